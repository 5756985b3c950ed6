"""streameval.evaluate_log: the batch job's online metric rows in memory, without Beam (issue 42 item 6).

Checked against the batch job's metrics.jsonl bit for bit (the bundled sample and a random log with
scores, users, dwell and interleaving teams), against independent references (numpy counts,
scikit-learn's roc_auc_score, a hand-written impression-weighted mean of per-user AUCs), its errors,
and that no Beam is imported."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

import streameval
from streameval.io import avro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "data", "sample", "impressions")
DAY = 86_400_000_000
T0 = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z
FIELDS = ("value", "num_queries", "stderr", "ci_low", "ci_high", "ci_level", "ci_method", "metric_canonical",
          "window_end")


def _key(r):
    return (r["window_start"], r["slice"], r["system"], r["metric"])


def _job_rows(paths, metrics, tmp_path, extra=()):
    from streameval.jobs import batch

    out = str(tmp_path / "job")
    args = [a for p in paths for a in ("--impressions", p)]
    rc = batch.main([*args, "--metrics", ",".join(metrics), "--output", out, "--quiet", *extra])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return rc, [json.loads(line) for line in f]


def _assert_same(lib, job):
    a, b = {_key(r): r for r in lib}, {_key(r): r for r in job}
    assert len(a) == len(lib) and len(b) == len(job)
    assert set(a) == set(b), sorted(set(a) ^ set(b), key=str)[:10]
    for k, r in a.items():
        for f in FIELDS:
            assert r[f] == b[k][f] or (r[f] != r[f] and b[k][f] != b[k][f]), (k, f, r[f], b[k][f])


def test_sample_equals_batch_job_bit_for_bit(tmp_path):
    paths = sorted(glob.glob(os.path.join(SAMPLE, "*.avro")))
    df = pd.DataFrame([r for p in paths for r in avro.read_records(p)])
    metrics = ["ctr", "clicks@3", "rr_first_click", "abandonment"]
    rc, job = _job_rows(paths, metrics, tmp_path, ["--slices", "campaign", "--window", "1d"])
    assert rc == 0
    lib = streameval.evaluate_log(df, metrics, by="campaign", window="1d")
    assert len(lib) == len(job) > 300
    _assert_same(lib, job)
    # --slice-missing skip, as a frame (read_metrics' columns)
    frame = streameval.evaluate_log(df, ["ctr"], by="campaign", slice_missing="skip", as_frame=True)
    assert list(frame.columns[:12]) == ["window_start", "window_end", "slice", "slice_campaign", "system", "metric",
                                        "value", "n", "n_unit", "num_queries", "num_impressions", "num_requests"]
    # the count in the column of its unit: CTR counts impressions, not queries
    assert (frame["n_unit"] == "impressions").all() and frame["num_queries"].isna().all()
    assert (frame["num_impressions"] == frame["n"]).all() and frame["num_requests"].isna().all()
    assert {r["n_unit"] for r in lib if r["metric"] in ("clicks@3", "rr_first_click", "abandonment")} == {"requests"}
    assert not frame["slice"].str.contains("missing").any()
    # the slice's attribute as a column of its own (null on the "all" rows), windows as UTC timestamps
    assert (frame["slice"] == "campaign=" + frame["slice_campaign"]).where(frame["slice"] != "all", True).all()
    assert frame.loc[frame["slice"] == "all", "slice_campaign"].isna().all()
    assert str(frame["window_start"].dtype) == "datetime64[us, UTC]" and frame["window_start"].isna().all()


def _random_log(seed=7, n_requests=300):
    rng = np.random.default_rng(seed)
    recs = []
    for r in range(n_requests):
        system = ["a", "b"][r % 2]
        user = None if r % 17 == 0 else f"u{rng.integers(0, 25)}"
        campaign = ["men", "women", None][r % 3]
        t = T0 + int(rng.integers(0, 3 * DAY))
        for p in range(1, int(rng.integers(1, 6)) + 1):
            clicked = bool(rng.random() < 0.3)
            score = round(float(rng.random()), 2)  # ties on purpose
            rec = {"event_id": f"{system}/{r}/{p}", "request_id": f"r{r}", "query_id": f"q{r % 7}", "user_id": user,
                   "system_id": system, "item_id": f"i{p}-{rng.integers(0, 1000)}", "position": p,
                   "score": None if rng.random() < 0.05 else score, "clicked": clicked,
                   "timestamp": t + p * 1000, "propensity": None,
                   "attributes": {"team": "AB"[int(rng.integers(0, 2))],
                                  **({"campaign": campaign} if campaign else {})},
                   "dwell_ms": int(rng.integers(0, 60_000)) if clicked and rng.random() < 0.8 else None}
            recs.append(rec)
    recs.append(dict(recs[0]))  # a replay: counted once
    return recs


ONLINE = ["ctr", "auc", "auc_hist", "gauc[user]", "gauc[query,clicks]", "clicks@3", "rr_first_click[clicked]",
          "abandonment", "logloss", "brier", "calibration", "ece[bins=5]", "mean_dwell", "sat_click_rate[t=30s]",
          "interleaving"]


def test_random_log_equals_batch_job_bit_for_bit(tmp_path):
    recs = _random_log()
    path = str(tmp_path / "imps.avro")
    avro.write_records(path, "impression", recs)
    rc, job = _job_rows([path], ONLINE, tmp_path, ["--slices", "campaign", "--window", "1d"])
    assert rc == 0
    df = pd.DataFrame(recs)
    lib = streameval.evaluate_log(df, ONLINE, by=["campaign"], window="1d")
    families = {r["metric"].split(":")[0].split("[")[0] for r in lib}
    assert families >= {"auc", "auc_hist", "gauc", "ece", "interleaving", "mean_dwell", "sat_click_rate"}
    _assert_same(lib, job)


def test_references_per_slice_and_window():
    from sklearn.metrics import roc_auc_score

    recs = _random_log(seed=3, n_requests=200)[:-1]
    df = pd.DataFrame(recs)
    df["campaign"] = [r["attributes"].get("campaign") for r in recs]
    df = df.drop(columns=["attributes"])
    rows = streameval.evaluate_log(df, ["ctr", "auc", "gauc[user]"], by="campaign", window="1d",
                                   attributes=["campaign"])
    got = {_key(r): r for r in rows}
    df["day"] = (df["timestamp"] // DAY) * DAY
    checked = 0
    for (day, system, camp), g in df.groupby(["day", "system_id", df["campaign"].fillna("(missing)")]):
        label = f"campaign={camp}"
        ctr = got[(int(day), label, system, "ctr")]
        assert ctr["value"] == g["clicked"].sum() / len(g) and ctr["num_queries"] == len(g)
        s = g[g["score"].notna()]
        if s["clicked"].nunique() == 2:
            assert got[(int(day), label, system, "auc")]["value"] == pytest.approx(
                roc_auc_score(s["clicked"], s["score"]), abs=1e-12)
        per_user = [(len(u), roc_auc_score(u["clicked"], u["score"]))
                    for _, u in s[s["user_id"].notna()].groupby("user_id") if u["clicked"].nunique() == 2]
        key = (int(day), label, system, "gauc[user,impressions]")
        if per_user:
            w = np.array([n for n, _ in per_user], dtype=float)
            assert got[key]["value"] == pytest.approx(float((w * [a for _, a in per_user]).sum() / w.sum()), abs=1e-12)
            assert got[key]["num_queries"] == len(per_user)
            checked += 1
    assert checked > 5
    whole = streameval.evaluate_log(df, ["auc"])  # the global window, the all slice
    s = df[df["score"].notna()]
    for system, g in s.groupby("system_id"):
        assert got_value(whole, "all", system, "auc") == pytest.approx(roc_auc_score(g["clicked"], g["score"]),
                                                                          abs=1e-12)


def got_value(rows, slice_label, system, metric):
    (row,) = [r for r in rows if r["slice"] == slice_label and r["system"] == system and r["metric"] == metric]
    return row["value"]


def _small():
    return pd.DataFrame(_random_log(seed=1, n_requests=10)[:-1])


def test_errors():
    df = _small()
    with pytest.raises(ValueError, match=r"^unknown metric 'acu'.*auc") as e:
        streameval.evaluate_log(df, ["acu"])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="ranking metric.*streameval.evaluate"):
        streameval.evaluate_log(df, ["ndcg@10"])
    with pytest.raises(ValueError, match="required impression field.*position"):
        streameval.evaluate_log(df.drop(columns=["position"]), ["ctr"])
    renamed = df.rename(columns={"position": "rank"})
    assert streameval.evaluate_log(renamed, ["ctr"], columns={"position": "rank"}) == \
        streameval.evaluate_log(df, ["ctr"])
    with pytest.raises(ValueError, match="has no unit"):
        streameval.evaluate_log(df, ["ctr"], window="1")
    with pytest.raises(ValueError, match="cannot parse window"):
        streameval.evaluate_log(df, ["ctr"], window="1 fortnight")
    with pytest.raises(ValueError, match="sliding window"):
        streameval.evaluate_log(df, ["auc"], window="1h/20m")


def test_metric_without_rows_does_not_vanish():
    df = _small()
    df["user_id"] = None
    with pytest.raises(streameval.MetricsWithoutRowsError, match=r"gauc\[user") as e:
        streameval.evaluate_log(df, ["ctr", "gauc[user]"])
    assert e.value.names == ["gauc[user]"] and any(r["metric"] == "ctr" for r in e.value.rows)


def test_dead_letters_left_out_with_a_warning():
    df = _small()
    df.loc[0, "position"] = 0
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rows = streameval.evaluate_log(df, ["ctr"])
    assert any("position must be >= 1" in str(x.message) for x in w)
    assert sum(r["num_queries"] for r in rows if r["metric"] == "ctr" and r["slice"] == "all") == len(df) - 1


def test_no_beam_imported():
    code = ("import sys, pandas as pd, streameval\n"
            "df = pd.DataFrame([{'event_id': 'e1', 'request_id': 'r1', 'query_id': 'q', 'system_id': 's',"
            " 'item_id': 'i', 'position': 1, 'timestamp': 0, 'clicked': True, 'score': 0.5, 'user_id': 'u'}])\n"
            "rows = streameval.evaluate_log(df, ['ctr', 'clicks@1'], by='campaign', window='1d', as_frame=True)\n"
            "assert len(rows) > 0\n"
            "assert 'apache_beam' not in sys.modules, 'apache_beam imported'\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
