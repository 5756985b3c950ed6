"""Issue 36, items 1 and 2: the jobs' ``--output`` folder is safe from the jobs themselves.

1. An ``--output`` that holds an input file, or that an input glob reads, is refused (exit 2, one
   line naming both) before anything is touched: a rerun whose glob matched its own outputs used to
   clear them and then fail reading them (data loss).
2. A local output folder is locked while a job runs (``.streameval.lock``: PID, host, start time):
   a second job exits 2 "output folder in use by PID N on HOST since T"; a lock a dead job left is
   taken over with a notice. A run replaces the previous run's outputs only when it publishes: a run
   that fails or is killed leaves them whole.

References: MAP of one query worked by hand. Judgments q1: d1 and d3 relevant, d2 not. Job A ranks
d1, d2, d3 (scores 3, 2, 1): AP = (1/1 + 2/3) / 2 = 5/6. Job B ranks d2, d1, d3: AP = (1/2 + 2/3) / 2
= 7/12. Each job writes one row (``--no-ctr``, global window, one system).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streameval.jobs import batch, ope
from streameval.jobs import stream as stream_cli
from streameval import read_metrics
from streameval.io import avro

from .conftest import fail_after

ROOT = Path(__file__).resolve().parents[1]
AP_A, AP_B = (1 + 2 / 3) / 2, (1 / 2 + 2 / 3) / 2
BASE_TS = 1_700_000_000_000_000
COMMON = ["--metrics", "map", "--no-ctr", "--quiet"]
JOB_TIMEOUT = 300  # seconds for one job as a subprocess on a busy machine
LOCK_FILE = ".streameval.lock"  # streameval.io.outdir.LOCK_FILE (imported where used: the tests run on main too)


def _impressions(order, system="A", copies=1):
    """Requests of query q1 ranking the items in ``order`` (scores descending); ``copies`` requests
    with the same ranking (the same AP each: the mean is unchanged)."""
    recs = []
    for c in range(copies):
        req = f"r{c}"
        for pos, item in enumerate(order, 1):
            recs.append({"event_id": f"{req}/{item}", "request_id": req, "query_id": "q1", "user_id": None,
                         "system_id": system, "item_id": item, "position": pos, "score": float(len(order) - pos + 1),
                         "clicked": pos == 1, "timestamp": BASE_TS + c, "propensity": 1 / 3, "attributes": {}})
    return recs


JUDGMENTS = [{"query_id": "q1", "item_id": d, "grade": g, "timestamp": 0, "source": "t"}
             for d, g in (("d1", 1), ("d2", 0), ("d3", 1))]


@pytest.fixture()
def inputs(tmp_path):
    """``in/a.avro`` (job A: AP 5/6), ``in/b.avro`` (job B: AP 7/12), ``in/j.avro`` (judgments); a few
    hundred impressions each, so a job runs long enough to be stopped or killed in the middle."""
    d = tmp_path / "in"
    d.mkdir()
    avro.write_records(d / "a.avro", "impression", _impressions(["d1", "d2", "d3"], copies=100))
    avro.write_records(d / "b.avro", "impression", _impressions(["d2", "d1", "d3"], copies=100))
    avro.write_records(d / "j.avro", "judgment", JUDGMENTS)
    return d


def _args(imps, judg, out):
    return ["--impressions", str(imps), "--judgments", str(judg), *COMMON, "--output", str(out)]


def _values(out):
    """The map values of the output folder ``out``, read through its manifest."""
    rows = read_metrics(out)
    assert {r["metric"] for r in rows} == {"map"}
    return [r["value"] for r in rows]


def _snapshot(folder: Path) -> dict:
    """{name: bytes} of the files directly in ``folder``."""
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def _command(*args) -> list[str]:
    return [sys.executable, "-c", "import sys; from streameval.cli import main; sys.exit(main())", *args]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _wait_for(proc, condition, what: str, timeout: float = JOB_TIMEOUT) -> bool:
    """Poll ``condition`` until it holds (True) or ``proc`` ended (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        if proc.poll() is not None:
            return condition()
        time.sleep(0.01)
    raise AssertionError(f"{what}: not seen in {timeout} s")


def _holder(out: Path):
    try:
        return json.loads((out / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# 1. an output that overlaps the inputs


def test_the_issue_rerun_with_a_glob_over_its_own_outputs_is_refused(inputs, tmp_path, capsys):
    """The issue's commands: run 1 writes o1; run 2 reads 'o1/*.avro', which matches run 1's
    metrics.avro and dead_letters.avro (and the logs copied there). Before: run 2 cleared run 1's
    outputs, then failed reading them (exit 1, run 1 gone). Now: exit 2, one line naming the output
    and the input, and every file of o1 byte for byte as run 1 left it."""
    o1 = tmp_path / "o1"
    assert batch.main(_args(inputs / "a.avro", inputs / "j.avro", o1)) == 0
    shutil.copy(inputs / "a.avro", o1 / "imps.avro")
    shutil.copy(inputs / "j.avro", o1 / "j.avro")
    before = _snapshot(o1)
    assert {"metrics.avro", "dead_letters.avro", "manifest.json", "summary.json"} <= set(before)
    capsys.readouterr()
    code = batch.main(["--impressions", str(o1 / "*.avro"), "--judgments", str(o1 / "j.avro"), *COMMON,
                       "--output", str(o1)])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    (line,) = _errors(err)
    assert f"--output {o1}" in line and f"--impressions {str(o1 / '*.avro')!r}" in line, line
    assert _snapshot(o1) == before
    assert sorted(p.name for p in o1.iterdir()) == sorted(before)  # nothing added (no lock, no staging)
    assert _values(o1) == [pytest.approx(AP_A, abs=1e-12)]


@pytest.mark.parametrize("case", ["inputs inside", "recursive glob", "folder glob"])
def test_an_output_an_input_glob_reads_is_refused_before_anything_is_made(inputs, tmp_path, capsys, case):
    """The issue's first command (the logs inside --output, 'o1/*imp*.avro'), an output below a
    recursive glob's folder and one a glob's folder part matches: exit 2, one line naming the output
    and the pattern or file; the output folder is not made, nothing in it is touched."""
    if case == "inputs inside":
        out = tmp_path / "o1"
        out.mkdir()
        shutil.copy(inputs / "a.avro", out / "imps.avro")
        shutil.copy(inputs / "j.avro", out / "j.avro")
        imps, judg, named = str(out / "*imp*.avro"), str(out / "j.avro"), str(out / "imps.avro")
    elif case == "recursive glob":
        out = inputs / "results" / "today"
        imps, judg, named = str(tmp_path / "**" / "a.avro"), str(inputs / "j.avro"), str(tmp_path / "**" / "a.avro")
    else:  # tmp/*/a.avro reads tmp/in/a.avro now and would read tmp/results/a.avro
        out = tmp_path / "results"
        imps, judg, named = str(tmp_path / "*" / "a.avro"), str(inputs / "j.avro"), str(tmp_path / "*" / "a.avro")
    before = _snapshot(out) if out.exists() else None
    capsys.readouterr()
    code = batch.main(["--impressions", imps, "--judgments", judg, *COMMON, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    (line,) = _errors(err)
    assert f"--output {out}" in line and named in line, line
    assert (_snapshot(out) == before) if before is not None else not out.exists()


def test_every_job_refuses_an_overlapping_output(inputs, tmp_path, capsys):
    """The streaming job (--replay) and ope: the same check, exit 2 and one line, nothing touched."""
    out = tmp_path / "o"
    out.mkdir()
    shutil.copy(inputs / "a.avro", out / "a.avro")
    before = _snapshot(out)
    runs = {
        "stream": lambda: stream_cli.main(["--replay", "--impressions", str(out / "*.avro"), "--judgments",
                                           str(inputs / "j.avro"), "--window", "1d", *COMMON, "--output", str(out)]),
        "ope": lambda: ope.main(["--logs", str(out / "*.avro"), "--target", "random", "--n-items", "3", "--slice",
                                 "none", "--output", str(out)]),
    }
    for name, run in runs.items():
        capsys.readouterr()
        code = run()
        err = capsys.readouterr().err
        assert code == 2, (name, err[-2000:])
        (line,) = _errors(err)
        assert f"--output {out}" in line and str(out / "*.avro") in line, (name, line)
        assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["a.avro"], name


def test_which_folders_a_glob_reaches(tmp_path):
    """pattern_reaches against folders worked out by hand: a glob reads its own folder, folders its
    folder parts match and, below a ``**``, every folder; not a sibling nor a folder below the one
    it reads. check_overlap names a file inside the output."""
    from streameval.io.outdir import OutputOverlapError, check_overlap, pattern_reaches

    t = str(tmp_path)
    assert pattern_reaches(f"{t}/logs/*.avro", f"{t}/logs")
    assert not pattern_reaches(f"{t}/logs/*.avro", f"{t}/logs/out")  # *.avro reads logs/ only
    assert not pattern_reaches(f"{t}/logs/*.avro", f"{t}/out")
    assert pattern_reaches(f"{t}/logs/*/x.avro", f"{t}/logs/day1")
    assert not pattern_reaches(f"{t}/logs/day*/x.avro", f"{t}/logs/out")
    assert pattern_reaches(f"{t}/logs/**/x.avro", f"{t}/logs/a/b/out")
    assert not pattern_reaches(f"{t}/logs/x.avro", f"{t}/logs")  # a file, compared as a file
    assert pattern_reaches("s3://b/logs/*.avro", "s3://b//logs/")
    assert not pattern_reaches("s3://b/logs/*.avro", "s3://b/logs/out")
    assert pattern_reaches("s3://b/logs/**", "s3://b/logs/out")
    assert not pattern_reaches("s3://b/logs/*.avro", f"{t}/logs")
    with pytest.raises(OutputOverlapError, match="holds the input file s3://b/out/x.avro"):
        check_overlap("s3://b/out/", [("--impressions", ["s3://b/out/x.avro"], ["s3://b/out/x.avro"])])
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OutputOverlapError, match="holds the input file"):  # the same folder through a link
        check_overlap(tmp_path / "link", [("--judgments", [f"{t}/real/j.avro"], [f"{t}/real/j.avro"])])


# --------------------------------------------------------------------------------------------
# 2. the lock


def test_two_batch_jobs_on_one_folder(inputs, tmp_path):
    """The issue's two jobs on one folder, as processes: A takes the lock and is stopped there
    (SIGSTOP) while B starts: B exits 2, "output folder in use by PID <A> on <host> since ...", one
    line. A, continued, exits 0 and the folder's rows are A's (AP 5/6), never B's (7/12)."""
    out = tmp_path / "o"
    a = subprocess.Popen(_command("batch", *_args(inputs / "a.avro", inputs / "j.avro", out)), env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        held = _wait_for(a, lambda: (_holder(out) or {}).get("pid") == a.pid, "job A's lock")
        assert held, f"job A ended (exit {a.poll()}) without taking a lock on {out}"
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b = subprocess.run(_command("batch", *_args(inputs / "b.avro", inputs / "j.avro", out)), env=_env(),
                               capture_output=True, text=True, timeout=JOB_TIMEOUT)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert b.returncode == 2, b.stderr[-2000:]
        (line,) = _errors(b.stderr)
        assert f"output folder {out} in use by PID {a.pid} on {socket.gethostname()} since " in line, line
        assert _holder(out)["pid"] == a.pid  # B did not touch A's lock
        stdout, stderr = a.communicate(timeout=JOB_TIMEOUT)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 0, stderr[-2000:]
    assert "wrote 1 metric rows" in stdout
    assert _values(out) == [pytest.approx(AP_A, abs=1e-12)]
    assert json.loads((out / "summary.json").read_text())["impression_files"] == [str(inputs / "a.avro")]
    assert not (out / LOCK_FILE).exists()


def test_a_held_lock_refuses_every_job(inputs, tmp_path, capsys):
    """A lock held by another holder (here this process, through its own open file) refuses the
    batch job, the streaming job and ope: exit 2 naming this PID; the folder keeps its content."""
    from streameval.io.outdir import LOCK_FILE as lock_file, OutputLock

    assert lock_file == LOCK_FILE
    out = tmp_path / "o"
    assert batch.main(_args(inputs / "a.avro", inputs / "j.avro", out)) == 0
    before = _snapshot(out)
    runs = {
        "batch": lambda: batch.main(_args(inputs / "b.avro", inputs / "j.avro", out)),
        "stream": lambda: stream_cli.main(["--replay", "--impressions", str(inputs / "b.avro"), "--judgments",
                                           str(inputs / "j.avro"), "--window", "1d", *COMMON, "--output", str(out)]),
        "ope": lambda: ope.main(["--logs", str(inputs / "b.avro"), "--target", "random", "--n-items", "3",
                                 "--slice", "none", "--output", str(out)]),
    }
    with OutputLock(str(out), "the test"):
        with_lock = _snapshot(out)
        for name, run in runs.items():
            capsys.readouterr()
            code = run()
            err = capsys.readouterr().err
            assert code == 2, (name, err[-2000:])
            (line,) = _errors(err)
            assert f"in use by PID {os.getpid()} on {socket.gethostname()} since " in line and "(the test)" in line, line
            assert _snapshot(out) == with_lock, name
    assert _snapshot(out) == before
    assert _values(out) == [pytest.approx(AP_A, abs=1e-12)]


def test_a_stale_lock_of_a_dead_process_is_taken_over(inputs, tmp_path, capsys):
    """A lock file naming a process of this host that no longer runs (and holds no lock): the job
    takes it over, says so in one line naming the dead PID, runs, and removes the lock at its end."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                             "since": "2026-01-02T03:04:05Z", "command": "streameval batch"}))
    capsys.readouterr()
    assert batch.main(_args(inputs / "b.avro", inputs / "j.avro", out)) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "stale lock" in line]
    assert len(notes) == 1, notes
    assert f"PID {dead.pid} on {socket.gethostname()} since 2026-01-02T03:04:05Z" in notes[0], notes
    assert "no longer running" in notes[0], notes
    assert _values(out) == [pytest.approx(AP_B, abs=1e-12)]
    assert not (out / LOCK_FILE).exists()


# --------------------------------------------------------------------------------------------
# outputs replaced only when a run publishes


def _raise_in_pipeline(row):
    raise RuntimeError("a stage of the pipeline raised")


def test_a_failed_second_run_leaves_the_first_runs_outputs(inputs, tmp_path, monkeypatch, capsys):
    """Run 2 checks its inputs, starts, and its pipeline fails: exit 1, and run 1's metrics, dead
    letters, summary and manifest are in the folder byte for byte, read back as run 1's rows."""
    out = tmp_path / "o"
    assert batch.main(_args(inputs / "a.avro", inputs / "j.avro", out)) == 0
    before = _snapshot(out)
    monkeypatch.setattr(batch, "_progress_row", _raise_in_pipeline)  # the step before the sinks
    capsys.readouterr()
    assert batch.main(_args(inputs / "b.avro", inputs / "j.avro", out)) == 1
    assert "the job failed" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no staging folder, no lock left
    assert _snapshot(out) == before
    assert _values(out) == [pytest.approx(AP_A, abs=1e-12)]


def test_a_run_killed_mid_run_leaves_the_first_runs_outputs(inputs, tmp_path, capsys):
    """Run 2, a process, is killed (SIGKILL) while its pipeline writes (Beam's temporary files exist):
    the folder still holds run 1's outputs whole (byte for byte, its rows read back), and its
    summary.json says what is true (issue 41, item 3: it said run 1's "DONE"): run 2 RUNNING, the
    published outputs run 1's. Run 3 takes over the lock run 2 left, saying so, and publishes its own
    rows; nothing of run 2 is left."""
    out = tmp_path / "o"
    assert batch.main(_args(inputs / "a.avro", inputs / "j.avro", out)) == 0
    before = _snapshot(out)

    def writing():
        return any(name.startswith("beam-temp-") for _, dirs, _ in os.walk(out) for name in dirs)

    run2 = subprocess.Popen(_command("batch", *_args(inputs / "b.avro", inputs / "j.avro", out)), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(run2, writing, "run 2 writing"), f"run 2 ended (exit {run2.poll()}) before it was killed"
        run2.send_signal(signal.SIGKILL)
    finally:
        if run2.poll() is None:
            run2.kill()
        run2.wait()
    assert run2.returncode == -signal.SIGKILL
    assert {k: v for k, v in _snapshot(out).items() if k not in (LOCK_FILE, "summary.json")} == \
        {k: v for k, v in before.items() if k != "summary.json"}
    running = json.loads((out / "summary.json").read_text())
    assert running["state"] == "RUNNING" and running["pid"] == run2.pid
    assert running["published_run_id"] == json.loads(before["manifest.json"])["run_id"]
    assert _values(out) == [pytest.approx(AP_A, abs=1e-12)]

    capsys.readouterr()
    with fail_after(JOB_TIMEOUT, "run 3"):
        assert batch.main(_args(inputs / "b.avro", inputs / "j.avro", out)) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "stale lock" in line]
    assert len(notes) == 1 and f"PID {run2.pid} " in notes[0], notes
    assert _values(out) == [pytest.approx(AP_B, abs=1e-12)]
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # run 2's staging folder is gone


def test_a_reader_never_mixes_two_runs(tmp_path, monkeypatch):
    """A run publishes while read_metrics reads an output of two shard files: the reader read run 1's
    first shard, run 2 replaced both (same sizes, another manifest) before the second was read. The
    rows are one run's, run 2's (the manifest is read again after the files), never one of each."""
    from streameval.io import tables

    out = tmp_path / "o"
    out.mkdir()
    names = [f"metrics-0000{i}-of-00002.jsonl" for i in range(2)]

    def publish(run, value):
        for i, name in enumerate(names):
            row = {"window_start": None, "window_end": None, "slice": "all", "system": f"S{i}", "metric": "map",
                   "value": value, "num_queries": 2}
            (out / name).write_text(json.dumps(row) + "\n")
        files = [{"path": str(out / n), "bytes": (out / n).stat().st_size} for n in names]
        (out / "manifest.json").write_text(json.dumps({"complete": True, "run_id": run,
                                                       "outputs": {"metrics.jsonl": files}}))

    publish("run-1", 0.25)
    real = tables.file_rows
    calls = []

    def reading(path):
        rows = real(path)
        calls.append(path)
        if len(calls) == 1:  # run 2 publishes between the two files of run 1
            publish("run-2", 0.75)
        return rows

    monkeypatch.setattr(tables, "file_rows", reading)
    assert sorted((r["system"], r["value"]) for r in read_metrics(out)) == [("S0", 0.75), ("S1", 0.75)]
