import os
import signal
import sys
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


@contextmanager
def fail_after(seconds: int, what: str):
    """Raise TimeoutError (SIGALRM) if the block runs longer than ``seconds``: a hang fails the test
    instead of blocking the run."""

    def timeout(signum, frame):
        raise TimeoutError(f"{what} did not finish in {seconds} s (hang?)")

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
