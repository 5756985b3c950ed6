"""Calibration metrics (issue 19, item 2): log loss, Brier score, calibration ratio, ECE over
fixed-width bins and the reliability diagram.

References: scikit-learn's ``log_loss``, ``brier_score_loss`` and ``calibration_curve`` (uniform
bins) on the same data, to 1e-12; the calibration ratio and its linearised standard error written
here from the definition. The engines' equality (per-record and columnar) is in
tests/test_columnar.py (seed 12). Beam pipelines run on FnApiRunner."""

import math
import random

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, log_loss

from streameval.jobs import batch
from streameval.accumulators.online import CalibrationOps
from streameval.beam.online import OnlineMetrics, calibration_bin_name, split_metric_names
from streameval.beam.transforms import metric_row
from streameval.commands import report
from streameval.metrics import calibration as cal
from streameval.metrics import online as om
from streameval.metrics.names import MetricNameError

from .test_online import HOUR, BASE, create, random_split_merge, run_pipeline

TOL = 1e-12


def _data(seed, n):
    rng = np.random.default_rng(seed)
    p = rng.random(n) ** 2
    # the ends, values on the bin edges of 2, 4, 5 and 10 bins (0.3 and 0.7 are not exactly the
    # linspace edges), and probabilities that the clipping changes
    p[:14] = [0.0, 1.0, 0.5, 0.25, 0.75, 0.2, 0.4, 0.3, 0.7, 0.1, 1e-20, 1 - 1e-17, 0.0, 1.0]
    y = rng.random(n) < np.clip(0.8 * p + 0.05, 0, 1)
    y[:14] = [True, False, True, False, True, True, False, True, False, True, True, False, False, True]
    return p, y


def _sklearn_ece(y, p, bins):
    prob_true, prob_pred = calibration_curve(y, p, n_bins=bins, strategy="uniform")
    counts = np.bincount(np.searchsorted(np.linspace(0, 1, bins + 1)[1:-1], p), minlength=bins)
    counts = counts[counts > 0]
    return float(np.sum(counts * np.abs(prob_pred - prob_true)) / len(p)), prob_true, prob_pred, counts


@pytest.mark.parametrize("bins", [1, 2, 4, 10, 7])
def test_values_equal_sklearn(bins):
    p, y = _data(bins, 3000)
    ops = CalibrationOps([bins])
    state = ops.create()
    for a, b in zip(p.tolist(), y.tolist()):
        ops.add(state, a, b)
    res = ops.extract(state)
    assert res["logloss"][0] == pytest.approx(log_loss(y, p), abs=TOL) and res["logloss"][1] == len(p)
    assert cal.logloss(p, y) == pytest.approx(log_loss(y, p), abs=TOL)
    assert res["brier"][0] == pytest.approx(brier_score_loss(y, p), abs=TOL)
    assert cal.brier(p, y) == pytest.approx(brier_score_loss(y, p), abs=TOL)
    ratio = math.fsum(p.tolist()) / y.sum()
    assert res["calibration"][0] == pytest.approx(ratio, abs=TOL) == cal.calibration_ratio(p, y)
    # the linearised standard error of the ratio, from its definition
    se = math.sqrt(len(p) / (len(p) - 1) * np.sum((p - ratio * y) ** 2) / y.sum() ** 2)
    assert res["calibration"][2] == pytest.approx(se, rel=1e-9)
    # log loss and Brier are means: the standard error of the mean of the terms
    ll_terms = -np.log(np.clip(np.where(y, p, 1 - p), cal.EPS, 1 - cal.EPS))
    assert res["logloss"][2] == pytest.approx(np.std(ll_terms, ddof=1) / math.sqrt(len(p)), rel=1e-9)
    assert res["brier"][2] == pytest.approx(np.std((p - y) ** 2, ddof=1) / math.sqrt(len(p)), rel=1e-9)
    want, prob_true, prob_pred, counts = _sklearn_ece(y, p, bins)
    assert res["ece"][bins][0] == pytest.approx(want, abs=TOL) == cal.ece(p, y, bins)
    got_bins = res["bins"][bins]
    assert [n for _, n, _, _, _ in got_bins] == counts.tolist()
    np.testing.assert_allclose([x for _, _, x, _, _ in got_bins], prob_pred, rtol=0, atol=TOL)
    np.testing.assert_allclose([x for _, _, _, x, _ in got_bins], prob_true, rtol=0, atol=TOL)
    # clipping: a confident mistake costs -log(eps)
    assert cal.logloss([1.0], [0]) == pytest.approx(-math.log(cal.EPS)) == pytest.approx(log_loss([0, 1], [1.0, 1.0]) * 2)


def test_any_split_and_merge_order_give_the_same_values():
    """One by one, vectorised by key, and merged in random trees: identical values (exact sums)."""
    rnd = random.Random(3)
    p, y = _data(11, 1200)
    ops = CalibrationOps([10, 3])
    key = np.array([rnd.randrange(4) for _ in range(len(p))])
    whole = {}
    for k in range(4):
        st = ops.create()
        for a, b in zip(p[key == k].tolist(), y[key == k].tolist()):
            ops.add(st, a, b)
        whole[k] = repr(ops.extract(st))
    vec = dict(ops.by_key(key, p, y))
    assert {k: repr(ops.extract(s)) for k, s in vec.items()} == whole
    for k in range(4):  # parts of each key, some one by one, some vectorised, merged in a random tree
        idx = np.flatnonzero(key == k)
        cuts = sorted(rnd.sample(range(1, len(idx)), 5))
        states = []
        for i, part in enumerate(np.split(idx, cuts)):
            if i % 2:
                states.append(dict(ops.by_key(np.zeros(len(part), int), p[part], y[part]))[0])
            else:
                st = ops.create()
                for j in part.tolist():
                    ops.add(st, p[j], y[j])
                states.append(st)
        states.append(ops.create())
        assert repr(ops.extract(random_split_merge(ops.merge, states, rnd))) == whole[k]
    empty = ops.extract(ops.create())
    assert math.isnan(empty["logloss"][0]) and empty["logloss"][1] == 0 and math.isnan(empty["ece"][10][0])


def test_names_and_bad_parameters():
    assert [s.name for s in om.parse_online_metrics("logloss,log_loss,brier,calibration,ece,ece[bins=10],ece[4],"
                                                    "ECE[bins=20,uniform]")] == \
        ["logloss", "brier", "calibration", "ece[bins=10]", "ece[bins=4]", "ece[bins=20]"]
    assert split_metric_names("map,ece[bins=5],brier") == (["map"], ["ece[bins=5]", "brier"])
    for bad, why in [("ece[bins=10,quantile]", "quantile bins are not exactly mergeable"),
                     ("ece[bins=0]", "integer from 1 to 10000"), ("ece[bins=abc]", "integer from 1 to 10000"),
                     ("ece[20000]", "integer from 1 to 10000")]:
        with pytest.raises(MetricNameError, match=why) as e:
            split_metric_names(f"map,{bad}")
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        CalibrationOps([2]).add(CalibrationOps([2]).create(), 1.5, True)
    with pytest.raises(ValueError, match="bins must be"):
        CalibrationOps([0])


def test_batch_job_refuses_a_bad_parameter_in_one_line(tmp_path, capsys):
    code = batch.main(["--impressions", str(tmp_path / "none.avro"), "--output", str(tmp_path / "o"),
                       "--metrics", "ece[bins=10,quantile]"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "quantile bins are not exactly mergeable" in err and len(err.splitlines()) == 1


def test_online_metrics_per_window_and_slice_equal_sklearn():
    """OnlineMetrics (the per-record engine) per (window, slice, system) against scikit-learn on the
    same examples; scores outside [0, 1] and null clicks are left out and counted."""
    rnd = random.Random(5)
    imps = []
    for i in range(900):
        clicked = None if rnd.random() < 0.05 else rnd.random() < 0.3
        score = rnd.choice([rnd.random() * 0.6, rnd.choice([0.0, 0.5, 1.0, 0.3]), 1.5, -0.25, None])
        imps.append({"event_id": f"e{i}", "request_id": f"r{i // 3}", "query_id": "q", "user_id": None,
                     "system_id": rnd.choice("AB"), "item_id": f"d{i % 3}", "position": i % 3 + 1, "score": score,
                     "clicked": clicked, "timestamp": BASE + rnd.randrange(2 * HOUR), "propensity": None,
                     "attributes": {"device": rnd.choice(["pc", "sp"])} if rnd.random() < 0.8 else {}})
    got = run_pipeline(lambda p: {"rows": create(p, imps, "Imps") | OnlineMetrics(
        ["logloss", "brier", "calibration", "ece[bins=5]"], window="1h", slices=["device"])}, counters=True)
    rows = {(r["window_start"], r["slice"], r["system"], r["metric"]): r for r in got["rows"]}
    ok = [r for r in imps if r["score"] is not None and r["clicked"] is not None]
    assert got["counters"]["online:score_not_probability"] == sum(not 0 <= r["score"] <= 1 for r in ok)
    ok = [r for r in ok if 0 <= r["score"] <= 1]
    groups: dict = {}
    for r in ok:
        ws = BASE + (r["timestamp"] - BASE) // HOUR * HOUR
        for sl in ("all", f"device={r['attributes']['device']}" if r["attributes"] else "device=(missing)"):
            groups.setdefault((ws, sl, r["system_id"]), []).append(r)
    assert len(groups) == 2 * 2 * 4
    for (ws, sl, system), rs in groups.items():
        p = np.array([r["score"] for r in rs])
        y = np.array([r["clicked"] for r in rs])
        k = (ws, sl, system)
        assert rows[(*k, "logloss")]["value"] == pytest.approx(log_loss(y, p, labels=[0, 1]), abs=TOL)
        assert rows[(*k, "logloss")]["num_queries"] == len(rs) and rows[(*k, "logloss")]["ci_method"] == "t"
        assert rows[(*k, "brier")]["value"] == pytest.approx(brier_score_loss(y, p, labels=[0, 1]), abs=TOL)
        assert rows[(*k, "calibration")]["value"] == pytest.approx(p.sum() / y.sum(), abs=TOL)
        want, prob_true, prob_pred, counts = _sklearn_ece(y, p, 5)
        assert rows[(*k, "ece[bins=5]")]["value"] == pytest.approx(want, abs=TOL)
        bins = np.unique(cal.bin_index(p, 5))
        for b, pt, pp, n in zip(bins.tolist(), prob_true, prob_pred, counts):
            pred, obs = rows[(*k, calibration_bin_name(5, b, "predicted"))], rows[(*k, calibration_bin_name(5, b, "observed"))]
            assert (pred["value"], obs["value"]) == pytest.approx((pp, pt), abs=TOL)
            assert pred["num_queries"] == obs["num_queries"] == n
    assert len(rows) == sum(4 + 2 * len(np.unique(cal.bin_index([r["score"] for r in rs], 5))) for rs in groups.values())


def test_report_draws_the_reliability_diagram(tmp_path):
    day = 24 * HOUR
    rows = [metric_row(None, None, "all", "a", "ece[bins=4]", 0.05, 100, None),
            metric_row(None, None, "all", "a", "logloss", 0.4, 100, 0.01)]
    for b, n, pred, obs in [(0, 50, 0.1, 0.12), (1, 30, 0.4, 0.3), (3, 20, 0.9, 0.85)]:
        rows.append(metric_row(None, None, "all", "a", calibration_bin_name(4, b, "predicted"), pred, n, None))
        rows.append(metric_row(None, None, "all", "a", calibration_bin_name(4, b, "observed"), obs, n, 0.05))
    # windowed rows only (10 bins): the report pools the windows, weighting by the bins' examples
    for d, (n, pred, obs) in enumerate([(10, 0.12, 0.1), (30, 0.16, 0.2)]):
        for sl in ("all", "device=pc"):
            rows.append(metric_row(d * day, (d + 1) * day, sl, "b", calibration_bin_name(10, 1, "predicted"), pred, n, None))
            rows.append(metric_row(d * day, (d + 1) * day, sl, "b", calibration_bin_name(10, 1, "observed"), obs, n, 0.1))
    rows = [dict(r, _source="m.jsonl") for r in rows]
    points = report.reliability_points(report.prepare_rows(rows))
    assert points[4][("all", "a")] == [(0, 50, 0.1, 0.12), (1, 30, 0.4, 0.3), (3, 20, 0.9, 0.85)]
    ((k, n, pred, obs),) = points[10][("device=pc", "b")]
    assert (k, n) == (1, 40) and pred == pytest.approx(0.15) and obs == pytest.approx(0.175)
    res = report.write_report(rows, str(tmp_path / "r"))
    names = {p.rsplit("/", 1)[1] for p in res["pngs"]}
    assert {"reliability_4.png", "reliability_10.png", "ece_bins_4_global.png", "logloss_global.png"} == names
    page = (tmp_path / "r" / "report.html").read_text()
    assert "reliability diagram (ece[bins=4])" in page and "Windows pooled." in page and "(0.25, 0.5]" in page
    assert "calibration_bin" not in page  # no plot or table per bin row
    # --metrics ece[bins=4] brings its bins, not the other diagram
    res = report.write_report(rows, str(tmp_path / "s"), metrics=["ece[bins=4]"])
    assert {p.rsplit("/", 1)[1] for p in res["pngs"]} == {"reliability_4.png", "ece_bins_4_global.png"}
