"""The replay source: :class:`Replay` plays recorded events in event-time order with a watermark
(a ``TestStream``; run it on the local streaming runner), and :func:`replay_clock` is its
processing time (seconds from the replay's start) for ``StreamMetrics(clock=replay_clock)``.

Record times are integer microseconds since the epoch; ``("watermark", micros)`` steps are
rounded down to milliseconds (a ``TestStream`` keeps milliseconds). An unknown step kind raises
``ValueError`` when the transform is applied.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, defaultdict

import apache_beam as beam
from apache_beam import pvalue
import pickle

from apache_beam.coders import BytesCoder
from apache_beam.coders.coders import LengthPrefixCoder
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP

from ...io import records
from .common import _when
from ...plan.windows import parse_duration

# The replay's processing time. Replay sets it as it plays each step (the local runner's test
# clock advances by the same amounts), so processing-time timers set from it fire in step with
# the replay. Only meaningful when the replay and the pipeline run in one process (local runner).
_REPLAY_NOW = [0.0]


def replay_clock() -> float:
    """The processing time of the running :class:`Replay` (seconds from the replay's start); pass
    ``clock=replay_clock`` to :class:`StreamMetrics` when replaying on the local runner."""
    return _REPLAY_NOW[0]


#: the watermark that closes every window while it is still finite (windows expire at +inf: what
#: fires then would be late for a downstream GroupByKey, e.g. the file writers'); whole milliseconds
END_OF_TIME_US = MAX_TIMESTAMP.micros - MAX_TIMESTAMP.micros % 1000 - 86_400_000_000_000


def usable_time(rec) -> int | None:
    """The event time (micros) of a record that has a usable one (a dict whose ``timestamp`` passes
    :func:`streameval.io.records.check_timestamp`: an integer in the years 1 to 9999), else None.
    Sources stamp elements only with usable times: a record with another timestamp travels on to
    the preparation stage, which makes it a dead letter, instead of crashing the runner (Beam's
    timestamps stop near 2**63 microseconds)."""
    if not isinstance(rec, dict):
        return None
    ts = rec.get("timestamp")
    return int(ts) if ts is not None and records.check_timestamp(ts) is None else None


def element_time(recs) -> int:
    """The earliest usable event time (:func:`usable_time`) of ``recs``, or 0 when none has one:
    the timestamp a source gives the element that carries them."""
    return min((t for t in map(usable_time, recs) if t is not None), default=0)


def ms_floor(us: int) -> int:
    """``us`` rounded down to whole milliseconds (a TestStream keeps milliseconds: never ahead)."""
    return int(us) - int(us) % 1000


#: the kinds of a replay step, in playing order (a request scored before its query's judgments would
#: be rescored without them)
PLAY_ORDER = ("judgments", "impressions", "clicks")


def replay_steps(files: dict, step_us: int) -> list:
    """The order in which a replay plays recorded events, on every runner: ``files`` ``{kind: {path or
    None: [record, ...]}}`` as ``[(step, [(kind, path, records), ...]), ...]``, the steps (event time //
    ``step_us``; records without a usable time at time 0) in order, in each step the judgments, then
    the impressions, then the clicks, each kind's files in the order given, each file's records in
    event-time order."""
    groups: dict = defaultdict(lambda: {k: defaultdict(list) for k in PLAY_ORDER})
    for kind, by_path in files.items():
        for path, recs in by_path.items():
            for r in recs:
                groups[(usable_time(r) or 0) // step_us][kind][path].append(r)
    out = []
    for s in sorted(groups):
        parts = []
        for kind in PLAY_ORDER:
            for path, recs in groups[s][kind].items():
                recs.sort(key=lambda r: usable_time(r) or 0)
                parts.append((kind, path, recs))
        out.append((s, parts))
    return out


# --------------------------------------------------------------------------------------------
# replay plans held in the process that plays them (the local runner's replays)

#: the plans read when a local replay's pipeline was built, by the replay's token (the latest few)
_HELD: OrderedDict = OrderedDict()
_HELD_LOCK = threading.Lock()
HELD_PLANS = 8


def new_token() -> str:
    """A fresh token naming one replay's plan in :func:`held_plan`."""
    return uuid.uuid4().hex


def held_plan(token: str, config, build):
    """The plan of the replay ``token``: ``build(config)`` the first time this process asks for it
    (the launcher, when it builds the pipeline), the same object afterwards (the local runner's
    replay DoFn, in the same process). Only the latest :data:`HELD_PLANS` plans stay held; a plan
    asked for again after it was let go (or in another process) is built again from ``config``
    (``build`` must give the same plan from the same files). Keeps the replayed data out of the
    pipeline graph: the graph carries the token and the config, never the records (issue 38 item 3:
    Beam pickled and bz2-compressed a graph holding them, 45 % of a replay's time)."""
    with _HELD_LOCK:
        plan = _HELD.get(token)
        if plan is not None:
            _HELD.move_to_end(token)
            return plan
    plan = build(config)
    with _HELD_LOCK:
        _HELD[token] = plan
        while len(_HELD) > HELD_PLANS:
            _HELD.popitem(last=False)
    return plan


# --------------------------------------------------------------------------------------------
# the replay source (TestStream)

def _event(kind, payload, ptime) -> bytes:
    """One replay event as the TestStream carries it (:class:`_ReplayFanout` reads it back)."""
    return pickle.dumps((kind, payload, ptime), protocol=pickle.HIGHEST_PROTOCOL)


class _ReplayFanout(beam.DoFn):
    def __init__(self, loader=None):
        self.loader = loader

    def process(self, element):
        kind, payload, ptime = pickle.loads(element)
        _REPLAY_NOW[0] = float(ptime)
        if kind == "chunk":  # the loader yields (kind, records) or (kind, (path, records))
            for k, recs in self.loader(payload):
                if recs:
                    yield pvalue.TaggedOutput(k, recs)
            return
        yield pvalue.TaggedOutput(kind, payload)


class Replay(beam.PTransform):
    """Plays recorded events in event-time order with a watermark, as a TestStream (run it on the
    local streaming runner, ``BundleBasedDirectRunner``, with ``streaming=True``).

    ``p | Replay(steps)`` returns ``{"impressions", "judgments", "clicks"}``: PCollections whose
    elements are lists of records, timestamped with the earliest event time of the list. ``steps``
    is a list of

    * ``("impressions" | "judgments" | "clicks", [records])``: events delivered together (or
      ``(path, [records])``: events of one file, whose dead letters name it);
    * ``("watermark", micros)``: the watermark advances (events behind it are late);
    * ``("advance", seconds)``: processing time advances (early panes by processing time fire);
    * ``("chunk", descriptor)``: ``loader(descriptor)`` yields ``(kind, records)`` when the chunk
      plays (keeps the TestStream small: a generator or a file block instead of the records).

    :meth:`from_records` builds the steps of an in-order replay of logs.
    """

    KINDS = ("impressions", "judgments", "clicks")

    def __init__(self, steps, loader=None, label=None):
        super().__init__(label)
        self.steps = list(steps)
        self.loader = loader

    @classmethod
    def from_records(cls, impressions=(), judgments=(), clicks=(), step="1h", pace=1.0, label=None):
        """Steps replaying the records in event-time order: the events of each ``step`` of event
        time are delivered together, then the watermark moves to the step's end and processing
        time advances by ``pace`` seconds. Judgments without a timestamp play at time 0. A kind's
        records are a list, or ``{path: records}`` for records read from files (the events of one
        step and file are one element ``(path, records)``, so a dead letter names its file)."""
        step_us = parse_duration(step, "step")
        files = {kind: given if isinstance(given, dict) else {None: given}
                 for kind, given in (("impressions", impressions), ("judgments", judgments), ("clicks", clicks))}
        steps = []
        for s, parts in replay_steps(files, step_us):
            steps += [(kind, recs if path is None else (path, recs)) for kind, path, recs in parts]
            steps.append(("watermark", (s + 1) * step_us))
            if pace:
                steps.append(("advance", float(pace)))
        return cls(steps, label=label)

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream

        # the events as length-prefixed bytes (standard coders): a runner that plays the TestStream
        # itself decodes its events with this coder in its own SDK (Flink's is Java: a Python coder
        # failed the job there, "UnknownCoderWrapper was used to perform an actual decoding in the Java
        # SDK"); Prism 2.62 reads a bytes event as length-prefixed ("pickle data was truncated" with
        # the bare bytes coder), as the length-prefix coder writes it
        ts = TestStream(coder=LengthPrefixCoder(BytesCoder()))
        ptime = 0.0
        for step in self.steps:
            kind, arg = step
            if kind == "watermark":
                ts = ts.advance_watermark_to(_when(ms_floor(arg)))
            elif kind == "advance":
                ptime += float(arg)
                ts = ts.advance_processing_time(float(arg))
            elif kind == "chunk":
                ts = ts.add_elements([TimestampedValue(_event("chunk", arg, ptime), _when(arg[0] if isinstance(
                    arg, (list, tuple)) else 0))])
            elif kind in self.KINDS:
                if isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], str):  # (path, records)
                    if arg[1]:
                        ts = ts.add_elements([TimestampedValue(_event(kind, (arg[0], list(arg[1])), ptime),
                                                               _when(element_time(arg[1])))])
                    continue
                if not arg:
                    continue
                ts = ts.add_elements([TimestampedValue(_event(kind, list(arg), ptime), _when(element_time(arg)))])
            else:
                raise ValueError(f"unknown replay step {kind!r}")
        # close every window while the watermark is still finite, then end
        ts = ts.advance_watermark_to(_when(END_OF_TIME_US)).advance_watermark_to_infinity()
        out = (pbegin | "TestStream" >> ts.with_output_types(bytes)
               | "Fanout" >> beam.ParDo(_ReplayFanout(self.loader)).with_outputs(*self.KINDS))
        return {k: out[k] for k in self.KINDS}
