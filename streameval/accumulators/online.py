"""Mergeable states of the online metrics: exact AUC, histogram AUC, GAUC, click metrics per
request, off-policy (IPS / SNIPS) sums. No Beam; the values come from
:mod:`streameval.metrics.online`.

Every state is a plain list / dict of Python primitives (Beam's FastPrimitivesCoder encodes it
without pickling); ``merge([])`` gives a fresh state, extracting an empty state gives NaN with count
0. Merging is exact: integer counts, and float sums kept as Shewchuk partials
(:mod:`streameval.accumulators.moments`), so any split and merge order gives the same value to the
last bit.

=================  ==========================================================================
ops                state
=================  ==========================================================================
:class:`AucOps`    ``{score: LabelCounts (positives, negatives)}`` (one entry per distinct
                   score: exact)
:class:`HistAucOps` ``{bin: LabelCounts (positives, negatives)}`` (at most ``bins`` entries:
                   bounded)
:class:`GaucOps`   :class:`GaucState` ``(used, excluded, sums)``: groups used and excluded,
                   per weighting a :class:`GaucSums` ``(w, y, ww, wy, yy)`` of partials (sum w,
                   sum y, sum w^2, sum w y, sum y^2) over groups' AUCs a, y = w a
:class:`ClickRequestOps` :class:`ClickRequestState` ``(min_timestamp, attributes, clicked,
                   logged)`` of one request, ``clicked`` ``{clicked item: position}`` (with
                   ``dwell=True``: ``{clicked item: [position, dwell_ms or -1]}``)
:class:`OpeOps`    :class:`OpeState` ``(n, sums)``, ``sums`` an :class:`OpeSums` ``(w, ww, y,
                   wy, yy)`` of partials (sum w, sum w^2, sum y, sum w y, sum y^2), y = w r
:class:`CalibrationOps` :class:`CalibrationState` ``(moments, clicks, clicked_p, bins)``: the
                   MeanMoments state (:class:`~.moments.MomentsState`) of (log loss term, Brier
                   term, p), clicks, sum of p over clicks (partials), per ECE bin count
                   ``{bin: CalibrationBin (examples, clicks, p partials)}``
=================  ==========================================================================

The named tuples are in :mod:`streameval.accumulators.online_states` (re-exported here); a state is
the *list* of its named tuple's fields, what Beam's coder encodes.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..metrics import calibration as cal
from ..metrics import interleaving as il
from ..metrics import online as om
from ..metrics import online_auc
from .moments import (MeanMoments, MomentsState, exact_sum_floats, partials_add, partials_add_product,
                      partials_add_square, partials_merge, product_terms)
from .online_states import (CalibrationBin, CalibrationState, ClickRequestState, CountArraysState, GaucState,
                            GaucSums, LabelCounts, OpeState, OpeSums)

__all__ = ["merge_counted_sums", "AucOps", "HistAucOps", "LabelCounts", "CountArraysState",
           "GaucOps", "GaucState", "GaucSums", "ClickRequestOps", "ClickRequestState",
           "InterleavingRequestOps", "OpeOps", "OpeState", "OpeSums", "CountArrays", "exact_sum", "auc_result",
           "hist_auc_result", "gauc_group_sums", "CalibrationOps", "CalibrationState", "CalibrationBin",
           "ScoreCountMetrics"]


def exact_sum(partials: list) -> Fraction:
    """The exact value of Shewchuk partials as a Fraction."""
    return sum((Fraction(p) for p in partials), Fraction(0))


def _label(label) -> int:
    if label is True or label is False:
        return int(label)
    if isinstance(label, (int, np.integer, np.bool_)) and int(label) in (0, 1):
        return int(label)
    raise ValueError(f"label must be a boolean or 0/1, got {label!r}")


#: LabelCounts' positions in a state's entry, for the updates in place (one an example)
_POSITIVES, _NEGATIVES = (LabelCounts._fields.index(f) for f in ("positives", "negatives"))


def _add_counts(state: dict, counts) -> None:
    """Add ``(key, positives, negatives)`` of ``counts`` to the entries of their keys (inline: one a
    distinct score; a new entry is the list of LabelCounts(p, n), built directly)."""
    pi, ni = _POSITIVES, _NEGATIVES
    for k, p, n in counts:
        c = state.get(k)
        if c is None:
            state[k] = [p, n]
        else:
            c[pi] += p
            c[ni] += n


def _merge_counts(states) -> dict:
    out: dict = {}
    for s in states:
        _add_counts(out, ((k, *counts) for k, counts in s.items()))  # LabelCounts' fields, in order
    return out


def _sorted_counts(state: dict) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(state)
    pos = np.fromiter((state[k][_POSITIVES] for k in keys), dtype=np.int64, count=len(keys))
    neg = np.fromiter((state[k][_NEGATIVES] for k in keys), dtype=np.int64, count=len(keys))
    return pos, neg


# --------------------------------------------------------------------------------------------
# exact AUC

class AucOps:
    """Exact AUC: counts of positives and negatives per distinct score (float key). Memory grows
    with the number of distinct scores; merging adds integer counts, so it is exact."""

    @staticmethod
    def create() -> dict:
        return {}

    @staticmethod
    def add(state: dict, score, label) -> dict:
        """Add one scored, labelled example. Raises ValueError on a non-finite score or a label
        other than a boolean / 0 / 1."""
        s = float(score)
        if not math.isfinite(s):
            raise ValueError(f"score {score!r} is not finite")
        y = _label(label)
        c = state.get(s)
        if c is None:
            c = state[s] = [0, 0]  # LabelCounts(0, 0)
        c[_POSITIVES if y else _NEGATIVES] += 1
        return state

    @staticmethod
    def add_many(state: dict, scores, labels) -> dict:
        """Add arrays of scores and labels (vectorised)."""
        values, pos, neg = om.auc_counts(scores, labels)
        _add_counts(state, zip(values.tolist(), pos.tolist(), neg.tolist()))
        return state

    @staticmethod
    def merge(states) -> dict:
        return _merge_counts(states)

    @staticmethod
    def counts(state: dict) -> tuple[np.ndarray, np.ndarray]:
        """(positives, negatives) per distinct score, scores ascending."""
        return _sorted_counts(state)

    @staticmethod
    def value_counts(state: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(distinct scores ascending, positives, negatives)."""
        return (np.array(sorted(state), dtype=np.float64), *_sorted_counts(state))

    @classmethod
    def extract(cls, state: dict) -> tuple[float, int, float]:
        """``(auc, examples, DeLong stderr)``; NaN AUC when a class is absent."""
        return auc_result(*cls.counts(state))

    @classmethod
    def summary(cls, state: dict) -> tuple[float, int, int, float]:
        """``(auc, positives, negatives, DeLong stderr)`` (a group's entry for :class:`GaucOps`)."""
        pos, neg = cls.counts(state)
        auc, P, N = om.auc_from_counts(pos, neg)
        return (auc, P, N, om.auc_delong_stderr(pos, neg))


# --------------------------------------------------------------------------------------------
# histogram AUC

class HistAucOps:
    """Bounded-memory AUC over ``bins`` equal-width score bins on ``[lo, hi]`` (scores outside
    fall in the edge bins). At most ``bins`` entries whatever the data. ``extract`` gives the
    value and its guaranteed error bound (:func:`~streameval.metrics.online.hist_auc_max_error`)."""

    def __init__(self, lo: float = 0.0, hi: float = 1.0, bins: int = 1000):
        om.hist_bin_index(0.0, lo, hi, bins)  # validates
        self.lo, self.hi, self.bins = float(lo), float(hi), int(bins)

    @staticmethod
    def create() -> dict:
        return {}

    def add(self, state: dict, score, label) -> dict:
        s = float(score)
        if not math.isfinite(s):
            raise ValueError(f"score {score!r} is not finite")
        y = _label(label)
        b = int(om.hist_bin_index(s, self.lo, self.hi, self.bins))
        c = state.get(b)
        if c is None:
            c = state[b] = [0, 0]  # LabelCounts(0, 0)
        c[_POSITIVES if y else _NEGATIVES] += 1
        return state

    def add_many(self, state: dict, scores, labels) -> dict:
        y = online_auc._labels01(labels, len(np.asarray(scores))).astype(np.int64)
        b = om.hist_bin_index(scores, self.lo, self.hi, self.bins)
        pos = np.bincount(b, weights=y, minlength=self.bins).astype(np.int64)
        tot = np.bincount(b, minlength=self.bins).astype(np.int64)
        _add_counts(state, ((k, int(pos[k]), int(tot[k] - pos[k])) for k in np.flatnonzero(tot).tolist()))
        return state

    @staticmethod
    def merge(states) -> dict:
        return _merge_counts(states)

    @staticmethod
    def extract(state: dict) -> tuple[float, int, float, float]:
        """``(auc, examples, DeLong stderr over the bins, max_error)``."""
        return hist_auc_result(*_sorted_counts(state))


def auc_result(pos, neg) -> tuple[float, int, float]:
    """``(auc, examples, DeLong stderr)`` from counts per distinct score, scores ascending (shape
    (v,) each); NaN AUC when a class is absent (:func:`~streameval.metrics.online.auc_from_counts`,
    :func:`~streameval.metrics.online.auc_delong_stderr`)."""
    from ..metrics.online_auc import auc_and_stderr

    auc, P, N, se = auc_and_stderr(pos, neg)
    return (auc, P + N, se)


class ScoreCountMetrics:
    """The rows of the metrics taken from the exact AUC state (counts per distinct score): ``auc``
    (when ``auc``) and the ``specs`` of :data:`~streameval.metrics.online_names.SCORE_COUNT_FAMILIES`
    (pr_auc, precision / recall / f1 at a threshold, psi and ks against ``reference``, a
    :class:`~streameval.metrics.threshold.DriftReference`). Called with ``(values, pos, neg)``
    (values ascending, as :meth:`AucOps.value_counts` and :meth:`CountArrays.arrays` give them):
    ``[(row name, value, n, stderr), ...]``. Picklable (the CombineFns carry it)."""

    def __init__(self, specs, auc: bool = False, reference=None):
        self.specs = [s for s in specs if s.score_counts]
        self.auc = bool(auc)
        self.reference = reference
        if reference is None and any(s.drift for s in self.specs):
            name = next(s.name for s in self.specs if s.drift)
            raise ValueError(f"{name} needs a reference distribution of scores (the batch job's --drift-reference "
                             f"PATH, evaluate_log(reference=...))")

    def __call__(self, values, pos, neg) -> list:
        from ..metrics.threshold import score_count_results

        out = [("auc", *auc_result(pos, neg))] if self.auc else []
        return out + score_count_results(self.specs, values, pos, neg, self.reference)


def hist_auc_result(pos, neg) -> tuple[float, int, float, float]:
    """``(auc, examples, DeLong stderr, max_error)`` from counts per bin, bins ascending."""
    auc, n, se = auc_result(pos, neg)
    return (auc, n, se, om.hist_auc_max_error(pos, neg))


# --------------------------------------------------------------------------------------------
# the same counts as arrays, for many keys at once (the columnar engine)

def _firsts(a: np.ndarray) -> np.ndarray:
    """Booleans, shape (n,): where each run of equal values of a sorted non-empty array starts."""
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    np.not_equal(a[1:], a[:-1], out=new[1:])
    return new


def _runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values, count of each) of a sorted non-empty float64 array."""
    starts = np.flatnonzero(_firsts(a))
    return a[starts], np.diff(np.append(starts, len(a)))


def _narrow(counts: np.ndarray) -> np.ndarray:
    """Non-negative integer counts in the narrowest unsigned type that holds their maximum (int64
    above 32 bits): with distinct scores every count is 0 or 1, one byte instead of eight."""
    top = int(counts.max()) if len(counts) else 0
    for kind in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(kind).max:
            return counts.astype(kind, copy=False)
    return counts.astype(np.int64, copy=False)


class CountArrays:
    """The counts of :class:`AucOps` / :class:`HistAucOps` as arrays, built for many keys at once.

    State: ``(values, positives, negatives)`` as the bytes of three arrays (float64, int64, int64;
    values ascending and distinct; ``-0.0`` and ``0.0`` are one value, as for a dict key): Beam's
    FastPrimitivesCoder encodes it without pickling. The values are the scores (exact AUC) or the
    bin numbers (histogram AUC); :func:`auc_result` / :func:`hist_auc_result` of :meth:`counts` give
    what :meth:`AucOps.extract` / :meth:`HistAucOps.extract` give for the same examples."""

    EMPTY = (b"", b"", b"")

    @staticmethod
    def _state(values, pos, neg) -> tuple[bytes, bytes, bytes]:
        return (np.ascontiguousarray(values, dtype=np.float64).tobytes(),
                np.ascontiguousarray(pos, dtype=np.int64).tobytes(),
                np.ascontiguousarray(neg, dtype=np.int64).tobytes())

    @classmethod
    def by_key(cls, key, values, labels, raw: bool = False):
        """``(key, state)`` per distinct key, keys ascending. ``key``: int64 codes, shape (n,);
        ``values``: the examples' scores or bins, shape (n,), finite; ``labels``: booleans, shape (n,).
        ``raw``: each state as its arrays (a state that stays in this process, see :meth:`merge`), the
        counts in the narrowest unsigned type that holds them."""
        key = np.asarray(key, dtype=np.int64)
        if not len(key):
            return
        v = np.asarray(values, dtype=np.float64) + 0.0  # -0.0 -> 0.0: one value, as for a dict key
        y = np.asarray(labels, dtype=bool)
        # rows grouped by key (a stable radix sort of the codes when they fit 16 bits), then each
        # key's values sorted directly (np.sort, no indirection) for all rows and for the positives:
        # the same counts per (key, value) as one lexsort of (key, value), 3-4 x faster
        if key[0] == key[-1] and (key == key[0]).all():
            bounds = [0, len(key)]
        else:
            small = key.min() >= 0 and key.max() < 65536
            order = np.argsort(key.astype(np.uint16) if small else key, kind="stable")
            key, v, y = key[order], v[order], y[order]
            bounds = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), len(key)]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            allv = np.sort(v[lo:hi])
            values, tot = _runs(allv)
            pos = np.zeros(len(values), dtype=np.int64)
            posv = np.sort(v[lo:hi][y[lo:hi]])
            if len(posv):
                pvals, pcount = _runs(posv)
                pos[np.searchsorted(values, pvals)] = pcount
            neg = tot - pos
            yield int(key[lo]), ((values, _narrow(pos), _narrow(neg)) if raw else cls._state(values, pos, neg))

    @staticmethod
    def arrays(state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, positives, negatives) of a state, as bytes or as arrays (``raw``; their counts
        may be of a narrower unsigned type)."""
        s = CountArraysState._make(state)
        if isinstance(s.values, np.ndarray):
            return state
        return (np.frombuffer(s.values, dtype=np.float64), np.frombuffer(s.positives, dtype=np.int64),
                np.frombuffer(s.negatives, dtype=np.int64))

    @classmethod
    def merge(cls, states, raw: bool = False):
        """One state of several (exact integer counts); ``merge([])`` is the empty state. The
        states may also be given as their three arrays (what ``raw=True`` returns: the arrays
        themselves, not their bytes, for a state that stays in this process, the counts in the
        narrowest unsigned type that holds them; copying a merged state of millions of values into
        bytes took about as long as the merge's sort)."""
        states = [s for s in states if len(CountArraysState._make(s).values)]
        if len(states) <= 1:
            state = states[0] if states else cls.EMPTY
            return cls.arrays(state) if raw else state
        parts = [CountArraysState._make(cls.arrays(s)) for s in states]
        # a stable argsort (timsort: the parts are sorted runs, merged in about linear time), then
        # the counts of each distinct value summed over its run; 1.5 x faster than np.unique's
        # inverse and np.add.at
        allv = np.concatenate([p.values for p in parts])
        allv += 0.0  # -0.0 -> 0.0: one value
        order = np.argsort(allv, kind="stable")
        values = allv[order]
        del allv
        pos = np.concatenate([p.positives for p in parts])[order]
        neg = np.concatenate([p.negatives for p in parts])[order]
        del order
        firsts = _firsts(values)
        if not firsts.all():  # (with distinct scores every run has one value: nothing to add)
            starts = np.flatnonzero(firsts)
            values = values[starts]
            pos = np.add.reduceat(pos, starts, dtype=np.int64)
            neg = np.add.reduceat(neg, starts, dtype=np.int64)
        if raw:
            return values, _narrow(pos), _narrow(neg)
        return cls._state(values, pos, neg)

    @classmethod
    def counts(cls, state) -> tuple[np.ndarray, np.ndarray]:
        """(positives, negatives) per value, values ascending."""
        _, pos, neg = cls.arrays(state)
        return pos, neg


# --------------------------------------------------------------------------------------------
# GAUC over group summaries


def _fresh_sums(names) -> list:
    """A list of empty partials per field of a named tuple of sums (``names``: its ``_fields``)."""
    return [[] for _ in names]


#: GaucState's positions in a state, for the updates in place (one a group)
_GAUC_USED, _GAUC_EXCLUDED, _GAUC_SUMS = (GaucState._fields.index(f) for f in ("used", "excluded", "sums"))


class GaucOps:
    """Weighted mean of group AUCs, for several weightings at once
    (:data:`~streameval.metrics.online.GAUC_WEIGHTINGS`). Add one group at a time (its AUC and
    class counts, e.g. from :meth:`AucOps.summary`); single-class groups are counted as excluded.

    Per weighting the state holds ``[sum w, sum y, sum w^2, sum w y, sum y^2]`` with y = w a (the
    double ``w * a``), the squares and the product exact (:func:`~.moments.partials_add_square`,
    :func:`~.moments.partials_add_product`): the linearised variance
    ``sum (y - R w)^2 = sum y^2 - 2 R sum w y + R^2 sum w^2`` taken in rational arithmetic is then
    exact (0 when every group has the same AUC), where sums of rounded products leave a residue of
    the order of an ulp of ``sum y^2``."""

    def __init__(self, weightings=("impressions",)):
        self.weightings = tuple(weightings)
        for w in self.weightings:
            if w not in om.GAUC_WEIGHTINGS:
                raise ValueError(f"weighting must be one of {om.GAUC_WEIGHTINGS}, got {w!r}")

    def create(self) -> list:
        return list(GaucState(0, 0, [_fresh_sums(GaucSums._fields) for _ in self.weightings]))

    def add_group(self, state: list, auc, n_pos: int, n_neg: int) -> list:
        if n_pos == 0 or n_neg == 0 or auc is None or math.isnan(auc):
            state[_GAUC_EXCLUDED] += 1
            return state
        state[_GAUC_USED] += 1
        a = float(auc)
        for sums, wname in zip(state[_GAUC_SUMS], self.weightings):
            w = float(om.gauc_weights(n_pos, n_neg, wname))
            sw, sy, sww, swy, syy = sums  # a GaucSums' fields
            y = w * a
            partials_add(sw, w)
            partials_add(sy, y)
            partials_add_square(sww, w)
            partials_add_product(swy, w, y)
            partials_add_square(syy, y)
        return state

    def merge(self, states) -> list:
        out = GaucState._make(self.create())
        used = excluded = 0
        for s in map(GaucState._make, states):
            used += s.used
            excluded += s.excluded
            for into, other in zip(out.sums, s.sums):
                for a, b in zip(into, other):
                    partials_merge(a, b)
        return list(out._replace(used=used, excluded=excluded))

    def extract(self, state: list) -> tuple[list[tuple[float, int, float]], int]:
        """``([(gauc, groups_used, stderr) per weighting], groups_excluded)``; the sums are taken
        exactly (Fractions), so the value does not depend on merge order."""
        s = GaucState._make(state)
        out = []
        for sums in s.sums:
            t = GaucSums._make(exact_sum(p) for p in sums)
            value, se = om.ratio_from_sums(s.used, t.w, t.y, t.ww, t.wy, t.yy)
            out.append((value, s.used, se))
        return out, s.excluded


def gauc_group_sums(auc, n_pos, n_neg, weightings) -> list:
    """The :class:`GaucOps` state of many groups at once (vectorised, exact): ``auc``, ``n_pos``,
    ``n_neg`` shape (g,) (a NaN AUC or a single class: the group is excluded). The sums are the exact
    sums of the same terms :meth:`GaucOps.add_group` adds one group at a time (the real squares and
    products), so the state's value is the same to the last bit."""
    from .moments import exact_sum_floats

    auc = np.asarray(auc, dtype=np.float64)
    n_pos = np.asarray(n_pos)
    n_neg = np.asarray(n_neg)
    ok = ~np.isnan(auc) & (n_pos > 0) & (n_neg > 0)
    a = auc[ok]
    sums = []
    for wname in weightings:
        w = om.gauc_weights(n_pos[ok], n_neg[ok], wname)
        y = w * a
        terms = {"w": w, "y": y, "ww": product_terms(w, w), "wy": product_terms(w, y), "yy": product_terms(y, y)}
        sums.append([exact_sum_floats(terms[f]) if len(terms[f]) else [] for f in GaucSums._fields])
    return list(GaucState(used=int(ok.sum()), excluded=int((~ok).sum()), sums=sums))


# --------------------------------------------------------------------------------------------
# click metrics of one request

def _merge_attrs(into: dict, other: dict) -> None:
    """Union of attribute maps; on a conflict the smaller value wins (order independent)."""
    for k, v in other.items():
        old = into.get(k)
        if old is None or v < old:
            into[k] = v


class ClickRequestOps:
    """One request's clicks: a :class:`ClickRequestState` ``(min_timestamp, attributes, {clicked
    item_id: position}, logged)``.

    ``logged`` is true once an impression with a logged click flag (not None) arrived; requests
    that never log clicks are left out of click metrics. The clicked items merge by union (the
    same impression delivered twice has no effect; an item clicked at two positions keeps the
    smaller), so any split and order give the same state. ``attribute_keys`` restricts the
    attributes kept (the slicing attributes). With ``dwell=True`` (the dwell metrics) a clicked
    item's value is ``[position, dwell_ms]`` (-1: no dwell logged), of two the smaller list."""

    def __init__(self, attribute_keys=None, dwell: bool = False):
        self.attribute_keys = None if attribute_keys is None else frozenset(attribute_keys)
        self.dwell = bool(dwell)

    @staticmethod
    def create() -> list:
        return list(ClickRequestState(None, {}, {}, False))

    @staticmethod
    def clicked_value(position: int, attributes):
        """What the state keeps of a clicked item (of two, the smaller): its position."""
        return int(position)

    def add_impression(self, state: list, item_id, position: int, clicked, timestamp=None,
                       attributes=None, dwell_ms=None) -> list:
        """Add one impression (``dwell_ms``: its click's dwell, kept with ``dwell=True``)."""
        # the ClickRequestState's fields unpacked (this runs per impression; the list is written
        # again only when a field that is not updated in place changed)
        first, attrs, items, logged = state
        changed = False
        if timestamp is not None and (first is None or timestamp < first):
            first, changed = int(timestamp), True
        if clicked is not None:
            if not logged:
                logged = changed = True
            if clicked:
                value = self.clicked_value(position, attributes)
                if self.dwell:
                    value = [value, -1 if dwell_ms is None else int(dwell_ms)]
                old = items.get(item_id)
                if old is None or value < old:
                    items[item_id] = value
        if attributes:
            if self.attribute_keys is not None:
                attributes = {k: v for k, v in attributes.items() if k in self.attribute_keys}
            _merge_attrs(attrs, attributes)
        if changed:
            state[:] = ClickRequestState(first, attrs, items, logged)
        return state

    def merge(self, states) -> list:
        out = ClickRequestState._make(self.create())
        first, logged = out.min_timestamp, out.logged
        for s in map(ClickRequestState._make, states):
            if s.min_timestamp is not None and (first is None or s.min_timestamp < first):
                first = s.min_timestamp
            _merge_attrs(out.attributes, s.attributes)
            for item, p in s.clicked.items():
                old = out.clicked.get(item)
                if old is None or p < old:
                    out.clicked[item] = p
            logged = logged or s.logged
        return list(out._replace(min_timestamp=first, logged=logged))

    @staticmethod
    def terms(states, specs) -> np.ndarray:
        """Per-request metric values, shape (len(specs), len(states))
        (:func:`~streameval.metrics.online.click_request_terms`); the dwell metrics need states of
        ``ClickRequestOps(dwell=True)``."""
        req, pos, dwell = [], [], []
        for i, s in enumerate(states):
            for p in ClickRequestState._make(s).clicked.values():
                req.append(i)
                if isinstance(p, list):
                    position, dwell_ms = p
                    pos.append(position)
                    dwell.append(math.nan if dwell_ms < 0 else float(dwell_ms))
                else:
                    pos.append(p)
                    dwell.append(math.nan)
        return om.click_request_terms(specs, req, pos, len(states), np.array(dwell, dtype=np.float64))

    @staticmethod
    def clicks_without_dwell(state) -> int:
        """Clicked items of a ``dwell=True`` state whose dwell was not logged."""
        missing = 0
        for v in ClickRequestState._make(state).clicked.values():
            if isinstance(v, list):
                _, dwell_ms = v
                missing += dwell_ms < 0
        return missing


class InterleavingRequestOps(ClickRequestOps):
    """One interleaved request's clicks: a :class:`ClickRequestState` ``(min_timestamp, attributes,
    {clicked item_id: team}, logged)``, the team the impression's ``attributes["team"]`` ("" when absent). Merged by union as
    :class:`ClickRequestOps` (an item clicked twice keeps the smaller team text)."""

    @staticmethod
    def clicked_value(position: int, attributes):
        """A clicked item's team: ``attributes["team"]``, "" when absent."""
        return (attributes or {}).get(il.TEAM_ATTRIBUTE) or ""

    @staticmethod
    def credit(state) -> tuple[int, int, bool]:
        """``(clicks on A's items, clicks on B's items, a click on an item without a team)``."""
        teams = list(ClickRequestState._make(state).clicked.values())
        return teams.count("A"), teams.count("B"), any(t not in il.TEAMS for t in teams)


# --------------------------------------------------------------------------------------------
# off-policy estimates

def check_probabilities(logging_prob, target_prob) -> tuple[float, float]:
    """``(logging probability, target probability)`` of one logged impression as floats; raises
    ValueError unless the first is in (0, 1] and the second in [0, 1] (the off-policy states')."""
    pb, pe = float(logging_prob), float(target_prob)
    if not 0.0 < pb <= 1.0:
        raise ValueError(f"logging probability (propensity) must be in (0, 1], got {logging_prob!r}")
    if not 0.0 <= pe <= 1.0:
        raise ValueError(f"target probability must be in [0, 1], got {target_prob!r}")
    return pb, pe


#: OpeState's positions in a state, for :meth:`OpeOps.add` (one an impression)
_OPE_N, _OPE_SUMS = (OpeState._fields.index(f) for f in ("n", "sums"))


def merge_counted_sums(out, states) -> list:
    """Merge ``states`` (lists of a named tuple with fields ``n``, a count, and ``sums``, lists of
    Shewchuk partials) into ``out``, a fresh state of that named tuple; the merged state as a list
    (:class:`OpeOps`, :class:`~.online_ope.DrOps`)."""
    n = 0
    for s in map(type(out)._make, states):
        n += s.n
        for into, other in zip(out.sums, s.sums):
            partials_merge(into, other)
    return list(out._replace(n=n))


class OpeOps:
    """Sums for IPS and SNIPS: an :class:`OpeState` ``(n, sums)``, ``sums`` an :class:`OpeSums` of
    sum w, sum w^2, sum y, sum w y, sum y^2, with
    w = target probability / logging probability, r the reward (click) and y = w r the weighted
    reward (the double ``w * r``, as numpy computes it). The squares and the product are added
    exactly (:func:`~.moments.partials_add_square`, :func:`~.moments.partials_add_product`), so the
    variance taken from the sums in rational arithmetic is the exact second moment about the mean
    (the M2 of Chan et al.'s (n, mean, M2) update, here with no rounding at all) and IPS's and
    SNIPS's standard errors are the exact sample statistics of the (w, y) pairs, correctly rounded,
    whatever the merge order. (Sums of rounded squares, as before, left a residue of the order of
    an ulp of sum y^2: two equal weighted rewards of 1e5 had a standard error of 0.00095, not 0.)"""

    @staticmethod
    def create() -> list:
        return list(OpeState(0, _fresh_sums(OpeSums._fields)))

    @staticmethod
    def add(state: list, reward, target_prob, logging_prob) -> list:
        """Add one logged impression. Raises ValueError when the logging probability is not in
        (0, 1], the target probability not in [0, 1] or the reward not finite."""
        pb, pe = check_probabilities(logging_prob, target_prob)
        r = float(reward)
        if not math.isfinite(r):
            raise ValueError(f"reward {reward!r} is not finite")
        w = pe / pb
        y = w * r
        if not math.isfinite(y) or not math.isfinite(w):
            raise ValueError(f"importance weight {pe!r} / {pb!r} times reward {r!r} is not a finite number")
        state[_OPE_N] += 1
        sw, sww, sy, swy, syy = state[_OPE_SUMS]  # an OpeSums' fields
        partials_add(sw, w)
        partials_add_square(sww, w)
        partials_add(sy, y)
        partials_add_product(swy, w, y)
        partials_add_square(syy, y)
        return state

    @staticmethod
    def merge(states) -> list:
        return merge_counted_sums(OpeState._make(OpeOps.create()), states)

    @staticmethod
    def extract(state: list) -> dict:
        """``{"ips": (V, n, se), "snips": (V, n, se), "mean_weight": (w, n, None),
        "ess": (ess, n, None)}``; NaN with n = 0 when empty."""
        n, partials = state  # the OpeState's fields
        sums = OpeSums._make(exact_sum(p) for p in partials)
        ips_v, ips_se = om.ips_from_sums(n, *sums)
        sn_v, sn_se = om.snips_from_sums(n, *sums)
        mw, ess = om.ess_from_sums(n, *sums)
        return {"ips": (ips_v, n, ips_se), "snips": (sn_v, n, sn_se), "mean_weight": (mw, n, None),
                "ess": (ess, n, None)}


# --------------------------------------------------------------------------------------------
# calibration of predicted probabilities


#: the MeanMoments(3) metrics of a CalibrationState's ``moments``: the log loss term, the Brier
#: term and the probability
_LOGLOSS, _BRIER, _P = range(3)


class CalibrationOps:
    """Log loss, Brier score, calibration ratio and ECE over fixed-width bins
    (:mod:`streameval.metrics.calibration`) of examples (probability p in [0, 1], label), for the
    ECE bin counts ``bins`` (several at once). State: a :class:`CalibrationState` ``(moments, clicks,
    clicked_p, bins)``: the MeanMoments(3) state of (log loss term, Brier term, p), clicks, sum of p
    over the clicks as partials, per bin count ``{bin: CalibrationBin (examples, clicks, sum p
    partials)}``: integer counts and exact sums, so any split and merge order gives the same values
    to the last bit. :meth:`add` (one example) and :meth:`by_key` (vectorised, many keys) give
    states of equal value."""

    def __init__(self, bins=()):
        self.bins = tuple(sorted({cal.check_bins(b) for b in bins}))
        self.mm = MeanMoments(3)

    def create(self) -> list:
        return list(CalibrationState(self.mm.create(), 0, [], [{} for _ in self.bins]))

    def add(self, state: list, p, label) -> list:
        """Add one example. Raises ValueError when p is not in [0, 1] or the label not 0/1."""
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {p!r}")
        y = _label(label)
        pa, ya = np.array([p]), np.array([bool(y)])
        (ll,), (br,) = cal.example_terms(pa, ya)
        s = CalibrationState._make(state)
        self.mm.add(s.moments, (float(ll), float(br), p))
        if y:
            partials_add(s.clicked_p, p)
            state[:] = s._replace(clicks=s.clicks + 1)
        for entries, bins in zip(s.bins, self.bins):
            (b,) = cal.bin_index(pa, bins).tolist()
            e = CalibrationBin._make(entries.get(b) or (0, 0, []))
            partials_add(e.p, p)
            entries[b] = list(e._replace(examples=e.examples + 1, clicks=e.clicks + y))
        return state

    def merge(self, states) -> list:
        out = CalibrationState._make(self.create())
        mms = [out.moments]
        clicks = 0
        for s in map(CalibrationState._make, states):
            mms.append(s.moments)
            clicks += s.clicks
            partials_merge(out.clicked_p, s.clicked_p)
            for into, entries in zip(out.bins, s.bins):
                for b, entry in entries.items():
                    e = CalibrationBin._make(entry)
                    old = into.get(b)
                    if old is None:
                        into[b] = list(e._replace(p=list(e.p)))
                    else:
                        o = CalibrationBin._make(old)
                        partials_merge(o.p, e.p)
                        into[b] = list(o._replace(examples=o.examples + e.examples, clicks=o.clicks + e.clicks))
        return list(out._replace(moments=self.mm.merge(mms), clicks=clicks))

    def by_key(self, key, p, labels):
        """``(key, state)`` per distinct key, keys ascending (vectorised). ``key``: int64 codes,
        ``p``: probabilities in [0, 1], ``labels``: booleans, shape (n,) each."""
        key = np.asarray(key, dtype=np.int64)
        if not len(key):
            return
        p = np.asarray(p, dtype=np.float64)
        y = np.asarray(labels, dtype=bool)
        ll, br = cal.example_terms(p, y)
        matrix = np.vstack([ll, br, p])
        bin_of = [cal.bin_index(p, bins) for bins in self.bins]
        order = np.argsort(key, kind="stable")
        k = key[order]
        starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
        ends = np.append(starts[1:], len(k))
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            m = order[lo:hi]
            pm, ym = p[m], y[m]
            clicked = pm[ym]
            state = CalibrationState(self.mm.add_many(self.mm.create(), matrix[:, m]), int(ym.sum()),
                                     exact_sum_floats(clicked) if len(clicked) else [], [])
            for b_all in bin_of:
                b = b_all[m]
                bo = np.argsort(b, kind="stable")
                bs, ps, ys = b[bo], pm[bo], ym[bo]
                bstart = np.flatnonzero(np.concatenate(([True], bs[1:] != bs[:-1])))
                bend = np.append(bstart[1:], len(bs))
                state.bins.append({int(bs[a]): list(CalibrationBin(int(z - a), int(ys[a:z].sum()),
                                                                   exact_sum_floats(ps[a:z])))
                                   for a, z in zip(bstart.tolist(), bend.tolist())})
            yield int(k[lo]), list(state)

    def extract(self, state: list) -> dict:
        """``{"logloss": (mean, n, stderr), "brier": (mean, n, stderr), "calibration": (ratio, n,
        stderr), "ece": {bins: (ece, n, None)}, "bins": {bins: [(bin, examples, mean p, click
        rate, stderr of the click rate), ...]}}``; NaN values with n = 0 when empty."""
        s = CalibrationState._make(state)
        moments = self.mm.extract(s.moments)
        ll, n, ll_se = moments[_LOGLOSS]
        br, _, br_se = moments[_BRIER]
        mm = MomentsState._make(s.moments)
        sp = exact_sum(mm.sums[_P])
        sp2 = exact_sum(mm.squares[_P])
        ratio, ratio_se = cal.ratio_result(n, s.clicks, sp, sp2, exact_sum(s.clicked_p))
        out = {"logloss": (ll, n, ll_se), "brier": (br, n, br_se), "calibration": (ratio, n, ratio_se),
               "ece": {}, "bins": {}}
        for counts, bins in zip(s.bins, self.bins):
            entries = [(b, CalibrationBin._make(e)) for b, e in sorted(counts.items())]
            sums = [exact_sum(e.p) for _, e in entries]
            out["ece"][bins] = (cal.ece_from_bins(n, [e.clicks for _, e in entries], sums), n, None)
            out["bins"][bins] = [(b, e.examples, float(s / e.examples), e.clicks / e.examples,
                                  om.mean_from_sums(e.examples, e.clicks, e.clicks)[1])
                                 for (b, e), s in zip(entries, sums)]
        return out
