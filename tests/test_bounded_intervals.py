"""Intervals of metrics bounded in [0, 1] stay in [0, 1] (issue 43, item 6).

When the t interval of a bounded metric (nDCG, AP, AUC, ...) leaves [0, 1], the rows carry the
logit-transformed interval (``ci_method`` ``logit``; ``--ci-bounded t`` keeps the t interval).
Reference: statsmodels' fractional logit (Papke and Wooldridge 1996: a binomial GLM with logit link
and intercept only, fitted to the per-query values, whose intercept is logit(mean)) with its
sandwich standard error (HC0 times sqrt(n / (n - 1)), the HC1 small-sample scale, which statsmodels'
GLM does not apply itself), t quantile with n - 1 degrees of freedom from scipy.stats; the per-query
nDCG values and the AUC with its DeLong standard error computed by hand here."""

import json
import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
import statsmodels.api as sm
from scipy.special import expit

from streameval.io import avro
from streameval.metrics import stats

T0 = 1_700_000_000_000_000


def fractional_logit_interval(values, level=0.95):
    """statsmodels' fractional logit interval of the mean of ``values`` (see the module)."""
    y = np.asarray(values, dtype=float)
    n = len(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-integer "counts" of the binomial family: intended
        res = sm.GLM(y, np.ones((n, 1)), family=sm.families.Binomial()).fit(cov_type="HC0", tol=1e-14, maxiter=200)
    b, bse = res.params[0], res.bse[0] * math.sqrt(n / (n - 1))
    q = st.t.ppf((1 + level) / 2, n - 1)
    return expit(b - q * bse), expit(b + q * bse)


def logit_reference(mean, n, se, level=0.95):
    """The same interval from a row's mean, count and standard error (delta method)."""
    q = st.t.ppf((1 + level) / 2, n - 1)
    c = math.log(mean / (1 - mean))
    h = q * se / (mean * (1 - mean))
    return expit(c - h), expit(c + h)


@pytest.mark.parametrize("seed", range(8))
def test_logit_interval_equals_statsmodels_fractional_logit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 30))
    y = np.clip(rng.beta(0.4, 1.5, n), 0, 1)
    y[0] = 0.0
    y[1] = 0.9
    m, se = y.mean(), y.std(ddof=1) / math.sqrt(n)
    level = (0.9, 0.95, 0.99)[seed % 3]
    lo, hi = stats.logit_interval(m, n, se, level)
    ref = fractional_logit_interval(y, level)
    assert lo == pytest.approx(ref[0], rel=1e-9) and hi == pytest.approx(ref[1], rel=1e-9)
    assert 0 < lo < m < hi < 1


def test_row_interval_uses_logit_only_where_the_t_interval_leaves_the_range():
    # the ndcg@10 row: n = 3, t interval [-0.69, 1.29]
    t = stats.row_interval("ndcg@10", 0.3, 3, 0.23, bounded="t")
    assert t["ci_method"] == "t" and t["ci_low"] == pytest.approx(0.3 - st.t.ppf(0.975, 2) * 0.23, rel=1e-12)
    assert t["ci_low"] < 0 and t["ci_high"] > 1
    row = stats.row_interval("ndcg@10", 0.3, 3, 0.23)
    assert row["ci_method"] == "logit"
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(logit_reference(0.3, 3, 0.23), rel=1e-12)
    for name in ("auc", "map", "P@5", "gauc[user,impressions]", "rr_first_click", "snips[t]"):
        assert stats.row_interval(name, 0.3, 3, 0.23)["ci_method"] == "logit", name
    # not bounded in [0, 1]: the t interval as it is
    for name in ("dcg@10", "num_ret", "clicks@5", "ips[t]", "logloss"):
        assert stats.row_interval(name, 0.3, 3, 0.23)["ci_method"] == "t", name
    # the t interval inside [0, 1]: unchanged
    inside = stats.row_interval("ndcg@10", 0.5, 100, 0.02)
    assert inside["ci_method"] == "t" and inside["ci_low"] == pytest.approx(0.5 - st.t.ppf(0.975, 99) * 0.02)
    # a value outside (0, 1) (nDCG with negative grades): t
    assert stats.row_interval("ndcg@10", -0.1, 3, 0.3)["ci_method"] == "t"
    with pytest.raises(ValueError, match="bounded"):
        stats.row_interval("ndcg@10", 0.3, 3, 0.23, bounded="clip")


# --------------------------------------------------------------------------------------------
# the jobs

SCORES = {"q0": (0.9, 0.2), "q1": (0.8, 0.3), "q2": (0.4, 0.7)}
CLICKS = {"q0": (False, True), "q1": (True, False), "q2": (True, False)}


def _inputs(tmp_path):
    imps, judg = [], []
    for qi, q in enumerate(sorted(SCORES)):
        for pos, item in enumerate(["a", "b"], 1):
            imps.append({"event_id": f"{q}{item}", "request_id": f"r{q}", "query_id": q, "user_id": f"u{qi}",
                         "system_id": "S", "item_id": item, "position": pos, "score": SCORES[q][pos - 1],
                         "clicked": CLICKS[q][pos - 1], "timestamp": T0 + qi, "propensity": None, "attributes": {},
                         "dwell_ms": None})
        # q0, q1: the relevant item was not shown (nDCG 0); q2: item a, ranked second by score
        judg.append({"query_id": q, "item_id": "a" if q == "q2" else "c", "grade": 1, "timestamp": T0,
                     "source": "t", "subtopic": None})
    avro.write_records(str(tmp_path / "imps.avro"), "impression", imps)
    avro.write_records(str(tmp_path / "judg.avro"), "judgment", judg)
    return str(tmp_path / "imps.avro"), str(tmp_path / "judg.avro")


def _hand_values():
    ndcg = [0.0, 0.0, 1 / math.log2(3)]
    pos = [s for q in SCORES for s, c in zip(SCORES[q], CLICKS[q]) if c]
    neg = [s for q in SCORES for s, c in zip(SCORES[q], CLICKS[q]) if not c]
    psi = np.array([[1.0 if x > y else 0.5 if x == y else 0.0 for y in neg] for x in pos])
    auc = psi.mean()
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)  # DeLong et al. 1988's structural components
    se = math.sqrt(np.var(v10, ddof=1) / len(pos) + np.var(v01, ddof=1) / len(neg))
    return ndcg, auc, se


def _rows(paths):
    rows = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                rows[r["metric"]] = r
    return rows


def _check(rows, bounded):
    ndcg, auc, auc_se = _hand_values()
    r = rows["ndcg@10"]
    assert r["num_queries"] == 3 and r["value"] == pytest.approx(np.mean(ndcg), rel=1e-12)
    a = rows["auc"] if "auc" in rows else None
    if bounded == "logit":
        assert r["ci_method"] == "logit"
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(fractional_logit_interval(ndcg), rel=1e-9)
        assert 0 < r["ci_low"] < r["ci_high"] < 1
        if a is not None:
            assert a["value"] == pytest.approx(auc, rel=1e-12) and a["stderr"] == pytest.approx(auc_se, rel=1e-12)
            assert a["ci_method"] == "logit" and 0 < a["ci_low"] < a["ci_high"] < 1
            assert (a["ci_low"], a["ci_high"]) == pytest.approx(logit_reference(auc, 6, auc_se), rel=1e-9)
    else:
        ref = st.t.interval(0.95, 2, loc=np.mean(ndcg), scale=np.std(ndcg, ddof=1) / math.sqrt(3))
        assert r["ci_method"] == "t" and (r["ci_low"], r["ci_high"]) == pytest.approx(ref, rel=1e-9)
        assert r["ci_low"] < 0
        if a is not None:
            ref = st.t.interval(0.95, 5, loc=auc, scale=auc_se)
            assert a["ci_method"] == "t" and (a["ci_low"], a["ci_high"]) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("engine,bounded", [("columnar", "logit"), ("records", "logit"), ("columnar", "t")])
def test_batch_job_bounded_intervals(tmp_path, engine, bounded):
    from streameval.jobs import batch

    imps, judg = _inputs(tmp_path)
    out = tmp_path / "out"
    assert batch.main(["--impressions", imps, "--judgments", judg, "--metrics", "ndcg@10,auc", "--labels", "clicks",
                       "--engine", engine, "--ci-bounded", bounded, "--output", str(out)]) == 0
    _check(_rows([out / "metrics.jsonl"]), bounded)


@pytest.mark.parametrize("engine,metrics", [("columnar", "ndcg@10,auc"), ("events", "ndcg@10")])
def test_stream_job_bounded_intervals(tmp_path, engine, metrics):
    from streameval.jobs import stream

    imps, judg = _inputs(tmp_path)
    out = tmp_path / "out"
    extra = ["--labels", "clicks"] if "auc" in metrics else []
    assert stream.main(["--replay", "--impressions", imps, "--judgments", judg, "--window", "1h", "--metrics", metrics,
                        *extra, "--engine", engine, "--output", str(out)]) == 0
    _check(_rows(sorted(out.glob("metrics-*.jsonl"))), "logit")
