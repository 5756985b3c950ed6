"""Clustered standard error of CTR (``--cluster request|user``; issue 43, item 1).

Reference: statsmodels' cluster-robust OLS (``OLS(clicked, 1).fit(cov_type="cluster")``, whose
intercept is the CTR) on the raw impressions, per (window, slice, system); and a coverage
simulation with clicks correlated within users."""

import json
import math
import random

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.special import ndtri

from streameval.io import avro
from streameval.metrics.online_sums import clustered_ratio_from_sums

HOUR = 3_600_000_000
T0 = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR


def statsmodels_cluster(y, groups):
    codes = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)[1]
    res = sm.OLS(np.asarray(y, dtype=float), np.ones((len(y), 1))).fit(cov_type="cluster", cov_kwds={"groups": codes})
    return res.params[0], res.bse[0]


def _sums(n, y):
    n, y = np.asarray(n, dtype=np.int64), np.asarray(y, dtype=np.int64)
    return [int(x) for x in (n.sum(), y.sum(), (n * n).sum(), (n * y).sum(), (y * y).sum())]


@pytest.mark.parametrize("seed", range(6))
def test_clustered_ratio_equals_statsmodels_cluster_robust_ols(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.integers(2, 60))
    sizes = rng.integers(1, 12, g)
    rates = rng.beta(1, 3, g)
    clicks = rng.binomial(sizes, rates)
    y = np.concatenate([[1.0] * c + [0.0] * (s - c) for s, c in zip(sizes, clicks)])
    groups = np.repeat(np.arange(g), sizes)
    ref_r, ref_se = statsmodels_cluster(y, groups)
    r, se = clustered_ratio_from_sums(g, *_sums(sizes, clicks))
    assert r == pytest.approx(ref_r, rel=1e-12) and se == pytest.approx(ref_se, rel=1e-10)


def test_clustered_ratio_edge_cases():
    assert all(math.isnan(x) for x in clustered_ratio_from_sums(0, 0, 0, 0, 0, 0))
    r, se = clustered_ratio_from_sums(1, *_sums([5], [2]))
    assert r == 0.4 and math.isnan(se)
    # every cluster at the same rate: no variance between clusters
    assert clustered_ratio_from_sums(3, *_sums([2, 4, 6], [1, 2, 3]))[1] == 0.0


def test_coverage_with_correlated_clicks():
    """1,000 simulated experiments, 400 users each with 1-8 impressions and a user click rate drawn
    from Beta(1, 4) (true CTR: the expected clicks over the expected impressions = 0.2): the 95%
    clustered interval covers 0.2 in 93-97% of them; the independent-impression (binomial Wald)
    interval, printed beside it, far less often."""
    rng = np.random.default_rng(2026)
    z = float(ndtri(0.975))
    cover_cl = cover_ind = 0
    runs = 1000
    for _ in range(runs):
        sizes = rng.integers(1, 9, 400)
        clicks = rng.binomial(sizes, rng.beta(1, 4, 400))
        r, se = clustered_ratio_from_sums(400, *_sums(sizes, clicks))
        cover_cl += abs(r - 0.2) <= z * se
        se_ind = math.sqrt(r * (1 - r) / sizes.sum())
        cover_ind += abs(r - 0.2) <= z * se_ind
    print(f"coverage of the 95% interval: clustered {cover_cl / runs:.3f}, independent impressions {cover_ind / runs:.3f}")
    assert 0.93 <= cover_cl / runs <= 0.97
    assert cover_ind / runs < 0.90


# --------------------------------------------------------------------------------------------
# the batch job

def _log(tmp_path):
    rnd = random.Random(7)
    recs = []
    for s in ("A", "B"):
        for u in range(30):
            p = rnd.betavariate(1, 4)
            for r in range(rnd.randint(1, 3)):
                for pos in range(1, rnd.randint(2, 6)):
                    recs.append({"event_id": f"{s}{u}-{r}-{pos}", "request_id": f"{s}{u}-{r}", "query_id": "q",
                                 "user_id": None if (u % 10 == 3 and r == 0) else f"u{u}", "system_id": s,
                                 "item_id": f"i{pos}", "position": pos, "score": None, "clicked": rnd.random() < p,
                                 "timestamp": T0 + rnd.randrange(0, 2 * HOUR), "propensity": None,
                                 "attributes": {"device": "m" if u % 2 else "d"}, "dwell_ms": None})
    path = tmp_path / "imps.avro"
    avro.write_records(str(path), "impression", recs)
    return str(path), recs


@pytest.mark.parametrize("engine,cluster,window", [("columnar", "user", "1h"), ("records", "user", "1h"),
                                                   ("columnar", "request", None), ("records", "request", None)])
def test_batch_clustered_ctr_equals_statsmodels(tmp_path, engine, cluster, window):
    from streameval.jobs import batch

    path, recs = _log(tmp_path)
    out = tmp_path / "out"
    args = ["--impressions", path, "--cluster", cluster, "--slices", "device", "--engine", engine,
            "--output", str(out)] + (["--window", window] if window else [])
    assert batch.main(args) == 0
    rows = {}
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            rows[(r["window_start"], r["slice"], r["system"], r["metric"])] = r
    # in a batch job every impression is on time (the default --allowed-lateness unlimited): none is
    # left out as late data
    groups: dict = {}
    for r in recs:  # an impression: the window of its own timestamp, its own slice
        ws = r["timestamp"] - r["timestamp"] % HOUR if window else None
        cid = f"user:{r['user_id']}" if cluster == "user" and r["user_id"] else f"request:{r['request_id']}"
        for lab in ("all", f"device={r['attributes']['device']}"):
            groups.setdefault((ws, lab, r["system_id"]), []).append((float(r["clicked"]), cid))
    name = f"ctr[cluster={cluster}]"
    for (ws, lab, system), obs in groups.items():
        y, g = zip(*obs)
        ref_r, ref_se = statsmodels_cluster(y, g)
        row = rows[(ws, lab, system, name)]
        assert row["num_queries"] == len(y) and row["value"] == pytest.approx(ref_r, rel=1e-12)
        assert row["stderr"] == pytest.approx(ref_se, rel=1e-10)
        assert rows[(ws, lab, system, f"{name}:clusters")]["value"] == len(set(g))
        deff_row = rows[(ws, lab, system, f"{name}:design_effect")]["value"]
        if 0 < ref_r < 1:
            deff = (ref_se / math.sqrt(ref_r * (1 - ref_r) / len(y))) ** 2
            assert deff_row == pytest.approx(deff, rel=1e-9)
        else:  # no click (or all): the binomial standard error is 0, no design effect
            assert deff_row is None
        z = float(ndtri(0.975))
        if row["ci_method"] == "cluster-delta":
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((ref_r - z * ref_se, ref_r + z * ref_se), rel=1e-9)
        else:
            assert row["ci_method"] == "cluster-delta-logit" and 0 < row["ci_low"] < row["ci_high"] < 1
