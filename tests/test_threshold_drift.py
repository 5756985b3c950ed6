"""pr_auc, precision / recall / f1 at a score threshold, psi[score] and ks[score] (issue 43 item 7).

Numbers against independent references: scikit-learn's average_precision_score, precision_score,
recall_score, f1_score; a hand-written numpy PSI over the reference's deciles; scipy.stats.ks_2samp.
Through the batch job (both engines), streameval.evaluate_log, the mergeable state, and the errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score

import streameval
from streameval.io import avro
from streameval.jobs import batch

T0 = 1_574_553_600_000_000
METRICS = ["pr_auc", "precision[t=0.5]", "recall[t=0.5]", "f1[t=0.5]", "precision[t=0.3]", "recall[t=0.72]",
           "psi[score]", "ks[score]"]


def _log(seed=5, n_requests=150, shift=0.0):
    rng = np.random.default_rng(seed)
    recs = []
    for r in range(n_requests):
        system = "ab"[r % 2]
        campaign = ["men", "women"][r % 3 % 2]
        for p in range(1, int(rng.integers(1, 5)) + 1):
            score = round(float(min(max(rng.random() + shift, 0.0), 1.0)), 2)  # ties on purpose
            recs.append({"event_id": f"{system}/{r}/{p}", "request_id": f"r{r}", "query_id": f"q{r % 5}",
                         "user_id": f"u{r % 9}", "system_id": system, "item_id": f"i{p}", "position": p,
                         "score": score, "clicked": bool(rng.random() < 0.2 + 0.5 * score),
                         "timestamp": T0 + r * 1000 + p, "propensity": None, "attributes": {"campaign": campaign},
                         "dwell_ms": None})
    return recs


def _reference_scores(seed=11, n=400):
    rng = np.random.default_rng(seed)
    return np.round(rng.beta(2, 3, n), 2)


def _psi_by_hand(actual, expected):
    """PSI over the expected sample's deciles (np.quantile, duplicates dropped; bin i holds
    edges[i-1] < x <= edges[i]), zero proportions replaced by 1e-4."""
    edges = np.unique(np.quantile(expected, np.linspace(0.1, 0.9, 9)))
    full = np.concatenate(([-np.inf], edges, [np.inf]))
    a = np.array([np.sum((actual > lo) & (actual <= hi)) for lo, hi in zip(full[:-1], full[1:])]) / len(actual)
    e = np.array([np.sum((expected > lo) & (expected <= hi)) for lo, hi in zip(full[:-1], full[1:])]) / len(expected)
    a = np.where(a == 0, 1e-4, a)
    e = np.where(e == 0, 1e-4, e)
    return float(np.sum((a - e) * np.log(a / e)))


def _check_against_references(rows, df, ref):
    got = {(r["slice"], r["system"], r["metric"]): r for r in rows}
    checked = 0
    for (system, camp), g in list(df.groupby(["system_id", "campaign"])) + [((s, None), g) for s, g in
                                                                             df.groupby("system_id")]:
        label = "all" if camp is None else f"campaign={camp}"
        y, s = g["clicked"].to_numpy().astype(int), g["score"].to_numpy()

        def row(m):
            return got[(label, system, m)]

        assert row("pr_auc")["value"] == pytest.approx(average_precision_score(y, s), abs=1e-12)
        assert row("pr_auc")["num_queries"] == len(g)
        for t in (0.5, 0.3):
            pred = (s >= t).astype(int)
            r = row(f"precision[t={t}]")
            assert r["value"] == pytest.approx(precision_score(y, pred), abs=1e-15)
            assert r["num_queries"] == pred.sum() and r["ci_method"] == "wilson"
            assert r["ci_low"] < r["value"] < r["ci_high"]
        pred = (s >= 0.5).astype(int)
        assert row("recall[t=0.5]")["value"] == pytest.approx(recall_score(y, pred), abs=1e-15)
        assert row("recall[t=0.5]")["num_queries"] == y.sum()
        assert row("recall[t=0.72]")["value"] == pytest.approx(recall_score(y, (s >= 0.72).astype(int)), abs=1e-15)
        assert row("f1[t=0.5]")["value"] == pytest.approx(f1_score(y, pred), abs=1e-15)
        assert row("f1[t=0.5]")["ci_low"] is None
        assert row("psi[score]")["value"] == pytest.approx(_psi_by_hand(s, ref), abs=1e-12)
        ks = ks_2samp(s, ref)
        assert row("ks[score]")["value"] == pytest.approx(ks.statistic, abs=1e-15)
        assert row("ks[score]:p_value")["value"] == pytest.approx(ks.pvalue, rel=1e-9)
        checked += 1
    assert checked == 6


def _frame(recs):
    df = pd.DataFrame(recs)
    df["campaign"] = [r["attributes"]["campaign"] for r in recs]
    return df


def _job(tmp_path, recs, ref_path, engine="columnar", extra=()):
    path = tmp_path / "imps.avro"
    avro.write_records(path, "impression", recs)
    out = tmp_path / f"out-{engine}"
    rc = batch.main(["--impressions", str(path), "--metrics", ",".join(METRICS), "--slices", "campaign",
                     "--drift-reference", str(ref_path), "--output", str(out), "--quiet", "--engine", engine, *extra])
    assert rc == 0
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def test_batch_job_and_evaluate_log_equal_the_references(tmp_path):
    recs = _log()
    ref = _reference_scores()
    ref_path = tmp_path / "reference.txt"
    ref_path.write_text("# reference scores\n" + "\n".join(repr(float(x)) for x in ref) + "\n")
    df = _frame(recs)
    columnar = _job(tmp_path, recs, ref_path)
    _check_against_references(columnar, df, ref)
    records = _job(tmp_path, recs, ref_path, engine="records")
    lib = streameval.evaluate_log(df.drop(columns=["campaign"]), METRICS, by="campaign", reference=ref)
    key = lambda r: (r["slice"], r["system"], r["metric"])  # noqa: E731
    fields = ("value", "num_queries", "stderr", "ci_low", "ci_high", "ci_method", "metric_canonical")
    for other in (records, lib):
        a = {key(r): r for r in columnar if not r["metric"].startswith("ctr")}
        b = {key(r): r for r in other if not r["metric"].startswith("ctr")}
        assert set(a) == set(b)
        for k in a:
            assert all(a[k][f] == b[k][f] for f in fields), (k, a[k], b[k])
    # a reference given as an impression Avro file: its scores with a logged click flag
    ref_recs = [dict(r, score=float(x), event_id=f"ref{i}", request_id=f"ref{i}", clicked=bool(i % 2))
                for i, (r, x) in enumerate(zip(recs, ref))]
    avro.write_records(tmp_path / "ref.avro", "impression", ref_recs)
    from_avro = streameval.evaluate_log(df, ["psi[score]", "ks[score]"], reference=str(tmp_path / "ref.avro"))
    sub = ref[:len(ref_recs)]
    for r in from_avro:
        s = df[df["system_id"] == r["system"]]["score"].to_numpy()
        if r["metric"] == "psi[score]":
            assert r["value"] == pytest.approx(_psi_by_hand(s, sub), abs=1e-12)
        elif r["metric"] == "ks[score]":
            assert r["value"] == pytest.approx(ks_2samp(s, sub).statistic, abs=1e-15)


def test_pr_auc_state_merges_in_any_order_and_large_ks_is_asymptotic():
    from streameval.accumulators.online import AucOps, CountArrays
    from streameval.metrics.online import parse_online_metrics
    from streameval.metrics.threshold import DriftReference, score_count_results

    rng = np.random.default_rng(3)
    s = np.round(rng.random(3000), 3)
    y = rng.random(3000) < s
    specs = parse_online_metrics(["pr_auc", "precision[t=0.4]", "f1[t=0.4]", "ks[score]", "psi[score]"])
    ref_scores = np.round(rng.random(12000) ** 1.3, 3)
    ref = DriftReference(ref_scores)
    whole = score_count_results(specs, *AucOps.value_counts(AucOps.add_many({}, s, y)), ref)
    assert whole[0][1] == pytest.approx(average_precision_score(y, s), abs=1e-12)
    ks = ks_2samp(s, ref_scores)  # n2 > 10000: scipy's asymptotic p-value
    assert whole[3][1] == pytest.approx(ks.statistic, abs=1e-15) and whole[4][1] == pytest.approx(ks.pvalue, rel=1e-9)
    idx = list(range(3000))
    for seed in range(4):
        random.Random(seed).shuffle(idx)
        cuts = sorted(random.Random(seed).sample(range(1, 3000), 5))
        parts = [np.array(idx[a:b]) for a, b in zip([0, *cuts], [*cuts, 3000])]
        states = [AucOps.add_many({}, s[p], y[p]) for p in parts]
        random.Random(seed + 9).shuffle(states)
        assert score_count_results(specs, *AucOps.value_counts(AucOps.merge(states)), ref) == whole
        arrays = [st for p in parts for _, st in CountArrays.by_key(np.zeros(len(p)), s[p], y[p])]
        assert score_count_results(specs, *CountArrays.arrays(CountArrays.merge(arrays[::-1])), ref) == whole


def test_names_and_alert_rules():
    from streameval.plan.alerts import unknown_measure
    from streameval.metrics.names import MetricNameError
    from streameval.metrics.online import parse_online_metric

    assert parse_online_metric("precision[score>=0.50]").name == "precision[t=0.5]"
    assert parse_online_metric("F1[t=1e-3]").name == "f1[t=0.001]"
    assert parse_online_metric("average_precision").name == "pr_auc"
    assert parse_online_metric("psi").name == "psi[score]"
    for bad in ("precision[t=abc]", "recall[t=]", "f1[t=nan]", "ks[feature_x]"):
        with pytest.raises(MetricNameError) as e:
            parse_online_metric(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(MetricNameError, match="closest accepted names: pr_auc"):
        parse_online_metric("pr_aux")
    for name in ("pr_auc", "precision[t=0.5]", "recall[t=0.5]", "f1[t=0.5]", "psi[score]", "ks[score]",
                 "ks[score]:p_value"):
        assert unknown_measure(name) is None, name


def test_job_errors_are_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "imps.avro"
    avro.write_records(path, "impression", _log(n_requests=10))
    base = ["--impressions", str(path), "--output", str(tmp_path / "out"), "--quiet"]
    cases = [(["--metrics", "precision[t=0.5x]"], "bad threshold"),
             (["--metrics", "psi[score]", "--drift-reference", str(tmp_path / "nope.txt")], "no such file"),
             (["--metrics", "ks[score]"], "needs --drift-reference"),
             (["--metrics", "pr_auc", "--drift-reference", str(path)], "name one in --metrics")]
    bad_ref = tmp_path / "bad.txt"
    bad_ref.write_text("0.5\nhello\n")
    cases.append((["--metrics", "psi[score]", "--drift-reference", str(bad_ref)], "line 2"))
    for argv, text in cases:
        assert batch.main([*base, *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert text in err and len(err.splitlines()) == 1, err
    df = _frame(_log(n_requests=10))
    with pytest.raises(ValueError, match="needs reference="):
        streameval.evaluate_log(df, ["ks[score]"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        streameval.evaluate_log(df, ["ks[score]"], reference=str(tmp_path / "nope.txt"))


def test_streaming_job_refuses_naming_the_batch_job():
    from streameval.beam.streaming.coarse_online import online_refusal

    for name in ("pr_auc", "recall[t=0.5]", "psi[score]"):
        why = online_refusal([name])
        assert why and "streameval batch" in why and "\n" not in why
    assert online_refusal(["auc"]) is None
