"""CUPED (``--covariate``): CTR clustered by the experiment's unit, adjusted by a pre-period covariate.

Deng, Xu, Kohavi and Walker, "Improving the Sensitivity of Online Controlled Experiments by Utilizing
Pre-Experiment Data", WSDM 2013 (CUPED); for a ratio metric such as CTR, the delta method of Deng,
Knoblich and Lu, "Applying the Delta Method in Metric Analytics: A Practical Guide with Novel Ideas", KDD 2018.

Per unit u (a request or a user, ``--cluster``) of system s: n_u impressions, y_u clicks, x_u the
covariate. CTR_s = sum y / sum n = R_s; its linearisation per unit L_u = (y_u - R_s n_u) / nbar_s
(nbar_s the mean impressions per unit), whose sample variance over G_s is ``ctr[cluster=C]``'s
variance: se^2 = sum L^2 / (G_s (G_s - 1)).

* theta, pooled over all systems: theta = sum_u L_u (x_u - xbar) / sum_u (x_u - xbar)^2 with R, nbar and
  xbar pooled (all units of all systems): the slope of the pooled OLS regression of L on x. With one
  impression per unit (n_u = 1) L_u = y_u - ybar and theta is the OLS slope of y on x.
* adjusted CTR_s = R_s - theta (xbar_s - xbar);
* its standard error: se_adj^2 = sum_u (L_u - theta (x_u - xbar_s))^2 / (G_s (G_s - 1)) (theta and xbar
  taken as known, as in Deng et al. 2013);
* variance reduction_s = 1 - se_adj^2 / se^2 (rho^2 of L and x when theta is system s's own slope).

Everything is computed from exact sums (:mod:`streameval.accumulators.cuped`) in rational arithmetic,
rounded once at the end. Pure Python; no Beam.
"""

from __future__ import annotations

import math
from fractions import Fraction

from . import stats
from .online_sums import clustered_ratio_variance
from .rows import metric_row

__all__ = ["THETA_UNDEFINED", "CupedResult", "cuped_from_sums", "cuped_rows", "cuped_name"]

#: ``ci_method`` of the rows when theta is undefined (the covariate has no variance, or no unit has one)
THETA_UNDEFINED = "cuped-theta-undefined"


def cuped_name(cluster: str, covariate: str) -> str:
    """The row name: ``ctr[cluster=C,cuped=NAME]``."""
    return f"ctr[cluster={cluster},cuped={covariate}]"


class CupedResult(dict):
    """``{"theta": Fraction | None, "xbar": Fraction | None, "imputed": int, systems: {s: {...}}}``."""


def cuped_from_sums(states: dict) -> CupedResult:
    """CUPED from each system's exact sums ``states[s]`` = ``(g, sn, sy, snn, sny, syy, gx, sx, sxx,
    sxn, sxy, sn_m, sy_m)`` (integers and Fractions). Units without a covariate get the pooled mean of
    the units that have one (c): x = c adds g_m c, g_m c^2, c sum n_m, c sum y_m to the sums.
    Returns theta (None when undefined: no covariate, or zero pooled variance of x) and per system
    ``r``, ``se``, ``r_adj``, ``se_adj``, ``vr`` (floats; NaN where undefined), ``g``, ``n``, ``xbar``."""
    tot = [sum((Fraction(st[i]) for st in states.values()), Fraction(0)) for i in range(13)]
    g_all, gx_all = tot[0], tot[6]
    c = tot[7] / gx_all if gx_all else None
    filled = {}
    for s, st in states.items():
        g, sn, sy, snn, sny, syy, gx, sx, sxx, sxn, sxy, sn_m, sy_m = (Fraction(v) for v in st)
        gm = g - gx
        if c is not None:
            sx, sxx, sxn, sxy = sx + gm * c, sxx + gm * c * c, sxn + c * sn_m, sxy + c * sy_m
        filled[s] = (g, sn, sy, snn, sny, syy, sx, sxx, sxn, sxy)
    out = CupedResult(theta=None, xbar=None, imputed=int(g_all - gx_all), systems={})
    if g_all and c is not None:
        G, N, Y, _, _, _, X, XX, XN, XY = (sum((f[i] for f in filled.values()), Fraction(0)) for i in range(10))
        sxx_c = XX - X * X / G
        out["xbar"] = X / G
        if sxx_c > 0 and N:
            r, nbar = Y / N, N / G
            out["theta"] = (XY - r * XN - (X / G) * (Y - r * N)) / nbar / sxx_c
    theta, xbar = out["theta"], out["xbar"]
    for s, (g, sn, sy, snn, sny, syy, sx, sxx, sxn, sxy) in filled.items():
        res = {"g": int(g), "n": int(sn), "r": math.nan, "se": math.nan, "r_adj": math.nan, "se_adj": math.nan,
               "vr": math.nan, "xbar": float(sx / g) if g and c is not None else math.nan}
        out["systems"][s] = res
        if not g or not sn:
            continue
        r, nbar = sy / sn, sn / g
        res["r"] = float(r)
        res["r_adj"] = float(r if theta is None else r - theta * (sx / g - xbar))
        if g < 2:
            continue
        sll = (syy - 2 * r * sny + r * r * snn) / (nbar * nbar)  # sum L^2
        var = clustered_ratio_variance(g, sn, sy, snn, sny, syy)  # ctr[cluster=C]'s, = max(sll, 0) / (g (g - 1))
        res["se"] = math.sqrt(float(var))
        if theta is None:
            res["se_adj"], res["vr"] = res["se"], (0.0 if var else math.nan)
            continue
        slx = (sxy - r * sxn) / nbar  # sum L (x - xbar_s) = sum L x (sum L = 0)
        sdd = sxx - sx * sx / g
        var_adj = max(sll - 2 * theta * slx + theta * theta * sdd, Fraction(0)) / (g * (g - 1))
        res["se_adj"] = math.sqrt(float(var_adj))
        res["vr"] = float(1 - var_adj / var) if var else math.nan
    return out


def cuped_rows(window_start, window_end, label, states: dict, cluster: str, covariate: str,
               level: float = stats.DEFAULT_LEVEL):
    """The rows of one (window, slice) from each system's exact sums (:func:`cuped_from_sums`):

    * ``ctr[cluster=C,cuped=X]`` per system: the adjusted CTR, its standard error, ``num_queries`` the
      impressions, the normal interval (``ci_method`` ``cuped-delta``; :data:`THETA_UNDEFINED` when
      theta is undefined: then the value is the unadjusted CTR, which every theta gives when all units
      have the same covariate, and its clustered interval);
    * ``...:variance_reduction`` per system: 1 - se_adj^2 / se^2 (0 when theta is undefined);
    * ``...:theta`` (system ``*``): theta, ``num_queries`` the units; value null and ``ci_method``
      :data:`THETA_UNDEFINED` when undefined;
    * ``...:imputed_units`` (system ``*``, only when some): units without a covariate value, given
      the pooled mean."""
    name = cuped_name(cluster, covariate)
    res = cuped_from_sums(states)
    undefined = res["theta"] is None
    units = 0
    for s in sorted(res["systems"]):
        v = res["systems"][s]
        units += v["g"]
        if not v["n"]:
            continue
        extra = {}
        if math.isfinite(v["se_adj"]):
            lo, hi = stats.normal_interval(v["r_adj"], v["se_adj"], level)
            extra = {"ci_low": lo, "ci_high": hi, "ci_level": float(level)}
        extra["ci_method"] = THETA_UNDEFINED if undefined else ("cuped-delta" if "ci_low" in extra else None)
        yield metric_row(window_start, window_end, label, s, name, v["r_adj"], v["n"], v["se_adj"], **extra)
        yield metric_row(window_start, window_end, label, s, f"{name}:variance_reduction", v["vr"], v["g"], None,
                         ci_method=THETA_UNDEFINED if undefined else None)
    theta = math.nan if undefined else float(res["theta"])
    yield metric_row(window_start, window_end, label, "*", f"{name}:theta", theta, units, None,
                     ci_method=THETA_UNDEFINED if undefined else None)
    if res["imputed"]:
        yield metric_row(window_start, window_end, label, "*", f"{name}:imputed_units", res["imputed"],
                         res["imputed"], None)
