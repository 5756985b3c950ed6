"""CPU time of the diversity measures' per-request scoring (``diversity.request_values``), the
Beam jobs' scoring of the diversity measures (batched across requests since 2026-11-27; judgment
matrices and ideal gains once per query).

    PYTHONPATH=. python benchmarks/bench_diversity.py [--requests 20000] [--queries 1000] [--items 20] [--repeat 3]

Prints the best of ``--repeat`` CPU times (user + sys of this process) on a seeded collection:
requests of ``--items`` items, each query with 30 judged documents and 1-5 subtopics each, six
measures. ``--per-query``: one call per query with its requests (as the per-record engine calls it),
judgments of that query only. Compare two checkouts by running each with its own PYTHONPATH.
"""

from __future__ import annotations

import argparse
import random
import resource

import numpy as np

from streameval.metrics import diversity


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--items", type=int, default=20, help="items per request (at most 120)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--per-query", action="store_true", help="one call per query (the per-record engine's calls)")
    args = p.parse_args(argv)
    rnd = random.Random(0)
    jq, js, jd, jg = [], [], [], []
    for q in range(args.queries):
        for d in rnd.sample(range(100), 30):
            for s in range(1, rnd.randint(1, 5) + 1):
                jq.append(f"q{q}")
                js.append(str(s))
                jd.append(f"d{d}")
                jg.append(rnd.randint(0, 2))
    rq, items, offs = [], [], [0]
    for _ in range(args.requests):
        rq.append(f"q{rnd.randrange(args.queries)}")
        items += [f"d{d}" for d in rnd.sample(range(120), args.items)]
        offs.append(len(items))
    specs = [diversity.parse_diversity(n) for n in ("alpha_nDCG@10", "ERR_IA@20", "NRBP", "AP_IA", "P_IA@5",
                                                      "S_recall@20")]
    calls = [(rq, np.array(offs), items, jq, js, jd, jg)]
    if args.per_query:
        calls = []
        jrows, rrows = {}, {}
        for i, q in enumerate(jq):
            jrows.setdefault(q, []).append(i)
        for r, q in enumerate(rq):
            rrows.setdefault(q, []).append(r)
        for q, reqs in sorted(rrows.items()):
            its = [d for r in reqs for d in items[offs[r]:offs[r + 1]]]
            o = np.concatenate([[0], np.cumsum([offs[r + 1] - offs[r] for r in reqs])])
            j = jrows.get(q, [])
            calls.append(([q] * len(reqs), o, its, [jq[i] for i in j], [js[i] for i in j], [jd[i] for i in j],
                          [jg[i] for i in j]))
    best = None
    for _ in range(args.repeat):
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        for call in calls:
            diversity.request_values(specs, *call)
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
        best = cpu if best is None else min(best, cpu)
    print(f"request_values: {args.requests} requests x {args.items} items, {args.queries} queries, {len(jq)} "
          f"subtopic judgments, 6 measures, {len(calls)} call(s): best of {args.repeat} CPU {best:.2f} s "
          f"({args.requests / best:.0f} requests/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
