"""Interleaving (issue 19, item 1): hand-worked lists from the papers' descriptions, the credit rules,
the sign test against scipy, and a seeded simulation with a cascade click model."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy.stats import binomtest

from streameval.metrics import interleaving as il
from streameval.metrics.online import parse_online_metric


class Coins:
    """A ``random.Random`` stand-in whose draws are given: True -> A (0.0), False -> B (0.9)."""

    def __init__(self, *a_first):
        self.seq = list(a_first)

    def random(self):
        return 0.0 if self.seq.pop(0) else 0.9


# Radlinski, Kurup and Joachims 2008, Figure 1: A = (a b c d g h), B = (b e a f g h)
A = list("abcdgh")
B = list("beafgh")


def test_balanced_interleaving_of_the_papers_example():
    # A first: a (A1), b (B1), A2 = b already shown, e (B2), c (A3), B3 = a shown, d (A4), f (B4), g (A5), h (A6)
    items, teams = il.balanced(A, B, Coins(True))
    assert items == list("abecdfgh")
    assert teams == list("ABBAABAA")
    # B first: b (B1), a (A1), e (B2), A2 = b shown, B3 = a shown, c (A3), f (B4), d (A4), g (B5), h (B6)
    items, _ = il.balanced(A, B, Coins(False))
    assert items == list("baecfdgh")
    # every prefix holds the top ka of A and the top kb of B with |ka - kb| <= 1
    for k in range(1, 9):
        top = set(items[:k])
        ka = max(j for j in range(7) if set(A[:j]) <= top)
        kb = max(j for j in range(7) if set(B[:j]) <= top)
        assert abs(ka - kb) <= 1


def test_team_draft_with_given_coins():
    # each round, the coin's team picks its highest item not yet shown, then the other team
    items, teams = il.team_draft(A, B, Coins(True, True, True, True))
    assert items == list("abcedfgh")  # A: a, B: b, A: c, B: e, A: d, B: f, A: g, B: h
    assert teams == list("ABABABAB")
    items, teams = il.team_draft(A, B, Coins(False, True, False, True))
    # B: b, A: a | A: c, B: e | B: f, A: d | A: g, B: h
    assert items == list("bacefdgh")
    assert teams == list("BAABBAAB")
    # every item of either ranking appears once; with disjoint rankings of equal length the teams'
    # sizes differ by at most one at every prefix, and each team's items keep their ranker's order
    rnd = random.Random(3)
    for _ in range(200):
        a = rnd.sample(range(12), 8)
        b = rnd.sample(range(12), 8)
        items, teams = il.team_draft(a, b, rnd.randrange(10**6))
        assert sorted(items) == sorted(set(a) | set(b))
        a, b = list(range(6)), list(range(10, 16))
        items, teams = il.team_draft(a, b, rnd.randrange(10**6))
        assert all(abs(teams[:k].count("A") - teams[:k].count("B")) <= 1 for k in range(13))
        assert [i for i, t in zip(items, teams) if t == "A"] == a


def test_seeded_coins_are_reproducible():
    assert il.team_draft(A, B, 7) == il.team_draft(A, B, 7)
    assert il.interleave(A, B, "balanced", 7) == il.balanced(A, B, 7)
    with pytest.raises(ValueError):
        il.interleave(A, B, "probabilistic")


def test_credit_rules():
    items, teams = il.balanced(A, B, Coins(True))  # a b e c d f g h
    clicked = [it in ("b", "e") for it in items]
    # balanced credit: lowest click e is B's 2nd, k = 2: A's top 2 {a, b} hold b, B's top 2 {b, e} hold both
    assert il.balanced_credit(A, B, items, clicked) == (1, 2)
    assert il.outcome(1, 2) == "B"
    items, teams = il.team_draft(A, B, Coins(True, True, True, True))  # a b c e d f g h, A B A B ...
    clicked = [it in ("a", "c", "e") for it in items]
    assert il.team_credit(teams, clicked) == (2, 1)
    assert il.outcome(2, 1) == "A" and il.outcome(1, 1) == "tie" and il.outcome(0, 0) is None
    t = il.request_terms([2, 1, 0, 1], [1, 1, 0, 3])
    assert t[:, 0].tolist() == [1, 0, 0] and t[:, 1].tolist() == [0, 0, 1] and t[:, 3].tolist() == [0, 1, 0]
    assert np.isnan(t[:, 2]).all()  # no click: left out


def test_sign_test_equals_scipy_binomtest():
    for wa in range(0, 40, 3):
        for wb in range(0, 40, 4):
            if wa + wb:
                assert il.sign_test_p_value(wa, wb) == pytest.approx(binomtest(wb, wa + wb).pvalue, rel=1e-12)
    assert il.sign_test_p_value(0, 0) == 1.0
    assert il.sign_test_p_value(1400, 1600) == pytest.approx(binomtest(1600, 3000).pvalue, rel=1e-9)


def test_preference_and_results():
    # 3 A wins, 5 B wins, 2 ties: ((5 + 1) / 10) - 0.5 = 0.1; scores 0,0,0,1,1,1,1,1,.5,.5
    pref, n, se = il.preference_from_counts(3, 5, 2)
    y = np.array([0, 0, 0, 1, 1, 1, 1, 1, .5, .5])
    assert n == 10 and pref == pytest.approx(y.mean() - 0.5)
    assert se == pytest.approx(y.std(ddof=1) / math.sqrt(10))
    res = il.interleaving_results(3, 5, 2)
    assert res["wins_a"][0] == 3 and res["ties"][0] == 2 and res["p_value"][1] == 8
    assert res["p_value"][0] == pytest.approx(binomtest(5, 8).pvalue)
    lo, hi = res["win_rate_b"][3]
    assert lo < 5 / 8 < hi
    assert math.isnan(il.preference_from_counts(0, 0, 0)[0])


def test_metric_name():
    assert parse_online_metric("interleaving").name == "interleaving"
    assert parse_online_metric("interleaving[team_draft]").family == "interleaving"


# --------------------------------------------------------------------------------------------
# simulation: graded collections, a cascade click model, B ranks by relevance with less noise

def _simulate(n_queries, noise_a, noise_b, seed, method="team_draft", docs=20, depth=10):
    """(wins_a, wins_b, ties) of ``n_queries`` interleaved requests: each query has ``docs``
    documents with grades 0..3 (P = .5, .25, .15, .1); a ranker sorts by grade + N(0, noise)."""
    rng = np.random.default_rng(seed)
    rnd = random.Random(seed)
    wa = wb = t = 0
    grades_all = rng.choice(4, size=(n_queries, docs), p=[.5, .25, .15, .1])
    rank_a = np.argsort(-(grades_all + rng.normal(0, noise_a, grades_all.shape)), axis=1)[:, :depth].tolist()
    rank_b = np.argsort(-(grades_all + rng.normal(0, noise_b, grades_all.shape)), axis=1)[:, :depth].tolist()
    for grades, a, b in zip(grades_all.tolist(), rank_a, rank_b):
        items, teams = il.interleave(a, b, method, rnd, length=depth)
        clicked = il.cascade_clicks([grades[i] for i in items], rnd, max_grade=3)
        if method == "team_draft":
            ca, cb = il.team_credit(teams, clicked)
        else:
            ca, cb = il.balanced_credit(a, b, items, clicked)
        o = il.outcome(ca, cb)
        wa += o == "A"
        wb += o == "B"
        t += o == "tie"
    return wa, wb, t


#: queries per trial, trials
N_QUERIES, TRIALS = 200, 100


def test_simulation_finds_the_better_ranker():
    """B (noise 1) against A (noise 3): B wins the sign test (p < 0.05, more wins) in at least 95%
    of the seeded trials of 200 queries. Measured (seeds 0..99): 100/100 at 200 queries, 99/100 at
    100, 78/100 at 50 (B has more wins in 100/100 at each); e.g. seed 0: 44 A wins, 118 B, 38 ties."""
    right = 0
    for trial in range(TRIALS):
        wa, wb, _ = _simulate(N_QUERIES, 3.0, 1.0, trial)
        right += wb > wa and il.sign_test_p_value(wa, wb) < 0.05
    assert right >= 0.95 * TRIALS, right


def test_simulation_identical_rankers_false_positive_rate():
    """Equally good rankers (noise 2 each, independent draws): the sign test at 0.05 rejects in
    about 5% of trials of 200 queries: measured 9/200 (seeds 1000..1199; 41/1000 on seeds
    5000..5999). The bound 16 is the 97.5% quantile of Binomial(200, 0.05)."""
    rejected = sum(il.sign_test_p_value(*_simulate(N_QUERIES, 2.0, 2.0, 1000 + trial)[:2]) < 0.05
                   for trial in range(2 * TRIALS))
    assert 2 <= rejected <= 16, rejected


def test_simulation_balanced_interleaving_finds_the_better_ranker():
    """Balanced interleaving with its own credit rule: B has more wins in 20/20 trials (measured)."""
    right = sum((lambda w: w[1] > w[0])(_simulate(N_QUERIES, 3.0, 1.0, 500 + trial, "balanced"))
                for trial in range(20))
    assert right >= 19


# --------------------------------------------------------------------------------------------
# the whole path: two TREC runs -> streameval convert interleave -> streameval batch --metrics interleaving

def test_convert_interleave_then_batch_on_real_runs(tmp_path):
    """trec_eval's test run (STANDARD, A) against an oracle run ranking the same queries' judged
    documents by grade (B): the simulated log's interleaving rows name B the winner, equal on both
    engines, and equal the credit counted from the log directly."""
    import json
    from pathlib import Path

    from streameval.jobs import batch
    from streameval import cli
    from streameval.io import avro

    data = Path(__file__).parent / "data" / "trec_eval_test"
    oracle = tmp_path / "oracle.run"
    lines = [ln.split() for ln in (data / "qrels.test").read_text().splitlines() if ln.strip()]
    oracle.write_text("".join(f"{q} Q0 {d} 0 {g} oracle\n" for q, _, d, g in lines))
    out = tmp_path / "imps.avro"
    assert cli.main(["convert", "interleave", "--run-a", str(data / "results.test"), "--run-b", str(oracle),
                     "--qrels", str(data / "qrels.test"), "--output", str(out), "--sessions", "20",
                     "--seed", "1"]) == 0
    recs = list(avro.read_records(out))
    rows = {}
    for engine in ("records", "columnar"):
        o = tmp_path / engine
        assert batch.main(["--impressions", str(out), "--metrics", "interleaving", "--output", str(o), "--quiet",
                           "--engine", engine, "--no-ctr"]) == 0
        rows[engine] = sorted(json.dumps(json.loads(x), sort_keys=True)
                              for x in (o / "metrics.jsonl").read_text().splitlines())
    assert rows["records"] == rows["columnar"]
    got = {json.loads(x)["metric"]: json.loads(x) for x in rows["records"]}
    assert {r["system"] for r in got.values()} == {"STANDARD-vs-oracle"}
    assert got["interleaving:preference"]["value"] > 0.2
    assert got["interleaving:p_value"]["value"] < 1e-6
    assert len(recs) == 3 * 20 * 10 and {r["attributes"]["team"] for r in recs} == {"A", "B"}
    credit: dict = {}
    for r in recs:
        c = credit.setdefault(r["request_id"], [0, 0])
        if r["clicked"]:
            c[r["attributes"]["team"] == "B"] += 1
    outcomes = [il.outcome(a, b) for a, b in credit.values()]
    assert got["interleaving:wins_a"]["value"] == outcomes.count("A")
    assert got["interleaving:wins_b"]["value"] == outcomes.count("B")
    assert got["interleaving:ties"]["value"] == outcomes.count("tie")
    assert got["interleaving:preference"]["num_queries"] == len(outcomes) - outcomes.count(None)


def test_request_state_merges_in_any_split():
    """InterleavingRequestOps: any split and merge order gives the same state and credit; a click on
    an item without a team marks the request."""
    from streameval.accumulators.online import InterleavingRequestOps

    ops = InterleavingRequestOps(["device"])
    imps = [("d1", 1, True, 5, {"team": "A", "device": "pc"}), ("d2", 2, False, 4, {"team": "B"}),
            ("d3", 3, True, 6, {"team": "B"}), ("d4", 4, True, 7, {"team": "B"}), ("d5", 5, None, 3, {})]
    one = ops.create()
    for imp in imps:
        ops.add_impression(one, *imp)
    assert one[0] == 3 and one[1] == {"device": "pc"} and ops.credit(one) == (1, 2, False)
    rnd = random.Random(0)
    for _ in range(20):
        order = rnd.sample(imps, len(imps))
        parts = [ops.create() for _ in range(3)]
        for imp in order:
            ops.add_impression(rnd.choice(parts), *imp)
        assert ops.merge(rnd.sample(parts, 3)) == one
    ops.add_impression(one, "d6", 6, True, 8, {"device": "sp"})
    assert ops.credit(one) == (1, 2, True)
