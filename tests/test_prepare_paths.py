"""The grouped fast path of prepare() gives exactly the general path's result (and the same errors)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streameval.metrics.prepare import prepare


def _collection(seed, str_ids, float_grades):
    rng = np.random.default_rng(seed)
    nq = int(rng.integers(1, 12))
    rq, rd, rs, jq, jd, jg = [], [], [], [], [], []
    for q in rng.permutation(nq + 3):  # some queries only judged, some only retrieved
        n = int(rng.integers(0, 30))
        docs = rng.choice(200, size=n, replace=False)
        if q < nq + 1:
            rq += [q] * n
            rd += list(docs)
            # float32 near-ties and exact ties
            rs += list(np.round(rng.normal(size=n), 1) + rng.choice([0, 1e-9], size=n))
        if q > 0:
            m = int(rng.integers(0, 25))
            jdocs = rng.choice(200, size=m, replace=False)
            jq += [q] * m
            jd += list(jdocs)
            g = rng.integers(-1, 5, size=m).astype(float)
            if float_grades:
                g = g + rng.choice([0, 0.5], size=m)
            jg += list(g)
    conv = (lambda a: np.array([f"d{x}" for x in a], dtype=str)) if str_ids else (lambda a: np.array(a, np.int64))
    convq = (lambda a: np.array([f"q{x}" for x in a], dtype=str)) if str_ids else (lambda a: np.array(a, np.int64))
    # the qrels need not be grouped
    perm = rng.permutation(len(jq))
    return (convq(rq), conv(rd), np.array(rs, float), convq(jq)[perm] if len(jq) else convq(jq),
            conv(jd)[perm] if len(jd) else conv(jd), np.array(jg, float)[perm] if len(jg) else np.array(jg, float))


def fast_and_general(args, kw):
    """(fast path's result, general path's result) of ``prepare(*args, **kw)``; None when the general
    path refuses the input, after checking that the fast path refuses it with the same error."""
    try:
        slow = prepare(*args, fast_path=False, **kw)
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e).split(" ")[0]):
            prepare(*args, **kw)
        return None
    return prepare(*args, **kw), slow


def assert_same_lists(fast, slow):
    """The same queries, in order, with the same ranked grades and judgment histograms."""
    assert list(fast.qids) == list(slow.qids)
    for name in ("offsets", "grades", "judged_offsets", "judged_values", "judged_counts"):
        np.testing.assert_array_equal(getattr(fast.lists, name), getattr(slow.lists, name), err_msg=name)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), str_ids=st.booleans(), float_grades=st.booleans(),
       depth=st.sampled_from([None, 1, 5, 1000]), complete=st.booleans(),
       precision=st.sampled_from(["float32", "float64"]), presorted=st.booleans())
def test_fast_path_equals_general(seed, str_ids, float_grades, depth, complete, precision, presorted):
    args = _collection(seed, str_ids, float_grades)
    if presorted:  # each query's rows by score descending, as run files list them
        rq, rd, rs = args[:3]
        block = np.cumsum(np.concatenate(([True], rq[1:] != rq[:-1]))) if len(rq) else rq
        order = np.lexsort((-rs, block))
        args = (rq[order], rd[order], rs[order], *args[3:])
    both = fast_and_general(args, dict(depth=depth, complete=complete, score_precision=precision))
    if both is None:
        return
    fast, slow = both
    assert_same_lists(fast, slow)
    assert list(fast.unjudged_qids) == list(slow.unjudged_qids)
    assert list(fast.missing_qids) == list(slow.missing_qids)


def test_duplicates_refused_on_both_paths():
    for fast_path in (True, False):
        with pytest.raises(ValueError, match="twice"):
            prepare(["q", "q"], ["a", "a"], [1.0, 0.5], ["q"], ["a"], [1], fast_path=fast_path)
        with pytest.raises(ValueError, match="twice"):
            prepare(["q"], ["a"], [1.0], ["q", "q"], ["a", "a"], [1, 2], fast_path=fast_path)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), wide=st.booleans())
def test_rank_order_packed_key_equals_lexsort(seed, wide):
    """rank_order's one-key sort (codes, float32 score image and positions packed in an int64) gives
    np.lexsort's permutation: -0.0 ties 0.0, infinities and subnormals order as floats, near-ties
    apart in float64 tie in float32; keys too wide to pack fall back to lexsort. float64: the
    float32 order refined by the doubles where they round to one float32, close (0.75 (1 + k 2**-30))
    or far apart (tiny doubles that are all 0 in float32, huge ones all inf)."""
    from streameval.metrics.prepare import rank_order, ranking_scores

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    q = rng.integers(0, 2**40 if wide else 7, n)
    d = rng.integers(0, int(rng.integers(1, 60)), n)
    edge = np.array([0.0, -0.0, 1.5, -2.0, 1e-40, -1e-40, np.inf, -np.inf, 3.0, 3.0 + 1e-9, -3.0, -3.0 - 1e-9,
                     1e-300, 2e-300, -1e-300, 5e-324, 1e300, 2e300, -1e300, *(0.75 * (1 + np.arange(4) * 2.0**-30))])
    s = (rng.choice(edge, n) if seed % 3 == 1 else 0.75 * (1 + rng.integers(0, 6, n) * 2.0**-30) if seed % 3 == 2
         else rng.normal(size=n))
    pos = rng.integers(1, 30, n).astype(float)
    for order, tie_break in (("score", "docno"), ("score", "position"), ("position", "docno")):
        for precision in ("float32", "float64"):
            got = rank_order(q, s, d, pos, order=order, tie_break=tie_break, score_precision=precision)
            neg = -ranking_scores(s, precision)
            want = (np.lexsort((-d, neg, q)) if order == "score" and tie_break == "docno"
                    else np.lexsort((-d, pos, q)) if order == "position" else np.lexsort((-d, pos, neg, q)))
            np.testing.assert_array_equal(got, want)
