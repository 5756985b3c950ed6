"""trec_eval 10's flags -J, -N, -n, -Z, -R / -T, '-' (standard input) and its relstring measure in
`streameval trec-eval`: the whole printed output equals, byte for byte, what trec_eval built from
its C source (tests/data/trec_eval_src, the session fixture trec_eval_bin of conftest.py)
prints on the same files: trec_eval's own test files (tests/data/trec_eval_test, with the Z-score
file and out.test.aqZ of the source's test folder) and a random collection made to reach the
corner cases (unjudged and unpooled documents, a query whose retrieved documents are all
unjudged, score ties, a judged query without results for -c)."""

import io
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from streameval.cli import trec_eval_main
from streameval.metrics.kernel import RankedLists
from streameval.metrics.trec_measures import relstrings

from .conftest import TREC_EVAL_SRC, data_path

SUITE = data_path("trec_eval_test", "qrels.test").parent
# trec_eval's test folder: its Z-score file and expected output are kept in tests/data/trec_eval_test
SRC_TEST = next((d for d in (os.path.join(os.path.dirname(__file__), "data", "trec_eval_test"),
                             os.path.join(TREC_EVAL_SRC, "test"))
                 if os.path.isfile(os.path.join(d, "zscores_file"))), os.path.join(TREC_EVAL_SRC, "test"))


def _ours(args, stdin: bytes | None = None, monkeypatch=None):
    buf = io.StringIO()
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = trec_eval_main([str(a) for a in args], out=buf)
    return code, buf.getvalue()


def _theirs(binary, args, stdin: bytes | None = None):
    done = subprocess.run([binary, *map(str, args)], capture_output=True, input=stdin, timeout=60)
    return done.returncode, done.stdout.decode()


def _random_collection(d, seed=7):
    """Qrels with grades -1 (pooled, unjudged) to 3, a query (103) with no relevant document, a query
    (109) whose retrieved documents are all unjudged or unpooled (-J empties it); a run with score
    ties (query 102), unpooled documents, lists of 1 to 50 documents; the run without query 105
    (for -c: trec_eval stops on a judged query without results otherwise); a Z-score file for every
    measure trec_eval prints here, with a standard deviation of 0 for some (its value or -1000000),
    query 104 left out (-1000000 for all its measures) and some measures left out of some queries
    (each query's lexically last measure is kept: trec_eval's binary search reads past the end
    of its table otherwise)."""
    rnd = random.Random(seed)
    qrels, run = [], []
    for q in range(1, 10):
        qid = f"{100 + q}"
        docs = [f"d{q}-{i:03d}" for i in range(rnd.randint(5, 60))]
        judged = rnd.sample(docs, rnd.randint(1, len(docs)))
        for i, doc in enumerate(judged):
            grade = 0 if q == 3 else rnd.choice([0, 0, 0, 1, 1, 2, 3, -1])
            if q == 9:
                grade = -1 if i else 2  # only pooled-but-unjudged documents are retrieved
            qrels.append(f"{qid} 0 {doc} {grade if i else max(grade, 0)}")
        if q == 9:
            ranked = judged[1:] or ["d9-none"]
        else:
            ranked = rnd.sample(docs, rnd.randint(1, min(len(docs), 50)))
        ranked += [f"x{q}-{i}" for i in range(rnd.randint(0, 6))]
        for i, doc in enumerate(ranked):
            run.append(f"{qid} Q0 {doc} {i + 1} {rnd.choice([1, 2, 2.5, 3]) if q == 2 else 100 - i} tag{seed}")
    (d / "qrels").write_text("\n".join(qrels) + "\n")
    (d / "run").write_text("\n".join(run) + "\n")
    (d / "run_c").write_text("\n".join(x for x in run if not x.startswith("105 ")) + "\n")
    return str(d / "qrels"), str(d / "run"), str(d / "run_c")


def _zscores_for(binary, d, qrels, run):
    """A Z-score file (see :func:`_random_collection`) from trec_eval's own per-query output."""
    code, text = _theirs(binary, ["-q", "-m", "all_trec", "-m", "utility.1,-2,0.5,0.25", qrels, run])
    assert code == 0
    rnd = random.Random(3)
    by_q = {}
    for line in text.splitlines():
        name, qid, value = (x.strip() for x in line.split("\t"))
        if qid != "all" and not value.startswith("'"):
            by_q.setdefault(qid, {})[name] = float(value)
    lines = []
    for qid, meas in sorted(by_q.items()):
        if qid == "104":
            continue
        last = max(meas)
        for name, v in sorted(meas.items()):
            if name != last and rnd.random() < 0.1:
                continue
            kind = rnd.random()
            if kind < 0.1:
                lines.append(f"{qid} {name} {v:.4f} 0")  # std 0, mean = the value: 0
            elif kind < 0.15:
                lines.append(f"{qid} {name} {v + 1:.4f} 0")  # std 0, another mean: -1000000
            else:
                lines.append(f"{qid} {name} {v * 0.8 + 0.01:.4f} {0.05 + rnd.random():.4f}")
    rnd.shuffle(lines)
    path = d / "zscores"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def collections(trec_eval_bin, tmp_path_factory):
    """(name, qrels, run, run for -c, Z-score file): trec_eval's test files and the random one."""
    d = tmp_path_factory.mktemp("flags")
    qrels, run, run_c = _random_collection(d)
    return [("suite", str(SUITE / "qrels.test"), str(SUITE / "results.test"), str(SUITE / "results.trunc"),
             os.path.join(SRC_TEST, "zscores_file")),
            ("random", qrels, run, run_c, _zscores_for(trec_eval_bin, d, qrels, run))]


FLAGS = [["-J"], ["-J", "-c"], ["-J", "-M", "7", "-l2"], ["-n"], ["-n", "-c", "-J"], ["-N", "2500"],
         ["-N", "2500", "-J", "-c"], ["-Z", "ZFILE"], ["-Z", "ZFILE", "-c", "-J"], ["-R", "qrels", "-T", "trec_results"]]
MEASURES = {
    "all_trec": ["-m", "all_trec"],
    "official": [],
    "params": ["-m", "utility.1,-2,0.5,0.25", "-m", "iprec_at_recall.0,0.02,0.5", "-m", "11pt_avg.0.2,0.5",
               "-m", "rbp_resid.p=0.6", "-m", "relstring.15", "-m", "num_q", "-m", "Rprec_mult.0.5,2",
               "-m", "set_F.0.5", "-m", "unj.3", "-m", "gm_map", "-m", "num_ret", "-m", "num_rel",
               "-m", "ideal_dcg.1=3,2=9"],
}


@pytest.mark.parametrize("measures", list(MEASURES), ids=list(MEASURES))
@pytest.mark.parametrize("flags", FLAGS, ids=[" ".join(f).replace("ZFILE", "z") for f in FLAGS])
def test_flags_match_built_trec_eval(trec_eval_bin, collections, flags, measures):
    for name, qrels, run, run_c, zfile in collections:
        if name == "suite" and "ZFILE" in flags and measures == "params":
            # utility_1,... sorts after every measure of zscores_file's queries: trec_eval's binary
            # search (convert_zscores.c) then reads past its table and crashes (SIGSEGV)
            continue
        args = ["-q", *(zfile if a == "ZFILE" else a for a in flags), *MEASURES[measures], qrels,
                run_c if "-c" in flags else run]
        want = _theirs(trec_eval_bin, args)
        assert want[0] == 0, (name, args)
        got = _ours(args)
        assert got == want, (name, args)
        assert len(want[1].splitlines()) >= (0 if "-n" in flags else 20)


def test_judged_only_changes_values(collections):
    """-J is not a no-op here: query 109 (only unjudged documents retrieved) is emptied: num_ret 0,
    iprec_at_recall_0.00 trec_eval's 0 / 0 (-nan), utility p3 * num_rel + p4 * (N - num_rel) =
    0.5 * 1 + 0.25 * (2500 - 1) = 625.25 (its one judged document, grade 2, is relevant)."""
    _, qrels, run, _, _ = collections[1]
    _, text = _ours(["-q", "-J", "-N", "2500", "-m", "num_ret", "-m", "iprec_at_recall.0", "-m",
                     "utility.1,-2,0.5,0.25", qrels, run])
    lines = {tuple(x.split("\t")[:2]): x.split("\t")[2] for x in text.splitlines()}
    assert lines[("num_ret               ", "109")] == "0"
    assert lines[("iprec_at_recall_0.00  ", "109")] == "  -nan"
    assert lines[("utility_1,-2,0.5,0.25 ", "109")] == "625.2500"


def test_zscores_print_trec_evals_aqZ():
    """trec_eval's Makefile: -q -m all_trec -Z test/zscores_file prints test/out.test.aqZ."""
    expected = os.path.join(SRC_TEST, "out.test.aqZ")
    if not os.path.isfile(expected):
        pytest.skip(f"trec_eval's test folder not found at {SRC_TEST}")
    code, text = _ours(["-q", "-m", "all_trec", "-Z", os.path.join(SRC_TEST, "zscores_file"),
                        SUITE / "qrels.test", SUITE / "results.test"])
    assert code == 0
    with open(expected) as f:
        assert text == f.read()


def test_run_from_stdin(trec_eval_bin, monkeypatch):
    """'-' as the run reads standard input, as trec_eval does; '-' as the qrels too (trec_eval
    cannot: compared with its output on the file)."""
    run_bytes = (SUITE / "results.test").read_bytes()
    args = ["-q", "-m", "all_trec", "-J", SUITE / "qrels.test", "-"]
    want = _theirs(trec_eval_bin, args, stdin=run_bytes)
    assert want[0] == 0
    assert _ours(args, stdin=run_bytes, monkeypatch=monkeypatch) == want
    want = _theirs(trec_eval_bin, ["-q", SUITE / "qrels.test", SUITE / "results.test"])
    got = _ours(["-q", "-", SUITE / "results.test"], stdin=(SUITE / "qrels.test").read_bytes(),
                monkeypatch=monkeypatch)
    assert got == want


def test_stdin_errors_name_it_dash(monkeypatch, capsys):
    code, _ = _ours(["-", SUITE / "results.test"], stdin=b"301 0 doc\n", monkeypatch=monkeypatch)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("streameval trec-eval: -:1: expected 4 columns") and err.count("\n") == 1
    code, _ = _ours(["-", "-"], stdin=b"", monkeypatch=monkeypatch)
    assert code == 2
    assert "cannot both be '-'" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value,reason", [
    # prefs, qrels_prefs and qrels_jg feed their own measures (test_trec_eval_quicktest.py): without -m,
    # trec_eval's default measures need -R qrels
    ("-R", "prefs", "default measures ('official') need -R qrels"),
    ("-R", "qrels_prefs", "default measures ('official') need -R qrels"),
    ("-R", "qrels_jg", "default measures ('official') need -R qrels"), ("-R", "trec", "unknown relevance file format"),
    ("-T", "tsv", "unknown results file format")])
def test_refused_formats_one_line(flag, value, reason, capsys):
    code, out = _ours([flag, value, SUITE / "qrels.test", SUITE / "results.test"])
    err = capsys.readouterr().err
    assert (code, out) == (2, "")
    assert reason in err and err.count("\n") == 1 and err.startswith(f"streameval trec-eval: {flag} {value}")


@pytest.mark.parametrize("content,reason", [
    ("", "empty Z-score file"), ("301 map 0.1\n", "3 fields, want 4"), ("301 map x 0.1\n", "must be numbers"),
    ("301 map 0.1 0.2\n301 map 0.1 0.3\n", "given twice"), ("301 map 0.1 nan\n", "finite")])
def test_bad_zscore_file_one_line(tmp_path, content, reason, capsys):
    z = tmp_path / "z"
    z.write_text(content)
    code, out = _ours(["-Z", z, SUITE / "qrels.test", SUITE / "results.test"])
    err = capsys.readouterr().err
    assert (code, out) == (2, "")
    assert reason in err and err.count("\n") == 1


def test_relstring_characters():
    """m_relstring.c's characters, by hand: grades [unpooled, unjudged (-1), 0, 3, 12, 1] at length
    4 give '-.03'; at 10, all six: '-.03>1'; at 0 or below, ''; an empty list, ''."""
    lists = RankedLists.from_lists([[None, -1, 0, 3, 12, 1], []], [[-1, 0, 3, 12, 1], [1]])
    assert relstrings(lists, 4) == ["-.03", ""]
    assert relstrings(lists, 10) == ["-.03>1", ""]
    assert relstrings(lists, 0) == ["", ""]
    assert relstrings(lists, -3) == ["", ""]
    assert np.asarray(lists.grades).shape == (6,)


@pytest.mark.parametrize("measures", [
    ["-m", "all_trec", "-m", "P.5", "-m", "utility.1,-2,3,0.5", "-m", "iprec_at_recall.0,0.001,0.5"],
    ["-m", "utility", "-m", "utility.2,-1,0,0", "-m", "P.5", "-m", "P.10,20", "-m", "relstring", "-m", "relstring.3",
     "-m", "relstring.4", "-m", "ndcg_cut.7", "-m", "all_trec"],
    ["-m", "official", "-m", "ndcg", "-m", "ndcg_cut.7", "-m", "map_cut.3", "-m", "map", "-m", "recall.4"]])
def test_first_parameters_replace_defaults(trec_eval_bin, measures):
    """trec_eval (meas_init.c): a measure named with parameters is computed with the first ones given
    only, whatever nickname or plain name also marks it."""
    args = ["-q", "-c", *measures, SUITE / "qrels.test", SUITE / "results.trunc"]
    want = _theirs(trec_eval_bin, args)
    assert want[0] == 0
    assert _ours(args) == want


@pytest.mark.parametrize("measure", ["P", "recall", "success", "map_cut", "ndcg_cut", "relative_P"])
def test_a_cutoff_measure_without_parameters_gets_trec_evals_default_cutoffs(trec_eval_bin, collections, measure):
    """``-m P`` (no parameters) is P at trec_eval's default cutoffs (measures.c), as the binary prints it;
    ``-m map_cut`` printed map and ``-m P`` was refused before."""
    for _name, qrels, run, _run_c, _z in collections:
        args = ["-q", "-m", measure, qrels, run]
        assert _ours(args) == _theirs(trec_eval_bin, args)
