"""Vectorised ranking-metric definitions: the one place each metric is defined.

Input is a batch of queries as flat arrays with offsets (:class:`RankedLists`); output is one score
per query and metric. Pure numpy: no Beam, no I/O. Definitions follow trec_eval 10.0
(``usnistgov/trec_eval``: ``form_res_rels.c`` and the ``m_*.c`` file named in each docstring) where
trec_eval has the measure; ERR follows Chapelle et al. 2009.

Conventions (see ``docs/metrics.md``):

* ``grades[i]`` is the judged grade of the item at rank ``i`` of its query, ``NaN`` when the item is
  not in the qrels. A negative grade means "in the pool but not judged" (trec_eval's
  ``RELVALUE_UNJUDGED``); it is neither relevant nor judged non-relevant.
* relevant means ``grade >= relevance_level`` (default 1); judged non-relevant means
  ``0 <= grade < relevance_level``.
* gains are the raw grades (``gain="linear"``, trec_eval) or ``2**grade - 1`` (``"exponential"``,
  Burges et al. 2005); only positive grades gain.
* the ideal DCG uses every positive judgment of the query (``ideal="judgments"``, trec_eval) or
  only the grades of the served items (``ideal="served"``, TFMA / scikit-learn style).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .names import MetricSpec
from .parallel import run_tasks

__all__ = ["RankedLists", "MetricOptions", "compute", "GAINS", "IDEALS", "options_for"]

from .choices import DEFAULT_GAIN, DEFAULT_IDEAL, DEFAULT_RELEVANCE_LEVEL, GAINS, IDEALS  # noqa: E402
#: ranked items scored per chunk by :func:`compute` (whole queries; bounds its temporaries, about 100
#: bytes an item: at 2**19, evaluate()'s first call on 3 M items faulted 74 MB of them in afresh on
#: its two threads, 10 MB at 2**18, and took 0.16 -> 0.12 s there)
CHUNK_ITEMS = 1 << 18


#: the largest grade the exponential gain 2**grade - 1 can use (2**1024 overflows a double)
MAX_EXPONENTIAL_GRADE = 1023


def usable_grade_limit(specs, options: "MetricOptions") -> tuple[int, str] | None:
    """``(highest grade, why)`` the metric ``specs`` (MetricSpecs, or ``MetricSpec.family`` names)
    can score under ``options`` (and their own options, :func:`options_for`), or None when any grade
    can: ERR's ``err_max_grade`` (a larger grade raises in ``_err``) and :data:`MAX_EXPONENTIAL_GRADE`
    with ``gain="exponential"`` (nDCG, DCG). The jobs reject the judgments above it as dead letters
    instead of failing or scoring NaN."""
    specs = list(specs)
    families = {getattr(s, "family", s) for s in specs}
    exponential = {getattr(s, "family", s) for s in specs
                   if (options_for(s, options) if isinstance(s, MetricSpec) else options).gain == "exponential"}
    limits = []
    if "err" in families:
        limits.append((int(np.floor(options.err_max_grade)), "the largest grade ERR scores (--err-max-grade)"))
    if {"ndcg", "dcg"} & exponential:
        limits.append((MAX_EXPONENTIAL_GRADE, "the largest grade whose exponential gain 2**grade - 1 fits a double"))
    return min(limits) if limits else None


@dataclass(frozen=True)
class MetricOptions:
    """Named conventions that change a metric's value (documented in ``docs/metrics.md``).

    relevance_level: grade at or above which an item is relevant (trec_eval ``-l``), default 1.
    gain: ``"linear"`` (trec_eval, gain = grade) or ``"exponential"`` (gain = 2**grade - 1).
    ideal: ``"judgments"`` (ideal DCG from all judged items, trec_eval) or ``"served"``.
    err_max_grade: the maximum grade g_max of ERR's satisfaction probability (2**g - 1) / 2**g_max;
        default 4 (grades 0-4, as TREC Web track's gdeval). A larger grade raises ``ValueError``, as
        does a grade above :data:`MAX_EXPONENTIAL_GRADE` with the exponential gain.
    num_docs_in_coll: the number of documents in the collection (trec_eval ``-N``, default 0 as
        trec_eval's); only ``utility``'s fourth coefficient (non-relevant documents not ranked) uses it.
    gain_floor: grades below it gain 0 in DCG, nDCG and their ideal (default 0: every positive grade
        gains); ranx's ``ndcg@10-l2`` (its relevance level drops the judgments below it).
    """

    relevance_level: float = DEFAULT_RELEVANCE_LEVEL
    gain: str = DEFAULT_GAIN
    ideal: str = DEFAULT_IDEAL
    err_max_grade: float = 4
    num_docs_in_coll: int = 0
    gain_floor: float = 0

    def __post_init__(self):
        if self.gain not in GAINS:
            raise ValueError(f"gain must be one of {GAINS}, got {self.gain!r}")
        if self.ideal not in IDEALS:
            raise ValueError(f"ideal must be one of {IDEALS}, got {self.ideal!r}")
        for name in ("relevance_level", "err_max_grade"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name} must be a number, got {v!r}")
            if not np.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v!r}")
        if not self.err_max_grade > 0:
            raise ValueError(f"err_max_grade must be positive, got {self.err_max_grade!r}")
        n = self.num_docs_in_coll
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"num_docs_in_coll must be an int, got {n!r}")


def options_for(spec: MetricSpec, options: "MetricOptions") -> "MetricOptions":
    """The options ``spec`` is computed with: ``options`` with the spec's own overrides
    (``spec.opts``: ``rel=2`` the relevance level, ``gain=exponential``; ir_measures parameters)."""
    if not spec.opts:
        return options
    changes = {}
    for part in spec.opts.split(";"):
        key, _, value = part.partition("=")
        if key == "rel":
            changes["relevance_level"] = float(value)
        elif key == "gain":
            changes["gain"] = value
        elif key == "floor":
            changes["gain_floor"] = float(value)
        elif key in ("ranx", "binary", "judged", "gains", "T", "p", "min_rel", "max_rel", "normalize", "rounding"):
            # read by the family's function (cwl_measures.params_of) / by _compute
            pass
        else:
            raise ValueError(f"{spec.name}: unknown option {part!r}")
    return replace(options, **changes)


@dataclass
class RankedLists:
    """A batch of ranked lists, flat.

    offsets: int64, shape (n_queries + 1,); query q's ranked items are ``offsets[q]:offsets[q+1]``.
    grades: float64, shape (offsets[-1],): grade of the item at each rank (rank order), NaN if the
        item has no judgment, negative if it is in the pool but unjudged.
    judged_offsets: int64, shape (n_queries + 1,): slices of the judgment histogram per query; with
        ``judged_index``, shape (n_histograms + 1,), one slice per histogram.
    judged_values: float64: distinct non-negative judged grades of each query, descending.
    judged_counts: int64: how many judgments of the query have that grade.
    judged_index: None, or int64, shape (n_queries,): the histogram of each ranked list, for lists
        that share one (several requests of one query: the ideal DCG is then computed once per
        histogram, not once per list).
    """

    offsets: np.ndarray
    grades: np.ndarray
    judged_offsets: np.ndarray
    judged_values: np.ndarray
    judged_counts: np.ndarray
    judged_index: np.ndarray | None = None

    @property
    def num_queries(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_lists(cls, ranked: list, judged: list) -> "RankedLists":
        """Build from Python lists: ``ranked[q]`` the grades in rank order (None/NaN = unjudged),
        ``judged[q]`` the grades of all judgments of query q (any order; negatives ignored)."""
        if len(ranked) != len(judged):
            raise ValueError("ranked and judged must have one entry per query")
        lengths = np.fromiter((len(r) for r in ranked), dtype=np.int64, count=len(ranked))
        offsets = np.zeros(len(ranked) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [np.nan if x is None else float(x) for r in ranked for x in r]
        grades = np.asarray(flat, dtype=np.float64)
        hv, hc, hl = [], [], []
        for j in judged:
            arr = np.asarray([float(x) for x in j], dtype=np.float64)
            arr = arr[arr >= 0]
            vals, counts = np.unique(arr, return_counts=True)
            hv.append(vals[::-1])
            hc.append(counts[::-1])
            hl.append(len(vals))
        joff = np.zeros(len(judged) + 1, dtype=np.int64)
        np.cumsum(hl, out=joff[1:])
        return cls(
            offsets=offsets,
            grades=grades,
            judged_offsets=joff,
            judged_values=np.concatenate(hv) if hv else np.zeros(0),
            judged_counts=np.concatenate(hc).astype(np.int64) if hc else np.zeros(0, np.int64),
        )


@dataclass
class _RowSums:
    """:meth:`_Batch.sum_top`'s state for one weight: the (queries x longest) matrix of the weights
    (None: too large, summed per cutoff instead), its running sums along the rows as far as made so
    far (None: none yet), and the longest list's length."""

    matrix: np.ndarray | None
    sums: np.ndarray | None
    longest: int


class _Batch:
    """Lazily computed intermediate arrays shared by the metrics of one call."""

    def __init__(self, lists: RankedLists, opts: MetricOptions):
        self.lists = lists
        self.opts = opts
        self.n = lists.num_queries
        off = np.asarray(lists.offsets, dtype=np.int64)
        self.off = off
        self.lengths = np.diff(off)
        self.N = int(off[-1])
        g = np.asarray(lists.grades, dtype=np.float64)
        if g.shape != (self.N,):
            raise ValueError(f"grades has shape {g.shape}, offsets say {self.N} ranked items")
        self.g = g
        self.qidx = np.repeat(np.arange(self.n), self.lengths)
        self.rank = np.arange(1, self.N + 1, dtype=np.int64) - np.repeat(off[:-1], self.lengths)
        with np.errstate(invalid="ignore"):
            self.judged = g >= 0
            self.rel = self.judged & (g >= opts.relevance_level)
        # judgment histogram
        joff = np.asarray(lists.judged_offsets, dtype=np.int64)
        hv = np.asarray(lists.judged_values, dtype=np.float64)
        hc = np.asarray(lists.judged_counts, dtype=np.int64)
        # histograms: one per list, or shared (judged_index: the histogram of each list)
        self.ng = len(joff) - 1
        self.gidx = None if lists.judged_index is None else np.asarray(lists.judged_index, dtype=np.int64)
        if (self.ng if self.gidx is None else len(self.gidx)) != self.n:
            raise ValueError(f"{self.ng if self.gidx is None else len(self.gidx)} judgment histograms or indices "
                             f"for {self.n} ranked lists")
        hq = np.repeat(np.arange(self.ng), np.diff(joff))
        self.hv, self.hc, self.hq, self.joff = hv, hc, hq, joff
        self.num_rel = self.per_list(np.bincount(hq, weights=hc * (hv >= opts.relevance_level), minlength=self.ng))
        self.num_nonrel = self.per_list(np.bincount(hq, weights=hc * ((hv >= 0) & (hv < opts.relevance_level)),
                                                    minlength=self.ng))
        self._cache: dict = {}

    # ---- helpers -------------------------------------------------------------------------
    def per_list(self, per_histogram: np.ndarray) -> np.ndarray:
        """Values per judgment histogram laid out per ranked list."""
        return per_histogram if self.gidx is None else per_histogram[self.gidx]

    def segsum(self, weights) -> np.ndarray:
        return np.bincount(self.qidx, weights=weights, minlength=self.n)

    def cached(self, name, make):
        """``make()``, computed once per batch under ``name``."""
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    def _last(self, k):
        """(index of each query's last item within its top ``k`` (None: all; an int, or an int
        array of one cutoff per query), clipped to 0; whether the query has such an item)."""
        take = self.lengths if k is None else np.minimum(self.lengths, k)
        return np.maximum(self.off[:-1] + take - 1, 0), take > 0

    def count_top(self, name, values, k=None) -> np.ndarray:
        """Per query, how many of its first ``k`` items (``k``: None for all, an int, or an array of
        one cutoff per query) have ``values`` (bool per item) true: the running count
        (:meth:`within`, exact integers) at the last of them. Equal to ``segsum(values & top(k))``."""
        if not self.N:
            return np.zeros(self.n)
        last, has = self._last(k) if not (k is None or np.isscalar(k)) else \
            self.cached(("last", k), lambda: self._last(k))
        return np.where(has, self.within(name, values)[last], 0.0)

    def sum_top(self, name, weights, k=None) -> np.ndarray:
        """Per query, the sum of ``weights`` (float per item, none of them -0.0) over its first
        ``k`` items, added in rank order as ``np.bincount`` adds them (equal bits). Without a cutoff,
        :meth:`segsum`; with one, the running sums along the rows of a (queries, longest) matrix,
        made only as far as the largest cutoff asked so far and kept for the other cutoffs of the
        same weights; :meth:`segsum` of the weights cut at ``k`` when that matrix would be much
        larger than the items themselves."""
        if k is None:
            return self.cached(("total", name), lambda: self.segsum(weights))
        key = ("rows", name)
        if key not in self._cache:
            longest = int(self.lengths.max()) if self.n else 0
            m: np.ndarray | None = None
            if self.N and self.n * longest == self.N:  # every list as long as the longest: a view
                m = np.asarray(weights, dtype=np.float64).reshape(self.n, longest)
            elif self.N and self.n * longest <= 4 * self.N + 1024:
                flat = np.zeros(self.n * longest)
                flat[self.qidx * longest + (self.rank - 1)] = weights
                m = flat.reshape(self.n, longest)
            self._cache[key] = _RowSums(m, None, longest)
        entry = self._cache[key]
        m, sums, longest = entry.matrix, entry.sums, entry.longest
        if m is None:
            return self.segsum(np.where(self.top(k), weights, 0.0))
        need = max(min(int(k), longest), 1)
        have = 0 if sums is None else sums.shape[1]
        if have < need:  # the running sums of columns have..need-1, continuing from column have-1
            if sums is None:
                sums = np.cumsum(m[:, :need], axis=1)
            else:
                more = np.cumsum(np.concatenate([sums[:, -1:], m[:, have:need]], axis=1), axis=1)
                sums = np.concatenate([sums, more[:, 1:]], axis=1)
            entry.sums = sums
        take = np.minimum(self.lengths, k)
        return np.where(take > 0, sums[np.arange(self.n), np.maximum(take - 1, 0)], 0.0)

    def within(self, name, values) -> np.ndarray:
        """Inclusive cumulative sum of ``values`` inside each query."""
        if name not in self._cache:
            c = np.cumsum(values, dtype=np.float64)
            before = np.concatenate(([0.0], c))[self.off[:-1]]
            self._cache[name] = c - np.repeat(before, self.lengths)
        return self._cache[name]

    @property
    def cum_rel(self):
        return self.within("cum_rel", self.rel)

    def top(self, k):
        return self.rank <= k

    def per_rel(self, numer):
        """numer / num_rel, 0 where the query has no relevant judgment (trec_eval)."""
        out = np.zeros(self.n)
        np.divide(numer, self.num_rel, out=out, where=self.num_rel > 0)
        return out

    def gain(self, grades):
        with np.errstate(invalid="ignore"):
            pos = (grades > 0) & (grades >= self.opts.gain_floor)
            if self.opts.gain == "exponential" and np.any(grades > MAX_EXPONENTIAL_GRADE):
                raise ValueError(f"gain='exponential': grade {np.nanmax(grades):g} is above "
                                 f"{MAX_EXPONENTIAL_GRADE}, the largest whose gain 2**grade - 1 fits a double")
        g = np.where(pos, grades, 0.0)
        if self.opts.gain == "exponential":
            g = np.where(pos, np.exp2(g) - 1.0, 0.0)
        return g

    @property
    def discounted_gain(self):
        if "dg" not in self._cache:
            self._cache["dg"] = self.gain(self.g) / np.log2(self.rank + 1.0)
        return self._cache["dg"]

    def _ideal_prefix(self):
        """Ideal DCG of every judged-ideal prefix, (histograms, longest) with the running sums along
        rows, and the number of positive grades per judgment histogram (:meth:`ideal` lays them out
        per ranked list); None when that matrix would be much
        larger than the grades themselves (:meth:`ideal` then sums per cutoff). Each running sum
        adds the same terms in the same order as ``np.bincount`` does in :meth:`ideal`: equal bits."""
        if "iprefix" not in self._cache:
            pos = self.hv > 0
            hv, hc, hq = self.hv[pos], self.hc[pos], self.hq[pos]
            ng = self.ng
            counts = np.bincount(hq, weights=hc, minlength=ng).astype(np.int64)
            total = int(counts.sum())
            longest = int(counts.max()) if ng else 0
            out = None
            if total and ng * longest <= 4 * total + 1024:
                vals = np.repeat(hv, hc)
                ioff = np.zeros(ng + 1, dtype=np.int64)
                np.cumsum(counts, out=ioff[1:])
                q = np.repeat(np.arange(ng, dtype=np.int64), counts)
                irank = np.arange(1, total + 1) - ioff[:-1][q]
                m = np.zeros((ng, longest))
                m[q, irank - 1] = self.gain(vals) / np.log2(irank + 1.0)
                out = (np.cumsum(m, axis=1), counts)
            self._cache["iprefix"] = out
        return self._cache["iprefix"]

    def ideal(self, k):
        """Ideal DCG at cutoff k (None = no cutoff), one value per query."""
        key = ("idcg", k)
        if key in self._cache:
            return self._cache[key]
        prefix = self._ideal_prefix() if self.opts.ideal != "served" else None
        if prefix is not None:
            sums, counts = prefix
            take = counts if k is None else np.minimum(counts, k)
            out = self.per_list(np.where(take > 0, sums[np.arange(self.ng), np.maximum(take - 1, 0)], 0.0))
            self._cache[key] = out
            return out
        if self.opts.ideal == "served":  # per ranked list, from its own grades
            with np.errstate(invalid="ignore"):
                pos = self.g > 0
            vals = self.g[pos]
            q = self.qidx[pos]
            order = np.lexsort((-vals, q))
            vals, q = vals[order], q[order]
            n = self.n
        else:  # per judgment histogram
            pos = self.hv > 0
            hv, hc, hq = self.hv[pos], self.hc[pos], self.hq[pos]
            n = self.ng
            if k is not None:
                # keep only what the cutoff needs: the first k positive grades of each query
                c = np.cumsum(hc)
                qc = np.bincount(hq, weights=hc, minlength=n)
                before = np.concatenate(([0], np.cumsum(qc)))[:-1].astype(np.int64)
                excl = c - hc - before[hq]
                hc = np.clip(k - excl, 0, hc)
            vals = np.repeat(hv, hc)
            q = np.repeat(hq, hc)
        counts = np.bincount(q, minlength=n)
        ioff = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=ioff[1:])
        irank = np.arange(1, len(vals) + 1) - np.repeat(ioff[:-1], counts)
        w = self.gain(vals) / np.log2(irank + 1.0)
        if k is not None:
            w = np.where(irank <= k, w, 0.0)
        out = np.bincount(q, weights=w, minlength=n)
        if self.opts.ideal != "served":
            out = self.per_list(out)
        self._cache[key] = out
        return out


# ---- the definitions -----------------------------------------------------------------------

def _num_ret(b: _Batch, k):
    """trec_eval m_num_ret.c: number of ranked items (after the depth cut)."""
    return b.lengths.astype(np.float64)


def _num_rel(b: _Batch, k):
    """trec_eval m_num_rel.c: number of judgments with grade >= relevance level."""
    return b.num_rel.astype(np.float64)


def _num_rel_ret(b: _Batch, k):
    """trec_eval m_num_rel_ret.c: relevant items among the ranked ones."""
    return b.count_top("cum_rel", b.rel)


def _precision(b: _Batch, k):
    """trec_eval m_P.c: relevant in the top k / k (k fixed even if fewer items are ranked)."""
    return b.count_top("cum_rel", b.rel, k) / float(k)


def _recall(b: _Batch, k):
    """trec_eval m_recall.c: relevant in the top k / num_rel (0 when num_rel is 0)."""
    return b.per_rel(b.count_top("cum_rel", b.rel, k))


def _success(b: _Batch, k):
    """trec_eval m_success.c: 1 if a relevant item is in the top k, else 0."""
    return (b.count_top("cum_rel", b.rel, k) > 0).astype(np.float64)


def _hits(b: _Batch, k):
    """ranx's hits@k (Bassani, ECIR 2022; ranx/metrics/hits.py): the number of relevant items in the
    top k (success@k is 1 when it is positive)."""
    return b.count_top("cum_rel", b.rel, k)


def _f1(b: _Batch, k):
    """ranx's f1 / f1@k (ranx/metrics/f1.py, 0.3.21): the harmonic mean of precision (relevant in the
    top k / k; without a cutoff, / the ranked items) and recall (/ num_rel), 2 h / (k + R) for h > 0
    relevant items in the top k; 0 when h or R is 0."""
    h = b.count_top("cum_rel", b.rel, k)
    denom = (b.lengths if k is None else float(k)) + b.num_rel
    out = np.zeros(b.n)
    np.divide(2.0 * h, denom, out=out, where=(h > 0) & (b.num_rel > 0))
    return out


def _num_q(b: _Batch, k):
    """ir_measures' NumQ: 1 per query (its total is the number of queries)."""
    return np.ones(b.n)


def _judged(b: _Batch, k):
    """ir_measures' Judged@k (judged_provider.py, from OpenNIR): the items with a judgment (any grade,
    in the qrels) among the top k, divided by min(k, ranked items); 0 when nothing is ranked."""
    have = ~np.isnan(b.g)
    count = b.count_top("cum_in_qrels", have, k)
    take = b.lengths if k is None else np.minimum(b.lengths, k)
    out = np.zeros(b.n)
    np.divide(count, take, out=out, where=take > 0)
    return out


def _recip_rank(b: _Batch, k):
    """trec_eval m_recip_rank.c: 1 / rank of the first relevant item, 0 if none (within the top
    k when a cutoff is given: RR@k, the per-query term of MRR@k)."""
    terms = b.cached("rr", lambda: np.where(b.rel & (b.cum_rel == 1), 1.0 / b.rank, 0.0))
    return b.sum_top("rr", terms, k)


def _ap(b: _Batch, k):
    """trec_eval m_map.c / m_map_cut.c: sum of precision at each relevant item's rank (within the
    top k for map_cut), divided by num_rel (all relevant judgments, retrieved or not)."""
    terms = b.cached("ap", lambda: np.where(b.rel, b.cum_rel / b.rank, 0.0))
    return b.per_rel(b.sum_top("ap", terms, k))


def _rprec(b: _Batch, k):
    """trec_eval m_Rprec.c: precision at rank R = num_rel."""
    return b.per_rel(b.count_top("cum_rel", b.rel, b.num_rel.astype(np.int64)))


def _bpref(b: _Batch, k):
    """trec_eval m_bpref.c (Buckley and Voorhees 2004): for each relevant ranked item,
    1 - min(n, R) / min(N, R) with n the judged non-relevant items ranked above it, R = num_rel,
    N = judged non-relevant items of the query; summed and divided by R. Unjudged items are skipped."""
    nonrel_above = b.within("cum_nonrel", b.judged & ~b.rel)
    R = b.num_rel[b.qidx]
    NN = b.num_nonrel[b.qidx]
    denom = np.minimum(NN, R)
    term = np.ones(b.N)
    has = b.rel & (nonrel_above > 0)
    np.subtract(1.0, np.minimum(nonrel_above, R) / np.where(denom > 0, denom, 1.0), out=term, where=has)
    return b.per_rel(b.segsum(np.where(b.rel, term, 0.0)))


def _dcg(b: _Batch, k):
    """DCG (Jarvelin and Kekalainen 2002) as trec_eval's m_ndcg.c computes it: sum over ranks r of
    gain / log2(r + 1); within the top k when a cutoff is given."""
    return b.sum_top("dg", b.discounted_gain, k)


def _ndcg(b: _Batch, k):
    """trec_eval m_ndcg.c (no cutoff) and m_ndcg_cut.c: DCG / ideal DCG, 0 when the ideal is 0.
    The ideal ranks the query's positive judgments by grade, cut at k when a cutoff is given."""
    dcg = _dcg(b, k)
    ideal = b.ideal(k)
    out = np.zeros(b.n)
    np.divide(dcg, ideal, out=out, where=ideal > 0)
    return out


def _err(b: _Batch, k):
    """Expected reciprocal rank at k (Chapelle, Metzler, Zhang and Grinspan, CIKM 2009):
    sum_r (1/r) R_r prod_{i<r} (1 - R_i), R = (2**g - 1) / 2**g_max, unjudged and negative grades 0."""
    gmax = b.opts.err_max_grade
    sel = b.top(k)
    g = b.g[sel]
    with np.errstate(invalid="ignore"):
        if np.any(g > gmax):
            raise ValueError(f"err@{k}: grade {np.nanmax(g):g} exceeds err_max_grade={gmax:g}; "
                             "pass a larger err_max_grade")
        pos = g > 0
    R = np.where(pos, (np.exp2(np.where(pos, g, 0.0)) - 1.0) / np.exp2(gmax), 0.0)
    M = np.zeros((b.n, k))
    M[b.qidx[sel], b.rank[sel] - 1] = R
    stay = np.cumprod(1.0 - M, axis=1)
    reach = np.concatenate((np.ones((b.n, 1)), stay[:, :-1]), axis=1)
    return (M * reach / np.arange(1, k + 1)).sum(axis=1)


_FUNCS = {
    "num_ret": _num_ret,
    "num_rel": _num_rel,
    "num_rel_ret": _num_rel_ret,
    "P": _precision,
    "recall": _recall,
    "success": _success,
    "hits": _hits,
    "f1": _f1,
    "num_q": _num_q,
    "judged": _judged,
    "recip_rank": _recip_rank,
    "map": _ap,
    "Rprec": _rprec,
    "bpref": _bpref,
    "dcg": _dcg,
    "ndcg": _ndcg,
    "err": _err,
}


from .trec_measures import FUNCS as _TREC_FUNCS  # noqa: E402  (they use _Batch's helpers)
from .cwl_measures import FUNCS as _CWL_FUNCS  # noqa: E402


def compute(lists: RankedLists, specs: list[MetricSpec], options: MetricOptions | None = None) -> np.ndarray:
    """Score every query of ``lists`` on every metric of ``specs``.

    Returns float64, shape (len(specs), lists.num_queries): row i holds specs[i]'s per-query scores.
    Raises ValueError on inconsistent shapes or an ERR grade above ``err_max_grade``.
    """
    opts = options or MetricOptions()
    off = np.asarray(lists.offsets, dtype=np.int64)
    n = len(off) - 1
    grades = np.asarray(lists.grades)
    n_items = int(off[-1]) if n >= 0 else 0
    if n < 1 or n_items <= CHUNK_ITEMS or grades.shape != (n_items,):
        return _compute(lists, specs, opts)
    # Queries are independent: score them a chunk at a time so the temporaries (about 100 bytes an
    # item) are bounded by a chunk. Same numbers as one batch, bit for bit: every per-query sum runs
    # over the query's own items in the same order, and the running counts are exact integers.
    joff = np.asarray(lists.judged_offsets, dtype=np.int64)
    hv, hc = np.asarray(lists.judged_values), np.asarray(lists.judged_counts)
    gidx = None if lists.judged_index is None else np.asarray(lists.judged_index, dtype=np.int64)
    cuts = np.searchsorted(off, np.arange(CHUNK_ITEMS, n_items, CHUNK_ITEMS), side="right") - 1
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < n}), n]
    out = np.empty((len(specs), n), dtype=np.float64)

    def chunk(a, b):
        lo, hi = off[a], off[b]
        if gidx is None:
            jlo, jhi = joff[a], joff[b]
            part = RankedLists(off[a:b + 1] - lo, grades[lo:hi], joff[a:b + 1] - jlo, hv[jlo:jhi], hc[jlo:jhi])
        else:  # the histograms the chunk's lists use, numbered anew
            used, local = np.unique(gidx[a:b], return_inverse=True)
            lens = joff[used + 1] - joff[used]
            pjoff = np.zeros(len(used) + 1, dtype=np.int64)
            np.cumsum(lens, out=pjoff[1:])
            at = np.repeat(joff[used] - pjoff[:-1], lens) + np.arange(pjoff[-1], dtype=np.int64)
            part = RankedLists(off[a:b + 1] - lo, grades[lo:hi], pjoff, hv[at], hc[at], local.reshape(-1))
        out[:, a:b] = _compute(part, specs, opts)

    # the chunks write disjoint columns of ``out``: on two threads
    try:
        run_tasks([(chunk, (a, b)) for a, b in zip(bounds[:-1], bounds[1:])])
    except ValueError:
        return _compute(lists, specs, opts)  # the whole batch's error, as without chunks
    return out


def _judged_lists(lists: RankedLists) -> RankedLists:
    """``lists`` without their unjudged ranked items (NaN or negative grade), the judged ones keeping
    their order: trec_eval ``-J`` for one measure (as :func:`streameval.metrics.prepare.judged_only`
    does for a whole evaluation)."""
    off = np.asarray(lists.offsets, dtype=np.int64)
    grades = np.asarray(lists.grades, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        keep = grades >= 0  # False for NaN
    owner = np.repeat(np.arange(len(off) - 1), np.diff(off))
    new_off = np.zeros(len(off), dtype=np.int64)
    np.cumsum(np.bincount(owner[keep], minlength=len(off) - 1), out=new_off[1:])
    return RankedLists(new_off, grades[keep], lists.judged_offsets, lists.judged_values, lists.judged_counts,
                       lists.judged_index)


def _mapped_lists(lists: RankedLists, gains: str) -> RankedLists:
    """``lists`` with their grades mapped by ir_measures' ``nDCG(gains={grade: gain})`` (``gains``:
    ``"0.0:0.0,2.0:3.0"``; a grade not named keeps its value), in the ranked items and in each
    query's judgment histogram (values merged and kept in descending order), as ir_measures maps the
    qrels before trec_eval scores them."""
    table = {float(g): float(v) for g, _, v in (p.partition(":") for p in gains.split(","))}

    def mapped(values):
        v = np.asarray(values, dtype=np.float64).copy()
        for g, gain in table.items():
            v[np.asarray(values, dtype=np.float64) == g] = gain
        return v

    joff = np.asarray(lists.judged_offsets, dtype=np.int64)
    hv, hc = mapped(lists.judged_values), np.asarray(lists.judged_counts, dtype=np.int64)
    new_off, vals, counts = [0], [], []
    for h in range(len(joff) - 1):
        merged: dict = {}
        for v, c in zip(hv[joff[h]:joff[h + 1]].tolist(), hc[joff[h]:joff[h + 1]].tolist()):
            merged[v] = merged.get(v, 0) + c
        for v in sorted(merged, reverse=True):
            vals.append(v)
            counts.append(merged[v])
        new_off.append(len(vals))
    return RankedLists(lists.offsets, mapped(lists.grades), np.asarray(new_off, dtype=np.int64),
                       np.asarray(vals, dtype=np.float64), np.asarray(counts, dtype=np.int64), lists.judged_index)


def _compute(lists: RankedLists, specs: list[MetricSpec], opts: MetricOptions) -> np.ndarray:
    # one batch per set of effective options (the specs' own overrides, :func:`options_for`): the
    # common case, no overrides, is one pass
    batches: dict = {}
    out = None
    for i, spec in enumerate(specs):
        eff = options_for(spec, opts)
        parts = spec.opts.split(";")
        judged = "judged" in parts  # ir_measures' judged_only=True (trec_eval -J)
        gains = next((p[6:] for p in parts if p.startswith("gains=")), "")  # ir_measures' nDCG(gains=...)
        if (eff, judged, gains) not in batches:
            own = _judged_lists(lists) if judged else lists
            batches[(eff, judged, gains)] = _Batch(_mapped_lists(own, gains) if gains else own, eff)
        b = batches[(eff, judged, gains)]
        if out is None:
            out = np.empty((len(specs), b.n), dtype=np.float64)
        fn = _FUNCS.get(spec.family) if not (spec.family == "ndcg" and spec.param) else None
        out[i] = fn(b, spec.k) if fn is not None else (_TREC_FUNCS.get(spec.family) or _CWL_FUNCS[spec.family])(b, spec)
    if out is None:
        out = np.empty((0, _Batch(lists, opts).n), dtype=np.float64)
    return out
