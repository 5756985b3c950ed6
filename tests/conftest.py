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
