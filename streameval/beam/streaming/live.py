"""A live file source for Beam's local streaming runner: :class:`WatchFiles` watches patterns for new
Avro files while the pipeline runs and feeds their records to it, with an event-time watermark.

Beam's local streaming runner (``BundleBasedDirectRunner``) has no splittable DoFns, so
``fileio.MatchContinuously`` cannot run on it. It does read a ``TestStream`` whose events come live
from a ``TestStreamService`` over gRPC (``TestStream(endpoint=...)``, the mechanism Beam's
interactive runner uses to feed a running pipeline). :class:`FileWatcher` is such a service's
event reader: it polls the patterns, reads each new file (:func:`streameval.beam.sources.
read_avro_blocks`, the batch job's reader and checks), judgment files first, then impressions and
clicks, each in name order, and sends its records as coarse elements (lists of up to ``chunk``
records of one kind), then the new watermark.

Watermark policy (documented in docs/metrics.md, "Streaming", "Event time and watermarks"): event
time is each record's own ``timestamp`` (int microseconds). A poll's complete files are read in name
order; after them, and only when no matched file is pending (seen but not complete yet: new, or
still growing), the watermark moves to ``max event time of the impressions and clicks read - delay``
(never back). So files copied into the directory in any order (``cp`` of a backlog, newest first)
are all read before the watermark passes their event times, whatever their names: a copy holds
the watermark while it runs (a copier that pauses longer than a poll interval between two files
lets it move; ``delay`` then bounds how far an older file may be behind). A file arriving after
the watermark passed its events' windows (plus the allowed lateness) is late data, as in any stream.
Judgments never move it (their time is when they were made, not when the traffic was). When no new file arrived (and none grew) for ``idle_stop``
seconds the watcher closes every window (watermark to the end of time) and the job ends; without
``idle_stop`` it runs until stopped. Processing time (``replay_clock``, early panes) is the
watcher's wall time since it started.

A file is read once, when it is complete: its size was the same at two successive polls (or write
it elsewhere and rename it into the directory). Names starting with ``.`` or ``_`` are skipped
(temporary files). A file whose bytes are damaged gives the records before the damage and a dead
letter (output ``"unreadable"``); a file the environment does not deliver (permission, network)
stops the watcher: :attr:`FileWatcher.error` holds the
:class:`~streameval.beam.sources.InputUnavailableError`, and the job must fail on it
(:meth:`WatchFiles.raise_error`).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
import grpc
import numpy as np
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.portability.api import beam_interactive_api_pb2_grpc, beam_runner_api_pb2_grpc
from apache_beam.testing.test_stream import ElementEvent, ProcessingTimeEvent, WatermarkEvent
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from ...io import avro, records
from ..sources import read_avro_blocks, unreadable_letter
from . import replay as _replay
from .common import FLUSH
from .polling import SCHEMA_OF, poll
from .replay import END_OF_TIME_US, ms_floor, usable_time
from ...plan.windows import parse_duration

_LOG = logging.getLogger(__name__)

from ..arguments import KINDS  # noqa: E402  (the command line's, Beam-free)
LOG_LENGTH = 100_000  # entries kept of the watcher's logs (files read, watermarks sent)
def ipc_bytes(table) -> bytes:
    """An Arrow table as an IPC stream (the ``("arrow", bytes)`` payload of the columnar engine)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def event_micros(table) -> np.ndarray:
    """The ``timestamp`` column of an Arrow block as int64 microseconds (all rows, usable or not)."""
    ts = table.column("timestamp")
    if pa.types.is_timestamp(ts.type):
        ts = ts.cast(pa.int64())
    return np.asarray(ts.to_numpy(zero_copy_only=False), dtype=np.int64)


#: decoded blocks handed to the pipeline in this process (``("held", key)`` payloads), by key
HELD_BLOCKS: dict = {}
_HELD_KEYS = itertools.count()


def _column_payloads(block):
    """``(payload, records, usable event times)`` of a decoded block: the fallback decoder's record
    lists (``("records", list)``, at most 10,000 each), or an Arrow block kept in this process
    (:data:`HELD_BLOCKS`) and named by the payload (``("held", key)``): the live source runs on the
    local runner, in the pipeline's process, and the TestStream service's gRPC client refuses
    messages over 4 MiB (a 65,536-row block is about 10 MB)."""
    if isinstance(block, list):
        step = 10_000
        for i in range(0, len(block), step):
            recs = block[i:i + step]
            times = np.fromiter((t for t in map(usable_time, recs) if t is not None), dtype=np.int64)
            yield ("records", recs), len(recs), times
        return
    ts = event_micros(block)
    key = f"{os.getpid()}:{next(_HELD_KEYS)}"
    HELD_BLOCKS[key] = block
    yield ("held", key), block.num_rows, ts[(ts >= records.EVENT_TIME_MIN) & (ts <= records.EVENT_TIME_MAX)]


class FileWatcher:
    """The event reader of a live :class:`WatchFiles`: polls ``patterns`` (``{kind: [pattern, ...]}``,
    kinds ``impressions``, ``judgments``, ``clicks``; local or remote, matched with Beam's
    FileSystems) every ``interval`` seconds and yields ``TestStream`` events: one element per chunk of
    at most ``chunk`` records of one file (``(kind, records, processing seconds)``, timestamped with
    the chunk's earliest event time), ``("unreadable", dead letter, seconds)`` for a damaged file,
    then the watermark and the processing time (see the module's policy: it moves after a poll in
    which no matched file is pending, :attr:`held_polls` counts the polls it was held). ``delay``:
    microseconds the watermark stays behind the latest event time read. ``idle_stop``: seconds without a new
    or growing file after which the watcher ends (None: never). ``clock``, ``sleep``: wall time (tests pass
    their own). Back pressure: with ``max_pending`` and ``received`` (a function giving the records
    the pipeline received so far), the watcher waits while more than ``max_pending`` records sent
    were not received, so what is in flight stays bounded whatever the backlog of files.

    Counters for the job's accounting: :attr:`records` (records sent, by kind), :attr:`files`
    (the latest paths read, in order), :attr:`watermark_us` and :attr:`watermark_log` (``(clock, micros)`` of
    each watermark sent); :attr:`error`: the environment error that stopped the watcher, or None."""

    def __init__(self, patterns: dict, interval: float = 1.0, delay: int = 0, idle_stop: float | None = None,
                 chunk: int = 10_000, clock=time.monotonic, sleep=time.sleep, max_pending: int | None = None,
                 received=None, columnar: bool = False):
        unknown = set(patterns) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}: use {KINDS}")
        if interval <= 0:
            raise ValueError("interval must be positive")
        if chunk < 1:
            raise ValueError("chunk must be positive")
        self.patterns = {k: list(v) for k, v in patterns.items() if v}
        self.interval = float(interval)
        self.delay = int(delay)
        self.idle_stop = None if idle_stop is None else float(idle_stop)
        self.chunk = int(chunk)
        #: send impression files as column blocks (ColumnarStreamMetrics's input) instead of records
        self.columnar = bool(columnar)
        self._clock = clock
        self._sleep = sleep
        self.records = {k: 0 for k in KINDS}
        self.files: deque = deque(maxlen=LOG_LENGTH)  # the latest paths read, in order
        self.error: BaseException | None = None
        self.watermark_us: int | None = None
        self.watermark_log: deque = deque(maxlen=LOG_LENGTH)  # (clock time, micros) of the latest watermarks
        self.sent = 0  # records sent
        self.first_sent_at = None  # clock time of the first record sent
        self.max_pending = None if max_pending is None else int(max_pending)
        self.received = received
        self._start = clock()
        self._sent_ms = 0
        self._sizes: dict = {}  # path -> size at the last poll (not read yet)
        self._done: set = set()
        self._max_event: int | None = None
        self._min_block: int | None = None  # the earliest timestamp of a block sent (micros, ms-floored)
        #: polls after which the watermark stayed where it was because a matched file was pending
        self.held_polls = 0
        self.stopped = threading.Event()

    # ----------------------------------------------------------------------------------------
    def _ready_files(self) -> list:
        """``(kind, path)`` of the files complete since the last poll: judgments, impressions, clicks,
        each in name order (:func:`streameval.beam.streaming.polling.poll`)."""
        found = poll(self.patterns, self._done, self._sizes)
        self._sizes, self._done = found.sizes, found.done
        return found.ready

    def _advance(self):
        """The processing-time event up to now (None when less than a millisecond passed)."""
        now_ms = int((self._clock() - self._start) * 1000)
        if now_ms <= self._sent_ms:
            return None
        event = ProcessingTimeEvent(Duration(micros=(now_ms - self._sent_ms) * 1000))
        self._sent_ms = now_ms
        return event

    def _wait_for_room(self):
        """Back pressure: while more than ``max_pending`` records sent are not yet received by the
        pipeline, wait (sending the processing time every second: the runner's heartbeat)."""
        if self.max_pending is None or self.received is None:
            return
        beat = self._clock()
        while self.sent - self.received() > self.max_pending and not self.stopped.is_set():
            self._sleep(0.02)
            if self._clock() - beat >= 1.0:
                beat = self._clock()
                event = self._advance()
                if event is not None:
                    yield event

    def _column_events(self, kind, path):
        """Columnar mode: one element per block of the file, ``(kind, (path, ("held", key) |
        ("records", list), records, watermark sent before it), seconds)``, timestamped with the block's earliest usable
        event time."""
        n = 0
        try:
            for block in read_avro_blocks(path, SCHEMA_OF[kind], "datafusion"):
                for payload, size, times in _column_payloads(block):
                    yield from self._wait_for_room()
                    n += size
                    self.records[kind] += size
                    self.sent += size
                    if self.first_sent_at is None:
                        self.first_sent_at = self._clock()
                    if len(times):
                        top = int(times.max())
                        self._max_event = top if self._max_event is None else max(self._max_event, top)
                    t0 = int(times.min()) if len(times) else 0
                    self._min_block = ms_floor(t0) if self._min_block is None else min(self._min_block, ms_floor(t0))
                    yield ElementEvent([TimestampedValue((kind, (str(path), payload, size, self.watermark_us),
                                                          self._sent_ms / 1000), Timestamp(micros=ms_floor(t0)))])
        except avro.AvroInputError as e:  # damaged bytes: the records before the damage and a dead letter
            yield ElementEvent([TimestampedValue(("unreadable", unreadable_letter(path, kind, e, n),
                                                  self._sent_ms / 1000), Timestamp(micros=0))])

    def _file_events(self, kind, path):
        if self.columnar:
            yield from self._column_events(kind, path)
            return
        n = 0
        try:
            for block in read_avro_blocks(path, SCHEMA_OF[kind]):
                for i in range(0, len(block), self.chunk):
                    recs = block[i:i + self.chunk]
                    yield from self._wait_for_room()
                    times = [t for t in map(usable_time, recs) if t is not None]
                    n += len(recs)
                    self.records[kind] += len(recs)
                    self.sent += len(recs)
                    if self.first_sent_at is None:
                        self.first_sent_at = self._clock()
                    if times and kind != "judgments":  # judgments never move the watermark
                        top = max(times)
                        self._max_event = top if self._max_event is None else max(self._max_event, top)
                    t0 = min(times, default=0)
                    yield ElementEvent([TimestampedValue((kind, (str(path), recs), self._sent_ms / 1000),
                                                         Timestamp(micros=ms_floor(t0)))])
        except avro.AvroInputError as e:  # damaged bytes: the records before the damage and a dead letter
            yield ElementEvent([TimestampedValue(("unreadable", unreadable_letter(path, kind, e, n),
                                                  self._sent_ms / 1000), Timestamp(micros=0))])

    def _watermark(self, us: int):
        """The events that move the watermark to ``us``: in columnar mode the flush of ``us`` first
        (:data:`~.common.FLUSH`: the engine's shards score the windows ending by then once), stamped
        with the watermark it follows."""
        if self.columnar:  # stamped below the end of every window it closes: the watermark it follows, or
            # before the first move the earliest block's time
            at = self.watermark_us if self.watermark_us is not None else (self._min_block or 0)
            yield ElementEvent([TimestampedValue(("impressions", (None, (FLUSH, None), 0, us), self._sent_ms / 1000),
                                                 Timestamp(micros=at))])
        self.watermark_us = us
        self.watermark_log.append((self._clock(), us))
        yield WatermarkEvent(Timestamp(micros=us))

    def events(self):
        """The ``TestStream`` events (Python objects) of the live stream, until ``idle_stop`` or
        :meth:`stop`."""
        self._start = self._clock()
        self._sent_ms = 0  # processing time sent so far, milliseconds
        last_new = self._start
        while not self.stopped.is_set():
            try:
                ready = self._ready_files()
                for kind, path in ready:
                    yield from self._file_events(kind, path)
                    self._done.add(path)
                    self.files.append(path)
                # the watermark moves after the poll's files were read, and only when no matched file is
                # pending (new or still growing): files copied in any order (a newer one first, an older
                # one still being written) are read before it passes their event times
                if self._max_event is not None and not self._sizes:
                    wm = ms_floor(self._max_event - self.delay)
                    if self.watermark_us is None or wm > self.watermark_us:
                        yield from self._watermark(wm)
                elif self._sizes:
                    self.held_polls += 1
            except Exception as e:  # the environment does not deliver a file: stop, the job fails
                self.error = e
                _LOG.error("watching stopped: %s", e)
                return
            if ready or self._sizes:  # a file still being written is activity too
                last_new = self._clock()
            event = self._advance()  # also a heartbeat: the runner gives up on a silent service after 30 s
            if event is not None:
                yield event
            if self.idle_stop is not None and self._clock() - last_new >= self.idle_stop:
                break
            self._sleep(self.interval)
        yield from self._watermark(END_OF_TIME_US)

    def stop(self) -> None:
        """Ends the stream at the next poll (every window closes, the job finishes)."""
        self.stopped.set()


def _decoded_micros():
    """Microseconds the runner's decoder makes of 1 in each time field of a TestStream event
    proto (``element``, ``watermark``, ``advance``). The proto says milliseconds, and Beam's encoder
    (``Event.to_runner_api``) sends milliseconds, but the local runner's decoder (2.5x to at least
    2.77: ``_TestStream.test_stream_payload_to_events``) reads microseconds; measured here rather
    than assumed, so the events stay right when either side changes."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners.direct.test_stream_impl import _TestStream

    ev = beam_runner_api_pb2.TestStreamPayload.Event
    coder = FastPrimitivesCoder()
    probe = {
        "element": ev(element_event=ev.AddElements(elements=[
            beam_runner_api_pb2.TestStreamPayload.TimestampedElement(encoded_element=coder.encode(0), timestamp=1)])),
        "watermark": ev(watermark_event=ev.AdvanceWatermark(new_watermark=1)),
        "advance": ev(processing_time_event=ev.AdvanceProcessingTime(advance_duration=1)),
    }
    out = {}
    for name, proto in probe.items():
        e = _TestStream.test_stream_payload_to_events(proto, coder)
        out[name] = (e.timestamped_values[0].timestamp.micros if name == "element" else
                     e.new_watermark.micros if name == "watermark" else e.advance_by.micros)
    return out


def _to_proto(event, coder, unit: dict):
    """A TestStream event as the proto the local runner's decoder turns back into the same event
    (``unit``: :func:`_decoded_micros`)."""
    from apache_beam.portability.api import beam_runner_api_pb2

    ev = beam_runner_api_pb2.TestStreamPayload.Event
    if isinstance(event, ElementEvent):
        return ev(element_event=ev.AddElements(tag="None", elements=[
            beam_runner_api_pb2.TestStreamPayload.TimestampedElement(
                encoded_element=coder.encode(tv.value), timestamp=tv.timestamp.micros // unit["element"])
            for tv in event.timestamped_values]))
    if isinstance(event, WatermarkEvent):
        return ev(watermark_event=ev.AdvanceWatermark(tag="None",
                                                      new_watermark=event.new_watermark.micros // unit["watermark"]))
    return ev(processing_time_event=ev.AdvanceProcessingTime(advance_duration=event.advance_by.micros // unit["advance"]))


#: the TestStream service's gRPC module: beam_interactive_api's since Beam 2.7x, beam_runner_api's before (2.62)
_TEST_STREAM_GRPC = (beam_interactive_api_pb2_grpc
                     if hasattr(beam_interactive_api_pb2_grpc, "TestStreamServiceServicer") else beam_runner_api_pb2_grpc)


class _Service(_TEST_STREAM_GRPC.TestStreamServiceServicer):
    """A TestStreamService on 127.0.0.1 serving one stream of a :class:`FileWatcher`."""

    def __init__(self, watcher: FileWatcher, coder):
        self.watcher = watcher
        self.coder = coder
        self.unit = _decoded_micros()
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        _TEST_STREAM_GRPC.add_TestStreamServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{port}"
        self.server.start()

    def Events(self, request, context):
        for event in self.watcher.events():
            if not context.is_active():
                self.watcher.stop()
                return
            yield _to_proto(event, self.coder, self.unit)

    def stop(self):
        self.server.stop(0)


# records received by the pipeline, per live source (the local runner runs in this process)
_RECEIVED: dict = {}


class _Fanout(beam.DoFn):
    def __init__(self, token: str):
        self.token = token

    def process(self, element):
        kind, payload, ptime = element
        _replay._REPLAY_NOW[0] = float(ptime)
        if kind in KINDS:  # payload: (path, records), or (path, block, records, watermark) (columnar)
            n = payload[2] if len(payload) == 4 else len(payload[1])
            _RECEIVED[self.token] = _RECEIVED.get(self.token, 0) + n
        yield pvalue.TaggedOutput(kind, payload)


class WatchFiles(beam.PTransform):
    """``p | WatchFiles({"impressions": [pattern], "judgments": [...], "clicks": [...]}, ...)``: new
    Avro files as they appear, while the pipeline runs, on Beam's local streaming runner
    (``BundleBasedDirectRunner``, ``streaming=True``). Returns ``{"impressions", "judgments",
    "clicks", "unreadable"}``: lists of records timestamped with their earliest event time, and one
    dead letter per damaged file. Arguments as :class:`FileWatcher` (``delay``: a duration such as
    ``"5m"``; ``max_pending``: records in flight before the watcher waits for the pipeline); use ``StreamMetrics(clock=replay_clock)`` for early panes by processing time.

    The gRPC service that feeds the runner starts when the transform is applied; call :meth:`close`
    after the pipeline finished and :meth:`raise_error` to fail the job when a file could not be
    read (the runner itself ends the stream as if it were complete)."""

    def __init__(self, patterns: dict, interval: float = 1.0, delay="0", idle_stop: float | None = None,
                 chunk: int = 10_000, max_pending: int | None = 40_000, label=None, columnar: bool = False):
        super().__init__(label)
        self.token = uuid.uuid4().hex
        #: columnar mode: a flush precedes each move of the watermark (give the engine ``flushes=True``)
        self.flushes = bool(columnar)
        self.watcher = FileWatcher(patterns, interval=interval,
                                   delay=parse_duration(delay, "delay", allow_zero=True), idle_stop=idle_stop,
                                   chunk=chunk, max_pending=max_pending,
                                   received=lambda: _RECEIVED.get(self.token, 0), columnar=columnar)
        self.service = None
        self.unreadable = None

    @property
    def counts(self) -> dict:
        """Records sent so far, by kind."""
        return dict(self.watcher.records)

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream

        coder = FastPrimitivesCoder()
        self.service = _Service(self.watcher, coder)
        out = (pbegin
               | "Live" >> TestStream(coder=coder, endpoint=self.service.endpoint)
               | "Fanout" >> beam.ParDo(_Fanout(self.token)).with_outputs(*KINDS, "unreadable"))
        #: dead letters of the files that could not be read to their end
        self.unreadable = out["unreadable"]
        return {k: out[k] for k in (*KINDS, "unreadable")}

    def close(self) -> None:
        """Stops the watcher and its service."""
        self.watcher.stop()
        if self.service is not None:
            self.service.stop()
        _RECEIVED.pop(self.token, None)

    def raise_error(self) -> None:
        """Raises the environment error that stopped the watcher, if any."""
        if self.watcher.error is not None:
            raise self.watcher.error
