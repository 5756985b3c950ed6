"""Stage 3, requests (key: a shard of request ids): each request's records, cleaned as in batch,
and a new *version* of the request downstream at each change.

Input: ``(shard, [closed_upto or None, pieces])`` (pieces of :mod:`.prepare`, through the gate or
not). Output: ``(query_id, [("req", ...), ("drop", ...)])`` to the queries stage (``"queries"``)
when ranking metrics are computed, else ``(system, [("ctr", ...)])`` straight to the aggregate
(main output); late records and dead letters as ``(_SIDE_KEY, [("side", dead_letter), ...])``.
The messages (tuples; times in micros):

* ``("req", request key, system, version, place, labels, served state, rank close, closed_upto,
  ctr message or None, kept impressions)``: ``place`` is the sub-window of the request's first
  impression (windows) or ``[session key, first ts, last ts]`` (sessions); ``served state`` the
  :class:`~streameval.beam.combiners.RankingStateCombineFn` accumulator's served items;
* ``("drop", request key, system, version)``: the request moved to another query;
* ``("ctr", request key, version, place or None, counts)``: click counts
  ``{sub-window: {label: {position: [impressions, clicks]}}}`` (sessions: ``{label: ...}``).

The fates of a request's records (``impressions_accepted``, ``duplicate:impression``,
``rejected:impression:<reason>``, ``clicks_accepted``, ``rejected:click:...``) are counted when it
closes, in the timer.
"""

from __future__ import annotations

from collections import defaultdict

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer

from ...io import cleaning, records
from ..combiners import RankingStateCombineFn
from ..transforms import slice_labels
from .common import (
    _SEP,
    _SIDE_KEY,
    REASON_CLICK_UNMATCHED,
    _category,
    _decode,
    _encode,
    _fmt_us,
    _late_record,
    _micros,
    _tally,
    _tally_late,
    _when,
)
from .prepare import _ACCEPTED, _DEAD, _PENDING
from .windows import _Config


# --------------------------------------------------------------------------------------------
# requests

# per request id: [systems {system: SysEntry}, click events, tombstone [closed_at, forget_at] or None]
_SYS, _CLICKS, _TOMB = 0, 1, 2
# per (request, system): [acc, imps, version, emitted query, ctr emitted, rank_close, last impression ts,
#  records {event_id: [[content key or None, record, copies], ...]}, kept [[event_id, variant], ...]]
_ACC, _IMPS, _VER, _EQ, _CV, _RCLOSE, _TLAST, _RECS, _KEPT = range(9)
# an impression kept for CTR: [ts, position, clicked, item, labels]
# a click event: a click entry of .prepare ([item, ts, system or None, raw json, fate, event key])


class _Requests:
    """Key: a shard of request ids. Each request's records (per system), cleaned as the batch job
    cleans them (:func:`streameval.io.cleaning.clean_request`: replays are duplicates, conflicting
    event ids and items served twice rejected; decided on all the records seen, so the order of
    arrival does not matter), the kept impressions' served items (RankingStateCombineFn
    accumulator), its impressions for CTR and its click events; every change of the kept records
    or of the clicks sends a new version of the request to its query (ranking) and to its system
    (clicks). A replay changes nothing and sends nothing. The fates of the request's records
    (accepted, duplicate, rejected) are final, and counted, when the request closes."""

    STATE = ReadModifyWriteStateSpec("requests", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # [armed, closed_upto]
    DUE = TimerSpec("due", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg
        self.combine = RankingStateCombineFn(cfg.ops, cfg.attr_keys)

    # -- windows and deadlines ---------------------------------------------------------------
    def _rank_place(self, rid, ent):
        cfg = self.cfg
        t0 = ent[_ACC][0][3]
        if cfg.spec.windowed:
            return cfg.spec.sub(t0)
        return [self._session_key(rid, ent), t0, ent[_TLAST]]

    def _session_key(self, rid, ent):
        if self.cfg.spec.by == "user":
            user = ent[_ACC][2].get("\x00user")
            if user is not None:
                return f"user={user}"
        return f"request={rid}"

    def _closes(self, ent):
        """(rank_close, last deadline) of a system entry."""
        cfg = self.cfg
        if cfg.spec.windowed:
            rc = cfg.expiry(cfg.spec.sub(ent[_ACC][0][3]))
            return rc, max(rc, cfg.expiry(cfg.spec.sub(ent[_TLAST])))
        rc = ent[_TLAST] + cfg.spec.size + cfg.lateness
        return rc, rc

    def _click_deadline(self, c):
        cfg = self.cfg
        if cfg.spec.windowed:
            return cfg.expiry(cfg.spec.sub(c[1]))
        return c[1] + cfg.spec.size + cfg.lateness

    # -- element processing ------------------------------------------------------------------
    def process(self, kv, state, meta,
                due):
        _, (gate_closed, msgs) = kv
        reqs = state.read() or {}
        armed, closed_upto = meta.read() or [None, None]
        if gate_closed is not None and (closed_upto is None or gate_closed > closed_upto):
            closed_upto = gate_closed
        closed = (lambda t: closed_upto is not None and t <= closed_upto)
        self._closed_upto = closed_upto
        nxt = armed
        out_q: dict = defaultdict(list)
        out_s: dict = defaultdict(list)
        late = []
        touched: dict = {}
        side = []
        for m in msgs:
            if m[0] == "side":
                side.append(m)
                continue
            kind, rid, items = m
            entry = touched.get(rid)
            if entry is None:
                cell = reqs.get(rid)
                entry = touched[rid] = [{}, [], None] if cell is None else _decode(cell[1])
            if entry[_TOMB] is not None:
                for it in items:
                    late.append(_late_record(
                        f"late:{'impression' if kind == 'imp' else 'click'}", it if kind == "imp" else it[3],
                        f"request {rid} is final: its windows closed at {_fmt_us(entry[_TOMB][0])}"))
                continue
            changed = set()
            if kind == "imp":
                self._add_impressions(rid, entry, items, changed, late, closed)
            else:
                self._add_clicks(rid, entry, items, changed, late, closed)
            for system in sorted(changed):
                self._emit(rid, system, entry[_SYS][system], out_q, out_s)
        for rid, entry in touched.items():
            d = self._next_deadline(entry, closed_upto)
            reqs[rid] = [d, _encode(entry)]
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if late:
            _tally_late(self.cfg.run, late)
            side.extend(("side", r) for r in late)
        if side:
            yield _SIDE_KEY, side
        if nxt is not None and nxt != armed:
            due.set(_when(nxt))
        meta.write([nxt, closed_upto])
        state.write(reqs)
        for q, ms in out_q.items():
            yield pvalue.TaggedOutput("queries", (q, ms))
        yield from out_s.items()

    def _add_impressions(self, rid, entry, recs, changed, late, closed):
        touched = set()
        for rec in recs:
            system = rec["system_id"]
            ent = entry[_SYS].get(system)
            if ent is not None and ent[_RCLOSE] is not None and closed(ent[_RCLOSE]):
                late.append(_late_record("late:impression", rec,
                                         f"request {rid} of {system} is final: its window closed at "
                                         f"{_fmt_us(ent[_RCLOSE])}"))
                continue
            if ent is None:
                ent = entry[_SYS][system] = [self.combine.create_accumulator(), [], 0, None, False, None, None, {},
                                             None]
            variants = ent[_RECS].setdefault(rec["event_id"], [])
            if not variants:
                variants.append([None, rec, 1])
                touched.add(system)
                continue
            key = cleaning.content_key(rec)
            for v in variants:
                if v[0] is None:
                    v[0] = cleaning.content_key(v[1])
            for v in variants:
                if v[0] == key:
                    v[2] += 1  # a replay: the request's records are unchanged
                    break
            else:
                variants.append([key, rec, 1])
                touched.add(system)
        for system in touched:
            if self._rebuild(entry, system):
                changed.add(system)

    @staticmethod
    def _clean(ent):
        """``clean_request`` over the records of a system entry: (kept, duplicates, rejected,
        {id(record): [event_id, variant]})."""
        flat, where = [], {}
        for eid, variants in ent[_RECS].items():
            for i, v in enumerate(variants):
                where[id(v[1])] = [eid, i]
                flat.extend([v[1]] * v[2])
        kept, n_dup, rejected = cleaning.clean_request(flat)
        return kept, n_dup, rejected, where

    def _rebuild(self, entry, system) -> bool:
        """Recompute the request's kept impressions (and from them its ranking state, CTR
        impressions and last impression time); False when the kept set did not change."""
        cfg = self.cfg
        ent = entry[_SYS][system]
        kept, _, _, where = self._clean(ent)
        sig = [where[id(r)] for r in kept]
        if sig == ent[_KEPT]:
            return False
        ent[_KEPT] = sig
        acc = self.combine.create_accumulator()
        imps = []
        tlast = None
        for rec in kept:
            ts = int(rec["timestamp"])
            if cfg.ranking:
                self.combine.add_input(acc, rec)
            else:  # click metrics only: the request's time, query and attributes, not its items
                if acc[0][3] is None or ts < acc[0][3]:
                    acc[0][3] = ts
                q = rec.get("query_id")
                if q is not None and (acc[1] is None or q < acc[1]):
                    acc[1] = q
            user = rec.get("user_id")
            if user is not None and ("\x00user" not in acc[2] or user < acc[2]["\x00user"]):
                acc[2]["\x00user"] = user
            tlast = ts if tlast is None else max(tlast, ts)
            if cfg.ctr:
                clicked = rec.get("clicked")
                imp = [ts, int(rec["position"]), None if clicked is None else bool(clicked), rec["item_id"],
                       slice_labels(rec.get("attributes"), cfg.slice_specs)]
                for c in entry[_CLICKS]:
                    if c[4] != _DEAD and (c[2] is None or c[2] == system) and c[0] == imp[3] and \
                            ts <= c[1] <= ts + cfg.delay:
                        imp[2] = True
                imps.append(imp)
        ent[_ACC], ent[_IMPS], ent[_TLAST] = acc, imps, tlast
        ent[_RCLOSE] = self._closes(ent)[0]
        return True

    def _add_clicks(self, rid, entry, clicks, changed, late, closed):
        cfg = self.cfg
        seen = {c[5] for c in entry[_CLICKS]}
        dup = 0
        for c in clicks:
            item, cts, csys, raw = c[:4]
            if c[5] in seen:  # a replayed click event: no effect
                dup += 1
                continue
            matched = False
            too_late = False
            for system, ent in entry[_SYS].items():
                if csys is not None and csys != system:
                    continue
                for imp in ent[_IMPS]:
                    if imp[3] == item and imp[0] <= cts <= imp[0] + cfg.delay:
                        if closed(cfg.expiry(cfg.spec.sub(imp[0])) if cfg.spec.windowed else ent[_RCLOSE]):
                            too_late = True
                            continue
                        matched = True
                        if imp[2] is not True:
                            imp[2] = True
                            changed.add(system)
            if too_late and not matched:
                late.append(_late_record("late:click", raw,
                                         f"the clicked impression's window (request {rid}) already closed"))
                continue
            seen.add(c[5])
            entry[_CLICKS].append(list(c))
        _tally(cfg.run, "duplicate:click", dup)

    def _emit(self, rid, system, ent, out_q, out_s):
        cfg = self.cfg
        ent[_VER] += 1
        rkey = system + _SEP + rid
        acc = ent[_ACC]
        place = self._rank_place(rid, ent)
        ctr_msg = None
        if cfg.ctr:
            counts: dict = {}
            for ts, pos, clicked, _item, labels in ent[_IMPS]:
                if clicked is None:
                    continue
                if cfg.spec.windowed:
                    by_label = counts.setdefault(cfg.spec.sub(ts), {})
                else:
                    by_label = counts
                for label in labels:
                    c = by_label.setdefault(label, {}).setdefault(pos, [0, 0])
                    c[0] += 1
                    c[1] += clicked
            if counts or ent[_CV]:
                ctr_msg = ("ctr", rkey, ent[_VER], None if cfg.spec.windowed else place, counts)
                ent[_CV] = bool(counts)
        if cfg.ranking:
            # the click counts of this version travel with its ranking state, so that both reach
            # the aggregate in one element and are accepted (or found late) together
            qid = acc[1]
            attrs = {k: v for k, v in acc[2].items() if k != "\x00user"}
            labels = slice_labels(attrs, cfg.slice_specs)
            out_q[qid].append(("req", rkey, system, ent[_VER], place, labels, acc[0], ent[_RCLOSE],
                               self._closed_upto, ctr_msg, len(ent[_KEPT])))
            if ent[_EQ] is not None and ent[_EQ] != qid:
                out_q[ent[_EQ]].append(("drop", rkey, system, ent[_VER]))
            ent[_EQ] = qid
        elif ctr_msg is not None:
            out_s[system].append(ctr_msg)

    def _arm(self, reqs, meta, due, closed_upto):
        nxt = None
        for d, _ in reqs.values():
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if nxt is not None:
            due.set(_when(nxt))
        meta.write([nxt, closed_upto])

    def _next_deadline(self, entry, closed_upto):
        """When the entry needs attention: its tombstone expires, all its windows closed (it becomes
        a tombstone), or a pending click's window closed; rounded up to the cleanup step, so one
        timer firing per shard serves many windows (which windows closed is known from the gate)."""
        if entry[_TOMB] is not None:
            return self.cfg.round_up(entry[_TOMB][1])
        last = max((self._closes(ent)[1] for ent in entry[_SYS].values()), default=None)
        ds = [self._click_deadline(c) for c in entry[_CLICKS] if c[4] == _PENDING]
        if last is not None and (not ds or closed_upto is None or last > closed_upto):
            ds.append(last)  # (with clicks pending, a closed request waits for them, not for itself)
        return self.cfg.round_up(min(ds)) if ds else None

    def _click_matches(self, entry, c) -> bool:
        for system, ent in entry[_SYS].items():
            if c[2] is not None and c[2] != system:
                continue
            for imp in ent[_IMPS]:
                if imp[3] == c[0] and imp[0] <= c[1] <= imp[0] + self.cfg.delay:
                    return True
        return False

    def _final_fates(self, rid, entry) -> list:
        """Counts the fates of a closing request's impressions (accepted, duplicates, rejected by
        reason; for CTR counted or clicks not logged); the dead letters of the rejected ones."""
        cfg = self.cfg
        run = cfg.run
        dead = []
        for system in sorted(entry[_SYS]):
            ent = entry[_SYS][system]
            kept, n_dup, rejected, _ = self._clean(ent)
            _tally(run, "impressions_accepted", len(kept))
            _tally(run, "duplicate:impression", n_dup)
            for rec, reason in rejected:
                _tally(run, f"rejected:impression:{_category(reason)}")
                dead.append({"source": cfg.source, "raw": records.to_json_text(rec), "reason": reason})
            if cfg.ctr:
                not_logged = sum(imp[2] is None for imp in ent[_IMPS])
                _tally(run, "click_impressions", len(ent[_IMPS]) - not_logged)
                _tally(run, "click_impressions_not_logged", not_logged)
        return dead

    def on_due(self, state, meta,
               due, ts):
        cfg = self.cfg
        now = _micros(ts)
        reqs = state.read() or {}
        armed, closed_upto = meta.read() or [None, None]
        closed_upto = now if closed_upto is None else max(closed_upto, now)
        self._closed_upto = closed_upto
        side = []
        for rid in list(reqs):
            d, blob = reqs[rid]
            if d is None or d > now:
                continue
            entry = _decode(blob)
            if entry[_TOMB] is not None:
                if entry[_TOMB][1] <= now:
                    del reqs[rid]
                continue
            pending = False
            for c in entry[_CLICKS]:
                if c[4] != _PENDING:
                    continue
                if self._click_deadline(c) > now:
                    pending = True
                elif self._click_matches(entry, c):
                    c[4] = _ACCEPTED
                    _tally(cfg.run, "clicks_accepted")
                else:
                    c[4] = _DEAD
                    _tally(cfg.run, f"rejected:click:{REASON_CLICK_UNMATCHED}")
                    side.append(_late_record(
                        "unmatched:click", c[3],
                        f"{REASON_CLICK_UNMATCHED} (no impression of item {c[0]!r} in request {rid!r} served at "
                        f"most {cfg.delay / 1e6:g} s before the click)"))
            last = max((self._closes(ent)[1] for ent in entry[_SYS].values()), default=None)
            if (last is None or last <= now) and not pending:
                side.extend(self._final_fates(rid, entry))
                if last is None:
                    del reqs[rid]
                    continue
                entry = [{}, [], [last, last + cfg.retention]]
            reqs[rid] = [self._next_deadline(entry, closed_upto), _encode(entry)]
        if side:
            yield _SIDE_KEY, [("side", r) for r in side]
        self._arm(reqs, meta, due, closed_upto)
        state.write(reqs)


class _RequestsFn(beam.DoFn):
    """Keyed state of request shards (logic in :class:`_Requests`; a DoFn with few methods keeps
    the runner's per-bundle introspection cheap)."""

    STATE, META, DUE = _Requests.STATE, _Requests.META, _Requests.DUE

    def __init__(self, cfg):
        self.logic = _Requests(cfg)

    def process(self, kv, state=beam.DoFn.StateParam(STATE), meta=beam.DoFn.StateParam(META),
                due=beam.DoFn.TimerParam(DUE)):
        return self.logic.process(kv, state, meta, due)

    @on_timer(DUE)
    def on_due(self, state=beam.DoFn.StateParam(STATE), meta=beam.DoFn.StateParam(META),
               due=beam.DoFn.TimerParam(DUE), ts=beam.DoFn.TimestampParam):
        return self.logic.on_due(state, meta, due, ts)
