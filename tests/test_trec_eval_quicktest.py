"""trec_eval 10's ``make quicktest`` (its Makefile's 15 commands) with ``streameval trec-eval`` in
place of ``./trec_eval``: the output must be byte-identical to trec_eval's own out.test* files
(tests/data/trec_eval_test, copied unchanged from trec_eval's test folder).  Then the preference
(-R prefs, -R qrels_prefs) and judgment-group (-R qrels_jg) families, and the -D / -o / -v flags,
against trec_eval built from its C source (tests/data/trec_eval_src) on seeded random collections.
"""

import io
import random
import subprocess

import pytest

from streameval.cli import trec_eval_main

from .conftest import data_path

# trec_eval's Makefile, target quicktest (test/... paths; expected output file first)
QUICKTEST = [
    ("out.test", ["qrels.test", "results.test"]),
    ("out.test", ["qrels.test.with-comments", "results.test"]),
    ("out.comment.test", ["qrels.comment.test", "results.comment.test"]),
    ("out.test.a", ["-m", "all_trec", "qrels.test", "results.test"]),
    ("out.test.aq", ["-m", "all_trec", "-q", "qrels.test", "results.test"]),
    ("out.test.aqc", ["-m", "all_trec", "-q", "-c", "qrels.test", "results.trunc"]),
    ("out.test.aqcM", ["-m", "all_trec", "-q", "-c", "-M100", "qrels.test", "results.trunc"]),
    ("out.test.aql", ["-m", "all_trec", "-mrelstring.20", "-q", "-l2", "qrels.rel_level", "results.test"]),
    ("out.test.prefs", ["-m", "all_prefs", "-q", "-R", "prefs", "prefs.test", "prefs.results.test"]),
    ("out.test.prefs", ["-m", "all_prefs", "-q", "-R", "prefs", "prefs.comment.test", "prefs.results.test"]),
    ("out.test.qrels_prefs", ["-m", "all_prefs", "-q", "-R", "qrels_prefs", "qrels.test", "results.test"]),
    ("out.test.qrels_jg", ["-m", "qrels_jg", "-q", "-R", "qrels_jg", "qrels.123", "results.test"]),
    ("out.test.qrels_jg", ["-m", "qrels_jg", "-q", "-R", "qrels_jg", "qrels.comments.123", "results.test"]),
    ("out.test.meas_params", ["-q", "-miprec_at_recall..10,.20,.25,.75,.50", "-m", "P.5,7,3", "-m",
                              "recall.20,2000", "-m", "Rprec_mult.5.0,0.2,0.35", "-mutility.2,-1,0,0", "-m",
                              "11pt_avg..25,.5,.75", "-mndcg.1=3,2=9,4=4.5", "-mndcg_cut.10,20,23.4",
                              "-msuccess.2,5,20", "qrels.test", "results.test"]),
    ("out.test.aqZ", ["-q", "-m", "all_trec", "-Z", "zscores_file", "qrels.test", "results.test"]),
]
_FILES = {"qrels.test", "qrels.test.with-comments", "qrels.comment.test", "results.test", "results.comment.test",
          "results.trunc", "qrels.rel_level", "prefs.test", "prefs.comment.test", "prefs.results.test", "qrels.123",
          "qrels.comments.123", "zscores_file"}


def _ours(args):
    buf = io.StringIO()
    code = trec_eval_main(args, out=buf)
    return code, buf.getvalue()


@pytest.mark.parametrize("expected_file,args", QUICKTEST,
                         ids=[f"{i:02d}-{c[0]}" for i, c in enumerate(QUICKTEST, 1)])
def test_quicktest_byte_identical(expected_file, args):
    expected = data_path("trec_eval_test", expected_file).read_text()
    args = [str(data_path("trec_eval_test", a)) if a in _FILES else a for a in args]
    code, got = _ours(args)
    assert code == 0
    assert got == expected


# ---- seeded random collections against the built trec_eval -------------------------------------


def _run_lines(rng, qids, docs, n_ret, tie_every=3):
    """A TREC run: per query n_ret documents, scores with ties (ties broken by docno in trec_eval)."""
    lines = []
    for q in qids:
        for i, d in enumerate(rng.sample(docs, n_ret)):
            score = round(rng.uniform(0, 5) / tie_every, 1) if i % 2 else rng.choice([1.0, 2.0, 2.5])
            lines.append(f"{q} Q0 {d} {i + 1} {score} RUN")
    return "\n".join(lines) + "\n"


def _prefs_lines(rng, qids, docs):
    """A prefs file: per query 1-3 judgment groups, some with one sub-group (equivalence classes),
    some with several (partial orders, consistent: every sub-group ranks its documents by one hidden
    order of the group, and a non-relevant document is 0 in every sub-group)."""
    lines = []
    for q in qids:
        for g in range(rng.randint(1, 3)):
            pool = rng.sample(docs, rng.randint(2, 12))
            hidden = {d: rng.randint(0, 4) for d in pool}
            n_sub = rng.choice([1, 1, 2, 3])
            for s in range(n_sub):
                members = pool if n_sub == 1 else rng.sample(pool, rng.randint(2, len(pool)))
                for d in members:
                    lines.append(f"{q} jg{g} s{s} {d} {hidden[d]}.0")
    rng.shuffle(lines)
    return "\n".join(lines) + "\n"


def _qrels_jg_lines(rng, qids, docs, groups=3, grades=(-1, 0, 0, 1, 2, 3)):
    lines = []
    for q in qids:
        for g in range(rng.randint(1, groups)):
            for d in rng.sample(docs, rng.randint(3, 25)):
                lines.append(f"{q} {g} {d} {rng.choice(grades)}")
    rng.shuffle(lines)
    return "\n".join(lines) + "\n"


def _compare(trec_eval_bin, tmp_path, rel_text, run_text, args):
    rel, run = tmp_path / "rel", tmp_path / "run"
    rel.write_text(rel_text)
    run.write_text(run_text)
    want = subprocess.run([trec_eval_bin, *args, str(rel), str(run)], capture_output=True, text=True, timeout=60)
    assert want.returncode == 0, want.stderr
    code, got = _ours([*args, str(rel), str(run)])
    assert code == 0
    assert got == want.stdout
    return got


PREFS_ARGS = [["-m", "all_prefs", "-q"], ["-m", "all_prefs", "-q", "-M", "6"], ["-m", "prefs", "-q", "-c"],
              ["-m", "all_prefs", "-n", "-q", "-c", "-M", "3"]]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("extra", PREFS_ARGS, ids=lambda a: " ".join(a))
def test_prefs_random_match_trec_eval(trec_eval_bin, tmp_path, seed, extra):
    rng = random.Random(seed)
    docs = [f"D{i:03d}" for i in range(30)]
    qids = [str(q) for q in rng.sample(range(100, 140), 5)]
    prefs = _prefs_lines(rng, qids, docs)
    # every query of the prefs file has results unless -c (trec_eval 10 stops on one without)
    ranked = qids if "-c" not in extra else qids[:3]
    out = _compare(trec_eval_bin, tmp_path, prefs, _run_lines(rng, ranked, docs, rng.randint(5, 20)),
                   [*extra, "-R", "prefs"])
    assert "prefs_" in out


@pytest.mark.parametrize("seed", [4, 5])
@pytest.mark.parametrize("extra", [["-m", "all_prefs", "-q"], ["-m", "all_prefs", "-q", "-M", "8", "-c"]],
                         ids=lambda a: " ".join(a))
def test_qrels_prefs_random_match_trec_eval(trec_eval_bin, tmp_path, seed, extra):
    """-R qrels_prefs: a qrels file whose iter column names several judgment groups."""
    rng = random.Random(seed)
    docs = [f"doc{i}" for i in range(40)]
    qids = ["q1", "q2", "q3", "q4"]
    qrels = _qrels_jg_lines(rng, qids, docs, grades=(0, 0, 1, 2, 3))
    ranked = qids if "-c" not in extra else qids[1:]
    _compare(trec_eval_bin, tmp_path, qrels, _run_lines(rng, ranked, docs, 15), [*extra, "-R", "qrels_prefs"])


JG_ARGS = [["-m", "qrels_jg", "-q"], ["-m", "qrels_jg", "-q", "-c", "-M", "5"], ["-m", "qrels_jg", "-q", "-J", "-l2"],
           ["-m", "P_avgjg.3,1,7,50", "-m", "Rprec_mult_avgjg.1.5,0.5,0.25", "-m", "map_avgjg", "-q"]]


@pytest.mark.parametrize("seed", [6, 7, 8])
@pytest.mark.parametrize("extra", JG_ARGS, ids=lambda a: " ".join(a))
def test_qrels_jg_random_match_trec_eval(trec_eval_bin, tmp_path, seed, extra):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(35)]
    qids = ["301", "302", "303", "304", "305"]
    qrels = _qrels_jg_lines(rng, qids, docs)
    ranked = qids if "-c" not in extra else qids[:3]
    out = _compare(trec_eval_bin, tmp_path, qrels, _run_lines(rng, ranked, docs, rng.randint(4, 30)),
                   [*extra, "-R", "qrels_jg"])
    assert "avgjg" in out


@pytest.mark.parametrize("seed", [9, 10])
def test_yaap_random_match_trec_eval(trec_eval_bin, tmp_path, seed):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(35)]
    qids = ["1", "2", "3", "4"]
    qrels = "".join(f"{q} 0 {d} {rng.choice([0, 1, 2])}\n" for q in qids for d in rng.sample(docs, 12))
    for extra in (["-q"], ["-q", "-c"], ["-q", "-J", "-l2"]):
        ranked = qids if "-c" not in extra else qids[:2]
        _compare(trec_eval_bin, tmp_path, qrels, _run_lines(rng, ranked, docs, 10), [*extra, "-m", "yaap", "-m", "map"])


# ---- flags ----------------------------------------------------------------------------------------


def test_debug_query_and_old_format_flags_match_trec_eval(trec_eval_bin):
    t = lambda name: str(data_path("trec_eval_test", name))  # noqa: E731
    for args in (["-q", "-D", "0.302", "-m", "all_trec", t("qrels.test"), t("results.test")],
                 ["-q", "-c", "-D", "0.303", "-m", "all_trec", t("qrels.test"), t("results.trunc")],
                 ["-q", "-o", t("qrels.test"), t("results.test")],
                 ["-q", "-c", "-D", "0.5.EC.noPrf", "-m", "all_prefs", "-R", "prefs", t("prefs.test"),
                  t("prefs.results.test")],
                 ["-q", "-D", "0.302", "-m", "qrels_jg", "-R", "qrels_jg", t("qrels.123"), t("results.test")]):
        want = subprocess.run([trec_eval_bin, *args], capture_output=True, text=True, timeout=60)
        assert want.returncode == 0
        code, got = _ours(args)
        assert code == 0 and got == want.stdout, args
    # -c -D 0.303: one query printed, the summary over the qrels' 3 queries as trec_eval
    assert "num_q                 \tall\t3\n" in _ours(["-c", "-D", "0.303", t("qrels.test"), t("results.trunc")])[1]


def test_version_flag(trec_eval_bin, capsys):
    want = subprocess.run([trec_eval_bin, "-v"], capture_output=True, text=True, timeout=60)
    assert trec_eval_main(["-v"], out=io.StringIO()) == 0
    assert capsys.readouterr().err == want.stderr == "trec_eval version 10.0-rc3\n"


def test_refusals_are_one_line(tmp_path, capsys):
    t = lambda name: str(data_path("trec_eval_test", name))  # noqa: E731
    cases = [
        (["-R", "prefs", t("prefs.test"), t("prefs.results.test")], "default measures ('official') need -R qrels"),
        (["-R", "prefs", "-m", "map", t("prefs.test"), t("prefs.results.test")], "measure 'map' needs -R qrels"),
        (["-m", "all_prefs", t("qrels.test"), t("results.test")], "needs -R prefs or -R qrels_prefs"),
        (["-R", "qrels_jg", "-m", "yaap", t("qrels.123"), t("results.test")], "measure 'yaap' needs -R qrels"),
        (["-R", "bogus", t("qrels.test"), t("results.test")], "unknown relevance file format"),
        (["-D", "x.301", t("qrels.test"), t("results.test")], "debug level is not an integer"),
        (["-D", "1.5", t("qrels.test"), t("results.test")], "-D: query '5' is not in the qrels"),
        (["-D", "0.9", "-m", "prefs", "-R", "prefs", t("prefs.test"), t("prefs.results.test")],
         "-D: query '9' is not in the prefs file"),
    ]
    # contradictory preferences in one judgment group (a > b in s1, b > a in s2): trec_eval aborts
    bad = tmp_path / "prefs"
    bad.write_text("1 g s1 a 2\n1 g s1 b 1\n1 g s2 a 1\n1 g s2 b 2\n")
    run = tmp_path / "run"
    run.write_text("1 Q0 a 1 1.0 r\n1 Q0 b 2 0.5 r\n")
    cases.append((["-R", "prefs", "-m", "all_prefs", str(bad), str(run)], "contradictory preferences"))
    bad2 = tmp_path / "prefs2"
    bad2.write_text("1 g s1 a 2\n1 g s1 b 1\n1 g s1 c\n")
    cases.append((["-R", "prefs", "-m", "all_prefs", str(bad2), str(run)], "prefs2:3: expected 5 fields"))
    for args, message in cases:
        code, got = _ours(args)
        err = capsys.readouterr().err
        assert code == 2 and got == "", args
        assert message in err and err.count("\n") == 1, err


def test_ec_preference_counts_by_hand(tmp_path):
    """One judgment group, one sub-group: a (2) > b (1) > c (0), so 3 preferences a>b, a>c, b>c.
    Ranking b, a (c not retrieved): a>b not fulfilled, a>c implied fulfilled, b>c implied fulfilled:
    prefs_num_prefs_poss 3, prefs_num_prefs_ful 2, prefs_num_prefs_ful_ret 0, prefs_simp 2/3,
    prefs_simp_ret 0/1 = 0, prefs_simp_imp 2/3.  Rnonrel: R = 2 relevant >= N = 1 non-relevant, so
    num_rel * (R - N) = 2 * 1 more possible and num_rel_ret * (R - N) = 2 * 1 more fulfilled:
    (2 + 2) / (3 + 2) = 0.8."""
    prefs, run = tmp_path / "p", tmp_path / "r"
    prefs.write_text("7 g s a 2\n7 g s b 1\n7 g s c 0\n")
    run.write_text("7 Q0 b 1 2.0 t\n7 Q0 a 2 1.0 t\n")
    code, got = _ours(["-q", "-m", "all_prefs", "-R", "prefs", str(prefs), str(run)])
    vals = {line.split("\t")[0].strip(): line.split("\t")[2] for line in got.splitlines() if "\t7\t" in line}
    assert code == 0
    assert (vals["prefs_num_prefs_poss"], vals["prefs_num_prefs_ful"], vals["prefs_num_prefs_ful_ret"]) == ("3", "2", "0")
    assert (vals["prefs_simp"], vals["prefs_simp_ret"], vals["prefs_simp_imp"]) == ("0.6667", "0.0000", "0.6667")
    assert vals["prefs_avgjg_Rnonrel"] == "0.8000"


def test_negative_levels_past_class_end_warns(tmp_path, capsys):
    """qrels read as prefs with a -1 grade: 3 relevant documents, 4 at levels <= 0 (3 at 0, 1 at -1),
    so prefs_avgjg_Rnonrel cuts the last class (-1) to R = 3 documents, past its end: trec_eval reads
    memory outside it; here a warning on stderr, the other measures as trec_eval."""
    qrels, run = tmp_path / "q", tmp_path / "r"
    qrels.write_text("1 0 a 1\n1 0 b 1\n1 0 c 1\n1 0 d 0\n1 0 e 0\n1 0 f 0\n1 0 g -1\n")
    run.write_text("1 Q0 a 1 3 t\n1 Q0 d 2 2 t\n1 Q0 g 3 1 t\n")
    code, got = _ours(["-m", "prefs_simp", "-m", "prefs_avgjg_Rnonrel", "-R", "qrels_prefs", str(qrels), str(run)])
    err = capsys.readouterr().err
    assert code == 0 and "prefs_simp" in got
    assert err.count("\n") == 1 and "warning: prefs_avgjg_Rnonrel" in err
