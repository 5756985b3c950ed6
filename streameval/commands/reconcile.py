"""``streameval reconcile A B``: compare two metric tables.

Each table is a batch or streaming job's output (``metrics.avro`` / ``metrics.jsonl`` in the
``schemas/metric_result.avsc`` shape, or a finished job's output directory, local or ``s3://`` /
``gs://``, read through its manifest by :func:`streameval.io.tables.read_metrics`: a streaming job's
pane files are one table, of which the final panes are compared; a directory without
``manifest.json``, a killed job's, is refused) or a CSV exported from
a dashboard with columns ``window_start, window_end, slice, system, metric, value`` (optional
``num_queries``, ``stderr``; windows as ISO-8601 text, integer microseconds, or empty / ``global``
for the global window), such as a job's ``metrics.csv`` (the typed table: its count ``n`` is
compared, whatever its unit, rather than ``num_queries``, which it fills only for ranking rows).
Rows are matched on (window_start, window_end, slice, system, metric), the metric in any spelling
(its canonical name, ``metric_canonical``: ``nDCG@10`` matches ``ndcg@10`` and ``ndcg_cut_10``; the
keys reported carry the canonical name).

Reported: rows whose values differ beyond the tolerance (``|a - b| > max(abs_tol, rel_tol *
max(|a|, |b|))``; NaN equals NaN only), rows whose ``num_queries`` differ when both tables have it
(``--ignore-counts`` to skip), rows present in one table only, and, with ``--correlate X:Y``, the
Pearson and Kendall correlations (scipy.stats) of metric X against metric Y over the (window, slice,
system) keys both have: X is taken from table A and Y from table B (a metric absent from its table
is looked up in the other), e.g. an offline metric against an online one over the same days.

Streaming tables can hold several panes of a window: the row with ``is_final`` true is used, else
the one with the largest ``pane_index``. Two rows with the same key and no pane to choose between
are an input error.

Exit status (:mod:`streameval.exits`): 0 the tables agree, 1 they disagree (differences, one-sided
rows, or a correlation below ``--min-correlation``) or no row was compared (both tables empty or no
key in both, and no ``--correlate`` pair over a common key: zero rows compared is no agreement, one
line on stderr says so), 2 bad input or arguments: a ``--metrics`` or ``--correlate`` name that is the
metric of no row of either table is refused naming the three closest metrics present
(:mod:`streameval.io.selection`). Does not import Beam (but Beam's
``FileSystems`` for a remote output directory).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from datetime import datetime, timezone

from ..beam.arguments import split_names
from ..exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ..io import results
from ..io.selection import NoMatchError, check_metrics
from ..metrics.online_names import canonical_metric

__all__ = ["main", "read_table", "compare", "correlate", "Comparison"]

KEY_FIELDS = ("window_start", "window_end", "slice", "system", "metric")
CSV_REQUIRED = ("window_start", "window_end", "slice", "system", "metric", "value")


class TableError(ValueError):
    """A table cannot be read or is ambiguous."""


# --------------------------------------------------------------------------------------------
# reading

def _micros(value, where: str):
    """Window bound -> int microseconds or None (global)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TableError(f"{where}: bad window bound {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise TableError(f"{where}: window bound {value!r} is not whole microseconds")
        return int(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    text = str(value).strip()
    if text.lower() in ("", "none", "null", "global", "nan"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return _micros(datetime.fromisoformat(text.replace("Z", "+00:00")), where)
    except ValueError:
        raise TableError(f"{where}: cannot read window bound {text!r} (ISO-8601 text, integer "
                         "microseconds, or empty/global)") from None


def _float(value, where: str, field: str):
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if text == "":
        return math.nan if field == "value" else None
    try:
        return float(text)
    except ValueError:
        raise TableError(f"{where}: {field} is not a number: {text!r}") from None


def _count(value, where: str):
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TableError(f"{where}: num_queries is not a number: {value!r}") from None
    if not f.is_integer():
        raise TableError(f"{where}: num_queries is not an integer: {value!r}")
    return int(f)


def _normalise(rec: dict, where: str) -> dict:
    for f in ("slice", "system", "metric"):
        if rec.get(f) is None or str(rec[f]) == "":
            raise TableError(f"{where}: missing {f}")
    return {
        "window_start": _micros(rec.get("window_start"), where),
        "window_end": _micros(rec.get("window_end"), where),
        "slice": str(rec["slice"]),
        "system": str(rec["system"]),
        "metric": str(rec["metric"]),
        "metric_canonical": str(rec.get("metric_canonical") or canonical_metric(str(rec["metric"]))),
        "value": _float(rec.get("value"), where, "value"),
        # a typed table's count (a job's metrics.csv: n, num_queries only where the unit is queries)
        "num_queries": _count(rec["n"] if rec.get("n") not in (None, "") else rec.get("num_queries"), where),
        "stderr": _float(rec.get("stderr"), where, "stderr"),
        "pane_index": _pane_index(rec.get("pane_index"), where),
        "is_final": _flag(rec.get("is_final"), where),
    }


def _pane_index(value, where: str):
    """A pane index (an int, from a job's table or a CSV's text) or None; the metric_result schema's
    type, so a CSV's "10" orders after "9"."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise TableError(f"{where}: pane_index is not an integer: {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise TableError(f"{where}: pane_index is not an integer: {value!r}") from None
    if not f.is_integer() or f < 0:
        raise TableError(f"{where}: pane_index is not a non-negative integer: {value!r}")
    return int(f)


_TRUE, _FALSE = {"true", "t", "1", "yes"}, {"false", "f", "0", "no"}


def _flag(value, where: str):
    """``is_final`` as a bool or None: a job's bool, or a CSV's text (``true``/``false``, ``1``/``0``,
    any case; empty: None). Anything else is an input error, never a truthy string."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "":
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise TableError(f"{where}: is_final is not a boolean: {value!r}")


def _read_csv(path: str):
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in CSV_REQUIRED if c not in cols]
        if missing:
            raise TableError(f"{path}: CSV lacks columns {missing} (needs {', '.join(CSV_REQUIRED)})")
        reader.fieldnames = cols
        for lineno, rec in enumerate(reader, 2):
            yield rec, f"{path}:{lineno}"


def read_table(path: str) -> dict:
    """{(window_start, window_end, slice, system, metric): row} of one table (a file, or a job's
    output directory). Rows have ``value``, ``num_queries`` (None when absent) and ``stderr``.
    Raises TableError on an unreadable file or an ambiguous duplicate key."""
    path = str(path)
    if _is_output(path):
        source = _output_rows(path)
    else:
        try:
            path = results.resolve(path)
        except FileNotFoundError as e:
            raise TableError(str(e)) from None
        source = _read_csv(path) if path.lower().endswith(".csv") else results.iter_rows(path)
    table: dict = {}
    try:
        for rec, where in source:
            row = _normalise(rec, where)
            # rows match on the metric in any spelling (nDCG@10 and ndcg_cut_10: issue 42)
            key = (*(row[f] for f in KEY_FIELDS[:4]), row["metric_canonical"])
            old = table.get(key)
            if old is None:
                table[key] = row
                continue
            chosen = _pick_pane(old, row)
            if chosen is None:
                raise TableError(f"{where}: duplicate row for {_key_text(key)} and no pane to choose between them")
            table[key] = chosen
    except (OSError, ValueError) as e:
        if isinstance(e, TableError):
            raise
        if isinstance(e, results.ResultsFormatError):
            raise TableError(str(e)) from None
        raise TableError(f"{path}: {e}") from None
    return table


def _is_output(path: str) -> bool:
    """A job's output directory (local, or a remote prefix such as ``s3://bucket/out``)."""
    return os.path.isdir(path) or ("://" in path and not path.lower().endswith((".avro", ".jsonl", ".csv")))


def _output_rows(path: str):
    """(row, where) of the final panes of a job's output directory, read through its manifest
    (:func:`streameval.io.tables.read_metrics`); an unfinished job's directory is a TableError."""
    from ..io.tables import MetricsTableError, read_metrics

    try:
        rows = read_metrics(path, final_only=True)
    except MetricsTableError as e:
        raise TableError(str(e)) from None
    for i, r in enumerate(rows, 1):
        yield r, f"{path}: row {i}"


def _pick_pane(a: dict, b: dict):
    """The final pane, else the later pane; None when the two cannot be ordered."""
    if bool(a.get("is_final")) != bool(b.get("is_final")):
        return a if a.get("is_final") else b
    pa, pb = a.get("pane_index"), b.get("pane_index")
    if pa is None or pb is None or pa == pb:
        return None
    return a if pa > pb else b


# --------------------------------------------------------------------------------------------
# comparing

def _fmt_time(micros) -> str:
    if micros is None:
        return "global"
    dt = datetime.fromtimestamp(micros / 1e6, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if micros % 1_000_000 == 0 else dt.isoformat()


def _key_text(key) -> str:
    ws, we, sl, system, metric = key
    win = "global" if ws is None and we is None else f"[{_fmt_time(ws)}, {_fmt_time(we)})"
    return f"window {win} slice {sl} system {system} metric {metric}"


def values_differ(a, b, abs_tol: float, rel_tol: float) -> bool:
    """True when ``a`` and ``b`` differ beyond ``max(abs_tol, rel_tol * max(|a|, |b|))``; NaN
    (or a missing value) equals only NaN."""
    a_nan = a is None or math.isnan(a)
    b_nan = b is None or math.isnan(b)
    if a_nan or b_nan:
        return a_nan != b_nan
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > max(abs_tol, rel_tol * max(abs(a), abs(b)))


class Comparison:
    """Result of :func:`compare`: ``matched`` (number of keys in both), ``differences`` (list of
    dicts: key, a, b, diff, rel_diff, and count_a / count_b when the counts differ),
    ``only_a`` / ``only_b`` (sorted keys)."""

    def __init__(self, matched, differences, only_a, only_b):
        self.matched = matched
        self.differences = differences
        self.only_a = only_a
        self.only_b = only_b

    @property
    def agree(self) -> bool:
        return not (self.differences or self.only_a or self.only_b)


def _sort_key(key):
    ws, we, sl, system, metric = key
    return (ws is not None, ws or 0, we or 0, sl != "all", sl, system, metric)


def check_tolerances(abs_tol: float, rel_tol: float) -> None:
    """Raises ``ValueError`` unless both tolerances are finite and non-negative (a NaN tolerance
    would make every comparison false, so any two tables would agree)."""
    for name, v in (("abs_tol", abs_tol), ("rel_tol", rel_tol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite non-negative number, got {v!r}")


def compare(a: dict, b: dict, abs_tol: float = 1e-9, rel_tol: float = 1e-9, counts: bool = True,
            metrics=None) -> Comparison:
    """Compare two tables from :func:`read_table` (optionally only the metrics in ``metrics``).
    Raises ``ValueError`` for a tolerance that is negative or not finite."""
    check_tolerances(abs_tol, rel_tol)
    if metrics:
        wanted = {canonical_metric(m) for m in metrics}  # the tables' keys hold canonical names
        a = {k: v for k, v in a.items() if k[4] in wanted}
        b = {k: v for k, v in b.items() if k[4] in wanted}
    common = sorted(set(a) & set(b), key=_sort_key)
    diffs = []
    for k in common:
        ra, rb = a[k], b[k]
        va, vb = ra["value"], rb["value"]
        value_diff = values_differ(va, vb, abs_tol, rel_tol)
        ca, cb = ra["num_queries"], rb["num_queries"]
        count_diff = counts and ca is not None and cb is not None and ca != cb
        if value_diff or count_diff:
            d = None if va is None or vb is None or math.isnan(va) or math.isnan(vb) else vb - va
            rel = None if d is None or max(abs(va), abs(vb)) == 0 else abs(d) / max(abs(va), abs(vb))
            diffs.append({"key": k, "a": va, "b": vb, "diff": d, "rel_diff": rel, "count_a": ca, "count_b": cb,
                          "value_differs": value_diff, "count_differs": bool(count_diff)})
    only_a = sorted(set(a) - set(b), key=_sort_key)
    only_b = sorted(set(b) - set(a), key=_sort_key)
    return Comparison(len(common), diffs, only_a, only_b)


def correlate(a: dict, b: dict, metric_x: str, metric_y: str) -> dict:
    """Pearson and Kendall correlation of ``metric_x`` (from table ``a``, else ``b``) against
    ``metric_y`` (from ``b``, else ``a``) over the (window_start, window_end, slice, system) keys
    where both are finite. Returns ``{"x", "y", "source_x", "source_y", "n", "pearson",
    "pearson_p", "kendall", "kendall_p"}`` (NaN when fewer than 3 pairs or a constant series)."""
    import warnings

    from scipy import stats

    def series(metric, first, second, names):
        for tab, name in ((first, names[0]), (second, names[1])):
            vals = {k[:4]: r["value"] for k, r in tab.items() if k[4] == metric}
            if vals:
                return vals, name
        return {}, None

    xs, src_x = series(canonical_metric(metric_x), a, b, ("A", "B"))
    ys, src_y = series(canonical_metric(metric_y), b, a, ("B", "A"))
    keys = sorted((k for k in set(xs) & set(ys)
                   if xs[k] is not None and ys[k] is not None and math.isfinite(xs[k]) and math.isfinite(ys[k])),
                  key=lambda k: _sort_key((*k, "")))
    x = [xs[k] for k in keys]
    y = [ys[k] for k in keys]
    out = {"x": metric_x, "y": metric_y, "source_x": src_x, "source_y": src_y, "n": len(keys),
           "pearson": math.nan, "pearson_p": math.nan, "kendall": math.nan, "kendall_p": math.nan}
    if len(keys) >= 3 and len(set(x)) > 1 and len(set(y)) > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = stats.pearsonr(x, y)
            t = stats.kendalltau(x, y)
        out.update(pearson=float(r[0]), pearson_p=float(r[1]), kendall=float(t[0]), kendall_p=float(t[1]))
    return out


# --------------------------------------------------------------------------------------------
# command

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval reconcile",
        description="Compare two metric tables (batch / streaming output: Avro, JSON lines or an output "
                    "directory; or a dashboard CSV with window_start, window_end, slice, system, metric, value). "
                    "Exit status 0 when they agree, 1 when they disagree or no row was compared, 2 on bad input.")
    p.add_argument("a", help="table A")
    p.add_argument("b", help="table B")
    p.add_argument("--abs-tol", type=float, default=1e-9,
                   help="absolute tolerance on values (default 1e-9; e.g. 5e-5 against a 4-decimal dashboard export)")
    p.add_argument("--rel-tol", type=float, default=1e-9,
                   help="relative tolerance on values, times the larger magnitude (default 1e-9)")
    p.add_argument("--ignore-counts", action="store_true",
                   help="do not compare num_queries (compared by default when both tables have it)")
    p.add_argument("--metrics", default=None,
                   help="comma-separated metric names to compare (default: all)")
    p.add_argument("--allow-one-sided", action="store_true",
                   help="rows present in one table only are reported but do not make the tables disagree")
    p.add_argument("--correlate", action="append", default=[], metavar="X:Y",
                   help="correlation of metric X (table A) with metric Y (table B) over the same windows, "
                        "slices and systems, e.g. ndcg@10:ctr; repeatable")
    p.add_argument("--min-correlation", type=float, default=None,
                   help="disagree when a --correlate Pearson or Kendall coefficient is below this")
    p.add_argument("--max-rows", type=int, default=50, help="rows listed per section (default 50; 0: all)")
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                   help="also write the full report as JSON to FILE ('-' for standard output instead of text)")
    return p


def _fmt(x, digits=6) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.{digits}g}"


def _table(header, lines) -> str:
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(l) for l in lines)])


def _key_cells(key):
    ws, we, sl, system, metric = key
    return [_fmt_time(ws), _fmt_time(we) if we is not None else ("global" if ws is None else "-"), sl, system, metric]


def _limit(items, n):
    return items if n <= 0 else items[:n]


def _json_key(key):
    return dict(zip(KEY_FIELDS, key))


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        check_tolerances(args.abs_tol, args.rel_tol)
        if args.min_correlation is not None and not -1 <= args.min_correlation <= 1:
            raise ValueError(f"--min-correlation must be a number in [-1, 1], got {args.min_correlation!r}")
    except ValueError as e:
        msg = str(e).replace("abs_tol", "--abs-tol").replace("rel_tol", "--rel-tol")
        print(f"streameval reconcile: {msg}", file=sys.stderr)
        return EXIT_USAGE
    pairs = []
    for spec in args.correlate:
        x, sep, y = spec.partition(":")
        if not sep or not x.strip() or not y.strip():
            print(f"streameval reconcile: --correlate wants X:Y, got {spec!r}", file=sys.stderr)
            return EXIT_USAGE
        pairs.append((x.strip(), y.strip()))
    try:
        a = read_table(args.a)
        b = read_table(args.b)
    except TableError as e:
        print(f"streameval reconcile: {e}", file=sys.stderr)
        return EXIT_USAGE
    metrics = split_names(args.metrics) if args.metrics else None
    # a name that selects no row is a typo, never "0 rows compared" (issue 41): exit 2 naming the
    # closest metrics of the tables (rows match on canonical names, as the keys hold them)
    present = {k[4] for k in a} | {k[4] for k in b}
    try:
        if metrics:
            check_metrics(metrics, present, where=" of either table", label="--metrics: ")
        for x, y in pairs:
            check_metrics([x, y], present, where=" of either table", label=f"--correlate {x}:{y}: ")
    except NoMatchError as e:
        print(f"streameval reconcile: {e}", file=sys.stderr)
        return EXIT_USAGE
    cmp = compare(a, b, args.abs_tol, args.rel_tol, counts=not args.ignore_counts, metrics=metrics)
    cors = [correlate(a, b, x, y) for x, y in pairs]
    low_cor = []
    if args.min_correlation is not None:
        for c in cors:
            if not (c["pearson"] >= args.min_correlation and c["kendall"] >= args.min_correlation):
                low_cor.append(c)
    one_sided = bool(cmp.only_a or cmp.only_b)
    # zero rows compared (both tables empty, no key in both, --metrics naming none) is no agreement;
    # a --correlate pair over common keys (metric X in A, Y in B) is a comparison
    compared = cmp.matched > 0 or any(c["n"] > 0 for c in cors)
    agree = compared and not cmp.differences and not low_cor and (args.allow_one_sided or not one_sided)
    if not compared:
        which = f" of the metrics {', '.join(metrics)}" if metrics else ""
        pairs_too = ", nor does a --correlate pair have a (window, slice, system) key in common" if cors else ""
        print(f"streameval reconcile: no rows were compared: no (window, slice, system, metric) key{which} is in "
              f"both tables (A {len(a)} rows, B {len(b)} rows){pairs_too}", file=sys.stderr)

    report = {
        "a": args.a, "b": args.b, "abs_tol": args.abs_tol, "rel_tol": args.rel_tol,
        "rows_a": len(a), "rows_b": len(b), "matched": cmp.matched,
        "differences": [{**_json_key(d["key"]), **{k: v for k, v in d.items() if k != "key"}} for d in cmp.differences],
        "only_a": [_json_key(k) for k in cmp.only_a], "only_b": [_json_key(k) for k in cmp.only_b],
        "correlations": cors, "agree": agree, "compared": compared,
    }
    if args.json_out:
        from ..io.results import null_for_nonfinite

        # JSON has no NaN: a NaN value (an empty set) or difference is null, as in metrics.jsonl
        text = json.dumps(null_for_nonfinite(report), indent=2, default=lambda x: None, allow_nan=False)
        if args.json_out == "-":
            out.write(text + "\n")
            return EXIT_OK if agree else EXIT_FAILED
        try:
            with open(args.json_out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            print(f"streameval reconcile: cannot write --json {args.json_out!r}: {getattr(e, 'strerror', None) or e}",
                  file=sys.stderr)
            return EXIT_USAGE

    w = out.write
    w(f"A: {args.a} ({len(a)} rows)\nB: {args.b} ({len(b)} rows)\n")
    w(f"matched {cmp.matched} rows on (window, slice, system, metric); {len(cmp.differences)} differ beyond "
      f"abs tol {args.abs_tol:g} / rel tol {args.rel_tol:g}"
      f"{'' if args.ignore_counts else ' (values or num_queries)'}; {len(cmp.only_a)} only in A; "
      f"{len(cmp.only_b)} only in B\n")
    if cmp.differences:
        lines = []
        for d in _limit(cmp.differences, args.max_rows):
            lines.append([*_key_cells(d["key"]), _fmt(d["a"], 10), _fmt(d["b"], 10), _fmt(d["diff"], 4),
                          _fmt(d["rel_diff"], 4), _fmt(d["count_a"]), _fmt(d["count_b"])])
        w("\ndifferences:\n" + _table(["window_start", "window_end", "slice", "system", "metric", "A", "B",
                                       "B-A", "rel", "n_A", "n_B"], lines) + "\n")
        if len(lines) < len(cmp.differences):
            w(f"... {len(cmp.differences) - len(lines)} more (--max-rows 0 lists all)\n")
    for name, keys, tab in (("A", cmp.only_a, a), ("B", cmp.only_b, b)):
        if keys:
            lines = [[*_key_cells(k), _fmt(tab[k]["value"], 10)] for k in _limit(keys, args.max_rows)]
            w(f"\nonly in {name}:\n" + _table(["window_start", "window_end", "slice", "system", "metric", "value"],
                                             lines) + "\n")
            if len(lines) < len(keys):
                w(f"... {len(keys) - len(lines)} more (--max-rows 0 lists all)\n")
    for c in cors:
        w(f"\ncorrelation of {c['x']} ({c['source_x'] or 'absent'}) with {c['y']} ({c['source_y'] or 'absent'}) "
          f"over {c['n']} (window, slice, system) keys: Pearson r = {_fmt(c['pearson'], 4)} "
          f"(p = {_fmt(c['pearson_p'], 3)}), Kendall tau = {_fmt(c['kendall'], 4)} (p = {_fmt(c['kendall_p'], 3)})\n")
        if c["n"] < 3:
            w("  (fewer than 3 pairs: no correlation)\n")
    if low_cor:
        w(f"\ncorrelation below --min-correlation {args.min_correlation:g}: "
          + ", ".join(f"{c['x']}:{c['y']}" for c in low_cor) + "\n")
    verdict = "AGREE" if agree else "DISAGREE" if compared else "NO ROWS COMPARED"
    if agree and one_sided:
        verdict += " (one-sided rows allowed)"
    w(f"\n{verdict}\n")
    return EXIT_OK if agree else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
