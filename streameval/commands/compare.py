"""``streameval compare QRELS RUN_A RUN_B [RUN_C ...] -m ndcg@10 [-m map ...]``: paired comparison of
run A with each other run on the queries they share.

Per metric and pair: both means, the mean difference ``B - A``, its Student t interval and Poisson
bootstrap percentile interval, the paired t-test and the two-sided sign-flip randomization test
(exact up to ``--exact-max`` queries, else ``--flips`` hash-seeded sign patterns). The numbers come
from :class:`streameval.accumulators.bootstrap.PairedComparison`, the state the Beam jobs merge,
fed with :func:`streameval.api.score_queries`' per-query scores, so they equal the jobs' to the bit.
Metric options are trec_eval's flags (``-l``, ``-c``, ``-M``). Does not import Beam.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

from ..exits import EXIT_USAGE, one_line

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
    p.add_argument("--json", action="store_true", help="print one JSON object per comparison instead of a table")
    return p


def _name(path: str) -> str:
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    return stem if ext in (".run", ".txt", ".trec", ".gz") and stem else base


def compare_runs(qrels, run_a, runs_b, metrics, *, names=None, level: float = 0.95, replicates=None,
                 flips=None, exact_max=None, seed: int = 0, **options) -> tuple[list[dict], dict]:
    """Compare ``run_a`` with each of ``runs_b`` (anything :func:`streameval.api.score_queries`
    reads). Returns (rows, info): one row per (B, metric) with ``system_a, system_b, metric`` and
    the :meth:`PairedComparison.extract` fields; info has the query counts per pair.
    ``options`` go to :func:`~streameval.api.score_queries` (relevance_level, complete, depth ...)."""
    from ..accumulators import bootstrap
    from ..api import score_queries
    from ..metrics.names import parse_metrics

    specs = parse_metrics(metrics)
    names = list(names) if names is not None else ["A"] + [f"B{i + 1}" for i in range(len(runs_b))]
    kw = {"replicates": bootstrap.DEFAULT_REPLICATES if replicates is None else replicates,
          "flips": bootstrap.DEFAULT_FLIPS if flips is None else flips,
          "exact_max": bootstrap.DEFAULT_EXACT_MAX if exact_max is None else exact_max, "seed": seed}

    def per_query(run):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, prep, values = score_queries(qrels, run, specs, **options)
        return {str(q): values[:, j] for j, q in enumerate(prep.qids)}

    a = per_query(run_a)
    rows, info = [], {"pairs": []}
    for name_b, run_b in zip(names[1:], runs_b):
        b = per_query(run_b)
        shared = sorted(set(a) & set(b))
        pc = bootstrap.PairedComparison(len(specs), **kw)
        state = pc.create()
        for q in shared:
            pc.add(state, q, a[q], b[q])
        info["pairs"].append({"system_a": names[0], "system_b": name_b, "queries": len(shared),
                              "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a))})
        for spec, res in zip(specs, pc.extract(state, level)):
            rows.append({"system_a": names[0], "system_b": name_b, "metric": spec.name, **res})
    return rows, info


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


def format_table(rows) -> str:
    pct = f"{rows[0]['ci_level'] * 100:g}%" if rows else "95%"
    header = ("metric", "A", "B", "n", "mean A", "mean B", "B - A", f"{pct} CI (t)", f"{pct} CI (bootstrap)",
              "t", "p (t)", "p (perm)")
    lines = [(r["metric"], r["system_a"], r["system_b"], str(r["num_queries"]), _f(r["mean_a"]), _f(r["mean_b"]),
              _f(r["diff"], "%+.4f"), _interval(r["t_low"], r["t_high"]), _interval(r["boot_low"], r["boot_high"]),
              _f(r["t"], "%.3f"), _p(r["p_t"]), _perm(r)) for r in rows]
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)]
    left = {0, 1, 2}

    def fmt(cells):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])


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
                                  seed=args.seed, relevance_level=args.level, complete=args.complete,
                                  depth=args.depth, gain=args.gain, err_max_grade=args.err_max_grade)
    except (MetricNameError, ValueError, OSError) as e:
        print(f"streameval compare: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        for r in rows:
            print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}))
        return 0
    for p in info["pairs"]:
        extra = ""
        if p["only_a"] or p["only_b"]:
            extra = f" (left out: {p['only_a']} only in {p['system_a']}, {p['only_b']} only in {p['system_b']})"
        print(f"{p['system_b']} vs {p['system_a']}: {p['queries']} paired queries{extra}")
    print(format_table(rows))
    print(f"B - A per query, averaged. CI (t): mean -/+ t(n-1) * stderr; CI (bootstrap): percentile interval of "
          f"{args.replicates} Poisson(1) replicates; p (t): paired t-test; p (perm): two-sided sign-flip "
          f"randomization test, exact up to {args.exact_max} queries, else {args.flips} random sign patterns "
          f"(p = (1 + hits) / (1 + {args.flips}); (min): no pattern reached the observed difference); weights "
          f"and signs hashed from the query id (seed {args.seed}). No correction for multiple comparisons.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
