"""Parallelism that grows with the input: the batch job at several input sizes with ``--shards auto``.

    python benchmarks/bench_scale.py                                  # 1 M, 10 M and 30 M impressions
    python benchmarks/bench_scale.py --sizes 1000000,3000000 --dir /tmp/bs
    python benchmarks/bench_scale.py --workers 1                      # in-process (one process holds all)
    python benchmarks/bench_scale.py --sizes 2000000 --hot-share 0.3 --hot-query-fraction 0   # a hot query,
                                                                      # without fan-out (issue 16)

The logs are :mod:`bench_beam`'s (10 impressions per request, 10,000 judged queries, files of
500,000 records; written once into ``--dir`` and reused). Each size runs ``streameval batch`` (all of
trec_eval's official measures plus CTR, sliced by device) in its own process, by default on two
worker processes of Beam's local runner (``--direct_running_mode multi_processing``), and prints:

* ``shards``: the request and query shards ``--shards auto`` chose;
* ``largest element``: the most impressions one element of the cleaning and of the scoring stage
  held (the job's ``element_impressions:*`` distributions), and the judgments one scoring element
  read from the side input;
* ``worker peak``: the peak resident memory of the largest worker process (the launcher's children),
  and ``launcher peak``, the process that runs the local runner (it holds the values between stages,
  as a remote runner's shuffle would);
* the wall time and impressions per second.

What should hold: the shard count grows with the input while the largest element and the worker's
peak stay flat (each worker holds about one element at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_beam import _compile_package, write_logs  # noqa: E402


def child(paths, jpath, out, workers: int, hot_fraction=None) -> dict:
    from streameval import cli

    os.environ.setdefault("STREAMEVAL_PROGRESS", "0")
    args = ["batch", "--judgments", jpath, "--metrics", "all_trec", "--slices", "device", "--output", out,
            "--quiet", "--shards", "auto", "--workers", str(workers)]
    if hot_fraction is not None:
        args += ["--hot-query-fraction", str(hot_fraction)]
    for p in paths:
        args += ["--impressions", p]
    t = time.perf_counter()
    code = cli.main(args)
    wall = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"batch job failed with {code}")
    summary = json.load(open(os.path.join(out, "summary.json")))
    el = summary.get("elements", {})
    return {"records": summary["accounting"]["impression"]["read"], "wall": wall, "shards": summary["shards"],
            "clean_max": el.get("element_impressions:clean", {}).get("max"),
            "score_max": el.get("element_impressions:score", {}).get("max"),
            "judgments_max": el.get("element_judgments:score", {}).get("max"),
            "score_elements": el.get("element_impressions:score", {}).get("count"),
            "fan_out_max": el.get("hot_query_fanout", {}).get("max"),
            "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "launcher_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _logs(n: int, work: str, hot_share: float = 0.0):
    tag = f"{n}" if not hot_share else f"{n}-hot{hot_share:g}"
    marker = os.path.join(work, f"written-{tag}.json")
    if os.path.exists(marker):
        return json.load(open(marker))
    t = time.perf_counter()
    d = os.path.join(work, f"logs-{tag}")
    os.makedirs(d, exist_ok=True)
    paths, jpath = write_logs(n, d, hot_share)
    json.dump([paths, jpath], open(marker, "w"))
    print(f"wrote {n:,} impressions in {len(paths)} files ({time.perf_counter() - t:.1f} s)", flush=True)
    return paths, jpath


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000,30000000", help="impressions per run, comma-separated")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the local runner (default 2)")
    ap.add_argument("--dir", default=None, help="keep the generated logs here (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--hot-share", type=float, default=0.0,
                    help="share of the requests that ask one judged query (a hot query; default 0: none)")
    ap.add_argument("--hot-query-fraction", default=None,
                    help="the job's --hot-query-fraction (default: the job's default; 0: no fan-out)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["paths"], spec["jpath"], spec["out"], spec["workers"], spec.get("hot"))))
        return 0
    work = args.dir or tempfile.mkdtemp(prefix="streameval-bench-scale-")
    os.makedirs(work, exist_ok=True)
    _compile_package()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        paths, jpath = _logs(n, work, args.hot_share)
        spec = json.dumps({"paths": paths, "jpath": jpath, "out": os.path.join(work, f"out-{n}"),
                           "workers": args.workers, "hot": args.hot_query_fraction})
        run = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, cwd=ROOT)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        res = json.loads(run.stdout.strip().splitlines()[-1])
        res["size"] = n
        results.append(res)
        print(json.dumps(res), flush=True)
    print(f"\n{'impressions':>12} {'shards':>6} {'largest clean':>13} {'largest score':>13} {'judgments':>9} "
          f"{'score elements':>14} {'fan-out':>7} {'worker peak MB':>14} {'launcher MB':>11} {'wall s':>7} "
          f"{'impr/s':>9}")
    for r in results:
        print(f"{r['records']:>12,} {r['shards']:>6} {r['clean_max']:>13,} {r['score_max']:>13,} "
              f"{r['judgments_max']:>9,} {r['score_elements'] or 0:>14} {r['fan_out_max'] or '-':>7} "
              f"{r['worker_peak_mb']:>14.0f} {r['launcher_peak_mb']:>11.0f} "
              f"{r['wall']:>7.1f} {r['records'] / r['wall']:>9,.0f}")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
