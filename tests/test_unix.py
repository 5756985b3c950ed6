"""The ``streameval`` command as a Unix tool (issue 41, items 1 and 4): unknown options refused,
``--version``, broken pipes, signals, help and argument errors without Beam, inputs checked before
Beam starts. Each test runs the command in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def streameval(*args, timeout=300, **kw) -> subprocess.CompletedProcess:
    """``streameval ARGS`` in a subprocess (this checkout's package), its output as text."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = "import sys; from streameval.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=kw.pop("cwd", None), **kw)


def impressions(path: Path, n_requests: int = 20) -> Path:
    """A small impression log: ``n_requests`` requests of 3 items, a click on the first of each."""
    from streameval.io import avro

    records = [{"event_id": f"e{r}-{k}", "request_id": f"r{r}", "query_id": f"q{r % 5}", "user_id": None,
                "system_id": "A", "item_id": f"d{k}", "position": k + 1, "score": float(3 - k),
                "clicked": k == 0, "timestamp": 1_600_000_000_000_000 + r * 1_000_000, "propensity": None,
                "attributes": {}, "dwell_ms": None} for r in range(n_requests) for k in range(3)]
    avro.write_records(str(path), "impression", records)
    return path


# ---- unknown options --------------------------------------------------------------------------

def test_batch_refuses_a_misspelt_option_naming_the_closest(tmp_path):
    """``--allowed-latness 1h`` ran with Beam's "Discarding unparseable args" warning, the option
    ignored, exit 0: now one line naming the job's option it resembles, exit 2, nothing written."""
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("batch", "--impressions", imps, "--window", "1d", "--allowed-latness", "1h",
                   "--output", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unknown option --allowed-latness" in lines[0] and "--allowed-lateness" in lines[0]
    assert not (tmp_path / "out").exists()


def test_stream_refuses_an_option_it_does_not_have(tmp_path):
    """``stream --formats parquet`` ran with the option dropped (the stream had no --formats; it has
    now). An option neither the stream nor Beam knows, ``--output-format``, is refused in one line."""
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("stream", "--replay", "--impressions", imps, "--window", "1d", "--output-format", "parquet",
                   "--output", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown option --output-format" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()
    # --formats itself: parquet alone is refused (the JSON lines are the table the readers use)
    r = streameval("stream", "--replay", "--impressions", imps, "--window", "1d", "--formats", "parquet",
                   "--output", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--formats must include jsonl" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_beam_option_misspelt_is_refused_with_beams_name(tmp_path):
    """A Beam option with dashes for underscores names Beam's spelling; a value Beam's own parser
    refuses is reported in one line too."""
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("batch", "--impressions", imps, "--direct-num-workers", "2", "--output", tmp_path / "out")
    assert r.returncode == 2 and "--direct_num_workers" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = streameval("batch", "--impressions", imps, "--direct_num_workers", "two", "--output", tmp_path / "out")
    assert r.returncode == 2 and "invalid int value: 'two'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_ope_refuses_an_unknown_option(tmp_path):
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("ope", "--logs", imps, "--target", "random", "--n-itmes", "3", "--output", tmp_path / "out")
    assert r.returncode == 2 and "unknown option --n-itmes" in r.stderr and "--n-items" in r.stderr, r.stderr


def test_batch_passes_beams_own_options_through(tmp_path):
    """An option Beam knows still reaches it, and the job runs: the counts of the log it was given."""
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("batch", "--impressions", imps, "--output", tmp_path / "out", "--quiet",
                   "--experiments", "no_such_experiment_is_harmless", "--max_cache_memory_usage_mb", "10")
    assert r.returncode == 0, r.stderr
    assert "impressions: read 60 = accepted 60" in r.stdout
    assert "unparseable" not in r.stderr.lower() and "unknown option" not in r.stderr


def test_flink_runner_options_are_known_and_checked(tmp_path):
    """Beam's Java Flink runner reads options its Python SDK does not declare (``--max_bundle_size``,
    ``--checkpointing_interval``, ...): the jobs accept them (streameval/beam/flink_options.py), Beam's
    options hold them with their types (the portable runner sends every option they hold to the job
    server; on Flink, the Kafka fault test in tests/test_engines.py waits for a completed checkpoint,
    which Flink takes only when --checkpointing_interval reached it), a misspelling names the
    option, and a value of the wrong type is refused in one line."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from streameval.beam import flink_options  # noqa: F401  (registers the options)

    got = PipelineOptions(["--max_bundle_size", "5000", "--checkpointing_interval=2000",
                           "--allow_non_restored_state", "false"]).get_all_options()
    assert got["max_bundle_size"] == 5000 and got["checkpointing_interval"] == 2000
    assert got["allow_non_restored_state"] is False
    assert got["savepoint_path"] is None  # not given: Beam's Java default
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("batch", "--impressions", imps, "--output", tmp_path / "out", "--quiet",
                   "--max_bundle_size", "5000", "--max_bundle_time_mills", "500")
    assert r.returncode == 0, r.stderr
    assert "impressions: read 60 = accepted 60" in r.stdout and "unknown option" not in r.stderr
    r = streameval("batch", "--impressions", imps, "--output", tmp_path / "out2", "--max_bundle_sise", "5000")
    assert r.returncode == 2 and "unknown option --max_bundle_sise" in r.stderr and "--max_bundle_size" in r.stderr
    r = streameval("batch", "--impressions", imps, "--output", tmp_path / "out3", "--checkpointing_interval", "often")
    assert r.returncode == 2 and "invalid int value: 'often'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out3").exists()


def test_event_timers_per_deadline_on_flink_only():
    """``--event-timers auto`` gives one timer per pending deadline on Flink (``--runner FlinkRunner``, or
    ``--flink_master`` as ``cluster up flink``'s runner_args give it) and one per key elsewhere (Prism
    2.62 fires a key's later tagged timers early); the option overrides it."""
    from streameval.jobs.stream_args import build_arg_parser, engine_options

    def timers(argv, runner=None):
        args, beam_args = build_arg_parser().parse_known_args(["--replay", "--impressions", "x.avro", *argv])
        return engine_options(args, beam_args, runner)

    assert timers(["--flink_master", "127.0.0.1:8081"], "PortableRunner") == "per_deadline"
    assert timers([], "FlinkRunner") == "per_deadline"
    assert timers(["--job_endpoint", "127.0.0.1:8099"], "PortableRunner") == "one"
    assert timers([], "BundleBasedDirectRunner") == timers([], None) == "one"
    assert timers(["--event-timers", "per-deadline"]) == "per_deadline"
    assert timers(["--event-timers", "one", "--flink_master", "127.0.0.1:8081"], "PortableRunner") == "one"


def test_checkpoints_finish_bundles_before_the_barrier():
    """With Flink's checkpoints on, the stream job asks Beam's Flink runner to finish its bundles before
    a checkpoint's barrier (``--finish_bundle_before_checkpointing``): else the outputs of the bundles a
    checkpoint finishes are held back and a later watermark may overtake them (late:update on the live
    Kafka test, tests/test_engines.py). Not added without checkpoints; an explicit value is kept."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from streameval.jobs.stream_args import checkpoint_options

    def finish(argv):
        return PipelineOptions(checkpoint_options(argv)).get_all_options().get("finish_bundle_before_checkpointing")

    assert finish(["--checkpointing_interval", "2000"]) is True
    assert finish(["--checkpointing_interval=2000", "--flink_master", "127.0.0.1:8081"]) is True
    assert finish([]) is None and finish(["--checkpointing_interval", "0"]) is None
    assert finish(["--checkpointing_interval", "2000", "--finish_bundle_before_checkpointing", "false"]) is False
    assert checkpoint_options(["--checkpointing_interval", "2000", "--finish_bundle_before_checkpointing=true"]) \
        == ["--checkpointing_interval", "2000", "--finish_bundle_before_checkpointing=true"]


def test_flink_jobs_keep_their_sdk_workers_for_the_job():
    """On Flink (``--runner FlinkRunner``, or a ``--flink_master``: ``cluster up flink``'s runner_args)
    the jobs ask Beam's runner to keep a job's SDK workers between its stages
    (``--environment_cache_millis``): with Beam's default each stage of the batch job started a worker
    process of its own (7 at 10 M impressions, docs/benchmarks.md). Not added elsewhere (Prism, the
    local runner); an explicit value is kept; the stream job's options get it too."""
    from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions

    from streameval.beam.flink_options import ENVIRONMENT_CACHE_MS, reuse_workers
    from streameval.jobs.stream_args import job_options

    def cache(argv):
        return int(PipelineOptions(argv).view_as(PortableOptions).environment_cache_millis)  # Beam declares no type

    flink = ["--runner", "PortableRunner", "--job_endpoint", "127.0.0.1:8099", "--flink_master", "127.0.0.1:8081"]
    assert cache(reuse_workers(flink)) == ENVIRONMENT_CACHE_MS > 0
    assert cache(reuse_workers(["--runner", "FlinkRunner"])) == ENVIRONMENT_CACHE_MS
    assert cache(reuse_workers(["--runner", "DirectRunner", "--runner=FlinkRunner"])) == ENVIRONMENT_CACHE_MS
    prism = ["--runner", "PortableRunner", "--job_endpoint", "127.0.0.1:8073", "--environment_type", "EXTERNAL"]
    assert reuse_workers(prism) == prism and reuse_workers(["--runner", "DirectRunner"]) == ["--runner", "DirectRunner"]
    assert reuse_workers([*flink, "--environment_cache_millis=0"]) == [*flink, "--environment_cache_millis=0"]
    assert cache(reuse_workers([*flink, "--environment_cache_millis", "5"])) == 5
    stream = job_options("PortableRunner", flink[2:] + ["--checkpointing_interval", "2000"])
    assert cache(stream) == ENVIRONMENT_CACHE_MS
    assert PipelineOptions(stream).get_all_options().get("finish_bundle_before_checkpointing") is True


def test_stream_that_ends_refuses_checkpointing(tmp_path):
    """With Flink's checkpoints on, a replay on Flink never ended (15 minutes, against 61 s without;
    docs/deploy.md): ``--checkpointing_interval`` with ``--replay`` or ``--watch-idle-stop`` is refused in
    one line before anything runs; 0 (off) is not. A replay with ``--savepoint_path`` is refused too."""
    imps = impressions(tmp_path / "imps.avro")
    for source in (["--replay", "--impressions", imps], ["--watch", "--impressions", tmp_path / "*.avro",
                                                         "--watch-idle-stop", "5"]):
        r = streameval("stream", *source, "--window", "1d", "--output", tmp_path / "out",
                       "--checkpointing_interval", "5000")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "--checkpointing_interval" in r.stderr and "never ended" in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()
    r = streameval("stream", "--replay", "--impressions", imps, "--window", "1d", "--output", tmp_path / "out",
                   "--savepoint_path", tmp_path / "savepoint-1")  # a replay starts from its files' beginning
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--savepoint_path: a replay starts from its files' beginning" in r.stderr and not (tmp_path / "out").exists()
    r = streameval("stream", "--replay", "--impressions", imps, "--window", "1d", "--output", tmp_path / "out",
                   "--quiet", "--checkpointing_interval", "0")
    assert r.returncode == 0, r.stderr


# ---- --help and argument errors before Beam is imported ----------------------------------------

def _beam_imported_after(*args) -> tuple[subprocess.CompletedProcess, bool]:
    """``streameval ARGS`` in a subprocess that says at its end whether ``apache_beam`` was imported."""
    code = ("import atexit, sys; atexit.register(lambda: sys.stderr.write("
            "'\\nBEAM-IMPORTED=%s\\n' % ('apache_beam' in sys.modules))); "
            "from streameval.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    flag = r.stderr.strip().splitlines()[-1]
    assert flag.startswith("BEAM-IMPORTED="), r.stderr
    return r, flag == "BEAM-IMPORTED=True"


@pytest.mark.parametrize("command", ["batch", "stream", "ope"])
def test_help_does_not_import_beam(command):
    """``batch --help`` took 12.5 s: Beam (and the job's transforms) were imported before parsing."""
    r, beam = _beam_imported_after(command, "--help")
    assert r.returncode == 0 and f"usage: streameval {command}" in r.stdout
    assert not beam


@pytest.mark.parametrize("command, args, message", [
    ("batch", ["--output", "o"], "the following arguments are required: --impressions"),
    ("batch", ["--impressions", "x", "--output", "o", "--engine", "colunmar"], "invalid choice: 'colunmar'"),
    ("stream", ["--replay", "--impressions", "x", "--ci-level", "high"], "invalid float value: 'high'"),
    ("ope", ["--logs", "x"], "the following arguments are required: --target"),
])
def test_argument_errors_do_not_import_beam(command, args, message):
    r, beam = _beam_imported_after(command, *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not beam


# ---- inputs checked before Beam starts ----------------------------------------------------------

def test_a_glob_that_matches_nothing_is_reported_before_beam(tmp_path):
    """A bad glob was reported after 14.6 s (Beam imported, the pipeline built): now before Beam."""
    r, beam = _beam_imported_after("batch", "--impressions", tmp_path / "logs" / "*.avro", "--output", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert f"--impressions: no files match the pattern '{tmp_path / 'logs' / '*.avro'}'" in r.stderr
    assert not beam and not (tmp_path / "out").exists()
    r, beam = _beam_imported_after("stream", "--replay", "--window", "1d", "--impressions", tmp_path / "none.avro")
    assert r.returncode == 2 and "--impressions: input file not found" in r.stderr and not beam, r.stderr


def test_a_csv_given_as_avro_is_named_with_the_way_to_read_it(tmp_path):
    """A CSV passed to batch was reported as a damaged Avro file (exit 3): now what it is, and
    ``convert table`` / Parquet (exit 2), before Beam; a real Avro file beside it is not refused."""
    imps = impressions(tmp_path / "imps.avro")
    csv = tmp_path / "log.csv"
    csv.write_text("request_id,item_id,position,clicked\nr1,d1,1,true\n")
    r, beam = _beam_imported_after("batch", "--impressions", imps, "--impressions", csv, "--output", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[0]
    assert line.startswith(f"error: --impressions {csv}: a CSV file, not an Avro file"), line
    assert f"streameval convert table {csv} --kind impressions" in line and "--input-format parquet" in line
    assert not beam and not (tmp_path / "out").exists()
    jsonl = tmp_path / "qrels.jsonl"
    jsonl.write_text('{"query_id": "q0", "item_id": "d0", "grade": 1}\n')
    r = streameval("batch", "--impressions", imps, "--judgments", jsonl, "--output", tmp_path / "out")
    assert r.returncode == 2 and "a JSON file, not an Avro file" in r.stderr and "--kind judgments" in r.stderr


def test_sniffing_leaves_damaged_avro_to_the_reader():
    """Binary bytes, an empty file and Avro are not named as another format (the job's reader reports
    a damaged Avro file as a dead letter); Parquet, JSON, CSV and text are."""
    from streameval.io.inputs import sniff_format

    assert sniff_format(b"Obj\x01rest") is None and sniff_format(b"") is None
    assert sniff_format(bytes(range(256))) is None and sniff_format(b"\x89PNG\r\n\x1a\n") is None
    assert sniff_format(b"PAR1\x15\x04") == "parquet"
    assert sniff_format(b'  {"a": 1}\n') == "json" and sniff_format(b"[1, 2]") == "json"
    assert sniff_format(b"\xef\xbb\xbfa;b\n1;2\n") == "csv" and sniff_format(b"a\tb\n") == "csv"
    assert sniff_format(b"hello world\n") == "text"
    assert sniff_format("a,\u00e9".encode()[:3]) == "csv"  # a sample cut inside a character is still text


# ---- --version ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version(flag):
    """``streameval --version`` was a usage error (exit 2): now the version pyproject.toml declares."""
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    r = streameval(flag)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"streameval {declared}\n"


# ---- broken pipes -------------------------------------------------------------------------------

def _with_reader_gone(*args) -> subprocess.CompletedProcess:
    """``streameval ARGS | head -0``: standard output a pipe whose reader has already gone, so the
    command's first write of its output meets a broken pipe (whatever the output's size)."""
    code = "import sys; from streameval.cli import main; sys.exit(main())"
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, None, err)


@pytest.fixture
def trec_files(tmp_path):
    run_a, run_b, qrels = tmp_path / "a.run", tmp_path / "b.run", tmp_path / "qrels"
    run_a.write_text("".join(f"q{q} Q0 d{k} {k} {10 - k} A\n" for q in range(30) for k in range(10)))
    run_b.write_text("".join(f"q{q} Q0 d{k} {k} {k} B\n" for q in range(30) for k in range(10)))
    qrels.write_text("".join(f"q{q} 0 d{k} {int(k < 3)}\n" for q in range(30) for k in range(10)))
    return qrels, run_a, run_b


def _metric_table(path: Path, value: float) -> Path:
    path.write_text("".join(json.dumps({"metric": "ctr", "slice": f"s=v{i}", "system": "A", "value": value,
                                        "num_queries": 10, "window_start": None, "window_end": None}) + "\n"
                            for i in range(50)))
    return path


@pytest.mark.parametrize("command", ["trec-eval", "compare", "reconcile"])
def test_a_reader_that_goes_away_ends_the_command_quietly(command, trec_files, tmp_path):
    """``trec-eval ... | head``, ``compare | head``, ``reconcile | head`` ended in a BrokenPipeError
    traceback, exit 1: now no traceback and 141, the shell's status of a program SIGPIPE ended."""
    qrels, run_a, run_b = trec_files
    args = {"trec-eval": ["-q", qrels, run_a], "compare": [qrels, run_a, run_b],
            "reconcile": [_metric_table(tmp_path / "a.jsonl", 0.1), _metric_table(tmp_path / "b.jsonl", 0.2),
                          "--max-rows", "0"]}[command]
    r = _with_reader_gone(command, *args)
    assert r.stderr == "" and r.returncode == 141, r.stderr


# ---- signals ------------------------------------------------------------------------------------

def _beam_temp(out: Path) -> list[str]:
    """Beam's temporary folders anywhere under ``out`` (also in the run's hidden staging folder)."""
    return [os.path.join(d, n) for d, dirs, _ in os.walk(out) for n in dirs if n.startswith("beam-temp-")]


def _default_signals() -> None:
    """(In the child, before exec) SIGINT and SIGTERM back to their default actions."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _batch_stopped_by(sig, imps: Path, out: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Start ``streameval batch`` on ``imps``, wait until its pipeline runs (Beam's file sinks made
    their ``beam-temp-*`` folders in the output), freeze it there (SIGSTOP), send ``sig`` and let it
    go on (SIGCONT): the signal arrives while the job runs, however fast the machine. Returns the
    finished process and the temporary folders seen while it ran."""
    import signal
    import time

    code = "import sys; from streameval.cli import main; sys.exit(main())"
    args = [a for _ in range(20) for a in ("--impressions", str(imps))]
    # the job's SIGINT and SIGTERM as an interactive shell gives them: a suite started in the background
    # of a non-interactive shell has SIGINT ignored, and a child inherits that (the job then ran to its
    # end, exit status 0: two fresh-clone trials, 2026-12-06)
    p = subprocess.Popen([sys.executable, "-c", code, "batch", *args, "--window", "1d", "--output", str(out),
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=_default_signals)
    try:
        seen, deadline = [], time.monotonic() + 240
        while not seen and p.poll() is None and time.monotonic() < deadline:
            seen = _beam_temp(out)
            time.sleep(0.005)
        assert seen, "the job ended (or did not start) before its sinks made their temporary folders"
        p.send_signal(signal.SIGSTOP)
        p.send_signal(sig)
        p.send_signal(signal.SIGCONT)
        stdout, stderr = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr), seen


def test_ctrl_c_on_batch_is_one_line_and_130(tmp_path):
    """Ctrl-C printed Beam's traceback: now one line, exit 130 (128 + SIGINT)."""
    import signal

    r, _ = _batch_stopped_by(signal.SIGINT, impressions(tmp_path / "imps.avro", 100), tmp_path / "out")
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines() == [
        "streameval batch: stopped by SIGINT: nothing of this run was published (an output folder keeps its "
        "previous run's outputs)"], r.stderr


def test_a_thread_left_running_by_an_interrupt_does_not_keep_the_command_alive():
    """CI hung 240 s after Ctrl-C had printed its line: Beam's in-process runner starts a non-daemon
    state-sampling thread and marks it started a statement later, so a signal in between leaves it
    running for ever and the interpreter waited for it at exit. The same situation, made certain:
    the command's run leaves such a thread behind and is interrupted; it still ends, 130, one line."""

    code = ("import signal, sys, threading\n"
            "from streameval import cli, interrupts\n"
            "def run(argv):\n"
            "    threading.Thread(target=threading.Event().wait, name='left-running').start()\n"
            "    raise interrupts.Interrupted(signal.SIGINT)\n"
            "cli._main = run\n"
            "sys.exit(cli.main())\n")
    r = subprocess.run([sys.executable, "-c", code, "batch"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip().splitlines() == [
        "streameval batch: stopped by SIGINT: nothing of this run was published (an output folder keeps its "
        "previous run's outputs)"], r.stderr


def test_sigterm_leaves_no_beam_temp_and_keeps_the_previous_run(tmp_path):
    """SIGTERM left the run's staging folder with Beam's ``beam-temp-*`` folders (and the lock) in the
    output: now they are removed on the way out, and the previous run's published outputs stay as
    they were; exit 143 (128 + SIGTERM), one line."""
    import signal

    imps, out = impressions(tmp_path / "imps.avro", 100), tmp_path / "out"
    first = streameval("batch", "--impressions", imps, "--output", out, "--quiet")
    assert first.returncode == 0, first.stderr
    published = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file() and not f.name.startswith(".")}
    assert "manifest.json" in published and "metrics.jsonl" in published
    r, seen = _batch_stopped_by(signal.SIGTERM, imps, out)
    assert seen and r.returncode == 143, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "stopped by SIGTERM" in r.stderr, r.stderr
    assert _beam_temp(out) == []
    assert sorted(os.listdir(out)) == sorted(published)  # no staging folder, no lock file
    assert {name: (out / name).read_bytes() for name in published} == published
