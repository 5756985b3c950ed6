"""The online metrics on the columnar engine (:class:`~streameval.beam.columnar.ColumnarMetrics`).

The same rows as :class:`~streameval.beam.online.OnlineMetrics` with labels from clicks, from the
clean impressions' columns of each request shard, vectorised; the states are those of
:mod:`streameval.accumulators.online`, so the values are the same to the last bit:

* ``auc`` / ``auc_hist``: per (window, slice, system) and shard, the counts of positives and
  negatives per distinct score or bin (:class:`~streameval.accumulators.online.CountArrays`), merged
  by :class:`CountsCombineFn`;
* ``gauc[GROUP,WEIGHTING]``: a group (user, query or request) may span request shards, so each
  clean shard sends its examples (group id, key, score, label) to the shard of their group
  (:func:`~streameval.beam.columnar.shard_of` of the id): one element per pair of shards, not one
  per group. There every group's AUC is computed at once
  (:func:`~streameval.metrics.online.group_auc`) and summed into a
  :class:`~streameval.accumulators.online.GaucOps` state per (window, slice, system)
  (:func:`~streameval.accumulators.online.gauc_group_sums`);
* ``logloss``, ``brier``, ``calibration``, ``ece[bins=B]``: per (window, slice, system) and shard,
  a :class:`~streameval.accumulators.online.CalibrationOps` state of the examples whose score is in
  [0, 1] (:meth:`~streameval.accumulators.online.CalibrationOps.by_key`), merged by
  :class:`~streameval.beam.combiners.OpsCombineFn`;
* ``interleaving``: a request is whole in its shard, so its clicks on team A's and B's items are
  counted there (:meth:`OnlineColumns._interleaving_states`) and the indicators summed into
  MeanMoments states;
* ``clicks@k``, ``rr_first_click``, ``abandonment`` and the dwell metrics (``mean_dwell``,
  ``sat_click_rate[t=T]``, ``long_click_ctr[t=T]``, ``last_click_ctr[t=T]``): a request is whole in
  its shard, so its terms (:func:`~streameval.metrics.online.click_request_terms`) are computed there
  and summed into MeanMoments states, as the ranking metrics. The dwell metrics read the chunk's
  ``dwell_ms`` column (:mod:`streameval.io.dwell`; the reader's screen sends a bad dwell to the record
  check, whose dead letter names it, as the per-record engine does).

Counters as the per-record transforms: ``online:no_score``, ``online:not_labelled``,
``online:score_not_probability``,
``online:no_group:<field>``, ``online:requests``, ``online:requests_not_logged``,
``online:clicks_no_dwell``.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder

from ..accumulators.moments import MeanMoments
from ..accumulators.online import (CalibrationOps, CountArrays, GaucOps, ScoreCountMetrics, auc_result,
                                   gauc_group_sums, hist_auc_result)
from ..io import counters as cn
from ..io import dwell as dwell_io
from ..metrics import calibration as cal
from ..metrics import interleaving as il
from ..metrics import online as om
from .combiners import MeanStatesCombineFn
from .columnar_clean import _first_min, _grouped, _labels, _windows
from .columnar_columns import (_HELD, _concat, _encode, _factorize, _group_bounds, _held_keys, _key_shards, _nonempty,
                               _pair_codes, _pick, _shards_of, _sorted_codes, _split, _take, _unique_codes, freeze, thaw)
from .columnar_score import mean_states
from .combiners import OpsCombineFn
from .counts_as_data import COUNTS, counts_tags
from .online import (
    LABEL_SOURCES,
    UNJUDGED_POLICIES,
    calibration_rows,
    gauc_rows,
    group_slice,
    hist_rows,
    interleaving_rows,
    score_count_rows,
    with_interval,
)
from .threads import ThreadedDoFn, counter, default_threads
from .transforms import NAMESPACE, metric_row

__all__ = ["OnlineColumns", "CountsCombineFn", "GaucShard",
           "online_rows", "TAG_AUC", "TAG_HIST", "TAG_GAUC", "TAG_CALIBRATION", "TAG_REQUESTS"]

TAG_AUC, TAG_HIST, TAG_GAUC, TAG_REQUESTS = "online_auc", "online_auc_hist", "online_gauc", "online_requests"
TAG_CALIBRATION = "online_calibration"
TAG_INTERLEAVING = "online_interleaving"
#: scored impressions on their way to their judgments (labels from judgments)
TAG_EXAMPLES = "online_examples"
SCORE_TAGS = (TAG_AUC, TAG_HIST, TAG_GAUC, TAG_CALIBRATION)
TAGS = (*SCORE_TAGS, TAG_REQUESTS, TAG_EXAMPLES, TAG_INTERLEAVING)
#: the columns the label stage needs of a scored impression
_EXAMPLE_FIELDS = ("query_id", "item_id", "score", "timestamp", "system_id", "attributes", "user_id", "request_id")


class OnlineColumns:
    """What a clean request shard contributes to the online metrics: tagged ``(key, state)`` outputs.

    ``specs``: :class:`~streameval.metrics.online.OnlineSpec` (the ``ctr`` family is left to the
    engine's CTR), ``hist``: a :class:`~streameval.accumulators.online.HistAucOps` (its bins),
    ``shards``: the group shards of GAUC."""

    def __init__(self, specs, window_micros, slice_specs, hist, shards: int, hold: bool = False, labels="clicks",
                 relevance_level=1, unjudged="exclude", hold_counts: bool = False, reference=None):
        if labels not in LABEL_SOURCES:
            raise ValueError(f"labels must be one of {LABEL_SOURCES}, got {labels!r}")
        if unjudged not in UNJUDGED_POLICIES:
            raise ValueError(f"unjudged must be one of {UNJUDGED_POLICIES}, got {unjudged!r}")
        self.labels = labels
        # the AUC and histogram AUC states (CountArrays) held in this process, only a key through Beam
        # (hold_counts: for :func:`online_rows`' CountsCombineFn(hold=True), Beam's in-process runner only)
        self.hold_counts = bool(hold_counts)
        self.relevance_level = relevance_level
        self.unjudged = unjudged
        self.specs = [s for s in specs if s.family != "ctr"]
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.hist = hist
        self.shards = int(shards)
        self.hold = hold
        families = {s.family for s in self.specs}
        self.auc = "auc" in families
        # pr_auc, precision / recall / f1 at thresholds, psi, ks: from the exact AUC state (one state,
        # merged once, for them and auc; streameval.metrics.threshold)
        self.score_counts = ScoreCountMetrics([s for s in self.specs if s.score_counts], self.auc, reference)
        self.counts = self.auc or bool(self.score_counts.specs)
        self.auc_hist = "auc_hist" in families
        self.groups = sorted({s.group for s in self.specs if s.family == "gauc"})
        self.calibration = [s for s in self.specs if s.calibration]
        self.calibration_ops = CalibrationOps(s.k for s in self.calibration if s.family == "ece")
        self.outside = counter(NAMESPACE, cn.ONLINE_SCORE_NOT_PROBABILITY)
        self.request_specs = [s for s in self.specs if s.per_request]
        self.dwell = any(s.dwell for s in self.request_specs)
        self.no_dwell = counter(NAMESPACE, cn.ONLINE_CLICKS_NO_DWELL)
        self.scores = any(s.needs_scores for s in self.specs)
        self.attr_keys = sorted({a for names in slice_specs for a in names})
        self.no_score = counter(NAMESPACE, cn.ONLINE_NO_SCORE)
        self.not_labelled = counter(NAMESPACE, cn.ONLINE_NOT_LABELLED)
        self.unjudged_counter = counter(NAMESPACE, cn.ONLINE_UNJUDGED)
        self.requests = counter(NAMESPACE, cn.ONLINE_REQUESTS)
        self.not_logged = counter(NAMESPACE, cn.ONLINE_REQUESTS_NOT_LOGGED)
        self.no_group = {g: counter(NAMESPACE, cn.online_no_group(om.GAUC_GROUPS[g])) for g in self.groups}
        self.mm = MeanMoments(len(self.request_specs))
        self.interleaving = any(s.family == "interleaving" for s in self.specs)
        self.no_team = counter(NAMESPACE, cn.ONLINE_INTERLEAVING_NO_TEAM)
        self.mm3 = MeanMoments(3)

    def __bool__(self):
        return bool(self.specs)

    def states(self, chunk):
        """Tagged outputs of one clean chunk (impression columns, :func:`~streameval.beam.columnar.
        impression_columns`)."""
        if self.scores:
            yield from self._score_states(chunk)
        if self.request_specs:
            yield from self._request_states(chunk)
        if self.interleaving:
            yield from self._interleaving_states(chunk)

    # -- examples: scored impressions with a logged click flag ------------------------------
    def _keys(self, ex):
        """Per slice specification: (key code per example, ``(ws, we, label, system)`` per code)."""
        wcode, wkeys = _windows(ex["timestamp"], self.window_micros)
        scode, svals = _factorize(ex["system_id"])
        for lcode, lvals in _labels(ex["attributes"], ex["n"], self.slice_specs):
            key = (wcode * len(lvals) + lcode) * len(svals) + scode
            uk, inv = _unique_codes(key)
            names = []
            for k in uk.tolist():
                si = k % len(svals)
                li = (k // len(svals)) % len(lvals)
                names.append((*wkeys[k // len(svals) // len(lvals)], lvals[li], svals[si]))
            yield inv, names

    def _score_states(self, chunk):
        scored = ~np.isnan(chunk["score"])
        self.no_score.inc(int(chunk["n"] - scored.sum()))
        if self.labels == "judgments":  # to the shard of their query's judgments (see LabelShard)
            ex = _take(chunk, scored, _EXAMPLE_FIELDS)
            for s, frozen in _split(ex, _shards_of(ex["query_id"], None, self.shards), hold=self.hold):
                yield pvalue.TaggedOutput(TAG_EXAMPLES, (s, frozen))
            return
        labelled = scored & (chunk["clicked"] >= 0)
        self.not_labelled.inc(int(scored.sum() - labelled.sum()))
        if not labelled.any():
            return
        ex = _take(chunk, labelled) if not labelled.all() else chunk
        yield from self.labelled_states(ex, ex["clicked"] == 1)

    def labelled_states(self, ex, label):
        """Tagged AUC, histogram AUC, GAUC and calibration outputs of examples ``ex`` (impression
        columns with scores) and their labels (bool, shape (n,))."""
        if not ex["n"]:
            return
        score = ex["score"]
        keys = list(self._keys(ex))
        if self.calibration:
            prob = cal.probability_mask(score)
            self.outside.inc(int(len(prob) - prob.sum()))
            if prob.any():
                for code, names in keys:
                    for k, state in self.calibration_ops.by_key(code[prob], score[prob], label[prob]):
                        yield pvalue.TaggedOutput(TAG_CALIBRATION, (names[k], state))
        if self.counts or self.auc_hist:
            bins = om.hist_bin_index(score, self.hist.lo, self.hist.hi, self.hist.bins) if self.auc_hist else None
            # the exact AUC of the "all" slice from the first slice specification's states: its
            # labels partition the examples (an example without the attribute has a label of its
            # own), so per (window, system) the "all" counts are the sum of its labels' counts and
            # the states, each sent to both keys, merge into the same state as the examples'
            # own; the "all" rows are not counted and sorted a second time
            whole = self.counts and len(keys) > 1
            for i, (code, names) in enumerate(keys):
                if self.counts and not (whole and i == 0):
                    for k, state in CountArrays.by_key(code, score, label, raw=self.hold_counts):
                        yield pvalue.TaggedOutput(TAG_AUC, (names[k], _hold_counts(state) if self.hold_counts
                                                            else state))
                        if whole and i == 1:
                            ws, we, _, system = names[k]
                            yield pvalue.TaggedOutput(TAG_AUC, ((ws, we, keys[0][1][0][2], system),
                                                                _hold_counts(state) if self.hold_counts else state))
                if self.auc_hist:
                    for k, state in CountArrays.by_key(code, bins, label, raw=self.hold_counts):
                        yield pvalue.TaggedOutput(TAG_HIST, (names[k], _hold_counts(state) if self.hold_counts
                                                             else state))
        for group in self.groups:
            gid = ex[om.GAUC_GROUPS[group]]
            valid = _nonempty(gid) & np.asarray(pc.is_valid(gid).to_numpy(zero_copy_only=False))
            self.no_group[group].inc(int(len(valid) - valid.sum()))
            if not valid.any():
                continue
            rows = None if valid.all() else np.flatnonzero(valid)
            # one row per (example, slice specification), the key codes of each specification after
            # those of the ones before
            codes, names = [], []
            for code, nm in keys:
                codes.append((code if rows is None else code[rows]) + len(names))
                names.extend(nm)
            # the group ids dictionary-encoded once (not per specification): each shard's part carries
            # its distinct ids (strings, in order of first appearance) and an int code per row
            gcode, gkeys = _encode(gid if rows is None else _pick(gid, rows))
            kshard = _key_shards(gkeys, self.shards)
            # a part: its shard's examples in row order (sorted stably by shard), each example's
            # columns once and its key codes once per specification (those of the specifications one
            # after the other), repeated per specification only where the shard is worked on
            order, starts, ends = _group_bounds(kshard[gcode])
            sc = score if rows is None else score[rows]
            lab = (label if rows is None else label[rows]).astype(np.int8)
            local = np.zeros(len(gkeys), dtype=np.int64)
            for lo, hi in zip(starts.tolist(), ends.tolist()):
                idx = order[lo:hi]
                s = int(kshard[gcode[idx[0]]])
                ks = np.flatnonzero(kshard == s)
                local[ks] = np.arange(len(ks))
                part = {"n": hi - lo, "gcode": local[gcode[idx]], "gids": gkeys.take(pa.array(ks)),
                        "key": np.concatenate([c[idx] for c in codes]), "score": sc[idx], "label": lab[idx]}
                yield pvalue.TaggedOutput(TAG_GAUC, ((group, s), (names, freeze(part, hold=self.hold))))

    # -- requests: whole in their shard -----------------------------------------------------
    def _request_states(self, chunk):
        req, _ = _pair_codes(chunk["system_id"], chunk["request_id"])
        fields = ("timestamp", "attributes", "position", "system_id", "request_id", "clicked")
        rows, req, starts, ends = _grouped(chunk, req, (*fields, "dwell_ms") if self.dwell else fields)
        logged = np.maximum.reduceat(rows["clicked"], starts) >= 0
        n_logged = int(logged.sum())
        self.requests.inc(n_logged)
        self.not_logged.inc(len(starts) - n_logged)
        if not n_logged:
            return
        clicked = np.flatnonzero(rows["clicked"] == 1)
        dwell = None
        if self.dwell:  # null (dwell.NULL) -> NaN; a clicked row is in a logged request
            d = rows["dwell_ms"][clicked]
            dwell = np.where(d == dwell_io.NULL, np.nan, d.astype(np.float64))
            self.no_dwell.inc(int((d == dwell_io.NULL).sum()))
        terms = om.click_request_terms(self.request_specs, req[clicked], rows["position"][clicked], len(starts),
                                       dwell)
        keep = np.flatnonzero(logged)
        attrs = {a: _first_min(rows["attributes"][a], starts, ends)
                 for a in self.attr_keys if a in rows["attributes"]}
        yield from (pvalue.TaggedOutput(TAG_REQUESTS, kv) for kv in mean_states(
            self.mm, np.minimum.reduceat(rows["timestamp"], starts)[keep],
            _pick(rows["system_id"], starts[keep]),
            {a: _pick(v, keep) for a, v in attrs.items()}, terms[:, keep],
            self.window_micros, self.slice_specs))


    def _interleaving_states(self, chunk):
        """Per interleaved request (whole in its shard): clicks on team A's and B's items
        (``attributes["team"]``) -> the indicators of :func:`~streameval.metrics.interleaving.
        request_terms`, summed per (window, slice, system) into MeanMoments states."""
        req, _ = _pair_codes(chunk["system_id"], chunk["request_id"])
        rows, req, starts, ends = _grouped(chunk, req, ("timestamp", "attributes", "position", "system_id",
                                                           "request_id", "clicked"))
        nreq = len(starts)
        logged = np.maximum.reduceat(rows["clicked"], starts) >= 0
        clicked = np.flatnonzero(rows["clicked"] == 1)
        team = rows["attributes"].get(il.TEAM_ATTRIBUTE)
        if team is None:
            tvals = np.full(len(clicked), "", dtype=object)
        else:
            tvals = np.asarray(_pick(team, clicked).to_pylist(), dtype=object)
        ca = np.bincount(req[clicked[tvals == "A"]], minlength=nreq)
        cb = np.bincount(req[clicked[tvals == "B"]], minlength=nreq)
        other = np.bincount(req[clicked[(tvals != "A") & (tvals != "B")]], minlength=nreq) > 0
        self.no_team.inc(int((other & logged).sum()))
        keep = np.flatnonzero(logged & ~other)
        if not len(keep):
            return
        terms = il.request_terms(ca[keep], cb[keep])
        attrs = {a: _first_min(rows["attributes"][a], starts, ends)
                 for a in self.attr_keys if a in rows["attributes"]}
        yield from (pvalue.TaggedOutput(TAG_INTERLEAVING, kv) for kv in mean_states(
            self.mm3, np.minimum.reduceat(rows["timestamp"], starts)[keep],
            _pick(rows["system_id"], starts[keep]),
            {a: _pick(v, keep) for a, v in attrs.items()}, terms,
            self.window_micros, self.slice_specs))


class LabelShard(ThreadedDoFn):
    """Labels from judgments: ``(query shard, frozen scored impressions)`` and the shard's resolved
    judgments (a multimap side input of the engine's judgment stage) -> the tagged outputs of
    :meth:`OnlineColumns.labelled_states`. An impression's label is ``grade >= relevance_level`` of
    its (query_id, item_id) judgment; without one (or with a negative grade: trec_eval's pooled but
    unjudged) it is left out and counted (``online:unjudged``) or, with ``unjudged="nonrelevant"``,
    labelled non-relevant (:class:`~streameval.beam.online.LabelFromJudgments`' rule)."""

    def __init__(self, online: OnlineColumns):
        self.online = online

    def process(self, element, judgments, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        """The work runs here (``threads`` 1); ``judgments``: the side input."""
        yield from self._submit((element, judgments), window, timestamp)

    def work(self, element, judgments):
        shard, parts = element
        ex = _concat([thaw(v) for v in parts])
        if not ex["n"]:
            return
        jparts = [thaw(v, keep=True) for v in judgments[shard]]  # a side input: may be read again
        grade = np.full(ex["n"], np.nan)
        if jparts:
            jc = _concat(jparts)
            qc, jqc, _ = _sorted_codes(ex["query_id"], jc["query_id"])
            ic, jic, ni = _sorted_codes(ex["item_id"], jc["item_id"])
            ni = max(ni, 1)
            at = pc.index_in(pa.array(qc * ni + ic), value_set=pa.array(jqc * ni + jic))
            at = np.asarray(at.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            grade = np.where(at >= 0, np.asarray(jc["grade"], dtype=np.float64)[at], np.nan)
        unjudged = np.isnan(grade) | (grade < 0)
        online = self.online
        if online.unjudged == "exclude":
            online.unjudged_counter.inc(int(unjudged.sum()))
            if unjudged.any():
                ex = _take(ex, ~unjudged)
                grade = grade[~unjudged]
            label = grade >= online.relevance_level
        else:
            label = ~unjudged & (grade >= online.relevance_level)
        yield from online.labelled_states(ex, label)


class GaucShard(ThreadedDoFn):
    """``((group, shard), [(key names, frozen examples), ...])`` -> ``((group, key), GaucOps state)``
    per (window, slice, system) key; with ``group_rows`` also each group's AUC row (metric ``auc``,
    slice ``<group>=<id>``). ``threads``: shards worked on at once (:mod:`streameval.beam.threads`)."""

    def __init__(self, weightings: dict, group_rows: bool = False, threads: int = 1):
        self.weightings = weightings
        self.group_rows = bool(group_rows)
        self.threads = int(threads)

    def work(self, element):
        (group, _), values = element
        index: dict = {}
        keys, gids, gcodes, scores, labels = [], [], [], [], []
        offset = 0
        for names, frozen in values:
            c = thaw(frozen)
            remap = np.fromiter((index.setdefault(k, len(index)) for k in names), dtype=np.int64, count=len(names))
            keys.append(remap[c["key"]])
            gids.append(c["gids"])  # the part's distinct ids; its rows' codes index them
            # a row per (example, slice specification): the examples' columns once per specification
            specs = len(c["key"]) // c["n"] if c["n"] else 0
            gcodes.append(np.tile(c["gcode"] + offset, specs))
            offset += len(c["gids"])
            scores.append(np.tile(c["score"], specs))
            labels.append(np.tile(c["label"], specs))
        key = np.concatenate(keys)
        score = np.concatenate(scores)
        label = np.concatenate(labels) == 1
        # the codes of the parts' ids in order of first appearance: those of the rows' ids
        gmap, gvals = _encode(pa.concat_arrays(gids))
        gcode = gmap[np.concatenate(gcodes)]
        combined = key * len(gvals) + gcode
        ids, auc, n_pos, n_neg = om.group_auc(combined, score, label)
        names = list(index)
        kid = ids // len(gvals)
        starts = np.flatnonzero(np.concatenate(([True], kid[1:] != kid[:-1])))
        ends = np.append(starts[1:], len(kid))
        weightings = self.weightings[group]
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            state = gauc_group_sums(auc[lo:hi], n_pos[lo:hi], n_neg[lo:hi], weightings)
            yield ((group, names[int(kid[lo])]), state)
        if self.group_rows:
            texts = gvals.to_pylist()
            for code, state in CountArrays.by_key(combined, score, label):
                ws, we, slice_label, system = names[code // len(gvals)]
                value, n, se = auc_result(*CountArrays.counts(state))
                yield pvalue.TaggedOutput("group_rows", metric_row(
                    ws, we, group_slice(slice_label, group, texts[code % len(gvals)]), system, "auc", value, n, se))


def _hold_counts(state) -> str:
    """A key for a CountArrays ``state`` kept in this process's memory (the held values of
    :func:`~streameval.beam.columnar_columns.freeze`; :func:`~streameval.beam.columnar_columns.
    release_held` drops them): Beam's local runner then encodes, groups and decodes a short string
    instead of the state's bytes (24 per distinct score: with distinct scores, every example's),
    four copies of them between the clean stage and the merge."""
    key = f"{os.getpid()}:c{next(_held_keys)}"
    _HELD[key] = state
    return key


def _take_held(key: str):
    try:
        return _HELD.pop(key)
    except KeyError:
        raise RuntimeError("an AUC state was held in another process: hold_counts needs Beam's in-process "
                           "local runner (FnApiRunner without worker processes)") from None


def _counts(state):
    """The CountArrays state of ``state`` or of a key of :func:`_hold_counts` (taken: a held state is
    read once; a merge still running on :func:`_merge_pool`: waited for, its error raised here).
    Raises RuntimeError for a key held in another process."""
    if not isinstance(state, str):
        return state
    held = _take_held(state)
    return held.result()[0] if isinstance(held, Future) else held


_pool = None
_pool_lock = threading.Lock()


def _merge_pool() -> ThreadPoolExecutor:
    """The threads that merge held AUC states (one per core, :func:`~streameval.beam.threads.
    default_threads`; made once per process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(default_threads(), thread_name_prefix="streameval-auc")
        return _pool


class CountsCombineFn(beam.CombineFn):
    """Merges :class:`~streameval.accumulators.online.CountArrays` states; output ``(auc, examples,
    stderr)`` (``kind="auc"``), ``(auc, examples, stderr, max_error)`` (``"auc_hist"``) or the
    rows' ``[(name, value, n, stderr), ...]`` of ``scores`` (``"scores"``, a
    :class:`~streameval.accumulators.online.ScoreCountMetrics`).
    Accumulator: a list of states, merged 64 at a time. ``hold``: the inputs may be keys of states
    held in this process (:func:`_hold_counts`), and the accumulators Beam encodes are too (Beam's
    in-process local runner only); the merges then run on a pool of threads (:func:`_merge_pool`:
    the runner calls ``compact`` key after key on its one thread, at the end of the clean stage,
    and the merges, numpy sorts that release the GIL, went one after the other), each with the
    output of its merged state, which ``extract_output`` takes when that state is the key's last."""

    def __init__(self, kind: str = "auc", hold: bool = False, scores=None):
        if kind not in ("auc", "auc_hist", "scores"):
            raise ValueError(f"kind must be auc, auc_hist or scores, got {kind!r}")
        if (kind == "scores") != (scores is not None):
            raise ValueError("scores (a ScoreCountMetrics) goes with kind='scores' only")
        self.kind = kind
        self.scores = scores
        self.hold = bool(hold)

    def _merged(self, states):
        if not self.hold:
            return CountArrays.merge([_counts(s) for s in states])
        if len(states) == 1:
            return states[0]
        return _hold_counts(_merge_pool().submit(self._merge_held, list(states)))

    def _merge_held(self, keys):
        """(merged state, its output) of held states (on a thread of :func:`_merge_pool`)."""
        merged = CountArrays.merge([_counts(k) for k in keys], raw=True)  # arrays: it stays in this process
        return merged, self._output(merged)

    def _output(self, state):
        if self.kind == "scores":
            return self.scores(*CountArrays.arrays(state))
        pos, neg = CountArrays.counts(state)
        return auc_result(pos, neg) if self.kind == "auc" else hist_auc_result(pos, neg)

    def create_accumulator(self):
        return []

    def add_input(self, acc, state):
        acc.append(state)
        if len(acc) >= 64:
            acc[:] = [self._merged(acc)]
        return acc

    def merge_accumulators(self, accumulators):
        return [self._merged([s for a in accumulators for s in a])]

    def compact(self, acc):
        return [self._merged(acc)]

    def extract_output(self, acc):
        if self.hold and len(acc) == 1 and isinstance(acc[0], str):
            held = _take_held(acc[0])
            if isinstance(held, Future):  # merged on the pool, with its output
                return held.result()[1]
            return self._output(held)
        return self._output(CountArrays.merge([_counts(s) for s in acc]))

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


def online_rows(outputs, online: OnlineColumns, group_rows: bool, ci_level: float, judgments=None,
                threads: int = 1, ci_bounded: str = "logit", counts=None) -> list:
    """The metric rows (PCollections) of the clean stage's tagged ``outputs``; with labels from
    judgments, ``judgments`` is the engine's resolved judgments by query shard. ``threads``: the GAUC
    shards worked on at once (:class:`GaucShard`). ``counts``: None, or a list to which the labelling
    stage's counts are added (it then counts as data: :mod:`streameval.beam.counts_as_data`)."""
    if online.labels == "judgments" and online.scores:
        label_fn = LabelShard(online)
        label_fn.counts_as_data = counts is not None
        labelled = (outputs[TAG_EXAMPLES]
                    | "GroupExamples" >> beam.GroupByKey()
                    | "LabelExamples" >> beam.ParDo(label_fn, beam.pvalue.AsMultiMap(judgments))
                    .with_outputs(*SCORE_TAGS, *counts_tags(counts is not None)))
        if counts is not None:
            counts.append(labelled[COUNTS])
        outputs = {TAG_REQUESTS: outputs[TAG_REQUESTS], TAG_INTERLEAVING: outputs[TAG_INTERLEAVING],
                   **{t: labelled[t] for t in SCORE_TAGS}}
    parts = []
    if online.score_counts.specs:  # auc among them: the exact AUC state is merged once
        parts.append(outputs[TAG_AUC]
                     | "MergeScoreCounts" >> beam.CombinePerKey(CountsCombineFn("scores", online.hold_counts,
                                                                                online.score_counts))
                     | "ScoreCountRows" >> beam.FlatMap(score_count_rows))
    elif online.auc:
        parts.append(outputs[TAG_AUC]
                     | "MergeAuc" >> beam.CombinePerKey(CountsCombineFn("auc", online.hold_counts))
                     | "AucRows" >> beam.Map(lambda kv: metric_row(*kv[0], "auc", *kv[1])))
    if online.auc_hist:
        parts.append(outputs[TAG_HIST]
                     | "MergeHistAuc" >> beam.CombinePerKey(CountsCombineFn("auc_hist", online.hold_counts))
                     | "HistAucRows" >> beam.FlatMap(hist_rows))
    if online.calibration:
        parts.append(outputs[TAG_CALIBRATION]
                     | "MergeCalibration" >> beam.CombinePerKey(OpsCombineFn(online.calibration_ops))
                     | "CalibrationRows" >> beam.FlatMap(calibration_rows, online.calibration))
    if online.groups:
        weightings = {g: tuple(s.weighting for s in online.specs if s.family == "gauc" and s.group == g)
                      for g in online.groups}
        per_key = (outputs[TAG_GAUC]
                   | "GroupShards" >> beam.GroupByKey()
                   | "GroupAuc" >> beam.ParDo(GaucShard(weightings, group_rows, threads)).with_outputs(
                       "group_rows", main="states"))
        if group_rows:
            parts.append(per_key.group_rows)
        for g in online.groups:
            parts.append(per_key.states
                         | f"Keep[{g}]" >> beam.Filter(lambda kv, g: kv[0][0] == g, g)
                         | f"Key[{g}]" >> beam.Map(lambda kv: (kv[0][1], kv[1]))
                         | f"Gauc[{g}]" >> beam.CombinePerKey(OpsCombineFn(GaucOps(weightings[g])))
                         | f"GaucRows[{g}]" >> beam.FlatMap(gauc_rows, g, weightings[g]))
    if online.request_specs:
        names = [s.name for s in online.request_specs]
        parts.append(outputs[TAG_REQUESTS]
                     | "MergeRequestMeans" >> beam.CombinePerKey(MeanStatesCombineFn(len(names)))
                     | "RequestRows" >> beam.FlatMap(_request_rows, names))
    if online.interleaving:
        parts.append(outputs[TAG_INTERLEAVING]
                     | "MergeInterleaving" >> beam.CombinePerKey(MeanStatesCombineFn(3, totals=[True] * 3))
                     | "InterleavingRows" >> beam.FlatMap(interleaving_rows, ci_level))
    return [p | f"OnlineIntervals{i}" >> beam.Map(with_interval, ci_level, ci_bounded) for i, p in enumerate(parts)]


def _request_rows(kv, names):
    (ws, we, label, system), results = kv
    for name, (value, n, se) in zip(names, results):
        yield metric_row(ws, we, label, system, name, value, n, se)
