"""Sources of the streaming job (``streameval stream``): Avro logs replayed in event-time order
(:class:`ReplayAvro`), new Avro files as they appear on runners with splittable DoFns
(:class:`WatchAvro`), and JSON events from Pub/Sub (:class:`ReadPubSubEvents`) and Kafka
(:class:`ReadKafkaEvents`). The live file source of the local runner is :mod:`.live`
(:class:`~.live.WatchFiles`); files are read with :func:`streameval.beam.sources.read_avro_blocks`,
the batch job's reader and checks.

Every source stamps an event with its own ``timestamp`` (int microseconds), never with when it was
read. A damaged Avro file gives the records of its complete blocks before the damage and one dead
letter (:func:`streameval.beam.sources.unreadable_letter`); a record without a usable event time is
passed on unstamped, for the preparation stage to make it a dead letter.
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.utils.timestamp import Timestamp

from ...io import avro
from ..sources import read_avro_blocks, unreadable_letter
from .polling import SCHEMA_OF
from .replay import Replay, usable_time

__all__ = ["ReplayAvro", "WatchAvro", "read_files", "ReadPubSubEvents", "ReadKafkaEvents", "KAFKA_TIMESTAMP_POLICIES"]


def read_files(paths, kind):
    """``({path: records}, dead letters of unreadable files)``: a damaged file (truncated, corrupt,
    an incompatible schema) gives the records of its complete blocks before the damage
    (:func:`streameval.io.avro.read_blocks`, as the batch job reads it) and one dead letter."""
    recs, unreadable = {}, []
    name = SCHEMA_OF[kind]
    for path in paths:
        n = 0
        mine = recs.setdefault(str(path), [])
        try:
            for block in read_avro_blocks(path, name):
                mine.extend(block)
                n += len(block)
        except avro.AvroInputError as e:  # damaged content; a file the environment does not deliver fails
            unreadable.append(unreadable_letter(path, kind, e, n))
    return recs, unreadable


class ReplayAvro(beam.PTransform):
    """``p | ReplayAvro(impressions=[paths], judgments=[paths], clicks=[paths])``: the logs
    replayed in event-time order with a watermark (:class:`~streameval.beam.streaming.Replay`);
    returns ``{"impressions", "judgments", "clicks"}`` PCollections of record lists. The files
    are read when the pipeline is built (a replay holds the log in memory). A file that cannot be
    read to its end contributes the records before the damage; ``self.unreadable`` holds one dead
    letter per such file and ``self.counts`` the records read per kind."""

    def __init__(self, impressions=(), judgments=(), clicks=(), step="1h", pace=1.0, label=None):
        super().__init__(label)
        self.paths = {"impressions": list(impressions), "judgments": list(judgments), "clicks": list(clicks)}
        self.step = step
        self.pace = pace
        self.counts = {}
        self.unreadable = []

    def expand(self, pbegin):
        recs = {}
        self.unreadable = []
        for k, v in self.paths.items():
            recs[k], bad = read_files(v, k)
            self.unreadable.extend(bad)
        self.counts = {k: sum(map(len, v.values())) for k, v in recs.items()}
        return pbegin | "Replay" >> Replay.from_records(recs["impressions"], recs["judgments"], recs["clicks"],
                                                        step=self.step, pace=self.pace)


class WatchAvro(beam.PTransform):
    """New Avro files of one kind matching ``pattern`` as they appear, polled every ``interval``
    seconds (:class:`streameval.beam.streaming.watch_source.WatchEvents`, a splittable DoFn with an
    event-time watermark): record lists timestamped with their earliest event time. Needs a runner
    with splittable DoFns (Prism, Flink, Dataflow). ``delay``: microseconds the watermark stays behind
    the latest event time read; ``idle_stop``: seconds without a new file after which the source ends
    (None: never). A damaged file gives the records before the damage; after the transform is applied,
    ``self.unreadable`` holds one dead letter per such file."""

    def __init__(self, pattern, kind="impressions", interval=10.0, delay=0, idle_stop=None, label=None):
        super().__init__(label)
        from .watch_source import WatchConfig, WatchEvents

        self._source = WatchEvents(WatchConfig({kind: [pattern]}, float(interval), int(delay), idle_stop))
        self.kind = kind
        self.unreadable = None

    def expand(self, pbegin):
        out = pbegin | "Watch" >> self._source
        #: dead letters of the files that could not be read to their end
        self.unreadable = out["unreadable"]
        return out[self.kind]


def _json_event(data, ts_field="timestamp"):
    from apache_beam.transforms.window import TimestampedValue

    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    try:
        rec = json.loads(text)
    except ValueError:  # damaged bytes: the preparation stage makes the text a dead letter
        return text
    ts = usable_time({"timestamp": rec.get(ts_field)}) if isinstance(rec, dict) else None
    if ts is not None:
        return TimestampedValue(rec, Timestamp(micros=ts))
    return rec  # no usable event time: the preparation stage makes it a dead letter


class ReadPubSubEvents(beam.PTransform):
    """JSON records from a Pub/Sub subscription (``projects/P/subscriptions/S``) or topic
    (``projects/P/topics/T``), timestamped with the record's ``timestamp`` (int microseconds)
    or, with ``timestamp_attribute``, by Pub/Sub from that message attribute (which also gives
    the runner its watermark)."""

    def __init__(self, source, timestamp_attribute=None, label=None):
        super().__init__(label)
        self.source = source
        self.timestamp_attribute = timestamp_attribute

    @property
    def read(self):
        """The Pub/Sub read alone (payloads as bytes, not decoded)."""
        kw = {"subscription": self.source} if "/subscriptions/" in self.source else {"topic": self.source}
        return beam.io.ReadFromPubSub(timestamp_attribute=self.timestamp_attribute, **kw)

    def expand(self, pbegin):
        return pbegin | "ReadPubSub" >> self.read | "Decode" >> beam.Map(_json_event)


from ..arguments import KAFKA_TIMESTAMP_POLICIES  # noqa: E402  (the command line's, Beam-free)


class ReadKafkaEvents(beam.PTransform):
    """JSON records from a Kafka topic (``apache_beam.io.kafka.ReadFromKafka``, a cross-language
    transform: the runner needs Beam's Java expansion service), timestamped with the record's
    ``timestamp`` field. The watermark follows Kafka's record timestamps (``timestamp_policy``,
    default ``create_time``: producers should set each record's timestamp to the event's time in
    milliseconds, so that a backlog read late is not late data); ``processing_time`` makes every
    event older than the reading time late (Beam's default, not ours)."""

    def __init__(self, bootstrap_servers, topic, consumer_config=None, expansion_service=None,
                 timestamp_policy="create_time", label=None):
        super().__init__(label)
        if timestamp_policy not in KAFKA_TIMESTAMP_POLICIES:
            raise ValueError(f"timestamp_policy must be one of {sorted(KAFKA_TIMESTAMP_POLICIES)}, "
                             f"got {timestamp_policy!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.consumer_config = dict(consumer_config or {})
        self.expansion_service = expansion_service
        self.timestamp_policy = KAFKA_TIMESTAMP_POLICIES[timestamp_policy]
        self.read = self._make_read()

    def _make_read(self):
        from apache_beam.io.kafka import ReadFromKafka

        cfg = {"bootstrap.servers": self.bootstrap_servers, "auto.offset.reset": "earliest", **self.consumer_config}
        kw = {"expansion_service": self.expansion_service} if self.expansion_service else {}
        return ReadFromKafka(consumer_config=cfg, topics=[self.topic], timestamp_policy=self.timestamp_policy, **kw)

    def expand(self, pbegin):
        return pbegin | "ReadKafka" >> self.read | "Decode" >> beam.Map(lambda kv: _json_event(kv[1]))
