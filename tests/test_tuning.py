"""streameval.tuning.one_blas_thread: numpy's OpenBLAS on one thread inside the block, restored after,
left alone when the environment sets the BLAS's threads (threadpoolctl as the independent reader)."""

from __future__ import annotations

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
