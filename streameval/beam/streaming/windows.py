"""Time in the streaming stages: durations, event-time window specifications, and the
configuration every stage shares.

All times are integer microseconds since the epoch (durations: microseconds), except
``_Config.early_seconds`` (seconds of processing time). :func:`parse_duration` and
:class:`WindowSpec` raise ``ValueError`` on a missing, non-positive or malformed duration.

Fixed and sliding windows are laid over *sub-windows* of the period: sub-window ``k`` is
``[k * period, (k + 1) * period)``, window ``j`` is ``[j * period, j * period + size)`` and holds the
sub-windows ``j .. j + per_window - 1``. Sessions have no sub-windows (``period == 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..keys import MAX_WINDOWS_PER_RECORD, check_windows_per_record
from ..transforms import parse_window

# --------------------------------------------------------------------------------------------
# durations and window specifications

def parse_duration(value, name="duration", allow_zero=False) -> int:
    """Microseconds from a Python number of seconds or text with a unit such as ``"90s"``, ``"30m"``,
    ``"1h"``, ``"1d"`` (see :func:`~streameval.beam.transforms.parse_window`: text without a unit is
    refused, naming ``name``); ``0``/``"0"`` only when ``allow_zero``."""
    if value is None:
        if allow_zero:
            return 0
        raise ValueError(f"{name} is required")
    if allow_zero and (value == 0 or str(value).strip().lower() in ("0", "0s", "none", "")):
        return 0
    size = parse_window(value, name)
    if size is None:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    micros = int(round(size * 1_000_000))
    if micros < 1:
        raise ValueError(f"{name} {value!r} is shorter than a microsecond")
    return micros


@dataclass(frozen=True)
class WindowSpec:
    """An event-time window specification.

    * ``WindowSpec.fixed("1h")``: epoch-aligned windows of one hour (the batch job's windows).
    * ``WindowSpec.sliding("1h", every="10m")``: windows of one hour starting every ten minutes;
      the size must be a multiple of the period. Requests are pre-aggregated in fixed sub-windows
      of the period and merged into each sliding window.
    * ``WindowSpec.sessions("30m", by="user")``: per-key sessions of activity: a request is active
      from its first to its last impression; the requests of one user (or each request alone,
      ``by="request"``) whose activity is separated by less than the gap form a session
      ``[first impression, last impression + gap)``. A request without a user is a session key of
      its own. Rows of a session carry its key in the slice label (``"user=u1"``,
      ``"user=u1,campaign=men"``), so two sessions never share a row.

    ``WindowSpec.parse`` reads ``"1h"``, ``"1h/10m"`` (sliding) and ``"session:30m"`` /
    ``"session:30m/request"``.
    """

    kind: str
    size: int  # micros: the window size (fixed, sliding) or the gap (sessions)
    period: int  # micros: the sub-window (fixed: size; sliding: the period); 0 for sessions
    by: str = "user"

    @classmethod
    def fixed(cls, size) -> "WindowSpec":
        s = parse_duration(size, "window size")
        return cls("fixed", s, s)

    @classmethod
    def sliding(cls, size, every, max_windows_per_record=MAX_WINDOWS_PER_RECORD, what=None,
                option="max_windows_per_record") -> "WindowSpec":
        """Sliding windows of ``size`` every ``every``; ValueError when each record would count in
        more than ``max_windows_per_record`` windows (``size / every``; default
        :data:`~streameval.beam.keys.MAX_WINDOWS_PER_RECORD`, 1,000), naming the count, the window
        (``what``, default ``a sliding window of SIZE every PERIOD``) and ``option``, the way to raise it."""
        s, p = parse_duration(size, "window size"), parse_duration(every, "window period")
        if s % p or s < p:
            raise ValueError(f"a sliding window's size ({size}) must be a multiple of its period ({every})")
        spec = cls("fixed" if s == p else "sliding", s, p)
        check_windows_per_record(s // p, max_windows_per_record,
                                 what or "a " + spec.describe().replace("sliding", "sliding window of", 1), option)
        return spec

    @classmethod
    def sessions(cls, gap, by="user") -> "WindowSpec":
        if by not in ("user", "request"):
            raise ValueError(f"sessions are per 'user' or per 'request', got {by!r}")
        return cls("sessions", parse_duration(gap, "session gap"), 0, by)

    @classmethod
    def parse(cls, value, max_windows_per_record=MAX_WINDOWS_PER_RECORD) -> "WindowSpec":
        """A window from its text (or a WindowSpec, returned as it is); a sliding one with more than
        ``max_windows_per_record`` windows per record is refused (:meth:`sliding`)."""
        if isinstance(value, WindowSpec):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls.fixed(value)
        text = str(value).strip().lower()
        if text.startswith(("session:", "sessions:")):
            rest = text.split(":", 1)[1]
            gap, _, by = rest.partition("/")
            return cls.sessions(gap, by or "user")
        if "/" in text:
            size, every = text.split("/", 1)
            return cls.sliding(size, every, max_windows_per_record, what=f"sliding window {text}")
        return cls.fixed(text)

    # -- fixed / sliding geometry ----------------------------------------------------------
    @property
    def windowed(self) -> bool:
        return self.kind != "sessions"

    @property
    def per_window(self) -> int:
        """Sub-windows per window (1 for fixed windows)."""
        return self.size // self.period if self.windowed else 0

    def sub(self, ts: int) -> int:
        """Index of the sub-window (of ``period``) holding ``ts``."""
        return ts // self.period

    def windows_of(self, k: int) -> range:
        """Indices of the windows containing sub-window ``k`` (window j starts at j * period)."""
        return range(k - self.per_window + 1, k + 1)

    def bounds(self, j: int) -> tuple[int, int]:
        return j * self.period, j * self.period + self.size

    def describe(self) -> str:
        def d(us):
            for unit, n in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000)):
                if us % n == 0:
                    return f"{us // n}{unit}"
            return f"{us}us"

        if self.kind == "fixed":
            return f"fixed {d(self.size)}"
        if self.kind == "sliding":
            return f"sliding {d(self.size)} every {d(self.period)}"
        return f"sessions per {self.by}, gap {d(self.size)}"

# --------------------------------------------------------------------------------------------
# the configuration of the stages

@dataclass
class _Config:
    spec: WindowSpec
    lateness: int
    delay: int
    retention: int
    early_seconds: float | None
    early_count: int | None
    ranking: bool
    ctr: bool
    specs: list
    options: object
    ops: object
    slice_specs: list
    attr_keys: list
    shards: int
    clock: object
    cleanup: int = 1
    run: str = ""
    policy: str = "latest"
    ci_level: float = 0.95
    intervals: str = "fixed"
    click_events: bool = False
    bounded: str = "logit"
    timer_per_deadline: bool = False

    """The settings of one :class:`~streameval.beam.streaming.StreamMetrics`, shared by its stages.

    ``spec``: the windows; ``lateness``, ``delay`` (click attribution), ``retention`` (how long a
    final request is remembered) and ``cleanup`` (the step in which state is freed): microseconds;
    ``early_seconds`` (processing-time seconds) and ``early_count`` (request updates): early
    panes, or None; ``ranking`` / ``ctr``: which metrics; ``specs``, ``options``, ``ops``: the
    ranking metrics as :class:`~streameval.beam.transforms.ScoreRankings` prepares them;
    ``slice_specs`` / ``attr_keys``: the slices and the attributes they read; ``shards``: keyed
    states of requests; ``clock``: processing-time source (None: wall time); ``run``: the id
    under which counts are tallied; ``policy``: the
    judgment conflict policy; ``ci_level``: the level of the rows' intervals; ``intervals``:
    ``"fixed"`` (t / Wilson) or ``"anytime"`` (confidence sequences); ``bounded``: ``"logit"`` or
    ``"t"``, the fixed interval of a metric in [0, 1] whose t interval leaves it
    (:func:`~streameval.metrics.stats.row_interval`); ``click_events``: whether
    clicks come as separate events (then an impression's null ``clicked`` is "not clicked unless
    a click matches": :func:`streameval.io.records.impression_clicked`); ``timer_per_deadline``:
    an event-time timer per pending deadline instead of one per key (:func:`.common.arm`).
    """

    def round_up(self, t: int) -> int:
        """``t`` rounded up to the cleanup step (state is freed in steps, not at every window)."""
        g = self.cleanup
        return -((-t) // g) * g

    def expiry(self, k: int) -> int:
        """When sub-window k stops accepting data: the end of the first window holding it plus the
        allowed lateness (= the sub-window's end + lateness: after that a window containing it is
        final and must not change)."""
        return (k + 1) * self.spec.period + self.lateness
