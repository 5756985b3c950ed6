"""streameval.fusion.optimize against ranx 0.3.21's optimize_fusion (issue 42 item 5): the same grid,
trial for trial the same metric value wherever the two fused runs rank the documents alike, and the
same chosen parameters; the command's --optimize; errors.

Data: 3 runs returning the same 30 documents for each of 25 queries with continuous random scores
(ties in a fused run come from the method only: rank-based methods tie by construction, and where
they do ranx's unstable sort and trec_eval's docno order can rank the tied documents differently; those
trials are compared to our own fuse + evaluate instead).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import streameval as se
from streameval import fusion as F
from streameval.cli import main as cli_main
from streameval.metrics.names import MetricNameError

RANX_NAME = {"combgmnz": "gmnz"}


def _data(seed=5, n_queries=25, n_docs=30):
    rng = np.random.default_rng(seed)
    qrels, runs = {}, [{}, {}, {}]
    for i in range(n_queries):
        q = f"q{i}"
        docs = [f"d{j}" for j in range(n_docs)]
        qrels[q] = {d: int(rng.integers(0, 4)) for d in rng.choice(docs, 20, replace=False)}
        for r in runs:
            r[q] = {d: float(s) for d, s in zip(docs, rng.random(n_docs))}
    return qrels, runs


def _params_for_fuse(qrels, runs, method, params):
    if method == "probfuse":
        return F.train(qrels, runs, "probfuse", "min-max", n_segments=params["n_segments"])
    return params


def _same_order(ours: se.fusion.FusedRun, theirs: dict) -> bool:
    for q, docs in theirs.items():
        mine = list(ours[q])
        want = sorted(docs, key=docs.get, reverse=True)
        scores = sorted(docs.values(), reverse=True)
        if len(set(scores)) < len(scores) or mine != want:  # a tie in ranx's run, or another order
            return False
    return True


@pytest.mark.parametrize("method", ["wsum", "wmnz", "mixed", "w_bordafuse", "w_condorcet", "rrf", "combgmnz",
                                    "logn_isr", "rbc", "probfuse", "slidefuse"])
def test_optimize_equal_to_ranx(method):
    ranx = pytest.importorskip("ranx")
    qrels, runs = _data()
    metric = "ndcg@10"
    best, trials = F.optimize(qrels, runs, method, "min-max", metric, return_trials=True)
    want, report = ranx.optimize_fusion(ranx.Qrels(qrels), [ranx.Run(r) for r in runs], norm="min-max",
                                        method=RANX_NAME.get(method, method), metric=metric,
                                        return_optimization_report=True, show_progress=False)
    key = F.SEARCHED[method]
    assert len(trials) == len(report.results) == len(report.configs)
    compared = 0
    for t, config, value in zip(trials, report.configs, report.results):
        # the same grid, in the same order
        if key == "weights":
            assert [float(x) for x in t.params["weights"]] == [float(x) for x in
                                                                config.strip("()").replace("np.float64(", "")
                                                                .replace(")", "").split(", ")]
        else:
            assert float(t.params[key]) == float(config)
        params = _params_for_fuse(qrels, runs, method, t.params)
        ours = se.fuse(runs, method, "min-max", params=params)
        assert t.score == pytest.approx(float(se.evaluate(qrels, dict(ours), metric)), rel=1e-12)
        theirs_params = {"weights": list(params["weights"])} if key == "weights" else (
            {"probs": params["probs"]} if method == "probfuse" else params)
        theirs = ranx.fuse([ranx.Run(r) for r in runs], norm="min-max", method=RANX_NAME.get(method, method),
                           params=theirs_params).to_dict()
        if _same_order(ours, theirs):
            compared += 1
            assert t.score == pytest.approx(value, rel=1e-9, abs=1e-12), (method, t.params)
    # the trials that could be compared were, and the choice is ranx's (w_condorcet: ranx sorts the candidates
    # from a Python set's order, which changes between processes, so its scores and choice do too)
    assert compared >= (1 if method in ("rrf", "w_bordafuse", "slidefuse", "rbc", "w_condorcet")
                        else len(trials) // 2), compared
    if key == "n_segments":
        assert len(best["probs"][0]) == len(want["probs"][0])
        for a, b in zip(best["probs"], want["probs"]):
            assert np.asarray(a) == pytest.approx(np.asarray(b), rel=1e-9)
    elif method != "w_condorcet":
        assert np.asarray(best[key], dtype=float) == pytest.approx(np.asarray(want[key], dtype=float))
    if method == "slidefuse":
        for a, b in zip(best["probs"], want["probs"]):
            assert np.asarray(a) == pytest.approx(np.asarray(b), rel=1e-9)
    # the last of the best: no later trial scores higher, none scores higher at all
    top = max(t.score for t in trials)
    last = max(i for i, t in enumerate(trials) if t.score >= top)
    assert trials[last].score == top


@pytest.mark.parametrize("method", ["posfuse", "mapfuse", "segfuse", "bayesfuse"])
def test_optimize_trained_methods_is_train(method):
    qrels, runs = _data(n_queries=8)
    got, trials = F.optimize(qrels, runs, method, "min-max", "map", return_trials=True)
    assert trials == []
    want = F.train(qrels, runs, method, "min-max")
    assert set(got) == set(want)
    for k in want:
        for a, b in zip(got[k], want[k]):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_optimize_by_hand_two_runs():
    """wsum on two runs, by hand: run a ranks the relevant document first, run b last; a weight on a of
    more than 2/3 puts it first."""
    qrels = {"q": {"rel": 1, "x": 0, "y": 0}}
    a = {"q": {"rel": 3.0, "x": 2.0, "y": 1.0}}
    b = {"q": {"rel": 1.0, "x": 3.0, "y": 2.0}}
    best, trials = F.optimize(qrels, [a, b], "wsum", "min-max", "recip_rank", return_trials=True)
    assert [t.params["weights"] for t in trials] == [[round(0.1 * i, 1), round(1 - 0.1 * i, 1)] for i in range(11)]
    by_weight = {t.params["weights"][0]: t.score for t in trials}
    # min-max: a = (1, 0.5, 0), b = (0, 1, 0.5) for rel, x, y; rel's fused w, x's 0.5 w + (1 - w)
    for w, score in by_weight.items():
        rel, x, y = w, 0.5 * w + (1 - w), 0.5 * (1 - w)
        rank = 1 + (x > rel) + (y > rel)
        assert score == 1 / rank, (w, score)
    assert [w for w, s in by_weight.items() if s == 1.0] == [0.7, 0.8, 0.9, 1.0]
    assert best["weights"] == [1.0, 0.0]  # the last of the best


def test_optimize_errors():
    qrels, runs = _data(n_queries=3)
    with pytest.raises(F.FusionNameError, match="combsum has no parameter to search or learn"):
        F.optimize(qrels, runs, "combsum")
    with pytest.raises(F.FusionNameError, match="closest: wsum"):
        F.optimize(qrels, runs, "wsun")
    with pytest.raises(MetricNameError):
        F.optimize(qrels, runs, "wsum", metric="ndgc@10")
    with pytest.raises(ValueError, match="at least two runs"):
        F.optimize(qrels, runs[:1], "wsum")
    with pytest.raises(ValueError, match="step must be in"):
        F.optimize(qrels, runs, "wsum", step=0)
    with pytest.raises(ValueError, match="takes no step"):
        F.optimize(qrels, runs, "slidefuse", step=2)


def _write(path, run):
    with open(path, "w") as f:
        for q, docs in run.items():
            for i, (d, s) in enumerate(sorted(docs.items(), key=lambda x: -x[1])):
                f.write(f"{q} Q0 {d} {i + 1} {s!r} t\n")


def test_command_optimize(tmp_path, capsys):
    qrels, runs = _data(n_queries=6)
    paths = []
    for i, r in enumerate(runs):
        paths.append(str(tmp_path / f"run{i}.txt"))
        _write(paths[-1], r)
    qp = tmp_path / "qrels.txt"
    qp.write_text("".join(f"{q} 0 {d} {g}\n" for q, docs in qrels.items() for d, g in docs.items()))
    out = tmp_path / "fused.txt"
    rc = cli_main(["fuse", *paths, "--method", "wsum", "--qrels", str(qp), "--optimize", "ndcg@10", "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    params = json.loads(captured.out)
    want = F.optimize(qrels, runs, "wsum", "min-max", "ndcg@10")
    assert params == {"weights": [float(x) for x in want["weights"]]}
    fused = se.fuse(runs, "wsum", params=want)
    lines = out.read_text().splitlines()
    assert len(lines) == sum(len(d) for d in fused.values())
    assert lines[0].split()[2] == next(iter(fused[sorted(fused)[0]]))
    # a trained method with --qrels: learnt, then fused
    rc = cli_main(["fuse", *paths, "--method", "posfuse", "--qrels", str(qp), "-o", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert len(json.loads(captured.out)["probs"]) == 3
    # without --qrels a trained method is refused in one line
    rc = cli_main(["fuse", *paths, "--method", "posfuse", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--qrels" in err and err.count("\n") == 1
    rc = cli_main(["fuse", *paths, "--method", "wsum", "--optimize", "ndcg@10", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--optimize needs --qrels" in err
