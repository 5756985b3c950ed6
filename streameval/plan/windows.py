"""Durations and event-time windows, parsed once: the part of an evaluation plan that says how
time is cut (issue 39: one :class:`WindowSpec` for both jobs). Pure Python, no Beam.

* :func:`parse_window`: a duration's text (``"90s"``, ``"30m"``, ``"1h"``, ``"1d"``, ``"1w"``) or
  a number of seconds, in seconds (None: the global window).
* :func:`window_micros`, :func:`parse_duration`: the same in integer microseconds.
* :class:`WindowSpec`: fixed (``"1h"``), sliding (``"1h/10m"``) or session (``"session:30m"``)
  windows, sizes and periods in integer microseconds.
* :func:`check_windows_per_record`: the limit on the sliding windows one record counts in.

Every function raises ``ValueError`` with one line naming the option (``name``) and the valid forms.

Fixed and sliding windows are laid over *sub-windows* of the period: sub-window ``k`` is
``[k * period, (k + 1) * period)``, window ``j`` is ``[j * period, j * period + size)`` and holds the
sub-windows ``j .. j + per_window - 1``. Sessions have no sub-windows (``period == 0``).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

__all__ = ["MAX_DURATION_SECONDS", "MAX_WINDOWS_PER_RECORD", "DURATION_FORMS", "parse_window", "window_micros",
           "parse_duration", "check_windows_per_record", "check_window_limit", "WindowSpec"]

# the longest window, lateness or retention: the years 1 to 9999 that event times may span (so that
# an event time plus a window, a lateness and a retention stays far inside Beam's timestamps)
MAX_DURATION_SECONDS = 10_000 * 366 * 86400

_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

#: the most sliding windows (size / period) a record may count in unless the caller raises it
#: (``max_windows_per_record``, the jobs' ``--max-windows-per-record``): every record's states are
#: sent to each of its windows, so ``7d/1s`` (604,800 windows per record) would run for ever
MAX_WINDOWS_PER_RECORD = 1_000


def check_windows_per_record(count: int, limit=MAX_WINDOWS_PER_RECORD, what: str = "a sliding window",
                             option: str = "max_windows_per_record") -> None:
    """Raises ValueError, one line naming ``count`` and the option that raises ``limit``, when a
    sliding window puts each record in more than ``limit`` windows (``what``: how the caller wrote
    the window, e.g. ``--window 7d/1s``); also when ``limit`` is not a positive whole number."""
    check_window_limit(limit, option)
    if count > limit:
        raise ValueError(f"{what} puts each record in {count:,} windows; the limit is {limit:,} ({option})")


def check_window_limit(limit, option: str = "max_windows_per_record") -> int:
    """``limit`` when it is a positive whole number of windows per record, else ValueError naming ``option``."""
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
        raise ValueError(f"{option} must be a positive whole number of windows, got {limit!r}")
    return int(limit)


#: the forms of a duration, for messages
DURATION_FORMS = "1s, 90s, 30m, 1h, 1d or 1w"


def parse_window(window, name: str = "window") -> float | None:
    """Window size in seconds from ``None``/``"none"``, a Python number of seconds, or text with a
    unit: ``"3600s"``, ``"30m"``, ``"1h"``, ``"1d"``, ``"1w"``. Text without a unit (``"1"``,
    ``"3600"``) is refused: it meant seconds, and ``--window 1`` gave one-second windows where a day or
    an hour was meant; only ``"0"`` (the same in every unit) stands alone. Raises ValueError, one
    line naming ``name`` (the option, e.g. ``--allowed-lateness``) and the valid forms (also for more
    than :data:`MAX_DURATION_SECONDS`, 10000 years)."""
    if window is None:
        return None
    if isinstance(window, (int, float)) and not isinstance(window, bool):
        size = float(window)
    else:
        text = str(window).strip().lower()
        if text in ("", "none", "global", "0"):
            return None
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", text)
        if not m and ("/" in text or text.startswith(("session:", "sessions:"))):
            raise ValueError(f"cannot parse {name} {window!r} here: this one takes a fixed size such as 1h or 1d "
                             f"(sliding windows: the size and every='10m'; session windows (session:30m) are the "
                             f"streaming job's: streameval stream, StreamMetrics)")
        if m and not m.group(2):
            raise ValueError(f"{name} {window!r} has no unit: write it with one, e.g. {DURATION_FORMS} "
                             f"(s seconds, m minutes, h hours, d days, w weeks)")
        if not m or m.group(2) not in _UNITS:
            raise ValueError(f"cannot parse {name} {window!r}: use a number and a unit, e.g. {DURATION_FORMS}"
                             + (", or none" if name == "window" else ""))
        size = float(m.group(1)) * _UNITS[m.group(2)]
    if not size > 0 or not math.isfinite(size):
        raise ValueError(f"{name} must be a positive duration, got {window!r}")
    if size > MAX_DURATION_SECONDS:
        raise ValueError(f"a duration must be at most 10000 years (the span of event times a job can window), "
                         f"got {name} {window!r}")
    return size


def window_micros(window) -> int | None:
    """The size in microseconds of ``window`` as :func:`parse_window` reads it (None: the global
    window); ValueError as there, and for a window shorter than a microsecond."""
    size = parse_window(window)
    if size is None:
        return None
    micros = int(round(size * 1_000_000))
    if micros < 1:
        raise ValueError(f"window {window!r} is shorter than a microsecond")
    return micros


def parse_duration(value, name="duration", allow_zero=False) -> int:
    """Microseconds from a Python number of seconds or text with a unit such as ``"90s"``, ``"30m"``,
    ``"1h"``, ``"1d"`` (see :func:`parse_window`: text without a unit is
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
        :data:`MAX_WINDOWS_PER_RECORD`, 1,000), naming the count, the window
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
