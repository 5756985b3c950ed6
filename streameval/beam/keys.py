"""Window and slice keys of records, pure Python: durations (``parse_window``, ``parse_lateness``),
fixed and sliding window bounds in microseconds (``window_bounds``, ``sliding_windows``, ``slide_keys``),
slice specifications and labels (``parse_slices``, ``slice_labels``, ``slice_part``, ``label_has_missing``,
``keep_slice_row``, ``attributes_without_values``) and dead-letter reason keys (``reason_key``): shared by both engines of the batch job
and the streaming job (split from :mod:`streameval.beam.transforms`, which re-exports them)."""

from __future__ import annotations

import math
import numbers
import re

from ..io.metric_table import label_parts

#: slice value of a request that lacks a slice attribute
MISSING = "(missing)"
ALL = "all"

# --------------------------------------------------------------------------------------------
# small helpers (pure Python, shared with streameval/jobs/batch.py)

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
    return limit


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


_window_micros = window_micros  # its former name (the engines import it)


def sliding_windows(window, every=None, max_windows_per_record=MAX_WINDOWS_PER_RECORD) -> tuple:
    """``(assign, slide)`` for ``window`` and a sliding period ``every`` (both as :func:`parse_window`
    reads them): ``assign`` is the size in micros of the fixed, epoch-aligned windows requests and
    impressions are assigned to (None: the global window), ``slide`` None or ``(size, period)`` in
    micros: sliding windows of ``size`` starting every ``period`` (Beam's ``SlidingWindows``), each
    the merge of the ``size // period`` sub-windows of the period it holds (then ``assign`` is the
    period). A size equal to the period is a fixed window. Raises ValueError (the streaming job's
    messages: :meth:`streameval.beam.streaming.windows.WindowSpec.sliding`) for a size that is not a
    multiple of the period, for ``every`` without ``window``, and for more than
    ``max_windows_per_record`` windows per record (:func:`check_windows_per_record`)."""
    size = _window_micros(window)
    if every is None or str(every).strip().lower() in ("", "none"):
        return size, None
    if size is None:
        raise ValueError(f"a sliding period (every={every!r}) needs a window size")
    from .streaming.windows import WindowSpec

    spec = WindowSpec.sliding(window, every, max_windows_per_record=max_windows_per_record)
    if spec.kind != "sliding":
        return size, None
    return spec.period, (spec.size, spec.period)


def slide_keys(element, slide):
    """``((window_start, window_end, *rest), value)`` of a sub-window (of the period) -> the same value
    keyed by each of the ``size // period`` sliding windows holding it (``slide = (size, period)``;
    window ``j`` is ``[j * period, j * period + size)``), earliest first; unchanged for the global
    window or ``slide`` None. Merging a key's values then gives the sliding window's state: the
    states are sums over requests (or impressions), and each lies in one sub-window."""
    (ws, we, *rest), value = element
    if slide is None or ws is None:
        yield element
        return
    size, period = slide
    for start in range(ws + period - size, ws + period, period):
        yield ((start, start + size, *rest), value)


#: the allowed lateness that keeps every record (the batch job's default: its whole input is on time)
UNLIMITED = "unlimited"


def parse_lateness(value, name: str = "allowed lateness") -> int | None:
    """The allowed lateness in micros: None, ``"unlimited"`` or ``"inf"``: no limit (None; every
    record of a request counts in the window of its earliest impression, nothing is late: the batch
    job's default, as its whole input is on time); ``0``/``"0"``: late data from the window's end (the
    stream's default); else a duration as :func:`parse_window` reads it (``"45m"``). Raises
    ValueError for anything else (``"-1"``, ``"none"``, a number without a unit)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in (UNLIMITED, "inf", "infinite"):
        return None
    if value in (0, "0") or (isinstance(value, str) and value.strip().lower() in ("0", "0s")):
        return 0
    if isinstance(value, str) and value.strip().lower() == "none":
        raise ValueError(f"{name} {value!r} is ambiguous: use {UNLIMITED} (keep every record) or 0 "
                         "(late data from the window's end)")
    size = parse_window(value, name)
    if size is None:
        raise ValueError(f"{name} wants a duration such as 0, 45m or 1h, or {UNLIMITED}, got {value!r}")
    return int(round(size * 1_000_000))


def window_start(timestamp, size_micros: int):
    """The start in microseconds of the fixed, epoch-aligned window of ``size_micros`` holding
    ``timestamp`` (microseconds): an int, or an int64 array for a column of them (the columnar
    engine's rule is this one, applied to its columns)."""
    return timestamp - timestamp % size_micros


def window_bounds(timestamp: int | None, size_micros: int | None) -> tuple:
    """``(window_start, window_end)`` in microseconds of the fixed, epoch-aligned window holding
    ``timestamp`` (:func:`window_start`); ``(None, None)`` for the global window (``size_micros`` None)."""
    if size_micros is None or timestamp is None:
        return (None, None)
    start = window_start(timestamp, size_micros)
    return (start, start + size_micros)


def parse_slices(slices) -> list[tuple[str, ...]]:
    """Slice specifications: each entry an attribute name (``"campaign"``), a comma-joined
    combination (``"campaign,device"``) or a tuple/list of names. Duplicates are dropped."""
    if slices is None:
        return []
    if isinstance(slices, str):
        slices = [slices]
    out: list[tuple[str, ...]] = []
    for s in slices:
        names = tuple(n.strip() for n in (s.split(",") if isinstance(s, str) else s))
        if not names or any(not n for n in names):
            raise ValueError(f"bad slice specification {s!r}")
        if names not in out:
            out.append(names)
    return out


def _escape_slice_text(text: str, value: bool) -> str:
    out = text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    if value and out.startswith("("):
        out = "\\" + out  # a value "(missing)" is not the absent attribute
    return out


def slice_part(name: str, value: str | None) -> str:
    """One ``attribute=value`` of a slice label: the (attribute, value) pair rendered so that
    different pairs never give the same text. A backslash, ``,`` and ``=`` in either are escaped
    with a backslash, and so is a value's leading ``(``; an absent attribute (``value`` None) is
    shown as ``(missing)``, unescaped, so it never equals a present value, not even the string
    ``"(missing)"`` (rendered ``\\(missing)``). See docs/metrics.md, "Slices"."""
    return f"{_escape_slice_text(name, False)}={MISSING if value is None else _escape_slice_text(value, True)}"


def slice_labels(attributes: dict | None, slice_specs) -> list[str]:
    """``["all", "campaign=men", "campaign=men,device=pc", ...]`` for one record (each part by
    :func:`slice_part`: an absent attribute is ``(missing)``, special characters escaped)."""
    attrs = attributes or {}
    labels = [ALL]
    for names in slice_specs:
        labels.append(",".join(slice_part(n, attrs.get(n)) for n in names))
    return labels


def label_has_missing(label: str) -> bool:
    """Whether a slice label (:func:`slice_part` parts joined by ``,``) has a part whose attribute is
    absent (``attr=(missing)``, unescaped): the rows ``--slice-missing skip`` leaves out. A present
    value ``"(missing)"`` is rendered ``\\(missing)`` and does not count."""
    return any(value == MISSING for _, value in label_parts(label))


def attributes_without_values(slice_specs, labels) -> list[str]:
    """The attributes of ``slice_specs`` (:func:`parse_slices`) that no slice label of ``labels``
    (a job's rows' ``slice``) has a value of: every request was in ``attr=(missing)`` (or, with
    ``--slice-missing skip``, in no row), so no record had the attribute, e.g. a typo
    (``--slices campain``; issue 41)."""
    present = {name for label in labels for name, value in label_parts(label or "") if value != MISSING}
    names = dict.fromkeys(n for spec in slice_specs for n in spec)
    return [n for n in names if _escape_slice_text(n, False) not in present]


SLICE_MISSING = ("show", "skip")


def keep_slice_row(row: dict) -> bool:
    """``beam.Filter`` predicate of ``--slice-missing skip``: False for a row of a slice in which some
    attribute is absent (``campaign=(missing)``), True for every other row (``all`` included)."""
    return not label_has_missing(row.get("slice") or "")


_GOT = re.compile(r",? got .*$")
_TAIL = re.compile(r"\s*\([^()]*\)$")
_BIGNUM = re.compile(r"-?\d{3,}")


def reason_key(reason: str) -> str:
    """A short category of a rejection reason (the values quoted in it removed), for counters:
    ``"position must be >= 1 (1-based), got 0"`` -> ``"position must be >= 1 (1-based)"``."""
    r = _GOT.sub("", reason)
    if r.startswith("score is not finite"):
        r = _TAIL.sub("", r)
    r = _BIGNUM.sub("N", r)
    return r[:120]
