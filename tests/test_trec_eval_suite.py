"""trec_eval's own test suite (../shared/data/trec_eval_test): our `streameval trec-eval` output
must equal trec_eval 10.0's printed output, line for line, for every implemented measure; and
trec_eval built from its C source (tests/data/trec_eval_src) on random small collections."""

import io
import random
import subprocess

import pytest

from streameval.cli import trec_eval_main
from streameval.metrics.names import ALL_TREC, MetricNameError, parse_metrics

from .conftest import data_path

IMPLEMENTED = {s.trec_name for s in ALL_TREC} | {"num_q", "runid", "relstring", "dcg", "ideal_dcg"}
# measures printed with trec_eval's parameters: long cutoffs, double cutoffs, parameter strings
_CUT_PREFIXES = ("P_", "recall_", "ndcg_cut_", "map_cut_", "success_", "relative_P_", "unj_")
_PARAM_PREFIXES = ("ndcg_1=", "iprec_at_recall_", "Rprec_mult_", "utility_", "11pt_avg_", "set_F_", "rbp_p=",
                   "rbp_resid_p=", "relstring_", "ideal_dcg_")


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
    for prefix in _CUT_PREFIXES:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return True
    return name.startswith(_PARAM_PREFIXES)


def _our_lines(text):
    """The lines of trec_eval's output whose measure we implement, as printed (bytes and order)."""
    return [line for line in text.splitlines() if line.strip() and _is_ours(line.split("\t")[0].strip())]


CASES = [
    ("out.test", ["qrels.test", "results.test"]),
    ("out.test.a", ["-m", "all_trec", "qrels.test", "results.test"]),
    ("out.test.aq", ["-m", "all_trec", "-q", "qrels.test", "results.test"]),
    ("out.test.aqc", ["-m", "all_trec", "-q", "-c", "qrels.test", "results.trunc"]),
    ("out.test.aql", ["-m", "all_trec", "-mrelstring.20", "-q", "-l2", "qrels.rel_level", "results.test"]),
    # trec_eval's command (ndcg with gains per level too: -mndcg.1=3,2=9,4=4.5)
    ("out.test.meas_params", ["-q", "-miprec_at_recall..10,.20,.25,.75,.50", "-m", "P.5,7,3", "-m", "recall.20,2000",
                              "-m", "Rprec_mult.5.0,0.2,0.35", "-mutility.2,-1,0,0", "-m", "11pt_avg..25,.5,.75",
                              "-mndcg.1=3,2=9,4=4.5", "-mndcg_cut.10,20,23.4", "-msuccess.2,5,20", "qrels.test", "results.test"]),
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


@pytest.mark.parametrize("expected_file,args", CASES, ids=[c[0] for c in CASES])
def test_lines_are_trec_evals(expected_file, args):
    """Byte for byte and in trec_eval's order: every line we print is the line trec_eval printed for
    that measure (name padding, query, value format), and no implemented line is missing."""
    expected = _our_lines(data_path("trec_eval_test", expected_file).read_text())
    args = [str(data_path("trec_eval_test", a)) if a.startswith(("qrels", "results")) else a for a in args]
    buf = io.StringIO()
    assert trec_eval_main(args, out=buf) == 0
    assert buf.getvalue().splitlines() == expected


@pytest.mark.parametrize("expected_file,args", CASES, ids=[c[0] for c in CASES])
def test_whole_output_is_trec_evals(expected_file, args):
    """trec_eval's Makefile commands (quicktest) print every line of its expected output, relstring's
    included: out.test.aq's 387 lines, out.test.aql's relstring_20, meas_params' ndcg_1=3,2=9,4=4.5
    (the whole quicktest, prefs and judgment groups too: test_trec_eval_quicktest.py)."""
    expected = data_path("trec_eval_test", expected_file).read_text()
    args = [str(data_path("trec_eval_test", a)) if a.startswith(("qrels", "results")) else a for a in args]
    buf = io.StringIO()
    assert trec_eval_main(args, out=buf) == 0
    assert buf.getvalue() == expected
    if expected_file == "out.test.aq":
        assert len(expected.splitlines()) == 387


def test_default_output_is_trec_evals_whole():
    """No -m: all 30 lines of trec_eval's default output (runid, num_q, gm_map, iprec_at_recall_*)."""
    buf = io.StringIO()
    d = data_path("trec_eval_test", "qrels.test").parent
    assert trec_eval_main([str(d / "qrels.test"), str(d / "results.test")], out=buf) == 0
    assert buf.getvalue() == (d / "out.test").read_text()


@pytest.mark.parametrize("measures", [["num_q"], ["runid"], ["runid", "num_q"], ["num_q", "gm_map"]])
def test_header_measures_alone(measures):
    d = data_path("trec_eval_test", "qrels.test").parent
    expected = [line for line in (d / "out.test").read_text().splitlines() if line.split()[0] in measures]
    buf = io.StringIO()
    args = [a for m in measures for a in ("-m", m)]
    assert trec_eval_main([*args, "-q", str(d / "qrels.test"), str(d / "results.test")], out=buf) == 0
    assert buf.getvalue().splitlines() == expected


def test_geometric_means_are_refused_by_the_beam_jobs():
    """gm_map / gm_bpref are geometric means: api.evaluate computes them; the Beam jobs (which merge
    arithmetic means) refuse them in one line, and all_trec leaves them out there."""
    from streameval.api import evaluate
    from streameval.io import trec

    d = data_path("trec_eval_test", "qrels.test").parent
    qrels, run = trec.read_qrels(d / "qrels.test"), trec.read_run(d / "results.test")
    got = evaluate(qrels, run, ["gm_map", "gm_bpref", "map"])
    assert ("%.4f" % got["gm_map"], "%.4f" % got["gm_bpref"]) == ("0.1051", "0.0083")
    assert got["gm_map"] < got["map"]
    with pytest.raises(MetricNameError, match="gm_map: a geometric mean"):
        parse_metrics(["map", "gm_map"], arithmetic="the Beam jobs")
    beam = parse_metrics(["all_trec"], arithmetic="the Beam jobs")
    assert {s.family for s in beam}.isdisjoint({"gm_map", "gm_bpref"})
    assert len(beam) == len(ALL_TREC) - 2


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


# ---- trec_eval built from its C source, on random small collections --------------------------------

# trec_eval_bin: conftest.py builds trec_eval from TREC_EVAL_SRC once a session


def _random_collection(d, seed):
    """Qrels (grades 0-3, some -1: pooled but unjudged; one query all non-relevant), a run (ties in
    score, documents outside the qrels, lists of 1 to 66 documents) and the run without query 105
    (for -c; trec_eval 10 stops on a judged query without results otherwise)."""
    rnd = random.Random(seed)
    qrels, run = [], []
    for q in range(1, 9):
        qid = f"{100 + q}"
        docs = [f"d{q}-{i:03d}" for i in range(rnd.randint(5, 80))]
        judged = rnd.sample(docs, rnd.randint(1, len(docs)))
        for i, doc in enumerate(judged):
            grade = 0 if q == 3 else rnd.choice([0, 0, 0, 1, 1, 2, 3, -1])
            qrels.append(f"{qid} 0 {doc} {grade if i else max(grade, 0)}")
        ranked = rnd.sample(docs, rnd.randint(1, min(len(docs), 60)))
        ranked += [f"x{q}-{i}" for i in range(rnd.randint(0, 6))]
        for i, doc in enumerate(ranked):
            run.append(f"{qid} Q0 {doc} {i + 1} {rnd.choice([1, 2, 2.5, 3, 4.25, 5]) if q == 2 else 100 - i} tag{seed}")
    (d / "qrels").write_text("\n".join(qrels) + "\n")
    (d / "run").write_text("\n".join(run) + "\n")
    (d / "run_c").write_text("\n".join(x for x in run if not x.startswith("105 ")) + "\n")
    return str(d / "qrels"), str(d / "run"), str(d / "run_c")


ORACLE_ARGS = [
    ["-q", "-m", "all_trec"],
    ["-q", "-c", "-l2", "-m", "all_trec"],
    ["-q", "-m", "iprec_at_recall.0.15,0.33,0.5", "-m", "Rprec_mult.0.5,3", "-m", "relative_P.3,7", "-m", "unj.2,9",
     "-m", "rbp.p=0.7", "-m", "rbp_resid.p=0.5", "-m", "set_F.0.5", "-m", "utility.3,-2,1,0.5",
     "-m", "11pt_avg.0.2,0.5,0.8", "-m", "num_q", "-m", "gm_map"],
    # trec_eval 10's ideal_dcg (not in all_trec), default gains and rel_level=gain pairs, with -c; dcg,
    # ideal_dcg and ndcg share one parameter set in trec_eval (m_ndcg.c's default_ndcg_gains): the
    # binary crashes when one of them with parameters is asked with another, so never together here
    ["-q", "-c", "-m", "ideal_dcg", "-m", "dcg", "-m", "ndcg", "-m", "P.5"],
    ["-q", "-c", "-m", "ideal_dcg.0=1,2=5,3=0.5", "-m", "map", "-m", "P.5", "-m", "G"],
    ["-q", "-m", "ideal_dcg.1=3,2=9,-1=4", "-m", "map", "-m", "P.5", "-m", "Rndcg"],
]


@pytest.mark.parametrize("seed", [11, 12])
def test_random_collections_match_built_trec_eval(trec_eval_bin, tmp_path, seed):
    qrels, run_all, run_c = _random_collection(tmp_path, seed)
    for args in ORACLE_ARGS:
        run = run_c if "-c" in args else run_all
        want = subprocess.run([trec_eval_bin, *args, qrels, run], capture_output=True, text=True, timeout=60)
        assert want.returncode == 0, want.stderr
        buf = io.StringIO()
        assert trec_eval_main([*args, qrels, run], out=buf) == 0
        expected = _our_lines(want.stdout)
        assert len(expected) > 30
        assert buf.getvalue().splitlines() == expected, args


def test_new_families_with_shared_histograms_and_chunks(monkeypatch):
    """The columnar engine's layout (several ranked lists sharing one judgment histogram,
    RankedLists.judged_index) and compute()'s chunks give the same values as one list per histogram."""
    import numpy as np

    from streameval.metrics import kernel
    from streameval.metrics.kernel import RankedLists, compute

    rnd = random.Random(5)
    judged = [[rnd.choice([0, 0, 1, 2, 3, -1]) for _ in range(rnd.randint(1, 30))] for _ in range(12)]
    ranked, owner = [], []
    for h, js in enumerate(judged):
        for _ in range(rnd.randint(1, 3)):
            pool = js + [None] * 5
            ranked.append(rnd.sample(pool, rnd.randint(0, len(pool))))
            owner.append(h)
    specs = [s for s in ALL_TREC if s.trec_name not in {t.trec_name for t in ALL_TREC[:3]}]
    specs += parse_metrics(["rbp.p=0.6", "rbp_resid.p=0.3", "utility.1,-2,0.5,0.25", "iprec_at_recall.0.33"])
    alone = compute(RankedLists.from_lists(ranked, [judged[h] for h in owner]), specs)
    per_hist = RankedLists.from_lists([[]] * len(judged), judged)
    shared = RankedLists.from_lists(ranked, [[]] * len(ranked))
    shared = RankedLists(shared.offsets, shared.grades, per_hist.judged_offsets, per_hist.judged_values,
                         per_hist.judged_counts, np.asarray(owner))
    np.testing.assert_array_equal(compute(shared, specs), alone)
    monkeypatch.setattr(kernel, "CHUNK_ITEMS", 40)
    np.testing.assert_array_equal(compute(shared, specs), alone)
