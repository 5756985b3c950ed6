"""Online metrics: AUC (exact and histogram), GAUC, click metrics per request, IPS / SNIPS.

References: scikit-learn's roc_auc_score, direct per-group / per-request computations written here
from the definitions, a pairwise DeLong computation, obp 0.4.1's estimators and Monte Carlo (values
recorded below), hand calculations, and raw-file parsing of the Yandex and LETOR samples.
Beam pipelines run on FnApiRunner."""

import csv
import json
import math
import random
import uuid
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from streameval import api
from streameval.accumulators.online import AucOps, ClickRequestOps, CountArrays, GaucOps, HistAucOps, OpeOps, auc_result
from streameval.beam.online import (
    AucCombineFn,
    ClickRequestCombineFn,
    GaucCombineFn,
    GroupAucCombineFn,
    HistAucCombineFn,
    OffPolicyCtr,
    OnlineMetrics,
    OpeCombineFn,
    split_metric_names,
)
from streameval.io import avro, convert
from streameval.metrics import online as om
from streameval.metrics.names import MetricNameError

from .conftest import data_path

HOUR = 3_600_000_000
DAY = 24 * HOUR
BASE = 1_700_000_000_000_000 - 1_700_000_000_000_000 % DAY

# --------------------------------------------------------------------------------------------
# helpers

_SINKS: dict = {}


def _put(x, key):
    _SINKS.setdefault(key, []).append(x)


def run_pipeline(build, counters=False):
    """Run ``build(p) -> {name: pcoll}`` on FnApiRunner; {name: [elements]} (+ "counters")."""
    p = beam.Pipeline(runner=FnApiRunner())
    outs = build(p)
    keys = {}
    for name, pc in outs.items():
        keys[name] = uuid.uuid4().hex
        _SINKS[keys[name]] = []
        pc | f"Sink{name}" >> beam.Map(_put, keys[name])
    result = p.run()
    result.wait_until_finish()
    got = {name: _SINKS.pop(k) for name, k in keys.items()}
    if counters:
        q = result.metrics().query(MetricsFilter().with_namespace("streameval"))["counters"]
        got["counters"] = {c.key.metric.name: c.committed for c in q}
    return got


def create(p, items, label):
    return p | label >> beam.Create(items).with_output_types(dict)


def by_key(rows):
    out = {}
    for r in rows:
        k = (r["window_start"], r["slice"], r["system"], r["metric"])
        assert k not in out, f"duplicate row {k}"
        out[k] = r
    return out


def random_split_merge(ops_merge, states, rnd):
    """Merge states in a random tree."""
    states = list(states)
    while len(states) > 1:
        rnd.shuffle(states)
        k = rnd.randint(2, min(4, len(states)))
        states = [ops_merge(states[:k])] + states[k:]
    return states[0]


def delong_pairwise(scores, labels):
    """DeLong et al. 1988 from the pairwise kernel psi(x, y) = 1, 1/2, 0 (O(P N))."""
    s = np.asarray(scores, float)
    y = np.asarray(labels, bool)
    x1, x0 = s[y], s[~y]
    psi = (x1[:, None] > x0[None, :]) + 0.5 * (x1[:, None] == x0[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return math.sqrt(v10.var(ddof=1) / len(x1) + v01.var(ddof=1) / len(x0))


# --------------------------------------------------------------------------------------------
# names

def test_names():
    assert om.parse_online_metric("gauc").name == "gauc[user,impressions]"
    assert om.parse_online_metric("GAUC[query, clicks]").name == "gauc[query,clicks]"
    assert om.parse_online_metric("gauc[request,uniform]").name == "gauc[request,unweighted]"
    assert om.parse_online_metric("ctr@pos3").name == "ctr@pos3"
    assert om.parse_online_metric("clicks@5").name == "clicks@5"
    assert om.parse_online_metric("mrr_click").name == "rr_first_click"
    assert om.parse_online_metric("rr_first_click[clicked]").clicked_only
    assert om.parse_online_metric("abandonment_rate").name == "abandonment"
    for bad in ("gauc[device]", "gauc[user,weird]", "clicks@0", "ctr@pos", "aucc"):
        with pytest.raises(MetricNameError):
            om.parse_online_metric(bad)
    ranking, online = split_metric_names("ndcg@10,P.5,10,gauc[query,clicks],auc,ctr")
    assert ranking == ["ndcg@10", "P.5,10"] and online == ["gauc[query,clicks]", "auc", "ctr"]
    with pytest.raises(MetricNameError, match="unknown metric 'aucc'; closest accepted names: auc, "):
        split_metric_names(["aucc"])  # issue 42: the closest names of both kinds


# --------------------------------------------------------------------------------------------
# exact AUC

def _tied_data(rng, n, levels):
    scores = rng.integers(0, levels, n) / levels  # many ties
    labels = rng.random(n) < rng.uniform(0.05, 0.95)
    labels[0], labels[1] = True, False
    return scores, labels


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(2, 3000))
        scores, labels = _tied_data(rng, n, int(rng.integers(1, 60)))
        ref = roc_auc_score(labels, scores)
        assert abs(om.auc_score(scores, labels) - ref) <= 1e-12
        state = AucOps.add_many(AucOps.create(), scores, labels)
        auc, count, se = AucOps.extract(state)
        assert abs(auc - ref) <= 1e-12 and count == n
    # continuous scores, large n
    s = rng.normal(size=200_000)
    y = rng.random(200_000) < 1 / (1 + np.exp(-s))
    assert abs(om.auc_score(s, y) - roc_auc_score(y, s)) <= 1e-12


def test_auc_hand_and_edge_cases():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5), (0.9>0.1), (0.5=0.5 -> 1/2), (0.5>0.1)
    assert om.auc_score([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]) == 3.5 / 4
    assert math.isnan(om.auc_score([0.1, 0.2], [1, 1]))
    assert math.isnan(AucOps.extract(AucOps.create())[0]) and AucOps.extract(AucOps.create())[1] == 0
    with pytest.raises(ValueError):
        om.auc_score([0.1, math.nan], [1, 0])
    with pytest.raises(ValueError):
        om.auc_score([0.1, 0.2], [1, 2])
    with pytest.raises(ValueError):
        AucOps.add(AucOps.create(), math.inf, True)
    # -0.0 and 0.0 are one score (a tie)
    assert om.auc_score([-0.0, 0.0], [1, 0]) == 0.5
    st_ = AucOps.add(AucOps.add(AucOps.create(), -0.0, 1), 0.0, 0)
    assert AucOps.extract(st_)[0] == 0.5


def test_auc_counts_exact_beyond_int64():
    # 2 P N > 2**62: the Python-int path; one positive above 2e9 negatives gives exactly 1
    pos = np.array([0, 3_000_000_000])
    neg = np.array([3_000_000_000, 0])
    assert om.auc_from_counts(pos, neg)[0] == 1.0
    assert om.auc_from_counts(np.array([3_000_000_000]), np.array([3_000_000_000]))[0] == 0.5


def test_delong_stderr_matches_pairwise():
    rng = np.random.default_rng(2)
    for _ in range(10):
        n = int(rng.integers(5, 400))
        s, y = _tied_data(rng, n, int(rng.integers(2, 30)))
        if y.sum() < 2 or (~y).sum() < 2:
            continue
        _, pos, neg = om.auc_counts(s, y)
        assert abs(om.auc_delong_stderr(pos, neg) - delong_pairwise(s, y)) <= 1e-12
    assert math.isnan(om.auc_delong_stderr([1, 0], [0, 5]))


def test_delong_in_place_same_bits_as_the_formula():
    """auc_delong_stderr (in place) and auc_and_stderr give the bits of the formula written out
    with new arrays (the code before), on counts of many distinct scores."""
    from streameval.metrics.online_auc import _cumulative, auc_and_stderr

    def formula(pos, neg):
        P, N = int(pos.sum()), int(neg.sum())
        auc = om.auc_from_counts(pos, neg)[0]
        v10 = ((np.cumsum(neg) - neg).astype(np.float64) + 0.5 * neg) / N
        v01 = ((P - np.cumsum(pos)).astype(np.float64) + 0.5 * pos) / P
        return math.sqrt(float(np.dot(pos, (v10 - auc) ** 2)) / (P - 1) / P
                         + float(np.dot(neg, (v01 - auc) ** 2)) / (N - 1) / N)

    rng = np.random.default_rng(5)
    for _ in range(12):
        m = int(rng.integers(2, 300_000))
        pos, neg = rng.integers(0, 3, m), rng.integers(0, 5, m)
        want = formula(pos, neg)
        assert om.auc_delong_stderr(pos, neg) == want
        auc, P, N = om.auc_from_counts(pos, neg)
        assert auc_and_stderr(pos, neg) == (auc, P, N, want)
        # narrow unsigned counts (a held state's) are read as they are: the same bits
        assert auc_and_stderr(pos.astype(np.uint8), neg.astype(np.uint16)) == (auc, P, N, want)
        # the counts below each value, summed in float64 or (totals from 2**53) in int64: the same
        below = (np.cumsum(neg) - neg).astype(np.float64)
        for total in (N, 2**53):
            assert _cumulative(neg.astype(np.uint8), neg.astype(np.float64), total, True).tolist() == below.tolist()
    assert all(math.isnan(x) for x in auc_and_stderr([0, 0], [1, 2])[::3])
    assert math.isnan(auc_and_stderr([1, 0], [0, 5])[3]) and auc_and_stderr([1, 0], [0, 5])[0] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.booleans()), min_size=0, max_size=80), st.randoms())
def test_auc_merge_any_split_equals_one_pass(pairs, rnd):
    one = AucOps.create()
    for s, y in pairs:
        AucOps.add(one, s / 8, y)
    parts = [AucOps.create() for _ in range(rnd.randint(1, 5))]
    for s, y in pairs:
        AucOps.add(rnd.choice(parts), s / 8, y)
    merged = random_split_merge(AucOps.merge, parts + [AucOps.merge([])], rnd)
    a, b = AucOps.extract(one), AucOps.extract(merged)
    assert json.dumps(a) == json.dumps(b)  # identical, NaN included


@pytest.mark.parametrize("nkeys", [1, 7, 70_000])
def test_count_arrays_by_key_match_direct_counts(nkeys):
    """CountArrays.by_key against counts per (key, value) in a dict (-0.0 and 0.0 one value, ties,
    one key, keys beyond 16 bits, negative scores), and its AUC against AucOps on the same rows."""
    rng = np.random.default_rng(nkeys)
    n = 200_000
    key = rng.integers(0, nkeys, n) * 3 + 5
    score = np.round(rng.normal(size=n), 2)
    score[rng.random(n) < 0.05] = -0.0
    score[rng.random(n) < 0.05] = 0.0
    label = rng.random(n) < 0.3
    direct = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for k, s, y in zip(key.tolist(), score.tolist(), label.tolist()):
        direct[k][s][0 if y else 1] += 1
    got = list(CountArrays.by_key(key, score, label))
    assert [k for k, _ in got] == sorted(direct)
    for k, state in got:
        values, pos, neg = CountArrays.arrays(state)
        want = sorted(direct[k].items())
        assert values.tolist() == [v for v, _ in want]
        assert pos.tolist() == [c[0] for _, c in want] and neg.tolist() == [c[1] for _, c in want]
    # merged states of a random split (and an empty state) equal the state of all rows
    part = rng.integers(0, 5, n)
    states = defaultdict(list)
    for i in range(5):
        for k, state in CountArrays.by_key(key[part == i], score[part == i], label[part == i]):
            states[k].append(state)
    for k, state in got[:50]:
        merged = CountArrays.merge(states[k] + [CountArrays.EMPTY])
        assert [a.tolist() for a in CountArrays.arrays(merged)] == [a.tolist() for a in CountArrays.arrays(state)]
        # as arrays (raw, a held state's form), also merged again with a state in bytes
        raw = CountArrays.merge(states[k][1:] + [CountArrays.EMPTY], raw=True)
        assert all(isinstance(a, np.ndarray) for a in raw)
        again = CountArrays.merge([raw, states[k][0]], raw=True)
        assert [a.tolist() for a in again] == [a.tolist() for a in CountArrays.arrays(state)]
    k0 = got[0][0]
    ops = AucOps.create()
    for s, y in zip(score[key == k0].tolist(), label[key == k0].tolist()):
        AucOps.add(ops, s, bool(y))
    assert json.dumps(list(AucOps.extract(ops))) == json.dumps(list(auc_result(*CountArrays.counts(got[0][1]))))


def test_count_arrays_raw_states_narrow_counts_without_wrapping():
    """Raw states (a held state's form) keep their counts in the narrowest unsigned type; merging
    them sums in int64, so counts past 255 and 65,535 at one score do not wrap, and the merged
    state and its AUC equal those of the states as bytes."""
    rng = np.random.default_rng(7)
    states, raws = [], []
    for i in range(300):  # each: 255 positives at 0.5 (uint8's maximum) and a few other scores
        score = np.concatenate([np.full(255, 0.5), np.round(rng.random(40) * 0.4, 3)])
        label = np.concatenate([np.ones(255, bool), rng.random(40) < 0.5])
        (_, state), = CountArrays.by_key(np.zeros(len(score), np.int64), score, label)
        (_, raw), = CountArrays.by_key(np.zeros(len(score), np.int64), score, label, raw=True)
        assert raw[1].dtype == np.uint8 and raw[2].dtype == np.uint8 and raw[0].dtype == np.float64
        assert [a.tolist() for a in raw] == [a.tolist() for a in CountArrays.arrays(state)]
        states.append(state)
        raws.append(raw)
    want = CountArrays.arrays(CountArrays.merge(states))
    assert want[1][want[0] == 0.5].tolist() == [255 * 300]
    for parts in (raws, raws[:1] + states[1:], [CountArrays.merge(raws[:150], raw=True),
                                                CountArrays.merge(raws[150:], raw=True)]):
        got = CountArrays.merge(parts, raw=True)
        assert got[1].dtype == np.uint32  # 76,500 positives at 0.5
        assert [a.tolist() for a in got] == [a.tolist() for a in want]
        assert repr(auc_result(*CountArrays.counts(got))) == repr(auc_result(*CountArrays.counts(want)))
        assert CountArrays.merge(parts) == CountArrays.merge(states)  # as bytes: int64 counts


# --------------------------------------------------------------------------------------------
# histogram AUC

def test_hist_auc_within_stated_bound():
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = int(rng.integers(2, 5000))
        kind = trial % 3
        if kind == 0:
            s = rng.random(n)
        elif kind == 1:
            s = rng.normal(0.5, 0.4, n)  # some outside [0, 1]: clipped into the edge bins
        else:
            s = rng.beta(0.5, 5, n)  # crowded near 0
        y = rng.random(n) < 0.3
        y[0], y[1] = True, False
        bins = int(rng.choice([1, 2, 10, 100, 1000]))
        ops = HistAucOps(0.0, 1.0, bins)
        state = ops.add_many(ops.create(), s, y)
        auc_h, count, se, bound = ops.extract(state)
        exact = roc_auc_score(y, s)
        assert count == n
        assert abs(auc_h - exact) <= bound + 1e-15, (trial, auc_h, exact, bound)
        assert len(state) <= bins
        # the same value one at a time
        one = ops.create()
        for a, b in zip(s[:200], y[:200]):
            ops.add(one, a, b)
        assert one == ops.add_many(ops.create(), s[:200], y[:200])
    # one bin: everything ties, AUC 1/2, bound 1/2
    assert HistAucOps(0, 1, 1).extract({0: [3, 4]})[0] == 0.5
    assert HistAucOps(0, 1, 1).extract({0: [3, 4]})[3] == 0.5


def test_hist_auc_bound_is_attained_and_exact_without_shared_bins():
    ops = HistAucOps(0.0, 1.0, 10)
    # positive 0.11 above negative 0.10: exact AUC 1; same bin: histogram 1/2, bound 1/2 (tight)
    st_ = ops.add(ops.add(ops.create(), 0.11, True), 0.10, False)
    auc, n, se, bound = ops.extract(st_)
    assert (auc, bound) == (0.5, 0.5) and om.auc_score([0.11, 0.10], [1, 0]) == 1.0
    # no bin holds both classes: bound 0 and the histogram AUC is exact
    rng = np.random.default_rng(4)
    s = (np.arange(500) + 0.5) / 500
    y = rng.random(500) < 0.5
    big = HistAucOps(0.0, 1.0, 1000)
    st3 = big.add_many(big.create(), s, y)
    assert big.extract(st3)[3] == 0 and big.extract(st3)[0] == om.auc_score(s, y)
    assert abs(big.extract(st3)[0] - roc_auc_score(y, s)) <= 1e-15


def test_hist_bins_monotone_and_validated():
    s = np.sort(np.random.default_rng(5).normal(0.5, 1, 10_000))
    b = om.hist_bin_index(s, -0.3, 1.7, 37)
    assert (np.diff(b) >= 0).all() and b.min() == 0 and b.max() == 36
    for bad in ((1, 0, 10), (0, 1, 0), (0, math.inf, 10), (0, 1, 2.5)):
        with pytest.raises(ValueError):
            om.hist_bin_index(0.5, *bad)


# --------------------------------------------------------------------------------------------
# GAUC

def _direct_gauc(groups, scores, labels, weighting):
    """Per group with pandas-free loops and scikit-learn; the weighted mean by hand."""
    by = defaultdict(list)
    for g, s, y in zip(groups, scores, labels):
        by[g].append((s, y))
    aucs, ws, excluded = [], [], 0
    for g, rows in by.items():
        ys = [y for _, y in rows]
        if all(ys) or not any(ys):
            excluded += 1
            continue
        aucs.append(roc_auc_score(ys, [s for s, _ in rows]))
        ws.append({"impressions": len(rows), "clicks": sum(ys), "unweighted": 1}[weighting])
    aucs, ws = np.array(aucs), np.array(ws, float)
    return float((aucs * ws).sum() / ws.sum()), len(aucs), excluded, aucs, ws


@pytest.mark.parametrize("weighting", om.GAUC_WEIGHTINGS)
def test_gauc_matches_direct_per_group(weighting):
    rng = np.random.default_rng(6)
    n = 6000
    groups = rng.integers(0, 300, n).astype(str)
    scores = np.round(rng.random(n), 2)
    labels = rng.random(n) < 0.2
    value, used, excluded, se = om.gauc(groups, scores, labels, weighting)
    ref, ref_used, ref_excl, aucs, ws = _direct_gauc(groups, scores, labels, weighting)
    assert abs(value - ref) <= 1e-12 and used == ref_used and excluded == ref_excl and excluded > 0
    if weighting == "unweighted":  # the usual standard error of a mean
        assert abs(se - aucs.std(ddof=1) / math.sqrt(len(aucs))) <= 1e-12
    else:  # ratio estimator, written out
        r = (aucs * ws).sum() / ws.sum()
        ref_se = math.sqrt(len(aucs) / (len(aucs) - 1) * ((ws * (aucs - r)) ** 2).sum() / ws.sum() ** 2)
        assert abs(se - ref_se) <= 1e-12
    # accumulators: groups' exact AUC states -> GaucOps, in random pieces
    rnd = random.Random(7)
    per_group = defaultdict(list)
    for g, s, y in zip(groups, scores, labels):
        per_group[g].append((s, y))
    ops = GaucOps(om.GAUC_WEIGHTINGS)
    parts = [ops.create() for _ in range(4)]
    for g, rows in per_group.items():
        st_ = AucOps.create()
        for s, y in rows:
            AucOps.add(st_, s, y)
        auc, p, q, _ = AucOps.summary(st_)
        ops.add_group(rnd.choice(parts), auc, p, q)
    res, excl = ops.extract(random_split_merge(ops.merge, parts, rnd))
    i = om.GAUC_WEIGHTINGS.index(weighting)
    assert excl == ref_excl and res[i][1] == ref_used
    assert abs(res[i][0] - ref) <= 1e-12 and abs(res[i][2] - se) <= 1e-12


def test_group_auc_each_group_equals_sklearn():
    rng = np.random.default_rng(8)
    g = rng.integers(0, 40, 3000)
    s = np.round(rng.normal(size=3000), 1)
    y = rng.random(3000) < 0.4
    ids, auc, n_pos, n_neg = om.group_auc(g, s, y)
    for k, gid in enumerate(ids):
        m = g == gid
        assert n_pos[k] == y[m].sum() and n_neg[k] == (~y[m]).sum()
        if 0 < y[m].sum() < m.sum():
            assert abs(auc[k] - roc_auc_score(y[m], s[m])) <= 1e-12
        else:
            assert math.isnan(auc[k])


def test_gauc_merge_order_independent_bitwise():
    rnd = random.Random(9)
    ops = GaucOps(("impressions", "clicks"))
    groups = [(rnd.random(), rnd.randint(1, 9), rnd.randint(0, 9)) for _ in range(200)]
    one = ops.create()
    for a, p, n in groups:
        ops.add_group(one, a, p, n)
    parts = [ops.create() for _ in range(6)]
    for a, p, n in groups:
        ops.add_group(rnd.choice(parts), a, p, n)
    assert ops.extract(one) == ops.extract(random_split_merge(ops.merge, parts, rnd))
    empty = ops.extract(ops.merge([]))
    assert math.isnan(empty[0][0][0]) and empty[0][0][1] == 0 and empty[1] == 0


# --------------------------------------------------------------------------------------------
# click metrics per request

def _direct_click_terms(requests, specs):
    """requests: list of lists of (position, clicked)."""
    out = []
    for imps in requests:
        clicked = sorted(p for p, c in imps if c)
        row = []
        for s in specs:
            if s.family == "clicks":
                row.append(sum(1 for p in clicked if s.k is None or p <= s.k))
            elif s.family == "rr_first_click":
                row.append(1 / clicked[0] if clicked else (math.nan if s.clicked_only else 0.0))
            else:
                row.append(0.0 if clicked else 1.0)
        out.append(row)
    return np.array(out).T


def test_click_request_terms_match_direct():
    rnd = random.Random(10)
    specs = om.parse_online_metrics(["clicks@1", "clicks@3", "clicks", "rr_first_click",
                                     "rr_first_click[clicked]", "abandonment"])
    requests = [[(p, rnd.random() < 0.15) for p in range(1, rnd.randint(1, 10) + 1)] for _ in range(500)]
    ops = ClickRequestOps()
    states = []
    for i, imps in enumerate(requests):
        st_ = ops.create()
        for p, c in imps:
            ops.add_impression(st_, f"item{p}", p, c, 10 + i)
        states.append(st_)
    got = ClickRequestOps.terms(states, specs)
    ref = _direct_click_terms(requests, specs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(ref), rtol=0, atol=0)


def test_click_request_state_duplicates_and_splits():
    ops = ClickRequestOps(attribute_keys=["campaign"])
    imps = [("a", 1, False, 5), ("b", 2, True, 3), ("c", 3, None, 1), ("d", 4, True, 9)]
    one = ops.create()
    for it, p, c, t in imps:
        ops.add_impression(one, it, p, c, t, {"campaign": "men", "x": "y"})
    assert one == [1, {"campaign": "men"}, {"b": 2, "d": 4}, True]
    rnd = random.Random(11)
    for _ in range(20):
        parts = [ops.create() for _ in range(3)]
        for it, p, c, t in imps + imps:  # every impression twice
            ops.add_impression(rnd.choice(parts), it, p, c, t, {"campaign": "men"})
        assert random_split_merge(ops.merge, parts, rnd) == one
    # only null clicks: not logged
    st_ = ops.add_impression(ops.create(), "a", 1, None, 0)
    assert st_[3] is False


# --------------------------------------------------------------------------------------------
# IPS / SNIPS

def test_ips_snips_match_direct_formulas_and_merge():
    rng = np.random.default_rng(12)
    n = 5000
    pb = rng.uniform(0.01, 0.5, n)
    pe = rng.uniform(0.0, 0.5, n)
    r = (rng.random(n) < 0.1).astype(float)
    w = pe / pb
    v, se = om.ips(r, pe, pb)
    assert abs(v - np.mean(w * r)) <= 1e-15 and abs(se - np.std(w * r, ddof=1) / math.sqrt(n)) <= 1e-15
    v2, se2 = om.snips(r, pe, pb)
    ref = (w * r).sum() / w.sum()
    ref_se = math.sqrt(n / (n - 1) * ((w * (r - ref)) ** 2).sum() / w.sum() ** 2)
    assert abs(v2 - ref) <= 1e-15 and abs(se2 - ref_se) <= 1e-15
    rnd = random.Random(13)
    parts = [OpeOps.create() for _ in range(5)]
    for a, b, c in zip(r, pe, pb):
        OpeOps.add(rnd.choice(parts), a, b, c)
    res = OpeOps.extract(random_split_merge(OpeOps.merge, parts, rnd))
    assert res["ips"][1] == n and abs(res["ips"][0] - v) <= 1e-15 and abs(res["snips"][0] - v2) <= 1e-15
    assert abs(res["ess"][0] - w.sum() ** 2 / (w * w).sum()) <= 1e-9
    empty = OpeOps.extract(OpeOps.merge([]))
    assert math.isnan(empty["ips"][0]) and empty["ips"][1] == 0
    with pytest.raises(ValueError):
        OpeOps.add(OpeOps.create(), 1, 0.5, 0.0)
    with pytest.raises(ValueError):
        om.ips([1], [1.5], [0.5])


def test_ips_snips_recover_a_known_ctr():
    """A simulated bandit: 20 items with known click rates; logging policy softmax, target policy
    another softmax. The target's true CTR is sum_a pi_e(a) ctr(a); IPS and SNIPS must land within 4
    standard errors of it (with the stated standard errors: a wrong se fails too)."""
    rng = np.random.default_rng(14)
    ctr = rng.uniform(0.01, 0.2, 20)
    pi_b = np.exp(rng.normal(size=20))
    pi_b /= pi_b.sum()
    pi_e = np.exp(3 * ctr / ctr.max())
    pi_e /= pi_e.sum()
    truth = float(pi_e @ ctr)
    z_ips, z_sn = [], []
    for rep in range(30):
        a = rng.choice(20, size=20000, p=pi_b)
        r = rng.random(20000) < ctr[a]
        v, se = om.ips(r, pi_e[a], pi_b[a])
        v2, se2 = om.snips(r, pi_e[a], pi_b[a])
        z_ips.append((v - truth) / se)
        z_sn.append((v2 - truth) / se2)
    for z in (np.array(z_ips), np.array(z_sn)):
        assert np.abs(z).max() < 4.5
        assert 0.6 < z.std() < 1.5  # standard errors of the right size


OBP_IPW_RANDOM_FROM_BTS = {  # obp 0.4.1: InverseProbabilityWeighting / SelfNormalized..., action_dist 1/n_items
    "all": (0.0023596395168460067, 0.002333713893161734),
    "men": (0.0030086263272564836, 0.0031894231622773923),
    "women": (0.00743757754192316, 0.0023730461434477556),
}


def test_ope_command_random_target_on_obd_bts_logs_matches_obp(tmp_path, capsys, monkeypatch):
    """``streameval.jobs.ope``: the random policy's CTR estimated from the BTS logs equals obp's IPW and
    SNIPW estimators (run separately with obp 0.4.1; values above), the standard error a direct
    computation, and the measured CTR a direct count of the random logs. The job's temporary
    directory (the logs converted to Avro) is gone when it returns."""
    import tempfile

    from streameval.jobs import ope

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    n_items = {}
    for c in ("all", "men", "women"):
        with open(data_path("obd", "bts", c, "item_context.csv")) as f:
            n_items[c] = sum(1 for _ in f) - 1
    assert n_items == {"all": 80, "men": 34, "women": 46}
    obd = data_path("obd")
    rc = ope.main(["--logs", str(obd / "bts" / "*" / "*.csv"), "--target", "random",
                   "--target-logs", str(obd / "random" / "*" / "*.csv"), "--output", str(tmp_path / "out")])
    assert rc == 0
    assert not list((tmp_path / "tmp").glob("streameval-ope-*"))
    printed = capsys.readouterr().out
    for c, n in n_items.items():  # the random policy's propensity is 1/n_items for every logged row
        assert f"campaign={c}: 10000 of 10000 propensities equal the random target's" in printed
    rows = by_key(json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl"))
    for c, (ips_ref, snips_ref) in OBP_IPW_RANDOM_FROM_BTS.items():
        ips_row = rows[(None, f"campaign={c}", "bts", "ips[random]")]
        sn_row = rows[(None, f"campaign={c}", "bts", "snips[random]")]
        assert ips_row["num_queries"] == 10000
        assert abs(ips_row["value"] - ips_ref) <= 1e-12 * ips_ref
        assert abs(sn_row["value"] - snips_ref) <= 1e-12 * snips_ref
        with open(data_path("obd", "bts", c, f"{c}.csv")) as f:
            logged = list(csv.DictReader(f))
        wr = np.array([(1 / n_items[c]) / float(r["propensity_score"]) * int(r["click"]) for r in logged])
        assert abs(ips_row["stderr"] - np.std(wr, ddof=1) / math.sqrt(len(wr))) <= 1e-12
        with open(data_path("obd", "random", c, f"{c}.csv")) as f:
            clicks = [int(r["click"]) for r in csv.DictReader(f)]
        measured = rows[(None, f"campaign={c}", "random", "ctr")]
        assert measured["value"] == sum(clicks) / len(clicks) and f"{measured['value']:.5f}" in printed
    # a shell-expanded glob is taken whole, a stray path is refused (not silently ignored)
    assert ope.main(["--logs", str(obd / "bts" / "all" / "all.csv"), "--target", "random",
                     str(obd / "bts" / "men" / "men.csv")]) == 2


def test_bts_monte_carlo_reproduces_obp():
    """obp 0.4.1 BernoulliTS(n_actions=5, len_list=3, alpha=[1..5], beta=[5..1], random_state=0)
    .compute_batch_action_dist(n_sim=2000) * 2000, recorded."""
    obp_counts = [[2, 17, 104], [15, 142, 424], [97, 435, 938], [386, 1027, 442], [1500, 379, 92]]
    got = om.bts_action_probabilities([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], 3, 2000, seed=0, chunk=333)
    np.testing.assert_array_equal(np.round(got * 2000).astype(int), obp_counts)
    assert np.allclose(got.sum(axis=0), 1)


def test_bts_prior_reader(tmp_path):
    from streameval.jobs.ope import read_bts_prior

    text = "all:\n  alpha:\n    - 47.0\n    - 8.0\n  beta:\n    - 12198.0\n    - 3566.0\nmen:\n  alpha:\n    - 1.0\n  beta:\n    - 2.0\n"
    (tmp_path / "prior.yaml").write_text(text)
    got = read_bts_prior(str(tmp_path / "prior.yaml"))
    assert got == {"all": {"alpha": [47.0, 8.0], "beta": [12198.0, 3566.0]}, "men": {"alpha": [1.0], "beta": [2.0]}}
    yaml = pytest.importorskip("yaml")
    assert got == yaml.safe_load(text)


def test_target_policies():
    u = om.UniformTarget({"men": 34}, attribute="campaign")
    assert u({"attributes": {"campaign": "men"}}) == 1 / 34 and u({"attributes": {"campaign": "x"}}) is None
    t = om.TableTarget({("men", "3", 1): 0.25})
    t.attribute = "campaign"
    assert t({"attributes": {"campaign": "men"}, "item_id": "3", "position": 1}) == 0.25
    lp = om.LoggedPropensityTarget([("m", "3", 1, 100, 0.1), ("m", "3", 1, 200, 0.3)], attribute="c")
    rec = lambda ts: {"attributes": {"c": "m"}, "item_id": "3", "position": 1, "timestamp": ts}  # noqa: E731
    assert [lp(rec(t)) for t in (0, 149, 150, 151, 999)] == [0.1, 0.1, 0.1, 0.3, 0.3]
    assert lp({"attributes": {"c": "m"}, "item_id": "4", "position": 1, "timestamp": 0}) is None


# --------------------------------------------------------------------------------------------
# Beam

class _NoFallback(beam.coders.Coder):
    def encode(self, value):
        raise AssertionError(f"accumulator holds a non-primitive {type(value).__name__}: would be pickled")

    def decode(self, encoded):
        raise AssertionError("no fallback")


def _pairs(rnd):
    return [(round(rnd.random(), 1), rnd.random() < 0.3) for _ in range(80)]


def _combiner_cases():
    """(name, CombineFn, input generator, (value, count) of an empty accumulator's output)."""
    return [
        ("auc", AucCombineFn(), _pairs, lambda out: (out[0], out[1])),
        ("group_auc", GroupAucCombineFn(), _pairs, lambda out: (out[0], out[1] + out[2])),
        ("hist", HistAucCombineFn(0, 1, 7), _pairs, lambda out: (out[0], out[1])),
        ("gauc", GaucCombineFn(("impressions", "unweighted")),
         lambda rnd: [(rnd.random(), rnd.randint(0, 3), rnd.randint(0, 3)) for _ in range(40)],
         lambda out: (out[0][1][0], out[0][1][1] + out[1])),
        ("click_request", ClickRequestCombineFn(["campaign"]),
         lambda rnd: [{"item_id": f"i{k}", "position": k, "clicked": rnd.choice([True, False, None]),
                       "timestamp": rnd.randint(0, 9), "attributes": {"campaign": rnd.choice("ab")}}
                      for k in range(1, 12)],
         lambda out: (math.nan, len(out[2]))),
        ("ope", OpeCombineFn(), lambda rnd: [(float(rnd.random() < 0.2), rnd.random(), rnd.uniform(0.1, 1))
                                             for _ in range(50)],
         lambda out: out["snips"][:2]),
    ]


@pytest.mark.parametrize("name,fn,gen,empty", _combiner_cases(), ids=[c[0] for c in _combiner_cases()])
def test_combiner_contract(name, fn, gen, empty):
    rnd = random.Random(15)
    strict = beam.coders.FastPrimitivesCoder(fallback_coder=_NoFallback())
    assert isinstance(fn.get_accumulator_coder(), beam.coders.FastPrimitivesCoder)
    value, count = empty(fn.extract_output(fn.merge_accumulators([])))
    assert math.isnan(value) and count == 0
    items = gen(rnd)
    one = fn.create_accumulator()
    for x in items:
        one = fn.add_input(one, x)
    parts = [fn.create_accumulator() for _ in range(4)]
    for x in items:
        k = rnd.randrange(4)
        parts[k] = fn.add_input(parts[k], x)
    parts = [strict.decode(strict.encode(a)) for a in parts]  # primitives only, round trip
    merged = fn.merge_accumulators([fn.merge_accumulators(parts[:2]), fn.merge_accumulators(parts[2:])])
    assert json.dumps(fn.extract_output(merged), default=str, sort_keys=True) == \
        json.dumps(fn.extract_output(one), default=str, sort_keys=True)


def _synthetic_log(seed=16, n_requests=400):
    rnd = random.Random(seed)
    imps = []
    for r in range(n_requests):
        system = rnd.choice(["A", "B"])
        user = f"u{rnd.randint(0, 30)}"
        ts = BASE + rnd.randint(0, 2 * DAY - 1)
        camp = rnd.choice(["men", "women"])
        for pos in range(1, rnd.randint(2, 6) + 1):
            clicked = rnd.random() < 0.25 if r % 17 else None  # some requests log no clicks
            imps.append({"event_id": f"{r}/{pos}", "request_id": f"r{r}", "query_id": f"q{r % 7}", "user_id": user,
                         "system_id": system, "item_id": f"i{pos}", "position": pos,
                         "score": None if (r % 23 == 0 and pos == 1) else round(rnd.random(), 2),
                         "clicked": clicked, "timestamp": ts + pos, "propensity": 0.2,
                         "attributes": {"campaign": camp}})
    return imps


def test_online_metrics_transform_matches_direct():
    imps = _synthetic_log()
    metrics = ["auc", "auc_hist", "gauc[user,impressions]", "gauc[user,clicks]", "gauc[query,unweighted]", "ctr",
               "clicks@2", "rr_first_click", "abandonment"]
    got = run_pipeline(lambda p: {"rows": create(p, imps, "Imps")
                                  | OnlineMetrics(metrics, window="1d", slices=["campaign"], hist_bins=20)},
                       counters=True)
    rows = by_key(got["rows"])
    cnt = got["counters"]
    assert cnt["online:no_score"] == sum(1 for r in imps if r["score"] is None)
    assert cnt["online:not_labelled"] == sum(1 for r in imps if r["score"] is not None and r["clicked"] is None)
    assert cnt["online:requests_not_logged"] == len({r["request_id"] for r in imps if r["clicked"] is None})

    def window(ts):
        return ts - ts % DAY

    checked = 0
    for ws in {window(r["timestamp"]) for r in imps}:
        for system in ("A", "B"):
            for sl in ("all", "campaign=men"):
                sel = [r for r in imps if window(r["timestamp"]) == ws and r["system_id"] == system
                       and (sl == "all" or r["attributes"]["campaign"] == "men")]
                lab = [r for r in sel if r["score"] is not None and r["clicked"] is not None]
                s = [r["score"] for r in lab]
                y = [r["clicked"] for r in lab]
                key = lambda m: rows[(ws, sl, system, m)]  # noqa: E731
                assert abs(key("auc")["value"] - roc_auc_score(y, s)) <= 1e-12
                assert key("auc")["num_queries"] == len(lab)
                hb = key("auc_hist:max_error")["value"]
                assert abs(key("auc_hist")["value"] - roc_auc_score(y, s)) <= hb
                for group, wname in (("user", "impressions"), ("user", "clicks"), ("query", "unweighted")):
                    field = om.GAUC_GROUPS[group]
                    ref, used, excl, _, _ = _direct_gauc([r[field] for r in lab], s, y, wname)
                    row = key(f"gauc[{group},{wname}]")
                    assert abs(row["value"] - ref) <= 1e-12 and row["num_queries"] == used
                    assert key(f"gauc[{group}]:excluded_groups")["value"] == excl
                logged = [r for r in sel if r["clicked"] is not None]
                assert key("ctr")["num_queries"] == len(logged)
                assert abs(key("ctr")["value"] - sum(r["clicked"] for r in logged) / len(logged)) <= 1e-15
                checked += 1
    assert checked == 8
    # per-request metrics: the request's window is its earliest impression's
    reqs = defaultdict(list)
    for r in imps:
        reqs[(r["system_id"], r["request_id"])].append(r)
    for (ws, sl, system, metric), row in rows.items():
        if metric not in ("clicks@2", "rr_first_click", "abandonment"):
            continue
        vals = []
        for (sy, _), rs in reqs.items():
            if sy != system or window(min(r["timestamp"] for r in rs)) != ws or all(r["clicked"] is None for r in rs):
                continue
            if sl != "all" and rs[0]["attributes"]["campaign"] != sl.split("=")[1]:
                continue
            clicked = sorted(r["position"] for r in rs if r["clicked"])
            vals.append({"clicks@2": sum(p <= 2 for p in clicked), "rr_first_click": 1 / clicked[0] if clicked else 0,
                         "abandonment": 0 if clicked else 1}[metric])
        assert row["num_queries"] == len(vals) and abs(row["value"] - np.mean(vals)) <= 1e-12
        assert abs(row["stderr"] - np.std(vals, ddof=1) / math.sqrt(len(vals))) <= 1e-12


def test_off_policy_ctr_dead_letters():
    imps = [
        {"event_id": "1", "request_id": "1", "query_id": "", "system_id": "L", "item_id": "a", "position": 1,
         "clicked": True, "timestamp": 0, "propensity": 0.5, "attributes": {}},
        {"event_id": "2", "request_id": "2", "query_id": "", "system_id": "L", "item_id": "a", "position": 1,
         "clicked": False, "timestamp": 0, "propensity": None, "attributes": {}},
        {"event_id": "3", "request_id": "3", "query_id": "", "system_id": "L", "item_id": "zz", "position": 1,
         "clicked": False, "timestamp": 0, "propensity": 0.5, "attributes": {}},
        {"event_id": "4", "request_id": "4", "query_id": "", "system_id": "L", "item_id": "a", "position": 1,
         "clicked": None, "timestamp": 0, "propensity": 0.5, "attributes": {}},
    ]
    target = om.TableTarget({(None, "a", 1): 0.25})

    def build(p):
        ope = OffPolicyCtr(target, "t")
        rows = create(p, imps, "Imps") | ope
        return {"rows": rows, "dead": ope.rejected}

    got = run_pipeline(build, counters=True)
    reasons = sorted(d["reason"] for d in got["dead"])
    assert len(reasons) == 2 and "propensity" in reasons[0] and "'zz'" in reasons[1]
    rows = by_key(got["rows"])
    assert rows[(None, "all", "L", "ips[t]")]["value"] == 0.5 and rows[(None, "all", "L", "ips[t]")]["num_queries"] == 1
    assert got["counters"]["ope:not_logged"] == 1
    with pytest.raises(ValueError):
        OffPolicyCtr(target, "a[b]")


# --------------------------------------------------------------------------------------------
# real data: LETOR (AUC, GAUC, NDCG@10 in one run) and Yandex (CTR by position, first-click RR)

def _letor_files(tmp_path):
    imps, judg = convert.letor_to_records(data_path("letor_lightgbm", "rank.test"),
                                          data_path("letor_lightgbm", "rank.test.query"), feature=253)
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    return imps, judg


def _letor_direct(feature):
    """Per query (labels, feature values) parsed from the raw libsvm file."""
    sizes = [int(x) for x in open(data_path("letor_lightgbm", "rank.test.query")).read().split()]
    labels, scores = [], []
    for line in open(data_path("letor_lightgbm", "rank.test")):
        parts = line.split()
        labels.append(int(float(parts[0])))
        feats = dict(tok.split(":") for tok in parts[1:])
        scores.append(float(feats.get(str(feature), 0.0)))
    out, i = {}, 0
    for q, n in enumerate(sizes, 1):
        out[f"q{q}"] = (np.array(labels[i:i + n]), np.array(scores[i:i + n]))
        i += n
    return out


def test_letor_auc_gauc_ndcg_in_one_run(tmp_path, capsys):
    from streameval.jobs import batch

    imps, judg = _letor_files(tmp_path)
    out = tmp_path / "out"
    rc = batch.main(["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
                          "--metrics", "ndcg@10,auc,gauc[query,impressions],gauc[query,clicks],gauc[query,unweighted]",
                          "--group-rows", "--output", str(out)])
    assert rc == 0
    rows = by_key(json.loads(line) for line in open(out / "metrics.jsonl"))
    direct = _letor_direct(253)
    # per-query AUC (relevant = label >= 1) against scikit-learn on the raw file
    n_single = 0
    for q, (lab, sc) in direct.items():
        rel = lab >= 1
        row = rows[(None, f"query={q}", "feature253", "auc")]
        if 0 < rel.sum() < len(rel):
            assert abs(row["value"] - roc_auc_score(rel, sc)) <= 1e-12
        else:
            n_single += 1
            assert row["value"] is None  # NaN: JSON lines write null (docs/metrics.md, "Outputs")
    allq = [q for q in direct]
    for wname in om.GAUC_WEIGHTINGS:
        ref, used, excl, _, _ = _direct_gauc([q for q in allq for _ in direct[q][0]],
                                             np.concatenate([direct[q][1] for q in allq]),
                                             np.concatenate([direct[q][0] >= 1 for q in allq]), wname)
        row = rows[(None, "all", "feature253", f"gauc[query,{wname}]")]
        assert abs(row["value"] - ref) <= 1e-12 and row["num_queries"] == used
    assert rows[(None, "all", "feature253", "gauc[query]:excluded_groups")]["value"] == n_single == 7
    pooled = roc_auc_score(np.concatenate([direct[q][0] >= 1 for q in allq]),
                           np.concatenate([direct[q][1] for q in allq]))
    assert abs(rows[(None, "all", "feature253", "auc")]["value"] - pooled) <= 1e-12
    # NDCG@10 from the graded labels equals the library on the same data
    qrels = {j["query_id"]: {} for j in judg}
    for j in judg:
        qrels[j["query_id"]][j["item_id"]] = j["grade"]
    run = {}
    for r in imps:
        run.setdefault(r["query_id"], {})[r["item_id"]] = r["score"]
    assert abs(rows[(None, "all", "feature253", "ndcg@10")]["value"] - api.evaluate(qrels, run, "ndcg@10").value()) <= 1e-12
    printed = capsys.readouterr().out
    assert "gauc[query,impressions]" in printed and "ndcg@10" in printed


def test_yandex_ctr_by_position_and_first_click_rr(tmp_path):
    """The first 3000 sessions of trainSample through the converter and OnlineMetrics, against a
    direct parse of the raw text."""
    raw = open(data_path("yandex_wscd_sample", "trainSample"), encoding="utf-8").read()
    sessions = [s.strip() for s in raw.split(";") if s.strip()][:3000]
    (tmp_path / "sample").write_text(";".join(sessions), encoding="utf-8")
    imps = list(convert.yandex_to_impressions(tmp_path / "sample"))
    avro.write_records(tmp_path / "y.avro", "impression", imps)
    from streameval.jobs.batch import ReadAvro

    got = run_pipeline(lambda p: {"rows": p | ReadAvro([str(tmp_path / "y.avro")], "impression")
                                  | OnlineMetrics(["ctr", "rr_first_click", "clicks@3", "abandonment"])})
    rows = by_key(got["rows"])
    pos_clicks = np.zeros(11)
    rr = []
    for s in sessions:
        _, rest = s.split("\t", 1)
        urls, clicks = rest.split(":")
        urls = [u.strip() for u in urls.split(",")]
        cl = {c.strip() for c in clicks.split(",") if c.strip()}
        ps = [i + 1 for i, u in enumerate(urls) if u in cl]
        for p in ps:
            pos_clicks[p] += 1
        rr.append(1 / min(ps) if ps else 0.0)
    n = len(sessions)
    for p in range(1, 11):
        row = rows[(None, "all", "yandex", f"ctr@pos{p}")]
        assert row["num_queries"] == n and abs(row["value"] - pos_clicks[p] / n) <= 1e-15
    row = rows[(None, "all", "yandex", "rr_first_click")]
    assert row["num_queries"] == n and abs(row["value"] - np.mean(rr)) <= 1e-12
    assert abs(row["stderr"] - np.std(rr, ddof=1) / math.sqrt(n)) <= 1e-12
    assert abs(rows[(None, "all", "yandex", "abandonment")]["value"] - np.mean(np.array(rr) == 0)) <= 1e-12


def test_online_metrics_bad_arguments():
    with pytest.raises(MetricNameError):
        OnlineMetrics(["auc", "ndcg@10"])
    with pytest.raises(ValueError):
        OnlineMetrics(["auc"], labels="judgments")
    with pytest.raises(ValueError):
        OnlineMetrics(["auc"], hist_range=(1, 0))
    with pytest.raises(ValueError):
        OnlineMetrics(["auc"], window="soon")


def test_online_rows_carry_intervals():
    """Every online row with a standard error carries its interval (t from that standard error)."""
    from scipy import stats as sst

    imps = []
    for r in range(40):
        for pos in (1, 2, 3):
            imps.append({"event_id": f"e{r}{pos}", "request_id": f"r{r}", "query_id": "q", "system_id": "s",
                         "user_id": f"u{r % 5}", "item_id": f"i{pos}", "position": pos, "score": (r * 7 + pos) % 11 / 10,
                         "clicked": (r + pos) % 4 == 0, "timestamp": 0, "attributes": {}})

    def build(p):
        return {"rows": create(p, imps, "I") | OnlineMetrics(["auc", "abandonment"], ci_level=0.9)}

    rows = {r["metric"]: r for r in run_pipeline(build)["rows"]}
    for m in ("auc", "abandonment"):
        r = rows[m]
        assert r["ci_method"] == "t" and r["ci_level"] == 0.9
        half = sst.t.ppf(0.95, r["num_queries"] - 1) * r["stderr"]
        assert abs(r["ci_low"] - (r["value"] - half)) < 1e-12 and abs(r["ci_high"] - (r["value"] + half)) < 1e-12
