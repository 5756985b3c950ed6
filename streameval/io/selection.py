"""A filter that selects no row is an error, never an empty result (issue 41: ``reconcile A A
--metrics ndgc@10`` compared 0 rows, an alert rule on ``ndgc@10`` fired on nothing).

Every command that filters metric rows by metric, system or slice (``reconcile --metrics`` and
``--correlate``, ``report --metrics``, the alert rules of ``batch --alerts`` / ``stream --alerts``)
checks each name it was given against the values present in the rows, and refuses a name that
matches none with one line naming the three closest values present (difflib's ratio, case ignored).
Metric names match in any spelling (:func:`streameval.metrics.online_names.canonical_metric`).

Layer 3 (I/O rules, no Beam): the standard library and the metric names.
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterable

from ..metrics.online_names import canonical_metric

__all__ = ["NoMatchError", "closest_present", "no_match_error", "check_selects", "check_metrics",
           "names_without_rows", "without_rows_line", "record_attributes", "slice_attribute_error"]


class NoMatchError(ValueError):
    """A filter (a metric, system or slice name) that selects no row; the message is one line and
    names the closest values present."""


def closest_present(raw, present: Iterable, n: int = 3) -> list[str]:
    """The ``n`` values of ``present`` closest to ``raw`` (difflib's ratio on lower case; every
    value is a candidate, so a table with at least ``n`` values always gives ``n``)."""
    by_lower: dict[str, str] = {}
    for p in sorted({str(p) for p in present if p is not None}):
        by_lower.setdefault(p.lower(), p)
    picks = difflib.get_close_matches(str(raw).strip().lower(), list(by_lower), n=n, cutoff=0.0)
    return [by_lower[p] for p in picks]


def no_match_error(what: str, raw, present: Iterable, where: str = "") -> NoMatchError:
    """The error of ``what`` (``metric``, ``system``, ``slice``) ``raw`` that matches no row of
    ``where`` (e.g. ``" of either table"``)."""
    present = list(present)
    picks = closest_present(raw, present)
    tail = (f"; closest {what} names present: {', '.join(picks)}" if picks
            else "; there are no rows")
    return NoMatchError(f"{what} {str(raw).strip()!r} matches no row{where}{tail}")


def check_selects(what: str, wanted: Iterable, present: Iterable, key: Callable | None = None,
                  where: str = "", label: str = "") -> None:
    """Raises :class:`NoMatchError` for the first of ``wanted`` whose ``key`` (default: itself) is
    the ``key`` of none of ``present``; ``label`` prefixes the message (the option or the rule)."""
    key = key or (lambda x: x)
    present = [p for p in present if p is not None]
    have = {key(p) for p in present}
    for w in wanted:
        if key(w) not in have:
            e = no_match_error(what, w, present, where)
            raise NoMatchError(f"{label}{e}") from None


def check_metrics(wanted: Iterable, present: Iterable, where: str = "", label: str = "") -> None:
    """:func:`check_selects` for metric names, matched in any spelling (their canonical names)."""
    check_selects("metric", wanted, present, key=canonical_metric, where=where, label=label)


def names_without_rows(names: Iterable, rows: Iterable[dict], accepted: int = 0) -> list[str]:
    """The metric ``names`` a job was asked for (as written) of which ``rows`` (a job's metric rows)
    hold no row, in any spelling: e.g. ``gauc[user,impressions]`` on a log without user ids. The
    jobs report them (``metrics_without_rows``) as a failed check (issue 41). No row at all: every
    name when ``accepted`` impressions reached the metrics (a log whose clicks are all unlogged
    asked for ``gauc``), else none (an empty input, allowed with ``--allow-empty``, or one whose
    every record was refused: the input checks say why, once)."""
    rows = list(rows)
    if not rows:
        return list(dict.fromkeys(names)) if accepted > 0 else []
    have = set()
    for r in rows:
        have.update((r.get("metric_canonical") or canonical_metric(r["metric"]), canonical_metric(r["metric"])))
        base, sep, _ = str(r["metric"]).rpartition(":")
        if sep and base:  # a metric whose rows are all derived ones: interleaving -> interleaving:wins, ...
            have.add(canonical_metric(base))
    return [n for n in dict.fromkeys(names) if canonical_metric(n) not in have]


def without_rows_line(names: list[str], status: int) -> str:
    """The one line both jobs print on stderr for the metrics of :func:`names_without_rows` (``status``:
    the exit status they give it, :data:`streameval.exits.EXIT_INPUT_CHECK`)."""
    return (f"error: {len(names)} of the metrics asked for produced no row (no record had what "
            f"{'it needs' if len(names) == 1 else 'they need'}, e.g. a user id for gauc[user,...]; "
            f"summary.json: metrics_without_rows; exit status {status}): {', '.join(names)}")


def record_attributes(paths: Iterable[str], limit: int = 50_000) -> set[str]:
    """The attribute names (``attributes`` map keys) of the first ``limit`` impression records of
    the Avro files ``paths`` (local), for the closest names of a slice attribute no record has; an
    empty set when they cannot be read here (remote, Parquet, damaged)."""
    from . import avro

    out: set[str] = set()
    try:
        for i, rec in enumerate(avro.read_records([p for p in paths if "://" not in str(p)], "impression")):
            out.update((rec.get("attributes") or {}).keys())
            if i + 1 >= limit:
                break
    except Exception:  # noqa: BLE001 (suggestions only: an unreadable input names none)
        pass
    return out


def slice_attribute_error(attribute: str, have: Iterable[str], sampled: bool = True) -> NoMatchError:
    """The one-line error of a ``--slices`` attribute that no record has (every request in
    ``attribute=(missing)``), naming the three closest attributes the records have (``have``)."""
    picks = closest_present(attribute, have)
    where = "the first records have" if sampled else "the records have"
    tail = f"; closest attributes {where}: {', '.join(picks)}" if picks else "; the records have no attributes"
    return NoMatchError(f"--slices: no record has the attribute {attribute!r} (every request is in "
                        f"{attribute}=(missing)){tail}")
