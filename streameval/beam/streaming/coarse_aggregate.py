"""Stage 3 of the columnar stream engine (:class:`~.coarse.ColumnarStreamMetrics`): the aggregate of the
shards' partials (key: system). A shard sends, for each window its pieces changed, its whole state of
that window (``("part", shard, version, {window: [rank, ctr, online]}, requests updated)``); the
aggregate keeps each shard's latest version per window and fires the panes of
:class:`~.window_aggregate._WindowAggregate` (fixed windows) from their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...accumulators.clicks import ctr_pos_merge
from ...io import counters as cn
from .aggregate import _PaneState
from .common import _fmt_us, _late_record
from .window_aggregate import _WindowAggregate


def _add_clicks(into: dict, by_label: dict) -> None:
    """Add click states ``{label: {position: [impressions, clicks]}}`` to ``into`` (the same form; exact
    integer sums, :func:`~streameval.accumulators.clicks.ctr_pos_merge`)."""
    for label, by_pos in by_label.items():
        into[label] = ctr_pos_merge([into.get(label, {}), {int(p): v for p, v in by_pos.items()}])


@dataclass(slots=True)
class _PartsCore:
    """A system's aggregate: ``parts``, ``{window: {shard: [version, {label: MeanMoments state (or
    PoissonBootstrap state)}, {label: {position: [impressions, clicks]}}, {online tag: {label:
    state}}]}}``; ``panes``, ``{window: _PaneState}`` of the open
    windows; ``closed_upto``, the time (micros) up to which windows closed, or None. State:
    ``[parts, panes (as lists), closed_upto]``."""

    parts: dict
    panes: dict
    closed_upto: int | None

    @classmethod
    def from_state(cls, value) -> "_PartsCore":
        parts, panes, closed = value
        return cls(parts, {j: _PaneState.from_state(p) for j, p in panes.items()}, closed)

    def to_state(self) -> list:
        return [self.parts, {j: p.to_state() for j, p in self.panes.items()}, self.closed_upto]


class _PartialAggregate(_WindowAggregate):
    """Key: system. Messages ``("part", shard, version, {window: [rank, ctr, online]}, requests
    updated)`` (see the module); the panes, windows and deadlines of
    :class:`~.window_aggregate._WindowAggregate` (fixed windows), its state :class:`_PartsCore`.
    ``online`` / ``boot``: the job's :class:`~.coarse_online.StreamOnline` /
    :class:`~.coarse_online.StreamBootstrap`, or None."""

    def __init__(self, cfg, online=None, boot=None):
        super().__init__(cfg)
        self.online = online
        self.boot = boot

    def updates(self, msgs) -> int:
        """``early_count`` counts the requests the shards' messages updated (not the messages)."""
        return sum(int(m[4]) for m in msgs)

    def new_core(self) -> _PartsCore:
        return _PartsCore({}, {}, None)

    def core_from_state(self, value) -> _PartsCore:
        return _PartsCore.from_state(value)

    def candidate(self, msgs):
        ends = [self.cfg.spec.bounds(int(k))[1] for m in msgs for k in m[3]]
        return min(ends, default=None)

    def candidates(self, msgs):
        """The end and the expiry of every window the messages touch: each a timer of its own, so
        that a watermark passing many windows at once closes them all in one step."""
        ends = {self.cfg.spec.bounds(int(k))[1] for m in msgs for k in m[3]}
        return sorted(ends | {e + self.cfg.lateness for e in ends})

    def _fresh(self, c, m):
        _, shard, version, subs, _n = m
        return [int(k) for k in subs if c.parts.get(int(k), {}).get(shard, [-1])[0] < version]

    def apply(self, system, c, m, dry=False):
        """Each window of a shard's message on its own: a window's part is the shard's whole state
        of that window (its requests lie in that window only), so the parts of the open windows
        count and those of the closed ones go to late data (``late:update``). Rejecting the whole
        message lost the open windows' latest requests when no later message of that shard came
        before they closed. A shard learns that a window closed later than the aggregate does (its
        own timer), so it may send a late request beside on-time ones: seen on Flink after a
        restore from a checkpoint, a message of four windows, the first closed."""
        fresh = self._fresh(c, m)
        if not fresh:
            return "stale"
        closed = [k for k in fresh if self._frozen(c, k)]
        if len(closed) == len(fresh):
            if not dry:
                self._reject(system, m, fresh)
            return "late"
        if dry:
            return "ok"
        if closed:
            self._reject(system, m, closed)
        _, shard, version, subs, _n = m
        for k in fresh:
            if k in closed:
                continue
            rank, ctr, onl = subs[k] if k in subs else subs[str(k)]
            c.parts.setdefault(k, {})[shard] = [version, rank, ctr, onl]
            p = c.panes.get(k)
            if p is None:
                p = c.panes[k] = _PaneState()
            p.dirty = True
        return "ok"

    def reject(self, system, c, m):
        fresh = self._fresh(c, m)
        if fresh:
            self._reject(system, m, fresh)

    def _reject(self, system, m, subs):
        spec = self.cfg.spec
        self._rejects.append(_late_record(
            cn.LATE_UPDATE, {"kind": "part", "system_id": system, "shard": m[1],
                            "windows": [[_fmt_us(a), _fmt_us(b)] for a, b in (spec.bounds(s) for s in subs)]},
            "a shard's update arrived after a window it changes closed"))

    def window_rows(self, c, j):
        rank: dict = {}
        ctr: dict = {}
        onl: dict = {}
        mm = self.boot if self.boot is not None else self.mm
        for _shard, (_v, r, cl, on) in sorted(c.parts.get(j, {}).items()):
            for label, st in r.items():
                cur = rank.get(label)
                rank[label] = [1, st] if cur is None else [1, mm.merge([cur[1], st])]
            if on:
                self.online.add(onl, on)
            _add_clicks(ctr, cl)
        out = self._ctr_rows(ctr, self._rank_rows(rank))
        if onl:
            self.online.rows(onl, *self.cfg.spec.bounds(j), None, self.cfg.ci_level, out, bounded=self.cfg.bounded,
                             kind=self.cfg.intervals)
        return out

    def _rank_rows(self, merged_rank):
        if self.boot is None:
            return super()._rank_rows(merged_rank)
        return {label: self.boot.rows(self.names, st) for label, (nreq, st) in merged_rank.items() if nreq > 0}

    def drop_closed(self, c, now):
        for k in [k for k in c.parts if self.cfg.spec.bounds(k)[1] + self.cfg.lateness <= now]:
            del c.parts[k]


__all__: list = []  # the engine's own stage: ColumnarStreamMetrics is the public transform
