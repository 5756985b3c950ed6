"""Stage 4, queries (key: query id; ranking metrics only): judgments under the conflict policy, and
the scoring of request versions.

Input: ``(query_id, messages)``: ``("judg", [[item, ts, grade, raw json], ...])``, ``("upto",
closed_upto)`` (from the gate), and ``("req", ...)`` / ``("drop", ...)`` from :mod:`.requests`;
``(_SIDE_KEY, side records)`` passes through. Output, per system (emitted in ``finish_bundle``,
all the bundle's request versions scored in one :func:`~streameval.metrics.kernel.compute` call):
``(system, [message, ...])`` with ``("rank", request key, query, [version, judgment generation],
place, labels, metric vector or None)`` (None: the request no longer contributes) and the
requests' ``("ctr", ...)`` messages passed on. Judgment fates (``judgments_accepted``,
``duplicate:judgment``, ``superseded:judgment``, ``rejected:judgment:...``) are counted as they
change; request fates (``requests_scored`` / ``_unjudged`` / ``_unrankable`` and their
impressions) when the request closes, in the timer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from ...io import cleaning
from ...io import counters as cn
from ..transforms import SOURCE_UNRANKABLE
from ...metrics.kernel import compute
from .common import _SEP, _SIDE_KEY, _fmt_us, _late_record, _micros, _tally, _when
from .windows import _Config
from ...io.dead_letters import dead_letter


# --------------------------------------------------------------------------------------------
# queries: judgments and scoring

# State of a query (Beam state, FastPrimitivesCoder: plain primitives only):
#   JUDGED: {item: [judgment ts (micros), grade (float)]}, the resolved judgment table;
#   PAIRS:  {item: [_JudgmentCopy as a list, ...]}, every distinct judgment seen, per item;
#   LOG:    a bag of _LogEntry (as lists): versions of the query's open requests;
#   META:   a _QueryMeta.
# The named types below convert from and to those lists (from_state / to_state).

class _QueryMeta(NamedTuple):
    """A query's book-keeping: ``jgen``, the judgment generation (bumped at each change of the
    table); ``armed``, the time (micros) the expiry timer is set for, or None; ``n_closed``, how
    many of its requests were final when a judgment changed the table, and ``last_closed``, the
    latest close (micros) among them; ``known``, the time up to which windows are known closed,
    or None. State: ``[jgen, armed, n_closed, last_closed, known]``."""

    jgen: int
    armed: int | None
    n_closed: int
    last_closed: int | None
    known: int | None

    @classmethod
    def read(cls, state) -> "_QueryMeta":
        value = state.read()
        return cls(0, None, 0, None, None) if value is None else cls(*value)

    def write(self, state) -> None:
        state.write(list(self))


@dataclass(slots=True)
class _JudgmentCopy:
    """One distinct judgment of a (query, item): its ``ts`` (micros) and ``grade``, how many
    ``copies`` arrived, and its ``raw`` record (JSON text; kept under the ``reject`` policy only,
    for dead letters, else None). State: ``[ts, grade, copies, raw]``."""

    ts: int
    grade: int
    copies: int
    raw: str | None

    def to_state(self) -> list:
        return [self.ts, self.grade, self.copies, self.raw]


def _read_pairs(state) -> dict:
    """PAIRS state as ``{item: [_JudgmentCopy, ...]}``."""
    return {item: [_JudgmentCopy(*e) for e in entries] for item, entries in (state.read() or {}).items()}


def _write_pairs(state, pairs: dict) -> None:
    state.write({item: [e.to_state() for e in entries] for item, entries in pairs.items()})


@dataclass(slots=True)
class _LogEntry:
    """A version of a request in its query's log: ``key`` (request key ``system + _SEP + request
    id``), ``system``, ``version``; for a version to score: its ``place``, slice ``labels``,
    ``served`` ranking state and ``close`` (micros, when its window closes); ``dropped``: the
    request left the query (a drop) or was final when a judgment changed the table;
    ``impressions``: its kept impressions; ``fate`` (``"ranked"``, ``"unjudged"``,
    ``"unrankable"``; None for a drop) and ``fate_gen``, the judgment generation that set it.
    State: ``[key, system, version, place, labels, served, close, dropped, impressions, fate,
    fate_gen]``."""

    key: str
    system: str
    version: int
    place: object
    labels: list | None
    served: list | None
    close: int | None
    dropped: bool
    impressions: int
    fate: str | None
    fate_gen: int

    @classmethod
    def from_state(cls, value) -> "_LogEntry":
        return cls(*value)

    def to_state(self) -> list:
        return [self.key, self.system, self.version, self.place, self.labels, self.served, self.close, self.dropped,
                self.impressions, self.fate, self.fate_gen]


class _ScoreJob(NamedTuple):
    """A request version to score (or pass on) at the end of the bundle (in memory only): the
    element's timestamp ``ts``, ``query``, request key ``rkey``, ``system``, ``version``, judgment
    generation ``jgen``, ``place``, ``labels``, ``served`` ranking state (for ``how == "ctr"``:
    the click-count message passed on), the table's ``grades`` (``{item: grade}``) and ``how``:
    ``"new"`` (a new version), None (a rescoring), ``"drop"`` or ``"ctr"``."""

    ts: object
    query: str
    rkey: str
    system: str
    version: int
    jgen: int
    place: object
    labels: list | None
    served: object
    grades: dict | None
    how: str | None


class _Resolution(NamedTuple):
    """:func:`streameval.io.cleaning.resolve_judgment` of a pair: the resolved ``grade`` (None:
    none), ``n_dup`` duplicates, the ``superseded`` and ``rejected`` ``(ts, grade)`` keys, and the
    winning ``(ts, grade)`` (None: none)."""

    grade: int | None
    n_dup: int
    superseded: list
    rejected: list
    win: tuple | None


class _Queries:
    """Key: query id. The query's judgments under the conflict policy (``latest``, ``max`` or
    ``reject``, :func:`streameval.io.cleaning.resolve_judgment`, as the batch job) and a log of its
    open requests' latest versions. Scores each request version against the table (all the
    bundle's versions in one kernel call, in finish_bundle), and rescores every open request of the
    query when a judgment changes the table. Judgments that arrive after some of the query's
    requests became final are applied to the open and later windows and written to the late
    output as a notice (the closed windows keep their final value). The fate of each request
    (ranked, unjudged, unrankable) is counted when it closes."""

    JUDGED = ReadModifyWriteStateSpec("judged", FastPrimitivesCoder())
    PAIRS = ReadModifyWriteStateSpec("pairs", FastPrimitivesCoder())
    LOG = BagStateSpec("log", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # a _QueryMeta
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg

    def start_bundle(self):
        self._jobs = []  # [_ScoreJob, ...]

    def _fate(self, judged, served) -> str:
        if not judged:
            return "unjudged"
        return "unrankable" if self.cfg.ops.unrankable(served) else "ranked"

    def _judge(self, query, judged, pairs, js, dead) -> list:
        """Applies judgments ``[item, ts, grade, raw]`` under the conflict policy; counts their
        fates (as the difference of the pair's resolution before and after, so that the counts
        always describe the judgments seen so far) and returns the raw records of those that
        changed the table."""
        cfg, run = self.cfg, self.cfg.run
        policy = cfg.policy
        changed = []
        for item, jts, grade, raw in js:
            entries = pairs.setdefault(item, [])
            before = _resolve(entries, policy)
            for e in entries:
                if e.ts == jts and e.grade == grade:
                    e.copies += 1
                    break
            else:
                entries.append(_JudgmentCopy(jts, grade, 1, raw if policy == "reject" else None))
            after = _resolve(entries, policy)
            _tally(run, cn.JUDGMENTS_ACCEPTED, (after.grade is not None) - (before.grade is not None))
            _tally(run, cn.DUPLICATE_JUDGMENT, after.n_dup - before.n_dup)
            _tally(run, cn.SUPERSEDED_JUDGMENT, len(after.superseded) - len(before.superseded))
            new_rejected = set(after.rejected) - set(before.rejected)
            if new_rejected:
                grades = sorted({e.grade for e in entries})
                by_key = {(e.ts, e.grade): e for e in entries}
                for key in sorted(new_rejected):
                    _tally(run, cn.rejected("judgment", cleaning.REASON_JUDGMENT_CONFLICT))
                    dead.append(dead_letter("ResolveJudgments", by_key[key].raw or raw,
                                            f"{cleaning.REASON_JUDGMENT_CONFLICT} (query {query!r}, item {item!r}: "
                                            f"grades {grades}; policy reject)"))
            old = judged.get(item)
            if after.grade is None:
                judged.pop(item, None)
            else:
                win_ts, win_grade = after.win
                judged[item] = [win_ts, float(win_grade)]
            if judged.get(item) != old:
                changed.append(raw)
        return changed

    def process(self, kv, judged_state, pairs_state, log,
                meta, expire,
                ts):
        query, msgs = kv
        if query == _SIDE_KEY:  # records for the side output, passing through
            yield kv
            return
        cfg = self.cfg
        judged = judged_state.read() or {}
        jgen, armed, n_closed, last_closed, known = _QueryMeta.read(meta)
        changed_judgments = []
        new_entries = []
        retract = []
        ctr_msgs = []
        dead = []
        pairs = None
        for m in msgs:
            if m[0] == "upto":
                if m[1] is not None and (known is None or m[1] > known):
                    known = m[1]
            elif m[0] == "judg":
                if pairs is None:
                    pairs = _read_pairs(pairs_state)
                changed_judgments.extend(self._judge(query, judged, pairs, m[1], dead))
            elif m[0] == "req":
                _, rkey, system, version, place, labels, served, close, upto, ctr_msg, n_imps = m
                if upto is not None and (known is None or upto > known):
                    known = upto
                new_entries.append(_LogEntry(rkey, system, version, place, labels, served, close, False, n_imps,
                                             self._fate(judged, served), jgen))
                if ctr_msg is not None:
                    ctr_msgs.append((system, ctr_msg))
            else:  # drop: the request's query changed; retract what it contributed from here
                _, rkey, system, version = m
                new_entries.append(_LogEntry(rkey, system, version, None, None, None, None, True, 0, None, jgen))
                retract.append((rkey, system, version))
        if pairs is not None:
            _write_pairs(pairs_state, pairs)
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]
        if changed_judgments:
            # (requests of this bundle were given their fate before the judgments: refresh it)
            for e in new_entries:
                if not e.dropped:
                    e.fate = self._fate(judged, e.served)
        for e in new_entries:
            log.add(e.to_state())
        jobs = {}
        if changed_judgments:
            jgen += 1
            judged_state.write(judged)
            latest = _latest(log.read())
            for e in latest.values():  # final already (their windows closed), not yet expired here
                if not e.dropped and known is not None and e.close <= known:
                    n_closed += 1
                    last_closed = e.close if last_closed is None else max(last_closed, e.close)
                    e.dropped = True
                    log.add(e.to_state())
            if n_closed:
                _tally(cfg.run, cn.JUDGMENT_LATE_NOTICES, len(changed_judgments))
                yield _SIDE_KEY, [("side", _late_record(
                    cn.LATE_JUDGMENT, raw,
                    f"{n_closed} request(s) of query {query!r} were already final (latest window closed at "
                    f"{_fmt_us(last_closed)}); their windows keep their final values, open and later "
                    "windows use this judgment")) for raw in changed_judgments]
            for e in latest.values():
                if not e.dropped:
                    fate = self._fate(judged, e.served)
                    if fate != e.fate:
                        e.fate, e.fate_gen = fate, jgen
                        log.add(e.to_state())
                    jobs[e.key] = e
        else:
            for e in new_entries:
                if not e.dropped:
                    jobs[e.key] = e if e.key not in jobs or jobs[e.key].version < e.version else jobs[e.key]
        grades = {item: g for item, (_, g) in judged.items()}
        fresh = {(e.key, e.version) for e in new_entries}
        for e in jobs.values():
            self._jobs.append(_ScoreJob(ts, query, e.key, e.system, e.version, jgen, e.place, e.labels, e.served,
                                        grades, "new" if (e.key, e.version) in fresh else None))
        for rkey, system, version in retract:
            self._jobs.append(_ScoreJob(ts, query, rkey, system, version, jgen, None, None, None, None, "drop"))
        for system, cm in ctr_msgs:
            _, rkey, version, _place, _counts = cm
            self._jobs.append(_ScoreJob(ts, query, rkey, system, version, jgen, None, None, cm, None, "ctr"))
        closes = [cfg.round_up(e.close) for e in new_entries if e.close is not None]
        if closes and (armed is None or min(closes) < armed):
            armed = min(closes)
            expire.set(_when(armed))
        _QueryMeta(jgen, armed, n_closed, last_closed, known).write(meta)

    def finish_bundle(self):
        cfg = self.cfg
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        out: dict = defaultdict(list)
        stamps: dict = {}
        to_score, where = [], []
        for i, (ts, query, rkey, system, version, jgen, place, labels, served, grades, how) in enumerate(jobs):
            if how == "drop":
                out[system].append(("rank", rkey, query, [version, jgen], None, None, None))
            elif how == "ctr":
                out[system].append(served)  # the version's click counts, passed on
            elif not grades:
                if how is None:  # rescored after the table lost its last judgment (policy reject)
                    out[system].append(("rank", rkey, query, [version, jgen], place, labels, None))
                # (a new version of an unjudged query: it never contributed from here)
            elif cfg.ops.unrankable(served):  # a dead letter when the request closes
                out[system].append(("rank", rkey, query, [version, jgen], place, labels, None))
            else:
                to_score.append([served[0], grades, served[2], served[3]])
                where.append(i)
            s = jobs[i].system
            stamps[s] = ts if s not in stamps else min(stamps[s], ts)
        if to_score:
            values = compute(cfg.ops.to_lists(to_score), cfg.specs, cfg.options)
            for col, i in zip(values.T.tolist(), where):
                ts, query, rkey, system, version, jgen, place, labels, *_ = jobs[i]
                out[system].append(("rank", rkey, query, [version, jgen], place, labels, col))
        for system, msgs in out.items():
            yield WindowedValue((system, msgs), stamps[system], [GlobalWindow()])

    def on_expire(self, log, meta,
                  judged_state, expire,
                  ts, query=None):
        cfg = self.cfg
        now = _micros(ts)
        jgen, armed, n_closed, last_closed, known = _QueryMeta.read(meta)
        known = now if known is None else max(known, now)
        latest = _latest(log.read())
        keep = []
        nxt = None
        dead = []
        for e in latest.values():
            if e.close is None:  # a drop
                continue
            if e.close <= now:
                if not e.dropped:
                    n_closed += 1
                    last_closed = e.close if last_closed is None else max(last_closed, e.close)
                fate = e.fate
                _tally(cfg.run, cn.requests_fate(fate))
                _tally(cfg.run, cn.impressions_fate(fate), e.impressions)
                if fate == "unrankable":
                    served = e.served
                    missing = cfg.ops.unrankable(served)
                    _tally(cfg.run, cn.IMPRESSIONS_UNSCORABLE, missing)
                    dead.append(dead_letter(
                        SOURCE_UNRANKABLE,
                        {"query_id": query, "system_id": e.system, "request_id": e.key.split(_SEP, 1)[1],
                         "impressions": e.impressions, "without_score": missing},
                        f"{missing} of the request's {len(served[0])} impressions have no score: "
                        "order='score' needs a finite score to rank them (use order='position')"))
            else:
                keep.append(e)
                d = cfg.round_up(e.close)
                nxt = d if nxt is None else min(nxt, d)
        log.clear()
        for e in keep:
            log.add(e.to_state())
        if nxt is not None:
            expire.set(_when(nxt))
        _QueryMeta(jgen, nxt, n_closed, last_closed, known).write(meta)
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]


def _resolve(entries, policy) -> _Resolution:
    """:func:`cleaning.resolve_judgment` of a pair's judgments (``[_JudgmentCopy, ...]``), plus
    the winning ``(ts, grade)``."""
    if not entries:
        return _Resolution(None, 0, [], [], None)
    counts = {(e.ts, e.grade): e.copies for e in entries}
    grade, n_dup, superseded, rejected = cleaning.resolve_judgment(counts, policy)
    win = None
    if grade is not None:
        sup = set(superseded)
        win = next(k for k in counts if k not in sup)
    return _Resolution(grade, n_dup, superseded, rejected, win)


class _QueriesFn(beam.DoFn):
    """Keyed state of queries (logic in :class:`_Queries`)."""

    JUDGED, PAIRS, LOG, META, EXPIRE = _Queries.JUDGED, _Queries.PAIRS, _Queries.LOG, _Queries.META, _Queries.EXPIRE

    def __init__(self, cfg):
        self.logic = _Queries(cfg)

    def start_bundle(self):
        self.logic.start_bundle()

    def process(self, kv, judged_state=beam.DoFn.StateParam(JUDGED), pairs_state=beam.DoFn.StateParam(PAIRS),
                log=beam.DoFn.StateParam(LOG), meta=beam.DoFn.StateParam(META), expire=beam.DoFn.TimerParam(EXPIRE),
                ts=beam.DoFn.TimestampParam):
        return self.logic.process(kv, judged_state, pairs_state, log, meta, expire, ts)

    def finish_bundle(self):
        return self.logic.finish_bundle()

    @on_timer(EXPIRE)
    def on_expire(self, log=beam.DoFn.StateParam(LOG), meta=beam.DoFn.StateParam(META),
                  judged_state=beam.DoFn.StateParam(JUDGED), expire=beam.DoFn.TimerParam(EXPIRE),
                  ts=beam.DoFn.TimestampParam, key=beam.DoFn.KeyParam):
        return self.logic.on_expire(log, meta, judged_state, expire, ts, key)


def _latest(entries) -> dict:
    """The latest version of each request in a query's log (``{request key: _LogEntry}`` from the
    LOG state's lists; a drop counts as a version; of one version, a closed mark, then the latest
    fate, wins)."""
    out: dict = {}
    for value in entries:
        e = _LogEntry.from_state(value)
        old = out.get(e.key)
        if old is None or (e.version, e.dropped, e.fate_gen) > (old.version, old.dropped, old.fate_gen):
            out[e.key] = e
    return out
