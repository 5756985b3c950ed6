"""Process-wide memory settings for the commands that allocate large numpy arrays in one process.

On the benchmark machine (a VM) page faults cost seconds: faulting in numpy's 2 MB transparent
huge pages for arrays touched once or twice, and glibc unmapping every freed chunk-sized temporary
so that the next one is faulted in afresh. ``streameval trec-eval`` and the batch job on the local
runner (in-process) use both settings below (``evaluate()`` and ``compare()`` the first, for the
time of the call); the batch job on the local runner also keeps numpy's
BLAS on one thread (:func:`one_blas_thread`). Standard library and numpy only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


def keep_freed_memory() -> None:
    """glibc only: serve allocations below 32 MB from the heap and keep freed memory for the next
    ones (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), instead of unmapping each chunk-sized
    temporary and faulting the next one in afresh; and one arena for all threads (M_ARENA_MAX):
    a thread's own arena grows in 64 MB heaps that glibc unmaps as soon as one is wholly free,
    whatever the trim threshold, so a pool thread's chunk-sized temporaries were faulted in afresh
    again and again (the batch job on 10 M impressions: 840,000 page faults and 5 s of system time
    with an arena per thread, 350,000 and 2.5 s with one). Process-wide and permanent for the
    process. Call it before any thread other than the main one has allocated: the arenas made
    before stay, and glibc hands an exited thread's arena to the next new thread (the ``streameval``
    command calls it first thing for its Beam commands). A no-op where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    mallopt(-8, 1)  # M_ARENA_MAX


def one_blas_thread_at_import() -> None:
    """For a command that does no linear algebra (``streameval trec-eval``, ``ndeval``): numpy's
    OpenBLAS starts one thread per core when numpy is imported, about 0.05 s of CPU for nothing
    (``OPENBLAS_NUM_THREADS``; a value the user set is kept). Call it before numpy is imported; a
    no-op after. (:func:`one_blas_thread` does the same for a block of a process that has numpy.)"""
    import os
    import sys

    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


#: the same settings for child processes (worker processes of the local runner), by environment:
#: glibc's tunables read at start-up and numpy's switch read at import
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
             "MALLOC_ARENA_MAX": "1", "NUMPY_MADVISE_HUGEPAGE": "0", "OPENBLAS_NUM_THREADS": "1"}


@contextlib.contextmanager
def for_children() -> Iterator[None]:
    """While in the block, processes started from this one get :data:`CHILD_ENV` (values already
    set in the environment are kept); the environment is restored after."""
    import os

    added = {k: v for k, v in CHILD_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


_hugepages_lock = threading.Lock()
_hugepages_users = 0  # blocks of no_numpy_hugepages running now (any thread)
_hugepages_before = None  # numpy's setting before the first of them


@contextlib.contextmanager
def no_numpy_hugepages() -> Iterator[None]:
    """While in the block, numpy does not madvise transparent huge pages for its large arrays; the
    setting is restored when the last such block of any thread ends (blocks on several threads at
    once, as ``evaluate()`` called from several threads, leave numpy's setting as they found it). A
    no-op on numpy builds without the switch. Why: on a VM whose freed memory goes back to the host
    (Firecracker's free page reporting: docs/benchmarks.md, "Huge pages"), faulting in a fresh 2 MB
    huge page costs far more than the 4 kB pages of the same bytes (``evaluate()`` with string ids:
    1.9 s, 1.5 s of it system time, against 0.6 s)."""
    global _hugepages_users, _hugepages_before
    import numpy as np

    set_hugepage = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if set_hugepage is None:
        yield
        return
    with _hugepages_lock:
        if _hugepages_users == 0:
            _hugepages_before = set_hugepage(False)
        _hugepages_users += 1
    try:
        yield
    finally:
        with _hugepages_lock:
            _hugepages_users -= 1
            if _hugepages_users == 0:
                set_hugepage(_hugepages_before)


#: the environment variables that set a BLAS's threads: when one is set, :func:`one_blas_thread` leaves
#: the BLAS alone
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_OPENBLAS_SETTERS = ("openblas_set_num_threads", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "scipy_openblas_set_num_threads64_")
_OPENBLAS_GETTERS = ("openblas_get_num_threads", "openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                     "scipy_openblas_get_num_threads64_")


def _openblas_libraries() -> list:
    """``(set, get)`` thread functions of every OpenBLAS loaded in this process (Linux: the shared
    objects of /proc/self/maps whose name has "openblas", e.g. numpy's libscipy_openblas64_)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return []
    paths = sorted({p for p in (line.split(None, 5)[-1] for line in maps.splitlines() if line.count(" ") >= 5)
                    if "openblas" in p.rsplit("/", 1)[-1].lower()})
    out = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _OPENBLAS_SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _OPENBLAS_GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            out.append((setter, getter))
    return out


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """While in the block, numpy's OpenBLAS runs each product on the calling thread (restored after;
    a no-op when the environment sets a BLAS's threads, :data:`BLAS_THREAD_VARIABLES`, or there is no
    OpenBLAS to find). On the local runner Beam's own threads already keep the cores busy, and
    OpenBLAS's threads spin while they wait: the comparisons' sign-flip products of the 1 M benchmark
    job took twice the CPU time with 2 threads (benchmarks in docs/benchmarks.md)."""
    import os

    import numpy  # noqa: F401  (loads the BLAS)

    libs = [] if any(v in os.environ for v in BLAS_THREAD_VARIABLES) else _openblas_libraries()
    before = [int(get()) for _, get in libs]
    for setter, _ in libs:
        setter(1)
    try:
        yield
    finally:
        for (setter, _), n in zip(libs, before):
            setter(n)
