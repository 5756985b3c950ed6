"""The launcher's watchdog of a portable job (``--stall-timeout``, :func:`accounting.wait_for_job`):
Prism 2.62 keeps a job RUNNING for ever when the SDK worker it waits for is lost (its worker pool
killed: tests/test_engines.py -k killed, about one run in three); Beam's 60 s deadline on the job's
streams used to end such a job, and every healthy job longer than a minute with it. The watchdog
cancels a job whose metrics changed and then stood still for the timeout, and never a job whose
runner reports metrics only at the end (Beam's Flink job server) or whose metrics keep changing.

A stand-in for Beam's portable ``PipelineResult`` (its class, so the portable path is taken; its
state, cancel and metrics scripted) and a fake clock; the real job service is the engine tier's."""

from __future__ import annotations

import pytest
from apache_beam.runners.portability.portable_runner import PipelineResult as PortableResult

from streameval.beam import accounting
from streameval.beam.sources import failure_reason


class _Job(PortableResult):
    """RUNNING until ``done_at`` seconds of the fake clock (never: None), then DONE."""

    def __init__(self, clock, done_at=None):  # noqa: D401 (Beam's __init__ is not called)
        self.clock, self.done_at, self.cancelled = clock, done_at, False

    @property
    def state(self):
        if self.cancelled:
            return "CANCELLED"
        return "DONE" if self.done_at is not None and self.clock.now >= self.done_at else "RUNNING"

    def cancel(self):
        self.cancelled = True

    def wait_until_finish(self, duration=None):
        raise AssertionError("a DONE job is not waited on")


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def _wait(job, clock, digest, timeout=60.0, live=None):
    return accounting.wait_for_job(job, poll=0.5, sleep=clock.sleep, clock=clock, digest=digest,
                                   stall_timeout=timeout, live=live)


def test_a_job_whose_metrics_stop_changing_is_cancelled_after_the_timeout():
    clock = _Clock()
    job = _Job(clock)  # RUNNING for ever, as Prism 2.62 with its worker lost
    # metrics that change for the first 20 s (bundles finishing), then stand still
    with pytest.raises(accounting.JobStalledError) as e:
        _wait(job, clock, lambda: str(min(clock.now, 20.0) // 5).encode())
    assert job.cancelled
    # the last change was seen at 20 s (looks every 5 s): cancelled at the first look 60 s after it
    assert 80.0 <= clock.now <= 80.0 + accounting.PROGRESS_EVERY_S + 0.5
    assert failure_reason(e.value).startswith("no progress for 60 s: the runner still reports the job RUNNING")


def test_a_job_whose_metrics_keep_changing_runs_on():
    clock = _Clock()
    job = _Job(clock, done_at=1000.0)  # longer than the timeout, making progress throughout
    assert _wait(job, clock, lambda: str(clock.now // 5).encode()) == "DONE"
    assert not job.cancelled and clock.now >= 1000.0


@pytest.mark.parametrize("digest", [lambda: b"", lambda: None], ids=["never-changing", "unknown"])
def test_metrics_that_never_change_or_cannot_be_read_never_arm_it(digest):
    """Beam's Flink job server reports a job's metrics when it ends: the same (empty) metrics for the
    whole run are no sign of a stall."""
    clock = _Clock()
    job = _Job(clock, done_at=2000.0)
    assert _wait(job, clock, digest) == "DONE" and not job.cancelled


def test_on_a_job_service_reporting_while_running_metrics_that_never_change_stall_it():
    """Prism reports metrics from its bundles' progress: a job whose worker pool was killed before
    its first progress report keeps empty metrics, RUNNING for ever (seen in the engine tier: the
    launcher waited past the test's 400 s). Armed when the job is first seen RUNNING, not before."""
    clock = _Clock()
    starting_until = 100.0

    class _Starting(_Job):
        @property
        def state(self):
            return "STARTING" if clock.now < starting_until and not self.cancelled else super().state

    job = _Starting(clock)
    with pytest.raises(accounting.JobStalledError):
        _wait(job, clock, lambda: b"", live=True)
    assert job.cancelled
    # first seen RUNNING at 100 s (a look every 5 s): cancelled 60 s after that look, not 60 s after the start
    assert starting_until + 60.0 <= clock.now <= starting_until + 60.0 + 2 * accounting.PROGRESS_EVERY_S


def test_on_a_job_service_reporting_while_running_changing_metrics_run_on():
    clock = _Clock()
    job = _Job(clock, done_at=1000.0)
    assert _wait(job, clock, lambda: str(clock.now // 30).encode(), live=True) == "DONE" and not job.cancelled


def test_a_job_service_that_fails_to_answer_for_metrics_is_no_stall():
    clock = _Clock()
    job = _Job(clock, done_at=500.0)
    calls = []

    def digest():
        calls.append(clock.now)
        if len(calls) > 2:
            raise RuntimeError("UNAVAILABLE")
        return str(len(calls)).encode()

    assert _wait(job, clock, digest) == "DONE" and not job.cancelled


def test_none_turns_it_off_and_a_duration_needs_its_unit():
    import argparse

    p = argparse.ArgumentParser()
    accounting.add_stall_timeout_argument(p)
    assert accounting.stall_timeout_from_args(p.parse_args([])) == 600.0
    assert accounting.stall_timeout_from_args(p.parse_args(["--stall-timeout", "none"])) is None
    assert accounting.stall_timeout_from_args(p.parse_args(["--stall-timeout", "90s"])) == 90.0
    with pytest.raises(ValueError, match="--stall-timeout '90' has no unit"):
        accounting.stall_timeout_from_args(p.parse_args(["--stall-timeout", "90"]))
    clock = _Clock()
    job = _Job(clock, done_at=300.0)
    assert accounting.wait_for_job(job, poll=0.5, sleep=clock.sleep, clock=clock, digest=lambda: b"x",
                                   stall_timeout=None) == "DONE"


def test_the_batch_job_refuses_a_bad_stall_timeout(tmp_path, capsys):
    from streameval.jobs import batch

    from .test_first_day import _write_small

    code = batch.main([*_write_small(tmp_path), "--metrics", "map", "--output", str(tmp_path / "o"),
                       "--stall-timeout", "ten"])
    assert code == 2
    assert "cannot parse --stall-timeout 'ten'" in capsys.readouterr().err


def test_a_go_runners_panic_is_reported_by_its_message_not_a_stack_frame():
    """Prism 2.62 under the same fault sometimes panics; the job's error then ends in the goroutines'
    stacks, whose last line ("/root/.cache/.../errgroup.go:75 +0x95") was the one line printed."""
    text = ("Pipeline job-001 failed in state FAILED: panic in stage.Execute bundle processing goroutine: send on "
            "closed channel, stage: &{ID:stage-056}\n"
            "goroutine 95 [running]:\n"
            "runtime/debug.Stack()\n"
            "\t/usr/local/go/src/runtime/debug/stack.go:26 +0x5e\n"
            "created by golang.org/x/sync/errgroup.(*Group).Go in goroutine 40\n"
            "/root/.cache/streameval/go/mod/golang.org/x/sync@v0.10.0/errgroup/errgroup.go:75 +0x95")
    assert failure_reason(RuntimeError(text)) == text.splitlines()[0]


def test_flink_progress_is_the_named_running_jobs_vertex_io_from_the_rest_api():
    """On Flink (Beam's job server reports metrics only at the end) the watch reads the job's
    progress from Flink's REST API: the one running job named after the pipeline's job_name, its
    vertices' status and I/O counters (not their busy and idle times, which grow in a stuck task)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from .fake_rest import serve_json

    state = {"busy": 0.0, "records": 10, "jobs": [
        {"jid": "a1", "name": "streameval-x", "state": "RUNNING"},
        {"jid": "b2", "name": "streameval-x", "state": "FINISHED"},  # an earlier run of that name: not it
        {"jid": "c3", "name": "other", "state": "RUNNING"}]}

    def get(path):
        if path == "/jobs/overview":
            return {"jobs": state["jobs"]}
        if path == "/jobs/a1":
            return {"state": "RUNNING", "vertices": [
                {"id": "v1", "status": "RUNNING", "metrics": {"read-records": state["records"], "write-bytes": 5,
                                                              "accumulated-busy-time": state["busy"]}}]}
        return None

    server = serve_json(get)
    try:
        master = f"127.0.0.1:{server.server_address[1]}"
        progress = accounting._flink_progress(PipelineOptions(["--flink_master", master]), "streameval-x")
        first = progress()
        assert first is not None
        state["busy"] = 99.0  # a stuck task stays busy: no progress
        assert progress() == first
        state["records"] = 11
        assert progress() != first
        state["jobs"].append({"jid": "d4", "name": "streameval-x", "state": "RUNNING"})  # two: none known
        assert progress() is None
        assert accounting._flink_progress(PipelineOptions([]), "streameval-x") is None
        assert accounting._flink_progress(PipelineOptions(["--flink_master", "[auto]"]), "streameval-x") is None
    finally:
        server.shutdown()
        server.server_close()
    assert progress() is None  # the REST API gone: not known (never a stall by itself)


def test_a_flink_job_the_job_server_left_running_is_cancelled_through_flinks_rest_api():
    """Beam 2.62's Flink job server answers a cancel of a streaming job without cancelling it on the
    cluster (the engine tier's Kafka job went on for minutes after the launcher said it was
    cancelled): the launcher asks Flink itself (PATCH /jobs/ID?mode=cancel) and says so only when the
    job is gone; a job Flink will not cancel is named."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from .fake_rest import serve_json

    jobs = {"a1": {"jid": "a1", "name": "streameval-x", "state": "RUNNING"},
            "b2": {"jid": "b2", "name": "other", "state": "RUNNING"}}
    stubborn = set()
    patched = []

    def patch(path):
        jid = path.split("/")[2].split("?")[0]
        patched.append(path)
        if jid not in stubborn:
            jobs[jid]["state"] = "CANCELED"
        return {}

    server = serve_json(lambda path: {"jobs": list(jobs.values())}, patch)
    try:
        options = PipelineOptions(["--job_endpoint", "127.0.0.1:1", "--job_name", "streameval-x",
                                   "--flink_master", f"127.0.0.1:{server.server_address[1]}"])
        clock = _Clock()
        assert accounting._flink_jobs_left(options, timeout=5, sleep=clock.sleep) == []
        assert patched == ["/jobs/a1?mode=cancel"] and jobs["b2"]["state"] == "RUNNING"  # another job untouched
        jobs["c3"] = {"jid": "c3", "name": "streameval-x", "state": "RUNNING"}
        stubborn.add("c3")
        assert accounting._flink_jobs_left(options, timeout=1, sleep=lambda s: None) == ["c3"]
        assert patched.count("/jobs/c3?mode=cancel") == 1  # asked once, then waited
        assert accounting._flink_jobs_left(PipelineOptions(["--job_endpoint", "127.0.0.1:1", "--job_name", "x"])) \
            is None  # no Flink master: nothing to ask
    finally:
        server.shutdown()
        server.server_close()
