"""Names and parameters of the trec_eval 10 measures added to the original families (issue 17).

Each family is spelled as trec_eval spells it (case of the letters ignored), with trec_eval's
parameters after a ``.`` (``-m iprec_at_recall.0.1,0.5``, ``-m relative_P.5``, ``-m rbp.p=0.95``,
``-m utility.2,-1,0,0``) or after ``_`` / ``@`` as trec_eval prints them (``iprec_at_recall_0.10``,
``relative_P_5``, ``utility_2,-1,0,0``, ``rbp_p=0.95``).  Without parameters a family takes
trec_eval's defaults.  Kinds (as trec_eval's ``meas_init.c`` reads them):

* plain (no parameter): gm_map, gm_bpref, infAP, binG, set_P, set_relative_P, set_recall, set_map, yaap,
  num_nonrel_judged_ret; G, ndcg_rel, Rndcg (trec_eval's default gains, the grades; its
  ``rel_level=gain`` parameters are not implemented); ideal_dcg (its ``rel_level=gain`` pairs as
  ndcg's, ``ideal_dcg.1=3,2=9``, printed ``ideal_dcg_1=3,2=9``);
* double cutoffs (one value each, printed ``%3.2f``): iprec_at_recall, Rprec_mult;
* long cutoffs (one value each, like ``P``): relative_P, unj;
* double parameters (one value, the parameter string printed as given): 11pt_avg, set_F, utility;
* ``name=value`` pairs: rbp, rbp_resid (``p``, the persistence; default 0.9).

The :class:`~streameval.metrics.names.MetricSpec` of these families keeps a long cutoff in ``k`` and
any other parameter in ``param`` (a string; ``""`` for trec_eval's default).
"""

from __future__ import annotations

import math

from . import registry
from .errors import MetricNameError

__all__ = ["FAMILIES", "GEOMETRIC", "MIN_GEO_MEAN", "parse", "trec_name", "values", "defaults",
           "all_trec_extras", "ACCEPTED"]

#: trec_eval's floor of a query's value before the log of a geometric mean (trec_eval.h)
MIN_GEO_MEAN = 0.00001

# derived from the registry (streameval/metrics/registry.py): the families with trec_eval's parameters
_TREC = tuple(f for f in registry.REGISTRY if f.parsed and f.trec_kind)
_PLAIN = tuple(f.name for f in _TREC if f.trec_kind == "plain")
_DCUT = {f.name: f.trec_defaults for f in _TREC if f.trec_kind == "dcut"}
_LCUT = {f.name: f.trec_defaults for f in _TREC if f.trec_kind == "lcut"}
_DPARAMS = {f.name: f.trec_defaults for f in _TREC if f.trec_kind == "dparams"}
_PAIRS = {f.name: {p.name: p.default for p in f.params} for f in _TREC if f.trec_kind == "pairs"}

FAMILIES = frozenset(_PLAIN) | set(_DCUT) | set(_LCUT) | set(_DPARAMS) | set(_PAIRS)
#: families averaged over queries with trec_eval's geometric mean
GEOMETRIC = frozenset(f.name for f in _TREC if f.average == registry.GEOMETRIC)
_BY_LOWER = sorted(((f.lower(), f) for f in FAMILIES), key=lambda t: -len(t[0]))

ACCEPTED = " ".join(f.forms for f in _TREC)


def _error(message):
    return MetricNameError(message)


def _floats(raw: str, text: str) -> list[float]:
    out = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise _error(f"metric {raw!r}: parameter {part!r} is not a number") from None
        if not math.isfinite(v):
            raise _error(f"metric {raw!r}: parameter {part!r} is not finite")
        out.append(v)
    return out


def _spec(family, k=None, param=""):
    from .names import MetricSpec

    return MetricSpec(family, k, param)


def defaults(family: str) -> list:
    """The specs of ``family`` at trec_eval's default parameters."""
    if family in _DCUT:
        return [_spec(family, None, repr(v)) for v in _DCUT[family]]
    if family in _LCUT:
        return [_spec(family, k) for k in _LCUT[family]]
    return [_spec(family)]


def all_trec_extras() -> list:
    """The specs these families add to ``-m all_trec`` (the registry's ``all_trec`` families with
    trec_eval's parameters that the default output lacks, at their defaults, in trec_eval's print order)."""
    out = []
    for f in sorted(_TREC, key=lambda f: f.print_order):
        if "all_trec" in f.trec_sets and "official" not in f.trec_sets:
            out += defaults(f.name)
    return out


def parse(raw: str):
    """The specs ``raw`` names, or None when it is not one of these families."""
    name = raw.strip()
    low = name.lower()
    for flow, family in _BY_LOWER:
        if low == flow:
            return defaults(family)
        if low.startswith(flow) and len(low) > len(flow) and low[len(flow)] in "._@":
            return _with_params(raw, family, name[len(flow) + 1:].strip())
    return None


def _with_params(raw: str, family: str, text: str) -> list:
    if not text:
        raise _error(f"metric {raw!r}: empty parameter list")
    if family in ("G", "ndcg_rel", "Rndcg"):
        raise _error(f"metric {raw!r}: gains per relevance level (rel_level=gain) are not implemented; "
                     f"{family} uses the grades as gains")
    if family == "ideal_dcg":  # ndcg's rel_level=gain pairs (m_ndcg.c, gain_init.c)
        from .trec_measures import gain_pairs

        try:
            gain_pairs(text)
        except ValueError as e:
            raise _error(f"metric {raw!r}: {e}") from None
        return [_spec(family, None, text)]
    if family in _PLAIN:
        raise _error(f"metric {raw!r}: {family} takes no parameter")
    if family in _DCUT:
        vals = sorted(set(_floats(raw, text)))
        return [_spec(family, None, repr(v)) for v in vals]
    if family in _LCUT:
        ks = []
        for v in _floats(raw, text):
            if not 1 <= v < 2**31:
                raise _error(f"metric {raw!r}: cutoff {v:g} must be a positive integer")
            ks.append(int(v))
        return [_spec(family, k) for k in sorted(set(ks))]
    if family in _DPARAMS:
        vals = _floats(raw, text)
        if family == "utility" and len(vals) != 4:
            raise _error(f"metric {raw!r}: utility takes 4 coefficients (p1,p2,p3,p4), got {len(vals)}")
        if family == "11pt_avg" and vals != sorted(vals):
            raise _error(f"metric {raw!r}: 11pt_avg's recall levels must be in increasing order")
        return [_spec(family, None, text)]
    pairs = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise _error(f"metric {raw!r}: parameters are name=value pairs, e.g. {family}.p=0.95")
        if key != "p":
            raise _error(f"metric {raw!r}: only the persistence p is supported (not gains per level)")
        pairs[key] = _floats(raw, value)[0]
    return [_spec(family, None, text)]


def values(spec) -> tuple:
    """The numeric parameters of ``spec``: a tuple of floats (double cutoffs: one; double parameters:
    all; pairs: the persistence p)."""
    f = spec.family
    if f in _DCUT:
        return (float(spec.param),)
    if f in _DPARAMS:
        return _DPARAMS[f] if not spec.param else tuple(float(v) for v in spec.param.split(","))
    if f in _PAIRS:
        p = _PAIRS[f]["p"]
        for part in spec.param.split(",") if spec.param else ():
            p = float(part.partition("=")[2])
        return (p,)
    return ()


def trec_name(spec) -> str:
    """The name trec_eval prints (meas_init.c: ``%s_%3.2f``, ``%s_%ld`` or ``%s_<parameters>``)."""
    f = spec.family
    if f in _DCUT:
        return "%s_%3.2f" % (f, float(spec.param))
    if f in _LCUT:
        return "%s_%d" % (f, spec.k)
    return f"{f}_{spec.param}" if spec.param else f


#: trec_eval m_relstring.c's default length
RELSTRING_DEFAULT = 10


def relstring(raw: str):
    """``(printed name, length)`` when ``raw`` names trec_eval's relstring measure (``relstring``,
    ``relstring.20``, ``relstring_20``), else None. Its value is a string (:func:`streameval.metrics.
    trec_measures.relstrings`), printed for single queries only, so only ``streameval trec-eval``
    takes it (not a metric of :func:`~streameval.metrics.names.parse_metrics`). trec_eval reads
    the first parameter as a double and keeps its integer part; the name carries the parameters
    as written. Raises MetricNameError for a parameter that is not a number."""
    name = raw.strip()
    low = name.lower()
    if low == "relstring":
        return "relstring", RELSTRING_DEFAULT
    if not (low.startswith("relstring") and len(low) > 9 and low[9] in "._"):
        return None
    text = name[10:].strip()
    if not text:
        raise _error(f"metric {raw!r}: empty parameter list")
    length = _floats(raw, text)[0]
    return f"relstring_{text}", int(length) if abs(length) < 2**62 else (2**62 if length > 0 else 0)
