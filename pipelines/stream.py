"""Streaming evaluation job: event-time windows with early, on-time and late panes.

    streameval stream --replay --impressions 'logs/*.avro' --judgments qrels.avro \\
        --metrics ndcg@10,map --window 1d --allowed-lateness 1h --early-every 30s --output out/

Sources:

* ``--replay``: plays the Avro logs in event-time order with a watermark (a TestStream on Beam's
  local streaming runner, ``BundleBasedDirectRunner``): ``--replay-step`` of event time per
  watermark step, ``--replay-pace`` seconds of processing time per step (drives ``--early-every``).
* ``--watch``: watches ``--impressions`` / ``--judgments`` / ``--clicks`` patterns for new Avro
  files (``fileio.MatchContinuously``; runners with splittable DoFns: Dataflow, Flink, Prism).
  Records are timestamped with their event time, so the files should hold current data.
* ``--pubsub-impressions`` / ``--pubsub-judgments`` / ``--pubsub-clicks`` (subscriptions or
  topics, JSON messages, event time from the ``timestamp`` field or ``--pubsub-timestamp-attribute``)
  and ``--kafka-bootstrap`` with ``--kafka-impressions`` etc. (JSON values): Beam's own IOs, on
  runners that provide them (Dataflow; Flink and Spark with the Java expansion service for Kafka).

Outputs (``--output DIR``): one file set per window and pane (:class:`WriteWindowedFiles`),
``metrics-<window start>-<window end>-<system>-pane<index>-<pane>.{jsonl,avro}`` (metric_result
schema), plus ``late_data-*.jsonl`` and ``dead_letters-*.jsonl`` (dead_letter shape),
``summary.json`` and, last, ``manifest.json``: the pane files read as one table with
``streameval.read_metrics(DIR)`` (``final_only=True``: the last pane of each window). The console shows each pane as it fires (``--quiet``: only the summary).

Repeated and conflicting input follows the batch job's rules (replayed impressions and click events
are duplicates, reused event ids and items served twice dead letters, ``--judgment-conflicts
latest|max|reject``, ``--grades LO:HI``); a damaged Avro file gives its good records and one dead
letter. The job prints the record accounting (:func:`streameval.beam.accounting.format_accounting`),
writes it to ``summary.json`` (``accounting``, ``accounting_problems``) and exits with status 1 when
the counts do not add up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import deque
from datetime import datetime, timedelta, timezone

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.utils.timestamp import Timestamp

from streameval.beam.arguments import (
    DEFAULT_METRICS,
    GDEVAL_ERR_MAX_GRADE,
    add_bootstrap_arguments,
    add_hist_arguments,
    add_metric_option_arguments,
    auto_err_max_grade,
    check_bootstrap_arguments,
    hist_range,
    make_pipeline,
    parse_err_max_grade,
    split_metrics,
)
from streameval.beam.sinks import prepare_output, publish, remove_temporary
from streameval.exits import EXIT_ALERT, EXIT_OK, one_line
from streameval.beam.arguments import parse_grades as _grades
from streameval.beam.arguments import parse_slice_args as _slices_from_args
from streameval.beam.sources import UNREADABLE, expand_inputs, failure_reason, read_avro_blocks, set_file_system_options, unreadable_letter
from streameval.beam.accounting import (add_input_check_arguments, check_inputs, exit_status, format_accounting,
                                        input_checks_from_args, job_counters)
from streameval.beam.online import split_metric_names
from streameval.beam.streaming.coarse import ColumnarStreamMetrics, ReplayColumns
from streameval.beam.streaming.coarse_online import online_refusal
from streameval.beam.streaming.live import WatchFiles
from streameval.beam.streaming.replay import element_time, usable_time
from streameval.beam.transforms import SOURCE_UNRANKABLE
from streameval.alerts import format_alert, load_rules
from streameval.beam.alerts import ALERTS_FIRED, StreamAlerts
from streameval.beam.prometheus import STORE as PROMETHEUS
from streameval.beam.prometheus import serve
from streameval.beam.streaming import (
    REASON_CLICK_UNMATCHED,
    Replay,
    StreamMetrics,
    WindowSpec,
    parse_duration,
    replay_clock,
    stream_counts,
)
from streameval import progress
from streameval.io import avro
from streameval.io.cleaning import JUDGMENT_POLICIES
from streameval.io.records import parse_time_range
from streameval.metrics.names import MetricNameError, parse_metrics
from streameval.metrics.online import parse_online_metric

__all__ = [
    "main",
    "build_arg_parser",
    "ReplayAvro",
    "WatchAvro",
    "ReadPubSubEvents",
    "ReadKafkaEvents",
    "WriteWindowedFiles",
    "WriteRecords",
    "ConsoleTable",
    "format_pane",
    "pane_file_stem",
]

KINDS = ("impressions", "judgments", "clicks")
LOCAL_STREAM_RUNNERS = ("BundleBasedDirectRunner", "DirectRunner")
#: request shards of the columnar engine by default: the local runner runs one process (one core for
#: Python), where every shard a file is cut into costs a call of each batch stage per window it touches
#: (a fixed cost of milliseconds) and a key's state and timers: one shard (docs/scale.md, 2026-11-27)
COLUMNAR_SHARDS = 1
RUNNING_TOTALS = "running_totals.jsonl"  # in --output (a local directory): the accounting as of each pane
#: the outputs in --output: a rerun removes a previous run's first, the manifest lists them last
OUTPUTS = ("metrics-*", "late_data-*", "dead_letters-*", "alerts-*", RUNNING_TOTALS)
_MICRO = timedelta(microseconds=1)
_SCHEMA_OF = {"impressions": "impression", "judgments": "judgment", "clicks": None}


# --------------------------------------------------------------------------------------------
# sources

def _read_local(paths, kind):
    """``({path: records}, dead letters of unreadable files)``: a damaged file (truncated, corrupt,
    an incompatible schema) gives the records of its complete blocks before the damage
    (:func:`streameval.io.avro.read_blocks`, as the batch job reads it) and one dead letter."""
    recs, unreadable = {}, []
    name = _SCHEMA_OF[kind]
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
            recs[k], bad = _read_local(v, k)
            self.unreadable.extend(bad)
        self.counts = {k: sum(map(len, v.values())) for k, v in recs.items()}
        return pbegin | "Replay" >> Replay.from_records(recs["impressions"], recs["judgments"], recs["clicks"],
                                                        step=self.step, pace=self.pace)


class _ParseAvroFile(beam.DoFn):
    """A matched Avro file -> its records in lists of at most 1000, each record list timestamped
    with its earliest event time (timestamps as int microseconds). A file that cannot be read to
    its end gives the records before the damage and a dead letter (output ``unreadable``)."""

    def __init__(self, kind):
        self.kind = kind

    @staticmethod
    def _stamped(path, batch):
        from apache_beam.transforms.window import TimestampedValue

        return TimestampedValue((path, batch), Timestamp(micros=element_time(batch)))

    def process(self, readable):
        n = 0
        path = readable.metadata.path
        try:
            for block in read_avro_blocks(path, _SCHEMA_OF[self.kind]):
                for i in range(0, len(block), 1000):
                    batch = block[i:i + 1000]
                    n += len(batch)
                    yield self._stamped(path, batch)
        except avro.AvroInputError as e:  # damaged content; a file the environment does not deliver fails
            yield pvalue.TaggedOutput("unreadable", unreadable_letter(readable.metadata.path, self.kind, e, n))


class WatchAvro(beam.PTransform):
    """New Avro files matching ``pattern`` as they appear (``fileio.MatchContinuously``, every
    ``interval`` seconds): record lists timestamped with their event time. Needs a runner with
    splittable DoFns and processing-time watermarks (Dataflow, Flink, Prism). A damaged file gives
    the records before the damage; after the transform is applied, ``self.unreadable`` holds one
    dead letter per such file."""

    def __init__(self, pattern, kind="impressions", interval=10.0, label=None):
        super().__init__(label)
        self.pattern = pattern
        self.kind = kind
        self.interval = float(interval)

    def expand(self, pbegin):
        parsed = (pbegin
                  | "Match" >> fileio.MatchContinuously(self.pattern, interval=self.interval)
                  | "Read" >> fileio.ReadMatches()
                  | "Parse" >> beam.ParDo(_ParseAvroFile(self.kind)).with_outputs("unreadable", main="records"))
        #: dead letters of the files that could not be read to their end
        self.unreadable = parsed.unreadable
        return parsed.records


def _json_event(data, ts_field="timestamp"):
    from apache_beam.transforms.window import TimestampedValue

    rec = json.loads(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)
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

    def expand(self, pbegin):
        kw = {"subscription": self.source} if "/subscriptions/" in self.source else {"topic": self.source}
        return (pbegin
                | "ReadPubSub" >> beam.io.ReadFromPubSub(timestamp_attribute=self.timestamp_attribute, **kw)
                | "Decode" >> beam.Map(_json_event))


KAFKA_TIMESTAMP_POLICIES = {"create_time": "CreateTime", "log_append_time": "LogAppendTime",
                            "processing_time": "ProcessingTime"}


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


# --------------------------------------------------------------------------------------------
# sinks

def _iso(us) -> str:
    if us is None:
        return "global"
    try:
        dt = datetime.fromtimestamp(us / 1e6, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(us)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if us % 1_000_000 == 0 else dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _safe(text) -> str:
    """``text`` as a file-name part: unchanged when it is short and plain; otherwise its characters
    outside ``[A-Za-z0-9._=+-]`` replaced, cut to 80 characters and followed by ``~`` and 8 hex
    digits of its SHA-1, so two different names never give the same file (``sys/1`` and ``sys_1``)."""
    import hashlib

    text = str(text)
    safe = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text)[:80] or "_"
    if safe == text:
        return safe
    return f"{safe}~{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


def pane_file_stem(rows) -> str:
    """``metrics-<start>-<end>-<system>-pane<index>-<pane>[-final]`` for the rows of one pane (one
    window, one system); a session's key is part of its slice, so it is added too."""
    r = rows[0]
    stem = f"metrics-{_iso(r['window_start'])}-{_iso(r['window_end'])}-{_safe(r['system'])}"
    sl = r["slice"]
    if sl.startswith(("user=", "request=")):
        stem += "-" + _safe(sl.split(",", 1)[0])
    stem += f"-pane{r['pane_index']:03d}-{r['pane']}"
    if r["is_final"]:
        stem += "-final"
    return stem.replace(":", "")


class _JsonLinesSink(fileio.FileSink):
    """Writes each element (a pane: a list of rows) as JSON lines."""

    def open(self, fh):
        self._fh = fh

    def write(self, rows):
        from streameval.io.results import json_line

        for r in rows:
            self._fh.write(json_line(r).encode("utf-8") + b"\n")

    def flush(self):
        self._fh.flush()


class _AvroSink(fileio.FileSink):
    """Writes each element (a pane: a list of rows) as one Avro container file (metric_result)."""

    def open(self, fh):
        self._fh = fh
        self._rows = []

    def write(self, rows):
        self._rows.extend(rows)

    def flush(self):
        import fastavro

        fastavro.writer(self._fh, avro.load_schema("metric_result"), self._rows)
        self._fh.flush()


def _pane_sink(dest):
    return _AvroSink() if dest.endswith(".avro") else _JsonLinesSink()


class WriteWindowedFiles(beam.PTransform):
    """``panes | WriteWindowedFiles(directory)``: each pane (the list of rows one firing emits for
    one window and system) to ``<stem>.jsonl`` and ``<stem>.avro`` (see :func:`pane_file_stem`):
    one file per pane and format, written by the step that receives the pane (to a temporary name,
    then renamed), in whatever window the pane comes, so no pane is ever late for the writer.

    It replaced ``fileio.WriteToFiles`` in the global window with a per-element trigger (issue 21):
    that grouped the panes by file name, and the local runner scans the trigger state of every key
    it has seen (one per file, never released in the global window) at every watermark step and
    lists the output directory at every firing, so a job of many small windows (sessions) slowed
    down quadratically with the number of files written."""

    def __init__(self, directory, formats=("jsonl", "avro"), label=None):
        super().__init__(label)
        self.directory = directory
        self.formats = tuple(formats)

    def expand(self, panes):
        return panes | "WritePaneFiles" >> beam.ParDo(_WritePaneFiles(self.directory, self.formats))


class _WritePaneFiles(beam.DoFn):
    """Writes a pane's files (:class:`WriteWindowedFiles`); yields nothing."""

    def __init__(self, directory, formats):
        self.directory = directory
        self.formats = tuple(formats)

    def process(self, rows):
        if not rows:
            return
        stem = pane_file_stem(rows)
        for f in self.formats:
            name = f"{stem}.{f}"
            final = FileSystems.join(self.directory, name)
            temp = FileSystems.join(self.directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
            sink = _pane_sink(name)
            with FileSystems.create(temp) as fh:
                sink.open(fh)
                sink.write(rows)
                sink.flush()
            if FileSystems.exists(final):  # a retried bundle: the same pane, the same content
                FileSystems.delete([final])
            FileSystems.rename([temp], [final])


class _AppendJsonl(beam.DoFn):
    """Records of a bundle to one new JSON-lines file ``<prefix>-<uuid>.jsonl`` (late data and
    dead letters: unwindowed side outputs)."""

    def __init__(self, directory, prefix):
        self.directory = directory
        self.prefix = prefix

    def start_bundle(self):
        self._recs = []

    def process(self, rec):
        self._recs.append(rec)

    def finish_bundle(self):
        if not self._recs:
            return
        from streameval.io.results import json_line

        path = FileSystems.join(self.directory, f"{self.prefix}-{uuid.uuid4().hex[:12]}.jsonl")
        with FileSystems.create(path) as fo:
            for r in self._recs:
                fo.write(json_line(r).encode("utf-8") + b"\n")
        self._recs = []


class WriteRecords(beam.PTransform):
    """``records | WriteRecords(directory, prefix)``: one JSON-lines file per bundle."""

    def __init__(self, directory, prefix, label=None):
        super().__init__(label)
        self.directory = directory
        self.prefix = prefix

    def expand(self, pcoll):
        return pcoll | "Append" >> beam.ParDo(_AppendJsonl(self.directory, self.prefix))


def format_pane(rows, metric_names=()) -> str:
    """A pane as text: a header line (pane, index, final, window, system) and a table of its rows."""
    r0 = rows[0]
    order = {n: i for i, n in enumerate(metric_names)}

    def mkey(m):
        if m in order:
            return (0, order[m], 0)
        if m.startswith("ctr@pos"):
            try:
                return (1, 1, int(m[7:]))
            except ValueError:
                pass
        return (1, 0 if m == "ctr" else 2, 0)

    head = (f"pane {r0['pane']} #{r0['pane_index']}{' final' if r0['is_final'] else ''}  "
            f"window {_iso(r0['window_start'])} .. {_iso(r0['window_end'])}  system {r0['system']}")
    lines = []
    for r in sorted(rows, key=lambda r: (r["slice"] != "all" and not r["slice"].count(",") == 0,
                                         r["slice"], mkey(r["metric"]))):
        v, se = r["value"], r.get("stderr")
        lines.append((r["slice"], r["metric"], "nan" if v is None or math.isnan(v) else f"{v:.4f}",
                      str(r["num_queries"]), "-" if se is None or math.isnan(se) else f"{se:.4f}"))
    header = ("slice", "metric", "value", "n", "stderr")
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  " + "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([head, fmt(header)] + [fmt(l) for l in lines])


# Panes and side records counted in this process: the local runner drops Beam counters of elements
# that come from timers (every pane does), so the summary of a local run counts them here.
LOCAL_COUNTS: dict = {}
# (monotonic time, pane, window end, is_final) of the latest panes as they reached the console step
# (local runner; bounded: a live job runs for ever)
PANE_LOG: deque = deque(maxlen=100_000)


def _count(key, n=1):
    LOCAL_COUNTS[key] = LOCAL_COUNTS.get(key, 0) + n


class _PanesOut(beam.DoFn):
    """Counts each pane (``LOCAL_COUNTS``) and prints it unless ``quiet``: one step, since every
    step after the aggregate costs a bundle per aggregate bundle on the local runner. With ``run``
    (the StreamMetrics' run id) it also reports the running totals of the record accounting as of
    each pane: a line on the console (unless ``quiet``) and, with a local ``totals_path``, a JSON
    line ``{"at", "pane", "window_start", "window_end", "system", "counts"}`` appended to it. The
    totals are this process's (:func:`streameval.beam.streaming.stream_counts`): the whole job's on
    the local runner; other runners report Beam counters (see :func:`main`)."""

    def __init__(self, metric_names, quiet, run=None, totals_path=None):
        self.metric_names = list(metric_names)
        self.quiet = quiet
        self.run = run
        self.totals_path = totals_path

    def process(self, rows):
        if not rows:
            return
        r0 = rows[0]
        progress.add("stream_rows", len(rows))
        _count(f"panes_{r0['pane']}")
        PANE_LOG.append((time.monotonic(), r0["pane"], r0["window_end"], r0["is_final"]))
        if r0["is_final"]:
            _count("panes_final")
        if not self.quiet:
            sys.stdout.write(format_pane(rows, self.metric_names) + "\n\n")
        if self.run is not None:
            counts = stream_counts(self.run)
            if not self.quiet:
                sys.stdout.write(running_totals_line(counts) + "\n\n")
            if self.totals_path:
                rec = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "pane": r0["pane"],
                       "window_start": r0["window_start"], "window_end": r0["window_end"], "system": r0["system"],
                       "counts": dict(sorted(counts.items()))}
                with open(self.totals_path, "a", encoding="utf-8") as fo:
                    fo.write(json.dumps(rec) + "\n")
        if not self.quiet:
            sys.stdout.flush()


def running_totals_line(counts: dict) -> str:
    """One line of running totals: records read, accepted, late and rejected per kind so far."""
    parts = []
    for kind in ("impression", "judgment", "click"):
        read = counts.get(f"{kind}s_read", 0)
        if not read:
            continue
        rejected = sum(v for k, v in counts.items() if k.startswith(f"rejected:{kind}:"))
        parts.append(f"{kind}s read {read}, valid {counts.get(f'{kind}s_valid', 0)}, late "
                     f"{counts.get(f'late:{kind}', 0)}, rejected {rejected}")
    return "running totals: " + ("; ".join(parts) or "nothing read yet")


# files that could not be read to their end (their dead letters' reasons), seen by _SideOut
LOCAL_UNREADABLE: list = []


class _SideOut(_AppendJsonl):
    """Counts the records the stream set aside (``LOCAL_COUNTS``: ``written:late:<kind>``,
    ``written:rejected``, ``written:unrankable``, ``written:unreadable``, and by source for the
    summary line) and, with a directory, writes them per bundle: ``late_data-*.jsonl`` (late data)
    and ``dead_letters-*.jsonl`` (the rest)."""

    def process(self, rec):
        src = rec.get("source", "")
        late = src.startswith("late:")
        if late:
            _count(f"written:{src}")
            _count(src)
        elif rec.get("reason", "").startswith(UNREADABLE):
            _count("written:unreadable")
            LOCAL_UNREADABLE.append(rec["reason"].replace(f"{UNREADABLE} ", f"{src} ", 1))
        elif src == SOURCE_UNRANKABLE:  # a request that cannot be ranked (its impressions are accepted)
            _count("written:unrankable")
        else:
            _count("written:rejected")
            if src.startswith("unmatched:"):
                _count(src)
        if self.directory:
            (self._late if late else self._dead).append(rec)

    def start_bundle(self):
        self._late, self._dead = [], []

    def finish_bundle(self):
        for prefix, recs in (("late_data", self._late), ("dead_letters", self._dead)):
            if recs:
                self._recs, self.prefix = recs, prefix
                super().finish_bundle()
        self._late, self._dead = [], []


class _PrintPanes(beam.DoFn):
    def __init__(self, metric_names, stream=None):
        self.metric_names = list(metric_names)
        self.stream = stream

    def process(self, rows):
        if rows:
            out = self.stream or sys.stdout
            out.write(format_pane(rows, self.metric_names) + "\n\n")
            out.flush()


class ConsoleTable(beam.PTransform):
    """``panes | ConsoleTable(metric_names)``: prints each pane as it fires (the process's
    stdout: meaningful on the local runner)."""

    def __init__(self, metric_names=(), label=None):
        super().__init__(label)
        self.metric_names = list(metric_names)

    def expand(self, panes):
        return panes | "Print" >> beam.ParDo(_PrintPanes(self.metric_names))


# --------------------------------------------------------------------------------------------
# arguments

def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval stream",
        description="Streaming ranking and click metrics over impression / judgment / click events, in "
                    "event-time windows with early, on-time and late panes (Apache Beam). Unknown arguments "
                    "are passed to Beam's PipelineOptions.")
    src = p.add_argument_group("sources (one of --replay, --watch, Pub/Sub, Kafka)")
    src.add_argument("--impressions", action="append", default=[],
                     help="Avro file(s) or glob of impressions (--replay, --watch); repeatable")
    src.add_argument("--judgments", action="append", default=[], help="Avro file(s) or glob of judgments")
    src.add_argument("--clicks", action="append", default=[],
                     help="Avro file(s) or glob of click events {request_id, item_id, timestamp, system_id?}")
    src.add_argument("--replay", action="store_true",
                     help="replay the files in event-time order with a watermark (local streaming runner)")
    src.add_argument("--replay-step", default="1h", help="event time per watermark step of the replay (default 1h)")
    src.add_argument("--replay-pace", type=float, default=1.0,
                     help="processing-time seconds per replay step (drives --early-every; default 1)")
    src.add_argument("--watch", action="store_true",
                     help="watch the patterns for new Avro files while the job runs (local runner: a live "
                          "TestStream service; other runners: fileio.MatchContinuously)")
    src.add_argument("--watch-interval", type=float, default=None,
                     help="seconds between matches (default 1 on the local runner, 10 elsewhere)")
    src.add_argument("--watch-delay", default="0",
                     help="local runner: the watermark stays this far behind the latest impression or click "
                          "time seen (default 0: a file older than everything seen before is late)")
    src.add_argument("--watch-idle-stop", type=float, default=None, metavar="SECONDS",
                     help="local runner: end the job (closing every window) after this long without a new "
                          "file (default: run until stopped)")
    for k in KINDS:
        src.add_argument(f"--pubsub-{k}", default=None, help=f"Pub/Sub subscription or topic of {k} (JSON)")
        src.add_argument(f"--kafka-{k}", default=None, help=f"Kafka topic of {k} (JSON values)")
    src.add_argument("--pubsub-timestamp-attribute", default=None, help="Pub/Sub attribute holding the event time")
    src.add_argument("--kafka-bootstrap", default=None, help="Kafka bootstrap servers (host:port,...)")
    src.add_argument("--kafka-expansion-service", default=None, help="address of a running expansion service")
    src.add_argument("--kafka-timestamp-policy", choices=sorted(KAFKA_TIMESTAMP_POLICIES), default="create_time",
                     help="what the watermark of a Kafka source follows (default create_time: producers set each "
                          "record's timestamp to its event time)")

    w = p.add_argument_group("windows and triggers")
    w.add_argument("--window", default=None, help="fixed window size (1h, 1d, ...); with --every: sliding; "
                   "also written 1h/10m (sliding), session:30m, session:30m/request")
    w.add_argument("--every", default=None, help="period of sliding windows (the size a multiple of it)")
    w.add_argument("--sessions", default=None, metavar="GAP", help="session windows with this gap instead")
    w.add_argument("--session-key", choices=("user", "request"), default="user")
    w.add_argument("--early-every", default=None, help="early panes every this much processing time (e.g. 30s)")
    w.add_argument("--early-count", type=int, default=None, help="early panes every N request updates")
    w.add_argument("--allowed-lateness", default="0", help="data this late still updates a window (default 0)")
    w.add_argument("--attribution-delay", default="30m", help="click events join impressions this recent (30m)")
    w.add_argument("--prometheus-port", type=int, default=None, metavar="PORT",
                   help="serve the latest final and latest pane values on http://127.0.0.1:PORT/metrics "
                        "(Prometheus exposition format; the local runner)")
    w.add_argument("--prometheus-linger", type=float, default=0, metavar="S",
                   help="after the job ended, keep serving until a scraper stored the final values (a scrape "
                        "after the end was sent and the next scrape arrived), at most S seconds (default 0; "
                        "give two scrape intervals or more)")
    w.add_argument("--alerts", default=None, metavar="RULES.toml",
                   help="alert rules (docs/metrics.md, 'Alert rules'), evaluated on every pane: ALERT lines, "
                        "alerts-*.jsonl; exit status 4 when one fired")
    w.add_argument("--retention", default=None,
                   help="how long a final request is remembered, so that its later pieces are late data as in "
                        "the batch job (default: the window size or the allowed lateness, whichever is longer; "
                        "state grows with the request ids of this span)")

    m = p.add_argument_group("metrics (as streameval batch)")
    m.add_argument("--metrics", default=DEFAULT_METRICS)
    m.add_argument("--slices", action="append", default=[])
    add_metric_option_arguments(m, err_help=(
        "g_max of ERR, a number, or auto (default): with --replay, the largest grade of the judgment files (at "
        "least 1), as the batch job; with --watch, Pub/Sub or Kafka, 4 (the judgments are not known when the job "
        "starts)"))
    m.add_argument("--ci-level", type=float, default=0.95,
                   help="level of every pane row's interval (Wilson for CTR, t otherwise; default 0.95)")
    m.add_argument("--intervals", choices=("fixed", "anytime"), default="fixed",
                   help="fixed-sample intervals (default) or confidence sequences, valid at every pane at once")
    add_bootstrap_arguments(m, "the ranking metrics' intervals on every pane: t (default) or the Poisson bootstrap "
                               "(the columnar engine)")
    add_hist_arguments(m)
    m.add_argument("--order", choices=("score", "position"), default="score")
    m.add_argument("--tie-break", choices=("docno", "position"), default="docno")
    m.add_argument("--score-precision", choices=("float32", "float64"), default="float32")
    m.add_argument("--depth", type=int, default=None)
    m.add_argument("--no-ctr", action="store_true", help="do not compute click metrics")
    m.add_argument("--judgment-conflicts", choices=JUDGMENT_POLICIES, default="latest",
                   help="judgments of one (query, item) with different grades: latest by timestamp (default; "
                        "equal times: the larger grade), max grade, or reject them all (dead letters)")
    m.add_argument("--grades", default=None, metavar="LO:HI",
                   help="declared grade range, inclusive (e.g. 0:4): judgments outside it are dead letters")
    m.add_argument("--event-time-range", default=None, metavar="FROM..TO",
                   help="accepted event times of impressions (and click events), FROM..TO, each a year or an ISO 8601 "
                        "time (e.g. 1970..2200): timestamps outside are dead letters; those outside the years "
                        "1 to 9999 always are")
    m.add_argument("--engine", choices=("auto", "columnar", "events"), default="auto",
                   help="columnar: the batch job's vectorised stages on each watched file's or replay step's "
                        "columns (--watch, --replay; the local runner, fixed windows, judgments read at the start, clicks in the impression "
                        "records); events: one event at a time (every source and window); auto (default): "
                        "columnar where it applies, saying why when it does not")
    m.add_argument("--request-shards", type=int, default=None,
                   help="keyed states holding the open requests: 0 keys them by request id (each element reads "
                        "and writes only its requests' state); default 16 on the local runner, 0 on others")

    o = p.add_argument_group("output")
    o.add_argument("--output", default=None, help="directory for the windowed files (none: console only)")
    o.add_argument("--quiet", action="store_true",
                   help="do not print the panes nor the progress line on stderr (records read, rows emitted, rate)")
    o.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                   help="seconds between progress lines on stderr (default 5)")
    o.add_argument("--report-every", type=float, default=60.0, metavar="SECONDS",
                   help="on other runners than the local one: print the running totals of the job's counters "
                        "this often while it runs (default 60)")
    o.add_argument("--runner", default=None,
                   help="Beam runner (default BundleBasedDirectRunner for --replay; e.g. DataflowRunner, "
                        "FlinkRunner, PrismRunner)")
    add_input_check_arguments(p)
    return p


def _split_window_arg(args) -> None:
    """``--window`` written as the library writes a window (:meth:`WindowSpec.parse`): ``1h/10m`` is
    ``--window 1h --every 10m``, ``session:30m`` is ``--sessions 30m`` and ``session:30m/request``
    adds ``--session-key request``. Rewrites ``args`` in place (so every later check sees one form);
    raises ValueError when the two forms are mixed."""
    text = str(args.window or "").strip().lower()
    if text.startswith(("session:", "sessions:")):
        if args.sessions or args.every:
            raise ValueError(f"--window {args.window} is a session window: it excludes --sessions / --every")
        gap, _, by = text.split(":", 1)[1].partition("/")
        args.window, args.sessions = None, gap
        if by:
            if by not in ("user", "request"):
                raise ValueError(f"sessions are per 'user' or per 'request', got {by!r} in --window {text}")
            args.session_key = by
    elif "/" in text:
        if args.every:
            raise ValueError(f"--window {args.window} names its period: it excludes --every")
        args.window, args.every = text.split("/", 1)


def _window_spec(args) -> WindowSpec:
    _split_window_arg(args)
    if args.sessions:
        if args.window or args.every:
            raise ValueError("--sessions excludes --window / --every")
        return WindowSpec.sessions(args.sessions, by=args.session_key)
    if not args.window:
        raise ValueError("give --window SIZE (with --every PERIOD for sliding windows) or --sessions GAP")
    return WindowSpec.sliding(args.window, args.every) if args.every else WindowSpec.fixed(args.window)


def _runner(args) -> str | None:
    """``--runner``, or the local streaming runner for ``--replay`` and ``--watch`` (None otherwise)."""
    return args.runner or ("BundleBasedDirectRunner" if args.replay or args.watch else None)


def _on_local_runner(args) -> bool:
    return _runner(args) in LOCAL_STREAM_RUNNERS


def _request_shards(args) -> int:
    """``--request-shards``, or its default: 16 on the local runner (it pays per key in every bundle),
    0 (one key per request) on distributed runners."""
    if args.request_shards is not None:
        return args.request_shards
    return 16 if _on_local_runner(args) else 0


def _live_watch(args) -> bool:
    """``--watch`` on the local streaming runner: the live TestStream source (:class:`WatchFiles`)."""
    return bool(args.watch) and _on_local_runner(args)


def columnar_refusal(args) -> str | None:
    """Why the columnar streaming engine cannot run this job (None: it can)."""
    if not (_live_watch(args) or (args.replay and _on_local_runner(args))):
        return "the columnar engine reads --watch and --replay on the local runner only"
    if args.every or args.sessions:
        return "the columnar engine has fixed windows only"
    if args.clicks:
        return "click events (--clicks) need the per-event engine (the columnar one reads the impressions' clicked field)"
    if args.intervals != "fixed":
        return "--intervals anytime needs the per-event engine"
    return None


def _engine(args) -> str:
    """The engine the job runs on: ``columnar`` or ``events`` (``--engine``; ``auto`` picks columnar
    where it applies, else ``args.engine_note`` says why, for --watch and --replay). Raises ValueError for
    ``--engine columnar`` on a job it cannot run."""
    why = columnar_refusal(args)
    if args.engine == "columnar" and why:
        raise ValueError(f"--engine columnar: {why}")
    needs = ([f"online metrics ({', '.join(args.online_names)})"] if getattr(args, "online_names", None) else []) + \
        (["--ci bootstrap"] if getattr(args, "ci", "t") == "bootstrap" else [])
    if needs and (why or args.engine == "events"):
        raise ValueError(f"{' and '.join(needs)} need the columnar engine: "
                         f"{why or 'not --engine events'}")
    if args.engine == "events":
        return "events"
    if why is None:
        return "columnar"
    if args.engine == "auto" and (args.watch or args.replay):
        args.engine_note = f"note: the per-event engine runs this job: {why}"  # printed once the job starts
    return "events"


def _sources(p, args, paths):
    """({kind: PCollection or None}, replay or live source or None)"""
    if getattr(args, "engine_used", None) == "columnar" and args.replay:
        rep = ReplayColumns(paths["impressions"], step=args.replay_step, pace=args.replay_pace)
        out = p | "Replay" >> rep
        return {"impressions": out, "judgments": None, "clicks": None}, rep
    if getattr(args, "engine_used", None) == "columnar":
        live = WatchFiles({"impressions": paths["impressions"]}, interval=args.watch_interval or 1.0,
                          delay=args.watch_delay, idle_stop=args.watch_idle_stop, columnar=True,
                          max_pending=1_000_000)
        out = p | "Watch" >> live
        return {"impressions": out["impressions"], "judgments": None, "clicks": None, "watchers": [live]}, live
    if args.replay:
        rep = ReplayAvro(paths["impressions"], paths["judgments"], paths["clicks"], step=args.replay_step,
                         pace=args.replay_pace)
        out = p | "Replay" >> rep
        return {k: out[k] if (paths[k]) else None for k in KINDS}, rep
    if _live_watch(args):
        live = WatchFiles(paths, interval=args.watch_interval or 1.0, delay=args.watch_delay,
                          idle_stop=args.watch_idle_stop)
        out = p | "Watch" >> live
        srcs = {k: out[k] if paths[k] else None for k in KINDS}
        srcs["watchers"] = [live]
        return srcs, live
    out = {"watchers": []}
    for k in KINDS:
        ps, topic = getattr(args, f"pubsub_{k}"), getattr(args, f"kafka_{k}")
        if args.watch and args.__dict__[k]:
            watchers = [WatchAvro(pat, k, args.watch_interval or 10.0) for pat in args.__dict__[k]]
            out["watchers"].extend(watchers)
            pcs = [p | f"Watch{k.title()}{i}" >> w for i, w in enumerate(watchers)]
            out[k] = pcs[0] if len(pcs) == 1 else pcs | f"All{k.title()}" >> beam.Flatten()
        elif ps:
            out[k] = p | f"PubSub{k.title()}" >> ReadPubSubEvents(ps, args.pubsub_timestamp_attribute)
        elif topic:
            out[k] = p | f"Kafka{k.title()}" >> ReadKafkaEvents(args.kafka_bootstrap, topic,
                                                                expansion_service=args.kafka_expansion_service,
                                                                timestamp_policy=args.kafka_timestamp_policy)
        else:
            out[k] = None
    return out, None


def _source_labels(args) -> dict:
    """The dead-letter ``source`` of each kind's records that do not come from a file (file sources
    name the file): the Pub/Sub subscription or topic, the Kafka topic."""
    labels = {}
    for k in KINDS:
        ps, topic = getattr(args, f"pubsub_{k}", None), getattr(args, f"kafka_{k}", None)
        labels[k] = ps or (f"kafka:{topic}" if topic else k)
    return labels


def build_pipeline(p, args, paths):
    """Add the job to ``p``: returns (StreamMetrics transform, rows, replay source or None)."""
    spec = _window_spec(args)
    srcs, rep = _sources(p, args, paths)
    if srcs["impressions"] is None:
        raise ValueError("no impressions source")
    columnar = getattr(args, "engine_used", None) == "columnar"
    if columnar:
        judgment_paths = expand_inputs(paths["judgments"]) if paths["judgments"] else []
        ranking = bool(judgment_paths)
        make, first = ColumnarStreamMetrics, judgment_paths or None
    else:
        ranking = srcs["judgments"] is not None
        make, first = StreamMetrics, srcs["judgments"]
    sm = make(
        first, ((split_metrics(args.metrics) if ranking else args.online_names) if columnar
                else split_metric_names(args.metrics)[0]) or None,
        window=spec,
        slices=_slices_from_args(args.slices), clicks=srcs["clicks"], early_every=args.early_every,
        early_count=args.early_count, allowed_lateness=args.allowed_lateness, retention=args.retention,
        attribution_delay=args.attribution_delay, relevance_level=args.relevance_level, gain=args.gain,
        ideal=args.ideal, err_max_grade=args.err_max_grade, order=args.order, tie_break=args.tie_break,
        depth=args.depth, score_precision=args.score_precision, ctr=not args.no_ctr,
        request_shards=(args.request_shards or COLUMNAR_SHARDS) if columnar else _request_shards(args), clock=replay_clock if args.replay or _live_watch(args) else None,
        source=_source_labels(args), judgment_conflicts=args.judgment_conflicts,
        grade_range=_grades(args.grades), time_range=parse_time_range(args.event_time_range),
        ci_level=args.ci_level, intervals=args.intervals,
        **(dict(ci=args.ci, replicates=args.replicates, ci_seed=args.ci_seed, hist_bins=args.hist_bins,
                hist_range=hist_range(args.hist_range)) if columnar else {}))
    rows = srcs["impressions"] | "StreamMetrics" >> sm
    ranking_names = split_metric_names(args.metrics)[0]
    names = [s.name for s in parse_metrics(ranking_names, arithmetic="the Beam jobs")] if ranking and ranking_names else []
    me = sys.modules.get("pipelines.stream") or __import__("pipelines.stream", fromlist=["_"])
    # running totals after each pane: this process's counts are the whole job's on the local runner only
    # (other runners: wait_reporting prints the job's counters from the launcher)
    local = _on_local_runner(args)
    totals = os.path.join(args.output, RUNNING_TOTALS) if local and args.output and "://" not in args.output else None
    if totals and os.path.exists(totals):
        os.remove(totals)
    sm.panes | "Console" >> beam.ParDo(me._PanesOut(names, args.quiet, sm.cfg.run if local else None, totals))
    side = [sm.side]
    if isinstance(rep, (ReplayAvro, ReplayColumns)) and rep.unreadable:
        side.append(p | "UnreadableFiles" >> beam.Create(rep.unreadable))
    side.extend(w.unreadable for w in srcs.get("watchers", []))
    side = side[0] if len(side) == 1 else tuple(side) | "AllSideRecords" >> beam.Flatten()
    side | "SideRecords" >> beam.ParDo(me._SideOut(args.output, "side"))
    if args.output:
        sm.panes | "WritePanes" >> WriteWindowedFiles(args.output)
    if args.prometheus_port is not None:
        sm.panes | "Prometheus" >> beam.Map(_export_pane)
    if getattr(args, "alert_rules", None):
        alerts = sm.panes | "Alerts" >> StreamAlerts(args.alert_rules)
        alerts | "PrintAlerts" >> beam.Map(_print_alert)
        if args.output:
            alerts | "WriteAlerts" >> WriteRecords(args.output, "alerts")
    return sm, rows, rep


def _export_pane(rows):
    """A pane's rows into the store the Prometheus endpoint serves (this process: the local runner)."""
    for r in rows if isinstance(rows, list) else [rows]:
        PROMETHEUS.update(r)


def _print_alert(a):
    """One ``ALERT`` line on stdout as an alert fires (the local runner's process)."""
    _count("alerts_printed")
    print(format_alert(a), flush=True)


def _summary_line(c: dict, replayed: dict, local: dict, verb: str = "replayed") -> str:
    """The one-line summary: records replayed, panes, late data, unmatched clicks, invalid records
    (``c``: the record counts; ``local``: what the command's own steps counted)."""
    invalid = sum(v for k, v in c.items() if k.startswith("rejected:"))
    parts = []
    if replayed:
        parts.append(f"{verb} {replayed.get('impressions', 0)} impression, {replayed.get('judgments', 0)} judgment "
                     f"and {replayed.get('clicks', 0)} click records")
    panes = {**c, **local}
    parts.append("panes: " + ", ".join(f"{panes.get(f'panes_{p}', 0)} {p}" for p in ("early", "on_time", "late"))
                 + f" ({panes.get('panes_final', 0)} final)")
    late = {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("late:") and v}
    if c.get("judgment_late_notices"):
        late["judgment (applied to open windows)"] = c["judgment_late_notices"]
    parts.append("late data: " + (", ".join(f"{v} {k}" for k, v in sorted(late.items())) or "none"))
    parts.append(f"{c.get('rejected:click:' + REASON_CLICK_UNMATCHED, 0)} click events matched no impression")
    parts.append(f"{invalid} invalid records")
    return "; ".join(parts)


def check_outputs(counts: dict, local: dict, replayed: dict | None) -> list[str]:
    """Identities between the record counts of StreamMetrics and what the command saw on the
    outputs (local runner): records replayed = records read; late records written = ``late:<kind>``;
    dead letters written = records rejected."""
    problems = []
    for kind in (replayed or {}):
        name = f"{kind}_read"
        if replayed[kind] != counts.get(name, 0):
            problems.append(f"{kind}: replayed {replayed[kind]} records but {name} is {counts.get(name, 0)}")
    for kind in ("impression", "click"):
        got, want = local.get(f"written:late:{kind}", 0), counts.get(f"late:{kind}", 0)
        if got != want:
            problems.append(f"late {kind}s: {got} written to the late-data output, {want} counted late")
    rejected = sum(v for k, v in counts.items() if k.startswith("rejected:"))
    if local.get("written:rejected", 0) != rejected:
        problems.append(f"dead letters: {local.get('written:rejected', 0)} written, {rejected} records rejected")
    return problems


def wait_reporting(result, every: float, out=None, sleep=time.sleep):
    """Waits for a job on another runner (an unbounded one may never end), printing the running
    totals of its Beam counters (:func:`running_totals_line`) every ``every`` seconds; returns the
    final state."""
    from apache_beam.runners.runner import PipelineState

    out = out or sys.stdout
    while not PipelineState.is_terminal(result.state):
        sleep(every)
        try:
            counters = job_counters(result)
        except Exception as e:  # noqa: BLE001 - a runner that cannot report metrics while running
            counters, note = {}, f" (metrics unavailable: {type(e).__name__})"
        else:
            note = ""
        out.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {result.state}: "
                  f"{running_totals_line(counters)}{note}\n")
        out.flush()
    return result.wait_until_finish()


def main(argv=None) -> int:
    parser = build_arg_parser()
    args, beam_args = parser.parse_known_args(argv)
    try:
        set_file_system_options(PipelineOptions(beam_args))  # before any remote file is matched
        _window_spec(args)
        if args.replay + args.watch > 1:
            raise ValueError("--replay and --watch exclude each other")
        parse_duration(args.allowed_lateness, "--allowed-lateness", allow_zero=True)
        parse_duration(args.attribution_delay, "--attribution-delay", allow_zero=True)
        if args.retention is not None:
            parse_duration(args.retention, "--retention")
        args.alert_rules = load_rules(args.alerts) if args.alerts else None
        if args.prometheus_port is not None and not 0 <= args.prometheus_port <= 65535:
            raise ValueError(f"--prometheus-port must be 0..65535, got {args.prometheus_port}")
        if not (0 <= args.prometheus_linger <= 86400):  # also NaN
            raise ValueError(f"--prometheus-linger must be 0..86400 seconds, got {args.prometheus_linger}")
        if args.prometheus_port is not None and not _on_local_runner(args):
            raise ValueError("--prometheus-port serves from the launcher's process: the local runner only "
                             f"(got --runner {args.runner})")
        if not 0 < args.ci_level < 1:
            raise ValueError(f"--ci-level must be in (0, 1), got {args.ci_level}")
        if not 0 < args.progress_interval <= 86400:  # also NaN
            raise ValueError(f"--progress-interval must be a number of seconds in (0, 86400], got {args.progress_interval}")
        if args.early_every:
            parse_duration(args.early_every, "--early-every")
        _slices_from_args(args.slices)
        _grades(args.grades)
        parse_time_range(args.event_time_range)
        ranking_names, online_names = split_metric_names(args.metrics)
        if ranking_names and (args.judgments or any(getattr(args, f"{s}_judgments") for s in ("pubsub", "kafka"))):
            parse_metrics(ranking_names, arithmetic="the Beam jobs")
        check_bootstrap_arguments(args)
        hist_range(args.hist_range)
        args.online_names = [n for n in online_names if parse_online_metric(n).family != "ctr"]
        if args.online_names:
            why = online_refusal(args.online_names)
            if why:
                raise ValueError(why)
        paths = {k: [] for k in KINDS}
        if args.replay:
            if not args.impressions:
                raise ValueError("--replay needs --impressions")
            paths = {k: expand_inputs(getattr(args, k)) if getattr(args, k) else [] for k in KINDS}
        elif args.watch:
            paths = {k: list(getattr(args, k)) for k in KINDS}
        elif not (args.pubsub_impressions or args.kafka_impressions):
            raise ValueError("choose a source: --replay, --watch, --pubsub-impressions or --kafka-impressions")
        if any(getattr(args, f"kafka_{k}") for k in KINDS) and not args.kafka_bootstrap:
            raise ValueError("Kafka topics need --kafka-bootstrap")
        checks = input_checks_from_args(args)
        err_auto = parse_err_max_grade(args.err_max_grade) is None
        args.err_max_grade = parse_err_max_grade(args.err_max_grade) or GDEVAL_ERR_MAX_GRADE
        if err_auto and args.replay and paths["judgments"]:
            args.err_max_grade = auto_err_max_grade(
                parse_metrics(ranking_names, arithmetic="the Beam jobs") if ranking_names else [],
                paths["judgments"], _grades(args.grades))
        args.engine_used = _engine(args)
    except (ValueError, TypeError, MetricNameError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2

    runner = _runner(args)
    if runner is None:
        print("error: name a streaming runner with --runner (e.g. DataflowRunner, FlinkRunner, PrismRunner)",
              file=sys.stderr)
        return 2
    options = PipelineOptions(["--runner", runner, *beam_args])
    options.view_as(StandardOptions).streaming = True
    try:
        p = make_pipeline(options)
        if args.output:  # a previous run's panes, manifest and temporary files go first: no mix of two runs
            args.output = prepare_output(args.output, OUTPUTS)
    except Exception as e:  # noqa: BLE001 (the runner's name; the output's file system: a file in the way, permission)
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if getattr(args, "engine_note", None):
        print(args.engine_note, file=sys.stderr)
    if _on_local_runner(args):
        from streameval.beam import local_runner

        local_runner.install()  # the local runner's per-bundle inspection of each DoFn, memoised
    me = sys.modules.get("pipelines.stream") or __import__("pipelines.stream", fromlist=["_"])
    local, unreadable = me.LOCAL_COUNTS, me.LOCAL_UNREADABLE
    local.clear()
    unreadable.clear()
    me.PANE_LOG.clear()
    try:
        sm, _, rep = build_pipeline(p, args, paths)
    except (ValueError, TypeError) as e:  # an option a transform refuses (each checks its own)
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    exporter = None
    if args.prometheus_port is not None:
        PROMETHEUS.clear()
        try:
            exporter = serve(args.prometheus_port)
        except (OSError, ImportError) as e:
            print(f"error: --prometheus-port {args.prometheus_port}: {one_line(e)}", file=sys.stderr)
            return 2
        print(f"serving the latest values on http://127.0.0.1:{exporter.port}/metrics (Prometheus)")
    try:
        return _run(p, args, paths, sm, rep, exporter, checks, runner, start)
    finally:
        if exporter is not None:
            exporter.close()


def _run(p, args, paths, sm, rep, exporter, checks, runner, start) -> int:
    """The job's run and report (``main``'s second half; ``exporter``: the Prometheus endpoint or None)."""
    me = sys.modules.get("pipelines.stream") or __import__("pipelines.stream", fromlist=["_"])
    local, unreadable = me.LOCAL_COUNTS, me.LOCAL_UNREADABLE
    live = rep if isinstance(rep, WatchFiles) else None
    handlers = {}
    if live is not None and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop watching: every window closes, the job reports
            handlers[sig] = signal.signal(sig, lambda *_: live.watcher.stop())
    run_id = getattr(getattr(sm, "cfg", None), "run", None)

    def records_read():
        counts = stream_counts(run_id) if run_id else {}
        return sum(v for k, v in counts.items() if k.endswith("s_read"))

    # records read and rows emitted so far (this process's: the local runner's), on stderr every few
    # seconds and at the end; off with --quiet
    line = progress.ProgressLine("streameval stream", read=records_read,
                                 written=lambda: progress.counts().get("stream_rows", 0),
                                 interval=args.progress_interval, enable=not args.quiet).start()
    try:
        result = p.run()
        in_process = _on_local_runner(args)
        state = result.wait_until_finish() if in_process else wait_reporting(result, args.report_every)
    except Exception as e:  # noqa: BLE001 - the runner's error, reported in one line
        line.enable = False
        line.stop()
        print(f"error: the job failed: {failure_reason(e)}", file=sys.stderr)
        if args.output:
            remove_temporary(args.output)  # no manifest: the directory reads as incomplete
        return 1
    finally:
        if live is not None:
            live.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if live is not None and live.watcher.error is not None:
        line.enable = False
        line.stop()
        print(f"error: the job failed: {failure_reason(live.watcher.error)}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - start
    counters = job_counters(result)
    if not _on_local_runner(args):  # the workers' counts: the job's counters
        line.read = lambda: sum(v for k, v in counters.items() if k.endswith("s_read"))
    line.stop()
    progress.add("stream_rows", -progress.counts().get("stream_rows", 0))  # the next run in this process starts at 0
    replayed = rep.counts if rep is not None else {}
    # the local runner reports Beam counters of a step's first bundle only: count in this process
    counts = sm.counts() if in_process else counters
    local_seen = dict(local)
    accounting, problems = sm.accounting(unreadable=sorted(unreadable), counts=counts)
    checked = {k: v for k, v in replayed.items() if paths[k]}
    if getattr(args, "engine_used", None) == "columnar" and paths["judgments"]:
        # the columnar engine reads the judgments when it starts (not through the watcher)
        checked.pop("judgments", None)
        replayed = {**replayed, "judgments": counts.get("judgments_read", 0)}
    if in_process:
        problems += check_outputs(counts, local_seen, checked)
    failed_checks = check_inputs(accounting, checks, judgments=sm.cfg.ranking,
                                 inputs=paths.get("impressions") or [])
    line = _summary_line(counts, replayed, local_seen if in_process else {}, "read" if live else "replayed")
    print(line)
    print(format_accounting(accounting))
    if args.output:
        summary = {"state": str(state), "wall_seconds": round(wall, 3), "runner": runner,
                   "window": sm.cfg.spec.describe(), "allowed_lateness": args.allowed_lateness, "retention": args.retention, "ci_level": args.ci_level, "intervals": args.intervals,
                   "early_every": args.early_every, "early_count": args.early_count,
                   "judgment_conflicts": args.judgment_conflicts, "grades": args.grades, "inputs": paths,
                   "replayed": replayed, "counts": dict(sorted(counts.items())),
                   "counters": dict(sorted(counters.items())), "counted_here": dict(sorted(local_seen.items())),
                   "accounting": accounting, "accounting_problems": problems,
                   "input_checks_failed": failed_checks, "summary": line}
        try:
            with FileSystems.create(FileSystems.join(args.output, "summary.json")) as fo:
                fo.write(json.dumps(summary, indent=2).encode("utf-8"))
            publish(args.output, OUTPUTS, {"state": str(state), "accounting_problems": problems,
                                           "input_checks_failed": failed_checks})
        except Exception as e:  # noqa: BLE001 (the output's file system: disk full, permission)
            print(f"error: cannot finish the output {args.output}: {one_line(e)}", file=sys.stderr)
            return 1
        print(f"wrote the panes to {args.output} in {wall:.1f} s ({runner})")
    if exporter is not None and args.prometheus_linger:
        # the job ended: every later scrape collects the final values; wait until one was stored
        got = exporter.wait_for_scrape(exporter.mark(), args.prometheus_linger)
        if got == "stored":
            print("prometheus: a scrape stored the final values")
        else:
            print(f"note: prometheus: {'no scrape collected' if got == 'none' else 'no scrape after the one that collected'}"
                  f" the final values within --prometheus-linger {args.prometheus_linger:g} s")
    status = exit_status(problems, failed_checks)
    if args.alert_rules:
        # the local runner's counters cover a step's first bundle only: the alerts printed here
        fired = local_seen.get("alerts_printed", 0) if in_process else counters.get(ALERTS_FIRED, 0)
        print(f"alerts: {fired} fired" + (f" (alerts-*.jsonl in {args.output})" if args.output else ""))
        if status == EXIT_OK and fired:
            return EXIT_ALERT
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
