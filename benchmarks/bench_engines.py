"""The batch job's options on the columnar engine against the per-record engine (issue 22's targets).

    python benchmarks/bench_engines.py --impressions 10000000 --records-impressions 200000 --repeat 3

On the synthetic logs of ``bench_beam.py`` (10 impressions per request, two systems, users of five
requests, a device attribute; one global window, slices by device), each case runs as
``streameval batch`` in its own process, best of ``--repeat``:

* ``ranking``: ``all_trec`` and CTR (the reference of the other cases' ratios);
* ``online``: ``auc,gauc[user,impressions],clicks@10,rr_first_click`` (labels from clicks);
* ``bootstrap``: ``all_trec`` and CTR with ``--ci bootstrap --replicates 200``;
* ``compare``: ``all_trec`` and CTR with ``--compare-baseline B``.

Each case runs on the engine the job picks (``auto``: the columnar one where it covers the options)
and, on ``--records-impressions`` impressions (the per-record engine is too slow for 10 M), with
``--engine records``: yesterday's path for the options the columnar engine did not cover. Prints wall
time (best of the runs), CPU time (user + sys of the job's process and its children, the best run;
steadier than wall time on a shared machine), impressions per CPU second, peak RSS and the ratios to
the ranking case on the same input (wall, CPU, memory). ``--base DIR`` runs another checkout's code
(e.g. ``git archive main | tar -x -C DIR``) on the same logs, the two alternating run by run.

Targets (issue 22): ``online`` >= 800,000 impressions/s at 10 M; ``bootstrap`` <= 2 x ``ranking``;
``compare`` <= 1.2 x ``ranking``; peak memory within 1.3 x of ``ranking``.

Off the in-process runner (issue 37 item 5)::

    python benchmarks/bench_engines.py --runner flink --impressions 10000000 --cases ranking --dir DIR
    python benchmarks/bench_engines.py --runner local --local-workers 2 --impressions 10000000 --cases ranking --dir DIR

``--runner flink`` or ``prism`` starts the engine with ``streameval cluster up`` (its state in a
temporary directory; Flink: ``--taskmanagers``, ``--slots``; the job runs with ``--parallelism``
2, ``--flink-parallelism`` to change it: Flink fills one TaskManager's slots first, so both subtasks
share a TaskManager) before the first run and stops it by
PID after the last; every run appends the cluster's ``runner_args``. ``--runner local`` runs Beam's
local runner with ``--workers N`` (``--local-workers``; N > 1: its multi-process mode). While each run
goes, the peak RSS of each cluster process with all its descendants (``taskmanager-1``,
``worker_pool-1`` with the SDK workers it started, ...; for ``local``, the job's process tree) is
sampled from /proc every 0.2 s and printed after the run (``--json FILE`` keeps the results). The
target of issue 37: each TaskManager's and worker pool's peak grows at most 1.2 x from 10 M to 30 M,
and Flink's wall time is within 1.5 x of the local multi-process runner's at 10 M.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = {
    "ranking": ["--metrics", "all_trec"],
    "online": ["--metrics", "auc,gauc[user,impressions],clicks@10,rr_first_click", "--labels", "clicks"],
    "bootstrap": ["--metrics", "all_trec", "--ci", "bootstrap", "--replicates", "200"],
    "compare": ["--metrics", "all_trec", "--compare-baseline", "B"],
}


def _logs(n: int, work: str):
    import bench_beam

    marker = os.path.join(work, f"written-{n}-users.json")
    if os.path.exists(marker):
        return json.load(open(marker))
    os.makedirs(work, exist_ok=True)
    paths, jpath = bench_beam.write_logs(n, work)
    json.dump([paths, jpath], open(marker, "w"))
    return paths, jpath


def child(spec: dict) -> dict:
    from streameval import cli

    os.environ.setdefault("STREAMEVAL_PROGRESS", "0")
    args = ["batch", "--judgments", spec["jpath"], "--slices", "device", "--output", spec["out"], "--quiet",
            "--engine", spec["engine"], *CASES[spec["case"]], *spec.get("runner_args", [])]
    for p in spec["paths"]:
        args += ["--impressions", p]
    t = time.perf_counter()
    code = cli.main(args)
    wall = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"batch job failed with {code}")
    summary = json.load(open(os.path.join(spec["out"], "summary.json")))
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return {"records": summary["accounting"]["impression"]["read"], "wall": wall, "peak_mb": peak,
            "engine": summary["engine"]}


def _once(spec: dict, tree: str) -> dict:
    """One run of a case in its own process, with the code of ``tree`` (this checkout or ``--base``):
    its wall time and peak RSS as the child reports them, and the CPU time (user + sys) of the child
    and every process it waited for, from this process's RUSAGE_CHILDREN before and after."""
    env = dict(os.environ, PYTHONPATH=tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        proc = subprocess.Popen([sys.executable, os.path.join(tree, "benchmarks", "bench_engines.py"), "--child",
                                 json.dumps(spec)], stdout=so, stderr=se, text=True, cwd=tree, env=env)
        sampler = Peaks({**spec.get("processes", {}), "job": proc.pid})
        sampler.start()
        code = proc.wait()
        sampler.stop()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if code != 0:
        raise SystemExit(stderr[-3000:])
    res = json.loads(stdout.strip().splitlines()[-1])
    res["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res["tree_peak_mb"] = sampler.peaks
    res["tree_cpu_s"] = sampler.cpu
    # off the in-process runner the work is the cluster's: its processes' CPU time is added
    res["cpu"] += sum(v for k, v in sampler.cpu.items() if k != "job")
    return res


def _children() -> dict:
    """{pid: [child pid, ...]} of every process, from /proc/PID/stat."""
    kids: dict = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``: its own and its reaped children's (user + system)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_usage(pid: int, kids: dict) -> tuple[float, float]:
    """(resident MB, CPU seconds) of ``pid`` and all its descendants, now (a descendant that ended is
    in its parent's CPU once reaped)."""
    rss, cpu, todo = 0.0, 0.0, [pid]
    while todo:
        p = todo.pop()
        rss += _rss_mb(p)
        cpu += _cpu_s(p)
        todo.extend(kids.get(p, ()))
    return rss, cpu


class Peaks(threading.Thread):
    """Samples, every ``every`` seconds until :meth:`stop`, the RSS and CPU time of each named process
    with its descendants; ``peaks``: {name: highest MB seen}; ``cpu``: {name: CPU seconds between the
    first and the last sample}."""

    def __init__(self, pids: dict, every: float = 0.2):
        super().__init__(daemon=True)
        self.pids, self.every, self.peaks = pids, every, {n: 0.0 for n in pids}
        self._first: dict = {}
        self.cpu: dict = {}
        self._done = threading.Event()

    def run(self):
        while True:
            kids = _children()
            for name, pid in self.pids.items():
                rss, cpu = tree_usage(pid, kids)
                self.peaks[name] = max(self.peaks[name], rss)
                self._first.setdefault(name, cpu)
                if cpu:
                    self.cpu[name] = cpu - self._first[name]
            if self._done.is_set():
                return
            self._done.wait(self.every)

    def stop(self):
        self._done.set()
        self.join()


def _run(spec: dict, repeat: int, trees=(ROOT,)) -> list[dict]:
    """Best of ``repeat`` runs (by CPU time) for each tree; the trees alternate run by run, so old
    and new code see the same load."""
    best = [None] * len(trees)
    for _ in range(max(1, repeat)):
        for i, tree in enumerate(trees):
            res = _once(dict(spec, out=spec["out"] + (f"-t{i}" if i else "")), tree)
            if best[i] is None or res["cpu"] < best[i]["cpu"]:
                best[i] = dict(res, best_wall=min(res["wall"], (best[i] or res)["wall"]))
            else:
                best[i]["best_wall"] = min(best[i]["best_wall"], res["wall"])
    return best


def _cluster(args, work: str):
    """Start ``args.runner``'s engine (``streameval cluster up``): (runner_args, {name: pid}, state dir),
    or the local runner's options and no cluster."""
    if args.runner == "local":
        return (["--workers", str(args.local_workers)] if args.local_workers else []), {}, None
    state = tempfile.mkdtemp(prefix=f"cluster-{args.runner}-", dir=work)
    extra = ["--taskmanagers", str(args.taskmanagers), "--slots", str(args.slots), "--runner-on-classpath",
             *(["--taskmanager-memory", args.taskmanager_memory] if args.taskmanager_memory else [])
             ] if args.runner == "flink" else []
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", "up", args.runner, "--state-dir", state,
                           *extra], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    if done.returncode != 0:
        raise SystemExit(f"cluster up {args.runner}: {done.stderr[-2000:]}")
    info = json.loads(done.stdout)
    return info["runner_args"], info["processes"], state


def _print_row(case, label, res, ref):
    print(f"{case:<10} {label:<4} {res['engine']:<9} {res['records']:>11,} {res['best_wall']:>8.2f} "
          f"{res['cpu']:>8.2f} {res['records'] / res['cpu']:>10,.0f} {res['peak_mb']:>8.0f} "
          f"{res['best_wall'] / ref['best_wall']:>9.2f} {res['cpu'] / ref['cpu']:>8.2f} "
          f"{res['peak_mb'] / ref['peak_mb']:>8.2f}", flush=True)
    print("           peak RSS with descendants (MB): "
          + ", ".join(f"{n} {mb:,.0f}" for n, mb in res["tree_peak_mb"].items()), flush=True)
    print("           CPU s with descendants: "
          + ", ".join(f"{n} {s:,.1f}" for n, s in res["tree_cpu_s"].items()), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impressions", type=int, default=1_000_000)
    ap.add_argument("--records-impressions", type=int, default=200_000,
                    help="input of the per-record engine's runs (0: skip them; always skipped off the "
                         "in-process runner)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", default=None, help="keep the generated logs here (default: a temporary directory)")
    ap.add_argument("--base", "--baseline", dest="base", default=None,
                    help="another checkout (e.g. `git archive main | tar -x -C DIR`): its code runs side by side, "
                         "alternating with this one's, on the same logs")
    ap.add_argument("--no-ranking", action="store_true", help="do not add the ranking case (no x ranking ratios)")
    ap.add_argument("--runner", choices=("local", "flink", "prism"), default="local",
                    help="local: Beam's local runner (default); flink, prism: a cluster started by "
                         "`streameval cluster up` for these runs and stopped after them")
    ap.add_argument("--local-workers", type=int, default=0,
                    help="--runner local: the job's --workers (default: the job's own default, in-process)")
    ap.add_argument("--taskmanagers", type=int, default=2, help="--runner flink: TaskManagers (default 2)")
    ap.add_argument("--slots", type=int, default=2,
                    help="--runner flink: slots per TaskManager (default 2, as cluster up)")
    ap.add_argument("--flink-parallelism", type=int, default=2,
                    help="--runner flink: the job's --parallelism (default 2, as --local-workers 2)")
    ap.add_argument("--taskmanager-memory", default=None,
                    help="--runner flink: each TaskManager's process memory (default: cluster up's, sized per slot)")
    ap.add_argument("--job-args", default="", help="more options for every run of the job, e.g. \"--parallelism 2\" "
                                                   "(Flink: one task per slot of each stage)")
    ap.add_argument("--json", default=None, help="write every result to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    work = args.dir or tempfile.mkdtemp(prefix="streameval-bench-engines-")
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}")
    runs = [(args.impressions, "auto")]
    if args.records_impressions and args.runner == "local" and not args.local_workers:
        runs.append((args.records_impressions, "records"))
    trees = [ROOT] + ([os.path.abspath(args.base)] if args.base else [])
    labels = ["new", "base"] if args.base else [""]
    for n, _ in runs:  # the logs first: not while a cluster waits
        _logs(n, os.path.join(work, str(n)))
    runner_args, processes, state = _cluster(args, work)
    if args.runner == "flink" and "--parallelism" not in args.job_args:
        # Flink's own default parallelism, which cluster up keeps, is 1: one SDK worker process for the
        # whole job, against --local-workers processes on the local runner
        runner_args = [*runner_args, "--parallelism", str(args.flink_parallelism)]
    runner_args = [*runner_args, *args.job_args.split()]
    print(f"runner {args.runner}: {' '.join(runner_args) or '(defaults)'}", flush=True)
    print(f"{'case':<10} {'code':<4} {'engine':<9} {'impressions':>11} {'wall s':>8} {'cpu s':>8} {'impr/s':>10} "
          f"{'peak MB':>8} {'x ranking':>9} {'x rk cpu':>8} {'x rk mem':>8}")
    out = []
    try:
        for n, engine in runs:
            paths, jpath = _logs(n, os.path.join(work, str(n)))
            refs = None
            for case in (["ranking"] if "ranking" not in cases and not args.no_ranking else []) + cases:
                results = _run({"case": case, "engine": engine, "paths": paths, "jpath": jpath,
                                "runner_args": runner_args, "processes": processes,
                                "out": os.path.join(work, f"out-{n}-{engine}-{case}-{args.runner}")},
                               args.repeat, trees)
                if case == "ranking":
                    refs = results
                nan = {"best_wall": math.nan, "cpu": math.nan, "peak_mb": math.nan}
                for label, res, ref in zip(labels, results, refs or [nan] * len(results)):
                    _print_row(case, label, res, ref)
                    out.append(dict(res, case=case, tree=label, runner=args.runner, runner_args=runner_args))
    finally:
        if state:
            done = subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", "down", "--state-dir", state],
                                  capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
            if done.returncode != 0:
                print(f"cluster down: {done.stderr.strip()}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
