"""Counts as data: a job's counter increments carried as elements to one step that reports them.

Beam counters are reported by every bundle of a step to the runner, which adds them up. Prism 2.62
loses some of these reports: a bundle's final report names each counter by a short id, and when two
bundles of a stage end with a short id Prism has not resolved yet (a stage split in two under load,
both halves ending within one metadata round trip), Prism keeps one payload per unresolved short id
(``metricsStore.contributeMetrics`` in ``prism/internal/jobservices/metrics.go``) and the other is
lost. The fresh-clone CI run of stop 55 lost half the scoring stage's ``requests_unjudged`` this way
(29,867 of 60,000 on the bundled sample): the accounting caught it, the job failed.

So the batch job counts as data: a stage whose DoFn has ``counts_as_data`` on
(:class:`streameval.beam.threads.ThreadedDoFn`) emits, at the end of each bundle, its increments as
one encoded element on the tag :data:`COUNTS`, and :class:`PublishCounts` adds all of them up
(``CombineGlobally``, lifted: one partial sum per bundle, then one small merge) and increments the
Beam counters and distributions from a single element in a single bundle: every counter of the job
is reported once, by one step, whichever runner runs it. The launcher reads them as before
(:func:`streameval.beam.accounting.job_counters`).

An element of :data:`COUNTS` is bytes (JSON): ``[[namespace, name, n], ...]`` for counters and
``[namespace, name, count, sum, min, max]`` for distributions, under keys ``"c"`` and ``"d"``.

Layer 3 (Beam): imports apache_beam only.
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

__all__ = ["COUNTS", "counts_tags", "add_counts", "summarized", "encode_counts", "decode_counts", "CountsCombineFn",
           "PublishCounts", "count_elements", "publish_distribution"]

#: the output tag of a DoFn's counts (one element per bundle and window)
COUNTS = "counts"


def counts_tags(on: bool) -> tuple:
    """The extra output tags of a ParDo whose DoFn counts as data when ``on``: ``(COUNTS,)`` or ``()``."""
    return (COUNTS,) if on else ()


def add_counts(into: dict, counts: dict) -> dict:
    """Add ``counts`` to ``into`` (returned), both ``{(namespace, name): n}`` for counters and
    ``{("distribution", namespace, name): [count, sum, min, max]}`` for distributions."""
    for key, value in counts.items():
        if len(key) == 3:
            prev = into.get(key)
            into[key] = list(value) if prev is None else [prev[0] + value[0], prev[1] + value[1],
                                                          min(prev[2], value[2]), max(prev[3], value[3])]
        else:
            into[key] = into.get(key, 0) + int(value)
    return into


def summarized(collected: dict) -> dict:
    """The increments :func:`streameval.beam.threads._collect` gathers (a distribution's values as a
    list) in the form of :func:`add_counts` (a distribution as ``[count, sum, min, max]``)."""
    out = {}
    for key, value in collected.items():
        if len(key) == 3:
            if value:
                out[key] = [len(value), sum(value), min(value), max(value)]
        else:
            out[key] = value
    return out


def encode_counts(counts: dict) -> bytes:
    """``counts`` (the form of :func:`add_counts`' result) as one element of :data:`COUNTS`."""
    return json.dumps({
        "c": sorted([k[0], k[1], int(n)] for k, n in counts.items() if len(k) == 2),  # 0 too: a counter the job made
        "d": sorted([k[1], k[2], *map(int, v)] for k, v in counts.items() if len(k) == 3 and v[0]),
    }, separators=(",", ":")).encode()


def decode_counts(blob: bytes) -> dict:
    """The counts of an element of :data:`COUNTS` (inverse of :func:`encode_counts`)."""
    data = json.loads(blob)
    out: dict = {(ns, name): n for ns, name, n in data.get("c", ())}
    out.update({("distribution", ns, name): [c, s, lo, hi] for ns, name, c, s, lo, hi in data.get("d", ())})
    return out


class _CountsCoder(beam.coders.Coder):
    """The accumulator of :class:`CountsCombineFn` as the bytes of :func:`encode_counts`."""

    def encode(self, value):
        return encode_counts(value)

    def decode(self, encoded):
        return decode_counts(encoded)

    def is_deterministic(self):
        return True


class CountsCombineFn(beam.CombineFn):
    """Elements of :data:`COUNTS` -> their sum, as one such element (exact integer sums)."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, blob):
        return add_counts(acc, decode_counts(blob))

    def merge_accumulators(self, accs):
        out: dict = {}
        for acc in accs:
            add_counts(out, acc)
        return out

    def extract_output(self, acc):
        return encode_counts(acc)

    def get_accumulator_coder(self):
        return _CountsCoder()


def publish_distribution(namespace: str, name: str, count: int, total: int, lo: int, hi: int) -> None:
    """Update Beam's distribution ``name`` so that it reports ``count``, ``total`` (sum), ``lo`` and
    ``hi`` (what a Beam distribution keeps of its values): ``lo``, ``hi`` and ``count - 2`` values
    between them with the rest of the sum (Beam's API takes one value at a time)."""
    dist = Metrics.distribution(namespace, name)
    if count <= 0:
        return
    if count == 1:
        dist.update(lo)
        return
    dist.update(lo)
    dist.update(hi)
    rest = count - 2
    if rest:
        q, r = divmod(total - lo - hi, rest)
        for i in range(rest):
            dist.update(q + 1 if i < r else q)


class _Publish(beam.DoFn):
    """The one element of the job's summed counts -> Beam counters and distributions."""

    def process(self, blob):
        for key, value in sorted(decode_counts(blob).items()):
            if len(key) == 3:
                publish_distribution(key[1], key[2], *value)
            else:  # also 0: the counter is reported, as when a stage increments it by 0
                Metrics.counter(*key).inc(value)
        return ()


def _as_bytes(blob) -> bytes:
    return bytes(blob)


class PublishCounts(beam.PTransform):
    """``(pcoll, ...) | PublishCounts()``: the elements of :data:`COUNTS` of every PCollection (in any
    windows) summed and reported as Beam counters and distributions by one step, from one element."""

    def expand(self, parts):
        parts = tuple(parts)
        if not parts:
            return None
        as_global = [part
                     | f"Global{i}" >> beam.WindowInto(GlobalWindows())
                     # every input of the Flatten typed bytes, as its output (Prism 2.62 rewrites an
                     # input's coder into the output's: streameval.beam.columnar._as_kv)
                     | f"Bytes{i}" >> beam.Map(_as_bytes).with_output_types(bytes)
                     for i, part in enumerate(parts)]
        merged = as_global[0] if len(as_global) == 1 else tuple(as_global) | "All" >> beam.Flatten()
        return (merged
                | "Sum" >> beam.CombineGlobally(CountsCombineFn()).with_output_types(bytes)
                | "Publish" >> beam.ParDo(_Publish()))


def _one_count(n, namespace, name) -> bytes:
    return encode_counts({(namespace, name): int(n)})


def count_elements(pcoll, namespace: str, name: str, label: str):
    """The number of elements of ``pcoll`` as an element of :data:`COUNTS` (counter ``name`` of
    ``namespace``), for :class:`PublishCounts`."""
    return (pcoll
            | f"{label}Global" >> beam.WindowInto(GlobalWindows())
            | f"{label}Count" >> beam.combiners.Count.Globally()
            | f"{label}AsCounts" >> beam.Map(_one_count, namespace, name).with_output_types(bytes))
