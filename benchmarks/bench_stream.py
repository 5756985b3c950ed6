"""Throughput of the streaming job: impressions per second through ``streameval stream --watch`` (live
files) and ``--replay``, the delay from the watermark passing a window's end to its on-time pane,
and peak memory, on Beam's local streaming runner (BundleBasedDirectRunner).

    python benchmarks/bench_stream.py                                  # 200k impressions as 20 files
    python benchmarks/bench_stream.py --impressions 1000000 --files 100 --mode watch

The log is synthetic (benchmarks/bench_stream_memory.py's generator: requests of 10 impressions,
200 judged queries and 20 unjudged, two systems, 5 % clicks, a device attribute), written once as
``--files`` Avro files of consecutive event time (cached under ``--data``). Each mode runs the job in
its own process (``--child``), as a user would run it, with NDCG@10, MAP, MRR@10, P@10 and CTR in
30-minute windows sliced by device:

* ``watch``: every file is in the watched directory when the job starts; the watcher reads them in
  name order, with back pressure (at most 40,000 records in flight), moving the watermark after each
  file, and the job ends 2 s after the last file (``--watch-idle-stop 2``). Throughput: impressions /
  (end of the job - first record sent), so start-up is excluded and up to 2 s of idle stop included.
  On-time delay: for each window, the time from the watcher sending the first watermark at or past
  the window's end to the window's on-time pane reaching the console step.
* ``replay``: ``--replay --replay-step 30m --replay-pace 0``: the files are read, then replayed.
* ``session`` (not part of ``both``): session windows, which run on the per-event engine (issue 21,
  item 6): ``streameval stream --replay --impressions IMP --sessions 30m --quiet`` with the job's
  defaults, ``IMP`` the bundled 10,000 Open Bandit impressions
  (``data/sample/impressions/obd_bts_all.avro``; ``--session-impressions``); also reports the
  process's CPU time (user + sys, start-up included), the figure to compare on a shared machine::

    python benchmarks/bench_stream.py --mode session

Printed as a table and, with ``--json``, as one JSON object per mode.

``--source kafka --runner flink|prism``: the same log produced ahead into a Kafka topic and read by the
job on that engine (benchmarks/bench_stream_kafka.py says what is measured)::

    python benchmarks/bench_stream.py --source kafka --runner flink --impressions 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

METRICS = "ndcg@10,map,mrr@10,P@10"


def make_data(directory: str, n_impressions: int, n_files: int) -> str:
    """``directory/<n>-<files>/{in/part-*.avro, judgments.avro}`` (made once)."""
    import bench_stream_memory as gen

    from streameval.io import avro

    root = os.path.join(directory, f"{n_impressions}-{n_files}")
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return root
    os.makedirs(os.path.join(root, "in"), exist_ok=True)
    avro.write_records(os.path.join(root, "judgments.avro"), "judgment", gen.judgments())
    chunks = n_impressions // gen.PER_STEP
    per_file = max(1, chunks // n_files)
    k = 0
    for f in range(n_files):
        recs = []
        for _ in range(per_file if f < n_files - 1 else chunks - k):
            recs += [r for kind, rs in gen.load_chunk(k) if kind == "impressions" for r in rs]
            k += 1
        avro.write_records(os.path.join(root, "in", f"part-{f:05d}.avro"), "impression", recs)
    open(done, "w").close()
    return root


SESSION_IMPRESSIONS = os.path.join(os.path.dirname(HERE), "data", "sample", "impressions", "obd_bts_all.avro")


def session_child(impressions: str, out: str) -> dict:
    """The session-window job on ``impressions`` in this process: wall and CPU seconds, panes."""
    t0 = time.monotonic()
    from streameval.jobs import stream as stream_cli

    code = stream_cli.main(["--replay", "--impressions", impressions, "--sessions", "30m", "--quiet", "--output", out])
    wall = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    summary = json.load(open(os.path.join(out, "summary.json")))
    n = summary["replayed"]["impressions"]
    return {"mode": "session", "exit": code, "impressions": n, "wall_s": round(wall, 1),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
            "throughput_per_s": round(n / wall),
            "panes": sum(v for k, v in summary["counted_here"].items() if k.startswith("panes_") and k != "panes_final")}


def child(mode: str, root: str, out: str, engine: str = "auto") -> dict:
    from streameval.jobs import stream as stream_cli
    from streameval.beam.streaming import console, live

    made = []

    class Recording(live.WatchFiles):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    stream_cli.WatchFiles = Recording
    src = ["--watch", "--watch-interval", "0.2", "--watch-idle-stop", "2"] if mode == "watch" else \
        ["--replay", "--replay-step", "30m", "--replay-pace", "0"]
    args = [*src, "--impressions", os.path.join(root, "in", "*.avro"), "--judgments",
            os.path.join(root, "judgments.avro"), "--metrics", METRICS, "--window", "30m", "--slices", "device",
            "--quiet", "--output", out, *(["--engine", engine] if mode == "watch" else [])]
    t0 = time.monotonic()
    code = stream_cli.main(args)
    wall = time.monotonic() - t0
    summary = json.load(open(os.path.join(out, "summary.json")))
    n = summary["replayed"]["impressions"]
    res = {"mode": mode if mode == "replay" else f"{mode}/{engine}", "exit": code, "impressions": n, "wall_s": round(wall, 1),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "panes": sum(v for k, v in summary["counted_here"].items() if k.startswith("panes_") and k != "panes_final")}
    if mode == "watch":
        w = made[0].watcher
        # from the first record sent to the end of the job (includes up to 2 s of the idle stop)
        res["throughput_per_s"] = round(n / max(time.monotonic() - w.first_sent_at, 1e-9))
        delays = []
        for at, pane, end, _final in console.PANE_LOG:
            if pane != "on_time":
                continue
            sent = next((t for t, wm in w.watermark_log if wm >= end), None)
            if sent is not None:
                delays.append(at - sent)
        delays.sort()
        if delays:
            res["on_time_delay_s"] = {"median": round(delays[len(delays) // 2], 2),
                                      "p90": round(delays[int(len(delays) * 0.9)], 2), "max": round(delays[-1], 2),
                                      "windows": len(delays)}
    else:
        res["throughput_per_s"] = round(n / wall)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--mode", choices=("watch", "replay", "both", "session"), default="both")
    ap.add_argument("--session-impressions", default=SESSION_IMPRESSIONS,
                    help="the impressions of --mode session (default: the bundled Open Bandit bts/all, 10,000)")
    ap.add_argument("--data", default="/tmp/streameval-bench-stream")
    ap.add_argument("--engine", choices=("auto", "columnar", "events"), default="auto",
                    help="the streaming job's engine for --watch (default: the job's choice, columnar here)")
    ap.add_argument("--source", choices=("files", "kafka"), default="files",
                    help="kafka: the log produced into a topic, read on --runner (bench_stream_kafka.py)")
    ap.add_argument("--runner", choices=("flink", "prism"), default="flink", help="the engine of --source kafka")
    ap.add_argument("--partitions", type=int, default=2, help="the topic's partitions (--source kafka)")
    ap.add_argument("--job-arg", action="append", default=[],
                    help="an option for the stream job with --source kafka (e.g. --job-arg=--parallelism=2)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child and a.mode == "session":
        print(json.dumps(session_child(a.session_impressions, a.out)))
        return 0
    root = None if a.mode == "session" else make_data(a.data, a.impressions, a.files)
    if a.source == "kafka":
        import bench_stream_kafka

        res = bench_stream_kafka.run(root, a.runner, a.partitions, a.data, METRICS, job_args=a.job_arg)
        print(json.dumps(res) if a.json else "\n".join(f"{k:>28}: {v}" for k, v in res.items()))
        return 0
    if a.child:
        print(json.dumps(child(a.mode, root, a.out, a.engine)))
        return 0
    results = []
    for mode in (("watch", "replay") if a.mode == "both" else (a.mode,)):
        out = os.path.join(a.data, f"out-{mode}-{os.getpid()}")
        proc = subprocess.run([sys.executable, __file__, "--child", "--mode", mode, "--impressions", str(a.impressions),
                               "--files", str(a.files), "--data", a.data, "--out", out, "--engine", a.engine,
                               "--session-impressions", a.session_impressions],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if a.json:
        for r in results:
            print(json.dumps(r))
        return 0
    print(f"{'mode':16}{'impressions':>12}{'wall s':>9}{'imp/s':>9}{'peak MB':>9}  on-time delay (median / p90 / max s)")
    for r in results:
        d = r.get("on_time_delay_s")
        dl = f"{d['median']} / {d['p90']} / {d['max']} over {d['windows']} windows" if d else \
            (f"- (CPU {r['cpu_s']} s, {r['panes']} panes)" if "cpu_s" in r else "-")
        print(f"{r['mode']:16}{r['impressions']:>12}{r['wall_s']:>9}{r['throughput_per_s']:>9}{r['peak_rss_mb']:>9}  {dl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
