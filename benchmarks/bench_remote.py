"""The batch job reading its inputs from local files against reading them from S3 (and writing its outputs
there): moto's S3 server on 127.0.0.1, started and stopped here.

    python benchmarks/bench_remote.py                          # 2,000,000 impressions in 4 files
    python benchmarks/bench_remote.py --impressions 2000000 --files 8 --repeat 3

The logs are those of benchmarks/bench_beam.py (its ``write_logs``: 10 impressions per request, 10,000
judged queries, two systems, a device attribute), cut into ``--files`` files, uploaded once to the
server (not timed). Each run is its own process, best of ``--repeat`` (the kinds in turn, so a busy
spell of the machine does not fall on one kind only); the job is bench_beam's
(``streameval batch``, all ranking metrics of trec_eval's official set plus CTR, sliced by device,
``--workers 1``):

* ``local``: inputs from the local files, outputs to a local directory;
* ``s3``: inputs ``s3://BUCKET/in/impressions-*.avro`` and the judgments from S3, outputs to
  ``s3://BUCKET/out``, through Beam's S3 file system as it is: a new boto3 session and client for every
  file-system call (docs/deploy.md, "Beam as it is").

Prints each run's wall time (the whole ``streameval batch`` call in the child process, from argument
parsing to the manifest) and the job's own ``wall_seconds`` (pipeline run, from summary.json), and the
ratio to local. Target: s3 within 1.5 x of local.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_beam  # noqa: E402  (benchmarks/bench_beam.py: the data generator and the job's settings)

TARGET = 1.5
KINDS = ("local", "s3")


def _job_args(impressions: str, judgments: str, out: str) -> list[str]:
    """bench_beam's job (``_job``), on patterns instead of a list of files."""
    return ["batch", "--impressions", impressions, "--judgments", judgments, "--metrics", "all_trec",
            "--slices", "device", "--output", out, "--quiet", "--workers", "1"]


def child(spec: dict) -> dict:
    """One run of the job in this process (a child of :func:`main`)."""
    os.environ.setdefault("STREAMEVAL_PROGRESS", "0")
    from apache_beam.io.filesystems import FileSystems

    from streameval import cli

    args = _job_args(spec["impressions"], spec["judgments"], spec["out"]) + spec.get("beam_args", [])
    t = time.perf_counter()
    code = cli.main(args)
    wall = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"batch job failed with {code}")
    with FileSystems.open(FileSystems.join(spec["out"], "manifest.json")) as fo:  # it names the run's folder
        folder = json.loads(fo.read()).get("folder") or ""
    with FileSystems.open(FileSystems.join(spec["out"], folder, "summary.json") if folder
                          else FileSystems.join(spec["out"], "summary.json")) as fo:
        summary = json.loads(fo.read())
    return {"kind": spec["kind"], "records": summary["accounting"]["impression"]["read"], "wall": wall,
            "job_wall": summary["wall_seconds"], "rows": summary["num_rows"]}


def _run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{spec['kind']} run failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _logs(n: int, files: int, work: str) -> tuple[list[str], str]:
    """bench_beam's logs of ``n`` impressions in ``files`` files (written once per directory)."""
    marker = os.path.join(work, f"written-{n}-{files}.json")
    if os.path.exists(marker):
        paths, jpath = json.load(open(marker))
        print(f"reusing {n:,} impressions in {len(paths)} files in {work}")
        return paths, jpath
    bench_beam.PER_FILE = math.ceil(n / files)  # write_logs cuts its files at PER_FILE records
    t = time.perf_counter()
    paths, jpath = bench_beam.write_logs(n, work)
    json.dump([paths, jpath], open(marker, "w"))
    size = sum(os.path.getsize(p) for p in paths) / 1e6
    print(f"wrote {n:,} impressions in {len(paths)} files ({size:,.0f} MB) in {time.perf_counter() - t:.1f} s")
    return paths, jpath


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=4, help="impression files (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each kind; the fastest is reported")
    ap.add_argument("--dir", default=None, help="keep the generated logs here (default: a temporary directory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from tests.fixtures_s3 import moto_server

    work = args.dir or tempfile.mkdtemp(prefix="streameval-bench-remote-")
    os.makedirs(work, exist_ok=True)
    bench_beam._compile_package()
    paths, jpath = _logs(args.impressions, args.files, work)
    kinds = KINDS
    results = []
    with moto_server() as s3:
        t = time.perf_counter()
        for p in paths:
            s3.upload(p, "in/" + os.path.basename(p))
        s3.upload(jpath, "in/" + os.path.basename(jpath))
        print(f"uploaded the logs to {s3.url('in/')} ({s3.endpoint}) in {time.perf_counter() - t:.1f} s")
        specs = {
            "local": {"impressions": os.path.join(work, "impressions-*.avro"), "judgments": jpath,
                      "out": os.path.join(work, "out")},
            "s3": {"impressions": s3.url("in/impressions-*.avro"), "judgments": s3.url("in/judgments.avro"),
                   "out": s3.url("out"), "beam_args": s3.beam_args},
        }
        best: dict = {}
        for i in range(max(1, args.repeat)):  # round robin: a busy spell of the machine hits every kind
            for kind in kinds:
                res = _run({**specs[kind], "kind": kind})
                print(f"  {kind}, run {i + 1}: {res['wall']:.2f} s (job {res['job_wall']:.2f} s)", flush=True)
                if kind not in best or res["wall"] < best[kind]["wall"]:
                    best[kind] = res
        results = [best[k] for k in kinds]
    ref = results[0]
    if any(r["records"] != ref["records"] or r["rows"] != ref["rows"] for r in results):
        print("error: the runs read different numbers of impressions or wrote different numbers of rows: "
              + ", ".join(f"{r['kind']}: {r['records']} / {r['rows']}" for r in results), file=sys.stderr)
        return 1
    print(f"{'inputs':<18} {'records':>11} {'wall s':>8} {'job s':>7} {'records/s':>11} {'x local':>8}")
    for r in results:
        print(f"{r['kind']:<18} {r['records']:>11,} {r['wall']:>8.2f} {r['job_wall']:>7.2f} "
              f"{r['records'] / r['wall']:>11,.0f} {r['wall'] / ref['wall']:>8.2f}")
    print(f"best of {max(1, args.repeat)}; target: s3 within {TARGET} x of local")
    return 0


if __name__ == "__main__":
    sys.exit(main())
