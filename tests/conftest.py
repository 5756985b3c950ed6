import os
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
#: small reference files kept in the repository (each folder with its SOURCE.md), so that a fresh
#: clone runs the main correctness tests; looked up before ../shared/data
LOCAL_DATA = REPO / "tests" / "data"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
pytest_plugins = ["tests.fixtures_s3", "tests.fixtures_portable", "tests.fixtures_stream"]
_SESSION_START = time.time()


def data_path(*parts) -> Path:
    """A data file from tests/data (small reference files kept in the repository) or else from
    ../shared/data; the test is skipped, naming both paths, when neither has it."""
    local = LOCAL_DATA.joinpath(*parts)
    if local.exists():
        return local
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"data not found: {local} (kept in the repository) nor {p} (shared data)")
    return p


class Hang(BaseException):
    """A block that ran past :func:`fail_after`'s limit. Not an ``Exception``: code under test that
    catches every ``Exception`` (a job's launcher waiting on its runner, a watchdog's look at the
    job's metrics) cannot swallow it; a TimeoutError raised there was, and a hung Prism job held
    the engine tier for minutes past the limit."""


@contextmanager
def fail_after(seconds: int, what: str):
    """Raise :class:`Hang` (SIGALRM) if the block runs longer than ``seconds``: a hang fails the test
    instead of blocking the run."""

    def timeout(signum, frame):
        raise Hang(f"{what} did not finish in {seconds} s (hang?)")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- trec_eval 10 built from its C source (test_trec_eval_suite, test_trec_eval_flags) -----------

#: the source kept in the repository (tests/data/trec_eval_src, so a fresh clone builds it), else ../shared's
TREC_EVAL_SRC = os.environ.get("TREC_EVAL_SRC") or next(
    (str(p) for p in (REPO / "tests" / "data" / "trec_eval_src", DATA.parent / "tools" / "trec_eval_src")
     if (p / "Makefile").is_file()), str(REPO / "tests" / "data" / "trec_eval_src"))


@pytest.fixture(scope="session")
def trec_eval_bin(tmp_path_factory):
    """trec_eval 10 built with its Makefile in a temporary copy of the source (about 10 s, once a session)."""
    import shutil
    import subprocess

    if not os.path.isfile(os.path.join(TREC_EVAL_SRC, "Makefile")):
        pytest.skip(f"trec_eval's source not found at {TREC_EVAL_SRC} (set TREC_EVAL_SRC)")
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("building trec_eval needs make and gcc (its Makefile's CC)")
    src = tmp_path_factory.mktemp("trec_eval") / "src"
    shutil.copytree(TREC_EVAL_SRC, src, ignore=shutil.ignore_patterns("test", "*.o", "trec_eval"))
    done = subprocess.run(["make", "-s"], cwd=src, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not (src / "trec_eval").exists():
        pytest.skip(f"could not build trec_eval: {done.stderr.strip()[-300:]}")
    return str(src / "trec_eval")


# ---- the engines' logs beside a failed engine test (CI shows only what pytest prints) ------------

#: the lines of an engine's log kept beside a failed test: its errors and warnings, the last of them
ENGINE_LOG_LINES = 25


def engine_log_excerpt(logs: Path, lines: int = ENGINE_LOG_LINES) -> str:
    """The last ``lines`` lines with ERROR, WARN, Exception or panic of each ``*.log`` file in the
    folder ``logs`` (a cluster's ``logs`` of ``streameval cluster up``), each under its name."""
    import re

    pattern = re.compile(r"ERROR|WARN|Exception|panic|level=(ERROR|WARN)")
    parts = []
    for f in sorted(Path(logs).glob("*.log")):
        try:
            hits = [ln for ln in f.read_text(errors="replace").splitlines() if pattern.search(ln)]
        except OSError:
            continue
        if hits:
            parts.append(f"--- {f.name} (last {min(lines, len(hits))} of {len(hits)} such lines)\n"
                         + "\n".join(ln[:400] for ln in hits[-lines:]))
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a cluster fixture (a dict with the ``logs`` of ``cluster up``: the
    engine tier's ``flink``, ``prism``, ``kafka``) gets the tail of its engines' errors and warnings
    as a section of its report, so that a failure in CI can be read from CI's output alone."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, dict) and isinstance(value.get("logs"), str) and Path(value["logs"]).is_dir():
            text = engine_log_excerpt(Path(value["logs"]))
            if text:
                report.sections.append((f"{name} cluster's logs: errors and warnings", text))


def pytest_sessionfinish(session, exitstatus):
    """Beam's ``Pipeline`` makes a folder in the temporary directory when it is constructed
    (``beam-pipeline-temp*``) and removes it only in ``run()``: each test that builds a pipeline it
    does not run (a construction error it expects, a graph it inspects) left one behind (2,773 of them
    in /tmp on the development machine, 2026-12-07). When the whole session is over (the controller,
    after pytest-xdist's workers), the empty ones made since it started are removed."""
    if hasattr(session.config, "workerinput"):
        return
    for d in Path(tempfile.gettempdir()).glob("beam-pipeline-temp*"):
        try:
            if d.is_dir() and d.stat().st_mtime >= _SESSION_START - 1 and not any(d.iterdir()):
                d.rmdir()
        except OSError:
            pass
