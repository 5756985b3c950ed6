"""Click-through rate counters: overall and by position. Integer counts, so merging is exact.

CTR = clicks / impressions (a ratio of sums over impressions, not a mean over requests).
Standard error: the binomial sqrt(p (1 - p) / n). Empty: NaN with count 0.

States are plain lists of ints (Beam's FastPrimitivesCoder encodes them without pickling), the
fields of a :class:`CtrState`: ``[impressions, clicks]``; by position ``{position: CtrState list}``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["CtrState", "ctr_create", "ctr_add", "ctr_merge", "ctr_extract",
           "ctr_pos_create", "ctr_pos_add", "ctr_pos_merge", "ctr_pos_extract"]


class CtrState(NamedTuple):
    """A CTR state's fields: ``impressions``, ``clicks``. The state: their list."""

    impressions: int
    clicks: int


#: CtrState's positions in a state, for the updates in place (one an impression)
_IMPRESSIONS, _CLICKS = (CtrState._fields.index(f) for f in ("impressions", "clicks"))


def _rate(imps: int, clicks: int) -> tuple[float, int, float]:
    if imps == 0:
        return (math.nan, 0, math.nan)
    p = clicks / imps
    return (p, imps, math.sqrt(p * (1.0 - p) / imps))


def ctr_create() -> list:
    return list(CtrState(0, 0))


def ctr_add(state: list, clicked: bool, n: int = 1) -> list:
    """Count ``n`` impressions, clicked or not."""
    state[_IMPRESSIONS] += n
    if clicked:
        state[_CLICKS] += n
    return state


def ctr_merge(states) -> list:
    imps = clicks = 0
    for s in map(CtrState._make, states):
        imps += s.impressions
        clicks += s.clicks
    return list(CtrState(imps, clicks))


def ctr_extract(state) -> tuple[float, int, float]:
    """(CTR, impressions, standard error)."""
    s = CtrState._make(state)
    return _rate(s.impressions, s.clicks)


def ctr_pos_create() -> dict:
    return {}


def ctr_pos_add(state: dict, position: int, clicked: bool) -> dict:
    c = state.get(position)
    if c is None:
        c = state[position] = ctr_create()
    c[_IMPRESSIONS] += 1
    if clicked:
        c[_CLICKS] += 1
    return state


def ctr_pos_merge(states) -> dict:
    out: dict = {}
    for s in states:
        for pos, counts in s.items():
            o = out.get(pos)
            if o is None:
                out[pos] = list(counts)
            else:
                c = CtrState._make(counts)
                o[_IMPRESSIONS] += c.impressions
                o[_CLICKS] += c.clicks
    return out


def ctr_pos_extract(state: dict) -> dict[int, tuple[float, int, float]]:
    """{position: (CTR, impressions, standard error)}, positions ascending."""
    return {pos: ctr_extract(counts) for pos, counts in sorted(state.items())}
