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

from .aggregate import _AggregateBase, _PaneState
from .common import _SEP, _fmt_us, _late_record

# core of the session aggregate:
# [reqs {key: entry}, dirty session keys, panes {"skey\x1fstart": PaneState + [end]}, closed
#  {skey: [[start, end], ...]}, closed_upto]
_SREQ, _SDIRTY, _SPANES, _SCLOSED, _SUPTO = range(5)


class _SessionAggregate(_AggregateBase):
    """Key: system. Session windows: the latest contribution of every open request, grouped by
    session key; the sessions (requests less than the gap apart) of the keys that changed are
    recomputed at each firing. A session is identified by its key and start; one that disappears
    (merged into another by a request bridging the gap) gets a final pane of empty rows."""

    def new_core(self):
        return [{}, [], {}, {}, None]

    def panes(self, c):
        return c[_SPANES]

    def pane_ids(self, c):
        return sorted(c[_SPANES])

    def last_event(self, c):
        return c[_SUPTO] or 0

    def window_of(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        return int(start), c[_SPANES][wid][4], skey

    def candidate(self, msgs):
        best = None
        for m in msgs:
            place = m[4] if m[0] == "rank" else m[3]
            if place is None:
                continue
            end = place[2] + self.cfg.spec.size
            best = end if best is None else min(best, end)
        return best

    def _reject(self, system, m, rkey, detail, reason):
        self._rejects.append(_late_record(
            "late:update", dict({"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1]}, **detail),
            reason))

    def _check(self, c, m):
        """(key, order, place, None) when the message applies, (key, order, place, (detail,
        reason)) when it is late, None when it is stale."""
        reqs = c[_SREQ]
        gap = self.cfg.spec.size
        if m[0] == "rank":
            _, rkey, query, order, place, labels, vector = m
            key = "r" + _SEP + rkey + _SEP + query
        else:
            _, rkey, version, place, counts = m
            key = "c" + _SEP + rkey
            order = [version]
        old = reqs.get(key)
        if old is not None and old[0] >= order:
            return None
        places = [q for q in ([old[1]] if old is not None else []) + [place] if q is not None]
        for skey, first, last in places:
            for a, b in c[_SCLOSED].get(skey, []):
                if first < b and last + gap > a:  # it is in, or would join, a closed session
                    return key, order, places, ({"session": skey, "session_window": [_fmt_us(a), _fmt_us(b)]},
                                                "an update of this request arrived after its session closed")
        upto = c[_SUPTO]
        if place is not None and old is None and upto is not None and place[2] + gap + self.cfg.lateness <= upto:
            return key, order, places, ({"session": place[0], "time": _fmt_us(place[1])},
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
            place, labels, vector = m[4], m[5], m[6]
            c[_SREQ][key] = [order, place if vector is not None else None, labels, vector]
        else:
            c[_SREQ][key] = [order, m[3], m[4]]
        for skey, _, _ in places:
            if skey not in c[_SDIRTY]:
                c[_SDIRTY].append(skey)
        return "ok"

    def reject(self, system, c, m):
        found = self._check(c, m)
        if found is not None:
            late = found[3] or ({}, "another part of this update of the request arrived after its session closed")
            self._reject(system, m, m[1], *late)

    def _sessions(self, c, skey):
        """[[start, end, entries]] of a session key, from its open requests' contributions."""
        gap = self.cfg.spec.size
        items = sorted(((e[1][1], k, e) for k, e in c[_SREQ].items() if e[1] is not None and e[1][0] == skey),
                       key=lambda x: (x[0], x[1]))
        out = []
        for t, _, e in items:
            end = e[1][2] + gap
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
        for skey in c[_SDIRTY]:
            now = {f"{skey}{_SEP}{start}": end for start, end, _ in self._sessions(c, skey)}
            for wid in [w for w in c[_SPANES] if w.rsplit(_SEP, 1)[0] == skey and w not in now]:
                if c[_SPANES][wid][_PaneState.EMITTED]:
                    gone.append(wid)
                else:
                    del c[_SPANES][wid]
            for wid, end in now.items():
                p = c[_SPANES].get(wid)
                if p is None:
                    p = c[_SPANES][wid] = _PaneState.new() + [end]
                p[4] = end
                p[_PaneState.DIRTY] = True
        c[_SDIRTY] = []
        return gone

    def _close_gone(self, system, c, gone, ts):
        for wid in gone:
            p = c[_SPANES][wid]
            yield from self._pane(system, c, wid, "late" if p[_PaneState.ONTIME] else "early", True, ts)
            del c[_SPANES][wid]

    def _emit_dirty(self, system, c, ts):
        gone = self._refresh(c)
        yield from self._late_out(ts)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c[_SPANES]):
            p = c[_SPANES][wid]
            if p[_PaneState.DIRTY]:
                yield from self._pane(system, c, wid, "late" if p[_PaneState.ONTIME] else "early", False, ts)

    def window_rows(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        start = int(start)
        rank: dict = {}
        ctr: dict = {}
        for a, b, entries in self._sessions(c, skey):
            if a != start:
                continue
            for e in entries:
                if len(e) == 4:  # ranking
                    for label in e[2]:
                        cell = rank.setdefault(label, [0, self.mm.create()])
                        cell[0] += 1
                        self.mm.add(cell[1], e[3])
                else:
                    for label, by_pos in e[2].items():
                        dl = ctr.setdefault(label, {})
                        for pos, (i, n) in by_pos.items():
                            cell = dl.setdefault(pos, [0, 0])
                            cell[0] += i
                            cell[1] += n
        return self._ctr_rows(ctr, self._rank_rows(rank))

    def next_deadline(self, c):
        best = None
        for p in c[_SPANES].values():
            end = p[4]
            d = end + self.cfg.lateness
            if not p[_PaneState.ONTIME] or p[_PaneState.DIRTY]:
                d = min(d, end)
            best = d if best is None else min(best, d)
        if c[_SDIRTY]:  # changes not yet grouped into sessions: look again now
            best = c[_SUPTO] if best is None or (c[_SUPTO] is not None and c[_SUPTO] < best) else best
        return best

    def fire_deadlines(self, system, c, now, ts):
        L = self.cfg.lateness
        gone = self._refresh(c)
        c[_SUPTO] = now if c[_SUPTO] is None else max(c[_SUPTO], now)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c[_SPANES]):
            p = c[_SPANES][wid]
            end = p[4]
            if end > now:
                continue
            final = end + L <= now
            if not p[_PaneState.ONTIME]:
                yield from self._pane(system, c, wid, "on_time", final, ts)
            elif p[_PaneState.DIRTY] or final:
                yield from self._pane(system, c, wid, "late", final, ts)
            if final:
                skey, start = wid.rsplit(_SEP, 1)
                start = int(start)
                c[_SCLOSED].setdefault(skey, []).append([start, end])
                for k, e in list(c[_SREQ].items()):
                    if e[1] is not None and e[1][0] == skey and start <= e[1][1] < end:
                        del c[_SREQ][k]
                del c[_SPANES][wid]
        keep_after = now - self.cfg.retention  # forget closed sessions after the retention
        for skey in list(c[_SCLOSED]):
            c[_SCLOSED][skey] = [w for w in c[_SCLOSED][skey] if w[1] + L > keep_after]
            if not c[_SCLOSED][skey]:
                del c[_SCLOSED][skey]
