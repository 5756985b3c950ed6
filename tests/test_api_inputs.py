"""Issue 21, item 4: ``evaluate()`` takes ranx, ir_measures and ir_datasets objects and ranx-column
DataFrames, gives the dict-of-dicts numbers on each (and ranx's / ir_measures' own numbers where those
libraries are installed, 1e-9), returns an :class:`Evaluation` whatever the number of metrics, and
refuses bad input with one line."""

import collections

import numpy as np
import pytest

import streameval
from streameval.api import Evaluation

METRICS = ["ndcg@10", "map", "P@5", "recip_rank", "recall@10"]
RANX_NAMES = {"ndcg@10": "ndcg@10", "map": "map", "P@5": "precision@5", "recip_rank": "mrr", "recall@10": "recall@10"}

# the shape of ir_datasets' records (TrecQrel, GenericScoredDoc): data sets cannot be downloaded here
TrecQrel = collections.namedtuple("TrecQrel", "query_id doc_id relevance iteration")
GenericScoredDoc = collections.namedtuple("GenericScoredDoc", "query_id doc_id score")


class TinyDataset:
    """An in-memory stand-in for an ir_datasets data set: qrels_iter() / scoreddocs_iter() generators."""

    def __init__(self, qrels, run):
        self.qrels, self.run = qrels, run

    def qrels_iter(self):
        return (TrecQrel(q, d, g, "0") for q, ds in self.qrels.items() for d, g in ds.items())

    def scoreddocs_iter(self):
        return (GenericScoredDoc(q, d, s) for q, ds in self.run.items() for d, s in ds.items())


def _data():
    """Six queries, distinct scores (no ties: ranx orders tied documents its own way), every query judged
    with at least one relevant document retrieved, some judged documents not retrieved."""
    rng = np.random.default_rng(21)
    qrels, run = {}, {}
    for i in range(6):
        q = f"q{i}"
        docs = [f"d{j}" for j in rng.choice(40, 12, replace=False)]
        run[q] = {d: float(s) for d, s in zip(docs, rng.permutation(12) / 8 + 0.25)}
        judged = list(docs[:: 2]) + [f"x{i}", f"y{i}"]
        qrels[q] = {d: int(g) for d, g in zip(judged, rng.integers(0, 3, len(judged)))}
        qrels[q][docs[int(rng.integers(12))]] = 2
    return qrels, run


def _df(d, pd):
    return pd.DataFrame([(q, doc, v) for q, ds in d.items() for doc, v in ds.items()], columns=["q_id", "doc_id", "score"])


@pytest.fixture(scope="module")
def ranx_inputs():
    """ranx's Qrels and Run of _data(), built once: their numba typed dicts take seconds to compile."""
    ranx = pytest.importorskip("ranx", reason="ranx not installed")
    qrels, run = _data()
    return ranx, ranx.Qrels(qrels), ranx.Run(run)


def _forms():
    def ir_measures_records(qrels, run):
        irm = pytest.importorskip("ir_measures", reason="ir_measures not installed")
        return ([irm.Qrel(q, d, g) for q, ds in qrels.items() for d, g in ds.items()],
                [irm.ScoredDoc(q, d, s) for q, ds in run.items() for d, s in ds.items()])

    def ir_datasets_iterators(qrels, run):
        ds = TinyDataset(qrels, run)
        return ds.qrels_iter(), ds.scoreddocs_iter()

    def namedtuple_tuples(qrels, run):  # tuples of records (not to be read as (qid, docno, value) arrays)
        ds = TinyDataset(qrels, run)
        return tuple(ds.qrels_iter()), tuple(ds.scoreddocs_iter())

    def ranx_dataframes(qrels, run):
        pd = pytest.importorskip("pandas", reason="pandas not installed")
        return _df(qrels, pd), _df(run, pd)

    return [ir_measures_records, ir_datasets_iterators, namedtuple_tuples, ranx_dataframes]


@pytest.mark.parametrize("form", _forms(), ids=lambda f: f.__name__)
def test_each_input_shape_gives_the_dict_numbers(form):
    qrels, run = _data()
    want = streameval.evaluate(qrels, run, METRICS, per_query=True)
    got = streameval.evaluate(*form(qrels, run), METRICS, per_query=True)
    assert got.means == want.means and got.per_query == want.per_query and got.num_queries == 6


def test_ranx_objects_give_the_dict_numbers_and_ranx_numbers(ranx_inputs):
    ranx, rqrels, rrun = ranx_inputs
    want = streameval.evaluate(*_data(), METRICS, per_query=True)
    got = streameval.evaluate(rqrels, rrun, METRICS, per_query=True)
    assert got.means == want.means and got.per_query == want.per_query
    ranx_means = ranx.evaluate(rqrels, rrun, list(RANX_NAMES.values()))
    for name, ranx_name in RANX_NAMES.items():
        assert got[name] == pytest.approx(ranx_means[ranx_name], abs=1e-9), name


def test_ir_measures_numbers():
    irm = pytest.importorskip("ir_measures", reason="ir_measures not installed")
    qrels, run = _data()
    ds = TinyDataset(qrels, run)
    want = irm.calc_aggregate([irm.nDCG @ 10, irm.AP, irm.P @ 5, irm.RR, irm.R @ 10], ds.qrels_iter(),
                              ds.scoreddocs_iter())
    got = streameval.evaluate(ds.qrels_iter(), ds.scoreddocs_iter(), METRICS)
    for name, m in zip(METRICS, [irm.nDCG @ 10, irm.AP, irm.P @ 5, irm.RR, irm.R @ 10]):
        assert got[name] == pytest.approx(want[m], abs=1e-9), name


def test_ties_are_ordered_as_trec_eval_whatever_the_input():
    """score descending, then docno descending: 'b' ranks above 'a' (ranx may order them otherwise; a
    ranx Run is read through to_dict(), so it goes the same way as the dict here)."""
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1.0, "b": 1.0}}
    ds = TinyDataset(qrels, run)
    assert streameval.evaluate(ds.qrels_iter(), ds.scoreddocs_iter(), "recip_rank").value() == 0.5
    assert streameval.evaluate(qrels, run, "recip_rank").value() == 0.5


def test_same_result_type_for_one_or_several_metrics():
    qrels, run = _data()
    one, listed, several = (streameval.evaluate(qrels, run, m) for m in ("map", ["map"], ["map", "P_5"]))
    assert all(type(ev) is Evaluation for ev in (one, listed, several))
    assert one.means == listed.means and one.value() == listed.value() == several["map"]
    # issue 42: the name as written is the key; any spelling reads it
    assert several["P_5"] == several["P@5"] == several.means["P_5"] and list(several) == ["map", "P_5"]
    with pytest.raises(ValueError, match="exactly one metric"):
        several.value()
    with pytest.raises(KeyError, match="not evaluated"):
        several["ndcg@10"]
    assert one.per_query is None


def test_per_query_is_a_dict_unless_pandas_is_asked_for():
    qrels, run = _data()
    as_dict = streameval.evaluate(qrels, run, ["map", "P@5"], per_query=True).per_query
    assert streameval.evaluate(qrels, run, ["map", "P@5"], per_query="dict").per_query == as_dict
    assert type(as_dict) is dict and list(as_dict) == sorted(qrels) and set(as_dict["q0"]) == {"map", "P@5"}
    with pytest.raises(ValueError, match="per_query must be one of"):
        streameval.evaluate(qrels, run, "map", per_query="frame")
    pd = pytest.importorskip("pandas", reason="pandas not installed")
    frame = streameval.evaluate(qrels, run, ["map", "P@5"], per_query="pandas").per_query
    assert isinstance(frame, pd.DataFrame) and frame.index.name == "query_id"
    assert frame.to_dict(orient="index") == as_dict


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_bad_inputs_give_one_line_errors():
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1.0}}
    for bad_run, error, match in [
        (42, TypeError, "cannot read a run from int: expected a dict of dicts"),
        ({"q": [("a", 1.0)]}, TypeError, "run dict maps query 'q' to a list"),
        ([("q", "a", 1.0)], TypeError, "run item 0 is a tuple: expected records with query_id, doc_id and score"),
        ([TrecQrel("q", "a", 1, "0")], TypeError, "run item 0 is a TrecQrel: expected records with .* score"),
        ({"q": {"a": "high"}}, ValueError, "run scores must be numbers"),
    ]:
        with pytest.raises(error, match=match) as e:
            streameval.evaluate(qrels, bad_run, "map")
        _one_line(e)
    with pytest.raises(TypeError, match="qrels item 0 is a GenericScoredDoc: .* relevance") as e:
        streameval.evaluate([GenericScoredDoc("q", "a", 1.0)], run, "map")
    _one_line(e)
    pd = pytest.importorskip("pandas", reason="pandas not installed")
    with pytest.raises(ValueError, match="run DataFrame has no query id column") as e:
        streameval.evaluate(qrels, pd.DataFrame({"query": ["q"], "doc_id": ["a"], "score": [1.0]}), "map")
    _one_line(e)
    with pytest.raises(ValueError, match="qrels DataFrame has no grade column") as e:
        streameval.evaluate(pd.DataFrame({"q_id": ["q"], "doc_id": ["a"]}), run, "map")
    _one_line(e)


def test_dataframes_with_arrow_string_ids_give_the_numbers_and_ids_of_str_arrays():
    """A DataFrame's Arrow string columns are read as numpy bytes inside evaluate() (no widening to
    str): the means and per-query numbers equal those of the same ids as numpy str arrays, the
    per-query ids are str, a mix with str ids (a dict of qrels) gives the same, and an error names
    an id as its text."""
    pd = pytest.importorskip("pandas")
    pa = pytest.importorskip("pyarrow")
    rng = np.random.default_rng(4)
    n_q, n_d = 40, 30
    rq = np.repeat([f"q{i}" for i in range(n_q)], n_d)
    rd = np.array([f"d{int(x)}" for x in rng.integers(0, 10**6, n_q * n_d)])
    rd = np.char.add(rd, np.tile(np.array([f"-{j}" for j in range(n_d)]), n_q))  # unique per query
    rs = rng.random(n_q * n_d).round(2)  # ties among the scores: broken by docno, as trec_eval
    pick = rng.random(n_q * n_d) < 0.4
    jq, jd, jg = rq[pick], rd[pick], rng.integers(0, 4, int(pick.sum())).astype(float)
    metrics = ["map", "ndcg@10", "P@5", "recip_rank"]
    want = streameval.evaluate((jq, jd, jg), (rq, rd, rs), metrics, per_query=True)
    arrow = pd.ArrowDtype(pa.string())
    run = pd.DataFrame({"query_id": pd.array(rq, dtype=arrow), "doc_id": pd.array(rd, dtype=arrow), "score": rs})
    qrels = pd.DataFrame({"query_id": pd.array(jq, dtype=arrow), "doc_id": pd.array(jd, dtype=arrow),
                          "relevance": jg})
    got = streameval.evaluate(qrels, run, metrics, per_query=True)
    assert dict(got.means) == dict(want.means)
    assert got.per_query == want.per_query and all(type(q) is str for q in got.per_query)
    as_dict: dict = {}
    for q, d, g in zip(jq.tolist(), jd.tolist(), jg.tolist()):
        as_dict.setdefault(q, {})[d] = int(g)
    assert dict(streameval.evaluate(as_dict, run, metrics).means) == dict(want.means)
    # the repeat inside the query's rows (the grouped path) and after another query's (the general one)
    for twice in (pd.concat([run.iloc[:1], run], ignore_index=True), pd.concat([run, run.iloc[:1]], ignore_index=True)):
        with pytest.raises(ValueError, match=f"run ranks docno '{rd[0]}' twice for query 'q0'"):
            streameval.evaluate(qrels, twice, metrics)
