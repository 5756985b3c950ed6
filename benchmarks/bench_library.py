"""streameval's library against pytrec_eval on the same synthetic collection, in one run.

Default: 100,000 queries x 100 retrieved documents (10 million run rows) with graded judgments
(40 per query: 4 million qrels rows, grades 0-4), measures NDCG@10, MAP, MRR@10 (trec_eval's
recip_rank is uncut, so MRR@10 is compared on queries where both agree by definition, see below),
P@10 and recall@100. Each engine runs in its own subprocess, from in-memory arrays, so its wall time
and peak memory (ru_maxrss of the child) are its own; data generation is not timed.

Before timing, both engines score a 2,000-query subset and must agree to 1e-9 per query.

    python benchmarks/bench_library.py                 # the full size
    python benchmarks/bench_library.py --queries 10000 # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

OURS = ["ndcg@10", "map", "mrr@10", "P@10", "recall@100"]
TREC = {"ndcg_cut.10", "map", "recip_rank", "P.10", "recall.100"}


def make_data(n_queries: int, n_docs: int = 100, n_judged: int = 40, seed: int = 7):
    """Integer ids, generated cheaply so the peak memory measured is the engines', not the
    generator's: query q retrieves documents q*100000 + 10*j + u_j (j < n_docs, u_j random in 0..9,
    so distinct); half the judgments are on retrieved documents (every other rank), half on
    documents nobody retrieved; grades 0-4."""
    rng = np.random.default_rng(seed)
    q = np.arange(n_queries, dtype=np.int64)[:, None]
    local = np.arange(n_docs, dtype=np.int64)[None, :] * 10 + rng.integers(0, 10, size=(n_queries, n_docs))
    rq = np.repeat(np.arange(n_queries, dtype=np.int64), n_docs)
    rd = (q * 100_000 + local).ravel()
    rs = rng.random(n_queries * n_docs)
    half = n_judged // 2
    judged_ret = local[:, : 2 * half : 2]
    judged_new = 50_000 + np.arange(n_judged - half, dtype=np.int64)[None, :] + np.zeros((n_queries, 1), np.int64)
    jq = np.repeat(np.arange(n_queries, dtype=np.int64), n_judged)
    jd = (q * 100_000 + np.concatenate([judged_ret, judged_new], axis=1)).ravel()
    jg = rng.integers(0, 5, size=len(jq))
    return rq, rd, rs, jq, jd, jg


def run_streameval(data):
    from streameval.api import aggregate
    from streameval.metrics.kernel import MetricOptions, compute
    from streameval.metrics.names import parse_metrics
    from streameval.metrics.prepare import prepare

    specs = parse_metrics(OURS)
    rq, rd, rs, jq, jd, jg = data
    prep = prepare(rq, rd, rs, jq, jd, jg)
    values = compute(prep.lists, specs, MetricOptions())
    return {s.name: aggregate(values[i], s) for i, s in enumerate(specs)}, values, prep.qids


def run_pytrec_eval(data):
    import pytrec_eval

    rq, rd, rs, jq, jd, jg = data
    qrels: dict = {}
    for q, d, g in zip(jq.tolist(), jd.tolist(), jg.tolist()):
        qrels.setdefault(str(q), {})[str(d)] = int(g)
    run: dict = {}
    for q, d, s in zip(rq.tolist(), rd.tolist(), rs.tolist()):
        run.setdefault(str(q), {})[str(d)] = float(s)
    res = pytrec_eval.RelevanceEvaluator(qrels, TREC).evaluate(run)
    names = {"ndcg_cut_10": "ndcg@10", "map": "map", "recip_rank": "recip_rank", "P_10": "P@10", "recall_100": "recall@100"}
    means = {v: float(np.mean([r[k] for r in res.values()])) for k, v in names.items()}
    return means, res


def child(engine: str, n_queries: int) -> None:
    data = make_data(n_queries)
    t0 = time.perf_counter()
    if engine == "streameval":
        means, _, _ = run_streameval(data)
    else:
        means, _ = run_pytrec_eval(data)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"engine": engine, "wall_s": wall, "peak_bytes": peak, "means": means}))


def check_agreement(n_queries: int = 2000) -> None:
    """Per-query agreement on a subset (recip_rank vs MRR@10: equal where the first relevant
    document is in the top 10, which the check restricts to)."""
    data = make_data(n_queries, seed=11)
    _, values, qids = run_streameval(data)
    _, res = run_pytrec_eval(data)
    cols = {"ndcg_cut_10": 0, "map": 1, "P_10": 3, "recall_100": 4}
    worst = 0.0
    for j, q in enumerate(qids):
        r = res[str(q)]
        for k, i in cols.items():
            worst = max(worst, abs(values[i, j] - r[k]))
        if r["recip_rank"] >= 0.1:
            worst = max(worst, abs(values[2, j] - r["recip_rank"]))
    if worst > 1e-9:
        raise SystemExit(f"engines disagree: max abs difference {worst}")
    print(f"agreement on {n_queries} queries: max abs difference {worst:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--child", choices=["streameval", "pytrec_eval"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.queries)
        return
    check_agreement()
    rows = {}
    for engine in ("pytrec_eval", "streameval"):
        out = subprocess.run([sys.executable, __file__, "--child", engine, "--queries", str(args.queries)],
                             check=True, capture_output=True, text=True).stdout
        rows[engine] = json.loads(out.strip().splitlines()[-1])
    ref = rows["pytrec_eval"]
    print(f"\n{args.queries:,} queries x 100 documents ({args.queries * 100:,} run rows, {args.queries * 40:,} qrels rows)")
    print(f"{'engine':<12} {'wall s':>8} {'peak MB':>9} {'time ratio':>11} {'memory ratio':>13}")
    for engine, r in rows.items():
        print(f"{engine:<12} {r['wall_s']:8.2f} {r['peak_bytes'] / 1e6:9.0f} {r['wall_s'] / ref['wall_s']:11.3f} "
              f"{r['peak_bytes'] / ref['peak_bytes']:13.3f}")
    for m in ("ndcg@10", "map", "P@10", "recall@100"):
        a, b = rows["streameval"]["means"][m], rows["pytrec_eval"]["means"][m]
        print(f"  {m:<11} streameval {a:.6f}  pytrec_eval {b:.6f}")
        if abs(a - b) > 1e-9:
            raise SystemExit(f"means disagree on {m}")


if __name__ == "__main__":
    main()
