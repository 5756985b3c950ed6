"""The engine tier: real engines started by ``streameval cluster up`` (Prism, a local Flink cluster),
the batch job on them against the same job on the local runner (FnApiRunner in this process), and
``cluster down`` leaving no process.

Reference: the in-process FnApiRunner run of the same arguments (itself checked against evaluate(),
trec_eval, pytrec_eval and hand calculations elsewhere). Equal means what tests/test_portable.py's
``assert_same`` says: the metric rows (JSON lines and Avro, as sorted lists, floats to the bit), the
dead letters, the unjudged requests, the damaged files, the comparisons, the accounting and the
counters.

The parts come from ``streameval cluster fetch`` (.ci/run calls it first). A test skips only where
the tool that builds or runs its engine is missing (``go`` for Prism, ``java`` for Flink), or, for
the batch job on Flink, where Beam's Flink job server jar could not be had (the skip says the
reason ``fetch`` recorded); with the tool present and the part missing, the fixture fetches it and
fails if it still cannot. Run with ``pytest -m engines tests/test_engines.py`` (``make test-engines``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from streameval.commands import engines, processes
from streameval.io import avro

from .test_columnar import _messy_logs
from .test_portable import BOOTSTRAP_COMPARE, MESSY_COLUMNAR, SAMPLE_COLUMNAR, assert_same, read_output, run_job

pytestmark = [
    pytest.mark.engines,
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
#: seconds `cluster up` may take (JVMs and Beam's imports on a loaded 2-core machine)
UP_TIMEOUT = 400


def _cli(*argv, timeout=UP_TIMEOUT) -> subprocess.CompletedProcess:
    """``streameval cluster ...`` as a user runs it: another process, this interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def _need(part: str, tool: str) -> None:
    """Skip when ``tool`` is not installed; else fetch ``part`` if the cache lacks it, and fail if
    it still cannot be had."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed: the {part} engine cannot be built or run here")
    if engines.missing([part]):
        engines.fetch(only=(part,), retry=True)
    lacking = engines.missing([part])
    if lacking:
        pytest.fail(f"{tool} is installed but {lacking[0]}", pytrace=False)


def _gone(pids) -> list[int]:
    """The PIDs (and members of their process groups) still running: none when all are gone."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            pgid = os.getpgid(int(d.name))
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (int(d.name) in pids or pgid in pids):
            left.append(int(d.name))
    return left


def _up(engine: str, state: Path, *extra) -> dict:
    done = _cli("up", engine, "--state-dir", str(state), *extra)
    assert done.returncode == 0, f"cluster up {engine}: exit {done.returncode}: {done.stderr[-2000:]}"
    info = json.loads(done.stdout)
    assert set(info) == {"engine", "runner_args", "processes", "web_ui", "logs"} | (
        {"job_jars"} if engine == "flink" and "--no-job-server" not in extra else set())
    return info


def _down(state: Path, info: dict) -> None:
    done = _cli("down", "--state-dir", str(state), timeout=120)
    assert done.returncode == 0, done.stderr
    assert _gone(set(info["processes"].values())) == []


@pytest.fixture(scope="session")
def prism(tmp_path_factory):
    _need("prism", "go")
    state = tmp_path_factory.mktemp("prism-cluster")
    info = _up("prism", state)
    try:
        yield info
    finally:
        _down(state, info)


@pytest.fixture(scope="session")
def flink(tmp_path_factory):
    """A local Flink cluster: 2 TaskManagers with 2 slots each; with Beam's Flink job server when
    its jar is in the cache, else without (``--no-job-server``; the batch job on Flink skips)."""
    _need("flink", "java")
    state = tmp_path_factory.mktemp("flink-cluster")
    has_job_server = not engines.missing(["job_server"])
    info = _up("flink", state, "--taskmanagers", "2", "--slots", "2",
               *(() if has_job_server else ("--no-job-server",)))
    info["has_job_server"] = has_job_server
    try:
        yield info
    finally:
        _down(state, info)


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """The launcher's working directory: a copy of the sample and the messy logs, one file cut short."""
    d = tmp_path_factory.mktemp("engines-launch")
    for sub in ("impressions", "judgments"):
        shutil.copytree(SAMPLE / sub, d / "sample" / sub)
    imp_files, judg = _messy_logs(11)
    for i, recs in enumerate(imp_files):
        avro.write_records(d / "messy" / f"imps-{i}.avro", "impression", recs)
    avro.write_records(d / "messy" / "judg.avro", "judgment", judg)
    extra = [dict(r, event_id="x" + r["event_id"], request_id="x" + r["request_id"]) for r in imp_files[0]]
    whole = d / "whole.avro"
    avro.write_records(whole, "impression", extra, sync_interval=2000)
    data = whole.read_bytes()
    (d / "messy" / "imps-cut.avro").write_bytes(data[: len(data) * 2 // 3])
    whole.unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        yield d


JOBS = {"sample-columnar": (SAMPLE_COLUMNAR, 0), "messy-columnar": (MESSY_COLUMNAR, 3),
        "bootstrap-compare": (BOOTSTRAP_COMPARE, 0)}


def _pair(name: str, engine: str, runner_args, runner_name: str):
    argv, expect = JOBS[name]
    code, got = run_job(argv, f"{name}/{engine}", runner_args)
    assert code == expect, f"{name} on {engine}: exit {code}"
    assert got["summary"]["runner"] == runner_name and got["manifest"]["complete"]
    code, ref = run_job(argv, f"{name}/local")
    assert code == expect and ref["metrics.jsonl"]
    assert got["outputs"] == ref["outputs"]
    return got, ref


# ------------------------------------------------------------------------------------------------
# Prism


@pytest.mark.parametrize("name", list(JOBS))
def test_batch_on_prism_equals_local(prism, launch, name):
    # Prism 2.62 loses Beam counter reports of bundles that end together (docs/deploy.md "Counters on
    # Prism"): until the batch job counted as data (streameval/beam/counts_as_data.py), about one run
    # in 30 to 50 failed its accounting here. Now every counter is reported by one step, once.
    argv, expect = JOBS[name]
    code, got = run_job(argv, f"{name}/prism", prism["runner_args"])
    assert code == expect, f"{name} on prism: exit {code}"
    assert got["summary"]["runner"] == "PortableRunner" and got["manifest"]["complete"]
    code, ref = run_job(argv, f"{name}/local")
    assert code == expect and ref["metrics.jsonl"]
    assert got["outputs"] == ref["outputs"]
    assert_same(got, ref)
    metrics = {json.loads(r)["metric"] for r in ref["metrics.jsonl"]}
    if name == "messy-columnar":  # online metrics and every kind of dead letter, a damaged file
        assert {"auc", "gauc[user,impressions]", "clicks@10", "rr_first_click"} <= metrics
        assert [json.loads(x)["source"] for x in got["unreadable_files.jsonl"]] == \
            [str(launch / "messy" / "imps-cut.avro")]
    if name == "bootstrap-compare":
        assert len(ref["comparisons.jsonl"]) == 3
    # the job ran in the pool's worker processes, not here
    pool_log = Path(prism["logs"]) / "worker_pool-1.log"
    assert "Starting worker with command" in pool_log.read_text(errors="replace")


def test_stream_replay_on_prism_equals_local(prism, launch):
    """``streameval stream --replay`` with the cluster's runner_args (the replay source, a splittable
    DoFn that reads the logs on a worker: no data in the pipeline graph, no TestStream; its records
    enter the columnar engine as blocks without a watermark) against the local streaming runner (the
    columnar engine on its own replay): the same pane files, each with the same rows."""
    from streameval.jobs import stream

    from .conftest import fail_after

    argv = ["--replay", "--impressions", "sample/impressions/letor_*.avro", "--judgments",
            "sample/judgments/letor_test_labels.avro", "--window", "1d", "--metrics", "ndcg@10,map,P@5", "--quiet"]
    with fail_after(600, "the stream job on Prism"):
        assert stream.main([*argv, "--output", "stream/prism", *prism["runner_args"]]) == 0
    assert stream.main([*argv, "--output", "stream/local"]) == 0

    def panes(out):
        return {p.name: sorted(p.read_text().splitlines()) for p in Path(out).glob("metrics-*.jsonl")}

    got, ref = panes("stream/prism"), panes("stream/local")
    assert ref and all(ref.values()) and got == ref
    assert all(name.endswith("-final.jsonl") for name in ref)


def test_prism_up_status_down_leaves_no_process(tmp_path):
    _need("prism", "go")
    info = _up("prism", tmp_path / "state")
    assert set(info["processes"]) == {"prism", "worker_pool-1"}
    with urllib.request.urlopen(info["web_ui"], timeout=10) as r:
        assert r.status == 200
    done = _cli("status", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 0 and json.loads(done.stdout)["running"] is True
    _down(tmp_path / "state", info)
    done = _cli("status", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2 and "no cluster in" in done.stderr


def _job_endpoint_options(info):
    """Pipeline options naming the job service of a cluster of ``cluster up`` (its runner_args)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args = info["runner_args"]
    return PipelineOptions(["--job_endpoint", args[args.index("--job_endpoint") + 1], "--job_name", "x"])


def test_the_stall_watch_arms_at_running_on_prism(prism):
    """The launcher's watchdog (accounting.wait_for_job) arms when the job is first seen RUNNING on a
    job service that reports metrics while a job runs (Prism; Flink's: the Flink test below)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from streameval.beam.accounting import reports_while_running

    assert reports_while_running(_job_endpoint_options(prism))
    assert not reports_while_running(PipelineOptions(["--job_endpoint", "127.0.0.1:1", "--job_name", "x"]))


def _signal_once_a_worker_starts(pool_log: Path, pgid: int, sig: int, delay: float):
    """A started daemon thread that sends ``sig`` to the process group ``pgid`` ``delay`` seconds
    after the worker pool's log (``pool_log``) says a new SDK worker started (within 300 s), and the
    event it sets once it has (its ``at``: when, ``time.monotonic()``)."""
    import threading

    started = pool_log.read_text(errors="replace").count("Starting worker with command")
    sent = threading.Event()

    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if pool_log.read_text(errors="replace").count("Starting worker with command") > started:
                time.sleep(delay)
                os.killpg(pgid, sig)
                sent.at = time.monotonic()
                sent.set()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, sent


@pytest.mark.parametrize("victim,reason", [
    ("prism", "the runner's service stopped answering (UNAVAILABLE: "),
    # Prism 2.77 failed the job with its reason; Prism 2.62 either fails it (SDK worker disconnected)
    # or keeps it RUNNING for ever, waiting for the lost worker (about one run in three): then the
    # launcher's watchdog (--stall-timeout, 30 s here) cancels it
    ("worker_pool-1", ("Pipeline job-", "the runner's service stopped answering (DEADLINE_EXCEEDED: ",
                       "no progress for 30 s: the runner still reports the job RUNNING")),
])
def test_a_process_killed_under_the_batch_job_on_prism_fails_it(tmp_path, launch, capsys, victim, reason):
    """SIGKILL to Prism (the job server) or to the worker pool's process group (the pool and its SDK
    workers) once the job's first SDK worker has started: the job exits 1 with one ``error:`` line
    (Prism: the lost service's gRPC status, was ``the job failed: >``; the pool: Prism's reason,
    ``SDK worker disconnected`` or, a minute later, a new worker's missing control connection), nothing is published under --output (no manifest, no metric
    rows), and ``cluster down`` still stops the rest. Prism does not retry a bundle whose worker
    died, so no run finishes after such a fault."""
    from streameval.jobs import batch

    from .conftest import fail_after

    _need("prism", "go")
    state = tmp_path / "state"
    info = _up("prism", state)
    try:
        # each process leads its own group
        killer, killed = _signal_once_a_worker_starts(Path(info["logs"]) / "worker_pool-1.log",
                                                      info["processes"][victim], signal.SIGKILL, 1)
        out = tmp_path / "out"
        capsys.readouterr()
        with fail_after(400, f"the batch job on Prism with {victim} killed"):
            code = batch.main([*SAMPLE_COLUMNAR, "--output", str(out), "--quiet", "--stall-timeout", "30s",
                               *info["runner_args"]])
        killer.join(5)
        assert killed.is_set(), f"no SDK worker started: {victim} was not killed under the job"
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if line.startswith("error:")]
        assert code == 1
        reasons = reason if isinstance(reason, tuple) else (reason,)
        assert len(errors) == 1 and errors[0].startswith(tuple(f"error: the job failed: {r}" for r in reasons)), err
        assert not any(line.startswith(("Traceback", "Exception in thread")) for line in err), err
        if victim == "prism":
            assert err == errors  # nothing but the one line
        elif "DEADLINE_EXCEEDED" not in errors[0] and "no progress for" not in errors[0]:  # Prism's reason: the worker's connection lost, or never made by a replacement
            assert "failed in state FAILED: " in errors[0]
            # (Prism 2.62 may also panic: "panic in stage.Execute bundle processing goroutine: send on
            # closed channel", reported without its goroutines' stacks)
            assert any(r in errors[0] for r in ("SDK worker disconnected", "didn't get control connection",
                                                "panic in stage.Execute")), errors[0]
        assert not (out / "manifest.json").exists() and not list(out.glob("metrics*"))
    finally:
        _down(state, info)


# ------------------------------------------------------------------------------------------------
# Flink


def test_flink_cluster_runs_its_taskmanagers(flink):
    with urllib.request.urlopen(f"{flink['web_ui']}/overview", timeout=10) as r:
        overview = json.loads(r.read())
    assert overview["taskmanagers"] == 2 and overview["slots-total"] == 4
    assert overview["flink-version"] == engines.FLINK_VERSION
    names = {"jobmanager", "taskmanager-1", "taskmanager-2", "worker_pool-1"}
    assert names <= set(flink["processes"])
    assert ("job_server" in flink["processes"]) == flink["has_job_server"]
    if flink["has_job_server"]:
        # Beam's own job server by default (--runner-on-classpath: none)
        assert flink["job_jars"].startswith("the job server's classpath, staged with each job"), flink["job_jars"]
    assert all(processes.start_ticks(pid) is not None for pid in flink["processes"].values())
    # sized per slot for Beam's data plane (docs/deploy.md, "TaskManager memory for Beam's Python stages")
    from streameval.commands.cluster import SLOT_DIRECT_MB, SLOT_HEAP_MB
    for tm in _flink_get(flink["web_ui"], "/taskmanagers")["taskmanagers"]:
        mem = _flink_get(flink["web_ui"], f"/taskmanagers/{tm['id']}")["memoryConfiguration"]
        assert mem["taskHeap"] == SLOT_HEAP_MB * tm["slotsNumber"] << 20, mem
        assert mem["taskOffHeap"] == SLOT_DIRECT_MB * tm["slotsNumber"] << 20, mem
    for i in (1, 2):
        with open(f"/proc/{flink['processes'][f'taskmanager-{i}']}/cmdline", "rb") as f:
            assert b"-XX:+ExitOnOutOfMemoryError" in f.read().split(b"\0")
    master = flink["runner_args"][flink["runner_args"].index("--flink_master") + 1] \
        if "--flink_master" in flink["runner_args"] else None
    assert master is None or f"http://{master}" == flink["web_ui"]


def _need_job_server(has: bool) -> None:
    if not has:
        why = engines.status().get("job_server")
        pytest.skip("Beam's Flink job server jar is not in the cache: "
                    f"{why.reason if why and why.reason else 'not fetched'}")


def _flink_idle(cluster: dict, timeout: float = 120) -> None:
    """Wait until the shared Flink cluster runs no job and has every slot free (the test before may
    have left a job cancelling); fail naming what still runs and the slots when it does not, so that
    a job refused for want of slots (``NoResourceAvailableException``, once in a CI trial of
    2026-12-06) says why."""
    deadline = time.monotonic() + timeout
    while True:
        o = _flink_get(cluster["web_ui"], "/overview")
        if o["jobs-running"] == 0 and o["slots-available"] == o["slots-total"] > 0:
            return
        if time.monotonic() > deadline:
            jobs = [(j["name"], j["state"]) for j in _flink_get(cluster["web_ui"], "/jobs/overview")["jobs"]
                    if j["state"] not in ("FINISHED", "FAILED", "CANCELED")]
            raise AssertionError(f"the Flink cluster is not idle after {timeout:g} s: {o}; jobs {jobs}")
        time.sleep(1)


def test_stream_replay_on_flink_equals_local(flink, launch):
    """``streameval stream --replay`` through Beam's Flink job server: the replay source (a splittable
    DoFn) with its default pace, one second of processing time between steps (a checkpoint of the
    replay's restriction that Flink resumes; Flink's TestStream, used before, could not advance
    processing time); the same pane files as the local streaming runner's, each with the same rows,
    and the accounting from the job's counters."""
    from streameval.jobs import stream

    from .conftest import fail_after

    _need_job_server(flink["has_job_server"])
    _flink_idle(flink)
    argv = ["--replay", "--impressions", "sample/impressions/letor_*.avro", "--judgments",
            "sample/judgments/letor_test_labels.avro", "--window", "1d", "--metrics", "ndcg@10,map,P@5", "--quiet"]
    with fail_after(600, "the stream job on Flink"):
        assert stream.main([*argv, "--output", "stream/flink", *flink["runner_args"]]) == 0
    assert stream.main([*argv, "--output", "stream/flink-local"]) == 0

    def panes(out):
        return {p.name: sorted(p.read_text().splitlines()) for p in Path(out).glob("metrics-*.jsonl")}

    got, ref = panes("stream/flink"), panes("stream/flink-local")
    assert ref and all(ref.values()) and got == ref
    counters = json.loads(Path("stream/flink/summary.json").read_text())["counters"]
    assert counters["impressions_read"] == 1536 and counters["judgments_read"] == 768


def _watch_job(engine_dir: Path, runner_args, later_after: float, idle_stop: int):
    """``streameval stream --watch`` on a folder: 7 hourly files already there, written newest first (a
    backlog out of date order), and ``later_after`` seconds after the start one more renamed into the
    folder, with events after all the others (so none of it is late; if the source has not polled yet,
    it is part of the backlog); the watch ends ``idle_stop`` seconds after the last new file. Returns
    the output folder and the records written."""
    import threading
    import time

    from streameval.jobs import stream

    from .conftest import fail_after
    from .test_stream_columnar import _log

    engine_dir = engine_dir.resolve()  # the writer thread must not follow a later change of directory
    files, judg = _log(seed=11, n_requests=300)
    backlog = files[:-1]
    top = max(r["timestamp"] for f in backlog for r in f)
    seen = {r["request_id"] for f in backlog for r in f}
    last = [r for r in files[-1] if r["timestamp"] > top and r["request_id"] not in seen]
    assert len(last) > 20
    watch = engine_dir / "watch"
    watch.mkdir(parents=True)
    avro.write_records(engine_dir / "judgments.avro", "judgment", judg)
    for i in reversed(range(len(backlog))):
        avro.write_records(watch / f"part-{i:03d}.avro", "impression", backlog[i])

    def last_file():
        time.sleep(later_after)
        tmp = engine_dir / "part-007.avro"
        avro.write_records(tmp, "impression", last)
        os.replace(tmp, watch / "part-007.avro")

    writer = threading.Thread(target=last_file, daemon=True)
    writer.start()
    out = engine_dir / "out"
    argv = ["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(engine_dir / "judgments.avro"),
            "--metrics", "ndcg@10,map,P@5", "--window", "1h", "--slices", "device", "--watch-interval", "1",
            "--watch-idle-stop", str(idle_stop), "--quiet", "--output", str(out), *runner_args]
    with fail_after(600, f"the stream job with --watch in {engine_dir}"):
        assert stream.main(argv) == 0
    writer.join(timeout=later_after + 30)
    return out, [*backlog, last]


@pytest.fixture(scope="module")
def watch_reference(launch):
    """The local runner's ``--watch`` on the same log as the engines' (the log is made from a fixed
    seed) and the batch job on its files: (stream output folder, batch output folder), made once for
    both engines' tests."""
    from streameval.jobs import batch as batch_cli

    ref, _ = _watch_job(Path("watch-local"), [], later_after=8, idle_stop=15)
    bout = Path("watch-local-batch").resolve()
    assert batch_cli.main(["--impressions", "watch-local/watch/*.avro", "--judgments", "watch-local/judgments.avro",
                           "--metrics", "ndcg@10,map,P@5", "--window", "1h", "--slices", "device",
                           "--allowed-lateness", "0", "--runner", "FnApiRunner", "--engine", "records",
                           "--output", str(bout)]) == 0
    return ref, bout


@pytest.mark.parametrize("engine", ["prism", "flink"])
def test_stream_watch_on_engine_ends_and_equals_local_and_batch(engine, request, launch, watch_reference):
    """``--watch`` on Prism and on Flink (issue 37 item 2): the watch source, a splittable DoFn with an
    event-time watermark (streameval/beam/streaming/watch_source.py), reads a backlog written out of
    date order and a file added while the job runs; nothing is late by arrival; the job ends after
    ``--watch-idle-stop``; every final pane equals the local runner's --watch (its live watcher), and
    the panes, the late data and the accounting equal the batch job's on the same files."""
    from .test_stream import assert_final_equals_batch
    from .test_stream_columnar import _jsonl

    cluster = request.getfixturevalue(engine)
    if engine == "flink":
        _need_job_server(cluster["has_job_server"])
        _flink_idle(cluster)
    # the engines start the source 2-30 s after the launch (Prism on a warm machine in 2 s); the local
    # runner in a few seconds. The idle stop counts from the last new file: once the backlog is read it
    # must outlast the later file's delay (20 s, and a writer thread that may wait for the GIL: 7 s seen),
    # or the watch ends before that file and its events are late (seen on Prism with idle_stop 0 s after
    # the file's delay); 20 s to spare (a file that comes before the source's first look is backlog)
    got, files = _watch_job(Path(f"watch-{engine}"), cluster["runner_args"], later_after=20, idle_stop=40)
    ref, bout = watch_reference  # (the same log: files of the same records, in another folder)

    def panes(out):
        return {p.name: sorted(p.read_text().splitlines()) for p in Path(out).glob("metrics-*.jsonl")}

    assert panes(got) == panes(ref) and len(panes(ref)) > 6
    summary = json.loads((got / "summary.json").read_text())
    assert summary["counters"]["impressions_read"] == sum(len(f) for f in files)
    assert_final_equals_batch(_jsonl(got, "metrics-*.jsonl"), _jsonl(bout, "metrics.jsonl"))
    # nothing is late by arrival: the only late impressions are those the batch job sets aside too (a
    # request's items after its first hour's end, lateness 0 in both)
    # (as sets: when Flink restarts the job, e.g. a TaskManager's heartbeat lost on this loaded machine,
    # the job runs again from the start without checkpointing, and the records set aside before the
    # restart are written a second time under other file names; docs/deploy.md, known defects)
    late = {(d["raw"], d["reason"]) for p in got.glob("late_data-*.jsonl") for d in map(json.loads, p.open())}
    batch_late = {(d["raw"], d["reason"]) for d in _jsonl(bout, "dead_letters.jsonl")
                  if d["source"] == "late:impression"}
    assert late == batch_late and len(batch_late) > 20
    assert summary["accounting"] == json.loads((bout / "summary.json").read_text())["accounting"]


@pytest.mark.parametrize("name", list(JOBS))
def test_batch_on_flink_equals_local(flink, launch, name):
    """The batch job through Beam's Flink job server on the local Flink cluster (its tasks on the
    TaskManagers, our Python code in the worker pool's SDK workers): every output, the accounting and
    the counters equal to the local runner's (the counters summed over every report of the job
    service: a transform after a flatten reports once per fused stage on Flink)."""
    _need_job_server(flink["has_job_server"])
    _flink_idle(flink)
    got, ref = _pair(name, "flink", flink["runner_args"], "PortableRunner")
    assert_same(got, ref)
    if name == "messy-columnar":
        assert [json.loads(x)["source"] for x in got["unreadable_files.jsonl"]] == \
            [str(launch / "messy" / "imps-cut.avro")]
    if name == "bootstrap-compare":
        assert len(ref["comparisons.jsonl"]) == 3
    pool_log = Path(flink["logs"]) / "worker_pool-1.log"
    assert "Starting worker with command" in pool_log.read_text(errors="replace")


def test_a_stopped_worker_pool_under_the_batch_job_on_flink_is_cancelled_by_the_stall_watch(flink, launch, tmp_path,
                                                                                           capsys):
    """The worker pool's process group SIGSTOPped once the job's first SDK worker has started: Flink
    keeps the job RUNNING with nothing moving (as with a TaskManager's gRPC thread out of memory at
    30 M, docs/benchmarks.md), and Beam's Flink job server reports metrics only at the end; the
    launcher's watch reads the job's progress from Flink's REST API (its vertices' I/O counters),
    cancels the job after ``--stall-timeout`` and exits 1 with one line; nothing is published, and
    the cluster's slots are free again for the next job."""
    from streameval.beam.accounting import reports_while_running
    from streameval.jobs import batch

    from .conftest import fail_after

    _need_job_server(flink["has_job_server"])
    # Beam's Flink job server reports metrics only at a job's end: the watch arms at a first change
    # (of the job's progress read from Flink's REST API), never at RUNNING (a long job is no stall)
    assert not reports_while_running(_job_endpoint_options(flink))
    pool = flink["processes"]["worker_pool-1"]
    stopper, stopped = _signal_once_a_worker_starts(Path(flink["logs"]) / "worker_pool-1.log", pool,
                                                    signal.SIGSTOP, 3)
    out = tmp_path / "out"
    capsys.readouterr()
    try:
        with fail_after(400, "the batch job on Flink with its worker pool stopped"):
            code = batch.main([*SAMPLE_COLUMNAR, "--output", str(out), "--quiet", "--stall-timeout", "30s",
                               *flink["runner_args"]])
        ended = time.monotonic()
    finally:
        stopper.join(5)
        os.killpg(pool, signal.SIGCONT)
    assert stopped.is_set(), "no SDK worker started: the pool was not stopped under the job"
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err == [e for e in err if e.startswith("error:")] and len(err) == 1, err
    assert err[0].startswith("error: the job failed: no progress for 30 s: the runner still reports the job "
                             "RUNNING"), err
    assert not (out / "manifest.json").exists() and not list(out.glob("metrics*"))
    # cancelled for the stop, not before it: at least the timeout after it, less Flink's 10 s between two
    # refreshes of its tasks' counters (the last change seen may predate the stop by that much)
    assert ended - stopped.at >= 30 - 10, f"cancelled {ended - stopped.at:.0f} s after the stop"
    _flink_idle(flink)  # the cancelled job gave its slots back


def _flink_get(web_ui: str, path: str) -> dict:
    """A JSON answer of Flink's REST API."""
    with urllib.request.urlopen(f"{web_ui}{path}", timeout=10) as r:
        return json.loads(r.read())


def _flink_job_running_on(web_ui: str) -> set:
    """The resource ids of the TaskManagers running a subtask of the cluster's running job (empty
    while none runs)."""
    with urllib.request.urlopen(f"{web_ui}/jobs/overview", timeout=10) as r:
        jobs = [j for j in json.loads(r.read())["jobs"] if j["state"] == "RUNNING"]
    where = set()
    for job in jobs:
        with urllib.request.urlopen(f"{web_ui}/jobs/{job['jid']}", timeout=10) as r:
            vertices = json.loads(r.read())["vertices"]
        for v in vertices:
            with urllib.request.urlopen(f"{web_ui}/jobs/{job['jid']}/vertices/{v['id']}", timeout=10) as r:
                for sub in json.loads(r.read())["subtasks"]:
                    if sub.get("status") == "RUNNING" and sub.get("taskmanager-id"):
                        where.add(sub["taskmanager-id"])
    return where


@pytest.mark.parametrize("victim", ["taskmanager", "job_server", "worker_pool"])
def test_a_process_killed_under_the_batch_job_on_flink(tmp_path, launch, capsys, victim):
    """SIGKILL, once the job's tasks run, to the TaskManager running them, or to Beam's job server.

    A TaskManager: Flink runs the lost tasks again on the other TaskManager (the cluster's
    exponential-delay restart strategy: a fixed-delay one counted each failed region as an attempt
    and gave up within 60 ms) and the job finishes with every output equal to the fault-free local
    run, Flink's exception history holding the lost TaskManager. The job server: the launcher loses
    the job's service and exits 1 with one ``error:`` line; nothing is published under --output.
    The worker pool (the one every TaskManager reaches: docs/deploy.md): Flink restarts the tasks,
    which cannot reach a pool any more, until its restart strategy gives up; the launcher exits 1
    with one ``error:`` line (the refused connection) and nothing is published. When the pool dies
    between starting a worker and the worker's connection, Beam's runner waits for that connection
    for ever: the launcher's stall watch (``--stall-timeout 60s``) cancels the job, one ``error:``
    line, nothing published.

    The TaskManager case runs on a cluster of ``--runner-on-classpath`` (Beam's runner on the Flink
    processes' classpath, a job server that stages no jars: docs/deploy.md, "Jobs without jars"), the
    others on the default one (Beam's job server staging its classpath), which the shared cluster of
    the other Flink tests runs too."""
    import signal
    import threading
    import time

    from streameval.jobs import batch

    from .conftest import fail_after

    _need("flink", "java")
    _need_job_server(not engines.missing(["job_server"]))
    state = tmp_path / "state"
    on_classpath = ("--runner-on-classpath",) if victim == "taskmanager" else ()
    info = _up("flink", state, "--taskmanagers", "2", "--slots", "2", *on_classpath)
    assert (info["job_jars"] == "none") == bool(on_classpath), info["job_jars"]
    try:
        killed: list = []

        def kill_when_running():
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    where = _flink_job_running_on(info["web_ui"])
                except OSError:
                    where = set()
                if where:
                    name = {"taskmanager": sorted(where)[0], "worker_pool": "worker_pool-1"}.get(victim, victim)
                    time.sleep(1)
                    os.killpg(info["processes"][name], signal.SIGKILL)  # each leads its own group
                    killed.append(name)
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_when_running, daemon=True)
        pool_log = Path(info["logs"]) / "worker_pool-1.log"
        workers_before = pool_log.read_text(errors="replace").count("Starting worker with command")
        killer.start()
        out = tmp_path / "out"
        capsys.readouterr()
        with fail_after(600, f"the batch job on Flink with the {victim} killed"):
            # a worker the pool started just before it was killed never connects, and Beam's runner waits for
            # its connection with no end (ExternalEnvironmentFactory.createEnvironment: "Still waiting for
            # startup of environment", the fresh-clone CI trial of be544b2): the stall watch ends that job
            stall = ["--stall-timeout", "60s"] if victim == "worker_pool" else []
            code = batch.main([*SAMPLE_COLUMNAR, "--output", str(out), "--quiet", *stall, *info["runner_args"]])
        killer.join(5)
        assert killed, f"no task of the job ran: the {victim} was not killed under the job"
        err = capsys.readouterr().err.strip().splitlines()
        errors = [line for line in err if line.startswith("error:")]
        if victim == "taskmanager":  # Flink ran the tasks again: the rows of a fault-free run
            assert code == 0, err[-20:]
            with urllib.request.urlopen(f"{info['web_ui']}/jobs/overview", timeout=10) as r:
                jobs = json.loads(r.read())["jobs"]
            assert [j["state"] for j in jobs] == ["FINISHED"]
            with urllib.request.urlopen(f"{info['web_ui']}/jobs/{jobs[0]['jid']}/exceptions", timeout=10) as r:
                history = json.loads(r.read()).get("exceptionHistory", {}).get("entries", [])
            assert history, "Flink recorded no failure: the TaskManager died after the job's tasks"
            assert any(killed[0] in json.dumps(e) for e in history), history  # the lost TaskManager's
            # Beam's runner on the classpath keeps a job's SDK worker between its stages (the jobs' default
            # --environment_cache_millis, streameval.beam.flink_options.reuse_workers): one worker per
            # TaskManager for the whole job, the restarted tasks' included (Beam's default: one per stage)
            started = pool_log.read_text(errors="replace").count("Starting worker with command") - workers_before
            assert 1 <= started <= 2, f"{started} SDK workers started for one job on 2 TaskManagers"
            got = read_output(out)
            code, ref = run_job(SAMPLE_COLUMNAR, str(tmp_path / "local"))
            assert code == 0
            assert_same(got, ref)
        elif victim == "worker_pool":
            assert code == 1 and len(errors) == 1, err
            # the killed pool's port refuses the restarted tasks, or another gRPC server has taken the freed
            # port by then (servers opened on port 0, as Beam's runner opens its fn API servers for each
            # restarted task, may get it) and answers that it has no worker pool: the fresh-clone CI trial
            # of 0159e69, 48 refusals in the JobManager's log, then "UNIMPLEMENTED: Method not found:
            # ...BeamFnExternalWorkerPool/StartWorker" on the last attempt
            stalled = errors[0].startswith("error: the job failed: no progress for 60 s")
            assert errors[0].startswith("error: the job failed: ") and (
                "Connection refused" in errors[0] or "BeamFnExternalWorkerPool/StartWorker" in errors[0]
                or stalled), errors
            assert not any(line.startswith("Traceback") for line in err), err
            assert not (out / "manifest.json").exists() and not list(out.glob("metrics*"))
            with urllib.request.urlopen(f"{info['web_ui']}/jobs/overview", timeout=10) as r:
                jobs = json.loads(r.read())["jobs"]
            assert [j["state"] for j in jobs] == ["CANCELED" if stalled else "FAILED"], (stalled, jobs)
            if not stalled:
                with urllib.request.urlopen(f"{info['web_ui']}/jobs/{jobs[0]['jid']}/exceptions", timeout=10) as r:
                    history = json.loads(r.read()).get("exceptionHistory", {}).get("entries", [])
                assert len(history) >= 2, history  # Flink tried again before it gave up
        else:
            assert code == 1 and len(errors) == 1, err
            assert errors[0].startswith("error: the job failed: the runner's service stopped answering"), errors
            assert not (out / "manifest.json").exists() and not list(out.glob("metrics*"))
    finally:
        _down(state, info)


# ------------------------------------------------------------------------------------------------
# Kafka: a broker in KRaft mode, and Beam's Kafka IO through its Java expansion service
#
# Reference: the records the test itself produced (Kafka's own console producer), read back with
# Kafka's own console consumer and with Beam's ReadFromKafka on Prism.

KAFKA_KEYS = {"engine", "bootstrap_servers", "processes", "logs"}


def _kafka_tool(main: str, *args, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """One of Kafka's command-line tools (its Java class) from the cached classpath."""
    cp = f"{engines.kafka_classpath()}/*"
    return subprocess.run(["java", "-cp", cp, main, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def _records(n: int, topic: str) -> list[str]:
    """``n`` impression events as JSON lines (the project's impression fields), distinct by event_id."""
    return [json.dumps({"event_id": f"{topic}-{i}", "request_id": f"r{i // 5}", "query_id": f"q{i % 7}",
                        "doc_id": f"d{i}", "position": i % 5 + 1, "timestamp": 1_700_000_000_000 + i,
                        "system": "A"}, sort_keys=True) for i in range(n)]


def _produce(bootstrap: str, topic: str, lines: list[str], partitions: int = 2) -> None:
    done = _kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create",
                       "--topic", topic, "--partitions", str(partitions), "--replication-factor", "1")
    assert done.returncode == 0 and f"Created topic {topic}." in done.stdout, done.stderr[-2000:]
    done = _kafka_tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", bootstrap, "--topic", topic,
                       stdin="".join(line + "\n" for line in lines))
    assert done.returncode == 0, done.stderr[-2000:]


def _up_kafka(state: Path, *extra) -> dict:
    _need("kafka", "java")
    done = _cli("up", "kafka", "--state-dir", str(state), *extra)
    assert done.returncode == 0, f"cluster up kafka: exit {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A Kafka broker with Beam's expansion service and a Java SDK worker pool beside it."""
    _need("kafka_io", "java")
    state = tmp_path_factory.mktemp("kafka-cluster")
    info = _up_kafka(state, "--expansion-service")
    assert set(info) == KAFKA_KEYS | {"expansion_service", "flink_expansion_service"}
    assert set(info["processes"]) == {"kafka", "java_worker_pool", "expansion_service", "expansion_service_flink"}
    try:
        yield info
    finally:
        _down(state, info)


@pytest.mark.kafka
def test_kafka_up_produce_consume_status_down_leaves_no_process(tmp_path):
    """``cluster up kafka``: one broker on 127.0.0.1 that takes a topic, records from Kafka's console
    producer and gives them back to Kafka's console consumer; ``status`` and ``down`` by PID."""
    state = tmp_path / "state"
    info = _up_kafka(state)
    try:
        assert set(info) == KAFKA_KEYS and set(info["processes"]) == {"kafka"}
        host, port = info["bootstrap_servers"].rsplit(":", 1)
        assert host == "127.0.0.1" and processes.listening_inodes(int(port))
        lines = _records(40, "events")
        _produce(info["bootstrap_servers"], "events", lines)
        done = _kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                           info["bootstrap_servers"], "--topic", "events", "--from-beginning", "--max-messages",
                           str(len(lines)), "--timeout-ms", "60000")
        assert done.returncode == 0, done.stderr[-2000:]
        assert sorted(done.stdout.splitlines()) == sorted(lines)
        done = _cli("status", "--state-dir", str(state))
        assert done.returncode == 0 and json.loads(done.stdout)["alive"] == {"kafka": True}
    finally:
        _down(state, info)
    done = _cli("status", "--state-dir", str(state))
    assert done.returncode == 2 and "no cluster in" in done.stderr


_READ_KAFKA = """
import sys
import apache_beam as beam
from apache_beam.io.kafka import ReadFromKafka
from apache_beam.options.pipeline_options import PipelineOptions

bootstrap, topic, n, expansion, out = sys.argv[1:6]
with beam.Pipeline(options=PipelineOptions(sys.argv[6:])) as p:
    (p | ReadFromKafka(consumer_config={"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"},
                       topics=[topic], max_num_records=int(n), expansion_service=expansion)
       | beam.Map(lambda kv: kv[1].decode("utf-8"))
       | beam.io.WriteToText(out, shard_name_template=""))
"""


@pytest.mark.kafka
@pytest.mark.parametrize("engine", ["prism", "flink"])
def test_beam_kafka_read(kafka, engine, request, tmp_path):
    """Beam's ReadFromKafka (the Java KafkaIO, expanded by the cached expansion service, its workers
    started by the Java worker pool) on Prism, then on Flink through Beam's job server (a bounded
    read: Flink's batch mode), beside the Python transforms on the Python worker pool: the N records
    produced, each once. The second job on the same Java worker pool is the one Beam's thread-based
    ExternalWorkerService never served."""
    engine_info = request.getfixturevalue(engine)
    if engine == "flink":
        _need_job_server(engine_info["has_job_server"])
    topic = f"impressions-{engine}"
    lines = _records(60, topic)
    _produce(kafka["bootstrap_servers"], topic, lines)
    script = tmp_path / "read_kafka.py"
    script.write_text(_READ_KAFKA)
    out = tmp_path / "read.txt"
    done = subprocess.run([sys.executable, str(script), kafka["bootstrap_servers"], topic, str(len(lines)),
                           kafka["expansion_service"], str(out), *engine_info["runner_args"]],
                          capture_output=True, text=True, timeout=420, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(out.read_text().splitlines()) == sorted(lines)


def _stream_on_kafka(tmp_path, kafka, engine_info, engine: str, topic: str, imps: list[dict],
                     metrics: str = "ctr") -> list[dict]:
    """``streameval produce`` the impressions into ``topic`` (record timestamps = event times), run
    ``streameval stream --kafka-impressions`` on the engine until every (window, system) has its final
    pane file, stop it with SIGINT; returns the final panes' rows. The launcher's line says the job on
    the runner was cancelled."""
    src = tmp_path / "imps.avro"
    avro.write_records(src, "impression", imps)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "produce", "--bootstrap-servers",
                           kafka["bootstrap_servers"], "--topic", topic, "--create-topic", "2", str(src)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["produced"] == len(imps), done.stderr[-2000:]
    expansion = kafka["flink_expansion_service" if engine == "flink" else "expansion_service"]
    out = tmp_path / "out"
    days = {r["timestamp"] // 86_400_000_000 for r in imps}
    systems = {r["system_id"] for r in imps}
    log = tmp_path / "stream.log"
    with open(log, "w") as fo:
        job = subprocess.Popen([sys.executable, "-m", "streameval.cli", "stream", "--kafka-bootstrap",
                                kafka["bootstrap_servers"], "--kafka-impressions", topic, "--kafka-expansion-service",
                                expansion, "--metrics", metrics, "--window", "1d", "--report-every", "5", "--quiet",
                                "--output", str(out), *engine_info["runner_args"]],
                               stdout=fo, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    # the launcher's running totals while the job runs: on Flink from Flink's REST API (its job server
    # reports counters only when a job ends: "nothing read yet" for the job's whole life until 2026-12-07)
    totals = f"running totals: impressions read {len(imps)}, valid {len(imps)}, late 0, rejected 0"
    try:
        deadline = time.monotonic() + 420
        while len(list(out.glob("metrics-*-final.jsonl"))) < len(days) * len(systems) or totals not in log.read_text():
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"final panes: {sorted(f.name for f in out.glob('*final.jsonl'))}\n" \
                                                f"{log.read_text()[-3000:]}"
            time.sleep(2)
        job.send_signal(signal.SIGINT)
        assert job.wait(120) == 130
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    said = log.read_text()
    assert "streameval stream: stopped by SIGINT; the job on the runner was cancelled" in said, said[-3000:]
    assert not list(out.glob("late_data-*")) and not list(out.glob("dead_letters-*"))  # a backlog is not late
    return [json.loads(line) for f in sorted(out.glob("metrics-*-final.jsonl")) for line in f.read_text().splitlines()]


@pytest.mark.kafka
@pytest.mark.parametrize("engine", ["prism", "flink"])
def test_stream_job_reads_kafka_live_equal_to_the_batch_job(kafka, engine, request, tmp_path):
    """The stream job on the engine reads a Kafka topic (a week of Open Bandit impressions of two
    logging policies produced ahead in event-time order, two partitions; Kafka's record timestamps =
    event times, the watermark follows them; nothing of the backlog is late) on the columnar engine
    (a bundle's records enter as one block of columns), with online metrics (click metrics beside CTR):
    Prism runs Beam's KafkaIO as a splittable DoFn in a Java SDK worker, Flink as its own unbounded
    source (the Flink expansion service). Every day's final pane is written while the job still
    runs; each equals the batch job's row on the same records, bit for bit; SIGINT cancels the job
    on the runner."""
    from .test_stream import assert_final_equals_batch

    engine_info = request.getfixturevalue(engine)
    if engine == "flink":
        _need_job_server(engine_info["has_job_server"])
    imps = [r for f in ("obd_bts_men.avro", "obd_random_men.avro")
            for r in avro.read_records(str(SAMPLE / "impressions" / f), "impression")]
    metrics = "ctr,clicks@3,rr_first_click,abandonment"
    rows = _stream_on_kafka(tmp_path, kafka, engine_info, engine, f"stream-{engine}", imps, metrics)
    # (online metrics: the per-event engine refuses them, so the columnar one ran)
    assert {r["metric"] for r in rows} == {"ctr", "ctr@pos1", "ctr@pos2", "ctr@pos3", "clicks@3", "rr_first_click",
                                           "abandonment"}
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "batch", "--impressions",
                           str(tmp_path / "imps.avro"), "--metrics", metrics, "--window", "1d", "--quiet",
                           "--output", str(tmp_path / "batch")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    batch_rows = [json.loads(x) for x in (tmp_path / "batch" / "metrics.jsonl").read_text().splitlines()]
    assert_final_equals_batch(rows, batch_rows)


def _live_requests(n0: int, now_us: int, rng, queries: int = 20, docs: int = 30, depth: int = 10) -> list[dict]:
    """One request's impressions: ``depth`` of ``docs`` items for one of ``queries`` queries, system A or
    B, all at ``now_us``, clicked with a probability falling with the position."""
    q, system = f"q{rng.integers(queries)}", "AB"[rng.integers(2)]
    items = rng.choice(docs, size=depth, replace=False)
    return [{"event_id": f"e{n0}-{pos}", "request_id": f"r{n0}", "query_id": q, "user_id": f"u{rng.integers(50)}",
             "system_id": system, "item_id": f"d{int(d)}", "position": pos, "score": float(depth - pos),
             "clicked": bool(rng.random() < 0.3 / pos), "timestamp": now_us, "propensity": None, "attributes": {},
             "dwell_ms": None}
            for pos, d in enumerate(items, 1)]


class _Live(NamedTuple):
    """What :func:`_stream_live` saw: every pane row (with its file's ``_file`` name and ``_mtime``),
    the events sent, the event ids the job sent to late data (``late_lines``: each late impression's
    event id, repeats kept), the other late-data records (``late_other``: a shard's update after its
    window closed, ``late:update``), the (window start, system) pairs, the metrics and the job's log."""

    rows: list
    sent: list
    late_lines: list
    late_other: list
    windows: set
    metrics: str
    log: str


def _flink_stop_with_savepoint(web_ui: str, target: str, drain: bool = False) -> str:
    """Stop the cluster's running job with a savepoint in ``target`` (Flink's REST API: ``POST
    /jobs/ID/stop``, the savepoint taken, then the job FINISHED; ``drain``: the sources send the
    largest watermark first, so every window closes); the savepoint's location."""
    [job] = [j["jid"] for j in _flink_get(web_ui, "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
    req = urllib.request.Request(f"{web_ui}/jobs/{job}/stop", method="POST",
                                 data=json.dumps({"targetDirectory": target, "drain": drain}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        trigger = json.loads(r.read())["request-id"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        got = _flink_get(web_ui, f"/jobs/{job}/savepoints/{trigger}")
        if got["status"]["id"] == "COMPLETED":
            op = got.get("operation") or {}
            assert "location" in op, op  # else "failure-cause"
            return op["location"]
        time.sleep(1)
    raise AssertionError(f"the savepoint of job {job} was not complete in 3 minutes")


def _stream_live(kafka, cluster, engine: str, judgments: str, tmp_path, extra=(), during=None,
                 resume_at: float | None = None) -> _Live:
    """Two minutes of live events into Kafka while the stream job runs on ``cluster`` (10 s windows,
    10 s allowed lateness, early panes every 3 s): 40 requests a second stamped with the wall clock minus
    up to 3 s (out of order within a bound), 3% of the requests sent twice (duplicates), after 45 s one
    request in 40 stamped 12 s back (late: a late pane, or late data past the lateness) and one in 80
    stamped 40 s back (late data). ``during(elapsed seconds)`` is called between batches. ``resume_at``
    (Flink): that many seconds in, the job is stopped with a savepoint (its launcher must end with exit
    status 0) and the same command started again with ``--savepoint_path`` (its log ``stream-2.log``),
    the events going on meanwhile. Waits until every window's final pane is written, then stops the job
    with SIGINT (resumed: stops it with a drained savepoint, its launcher ending with exit status 0 and
    its summary)."""
    import numpy as np
    from confluent_kafka import Producer

    from streameval.commands.produce import create_topic, produce

    metrics = "ndcg@10,ctr" + (",clicks@3,rr_first_click,auc" if judgments == "file" else "")
    bootstrap = kafka["bootstrap_servers"]
    rng = np.random.default_rng(11)
    judg = [{"query_id": f"q{q}", "item_id": f"d{d}", "grade": int(rng.integers(4)), "timestamp": 0, "source": "live",
             "subtopic": None}
            for q in range(20) for d in range(30)]
    topics = {k: f"live-{k}-{engine}-{judgments}-{tmp_path.name}" for k in ("impressions", "judgments")}
    for topic in topics.values():
        create_topic(bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, "log_level": 3})
    avro.write_records(tmp_path / "judgments.avro", "judgment", judg)
    if judgments == "topic":
        produce(bootstrap, topics["judgments"], judg, "judgment", producer=producer)
        source = ["--kafka-judgments", topics["judgments"]]
    else:
        source = ["--judgments", str(tmp_path / "judgments.avro")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out, log = tmp_path / "out", tmp_path / "stream.log"
    command = [sys.executable, "-m", "streameval.cli", "stream", "--kafka-bootstrap", bootstrap,
               "--kafka-impressions", topics["impressions"], *source, "--kafka-expansion-service",
               kafka["flink_expansion_service" if engine == "flink" else "expansion_service"],
               "--metrics", metrics,
               "--window", "10s", "--allowed-lateness", "10s", "--early-every", "3s",
               "--report-every", "10", "--quiet", "--output", str(out), *extra, *cluster["runner_args"]]
    with open(log, "w") as fo:
        job = subprocess.Popen(command, stdout=fo, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    sent: list[dict] = []
    try:
        # the job reads once its Kafka reader has started (Flink deploys it in 20-60 s): events produced
        # before that are a backlog, read first, not late
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < 120:
            assert job.poll() is None, log.read_text()[-3000:]
            now = time.time_ns() // 1000
            batch = []
            for _ in range(20):
                n += 1
                back = 40_000_000 if n % 80 == 0 and time.monotonic() - start > 45 else \
                    12_000_000 if n % 40 == 0 and time.monotonic() - start > 45 else int(rng.integers(3_000_000))
                recs = _live_requests(n, now - back, rng)
                batch += recs + (recs if rng.random() < 0.03 else [])
            produce(bootstrap, topics["impressions"], batch, "impression", producer=producer)
            sent += batch
            if during is not None:
                during(time.monotonic() - start)
            if resume_at is not None and time.monotonic() - start >= resume_at and log.name == "stream.log":
                where = _flink_stop_with_savepoint(cluster["web_ui"], str(tmp_path / "savepoints"))
                assert job.wait(120) == 0, log.read_text()[-3000:]  # the stopped job's launcher ends well
                log = tmp_path / "stream-2.log"
                with open(log, "w") as fo:
                    job = subprocess.Popen([*command, "--savepoint_path", where], stdout=fo,
                                           stderr=subprocess.STDOUT, env=env, start_new_session=True)
            time.sleep(0.5)
        last_end = (max(r["timestamp"] for r in sent) // 10_000_000 + 1) * 10_000_000
        windows = {(r["timestamp"] // 10_000_000 * 10_000_000, r["system_id"]) for r in sent}
        # every window's final pane: the watermark passes the last window's end plus the lateness once
        # the partitions are idle (Kafka's reader then moves it to the wall clock)
        deadline = time.monotonic() + 300
        while True:
            finals = {f.name for f in out.glob("metrics-*-final.jsonl")}
            if len(finals) >= len(windows) and time.time_ns() // 1000 > last_end + 20_000_000:
                break
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, \
                f"{len(finals)} of {len(windows)} final panes\n{log.read_text()[-3000:]}"
            time.sleep(2)
        if resume_at is None:
            job.send_signal(signal.SIGINT)
            assert job.wait(120) == 130, log.read_text()[-3000:]
        else:
            _flink_stop_with_savepoint(cluster["web_ui"], str(tmp_path / "savepoints"), drain=True)
            assert job.wait(120) == 0, log.read_text()[-3000:]
    finally:
        producer.flush(10)
        del producer  # librdkafka's client closes (else it retries the broker the fixture stops)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    rows = [dict(json.loads(line), _file=f.name, _mtime=f.stat().st_mtime)
            for f in out.glob("metrics-*.jsonl") for line in f.read_text().splitlines()]
    late = [json.loads(line) for f in out.glob("late_data-*.jsonl") for line in f.read_text().splitlines()]
    late_lines = [json.loads(d["raw"])["event_id"] for d in late if d["source"] == "late:impression"]
    assert not list(out.glob("dead_letters-*"))
    return _Live(rows, sent, late_lines, [d for d in late if d["source"] != "late:impression"], windows, metrics,
                 log.read_text())


def _assert_final_equals_batch_of_kept(live: _Live, tmp_path) -> list[dict]:
    """Every window's final pane equals the batch job on the events the stream did not send to late
    data (duplicates included: both jobs keep one copy), bit for bit. Returns the final rows."""
    from .test_stream import assert_final_equals_batch

    late_ids = set(live.late_lines)
    avro.write_records(tmp_path / "kept.avro", "impression", [r for r in live.sent if r["event_id"] not in late_ids])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "streameval.cli", "batch", "--impressions",
                           str(tmp_path / "kept.avro"), "--judgments", str(tmp_path / "judgments.avro"),
                           "--metrics", live.metrics, "--window", "10s", "--labels", "clicks", "--quiet",
                           "--output", str(tmp_path / "batch")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    batch_rows = [json.loads(line) for line in (tmp_path / "batch" / "metrics.jsonl").read_text().splitlines()]
    final = [{k: v for k, v in r.items() if not k.startswith("_")} for r in live.rows if r["is_final"]]
    assert_final_equals_batch(final, batch_rows)
    return final


@pytest.mark.kafka
@pytest.mark.parametrize("engine, judgments", [("flink", "topic"), ("flink", "file")])
def test_stream_job_scores_kafka_events_produced_live(kafka, engine, judgments, request, tmp_path):
    """Two minutes of live events into Kafka while the stream job runs on the engine (:func:`_stream_live`:
    out of order within a bound, duplicates, late panes, late data). Early, on-time and late panes are
    written while the job runs; every window's final pane equals the batch job on the events the job
    did not send to late data, bit for bit; the delay from a window's end to its on-time pane file is
    measured. Judgments from a topic: the per-event engine (ndcg@10 and CTR); from a file: the
    columnar engine, with online metrics beside them. (Not on Prism: docs/deploy.md, "Kafka on Prism".)"""
    import numpy as np

    cluster = request.getfixturevalue(engine)
    if engine == "flink":
        _need_job_server(cluster["has_job_server"])
        _flink_idle(cluster)
    live = _stream_live(kafka, cluster, engine, judgments, tmp_path)
    rows = live.rows
    assert {r["pane"] for r in rows} >= {"early", "on_time", "late"}, sorted({r["pane"] for r in rows})
    assert live.late_lines and not live.late_other, live.late_other[:3]
    final = _assert_final_equals_batch_of_kept(live, tmp_path)
    if judgments == "file":  # online metrics: the per-event engine refuses them, so the columnar one ran
        assert {"clicks@3", "rr_first_click", "auc"} <= {r["metric"] for r in final}
    # the delay from a window's end (wall clock = event time here) to its on-time pane file
    delays = sorted(r["_mtime"] - r["window_end"] / 1e6 for r in rows
                    if r["pane"] == "on_time" and r["metric"] == "ctr")
    med, p90 = float(np.median(delays)), float(np.percentile(delays, 90))
    print(f"\nlive Kafka on {engine} (judgments from a {judgments}): {len(live.sent)} impressions "
          f"({len(set(live.late_lines))} late data), {len(live.windows)} windows x system; window end -> on-time "
          f"pane file: median {med:.1f} s, p90 {p90:.1f} s")
    assert 0 < med < 60


@pytest.mark.kafka
def test_stream_on_kafka_with_checkpoints_survives_a_killed_taskmanager(kafka, tmp_path):
    """The live stream of :func:`_stream_live` on a Flink cluster of its own with checkpoints every
    2 s (``--checkpointing_interval``); 50 s into the production, once a checkpoint is complete, SIGKILL
    to the TaskManager running the job. Flink restores the job from its latest checkpoint on the other
    TaskManager (its exception history names the lost one; the checkpoint statistics a restore) and
    the job goes on reading Kafka from the checkpointed offsets. The stream job finishes Flink's bundles
    before a checkpoint's barrier (``--finish_bundle_before_checkpointing``, its default with
    checkpoints on): with Beam's default a shard's update held back by a checkpoint reached the
    aggregate after its window closed (late:update: final panes short of the batch job in 2 of 3
    runs). Exactly once: every window's final
    pane equals the batch job on the events not sent to late data, bit for bit (an event read twice,
    or lost with the state, would change a count); one final pane file per window and system. Late
    data is at least once: records of the replayed stretch may be written twice (counted, printed)."""
    import collections
    import threading

    _need("flink", "java")
    _need_job_server(not engines.missing(["job_server"]))
    state = tmp_path / "state"
    cluster = _up("flink", state, "--taskmanagers", "2", "--slots", "2")
    killed: list = []
    started: list = []
    try:
        def kill_once_checkpointed() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    [job] = [j["jid"] for j in _flink_get(cluster["web_ui"], "/jobs/overview")["jobs"]
                             if j["state"] == "RUNNING"]
                    done = _flink_get(cluster["web_ui"], f"/jobs/{job}/checkpoints")["counts"]["completed"]
                    where = _flink_job_running_on(cluster["web_ui"])
                except (OSError, ValueError, KeyError):
                    done, where = 0, set()
                if done and where:
                    name = sorted(where)[0]
                    os.killpg(cluster["processes"][name], signal.SIGKILL)  # each leads its own group
                    killed.append((name, job, done))
                    return
                time.sleep(0.5)

        def killer(elapsed: float) -> None:  # once, off the producer's loop: REST calls take a while
            if not started and elapsed >= 50:
                started.append(threading.Thread(target=kill_once_checkpointed, daemon=True))
                started[0].start()

        live = _stream_live(kafka, cluster, "flink", "file", tmp_path,
                            extra=("--checkpointing_interval", "2000"), during=killer)
        assert killed, "no checkpoint was complete in the two minutes: the TaskManager was not killed"
        name, job, _ = killed[0]
        history = _flink_get(cluster["web_ui"], f"/jobs/{job}/exceptions").get("exceptionHistory", {})
        assert any(name in json.dumps(e) for e in history.get("entries", [])), history
        restored = _flink_get(cluster["web_ui"], f"/jobs/{job}/checkpoints")["latest"]["restored"]
        assert restored and restored.get("id"), "Flink restored no checkpoint"
    finally:
        _down(state, cluster)
    assert not live.late_other, live.late_other[:3]  # no late:update: every shard update came in time
    _assert_final_equals_batch_of_kept(live, tmp_path)
    finals = collections.Counter(f.split("-pane")[0] for f in {r["_file"] for r in live.rows if r["is_final"]})
    assert finals and set(finals.values()) == {1}, [k for k, v in finals.items() if v > 1]
    # late data is at least once, not exactly once (docs/deploy.md, "Checkpoints and a killed TaskManager"):
    # a bundle's late records written after the restored checkpoint and before the kill are written
    # again when Flink replays from it, to a file of another name. Every late record is one of the
    # events sent.
    sent_ids = {r["event_id"] for r in live.sent}
    assert set(live.late_lines) <= sent_ids
    twice = [e for e, k in collections.Counter(live.late_lines).items() if k > 1]
    print(f"\nlive Kafka on Flink, {name} killed after {killed[0][2]} checkpoints: {len(live.sent)} impressions, "
          f"{len(set(live.late_lines))} late data ({len(twice)} of them written twice), {len(live.windows)} windows "
          f"x system; restored checkpoint {restored['id']}; other late records: "
          f"{[(d['source'], d['reason'], d['raw']) for d in live.late_other]}")


@pytest.mark.kafka
def test_stream_on_kafka_stopped_with_a_savepoint_and_resumed(kafka, tmp_path):
    """The live stream of :func:`_stream_live` on a Flink cluster of its own, 70 s into the production
    stopped with a savepoint (Flink's REST API, as ``flink stop --savepointPath`` does; the launcher
    ends with exit status 0 and publishes) and started again with ``--savepoint_path``, as a user
    upgrading or moving a job does, while the events go on. The resumed job restores the windows'
    state and the Kafka offsets and writes into the same ``--output`` (the stopped run's pane files
    stay; its summary is kept as ``previous_run``). Every window's final pane equals the batch job on
    the events not sent to late data, bit for bit, one final file per window and system; no
    late:update."""
    import collections

    _need("flink", "java")
    _need_job_server(not engines.missing(["job_server"]))
    state = tmp_path / "state"
    cluster = _up("flink", state, "--taskmanagers", "2", "--slots", "2")
    try:
        live = _stream_live(kafka, cluster, "flink", "file", tmp_path, resume_at=70)
    finally:
        _down(state, cluster)
    assert (tmp_path / "stream-2.log").exists(), "the job was not resumed"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert "savepoint-" in summary["resumed_from"], summary["resumed_from"]
    assert summary["previous_run"]["state"] == "DONE", summary["previous_run"]
    # every record accounted for across the two runs: the valid impressions the stopped run held in its
    # open windows (in the savepoint) are the ones the resumed run counted without reading them
    held = summary["previous_run"]["accounting"]["impression"]["held_in_state"]
    assert held > 0 and summary["accounting"]["impression"]["held_in_state"] == -held, summary["accounting"]
    assert not summary["accounting_problems"] and not summary["previous_run"]["accounting_problems"]
    assert not live.late_other, live.late_other[:3]
    _assert_final_equals_batch_of_kept(live, tmp_path)
    finals = collections.Counter(f.split("-pane")[0] for f in {r["_file"] for r in live.rows if r["is_final"]})
    assert finals and set(finals.values()) == {1}, [k for k, v in finals.items() if v > 1]
    twice = [e for e, k in collections.Counter(live.late_lines).items() if k > 1]
    before = summary["previous_run"]["accounting"]["impression"]["read"]
    after = summary["accounting"]["impression"]["read"]
    print(f"\nlive Kafka on Flink, stopped with a savepoint and resumed: {len(live.sent)} impressions sent, read "
          f"{before:,} before the stop ({held:,} held in its windows) and {after:,} after, "
          f"{len(set(live.late_lines))} late data "
          f"({len(twice)} written twice), {len(live.windows)} windows x system; {summary['resumed_from']}")


# ------------------------------------------------------------------------------------------------
# the command line's refusals (no engine needed)


def test_kafka_cluster_id_never_starts_with_a_dash(tmp_path, monkeypatch):
    """Kafka's storage tool took a cluster ID starting with ``-`` for an option and refused to format
    (``argument --cluster-id/-t: expected one argument``; one start of the Kafka tier in 64): the ID is
    drawn again until it does not, as Kafka's ``Uuid.randomUuid`` does, and such a kept ID is replaced."""
    import base64
    import uuid

    from streameval.commands import cluster

    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(b"\xf8" + bytes(15)).decode().startswith("-")  # the first draw would start so
    cid = cluster._kafka_cluster_id(tmp_path)
    assert cid == base64.urlsafe_b64encode(b"\x10" * 16).decode().rstrip("=") and len(cid) == 22
    assert cluster._kafka_cluster_id(tmp_path) == cid  # kept
    (tmp_path / "kafka" / "cluster.id").write_text("-bad\n")
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(bytes=b"\x20" * 16))
    assert not cluster._kafka_cluster_id(tmp_path).startswith("-")


def test_unknown_engine_is_a_usage_error(tmp_path):
    done = _cli("up", "flinc", "--state-dir", str(tmp_path), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "streameval cluster up: unknown engine 'flinc' (did you mean flink?); choose one of flink, prism, kafka"]


def test_up_with_parts_missing_from_the_cache_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMEVAL_CACHE", str(tmp_path / "empty-cache"))
    done = _cli("up", "flink", "--state-dir", str(tmp_path / "state"), timeout=60)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("streameval cluster up: flink is not in the cache (")
    assert "job_server is not in the cache (" in line and "--no-job-server" in line
    assert not (tmp_path / "state" / "cluster.json").exists()
    done = _cli("up", "prism", "--state-dir", str(tmp_path / "state"), timeout=60)
    assert done.returncode == 1 and "prism is not in the cache (" in done.stderr
    assert not (tmp_path / "state" / "cluster.json").exists()


def test_the_job_server_launcher_compiles_against_the_cached_runner_or_says_why_not(tmp_path, monkeypatch):
    """``job_server_launcher``: (folder, "") once compiled (once per source: a second call finds it), else
    None and why, so that ``cluster up flink`` falls back to Beam's own driver and says so."""
    version = engines.beam_version()
    got, why = engines.job_server_launcher(tmp_path, version)
    assert got is None and why.startswith("no unshaded runner classpath in the cache")
    cached = engines.job_server_classpath()
    if not (cached / ".complete").exists():
        pytest.skip(f"the runner classpath is not in the cache ({cached})")
    runner = engines.job_server_classpath(tmp_path, version)
    runner.parent.mkdir(parents=True)
    runner.symlink_to(cached, target_is_directory=True)
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path / "nothing-here"))
        got, why = engines.job_server_launcher(tmp_path, version)
    assert got is None and why.startswith("no javac on PATH")
    got, why = engines.job_server_launcher(tmp_path, version)
    assert why == "" and (got / "streameval" / "flink" / "StreamevalFlinkJobServer.class").exists()
    assert got.parent == runner.parent and (got / ".complete").exists()
    assert engines.job_server_launcher(tmp_path, version) == (got, "")


def test_stop_kills_what_a_dead_leader_left_in_its_group(tmp_path):
    """A process group whose leader died (a worker pool SIGKILLed alone) still holds its children
    (SDK workers): stopping it by the leader's PID kills them too; a PID that is no longer ours
    (another start time) is left alone."""
    import signal
    import time

    proc = processes.spawn("leader", ["sh", "-c", "sleep 300 & echo $! > child.pid; wait"], tmp_path, dict(os.environ),
                          tmp_path / "cwd")
    pid_file = tmp_path / "cwd" / "child.pid"
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    os.waitpid(proc.pid, 0)
    assert not processes.alive(proc) and processes.start_ticks(child) is not None
    assert processes.ours(proc)
    processes.stop(proc, grace=5)
    assert processes.start_ticks(child) is None and not processes.ours(proc)
    stranger = processes.Proc(os.getpid(), (processes.start_ticks(os.getpid()) or 0) + 1, [], "")
    assert not processes.ours(stranger)
    processes.stop(stranger, grace=1)  # not ours: no signal (this process is still here)


def test_down_without_a_cluster_is_a_usage_error(tmp_path):
    done = _cli("down", "--state-dir", str(tmp_path), timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "no cluster in" in done.stderr
