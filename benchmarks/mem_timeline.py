"""Where the batch job's memory goes: its resident set over time, in this process.

    python benchmarks/mem_timeline.py --case online --impressions 10000000 --dir /tmp/online-bench

Runs one case of ``bench_engines.py`` (``ranking``, ``online``, ``bootstrap``, ``compare``) on the same
synthetic logs (made in ``--dir`` if they are not there yet) as ``streameval batch`` in this process,
on the in-process local runner (FnApiRunner, as the job's default), and samples every ``--every``
seconds:

* the resident set (``/proc/self/statm``, MB);
* the values held in this process between stages (:data:`streameval.beam.columnar_columns._HELD`):
  the exact AUC states (``auc``; a state sent to two keys counts twice) and the frozen columns
  (``parts``: request shards, GAUC parts), MB;
* the innermost streameval function each of the job's threads is in.

Prints about ``--lines`` samples and the peak's, then the job's wall time and peak (``ru_maxrss``).
Linux only. The sampler's own cost is small (one stack walk per sample); the resident set of a run
varies by 10-20 % with how the job's threads overlap, so compare several runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_MB


def _held_mb() -> tuple[float, float]:
    """(AUC states, other held values) in MB, from the held values' arrays and bytes."""
    from streameval.beam.columnar_columns import _HELD

    def size(v) -> int:
        if isinstance(v, dict):
            return sum(size(x) for x in v.values())
        if isinstance(v, (tuple, list)):
            return sum(size(x) for x in v)
        if isinstance(v, (bytes, str)):
            return len(v)
        return int(getattr(v, "nbytes", 0))

    auc = other = 0
    for key, value in list(_HELD.items()):
        if ":c" in key:  # columnar_online._hold_counts' keys
            auc += size(value)
        else:
            other += size(value)
    return auc / 2**20, other / 2**20


def _where() -> str:
    here = threading.get_ident()
    places = set()
    for tid, frame in sys._current_frames().items():
        if tid == here:
            continue
        ours = [f for f in traceback.extract_stack(frame)
                if f"{os.sep}streameval{os.sep}" in f.filename and f"{os.sep}benchmarks{os.sep}" not in f.filename]
        if ours:
            places.add(f"{os.path.basename(ours[-1].filename)}:{ours[-1].lineno}:{ours[-1].name}")
    return " | ".join(sorted(places))


def main(argv=None) -> int:
    import bench_engines

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="online", choices=sorted(bench_engines.CASES))
    ap.add_argument("--impressions", type=int, default=1_000_000)
    ap.add_argument("--dir", default=None, help="the logs (default: a temporary directory)")
    ap.add_argument("--every", type=float, default=0.05, help="seconds between samples")
    ap.add_argument("--lines", type=int, default=60, help="about how many samples to print")
    args = ap.parse_args(argv)
    import tempfile

    work = args.dir or tempfile.mkdtemp(prefix="streameval-mem-")
    paths, jpath = bench_engines._logs(args.impressions, os.path.join(work, str(args.impressions)))
    samples, stop = [], threading.Event()
    t0 = time.perf_counter()

    def sample():
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, _rss_mb(), *_held_mb(), _where()))
            stop.wait(args.every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = os.path.join(work, f"mem-{args.case}-{args.impressions}")
    res = bench_engines.child({"jpath": jpath, "paths": paths, "out": out, "engine": "auto", "case": args.case})
    stop.set()
    sampler.join()
    peak = max(samples, key=lambda s: s[1])
    step = max(1, len(samples) // max(1, args.lines))
    print(f"{'s':>6} {'RSS MB':>7} {'auc MB':>7} {'held MB':>7}  threads in")
    for s in samples[::step] + ([peak] if samples.index(peak) % step else []):
        print(f"{s[0]:6.2f} {s[1]:7.0f} {s[2]:7.0f} {s[3]:7.0f}  {'PEAK ' if s is peak else ''}{s[4][:200]}")
    print(f"{args.case}: {res['records']:,} impressions, {res['wall']:.2f} s, peak RSS {res['peak_mb']:,.0f} MB "
          f"(sampled peak {peak[1]:,.0f} MB at {peak[0]:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
