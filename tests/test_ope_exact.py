"""Standard errors of IPS, SNIPS and GAUC are the exact sample statistics (issue 43).

The mergeable states keep exact sums of the real squares and products (no rounded square), so the
variance taken from them is the exact second moment about the mean, whatever the merge order.
References: numpy's two-pass ``np.std(w * r, ddof=1) / sqrt(n)`` (IPS, obp's ``estimate_interval``
uses the same sample of w r), the linearised ratio variance written with numpy from its definition
(SNIPS, GAUC; Cochran 1977, 6.4), and exact rational arithmetic (Fractions) in the test."""

import json
import math
import os
import random
from fractions import Fraction

import numpy as np
import pytest

from streameval.accumulators.online import GaucOps, OpeOps, gauc_group_sums
from streameval.io import avro
from streameval.metrics import online as om

from .test_online import random_split_merge as split_merge


def _ope_state(r, pe, pb, parts, seed):
    rnd = random.Random(seed)
    states = [OpeOps.create() for _ in range(parts)]
    for a, b, c in zip(r, pe, pb):
        OpeOps.add(rnd.choice(states), a, b, c)
    return OpeOps.extract(split_merge(OpeOps.merge, states, rnd))


def _numpy_ips(r, pe, pb):
    y = pe / pb * r
    return y.mean(), np.std(y, ddof=1) / math.sqrt(len(y))


def _numpy_snips(r, pe, pb):
    w = pe / pb
    y = w * r
    R = y.sum() / w.sum()
    n = len(w)
    return R, math.sqrt(n / (n - 1) * ((y - R * w) ** 2).sum()) / w.sum()


def _exact_ips_se(r, pe, pb):
    """The exact sample standard error of the doubles y = w * r (Fractions), rounded once."""
    y = [Fraction(float(v)) for v in pe / pb * r]
    n = len(y)
    mean = sum(y, Fraction(0)) / n
    m2 = sum(((v - mean) ** 2 for v in y), Fraction(0))
    return math.sqrt(float(m2 / (n - 1) / n))


def test_two_equal_weighted_rewards_have_zero_stderr():
    # the case: propensity 1e-6, target 0.1, both clicked: w r = 1e5 twice
    r, pe, pb = np.ones(2), np.full(2, 0.1), np.full(2, 1e-6)
    assert np.std(pe / pb * r, ddof=1) == 0.0
    res = OpeOps.extract(_one(r, pe, pb))
    assert res["ips"][1] == 2 and res["ips"][2] == 0.0  # was 0.000950954373222832
    assert res["snips"][2] == 0.0
    assert res["ess"][0] == 2.0  # (sum w)^2 / sum w^2 with exact squares
    assert om.ips(r, pe, pb)[1] == 0.0 and om.snips(r, pe, pb)[1] == 0.0


def _one(r, pe, pb):
    s = OpeOps.create()
    for a, b, c in zip(r, pe, pb):
        OpeOps.add(s, a, b, c)
    return s


@pytest.mark.parametrize("case", range(6))
def test_ips_snips_stderr_equal_numpy_and_exact_on_random_logs(case):
    rng = np.random.default_rng(100 + case)
    n = int(rng.integers(2, 400))
    if case < 2:  # ordinary logs
        pb = rng.uniform(0.01, 0.5, n)
        pe = rng.uniform(0.0, 0.5, n)
        r = (rng.random(n) < 0.2).astype(float)
    elif case < 4:  # tiny propensities: weights near 1e5, nearly equal (the ill-conditioned case)
        pb = 1e-6 * (1.0 + 1e-7 * rng.random(n))
        pe = np.full(n, 0.1)
        r = np.ones(n) if case == 2 else (rng.random(n) < 0.9).astype(float)
    else:  # rewards that are not clicks
        pb = rng.uniform(1e-4, 1.0, n)
        pe = rng.uniform(0.0, 1.0, n)
        r = rng.normal(3.0, 1.0, n)
    res = _ope_state(r, pe, pb, 7, case)
    v, se = _numpy_ips(r, pe, pb)
    assert res["ips"][0] == pytest.approx(v, rel=1e-13)
    assert res["ips"][2] == pytest.approx(se, rel=1e-12)
    assert res["ips"][2] == pytest.approx(_exact_ips_se(r, pe, pb), rel=4e-16)
    v2, se2 = _numpy_snips(r, pe, pb)
    assert res["snips"][0] == pytest.approx(v2, rel=1e-13)
    assert res["snips"][2] == pytest.approx(se2, rel=1e-12)
    # the library's arrays path agrees with the same references
    assert om.ips(r, pe, pb)[1] == pytest.approx(se, rel=1e-12)
    assert om.snips(r, pe, pb)[1] == pytest.approx(se2, rel=1e-12)


def test_ope_merge_order_does_not_change_results():
    rng = np.random.default_rng(7)
    n = 300
    pb = 1e-6 * (1.0 + 1e-7 * rng.random(n))
    pe = rng.uniform(0.05, 0.1, n)
    r = (rng.random(n) < 0.5).astype(float)
    whole = OpeOps.extract(_one(r, pe, pb))
    for seed in range(5):
        assert _ope_state(r, pe, pb, 2 + seed * 3, seed) == whole


def test_ope_infinite_weight_refused():
    with pytest.raises(ValueError, match="not a finite number"):
        OpeOps.add(OpeOps.create(), 1.0, 1.0, 5e-324)


# --------------------------------------------------------------------------------------------
# GAUC's ratio state: the same defect and the same fix

def _gauc_state(groups, weightings):
    ops = GaucOps(weightings)
    s = ops.create()
    for a, p, q in groups:
        ops.add_group(s, a, p, q)
    return ops, s


def test_gauc_equal_aucs_have_zero_stderr_and_random_groups_equal_numpy():
    rng = np.random.default_rng(3)
    for t in range(40):
        g = int(rng.integers(2, 8))
        counts = rng.integers(1, 10_000, size=(g, 2))
        a = np.full(g, rng.random()) if t % 2 == 0 else rng.random(g)
        ops, s = _gauc_state([(float(x), int(p), int(q)) for x, (p, q) in zip(a, counts)], ("impressions",))
        (value, used, se), = ops.extract(s)[0]
        w = counts.sum(axis=1).astype(float)
        y = w * a
        R = y.sum() / w.sum()
        ref = math.sqrt(g / (g - 1) * ((y - R * w) ** 2).sum()) / w.sum()
        # exact reference from the same doubles (w, w * a)
        W, Y = [Fraction(float(x)) for x in w], [Fraction(float(x)) for x in y]
        Rx = sum(Y) / sum(W)
        exact = math.sqrt(float(Fraction(g, g - 1) * sum((yy - Rx * ww) ** 2 for ww, yy in zip(W, Y)) / sum(W) ** 2))
        assert used == g
        assert se == pytest.approx(exact, rel=4e-16, abs=0.0)
        assert se == pytest.approx(ref, rel=1e-12, abs=1e-15)  # equal AUCs: was about 2e-9
        # the vectorised state (the columnar engine's) has the same value to the last bit
        vec = gauc_group_sums(a, counts[:, 0], counts[:, 1], ("impressions",))
        assert ops.extract(vec) == ops.extract(s)


# --------------------------------------------------------------------------------------------
# the command

def test_ope_command_reports_zero_stderr_for_equal_weighted_rewards(tmp_path):
    from streameval.jobs import ope

    recs = [{"event_id": str(i), "request_id": str(i), "query_id": "", "system_id": "L", "item_id": "a",
             "position": 1, "clicked": True, "timestamp": 0, "propensity": 1e-6, "attributes": {}} for i in range(2)]
    # a subnormal propensity: 0.1 / 5e-324 is not a finite double; a dead letter, not a crash or an inf
    recs.append(dict(recs[0], event_id="x", request_id="x", propensity=5e-324))
    logs = tmp_path / "logs.avro"
    avro.write_records(str(logs), "impression", recs)
    out = tmp_path / "out"
    assert ope.main(["--logs", str(logs), "--target", "random", "--n-items", "10", "--slice", "none",
                     "--output", str(out)]) == 0
    rows = {}
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            rows[r["metric"]] = r
    assert rows["ips[random]"]["value"] == pytest.approx(1e5, rel=1e-15)
    assert rows["ips[random]"]["stderr"] == 0.0
    assert rows["snips[random]"]["stderr"] == 0.0
    assert rows["ips[random]"]["num_queries"] == 2
    with open(os.path.join(out, "dead_letters.jsonl"), encoding="utf-8") as f:
        dead = [json.loads(line) for line in f]
    assert len(dead) == 1 and "not a finite number" in dead[0]["reason"]
