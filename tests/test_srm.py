"""Sample-ratio mismatch rows (``--expected-split``) and the ``test = "srm"`` alert rule (issue 43, item 2).

Reference: scipy.stats.chisquare on the requests per system counted here from the raw records
(each request once, in the window of its earliest impression and the slice of its attribute)."""

import json
import math
import random

import numpy as np
import pytest
import scipy.stats as st

from streameval.plan import alerts
from streameval.beam.prometheus import rule_expressions
from streameval.io import avro
from streameval.metrics import stats

HOUR = 3_600_000_000
T0 = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR


@pytest.mark.parametrize("seed", range(10))
def test_srm_test_equals_scipy_chisquare(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 6))
    w = rng.uniform(0.5, 3, k)
    shares = w / w.sum()
    obs = rng.multinomial(int(rng.integers(10, 100_000)), rng.dirichlet(np.ones(k) * 50))
    chi2, p = stats.srm_test(obs, shares)
    ref = st.chisquare(obs, f_exp=obs.sum() * shares)
    assert chi2 == pytest.approx(ref.statistic, rel=1e-12)
    assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


def test_srm_of_the_issue_and_edge_cases():
    # 50.8 / 49.2 % of 1 M users against a 50 / 50 split: a broken experiment
    chi2, p = stats.srm_test([508_000, 492_000], [0.5, 0.5])
    assert chi2 == pytest.approx(256.0, rel=1e-12) and p == pytest.approx(st.chisquare([508_000, 492_000]).pvalue, rel=1e-9)
    assert all(math.isnan(x) for x in stats.srm_test([0, 0], [0.5, 0.5]))
    assert stats.parse_expected_split("A=50, B=25,C=25") == {"A": 0.5, "B": 0.25, "C": 0.25}
    for bad, msg in [("A=1", "two systems"), ("A=1,A=2", "twice"), ("A=1,B=0", "positive"), ("A=1,B=x", "not a number"),
                     ("A,B", "SYSTEM=WEIGHT"), ("A=1,B=nan", "positive")]:
        with pytest.raises(ValueError, match=msg):
            stats.parse_expected_split(bad)


# --------------------------------------------------------------------------------------------
# the batch job

SPLIT = {"A": 2, "B": 1, "D": 1}


def _log(tmp_path):
    rnd = random.Random(11)
    recs = []
    sizes = {"A": 150, "B": 60, "C": 9, "D": 40}  # C: not in the split; D: desktop only
    for s, k in sizes.items():
        for i in range(k):
            dev = "desktop" if s == "D" or i % 3 == 0 else "mobile"
            t = T0 + rnd.randrange(0, 2 * HOUR)
            for pos in (1, 2, 3):
                # later impressions of a request may fall in the next hour: the request stays in the first
                recs.append({"event_id": f"{s}{i}-{pos}", "request_id": f"{s}{i}", "query_id": f"q{i % 7}",
                             "user_id": None, "system_id": s, "item_id": f"it{pos}", "position": pos, "score": None,
                             "clicked": rnd.random() < 0.3, "timestamp": t + pos * 600_000_000,
                             "propensity": None, "attributes": {"device": dev}, "dwell_ms": None})
    rnd.shuffle(recs)
    path = tmp_path / "imps.avro"
    avro.write_records(str(path), "impression", recs)
    return str(path), recs


def _expected(recs, window):
    """{(window_start, slice): {system: requests}} counted from the raw records."""
    first: dict = {}
    for r in recs:
        k = (r["system_id"], r["request_id"])
        first[k] = min(first.get(k, (r["timestamp"], r)), (r["timestamp"], r), key=lambda x: x[0])
    out: dict = {}
    for (system, _), (t, r) in first.items():
        ws = None if window is None else t - t % window
        for label in ("all", f"device={r['attributes']['device']}"):
            d = out.setdefault((ws, label), {})
            d[system] = d.get(system, 0) + 1
    return out


@pytest.mark.parametrize("engine,window", [("columnar", None), ("records", "1h"), ("columnar", "1h")])
def test_batch_srm_rows_equal_scipy_chisquare(tmp_path, engine, window):
    from streameval.jobs import batch

    path, recs = _log(tmp_path)
    out = tmp_path / "out"
    args = ["--impressions", path, "--expected-split", "A=2,B=1,D=1", "--slices", "device", "--engine", engine,
            "--output", str(out)] + (["--window", window] if window else [])
    assert batch.main(args) == 0
    rows = {}
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["metric"].startswith("srm"):
                rows[(r["window_start"], r["slice"], r["system"], r["metric"])] = r
    expected = _expected(recs, HOUR if window else None)
    shares = np.array([2, 1, 1]) / 4
    assert {(ws, lab) for ws, lab, _, _ in rows} == set(expected)
    for (ws, lab), counts in expected.items():
        obs = np.array([counts.get(s, 0) for s in SPLIT])
        ref = st.chisquare(obs, f_exp=obs.sum() * shares)
        p = rows[(ws, lab, "*", "srm")]
        assert p["num_queries"] == obs.sum() and p["value"] == pytest.approx(ref.pvalue, rel=1e-9)
        assert rows[(ws, lab, "*", "srm:chi2")]["value"] == pytest.approx(ref.statistic, rel=1e-12)
        for s, n in zip(SPLIT, obs):  # D has no mobile request: its share row says 0
            share = rows[(ws, lab, s, "srm:share")]
            assert share["num_queries"] == n and share["value"] == pytest.approx(n / obs.sum(), rel=1e-12)
        other = counts.get("C", 0)
        if other:
            assert rows[(ws, lab, "*", "srm:undeclared_requests")]["value"] == other
        else:
            assert (ws, lab, "*", "srm:undeclared_requests") not in rows
    # the mobile slice has no D at all: a mismatch the test sees
    assert any(rows[(ws, lab, "*", "srm")]["value"] < 1e-3 for ws, lab in expected if lab == "device=mobile")


def test_batch_srm_sliding_windows_equal_the_sum_of_sub_windows(tmp_path):
    from streameval.jobs import batch

    path, recs = _log(tmp_path)
    out = tmp_path / "out"
    assert batch.main(["--impressions", path, "--expected-split", "A=2,B=1,D=1", "--window", "2h", "--every", "1h",
                       "--output", str(out)]) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    per_hour = _expected(recs, HOUR)
    for r in rows:
        if r["metric"] != "srm" or r["slice"] != "all":
            continue
        counts: dict = {}
        for start in (r["window_start"], r["window_start"] + HOUR):
            for s, n in per_hour.get((start, "all"), {}).items():
                counts[s] = counts.get(s, 0) + n
        obs = np.array([counts.get(s, 0) for s in SPLIT])
        assert r["value"] == pytest.approx(st.chisquare(obs, f_exp=obs.sum() * np.array([2, 1, 1]) / 4).pvalue, rel=1e-9)


def test_expected_split_errors_exit_2(tmp_path, capsys):
    from streameval.jobs import batch

    path, _ = _log(tmp_path)
    for bad in ("A=1", "A=1,B=-1"):
        assert batch.main(["--impressions", path, "--expected-split", bad, "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--expected-split" in err[0]


# --------------------------------------------------------------------------------------------
# the alert rule

def _srm_row(p, n=1000):
    return {"window_start": None, "window_end": None, "slice": "all", "system": "*", "metric": "srm", "value": p,
            "num_queries": n, "stderr": None, "ci_low": None, "ci_high": None}


def test_srm_alert_rule():
    rule, = alerts.parse_rules({"rule": [{"name": "split", "metric": "srm", "test": "srm", "p_below": 0.001}]})
    p = st.chisquare([508, 492]).pvalue  # 0.61: no alert
    assert alerts.evaluate([rule], [_srm_row(p)]) == []
    p = st.chisquare([50_800, 49_200]).pvalue  # 4e-7
    fired, = alerts.evaluate([rule], [_srm_row(p)])
    assert fired["p_value"] == p and "sample-ratio mismatch" in fired["condition"]
    for bad, msg in [({"metric": "ctr", "test": "srm", "p_below": 0.01}, "metric must be 'srm'"),
                     ({"metric": "srm", "test": "srm"}, "needs p_below"),
                     ({"metric": "srm", "p_below": 0.01}, "with test = 'srm'"),
                     ({"metric": "srm", "test": "srm", "p_below": 1.5}, r"in \(0, 1\)"),
                     ({"metric": "srm", "test": "srm", "p_below": 0.01, "below": 0.5}, "p_below only")]:
        with pytest.raises(ValueError, match=msg):
            alerts.parse_rules({"rule": [{"name": "r", **bad}]})
    (cond, expr, _), = rule_expressions(rule)
    assert cond == "srm" and 'metric="srm"' in expr and "< 0.001" in expr
