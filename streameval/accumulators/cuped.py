"""CUPED state (``--covariate``): per system, exact sums over the experiment's units (a request or a
user: ``--cluster``) of the unit's impressions n, clicks y and pre-period covariate x.

State of one system (a plain list: Beam's FastPrimitivesCoder encodes it without pickling):
``[g, sn, sy, snn, sny, syy, gx, sx, sxx, sxn, sxy, sn_m, sy_m]``

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

from .moments import partials_add, partials_add_product, partials_add_square, partials_merge

__all__ = ["cuped_create", "cuped_add_unit", "cuped_merge", "cuped_exact", "cuped_states"]

_INTS = (0, 1, 2, 3, 4, 5, 6, 11, 12)
_PARTIALS = (7, 8, 9, 10)


def cuped_create() -> list:
    """An empty state (no unit)."""
    return [0, 0, 0, 0, 0, 0, 0, [], [], [], [], 0, 0]


def cuped_add_unit(state: list, n: int, y: int, x) -> list:
    """Add one unit (``n`` impressions, ``y`` clicks, covariate ``x``: a finite float, or None when the
    unit has none) in place; returns ``state``."""
    n, y = int(n), int(y)
    state[0] += 1
    state[1] += n
    state[2] += y
    state[3] += n * n
    state[4] += n * y
    state[5] += y * y
    if x is None:
        state[11] += n
        state[12] += y
        return state
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"a covariate value must be finite, got {x!r}")
    state[6] += 1
    partials_add(state[7], x)
    partials_add_square(state[8], x)
    partials_add_product(state[9], x, float(n))
    partials_add_product(state[10], x, float(y))
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
