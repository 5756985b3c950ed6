"""The ``streameval`` command as a Unix tool (issue 41, items 1 and 4): unknown options refused,
``--version``, broken pipes, signals, help and argument errors without Beam, inputs checked before
Beam starts. Each test runs the command in a subprocess, as a user would."""

from __future__ import annotations

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
    """``stream --formats parquet``: the streaming job has no --formats, and Beam has no such option."""
    imps = impressions(tmp_path / "imps.avro")
    r = streameval("stream", "--replay", "--impressions", imps, "--window", "1d", "--formats", "parquet",
                   "--output", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown option --formats" in lines[0], r.stderr
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
