"""CUPED (``--covariate attr:NAME`` with ``--cluster``; issue 43, item 3).

References: numpy's least squares and statsmodels' OLS on the per-unit data (theta the slope of the
pooled regression on [1, x - mean x]; each system's adjusted mean and standard error an OLS on a
constant of its adjusted values), rho^2 with numpy, a coverage simulation, and the batch job on both
engines against the library function from the raw records."""

import json
import math
import random

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.special import ndtri

from streameval.accumulators.cuped import cuped_add_unit, cuped_create, cuped_exact, cuped_merge, cuped_states
from streameval.io import avro
from streameval.metrics.cuped import THETA_UNDEFINED, cuped_from_sums, cuped_rows
from streameval.metrics.online_sums import clustered_ratio_from_sums

HOUR = 3_600_000_000
T0 = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR
Z = float(ndtri(0.975))


def _ab(seed, units=600, effect=0.3):
    """A seeded A/B test: per unit a pre-period value x and a post-period outcome y correlated with it."""
    rng = np.random.default_rng(seed)
    arm = rng.integers(0, 2, units)
    skill = rng.gamma(2.0, 1.0, units)
    x = rng.poisson(skill * 3).astype(float)
    y = rng.poisson(skill * 3 + effect * arm)
    return arm, x, y


def _numpy_reference(arm, x, y, n=None):
    """theta by np.linalg.lstsq of the pooled (linearised, when n is given) outcome on [1, x - mean x];
    per system the adjusted mean and standard error by statsmodels' OLS on a constant."""
    if n is None:
        n = np.ones_like(y)
    r, nbar = y.sum() / n.sum(), n.sum() / len(n)
    lin = (y - r * n) / nbar
    design = np.column_stack([np.ones(len(x)), x - x.mean()])
    theta = np.linalg.lstsq(design, lin, rcond=None)[0][1]
    theta_sm = sm.OLS(lin, design).fit().params[1]
    assert theta == pytest.approx(theta_sm, rel=1e-12)
    out = {}
    for s in np.unique(arm):
        m = arm == s
        rs, nbs = y[m].sum() / n[m].sum(), n[m].sum() / m.sum()
        ls = (y[m] - rs * n[m]) / nbs
        # the adjusted per-unit values: mean = rs - theta (xbar_s - xbar), their variance over G_s
        z = rs + ls - theta * (x[m] - x.mean())
        fit = sm.OLS(z, np.ones(m.sum())).fit()
        plain = sm.OLS(rs + ls, np.ones(m.sum())).fit()
        out[int(s)] = (fit.params[0], fit.bse[0], plain.bse[0])
    return theta, out


@pytest.mark.parametrize("seed", range(4))
def test_per_unit_means_equal_numpy_and_statsmodels_ols(seed):
    arm, x, y = _ab(seed)
    res = cuped_from_sums(cuped_states(arm.tolist(), [1] * len(y), y.tolist(), x.tolist()))
    theta, ref = _numpy_reference(arm, x, y)
    assert float(res["theta"]) == pytest.approx(theta, rel=1e-12)
    for s, (mean, se, se_plain) in ref.items():
        v = res["systems"][s]
        assert v["r_adj"] == pytest.approx(mean, rel=1e-12)
        assert v["se_adj"] == pytest.approx(se, rel=1e-12)
        assert v["se"] == pytest.approx(se_plain, rel=1e-12)
        # the plain mean of y and its standard error (ddof 1)
        m = arm == s
        assert v["r"] == pytest.approx(y[m].mean(), rel=1e-12)
        assert v["se"] == pytest.approx(y[m].std(ddof=1) / math.sqrt(m.sum()), rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_ctr_ratio_delta_method_equals_linearised_ols(seed):
    """CTR = sum clicks / sum impressions: the delta method's linearisation, then the same OLS; the
    unadjusted standard error is ctr[cluster=C]'s."""
    rng = np.random.default_rng(100 + seed)
    g = 500
    arm = rng.integers(0, 2, g)
    rate = rng.beta(1, 4, g)
    pre_n = rng.integers(1, 10, g)
    x = rng.binomial(pre_n, rate).astype(float)  # pre-period clicks
    n = rng.integers(1, 10, g)
    y = rng.binomial(n, np.clip(rate * (1 + 0.1 * arm), 0, 1))
    res = cuped_from_sums(cuped_states(arm.tolist(), n.tolist(), y.tolist(), x.tolist()))
    theta, ref = _numpy_reference(arm, x, y.astype(float), n.astype(float))
    assert float(res["theta"]) == pytest.approx(theta, rel=1e-12)
    for s, (mean, se, se_plain) in ref.items():
        v = res["systems"][s]
        m = arm == s
        assert v["r_adj"] == pytest.approx(mean, rel=1e-12) and v["se_adj"] == pytest.approx(se, rel=1e-12)
        nn, yy = n[m].astype(np.int64), y[m].astype(np.int64)
        r, se_cl = clustered_ratio_from_sums(int(m.sum()), int(nn.sum()), int(yy.sum()), int((nn * nn).sum()),
                                             int((nn * yy).sum()), int((yy * yy).sum()))
        assert v["r"] == r and v["se"] == pytest.approx(se_cl, rel=1e-12) and se_plain == pytest.approx(se_cl, rel=1e-12)
        assert v["vr"] > 0.1


def test_variance_reduction_is_rho_squared():
    arm, x, y = _ab(7, units=2000)
    res = cuped_from_sums(cuped_states(arm.tolist(), [1] * len(y), y.tolist(), x.tolist()))
    theta = float(res["theta"])
    for s in (0, 1):
        m = arm == s
        exact = 1 - np.var(y[m] - theta * x[m], ddof=1) / np.var(y[m], ddof=1)
        assert res["systems"][s]["vr"] == pytest.approx(exact, rel=1e-12)
        rho2 = np.corrcoef(x[m], y[m])[0, 1] ** 2  # with the system's own slope: exactly rho^2
        assert res["systems"][s]["vr"] == pytest.approx(rho2, abs=0.01) and rho2 > 0.3
    # one system: theta is its own slope, the reduction exactly rho^2
    one = cuped_from_sums(cuped_states([0] * len(y), [1] * len(y), y.tolist(), x.tolist()))
    assert one["systems"][0]["vr"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, rel=1e-12)


def test_coverage_and_width():
    """300 seeded A/B tests with a true effect 0.3 on B: the 95% interval of the difference of the
    adjusted means covers it about 95% of the time and is narrower than the unadjusted one."""
    rng = np.random.default_rng(2013)
    runs, cover, cover_plain, ratio = 300, 0, 0, []
    for _ in range(runs):
        g = 400
        arm = rng.integers(0, 2, g)
        skill = rng.gamma(2.0, 1.0, g)
        x = rng.poisson(skill * 3).astype(float)
        y = rng.poisson(skill * 3 + 0.3 * arm)
        res = cuped_from_sums(cuped_states(arm.tolist(), [1] * g, y.tolist(), x.tolist()))["systems"]
        d = res[1]["r_adj"] - res[0]["r_adj"]
        se = math.hypot(res[1]["se_adj"], res[0]["se_adj"])
        d0 = res[1]["r"] - res[0]["r"]
        se0 = math.hypot(res[1]["se"], res[0]["se"])
        cover += abs(d - 0.3) <= Z * se
        cover_plain += abs(d0 - 0.3) <= Z * se0
        ratio.append(se / se0)
    print(f"coverage: cuped {cover / runs:.3f}, unadjusted {cover_plain / runs:.3f}; "
          f"median width ratio {np.median(ratio):.3f}")
    assert 0.92 <= cover / runs <= 0.98
    assert max(ratio) < 1 and np.median(ratio) < 0.75


def test_merge_order_and_split_do_not_change_a_bit():
    rng = np.random.default_rng(5)
    units = [(int(rng.integers(0, 3)), int(rng.integers(1, 9)), int(rng.integers(0, 5)),
              None if rng.random() < 0.1 else float(rng.normal(3, 2)) * 1.1) for _ in range(400)]

    def rows(order, parts):
        per = {}
        for k, idx in enumerate(np.array_split(order, parts)):
            for i in idx:
                s, n, y, x = units[i]
                cuped_add_unit(per.setdefault((s, k), cuped_create()), n, y, x)
        merged = {}
        for (s, _), st in sorted(per.items(), key=lambda kv: rng.random()):
            merged[s] = cuped_merge([merged.get(s, cuped_create()), st])
        return list(cuped_rows(None, None, "all", {s: cuped_exact(st) for s, st in merged.items()}, "user", "pre"))

    base = rows(np.arange(400), 1)
    for parts in (2, 7, 31):
        assert rows(rng.permutation(400), parts) == base
    names = {r["metric"] for r in base}
    assert names == {"ctr[cluster=user,cuped=pre]", "ctr[cluster=user,cuped=pre]:variance_reduction",
                     "ctr[cluster=user,cuped=pre]:theta", "ctr[cluster=user,cuped=pre]:imputed_units"}


def test_missing_covariate_gets_the_pooled_mean():
    arm, x, y = _ab(3, units=300)
    xm = x.copy()
    miss = np.arange(300) % 7 == 0
    xm[miss] = np.nan
    res = cuped_from_sums(cuped_states(arm.tolist(), [1] * 300, y.tolist(), xm.tolist()))
    filled = np.where(miss, np.nanmean(xm), xm)
    theta, ref = _numpy_reference(arm, filled, y.astype(float))
    assert float(res["theta"]) == pytest.approx(theta, rel=1e-12) and res["imputed"] == int(miss.sum())
    for s, (mean, se, _) in ref.items():
        assert res["systems"][s]["r_adj"] == pytest.approx(mean, rel=1e-12)
        assert res["systems"][s]["se_adj"] == pytest.approx(se, rel=1e-12)


def test_zero_variance_covariate_says_theta_is_undefined():
    states = cuped_states([0, 0, 1, 1, 1], [3, 2, 4, 1, 2], [1, 0, 2, 1, 0], [2.0] * 5)
    rows = {(r["system"], r["metric"]): r for r in cuped_rows(None, None, "all", states, "user", "pre")}
    name = "ctr[cluster=user,cuped=pre]"
    th = rows[("*", f"{name}:theta")]
    assert th["value"] is None or math.isnan(th["value"])
    assert th["ci_method"] == THETA_UNDEFINED
    for s, (n, y) in {0: ((3, 2), (1, 0)), 1: ((4, 1, 2), (2, 1, 0))}.items():
        row = rows[(s, name)]
        assert row["ci_method"] == THETA_UNDEFINED and row["value"] == sum(y) / sum(n)
        assert math.isfinite(row["stderr"]) and row["ci_low"] < row["value"] < row["ci_high"]
        assert rows[(s, f"{name}:variance_reduction")]["value"] == 0.0


# --------------------------------------------------------------------------------------------
# the batch job

def _log(tmp_path, attr="pre_clicks", constant=False):
    rnd = random.Random(11)
    recs = []
    for s in ("A", "B"):
        for u in range(40):
            p = rnd.betavariate(1, 4)
            pre = 2.0 if constant else float(sum(rnd.random() < p for _ in range(8)))
            for r in range(rnd.randint(1, 3)):
                for pos in range(1, rnd.randint(2, 6)):
                    attrs = {"device": "m" if u % 2 else "d"}
                    if u % 13 != 5:  # a few users without the covariate: the pooled mean
                        attrs[attr] = repr(pre)
                    recs.append({"event_id": f"{s}{u}-{r}-{pos}", "request_id": f"{s}{u}-{r}", "query_id": "q",
                                 "user_id": f"u{u}", "system_id": s, "item_id": f"i{pos}", "position": pos,
                                 "score": None, "clicked": rnd.random() < p,
                                 "timestamp": T0 + rnd.randrange(0, 2 * HOUR), "propensity": None,
                                 "attributes": attrs, "dwell_ms": None})
    path = tmp_path / "imps.avro"
    avro.write_records(str(path), "impression", recs)
    return str(path), recs


def _library_rows(recs, cluster, attr, window):
    units: dict = {}
    for r in recs:
        ws = r["timestamp"] - r["timestamp"] % HOUR if window else None
        cid = f"user:{r['user_id']}" if cluster == "user" else f"request:{r['request_id']}"
        x = r["attributes"].get(attr)
        for lab in ("all", f"device={r['attributes']['device']}"):
            u = units.setdefault((ws, lab, r["system_id"], cid), [0, 0, None])
            u[0] += 1
            u[1] += int(r["clicked"])
            if x is not None:
                u[2] = float(x) if u[2] is None else min(u[2], float(x))
    by_key: dict = {}
    for (ws, lab, s, _), (n, y, x) in units.items():
        by_key.setdefault((ws, lab), []).append((s, n, y, x))
    out = {}
    for (ws, lab), us in by_key.items():
        s, n, y, x = zip(*us)
        we = ws + HOUR if ws is not None else None
        for row in cuped_rows(ws, we, lab, cuped_states(s, n, y, x), cluster, attr):
            out[(ws, lab, row["system"], row["metric"])] = row
    return out


def _job_rows(tmp_path, path, args, name="out"):
    from streameval.jobs import batch

    out = tmp_path / name
    status = batch.main(["--impressions", path, "--output", str(out), *args])
    rows = {}
    if status == 0:
        with open(out / "metrics.jsonl", encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                rows[(r["window_start"], r["slice"], r["system"], r["metric"])] = r
    return status, rows


@pytest.mark.parametrize("engine,cluster,window,shards", [("columnar", "user", "1h", "auto"),
                                                          ("columnar", "user", "1h", "7"),
                                                          ("records", "user", None, "auto"),
                                                          ("columnar", "request", None, "3")])
def test_batch_job_equals_library(tmp_path, engine, cluster, window, shards):
    """Equal bit for bit to the library on the raw records, on both engines and any sharding (merge
    order)."""
    path, recs = _log(tmp_path)
    status, rows = _job_rows(tmp_path, path, ["--cluster", cluster, "--covariate", "attr:pre_clicks", "--slices",
                                              "device", "--engine", engine, "--quiet"]
                             + (["--window", window] if window else [])
                             + (["--shards", shards] if engine == "columnar" else []))
    assert status == 0
    ref = _library_rows(recs, cluster, "pre_clicks", window)
    got = {k: v for k, v in rows.items() if ",cuped=" in k[3]}
    assert set(got) == set(ref) and len(ref) > 10
    for k, want in ref.items():
        row = dict(got[k])
        assert row == want, k  # bit for bit (the job writes floats as JSON: repr round trips)
    assert any(k[3].endswith(":imputed_units") for k in ref)
    theta = [r for k, r in ref.items() if k[3].endswith(":theta")]
    assert all(r["value"] is not None and r["value"] > 0 for r in theta)


def test_batch_job_refuses_unknown_covariate_attribute(tmp_path, capsys):
    path, _ = _log(tmp_path)
    status, _ = _job_rows(tmp_path, path, ["--cluster", "user", "--covariate", "attr:pre_clikcs", "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert "pre_clikcs" in err and "closest attributes the first records have: pre_clicks" in err


def test_batch_job_option_errors(tmp_path, capsys):
    path, _ = _log(tmp_path)
    assert _job_rows(tmp_path, path, ["--covariate", "attr:pre_clicks"], "o1")[0] == 2
    assert "need --cluster" in capsys.readouterr().err
    assert _job_rows(tmp_path, path, ["--cluster", "user", "--covariate", "pre_clicks"], "o2")[0] == 2
    assert "attr:NAME" in capsys.readouterr().err


def test_batch_job_zero_variance_covariate(tmp_path):
    path, recs = _log(tmp_path, constant=True)
    status, rows = _job_rows(tmp_path, path, ["--cluster", "user", "--covariate", "attr:pre_clicks", "--quiet"])
    assert status == 0
    name = "ctr[cluster=user,cuped=pre_clicks]"
    th = rows[(None, "all", "*", f"{name}:theta")]
    assert th["value"] is None and th["ci_method"] == THETA_UNDEFINED
    for s in ("A", "B"):
        row, plain = rows[(None, "all", s, name)], rows[(None, "all", s, "ctr[cluster=user]")]
        assert row["ci_method"] == THETA_UNDEFINED and row["value"] == plain["value"]
        assert row["stderr"] == pytest.approx(plain["stderr"], rel=1e-12)


def _pre_log(tmp_path, recs):
    """A pre-period log of the same users (but users 0-4 absent): clicks correlated with the experiment's."""
    rnd = random.Random(3)
    rate: dict = {}
    for r in recs:
        u = rate.setdefault(r["user_id"], [0, 0])
        u[0] += 1
        u[1] += int(r["clicked"])
    pre = []
    for uid, (n, y) in sorted(rate.items()):
        if int(uid[1:]) < 5:
            continue
        p = (y + 1) / (n + 2)
        for i in range(rnd.randint(3, 9)):
            pre.append({"event_id": f"pre-{uid}-{i}", "request_id": f"pre-{uid}-{i}", "query_id": "q",
                        "user_id": uid, "system_id": "A", "item_id": "i1", "position": 1, "score": None,
                        "clicked": (None if i == 0 else rnd.random() < p), "timestamp": T0 - 30 * 24 * HOUR + i,
                        "propensity": None, "attributes": {}, "dwell_ms": None})
    path = tmp_path / "pre.avro"
    avro.write_records(str(path), "impression", pre)
    clicks: dict = {}
    for r in pre:
        if r["clicked"] is not None:
            clicks[r["user_id"]] = clicks.get(r["user_id"], 0) + int(r["clicked"])
    return str(path), clicks


@pytest.mark.parametrize("engine", ["columnar", "records"])
def test_batch_job_covariate_log_equals_library(tmp_path, engine):
    """--covariate-log: x = the user's clicks in the pre-period log; users absent from it get the
    pooled mean (imputed_units)."""
    path, recs = _log(tmp_path)
    pre_path, clicks = _pre_log(tmp_path, recs)
    status, rows = _job_rows(tmp_path, path, ["--cluster", "user", "--covariate-log", pre_path, "--slices", "device",
                                              "--engine", engine, "--quiet"])
    assert status == 0
    recs2 = [dict(r, attributes={**{k: v for k, v in r["attributes"].items() if k != "pre_clicks"},
                                 **({"log_clicks": repr(float(clicks[r["user_id"]]))} if r["user_id"] in clicks
                                    else {})}) for r in recs]
    ref = _library_rows(recs2, "user", "log_clicks", None)
    got = {k: v for k, v in rows.items() if ",cuped=" in k[3]}
    assert got == ref and len(ref) > 10
    # 5 users of each system are absent from the pre-period log
    assert rows[(None, "all", "*", "ctr[cluster=user,cuped=log_clicks]:imputed_units")]["value"] == 10
    assert rows[(None, "all", "*", "ctr[cluster=user,cuped=log_clicks]:theta")]["value"] > 0


def test_covariate_and_covariate_log_together_refused(tmp_path, capsys):
    path, recs = _log(tmp_path)
    status, _ = _job_rows(tmp_path, path, ["--cluster", "user", "--covariate", "attr:pre_clicks",
                                           "--covariate-log", path])
    assert status == 2 and "give one" in capsys.readouterr().err
