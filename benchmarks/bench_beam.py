"""Throughput of the Beam batch job on the local runner, against fastavro decoding the same files.

    python benchmarks/bench_beam.py                       # 1,000,000 impressions
    python benchmarks/bench_beam.py --impressions 10000000
    python benchmarks/bench_beam.py --impressions 200000 --profile out.prof   # where the time goes
    python benchmarks/bench_beam.py --stages              # the columnar engine's stages, timed one by one
    python benchmarks/bench_beam.py --workers 2           # the job on 2 worker processes as well

Writes synthetic impression logs (10 impressions per request, 10,000 judged queries of 40 graded
items, 5% of requests on unjudged queries, clicks, two systems, users of 5 requests on average, a
device attribute) in files of
500,000 records, then times, each in its own process:

* ``fastavro``: decoding every record of the files with ``fastavro.reader`` (the reference; the
  job's default Avro decoder is DataFusion, ``--avro-decoder fastavro`` times the job with fastavro);
* ``batch job``: ``streameval batch`` (``streameval.jobs.batch.main``) on ``FnApiRunner``, all ranking
  metrics of trec_eval's official set (``all_trec``) plus CTR, one global window, slice by device.

Prints impressions per second and the ratio to fastavro alone. With ``--profile FILE`` the job runs
under cProfile in this process (FnApiRunner runs the workers in-process) and the top functions by
cumulative and own time are printed: the stages that cost the most per impression. ``--stages``
runs the columnar engine's steps outside Beam, one after the other on all the data (decoding, each
stage's DoFn, including the pickling of the values it passes on, and a pickle round trip of those
bytes where Beam encodes the elements between stages) and prints the
time of each per impression, without cProfile's distortion. The job runs in-process (``--workers 1``);
``--workers N`` also times it on N worker processes (``streameval batch --workers N``).
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
#: requests per user on average (users spread over every file: GAUC's groups cross request shards)
USER_REQUESTS = 5
BASE_TS = 1_700_000_000_000_000


def write_logs(n: int, out_dir: str, hot_share: float = 0.0) -> tuple[list[str], str]:
    """``hot_share``: the share of the requests that ask the judged query ``q0`` (a hot query;
    0: every query equally likely, the logs of the earlier measurements)."""
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
            q = 0 if hot_share and r.random() < hot_share else r.randrange(int(N_QUERIES * 1.05))
            system = "A" if req % 2 else "B"
            device = "pc" if r.random() < 0.6 else "sp"
            user = f"u{r.randrange(max(1, n // (PER_REQUEST * USER_REQUESTS)))}"
            for pos, d in enumerate(r.sample(range(100), PER_REQUEST), 1):
                yield {"event_id": f"e{req}-{pos}", "request_id": f"r{req}", "query_id": f"q{q}", "user_id": user,
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


def stages(paths, jpath, decoder: str) -> None:
    """Time the columnar engine's steps one by one, outside Beam (see the module docstring), with the
    process memory settings of the job on the local runner (streameval/jobs/batch.py)."""
    from streameval import tuning

    tuning.keep_freed_memory()
    with tuning.no_numpy_hugepages():
        _stages(paths, jpath, decoder)


def _stages(paths, jpath, decoder: str) -> None:
    import collections
    import pickle

    from apache_beam import pvalue

    from streameval.beam import columnar as C
    from streameval.beam import columnar_clean, columnar_read, columnar_score
    from streameval.metrics.kernel import MetricOptions
    from streameval.metrics.names import parse_metrics
    from streameval.metrics.prepare import DEFAULT_SCORE_PRECISION

    times: dict = {}

    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        times[name] = time.perf_counter() - t
        return out

    def main_outputs(gen):
        return [x for x in gen if not isinstance(x, pvalue.TaggedOutput)]

    def grouped(pairs):
        by = collections.defaultdict(list)
        for k, v in pairs:
            by[k].append(v)
        return by

    def round_trip(by):
        return {k: [pickle.loads(pickle.dumps(v, 5)) for v in vs] for k, vs in by.items()}

    rd = columnar_read._ReadImpressionColumns(C.SHARDS, decoder=decoder)
    rj = columnar_read._ReadJudgmentColumns(C.SHARDS, decoder=decoder)
    # block by block, as the job does (holding every decoded dict at once would add GC time)
    decode = columns = 0.0
    n = 0
    imps: dict = collections.defaultdict(list)
    for p in paths:
        blocks = rd._blocks(p)
        while True:
            t = time.perf_counter()
            b = next(blocks, None)
            decode += time.perf_counter() - t
            if b is None:
                break
            b = b[0]
            n += len(b) if isinstance(b, list) else b.num_rows
            t = time.perf_counter()
            for k, v in main_outputs(rd._block(b, True) if isinstance(b, list) else rd._table(b)):
                imps[k].append(v)
            columns += time.perf_counter() - t
    times[f"decode impressions ({decoder})"] = decode
    jblocks = timed("decode judgments", lambda: [b for b, _ in rj._blocks(jpath)])
    times["1 columns, checks, shards, pickle: impressions"] = columns
    judg = timed("1 columns, checks, shards, pickle: judgments",
                 lambda: grouped(kv for b in jblocks
                                 for kv in main_outputs(rj._block(b, True) if isinstance(b, list) else rj._table(b))))
    imps = timed("encode + decode 1 -> 2 (pickled bytes)", lambda: round_trip(imps))
    judg = round_trip(judg)
    clean = columnar_clean._CleanShard("bench", True, True, None, [("device",)], "score", C.SHARDS)
    reqs = timed("2 unpickle, clean, CTR counts, re-shard, pickle",
                 lambda: grouped(main_outputs(x for kv in imps.items() for x in clean.work(kv))))
    reqs = timed("encode + decode 2 -> 3 (pickled bytes)", lambda: round_trip(reqs))
    resolve = columnar_score._ResolveShard("latest", "bench")
    resolved = timed("3 unpickle, resolve judgments", lambda: grouped(
        main_outputs(x for kv in judg.items() for x in resolve.work(kv))))
    resolved = round_trip(resolved)
    score = columnar_score._ScoreShard(parse_metrics(["all_trec"]), MetricOptions(), "score", "docno",
                                       DEFAULT_SCORE_PRECISION, None, None, [("device",)])
    timed("3 unpickle, ranking, metrics, means", lambda: [
        main_outputs(score.work((k, vs), resolved.get(k, []))) for k, vs in reqs.items()])
    total = sum(times.values())
    print(f"{'step':<52} {'s':>7} {'us/impression':>14}")
    for name, t in times.items():
        print(f"{name:<52} {t:7.2f} {t / n * 1e6:14.2f}")
    print(f"{'total (' + format(n, ',') + ' impressions)':<52} {total:7.2f} {total / n * 1e6:14.2f}")


def _compile_package() -> None:
    """Byte-compile this checkout's modules, as installing the package does: the timed job then
    loads them as an installed package would, even where PYTHONDONTWRITEBYTECODE keeps Python
    from caching them itself (that costs about 0.3 s of compiling in every run)."""
    import compileall

    for package in ("streameval",):
        compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


def _job(paths, jpath, out, workers=None, decoder=None):
    from streameval import cli  # the ``streameval batch`` command, with its process settings

    args = ["batch", "--judgments", jpath, "--metrics", "all_trec", "--slices", "device", "--output", out, "--quiet"]
    args += ["--workers", str(workers or 1)]
    if decoder:
        args += ["--avro-decoder", decoder]
    for p in paths:
        args += ["--impressions", p]
    return cli.main(args)


def child(kind: str, paths, jpath, out, workers=None, decoder=None) -> dict:
    t = time.perf_counter()
    if kind == "fastavro":
        n = _decode(paths)
    else:
        os.environ.setdefault("STREAMEVAL_PROGRESS", "0")
        code = _job(paths, jpath, out, workers, decoder)
        if code != 0:
            raise SystemExit(f"batch job failed with {code}")
        n = json.load(open(os.path.join(out, "summary.json")))["accounting"]["impression"]["read"]
    wall = time.perf_counter() - t
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,  # worker processes too
               resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return {"kind": kind, "records": n, "wall": wall, "peak_mb": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="keep the generated logs here (default: a temporary directory)")
    ap.add_argument("--profile", default=None, help="run the job under cProfile in this process, save to FILE")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each engine; the fastest is reported")
    ap.add_argument("--stages", action="store_true", help="time the columnar engine's steps one by one")
    ap.add_argument("--workers", type=int, default=None,
                    help="also run the job on this many worker processes (multi_processing)")
    ap.add_argument("--avro-decoder", choices=("datafusion", "fastavro"), default=None,
                    help="the job's (and --stages') Avro decoder (default: the job's default)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.dir or tempfile.mkdtemp(prefix="streameval-bench-beam-")
    os.makedirs(work, exist_ok=True)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["kind"], spec["paths"], spec["jpath"], spec["out"], spec.get("workers"),
                               spec.get("decoder"))))
        return 0
    _compile_package()
    t = time.perf_counter()
    marker = os.path.join(work, f"written-{args.impressions}-users.json")
    if os.path.exists(marker):  # the same logs, written by an earlier run into --dir
        paths, jpath = json.load(open(marker))
        print(f"reusing {args.impressions:,} impressions in {len(paths)} files in {work}")
    else:
        paths, jpath = write_logs(args.impressions, work)
        json.dump([paths, jpath], open(marker, "w"))
        print(f"wrote {args.impressions:,} impressions in {len(paths)} files ({time.perf_counter() - t:.1f} s)")
    if args.stages:
        from streameval.beam.columnar import default_decoder

        stages(paths, jpath, args.avro_decoder or default_decoder())
        return 0
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
    runs = [("fastavro", None), ("job", None)] + ([(f"job x{args.workers}", args.workers)] if args.workers else [])
    for kind, workers in runs:
        spec = json.dumps({"kind": kind, "paths": paths, "jpath": jpath, "out": os.path.join(work, "out"),
                           "workers": workers, "decoder": args.avro_decoder})
        best = None
        for _ in range(max(1, args.repeat)):
            out = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            res["kind"] = kind
            if best is None or res["wall"] < best["wall"]:
                best = res
        results.append(best)
    ref = results[0]["wall"]
    print(f"{'engine':<10} {'records':>11} {'wall s':>8} {'records/s':>11} {'peak MB':>8} {'x fastavro':>10}")
    for r in results:
        print(f"{r['kind']:<10} {r['records']:>11,} {r['wall']:>8.2f} {r['records'] / r['wall']:>11,.0f} "
              f"{r['peak_mb']:>8.0f} {r['wall'] / ref:>10.2f}")
    print("targets: >= 1,000,000 impressions/s and <= 1.5 x fastavro's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
