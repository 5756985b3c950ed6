"""ir_measures spellings (``AP(rel=2)@100``, ``nDCG(dcg='exp-log2')@10``, ``Judged@10``, ...).

ir_measures (Macdonald and Tonellotto, ICTIR 2020) writes a measure as ``Name(param=value, ...)@cutoff``.
Each name accepted here maps to the trec_eval semantics ir_measures' pytrec_eval provider gives it
(``ir_measures/providers/pytrec_eval_provider.py``), or, for the measures pytrec_eval lacks, to the
definition of the provider ir_measures picks (judged: Judged@k; gdeval: ERR@k and
``nDCG(dcg='exp-log2')``; msmarco: ``RR@k``):

==========================  ==================================================================
ir_measures                 streameval
==========================  ==================================================================
``P(rel=r)@k``              ``P@k`` at relevance level r
``R(rel=r)@k``, Recall      ``recall@k``
``AP(rel=r)[@k]``, MAP      ``map`` / ``map@k`` (trec_eval map_cut)
``RR(rel=r)[@k]``, MRR      ``recip_rank`` / ``mrr@k``
``nDCG(dcg=d)[@k]``, NDCG   ``ndcg[@k]``; ``dcg='log2'``: gain = grade (trec_eval),
                            ``dcg='exp-log2'``: gain = 2**grade - 1; ideal from all judgments
``Rprec(rel=r)``            ``Rprec``
``Bpref(rel=r)``            ``bpref``
``infAP(rel=r)``            trec_eval ``infAP``
``NumRet``                  ``num_ret``; ``NumRet(rel=r)``: ``num_rel_ret`` (totals)
``NumRel(rel=r)``           ``num_rel`` (total)
``NumQ``                    number of queries (1 per query, total)
``SetP(rel=r)``             trec_eval ``set_P``; ``SetP(relative=True)``: ``set_relative_P``
``SetR(rel=r)``             ``set_recall``;  ``SetAP(rel=r)``: ``set_map``
``SetF(rel=r, beta=b)``     ``set_F`` with parameter b
``Success(rel=r)@k``        ``success@k``
``IPrec(recall=x)``, IPrec@x ``iprec_at_recall`` at x (0 <= x <= 1); ``rounding='trec_eval_9'``:
                            x R relevant documents as (long) (x R + 0.9), as pytrec_eval (ours)
``Judged[@k]``              judged items (in the qrels) in the top k / min(k, ranked items)
``ERR@k``                   ``err@k`` (2**g - 1) / 2**err_max_grade, as gdeval with grades <= 4
``RBP(p=x)``                trec_eval ``rbp`` (graded, gains divided by the query's top grade);
                            ir_measures' default p is 0.8
``RBP(p=x, rel=r)``         cwl_eval's binary RBP (ir_measures' cwl_eval provider): gain 1 for a
                            grade >= r, else 0, over the first 1000 ranks
``judged_only=True``        (any measure) trec_eval ``-J`` for that measure: its unjudged ranked
                            documents removed before scoring
``nDCG(gains={g: x, ...})`` the qrels' grades mapped before scoring (a grade not named: itself)
``INST(T=t, max_rel=m)``    cwl_eval's C/W/L measures (ir_measures' cwl_eval provider), as are
``INSQ``, ``BPM(T=t)@K``    ``SDCG@k``, ``NERR8@k``, ``NERR9@k``, ``NERR10(p=x)``, ``NERR11(T=t)``
                            (all with max_rel): gain (grade - min_rel) / (max_rel - min_rel) in [0, 1]
``Compat(p=x)``             the compat provider's RBO with the ideal ranking (``normalize=b``)
``Accuracy(rel=r)[@k]``     the accuracy provider's: 1 - the mean share of the top k's non-relevant
                            documents above each relevant one (0 with no relevant one, 1 with no
                            non-relevant one: ir_measures gives no value / raises there)
==========================  ==================================================================

``rel``, ``dcg`` (and RBP's ``p``) apply to that measure only and override the global options
(``relevance_level``, ``gain``) of :class:`~streameval.metrics.kernel.MetricOptions`. The result row
keeps the name as written (``AP(rel=2)@100``). Not available (a :class:`MetricNameError` naming the
measure): nDCG_IA. cwl_eval's C/W/L measures (INST, INSQ, BPM, SDCG, NERR8-11; ``max_rel`` required, as in
ir_measures), Compat and Accuracy: :mod:`streameval.metrics.cwl_measures`. The diversity
measures (alpha_nDCG, ERR_IA, NRBP, P_IA, AP_IA, StRecall...) need subtopic qrels:
:mod:`streameval.metrics.diversity` parses them and :func:`streameval.evaluate` computes them; the
commands that read ad hoc qrels refuse them (:func:`streameval.metrics.names.parse_metric`).
"""

from __future__ import annotations

import re

from . import registry
from .errors import MetricNameError

__all__ = ["parse", "looks_like", "NAMES"]

# ir_measures name (lower case) -> (canonical ir_measures name, family or None, parameters accepted,
# cutoff: "required" / "optional" / "none")
_MEASURES = {
    "p": ("P", "P", {"rel"}, "required"),
    "precision": ("P", "P", {"rel"}, "required"),
    "r": ("R", "recall", {"rel"}, "required"),
    "recall": ("R", "recall", {"rel"}, "required"),
    "ap": ("AP", "map", {"rel"}, "optional"),
    "map": ("AP", "map", {"rel"}, "optional"),
    "rr": ("RR", "recip_rank", {"rel"}, "optional"),
    "mrr": ("RR", "recip_rank", {"rel"}, "optional"),
    "ndcg": ("nDCG", "ndcg", {"dcg"}, "optional"),
    "rprec": ("Rprec", "Rprec", {"rel"}, "none"),
    "bpref": ("Bpref", "bpref", {"rel"}, "none"),
    "infap": ("infAP", "infAP", {"rel"}, "none"),
    "numret": ("NumRet", "num_ret", {"rel"}, "none"),
    "numrelret": ("NumRelRet", "num_rel_ret", {"rel"}, "none"),
    "numrel": ("NumRel", "num_rel", {"rel"}, "none"),
    "numq": ("NumQ", "num_q", set(), "none"),
    "setp": ("SetP", "set_P", {"rel", "relative"}, "none"),
    "setrelp": ("SetRelP", "set_relative_P", {"rel"}, "none"),
    "setr": ("SetR", "set_recall", {"rel"}, "none"),
    "setap": ("SetAP", "set_map", {"rel"}, "none"),
    "setf": ("SetF", "set_F", {"rel", "beta"}, "none"),
    "success": ("Success", "success", {"rel"}, "required"),
    "iprec": ("IPrec", "iprec_at_recall", {"recall", "rounding"}, "none"),
    "judged": ("Judged", "judged", set(), "optional"),
    "err": ("ERR", "err", set(), "required"),
    "rbp": ("RBP", "rbp", {"p", "rel"}, "none"),
    # cwl_eval's C/W/L measures and the compat provider's Compat (cwl_measures.py); parameters: the registry's
    **{name.lower(): (name, name, {p.name for p in registry.family(name).params}, registry.family(name).cutoff)
       for name in ("INST", "INSQ", "BPM", "SDCG", "NERR8", "NERR9", "NERR10", "NERR11", "Compat", "Accuracy")},
}
#: the families scored by streameval.metrics.cwl_measures (their parameters in MetricSpec.opts)
CWL = frozenset(("INST", "INSQ", "BPM", "SDCG", "NERR8", "NERR9", "NERR10", "NERR11", "Compat", "Accuracy"))
#: ir_measures' measure names as it spells them (the closest names of an unknown one draw on them)
NAMES = tuple(dict.fromkeys(v[0] for v in _MEASURES.values()))
# ir_measures names whose spelling only ir_measures uses (parsed here even without parentheses)
_OWN_CASED = {"NumRet", "NumRelRet", "NumRel", "NumQ", "SetP", "SetRelP", "SetR", "SetAP", "SetF", "IPrec",
              "Judged", "RBP"}
# measures ir_measures has through other providers only
_OTHER = {"alpha_ndcg", "alpha_dcg", "α_ndcg", "α_dcg", "err_ia", "nerr_ia", "ndcg_ia", "nrbp", "nnrbp",
          "p_ia", "ap_ia", "map_ia", "strecall"}

_CWL_LOWER = frozenset(n.lower() for n in CWL)

_FORM = re.compile(r"^(?P<name>[^\W\d][\w\-]*)\s*(?:\((?P<params>.*)\))?\s*(?:@\s*(?P<k>\S+))?$")
_ACCEPTED = ("ir_measures: P(rel=r)@k R@k AP(rel=r)[@k] RR(rel=r)[@k] nDCG(dcg='log2'|'exp-log2')[@k] Rprec Bpref "
             "infAP NumRet[(rel=r)] NumRel NumQ SetP[(rel=r,relative=True)] SetR SetAP SetF(beta=b) Success@k "
             "IPrec(recall=x) Judged[@k] ERR@k RBP(p=x) INST(T=t,max_rel=m) INSQ(max_rel=m) BPM(T=t,max_rel=m)@k "
             "SDCG(max_rel=m)@k NERR8(max_rel=m)@k NERR9(max_rel=m)@k NERR10(p=x,max_rel=m) NERR11(T=t,max_rel=m) "
             "Compat(p=x) Accuracy(rel=r)[@k]")


def _error(message):
    return MetricNameError(message)


def looks_like(raw: str) -> bool:
    """True when ``raw`` is written the ir_measures way: with parentheses, or one of the names only
    ir_measures uses (NumQ, SetP, Judged, RBP, ...)."""
    name = raw.strip()
    if "(" in name:
        return True
    base = name.split("@", 1)[0].strip()
    return base in _OWN_CASED or base.lower() in _OTHER or base.lower() in _CWL_LOWER


def _value(raw, key, text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    try:
        v = float(text)
    except ValueError:
        raise _error(f"metric {raw!r}: parameter {key}={text!r} is not a number, a quoted string or True/False") \
            from None
    if v != v or v in (float("inf"), float("-inf")):
        raise _error(f"metric {raw!r}: parameter {key}={text!r} is not finite")
    return v


def _gain_map(raw, body: str) -> dict:
    """``{grade: gain}`` of ``nDCG(gains={0: 0, 1: 1, 2: 3})`` (numbers only)."""
    out = {}
    for part in body.split(","):
        if not part.strip():
            continue
        key, colon, value = part.partition(":")
        try:
            g, v = float(key.strip().strip("'\"")), float(value.strip())
        except ValueError:
            raise _error(f"metric {raw!r}: gains maps numbers to numbers, got {part.strip()!r}") from None
        if not colon or g != g or v != v or abs(v) == float("inf"):
            raise _error(f"metric {raw!r}: gains maps numbers to finite numbers, got {part.strip()!r}")
        out[g] = v
    return out


def parse(raw: str):
    """The one :class:`~streameval.metrics.names.MetricSpec` an ir_measures name gives (its row name
    the name as written), or None when ``raw`` is not written the ir_measures way (:func:`looks_like`).
    Raises MetricNameError (one line, naming the measure) for an unknown measure or parameter."""
    from .names import MAX_CUTOFF, MetricSpec

    if not looks_like(raw):
        return None
    name = raw.strip()
    m = _FORM.match(name)
    if not m:
        from .names import unknown_name_error

        raise unknown_name_error(name)
    low = m.group("name").lower()
    if low not in _MEASURES:
        if low in _OTHER:
            raise _error(f"metric {name!r}: ir_measures' {m.group('name')} needs a provider other than trec_eval "
                         f"semantics; not implemented")
        from .names import unknown_name_error

        raise unknown_name_error(name, head=f"metric {name!r}: unknown ir_measures measure {m.group('name')!r}")
    canon, family, allowed, cut = _MEASURES[low]
    params = {}
    judged_only = False
    text = (m.group("params") or "").strip()
    gains = None
    if canon == "nDCG" and re.search(r"\bgains\s*=", text):
        gm = re.search(r"\bgains\s*=\s*\{(?P<body>[^{}]*)\}\s*(?:,|$)", text)
        if not gm:
            raise _error(f"metric {name!r}: gains is a dict of grade: gain, e.g. nDCG(gains={{0: 0, 1: 1, 2: 3}})")
        # a grade mapped to itself changes nothing (ir_measures leaves it out of the measure's name)
        gains = {g: v for g, v in _gain_map(name, gm.group("body")).items() if g != v}
        text = (text[:gm.start()] + text[gm.end():]).strip().strip(",")
    for part in text.split(",") if text else ():
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise _error(f"metric {name!r}: parameters are name=value pairs, e.g. {canon}(rel=2)")
        v = _value(name, key, value)
        if key == "judged_only":
            if not isinstance(v, bool):
                raise _error(f"metric {name!r}: judged_only is True or False")
            if v:
                judged_only = True
            continue
        if key == "cutoff":
            key = "@"
        if key != "@" and key not in allowed:
            if canon == "nDCG" and key == "gains":
                raise _error(f"metric {name!r}: nDCG(gains=...) (custom gain maps) is not implemented")
            ok = ", ".join(sorted(allowed)) or "none"
            hint = "; its K is the cutoff: BPM(T=2)@5" if canon == "BPM" and key == "K" else ""
            raise _error(f"metric {name!r}: {canon} takes no parameter {key!r} (parameters: {ok}){hint}")
        if key in params:
            raise _error(f"metric {name!r}: parameter {key!r} given twice")
        params[key] = v
    k = params.pop("@", None)
    if canon == "IPrec" and m.group("k") is not None and "recall" not in params:
        params["recall"] = _value(name, "@", m.group("k"))  # ir_measures' IPrec@0.5: the recall level
    elif m.group("k") is not None:
        if k is not None:
            raise _error(f"metric {name!r}: cutoff given twice")
        k = _value(name, "@", m.group("k"))
    if k is not None:
        if cut == "none":
            raise _error(f"metric {name!r}: {canon} takes no cutoff")
        if isinstance(k, (bool, str)) or k != int(k) or not 1 <= k <= MAX_CUTOFF:
            raise _error(f"metric {name!r}: cutoff {k!r} must be an integer between 1 and {MAX_CUTOFF}")
        k = int(k)
    elif cut == "required":
        raise _error(f"metric {name!r}: {canon} needs a cutoff, e.g. {canon}@10")
    if family in CWL:
        return _cwl_spec(name, canon, params, k, judged_only)
    opts, param = [], ""
    if canon == "NumRelRet":
        params.setdefault("rel", 1)  # ir_measures: NumRelRet = NumRet(rel=1)
    if "rel" in params:
        rel = params.pop("rel")
        if isinstance(rel, (bool, str)):
            raise _error(f"metric {name!r}: rel must be a number")
        if family == "num_ret":
            family = "num_rel_ret"
        if canon == "RBP":  # cwl_eval's binary RBP: gain 1 at or above rel, else 0
            opts.append("binary")
        opts.append(f"rel={rel:g}")
    if "dcg" in params:
        dcg = params.pop("dcg")
        if dcg not in ("log2", "exp-log2"):
            raise _error(f"metric {name!r}: dcg must be 'log2' or 'exp-log2', got {dcg!r}")
        opts.append("gain=" + ("linear" if dcg == "log2" else "exponential"))
    if params.pop("relative", False) is True:
        family = "set_relative_P"
    if "beta" in params:
        param = repr(float(params.pop("beta")))
    if family == "iprec_at_recall":
        param = _iprec_param(name, params, opts)
    if family == "rbp":
        p = float(params.pop("p", 0.8))
        if not 0 < p < 1:
            raise _error(f"metric {name!r}: RBP's persistence p must be in (0, 1)")
        param = f"p={p!r}"
    if judged_only:  # trec_eval -J for this measure: its unjudged ranked documents removed first
        opts.append("judged")
    if gains:  # ir_measures' nDCG(gains=...): the qrels' grades mapped before scoring (a grade not named: itself)
        opts.append("gains=" + ",".join(f"{g!r}:{v!r}" for g, v in sorted(gains.items())))
    return MetricSpec(family, k, param, ";".join(opts), label=name)


def _iprec_param(name, params, opts):
    """IPrec's recall level as the spec's parameter (``params``' ``recall``, checked); its ``rounding``
    (ours: trec_eval 10's lround(x R), or trec_eval 9's (long) (x R + 0.9)) appended to ``opts``."""
    rounding = params.pop("rounding", "trec_eval_10")
    if rounding not in ("trec_eval_10", "trec_eval_9"):
        raise _error(f"metric {name!r}: rounding is 'trec_eval_10' (lround(x R), the default) or 'trec_eval_9' "
                     f"((long) (x R + 0.9), pytrec_eval's and ir_measures'), got {rounding!r}")
    if rounding == "trec_eval_9":
        opts.append("rounding=trec_eval_9")
    if "recall" not in params:
        raise _error(f"metric {name!r}: IPrec needs a recall level, e.g. IPrec(recall=0.5)")
    recall = params.pop("recall")
    if isinstance(recall, (bool, str)) or not 0 <= recall <= 1:
        raise _error(f"metric {name!r}: IPrec's recall level {recall!r} must be between 0 and 1")
    return repr(float(recall))


def _cwl_spec(name, canon, params, k, judged_only):
    """The MetricSpec of a measure of :mod:`streameval.metrics.cwl_measures` (INST, INSQ, BPM, SDCG,
    NERR8-11, Compat): its parameters checked against ir_measures' definitions and kept, defaults
    filled in, in ``opts`` (``T=1.0;min_rel=0;max_rel=3``)."""
    from .names import MetricSpec

    f = registry.family(canon)
    if judged_only:
        raise _error(f"metric {name!r}: {canon} takes no parameter 'judged_only' (parameters: "
                     f"{', '.join(p.name for p in f.params)})")
    opts = []
    for prm in f.params:
        v = params.get(prm.name, prm.default)
        if prm.name == "dcg":
            if v != "log2":
                raise _error(f"metric {name!r}: {canon}'s dcg must be 'log2' (the only one ir_measures has), got {v!r}")
            continue
        if v is None:
            raise _error(f"metric {name!r}: {canon} needs max_rel, the largest relevance grade (ir_measures requires "
                         f"it), e.g. {canon}(max_rel=3){'@10' if f.cutoff == registry.REQUIRED else ''}")
        if prm.type == "bool":
            if not isinstance(v, bool):
                raise _error(f"metric {name!r}: {prm.name} is True or False, got {v!r}")
            opts.append(f"{prm.name}={v}")
            continue
        if isinstance(v, (bool, str)):
            raise _error(f"metric {name!r}: {prm.name} must be a number, got {v!r}")
        if prm.type == "int":
            if v != int(v) or (prm.name == "rel" and v < 1):
                least = " of at least 1" if prm.name == "rel" else ""
                raise _error(f"metric {name!r}: {prm.name} must be an integer{least}, got {v!r}")
            opts.append(f"{prm.name}={int(v)}")
            continue
        if prm.name == "T" and not v > 0:
            raise _error(f"metric {name!r}: {canon}'s T must be positive, got {v!r}")
        if prm.name == "p" and not 0 <= v <= 1:
            raise _error(f"metric {name!r}: {canon}'s p must be in [0, 1], got {v!r}")
        opts.append(f"{prm.name}={float(v)!r}")
    if "min_rel" in params or "max_rel" in params:
        lo, hi = int(params.get("min_rel", 0)), int(params["max_rel"])
        if not lo < hi:
            raise _error(f"metric {name!r}: min_rel ({lo}) must be below max_rel ({hi})")
    return MetricSpec(canon, k, "", ";".join(opts), label=name)
