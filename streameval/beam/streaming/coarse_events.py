"""Events from a source that runs on the runner (Kafka, Pub/Sub, the watched or replayed files of
:mod:`.watch_source` and :mod:`.replay_source`) as blocks of :class:`~.coarse.ColumnarStreamMetrics`:
:class:`EventBlocks`.

A bundle's events are gathered into blocks of at most ``max_records`` (one per source: a topic,
a file), so the columnar stages receive coarse elements: a Kafka poll's records become one block,
cleaned and scored as columns. Such a block carries no watermark (the source's watermark is the
runner's, which no element sees): the columnar shards then learn which windows closed from their
event-time timers, set at the end plus the allowed lateness of every window that has data in any
shard (``("seen", [windows])`` notices, :class:`~.coarse._ReadBlocks`).

Block forms (the second field of ``(source, (form, payload), records, None)``):

* ``("json", [bytes or str, ...])``: JSON values (Kafka's, Pub/Sub's), decoded and checked one
  by one by the stage that reads the block; a value that is not JSON, or not an object, is a dead
  letter with its reason (the bytes as text, invalid UTF-8 replaced);
* ``("records", [dict, ...])``: records of the impression schema's types (an Avro file's), screened
  as columns as the batch job screens them.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from .prepare import file_records

__all__ = ["EventBlocks", "MAX_BLOCK"]

#: the most events in one block (a bundle gives one block per source, cut at this size)
MAX_BLOCK = 20_000


class _Gather(beam.DoFn):
    """A bundle's events -> blocks ``(source, (form, events), n, None)`` stamped with the earliest
    event time among them (never after an event: the block holds the watermark no later than its
    events would)."""

    def __init__(self, source: str, form: str, max_records: int):
        self.source = source
        self.form = form
        self.max_records = int(max_records)

    def start_bundle(self):
        self._open: dict = {}  # source -> [events, earliest timestamp]

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        if self.form == "json":  # a Kafka (key, value) pair or a Pub/Sub payload
            source, events = self.source, [element[1] if isinstance(element, tuple) else element]
        else:
            source, events = file_records(element, self.source)
        block = self._open.setdefault(source, [[], MAX_TIMESTAMP])
        block[0].extend(events)
        block[1] = min(block[1], timestamp)
        if len(block[0]) >= self.max_records:
            del self._open[source]
            yield beam.transforms.window.TimestampedValue(self._block(source, block[0]), block[1])

    def _block(self, source, events):
        return source, (self.form, events), len(events), None

    def finish_bundle(self):
        for source, (events, ts) in self._open.items():
            yield WindowedValue(self._block(source, events), ts, (GlobalWindow(),))
        self._open = {}


class EventBlocks(beam.PTransform):
    """``events | EventBlocks(source, form)``: the blocks :class:`~.coarse.ColumnarStreamMetrics`
    reads (the module docstring), without a watermark (give the transform ``source_watermark=False``).

    ``form``: ``"json"`` for Kafka's ``(key, value)`` pairs or Pub/Sub payloads (``source``, e.g.
    ``kafka:impressions``, names their dead letters), ``"records"`` for the ``(path, [records])``
    pairs of the file sources (the path names them). Events stay in the global window."""

    def __init__(self, source: str, form: str = "json", max_records: int = MAX_BLOCK, label=None):
        super().__init__(label)
        if form not in ("json", "records"):
            raise ValueError(f"form must be 'json' or 'records', got {form!r}")
        if int(max_records) < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records!r}")
        self.source = source
        self.form = form
        self.max_records = int(max_records)

    def expand(self, events):
        return events | "Gather" >> beam.ParDo(_Gather(self.source, self.form, self.max_records))
