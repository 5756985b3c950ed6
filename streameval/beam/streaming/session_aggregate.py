"""Stage 5, the aggregate for session windows (key: system).

Core state (one ``ReadModifyWriteState`` per system, plain primitives): the latest
contribution of every open request with its place ``[session key, first ts, last ts]`` (micros),
the session keys changed since the last firing, the pane book-keeping of each session (identified
by ``"<session key>\x1f<start micros>"``), the closed sessions of each key (kept for the
retention) and the time up to which sessions closed. Sessions are recomputed from the requests'
places at each firing; a session that disappears (merged into another) gets a final pane of
empty rows. An update touching a closed session is late: it goes to the side output, unapplied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .aggregate import _AggregateBase, _PaneState
from ...io import counters as cn
from .common import _SEP, _fmt_us, _late_record

class _Place(NamedTuple):
    """Where a request is active: its session ``key`` (``"user=<id>"`` or ``"request=<id>"``) and
    the times (micros) of its ``first`` and ``last`` kept impressions. In messages and state:
    ``[key, first, last]``."""

    key: str
    first: int
    last: int


def _place(value) -> _Place | None:
    return None if value is None else _Place(*value)


class _SessionRank(NamedTuple):
    """A request version's ranking contribution: its ``order`` (``[version, judgment
    generation]``), ``place`` (None: it contributes nothing, a tombstone that keeps the order),
    slice ``labels`` and metric ``vector``. State: ``[order, place, labels, vector]``."""

    order: list
    place: _Place | None
    labels: list
    vector: list | None

    def to_state(self) -> list:
        return [self.order, None if self.place is None else list(self.place), self.labels, self.vector]


class _SessionCtr(NamedTuple):
    """A request version's click counts: its ``order`` (``[version]``), ``place`` and ``counts``
    (``{label: {position: [impressions, clicks]}}``). State: ``[order, place, counts]``."""

    order: list
    place: _Place | None
    counts: dict

    def to_state(self) -> list:
        return [self.order, None if self.place is None else list(self.place), self.counts]


def _contribution(value):
    """A :class:`_SessionRank` (four fields) or :class:`_SessionCtr` (three) from its state."""
    if len(value) == 4:
        order, place, labels, vector = value
        return _SessionRank(order, _place(place), labels, vector)
    order, place, counts = value
    return _SessionCtr(order, _place(place), counts)


@dataclass(slots=True)
class _SessionCore:
    """The core state of a system's session aggregate.

    * ``requests``: ``{contribution key: _SessionRank or _SessionCtr}``, the latest contribution
      of every open request (keys as in :mod:`.window_aggregate`);
    * ``dirty``: the session keys changed since their sessions were last recomputed;
    * ``panes``: ``{"<session key>\x1f<start micros>": _PaneState}`` (with the session's ``end``);
    * ``closed``: ``{session key: [[start, end], ...]}``, the closed sessions (micros), kept for
      the retention;
    * ``closed_upto``: the time (micros) up to which sessions closed, or None.

    State: ``[requests (as lists), dirty, panes (as lists), closed, closed_upto]``.
    """

    requests: dict
    dirty: list
    panes: dict
    closed: dict
    closed_upto: int | None

    @classmethod
    def from_state(cls, value) -> "_SessionCore":
        reqs, dirty, panes, closed, closed_upto = value
        return cls({k: _contribution(e) for k, e in reqs.items()}, dirty,
                   {wid: _PaneState.from_state(p) for wid, p in panes.items()}, closed, closed_upto)

    def to_state(self) -> list:
        return [{k: e.to_state() for k, e in self.requests.items()}, self.dirty,
                {wid: p.to_state() for wid, p in self.panes.items()}, self.closed, self.closed_upto]


class _SessionAggregate(_AggregateBase):
    """Key: system. Session windows: the latest contribution of every open request, grouped by
    session key; the sessions (requests less than the gap apart) of the keys that changed are
    recomputed at each firing. A session is identified by its key and start; one that disappears
    (merged into another by a request bridging the gap) gets a final pane of empty rows."""

    def new_core(self) -> _SessionCore:
        return _SessionCore({}, [], {}, {}, None)

    def core_from_state(self, value) -> _SessionCore:
        return _SessionCore.from_state(value)

    def window_of(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        return int(start), c.panes[wid].end, skey

    def candidate(self, msgs):
        best = None
        for m in msgs:
            place = _place(m[4] if m[0] == "rank" else m[3])
            if place is None:
                continue
            end = place.last + self.cfg.spec.size
            best = end if best is None else min(best, end)
        return best

    def _reject(self, system, m, rkey, detail, reason):
        self._rejects.append(_late_record(
            cn.LATE_UPDATE, dict({"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1]}, **detail),
            reason))

    def _check(self, c, m):
        """(key, order, place, None) when the message applies, (key, order, place, (detail,
        reason)) when it is late, None when it is stale."""
        reqs = c.requests
        gap = self.cfg.spec.size
        if m[0] == "rank":
            _, rkey, query, order, place, labels, vector = m
            key = "r" + _SEP + rkey + _SEP + query
        else:
            _, rkey, version, place, counts = m
            key = "c" + _SEP + rkey
            order = [version]
        place = _place(place)
        old = reqs.get(key)
        if old is not None and old.order >= order:
            return None
        places = [q for q in ([old.place] if old is not None else []) + [place] if q is not None]
        for skey, first, last in places:
            for a, b in c.closed.get(skey, []):
                if first < b and last + gap > a:  # it is in, or would join, a closed session
                    return key, order, places, ({"session": skey, "session_window": [_fmt_us(a), _fmt_us(b)]},
                                                "an update of this request arrived after its session closed")
        upto = c.closed_upto
        if place is not None and old is None and upto is not None and place.last + gap + self.cfg.lateness <= upto:
            return key, order, places, ({"session": place.key, "time": _fmt_us(place.first)},
                                        "the request's session closed before the request arrived")
        return key, order, places, None

    def apply(self, system, c, m, dry=False):
        found = self._check(c, m)
        if found is None:
            return "stale"
        key, order, places, late = found
        if late is not None:
            if not dry:
                self._reject(system, m, m[1], *late)
            return "late"
        if dry:
            return "ok"
        if m[0] == "rank":
            _, _rkey, _query, _order, place, labels, vector = m
            c.requests[key] = _SessionRank(order, _place(place) if vector is not None else None, labels, vector)
        else:
            _, _rkey, _version, place, counts = m
            c.requests[key] = _SessionCtr(order, _place(place), counts)
        for skey, _, _ in places:
            if skey not in c.dirty:
                c.dirty.append(skey)
        return "ok"

    def reject(self, system, c, m):
        found = self._check(c, m)
        if found is not None:
            late = found[3] or ({}, "another part of this update of the request arrived after its session closed")
            self._reject(system, m, m[1], *late)

    def _sessions(self, c, skey):
        """[[start, end, entries]] of a session key, from its open requests' contributions."""
        gap = self.cfg.spec.size
        items = sorted(((e.place.first, k, e) for k, e in c.requests.items()
                        if e.place is not None and e.place.key == skey), key=lambda x: (x[0], x[1]))
        out = []
        for t, _, e in items:
            end = e.place.last + gap
            if out and t < out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
                out[-1][2].append(e)
            else:
                out.append([t, end, [e]])
        return out

    def _refresh(self, c) -> list:
        """Recompute the sessions of the changed keys; returns the identities that disappeared and
        had emitted rows (they need a final empty pane)."""
        gone = []
        for skey in c.dirty:
            now = {f"{skey}{_SEP}{start}": end for start, end, _ in self._sessions(c, skey)}
            for wid in [w for w in c.panes if w.rsplit(_SEP, 1)[0] == skey and w not in now]:
                if c.panes[wid].emitted:
                    gone.append(wid)
                else:
                    del c.panes[wid]
            for wid, end in now.items():
                p = c.panes.get(wid)
                if p is None:
                    p = c.panes[wid] = _PaneState(end=end)
                p.end = end
                p.dirty = True
        c.dirty = []
        return gone

    def _close_gone(self, system, c, gone, ts):
        for wid in gone:
            p = c.panes[wid]
            yield from self._pane(system, c, wid, "late" if p.on_time else "early", True, ts)
            del c.panes[wid]

    def _emit_dirty(self, system, c, ts):
        gone = self._refresh(c)
        yield from self._late_out(ts)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c.panes):
            p = c.panes[wid]
            if p.dirty:
                yield from self._pane(system, c, wid, "late" if p.on_time else "early", False, ts)

    def window_rows(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        start = int(start)
        rank: dict = {}
        ctr: dict = {}
        for a, b, entries in self._sessions(c, skey):
            if a != start:
                continue
            for e in entries:
                if isinstance(e, _SessionRank):
                    for label in e.labels:
                        cell = rank.setdefault(label, [0, self.mm.create()])  # [requests, moments]
                        cell[0] += 1
                        self.mm.add(cell[1], e.vector)
                else:
                    for label, by_pos in e.counts.items():
                        dl = ctr.setdefault(label, {})
                        for pos, (i, n) in by_pos.items():
                            cell = dl.setdefault(pos, [0, 0])
                            cell[0] += i
                            cell[1] += n
        return self._ctr_rows(ctr, self._rank_rows(rank))

    def next_deadline(self, c):
        best = None
        for p in c.panes.values():
            end = p.end
            d = end + self.cfg.lateness
            if not p.on_time or p.dirty:
                d = min(d, end)
            best = d if best is None else min(best, d)
        if c.dirty:  # changes not yet grouped into sessions: look again now
            best = c.closed_upto if best is None or (c.closed_upto is not None and c.closed_upto < best) else best
        return best

    def fire_deadlines(self, system, c, now, ts):
        L = self.cfg.lateness
        gone = self._refresh(c)
        c.closed_upto = now if c.closed_upto is None else max(c.closed_upto, now)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c.panes):
            p = c.panes[wid]
            end = p.end
            if end > now:
                continue
            final = end + L <= now
            if not p.on_time:
                yield from self._pane(system, c, wid, "on_time", final, ts)
            elif p.dirty or final:
                yield from self._pane(system, c, wid, "late", final, ts)
            if final:
                skey, start = wid.rsplit(_SEP, 1)
                start = int(start)
                c.closed.setdefault(skey, []).append([start, end])
                for k, e in list(c.requests.items()):
                    if e.place is not None and e.place.key == skey and start <= e.place.first < end:
                        del c.requests[k]
                del c.panes[wid]
        keep_after = now - self.cfg.retention  # forget closed sessions after the retention
        for skey in list(c.closed):
            c.closed[skey] = [w for w in c.closed[skey] if w[1] + L > keep_after]
            if not c.closed[skey]:
                del c.closed[skey]
