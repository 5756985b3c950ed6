import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
pytest_plugins = ["tests.fixtures_s3", "tests.fixtures_portable"]


def data_path(*parts) -> Path:
    """A file under ../shared/data; the test is skipped (with the path) when it is absent."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not found: {p}")
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
