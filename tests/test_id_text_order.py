"""Ids order as their text (trec_eval's strcmp on ``str(id)``) whatever the container and kind of
id, without turning every row into text (issue 38 item 1).

The references are independent of the code under test: Python's own string sort (for the keys),
the same data given with string ids, and the built trec_eval 10 (``trec_eval_bin``) on TREC files
written from it. The collections are made of few scores so that ties, broken by docno descending as
text, decide most rankings."""

from __future__ import annotations

import collections
import subprocess

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streameval as se
from streameval.metrics.kernel import MetricOptions, compute
from streameval.metrics.names import parse_metrics
from streameval.metrics.prepare import factorize, prepare

MEASURES = ["map", "recip_rank", "P_1", "P_3", "ndcg_cut_3", "ndcg", "bpref", "Rprec", "success_1"]
TREC_M = ["map", "recip_rank", "P.1,3", "ndcg_cut.3", "ndcg", "bpref", "Rprec", "success.1"]
Rec = collections.namedtuple("Rec", "query_id doc_id score relevance")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(10**17) + 1, 10**17 - 1), min_size=1, max_size=60), st.booleans())
def test_text_keys_order_as_python_strings(ids, small):
    """TextKeys: keys order as ``str(id)`` sorts (Python's code-point order) and give the ids back."""
    from streameval.metrics.prepare import text_keys

    a = np.array([i % 1000 if small else i for i in ids] + [0, 1, 10, 2], dtype=np.int64)
    tk = text_keys(a)
    k = tk.keys(a)
    assert (tk.ids(k) == a).all()
    assert sorted(a.tolist(), key=str) == a[np.argsort(k, kind="stable")].tolist()
    assert 0 <= int(k.min()) and int(k.max()) < tk.limit < 2**62


def test_factorize_integer_ids_as_text():
    """factorize's vocabulary of integer ids is in text order (it was numeric: 2 before 10)."""
    vocab, (codes,) = factorize(np.array([2, 10, 1000, -1, -10, 0, 25]))
    assert [str(v) for v in vocab] == sorted(["2", "10", "1000", "-1", "-10", "0", "25"])
    assert [str(vocab[c]) for c in codes] == ["2", "10", "1000", "-1", "-10", "0", "25"]


def _collection(seed, qids, docnos):
    """A run (each query ranks every docno, scores among three values: many ties) and qrels."""
    rng = np.random.default_rng(seed)
    run, qrels = [], []
    for q in qids:
        scores = rng.choice([0.25, 0.5, 1.0], size=len(docnos))
        run += [(q, d, float(s)) for d, s in zip(docnos, scores)]
        judged = rng.choice(len(docnos), size=len(docnos) // 2, replace=False)
        qrels += [(q, docnos[i], int(rng.integers(0, 3))) for i in judged]
    return run, qrels


def _forms(run, qrels):
    """The same run and qrels in every container evaluate() takes."""
    def d(rows):
        out: dict = {}
        for q, doc, v in rows:
            out.setdefault(q, {})[doc] = v
        return out

    def cols(rows):
        return [list(c) for c in zip(*rows)]

    rq, rd, rs = cols(run)
    jq, jd, jg = cols(qrels)

    def arr(x):  # a numpy array of the ids' own kind (int64 for ints, object when mixed)
        a = np.asarray(x)
        return a if a.dtype.kind in "iu" else np.asarray(x, dtype=object)

    return {
        "dict": (d(qrels), d(run)),
        "tuple of lists": ((jq, jd, jg), (rq, rd, rs)),
        "tuple of arrays": ((arr(jq), arr(jd), np.array(jg)), (arr(rq), arr(rd), np.array(rs))),
        "DataFrame": (pd.DataFrame({"q_id": pd.Series(jq, dtype=arr(jq).dtype), "doc_id": pd.Series(jd, dtype=arr(jd).dtype),
                                    "rel": jg}),
                      pd.DataFrame({"q_id": pd.Series(rq, dtype=arr(rq).dtype), "doc_id": pd.Series(rd, dtype=arr(rd).dtype),
                                    "score": rs})),
        "records": ([Rec(q, doc, None, g) for q, doc, g in qrels], [Rec(q, doc, s, None) for q, doc, s in run]),
    }


def _as_text(rows):
    return [(str(q), str(doc), v) for q, doc, v in rows]


def _trec_eval(trec_eval_bin, tmp_path, run, qrels):
    """trec_eval 10 -q on files written from the string form: {qid: {measure: value}}, 4 decimals."""
    rp, qp = tmp_path / "run", tmp_path / "qrels"
    rp.write_text("".join(f"{q} Q0 {doc} 0 {s} t\n" for q, doc, s in run))
    qp.write_text("".join(f"{q} 0 {doc} {g}\n" for q, doc, g in qrels))
    args = [trec_eval_bin, "-q"]
    for m in TREC_M:
        args += ["-m", m]
    out = subprocess.run([*args, str(qp), str(rp)], capture_output=True, text=True, check=True).stdout
    res: dict = {}
    for line in out.splitlines():
        name, q, v = line.split()
        if q != "all":
            res.setdefault(q, {})[parse_metrics(name)[0].name] = float(v)  # as evaluate() names it
    return res


INT_IDS = ([2, 10, -1, 1000, 0, 7], [2, 10, -1, -10, 0, 1, 100, 1000, 25, 3, 20, 200])
MIXED_IDS = ([2, 10, "01", 1e3, -1, 1.5], [2, 10, 1e3, "01", -1, 1.5, "1", "-10", 100, 25.0, "b", 0])
NUMBER_IDS = ([2, 10, 1e3, -1, 1.5], [2, 10, 1e3, -1, 1.5, 100, 25.0, 0, 7, 20])  # ints and floats, no str


@pytest.mark.parametrize("ids", [INT_IDS, MIXED_IDS, NUMBER_IDS], ids=["int ids", "mixed ids", "number ids"])
@pytest.mark.parametrize("seed", [1, 2])
def test_every_container_orders_ids_as_text(trec_eval_bin, tmp_path, ids, seed):
    """Per-query values (ties broken by docno descending as text) and the queries' order are those
    of the same data given as strings, and trec_eval 10's on files written from it; for every
    container, integer and mixed ids (``1e3`` is ``"1000.0"``, ``1.5`` is ``"1.5"``, ``"01"`` stays)."""
    run, qrels = _collection(seed, *ids)
    want = se.evaluate(*_forms(_as_text(run), _as_text(qrels))["dict"], MEASURES, per_query=True).per_query
    ref = _trec_eval(trec_eval_bin, tmp_path, _as_text(run), _as_text(qrels))
    assert list(want) == sorted(ref)  # the queries in text order
    for q, row in ref.items():
        for m, v in row.items():
            assert round(want[q][m], 4) == pytest.approx(v, abs=1e-12), (q, m)
    for name, (qr, rn) in _forms(run, qrels).items():
        got = se.evaluate(qr, rn, MEASURES, per_query=True).per_query
        assert list(got) == list(want), name
        assert got == want, name


@pytest.mark.parametrize("fast_path", [True, False])
def test_prepare_orders_integer_docnos_as_text(trec_eval_bin, tmp_path, fast_path):
    """prepare() on integer id arrays, both paths: ties broken by docno descending as text ("2" above
    "10"; it was numeric order), queries in text order, as trec_eval on the same data as strings."""
    run, qrels = _collection(3, *INT_IDS)
    rq, rd, rs = (np.array(c) for c in zip(*run))
    jq, jd, jg = (np.array(c) for c in zip(*qrels))
    prep = prepare(rq, rd, rs, jq, jd, jg, fast_path=fast_path)
    ref = _trec_eval(trec_eval_bin, tmp_path, _as_text(run), _as_text(qrels))
    assert [str(q) for q in prep.qids] == sorted(ref)
    specs = parse_metrics(["map", "recip_rank", "P_1"])
    values = compute(prep.lists, specs, MetricOptions())
    for j, q in enumerate(prep.qids):
        for i, s in enumerate(specs):
            assert round(float(values[i, j]), 4) == pytest.approx(ref[str(q)][s.name], abs=1e-12), (q, s.name)


TEXT_IDS = (["2", "10", "01", "1e3", "-1", "q_b"], ["2", "10", "1000.0", "01", "-1", "1.5", "1", "-10", "b", "B", "0", "d_9"])
UNICODE_IDS = (["2", "é", "10", "z"], ["2", "10", "é1", "e", "ü", "0", "Z", "ß"])  # non-ASCII: the row-by-row path


@pytest.mark.parametrize("ids", [TEXT_IDS, UNICODE_IDS], ids=["ascii", "non-ascii"])
@pytest.mark.parametrize("dtype", ["str", object, "string[pyarrow]", "large_string[pyarrow]"])
def test_dataframe_text_columns_order_as_text(trec_eval_bin, tmp_path, ids, dtype):
    """Text id columns of a DataFrame, as pandas 3 holds them (Arrow strings: ``str``, ``string[pyarrow]``,
    ``large_string[pyarrow]``) or as Python objects: read from Arrow's bytes when ASCII, row by row
    otherwise; per-query values and the queries' order as trec_eval 10 on the same data in files."""
    if dtype == "large_string[pyarrow]":
        import pyarrow as pa

        dtype = pd.ArrowDtype(pa.large_string())
    run, qrels = _collection(3, *ids)
    ref = _trec_eval(trec_eval_bin, tmp_path, run, qrels)

    def frame(rows, value):
        q, d, v = (list(c) for c in zip(*rows))
        return pd.DataFrame({"q_id": pd.Series(q, dtype=dtype), "doc_id": pd.Series(d, dtype=dtype), value: v})

    got = se.evaluate(frame(qrels, "rel"), frame(run, "score"), MEASURES, per_query=True).per_query
    assert list(got) == sorted(ref)  # code-point order: UTF-8 byte order, trec_eval's strcmp
    for q, row in ref.items():
        for m, v in row.items():
            assert round(got[q][m], 4) == pytest.approx(v, abs=1e-12), (q, m)


@pytest.mark.parametrize("dtype", ["str", object])
def test_dataframe_text_id_with_nul_is_refused(dtype):
    """A NUL inside an id (numpy would drop a trailing one: "d1\\x00" read as "d1") is a ValueError."""
    run = pd.DataFrame({"q_id": pd.Series(["1", "1"], dtype=dtype), "doc_id": pd.Series(["d1", "d1\x00"], dtype=dtype),
                        "score": [1.0, 2.0]})
    qrels = pd.DataFrame({"q_id": ["1"], "doc_id": ["d1"], "rel": [1]})
    with pytest.raises(ValueError, match="NUL"):
        se.evaluate(qrels, run, ["map"])
