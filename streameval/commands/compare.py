"""``streameval compare QRELS RUN_A RUN_B [RUN_C ...] -m ndcg@10 [-m map ...]``: paired comparison of
run A with each other run on the queries they share.

Per metric and pair: both means, the mean difference ``B - A``, its Student t interval and Poisson
bootstrap percentile interval, the paired t-test and the two-sided sign-flip randomization test
(exact up to ``--exact-max`` queries, else ``--flips`` hash-seeded sign patterns). The numbers come
from :class:`streameval.accumulators.paired.PairedComparison`, the state the Beam jobs merge,
fed with :func:`streameval.api.score_queries`' per-query scores, so they equal the jobs' to the bit.
Metric options are trec_eval's flags (``-l``, ``-c``, ``-M``). Does not import Beam.

With more than one B: ``--adjust holm|bh`` adds p-values adjusted per metric over the comparisons
with A (Holm's family-wise, Benjamini-Hochberg's false discovery rate or Bonferroni's adjustment),
``--all-pairs`` compares every pair of runs instead of A with each other run, ``--tukey``
adds Tukey's HSD of all pairs of runs per metric on the queries every run scored
(:mod:`streameval.metrics.multiple`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from ..exits import EXIT_USAGE, one_line
from ..metrics.multiple import ADJUST_METHODS

__all__ = ["main", "compare_runs", "build_arg_parser"]


def build_arg_parser() -> argparse.ArgumentParser:
    from ..accumulators.bootstrap import DEFAULT_EXACT_MAX, DEFAULT_FLIPS, DEFAULT_REPLICATES

    p = argparse.ArgumentParser(
        prog="streameval compare",
        description="Paired comparison of TREC run A with each further run on the same queries: mean difference "
                    "(B - A), t and bootstrap intervals, paired t-test, sign-flip randomization test.")
    p.add_argument("qrels", help="TREC qrels file")
    p.add_argument("run_a", help="baseline run (A)")
    p.add_argument("runs_b", nargs="+", metavar="run_b", help="run(s) compared with A (B); difference is B - A")
    p.add_argument("-m", dest="metrics", action="append", default=None, metavar="METRIC",
                   help="metric (ndcg@10, map, P_10, ndcg_cut.10, ...); repeatable (default: ndcg@10 and map)")
    p.add_argument("-l", dest="level", type=float, default=1, help="relevance level (trec_eval -l; default 1)")
    p.add_argument("-c", dest="complete", action="store_true",
                   help="every judged query counts; a run without results for it scores 0 (trec_eval -c)")
    p.add_argument("-M", dest="depth", type=int, default=None, help="top DEPTH documents per query (trec_eval -M)")
    p.add_argument("--gain", choices=("linear", "exponential"), default="linear")
    p.add_argument("--err-max-grade", type=float, default=4)
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    p.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES,
                   help=f"Poisson bootstrap replicates (default {DEFAULT_REPLICATES})")
    p.add_argument("--flips", type=int, default=DEFAULT_FLIPS,
                   help=f"random sign patterns of the randomization test (default {DEFAULT_FLIPS})")
    p.add_argument("--exact-max", type=int, default=DEFAULT_EXACT_MAX,
                   help=f"enumerate all 2^n sign patterns up to this many queries (default {DEFAULT_EXACT_MAX})")
    p.add_argument("--seed", type=int, default=0, help="keys the hash of the bootstrap weights and signs (default 0)")
    p.add_argument("--adjust", choices=ADJUST_METHODS, default="none",
                   help="adjust the p-values of the t and randomization tests for multiple comparisons, per metric "
                        "over the comparisons of every B with A: holm (Holm 1979, family-wise error rate), bh "
                        "(Benjamini-Hochberg 1995, false discovery rate), bonferroni (family-wise, single step); adds the columns p (t, METHOD) and "
                        "p (perm, METHOD), the JSON fields p_t_adj and p_perm_adj (default none: raw p-values only)")
    p.add_argument("--tukey", action="store_true",
                   help="also print Tukey's HSD (Tukey 1949) of all pairs of runs per metric: mean difference, "
                        "family-wise adjusted p-value, simultaneous --confidence interval, reject; one-way, runs as "
                        "groups of per-query scores on the queries every run scored (as ranx); with --json, one "
                        "object per pair with \"test\": \"tukey_hsd\"")
    p.add_argument("--all-pairs", action="store_true",
                   help="compare every pair of runs (A-B1, A-B2, B1-B2, ...; difference: the later run minus the "
                        "earlier) instead of A with each other run; --adjust's family is then every pair, per metric "
                        "(the library: streameval.compare)")
    p.add_argument("--json", action="store_true", help="print one JSON object per comparison instead of a table")
    return p


def _name(path: str) -> str:
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    return stem if ext in (".run", ".txt", ".trec", ".gz") and stem else base


def compare_runs(qrels, run_a, runs_b, metrics, *, names=None, level: float = 0.95, replicates=None,
                 flips=None, exact_max=None, seed: int = 0, adjust: str = "none", tukey: bool = False,
                 all_pairs: bool = False, **options) -> tuple[list[dict], dict]:
    """Compare ``run_a`` with each of ``runs_b`` (anything :func:`streameval.api.score_queries`
    reads). Returns (rows, info): one row per (B, metric) with ``system_a, system_b, metric`` and
    the :meth:`PairedComparison.extract` fields; info has the query counts per pair.
    ``options`` go to :func:`~streameval.api.score_queries` (relevance_level, complete, depth ...).
    ``all_pairs``: every pair ``(i, j)``, ``i < j``, of the runs ``[run_a, *runs_b]`` instead
    (``system_a`` the earlier run; the adjustment's family is then every pair, per metric).

    ``adjust`` (``"none"``, ``"holm"``, ``"bh"``): unless none, each row also gets ``adjust`` (the
    method), ``p_t_adj`` and ``p_perm_adj``: ``p_t`` and ``p_perm`` adjusted over one family per
    metric, the comparisons of every B with A (:func:`~streameval.metrics.multiple.adjust_pvalues`;
    a NaN p-value stays NaN and is not counted). ``tukey``: info also gets ``"tukey"``, one dict
    per (metric, pair of systems ``i < j`` in the order given) with ``test="tukey_hsd"``, ``metric,
    system_a, system_b`` (systems ``i`` and ``j``), ``num_queries, num_systems, mean_a, mean_b,
    diff`` (``mean_b - mean_a``), ``stderr, q, p_tukey, ci_low, ci_high, ci_level, reject, df``
    from :func:`~streameval.metrics.multiple.tukey_hsd` on the per-query scores of every system
    (as groups) on the queries all of them scored with a finite score for that metric; and
    ``"tukey_queries"``, the number of queries all systems scored. ValueError for an unknown
    ``adjust``, or with ``tukey`` when fewer than two queries are shared by all systems."""
    from ..accumulators import bootstrap, paired
    from ..api_compare import scores_by_query
    from ..metrics import multiple
    from ..metrics.names import parse_metrics

    if adjust not in ADJUST_METHODS:
        raise ValueError(f"adjust must be one of {', '.join(ADJUST_METHODS)}, got {adjust!r}")
    specs = parse_metrics(metrics, arithmetic="the paired tests of compare")
    names = list(names) if names is not None else ["A"] + [f"B{i + 1}" for i in range(len(runs_b))]
    kw = {"replicates": bootstrap.DEFAULT_REPLICATES if replicates is None else replicates,
          "flips": bootstrap.DEFAULT_FLIPS if flips is None else flips,
          "exact_max": bootstrap.DEFAULT_EXACT_MAX if exact_max is None else exact_max, "seed": seed}

    scored = [scores_by_query(qrels, run, specs, **options)[0] for run in (run_a, *runs_b)]
    rows, info = [], {"pairs": []}
    pairs = ([(i, j) for i in range(len(scored)) for j in range(i + 1, len(scored))] if all_pairs
             else [(0, j) for j in range(1, len(scored))])
    for i, j in pairs:
        a, b, name_a, name_b = scored[i], scored[j], names[i], names[j]
        shared = sorted(set(a) & set(b))
        pc = paired.PairedComparison(len(specs), **kw)
        state = pc.create()
        for q in shared:
            pc.add(state, q, a[q], b[q])
        info["pairs"].append({"system_a": name_a, "system_b": name_b, "queries": len(shared),
                              "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a))})
        for spec, res in zip(specs, pc.extract(state, level)):
            rows.append({"system_a": name_a, "system_b": name_b, "metric": spec.name, **res})
    if adjust != "none":
        for spec in specs:
            family = [r for r in rows if r["metric"] == spec.name]
            for key in ("p_t", "p_perm"):
                adj = multiple.adjust_pvalues([r[key] for r in family], adjust)
                for r, v in zip(family, adj.tolist()):
                    r["adjust"], r[key + "_adj"] = adjust, v
    if tukey:
        info["tukey"] = _tukey_rows(specs, names, scored, level)
        info["tukey_queries"] = len(set.intersection(*(set(s) for s in scored)))
    return rows, info


def _tukey_rows(specs, names, scored, level) -> list[dict]:
    """Tukey's HSD per metric on the queries every system scored (finite scores only)."""
    import numpy as np

    from ..metrics import multiple

    common = sorted(set.intersection(*(set(s) for s in scored)))
    out = []
    for j, spec in enumerate(specs):
        table = np.array([[s[q][j] for s in scored] for q in common], dtype=np.float64)
        table = table.reshape(len(common), len(scored))
        table = table[np.isfinite(table).all(axis=1)]
        if table.shape[0] < 2:
            raise ValueError(f"Tukey's HSD for {spec.name}: fewer than two queries scored by every run "
                             f"({table.shape[0]})")
        res = multiple.tukey_hsd(table.T, level)
        for p, (i, k) in enumerate(res.pairs.tolist()):
            out.append({"test": "tukey_hsd", "metric": spec.name, "system_a": names[i], "system_b": names[k],
                        "num_queries": int(table.shape[0]), "num_systems": len(scored),
                        "mean_a": float(res.means[i]), "mean_b": float(res.means[k]), "diff": float(res.diff[p]),
                        "stderr": float(res.stderr[p]), "q": float(res.q[p]), "p_tukey": float(res.pvalue[p]),
                        "ci_low": float(res.low[p]), "ci_high": float(res.high[p]), "ci_level": res.level,
                        "reject": bool(res.reject[p]), "df": res.df})
    return out


def _f(x, fmt="%.4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt % x


def _p(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "%.4f" % x if x >= 1e-4 else "%.1e" % x


def _perm(r) -> str:
    if r["perm_method"] == "exact":
        return _p(r["p_perm"]) + " (exact)"
    if r["perm_method"] == "monte-carlo" and r["p_perm"] == 1 / (r["perm_samples"] + 1):
        return _p(r["p_perm"]) + " (min)"  # no random sign pattern reached the observed difference
    return _p(r["p_perm"])


def _interval(lo, hi) -> str:
    return f"[{_f(lo, '%+.4f')}, {_f(hi, '%+.4f')}]"


def _layout(header, lines, left) -> str:
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])


def format_table(rows) -> str:
    pct = f"{rows[0]['ci_level'] * 100:g}%" if rows else "95%"
    header = ("metric", "A", "B", "n", "mean A", "mean B", "B - A", f"{pct} CI (t)", f"{pct} CI (bootstrap)",
              "t", "p (t)", "p (perm)")
    lines = [(r["metric"], r["system_a"], r["system_b"], str(r["num_queries"]), _f(r["mean_a"]), _f(r["mean_b"]),
              _f(r["diff"], "%+.4f"), _interval(r["t_low"], r["t_high"]), _interval(r["boot_low"], r["boot_high"]),
              _f(r["t"], "%.3f"), _p(r["p_t"]), _perm(r)) for r in rows]
    method = rows[0].get("adjust") if rows else None
    if method:  # adjusted p-values (--adjust): two more columns
        header += (f"p (t, {method})", f"p (perm, {method})")
        lines = [l + (_p(r["p_t_adj"]), _p(r["p_perm_adj"])) for l, r in zip(lines, rows)]
    return _layout(header, lines, {0, 1, 2})


def format_tukey(rows) -> str:
    """The table of :func:`compare_runs`' ``info["tukey"]`` rows."""
    pct = f"{rows[0]['ci_level'] * 100:g}%" if rows else "95%"
    header = ("metric", "A", "B", "n", "B - A", f"{pct} simultaneous CI", "q", "p (Tukey)", "reject")
    lines = [(r["metric"], r["system_a"], r["system_b"], str(r["num_queries"]), _f(r["diff"], "%+.4f"),
              _interval(r["ci_low"], r["ci_high"]), _f(r["q"], "%.3f"), _p(r["p_tukey"]),
              "yes" if r["reject"] else "no") for r in rows]
    return _layout(header, lines, {0, 1, 2})


def main(argv=None) -> int:
    from ..io import trec
    from ..metrics.names import MetricNameError

    args = build_arg_parser().parse_args(argv)
    metrics = args.metrics or ["ndcg@10", "map"]
    try:
        if not 0 < args.confidence < 1:
            raise ValueError("--confidence must be in (0, 1)")
        if args.replicates < 0 or args.flips < 0 or args.exact_max < 0:
            raise ValueError("--replicates, --flips and --exact-max must be >= 0")
        qrels = trec.read_qrels(args.qrels)
        if len(qrels) == 0:
            raise trec.InputFormatError(args.qrels, None, "empty qrels file (no judgment lines)")
        paths = [args.run_a, *args.runs_b]
        runs = [trec.read_run(p) for p in paths]
        for p, run in zip(paths, runs):
            if len(run) == 0:  # as trec-eval: a comparison with n = 0 is no comparison
                raise trec.InputFormatError(p, None, "empty run file (no result lines)")
        names = [_name(p) for p in paths]
        if len(set(names)) < len(names):
            names = paths
        rows, info = compare_runs(qrels, runs[0], runs[1:], metrics, names=names, level=args.confidence,
                                  replicates=args.replicates, flips=args.flips, exact_max=args.exact_max,
                                  seed=args.seed, adjust=args.adjust, tukey=args.tukey, all_pairs=args.all_pairs,
                                  relevance_level=args.level, complete=args.complete,
                                  depth=args.depth, gain=args.gain, err_max_grade=args.err_max_grade)
    except (MetricNameError, ValueError, OSError) as e:
        print(f"streameval compare: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        for r in rows + info.get("tukey", []):
            print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}))
        return 0
    # the header names the runs as the table does: its columns A and B, the names in them
    for p in info["pairs"]:
        extra = ""
        if p["only_a"] or p["only_b"]:
            extra = f" (left out: {p['only_a']} only in A, {p['only_b']} only in B)"
        print(f"A = {p['system_a']}, B = {p['system_b']}: {p['queries']} paired queries{extra}")
    print(format_table(rows))
    print(f"B - A per query, averaged. CI (t): mean -/+ t(n-1) * stderr; CI (bootstrap): percentile interval of "
          f"{args.replicates} Poisson(1) replicates; p (t): paired t-test; p (perm): two-sided sign-flip "
          f"randomization test, exact up to {args.exact_max} queries, else {args.flips} random sign patterns "
          f"(p = (1 + hits) / (1 + {args.flips}); (min): no pattern reached the observed difference); weights "
          f"and signs hashed from the query id (seed {args.seed}). " + _adjust_note(args.adjust, len(info["pairs"]), args.all_pairs))
    if args.tukey:
        print()
        print(f"Tukey HSD, all pairs of the {len(paths)} runs, on the {info['tukey_queries']} queries every run "
              f"scored:")
        print(format_tukey(info["tukey"]))
        print(f"One-way Tukey HSD per metric (runs as groups of per-query scores, pooled variance, "
              f"df = runs x (queries - 1)): p (Tukey) and the {args.confidence * 100:g}% simultaneous intervals hold "
              f"for all pairs of a metric at once; reject: the interval excludes 0. It ignores the pairing by "
              f"query (query difficulty goes into its error term), so it is usually less powerful than the "
              f"paired tests above.")
    return 0


def _adjust_note(method: str, m: int, all_pairs: bool = False) -> str:
    if method == "none":
        return "No correction for multiple comparisons."
    what = {"holm": "Holm's step-down method (family-wise error rate)",
            "bh": "the Benjamini-Hochberg method (false discovery rate)",
            "bonferroni": "Bonferroni's method (family-wise error rate)"}[method]
    return (f"p (t, {method}) and p (perm, {method}): the p-values adjusted by {what}, per metric over its {m} "
            f"comparison{'s' if m != 1 else ''}" + (" (all pairs)." if all_pairs else " with A."))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
