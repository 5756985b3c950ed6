"""Throughput of the Beam batch job on the local runner, against fastavro decoding the same files.

    python benchmarks/bench_beam.py                       # 1,000,000 impressions
    python benchmarks/bench_beam.py --impressions 10000000
    python benchmarks/bench_beam.py --impressions 200000 --profile out.prof   # where the time goes

Writes synthetic impression logs (10 impressions per request, 10,000 judged queries of 40 graded
items, 5% of requests on unjudged queries, clicks, two systems, a device attribute) in files of
500,000 records, then times, each in its own process:

* ``fastavro``: decoding every record of the files with ``fastavro.reader`` (the floor);
* ``batch job``: ``streameval batch`` (``pipelines.batch.main``) on ``FnApiRunner``, all ranking
  metrics of trec_eval's official set (``all_trec``) plus CTR, one global window, slice by device.

Prints impressions per second and the ratio to fastavro alone. With ``--profile FILE`` the job runs
under cProfile in this process (FnApiRunner runs the workers in-process) and the top functions by
cumulative and own time are printed: the stages that cost the most per impression.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PER_REQUEST = 10
N_QUERIES = 10_000
PER_FILE = 500_000
BASE_TS = 1_700_000_000_000_000


def write_logs(n: int, out_dir: str) -> tuple[list[str], str]:
    from streameval.io import avro

    rnd = random.Random(5)
    judg = []
    for q in range(N_QUERIES):
        for d in rnd.sample(range(100), 40):
            judg.append({"query_id": f"q{q}", "item_id": f"d{d}", "grade": rnd.randint(0, 3), "timestamp": 0,
                         "source": "bench"})
    jpath = os.path.join(out_dir, "judgments.avro")
    avro.write_records(jpath, "judgment", judg)

    def gen(start, stop):
        r = random.Random(start)
        for req in range(start // PER_REQUEST, stop // PER_REQUEST):
            q = r.randrange(int(N_QUERIES * 1.05))
            system = "A" if req % 2 else "B"
            device = "pc" if r.random() < 0.6 else "sp"
            for pos, d in enumerate(r.sample(range(100), PER_REQUEST), 1):
                yield {"event_id": f"e{req}-{pos}", "request_id": f"r{req}", "query_id": f"q{q}", "user_id": None,
                       "system_id": system, "item_id": f"d{d}", "position": pos, "score": r.random(),
                       "clicked": r.random() < 0.05, "timestamp": BASE_TS + req * 1000 + pos, "propensity": None,
                       "attributes": {"device": device}}

    paths = []
    for i, start in enumerate(range(0, n, PER_FILE)):
        p = os.path.join(out_dir, f"impressions-{i:03d}.avro")
        avro.write_records(p, "impression", gen(start, min(n, start + PER_FILE)))
        paths.append(p)
    return paths, jpath


def _decode(paths) -> int:
    import fastavro

    n = 0
    for p in paths:
        with open(p, "rb") as fo:
            for _ in fastavro.reader(fo):
                n += 1
    return n


def _job(paths, jpath, out):
    from pipelines import batch

    args = ["--judgments", jpath, "--metrics", "all_trec", "--slices", "device", "--output", out, "--quiet"]
    for p in paths:
        args += ["--impressions", p]
    return batch.main(args)


def child(kind: str, paths, jpath, out) -> dict:
    t = time.perf_counter()
    if kind == "fastavro":
        n = _decode(paths)
    else:
        os.environ.setdefault("STREAMEVAL_PROGRESS", "0")
        code = _job(paths, jpath, out)
        if code != 0:
            raise SystemExit(f"batch job failed with {code}")
        n = json.load(open(os.path.join(out, "summary.json")))["accounting"]["impression"]["read"]
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": kind, "records": n, "wall": wall, "peak_mb": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="keep the generated logs here (default: a temporary directory)")
    ap.add_argument("--profile", default=None, help="run the job under cProfile in this process, save to FILE")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="streameval-bench-beam-")
    os.makedirs(work, exist_ok=True)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["kind"], spec["paths"], spec["jpath"], spec["out"])))
        return 0
    t = time.perf_counter()
    paths, jpath = write_logs(args.impressions, work)
    print(f"wrote {args.impressions:,} impressions in {len(paths)} files ({time.perf_counter() - t:.1f} s)")
    if args.profile:
        import cProfile
        import pstats

        os.environ["STREAMEVAL_PROGRESS"] = "0"
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.runcall(_job, paths, jpath, os.path.join(work, "out-prof"))
        wall = time.perf_counter() - t
        prof.dump_stats(args.profile)
        print(f"profiled job: {wall:.1f} s, {args.impressions / wall:,.0f} impressions/s (under cProfile)")
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(25)
        return 0
    results = []
    for kind in ("fastavro", "job"):
        spec = json.dumps({"kind": kind, "paths": paths, "jpath": jpath, "out": os.path.join(work, "out")})
        out = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ref = results[0]["wall"]
    print(f"{'engine':<10} {'records':>11} {'wall s':>8} {'records/s':>11} {'peak MB':>8} {'x fastavro':>10}")
    for r in results:
        print(f"{r['kind']:<10} {r['records']:>11,} {r['wall']:>8.2f} {r['records'] / r['wall']:>11,.0f} "
              f"{r['peak_mb']:>8.0f} {r['wall'] / ref:>10.2f}")
    print("targets: >= 1,000,000 impressions/s and <= 1.5 x fastavro's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
