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

from .aggregate import _AggregateBase, _mm_sub, _PaneState
from .common import _SEP, _decode, _encode, _fmt_us, _late_record

# core of the windowed aggregate:
# [reqs {key: entry}, rank sums {sub: {label: [nreq, mm]}}, ctr sums {sub: {label: {pos: [i, c]}}},
#  panes {window: PaneState}, closed_upto]
_CREQ, _CRANK, _CCTR, _CPANES, _CCLOSED = range(5)


class _WindowAggregate(_AggregateBase):
    """Key: system. Fixed and sliding windows (sub-windows of the period, merged per window)."""

    def new_core(self):
        return [{}, {}, {}, {}, None]

    def panes(self, c):
        return c[_CPANES]

    def pane_ids(self, c):
        return sorted(c[_CPANES])

    def last_event(self, c):
        return c[_CCLOSED] or 0

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
        closed = c[_CCLOSED]
        return closed is not None and self.cfg.expiry(k) <= closed

    def _touch(self, c, k):
        for j in self.cfg.spec.windows_of(k):
            p = c[_CPANES].get(j)
            if p is None:
                p = c[_CPANES][j] = _PaneState.new()
            p[_PaneState.DIRTY] = True

    def _subs(self, c, m):
        """(key, old entry, sub-windows the message changes) or None when it is stale."""
        reqs = c[_CREQ]  # {key: [last sub-window, encoded entry]}
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            key = "r" + _SEP + rkey + _SEP + query
        else:
            _, rkey, version, _place, counts = m
            key, order = "c" + _SEP + rkey, [version]
        cell = reqs.get(key)
        old = None if cell is None else _decode(cell[1])
        if old is not None and old[0] >= order:
            return None
        if m[0] == "rank":
            subs = {k} if vector is not None else set()
            if old is not None:
                subs.add(old[1])
        else:
            subs = {int(x) for x in counts}
            if old is not None:
                subs |= {int(x) for x in old[1]}
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
        reqs = c[_CREQ]
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            if old is not None:
                self._rank_sub(c, old[1], old[2], old[3], -1)
            if vector is not None:
                self._rank_sub(c, k, labels, vector, +1)
                reqs[key] = [k, _encode([order, k, labels, vector])]
            elif old is not None:
                reqs[key] = [old[1], _encode([order, old[1], [], None])]  # a tombstone keeps the order
        else:
            _, rkey, version, _place, counts = m
            if old is not None:
                self._ctr_add(c, old[1], -1)
            self._ctr_add(c, counts, +1)
            reqs[key] = [max(subs, default=None), _encode([[version], counts])]
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
            "late:update", {"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1],
                            "windows": [[_fmt_us(a), _fmt_us(b)] for a, b in (spec.bounds(s) for s in subs)]},
            "an update of this request arrived after a window it changes closed"))

    def _rank_sub(self, c, k, labels, vector, sign):
        if vector is None:
            return
        by_label = c[_CRANK].setdefault(k, {})
        for label in labels:
            cell = by_label.get(label)
            if cell is None:
                cell = by_label[label] = [0, self.mm.create()]
            cell[0] += sign
            if sign > 0:
                self.mm.add(cell[1], vector)
            else:
                _mm_sub(cell[1], vector)
            if cell[0] == 0:
                del by_label[label]
        if not by_label:
            del c[_CRANK][k]

    def _ctr_add(self, c, counts, sign):
        for k, by_label in counts.items():
            k = int(k)
            dst = c[_CCTR].setdefault(k, {})
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
                del c[_CCTR][k]

    def window_rows(self, c, j):
        spec = self.cfg.spec
        subs = range(j, j + spec.per_window)
        rank: dict = {}
        for k in subs:
            for label, (nreq, st) in c[_CRANK].get(k, {}).items():
                cur = rank.get(label)
                rank[label] = [nreq, st] if cur is None else [cur[0] + nreq, self.mm.merge([cur[1], st])]
        out = self._rank_rows(rank)
        ctr: dict = {}
        for k in subs:
            for label, by_pos in c[_CCTR].get(k, {}).items():
                dl = ctr.setdefault(label, {})
                for pos, (i, n) in by_pos.items():
                    cell = dl.setdefault(pos, [0, 0])
                    cell[0] += i
                    cell[1] += n
        return self._ctr_rows(ctr, out)

    def next_deadline(self, c):
        spec, cfg = self.cfg.spec, self.cfg
        best = None
        for j, p in c[_CPANES].items():
            start, end = spec.bounds(j)
            d = end + cfg.lateness
            if not p[_PaneState.ONTIME] or p[_PaneState.DIRTY]:
                d = min(d, end)
            best = d if best is None else min(best, d)
        return best

    def fire_deadlines(self, system, c, now, ts):
        spec, cfg = self.cfg.spec, self.cfg
        c[_CCLOSED] = now if c[_CCLOSED] is None else max(c[_CCLOSED], now)
        for j in sorted(c[_CPANES]):
            p = c[_CPANES][j]
            start, end = spec.bounds(j)
            if end > now:
                continue
            final = end + cfg.lateness <= now
            if not p[_PaneState.ONTIME]:
                yield from self._pane(system, c, j, "on_time", final, ts)
            elif p[_PaneState.DIRTY] or final:
                yield from self._pane(system, c, j, "late", final, ts)
            if final:
                del c[_CPANES][j]
        # drop the sub-windows whose last window (window k) closed, and the requests living only there
        done = (lambda k: spec.bounds(k)[1] + cfg.lateness <= now)
        for k in [k for k in set(c[_CRANK]) | set(c[_CCTR]) if done(k)]:
            c[_CRANK].pop(k, None)
            c[_CCTR].pop(k, None)
        for key, (last, _) in list(c[_CREQ].items()):
            if last is None or done(last):
                del c[_CREQ][key]
