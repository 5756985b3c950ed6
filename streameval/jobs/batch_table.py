"""The batch job's console output: the metric table, the comparison table and the one-line report of its
counters (what `streameval batch` prints after a run; split from streameval/jobs/batch.py)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from streameval.beam.transforms import ALL
from streameval.io import counters as cn

__all__ = ["sort_rows", "format_table", "format_comparisons", "report_line", "fmt_time"]



def _metric_rank(names):
    order = {n: i for i, n in enumerate(names)}

    def key(metric):
        if metric in order:
            return (0, order[metric], 0, metric)
        if metric == "ctr":
            return (1, 0, 0, metric)
        if metric.startswith("ctr@pos"):
            try:
                return (1, 1, int(metric[7:]), metric)
            except ValueError:
                pass
        return (2, 0, 0, metric)

    return key


def fmt_time(micros) -> str:
    if micros is None:
        return "global"
    dt = datetime.fromtimestamp(micros / 1e6, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if micros % 1_000_000 == 0 else dt.isoformat()


def sort_rows(rows, metric_names=()):
    """Rows sorted by window, slice, system, then metric (requested order, then ctr, ctr@pos1...)."""
    mkey = _metric_rank(list(metric_names))
    return sorted(rows, key=lambda r: (r["window_start"] is not None, r["window_start"] or 0,
                                       r["slice"] != "all", r["slice"], r["system"], mkey(r["metric"])))


def format_table(rows, metric_names=()) -> str:
    """A plain-text table of metric rows (sorted as :func:`sort_rows`)."""
    header = ("window", "slice", "system", "metric", "value", "n", "stderr", "interval")
    lines = []
    for r in sort_rows(rows, metric_names):
        v, se = r["value"], r.get("stderr")
        lo, hi = r.get("ci_low"), r.get("ci_high")
        ci = "-" if lo is None or hi is None else f"[{lo:.4f}, {hi:.4f}] {r['ci_level'] * 100:g}% {r['ci_method']}"
        lines.append((
            fmt_time(r["window_start"]), r["slice"], r["system"], r["metric"],
            "nan" if v is None or math.isnan(v) else f"{v:.4f}",
            str(r["num_queries"]),
            "-" if se is None or math.isnan(se) else f"{se:.4f}",
            ci,
        ))
    return _text_table(header, lines, right={4, 5, 6})


def _text_table(header, lines, right=()) -> str:
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [fmt(header), fmt(["-" * w for w in widths])]
    out.extend(fmt(l) for l in lines)
    return "\n".join(out)


def format_comparisons(rows, metric_names=()) -> str:
    """A plain-text table of comparison records (``comparisons.jsonl``): per window, slice, pair and
    metric the mean difference B - A, its bootstrap interval and the t-test and randomization
    p-values."""
    order = {n: i for i, n in enumerate(metric_names)}

    def f(x, fmt="{:.4f}"):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

    lines = [(fmt_time(r["window_start"]), r["slice"], f"{r['system_b']} - {r['system_a']}", r["metric"],
              str(r["num_queries"]), f(r["diff"]), f"[{f(r['boot_low'])}, {f(r['boot_high'])}]",
              f(r["p_t"], "{:.4g}"), f(r["p_perm"], "{:.4g}"))
             for r in sorted(rows, key=lambda r: (r["window_start"] or 0, r["slice"] != ALL, r["slice"],
                                                  r["system_a"], r["system_b"], order.get(r["metric"], len(order)),
                                                  r["metric"]))]
    return _text_table(("window", "slice", "B - A", "metric", "n", "diff", "bootstrap interval", "p (t)",
                        "p (perm)"), lines, right={4, 5, 7, 8})


def report_line(counters: dict, ranked: bool = True, unjudged_file: bool = True) -> str:
    """The requests' fates (when ranking metrics were computed) and the online metrics' counts (the
    records' are in the accounting)."""
    parts = []
    if ranked:
        unjudged, unlisted = counters.get(cn.REQUESTS_UNJUDGED, 0), counters.get(cn.REQUESTS_UNJUDGED_UNLISTED, 0)
        if not unjudged_file:
            where = "not listed: --no-unjudged-file"
        elif unlisted:
            where = (f"{unjudged - unlisted} in unjudged.jsonl; {unlisted} of systems without any judged request, "
                     "not listed")
        else:
            where = "unjudged.jsonl"
        parts.append(f"requests: scored {counters.get(cn.REQUESTS_SCORED, 0)}, without judgments {unjudged} ({where})")
    if counters.get(cn.REQUESTS_COMPLETED):
        parts.append(f"{counters[cn.REQUESTS_COMPLETED]} (query, system) pairs without a request scored 0 (complete)")
    online = [f"{k[len(cn.ONLINE_PREFIX):]} {v}" for k, v in sorted(counters.items())
              if k.startswith(cn.ONLINE_PREFIX) and v]
    if online:
        parts.append("online metrics: " + ", ".join(online))
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# entry point
