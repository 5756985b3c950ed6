"""Slate off-policy estimators (issue 43 item 4): standard slate IPS, independent IPS, reward-interaction
IPS and the pseudo-inverse estimator.

* values equal obp 0.4.1's ``SlateStandardIPS``, ``SlateIndependentIPS`` and
  ``SlateRewardInteractionIPS`` (``obp/ope/estimators_slate.py``) to 1e-12 relative on obp's
  ``SyntheticSlateBanditDataset`` (slates of distinct items drawn one position after the other, and
  factorizable ones) and, through ``streameval ope --slate --target random``, on the bundled Open Bandit
  sample and on synthetic slates written as impression logs. Without obp installed, obp's formulas
  written here in numpy (:func:`_obp_values`) stand in for the package (the synthetic data then come
  from numpy);
* the pseudo-inverse estimator equals Swaminathan et al.'s q^T Gamma^+ 1_s with Gamma's pseudo-inverse
  from ``numpy.linalg.pinv`` (Gamma and q enumerated over every slate) for a product logging policy;
* the standard errors equal numpy's ``std(ddof=1) / sqrt(n)`` of the per-slate values, the effective
  sample sizes (sum u)^2 / sum u^2 of the weights;
* the mergeable state gives bit-identical results in any split and merge order, and a slate's terms do
  not depend on the order its impressions arrive in;
* the job warns once on a small effective sample size and dead-letters a slate with a repeated position.

obp is imported as in ``tests/test_ope_dr.py`` (a torch stub; package ``__init__`` files bypassed)."""

import itertools
import json
import math
import os
import random

import numpy as np
import pytest

from streameval.accumulators.online_slate import SlateImpression, SlateOpeOps, SlateRequestOps
from streameval.io import avro
from streameval.metrics import online_slate as ms

from .helpers_ope import obp_importable
from .test_online import random_split_merge as split_merge


def _obp():
    """``(SyntheticSlateBanditDataset, estimators_slate)`` of obp, or None when obp is not installed."""
    if not obp_importable():
        return None
    from obp.dataset.synthetic_slate import SyntheticSlateBanditDataset
    from obp.ope import estimators_slate

    return SyntheticSlateBanditDataset, estimators_slate


def _obp_values(sid, pos, r, b, e):
    """obp's three estimates, ``b`` and ``e`` dicts of the behaviour's and the target's ``pscore``,
    ``pscore_item_position`` and ``pscore_cascade`` arrays: with obp when it is installed, else its
    formulas in numpy (sum over impressions of r times the ratio, over the number of slates)."""
    got = _obp()
    if got is None:
        n = len(np.unique(sid))
        return {"slate_ips": (r * e["pscore"] / b["pscore"]).sum() / n,
                "iips": (r * e["pscore_item_position"] / b["pscore_item_position"]).sum() / n,
                "rips": (r * e["pscore_cascade"] / b["pscore_cascade"]).sum() / n}
    est, L = got[1], int(pos.max()) + 1
    kw = dict(slate_id=np.unique(sid, return_inverse=True)[1], reward=r, position=pos)  # obp: integer ids
    return {
        "slate_ips": est.SlateStandardIPS(len_list=L).estimate_policy_value(
            **kw, pscore=b["pscore"], evaluation_policy_pscore=e["pscore"]),
        "iips": est.SlateIndependentIPS(len_list=L).estimate_policy_value(
            **kw, pscore_item_position=b["pscore_item_position"],
            evaluation_policy_pscore_item_position=e["pscore_item_position"]),
        "rips": est.SlateRewardInteractionIPS(len_list=L).estimate_policy_value(
            **kw, pscore_cascade=b["pscore_cascade"], evaluation_policy_pscore_cascade=e["pscore_cascade"]),
    }


def _softmax(x):
    z = np.exp(x - x.max())
    return z / z.sum()


def _slate_probs(logit, L, factorizable):
    """{slate (tuple of items): probability} of a softmax policy over ``logit`` (one row's): positions
    drawn independently (factorizable) or one after the other among the items left (obp's default)."""
    m = len(logit)
    out = {}
    for s in (itertools.product(range(m), repeat=L) if factorizable else itertools.permutations(range(m), L)):
        p, left = 1.0, list(range(m))
        for a in s:
            p *= _softmax(logit[left])[left.index(a)]
            if not factorizable:
                left.remove(a)
        out[s] = p
    return out


def _pscores(actions, logits, L, factorizable):
    """obp's three pscores (flat) of the slates ``actions`` (n, L) under per-round softmax ``logits``."""
    n = len(actions)
    out = {k: np.zeros(n * L) for k in ("pscore", "pscore_item_position", "pscore_cascade")}
    for i, (s, logit) in enumerate(zip(actions, logits)):
        probs = _slate_probs(logit, L, factorizable)
        cascade, left = 1.0, list(range(len(logit)))
        for k, a in enumerate(s):
            cascade *= _softmax(logit[left])[left.index(a)]
            if not factorizable:
                left.remove(a)
            out["pscore_cascade"][i * L + k] = cascade
            out["pscore_item_position"][i * L + k] = sum(p for t, p in probs.items() if t[k] == a)
        out["pscore"][i * L:(i + 1) * L] = cascade
    return out


def _behaviour(context, action_context, random_state=None):
    """A context-dependent behaviour logit (obp's ``behavior_policy_function`` signature)."""
    return 1.5 * context @ np.random.RandomState(random_state).normal(size=(context.shape[1], action_context.shape[0]))


def _synthetic(seed, n, m, L, factorizable):
    """Slates ``(sid, pos, reward, actions (n, L), behaviour logits, behaviour pscores, target
    logits)``: obp's SyntheticSlateBanditDataset when installed, else numpy's draws."""
    got = _obp()
    if got is not None:
        ds = got[0](n_unique_action=m, len_list=L, dim_context=3, reward_type="binary",
                    reward_structure="cascade_additive", click_model="cascade", base_reward_function=None,
                    behavior_policy_function=_behaviour, is_factorizable=factorizable, random_state=seed)
        bf = ds.obtain_batch_bandit_feedback(n_rounds=n)
        logits_b = _behaviour(bf["context"], ds.action_context, seed)
        b = {k: bf[k] for k in ("pscore", "pscore_item_position", "pscore_cascade")}
        actions, sid, pos, r = bf["action"].reshape(n, L), bf["slate_id"], bf["position"], bf["reward"].astype(float)
    else:
        rng = np.random.default_rng(seed)
        logits_b = 1.5 * rng.normal(size=(n, 3)) @ rng.normal(size=(3, m))
        actions = []
        for logit in logits_b:
            left, s = list(range(m)), []
            for _ in range(L):
                a = int(rng.choice(left, p=_softmax(logit[left])))
                s.append(a)
                if not factorizable:
                    left.remove(a)
            actions.append(s)
        actions = np.array(actions)
        b = _pscores(actions, logits_b, L, factorizable)
        sid, pos = np.repeat(np.arange(n), L), np.tile(np.arange(L), n)
        r = (rng.random(n * L) < 0.3).astype(float)
    logits_e = np.random.default_rng(seed + 1).normal(size=(n, m)) * 2.0
    return sid, pos, r, actions, logits_b, b, logits_e


# --------------------------------------------------------------------------------------------
# the library against obp


@pytest.mark.parametrize("factorizable,seed", [(False, 3), (True, 4)])
def test_values_equal_obp_on_synthetic_slate_data(factorizable, seed):
    n, m, L = 300, 5, 3
    sid, pos, r, actions, logits_b, b, logits_e = _synthetic(seed, n, m, L, factorizable)
    e = _pscores(actions, logits_e, L, factorizable)
    # our pscores of the behaviour are obp's (the behaviour is the one obp drew from)
    mine = _pscores(actions, logits_b, L, factorizable)
    for k in b:
        np.testing.assert_allclose(mine[k], b[k], rtol=1e-12)
    cond_b = ms.conditional_from_cascade(sid, pos, b["pscore_cascade"])
    cond_e = ms.conditional_from_cascade(sid, pos, e["pscore_cascade"])
    ours = ms.slate_estimates(sid, pos, r, e["pscore_item_position"], b["pscore_item_position"], cond_e, cond_b)
    ref = _obp_values(sid, pos, r, b, e)
    for k, v in ref.items():
        assert ours[k].value == pytest.approx(v, rel=1e-12, abs=0), k
        assert ours[k].slates == n
    # standard errors: numpy's over the per-slate sums of obp's per-impression terms
    terms = {"slate_ips": r * e["pscore"] / b["pscore"],
             "iips": r * e["pscore_item_position"] / b["pscore_item_position"],
             "rips": r * e["pscore_cascade"] / b["pscore_cascade"]}
    w = e["pscore_item_position"] / b["pscore_item_position"]
    wsum = np.bincount(sid, weights=w)
    terms["pi"] = np.repeat((wsum - (L - 1)) * np.bincount(sid, weights=r), L) / L  # per-slate value spread over L
    weights = {"slate_ips": (e["pscore"] / b["pscore"])[::L], "iips": w,
               "rips": e["pscore_cascade"] / b["pscore_cascade"], "pi": wsum - (L - 1)}
    for k, t in terms.items():
        y = np.bincount(sid, weights=t)
        assert ours[k].value == pytest.approx(y.mean(), rel=1e-12), k
        assert ours[k].stderr == pytest.approx(np.std(y, ddof=1) / math.sqrt(n), rel=1e-12), k
        u = weights[k]
        assert ours[k].ess == pytest.approx(u.sum() ** 2 / (u * u).sum(), rel=1e-12), k
        assert ours[k].weights == len(u)
    # the weights vary: these are not all-equal ratios
    assert np.std(weights["slate_ips"]) > 0.5 and ours["slate_ips"].ess < 0.8 * n
    # with marginal probabilities only (the job's case) slate_ips and rips take products of the
    # marginal ratios: exact for a factorizable policy, not otherwise
    marg = ms.slate_estimates(sid, pos, r, e["pscore_item_position"], b["pscore_item_position"])
    if factorizable:
        for k in ref:
            assert marg[k].value == pytest.approx(ref[k], rel=1e-12), k
    else:
        assert marg["slate_ips"].value != pytest.approx(ref["slate_ips"], rel=1e-3)
    # the mergeable state gives the same values (one slate at a time, impressions in reverse)
    state = SlateOpeOps.create()
    req = SlateRequestOps()
    for i in range(n):
        st = req.create()
        for j in reversed(range(i * L, (i + 1) * L)):
            req.add(st, SlateImpression(int(pos[j]) + 1, float(r[j]), float(e["pscore_item_position"][j]),
                                        float(b["pscore_item_position"][j]), float(cond_e[j]), float(cond_b[j])))
        SlateOpeOps.add(state, req.terms(st))
    got = SlateOpeOps.extract(state)
    for k in ms.SLATE_ESTIMATORS:
        assert got[k].value == pytest.approx(ours[k].value, rel=1e-14) and got[k].slates == n
        assert got[k].stderr == pytest.approx(ours[k].stderr, rel=1e-12)
        assert got[k].ess == pytest.approx(ours[k].ess, rel=1e-13) and got[k].weights == ours[k].weights


def test_pi_equals_the_pseudo_inverse_for_a_product_logging_policy():
    """Swaminathan et al. 2017: V_PI = (1/n) sum_i R_i q_e(x_i)^T Gamma_b(x_i)^+ 1_{s_i}, Gamma_b and
    q_e enumerated over all m^L slates, the pseudo-inverse by numpy; the logging policy a product
    (obp's factorizable one), the target a softmax drawing distinct items one position after the other."""
    n, m, L = 120, 4, 3
    sid, pos, r, actions, logits_b, b, logits_e = _synthetic(11, n, m, L, True)
    d = m * L

    def indicator(s):
        v = np.zeros(d)
        v[[k * m + a for k, a in enumerate(s)]] = 1.0
        return v

    values, target_marg = [], np.zeros(n * L)
    for i in range(n):
        gamma = sum(p * np.outer(indicator(s), indicator(s)) for s, p in _slate_probs(logits_b[i], L, True).items())
        q = sum(p * indicator(s) for s, p in _slate_probs(logits_e[i], L, False).items())
        weight = q @ np.linalg.pinv(gamma) @ indicator(actions[i])
        sl = slice(i * L, (i + 1) * L)
        target_marg[sl] = [q[k * m + a] for k, a in enumerate(actions[i])]
        ours = ms.slate_terms(pos[sl], r[sl], target_marg[sl], b["pscore_item_position"][sl])
        # Gamma's condition number (on its range) reaches 1e8 here: numpy's pinv is good to a few 1e-9
        assert ours.weights[3][0] == pytest.approx(weight, rel=1e-7, abs=1e-7)
        values.append(r[sl].sum() * weight)
    ours = ms.slate_estimates(sid, pos, r, target_marg, b["pscore_item_position"])["pi"]
    # the weights are of both signs (sum_k w_k < L - 1): the mean is compared at the scale of the values
    scale = np.abs(values).mean()
    assert min(values) < 0 < max(values)
    assert ours.value == pytest.approx(np.mean(values), rel=0, abs=1e-8 * scale)
    assert ours.stderr == pytest.approx(np.std(values, ddof=1) / math.sqrt(n), rel=1e-8)
    # not IIPS: the pseudo-inverse weights the whole slate's clicks
    assert ours.value != pytest.approx(ms.slate_estimates(sid, pos, r, target_marg, b["pscore_item_position"])[
        "iips"].value, rel=1e-3)


# --------------------------------------------------------------------------------------------
# merge order, arrival order, errors


def _random_slates(rng, n):
    out = []
    for i in range(n):
        L = int(rng.integers(1, 5))
        positions = rng.permutation(np.arange(1, 7))[:L]
        imps = [SlateImpression(int(p), float(rng.random() < 0.3), float(rng.uniform(0, 1)),
                                float(1e-3 + rng.random() * 0.6)) for p in positions]
        out.append(imps)
    return out


def test_merge_order_and_partitions_give_bit_identical_values():
    rng = np.random.default_rng(5)
    slates = _random_slates(rng, 400)
    req = SlateRequestOps()

    def terms(imps):
        st = req.create()
        for imp in imps:
            req.add(st, imp)
        return req.terms(st)

    whole = SlateOpeOps.create()
    for imps in slates:
        SlateOpeOps.add(whole, terms(imps))
    want = SlateOpeOps.extract(whole)
    assert want["slate_ips"].slates == 400 and want["iips"].weights == sum(len(s) for s in slates)
    for seed in range(5):
        rnd = random.Random(seed)
        # a slate's impressions split over partial request states, merged in a random order
        shuffled = []
        for imps in slates:
            parts = [req.create() for _ in range(rnd.randint(1, 3))]
            for imp in rnd.sample(imps, len(imps)):
                req.add(rnd.choice(parts), imp, timestamp=rnd.randint(0, 10), attributes={"c": rnd.choice("ab")})
            st = split_merge(req.merge, parts, rnd)
            assert req.terms(st) == terms(imps)
            shuffled.append(req.terms(st))
        rnd.shuffle(shuffled)
        states = [SlateOpeOps.create() for _ in range(3 + 4 * seed)]
        for t in shuffled:
            SlateOpeOps.add(rnd.choice(states), t)
        assert SlateOpeOps.extract(split_merge(SlateOpeOps.merge, states, rnd)) == want  # to the last bit
    empty = SlateOpeOps.extract(SlateOpeOps.merge([]))
    assert empty["rips"].slates == 0 and math.isnan(empty["rips"].value) and math.isnan(empty["pi"].ess)
    # the merged request keeps the earliest timestamp and, of two values of an attribute, the smaller
    a, b = req.create(), req.create()
    req.add(a, slates[0][0], timestamp=7, attributes={"c": "b"})
    req.add(b, slates[0][1] if len(slates[0]) > 1 else slates[0][0], timestamp=3, attributes={"c": "a"})
    merged = req.merge([a, b])
    assert merged.timestamp == 3 and merged.attributes == {"c": "a"}


def test_refusals():
    with pytest.raises(ValueError, match="positions must be distinct"):
        ms.slate_terms([1, 1], [0, 1], [0.5, 0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"logging_prob must be in \(0, 1\]"):
        ms.slate_terms([1, 2], [0, 1], [0.5, 0.5], [0.5, 0.0])
    with pytest.raises(ValueError, match=r"target_cond must be in \[0, 1\]"):
        ms.slate_terms([1, 2], [0, 1], [0.5, 0.5], [0.5, 0.5], [0.5, 1.5], None)
    with pytest.raises(ValueError, match="finite"):
        ms.slate_terms([1], [float("nan")], [0.5], [0.5])
    with pytest.raises(ValueError, match="at least one impression"):
        SlateRequestOps.terms(SlateRequestOps.create())
    half = SlateRequestOps.create()
    SlateRequestOps().add(half, SlateImpression(1, 1.0, 0.5, 0.5, 0.5, 0.5))
    SlateRequestOps().add(half, SlateImpression(2, 1.0, 0.5, 0.5))
    with pytest.raises(ValueError, match="target_cond given for 1 of the slate's 2 impressions"):
        SlateRequestOps.terms(half)
    with pytest.raises(ValueError, match="shape"):
        ms.slate_estimates([0, 0], [0, 1], [1, 0], [0.5], [0.5, 0.5])
    # one slate by hand: positions 3 and 1 given out of order
    t = ms.slate_terms([3, 1], [1.0, 1.0], [0.2, 0.1], [0.4, 0.5], [0.3, 0.1], [0.6, 0.5])
    w1, w3, v1, v3 = 0.1 / 0.5, 0.2 / 0.4, 0.1 / 0.5, 0.3 / 0.6
    assert t.values == pytest.approx((v1 * v3 * 2, w1 + w3, v1 + v1 * v3, (w1 + w3 - 1) * 2), rel=1e-15)
    assert t.weights[2] == pytest.approx((v1, v1 * v3)) and t.impressions == 2


# --------------------------------------------------------------------------------------------
# the command


def _rows(out):
    rows = {}
    for line in open(out / "metrics.jsonl", encoding="utf-8"):
        r = json.loads(line)
        rows[(r["slice"], r["system"], r["metric"])] = r
    return rows


def test_command_equals_obp_on_the_open_bandit_sample(tmp_path, capsys):
    """``streameval ope --slate --target random`` on the BTS logs of the three campaigns. Every request
    of the bundled sample is one impression (its rows do not group into page views: data/sample/
    SOURCE.md), so each slate has one impression and the four estimators are IPS on it; their rows
    equal obp's slate estimators on the same arrays and the ``ips`` row."""
    from streameval.jobs import ope

    sizes = {"all": 80, "men": 34, "women": 46}
    paths = [os.path.join("data", "sample", "impressions", f"obd_bts_{c}.avro") for c in sizes]
    out = tmp_path / "out"
    assert ope.main(["--logs", *paths, "--target", "random", "--n-items", "all=80,men=34,women=46", "--slate",
                     "--output", str(out)]) == 0
    report = capsys.readouterr().out
    assert "slate_ips[random] (se)" in report and "(slates: 30000)" in report
    rows = _rows(out)
    recs = [r for p in paths for r in avro.read_records(p, "impression")]
    for sl, keep in [("all", None), *((f"campaign={c}", c) for c in sizes)]:
        sel = [r for r in recs if keep is None or r["attributes"]["campaign"] == keep]
        sid = np.array([r["request_id"] for r in sel])
        pos = np.array([r["position"] - 1 for r in sel])
        rew = np.array([float(r["clicked"]) for r in sel])
        pb = np.array([r["propensity"] for r in sel])
        pe = np.array([1.0 / sizes[r["attributes"]["campaign"]] for r in sel])
        ps = {"pscore": pb, "pscore_item_position": pb, "pscore_cascade": pb}
        ref = _obp_values(sid, pos, rew, ps, {k: pe for k in ps})
        y = pe / pb * rew
        ref["pi"] = y.mean()  # one impression per slate: weight w - (1 - 1)
        for k, v in ref.items():
            row = rows[(sl, "bts", f"{k}[random]")]
            assert row["num_queries"] == len(sel)
            assert row["value"] == pytest.approx(v, rel=1e-12, abs=0), (sl, k)
            assert row["stderr"] == pytest.approx(np.std(y, ddof=1) / math.sqrt(len(y)), rel=1e-12), (sl, k)
            assert row["ci_method"] == "t" and row["ci_low"] < row["value"] < row["ci_high"]
            assert row["value"] == pytest.approx(rows[(sl, "bts", "ips[random]")]["value"], rel=1e-15)
            ess = rows[(sl, "bts", f"{k}[random]:ess")]
            assert ess["value"] == pytest.approx(rows[(sl, "bts", "ope[random]:ess")]["value"], rel=1e-12)


def _slate_log(tmp_path, seed, n=400, m=6, L=3):
    """obp's factorizable synthetic slates (a context-dependent product behaviour) as impression logs:
    one request per slate, the behaviour's marginal as the propensity, two campaigns. Slates showing
    an item twice are dropped (the job rejects a request's second impression of an item)."""
    sid, pos, r, actions, logits_b, b, _ = _synthetic(seed, n, m, L, True)
    keep = np.array([len(set(s)) == L for s in actions])
    keep_imp = np.repeat(keep, L)
    recs = []
    for j in np.flatnonzero(keep_imp):
        i = int(sid[j])
        recs.append({"event_id": f"e{j}", "request_id": f"q{i}", "query_id": "", "system_id": "L",
                     "item_id": str(int(actions[i][pos[j]])), "position": int(pos[j]) + 1, "clicked": bool(r[j]),
                     "timestamp": i, "propensity": float(b["pscore_item_position"][j]),
                     "attributes": {"campaign": "a" if i % 3 else "b"}})
    logs = tmp_path / f"slates{seed}.avro"
    avro.write_records(str(logs), "impression", recs)
    arrays = {"sid": sid[keep_imp], "pos": pos[keep_imp], "r": r[keep_imp],
              "b": {k: v[keep_imp] for k, v in b.items()}, "campaign": np.array([rec["attributes"]["campaign"]
                                                                                 for rec in recs])}
    return logs, arrays


def test_command_equals_obp_on_synthetic_slates(tmp_path, capsys):
    """Slates of three impressions with weights that vary: the job's rows (target random over the 6
    items: 1/6 at every position, a factorizable policy) equal obp's estimators per slice."""
    from streameval.jobs import ope

    m, L = 6, 3
    logs, a = _slate_log(tmp_path, 21, m=m, L=L)
    out = tmp_path / "out"
    assert ope.main(["--logs", str(logs), "--target", "random", "--n-items", str(m), "--slate",
                     "--output", str(out)]) == 0
    capsys.readouterr()
    rows = _rows(out)
    for sl, keep in (("all", None), ("campaign=a", "a"), ("campaign=b", "b")):
        sel = np.ones(len(a["sid"]), bool) if keep is None else a["campaign"] == keep
        sid, pos, r = a["sid"][sel], a["pos"][sel], a["r"][sel]
        b = {k: v[sel] for k, v in a["b"].items()}
        e = {"pscore": np.full(len(sid), m ** -L), "pscore_item_position": np.full(len(sid), 1 / m),
             "pscore_cascade": float(m) ** -(pos + 1.0)}
        ref = _obp_values(sid, pos, r, b, e)
        lib = ms.slate_estimates(sid, pos, r, e["pscore_item_position"], b["pscore_item_position"])
        for k in ms.SLATE_ESTIMATORS:
            row = rows[(sl, "L", f"{k}[random]")]
            assert row["num_queries"] == len(np.unique(sid))
            if k in ref:
                assert row["value"] == pytest.approx(ref[k], rel=1e-12, abs=0), (sl, k)
            assert row["value"] == pytest.approx(lib[k].value, rel=1e-13), (sl, k)
            assert row["stderr"] == pytest.approx(lib[k].stderr, rel=1e-12), (sl, k)
            ess = rows[(sl, "L", f"{k}[random]:ess")]
            assert ess["value"] == pytest.approx(lib[k].ess, rel=1e-12) and ess["num_queries"] == lib[k].weights
    assert len({rows[("all", "L", f"{k}[random]")]["value"] for k in ms.SLATE_ESTIMATORS}) == 4
    # without --slate no slate rows
    assert ope.main(["--logs", str(logs), "--target", "random", "--n-items", str(m),
                     "--output", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert not any(k[2].startswith(("slate_ips[", "iips[", "rips[", "pi[")) for k in _rows(tmp_path / "plain"))


def test_command_warns_on_a_small_slate_ess_and_dead_letters_a_repeated_position(tmp_path, capsys):
    from streameval.jobs import ope

    logs, a = _slate_log(tmp_path, 22, n=40)
    recs = list(avro.read_records(str(logs), "impression"))
    n_slates = len({r["request_id"] for r in recs})
    bad = [dict(recs[0], event_id="x1", request_id="dup", item_id="100", position=1),
           dict(recs[0], event_id="x2", request_id="dup", item_id="101", position=1)]
    avro.write_records(str(logs), "impression", recs + bad)
    out = tmp_path / "out"
    assert ope.main(["--logs", str(logs), "--target", "random", "--n-items", "6", "--slate", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if "effective sample size" in line]
    assert len(lines) == 2  # the impressions' (below 100) and the slates'
    slate_line = [line for line in lines if line.startswith("warning: slate estimators'")]
    k = 4 * (1 + len({r["attributes"]["campaign"] for r in recs}))  # 4 estimators per slice: all and campaigns
    assert len(slate_line) == 1 and f"{k} of {k} (slice, logs, estimator) rows" in slate_line[0]
    rows = _rows(out)
    assert rows[("all", "L", "slate_ips[random]")]["num_queries"] == n_slates  # the bad request left out
    assert rows[("all", "L", "ips[random]")]["num_queries"] == len(recs) + 2  # its impressions in IPS
    dead = [json.loads(line) for line in open(out / "dead_letters.jsonl", encoding="utf-8")]
    assert len(dead) == 1 and dead[0]["reason"].startswith("slate estimators: a slate's positions must be distinct")
    assert json.loads(dead[0]["raw"])["request_id"] == "dup"
    assert f"(slates: {n_slates})" in captured.out


def test_small_slate_ess_rule():
    from streameval.jobs.ope import small_ess_warning, small_slate_ess_warning

    def rows(*triples):
        return [{"metric": f"{m}[t]:ess", "value": e, "num_queries": n, "slice": f"s{i}", "system": "L"}
                for i, (m, e, n) in enumerate(triples)]

    assert small_slate_ess_warning(rows(("iips", 150.0, 10_000), ("pi", 100.0, 100)), "t") is None
    text = small_slate_ess_warning(rows(("iips", 150.0, 20_000), ("slate_ips", 150.0, 20_000), ("rips", 5e3, 9e3)), "t")
    assert "2 of 3" in text and "smallest 150.0 of 20000 weights (iips[t]" in text  # below 1 %
    assert "smallest 99.0 of 120" in small_slate_ess_warning(rows(("rips", 99.0, 120)), "t")
    assert small_slate_ess_warning(rows(("rips", 99.0, 120)), "other") is None
    assert small_ess_warning(rows(("rips", 99.0, 120)), "t") is None  # the impressions' rule: ope[t]:ess only
