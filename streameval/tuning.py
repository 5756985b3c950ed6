"""Process-wide memory settings for the commands that allocate large numpy arrays in one process.

On the benchmark machine (a VM) page faults cost seconds: faulting in numpy's 2 MB transparent
huge pages for arrays touched once or twice, and glibc unmapping every freed chunk-sized temporary
so that the next one is faulted in afresh. ``streameval trec-eval`` and the batch job on the local
runner (in-process) use both settings below. Standard library and numpy only.
"""

from __future__ import annotations

import contextlib
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


def one_blas_thread() -> None:
    """For a command that does no linear algebra (``streameval trec-eval``, ``ndeval``): numpy's
    OpenBLAS starts one thread per core when numpy is imported, about 0.05 s of CPU for nothing
    (``OPENBLAS_NUM_THREADS``; a value the user set is kept). Call it before numpy is imported; a
    no-op after."""
    import os
    import sys

    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


#: the same settings for child processes (worker processes of the local runner), by environment:
#: glibc's tunables read at start-up and numpy's switch read at import
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
             "MALLOC_ARENA_MAX": "1", "NUMPY_MADVISE_HUGEPAGE": "0"}


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


@contextlib.contextmanager
def no_numpy_hugepages() -> Iterator[None]:
    """While in the block, numpy does not madvise transparent huge pages for its large arrays
    (restored after; a no-op on numpy builds without the switch)."""
    import numpy as np

    set_hugepage = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    before = set_hugepage(False) if set_hugepage is not None else None
    try:
        yield
    finally:
        if set_hugepage is not None:
            set_hugepage(before)
