"""The memory- and speed-minded paths give the same numbers, bit for bit, as the plain ones:
prepare's grouped path laid out in chunks, compute() in chunks of queries, and the AUC / group
AUC by sorted search (including scores that share a shortened code) against direct counting."""

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from streameval.metrics import grouped, kernel
from streameval.metrics import online as om
from streameval.metrics import online_auc
from streameval.metrics.kernel import MetricOptions, RankedLists, compute
from streameval.metrics.names import parse_metrics
from streameval.metrics.prepare import prepare
from tests.test_prepare_paths import _collection, assert_same_lists, fast_and_general

SPECS = parse_metrics(["ndcg@10", "ndcg", "map", "map@5", "mrr@10", "recip_rank", "P@5", "recall@100", "bpref",
                       "Rprec", "err@5", "num_rel_ret", "success@1", "dcg@3"])


@pytest.mark.parametrize("chunk", [1, 7, 40])
def test_chunked_grouped_prepare_equals_general_path(monkeypatch, chunk):
    monkeypatch.setattr(grouped, "CHUNK_ROWS", chunk)
    for seed in range(40):
        args = _collection(seed, seed % 2 == 0, seed % 3 == 0)
        kw = dict(depth=[None, 1, 5][seed % 3], complete=seed % 4 == 0,
                  score_precision=["float32", "float64"][seed % 2])
        both = fast_and_general(args, kw)
        if both is not None:
            assert_same_lists(*both)


def test_grouped_prepare_queries_out_of_order_and_unjudged_blocks(monkeypatch):
    monkeypatch.setattr(grouped, "CHUNK_ROWS", 5)
    rng = np.random.default_rng(5)
    order = rng.permutation(30)
    rq = np.repeat(order, 4)
    rd = rng.permutation(1000)[: len(rq)]
    rs = rng.normal(size=len(rq)).round(1)  # ties
    jq = np.repeat(np.arange(0, 30, 2), 3)  # odd queries unjudged: their blocks are skipped
    jd = rd[np.isin(rq, jq)][: len(jq)]
    jq = rq[np.isin(rq, jq)][: len(jq)]
    jg = rng.integers(0, 3, size=len(jq))
    fast, slow = prepare(rq, rd, rs, jq, jd, jg), prepare(rq, rd, rs, jq, jd, jg, fast_path=False)
    np.testing.assert_array_equal(fast.lists.grades, slow.lists.grades)
    np.testing.assert_array_equal(fast.lists.offsets, slow.lists.offsets)


def test_duplicate_found_in_a_later_chunk(monkeypatch):
    monkeypatch.setattr(grouped, "CHUNK_ROWS", 2)
    rq = [1, 1, 2, 2, 3, 3, 3]
    rd = ["a", "b", "a", "b", "c", "d", "c"]
    with pytest.raises(ValueError, match="run ranks docno 'c' twice for query '3'"):
        prepare(rq, rd, [3.0, 2, 1, 0, 5, 4, 3], [1, 2, 3], ["a", "a", "c"], [1, 1, 1])


def _random_lists(rng, n):
    lengths = rng.integers(0, 30, size=n)
    ranked = [[None if rng.random() < 0.3 else float(rng.integers(-1, 5)) for _ in range(k)] for k in lengths]
    judged = [list(rng.integers(-1, 5, size=rng.integers(0, 40)).astype(float)) for _ in range(n)]
    return RankedLists.from_lists(ranked, judged)


@pytest.mark.parametrize("chunk", [1, 13, 100])
def test_chunked_compute_is_bit_identical(monkeypatch, chunk):
    rng = np.random.default_rng(chunk)
    lists = _random_lists(rng, 300)
    default = kernel.CHUNK_ITEMS
    for opts in (MetricOptions(), MetricOptions(gain="exponential", ideal="served", relevance_level=2)):
        whole = compute(lists, SPECS, opts)
        monkeypatch.setattr(kernel, "CHUNK_ITEMS", chunk)
        parts = compute(lists, SPECS, opts)
        monkeypatch.setattr(kernel, "CHUNK_ITEMS", default)
        assert whole.tobytes() == parts.tobytes()


def test_chunked_compute_raises_the_whole_batch_error(monkeypatch):
    lists = RankedLists.from_lists([[1, 2], [3, 9], [1], [7, 1]], [[1, 2], [3, 9], [1], [7]])
    spec = parse_metrics(["err@2"])
    with pytest.raises(ValueError) as whole:
        compute(lists, spec)
    monkeypatch.setattr(kernel, "CHUNK_ITEMS", 1)
    with pytest.raises(ValueError) as parts:
        compute(lists, spec)
    assert str(parts.value) == str(whole.value) and "grade 9 " in str(whole.value)


def _direct_group_counts(g, s, y):
    """(ids, u2, n_pos, n_neg) by counting pairs group by group."""
    out = {}
    for k in np.unique(g):
        m = g == k
        p, q = s[m & y], s[m & ~y]
        u2 = int(2 * (p[:, None] > q[None, :]).sum() + (p[:, None] == q[None, :]).sum())
        out[k] = (u2, len(p), len(q))
    return out


@pytest.mark.parametrize("kind", ["uniform", "ties", "signs", "shared_codes", "strings"])
def test_group_auc_equals_pair_counting(kind):
    rng = np.random.default_rng(len(kind))
    n = 3000
    y = rng.random(n) < 0.4
    g = rng.integers(0, 80, size=n)
    if kind == "uniform":
        s = rng.random(n)
    elif kind == "ties":
        s = rng.integers(0, 5, size=n).astype(float)
    elif kind == "signs":
        s = rng.choice([-0.0, 0.0, -1.5, 2.5, -1e300, 1e300, 5e-324], size=n)
    elif kind == "shared_codes":  # a wide range plus scores a few ulps apart: the code is shortened
        s = 0.5 + rng.integers(0, 64, size=n) * np.spacing(0.5)
        s[:2] = [1e-300, 1e300]
    else:
        s = rng.random(n).round(2)
        g = np.array([f"user{k}" for k in g])
    ids, auc, n_pos, n_neg = om.group_auc(g, s, y)
    direct = _direct_group_counts(g, s, y)
    assert list(ids) == sorted(direct)
    for i, k in enumerate(ids):
        u2, p, q = direct[k]
        assert (n_pos[i], n_neg[i]) == (p, q)
        if p and q:
            assert auc[i] == u2 / (2 * p * q)
        else:
            assert math.isnan(auc[i])
    total = _direct_group_counts(np.zeros(n, int), s, y)[0]
    assert om.auc_score(s, y) == total[0] / (2 * total[1] * total[2])
    assert abs(om.auc_score(s, y) - roc_auc_score(y, s)) <= 1e-12


def test_group_codes_equal_unique():
    rng = np.random.default_rng(2)
    for ids in (rng.integers(0, 50, 500), rng.integers(10**12, 10**12 + 40, 500).astype(np.uint64),
                rng.integers(-20, 20, 500).astype(np.int8), np.arange(7), rng.integers(0, 2**40, 300)):
        gids, codes = online_auc._group_codes(ids)
        ref_ids, ref_codes = np.unique(ids, return_inverse=True)
        assert gids.dtype == ref_ids.dtype
        np.testing.assert_array_equal(gids, ref_ids)
        np.testing.assert_array_equal(codes, ref_codes)


def test_ascii_codes_order_as_the_strings():
    rng = np.random.default_rng(9)
    alphabet = np.array(list("ab-Z09"))
    words = ["".join(rng.choice(alphabet, size=rng.integers(0, 7))) for _ in range(400)]
    a, b = np.array(words[:250]), np.array(words[250:] + ["", "a", "aa", "a-"], dtype="U9")
    ca, cb = grouped._ascii_codes(a, b)
    allw, allc = np.concatenate((a, b)), np.concatenate((ca, cb))
    vocab, codes = np.unique(allw, return_inverse=True)
    # equal strings, equal codes; order of the codes = order of the strings
    assert len(np.unique(allc)) == len(vocab)
    np.testing.assert_array_equal(np.unique(allc, return_inverse=True)[1].ravel(), codes.ravel())
    assert grouped._ascii_codes(np.array(["é", "a"]), np.array(["b"])) is None
    hexes = np.array(["".join(rng.choice(list("0123456789abcdef"), size=20)) for _ in range(200)])
    assert grouped._ascii_codes(hexes) is None  # 20 positions x 4 bits and more: > 62 bits


def test_errors_name_string_ids_on_both_paths():
    for fast_path in (True, False):
        with pytest.raises(ValueError, match="qrels judge docno 'zz' twice for query 'q'"):
            prepare(["q"], ["a"], [1.0], ["q", "q"], ["zz", "zz"], [1, 2], fast_path=fast_path)
        with pytest.raises(ValueError, match="run ranks docno 'b' twice for query 'q'"):
            prepare(["q", "q", "q"], ["b", "a", "b"], [1.0, 2, 3], ["q"], ["a"], [1], fast_path=fast_path)


def _segsum_reference(lists, opts, family, k):
    """The kernel's per-query sums written as one np.bincount over every ranked item (its
    definitions before the running counts and row sums), for bit-for-bit comparison."""
    b = kernel._Batch(lists, opts)
    if family in ("P", "recall", "success", "num_rel_ret"):
        top = b.rel if k is None else b.rel & b.top(k)
        c = b.segsum(top)
        return {"P": c / float(k or 1), "recall": b.per_rel(c), "success": (c > 0).astype(np.float64),
                "num_rel_ret": c}[family]
    if family == "Rprec":
        return b.per_rel(b.segsum(b.rel & (b.rank <= b.num_rel[b.qidx])))
    if family == "recip_rank":
        first = b.rel & (b.cum_rel == 1)
        if k is not None:
            first &= b.top(k)
        return b.segsum(np.where(first, 1.0 / b.rank, 0.0))
    if family == "map":
        sel = b.rel if k is None else b.rel & b.top(k)
        return b.per_rel(b.segsum(np.where(sel, b.cum_rel / b.rank, 0.0)))
    if family == "dcg":
        return b.segsum(b.discounted_gain if k is None else np.where(b.top(k), b.discounted_gain, 0.0))
    raise AssertionError(family)


@pytest.mark.parametrize("layout", ["varied", "skewed", "uniform"])
def test_running_counts_and_row_sums_equal_one_bincount(layout):
    """count_top (running counts at each query's k-th item) and sum_top (running sums along the rows
    of a queries x longest matrix, made as far as the largest cutoff asked so far and extended for a
    larger one; np.bincount when that matrix would be too large: ``skewed``, one long list among
    short ones; a view of the items when every list has the same length: ``uniform``) give the bits
    of one np.bincount over the items."""
    skewed = layout == "skewed"
    specs = parse_metrics(["P@1", "P@3", "P@20", "recall@2", "recall@50", "success@1", "success@4", "num_rel_ret",
                           "Rprec", "recip_rank", "mrr@2", "mrr@7", "map", "map@3", "map@2", "dcg", "dcg@1",
                           "dcg@5", "dcg@3", "dcg@30"])
    rng = np.random.default_rng(11)
    for trial in range(30):
        n = int(rng.integers(20 if skewed else 1, 40))
        lengths = rng.integers(0, 12, n) if layout != "uniform" else np.full(n, int(rng.integers(1, 12)))
        if skewed:
            lengths[0] = 400
        off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        grades = rng.choice([np.nan, -1.0, 0.0, 1.0, 2.0, 3.0], size=int(off[-1]))
        jl = rng.integers(0, 4, n)
        joff = np.concatenate(([0], np.cumsum(jl))).astype(np.int64)
        hv = np.concatenate([np.sort(rng.choice([3.0, 2.0, 1.0, 0.0, -1.0], size=m, replace=False))[::-1]
                             for m in jl]) if joff[-1] else np.zeros(0)
        hc = rng.integers(1, 30, int(joff[-1])).astype(np.int64)
        lists = RankedLists(offsets=off, grades=grades, judged_offsets=joff, judged_values=hv, judged_counts=hc)
        opts = MetricOptions(gain="exponential" if trial % 2 else "linear", relevance_level=1 + trial % 2)
        b = kernel._Batch(lists, opts)
        matrix = b.N and b.n * int(b.lengths.max()) <= 4 * b.N + 1024
        assert bool(matrix) == (not skewed and b.N > 0)
        got = compute(lists, specs, opts)
        for i, spec in enumerate(specs):
            want = _segsum_reference(lists, opts, spec.family, spec.k)
            assert got[i].tobytes() == want.tobytes(), (trial, spec.name)


@pytest.mark.parametrize("chunk", [None, 9])
def test_shared_judgment_histograms_equal_one_per_list(monkeypatch, chunk):
    """RankedLists(judged_index=...): lists that point at a shared judgment histogram (the requests of
    one query) score as when each list carries its own copy, bit for bit, for every metric, both
    ideals and both ideal-DCG paths (running sums per histogram; per cutoff when one histogram is
    much longer than the rest), and in chunks of lists."""
    if chunk:
        monkeypatch.setattr(kernel, "CHUNK_ITEMS", chunk)
    specs = parse_metrics(["ndcg", "ndcg@3", "ndcg@20", "map", "Rprec", "bpref", "recall@5", "num_rel", "P@2", "err@4"])
    rng = np.random.default_rng(8)
    for trial in range(20):
        nh = int(rng.integers(1, 12))
        hists = [list(rng.integers(-1, 4, size=int(rng.integers(0, 8))).astype(float)) for _ in range(nh)]
        if trial % 3 == 0:
            hists[0] = list(rng.integers(1, 4, size=300).astype(float))  # one long: per-cutoff path
        gidx = rng.integers(0, nh, int(rng.integers(1, 30)))
        ranked = [[None if rng.random() < 0.3 else float(rng.integers(-1, 4)) for _ in range(int(rng.integers(0, 7)))]
                  for _ in gidx]
        own = RankedLists.from_lists(ranked, [hists[g] for g in gidx.tolist()])
        per = RankedLists.from_lists([[]] * nh, hists)
        shared = RankedLists(own.offsets, own.grades, per.judged_offsets, per.judged_values, per.judged_counts,
                             judged_index=gidx)
        for opts in (MetricOptions(), MetricOptions(gain="exponential", ideal="served", relevance_level=2)):
            assert compute(shared, specs, opts).tobytes() == compute(own, specs, opts).tobytes(), trial


def test_run_length_blocks_of_text_ids_equal_comparing_the_strings():
    """grouped._differs compares ``str`` and ``bytes`` ids as words of their storage: the same
    answer as comparing the strings, for widths that take 32- and 64-bit words, a prefix of another
    id, empty ids and more than 8 words (compared as strings)."""
    from streameval.metrics.grouped import _differs

    rng = np.random.default_rng(3)
    for width in (1, 2, 3, 5, 8, 9, 16, 17, 40):
        pool = np.array(["".join(rng.choice(list("ab\u00e9"), size=int(rng.integers(0, width + 1))))
                         for _ in range(6)] + ["a" * width, "a" * max(width - 1, 0), ""])
        ids = np.sort(rng.choice(pool, size=200))
        for arr in (ids, np.char.encode(ids, "utf-8")):
            assert _differs(arr).tolist() == [bool(x != y) for x, y in zip(arr[1:].tolist(), arr[:-1].tolist())]


def test_queries_out_of_text_order_in_the_middle_of_the_run():
    """prepare's chunks take the run's query blocks in the output's (text) order: a run listing
    q1, q3, q2, q4 has its first and last blocks in place and the middle two swapped; each query
    must keep its own rows (a check that looked only at the first block's start and the last one's
    end took the four as one slice of the run, and gave q2 the rows of q3)."""
    rq = np.repeat([1, 3, 2, 4], [2, 3, 2, 2])
    rd = np.array([10, 11, 30, 31, 32, 20, 21, 40, 41])
    rs = np.array([2.0, 1.0, 3.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0])
    jq, jd, jg = np.array([1, 2, 3, 4]), np.array([11, 20, 32, 40]), np.array([1.0, 2.0, 3.0, 4.0])
    fast = prepare(rq, rd, rs, jq, jd, jg)
    assert list(fast.qids) == [1, 2, 3, 4]
    want = [[np.nan, 1.0], [2.0, np.nan], [np.nan, np.nan, 3.0], [4.0, np.nan]]  # by hand, rank order
    np.testing.assert_array_equal(fast.lists.grades, np.concatenate(want))
    np.testing.assert_array_equal(fast.lists.offsets, [0, 2, 4, 7, 9])
    assert_same_lists(fast, prepare(rq, rd, rs, jq, jd, jg, fast_path=False))


def test_smallest_value_of_each_request_equals_pythons_min():
    """The columnar clean stage's request query and attributes (``_first_min``, vectorised) against
    Python's ``min`` over each request's non-null values, the first of equal ones; null when a request
    has none. Runs of one value, mixed runs, unicode beyond ASCII and the byte order of UTF-8."""
    import pyarrow as pa

    from streameval.beam.columnar_clean import _first_min

    rng = np.random.default_rng(11)
    words = ["b", "a", "ab", "B", "é", "z", "Ω", "a\u0301", "10", "9", "", "\U0001f600", None]
    for trial in range(200):
        lengths = rng.integers(1, 6, size=int(rng.integers(1, 40)))
        if trial % 3 == 0:  # long runs of one value (the coder's run-length path)
            vals = [w for n in lengths for w in [words[int(rng.integers(len(words)))]] * int(n) * 20]
            lengths = lengths * 20
        else:
            vals = [words[int(i)] for i in rng.integers(len(words), size=int(lengths.sum()))]
        ends = np.cumsum(lengths).astype(np.int64)
        starts = ends - lengths
        got = _first_min(pa.array(vals, type=pa.string()), starts, ends).to_pylist()
        want = []
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            present = [v for v in vals[lo:hi] if v is not None]
            want.append(min(present) if present else None)
        assert got == want
