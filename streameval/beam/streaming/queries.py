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

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from ...io import cleaning, records
from ...metrics.kernel import compute
from .common import _SEP, _SIDE_KEY, _fmt_us, _late_record, _micros, _tally, _when
from .windows import _Config


# --------------------------------------------------------------------------------------------
# queries: judgments and scoring

# a request in a query's log: [rkey, system, version, place, labels, served state, close, dropped,
#  impressions, fate ("ranked", "unjudged", "unrankable"), fate generation]
_LK, _LSYS, _LVER, _LPLACE, _LLAB, _LSERVED, _LCLOSE, _LDROP, _LN, _LFATE, _LFGEN = range(11)


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
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # [jgen, armed, closed, last closed]
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg

    def start_bundle(self):
        self._jobs = []  # (ts, query, rkey, system, version, jgen, place, labels, served, judged)

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
                if e[0] == jts and e[1] == grade:
                    e[2] += 1
                    break
            else:
                entries.append([jts, grade, 1, raw if policy == "reject" else None])
            after = _resolve(entries, policy)
            _tally(run, "judgments_accepted", (after[0] is not None) - (before[0] is not None))
            _tally(run, "duplicate:judgment", after[1] - before[1])
            _tally(run, "superseded:judgment", len(after[2]) - len(before[2]))
            new_rejected = set(after[3]) - set(before[3])
            if new_rejected:
                grades = sorted({e[1] for e in entries})
                by_key = {(e[0], e[1]): e for e in entries}
                for key in sorted(new_rejected):
                    _tally(run, f"rejected:judgment:{cleaning.REASON_JUDGMENT_CONFLICT}")
                    dead.append({"source": cfg.source, "raw": by_key[key][3] or raw,
                                 "reason": f"{cleaning.REASON_JUDGMENT_CONFLICT} (query {query!r}, item {item!r}: "
                                           f"grades {grades}; policy reject)"})
            old = judged.get(item)
            if after[0] is None:
                judged.pop(item, None)
            else:
                win = after[4]
                judged[item] = [win[0], float(win[1])]
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
        jgen, armed, n_closed, last_closed, known = meta.read() or [0, None, 0, None, None]
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
                    pairs = pairs_state.read() or {}
                changed_judgments.extend(self._judge(query, judged, pairs, m[1], dead))
            elif m[0] == "req":
                _, rkey, system, version, place, labels, served, close, upto, ctr_msg, n_imps = m
                if upto is not None and (known is None or upto > known):
                    known = upto
                new_entries.append([rkey, system, version, place, labels, served, close, False, n_imps,
                                    self._fate(judged, served), jgen])
                if ctr_msg is not None:
                    ctr_msgs.append((system, ctr_msg))
            else:  # drop: the request's query changed; retract what it contributed from here
                _, rkey, system, version = m
                new_entries.append([rkey, system, version, None, None, None, None, True, 0, None, jgen])
                retract.append((rkey, system, version))
        if pairs is not None:
            pairs_state.write(pairs)
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]
        if changed_judgments:
            # (requests of this bundle were given their fate before the judgments: refresh it)
            for e in new_entries:
                if not e[_LDROP]:
                    e[_LFATE] = self._fate(judged, e[_LSERVED])
        for e in new_entries:
            log.add(e)
        jobs = {}
        if changed_judgments:
            jgen += 1
            judged_state.write(judged)
            latest = _latest(log.read())
            for e in latest.values():  # final already (their windows closed), not yet expired here
                if not e[_LDROP] and known is not None and e[_LCLOSE] <= known:
                    n_closed += 1
                    last_closed = e[_LCLOSE] if last_closed is None else max(last_closed, e[_LCLOSE])
                    e[_LDROP] = True
                    log.add(e)
            if n_closed:
                _tally(cfg.run, "judgment_late_notices", len(changed_judgments))
                yield _SIDE_KEY, [("side", _late_record(
                    "late:judgment", raw,
                    f"{n_closed} request(s) of query {query!r} were already final (latest window closed at "
                    f"{_fmt_us(last_closed)}); their windows keep their final values, open and later "
                    "windows use this judgment")) for raw in changed_judgments]
            for e in latest.values():
                if not e[_LDROP]:
                    fate = self._fate(judged, e[_LSERVED])
                    if fate != e[_LFATE]:
                        e[_LFATE], e[_LFGEN] = fate, jgen
                        log.add(e)
                    jobs[e[_LK]] = e
        else:
            for e in new_entries:
                if not e[_LDROP]:
                    jobs[e[_LK]] = e if e[_LK] not in jobs or jobs[e[_LK]][_LVER] < e[_LVER] else jobs[e[_LK]]
        grades = {item: g for item, (_, g) in judged.items()}
        fresh = {(e[_LK], e[_LVER]) for e in new_entries}
        for e in jobs.values():
            self._jobs.append((ts, query, e[_LK], e[_LSYS], e[_LVER], jgen, e[_LPLACE], e[_LLAB], e[_LSERVED],
                               grades, "new" if (e[_LK], e[_LVER]) in fresh else None))
        for rkey, system, version in retract:
            self._jobs.append((ts, query, rkey, system, version, jgen, None, None, None, None, "drop"))
        for system, cm in ctr_msgs:
            self._jobs.append((ts, query, cm[1], system, cm[2], jgen, None, None, cm, None, "ctr"))
        closes = [cfg.round_up(e[_LCLOSE]) for e in new_entries if e[_LCLOSE] is not None]
        if closes and (armed is None or min(closes) < armed):
            armed = min(closes)
            expire.set(_when(armed))
        meta.write([jgen, armed, n_closed, last_closed, known])

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
            s = jobs[i][3]
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
        jgen, armed, n_closed, last_closed, known = meta.read() or [0, None, 0, None, None]
        known = now if known is None else max(known, now)
        latest = _latest(log.read())
        keep = []
        nxt = None
        dead = []
        for e in latest.values():
            if e[_LCLOSE] is None:  # a drop
                continue
            if e[_LCLOSE] <= now:
                if not e[_LDROP]:
                    n_closed += 1
                    last_closed = e[_LCLOSE] if last_closed is None else max(last_closed, e[_LCLOSE])
                fate = e[_LFATE]
                _tally(cfg.run, "requests_scored" if fate == "ranked" else f"requests_{fate}")
                _tally(cfg.run, f"impressions_{fate}", e[_LN])
                if fate == "unrankable":
                    served = e[_LSERVED]
                    missing = cfg.ops.unrankable(served)
                    _tally(cfg.run, "impressions_unscorable", missing)
                    dead.append({"source": "StreamMetrics", "reason":
                                 f"{missing} of the request's {len(served[0])} impressions have no score: "
                                 "order='score' needs a finite score to rank them (use order='position')",
                                 "raw": records.to_json_text({"query_id": query, "system_id": e[_LSYS],
                                                              "request_id": e[_LK].split(_SEP, 1)[1],
                                                              "impressions": e[_LN], "without_score": missing})})
            else:
                keep.append(e)
                d = cfg.round_up(e[_LCLOSE])
                nxt = d if nxt is None else min(nxt, d)
        log.clear()
        for e in keep:
            log.add(e)
        if nxt is not None:
            expire.set(_when(nxt))
        meta.write([jgen, nxt, n_closed, last_closed, known])
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]


def _resolve(entries, policy):
    """:func:`cleaning.resolve_judgment` of a pair's ``[[ts, grade, count, raw], ...]``, plus
    the winning ``(ts, grade)``."""
    if not entries:
        return None, 0, [], [], None
    counts = {(e[0], e[1]): e[2] for e in entries}
    grade, n_dup, superseded, rejected = cleaning.resolve_judgment(counts, policy)
    win = None
    if grade is not None:
        sup = set(superseded)
        win = next(k for k in counts if k not in sup)
    return grade, n_dup, superseded, rejected, win


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
    """The latest version of each request in a query's log (a drop counts as a version; of one
    version, a closed mark, then the latest fate, wins)."""
    out: dict = {}
    for e in entries:
        old = out.get(e[_LK])
        if old is None or (e[_LVER], e[_LDROP], e[_LFGEN]) > (old[_LVER], old[_LDROP], old[_LFGEN]):
            out[e[_LK]] = e
    return out
