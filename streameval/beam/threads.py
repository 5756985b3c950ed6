"""DoFns whose work on an element runs on a small pool of threads of this process.

Beam's in-process local runner (``FnApiRunner`` without worker processes) calls a stage's DoFn on one
thread, so a job on it uses one core, and worker processes cost more than they give when the values
between stages are large (every value crosses the runner's single-threaded data plane). The columnar
engine's work on an element (a file, a shard of requests) is mostly numpy, Arrow and DataFusion
calls on large arrays, which run without holding the GIL: on a pool of threads two elements are
worked on at once.

:class:`ThreadedDoFn` submits each element's work (:meth:`ThreadedDoFn.work`, a generator) to the
pool and hands its outputs to Beam on the DoFn's own thread, as each element finishes, in the order
the elements came, with the window and timestamp of the element that produced them; the rest at
``finish_bundle``. Beam's counters are bound to the runner's thread, so work on a pool thread
counts through :func:`counter`, whose increments are kept and applied on the DoFn's thread with
the outputs. An exception raised by the work is raised again from the DoFn (the bundle fails, as
it would without threads). With ``threads`` 1 the work runs in ``process`` as a plain DoFn's.

With ``counts_as_data`` on (the batch job), the increments are not applied to Beam's counters:
the DoFn emits them, summed per bundle and window, as one element on the tag
:data:`streameval.beam.counts_as_data.COUNTS`, for :class:`~streameval.beam.counts_as_data.PublishCounts`
(why: that module's docstring). The work's outputs are then gathered per element also with
``threads`` 1.

Layer 3 (Beam): imports apache_beam and streameval.beam.counts_as_data only.
"""

from __future__ import annotations

import collections
import threading
import typing
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from .counts_as_data import COUNTS, add_counts, encode_counts, summarized

__all__ = ["Counter", "counter", "Distribution", "distribution", "ThreadedDoFn", "default_threads"]

_local = threading.local()
_pools: dict = {}
_pools_lock = threading.Lock()


def default_threads() -> int:
    """The cores this process may run on (``os.sched_getaffinity``), at least 1."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (not Linux)
        return max(1, os.cpu_count() or 1)


class Counter:
    """A Beam counter (``Metrics.counter(namespace, name)``) that can be incremented on a pool
    thread of :class:`ThreadedDoFn`: there the increment is kept and applied on the DoFn's thread."""

    __slots__ = ("key", "_beam")

    def __init__(self, namespace: str, name: str):
        self.key = (namespace, name)
        self._beam = Metrics.counter(namespace, name)

    def inc(self, n: int = 1) -> None:
        pending = getattr(_local, "counts", None)
        if pending is None:
            self._beam.inc(n)
        else:
            pending[self.key] = pending.get(self.key, 0) + n


def counter(namespace: str, name: str) -> Counter:
    """:class:`Counter` ``name`` of ``namespace``."""
    return Counter(namespace, name)


class Distribution:
    """A Beam distribution (``Metrics.distribution(namespace, name)``: count, sum, min, max of the
    values given) that can be updated on a pool thread of :class:`ThreadedDoFn`, as :class:`Counter`."""

    __slots__ = ("key", "_beam")

    def __init__(self, namespace: str, name: str):
        self.key = ("distribution", namespace, name)
        self._beam = Metrics.distribution(namespace, name)

    def update(self, value: int) -> None:
        pending = getattr(_local, "counts", None)
        if pending is None:
            self._beam.update(int(value))
        else:
            pending.setdefault(self.key, []).append(int(value))


def distribution(namespace: str, name: str) -> Distribution:
    """:class:`Distribution` ``name`` of ``namespace``."""
    return Distribution(namespace, name)


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="streameval-work")
        return pool


def _collect(work, args):
    """Run ``work(*args)`` to its end on this (pool) thread: (outputs, counter increments)."""
    outer = getattr(_local, "counts", None)
    _local.counts = {}
    try:
        return list(work(*args)), _local.counts
    finally:
        _local.counts = outer


class _Done:
    """A finished piece of work, as a finished future: :meth:`result` gives its (outputs, increments)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _apply(counts: dict) -> None:
    """Apply increments gathered by :func:`_collect` to Beam's counters and distributions."""
    for key, n in counts.items():
        if len(key) == 3:  # a distribution's values
            dist = Metrics.distribution(key[1], key[2])
            for v in n:
                dist.update(v)
        else:
            Metrics.counter(*key).inc(n)


@beam.typehints.with_output_types(typing.Any)
class ThreadedDoFn(beam.DoFn):
    """A DoFn whose subclasses define :meth:`work` (a generator of outputs and
    ``pvalue.TaggedOutput``, as ``process`` would be); ``process`` hands each element to it through
    :meth:`_submit` (a subclass with side inputs overrides ``process`` to pass them on).

    Its outputs are declared ``Any`` (what Beam's inference from the bytecode of ``process`` found
    for every subclass, at 0.15 s of the batch job's construction: the declaration skips it).

    ``threads``: elements worked on at once (1: in ``process`` itself, no pool). At most ``threads``
    elements are waited for at a time, so a bundle's outputs are not all held at once."""

    threads = 1
    #: True: the work's counter increments leave as data (:mod:`streameval.beam.counts_as_data`),
    #: declare the tag ``COUNTS`` among the ParDo's outputs
    counts_as_data = False

    def start_bundle(self):
        self._pending = collections.deque()
        self._counts = {}  # counts_as_data: {window: [increments, earliest timestamp]}

    def work(self, *args):  # pragma: no cover (abstract)
        raise NotImplementedError

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        """``work(element)``'s outputs (a DoFn with side inputs overrides this and passes them on)."""
        yield from self._submit((element,), window, timestamp)

    def _submit(self, args, window, timestamp):
        """Outputs (as windowed values) of the elements finished by now; ``args``: :meth:`work`'s."""
        if self.threads <= 1:
            if self.counts_as_data:
                yield from self._finished(_Done(_collect(self.work, args)), window, timestamp)
            else:
                yield from self._windowed(self.work(*args), window, timestamp)
            return
        pending = self._pending
        pending.append((_pool(self.threads).submit(_collect, self.work, args), window, timestamp))
        while pending and (pending[0][0].done() or len(pending) > self.threads):
            yield from self._finished(*pending.popleft())

    def finish_bundle(self):
        pending = getattr(self, "_pending", None)
        while pending:
            yield from self._finished(*pending.popleft())
        by_window = getattr(self, "_counts", None)
        if by_window:
            for window, (counts, timestamp) in by_window.items():
                yield pvalue.TaggedOutput(COUNTS, WindowedValue(encode_counts(counts), timestamp, (window,)))
            by_window.clear()

    def _finished(self, future, window, timestamp):
        outputs, counts = future.result()
        if self.counts_as_data:
            self._count(counts, window, timestamp)
        else:
            _apply(counts)
        yield from self._windowed(outputs, window, timestamp)

    def _count(self, counts, window, timestamp):
        if not counts:
            return
        held = self._counts.get(window)
        if held is None:
            self._counts[window] = [add_counts({}, summarized(counts)), timestamp]
        else:
            add_counts(held[0], summarized(counts))
            held[1] = min(held[1], timestamp)

    @staticmethod
    def _windowed(outputs, window, timestamp):
        for out in outputs:
            if isinstance(out, pvalue.TaggedOutput):
                yield pvalue.TaggedOutput(out.tag, WindowedValue(out.value, timestamp, (window,)))
            else:
                yield WindowedValue(out, timestamp, (window,))
