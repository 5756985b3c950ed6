"""Stage 2, the gate (fixed and sliding windows only; keyed by request shard, as the requests stage,
so the work spreads over workers): the lateness of raw events against the sub-windows that already
closed.

Input: ``(shard, pieces)`` from :mod:`.prepare` (judgments: the shard of their query id). Output: ``(shard, [closed_upto, pieces])`` to the
requests stage (main output; ``closed_upto``: micros up to which windows are closed, or None) and
``(query_id, [("upto", closed_upto), ("judg", entries)])`` to the queries stage (``"queries"``).
An impression or click whose sub-window closed is counted (``late:impression``, ``late:click``)
and travels on as a late record (``("side", dead_letter)``, shard 0). Replays and duplicates pass
through: they are decided downstream, per request.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer

from ...io import counters as cn
from .common import _fmt_us, _late_record, _micros, _tally_late, _when
from .prepare import _by_shard, _Click, side_key
from ...plan.windows import WindowSpec


# --------------------------------------------------------------------------------------------
# the gate: lateness of raw events against the windows that already closed

class _GateState(NamedTuple):
    """The gate's state (per shard): ``fired``, the last closed sub-window (every one up to it is
    closed) or None; ``pending``, the sorted sub-windows with data that are not closed yet. Kept
    in Beam state as the list ``[fired, pending]``."""

    fired: int | None
    pending: list

    @classmethod
    def read(cls, state) -> "_GateState":
        value = state.read()
        return cls(None, []) if value is None else cls(*value)

    def write(self, state) -> None:
        state.write([self.fired, self.pending])


class _GateFn(beam.DoFn):
    """Per request shard. Remembers the sub-windows that have data (its own events and the
    ``("seen", [sub-windows])`` notices that the preparation stage sends every shard, so each shard
    knows what a single gate over all events would know) and sets an event-time timer at
    each one's expiry (end + allowed lateness), in order; when the timer fires the watermark has
    passed that expiry, so every sub-window up to it is closed. An impression or click whose own
    sub-window is closed is late data: counted and sent to the late output. (A sub-window in which
    no event was ever seen and which closed before its first event arrives cannot be told apart
    from an open one: its data is accepted and reported in an immediately final pane.)"""

    STATE = ReadModifyWriteStateSpec("gate", FastPrimitivesCoder())  # a _GateState
    TICK = TimerSpec("tick", TimeDomain.WATERMARK)

    def __init__(self, spec: WindowSpec, lateness: int, shards: int, run: str = ""):
        """``shards``: the requests stage's key space (0: keyed by request id); the gate's own keys
        are the preparation stage's gate shards."""
        self.spec = spec
        self.lateness = lateness
        self.shards = shards
        self.run = run

    def _expiry(self, k):
        return (k + 1) * self.spec.period + self.lateness

    def process(self, kv, state=beam.DoFn.StateParam(STATE), tick=beam.DoFn.TimerParam(TICK)):
        _, msgs = kv
        fired, pending = _GateState.read(state)
        pending_set = set(pending)
        before = pending[0] if pending else None
        keep_msgs = []
        late = []
        side = []
        judgments = []
        for m in msgs:
            if m[0] == "side":
                side.append(m)
                continue
            if m[0] == "seen":  # sub-windows with data on some shard (.prepare announces them to all)
                pending_set.update(k for k in m[1] if fired is None or k > fired)
                continue
            if m[0] == "judg":
                judgments.append(m)
                continue
            kind, rid, items = m
            keep = []
            for it in items:
                if kind == "imp":
                    ts, raw = it["timestamp"], it
                else:
                    click = _Click.from_state(it)
                    ts, raw = click.ts, click.raw
                k = self.spec.sub(ts)
                if fired is not None and k <= fired:
                    late.append(_late_record(
                        cn.late("impression" if kind == "imp" else "click"), raw,
                        f"event time {_fmt_us(ts)} is in a window that closed at {_fmt_us(self._expiry(k))} "
                        f"(window end + allowed lateness)"))
                    continue
                keep.append(it)
                pending_set.add(k)
            if keep:
                keep_msgs.append((kind, rid, keep))
        if late:
            _tally_late(self.run, late)
            side.extend(("side", r) for r in late)
        pending = sorted(pending_set)
        if pending and pending[0] != before:
            tick.set(_when(self._expiry(pending[0])))
        _GateState(fired, pending).write(state)
        closed_upto = None if fired is None else self._expiry(fired)
        for _, query, js in judgments:
            yield pvalue.TaggedOutput("queries", (query, [("upto", closed_upto), ("judg", js)]))
        parts = dict(_by_shard(keep_msgs, self.shards))  # to the requests stage's keys
        if side:
            parts.setdefault(side_key(self.shards), []).extend(side)
        for shard, ms in parts.items():
            yield shard, [closed_upto, ms]

    @on_timer(TICK)
    def on_tick(self, state=beam.DoFn.StateParam(STATE), tick=beam.DoFn.TimerParam(TICK),
                ts=beam.DoFn.TimestampParam):
        fired, pending = _GateState.read(state)
        now = _micros(ts)
        while pending and self._expiry(pending[0]) <= now:
            fired = pending.pop(0) if fired is None else max(fired, pending.pop(0))
        if pending:
            tick.set(_when(self._expiry(pending[0])))
        _GateState(fired, pending).write(state)
