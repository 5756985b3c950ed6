"""Click-through rate counters: overall and by position. Integer counts, so merging is exact.

CTR = clicks / impressions (a ratio of sums over impressions, not a mean over requests).
Standard error: the binomial sqrt(p (1 - p) / n). Empty: NaN with count 0.

States are plain lists of ints (Beam's FastPrimitivesCoder encodes them without pickling):
``CtrState = [impressions, clicks]``; ``CtrByPositionState = {position: [impressions, clicks]}``.
"""

from __future__ import annotations

import math

__all__ = ["ctr_create", "ctr_add", "ctr_merge", "ctr_extract",
           "ctr_pos_create", "ctr_pos_add", "ctr_pos_merge", "ctr_pos_extract"]


def _rate(imps: int, clicks: int) -> tuple[float, int, float]:
    if imps == 0:
        return (math.nan, 0, math.nan)
    p = clicks / imps
    return (p, imps, math.sqrt(p * (1.0 - p) / imps))


def ctr_create() -> list:
    return [0, 0]


def ctr_add(state: list, clicked: bool, n: int = 1) -> list:
    """Count ``n`` impressions, clicked or not."""
    state[0] += n
    if clicked:
        state[1] += n
    return state


def ctr_merge(states) -> list:
    out = [0, 0]
    for s in states:
        out[0] += s[0]
        out[1] += s[1]
    return out


def ctr_extract(state) -> tuple[float, int, float]:
    """(CTR, impressions, standard error)."""
    return _rate(state[0], state[1])


def ctr_pos_create() -> dict:
    return {}


def ctr_pos_add(state: dict, position: int, clicked: bool) -> dict:
    c = state.get(position)
    if c is None:
        c = state[position] = [0, 0]
    c[0] += 1
    if clicked:
        c[1] += 1
    return state


def ctr_pos_merge(states) -> dict:
    out: dict = {}
    for s in states:
        for pos, (i, c) in s.items():
            o = out.get(pos)
            if o is None:
                out[pos] = [i, c]
            else:
                o[0] += i
                o[1] += c
    return out


def ctr_pos_extract(state: dict) -> dict[int, tuple[float, int, float]]:
    """{position: (CTR, impressions, standard error)}, positions ascending."""
    return {pos: _rate(i, c) for pos, (i, c) in sorted(state.items())}
