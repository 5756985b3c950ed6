"""Issue 41, item 3: a killed rerun looked finished. A rerun into the same ``--output`` SIGKILLed
while running left the previous run's ``summary.json`` with ``"state": "DONE"``. From the rerun's
first step, summary.json now says a run is under way (``"state": "RUNNING"``, its run id, and which
run's outputs the manifest still publishes); a run that ends without publishing puts back what is
true (the published run's summary, or ``FAILED`` where a live run wrote in place)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streameval.beam import sinks
from streameval.io import avro

from .conftest import REPO

BASE = 1_574_553_600_000_000


def _log(path, n=400):
    recs = [{"event_id": f"e{i}", "request_id": f"r{i // 4}", "query_id": f"q{(i // 4) % 7}", "user_id": None,
             "system_id": "A", "item_id": f"d{i % 4}", "position": i % 4 + 1, "score": float(4 - i % 4),
             "clicked": i % 5 == 0, "timestamp": BASE + i * 60_000_000, "propensity": None, "attributes": {}}
            for i in range(n)]
    avro.write_records(str(path), "impression", recs)


def _run(args, env, **kw):
    return subprocess.Popen([sys.executable, "-c", "import sys; from streameval.cli import main; sys.exit(main())",
                             *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def _summary(out):
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("job", ["batch", "stream --replay", "stream --watch"])
def test_a_rerun_killed_while_running_leaves_a_summary_that_says_so(tmp_path, job):
    imps = tmp_path / "in" / "imps.avro"
    imps.parent.mkdir()
    _log(imps)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    common = ["--impressions", str(tmp_path / "in" / "*.avro"), "--window", "1h", "--output", str(out), "--quiet"]
    words = job.split()
    extra = ["--watch-interval", "0.1", "--watch-idle-stop", "2"] if "--watch" in words else []
    first = _run([*words, *common, *extra], env)
    assert first.wait(timeout=600) == 0, first.stderr.read()
    done = _summary(out)
    assert done["state"] == "DONE" and (out / "manifest.json").exists()
    published = json.loads((out / "manifest.json").read_text())["run_id"]

    # the rerun: SIGKILLed as soon as it holds the folder (its lock names it; its pipeline is being
    # built or run), then a moment later
    # (the replay paced at 1 s per 10 minutes of its 400: a rerun of the unpaced replay published
    # within the 0.5 s the test waited, on CI, and its own DONE summary was taken for the old one)
    slow = ["--replay-step", "10m", "--replay-pace", "1"] if "--replay" in words else []
    rerun = _run([*words, *common, *(["--watch-interval", "0.1"] if extra else []), *slow], env)
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end and rerun.poll() is None:
            try:
                if json.loads((out / ".streameval.lock").read_text()).get("pid") == rerun.pid:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        time.sleep(0.2)
        assert rerun.poll() is None, "the rerun ended before it could be killed"
        rerun.send_signal(signal.SIGKILL)
        rerun.wait(timeout=30)
    finally:
        if rerun.poll() is None:
            rerun.kill()
    after = _summary(out)
    assert after is not None and after["state"] == "RUNNING", after  # not the previous run's "DONE"
    assert after["run_id"] != published and after["command"] == f"streameval {words[0]}"
    assert after["pid"] == rerun.pid
    if "--watch" in words:  # written in place: the previous outputs were removed when the rerun started
        assert not (out / "manifest.json").exists()
    else:  # staged: the published outputs stay the previous run's, and summary.json names that run
        assert json.loads((out / "manifest.json").read_text())["run_id"] == published
        assert after["published_run_id"] == published


def test_a_run_that_ends_without_publishing_puts_back_what_is_true(tmp_path):
    """No Beam: the folder's hold alone. Staged: the published run's summary.json comes back byte for
    byte (or none, when there was none); live: FAILED."""
    out = tmp_path / "out"
    out.mkdir()
    previous = b'{"state": "DONE", "run_id": "r1"}'
    (out / "summary.json").write_bytes(previous)
    (out / "manifest.json").write_text(json.dumps({"complete": True, "outputs": {}, "run_id": "r1"}))
    run = sinks.start_output(str(out), ["metrics.jsonl"], command="streameval batch")
    running = _summary(out)
    assert running["state"] == "RUNNING" and running["run_id"] == run.run_id and running["published_run_id"] == "r1"
    sinks.close_output(run)
    assert (out / "summary.json").read_bytes() == previous

    empty = tmp_path / "empty"
    run = sinks.start_output(str(empty), ["metrics.jsonl"], command="streameval batch")
    assert _summary(empty)["state"] == "RUNNING"
    sinks.close_output(run)
    assert not (empty / "summary.json").exists()

    run = sinks.start_output(str(out), ["metrics-*"], live=True, command="streameval stream")
    assert _summary(out)["state"] == "RUNNING" and not (out / "manifest.json").exists()
    sinks.close_output(run)
    assert _summary(out)["state"] == "FAILED" and _summary(out)["run_id"] == run.run_id


@pytest.mark.parametrize("live", [False, True])
def test_the_running_summary_is_written_before_the_folder_is_cleared(tmp_path, monkeypatch, live):
    """The CI failure of the timed test above (stream --replay, a loaded machine): the rerun was killed
    0.5 s after it took the lock, while it still cleared the folder through Beam's file systems, before
    it wrote its RUNNING summary. The summary now comes straight after the lock: whatever the run does
    next finds it RUNNING; a start that fails puts the folder's summary back."""
    out = tmp_path / "out"
    out.mkdir()
    done = {"state": "DONE", "run_id": "r1"}
    (out / "summary.json").write_text(json.dumps(done))
    (out / "manifest.json").write_text(json.dumps({"run_id": "r1", "outputs": {}}))
    seen = []
    monkeypatch.setattr(sinks, "_remove_beam_temp", lambda d: seen.append(_summary(out)["state"]))
    run = sinks.start_output(str(out), ["metrics-*"], live=live, command="test")
    try:
        assert seen == ["RUNNING"]
        assert _summary(out)["run_id"] == run.run_id
    finally:
        sinks.close_output(run)
    # ended without publishing: the published run's summary back (staged), FAILED (live, written in place)
    assert _summary(out) == done if not live else _summary(out)["state"] == "FAILED"

    def boom(d):
        raise OSError("disk gone")

    (out / "summary.json").write_text(json.dumps(done))
    monkeypatch.setattr(sinks, "_remove_beam_temp", boom)
    with pytest.raises(OSError, match="disk gone"):
        sinks.start_output(str(out), ["metrics-*"], live=live, command="test")
    assert _summary(out) == (done if not live else None)
    assert not (out / ".streameval.lock").exists()


def test_a_resumed_live_run_keeps_the_stopped_runs_files(tmp_path):
    """A streaming job restored from a savepoint (Flink's ``--savepoint_path``) goes on with the stopped
    job's windows and pane indexes: its output folder keeps the stopped run's pane files (a fresh live
    run removes them), loses only the manifest while it runs, and keeps the stopped run's summary
    (``previous_summary``; a resumed run that fails writes it into its FAILED summary). A remote folder
    (each run's panes in a folder of its own) and a staged output are refused."""
    out = tmp_path / "out"
    out.mkdir()
    stopped = {"state": "DONE", "run_id": "r1", "accounting": {"impression": {"read": 40}}}
    (out / "summary.json").write_text(json.dumps(stopped))
    (out / "manifest.json").write_text(json.dumps({"complete": True, "run_id": "r1", "outputs": {}}))
    (out / "metrics-20191124T000000-pane0-final.jsonl").write_text('{"metric": "ctr"}\n')
    run = sinks.start_output(str(out), ["metrics-*"], live=True, resume=True, command="streameval stream")
    assert (out / "metrics-20191124T000000-pane0-final.jsonl").exists() and not (out / "manifest.json").exists()
    assert json.loads(run.previous_summary) == stopped and _summary(out)["state"] == "RUNNING"
    sinks.close_output(run)
    failed = _summary(out)
    assert failed["state"] == "FAILED" and failed["previous_run"] == stopped

    fresh = sinks.start_output(str(out), ["metrics-*"], live=True, command="streameval stream")
    assert not (out / "metrics-20191124T000000-pane0-final.jsonl").exists() and fresh.previous_summary is None
    sinks.close_output(fresh)
    for where, live in (("s3://bucket/out", True), (str(tmp_path / "staged"), False)):
        with pytest.raises(ValueError, match="a resumed streaming job goes on writing a local --output"):
            sinks.start_output(where, ["metrics-*"], live=live, resume=True)
    assert not (tmp_path / "staged").exists()
