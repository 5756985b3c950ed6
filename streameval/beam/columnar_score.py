"""Stage 3 of the columnar engine (:mod:`streameval.beam.columnar`): per query shard, the judgments
resolved and the requests ranked and scored into mean states per (window, slice, system)."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue

from ..accumulators.bootstrap import PoissonBootstrap
from ..accumulators.moments import MeanMoments
from ..io import cleaning, records
from ..io import counters as cn
from ..metrics.kernel import MetricOptions, RankedLists, compute
from ..metrics.prepare import judgment_histogram, rank_order
from .columnar_columns import (_concat, _concat_attributes, _encode, _factorize, _group_bounds, _judgment_records,
                               _pick, _pylist, _sorted_codes, _strings, freeze, thaw)
from .columnar_clean import _concat_requests, _labels, _take_requests, _windows
from .threads import ThreadedDoFn, counter, distribution
from .transforms import (ALL, NAMESPACE, SOURCE_UNRANKABLE, conflict_key, empty_ranking_values, score_values,
                         window_bounds)
from ..io.dead_letters import dead_letter


# --------------------------------------------------------------------------------------------
# stage 3: judgments, ranking, means per (window, slice, system)

class _ResolveShard(ThreadedDoFn):
    """Per query shard, its judgments resolved to one grade per (query, item): ``(shard, frozen
    {"n", "query_id", "item_id", "grade" (float64)})``, and dead letters (conflicts, policy reject)."""

    def __init__(self, policy: str, judg_source: str, hold: bool = False, threads: int = 1):
        self.hold = hold
        self.threads = int(threads)
        self.policy = policy
        self.judg_source = judg_source
        self.j_accepted = counter(NAMESPACE, cn.JUDGMENTS_ACCEPTED)
        self.j_duplicates = counter(NAMESPACE, cn.DUPLICATE_JUDGMENT)
        self.j_superseded = counter(NAMESPACE, cn.SUPERSEDED_JUDGMENT)
        self.j_rejected = counter(NAMESPACE, cn.rejected("judgment", cleaning.REASON_JUDGMENT_CONFLICT))

    def work(self, element):
        shard, values = element
        dead: list = []
        q, d, g, div = self._resolve(_concat([thaw(v) for v in values]), dead)
        for x in dead:
            yield pvalue.TaggedOutput("dead_letters", x)
        if len(g):
            yield shard, freeze({"n": len(g), "query_id": q, "item_id": d, "grade": g, **div}, hold=self.hold)

    def _resolve(self, jc: dict, dead: list):
        """(query ids, item ids, grades float64, subtopic columns) of the accepted judgments, one
        grade per (query, item): a judgment with a subtopic is resolved per (query, subtopic, item),
        and an item's grade is the largest of its query's resolved judgments (ad hoc and of every
        subtopic); the subtopic columns ``{"sub_query_id", "sub_subtopic", "sub_item_id",
        "sub_grade"}`` hold the resolved subtopic judgments (empty when there are none). Their dead
        letters are appended to ``dead``."""
        n = jc["n"]
        if n == 0:
            return _strings([]), _strings([]), np.zeros(0), _no_subtopics()
        qc, _ = _encode(jc["query_id"])
        ic, ivocab = _encode(jc["item_id"])
        pair = qc * max(len(ivocab), 1) + ic
        sub = jc.get("subtopic")
        with_sub = sub is not None and sub.null_count < len(sub)
        if with_sub:
            sc, svocab = _encode(sub)
            pair = pair * len(svocab) + sc
        order, starts, ends = _group_bounds(pair)
        ts, gr = jc["timestamp"][order], jc["grade"][order]
        sizes = ends - starts
        multi = np.flatnonzero(sizes > 1)
        first = order[starts]
        grades = jc["grade"][first].astype(np.float64)
        keep = np.ones(len(starts), dtype=bool)
        n_dup = 0
        n_sup = 0
        if len(multi):
            same = np.ones(len(order), dtype=bool)
            same[1:] = (ts[1:] == ts[:-1]) & (gr[1:] == gr[:-1])
            same[starts] = True
            conflicted = multi[np.add.reduceat(~same, starts)[multi] > 0]
            n_dup += int((sizes[multi] - 1).sum())
            for g in conflicted:
                lo, hi = starts[g], ends[g]
                entries: dict = {}
                rows: dict = {}
                for i in order[lo:hi]:
                    key = (int(jc["timestamp"][i]), int(jc["grade"][i]))
                    entries[key] = entries.get(key, 0) + 1
                    rows.setdefault(key, []).append(int(i))
                n_dup -= (hi - lo) - 1  # counted by resolve_judgment instead
                grade, dup, superseded, rejected = cleaning.resolve_judgment(entries, self.policy)
                n_dup += dup
                n_sup += len(superseded)
                qid, item = jc["query_id"][int(order[lo])].as_py(), jc["item_id"][int(order[lo])].as_py()
                subtopic = sub[int(order[lo])].as_py() if with_sub else None
                distinct = sorted({g for _, g in entries})
                for key in rejected:
                    self.j_rejected.inc()
                    recs = _judgment_records(jc, rows[key])
                    rec = min(recs, key=records.to_json_text)
                    dead.append(dead_letter(
                        self.judg_source, rec,
                        f"{cleaning.REASON_JUDGMENT_CONFLICT} ({conflict_key(qid, subtopic, item)}: "
                        f"grades {distinct}; policy reject)"))
                if grade is None:
                    keep[g] = False
                else:
                    grades[g] = float(grade)
        self.j_duplicates.inc(n_dup)
        self.j_superseded.inc(n_sup)
        self.j_accepted.inc(int(keep.sum()))
        first = first[keep]
        grades = grades[keep]
        if not with_sub:
            return _pick(jc["query_id"], first), _pick(jc["item_id"], first), grades, _no_subtopics()
        subs = _pick(sub, first)
        has = np.asarray(subs.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        div = {"sub_query_id": _pick(jc["query_id"], first[has]), "sub_subtopic": _pick(subs, has),
               "sub_item_id": _pick(jc["item_id"], first[has]), "sub_grade": grades[has]}
        # one ad hoc grade per (query, item): the largest
        adhoc = pair[first] // len(svocab)
        order, starts, _ = _group_bounds(adhoc)
        top = np.maximum.reduceat(grades[order], starts) if len(starts) else grades[:0]
        rows = first[order[starts]]
        return _pick(jc["query_id"], rows), _pick(jc["item_id"], rows), top, div


def _no_subtopics() -> dict:
    return {"sub_query_id": _strings([]), "sub_subtopic": _strings([]), "sub_item_id": _strings([]),
            "sub_grade": np.zeros(0)}


class _ScoreShard(ThreadedDoFn):
    def __init__(self, specs, options: MetricOptions, order: str, tie_break: str, score_precision: str, depth,
                 window_micros, slice_specs, threads: int = 1, bootstrap=None, compare=None):
        self.threads = int(threads)
        #: (baseline system, replicates, seed) of the paired comparisons, or None
        self.compare = compare
        if compare is not None:
            from ..accumulators.paired import PairedComparison

            self.pc = PairedComparison(len(specs), compare[1], seed=compare[2])
        #: (replicates, seed) of the Poisson bootstrap, or None (means only)
        self.bootstrap = bootstrap
        self.specs = specs
        self.options = options
        self.order = order
        self.tie_break = tie_break
        self.score_precision = score_precision
        self.depth = depth
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.mm = MeanMoments(len(specs)) if bootstrap is None else PoissonBootstrap(len(specs), *bootstrap)
        self.scored = counter(NAMESPACE, cn.REQUESTS_SCORED)
        self.unjudged = counter(NAMESPACE, cn.REQUESTS_UNJUDGED)
        self.queries = counter(NAMESPACE, cn.QUERIES_SCORED)
        self.unscorable = counter(NAMESPACE, cn.IMPRESSIONS_UNSCORABLE)
        self.imp_ranked = counter(NAMESPACE, cn.IMPRESSIONS_RANKED)
        self.imp_unjudged = counter(NAMESPACE, cn.IMPRESSIONS_UNJUDGED)
        self.imp_unrankable = counter(NAMESPACE, cn.IMPRESSIONS_UNRANKABLE)
        self.completed = counter(NAMESPACE, cn.REQUESTS_COMPLETED)
        #: impressions per element of this stage (one query shard) and judgments held (the side input)
        self.element_rows = distribution(NAMESPACE, cn.ELEMENT_IMPRESSIONS_SCORE)
        self.side_rows = distribution(NAMESPACE, cn.ELEMENT_JUDGMENTS_SCORE)

    def process(self, element, judgments, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        """``element``: (query shard, frozen request chunks); ``judgments``: the resolved judgments
        by shard (a multimap side input of :class:`_ResolveShard`'s output)."""
        # the side input is read here, on the runner's thread; the work may run on a pool thread
        yield from self._submit((element, list(judgments[_element_shard(element[0])])), window, timestamp)

    def work(self, element, judgments, systems=None, hot=None):
        """The outputs of ``element`` given its shard's resolved judgments (frozen values) and, for
        ``complete``, every system of the job (sorted). ``hot``: None, or the set of the queries fanned
        out in any request shard (:mod:`streameval.beam.columnar_hot`): their scored requests are
        counted and completed by the hot stage (tag ``hot``), not here."""
        key, rparts = element
        if not isinstance(key, int):  # a hot query's sub-element: the plain element completes its shard
            systems = None
        rparts = [v for v in rparts if v is not None]  # None: a shard's marker (complete)
        jparts = [thaw(v, keep=True) for v in judgments]  # a side input: may be read again
        if jparts:
            jc = _concat(jparts)
            jq, jd, jg = jc["query_id"], jc["item_id"], jc["grade"]
        else:
            jc = _no_subtopics()
            jq, jd, jg = _strings([]), _strings([]), np.zeros(0)
        self.side_rows.update(len(jq))
        cq, cg = jq, jg  # the judged queries completed here: the hot ones are the hot stage's
        if hot and systems is not None and len(jq):
            cold = ~_among(jq, hot)
            cq, cg = _pick(jq, cold), np.asarray(jg)[cold]
        if not rparts:
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        r = _concat_requests([thaw(v) for v in rparts])
        self.element_rows.update(int(r["records"].sum()))
        nreq = r["n_requests"]
        if not nreq:
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        # queries: codes shared by requests and judgments
        rq, jqc, _ = _sorted_codes(r["query_id"], jq)
        nq = int(max(rq.max(initial=-1), jqc.max(initial=-1))) + 1
        judged_q = np.zeros(nq, dtype=bool)
        judged_q[jqc] = True
        judged = judged_q[rq]
        # unjudged requests: one output of the shard's, not one Beam element per request
        rows = np.flatnonzero(~judged)
        if len(rows):
            ids = zip(*(_pylist(r[f], rows) for f in ("query_id", "system_id", "request_id")))
            n_imps = r["records"][rows]
            self.unjudged.inc(len(rows))
            self.imp_unjudged.inc(int(n_imps.sum()))
            yield pvalue.TaggedOutput("unjudged", [
                {"query_id": qid, "system": system, "request_id": rid,
                 "window_start": window_bounds(ts, self.window_micros)[0], "impressions": n}
                for (qid, system, rid), ts, n in zip(ids, r["min_ts"][rows].tolist(), n_imps.tolist())])
        # requests that cannot be ranked
        unrankable = judged & (r["unscored"] > 0)
        rows = np.flatnonzero(unrankable)
        ids = zip(*(_pylist(r[f], rows) for f in ("query_id", "system_id", "request_id")))
        for i, (qid, system, rid) in zip(rows.tolist(), ids):
            missing = int(r["unscored"][i])
            total = int(r["records"][i])
            self.unscorable.inc(missing)
            self.imp_unrankable.inc(total)
            yield pvalue.TaggedOutput("dead_letters", dead_letter(
                SOURCE_UNRANKABLE,
                {"query_id": qid, "system_id": system, "request_id": rid, "impressions": total,
                 "without_score": missing},
                f"{missing} of the request's {total} impressions have no score: "
                "order='score' needs a finite score to rank them (use order='position')"))
        sel = np.flatnonzero(judged & ~unrankable)
        if not len(sel):
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        self.scored.inc(len(sel))
        self.imp_ranked.inc(int(r["records"][sel].sum()))
        if len(sel) < nreq:
            rq_sel = rq[sel]
            r = _take_requests(r, sel)
            rq = rq_sel
        is_hot = _among(r["query_id"], hot) if hot else np.zeros(len(rq), dtype=bool)
        self.queries.inc(len(np.unique(rq[~is_hot])))  # the hot ones: counted once by the hot stage
        values = self._values(r, rq, jqc, jd, jg, nq, jc)
        yield from self._means(r, values)  # exact sums: a hot query's requests may be split freely
        if is_hot.any():
            from .columnar_hot import hot_summaries

            for kv in hot_summaries(_take_requests(r, np.flatnonzero(is_hot))):
                yield pvalue.TaggedOutput("hot", kv)
            if is_hot.all():
                if systems is not None:
                    yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
                return
            r, values = _take_requests(r, np.flatnonzero(~is_hot)), values[:, ~is_hot]
        if systems is not None:  # trec_eval -c: every judged query, every system
            yield from self._complete(cq, cg, systems, r["query_id"], r["system_id"], (r, values))
        elif self.compare is not None:
            yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)

    def _pairs(self, min_ts, system_id, attributes, query_id, values, all_only=None):
        """Tagged comparison states (``compare``) of scored requests (see columnar_compare)."""
        from .columnar_compare import paired_states

        for kv in paired_states(self.pc, self.compare[0], min_ts, system_id, attributes, query_id, values,
                                self.window_micros, self.slice_specs, all_only):
            yield pvalue.TaggedOutput("comparisons", kv)

    def _complete(self, jq, jg, systems, scored_query, scored_system, scored):
        """``complete``: a (judged query, system) pair of this shard without a scored request scores
        as an empty ranking (trec_eval's -c), in the global window's slice ``all``, as
        :class:`~streameval.beam.transforms.ScoreRankings` with ``complete=True``. ``jq``, ``jg``: the
        shard's resolved judgments; ``scored_*``: the query and system of each scored request;
        ``scored``: None or (the scored requests, their values), compared with the empty rankings
        (``compare``)."""
        pairs = [] if not len(jq) or not systems else None
        if pairs is None:
            yield from self._completions(jq, jg, systems, scored_query, scored_system, scored)
        elif self.compare is not None and scored is not None:
            r, values = scored
            yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)

    def _completions(self, jq, jg, systems, scored_query, scored_system, scored):
        jcode, qvals = _encode(jq)
        qnames = qvals.to_pylist()
        present = set(zip(scored_query.to_pylist(), scored_system.to_pylist()))
        pairs = [(qi, system) for qi, q in enumerate(qnames) for system in systems if (q, system) not in present]
        if not pairs:
            if self.compare is not None and scored is not None:
                r, values = scored
                yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)
            return
        qidx = np.fromiter((qi for qi, _ in pairs), dtype=np.int64, count=len(pairs))
        qoff, hv, hc = judgment_histogram(jcode, np.asarray(jg, dtype=np.float64), len(qnames))
        lists = RankedLists(offsets=np.zeros(len(pairs) + 1, dtype=np.int64), grades=np.zeros(0),
                            judged_offsets=qoff, judged_values=hv, judged_counts=hc, judged_index=qidx)
        values = empty_ranking_values(self.specs, self.options, lists, len(pairs))
        self.completed.inc(len(pairs))
        counted = set(scored_query.to_pylist())
        self.queries.inc(len({qnames[qi] for qi, _ in pairs} - counted))
        by_system: dict = {}
        for i, (_, system) in enumerate(pairs):
            by_system.setdefault(system, []).append(i)
        for system, idx in by_system.items():
            idx = np.asarray(idx)
            if self.bootstrap is None:
                state = self.mm.add_many(self.mm.create(), values[:, idx])
            else:
                state = self.mm.add_many(self.mm.create(), values[:, idx], keys=[qnames[i] for i in qidx[idx]])
            yield ((None, None, ALL, system), state)
        if self.compare is not None:  # the empty rankings count in the slice "all" only
            n = len(pairs)
            c_query = _strings([qnames[qi] for qi, _ in pairs])
            c_system = _strings([system for _, system in pairs])
            if scored is None:
                yield from self._pairs(np.zeros(n, np.int64), c_system, {}, c_query, values, np.ones(n, dtype=bool))
            else:
                r, rvalues = scored
                nreq = r["n_requests"]
                attrs = _concat_attributes([(r["attributes"], nreq), ({}, n)])
                yield from self._pairs(np.concatenate([r["min_ts"], np.zeros(n, np.int64)]),
                                       pa.concat_arrays([_strings(r["system_id"]), c_system]), attrs,
                                       pa.concat_arrays([_strings(r["query_id"]), c_query]),
                                       np.hstack([rvalues, values]),
                                       np.concatenate([np.zeros(nreq, dtype=bool), np.ones(n, dtype=bool)]))

    def _values(self, r, rq, jqc, jd, jg, nq, jc=None) -> np.ndarray:
        """(n_metrics, n_requests) metric values of the requests of ``r`` (all judged and rankable);
        ``jc``: the resolved judgments' columns, whose ``sub_*`` ones the diversity measures score."""
        rr = r["row_request"]
        ic, jic, ni = _sorted_codes(r["item_id"], jd)
        ni = max(ni, 1)
        perm = rank_order(rr, r["score"], ic, r["position"], order=self.order, tie_break=self.tie_break,
                          score_precision=self.score_precision)
        rr_s = rr[perm]
        nreq = r["n_requests"]
        counts = np.bincount(rr_s, minlength=nreq)
        if self.depth is not None:
            starts = np.cumsum(counts) - counts
            rank0 = np.arange(len(rr_s)) - np.repeat(starts, counts)
            cut = rank0 < self.depth
            perm = perm[cut]
            rr_s = rr_s[cut]
            counts = np.bincount(rr_s, minlength=nreq)
        offsets = np.zeros(nreq + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # join the grades: key (query, item), one judgment per key (resolved), by Arrow's hash table
        key = rq[rr_s] * ni + ic[perm]
        if len(jg):
            at = pc.index_in(pa.array(key), value_set=pa.array(jqc * ni + jic))
            at = np.asarray(at.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            grades = np.where(at >= 0, np.asarray(jg, dtype=np.float64)[at], np.nan)
        else:
            grades = np.full(len(key), np.nan)
        # judgment histogram per query; each request points at its query's
        qoff, hv, hc = judgment_histogram(jqc, jg.astype(np.float64), nq)
        lists = RankedLists(offsets=offsets, grades=grades.astype(np.float64), judged_offsets=qoff,
                            judged_values=hv, judged_counts=hc, judged_index=rq)
        jc = jc if jc is not None and "sub_grade" in jc else _no_subtopics()
        return score_values(self.specs, self.options, lambda specs: compute(lists, specs, self.options),
                            lambda: (r["query_id"], offsets, _pick(r["item_id"], perm)),
                            (jc["sub_query_id"], jc["sub_subtopic"], jc["sub_item_id"], jc["sub_grade"]))

    def _means(self, r, values):
        return mean_states(self.mm, r["min_ts"], r["system_id"], r["attributes"], values, self.window_micros,
                           self.slice_specs, r["query_id"] if self.bootstrap else None)


def mean_states(mm, min_ts, system_id, attributes: dict, values, window_micros, slice_specs, query_id=None):
    """``((window_start, window_end, slice, system), state)`` pairs of requests' metric values:
    ``values`` shape (n_metrics, n_requests); ``min_ts`` (int64 micros), ``system_id`` (Arrow
    strings) and ``attributes`` (``{key: Arrow strings}``, the slicing ones) per request. A request
    counts in the window of ``min_ts`` and in its label of every slice specification.

    ``mm``: a :class:`MeanMoments` (states of means), or a
    :class:`~streameval.accumulators.bootstrap.PoissonBootstrap` with ``query_id`` (Arrow strings,
    per request: the bootstrap's key, as in the per-record engine; the weights of each distinct
    query are drawn once)."""
    if query_id is not None:
        qcode, qvocab = _encode(query_id)
        table = mm.rs.weights(qvocab.to_pylist())

        def add(members):
            return mm.add_many(mm.create(), values[:, members], weights=table, index=qcode[members])
    else:
        def add(members):
            return mm.add_many(mm.create(), values[:, members])

    nreq = len(min_ts)
    wcode, wkeys = _windows(min_ts, window_micros)
    scode, svals = _factorize(system_id)
    labels = _labels(attributes, nreq, slice_specs)
    # every slice specification partitions the requests, so the states of "all" are the exact
    # merges of the first specification's states (the exact sums are computed once, not twice)
    derive_all = len(labels) > 1
    merged: dict = {}
    for spec, (lcode, lvals) in enumerate(labels):
        if spec == 0 and derive_all:
            continue
        key = (wcode * len(lvals) + lcode) * len(svals) + scode
        order, starts, ends = _group_bounds(key)
        for lo, hi in zip(starts, ends):
            members = order[lo:hi]
            k = int(key[members[0]])
            si = k % len(svals)
            li = (k // len(svals)) % len(lvals)
            wi = k // len(svals) // len(lvals)
            wkey = wkeys[wi]
            state = add(members)
            if spec == 1 and derive_all:
                merged.setdefault((*wkey, ALL, svals[si]), []).append(state)
            yield ((*wkey, lvals[li], svals[si]), state)
    for key, states in merged.items():
        yield (key, mm.merge(states))


class _CompletingScoreShard(_ScoreShard):
    """:class:`_ScoreShard` with ``complete``: the job's systems as a second side input."""

    def process(self, element, judgments, systems, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), sorted(systems)), window,
                                timestamp)


class _HotScoreShard(_ScoreShard):
    """:class:`_ScoreShard` with hot queries fanned out: the set of hot queries as a second side input."""

    def process(self, element, judgments, hot, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), None, frozenset(hot)),
                                window, timestamp)


class _HotCompletingScoreShard(_ScoreShard):
    """:class:`_CompletingScoreShard` with hot queries fanned out (side inputs: systems, hot queries)."""

    def process(self, element, judgments, systems, hot, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), sorted(systems),
                                 frozenset(hot)), window, timestamp)


def _element_shard(key) -> int:
    """The query shard of a score stage key: the shard, or (shard, sub) for a hot query's sub-element."""
    return key if isinstance(key, int) else key[0]


def _among(values: pa.Array, names) -> np.ndarray:
    """bool per row of an Arrow string column: is its value one of ``names`` (a set of str)."""
    found = pc.is_in(_strings(values), value_set=pa.array(sorted(names), type=pa.string()))
    return np.asarray(found.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
