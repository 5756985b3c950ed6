"""Window and slice keys of records, pure Python: durations (``parse_window``, ``parse_lateness``),
fixed and sliding window bounds in microseconds (``window_bounds``, ``sliding_windows``, ``slide_keys``),
slice specifications and labels (``parse_slices``, ``slice_labels``, ``slice_part``, ``label_has_missing``,
``keep_slice_row``, ``attributes_without_values``) and dead-letter reason keys (``reason_key``): shared by both engines of the batch job
and the streaming job (split from :mod:`streameval.beam.transforms`, which re-exports them)."""

from __future__ import annotations

import re

from ..io.metric_table import label_parts
from ..plan.windows import (  # noqa: F401 (re-exported: their former home)
    DURATION_FORMS,
    MAX_DURATION_SECONDS,
    MAX_WINDOWS_PER_RECORD,
    WindowSpec,
    check_window_limit,
    check_windows_per_record,
    parse_window,
    window_micros,
)

#: slice value of a request that lacks a slice attribute
MISSING = "(missing)"
ALL = "all"

# --------------------------------------------------------------------------------------------
# small helpers (pure Python, shared with streameval/jobs/batch.py)

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
