"""Throughput of the streaming job reading Kafka (issue 40 item 6), on Flink or Prism:
``python benchmarks/bench_stream.py --source kafka --runner flink --impressions 1000000``.

The synthetic log of ``bench_stream.py`` (``make_data``: requests of 10 impressions in event-time
order, two systems, a device attribute, judgments in a file) is produced ahead into a topic of
``--partitions`` partitions with ``streameval produce``'s function (JSON values, the event time as
each record's timestamp), then ``streameval stream --kafka-impressions`` reads it on the engine
(the columnar engine: NDCG@10, MAP, MRR@10, P@10 and CTR in 30-minute windows sliced by device) until
every (window, system) has its final pane file, and is stopped with SIGINT. The engine and a Kafka
broker (with Beam's expansion services) are started by ``streameval cluster up`` for the run and
stopped after it, each by PID.

Reported: the produce rate; the job's rate from its first final pane file to its last (impressions of
the windows after the first, over that time: start-up and the Kafka reader's deployment excluded),
and from the launch to the last; the peak resident memory of each cluster process with its
descendants (TaskManagers, the worker pools and their SDK workers), sampled every 0.5 s.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WINDOW_US = 30 * 60 * 1_000_000
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))


def _default_sigint() -> None:
    """(In the job's process, before exec) SIGINT back to its default action: a benchmark started in
    the background of a non-interactive shell has SIGINT ignored, the job inherited that and ran on
    after the SIGINT that should stop it (the job keeps an ignored signal ignored, as nohup wants)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _up(engine: str, work: str, *extra) -> tuple[dict, str]:
    state = tempfile.mkdtemp(prefix=f"cluster-{engine}-", dir=work)
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", "up", engine, "--state-dir", state,
                           *extra], capture_output=True, text=True, cwd=ROOT, env=_ENV)
    if done.returncode != 0:
        raise SystemExit(f"cluster up {engine}: {done.stderr[-2000:]}")
    return json.loads(done.stdout), state


def _down(state: str) -> None:
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", "down", "--state-dir", state],
                          capture_output=True, text=True, cwd=ROOT, env=_ENV)
    if done.returncode != 0:
        print(f"cluster down: {done.stderr.strip()}", file=sys.stderr)


def run(root: str, runner: str, partitions: int, work: str, metrics: str, timeout: float = 3600,
        job_args=()) -> dict:
    """Produce ``root``'s impressions into a new topic and read them with the stream job on ``runner``
    (``flink`` or ``prism``; ``job_args``: more options of the job, e.g. Beam's); the measurements
    (see the module)."""
    import bench_engines

    from streameval.commands.produce import create_topic, produce
    from streameval.io import avro

    files = sorted(glob.glob(os.path.join(root, "in", "*.avro")))
    per_window: dict = {}
    pairs = set()
    n = 0
    for f in files:  # the windows' sizes (for the rate) and the (window, system) pairs to wait for
        for r in avro.read_records(f, "impression"):
            w = r["timestamp"] // WINDOW_US
            per_window[w] = per_window.get(w, 0) + 1
            pairs.add((w, r["system_id"]))
            n += 1
    kafka, kstate = _up("kafka", work, "--expansion-service")
    engine, estate = _up(runner, work, *(("--taskmanagers", "2", "--slots", "2") if runner == "flink" else ()))
    try:
        bootstrap = kafka["bootstrap_servers"]
        topic = f"bench-{n}-{os.getpid()}"
        create_topic(bootstrap, topic, partitions)
        t0 = time.monotonic()
        for f in files:
            produce(bootstrap, topic, avro.read_records(f, "impression"))
        produce_s = time.monotonic() - t0
        # a new folder each run: a previous run's pane files would count as this run's
        out = tempfile.mkdtemp(prefix=f"out-kafka-{runner}-", dir=work)
        expansion = kafka["flink_expansion_service" if runner == "flink" else "expansion_service"]
        peaks = bench_engines.Peaks({**engine["processes"], **{f"kafka:{k}": v for k, v in kafka["processes"].items()}},
                                    every=0.5)
        peaks.start()
        log, launched = open(os.path.join(work, f"stream-{runner}.log"), "w"), time.time()
        job = subprocess.Popen([sys.executable, "-m", "streameval.cli", "stream", "--kafka-bootstrap", bootstrap,
                                "--kafka-impressions", topic, "--kafka-expansion-service", expansion,
                                "--judgments", os.path.join(root, "judgments.avro"), "--metrics", metrics,
                                "--window", "30m", "--slices", "device", "--quiet", "--report-every", "30",
                                "--output", out, *engine["runner_args"], *job_args],
                               stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=_ENV, start_new_session=True,
                               preexec_fn=_default_sigint)
        try:
            deadline = time.monotonic() + timeout
            while len(glob.glob(os.path.join(out, "metrics-*-final.jsonl"))) < len(pairs):
                if job.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the stream job: exit {job.poll()}, "
                                     f"{len(glob.glob(os.path.join(out, 'metrics-*-final.jsonl')))} of {len(pairs)} "
                                     f"final panes; {log.name}")
                time.sleep(0.5)
            job.send_signal(signal.SIGINT)
            job.wait(120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(30)
            peaks.stop()
            log.close()
        finals = {}
        for f in glob.glob(os.path.join(out, "metrics-*-final.jsonl")):
            with open(f) as fh:
                row = json.loads(fh.readline())
            w = row["window_start"] // WINDOW_US
            finals[w] = max(finals.get(w, 0.0), os.stat(f).st_mtime)
        first_w = min(finals, key=finals.get)
        t_first, t_last = finals[first_w], max(finals.values())
        after = sum(c for w, c in per_window.items() if w > first_w)
        return {"source": "kafka", "runner": runner, "job_args": list(job_args), "impressions": n,
                "partitions": partitions,
                "produce_s": round(produce_s, 1), "produce_per_s": round(n / produce_s),
                "windows": len(per_window), "first_to_last_final_s": round(t_last - t_first, 1),
                "throughput_per_s": round(after / max(t_last - t_first, 1e-9)),
                "launch_to_last_final_s": round(t_last - launched, 1),
                "throughput_with_start_per_s": round(n / max(t_last - launched, 1e-9)),
                "peak_rss_mb": {k: round(v) for k, v in sorted(peaks.peaks.items())}}
    finally:
        _down(estate)
        _down(kstate)
