"""The streaming job on the batch job's columnar stages: coarse elements (a watched file's columns),
vectorised cleaning and scoring, per-shard exact partial sums merged where the panes fire.

``blocks | ColumnarStreamMetrics(judgment_paths, metrics, window="1h", ...)`` gives the same metric
rows (``pane``, ``pane_index``, ``is_final``) as :class:`~.transform.StreamMetrics` for fixed
windows, judgments read when the job starts and clicks logged in the impression records (the
``clicked`` field). Its input is what :class:`~.live.FileWatcher` sends with ``columnar=True``: one
element per block of a file, ``(path, block, records, watermark)`` where ``block`` is an Arrow IPC
stream (``("arrow", bytes)``) or a list of records (``("records", list)``) and ``watermark`` the
watermark (micros) the source had sent before the block, or None.

Stages (docs/metrics.md, "Streaming on the columnar engine"):

1. **Read** (stateless): the block is checked by the batch reader (:class:`~..columnar_read.
   _ReadImpressionColumns`: the same screen, the same dead letters) and cut by request shard.
2. **Shard** (key: request shard; keyed state in the global window): the shard keeps the columns
   of its open requests (a bag of frozen pieces). A piece's records whose request's window was
   final when the source sent them (its end plus the allowed lateness at or before the watermark)
   are late data. The others join the bag, and the windows they touch are cleaned and scored again
   from the bag by the batch job's own stages (:class:`~..columnar_clean._CleanShard`,
   :class:`~..columnar_score._ScoreShard`, the judgments of each query shard from a multimap side
   input): the shard sends its new exact partial sums of those windows (MeanMoments states per
   slice label, click counts per position) to the aggregate, one message per system, with a
   version. With a source that flushes before each move of its watermark (``flushes=True``:
   :class:`~.coarse_replay.ReplayColumns`, a ``(FLUSH, watermark)`` to every shard) and no early
   panes, a window is cleaned and scored once instead, at the flush before the watermark passes its
   end (a piece for a window ending by a flush already seen is scored when it comes). When the
   watermark passes a window's end plus the allowed lateness (an event-time timer), the window's
   requests are counted (the record accounting) and their dead letters written, exactly once, as
   their latest cleaning and scoring found them; the records are kept for the retention (so later
   pieces of a final request are late data, as in :class:`StreamMetrics`) and then dropped.
3. **Aggregate** (key: system, :mod:`.coarse_aggregate`): the latest partial of each shard per
   window (a newer version replaces an older one), merged when a pane fires
   (:class:`~.aggregate._AggregateBase`'s panes: early panes every ``early_count`` shard updates or
   ``early_every`` of processing time, the on-time pane at the watermark, late panes, the final
   pane). This is the first level of a two-level aggregate: a system's key receives a few partial
   states per file, not a message per request.

Data flows only through ``process`` (the shard stage's outputs hold the downstream watermark);
timers only count, write dead letters and free state, and the aggregate's timers fire panes.

The work on a piece is proportional to the open windows it touches in its shard (they are cleaned
and scored again), so the cost grows with the number of pieces per window and shard: files of many
records and a small number of shards (default 16) keep it low; a source that flushes makes it one
scoring per window (1 M impressions in one window, 19 pieces: 9.9 M request rows scored, now 1 M).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.typehints import typehints

from ...accumulators.bootstrap import DEFAULT_REPLICATES
from ...accumulators.moments import MeanMoments
from ...io import counters as cn
from ..columnar_clean import _CleanShard
from ..columnar_columns import _concat, _pair_codes, _take, freeze, thaw
from ..columnar_read import _ReadImpressionColumns, default_decoder
from ..columnar_score import _ScoreShard
from ..threads import _collect
from ...io.counters import NAMESPACE
from ...metrics.prepare import DEFAULT_SCORE_PRECISION
from .aggregate import _AggregateFn
from .coarse_aggregate import _PartialAggregate, _add_clicks
from .coarse_judgments import HeldJudgments, JudgmentRead, QueryJudgments, held_judgments, read_judgments
from .common import FLUSH, _fmt_us, _late_record, _pending, _tally, arm
from .replay import held_plan, new_token
from .transform import StreamMetrics

#: query shards of the resolved judgments and of the cleaned requests: one (a shard scores all its
#: requests in one call of the batch kernel; the judgments are held whole, read when the job starts)
QUERY_SHARDS = 1
#: event time (micros) over which final windows are counted together (see _ShardFn._counted_at): the
#: shards hold up to this much more data; one timer and one cleaning per group instead of per window
COUNT_EVERY = 4 * 3600 * 1_000_000
_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min
#: the tag of a notice to the shards: ``(SEEN, [window index, ...])``, windows with data (see _ReadBlocks)
SEEN = "seen"


def _apply_counts(run: str, counts: dict) -> None:
    """Counter increments collected by :func:`~..threads._collect` (``{(namespace, name): n}``;
    distributions as ``(kind, namespace, name)``): counters of our namespace go to the run's tally
    and Beam counter (:func:`~.common._tally`), distributions to Beam."""
    for key, n in counts.items():
        if len(key) == 3:
            dist = Metrics.distribution(key[1], key[2])
            for v in n:
                dist.update(v)
        elif key[0] == NAMESPACE:
            _tally(run, key[1], int(n))
        else:
            Metrics.counter(*key).inc(n)


def _values(p, label: str, values: list):
    """A PCollection of ``values`` from an Impulse (Beam's ``Create`` adds a composite that Prism
    refuses in a streaming job: ``MaybeReshuffle``, a pickled transform with no parts)."""
    return p | label >> beam.Impulse() | f"{label}Values" >> beam.FlatMap(lambda _, vs: vs, values)


def _count_judgments(counts: list, run: str) -> None:
    """The judgments' counter increments (``[[key, n], ...]``, :meth:`ColumnarStreamMetrics._judgments`)
    applied by the job: :func:`_apply_counts`."""
    _apply_counts(run, {tuple(k): n for k, n in counts})


class _Tallied(beam.DoFn):
    """A batch stage (a :class:`~..threads.ThreadedDoFn`'s ``work``) whose counts go to the stream's
    tally (the local streaming runner reports Beam counters of a step's first bundle only)."""

    def __init__(self, inner, run: str):
        self.inner = inner
        self.run = run

    def process(self, element):
        outs, counts = _collect(self.inner.work, (element,))
        _apply_counts(self.run, counts)
        yield from outs


# --------------------------------------------------------------------------------------------
# stage 1: read a block

class _NoticedImpressionColumns(_ReadImpressionColumns):
    """The batch reader's rules, and ``seen``: the windows (event time // ``notice_period``, in
    microseconds) that the valid rows of the blocks read since it was last cleared are in (none
    when ``notice_period`` is None), taken from the columns before they are split and frozen."""

    def __init__(self, *args, notice_period: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.notice_period = notice_period
        self.seen: set = set()

    def passed(self, chunk: dict) -> None:
        if self.notice_period is not None and chunk["n"]:
            self.seen.update(np.unique(chunk["timestamp"] // self.notice_period).tolist())


class _ReadBlocks(beam.DoFn):
    """``(path, block, records, watermark)`` -> ``(request shard, (watermark, frozen columns))`` and
    dead letters (tag ``side``) of the records the batch reader rejects."""

    def __init__(self, shards: int, time_range, run: str, hold: bool = False, notice_period: int | None = None):
        # hold: the pieces stay in this process (not pickled), for the in-process local runner only
        self.reader = _NoticedImpressionColumns(shards, decoder="datafusion", time_range=time_range, hold=hold,
                                                notice_period=notice_period)
        self.run = run
        self.shards = shards
        # blocks without a watermark (EventBlocks, notice_period set): every shard is told the windows
        # a block has data in (the reader's ``seen``)

    def process(self, element):
        path, (form, block), n, wm = element
        if form == FLUSH:  # the source's watermark moves to wm next: to every shard
            for shard in range(self.shards):
                yield shard, (FLUSH, wm)
            return
        self.reader.seen.clear()
        if form == "held":  # a block the live source holds in this process (the local runner)
            from .live import HELD_BLOCKS

            table = HELD_BLOCKS.pop(block)
            outs, counts = _collect(self.reader._table, (table, path))
        elif form == "arrow":
            table = pa.ipc.open_stream(block).read_all()
            outs, counts = _collect(self.reader._table, (table, path))
        elif form == "json":  # an event source's values (.coarse_events)
            outs, counts = _collect(self.reader.events, (block, path))
        else:
            outs, counts = _collect(self.reader._block, (block, path))
        _tally(self.run, cn.IMPRESSIONS_READ, n)
        _apply_counts(self.run, counts)
        for o in outs:
            if isinstance(o, pvalue.TaggedOutput):
                yield pvalue.TaggedOutput("side", o.value)
            else:
                shard, frozen = o
                yield shard, (wm, frozen)
        if self.reader.seen:  # a notice: ("seen", [window index, ...]), to every shard
            notice = (SEEN, sorted(self.reader.seen))
            for shard in range(self.shards):
                yield shard, notice


# --------------------------------------------------------------------------------------------
# stage 2: the shards

class _ShardMeta(NamedTuple):
    """A shard's book-keeping: ``closed``, the watermark (micros) known here (windows whose end plus
    the allowed lateness is at or before it are final), or None; ``version`` of its latest
    partials; ``armed``, the times (micros, ascending) its timers are set for (one per time:
    :func:`~.common.arm`); ``sent``, ``{window: [system,
    ...]}``: the systems whose partials of an open window were sent (an emptied one is sent as an
    empty partial); ``final``, the windows already counted (records kept for the retention);
    ``tally``, ``{window: [counts, dead letters]}`` of the open windows' requests as their latest
    cleaning and scoring found them (written out when the window is final); with a source that
    flushes (:data:`FLUSH`), ``dirty``, the windows changed since they were last scored,
    ``flushed``, the latest flush's watermark (micros) or None, and ``low``, at most the earliest
    event time (micros) of the records held, or None. State: a list of the nine."""

    closed: int | None
    version: int
    armed: list
    sent: dict
    final: list
    tally: dict
    dirty: list = []
    flushed: int | None = None
    low: int | None = None

    @classmethod
    def read(cls, state) -> "_ShardMeta":
        v = state.read()
        return cls(None, 0, [], {}, [], {}) if v is None else cls(*v)

    def write(self, state) -> None:
        state.write(list(self))


@dataclass
class _Stages:
    """The batch stages a shard runs (built once per DoFn instance)."""

    clean: _CleanShard
    score: _ScoreShard | None


class _ShardFn(beam.DoFn):
    PIECES = BagStateSpec("pieces", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())
    EXPIRY = TimerSpec("expiry", TimeDomain.WATERMARK)

    def __init__(self, cfg, batch: dict, judgments: dict | None, online=None, boot=None, hold: bool = False,
                 source_watermark: bool = True, flushes: bool = False):
        #: False: the blocks carry no watermark (EventBlocks): the shard learns which windows closed from
        #: its timers alone, each set at a window's expiry (not rounded up: see _counted_at)
        self.source_watermark = source_watermark
        #: the source flushes (FLUSH) before each move of its watermark; without early panes a window is
        #: then scored once, at the flush before the watermark passes its end, not at each piece
        #: (a window of k pieces was cleaned and scored k times, the pieces so far each time)
        self.deferred = bool(flushes) and not (cfg.early_seconds or cfg.early_count)
        #: the bag's pieces held in this process (its state holds their keys; nothing pickled): for
        #: the in-process local runner only
        self.hold = hold
        #: {query shard: [frozen resolved judgments]} (read when the job started), or None
        self.judgments = judgments
        self.cfg = cfg
        self.batch = batch  # the batch stages' options (see ColumnarStreamMetrics)
        self.online = online  # a coarse_online.StreamOnline, or None
        self.boot = boot  # a coarse_online.StreamBootstrap (--ci bootstrap), or None
        self._stages = None
        self._held = None
        self.token = uuid.uuid4().hex  # this job's judgments in the process-wide cache
        self._mm = boot if boot is not None else MeanMoments(len(cfg.specs))

    def _get_stages(self) -> _Stages:
        if self._stages is None:
            b, cfg = self.batch, self.cfg
            # the values between the two stages stay in this process (hold): nothing is pickled
            on = self.online
            clean = _CleanShard("CleanImpressions", cfg.ranking, cfg.ctr, cfg.spec.size, cfg.slice_specs,
                                b["order"], QUERY_SHARDS, hold=True, lateness_micros=cfg.lateness,
                                online=on.columns() if on and on.specs else None, cluster=on.cluster if on else "none")
            if self.judgments is not None:  # made once per process and job (the runner copies DoFns), then held
                self._held = held_judgments(self.judgments, self.token)
            score = _ScoreShard(cfg.specs, cfg.options, b["order"], b["tie_break"], b["score_precision"],
                                b["depth"], cfg.spec.size, cfg.slice_specs,
                                bootstrap=b.get("bootstrap")) if cfg.ranking else None
            self._stages = _Stages(clean, score)
        return self._stages

    # -- the batch stages on a chunk of whole requests --------------------------------------------
    def _run(self, shard: int, chunk: dict, judgments):
        """(ranking states ``{(window start, system): {label: state}}``, click states
        ``{(window start, system): {label: {position: [impressions, clicks]}}}``, online states
        ``{(window start, system): {tag: {label: state}}}`` (:mod:`.coarse_online`), side records,
        counts) of the batch stages on ``chunk``."""
        st = self._get_stages()
        counts: dict = {}

        def run(work, args):
            outs, c = _collect(work, args)
            for k, v in c.items():
                counts[k] = counts.get(k, []) + v if len(k) == 3 else counts.get(k, 0) + v
            return outs

        rank: dict = {}
        ctr: dict = {}
        onl: dict = {}
        side: list = []
        by_query: dict = {}
        judgments = self._held if judgments is not None else None
        for o in run(st.clean.work, ((shard, [freeze(chunk, hold=True)]),)):
            if isinstance(o, pvalue.TaggedOutput):
                if o.tag == "clicks":
                    (ws, _we, label, system), pos = o.value
                    ctr.setdefault((ws, system), {})[label] = pos
                elif o.tag == "dead_letters":
                    side.append(o.value)
                elif self.online is not None and self.online.is_online(o):
                    self.online.collect((o,), onl)
            else:
                by_query.setdefault(o[0], []).append(o[1])
        for q, parts in sorted(by_query.items()) if st.score is not None else ():
            held = judgments.get(q) if judgments is not None else None
            # the judgments of the chunk's queries only (a QueryJudgments): not the collection's each time
            jparts = held.of(chunk["query_id"]) if held is not None else []
            try:
                outs = run(st.score.work, ((q, parts), jparts))
            finally:
                QueryJudgments.release(jparts)
            for o in outs:
                if isinstance(o, pvalue.TaggedOutput):
                    if o.tag == "dead_letters":
                        side.append(o.value)
                    # "unjudged": counted (requests_unjudged), as the per-event stream does
                else:
                    (ws, _we, label, system), state = o
                    by_label = rank.setdefault((ws, system), {})
                    # the query shards' states of one (window, label, system) merge exactly
                    by_label[label] = state if label not in by_label else self._mm.merge([by_label[label], state])
        return rank, ctr, onl, side, counts

    # -- requests and windows ------------------------------------------------------------------
    def _request_windows(self, chunk: dict):
        """(request code per row, window index per request) of a chunk (a request counts in the
        window of its earliest impression, as in batch)."""
        req, _ = _pair_codes(chunk["system_id"], chunk["request_id"])
        t0 = np.full(int(req.max()) + 1 if len(req) else 0, _INT64_MAX, dtype=np.int64)
        np.minimum.at(t0, req, chunk["timestamp"])
        return req, t0 // self.cfg.spec.period

    def _expiry(self, k):
        return (k + 1) * self.cfg.spec.period + self.cfg.lateness

    def _counted_at(self, k):
        """When window k's requests are counted and their dead letters written: its expiry rounded
        up to :data:`COUNT_EVERY` of event time (whole windows), so that one timer counts several
        windows (the panes do not wait for it: the aggregate fires them)."""
        t = self._expiry(k)
        if not self.source_watermark:  # the timer is how this shard knows the window closed: on time
            return t
        step = self.cfg.spec.period * max(1, COUNT_EVERY // self.cfg.spec.period)
        return -(-t // step) * step

    @staticmethod
    def _buffer(pieces, drop: bool = False) -> dict | None:
        """The bag's pieces as one chunk (None: empty); ``drop``: held pieces leave this process's
        memory (the bag is cleared next)."""
        held = [thaw(v, keep=not drop) if isinstance(v[1], str) else thaw(v) for v in pieces.read()]
        return _concat(held) if held else None

    def process(self, element, pieces=beam.DoFn.StateParam(PIECES),
                meta=beam.DoFn.StateParam(META), expiry=beam.DoFn.TimerParam(EXPIRY),
                timestamp=beam.DoFn.TimestampParam):
        shard, (wm, frozen) = element
        cfg = self.cfg
        m = _ShardMeta.read(meta)
        if wm == SEEN:  # a notice (_ReadBlocks): windows with data somewhere, whose close this shard times
            self._noticed(m, frozen, meta, expiry)
            return
        if wm == FLUSH:  # the source's watermark moves to `frozen` next: the windows ending by then
            yield from self._flush(shard, int(frozen), timestamp.micros, pieces, meta, expiry, m)
            return
        closed = m.closed if wm is None else (wm if m.closed is None else max(m.closed, wm))
        new = thaw(frozen)
        period = cfg.spec.period
        if self.deferred and new["n"]:
            low = int(new["timestamp"].min())
            low = low if m.low is None else min(m.low, low)
            if (low // period + 1) * period > self._passed(closed, m):
                # every record held and new is in a window that neither the watermark nor a flush has
                # passed: none is late, and the windows the piece changes (its requests', its
                # impressions' own) are scored at a flush: its impressions' own windows (a request's
                # window is an earlier one's of its records, dirty since they came), no request key
                pieces.add(freeze(new, hold=self.hold))
                dirty = sorted(set(m.dirty).union(np.unique(new["timestamp"] // period).tolist()))
                m._replace(closed=closed, dirty=dirty, low=low).write(meta)
                return
        old = self._buffer(pieces)
        n_old = old["n"] if old is not None else 0
        both = _concat([old, new]) if old is not None else new
        req, win = self._request_windows(both)
        if closed is not None:
            late = self._expiry(win[req[n_old:]]) <= closed
            if late.any():
                rows = np.flatnonzero(late)
                yield from self._late(new, rows, win[req[n_old:]][rows], closed)
                new = _take(new, ~late)
                if not new["n"]:
                    m._replace(closed=closed).write(meta)
                    return
                both = _concat([old, new]) if old is not None else new
                req, win = self._request_windows(both)
        pieces.add(freeze(new, hold=self.hold))
        if new["n"]:
            low = int(new["timestamp"].min())
            m = m._replace(low=low if m.low is None else min(m.low, low))
        # windows the piece changes: its requests' windows (ranking) and its impressions' own windows
        # (CTR counts an impression in the window of its own time)
        touched = np.union1d(win[req][n_old:], both["timestamp"][n_old:] // period)
        dirty = m.dirty
        if self.deferred:  # scored at the flush before the watermark passes their end (now, if one has)
            later = (touched + 1) * period > self._passed(closed, m)
            dirty = sorted(set(dirty) | set(touched[later].tolist()))
            touched = touched[~later]
        m = m._replace(closed=closed, dirty=dirty)
        if not len(touched):
            m.write(meta)
            return
        yield from self._send(shard, both, req, win, n_old, touched, m, meta, expiry)

    @staticmethod
    def _passed(closed: int | None, m: _ShardMeta) -> int:
        """How far (micros) the watermark ``closed`` or a flush seen has passed: windows ending by
        then are scored when a piece of theirs comes, not at a flush."""
        return max(_INT64_MIN if closed is None else closed, _INT64_MIN if m.flushed is None else m.flushed)

    def _flush(self, shard, wm: int, stamp: int, pieces, meta, expiry, m: _ShardMeta):
        """A source's flush (:data:`FLUSH`, timestamped ``stamp``, micros): its watermark moves from
        ``stamp`` to ``wm`` next, so the dirty windows ending after ``stamp`` and by ``wm`` are scored
        and sent (data leaves from ``process``, never from a timer: see the package's design notes),
        their partials timestamped before their end: the downstream watermark waits for them. A window
        ending by ``stamp`` waits for the flush that crossed its end (a flush that overtook it on
        the way, e.g. bundles of the read stage finishing out of order, would send it too late). A
        piece arriving after a flush for a window ending by its ``wm`` is scored when it arrives
        (:meth:`process`)."""
        period = self.cfg.spec.period
        due = [k for k in m.dirty if stamp < (k + 1) * period <= wm]
        m = m._replace(dirty=[k for k in m.dirty if k not in due],
                       flushed=wm if m.flushed is None else max(m.flushed, wm))
        both = self._buffer(pieces) if due else None
        if both is None:
            m.write(meta)
            return
        req, win = self._request_windows(both)
        yield from self._send(shard, both, req, win, both["n"], np.array(due, dtype=np.int64), m, meta, expiry)

    def _send(self, shard, both, req, win, n_old, touched, m: _ShardMeta, meta, expiry):
        """Clean and score the ``touched`` windows (window indexes, ascending) again from the shard's
        records ``both`` (request code ``req`` per row, window ``win`` per request; rows from ``n_old``
        on are new), send each system's partials of them to the aggregate, keep their counts and dead
        letters (``tally``) and arm the timers; ``m`` is written to ``meta``."""
        cfg = self.cfg
        period = cfg.spec.period
        rwin = win[req]
        # the requests with an impression in a touched window or counting in one: every ranking and
        # click sum of the touched windows comes from them
        last = np.full(len(win), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, req, both["timestamp"] // period)
        span = np.zeros(len(win), dtype=bool)
        for k in touched.tolist():
            span |= (win <= k) & (last >= k)
        sel = span[req]
        version = m.version + 1
        sent = dict(m.sent)
        tally = dict(m.tally)
        # every window the piece touches, cleaned and scored again from the shard's records, one
        # request window at a time: the counts and dead letters of a touched window's requests are
        # kept (tally) and written out once, when the window is final (on_expiry)
        rank, ctr, onl = self._score_windows(shard, both if sel.all() else _take(both, sel),
                                             rwin if sel.all() else rwin[sel], set(touched.tolist()), tally)
        by_system: dict = {}
        for k in touched.tolist():
            start = k * cfg.spec.period
            systems = {s for (ws, s) in list(rank) + list(ctr) + list(onl) if ws == start}
            for s in systems | set(sent.get(k, [])):
                by_system.setdefault(s, {})[k] = [rank.get((start, s), {}), ctr.get((start, s), {}),
                                                  onl.get((start, s), {})]
            sent[k] = sorted(systems)
        updated = int(len(np.unique(req[n_old:])))  # requests this piece changed (early_count counts them)
        for system, subs in sorted(by_system.items()):
            yield system, [("part", int(shard), version, subs, updated)]
        armed = arm(expiry, m.armed, [self._counted_at(k) for k in sent if k not in m.final],
                    self.cfg.timer_per_deadline)
        m._replace(version=version, armed=armed, sent=sent, tally=tally).write(meta)

    def _noticed(self, m: _ShardMeta, windows, meta, expiry) -> None:
        """A notice's windows that this shard does not time yet join ``sent`` with no system (nothing
        of theirs was sent from here), so its timer fires at their expiry; windows already closed here
        are left alone."""
        new = [int(k) for k in windows if int(k) not in m.sent and int(k) not in m.final
               and (m.closed is None or self._expiry(int(k)) > m.closed)]
        if not new:
            return
        sent = dict(m.sent)
        for k in new:
            sent[k] = []
        armed = arm(expiry, m.armed, [self._counted_at(k) for k in sent if k not in m.final],
                    self.cfg.timer_per_deadline)
        m._replace(sent=sent, armed=armed).write(meta)

    def _score_windows(self, shard, chunk, rwin, touched: set, tally: dict):
        """The batch stages on ``chunk`` (requests whose request window is ``rwin`` per row), one
        request window at a time: (ranking, click and online states as :meth:`_run`'s, merged over
        the request windows); each touched window's counts and dead letters go to ``tally``. A
        request counts in one window (its earliest impression's) and its rules look at its own
        records only, so the windows' counts add up to those of the whole chunk."""
        rank: dict = {}
        ctr: dict = {}
        onl: dict = {}
        groups = np.unique(rwin)
        for g in groups.tolist():
            sub = chunk if len(groups) == 1 else _take(chunk, rwin == g)
            r, c, o, side, counts = self._run(shard, sub, self.judgments)
            rank.update(r)  # keyed by the request window: disjoint
            for key, by_label in c.items():  # CTR by the impressions' own windows: added up
                _add_clicks(ctr.setdefault(key, {}), by_label)
            for key, by_tag in o.items():
                self.online.add(onl.setdefault(key, {}), by_tag)
            if g in touched:  # all of the window's requests were in the chunk
                tally[g] = [counts, side]
        return rank, ctr, onl

    def _late(self, new, rows, wins, closed):
        """Late data (the per-event engine's rules and reasons): a record whose own window is final;
        else a piece of a final request: after the request's close by its own time (the batch job's
        rule and reason), or late by arrival."""
        from ...io import cleaning
        from ..columnar_columns import columns_records

        period = self.cfg.spec.period
        for rec, k in zip(columns_records(new, rows), wins.tolist()):
            _tally(self.cfg.run, cn.LATE_IMPRESSION)
            ts = int(rec["timestamp"])
            own = self._expiry(ts // period)
            rc = self._expiry(k)  # the request's close
            if own <= closed:
                reason = (f"event time {_fmt_us(ts)} is in a window that closed at {_fmt_us(own)} "
                          "(window end + allowed lateness)")
            elif ts >= rc:
                reason = cleaning.after_close_reason(ts, rc)
            else:
                reason = (f"request {rec['request_id']} of {rec['system_id']} is final: its window closed at "
                          f"{_fmt_us(rc)}")
            yield pvalue.TaggedOutput("side", _late_record(cn.LATE_IMPRESSION, rec, reason))

    @on_timer(EXPIRY)
    def on_expiry(self, pieces=beam.DoFn.StateParam(PIECES), meta=beam.DoFn.StateParam(META),
                  expiry=beam.DoFn.TimerParam(EXPIRY), key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam):
        now = ts.micros
        cfg = self.cfg
        m = _ShardMeta.read(meta)
        closed = now if m.closed is None else max(m.closed, now)
        sent = dict(m.sent)
        final = list(m.final)
        tally = dict(m.tally)
        due = [k for k in sent if k not in final and self._expiry(k) <= now]
        # the final windows' counts and dead letters, as their requests' latest cleaning and scoring
        # found them, written exactly once (their partials were sent when their records arrived)
        for k in sorted(due):
            counts, side = tally.pop(k, ({}, []))
            _apply_counts(cfg.run, counts)
            for rec in side:
                yield pvalue.TaggedOutput("side", rec)
        final.extend(due)
        # records of windows final for longer than the retention are dropped (until then a later
        # piece of one of their requests is late data)
        keep_for = max(cfg.retention, cfg.spec.period)  # a later window's clicks may need a request's records
        gone = [k for k in final if self._expiry(k) + keep_for <= now]
        if gone:
            buf = self._buffer(pieces, drop=True)  # the held pieces are dropped, the kept rows held again
            pieces.clear()
            m = m._replace(low=None)
            if buf is not None and buf["n"]:
                req, win = self._request_windows(buf)
                keep = ~np.isin(win[req], np.array(gone, dtype=np.int64))
                if keep.any():
                    kept = buf if keep.all() else _take(buf, keep)
                    pieces.add(freeze(kept, hold=self.hold))
                    m = m._replace(low=int(kept["timestamp"].min()))
            for k in gone:
                sent.pop(k, None)
            final = [k for k in final if k not in gone]
        times = [self._expiry(k) + keep_for if k in final else self._counted_at(k) for k in sent]
        armed = arm(expiry, _pending(m.armed, now, self.cfg.timer_per_deadline), times, self.cfg.timer_per_deadline)
        m._replace(closed=closed, armed=armed, sent=sent, final=final, tally=tally).write(meta)


# --------------------------------------------------------------------------------------------
# the transform

class ColumnarStreamMetrics(StreamMetrics):
    """``blocks | ColumnarStreamMetrics(judgment_paths, metrics, window, ...)``: the streaming job on
    the columnar engine (see the module). ``judgment_paths``: judgment files read when the job
    starts (None: click metrics only). Arguments as :class:`StreamMetrics`, except: fixed windows
    only; no click events (clicks are the impressions' ``clicked`` field); ``early_count`` counts
    shard updates (a file gives one per shard it touches); ``request_shards``: the shards of
    stage 2 (default 16); ``metrics`` may also name online metrics (:mod:`.coarse_online`: ``auc``,
    ``auc_hist`` with ``hist_bins`` / ``hist_range``, click, calibration and interleaving metrics;
    ``gauc`` raises ValueError); ``cluster`` (``request`` / ``user``): the batch job's ``ctr[cluster=C]``
    rows (:mod:`.coarse_online`); ``ci="bootstrap"`` (``replicates``, ``ci_seed``): the ranking
    metrics' Poisson bootstrap intervals (ValueError without ranking metrics); ``in_process``: the
    blocks' columns and the shards' pieces stay in this process's memory instead of being pickled
    between the steps and into the shards' state (None: when the pipeline's runner is the in-process
    ``BundleBasedDirectRunner``; True needs a runner that runs every step in one process);
    ``source_watermark``: False for blocks that carry no watermark (:class:`~.coarse_events.EventBlocks`:
    Kafka, Pub/Sub, the file sources that run on the runner); ``flushes``: True for a source that sends
    a flush before each move of its watermark (:data:`~.common.FLUSH`, :class:`~.coarse_replay.ReplayColumns`:
    without early panes each window is then cleaned and scored once, not at every piece). Outputs and counts as
    :class:`StreamMetrics` (``panes``, ``side``, ``late``, ``dead_letters``, :meth:`counts`,
    :meth:`accounting`)."""

    def __init__(self, judgment_paths=None, metrics=None, window="1h", *, order="score", tie_break="docno",
                 score_precision=DEFAULT_SCORE_PRECISION, depth=None, request_shards=16, decoder=None, ci="t",
                 replicates=DEFAULT_REPLICATES, ci_seed=0, hist_bins=1000, hist_range=(0.0, 1.0), in_process=None,
                 cluster="none", source_watermark=True, flushes=False, **kw):
        from ..online import split_metric_names
        from .coarse_online import StreamBootstrap, StreamOnline

        paths = list(judgment_paths or [])
        kw.pop("clicks", None)
        if ci not in ("t", "bootstrap"):
            raise ValueError(f"ci must be 't' or 'bootstrap', got {ci!r}")
        ranking, online = split_metric_names(list(metrics or []), diversity=True)
        if ranking and not paths:
            raise ValueError("ranking metrics need judgments")
        ctr = kw.pop("ctr", True)
        # the base transform computes ranking metrics and CTR; online metrics are this engine's
        super().__init__(paths if ranking else None, ranking or None, window, order=order, tie_break=tie_break,
                         score_precision=score_precision, depth=depth, request_shards=max(int(request_shards), 1),
                         ctr=ctr or bool(online), **kw)
        if not ctr:
            self.cfg = dataclasses.replace(self.cfg, ctr=False)
        if not self.cfg.spec.windowed or self.cfg.spec.per_window != 1:
            raise ValueError("the columnar streaming engine has fixed windows only (use --engine events for "
                             "sliding windows and sessions)")
        if self.cfg.intervals != "fixed" and ci == "bootstrap":
            raise ValueError("--intervals anytime and --ci bootstrap exclude each other (a bootstrap interval "
                             "holds at one look)")
        self.judgment_paths = paths
        if cluster != "none" and not ctr:
            raise ValueError(f"cluster={cluster!r} gives clustered ctr rows: not without ctr")
        self.online = StreamOnline(online, self.cfg.spec.size, self.cfg.slice_specs, QUERY_SHARDS, hist_bins,
                                   hist_range, cluster) if online or cluster != "none" else None
        if self.online is not None and not self.online:
            self.online = None  # only the ctr family: the job's CTR
        if ci == "bootstrap" and not self.cfg.ranking:
            raise ValueError("--ci bootstrap applies to ranking metrics: give judgments and ranking metrics")
        self.boot = StreamBootstrap(len(self.cfg.specs), int(replicates), int(ci_seed), self.cfg.ci_level,
                                    [s.is_count for s in self.cfg.specs]) if ci == "bootstrap" else None
        self.batch = {"order": order, "tie_break": tie_break, "score_precision": score_precision, "depth": depth,
                      "bootstrap": (int(replicates), int(ci_seed)) if ci == "bootstrap" else None}
        self.decoder = decoder or default_decoder()
        #: the blocks' columns and the shards' pieces held in this process instead of pickled (None:
        #: when the pipeline's runner is the in-process BundleBasedDirectRunner)
        self.in_process = in_process
        #: False: the blocks carry no watermark (:class:`~.coarse_events.EventBlocks`)
        self.source_watermark = bool(source_watermark)
        #: True: the source flushes before each move of its watermark (:class:`~.coarse_replay.ReplayColumns`)
        self.flushes = bool(flushes)

    def _judgment_read(self) -> JudgmentRead:
        """How the judgments are read (:func:`~.coarse_judgments.read_judgments`, when the pipeline is
        built; the counts go to the run's tally in a step of the job, :meth:`expand`, so that a runner
        elsewhere reports them with the job's counters)."""
        return JudgmentRead(tuple(self.judgment_paths), QUERY_SHARDS, self.grade_range, self.decoder, self.cfg.policy)

    def expand(self, blocks):
        cfg = self.cfg
        p = blocks.pipeline
        side = []
        judgments = None
        hold = self.in_process
        if hold is None:
            from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

            hold = isinstance(getattr(p, "runner", None), BundleBasedDirectRunner)
        if self.judgment_paths:
            read = self._judgment_read()
            if hold:  # held in this process: the shards' DoFn carries a reference (coarse_judgments)
                token = new_token()
                judgments, dead, counts = held_plan(token, read, read_judgments)
                judgments = HeldJudgments(token, read)
            else:
                judgments, dead, counts = read_judgments(read)
            if dead:
                side.append(_values(p, "JudgmentDeadLetters", dead))
            if counts:  # counted by the job (on a worker elsewhere), once
                _ = _values(p, "JudgmentCounts", [counts]) | "CountJudgments" >> beam.Map(_count_judgments, cfg.run)
        pieces = blocks | "ReadBlocks" >> beam.ParDo(_ReadBlocks(
            cfg.shards, self.time_range, cfg.run, hold, None if self.source_watermark else cfg.spec.period)).with_outputs(
            "side", main="pieces")
        side.append(pieces.side)
        keyed = pieces.pieces
        keyed.element_type = typehints.Tuple[int, typehints.Any]
        shards = keyed | "Shards" >> beam.ParDo(_ShardFn(
            cfg, self.batch, judgments, self.online, self.boot, hold, self.source_watermark,
            self.flushes)).with_outputs(
            "side", main="systems")
        side.append(shards.side)
        to_agg = shards.systems
        to_agg.element_type = typehints.Tuple[str, typehints.Any]
        agg = to_agg | "Aggregate" >> beam.ParDo(_AggregateFn(_PartialAggregate(cfg, self.online, self.boot))).with_outputs(
            "panes", "side", main="rows")
        side.append(agg.side)
        self.panes = agg.panes
        self.side = tuple(side) | "AllSide" >> beam.Flatten()
        return agg.rows


__all__ = ["ColumnarStreamMetrics", "QUERY_SHARDS"]
