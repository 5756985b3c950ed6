"""Rank fusion (streameval.fuse, streameval fuse): every method and normalisation against hand
computations on a tiny pair of runs, the input forms, the errors, the command's round trip, and
against ranx 0.3.21's own fused runs on random runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import streameval as se
from streameval.cli import main as cli_main
from streameval.fusion import FusionNameError
from streameval.io import trec

# run A ranks a > b > c; run B ranks b > d; q2 is only in A
A = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"x": 5.0, "y": 4.0}}
B = {"q1": {"b": 0.9, "d": 0.5}}


def _q1(method, norm="min-max", **params):
    return se.fuse([A, B], method, norm, **params)["q1"]


def _close(got: dict, want: dict):
    assert set(got) == set(want)
    for d, v in want.items():
        assert got[d] == pytest.approx(v, rel=1e-12, abs=1e-15), d


def test_rank_methods_by_hand():
    # ranks: A a1 b2 c3, B b1 d2
    _close(_q1("rrf"), {"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 63, "d": 1 / 62})
    _close(_q1("rrf", k=0), {"a": 1, "b": 1 / 2 + 1, "c": 1 / 3, "d": 1 / 2})
    _close(_q1("isr"), {"a": 1, "b": (1 / 4 + 1) * 2, "c": 1 / 9, "d": 1 / 4})
    _close(_q1("log_isr"), {"a": 0, "b": 1.25 * math.log(2), "c": 0, "d": 0})
    _close(_q1("logn_isr", sigma=0.5), {"a": math.log(1.5), "b": 1.25 * math.log(2.5), "c": math.log(1.5) / 9,
                                        "d": math.log(1.5) / 4})
    # 4 candidates: A gives a 4, b 3, c 2, d (4-3+1)/2 = 1; B gives b 4, d 3, a and c (4-2+1)/2 = 1.5
    _close(_q1("bordafuse"), {"a": 5.5, "b": 7, "c": 3.5, "d": 4})
    _close(_q1("w_bordafuse", weights=[2, 1]), {"a": 9.5, "b": 10, "c": 5.5, "d": 5})
    # rank-biased centroids: (1 - phi) phi^(r - 1) per run
    _close(_q1("rbc", phi=0.5), {"a": 0.5, "b": 0.25 + 0.5, "c": 0.125, "d": 0.25})


def test_condorcet_by_hand():
    # R1 a > b > c > d, R2 b > a > d, R3 a > c > b; a beats b 2-1 and c, d 3-0; b beats c 2-1 and d 3-0;
    # c beats d 2-1 (R2, which returned d but not c, votes for d)
    runs = [{"q": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}}, {"q": {"b": 3.0, "a": 2.0, "d": 1.0}},
            {"q": {"a": 3.0, "c": 2.0, "b": 1.0}}]
    fused = se.fuse(runs, "condorcet")
    assert fused == {"q": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}} and list(fused["q"]) == ["a", "b", "c", "d"]
    # weights 1, 1, 3: R3 alone outweighs R1 and R2, so c passes b (3 to 2); the rest as before
    fused = se.fuse(runs, "weighted_condorcet", weights=[1, 1, 3])
    assert list(fused["q"].items()) == [("a", 4.0), ("c", 3.0), ("b", 2.0), ("d", 1.0)]
    # ranks count, not scores: every normalisation but the inverted one gives the same fused run
    assert se.fuse(runs, "condorcet", None) == se.fuse(runs, "condorcet", "zmuv") == se.fuse(runs, "condorcet")
    # inverted: R1 d > c > b > a, R2 d > a > b, R3 b > c > a; b beats c 2-1 (R2 returned b, not c)
    assert list(se.fuse(runs, "condorcet", "min-max-inverted")["q"]) == ["d", "b", "c", "a"]
    with pytest.raises(ValueError, match="w_condorcet needs the parameter weights"):
        se.fuse(runs, "w_condorcet")


def test_mixed_by_hand():
    # min-max: A a 1, b 0.5, c 0; B b 1, d 0; weights 2, 1: b (2 x 0.5 + 1) x sqrt(2)
    _close(_q1("mixed", weights=[2, 1]), {"a": 2, "b": 2 * math.sqrt(2), "c": 0, "d": 0})


def test_score_methods_by_hand():
    # min-max: A a 1, b 0.5, c 0; B b 1, d 0
    _close(_q1("combsum"), {"a": 1, "b": 1.5, "c": 0, "d": 0})
    _close(_q1("combmnz"), {"a": 1, "b": 3, "c": 0, "d": 0})
    _close(_q1("combmax"), {"a": 1, "b": 1, "c": 0, "d": 0})
    _close(_q1("combmin"), {"a": 1, "b": 0.5, "c": 0, "d": 0})
    _close(_q1("combmed"), {"a": 1, "b": 0.75, "c": 0, "d": 0})
    _close(_q1("combanz"), {"a": 1, "b": 0.75, "c": 0, "d": 0})
    _close(_q1("combgmnz", gamma=0.5), {"a": 1, "b": 1.5 * math.sqrt(2), "c": 0, "d": 0})
    _close(_q1("wsum", weights=[2, 1]), {"a": 2, "b": 2, "c": 0, "d": 0})
    _close(_q1("wmnz", weights=[2, 1]), {"a": 2, "b": 1.5 * 3, "c": 0, "d": 0})
    # without normalisation: the raw scores
    _close(_q1("combsum", None), {"a": 3, "b": 2.9, "c": 1, "d": 0.5})
    _close(_q1("combmed", "none"), {"a": 3, "b": 1.45, "c": 1, "d": 0.5})
    # combmed of three runs: the middle value, not the mean
    three = se.fuse([A, B, {"q1": {"b": 10.0}}], "combmed", None)
    assert three["q1"]["b"] == 2.0


def test_normalisations_by_hand():
    # combsum shows each normalisation; A's scores 3, 2, 1 (n 3, mean 2, sd sqrt(2/3)); B's 0.9, 0.5
    _close(_q1("combsum", "max"), {"a": 1, "b": 2 / 3 + 1, "c": 1 / 3, "d": 0.5 / 0.9})
    _close(_q1("combsum", "sum"), {"a": 2 / 3, "b": 1 / 3 + 0.4 / 0.4, "c": 0, "d": 0})
    sd = math.sqrt(2 / 3)
    _close(_q1("combsum", "zmuv"), {"a": 1 / sd, "b": 0 + 1, "c": -1 / sd, "d": -1})
    _close(_q1("combsum", "rank"), {"a": 1, "b": 2 / 3 + 1, "c": 1 / 3, "d": 0.5})
    _close(_q1("combsum", "min-max-inverted"), {"a": 0, "b": 0.5 + 0, "c": 1, "d": 1})
    # borda over the 4 candidates: A a 1, b .75, c .5, d .5 - 2/8; B b 1, d .75, a and c .5 - 1/8
    _close(_q1("combsum", "borda"), {"a": 1.375, "b": 1.75, "c": 0.875, "d": 1.0})
    # the inverted run is ranked again: A c1 b2 a3, B d1 b2
    _close(_q1("rrf", "min-max-inverted"), {"a": 1 / 63, "b": 2 / 62, "c": 1 / 61, "d": 1 / 61})


def test_trained_methods_by_hand():
    from streameval.fusion import train

    qrels = {"q1": {"b": 1, "d": 2, "a": 0}, "q2": {"y": 1}}
    # posfuse: A's ranks 1..3 hold relevant documents in 0 of 2, 2 of 2 and 0 of 1 queries; B's in 1 of 1
    probs = train(qrels, [A, B], "posfuse")["probs"]
    assert [p.tolist() for p in probs] == [[0, 1, 0], [1, 1]]
    fused = se.fuse([A, B], "posfuse", probs=probs)
    assert fused == {"q1": {"b": 2.0, "d": 1.0, "c": 0.0, "a": 0.0}, "q2": {"y": 1.0, "x": 0.0}}
    # a run query without judgments is left out; a grade below relevance_level is not relevant
    extra = {**A, "q9": {"b": 1.0}}
    assert [p.tolist() for p in train(qrels, [extra, B], "posfuse")["probs"]] == [[0, 1, 0], [1, 1]]
    assert [p.tolist() for p in train(qrels, [A, B], "posfuse", relevance_level=2)["probs"]] == [[0, 0, 0], [0, 1]]
    # probfuse, 2 segments: A's q1 (3 documents, 2 a segment) [a b | c] shares .5 and 0, q2 [x | y] 0 and 1;
    # B's q1 [b | d] 1 and 1
    probs = train(qrels, [A, B], "probfuse", n_segments=2)["probs"]
    assert [p.tolist() for p in probs] == [[0.25, 0.5], [1, 1]]
    fused = se.fuse([A, B], "probfuse", params={"probs": probs})
    _close(fused["q1"], {"a": 0.25, "b": 0.25 + 1, "c": 0.5 / 2, "d": 1 / 2})
    _close(fused["q2"], {"x": 0.25, "y": 0.5 / 2})
    # mapfuse: A's average precisions q1 (b at 2, d unretrieved) 1/2 / 2, q2 (y at 2) 1/2: MAP 0.375; B's q1 1
    params = train(qrels, [A, B], "mapfuse")
    assert params == {"map_scores": [0.375, 1.0]}
    _close(se.fuse([A, B], "mapfuse", params=params)["q1"], {"a": 0.375, "b": 0.375 / 2 + 1, "c": 0.125, "d": 0.5})
    # segfuse: ranks 1-5 are segment 1; A holds 2 relevant in it over 2 queries, B 2 over 1 (of 5 places)
    params = train(qrels, [A, B], "segfuse")
    assert [p.tolist() for p in params["probs"]] == [[0.2] + [0] * 9, [0.4] + [0] * 9]
    _close(se.fuse([A, B], "segfuse", params=params)["q1"], {"a": 0.2 * 2, "b": 0.2 * 1.5 + 0.4 * 2, "c": 0.2,
                                                              "d": 0.4})
    # slidefuse, w 1: posfuse's probs averaged over the ranks r - 1 .. r + 1 within the run
    params = {**train(qrels, [A, B], "slidefuse"), "w": 1}
    _close(se.fuse([A, B], "slidefuse", params=params)["q1"], {"a": 0.5, "b": 1 / 3 + 1, "c": 0.5, "d": 1})
    # bayesfuse: ranks 1-5, precision 2 / 5 / 2 for A, 2 / 5 for B; a document a run lacks: log(0.001 / 0.999)
    odds = train(qrels, [A, B], "bayesfuse")["log_odds"]
    assert [len(o) for o in odds] == [1000, 1000]
    assert odds[0][0] == pytest.approx(math.log(0.2 / 0.8)) and odds[1][4] == pytest.approx(math.log(0.4 / 0.6))
    assert odds[0][5] == pytest.approx(math.log(0.001 / 0.999))
    fused = se.fuse([A, B], "bayesfuse", log_odds=odds)
    low = math.log(0.001 / 0.999)
    _close(fused["q1"], {"a": math.log(0.25) + low, "b": math.log(0.25) + math.log(2 / 3), "c": math.log(0.25) + low,
                         "d": low + math.log(2 / 3)})
    _close(fused["q2"], {"x": math.log(0.25), "y": math.log(0.25)})  # q2 only in A
    with pytest.raises(ValueError, match="slidefuse needs the parameter w"):
        se.fuse([A, B], "slidefuse", probs=params["probs"])
    with pytest.raises(ValueError, match="probfuse needs n_segments"):
        train(qrels, [A, B], "probfuse")
    with pytest.raises(FusionNameError, match="rrf learns nothing"):
        train(qrels, [A, B], "rrf")
    with pytest.raises(ValueError, match="posfuse needs the parameter probs"):
        se.fuse([A, B], "posfuse")


def test_order_ties_and_missing_queries():
    fused = se.fuse([A, B], "combsum")
    assert list(fused) == ["q1", "q2"]
    # a 1 and b 1.5: b first; c and d tie at 0: docno descending (d, then c)
    assert list(fused["q1"]) == ["b", "a", "d", "c"]
    assert fused["q2"] == {"x": 1.0, "y": 0.0}  # only in A: fused from A alone
    # tied scores within a run are ranked by docno descending, as trec_eval orders them
    tied = se.fuse([{"q": {"a": 1.0, "b": 1.0}}, {"q": {"c": 1.0}}], "rrf", None)
    _close(tied["q"], {"b": 1 / 61, "a": 1 / 62, "c": 1 / 61})
    assert list(tied["q"]) == ["c", "b", "a"]


def test_input_forms_and_outputs(tmp_path):
    pd = pytest.importorskip("pandas")
    want = se.fuse([A, B], "rrf")
    path = tmp_path / "a.run"
    trec.write_run(path, trec.TrecRun(["q1", "q1", "q1", "q2", "q2"], ["a", "b", "c", "x", "y"],
                                      [3.0, 2.0, 1.0, 5.0, 4.0], [1, 2, 3, 1, 2], "A"))
    frame = pd.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["b", "d"], "score": [0.9, 0.5]})
    arrays = (np.array(["q1", "q1"]), np.array(["b", "d"]), np.array([0.9, 0.5]))
    for runs in ([str(path), frame], [A, arrays], (A, B)):
        assert se.fuse(runs, "rrf") == want
    q, d, s = want.arrays()
    assert q.tolist() == ["q1"] * 4 + ["q2"] * 2 and d.tolist() == ["b", "a", "d", "c", "x", "y"]
    assert s[0] == want["q1"]["b"]
    out = tmp_path / "fused.run"
    want.write_trec(out, tag="mine")
    lines = [line.split() for line in out.read_text().splitlines()]
    assert lines[0] == ["q1", "Q0", "b", "1", repr(1 / 62 + 1 / 61), "mine"]
    assert [row[3] for row in lines] == ["1", "2", "3", "4", "1", "2"]
    # a fused run is a run evaluate() reads: b first in q1, y second in q2
    assert se.evaluate({"q1": {"b": 1}, "q2": {"y": 1}}, want, "recip_rank").value() == 0.75


def test_errors():
    with pytest.raises(FusionNameError, match=r"unknown fusion method 'rff'; closest: rrf"):
        se.fuse([A, B], "rff")
    with pytest.raises(FusionNameError, match=r"closest: min-max"):
        se.fuse([A, B], "rrf", "minmax2")
    with pytest.raises(FusionNameError, match=r"rrf takes no parameter 'kk'.*closest: k"):
        se.fuse([A, B], "rrf", kk=3)
    with pytest.raises(ValueError, match="combgmnz needs the parameter gamma"):
        se.fuse([A, B], "combgmnz")
    with pytest.raises(ValueError, match="1 weights for 2 runs"):
        se.fuse([A, B], "wsum", weights=[1])
    with pytest.raises(ValueError, match="at least two runs"):
        se.fuse([A], "rrf")
    with pytest.raises(ValueError, match="document 'a' more than once"):
        se.fuse([(["q", "q"], ["a", "a"], [1.0, 2.0]), B])
    with pytest.raises(ValueError, match="not a finite number"):
        se.fuse([{"q": {"a": float("nan")}}, B])
    with pytest.raises(TypeError, match="list or tuple of runs"):
        se.fuse(A)
    # ranx's own spellings are accepted
    assert se.fuse([A, B], "sum") == se.fuse([A, B], "combsum") == se.fuse([A, B], "comb_sum", "min_max")


def test_cli_round_trip(tmp_path, capsys):
    pa, pb, out = tmp_path / "a.run", tmp_path / "b.run", tmp_path / "out" / "fused.run"
    trec.write_run(pa, trec.TrecRun(["q1"] * 3, ["a", "b", "c"], [3.0, 2.0, 1.0], [1, 2, 3], "A"))
    trec.write_run(pb, trec.TrecRun(["q1"] * 2, ["b", "d"], [0.9, 0.5], [1, 2], "B"))
    assert cli_main(["fuse", str(pa), str(pb), "--method", "wsum", "--param", "weights=2,1", "-o", str(out)]) == 0
    got = trec.read_run(out)
    assert got.tag == "fused"
    assert all(len(line.split()) == 6 for line in out.read_text().splitlines())
    assert dict(zip(got.docno.tolist(), got.score.tolist())) == {"a": 2.0, "b": 2.0, "c": 0.0, "d": 0.0}
    assert got.docno.tolist() == ["b", "a", "d", "c"] and got.rank.tolist() == [1, 2, 3, 4]
    assert cli_main(["fuse", str(pa), str(pb), "--param", "k=0", "--tag", "rrf0", "-o", str(out)]) == 0
    got = trec.read_run(out)
    assert got.tag == "rrf0"
    assert dict(zip(got.docno.tolist(), got.score.tolist())) == {"a": 1, "b": 1.5, "c": 1 / 3, "d": 0.5}
    capsys.readouterr()
    assert cli_main(["fuse", str(pa), str(pb), "--method", "combsumm", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "closest: combsum" in err
    assert cli_main(["fuse", str(pa), str(pb), "--norm", "zmvu", "-o", str(out)]) == 2
    assert "closest: zmuv" in capsys.readouterr().err
    assert cli_main(["fuse", str(pa), str(pb), "--method", "posfuse", "-o", str(out)]) == 2
    assert "streameval.fusion.train" in capsys.readouterr().err
    assert cli_main(["fuse", str(pa), str(pb), "--method", "slidefuse", "--param", "w=2", "-o", str(out)]) == 2
    assert "slidefuse learns its parameters" in capsys.readouterr().err
    assert cli_main(["fuse", str(pa), str(pb), "--method", "weighted_condorcet", "--param", "weights=1,3",
                     "-o", str(out)]) == 0
    assert trec.read_run(out).docno.tolist() == ["b", "d", "a", "c"]  # b and d (run B, weight 3) first
    assert cli_main(["fuse", str(pa), str(pb), "--method", "mixed", "--param", "weights=2,1", "-o", str(out)]) == 0
    assert trec.read_run(out).docno.tolist() == ["b", "a", "d", "c"]
    assert cli_main(["fuse", str(pa), str(pb), "--param", "k", "-o", str(out)]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert cli_main(["fuse", str(pa), str(tmp_path / "missing.run"), "-o", str(out)]) == 2
    assert "missing.run" in capsys.readouterr().err


def _random_runs(seed=3):
    """3 runs of 20 queries, distinct scores, each run missing some of the 40 documents."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(3):
        run = {}
        for q in range(20):
            docs = rng.choice(40, size=int(rng.integers(5, 25)), replace=False)
            scores = rng.permutation(10_000)[:len(docs)] / 97.0 - 30
            run[f"q{q}"] = {f"d{x}": float(s) for x, s in zip(docs, scores)}
        runs.append(run)
    return runs


_PARAMS = {"rrf": {}, "isr": {}, "log_isr": {}, "logn_isr": {}, "sum": {}, "mnz": {}, "max": {}, "min": {},
           "med": {}, "anz": {}, "gmnz": {"gamma": 0.7}, "wsum": {"weights": [0.2, 0.5, 0.3]},
           "wmnz": {"weights": [0.2, 0.5, 0.3]}, "bordafuse": {}, "w_bordafuse": {"weights": [0.2, 0.5, 0.3]},
           "rbc": {"phi": 0.8}, "mixed": {"weights": [0.2, 0.5, 0.3]}}


@pytest.mark.parametrize("norm", ["min-max", "min-max-inverted", "max", "sum", "zmuv", "rank", "borda", None])
def test_equal_to_ranx(norm):
    """Every method after ``norm``: the fused scores equal ranx 0.3.21's (rel 1e-9), and the order
    of the documents where the fused scores do not tie. Not compared: bordafuse and the rank-based
    methods after the borda normalisation, where ranx ranks the candidates in a Python set's order
    (docs/metrics.md, "Rank fusion")."""
    ranx = pytest.importorskip("ranx")
    runs = _random_runs()
    for method, params in _PARAMS.items():
        if norm == "borda" and method in ("rrf", "isr", "log_isr", "logn_isr", "bordafuse", "w_bordafuse", "rbc"):
            continue
        want = ranx.fuse([ranx.Run(r) for r in runs], norm=norm, method=method, params=params).to_dict()
        got = se.fuse(runs, method, norm, params=params)
        assert list(got) == list(want), method
        for q in want:
            assert set(got[q]) == set(want[q]), (method, q)
            for d, v in want[q].items():
                assert got[q][d] == pytest.approx(v, rel=1e-9, abs=1e-12), (method, q, d)
            scores = np.array(list(want[q].values()))
            if (np.abs(np.diff(scores)) > 1e-9 * np.abs(scores[1:])).all():  # no tie, to ranx's rounding
                assert list(got[q]) == list(want[q]), (method, q)


@pytest.mark.parametrize("norm", ["min-max", "zmuv", None])
def test_trained_equal_to_ranx(norm):
    """The trained methods' learnt parameters equal ranx's (optimize_fusion; probfuse_train and
    slidefuse_train on the normalised runs, as optimize_fusion gives them), and so do the runs fused
    with them."""
    ranx = pytest.importorskip("ranx")
    from ranx.fusion import probfuse_train, slidefuse_train
    from ranx.normalization import norm_switch

    from streameval.fusion import train

    runs = _random_runs()
    rng = np.random.default_rng(5)
    qrels = {q: {f"d{x}": int(rng.integers(0, 3)) for x in rng.choice(40, 10, replace=False)} for q in runs[0]}
    ranx_qrels = ranx.Qrels({q: {d: g for d, g in j.items() if g > 0} or {"none": 1} for q, j in qrels.items()})
    normed = [ranx.Run(r) if norm is None else norm_switch(norm)(ranx.Run(r)) for r in runs]
    cases = {"posfuse": (ranx.optimize_fusion(ranx_qrels, [ranx.Run(r) for r in runs], norm=norm, method="posfuse"),
                         train(qrels, runs, "posfuse", norm)),
             "probfuse": ({"probs": probfuse_train(ranx_qrels, normed, 4)},
                          train(qrels, runs, "probfuse", norm, n_segments=4)),
             "slidefuse": ({"probs": slidefuse_train(ranx_qrels, normed), "w": 2},
                           {**train(qrels, runs, "slidefuse", norm), "w": 2})}
    for method in ("mapfuse", "segfuse", "bayesfuse"):
        cases[method] = (ranx.optimize_fusion(ranx_qrels, [ranx.Run(r) for r in runs], norm=norm, method=method),
                         train(qrels, runs, method, norm))
    for method, (want_params, got_params) in cases.items():
        assert set(got_params) == set(want_params), method
        for key in set(want_params) - {"w"}:
            assert len(got_params[key]) == len(want_params[key]) == 3, (method, key)
            for w, g in zip(want_params[key], got_params[key]):
                assert g == pytest.approx(np.asarray(w), rel=1e-9, abs=1e-15), (method, key)
        want = ranx.fuse([ranx.Run(r) for r in runs], norm=norm, method=method, params=want_params).to_dict()
        got = se.fuse(runs, method, norm, params=got_params)
        assert list(got) == list(want)
        for q in want:
            assert set(got[q]) == set(want[q])
            for d, v in want[q].items():
                assert got[q][d] == pytest.approx(v, rel=1e-9, abs=1e-12), (method, q, d)


def _condorcet_runs(seed=7):
    """3 runs of 20 queries over the same 12 documents, their scores noisy copies of one another's,
    so that pairwise votes mostly order the documents (all distinct scores)."""
    rng = np.random.default_rng(seed)
    base = {f"q{q}": rng.normal(size=12) for q in range(20)}
    return [{q: {f"d{i}": float(b[i] + rng.normal(scale=0.4)) for i in range(12)} for q, b in base.items()}
            for _ in range(3)]


def _votes_order(runs, q, docs, weights, inverted):
    """Whether the pairwise votes (a run ranking x above y votes for x) put every document of ``docs``
    before every later one, so that any sort, ranx's over a Python set's order included, gives ``docs``."""
    ranks = [{d: i for i, d in enumerate(sorted(r[q], key=r[q].get, reverse=not inverted))} for r in runs]

    def wins(x, y):
        x_votes = sum(w for w, rk in zip(weights, ranks) if rk[x] < rk[y])
        return x_votes > sum(weights) - x_votes

    return all(wins(x, y) for i, x in enumerate(docs) for y in docs[i + 1:])


@pytest.mark.parametrize("norm", ["min-max", "min-max-inverted", None])
@pytest.mark.parametrize("method, params", [("condorcet", {}), ("w_condorcet", {"weights": [0.2, 0.45, 0.35]})])
def test_condorcet_equal_to_ranx(method, norm, params):
    """condorcet and w_condorcet equal ranx's fused runs on every query whose pairwise votes order the
    documents (no cycle: then ranx's order depends on a Python set's; the weights tie no two sets of runs)."""
    ranx = pytest.importorskip("ranx")
    runs = _condorcet_runs()
    want = ranx.fuse([ranx.Run(r) for r in runs], norm=norm, method=method, params=params).to_dict()
    got = se.fuse(runs, method, norm, params=params)
    assert list(got) == list(want)
    compared = 0
    for q in want:
        assert set(got[q]) == set(want[q])
        if _votes_order(runs, q, list(want[q]), params.get("weights", [1, 1, 1]), norm == "min-max-inverted"):
            assert list(got[q].items()) == list(want[q].items()), q
            compared += 1
    assert compared >= 10
