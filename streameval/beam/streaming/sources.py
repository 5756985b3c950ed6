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
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from ...io import avro
from ..sources import read_avro_blocks, unreadable_letter
from .polling import SCHEMA_OF
from .common import _when
from .replay import element_time, ms_floor, replay_steps, usable_time

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


class RecordReplayConfig(NamedTuple):
    """What a per-event replay reads: ``paths`` ``((kind, (file, ...)), ...)`` (impressions, judgments,
    clicks; files in the order given) and ``step`` microseconds of event time per step."""

    paths: tuple
    step: int


class RecordReplayPlan(NamedTuple):
    """A per-event replay read: ``steps`` as :func:`~.replay.replay_steps` gives them, ``counts``
    records read per kind, ``unreadable`` one dead letter per file that could not be read to its end."""

    steps: list
    counts: dict
    unreadable: list


def record_plan(cfg: RecordReplayConfig) -> RecordReplayPlan:
    """Read ``cfg``'s files (:func:`read_files`) into a :class:`RecordReplayPlan`. Raises
    :class:`~streameval.beam.sources.InputUnavailableError` for a file the environment does not
    deliver."""
    recs, unreadable = {}, []
    for kind, paths in cfg.paths:
        recs[kind], bad = read_files(list(paths), kind)
        unreadable.extend(bad)
    counts = {k: sum(map(len, v.values())) for k, v in recs.items()}
    return RecordReplayPlan(replay_steps(recs, cfg.step), counts, unreadable)


class _PlayRecords(beam.DoFn):
    """``(token, paths, step, index, processing seconds)`` -> the records of the plan's step ``index``
    (held in this process, :func:`~.replay.held_plan`; read again from the files elsewhere) as
    ``(path, [record, ...])`` on the output of their kind, timestamped with their earliest event time
    (in whole milliseconds, as a ``TestStream`` element keeps it); the replay's processing time
    (:func:`~.replay.replay_clock`) moves to the element's."""

    def process(self, element):
        from . import replay as _replay

        token, paths, step_us, i, ptime = element
        _replay._REPLAY_NOW[0] = float(ptime)
        plan = _replay.held_plan(token, RecordReplayConfig(paths, step_us), record_plan)
        for kind, path, recs in plan.steps[i][1]:
            yield pvalue.TaggedOutput(kind, TimestampedValue(
                (path, list(recs)), Timestamp(micros=ms_floor(element_time(recs)))))


class ReplayAvro(beam.PTransform):
    """``p | ReplayAvro(impressions=[paths], judgments=[paths], clicks=[paths])``: the logs
    replayed in event-time order with a watermark, on the local streaming runner, as
    :meth:`~streameval.beam.streaming.Replay.from_records` plays them (each step's judgments, then
    impressions, then clicks; the watermark to the step's end; ``pace`` seconds of processing time);
    returns ``{"impressions", "judgments", "clicks"}`` PCollections of ``(path, records)``. The files
    are read when the pipeline is built (a replay holds the log in memory, :func:`record_plan`) and
    the plan stays in this process: the pipeline's ``TestStream`` carries one descriptor per step,
    never the records (:class:`_PlayRecords`). A file that cannot be read to its end contributes the
    records before the damage; ``self.unreadable`` holds one dead letter per such file and
    ``self.counts`` the records read per kind."""

    KINDS = ("impressions", "judgments", "clicks")

    def __init__(self, impressions=(), judgments=(), clicks=(), step="1h", pace=1.0, label=None):
        super().__init__(label)
        self.paths = {"impressions": list(impressions), "judgments": list(judgments), "clicks": list(clicks)}
        self.step = step
        self.pace = pace
        self.counts = {}
        self.unreadable = []

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream

        from ...plan.windows import parse_duration
        from .replay import END_OF_TIME_US, held_plan, new_token

        cfg = RecordReplayConfig(tuple((k, tuple(str(x) for x in v)) for k, v in self.paths.items()),
                                 parse_duration(self.step, "step"))
        token = new_token()
        plan = held_plan(token, cfg, record_plan)
        self.counts, self.unreadable = dict(plan.counts), list(plan.unreadable)
        stream = TestStream(coder=FastPrimitivesCoder())
        ptime = 0.0
        for i, (s, parts) in enumerate(plan.steps):
            first = min(ms_floor(element_time(recs)) for _, _, recs in parts)
            stream = stream.add_elements([TimestampedValue((token, cfg.paths, cfg.step, i, ptime), _when(first))])
            stream = stream.advance_watermark_to(_when(ms_floor((s + 1) * cfg.step)))
            if self.pace:
                ptime += float(self.pace)
                stream = stream.advance_processing_time(float(self.pace))
        # close every window while the watermark is still finite, then end
        stream = stream.advance_watermark_to(_when(END_OF_TIME_US)).advance_watermark_to_infinity()
        out = (pbegin | "TestStream" >> stream
               | "Fanout" >> beam.ParDo(_PlayRecords()).with_outputs(*self.KINDS))
        return {k: out[k] for k in self.KINDS}


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
