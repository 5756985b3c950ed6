"""streameval.tuning.one_blas_thread: numpy's OpenBLAS on one thread inside the block, restored after,
left alone when the environment sets the BLAS's threads (threadpoolctl as the independent reader)."""

from __future__ import annotations

import numpy  # noqa: F401  (loads the BLAS that threadpoolctl reads)
import pytest

from streameval import tuning

threadpoolctl = pytest.importorskip("threadpoolctl")


def _openblas_threads():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]


def test_one_blas_thread_sets_and_restores(monkeypatch):
    for v in tuning.BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    with threadpoolctl.threadpool_limits(2):
        before = _openblas_threads()
        if not before:
            pytest.skip("numpy is not linked to OpenBLAS here")
        with tuning.one_blas_thread():
            assert _openblas_threads() == [1] * len(before)
        assert _openblas_threads() == before
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
        with tuning.one_blas_thread():
            assert _openblas_threads() == before


def test_trec_eval_starts_numpy_with_one_blas_thread(tmp_path):
    """``streameval trec-eval`` sets OPENBLAS_NUM_THREADS=1 before numpy's import (it does no linear
    algebra); a value the user set is kept."""
    import os
    import subprocess
    import sys

    (tmp_path / "q").write_text("1 0 d1 1\n")
    (tmp_path / "r").write_text("1 Q0 d1 1 1.0 t\n")
    code = ("import os, sys; from streameval import cli; rc = cli.main(['trec-eval', sys.argv[1], sys.argv[2]]); "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q"), str(tmp_path / "r")], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "1"
    env["OPENBLAS_NUM_THREADS"] = "3"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q"), str(tmp_path / "r")], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "3"


def test_no_numpy_hugepages_blocks_on_two_threads_leave_the_setting_as_found():
    # two overlapping blocks (as evaluate() on two threads): the first ending must not turn huge pages
    # back on under the second, and the last ending restores the setting found before the first
    import threading

    import numpy as np

    from streameval.tuning import no_numpy_hugepages

    setting = np._core.multiarray._set_madvise_hugepage
    before = setting(True)
    try:
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def a():
            with no_numpy_hugepages():
                a_in.set()
                b_in.wait(10)
            a_out.set()

        def b():
            a_in.wait(10)
            with no_numpy_hugepages():
                b_in.set()
                a_out.wait(10)
                cur = setting(False)  # read it (and leave it as it was)
                seen["inside b after a ended"] = cur

        ts = [threading.Thread(target=f) for f in (a, b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(20)
        assert seen == {"inside b after a ended": False}
        assert setting(True) is True  # restored to what it was before both
    finally:
        setting(before)
