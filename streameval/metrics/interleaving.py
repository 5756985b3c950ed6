"""Interleaving: team-draft and balanced interleaving, credit assignment, the preference and its tests.

Pure numpy and Python (no Beam, no I/O). Conventions are in ``docs/metrics.md`` (section
"Interleaving").

Interleaving (Joachims 2002/2003; Radlinski, Kurup and Joachims, "How does clickthrough data reflect
retrieval quality?", CIKM 2008; Chapelle, Joachims, Radlinski and Yue, "Large-scale validation and
analysis of interleaved search evaluation", ACM TOIS 30(1), 2012) shows each user one list merged
from the rankings of two rankers A and B and credits each click to the ranker that contributed the
clicked item. Per request (impression list), the ranker with more credited clicks wins; equal
(non-zero) credit is a tie; a request without a click says nothing and is left out, as in both papers.

Over ``n`` requests with a click (``wins_a + wins_b + ties = n``):

* preference for B: ``(wins_b + ties / 2) / n - 0.5`` (Chapelle et al. 2012's Delta_AB with the
  roles of A and B swapped: positive means B is preferred, 0 no preference; in [-0.5, 0.5]); its
  standard error is that of the mean of the per-request scores 1 (B wins), 1/2 (tie), 0 (A wins);
* the sign test: under "no preference" every request with a winner is won by B with probability
  1/2; the exact two-sided binomial p-value of ``wins_b`` among ``wins_a + wins_b`` (ties left out,
  the sign test's convention), :func:`sign_test_p_value`;
* the share of decisive requests won by B, ``wins_b / (wins_a + wins_b)``, with its Wilson interval.

In an impression log, the team of each served item is the impression's ``attributes["team"]``
("A" or "B"); the request's ``system_id`` names the experiment (the A/B pair), the teams name the
rankers.
"""

from __future__ import annotations

import math
import random

import numpy as np

__all__ = [
    "TEAMS",
    "TEAM_ATTRIBUTE",
    "METHODS",
    "team_draft",
    "balanced",
    "interleave",
    "team_credit",
    "balanced_credit",
    "outcome",
    "request_terms",
    "sign_test_p_value",
    "preference_from_counts",
    "interleaving_results",
    "cascade_clicks",
]

TEAMS = ("A", "B")
#: the impression attribute holding the team of the served item
TEAM_ATTRIBUTE = "team"
METHODS = ("team_draft", "balanced")


def _rng(seed):
    """``seed``: None, an int, or an object with ``random()`` (a ``random.Random``) used as is."""
    return seed if hasattr(seed, "random") else random.Random(seed)


def team_draft(a, b, seed=None, length: int | None = None) -> tuple[list, list]:
    """Team-draft interleaving (Radlinski, Kurup and Joachims 2008, Algorithm 2):
    ``(items, teams)``, the merged list and the team ("A" or "B") of each item.

    Like captains picking teams: in each round a fair coin (``random.Random(seed)``, one draw per
    round) decides which team picks first; then each team in turn appends its highest-ranked item
    not yet in the list. A team whose ranking is exhausted no longer picks. Formally, while items
    remain: if ``|team A| < |team B|`` or (equal and the coin says A), A picks, else B picks (one
    pick per step, so the coin is drawn when both teams are the same size: once per round).
    ``length``: stop after that many items (default: all distinct items of both rankings)."""
    rnd = _rng(seed)
    a, b = list(a), list(b)
    total = len(set(a) | set(b))
    length = total if length is None else min(int(length), total)
    items, teams, seen = [], [], set()
    ia = ib = 0
    na = nb = 0
    coin_a = None
    while len(items) < length:
        while ia < len(a) and a[ia] in seen:
            ia += 1
        while ib < len(b) and b[ib] in seen:
            ib += 1
        has_a, has_b = ia < len(a), ib < len(b)
        if not (has_a or has_b):
            break
        if na == nb:
            coin_a = rnd.random() < 0.5
        pick_a = has_a and (not has_b or na < nb or (na == nb and coin_a))
        if pick_a:
            items.append(a[ia])
            teams.append("A")
            seen.add(a[ia])
            na += 1
        else:
            items.append(b[ib])
            teams.append("B")
            seen.add(b[ib])
            nb += 1
    return items, teams


def balanced(a, b, seed=None, length: int | None = None) -> tuple[list, list]:
    """Balanced interleaving (Joachims 2003; Radlinski, Kurup and Joachims 2008, Algorithm 1):
    ``(items, teams)``.

    One fair coin (``random.Random(seed)``) decides whether A or B goes first; then the two rankings
    are read top down in turns (pointers ``ka``, ``kb``): when ``ka < kb``, or ``ka == kb`` and A
    goes first, A's next item ``a[ka]`` is appended unless already in the list and ``ka`` advances;
    otherwise the same for B. At any cutoff, the list holds the top ``ka`` of A and the top ``kb``
    of B with ``|ka - kb| <= 1``. The team of an item is the ranker whose pointer appended it (for
    the log; the balanced credit rule, :func:`balanced_credit`, does not use teams)."""
    rnd = _rng(seed)
    a, b = list(a), list(b)
    a_first = rnd.random() < 0.5
    total = len(set(a) | set(b))
    length = total if length is None else min(int(length), total)
    items, teams, seen = [], [], set()
    ka = kb = 0
    while len(items) < length and (ka < len(a) or kb < len(b)):
        take_a = kb >= len(b) or (ka < len(a) and (ka < kb or (ka == kb and a_first)))
        if take_a:
            if a[ka] not in seen:
                items.append(a[ka])
                teams.append("A")
                seen.add(a[ka])
            ka += 1
        else:
            if b[kb] not in seen:
                items.append(b[kb])
                teams.append("B")
                seen.add(b[kb])
            kb += 1
    return items, teams


def interleave(a, b, method: str = "team_draft", seed=None, length: int | None = None) -> tuple[list, list]:
    """``team_draft`` or ``balanced`` interleaving of rankings ``a`` and ``b``."""
    if method == "team_draft":
        return team_draft(a, b, seed, length)
    if method == "balanced":
        return balanced(a, b, seed, length)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def team_credit(teams, clicked) -> tuple[int, int]:
    """``(clicks on A's items, clicks on B's items)`` (team-draft credit, Radlinski et al. 2008):
    ``teams`` and ``clicked`` (booleans) per position of the interleaved list."""
    ca = sum(1 for t, c in zip(teams, clicked) if c and t == "A")
    cb = sum(1 for t, c in zip(teams, clicked) if c and t == "B")
    return ca, cb


def balanced_credit(a, b, items, clicked) -> tuple[int, int]:
    """Balanced-interleaving credit (Radlinski et al. 2008, section 4.1): with ``l`` the lowest
    (last) clicked item of the interleaved list ``items`` and ``k`` the smallest rank at which
    ``l`` appears in A or in B (1-based), A is credited the clicked items among A's top ``k`` and B
    those among B's top ``k``. ``(0, 0)`` without a click."""
    clicks = [it for it, c in zip(items, clicked) if c]
    if not clicks:
        return 0, 0
    last = clicks[-1]
    a, b = list(a), list(b)
    ranks = [a.index(last) + 1 if last in a else math.inf, b.index(last) + 1 if last in b else math.inf]
    k = min(ranks)
    top_a, top_b = set(a[:k]), set(b[:k])
    return sum(it in top_a for it in clicks), sum(it in top_b for it in clicks)


def outcome(clicks_a: int, clicks_b: int) -> str | None:
    """The request's outcome: ``"A"`` or ``"B"`` (more credited clicks), ``"tie"`` (equal, not
    zero) or None (no click: left out)."""
    if clicks_a == clicks_b:
        return None if clicks_a == 0 else "tie"
    return "A" if clicks_a > clicks_b else "B"


def request_terms(clicks_a, clicks_b) -> np.ndarray:
    """Per-request indicators, shape (3, n): A wins, B wins, tie; NaN (left out) for a request
    without a credited click or with NaN credit (a click on an item without a team)."""
    ca = np.asarray(clicks_a, dtype=np.float64)
    cb = np.asarray(clicks_b, dtype=np.float64)
    out = np.stack([(ca > cb), (cb > ca), (ca == cb)]).astype(np.float64)
    out[:, ~((ca + cb) > 0)] = math.nan
    return out


def sign_test_p_value(wins_a: int, wins_b: int) -> float:
    """Exact two-sided sign test of "no preference": the binomial p-value of ``wins_b`` successes in
    ``m = wins_a + wins_b`` trials with probability 1/2 (ties left out). The distribution is
    symmetric, so the p-value is ``min(1, 2 P(X <= min(wins_a, wins_b)))`` (equal to
    ``scipy.stats.binomtest(wins_b, m).pvalue``); computed in exact integers up to m = 2000, by
    ``scipy.stats.binom.cdf`` beyond. 1 when m = 0."""
    wa, wb = int(wins_a), int(wins_b)
    if wa < 0 or wb < 0:
        raise ValueError("wins must be non-negative")
    m = wa + wb
    if m == 0:
        return 1.0
    k = min(wa, wb)
    if 2 * k == m:
        return 1.0
    if m <= 2000:
        tail = sum(math.comb(m, i) for i in range(k + 1))
        return min(1.0, 2 * tail / 2**m)
    from scipy.stats import binom

    return float(min(1.0, 2 * binom.cdf(k, m, 0.5)))


def preference_from_counts(wins_a: int, wins_b: int, ties: int) -> tuple[float, int, float]:
    """``(preference for B, n, stderr)`` with n = wins_a + wins_b + ties: the mean of the
    per-request scores 1 (B wins), 1/2 (tie), 0 (A wins) minus 1/2, and the standard error of that
    mean (sample standard deviation over sqrt(n)). NaN when n = 0; stderr NaN when n = 1."""
    wa, wb, t = int(wins_a), int(wins_b), int(ties)
    n = wa + wb + t
    if n == 0:
        return math.nan, 0, math.nan
    mean = (wb + t / 2) / n
    if n < 2:
        return mean - 0.5, n, math.nan
    # sum (y - mean)^2 with sum y = wb + t/2 and sum y^2 = wb + t/4, in exact quarters
    ss4 = n * (4 * wb + t) - (2 * wb + t) ** 2  # 4 n sum y^2 - (2 sum y)^2 = 4 n sum (y - mean)^2
    var = max(ss4, 0) / (4 * n) / (n - 1)
    return mean - 0.5, n, math.sqrt(var / n)


def interleaving_results(wins_a: int, wins_b: int, ties: int, level: float = 0.95) -> dict:
    """The rows' values of one (window, slice, experiment): ``{suffix: (value, count, stderr, ci)}``
    for suffixes ``preference``, ``wins_a``, ``wins_b``, ``ties``, ``p_value`` and ``win_rate_b``
    (``ci``: its Wilson interval ``(low, high)`` or None)."""
    from .stats import wilson_interval

    wa, wb, t = int(wins_a), int(wins_b), int(ties)
    pref, n, se = preference_from_counts(wa, wb, t)
    m = wa + wb
    rate = wb / m if m else math.nan
    ci = tuple(wilson_interval(wb, m, level)) if m else None
    return {"preference": (pref, n, se, None), "wins_a": (float(wa), n, None, None),
            "wins_b": (float(wb), n, None, None), "ties": (float(t), n, None, None),
            "p_value": (sign_test_p_value(wa, wb), m, None, None), "win_rate_b": (rate, m, None, ci)}


def cascade_clicks(grades, rng, max_grade: int = 1, p_min: float = 0.05, p_max: float = 0.95,
                   stop: float = 0.6) -> list[bool]:
    """Clicks of one user on a list under the cascade model (Craswell, Zoeter, Taylor and Ramsey,
    WSDM 2008) with the stopping of Chapelle et al. 2009's dependent click model: the user reads
    top down; an item of grade g is clicked with probability ``p_min + (p_max - p_min) g /
    max_grade`` (unjudged or negative grades count as 0); after a click the user stops with
    probability ``stop * g / max_grade`` (more likely after a relevant item). ``rng``: a
    ``random.Random``."""
    out = []
    top = max(int(max_grade), 1)
    stopped = False
    for g in grades:
        if stopped:
            out.append(False)
            continue
        r = min(max(g or 0, 0), top) / top
        c = rng.random() < p_min + (p_max - p_min) * r
        out.append(c)
        if c and rng.random() < stop * r:
            stopped = True
    return out
