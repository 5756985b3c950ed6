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
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer

from ...accumulators.clicks import ctr_pos_add
from ...io import cleaning, records
from ...io import counters as cn
from ..combiners import (RankingStateCombineFn, request_attributes, request_min_timestamp, request_query_id,
                         request_state)
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
from .prepare import _ACCEPTED, _DEAD, _PENDING, _Click
from .windows import _Config
from ...io.dead_letters import dead_letter


# --------------------------------------------------------------------------------------------
# requests

# State of a shard (Beam state, FastPrimitivesCoder: plain primitives only):
#   STATE: {request id: [deadline (micros) or None, encoded _RequestEntry]} (an entry is decoded
#          only when an element or the timer touches it);
#   META:  a _RequestsMeta.
# The named types below are what the code works on; each converts from and to its list layout
# (from_state / to_state), so the state holds the same primitives as before the types had names.

class _RequestsMeta(NamedTuple):
    """A shard's timer book-keeping: ``armed``, the time (micros) the timer is set for, or None;
    ``closed_upto``, the time up to which windows are known closed, or None. State:
    ``[armed, closed_upto]``."""

    armed: int | None
    closed_upto: int | None

    @classmethod
    def read(cls, state) -> "_RequestsMeta":
        value = state.read()
        return cls(None, None) if value is None else cls(*value)

    def write(self, state) -> None:
        state.write([self.armed, self.closed_upto])


@dataclass(slots=True)
class _Variant:
    """One content of an event id: ``key``, its :func:`~streameval.io.cleaning.content_key` (None
    until a second content of the event id needs comparing), the ``record`` (impression dict) and
    how many ``copies`` arrived. State: ``[key, record, copies]``."""

    key: object
    record: dict
    copies: int

    @classmethod
    def from_state(cls, value) -> "_Variant":
        return cls(*value)

    def to_state(self) -> list:
        return [self.key, self.record, self.copies]


@dataclass(slots=True)
class _CtrImpression:
    """An impression kept for CTR: its time ``ts`` (micros), ``position`` (1-based), ``clicked``
    (True, False or None when the log says nothing), ``item`` and slice ``labels``. State:
    ``[ts, position, clicked, item, labels]``."""

    ts: int
    position: int
    clicked: bool | None
    item: str
    labels: list

    @classmethod
    def from_state(cls, value) -> "_CtrImpression":
        return cls(*value)

    def to_state(self) -> list:
        return [self.ts, self.position, self.clicked, self.item, self.labels]


@dataclass(slots=True)
class _SystemEntry:
    """A request's records of one system.

    * ``acc``: the kept impressions' :class:`~streameval.beam.combiners.RankingStateCombineFn`
      accumulator (its own list layout; with click metrics only: the request's first time, query
      and attributes);
    * ``imps``: the kept impressions for CTR (:class:`_CtrImpression`);
    * ``version``: versions sent so far; ``query``: the query the last version went to (None:
      none yet); ``ctr_emitted``: whether the last version had click counts;
    * ``rank_close``: when (micros) the window of the request's first impression closes;
      ``last_ts``: its last kept impression's time (micros);
    * ``records``: ``{event_id: [_Variant, ...]}``, every content seen;
    * ``kept``: the kept records as ``[[event_id, variant index], ...]`` (None before the first
      cleaning), to tell whether a cleaning changed anything.

    State: ``[acc, imps, version, query, ctr_emitted, rank_close, last_ts, records, kept]``.
    """

    acc: list
    imps: list
    version: int
    query: str | None
    ctr_emitted: bool
    rank_close: int | None
    last_ts: int | None
    records: dict
    kept: list | None

    @classmethod
    def from_state(cls, value) -> "_SystemEntry":
        acc, imps, version, query, ctr_emitted, rank_close, last_ts, recs, kept = value
        return cls(acc, [_CtrImpression.from_state(i) for i in imps], version, query, ctr_emitted, rank_close,
                   last_ts, {eid: [_Variant.from_state(v) for v in vs] for eid, vs in recs.items()}, kept)

    def to_state(self) -> list:
        return [self.acc, [i.to_state() for i in self.imps], self.version, self.query, self.ctr_emitted,
                self.rank_close, self.last_ts,
                {eid: [v.to_state() for v in vs] for eid, vs in self.records.items()}, self.kept]


class _Tombstone(NamedTuple):
    """The final requests of one request id, remembered so that their later pieces are late data:
    ``closes`` (``{system: close}``, the end of the window of each system's first impression plus
    the allowed lateness: the batch job's rule), ``closed_at``, when their last window closed, and
    ``forget_at``, when they are forgotten (micros). A request is a (system, request id) pair, as in
    the batch job: a system the id had not served starts a new request beside the tombstone.
    State: ``[closes, closed_at, forget_at]``."""

    closes: dict
    closed_at: int
    forget_at: int


@dataclass(slots=True)
class _RequestEntry:
    """Everything a shard keeps of one request id: ``systems`` (``{system: _SystemEntry}``), its
    ``clicks`` (:class:`~streameval.beam.streaming.prepare._Click`, de-duplicated by key) and,
    once final, its ``tombstone`` (then the other fields are empty). Kept encoded in state
    (:meth:`decode`, :meth:`encode`); layout ``[systems, clicks, tombstone or None]``."""

    systems: dict
    clicks: list
    tombstone: _Tombstone | None

    def live(self) -> bool:
        """Whether the entry has records not yet final (systems or clicks)."""
        return bool(self.systems or self.clicks)

    @classmethod
    def decode(cls, blob: bytes) -> "_RequestEntry":
        systems, clicks, tomb = _decode(blob)
        return cls({s: _SystemEntry.from_state(e) for s, e in systems.items()},
                   [_Click.from_state(c) for c in clicks], None if tomb is None else _Tombstone(*tomb))

    def encode(self) -> bytes:
        tomb = self.tombstone
        return _encode([{s: e.to_state() for s, e in self.systems.items()}, [c.to_state() for c in self.clicks],
                        None if tomb is None else list(tomb)])


class _Requests:
    """Key: a shard of request ids, or the request id itself (``request_shards=0``: the state an
    element reads and writes is its own request's). Each request's records (per system), cleaned as the batch job
    cleans them (:func:`streameval.io.cleaning.clean_request`: replays are duplicates, conflicting
    event ids and items served twice rejected; decided on all the records seen, so the order of
    arrival does not matter), the kept impressions' served items (RankingStateCombineFn
    accumulator), its impressions for CTR and its click events; every change of the kept records
    or of the clicks sends a new version of the request to its query (ranking) and to its system
    (clicks). A replay changes nothing and sends nothing. The fates of the request's records
    (accepted, duplicate, rejected) are final, and counted, when the request closes."""

    STATE = ReadModifyWriteStateSpec("requests", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # a _RequestsMeta
    DUE = TimerSpec("due", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg
        self.combine = RankingStateCombineFn(cfg.ops, cfg.attr_keys)

    # -- windows and deadlines ---------------------------------------------------------------
    def _rank_place(self, rid, ent):
        cfg = self.cfg
        t0 = request_min_timestamp(ent.acc)
        if cfg.spec.windowed:
            return cfg.spec.sub(t0)
        return [self._session_key(rid, ent), t0, ent.last_ts]

    def _session_key(self, rid, ent):
        if self.cfg.spec.by == "user":
            user = request_attributes(ent.acc).get("\x00user")
            if user is not None:
                return f"user={user}"
        return f"request={rid}"

    def _closes(self, ent):
        """(rank_close, last deadline) of a system entry: in windows, its close is that of its
        earliest record (any that passed the record checks: late data is set aside before the
        request rules, :func:`streameval.io.cleaning.split_after_close`)."""
        cfg = self.cfg
        if cfg.spec.windowed:
            first = min(int(v.record["timestamp"]) for vs in ent.records.values() for v in vs)
            rc = cfg.expiry(cfg.spec.sub(first))
            return rc, max(rc, cfg.expiry(cfg.spec.sub(ent.last_ts)))
        rc = ent.last_ts + cfg.spec.size + cfg.lateness
        return rc, rc

    def _click_deadline(self, c: _Click):
        cfg = self.cfg
        if cfg.spec.windowed:
            return cfg.expiry(cfg.spec.sub(c.ts))
        return c.ts + cfg.spec.size + cfg.lateness

    # -- element processing ------------------------------------------------------------------
    def process(self, kv, state, meta,
                due):
        _, (gate_closed, msgs) = kv
        reqs = state.read() or {}
        armed, closed_upto = _RequestsMeta.read(meta)
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
                cell = reqs.get(rid)  # [deadline, encoded entry]
                entry = touched[rid] = _RequestEntry({}, [], None) if cell is None else _RequestEntry.decode(cell[1])
            if entry.tombstone is not None:
                items = self._after_tombstone(rid, entry, kind, items, late)
                if not items:
                    continue
            changed = set()
            if kind == "imp":
                self._add_impressions(rid, entry, items, changed, late, closed)
            else:
                self._add_clicks(rid, entry, items, changed, late, closed)
            for system in sorted(changed):
                self._emit(rid, system, entry.systems[system], out_q, out_s)
        for rid, entry in touched.items():
            d = self._next_deadline(entry, closed_upto)
            reqs[rid] = [d, entry.encode()]
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if late:
            _tally_late(self.cfg.run, late)
            side.extend(("side", r) for r in late)
        if side:
            yield _SIDE_KEY, side
        if nxt is not None and nxt != armed:
            due.set(_when(nxt))
        _RequestsMeta(nxt, closed_upto).write(meta)
        state.write(reqs)
        for q, ms in out_q.items():
            yield pvalue.TaggedOutput("queries", (q, ms))
        yield from out_s.items()

    def _after_tombstone(self, rid, entry, kind, items, late) -> list:
        """The records of a request id some of whose requests are final: an impression of a final
        (system, request) is late (at or after its close by its own time: the batch job's rule and
        reason; else late by arrival), a click is late when it can only belong to a final request;
        the rest (a system the id had not served) are returned, to start new requests."""
        tomb = entry.tombstone
        fresh = []
        for it in items:
            if kind == "imp":
                system = it["system_id"]
                rc = tomb.closes.get(system)
                if rc is None:
                    fresh.append(it)
                    continue
                ts = int(it["timestamp"])
                late.append(_late_record(cn.LATE_IMPRESSION, it, cleaning.after_close_reason(ts, rc) if ts >= rc else
                                         f"request {rid} of {system} is final: its window closed at {_fmt_us(rc)}"))
                continue
            c = _Click.from_state(it)
            if (c.system is None and not entry.systems) or c.system in tomb.closes:
                late.append(_late_record(cn.LATE_CLICK, c.raw,
                                         f"request {rid} is final: its windows closed at {_fmt_us(tomb.closed_at)}"))
                continue
            fresh.append(it)
        return fresh

    def _add_impressions(self, rid, entry, recs, changed, late, closed):
        touched = set()
        for rec in recs:
            system = rec["system_id"]
            ent = entry.systems.get(system)
            if ent is not None and ent.rank_close is not None and closed(ent.rank_close):
                ts = int(rec["timestamp"])
                # after the close by its own time: the batch job's rule and reason; else late by arrival
                late.append(_late_record(cn.LATE_IMPRESSION, rec, cleaning.after_close_reason(ts, ent.rank_close)
                                         if ts >= ent.rank_close else
                                         f"request {rid} of {system} is final: its window closed at "
                                         f"{_fmt_us(ent.rank_close)}"))
                continue
            if ent is None:
                ent = entry.systems[system] = _SystemEntry(
                    acc=self.combine.create_accumulator(), imps=[], version=0, query=None, ctr_emitted=False,
                    rank_close=None, last_ts=None, records={}, kept=None)
            variants = ent.records.setdefault(rec["event_id"], [])
            if not variants:
                variants.append(_Variant(None, rec, 1))
                touched.add(system)
                continue
            key = cleaning.content_key(rec)
            for v in variants:
                if v.key is None:
                    v.key = cleaning.content_key(v.record)
            for v in variants:
                if v.key == key:
                    v.copies += 1  # a replay: the request's records are unchanged
                    break
            else:
                variants.append(_Variant(key, rec, 1))
                touched.add(system)
        for system in touched:
            if self._rebuild(entry, system):
                changed.add(system)

    def _clean(self, ent, with_late=False):
        """``clean_request`` over the records of a system entry: (kept, duplicates, rejected,
        {id(record): [event_id, variant]}), and with ``with_late`` the impressions after the
        request's close (:func:`streameval.io.cleaning.split_after_close`, the batch job's rule:
        at or after the end of its earliest impression's window plus the allowed lateness), which
        ``kept`` then leaves out whatever the order they came in."""
        flat, where = [], {}
        for eid, variants in ent.records.items():
            for i, v in enumerate(variants):
                where[id(v.record)] = [eid, i]
                flat.extend([v.record] * v.copies)
        cfg = self.cfg
        flat, late = cleaning.split_after_close(
            flat, (lambda t0: cfg.expiry(cfg.spec.sub(t0))) if cfg.spec.windowed else None)
        kept, n_dup, rejected = cleaning.clean_request(flat)
        if with_late:
            return kept, n_dup, rejected, where, late
        return kept, n_dup, rejected, where

    def _rebuild(self, entry, system) -> bool:
        """Recompute the request's kept impressions (and from them its ranking state, CTR
        impressions and last impression time); False when the kept set did not change."""
        cfg = self.cfg
        ent = entry.systems[system]
        kept, _, _, where = self._clean(ent)
        sig = [where[id(r)] for r in kept]
        if sig == ent.kept:
            return False
        ent.kept = sig
        acc = self.combine.create_accumulator()
        imps = []
        tlast = None
        for rec in kept:
            ts = int(rec["timestamp"])
            if cfg.ranking:
                self.combine.add_input(acc, rec)
            else:  # click metrics only: the request's time, query and attributes, not its items
                first = request_min_timestamp(acc)
                if first is None or ts < first:
                    self.combine.set_min_timestamp(acc, ts)
                self.combine.add_query(acc, rec.get("query_id"))
            user = rec.get("user_id")
            attrs = request_attributes(acc)
            if user is not None and ("\x00user" not in attrs or user < attrs["\x00user"]):
                attrs["\x00user"] = user
            tlast = ts if tlast is None else max(tlast, ts)
            if cfg.ctr:
                # with click events, a null clicked is "not clicked unless a click matches"
                imp = _CtrImpression(ts, int(rec["position"]),
                                     records.impression_clicked(rec.get("clicked"), cfg.click_events),
                                     rec["item_id"], slice_labels(rec.get("attributes"), cfg.slice_specs))
                for c in entry.clicks:
                    if c.fate != _DEAD and (c.system is None or c.system == system) and c.item == imp.item and \
                            ts <= c.ts <= ts + cfg.delay:
                        imp.clicked = True
                imps.append(imp)
        if not kept:  # every record rejected (a request naming several query ids): it contributes nothing,
            # but keeps its time, so that it closes (and its records' fates are counted) with its window
            times = [int(v.record["timestamp"]) for vs in ent.records.values() for v in vs]
            self.combine.set_min_timestamp(acc, min(times))
            tlast = max(times)
        ent.acc, ent.imps, ent.last_ts = acc, imps, tlast
        ent.rank_close = self._closes(ent)[0]
        return True

    def _add_clicks(self, rid, entry, clicks, changed, late, closed):
        cfg = self.cfg
        seen = {c.key for c in entry.clicks}
        dup = 0
        for c in clicks:
            c = _Click.from_state(c)
            item, cts, csys, raw = c.item, c.ts, c.system, c.raw
            if c.key in seen:  # a replayed click event: no effect
                dup += 1
                continue
            matched = False
            too_late = False
            for system, ent in entry.systems.items():
                if csys is not None and csys != system:
                    continue
                for imp in ent.imps:
                    if imp.item == item and imp.ts <= cts <= imp.ts + cfg.delay:
                        if closed(cfg.expiry(cfg.spec.sub(imp.ts)) if cfg.spec.windowed else ent.rank_close):
                            too_late = True
                            continue
                        matched = True
                        if imp.clicked is not True:
                            imp.clicked = True
                            changed.add(system)
            if too_late and not matched:
                late.append(_late_record(cn.LATE_CLICK, raw,
                                         f"the clicked impression's window (request {rid}) already closed"))
                continue
            seen.add(c.key)
            entry.clicks.append(c)
        _tally(cfg.run, cn.DUPLICATE_CLICK, dup)

    def _emit(self, rid, system, ent, out_q, out_s):
        cfg = self.cfg
        ent.version += 1
        rkey = system + _SEP + rid
        acc = ent.acc
        place = self._rank_place(rid, ent)
        ctr_msg = None
        if cfg.ctr:
            counts: dict = {}
            for imp in ent.imps:
                ts, pos, clicked, labels = imp.ts, imp.position, imp.clicked, imp.labels
                if clicked is None:
                    continue
                if cfg.spec.windowed:
                    by_label = counts.setdefault(cfg.spec.sub(ts), {})
                else:
                    by_label = counts
                for label in labels:
                    ctr_pos_add(by_label.setdefault(label, {}), pos, clicked)
            if counts or ent.ctr_emitted:
                ctr_msg = ("ctr", rkey, ent.version, None if cfg.spec.windowed else place, counts)
                ent.ctr_emitted = bool(counts)
        if cfg.ranking and not ent.kept:  # nothing kept: retract what the request contributed
            if ent.query is not None:
                out_q[ent.query].append(("drop", rkey, system, ent.version))
                ent.query = None
            if ctr_msg is not None:
                out_s[system].append(ctr_msg)
        elif cfg.ranking:
            # the click counts of this version travel with its ranking state, so that both reach
            # the aggregate in one element and are accepted (or found late) together
            qid = request_query_id(acc)
            attrs = {k: v for k, v in request_attributes(acc).items() if k != "\x00user"}
            labels = slice_labels(attrs, cfg.slice_specs)
            out_q[qid].append(("req", rkey, system, ent.version, place, labels, request_state(acc), ent.rank_close,
                               self._closed_upto, ctr_msg, len(ent.kept)))
            if ent.query is not None and ent.query != qid:
                out_q[ent.query].append(("drop", rkey, system, ent.version))
            ent.query = qid
        elif ctr_msg is not None:
            out_s[system].append(ctr_msg)

    def _arm(self, reqs, meta, due, closed_upto):
        nxt = None
        for d, _ in reqs.values():
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if nxt is not None:
            due.set(_when(nxt))
        _RequestsMeta(nxt, closed_upto).write(meta)

    def _next_deadline(self, entry, closed_upto):
        """When the entry needs attention: its tombstone expires, all its windows closed (it becomes
        a tombstone), or a pending click's window closed; rounded up to the cleanup step, so one
        timer firing per shard serves many windows (which windows closed is known from the gate)."""
        if entry.tombstone is not None and not entry.live():
            return self.cfg.round_up(entry.tombstone.forget_at)
        last = max((self._closes(ent)[1] for ent in entry.systems.values()), default=None)
        ds = [self._click_deadline(c) for c in entry.clicks if c.fate == _PENDING]
        if last is not None and (not ds or closed_upto is None or last > closed_upto):
            ds.append(last)  # (with clicks pending, a closed request waits for them, not for itself)
        return self.cfg.round_up(min(ds)) if ds else None

    def _click_matches(self, entry, c: _Click) -> bool:
        for system, ent in entry.systems.items():
            if c.system is not None and c.system != system:
                continue
            for imp in ent.imps:
                if imp.item == c.item and imp.ts <= c.ts <= imp.ts + self.cfg.delay:
                    return True
        return False

    def _final_fates(self, rid, entry) -> list:
        """Counts the fates of a closing request's impressions (accepted, duplicates, rejected by
        reason; for CTR counted or clicks not logged); the dead letters of the rejected ones."""
        cfg = self.cfg
        run = cfg.run
        dead = []
        for system in sorted(entry.systems):
            ent = entry.systems[system]
            kept, n_dup, rejected, _, late = self._clean(ent, with_late=True)
            _tally(run, cn.IMPRESSIONS_ACCEPTED, len(kept))
            _tally(run, cn.DUPLICATE_IMPRESSION, n_dup)
            for rec, reason in rejected:
                _tally(run, cn.rejected("impression", _category(reason)))
                dead.append(dead_letter("CleanImpressions", rec, reason))
            if late:
                _tally(run, cn.LATE_IMPRESSION, len(late))
                dead.extend(_late_record(cn.LATE_IMPRESSION, rec, reason) for rec, reason in late)
            if cfg.ctr:
                not_logged = sum(imp.clicked is None for imp in ent.imps)
                _tally(run, cn.CLICK_IMPRESSIONS, len(ent.imps) - not_logged)
                _tally(run, cn.CLICK_IMPRESSIONS_NOT_LOGGED, not_logged)
        return dead

    def on_due(self, state, meta,
               due, ts):
        cfg = self.cfg
        now = _micros(ts)
        reqs = state.read() or {}
        armed, closed_upto = _RequestsMeta.read(meta)
        closed_upto = now if closed_upto is None else max(closed_upto, now)
        side = self._due_pass(reqs, now, closed_upto)
        if side:
            yield (_SIDE_KEY, [("side", r) for r in side])
        self._arm(reqs, meta, due, closed_upto)
        if reqs:
            state.write(reqs)
        elif cfg.shards == 0:  # keyed by request id and the request is forgotten: nothing stays
            state.clear()
            meta.clear()
        else:
            state.write(reqs)

    def _due_pass(self, reqs, now, closed_upto) -> list:
        """One due time ``now`` of a shard: the requests due by then closed or forgotten, pending
        clicks decided (``reqs`` changed in place); returns the side records."""
        cfg = self.cfg
        self._closed_upto = closed_upto
        side = []
        for rid in list(reqs):
            d, blob = reqs[rid]
            if d is None or d > now:
                continue
            entry = _RequestEntry.decode(blob)
            tomb = entry.tombstone
            if tomb is not None and not entry.live():
                if tomb.forget_at <= now:
                    del reqs[rid]
                continue
            pending = False
            for c in entry.clicks:
                if c.fate != _PENDING:
                    continue
                if self._click_deadline(c) > now:
                    pending = True
                elif self._click_matches(entry, c):
                    c.fate = _ACCEPTED
                    _tally(cfg.run, cn.CLICKS_ACCEPTED)
                else:
                    c.fate = _DEAD
                    _tally(cfg.run, cn.rejected("click", REASON_CLICK_UNMATCHED))
                    side.append(_late_record(
                        "unmatched:click", c.raw,
                        f"{REASON_CLICK_UNMATCHED} (no impression of item {c.item!r} in request {rid!r} served at "
                        f"most {cfg.delay / 1e6:g} s before the click)"))
            last = max((self._closes(ent)[1] for ent in entry.systems.values()), default=None)
            if (last is None or last <= now) and not pending:
                side.extend(self._final_fates(rid, entry))
                if last is None and tomb is None:
                    del reqs[rid]
                    continue
                closes = {} if tomb is None else dict(tomb.closes)
                closes.update((s, self._closes(ent)[0]) for s, ent in entry.systems.items())
                if last is None or (tomb is not None and tomb.closed_at > last):
                    last = tomb.closed_at
                forget = last + cfg.retention if tomb is None else max(tomb.forget_at, last + cfg.retention)
                entry = _RequestEntry({}, [], _Tombstone(closes, last, forget))
            reqs[rid] = [self._next_deadline(entry, closed_upto), entry.encode()]
        return side


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
