"""Stage 5, the aggregate (key: system): the plumbing shared by the window and session aggregates
(:mod:`.window_aggregate`, :mod:`.session_aggregate`), and their DoFn.

Input: ``(system, [message, ...])`` with ``("rank", ...)`` messages of :mod:`.queries` and
``("ctr", ...)`` messages of :mod:`.requests`; ``(_SIDE_KEY, side records)`` goes to the
``"side"`` output. Messages are kept in a bag (``INBOX``) and folded into the core state when a
pane may fire: every ``early_count`` updates, every ``early_seconds`` of processing time
(``PROC`` timer), and at window ends and expiries (``EVENT`` timer, event time). Outputs:
metric rows (main; :func:`~streameval.beam.transforms.metric_row` dicts with ``pane``,
``pane_index``, ``is_final``), ``"panes"`` (one element per pane: its rows) and ``"side"``
(late updates, counted ``late:update``; dead letters).

A request's contribution is replaced, never added twice: the old one is subtracted exactly
(:func:`_mm_sub`) before the new one is added, so the sums equal those of a fresh pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from ...accumulators.moments import MeanMoments, MomentsState, partials_add
from ...io import counters as cn
from ...metrics import stats
from ..combiners import CtrByPositionCombineFn, MeanCombineFn
from ..transforms import metric_row
from .common import _SIDE_KEY, _micros, _pending, _tally, _when, arm
from .windows import _Config


# --------------------------------------------------------------------------------------------
# exact removal and processing time

_SPLIT = 134217729.0  # Veltkamp's splitter, as MeanMoments uses


def _mm_sub(state: list, values) -> None:
    """Remove one observation per metric from a :class:`MeanMoments` state, exactly: the negated
    value and the negated exact pieces of its square are added to the Shewchuk partials, so the
    partials' exact sums equal those of a state that never saw the observation, and extraction
    (which depends only on the exact sums and the count) gives the same result to the last bit."""
    counts, sums, squares = MomentsState.of(state)
    for m, x in enumerate(values):
        x = float(x)
        if math.isnan(x):
            continue
        counts[m] -= 1
        if x == 0.0:
            continue
        partials_add(sums[m], -x)
        c = _SPLIT * x
        hi = c - (c - x)
        lo = x - hi
        partials_add(squares[m], -(hi * hi))
        partials_add(squares[m], -(2.0 * hi * lo))
        partials_add(squares[m], -(lo * lo))


class _Clock:
    """Processing time for early firings: ``time.time`` or a callable (tests, replays)."""

    def __init__(self, fn=None):
        self.fn = fn

    def __call__(self) -> float:
        if self.fn is None:
            import time

            return time.time()
        return float(self.fn())


# --------------------------------------------------------------------------------------------
# the aggregate: panes

def _version_of(m):
    """(request key, request version) of an aggregate message."""
    return (m[1], m[3][0]) if m[0] == "rank" else (m[1], m[2])


@dataclass(slots=True)
class _PaneState:
    """Book-keeping of one output window: ``next_index``, the index of its next pane;
    ``on_time``, whether the on-time pane fired; ``emitted``, the metrics of the rows emitted so
    far per slice label (``{label: [metric, ...]}``, to retract them if they empty); ``dirty``,
    whether it changed since its last pane; ``end``, a session's end (micros; None for fixed and
    sliding windows, whose bounds follow from their index). State: ``[next_index, on_time,
    emitted, dirty]``, plus ``end`` for a session."""

    next_index: int = 0
    on_time: bool = False
    emitted: dict = field(default_factory=dict)
    dirty: bool = False
    end: int | None = None

    @classmethod
    def from_state(cls, value) -> "_PaneState":
        return cls(*value)

    def to_state(self) -> list:
        state = [self.next_index, self.on_time, self.emitted, self.dirty]
        if self.end is not None:
            state.append(self.end)
        return state


class _Schedule(NamedTuple):
    """The aggregate's firing book-keeping (per system): ``armed``, the times (micros, ascending)
    event timers are set for (one timer per time, tagged by it: see :func:`~.common.arm`);
    ``proc_armed``, the processing time (seconds) the early-pane timer is set for, or None;
    ``proc_now``, the latest processing time seen (seconds); ``count``, updates since the last early
    pane. State: ``[armed, proc_armed, proc_now, count]``."""

    armed: list
    proc_armed: float | None
    proc_now: float
    count: int

    @classmethod
    def read(cls, state) -> "_Schedule":
        value = state.read()
        return cls([], None, 0.0, 0) if value is None else cls(*value)

    def write(self, state) -> None:
        state.write(list(self))


class _AggregateBase:
    """The logic shared by the aggregates. A subclass keeps its core state as a named object
    (``new_core``; ``core_from_state`` / its ``to_state`` convert from and to the primitives kept
    in the ``CORE`` state) and says which windows exist (``panes``, ``pane_ids``, ``window_of``),
    how messages change them (``apply``, ``reject``, ``candidate``), their rows
    (``window_rows``) and when they fire (``next_deadline``, ``fire_deadlines``)."""

    INBOX = BagStateSpec("inbox", FastPrimitivesCoder())
    CORE = ReadModifyWriteStateSpec("core", FastPrimitivesCoder())
    SCHED = ReadModifyWriteStateSpec("sched", FastPrimitivesCoder())  # a _Schedule
    EVENT = TimerSpec("event", TimeDomain.WATERMARK)
    PROC = TimerSpec("proc", TimeDomain.REAL_TIME)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg
        self.names = [s.name for s in cfg.specs]
        self.totals = [s.is_count for s in cfg.specs]
        self.mean = MeanCombineFn(len(cfg.specs), self.totals)
        self.mm = MeanMoments(len(cfg.specs))
        self.ctr_fn = CtrByPositionCombineFn(overall=True)
        self.clock = _Clock(cfg.clock)

    # -- shared plumbing -----------------------------------------------------------------------
    def process(self, kv, inbox, core,
                sched, event,
                proc, ts):
        system, msgs = kv
        if system == _SIDE_KEY:
            for m in msgs:
                yield pvalue.TaggedOutput("side", m[1])
            return
        inbox.add(msgs)
        armed, parmed, pnow, count = _Schedule.read(sched)
        count += self.updates(msgs)
        armed = arm(event, armed, self.candidates(msgs), self.cfg.timer_per_deadline)
        cfg = self.cfg
        if cfg.early_seconds and parmed is None:
            parmed = max(self.clock(), pnow) + cfg.early_seconds
            proc.set(Timestamp.of(parmed))
        if cfg.early_count and count >= cfg.early_count:
            count = 0
            c = self._fold(system, inbox, core)
            yield from self._emit_dirty(system, c, ts)
            armed = self._rearm(c, event, armed)
            core.write(c.to_state())
        _Schedule(armed, parmed, pnow, count).write(sched)

    def candidate(self, msgs) -> int | None:
        """The earliest event time (micros) at which a window ``msgs`` touch may fire, or None
        (each subclass says)."""
        raise NotImplementedError

    def next_deadline(self, c) -> int | None:
        """The earliest event time (micros) at which one of ``c``'s panes fires, or None (each
        subclass says)."""
        raise NotImplementedError

    def candidates(self, msgs) -> list:
        """The event times (micros) at which the windows ``msgs`` touch may fire (here: the
        earliest of them, ``candidate``; the next ones are armed as earlier ones fire)."""
        cand = self.candidate(msgs)
        return [] if cand is None else [cand]

    def deadlines(self, c) -> list:
        """The event times (micros) at which ``c``'s panes fire (here: the next one,
        ``next_deadline``: one timer at a time)."""
        nxt = self.next_deadline(c)
        return [] if nxt is None else [nxt]

    def updates(self, msgs) -> int:
        """How many updates ``msgs`` bring, for ``early_count`` (here: one per message, a request
        version)."""
        return len(msgs)

    # the cores of both subclasses (_WindowCore, _SessionCore) hold their panes and closing time alike
    def panes(self, c):
        return c.panes

    def pane_ids(self, c):
        return sorted(c.panes)

    def last_event(self, c):
        return c.closed_upto or 0

    def _fold(self, system, inbox, core):
        value = core.read()
        c = self.new_core() if value is None else self.core_from_state(value)
        batches = list(inbox.read())
        inbox.clear()
        self._rejects = []
        msgs = [m for batch in batches for m in batch]
        # a request version whose update is late anywhere is late everywhere (ranking and clicks
        # alike): decided on the state before the fold, so the order of the messages is irrelevant
        late = {_version_of(m) for m in msgs if self.apply(system, c, m, dry=True) == "late"}
        for m in msgs:
            if _version_of(m) in late:
                self.reject(system, c, m)
            else:
                self.apply(system, c, m)
        return c

    def _late_out(self, ts):
        rej, self._rejects = self._rejects, []
        if rej:
            _tally(self.cfg.run, cn.LATE_UPDATE, len(rej))
            for r in rej:
                yield pvalue.TaggedOutput("side", TimestampedValue(r, ts))

    def _emit_dirty(self, system, c, ts):
        yield from self._late_out(ts)
        for wid in self.pane_ids(c):
            p = self.panes(c)[wid]
            if p.dirty:
                pane = "late" if p.on_time else "early"
                yield from self._pane(system, c, wid, pane, False, ts)

    def on_proc(self, inbox, core,
                sched, event,
                key, ts):
        armed, parmed, pnow, count = _Schedule.read(sched)
        pnow = max(pnow, float(ts))
        c = self._fold(key, inbox, core)
        out = list(self._emit_dirty(key, c, _when(self.last_event(c))))
        armed = self._rearm(c, event, armed)
        core.write(c.to_state())
        _Schedule(armed, None, pnow, 0).write(sched)
        yield from out

    def on_event(self, inbox, core,
                 sched, event,
                 key, ts):
        now = _micros(ts)
        armed, parmed, pnow, count = _Schedule.read(sched)
        c = self._fold(key, inbox, core)
        out = list(self._late_out(ts))
        out.extend(self.fire_deadlines(key, c, now, ts))
        armed = self._rearm(c, event, _pending(armed, now, self.cfg.timer_per_deadline))
        core.write(c.to_state())
        _Schedule(armed, parmed, pnow, count).write(sched)
        yield from out

    def _rearm(self, c, event, armed):
        return arm(event, armed, self.deadlines(c), self.cfg.timer_per_deadline)

    # -- rows ----------------------------------------------------------------------------------
    def _pane(self, system, c, wid, pane, final, ts):
        p = self.panes(c)[wid]
        start, end, prefix = self.window_of(c, wid)
        current = self.window_rows(c, wid)  # {label: [(metric, value, n, se), ...]}
        idx = p.next_index
        extra = dict(pane=pane, pane_index=idx, is_final=bool(final))
        rows = []
        emitted = p.emitted
        for label in sorted(current):
            out_label = label if prefix is None else (prefix if label == "all" else f"{prefix},{label}")
            for metric, value, n, se, *ci in current[label]:
                # the batch job's interval of the same numbers (Wilson for CTR, t otherwise), or the
                # interval the row comes with (bootstrap, online metrics: see coarse_online)
                iv = ci[0] if ci else stats.row_interval(metric, value, n, se, self.cfg.ci_level, self.cfg.intervals,
                                                         bounded=self.cfg.bounded)
                rows.append(metric_row(start, end, out_label, system, metric, value, n, se, **extra, **iv))
        for label, metrics in sorted(emitted.items()):  # emptied since: an empty row replaces it
            have = {m for m, *_ in current.get(label, [])}
            out_label = label if prefix is None else (prefix if label == "all" else f"{prefix},{label}")
            for metric in metrics:
                if metric not in have:
                    rows.append(metric_row(start, end, out_label, system, metric, math.nan, 0, None, **extra))
        for label, rs in current.items():  # every row ever emitted stays in the window's panes
            have = emitted.setdefault(label, [])
            have.extend(m for m, *_ in rs if m not in have)
        p.dirty = False
        if pane == "on_time":
            p.on_time = True
        if not rows:
            return
        p.next_index = idx + 1
        _tally(self.cfg.run, cn.panes(pane))
        if final:  # (also counted by the console step, in its process: on the local runner only)
            _tally(self.cfg.run, cn.PANES_FINAL)
        yield pvalue.TaggedOutput("panes", TimestampedValue(rows, ts))
        for r in rows:
            yield TimestampedValue(r, ts)

    def _rank_rows(self, merged_rank):
        """{label: [nreq, mm state]} -> rows of the ranking metrics."""
        out = {}
        for label, (nreq, st) in merged_rank.items():
            if nreq <= 0:
                continue
            res = self.mean.extract_output(st)
            out[label] = [(name, v, n, se) for name, (v, n, se) in zip(self.names, res)]
        return out

    def _ctr_rows(self, merged_ctr, out):
        for label, by_pos in merged_ctr.items():
            by_pos = {p: v for p, v in by_pos.items() if v[0] > 0}
            if not by_pos:
                continue
            (ctr, n, se), per_pos = self.ctr_fn.extract_output(by_pos)
            rows = out.setdefault(label, [])
            rows.append(("ctr", ctr, n, se))
            for pos, (v, n2, se2) in per_pos.items():
                rows.append((f"ctr@pos{pos}", v, n2, se2))
        return out


class _AggregateFn(beam.DoFn):
    """Keyed state of systems: panes (logic in :class:`_WindowAggregate` / :class:`_SessionAggregate`)."""

    INBOX, CORE, SCHED = _AggregateBase.INBOX, _AggregateBase.CORE, _AggregateBase.SCHED
    EVENT, PROC = _AggregateBase.EVENT, _AggregateBase.PROC

    def __init__(self, logic):
        self.logic = logic

    def process(self, kv, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                proc=beam.DoFn.TimerParam(PROC), ts=beam.DoFn.TimestampParam):
        return self.logic.process(kv, inbox, core, sched, event, proc, ts)

    @on_timer(PROC)
    def on_proc(self, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam):
        return self.logic.on_proc(inbox, core, sched, event, key, ts)

    @on_timer(EVENT)
    def on_event(self, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                 sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                 key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam):
        return self.logic.on_event(inbox, core, sched, event, key, ts)
