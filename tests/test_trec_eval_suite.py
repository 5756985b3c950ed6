"""trec_eval's own test suite (../shared/data/trec_eval_test): our `streameval trec-eval` output
must equal trec_eval 10.0's printed output, line for line, for every implemented measure."""

import io

import pytest

from streameval.cli import trec_eval_main
from streameval.metrics.names import ALL_TREC

from .conftest import data_path

IMPLEMENTED = {s.trec_name for s in ALL_TREC} | {"num_q", "runid"}


def _parse(text):
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, qid, value = line.split("\t")
        out[(name.strip(), qid)] = value.strip()
    return out


def _run(args):
    buf = io.StringIO()
    assert trec_eval_main(args, out=buf) == 0
    return _parse(buf.getvalue())


def _is_ours(name):
    if name in IMPLEMENTED:
        return True
    for prefix in ("P_", "recall_", "ndcg_cut_", "map_cut_", "success_"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return False


CASES = [
    ("out.test", ["qrels.test", "results.test"]),
    ("out.test.a", ["-m", "all_trec", "qrels.test", "results.test"]),
    ("out.test.aq", ["-m", "all_trec", "-q", "qrels.test", "results.test"]),
    ("out.test.aqc", ["-m", "all_trec", "-q", "-c", "qrels.test", "results.trunc"]),
    ("out.test.aql", ["-m", "all_trec", "-q", "-l2", "qrels.rel_level", "results.test"]),
    ("out.test.meas_params", ["-q", "-m", "P.5,7,3", "-m", "recall.20,2000", "-mndcg_cut.10,20,23.4",
                              "-msuccess.2,5,20", "qrels.test", "results.test"]),
]


@pytest.mark.parametrize("expected_file,args", CASES, ids=[c[0] for c in CASES])
def test_matches_trec_eval(expected_file, args):
    expected = _parse(data_path("trec_eval_test", expected_file).read_text())
    args = [str(data_path("trec_eval_test", a)) if a.startswith(("qrels", "results")) else a for a in args]
    got = _run(args)
    wanted = {k: v for k, v in expected.items() if _is_ours(k[0])}
    # every value we print is trec_eval's, and we print every implemented measure trec_eval printed
    assert {k: got.get(k) for k in wanted} == wanted
    extra = set(got) - set(expected)
    assert not extra, f"printed measures trec_eval did not: {sorted(extra)[:5]}"
    assert len(wanted) >= 10


def test_complete_scores_missing_query_zero():
    """-c: topic 302 has judgments but no results in results.trunc; it is printed with zeros."""
    got = _run(["-m", "num_q", "-m", "map", "-m", "P.5", "-q", "-c", str(data_path("trec_eval_test", "qrels.test")),
                str(data_path("trec_eval_test", "results.trunc"))])
    assert got[("map", "302")] == "0.0000"
    assert got[("num_q", "all")] == "3"
    got = _run(["-m", "num_q", "-m", "map", "-q", str(data_path("trec_eval_test", "qrels.test")),
                str(data_path("trec_eval_test", "results.trunc"))])
    assert ("map", "302") not in got
    assert got[("num_q", "all")] == "2"
