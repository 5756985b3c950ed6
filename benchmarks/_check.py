"""The regression gate of ``benchmarks/run.py --check`` (issue 38 item 5), run by ``make test`` in CI.

Every criterion is a ratio of two things measured in the same run on the same machine, so a slow or
busy CI machine slows both sides. Each side runs ``--repeat`` times (5), the two sides interleaved
run by run, each run a process of its own; a time is the best of its runs, a peak memory (the
process's own VmHWM) the median. The best, not the median: a busy virtual machine only ever adds
time, and on the 2-core VM the gate runs on, one form's five runs took 0.41 to 1.29 s for the same
code (evaluate()'s two threads waiting on each other under the host's memory reclaim), so a median
of 3 failed a limit that every form's fastest run met by half; a regression slows every run, the
fastest too:

* ``evaluate()`` from arrays against pytrec_eval on the same collection (``_data.ranking(30000,
  seed=7)``: 30,000 queries x 100 documents, 40 graded judgments each), with integer ids, string
  ids (numpy str arrays) and DataFrames with integer ids and with string ids: time <= 0.1 x, peak
  memory <= 0.35 x (each side's peak counted from its inputs loaded: :func:`_reset_peak`); where that
  is not met today (string ids' time, a DataFrame's string columns) an
  interim target holds today's level (:data:`INTERIM`), so a regression still fails;
* ``streameval trec-eval`` against pytrec_eval reading the same TREC files (``parse_qrel`` /
  ``parse_run``), whole processes: time <= 0.2 x;
* the batch job (``streameval batch``, whole process, start-up included) on 1 M impressions
  (``bench_beam.py``'s logs, NDCG@10, MAP, MRR@10, P@10 and CTR): its time per impression against
  pytrec_eval's time per run row above (a reference measured in the same run: a slow machine slows
  both): <= BATCH_TARGET;
* the stream's ``--replay`` (``--replay-step 30m --replay-pace 0``, 30-minute windows) on the same
  log, whole process, against the batch job: issue 38's target is 500,000 impressions/s, about 0.6 x
  the batch job's time (:data:`REPLAY_TARGET`); today's level (about 0.85 x since the engine's shards
  score a window once, at the replay's flush: 2.4 x when they scored it again at each piece) is held by
  an interim target of 1 x (:data:`REPLAY_INTERIM`), so scoring at each piece again (2.4 x) or the
  replay's records travelling in the pipeline graph again (12.4 x) fails. ``--no-replay`` leaves it out.

A criterion fails when its ratio is worse than twice its target (room for a noisy machine: the
regression this gate was made for was 9 x). Every criterion is printed with its value, target and
limit; the exit status is 1 when any failed. Before the timings count, every engine's means must
agree (1e-9; the files: trec_eval's 4 printed decimals).

``--write-docs`` rewrites the marked section of docs/benchmarks.md from this run (commit, date,
machine, commands); the section is never edited by hand.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
QUERIES = 30_000
IMPRESSIONS = 1_000_000
BATCH_METRICS = "ndcg@10,map,mrr@10,P@10"
#: evaluate() forms short of issue 38's targets today: (time, memory) targets that hold today's level
#: (string ids: the text of each id is coded, ~0.13 x; a DataFrame's string columns, Arrow strings in
#: pandas 3, read as bytes from Arrow's buffer: ~0.18 x and 0.61 x memory, were 0.26 x and 0.89 x when
#: widened to numpy str, 0.72 x when each id became a Python str)
INTERIM = {"string ids": (0.15, 0.35), "DataFrame, string ids": (0.2, 0.65)}
#: the batch job's time per impression / pytrec_eval's per run row (see the module docstring)
BATCH_TARGET = 3.0
#: the stream's replay of the batch job's log / the batch job's time: issue 38's 500,000 impressions/s
REPLAY_TARGET = 0.6
#: ... and the interim target that holds today's level (0.85 x; 2.4 x while the shards scored a window at
#: each piece, 12.4 x while the records travelled in the graph)
REPLAY_INTERIM = 1.0
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- benchmarks/run.py --check --write-docs: begin (written by the script; do not edit) -->"
END = "<!-- benchmarks/run.py --check --write-docs: end -->"


class Criterion:
    """One line of the gate: ``value`` (a ratio) against ``target``; fails above 2 x target unless
    ``report_only``."""

    def __init__(self, name, value, target, *, report_only=False, detail=""):
        self.name, self.value, self.target, self.report_only, self.detail = name, value, target, report_only, detail

    @property
    def limit(self):
        return 2 * self.target

    @property
    def result(self):
        if self.value is None:
            return "FAILED (not measured)"
        if self.report_only:
            return "reported" + (" (met)" if self.value <= self.target else " (not met)")
        if self.value <= self.target:
            return "met"
        return "ok (within 2 x)" if self.value <= self.limit else "FAILED"

    @property
    def failed(self):
        return self.result.startswith("FAILED")


# ---------------------------------------------------------------------------------------------
# child side (one process per timed run)


def _reset_peak() -> None:
    """Reset this process's high-water resident set (VmHWM) to what it holds now (Linux's
    ``/proc/self/clear_refs``, value 5): the peak then counts what is resident from here on. Each
    side of an evaluate() criterion does it with its inputs loaded, just before its timed call: the
    DataFrame form's construction (pandas copies the arrays into one block, a transient of the
    whole run, before the old arrays are freed) is the benchmark's set-up, not evaluate()'s memory."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(what: str, rest: list, emit, peak_bytes) -> None:
    import _data

    if what == "gate-strings":  # the collection with string ids ("q<n>", "d<n>"), as .npy (U) files
        import numpy as np

        src, d = rest
        if not os.path.exists(os.path.join(d, ".done")):
            a = _data.load(src, _data.RANKING)

            def text(prefix, x):  # as numpy makes it from a list of str: as wide as the longest id
                t = np.char.add(prefix, x.astype(str))
                return t.astype(f"U{max(int(np.char.str_len(t).max()), 1)}")

            _data.save(d, {k: text(k[1], a[k]) if k[1] in "qd" else a[k] for k in _data.RANKING})
            open(os.path.join(d, ".done"), "w").close()
        emit({"ok": True})
    elif what == "gate-evaluate":  # evaluate() on arrays or a DataFrame; loading and the DataFrame untimed
        d, form = rest
        a = _data.load(d, _data.RANKING)
        import _engines as E

        if form == "pytrec_eval":
            fn = E.ranking_pytrec_eval
            arg = a
        else:
            from streameval.api import evaluate

            rq, rd, rs, jq, jd, jg = (a[k] for k in _data.RANKING)
            if form == "dataframe":
                import pandas as pd

                run = pd.DataFrame({"q_id": rq, "doc_id": rd, "score": rs})
                qrels = pd.DataFrame({"q_id": jq, "doc_id": jd, "rel": jg})
                del rq, rd, rs, jq, jd, jg
                a.clear()
            else:
                run, qrels = (rq, rd, rs), (jq, jd, jg)
            arg = None

            def fn(_):
                return dict(evaluate(qrels, run, list(E.MEANS)).means)
        _reset_peak()  # the peak of the call, from its inputs in memory (not building the DataFrame)
        t0 = time.perf_counter()
        means = fn(arg)
        wall = time.perf_counter() - t0
        emit({"wall": wall, "peak": peak_bytes(), "means": means})
    elif what == "gate-logs":
        import bench_beam

        d, n = rest[0], int(rest[1])
        marker = os.path.join(d, ".done.json")
        if not os.path.exists(marker):
            os.makedirs(d, exist_ok=True)
            paths, jpath = bench_beam.write_logs(n, d)
            with open(marker, "w") as f:
                json.dump({"paths": paths, "judgments": jpath}, f)
        with open(marker) as f:
            emit(json.load(f))
    else:
        raise SystemExit(f"unknown child task {what!r}")


# ---------------------------------------------------------------------------------------------
# parent side


def _interleaved_runs(repeat, fns):
    """Run each of ``fns`` (name -> callable returning a dict with "wall") ``repeat`` times,
    interleaved; {name: [results]}."""
    out = {k: [] for k in fns}
    for _ in range(max(repeat, 1)):
        for k, fn in fns.items():
            out[k].append(fn())
    return out


def _med(runs, key="wall"):
    """The best wall time of ``runs`` (noise only adds time), or the median of another ``key``."""
    return min(r[key] for r in runs) if key == "wall" else statistics.median(r[key] for r in runs)


def _agree(means_a, means_b, tol, skip=()):
    return max((abs(means_a[k] - v) for k, v in means_b.items() if k not in skip), default=0.0) <= tol


def run_check(run_mod, workdir: str, repeat: int, replay: bool = False) -> tuple[list, dict]:
    """The gate's measurements; (criteria, facts for the docs)."""
    R = run_mod
    log = R.log
    facts: dict = {"timings": {}}
    crit: list[Criterion] = []
    t_start = time.perf_counter()
    data_dir = os.path.join(workdir, f"ranking-{QUERIES}-s7")
    str_dir = os.path.join(workdir, f"ranking-{QUERIES}-s7-strings")
    log(f"check: the collection ({QUERIES:,} queries x 100 documents) in {workdir} ...")
    R.run_child("make-ranking", data_dir, QUERIES, 7)
    R.run_child("gate-strings", data_dir, str_dir)

    # -- evaluate() against pytrec_eval from arrays
    forms = {"pytrec_eval": (data_dir, "pytrec_eval"), "integer ids": (data_dir, "arrays"),
             "string ids": (str_dir, "arrays"), "DataFrame, integer ids": (data_dir, "dataframe"),
             "DataFrame, string ids": (str_dir, "dataframe")}
    log(f"check: evaluate() and pytrec_eval from arrays, {repeat} runs each, interleaved ...")
    runs = _interleaved_runs(repeat, {k: (lambda d=d, f=f: R.run_child("gate-evaluate", d, f)) for k, (d, f) in forms.items()})
    ref = runs["pytrec_eval"]
    facts["timings"]["pytrec_eval from arrays"] = (_med(ref), _med(ref, "peak"))
    for k in forms:
        if k == "pytrec_eval":
            continue
        ok = all(_agree(r["means"], ref[0]["means"], 1e-9, skip=("mrr@10",)) for r in runs[k])
        facts["timings"][f"evaluate(), {k}"] = (_med(runs[k]), _med(runs[k], "peak"))
        t = _med(runs[k]) / _med(ref) if ok else None
        m = _med(runs[k], "peak") / _med(ref, "peak") if ok else None
        detail = "" if ok else "means disagree with pytrec_eval's"
        # where issue 38's targets (0.1 x, 0.35 x) are not met yet, the gate holds today's level
        tt, mt = INTERIM.get(k, (0.1, 0.35))
        crit.append(Criterion(f"evaluate(), {k}: time / pytrec_eval's", t, tt,
                              detail=detail or ("" if tt == 0.1 else "interim: issue 38's 0.10 not met")))
        crit.append(Criterion(f"evaluate(), {k}: peak memory / pytrec_eval's", m, mt,
                              detail=detail or ("" if mt == 0.35 else "interim: issue 38's 0.35 not met")))

    # -- streameval trec-eval against pytrec_eval from the same files
    log("check: TREC files ...")
    files = R.run_child("write-trec", data_dir)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def time_cli():
        text, wall, peak = R.spawn(R._cli(files["qrels"], files["run"]), env=env)
        return {"wall": wall, "peak": peak, "means": R._parse_trec_eval(text).get("all", {})}

    def time_ref():
        text, wall, peak = R.spawn([sys.executable, os.path.join(HERE, "run.py"), "--child", "pytrec-eval-files",
                                    files["qrels"], files["run"]], env=env)
        means = json.loads([ln for ln in text.splitlines() if ln.startswith("@@RESULT ")][-1][9:])
        return {"wall": wall, "peak": peak, "means": means}

    log(f"check: streameval trec-eval and pytrec_eval from files, {repeat} runs each ...")
    runs = _interleaved_runs(repeat, {"pytrec_eval": time_ref, "trec-eval": time_cli})
    ok = all(_agree(r["means"], runs["pytrec_eval"][0]["means"], 1e-4) for r in runs["trec-eval"])
    facts["timings"]["pytrec_eval from TREC files (whole process)"] = (_med(runs["pytrec_eval"]),
                                                                        _med(runs["pytrec_eval"], "peak"))
    facts["timings"]["streameval trec-eval (whole process)"] = (_med(runs["trec-eval"]), _med(runs["trec-eval"], "peak"))
    crit.append(Criterion("streameval trec-eval from files: time / pytrec_eval's", _med(runs["trec-eval"]) /
                          _med(runs["pytrec_eval"]) if ok else None, 0.2,
                          detail="" if ok else "means disagree with pytrec_eval's"))

    # -- the batch job at 1 M impressions against fastavro decoding the same files
    log(f"check: the batch job on {IMPRESSIONS:,} impressions ...")
    logs = R.run_child("gate-logs", os.path.join(workdir, f"logs-{IMPRESSIONS}"), IMPRESSIONS)
    out_dir = os.path.join(workdir, "batch-out")

    def batch_args(extra=()):
        args = [sys.executable, "-m", "streameval.cli", "batch", "--judgments", logs["judgments"], "--metrics",
                BATCH_METRICS, "--output", out_dir, "--quiet", *extra]
        for p in logs["paths"]:
            args += ["--impressions", p]
        return args

    def time_batch():
        _, wall, peak = R.spawn(batch_args(), env=env)
        with open(os.path.join(out_dir, "summary.json")) as f:
            n = json.load(f)["accounting"]["impression"]["read"]
        return {"wall": wall, "peak": peak, "records": n}

    runs = _interleaved_runs(repeat, {"batch": time_batch})
    b = _med(runs["batch"])
    n_read = runs["batch"][0]["records"]
    facts["timings"][f"streameval batch, {IMPRESSIONS / 1e6:g} M impressions (whole process)"] = (b, _med(runs["batch"], "peak"))
    # per impression against pytrec_eval's time per run row above (same run, same machine's load)
    per_row = facts["timings"]["pytrec_eval from arrays"][0] / (QUERIES * 100)
    crit.append(Criterion(f"batch job, {IMPRESSIONS / 1e6:g} M impressions: time per impression / pytrec_eval's "
                          "per run row", b / IMPRESSIONS / per_row if n_read == IMPRESSIONS else None, BATCH_TARGET,
                          detail=f"{n_read / b:,.0f} impressions/s, whole process"))

    # -- the stream's replay on the same log against the batch job
    if replay:
        crit.append(_check_replay(R, workdir, logs, min(repeat, 2), b, env, facts))
    facts["seconds"] = time.perf_counter() - t_start
    return crit, facts


def _check_replay(R, workdir: str, logs: dict, repeat: int, batch_wall: float, env, facts: dict) -> Criterion:
    """The stream's ``--replay`` of the batch job's log (best of ``repeat``, whole process) against the
    batch job's time ``batch_wall``: :data:`REPLAY_INTERIM` (issue 38: :data:`REPLAY_TARGET`)."""
    R.log(f"check: the stream's --replay on the same log, {repeat} runs ...")
    sout = os.path.join(workdir, "stream-out")
    args = [sys.executable, "-m", "streameval.cli", "stream", "--replay", "--replay-step", "30m", "--replay-pace",
            "0", "--judgments", logs["judgments"], "--metrics", BATCH_METRICS, "--window", "30m", "--quiet",
            "--output", sout, "--impressions", os.path.join(os.path.dirname(logs["paths"][0]), "impressions-*.avro")]

    def time_replay():
        _, wall, peak = R.spawn(args, env=env)
        with open(os.path.join(sout, "summary.json")) as f:
            n = json.load(f)["replayed"]["impressions"]
        return {"wall": wall, "peak": peak, "records": n}

    runs = _interleaved_runs(repeat, {"replay": time_replay})
    wall = _med(runs["replay"])
    n_rep = runs["replay"][0]["records"]
    facts["timings"][f"streameval stream --replay, {IMPRESSIONS / 1e6:g} M impressions (whole process)"] = (
        wall, _med(runs["replay"], "peak"))
    return Criterion(f"stream --replay, {IMPRESSIONS / 1e6:g} M impressions: time / the batch job's",
                     wall / batch_wall if n_rep == IMPRESSIONS else None, REPLAY_INTERIM,
                     detail=f"{n_rep / wall:,.0f} impressions/s, whole process; issue 38's target "
                            f"{REPLAY_TARGET} x, 500,000/s")


def print_check(crit, facts, load_before, load_after) -> None:
    print(f"\nregression gate (benchmarks/run.py --check): load average before {load_before}, after {load_after}; "
          f"{facts['seconds']:.0f} s")
    w = max(len(c.name) for c in crit)
    print(f"{'criterion':<{w}} {'value':>7} {'target':>7} {'limit':>7}  result")
    for c in crit:
        v = "-" if c.value is None else f"{c.value:.3f}"
        lim = "-" if c.report_only else f"{c.limit:.2f}"
        print(f"{c.name:<{w}} {v:>7} {c.target:>7.2f} {lim:>7}  {c.result}{'  (' + c.detail + ')' if c.detail else ''}")
    print("\ntimings (best wall of the runs, median peak): wall s, peak MB")
    for k, (t, p) in facts["timings"].items():
        print(f"  {k:<62} {t:7.2f} {'' if p is None else f'{p / 1e6:8.0f}'}")
    failed = [c.name for c in crit if c.failed]
    print(f"\n{'FAILED: ' + '; '.join(failed) if failed else 'every criterion within its limit'}")


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 1e6:.1f} GB RAM"
    except (OSError, StopIteration):
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs ({model or 'model unknown'}){mem}, " \
           f"Python {platform.python_version()}"


def write_docs(crit, facts, command: str, load_before, load_after, path: str = DOCS) -> None:
    """Replace the marked section of docs/benchmarks.md by this run's tables."""
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "--untracked-files=no") else ""
    lines = [BEGIN, "",
             f"Written by `{command}` from one run: commit `{_git('rev-parse', '--short=12', 'HEAD')}`{dirty}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {_machine()}; load average "
             f"{load_before} before, {load_after} after; {facts['seconds']:.0f} s. Each time is the best of the "
             "runs, each peak memory their median, the two sides of a ratio interleaved; a criterion fails above "
             "twice its target.", "",
             "| criterion | value | target | limit | result |", "| --- | --- | --- | --- | --- |"]
    for c in crit:
        v = "-" if c.value is None else f"{c.value:.3f}"
        lim = "reported only" if c.report_only else f"{c.limit:.2f}"
        lines.append(f"| {c.name}{' (' + c.detail + ')' if c.detail else ''} | {v} | {c.target:.2f} | {lim} | {c.result} |")
    lines += ["", "| measured | wall | peak memory |", "| --- | --- | --- |"]
    for k, (t, p) in facts["timings"].items():
        lines.append(f"| {k} | {t:.2f} s | {'' if p is None else f'{p / 1e6:,.0f} MB'} |")
    lines += ["", END]
    with open(path) as f:
        text = f.read()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + "\n".join(lines) + tail
    else:
        raise SystemExit(f"{path} has no section marked {BEGIN!r} ... {END!r}")
    with open(path, "w") as f:
        f.write(text)
