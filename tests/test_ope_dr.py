"""DM, DR, SNDR and Switch-DR (issue 43 item 4): the library's values equal obp 0.4.1's estimators
(``obp/ope/estimators.py``: DirectMethod, DoublyRobust, SelfNormalizedDoublyRobust,
SwitchDoublyRobust) on obp's synthetic bandit data with obp's RegressionModel as the reward model;
the mergeable state gives bit-identical values in any split and merge order; ``streameval ope``
with ``--reward-model`` writes rows equal to the library's and warns once on a small effective
sample size; bad reward models are refused with one line.

obp is imported without torch (not installed here): its estimators use torch only in type hints
and isinstance checks, so a stub module stands in; ``obp.ope``/``obp.dataset``/``obp.policy``'s
package ``__init__`` files (matplotlib, seaborn, torch) are bypassed. ``pip install --no-deps
obp==0.4.1`` suffices; the obp tests skip without it."""

import csv
import json
import math
import random

import numpy as np
import pytest

from streameval.accumulators.online_ope import DrOps
from streameval.io import avro
from streameval.metrics import online_ope as mo

from .helpers_ope import obp_importable


def _import_obp():
    if not obp_importable():
        pytest.skip("obp not installed (pip install --no-deps obp==0.4.1)")
    from obp.dataset.synthetic import SyntheticBanditDataset, logistic_reward_function
    from obp.ope import estimators
    from obp.ope.regression_model import RegressionModel

    return SyntheticBanditDataset, logistic_reward_function, estimators, RegressionModel


def _synthetic(seed, n_rounds=3000, n_actions=8, len_list=None):
    SyntheticBanditDataset, logistic_reward_function, est, RegressionModel = _import_obp()
    from sklearn.linear_model import LogisticRegression

    ds = SyntheticBanditDataset(n_actions=n_actions, dim_context=5, reward_function=logistic_reward_function,
                                behavior_policy_function=None, random_state=seed)
    bf = ds.obtain_batch_bandit_feedback(n_rounds=n_rounds)
    rng = np.random.default_rng(seed)
    # a target policy: softmax of the expected rewards (shape obp's (n_rounds, n_actions, 1))
    logits = 5.0 * bf["expected_reward"] + rng.normal(0, 0.5, bf["expected_reward"].shape)
    pi = np.exp(logits - logits.max(axis=1, keepdims=True))
    pi = (pi / pi.sum(axis=1, keepdims=True))[:, :, None]
    reg = RegressionModel(n_actions=n_actions, base_model=LogisticRegression(max_iter=1000, random_state=seed),
                          action_context=bf["action_context"])
    q_hat = reg.fit_predict(context=bf["context"], action=bf["action"], reward=bf["reward"], n_folds=2,
                            random_state=seed)
    return bf, pi, q_hat, est


@pytest.mark.parametrize("seed", [12345, 7])
def test_values_equal_obp_on_synthetic_bandit_data(seed):
    bf, pi, q_hat, est = _synthetic(seed)
    kw = dict(reward=bf["reward"], action=bf["action"], pscore=bf["pscore"], action_dist=pi,
              estimated_rewards_by_reg_model=q_hat, position=np.zeros(len(bf["action"]), dtype=int))
    ref = {
        "dm": est.DirectMethod().estimate_policy_value(action_dist=pi, estimated_rewards_by_reg_model=q_hat),
        "dr": est.DoublyRobust().estimate_policy_value(**kw),
        "sndr": est.SelfNormalizedDoublyRobust().estimate_policy_value(**kw),
    }
    ours = {"dm": mo.dm(pi, q_hat), "dr": mo.dr(**kw), "sndr": mo.sndr(**kw)}
    for k in ref:
        assert ours[k][0] == pytest.approx(ref[k], rel=1e-12, abs=0), k
    # the weights of this log range widely: several thresholds switch some rounds, not all
    w = pi[np.arange(len(bf["action"])), bf["action"], 0] / bf["pscore"]
    taus = [0.0, 0.5, 1.0, 2.0, float(np.median(w)), 1e9]
    for tau in taus:
        r = est.SwitchDoublyRobust(tau=tau).estimate_policy_value(**kw)
        assert mo.switch_dr(**kw, tau=tau)[0] == pytest.approx(r, rel=1e-12, abs=0), tau
    assert mo.switch_dr(**kw)[0] == pytest.approx(est.SwitchDoublyRobust().estimate_policy_value(**kw), rel=1e-12)
    assert 0 < (w <= 1.0).mean() < 1
    # switch with tau 0 is DM, with an infinite tau DR
    assert mo.switch_dr(**kw, tau=0.0)[0] == pytest.approx(ours["dm"][0], rel=1e-12)
    assert mo.switch_dr(**kw, tau=1e9)[0] == pytest.approx(ours["dr"][0], rel=1e-12)

    # standard errors: the sample sd of obp's own per-round terms over sqrt(n) (SNDR: linearised)
    n = len(w)
    for k, cls in (("dr", est.DoublyRobust), ("dm", est.DirectMethod)):
        terms = cls()._estimate_round_rewards(**kw)
        assert ours[k][1] == pytest.approx(np.std(terms, ddof=1) / math.sqrt(n), rel=1e-12)
    for tau in taus:
        terms = est.SwitchDoublyRobust(tau=tau)._estimate_round_rewards(**kw)
        assert mo.switch_dr(**kw, tau=tau)[1] == pytest.approx(np.std(terms, ddof=1) / math.sqrt(n), rel=1e-12)
    pe, q, d = mo.reward_model_terms(bf["action"], pi, q_hat)
    u = w * (bf["reward"] - q)
    z = d + (u - u.sum() / w.sum() * w) / w.mean()
    assert ours["sndr"][1] == pytest.approx(np.std(z, ddof=1) / math.sqrt(n), rel=1e-12)

    # the mergeable state gives the same values
    ops = DrOps(taus)
    s = ops.create()
    for row in zip(bf["reward"], pe, bf["pscore"], q, d):
        ops.add(s, *row)
    res = ops.extract(s)
    for k in ("dm", "dr", "sndr"):
        assert res[k][0] == pytest.approx(ours[k][0], rel=1e-13) and res[k][1] == n
        assert res[k][2] == pytest.approx(ours[k][1], rel=1e-10)
    for tau in taus:
        assert res[("switch_dr", tau)][0] == pytest.approx(mo.switch_dr(**kw, tau=tau)[0], rel=1e-13)


def test_values_equal_obp_with_positions():
    # obp's 3-D arrays: (n_rounds, n_actions, len_list) with each round's position
    _, _, est, _ = _import_obp()
    rng = np.random.default_rng(3)
    n, k, L = 2000, 6, 3
    raw = rng.random((n, k, L)) ** 3
    pi = raw / raw.sum(axis=1, keepdims=True)
    q_hat = rng.uniform(0, 0.3, (n, k, L))
    pos = rng.integers(0, L, n)
    act = rng.integers(0, k, n)
    kw = dict(reward=(rng.random(n) < 0.1).astype(float), action=act, pscore=np.full(n, 1 / k),
              action_dist=pi, estimated_rewards_by_reg_model=q_hat, position=pos)
    assert mo.dm(pi, q_hat, pos)[0] == pytest.approx(est.DirectMethod().estimate_policy_value(
        action_dist=pi, estimated_rewards_by_reg_model=q_hat, position=pos), rel=1e-12)
    assert mo.dr(**kw)[0] == pytest.approx(est.DoublyRobust().estimate_policy_value(**kw), rel=1e-12)
    assert mo.sndr(**kw)[0] == pytest.approx(est.SelfNormalizedDoublyRobust().estimate_policy_value(**kw), rel=1e-12)
    for tau in (0.5, 1.0, 3.0):
        assert mo.switch_dr(**kw, tau=tau)[0] == pytest.approx(
            est.SwitchDoublyRobust(tau=tau).estimate_policy_value(**kw), rel=1e-12)


# --------------------------------------------------------------------------------------------
# merge order

def _split_merge(ops, states, rnd):
    states = list(states)
    while len(states) > 1:
        rnd.shuffle(states)
        k = rnd.randint(2, min(4, len(states)))
        states = [ops.merge(states[:k])] + states[k:]
    return states[0]


def test_merge_order_gives_bit_identical_values():
    rng = np.random.default_rng(11)
    n = 600
    rows = list(zip((rng.random(n) < 0.3).astype(float), rng.uniform(0, 1, n), 1e-3 + rng.random(n) * 0.5,
                    rng.uniform(0, 1, n), rng.normal(0.3, 0.1, n)))
    ops = DrOps((0.5, 1.0, 20.0))
    whole = ops.create()
    for row in rows:
        ops.add(whole, *row)
    want = ops.extract(whole)
    assert set(want) == {"dm", "dr", "sndr", ("switch_dr", 0.5), ("switch_dr", 1.0), ("switch_dr", 20.0)}
    for seed in range(5):
        rnd = random.Random(seed)
        shuffled = rows[:]
        rnd.shuffle(shuffled)
        parts = [ops.create() for _ in range(3 + 4 * seed)]
        for row in shuffled:
            ops.add(rnd.choice(parts), *row)
        got = ops.extract(_split_merge(ops, parts, rnd))
        assert got == want  # every value and standard error to the last bit
    assert ops.extract(ops.merge([]))["dr"][1] == 0 and math.isnan(ops.extract(ops.merge([]))["dr"][0])


# --------------------------------------------------------------------------------------------
# errors

def test_library_refuses_a_bad_reward_model():
    rng = np.random.default_rng(0)
    n, k = 50, 4
    pi = np.full((n, k, 1), 1 / k)
    kw = dict(reward=np.ones(n), action=rng.integers(0, k, n), pscore=np.full(n, 0.25), action_dist=pi)
    with pytest.raises(ValueError, match="must have action_dist's shape"):
        mo.dr(**kw, estimated_rewards_by_reg_model=np.zeros((n, k + 1, 1)))
    with pytest.raises(ValueError, match="must have action_dist's shape"):
        mo.sndr(**kw, estimated_rewards_by_reg_model=np.zeros((n - 1, k, 1)))
    q = np.zeros((n, k, 1))
    q[3, 1, 0] = np.nan
    with pytest.raises(ValueError, match="must be finite"):
        mo.switch_dr(**kw, estimated_rewards_by_reg_model=q)
    with pytest.raises(ValueError, match="tau"):
        mo.switch_dr(**kw, estimated_rewards_by_reg_model=np.zeros((n, k, 1)), tau=-1)
    with pytest.raises(ValueError, match="reward_hat and dm_value must have"):
        mo.dr_from_terms(np.ones(3), np.full(3, 0.5), np.full(3, 0.5), np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="must be finite"):
        DrOps().add(DrOps().create(), 1.0, 0.5, 0.5, float("nan"), 0.1)


# --------------------------------------------------------------------------------------------
# the command

def _log(tmp_path, n, seed, weights="moderate"):
    """n impressions (two campaigns), a reward model file for them, and the arrays behind both."""
    rng = np.random.default_rng(seed)
    recs, rm = [], []
    for i in range(n):
        pb = float(rng.uniform(0.1, 0.5))
        if weights == "wide" and rng.random() < 0.005:  # a few rounds of weight 2e5 outweigh the rest
            pb = 1e-6
        recs.append({"event_id": f"e{i}", "request_id": f"e{i}", "query_id": "", "system_id": "L",
                     "item_id": str(int(rng.integers(0, 5))), "position": 1, "clicked": bool(rng.random() < 0.3),
                     "timestamp": i, "propensity": pb, "attributes": {"campaign": "a" if i % 3 else "b"}})
        rm.append({"event_id": f"e{i}", "reward_hat": float(rng.uniform(0, 0.5)), "dm_value": float(rng.uniform(0, 0.5))})
    logs = tmp_path / "logs.avro"
    avro.write_records(str(logs), "impression", recs)
    return logs, recs, rm


def _write_rm(path, rm, fmt="csv"):
    if fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=["event_id", "reward_hat", "dm_value"])
            w.writeheader()
            for row in rm:
                w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    else:
        with open(path, "w", encoding="utf-8") as f:
            for row in rm:
                f.write(json.dumps(row) + "\n")


def _run(tmp_path, logs, rm_path, *extra):
    from streameval.jobs import ope

    out = tmp_path / "out"
    rc = ope.main(["--logs", str(logs), "--target", "random", "--n-items", "5", "--slice", "campaign",
                   "--output", str(out), *(["--reward-model", str(rm_path)] if rm_path else []), *extra])
    rows, dead = {}, []
    if rc == 0:
        for line in open(out / "metrics.jsonl", encoding="utf-8"):
            r = json.loads(line)
            rows[(r["slice"], r["metric"])] = r
        dead = [json.loads(line) for line in open(out / "dead_letters.jsonl", encoding="utf-8")]
    return rc, rows, dead


def test_command_rows_equal_the_library(tmp_path, capsys):
    logs, recs, rm = _log(tmp_path, 600, 5)
    _write_rm(tmp_path / "rm.jsonl", rm, "jsonl")
    rc, rows, dead = _run(tmp_path, logs, tmp_path / "rm.jsonl", "--switch-tau", "1", "--switch-tau", "2.5")
    assert rc == 0 and dead == []
    err = capsys.readouterr().err
    assert "effective sample size" not in err  # every row: ESS above 100 and 1% of its impressions
    for sl, keep in (("all", lambda r: True), ("campaign=a", lambda r: r["attributes"]["campaign"] == "a"),
                     ("campaign=b", lambda r: r["attributes"]["campaign"] == "b")):
        idx = [i for i, r in enumerate(recs) if keep(r)]
        r = np.array([float(recs[i]["clicked"]) for i in idx])
        pb = np.array([recs[i]["propensity"] for i in idx])
        pe = np.full(len(idx), 0.2)
        q = np.array([rm[i]["reward_hat"] for i in idx])
        d = np.array([rm[i]["dm_value"] for i in idx])
        want = {"dm[random]": mo.dm_from_terms(d), "dr[random]": mo.dr_from_terms(r, pe, pb, q, d),
                "sndr[random]": mo.sndr_from_terms(r, pe, pb, q, d),
                "switch_dr[random,tau=1]": mo.switch_dr_from_terms(r, pe, pb, q, d, 1.0),
                "switch_dr[random,tau=2.5]": mo.switch_dr_from_terms(r, pe, pb, q, d, 2.5),
                "ips[random]": mo.ips(r, pe, pb)}
        for metric, (v, se) in want.items():
            row = rows[(sl, metric)]
            assert row["num_queries"] == len(idx), (sl, metric)
            assert row["value"] == pytest.approx(v, rel=1e-13, abs=1e-15), (sl, metric)
            assert row["stderr"] == pytest.approx(se, rel=1e-10), (sl, metric)
            assert row["ci_low"] < row["value"] < row["ci_high"]
    # the switch thresholds do switch here: tau 1 leaves out some rounds' corrections, 2.5 none (w <= 2)
    assert rows[("all", "switch_dr[random,tau=2.5]")]["value"] == rows[("all", "dr[random]")]["value"]
    assert rows[("all", "switch_dr[random,tau=1]")]["value"] != rows[("all", "dr[random]")]["value"]
    # the default tau is obp's (1); without --reward-model no such rows
    rc, rows2, _ = _run(tmp_path, logs, tmp_path / "rm.jsonl")
    assert rc == 0 and ("all", "switch_dr[random,tau=1]") in rows2 and ("all", "switch_dr[random,tau=2.5]") not in rows2
    rc, rows3, _ = _run(tmp_path, logs, None)
    assert rc == 0 and not any(m.startswith(("dm[", "dr[", "sndr[", "switch_dr[")) for _, m in rows3)


def test_command_warns_once_on_a_small_effective_sample_size(tmp_path, capsys):
    logs, recs, rm = _log(tmp_path, 40, 8)  # ESS below 100 in every row
    _write_rm(tmp_path / "rm.csv", rm)
    rc, rows, _ = _run(tmp_path, logs, tmp_path / "rm.csv")
    err = capsys.readouterr().err
    assert rc == 0
    lines = [line for line in err.splitlines() if "effective sample size" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "3 of 3 (slice, logs) rows" in lines[0]
    # a large log with a few huge weights: ESS below 1% of the 3000 impressions
    logs, recs, rm = _log(tmp_path, 3000, 9, weights="wide")
    rc, rows, _ = _run(tmp_path, logs, None)
    ess = rows[("all", "ope[random]:ess")]
    err = capsys.readouterr().err
    assert rc == 0 and ess["value"] < 0.01 * ess["num_queries"]
    assert sum("effective sample size" in line for line in err.splitlines()) == 1
    # and none on a large log with moderate weights
    logs, recs, rm = _log(tmp_path, 3000, 10)
    rc, rows, _ = _run(tmp_path, logs, None)
    assert rc == 0 and rows[("all", "ope[random]:ess")]["value"] > 1000
    assert "effective sample size" not in capsys.readouterr().err


def test_small_ess_rule():
    from streameval.jobs.ope import ESS_WARN_FRACTION, ESS_WARN_MIN, small_ess_warning

    assert (ESS_WARN_MIN, ESS_WARN_FRACTION) == (100, 0.01)  # as docs/metrics.md says

    def rows(*pairs):
        return [{"metric": "ope[t]:ess", "value": e, "num_queries": n, "slice": f"s{i}", "system": "L"}
                for i, (e, n) in enumerate(pairs)]

    assert small_ess_warning(rows((150.0, 10_000), (100.0, 100)), "t") is None
    assert "1 of 2" in small_ess_warning(rows((150.0, 10_000), (150.0, 20_000)), "t")  # below 1%
    assert "smallest 99.0 of 120" in small_ess_warning(rows((99.0, 120), (5000.0, 20_000)), "t")  # below 100
    assert small_ess_warning(rows((99.0, 120)), "other") is None


def test_command_refuses_a_bad_reward_model_and_dead_letters_a_missing_row(tmp_path, capsys):
    logs, recs, rm = _log(tmp_path, 30, 4)
    # wrong shape: a column missing, a value that is no number, an event given twice: exit 2, one line
    for name, rows_, text in (("nocol.csv", [{k: v for k, v in r.items() if k != "dm_value"} for r in rm],
                               "no column dm_value"),
                              ("bad.jsonl", [dict(rm[0], reward_hat="high")] + rm[1:], "reward_hat 'high' is not a number"),
                              ("twice.jsonl", rm + [rm[3]], "event_id 'e3' given twice")):
        path = tmp_path / name
        if name.endswith(".csv"):
            with open(path, "w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, fieldnames=["event_id", "reward_hat"])
                w.writeheader()
                w.writerows(rows_)
        else:
            _write_rm(path, rows_, "jsonl")
        rc, _, _ = _run(tmp_path, logs, path)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2
        assert len(err) == 1 and err[0].startswith("error: reward model") and text in err[0], err
    rc, _, _ = _run(tmp_path, logs, tmp_path / "twice.jsonl", "--switch-tau", "-1")
    assert rc == 2 and "--switch-tau" in capsys.readouterr().err
    # a row the reward model does not cover: a dead letter with its reason, left out of every estimate
    _write_rm(tmp_path / "part.csv", rm[:-2])
    rc, rows, dead = _run(tmp_path, logs, tmp_path / "part.csv")
    assert rc == 0
    assert sorted(json.loads(d["raw"])["event_id"] for d in dead) == ["e28", "e29"]
    assert all(d["reason"].startswith("no reward model value for event") for d in dead)
    assert rows[("all", "dr[random]")]["num_queries"] == 28 == rows[("all", "ips[random]")]["num_queries"]


def test_command_equals_obp_on_the_open_bandit_sample(tmp_path, capsys):
    """The random policy's CTR from the BTS logs of the men campaign: the job's rows with a reward
    model (a per (item, position) click rate of the random logs, shifted per round by the logged
    user-item affinity) equal obp's estimators on the same arrays (obp's (n, n_items, 3) shapes)."""
    from .conftest import data_path

    _, _, est, _ = _import_obp()
    from streameval.jobs import ope

    bts = data_path("obd", "bts", "men", "men.csv")
    rnd = data_path("obd", "random", "men", "men.csv")
    with open(bts, newline="", encoding="utf-8") as f:
        logged = list(csv.DictReader(f))
    with open(rnd, newline="", encoding="utf-8") as f:
        other = list(csv.DictReader(f))
    n_items, L = 34, 3
    shows, clicks = np.zeros((n_items, L)), np.zeros((n_items, L))
    for r in other:
        shows[int(r["item_id"]), int(r["position"]) - 1] += 1
        clicks[int(r["item_id"]), int(r["position"]) - 1] += int(r["click"])
    base = (clicks + 0.5) / (shows + 100.0)
    n = len(logged)
    aff = np.array([[float(r[f"user-item_affinity_{a}"]) for a in range(n_items)] for r in logged])
    q_hat = base[None, :, :] + 0.001 * aff[:, :, None]
    pi = np.full((n, n_items, L), 1.0 / n_items)
    kw = dict(reward=np.array([float(r["click"]) for r in logged]),
              action=np.array([int(r["item_id"]) for r in logged]),
              pscore=np.array([float(r["propensity_score"]) for r in logged]), action_dist=pi,
              estimated_rewards_by_reg_model=q_hat, position=np.array([int(r["position"]) - 1 for r in logged]))
    _, q, d = mo.reward_model_terms(kw["action"], pi, q_hat, kw["position"])
    _write_rm(tmp_path / "rm.csv", [{"event_id": f"bts/men/{r['']}", "reward_hat": float(a), "dm_value": float(b)}
                                     for r, a, b in zip(logged, q, d)])
    assert ope.main(["--logs", str(bts), "--target", "random", "--reward-model", str(tmp_path / "rm.csv"),
                     "--switch-tau", "1", "--switch-tau", "20", "--output", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    rows = {}
    for line in open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8"):
        r = json.loads(line)
        if r["slice"] == "campaign=men":
            rows[r["metric"]] = r
    ref = {"dm[random]": est.DirectMethod().estimate_policy_value(
               action_dist=pi, estimated_rewards_by_reg_model=q_hat, position=kw["position"]),
           "dr[random]": est.DoublyRobust().estimate_policy_value(**kw),
           "sndr[random]": est.SelfNormalizedDoublyRobust().estimate_policy_value(**kw),
           "switch_dr[random,tau=1]": est.SwitchDoublyRobust(tau=1.0).estimate_policy_value(**kw),
           "switch_dr[random,tau=20]": est.SwitchDoublyRobust(tau=20.0).estimate_policy_value(**kw)}
    for metric, v in ref.items():
        assert rows[metric]["num_queries"] == n
        assert rows[metric]["value"] == pytest.approx(v, rel=1e-12, abs=0), metric
    assert rows["dr[random]"]["stderr"] == pytest.approx(
        np.std(est.DoublyRobust()._estimate_round_rewards(**kw), ddof=1) / math.sqrt(n), rel=1e-10)
