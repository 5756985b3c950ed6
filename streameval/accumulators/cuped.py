"""CUPED state (``--covariate``): per system, exact sums over the experiment's units (a request or a
user: ``--cluster``) of the unit's impressions n, clicks y and pre-period covariate x.

State of one system (a plain list: Beam's FastPrimitivesCoder encodes it without pickling), the
fields of a :class:`CupedState`: ``[g, sn, sy, snn, sny, syy, gx, sx, sxx, sxn, sxy, sn_m, sy_m]``

* ``g``, ``sn``, ``sy``, ``snn``, ``sny``, ``syy``: integers, the units and the sums of n, y, n^2, n y,
  y^2 over all units (as ``ctr[cluster=C]``'s state);
* ``gx``: the units with a covariate value; ``sx``, ``sxx``, ``sxn``, ``sxy``: Shewchuk partials of
  the sums of x, x^2, x n and x y over them (each product added exactly);
* ``sn_m``, ``sy_m``: the sums of n and y over the units without a covariate value (they get the
  pooled mean of x at extraction, :func:`streameval.metrics.cuped.exact_sums`).

Adding and merging are exact (integers, exact partials), so any split and merge order gives the same
exact sums, and the rows the same bits. Layer 2: no Beam.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

from .moments import partials_add, partials_add_product, partials_add_square, partials_merge

__all__ = ["CupedState", "cuped_create", "cuped_add_unit", "cuped_merge", "cuped_exact", "cuped_states"]


class CupedState(NamedTuple):
    """A CUPED state's fields (see the module docstring). The state: their list."""

    g: int
    sn: int
    sy: int
    snn: int
    sny: int
    syy: int
    gx: int
    sx: list
    sxx: list
    sxn: list
    sxy: list
    sn_m: int
    sy_m: int


def _at(*fields: str) -> tuple[int, ...]:
    """The positions of ``fields`` in a state."""
    return tuple(CupedState._fields.index(f) for f in fields)


#: the positions of the integer fields and of the partials
_INTS = _at("g", "sn", "sy", "snn", "sny", "syy", "gx", "sn_m", "sy_m")
_PARTIALS = _at("sx", "sxx", "sxn", "sxy")
#: every field's position, for the updates in place (one a unit)
_G, _SN, _SY, _SNN, _SNY, _SYY, _GX, _SX, _SXX, _SXN, _SXY, _SN_M, _SY_M = _at(
    "g", "sn", "sy", "snn", "sny", "syy", "gx", "sx", "sxx", "sxn", "sxy", "sn_m", "sy_m"
)


def cuped_create() -> list:
    """An empty state (no unit)."""
    return list(CupedState(0, 0, 0, 0, 0, 0, 0, [], [], [], [], 0, 0))


def cuped_add_unit(state: list, n: int, y: int, x) -> list:
    """Add one unit (``n`` impressions, ``y`` clicks, covariate ``x``: a finite float, or None when the
    unit has none) in place; returns ``state``."""
    n, y = int(n), int(y)
    state[_G] += 1
    state[_SN] += n
    state[_SY] += y
    state[_SNN] += n * n
    state[_SNY] += n * y
    state[_SYY] += y * y
    if x is None:
        state[_SN_M] += n
        state[_SY_M] += y
        return state
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"a covariate value must be finite, got {x!r}")
    state[_GX] += 1
    partials_add(state[_SX], x)
    partials_add_square(state[_SXX], x)
    partials_add_product(state[_SXN], x, float(n))
    partials_add_product(state[_SXY], x, float(y))
    return state


def cuped_merge(states) -> list:
    """One state of several (a fresh one for none)."""
    out = cuped_create()
    for s in states:
        for i in _INTS:
            out[i] += s[i]
        for i in _PARTIALS:
            partials_merge(out[i], s[i])
    return out


def cuped_exact(state: list) -> tuple:
    """The state's sums as exact numbers: ``(g, sn, sy, snn, sny, syy, gx, sx, sxx, sxn, sxy, sn_m,
    sy_m)``, the partials as :class:`~fractions.Fraction`."""
    return tuple(sum((Fraction(p) for p in v), Fraction(0)) if i in _PARTIALS else v for i, v in enumerate(state))


def cuped_states(systems, n, y, x) -> dict:
    """``{system: exact sums}`` (:func:`cuped_exact`) of per-unit sequences: each unit's system,
    impressions, clicks and covariate (None or NaN: none), in any order."""
    states: dict = {}
    for s, ni, yi, xi in zip(systems, n, y, x):
        xi = None if xi is None or (isinstance(xi, float) and math.isnan(xi)) else float(xi)
        cuped_add_unit(states.setdefault(s, cuped_create()), ni, yi, xi)
    return {s: cuped_exact(st) for s, st in states.items()}
