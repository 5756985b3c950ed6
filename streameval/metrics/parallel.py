"""Independent pieces of the metric work on a few threads (numpy releases the GIL in its loops and
sorts, so two threads use both cores of a 2-core machine)."""

from __future__ import annotations

import os

__all__ = ["WORKERS", "run_tasks"]

#: threads for the independent chunks of the work
WORKERS = min(2, os.cpu_count() or 1)


def run_tasks(tasks, workers: int | None = None) -> list:
    """``[fn(*args) for fn, args in tasks]``, on ``workers`` (default :data:`WORKERS`) threads, the
    results in the tasks' order; the first task's error (in order) is raised."""
    workers = WORKERS if workers is None else workers
    if workers < 2 or len(tasks) < 2:
        return [fn(*args) for fn, args in tasks]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(fn, *args) for fn, args in tasks]
        return [f.result() for f in futures]
