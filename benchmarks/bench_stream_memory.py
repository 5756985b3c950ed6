"""Memory of the streaming job: peak RSS stays flat as the number of replayed events grows.

    python benchmarks/bench_stream_memory.py                  # 250k, 500k and 1M impressions
    python benchmarks/bench_stream_memory.py --impressions 1000000 --child

Each size runs in its own process (``--child``): a replay of synthetic impressions (10 per
request, a pool of judged queries, clicks) through ``StreamMetrics`` on the local streaming
runner (``BundleBasedDirectRunner``), in 30-minute windows, NDCG@10, MAP, MRR@10, P@10 and CTR.
The replay plays *chunks*: each TestStream element is a chunk number that a loader expands into
that chunk's records, so neither the TestStream nor the driver holds the log (the bounded-memory
claim is about the pipeline's state, not about a list of a million events). The child samples
its resident set size (``/proc/self/statm``) every 0.2 s and reports the peak, the highest RSS in
each tenth of the run and the number of metric rows; the parent prints a table. Memory is flat
when the peak does not grow with the number of events: the open state is the requests and panes
of the open windows, whatever was seen before.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MIN = 60_000_000
BASE = 1_700_000_000_000_000 - 1_700_000_000_000_000 % (24 * 60 * MIN)
PER_REQUEST = 10
N_QUERIES = 200
STEP = 5 * MIN  # event time per replay step (one chunk)
PER_STEP = 2000  # impressions per chunk


def judgments():
    rnd = random.Random(7)
    out = []
    for q in range(N_QUERIES):
        for d in rnd.sample(range(50), 20):
            out.append({"query_id": f"q{q}", "item_id": f"d{d}", "grade": rnd.randint(0, 3), "timestamp": 0,
                        "source": "bench"})
    return out


def load_chunk(k):
    """The records of chunk k: PER_STEP impressions in [BASE + k STEP, BASE + (k+1) STEP)."""
    rnd = random.Random(1000 + k)
    t0 = BASE + k * STEP
    imps = []
    for r in range(PER_STEP // PER_REQUEST):
        rid = f"r{k}-{r}"
        q = rnd.randrange(N_QUERIES + 20)  # 20 queries without judgments
        system = "A" if r % 2 else "B"
        ts = t0 + rnd.randrange(STEP - 2000)
        user = f"u{rnd.randrange(5000)}"
        for pos, d in enumerate(rnd.sample(range(50), PER_REQUEST), 1):
            imps.append({"event_id": f"{rid}/{pos}", "request_id": rid, "query_id": f"q{q}", "user_id": user,
                         "system_id": system, "item_id": f"d{d}", "position": pos, "score": rnd.random(),
                         "clicked": rnd.random() < 0.05, "timestamp": ts + pos, "propensity": None,
                         "attributes": {"device": "pc" if rnd.random() < 0.6 else "mobile"}})
    out = [("impressions", imps)]
    if k == 0:
        out.insert(0, ("judgments", judgments()))
    return out


ROWS = {"rows": 0, "final_rows": 0}


def count_row(row):
    """Counts the metric rows in this process (Beam's local runner drops the counters of elements
    that come from timers, and every pane comes from one)."""
    ROWS["rows"] += 1
    ROWS["final_rows"] += bool(row["is_final"])


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(n_impressions: int, window: str) -> dict:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    from streameval.beam.streaming import Replay, StreamMetrics

    n_chunks = n_impressions // PER_STEP
    steps = []
    for k in range(n_chunks):
        steps += [("chunk", (BASE + k * STEP, k)), ("watermark", BASE + (k + 1) * STEP)]

    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append(_rss_mb())
            time.sleep(0.2)

    import bench_stream_memory as me  # by reference: the local runner shares this module's counts

    me.ROWS.update(rows=0, final_rows=0)

    opts = PipelineOptions([])
    opts.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(runner=BundleBasedDirectRunner(), options=opts)
    src = p | Replay(steps, loader=lambda d: load_chunk(d[1]))
    (src["impressions"]
     | StreamMetrics(src["judgments"], ["ndcg@10", "map", "mrr@10", "P@10"], window=window, slices=["device"])
     | beam.Map(me.count_row))
    start_rss = _rss_mb()
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    t0 = time.perf_counter()
    p.run().wait_until_finish()
    wall = time.perf_counter() - t0
    counts = dict(me.ROWS)
    stop.set()
    th.join()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    by_tenth = []  # the highest RSS in each tenth of the run's wall time
    for i in range(10):
        part = samples[len(samples) * i // 10: len(samples) * (i + 1) // 10]
        by_tenth.append(round(max(part), 1) if part else None)
    return {"impressions": n_chunks * PER_STEP, "windows": n_chunks * STEP // (30 * MIN), "wall_s": round(wall, 1),
            "rss_before_run_mb": round(start_rss, 1), "peak_rss_mb": round(peak, 1), "rss_by_tenth_mb": by_tenth,
            "rows": counts.get("rows", 0), "final_rows": counts.get("final_rows", 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, action="append", default=None,
                    help="sizes to run (default 250000, 500000, 1000000)")
    ap.add_argument("--window", default="30m")
    ap.add_argument("--child", action="store_true", help="run one size in this process (JSON on stdout)")
    args = ap.parse_args(argv)
    sizes = args.impressions or [250_000, 500_000, 1_000_000]
    if args.child:
        print(json.dumps(child(sizes[0], args.window)))
        return 0
    results = []
    for n in sizes:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--impressions", str(n),
                              "--window", args.window], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{r['impressions']:>9,d} impressions  {r['windows']:>4d} windows  {r['wall_s']:>7.1f} s  "
              f"{r['impressions'] / r['wall_s']:>8,.0f} events/s  "
              f"peak RSS {r['peak_rss_mb']:>7.1f} MB  (before run {r['rss_before_run_mb']:.1f} MB)  "
              f"RSS by tenth of the run {r['rss_by_tenth_mb']}  rows {r['rows']}", flush=True)
    growth = results[-1]["peak_rss_mb"] - results[0]["peak_rss_mb"]
    print(f"peak RSS grew {growth:+.1f} MB from {results[0]['impressions']:,d} to {results[-1]['impressions']:,d} "
          f"impressions ({results[-1]['impressions'] / results[0]['impressions']:.0f}x the events)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
