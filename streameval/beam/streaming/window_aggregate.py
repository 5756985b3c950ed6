"""Stage 5, the aggregate for fixed and sliding windows (key: system).

Sums are kept per sub-window of the period and merged into each window when its rows are
computed. Core state (one ``ReadModifyWriteState`` per system, plain primitives): the latest
contribution of each request, exact per-sub-window sums of the ranking metrics (count of
requests and :class:`~streameval.accumulators.moments.MeanMoments` state, per slice label) and
of the click counts (``{label: {position: [impressions, clicks]}}``), the pane book-keeping of
each open window and the time (micros) up to which windows closed. An update that changes a
sub-window whose windows are all final is late: it goes to the side output, unapplied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .aggregate import _AggregateBase, _mm_sub, _PaneState
from ...io import counters as cn
from .common import _SEP, _decode, _encode, _fmt_us, _late_record

class _RankContribution(NamedTuple):
    """What a request version added to the ranking sums: its ``order`` (``[version, judgment
    generation]``: a message with a lower one is stale), the sub-window ``sub`` of its first
    impression, its slice ``labels`` and metric ``vector`` (None: it contributes nothing, a
    tombstone that keeps the order). Kept encoded: ``[order, sub, labels, vector]``."""

    order: list
    sub: int
    labels: list
    vector: list | None

    def encode(self) -> bytes:
        return _encode([self.order, self.sub, self.labels, self.vector])


class _CtrContribution(NamedTuple):
    """What a request version added to the click sums: its ``order`` (``[version]``) and its
    ``counts`` (``{sub-window: {label: {position: [impressions, clicks]}}}``). Kept encoded:
    ``[order, counts]``."""

    order: list
    counts: dict

    def encode(self) -> bytes:
        return _encode([self.order, self.counts])


@dataclass(slots=True)
class _RankSum:
    """Exact sums of the ranking metrics of one (sub-window, label): how many ``requests`` and
    their :class:`~streameval.accumulators.moments.MeanMoments` state ``moments``. State:
    ``[requests, moments]``."""

    requests: int
    moments: list


@dataclass(slots=True)
class _WindowCore:
    """The core state of a system's windowed aggregate.

    * ``requests``: ``{contribution key: [last sub-window, encoded contribution]}`` (a
      :class:`_RankContribution` under ``"r" + _SEP + request key + _SEP + query``, a
      :class:`_CtrContribution` under ``"c" + _SEP + request key``), decoded only when touched;
    * ``rank``: ``{sub-window: {label: _RankSum}}``;
    * ``ctr``: ``{sub-window: {label: {position: [impressions, clicks]}}}``;
    * ``panes``: ``{window index: _PaneState}`` of the open windows;
    * ``closed_upto``: the time (micros) up to which windows closed, or None.

    State: ``[requests, rank (sums as [requests, moments]), ctr, panes (as lists), closed_upto]``.
    """

    requests: dict
    rank: dict
    ctr: dict
    panes: dict
    closed_upto: int | None

    @classmethod
    def from_state(cls, value) -> "_WindowCore":
        reqs, rank, ctr, panes, closed_upto = value
        rank = {k: {label: _RankSum(*cell) for label, cell in by_label.items()} for k, by_label in rank.items()}
        return cls(reqs, rank, ctr, {j: _PaneState.from_state(p) for j, p in panes.items()}, closed_upto)

    def to_state(self) -> list:
        rank = {k: {label: [s.requests, s.moments] for label, s in by_label.items()}
                for k, by_label in self.rank.items()}
        return [self.requests, rank, self.ctr, {j: p.to_state() for j, p in self.panes.items()}, self.closed_upto]


class _WindowAggregate(_AggregateBase):
    """Key: system. Fixed and sliding windows (sub-windows of the period, merged per window)."""

    def new_core(self) -> _WindowCore:
        return _WindowCore({}, {}, {}, {}, None)

    def core_from_state(self, value) -> _WindowCore:
        return _WindowCore.from_state(value)

    def window_of(self, c, j):
        start, end = self.cfg.spec.bounds(j)
        return start, end, None

    def candidate(self, msgs):
        """Earliest window end among the windows the messages touch: the on-time pane's time, or
        (already past) a late pane as soon as the watermark moves."""
        spec = self.cfg.spec
        best = None
        for m in msgs:
            if m[0] == "rank":
                subs = [m[4]] if m[4] is not None else []
            else:
                subs = list(m[4])
            for k in subs:
                end = spec.bounds(k - spec.per_window + 1)[1]
                if best is None or end < best:
                    best = end
        return best

    def _frozen(self, c, k):
        closed = c.closed_upto
        return closed is not None and self.cfg.expiry(k) <= closed

    def _touch(self, c, k):
        for j in self.cfg.spec.windows_of(k):
            p = c.panes.get(j)
            if p is None:
                p = c.panes[j] = _PaneState()
            p.dirty = True

    def _subs(self, c, m):
        """(key, old contribution, sub-windows the message changes) or None when it is stale."""
        reqs = c.requests  # {key: [last sub-window, encoded contribution]}
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            key, kind = "r" + _SEP + rkey + _SEP + query, _RankContribution
        else:
            _, rkey, version, _place, counts = m
            key, order, kind = "c" + _SEP + rkey, [version], _CtrContribution
        cell = reqs.get(key)
        old = None if cell is None else kind(*_decode(cell[1]))
        if old is not None and old.order >= order:
            return None
        if m[0] == "rank":
            subs = {k} if vector is not None else set()
            if old is not None:
                subs.add(old.sub)
        else:
            subs = {int(x) for x in counts}
            if old is not None:
                subs |= {int(x) for x in old.counts}
        return key, old, subs

    def apply(self, system, c, m, dry=False):
        found = self._subs(c, m)
        if found is None:
            return "stale"
        key, old, subs = found
        if any(self._frozen(c, x) for x in subs):
            if not dry:
                self._reject(system, m, m[1], sorted(subs))
            return "late"
        if dry:
            return "ok"
        reqs = c.requests
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            if old is not None:
                self._rank_sub(c, old.sub, old.labels, old.vector, -1)
            if vector is not None:
                self._rank_sub(c, k, labels, vector, +1)
                reqs[key] = [k, _RankContribution(order, k, labels, vector).encode()]
            elif old is not None:  # a tombstone keeps the order
                reqs[key] = [old.sub, _RankContribution(order, old.sub, [], None).encode()]
        else:
            _, rkey, version, _place, counts = m
            if old is not None:
                self._ctr_add(c, old.counts, -1)
            self._ctr_add(c, counts, +1)
            reqs[key] = [max(subs, default=None), _CtrContribution([version], counts).encode()]
        for x in subs:
            self._touch(c, x)
        return "ok"

    def reject(self, system, c, m):
        found = self._subs(c, m)
        if found is not None:
            self._reject(system, m, m[1], sorted(found[2]))

    def _reject(self, system, m, rkey, subs):
        spec = self.cfg.spec
        self._rejects.append(_late_record(
            cn.LATE_UPDATE, {"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1],
                            "windows": [[_fmt_us(a), _fmt_us(b)] for a, b in (spec.bounds(s) for s in subs)]},
            "an update of this request arrived after a window it changes closed"))

    def _rank_sub(self, c, k, labels, vector, sign):
        if vector is None:
            return
        by_label = c.rank.setdefault(k, {})
        for label in labels:
            cell = by_label.get(label)
            if cell is None:
                cell = by_label[label] = _RankSum(0, self.mm.create())
            cell.requests += sign
            if sign > 0:
                self.mm.add(cell.moments, vector)
            else:
                _mm_sub(cell.moments, vector)
            if cell.requests == 0:
                del by_label[label]
        if not by_label:
            del c.rank[k]

    def _ctr_add(self, c, counts, sign):
        for k, by_label in counts.items():
            k = int(k)
            dst = c.ctr.setdefault(k, {})
            for label, by_pos in by_label.items():
                dl = dst.setdefault(label, {})
                for pos, (i, n) in by_pos.items():
                    cell = dl.setdefault(pos, [0, 0])
                    cell[0] += sign * i
                    cell[1] += sign * n
                    if cell[0] == 0:
                        del dl[pos]
                if not dl:
                    del dst[label]
            if not dst:
                del c.ctr[k]

    def window_rows(self, c, j):
        spec = self.cfg.spec
        subs = range(j, j + spec.per_window)
        rank: dict = {}
        for k in subs:
            for label, s in c.rank.get(k, {}).items():
                nreq, st = s.requests, s.moments
                cur = rank.get(label)
                rank[label] = [nreq, st] if cur is None else [cur[0] + nreq, self.mm.merge([cur[1], st])]
        out = self._rank_rows(rank)
        ctr: dict = {}
        for k in subs:
            for label, by_pos in c.ctr.get(k, {}).items():
                dl = ctr.setdefault(label, {})
                for pos, (i, n) in by_pos.items():
                    cell = dl.setdefault(pos, [0, 0])
                    cell[0] += i
                    cell[1] += n
        return self._ctr_rows(ctr, out)

    def next_deadline(self, c):
        spec, cfg = self.cfg.spec, self.cfg
        best = None
        for j, p in c.panes.items():
            start, end = spec.bounds(j)
            d = end + cfg.lateness
            if not p.on_time or p.dirty:
                d = min(d, end)
            best = d if best is None else min(best, d)
        return best

    def deadlines(self, c):
        """Every pane's deadlines (micros): its window's end while its on-time pane has not fired
        or it changed since its last pane, and its expiry (end plus the allowed lateness), each
        armed as a timer of its own (:func:`~.common.arm`)."""
        spec, lateness = self.cfg.spec, self.cfg.lateness
        out = set()
        for j, p in self.panes(c).items():
            end = spec.bounds(j)[1]
            out.add(end + lateness)
            if not p.on_time or p.dirty:
                out.add(end)
        return sorted(out)

    def fire_deadlines(self, system, c, now, ts):
        spec, cfg = self.cfg.spec, self.cfg
        c.closed_upto = now if c.closed_upto is None else max(c.closed_upto, now)
        for j in sorted(c.panes):
            p = c.panes[j]
            start, end = spec.bounds(j)
            if end > now:
                continue
            final = end + cfg.lateness <= now
            if not p.on_time:
                yield from self._pane(system, c, j, "on_time", final, ts)
            elif p.dirty or final:
                yield from self._pane(system, c, j, "late", final, ts)
            if final:
                del c.panes[j]
        self.drop_closed(c, now)

    def drop_closed(self, c, now):
        """Frees the state of the sub-windows whose last window closed by ``now``."""
        spec, cfg = self.cfg.spec, self.cfg
        # drop the sub-windows whose last window (window k) closed, and the requests living only there
        done = (lambda k: spec.bounds(k)[1] + cfg.lateness <= now)
        for k in [k for k in set(c.rank) | set(c.ctr) if done(k)]:
            c.rank.pop(k, None)
            c.ctr.pop(k, None)
        for key, (last, _) in list(c.requests.items()):
            if last is None or done(last):
                del c.requests[key]
