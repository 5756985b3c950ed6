"""``streameval report RESULTS... --out DIR``: PNG plots and one self-contained HTML page from metric
rows (schemas/metric_result.avsc, as Avro or JSON lines, e.g. ``streameval batch``'s
``metrics.avro`` / ``metrics.jsonl``; a directory is a finished batch or streaming job's output,
local or ``s3://`` / ``gs://``, read through its manifest as one table by
:func:`streameval.io.tables.read_metrics`: a directory without ``manifest.json``, a killed job's,
is refused).

Per metric: rows with event-time windows give a line plot of the value over time with its interval
as a band, one panel per slice and one line per system; global-window rows give a bar chart with
error bars (groups: slices, bars: systems). The page ``DIR/report.html`` holds every plot
(embedded as base64 PNG, so the file stands alone) and the tables of rows.

Reliability diagrams: the rows ``calibration_bin[bins=B,k=b]:predicted`` and ``:observed`` (written with
each ``ece[bins=B]``: a bin's mean predicted probability and click rate, ``num_queries`` its examples)
give one diagram per B instead of a plot per row: per slice, one line per system of observed click
rate against mean predicted probability, with Wilson intervals and the diagonal of perfect
calibration. The global-window rows are drawn when there are any; else the windows' rows are pooled
(each bin's means weighted by its examples: the diagram of the whole period).

Intervals: a row's own ``ci_low``/``ci_high`` when it has them; otherwise the report computes one
with :func:`streameval.metrics.stats.row_interval` (Wilson for CTR, Student t from ``stderr`` and
``num_queries`` otherwise, logit for a metric in [0, 1] whose t interval leaves it) at
``--confidence``, marked with ``*`` in the tables. Streaming rows with several panes for one window:
the final pane (else the highest ``pane_index``) is shown.
Does not import Beam (but Beam's ``FileSystems`` for a remote output directory).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import math
import os
import re
import sys
from collections import defaultdict
from datetime import datetime, timedelta, timezone

from ..beam.arguments import split_names
from ..exits import EXIT_USAGE, one_line
from ..io.selection import check_metrics
from ..metrics.online_names import canonical_metric

__all__ = ["main", "read_rows", "prepare_rows", "write_report", "build_arg_parser"]

_FLOAT_FIELDS = ("value", "stderr", "ci_low", "ci_high", "ci_level")
#: a reliability-diagram row (:func:`streameval.beam.online.calibration_bin_name`)
_BIN_ROW = re.compile(r"calibration_bin\[bins=(\d+),k=(\d+)\]:(predicted|observed)")


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval report",
        description="Render metric rows (metric_result Avro or JSON lines) as PNG plots and one self-contained "
                    "HTML page.")
    p.add_argument("results", nargs="+", help="metric_result files (.avro or .jsonl) or output directories")
    p.add_argument("--out", required=True, help="output directory (PNG files and report.html)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="level of the intervals the report computes for rows without one (default 0.95)")
    p.add_argument("--metrics", default=None, help="comma-separated metrics to include (default: all)")
    p.add_argument("--title", default="streameval report")
    return p


# --------------------------------------------------------------------------------------------
# reading

def _float(x):
    if x is None:
        return None
    if isinstance(x, str):
        return float(x)  # "NaN", "Infinity" as written by the JSON lines sink
    return float(x)


def _is_output(path: str) -> bool:
    """A job's output directory (local, or a remote prefix such as ``s3://bucket/out``)."""
    return os.path.isdir(path) or ("://" in path and not path.lower().endswith((".avro", ".jsonl")))


def read_rows(paths) -> list[dict]:
    """Metric rows of the given files and job output directories; each row gets ``_source`` (the
    file's name; a directory's own name). Avro files are recognised by their magic bytes, anything
    else is read as JSON lines; a directory is read by :func:`streameval.io.tables.read_metrics`
    (every pane). Raises ``ValueError`` (one line) for a row that is not a metric row or a
    directory without manifest, ``OSError`` for a file that cannot be read."""
    from ..io import results

    rows = []
    for p in paths:
        p = str(p)
        if _is_output(p):
            from ..io.tables import read_metrics

            path = p.rstrip("/") if "://" in p else os.path.abspath(p)
            recs = read_metrics(p)
        else:
            path = results.resolve(p)
            recs = [rec for rec, _ in results.iter_rows(path)]
        for r in recs:
            missing = [k for k in ("slice", "system", "metric", "value", "num_queries") if k not in r]
            if missing:
                raise ValueError(f"{path}: a row lacks {', '.join(missing)} (is it a metric_result file?)")
            r = dict(r)
            for k in _FLOAT_FIELDS:
                r[k] = _float(r.get(k))
            r.setdefault("window_start", None)
            r.setdefault("window_end", None)
            r["_source"] = path.rsplit("/", 1)[-1] if "://" in path else os.path.basename(path)
            rows.append(r)
    return rows


def prepare_rows(rows, level: float = 0.95) -> list[dict]:
    """Keep one row per (window, slice, system, metric) - the final / latest pane - label systems
    with their file when two files hold the same key, and fill missing intervals (``_ci_computed``)."""
    from ..metrics import stats

    best: dict = {}
    sources_per_key = defaultdict(set)
    for r in rows:
        key = (r["_source"], r["window_start"], r["slice"], r["system"], r["metric"])
        sources_per_key[key[1:]].add(r["_source"])
        rank = (bool(r.get("is_final")), r.get("pane_index") if r.get("pane_index") is not None else -1)
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, r)
    clash = any(len(s) > 1 for s in sources_per_key.values())
    out = []
    for _, r in best.values():
        r = dict(r)
        if clash:
            r["system"] = f"{r['system']} [{r['_source']}]"
        r["_ci_computed"] = False
        if r.get("ci_low") is None or r.get("ci_high") is None:
            ci = stats.row_interval(r["metric"], r["value"], r["num_queries"], r.get("stderr"), level)
            if ci["ci_low"] is not None:
                r.update(ci)
                r["_ci_computed"] = True
        out.append(r)
    return out


# --------------------------------------------------------------------------------------------
# plots

def _save_png(plt, fig, out_dir: str, name: str, pngs: list) -> bytes:
    """Write ``fig`` as ``out_dir/name.png`` (appended to ``pngs``), close it; returns the PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    data = buf.getvalue()
    path = os.path.join(out_dir, name + ".png")
    with open(path, "wb") as fo:
        fo.write(data)
    pngs.append(path)
    return data


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "metric"


#: the window starts a date axis can show (Python's and matplotlib's years 1 to 9999)
_DATE_MIN, _DATE_MAX = -62_135_596_800_000_000, 253_402_300_799_999_999


def _dated(micros) -> bool:
    return micros is not None and _DATE_MIN <= micros <= _DATE_MAX


def _dt(micros):
    # exact (a float of micros / 1e6 rounds the last microsecond of 9999 into the year 10000)
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(micros))


def _fmt_time(micros) -> str:
    """A window start as UTC date and time; one outside the years 1 to 9999 (a table may hold
    any int64) as its microseconds since the epoch."""
    if micros is None:
        return "global"
    if not _dated(micros):
        return f"{micros} us since 1970"
    return _dt(micros).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _ok(x) -> bool:
    return x is not None and math.isfinite(x)


def _sort_slices(slices):
    return sorted(slices, key=lambda s: (s != "all", s))


def _plot_windows(plt, metric, rows):
    import matplotlib.dates as mdates

    slices = _sort_slices({r["slice"] for r in rows})
    systems = sorted({r["system"] for r in rows})
    ncols = min(3, len(slices))
    nrows = -(-len(slices) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 3.8 * nrows), squeeze=False, sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # a date axis for windows within the years 1 to 9999; else days since 1970 on a plain axis
    dates = all(_dated(r["window_start"]) for r in rows)
    starts = {r["window_start"] for r in rows}
    if len(starts) == 1:  # one window [start, end): the axis shows a window's width either side of its start
        (start,) = starts
        ends = [r.get("window_end") for r in rows if r.get("window_end") is not None]
        width = max(ends) - start if ends and max(ends) > start else 86_400_000_000
        span = (max(start - width, _DATE_MIN) if dates else start - width,
                min(start + width, _DATE_MAX) if dates else start + width)
    for ax, sl in zip(axes.flat, slices):
        for i, system in enumerate(systems):
            pts = sorted((r for r in rows if r["slice"] == sl and r["system"] == system),
                         key=lambda r: r["window_start"])
            if not pts:
                continue
            color = colors[i % len(colors)]
            x = [_dt(r["window_start"]) if dates else r["window_start"] / 86_400e6 for r in pts]
            y = [r["value"] if _ok(r["value"]) else math.nan for r in pts]
            lo = [r["ci_low"] if _ok(r.get("ci_low")) else math.nan for r in pts]
            hi = [r["ci_high"] if _ok(r.get("ci_high")) else math.nan for r in pts]
            ax.plot(x, y, marker="o", markersize=3, color=color, label=system)
            if len(pts) > 1:
                ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
            else:  # one window: a band between one x has no width; the interval as an error bar
                ok = _ok(lo[0]) and _ok(hi[0]) and _ok(y[0])
                ax.errorbar(x, y, yerr=[[max(y[0] - lo[0], 0.0)], [max(hi[0] - y[0], 0.0)]] if ok else None,
                            fmt="none", capsize=4, color=color)
        ax.set_title(f"{metric} - {sl}", fontsize=10)
        if len(starts) == 1:  # one window: the axis spans it (matplotlib would show 1968-1972 around it)
            lo_x, hi_x = span
            ax.set_xlim(_dt(lo_x) if dates else lo_x / 86_400e6, _dt(hi_x) if dates else hi_x / 86_400e6)
        if dates:
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(mdates.AutoDateLocator()))
        else:
            ax.set_xlabel("window start (days since 1970-01-01)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(slices):]:
        ax.set_visible(False)
    fig.supylabel(metric)
    fig.tight_layout()
    return fig


def _plot_global(plt, metric, rows):
    """Bars with error bars: one group per slice, one bar per system (one slice: one bar per
    system, named on the axis)."""
    import numpy as np

    slices = _sort_slices({r["slice"] for r in rows})
    systems = sorted({r["system"] for r in rows})
    by = {(r["slice"], r["system"]): r for r in rows}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    single = len(slices) == 1
    width = 0.8 if single else 0.8 / len(systems)
    n_bars = len(systems) * len(slices)
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * n_bars + 2), 4.6 if single else 4.2))
    x0 = np.arange(len(systems) if single else len(slices), dtype=float)
    top = 0.0
    for i, system in enumerate(systems):
        vals, err_lo, err_hi = [], [], []
        for sl in slices:
            r = by.get((sl, system))
            v = r["value"] if r is not None and _ok(r["value"]) else math.nan
            vals.append(v)
            has = r is not None and _ok(r.get("ci_low")) and _ok(r.get("ci_high")) and _ok(v)
            err_lo.append(max(v - r["ci_low"], 0.0) if has else 0.0)
            err_hi.append(max(r["ci_high"] - v, 0.0) if has else 0.0)
            if _ok(v):
                top = max(top, v + err_hi[-1])
        x = x0[i:i + 1] if single else x0 + (i - (len(systems) - 1) / 2) * width
        ax.bar(x, vals, width, yerr=[err_lo, err_hi], capsize=4, color=colors[i % len(colors)],
               label=system, edgecolor="white")
    if single:
        ax.set_xticks(x0, systems, rotation=20 if len(systems) > 3 else 0, ha="right" if len(systems) > 3 else "center")
        ax.set_title(f"{metric} - {slices[0]} (global window)", fontsize=10)
    else:
        ax.set_xticks(x0, slices, rotation=20 if len(slices) > 3 else 0)
        ax.set_title(f"{metric} (global window)", fontsize=10)
        ax.legend(fontsize=8, ncols=min(3, len(systems)), loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if top > 0:
        ax.set_ylim(top=top * 1.08)
    ax.set_ylabel(metric)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def _bins_of(row):
    m = _BIN_ROW.fullmatch(row["metric"])
    return int(m.group(1)) if m else None


def reliability_points(rows) -> dict:
    """``{bins: {(slice, system): [(bin, examples, mean predicted, click rate), ...]}}`` of the
    reliability rows among ``rows`` (one row per key, as :func:`prepare_rows` gives), bins ascending.
    Global-window rows when there are any for a bin count, else the windows pooled (means weighted
    by the bins' examples)."""
    found: dict = defaultdict(list)
    for r in rows:
        m = _BIN_ROW.fullmatch(r["metric"])
        if m and _ok(r["value"]) and r["num_queries"]:
            found[int(m.group(1))].append((r, int(m.group(2)), m.group(3)))
    out = {}
    for bins, items in sorted(found.items()):
        glob = [x for x in items if x[0]["window_start"] is None]
        acc: dict = defaultdict(lambda: [0, 0.0, 0, 0.0])  # n and n * mean, for predicted and observed
        for r, k, what in (glob or items):
            a = acc[(r["slice"], r["system"], k)]
            j = 0 if what == "predicted" else 2
            a[j] += r["num_queries"]
            a[j + 1] += r["num_queries"] * r["value"]
        per: dict = defaultdict(list)
        for (sl, system, k), (n, sp, n2, so) in sorted(acc.items()):
            if n and n2:
                per[(sl, system)].append((k, n, sp / n, so / n2))
        out[bins] = dict(per)
    return out


def _plot_reliability(plt, bins, points, level):
    from ..metrics import stats

    slices = _sort_slices({sl for sl, _ in points})
    systems = sorted({sy for _, sy in points})
    ncols = min(3, len(slices))
    nrows = -(-len(slices) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 4.6 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, sl in zip(axes.flat, slices):
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
        for i, system in enumerate(systems):
            pts = points.get((sl, system))
            if not pts:
                continue
            x = [p for _, _, p, _ in pts]
            y = [o for _, _, _, o in pts]
            ci = [stats.wilson_interval(round(o * n), n, level) for _, n, _, o in pts]
            err = [[max(o - lo, 0.0) for o, (lo, _) in zip(y, ci)], [max(hi - o, 0.0) for o, (_, hi) in zip(y, ci)]]
            ax.errorbar(x, y, yerr=err, marker="o", markersize=4, capsize=3, color=colors[i % len(colors)],
                        label=system)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_title(f"reliability, {bins} bins - {sl}", fontsize=10)
        ax.set_xlabel("mean predicted probability")
        ax.set_ylabel("observed click rate")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(slices):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def _reliability_table(bins, points) -> str:
    head = ("slice", "system", "bin", "n", "mean predicted", "observed")
    out = ["<table class='bins'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for (sl, system), pts in sorted(points.items(), key=lambda kv: (kv[0][0] != "all", kv[0])):
        for k, n, pred, obs in pts:
            cells = [html.escape(sl), html.escape(system), f"({k / bins:g}, {(k + 1) / bins:g}]"]
            out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells)
                       + f"<td class='n'>{n}</td><td class='n'>{pred:.4f}</td><td class='n'>{obs:.4f}</td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1em}
th,td{border:1px solid #ddd;padding:2px 8px} th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;height:auto;border:1px solid #eee} .note{color:#555;font-size:0.9em}
"""


def _cell(x, fmt="%.4f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt % x


def _table(rows) -> str:
    head = ("window", "slice", "system", "value", "n", "stderr", "CI low", "CI high", "level", "method")
    out = ["<table class='rows'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        method = (r.get("ci_method") or "-") + ("*" if r.get("_ci_computed") else "")
        cells = [(_fmt_time(r["window_start"]), ""), (r["slice"], ""), (r["system"], ""),
                 (_cell(r["value"]), "n"), (str(r["num_queries"]), "n"), (_cell(r.get("stderr")), "n"),
                 (_cell(r.get("ci_low")), "n"), (_cell(r.get("ci_high")), "n"),
                 (_cell(r.get("ci_level"), "%g"), "n"), (method, "")]
        out.append("<tr>" + "".join(f"<td class='{c}'>{html.escape(str(v))}</td>" if c else
                                    f"<td>{html.escape(str(v))}</td>" for v, c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _metric_order(metrics):
    def key(m):
        if m == "ctr":
            return (1, 0, m)
        if m.startswith("ctr@pos") and m[7:].isdigit():
            return (1, int(m[7:]), m)
        return (0, 0, m)

    return sorted(metrics, key=key)


def write_report(rows, out_dir: str, title: str = "streameval report", level: float = 0.95,
                 inputs=(), metrics=None) -> dict:
    """Write the PNG plots and ``report.html`` for metric rows (as :func:`read_rows` gives);
    returns ``{"html": path, "pngs": [paths], "rows": n}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import progress

    rows = prepare_rows(rows, level)
    if metrics:
        # a name that selects no row is a typo: refused naming the closest metrics present (issue 41)
        check_metrics(metrics, [r.get("metric_canonical") or r["metric"] for r in rows
                                if not _BIN_ROW.fullmatch(r["metric"])],
                      where=" of the inputs", label="--metrics: ")
        # any spelling of a metric finds its rows (ndcg_cut_10 those of nDCG@10; issue 42)
        wanted = {canonical_metric(m) for m in metrics}
        # ece[bins=B] brings its reliability rows
        ece = {m[9:-1] for m in wanted if m.startswith("ece[bins=") and m.endswith("]")}
        rows = [r for r in rows if (r.get("metric_canonical") or canonical_metric(r["metric"])) in wanted
                or (_BIN_ROW.fullmatch(r["metric"]) and _BIN_ROW.fullmatch(r["metric"]).group(1) in ece)]
    if not rows:
        raise ValueError("no metric rows to report")
    os.makedirs(out_dir, exist_ok=True)
    by_metric = defaultdict(list)
    for r in rows:
        if not _BIN_ROW.fullmatch(r["metric"]):
            by_metric[r["metric"]].append(r)
    sections, pngs, used = [], [], set()
    for metric in progress.bar(_metric_order(by_metric), desc="plots", unit="metric"):
        mrows = by_metric[metric]
        parts = [("windows", [r for r in mrows if r["window_start"] is not None]),
                 ("global", [r for r in mrows if r["window_start"] is None])]
        body = []
        for kind, prow in parts:
            if not prow:
                continue
            fig = (_plot_windows if kind == "windows" else _plot_global)(plt, metric, prow)
            name = f"{_slug(metric)}_{kind}"
            while name in used:
                name += "_"
            used.add(name)
            data = _save_png(plt, fig, out_dir, name, pngs)
            prow = sorted(prow, key=lambda r: (r["window_start"] or 0, r["slice"] != "all", r["slice"], r["system"]))
            alt = f"{metric}: {'value per window' if kind == 'windows' else 'global value'} with its interval"
            body.append(f"<h3>{'per window' if kind == 'windows' else 'global window'}</h3>\n"
                        f"<img src='data:image/png;base64,{base64.b64encode(data).decode('ascii')}' "
                        f"alt='{html.escape(alt)}'>\n" + _table(prow))
        sections.append(f"<section id='{_slug(metric)}'><h2>{html.escape(metric)}</h2>\n" + "\n".join(body) + "</section>")
    diagrams = reliability_points(rows)
    for bins, points in diagrams.items():
        fig = _plot_reliability(plt, bins, points, level)
        name = f"reliability_{bins}"
        data = _save_png(plt, fig, out_dir, name, pngs)
        alt = f"reliability diagram over {bins} bins: observed click rate against mean predicted probability"
        sections.append(f"<section id='{name}'><h2>reliability diagram (ece[bins={bins}])</h2>\n"
                        f"<p class='note'>Bars: Wilson intervals at level {level:g}; dashed: perfect calibration."
                        f"{'' if any(r['window_start'] is None for r in rows if _bins_of(r) == bins) else ' Windows pooled.'}"
                        f"</p>\n<img src='data:image/png;base64,{base64.b64encode(data).decode('ascii')}' "
                        f"alt='{html.escape(alt)}'>\n" + _reliability_table(bins, points) + "</section>")
    methods = sorted({r.get("ci_method") for r in rows if r.get("ci_method")})
    computed = sum(r["_ci_computed"] for r in rows)
    nav = " | ".join([f"<a href='#{_slug(m)}'>{html.escape(m)}</a>" for m in _metric_order(by_metric)]
                     + [f"<a href='#reliability_{b}'>reliability ({b} bins)</a>" for b in diagrams])
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="note">{len(rows)} metric rows from {html.escape(', '.join(inputs) or 'rows')}; generated {now}.
Intervals: {html.escape(', '.join(methods) or 'none')} (t: Student t on the per-query scores; wilson: Wilson score
interval of a click-through rate; bootstrap: Poisson bootstrap percentile interval; normal: mean &plusmn; z stderr).
{f'* {computed} intervals were computed by the report from value, n and stderr at level {level:g}.' if computed else ''}
Bands and error bars show the interval.</p>
<nav>{nav}</nav>
{''.join(sections)}
</body></html>
"""
    html_path = os.path.join(out_dir, "report.html")
    with open(html_path, "w", encoding="utf-8") as fo:
        fo.write(page)
    return {"html": html_path, "pngs": pngs, "rows": len(rows)}


#: the one line ``report`` prints when matplotlib is not installed (the ``report`` extra)
MISSING_MATPLOTLIB = ("streameval report needs matplotlib, in the report extra: pip install 'streameval[report]' "
                      "(from a clone: pip install -e '.[report]'; make demo installs it)")


def main(argv=None) -> int:
    args = build_arg_parser().parse_args(argv)
    try:
        import matplotlib  # noqa: F401 (checked before any input is read)
    except ImportError:
        print(MISSING_MATPLOTLIB, file=sys.stderr)
        return EXIT_USAGE
    try:
        if not 0 < args.confidence < 1:
            raise ValueError("--confidence must be in (0, 1)")
        rows = read_rows(args.results)
        metrics = split_names(args.metrics) if args.metrics else None
        res = write_report(rows, args.out, title=args.title, level=args.confidence,
                           inputs=[os.path.basename(os.path.normpath(p)) for p in args.results], metrics=metrics)
    except (ValueError, OSError) as e:
        print(f"streameval report: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {res['html']} and {len(res['pngs'])} PNG plots ({res['rows']} rows)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
