"""Metric names as users write them, parsed into :class:`MetricSpec`.

Accepted spellings (case of the family name is ignored, ``P`` and ``p`` are the same):

==============  ===========================================  ====================
family          forms                                        trec_eval name
==============  ===========================================  ====================
P               ``P@5``, ``P_5``, ``P.5``, ``precision@5``    ``P_5``
recall          ``recall@100``, ``recall_100``, ``R@100``     ``recall_100``
success         ``success@1``, ``success_1``, ``hit@1``       ``success_1``
hits            ``hits@10`` (ranx: relevant items in top k)   (none)
recip_rank      ``recip_rank``, ``mrr``, ``rr``               ``recip_rank``
recip_rank@k    ``mrr@10``, ``rr@10``, ``recip_rank@10``      (none)
map             ``map``, ``ap``                               ``map``
map@k           ``map@100``, ``map_cut_100``, ``ap@100``      ``map_cut_100``
Rprec           ``Rprec``, ``r-precision``, ``R-prec``        ``Rprec``
bpref           ``bpref``                                     ``bpref``
dcg / dcg@k     ``dcg``, ``dcg@10``, ``dcg_cut_10``           (none)
ndcg            ``ndcg``                                      ``ndcg``
ndcg@k          ``ndcg@10``, ``ndcg_cut_10``, ``ndcg_cut.10`` ``ndcg_cut_10``
err@k           ``err@20``, ``err_20``, ``err``               (none)
num_ret         ``num_ret``                                   ``num_ret``
num_rel         ``num_rel``                                   ``num_rel``
num_rel_ret     ``num_rel_ret``                               ``num_rel_ret``
==============  ===========================================  ====================

The other trec_eval 10 families (gm_map, iprec_at_recall, set_F, infAP, rbp, ...) are spelled as in
trec_eval, with its parameters: see :mod:`streameval.metrics.trec_names`.

ir_measures' spellings with their own parameters (``AP(rel=2)@100``, ``nDCG(dcg='exp-log2')@10``,
``Judged@10``, ``NumQ``, ``SetP``, ``RBP(p=0.8)``): see :mod:`streameval.metrics.irm_names`; their
rows keep the name as written. ``hits@k`` is ranx's count of relevant items in the top k.

trec_eval's parameter lists expand to several specs: ``P.5,10`` gives ``P@5`` and ``P@10``.
``all_trec`` expands to every implemented trec_eval measure at trec_eval's default cutoffs.
"""

from __future__ import annotations

import contextvars
import difflib
import re
from dataclasses import dataclass, field, replace

from . import diversity, irm_names, registry, trec_names
from .errors import MetricNameError
from . import diversity as _diversity

__all__ = [
    "MetricSpec",
    "MetricNameError",
    "parse_metric",
    "parse_metrics",
    "metric_name_list",
    "TREC_DEFAULT_CUTOFFS",
    "MAX_CUTOFF",
    "ALL_TREC",
    "OFFICIAL_TREC",
    "check_arithmetic",
    "is_diversity",
    "closest",
    "closest_text",
    "ranking_vocabulary",
    "ranking_identity",
    "unknown_name_error",
    "as_name",
]

#: the largest cutoff and depth (positions are Avro ints in the logs; trec_eval's ranks are C ints)
MAX_CUTOFF = 2**31 - 1
# trec_eval's default cutoffs for P, recall, map_cut and ndcg_cut; success has its own.
TREC_DEFAULT_CUTOFFS = registry.TREC_CUTOFFS
TREC_SUCCESS_CUTOFFS = registry.SUCCESS_CUTOFFS


@dataclass(frozen=True, order=True)
class MetricSpec:
    """One metric at one cutoff.

    ``family`` is one of :data:`FAMILIES`; ``k`` is the cutoff (``None`` for no cutoff).
    """

    family: str
    k: int | None = None
    #: trec_eval's parameter of the families of :mod:`streameval.metrics.trec_names` ("": default)
    param: str = ""
    #: this measure's own options overriding the global MetricOptions, ``;``-joined ``rel=2``,
    #: ``gain=exponential`` ("": none; ir_measures parameters, :mod:`streameval.metrics.irm_names`)
    opts: str = ""
    #: an ir_measures name as the user wrote it, the row name ("": the canonical name); two labels
    #: of one measure (``RBP``, ``RBP(p=0.8)``) are two rows
    label: str = ""
    #: any other name as the user wrote it when it is not the canonical one (``nDCG@10``, ``AP``,
    #: ``ndcg_cut_10``; issue 42), the row name; not part of the measure's identity: two spellings of
    #: one measure are one spec (the first spelling names it)
    written: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        """Name used in result rows: the name as the user wrote it (``nDCG@10``, ``AP``,
        ``AP(rel=2)@100``), or the :attr:`canonical` name of a spec not parsed from one name
        (``P.5,10``'s two specs are ``P@5`` and ``P@10``)."""
        return self.label or self.written or self.canonical

    @property
    def canonical(self) -> str:
        """The measure's canonical name, whatever its spelling: ``ndcg@10`` for ``nDCG@10``,
        ``ndcg_cut_10`` and ``NDCG@10``, ``map`` for ``AP``, ``P(rel=2)@5`` for ``P(rel=2)@5`` and
        ``p(rel=2)@5``; the rows' ``metric_canonical``. A diversity measure's is its name."""
        if self.label and registry.BY_NAME.get(self.family) is not None and registry.BY_NAME[self.family].subtopics:
            return self.label
        if self.family in trec_names.FAMILIES:
            base = trec_names.trec_name(self)
        elif self.family == "recip_rank" and self.k is not None:
            base = f"mrr@{self.k}"
        elif self.family == "ndcg" and self.param:
            base = f"ndcg_{self.param}"
        else:
            base = _DISPLAY[self.family] if self.k is None else f"{_DISPLAY[self.family]}@{self.k}"
        if not self.opts:
            return base
        opts = "(" + self.opts.replace(";", ",") + ")"
        head, at, k = base.partition("@")
        return f"{head}{opts}{at}{k}"

    @property
    def trec_name(self) -> str | None:
        """The name trec_eval prints for this measure, or ``None`` if trec_eval lacks it."""
        f, k = self.family, self.k
        if self.opts:
            return None
        if f in trec_names.FAMILIES:
            return trec_names.trec_name(self)
        if f == "ndcg" and self.param:  # trec_eval's rel_level=gain parameters, printed as given
            return f"ndcg_{self.param}"
        if k is None:
            return f if f in _TREC_PLAIN else None
        return f"{_TREC_CUT[f]}_{k}" if f in _TREC_CUT else None

    @property
    def is_count(self) -> bool:
        """True for num_ret / num_rel / num_rel_ret (trec_eval sums them in ``all``)."""
        return self.average == registry.TOTAL

    @property
    def average(self) -> str:
        """How the per-query values are summarised over queries: ``"mean"`` (arithmetic),
        ``"total"`` (the counts, :attr:`is_count`) or ``"geometric"`` (gm_map, gm_bpref: trec_eval's
        exp of the mean log, values floored at :data:`trec_names.MIN_GEO_MEAN`)."""
        f = registry.BY_NAME.get(self.family)
        return f.average if f is not None else registry.MEAN

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.name


# The tables below are derived from the registry (streameval/metrics/registry.py), one record per
# family; the families of trec_names.py are spelled and parsed there.
_OURS = tuple(f for f in registry.REGISTRY if f.parsed and not f.trec_kind)

# family -> display base
_DISPLAY = {f.name: f.name for f in _OURS}
FAMILIES = tuple(_DISPLAY)

# families whose cutoff versions trec_eval prints, and the prefix it uses
_TREC_CUT = {f.name: f.trec_cut_name for f in _OURS if f.trec_cut_name}

# families trec_eval prints without a cutoff
_TREC_PLAIN = {f.name for f in _OURS if f.trec_name}

# families that need a cutoff / accept no cutoff
_NEEDS_K = {f.name for f in _OURS if f.cutoff == registry.REQUIRED}
_NO_K = {f.name for f in _OURS if f.cutoff == registry.NONE}

_ALIASES = {a: f.name for f in _OURS for a in f.aliases}

ACCEPTED = registry.accepted() + " | " + irm_names._ACCEPTED

_ERR_DEFAULT_K = registry.family("err").default_k

_FORM = re.compile(r"^(?P<base>[A-Za-z][A-Za-z_\-]*?)(?:(?:@|_|\.)(?P<params>[0-9][0-9,.]*))?$")


# -- the closest accepted names, for the one-line error of an unknown name -------------------------------

# True while candidate names are tried (their own errors then name no closest names: no recursion)
_SUGGESTING: contextvars.ContextVar[bool] = contextvars.ContextVar("_SUGGESTING", default=False)
# a name's base and its tail (cutoff, parameters) kept when the base is replaced: ndgc|@10, ndgc_cut|_10,
# P|.5,10, nDGC|(dcg='log2')@10, gauc|[user], rbp|.p=0.9
_TAIL = re.compile(r"^(?P<base>.*?)(?P<tail>(?:[@(\[].*|[_.][0-9].*|[_.]p=.*)?)$", re.S)


def closest(raw, vocabulary, identity, n: int = 3) -> list[str]:
    """The ``n`` accepted names closest to ``raw`` (difflib's ratio, case ignored): each base name of
    ``vocabulary`` with ``raw``'s cutoff or parameters (``ndgc@10`` -> ``ndcg@10``) or alone.
    ``identity(name)`` is the measure a candidate names (hashable) or None when it is not accepted;
    two spellings of one measure are offered once."""
    text = str(raw).strip()
    m = _TAIL.match(text)
    head, tail = (m.group("base"), m.group("tail")) if text else ("", "")
    with_tail: dict[str, list[str]] = {}  # lower case -> its spellings, the vocabulary's order
    alone: dict[str, list[str]] = {}
    for base in vocabulary:
        for c, into in (((base + tail, with_tail), (base, alone)) if tail else ((base, alone),)):
            if c not in into.setdefault(c.lower(), []):
                into[c.lower()].append(c)
    token = _SUGGESTING.set(True)
    try:
        out, seen = [], set()
        # the name with its cutoff or parameters first, then the base names alone (a tail only one
        # measure takes, nDCGG(dcg='exp-log2')@10, leaves the others)
        for word, cands in ((text, {**with_tail, **alone}), (head, alone)):
            for low in difflib.get_close_matches(word.lower(), list(cands), n=12 * n, cutoff=0.0):
                for c in cands[low]:  # the first spelling accepted (judged is refused, Judged accepted)
                    key = identity(c)
                    if key is not None:
                        break
                if key is None or key in seen:
                    continue
                seen.add(key)
                out.append(c)
                if len(out) == n:
                    return out
        return out
    finally:
        _SUGGESTING.reset(token)


def ranking_vocabulary(diversity: bool = False) -> tuple[str, ...]:
    """The base names of the ranking measures: the registry's families and our aliases, trec_eval's
    families, ir_measures' measures, ``all_trec`` and ``official`` (and the diversity measures)."""
    out = [f.name for f in registry.REGISTRY if f.parsed and not f.subtopics]
    out += [a for f in _OURS for a in f.aliases]
    out += sorted(trec_names.FAMILIES) + list(irm_names.NAMES) + ["all_trec", "official", "dcg_burges", "ndcg_burges"]
    if diversity:
        out += list(_diversity.MEASURES)
    return tuple(dict.fromkeys(out))


def ranking_identity(name: str, diversity: bool = False):
    """The measures a ranking name gives (a hashable key, spellings aside) or None if it is refused."""
    try:
        specs = parse_metric(name, diversity=diversity)
    except MetricNameError:
        return None
    return tuple((s.family, s.k, s.param, s.opts) for s in specs)


def closest_text(raw, vocabulary, identity) -> str:
    """``"; closest accepted names: a, b, c (every name: docs/metrics.md)"``, the tail of an unknown
    name's error (:func:`closest`); empty while candidates are being tried."""
    if _SUGGESTING.get():
        return ""
    picks = closest(raw, vocabulary, identity)
    return f"; closest accepted names: {', '.join(picks)} (every name: docs/metrics.md)" if picks else ""


def _closest_text(raw, diversity: bool = False) -> str:
    vocabulary = ranking_vocabulary(diversity)
    if "(" in str(raw):  # written the ir_measures way: its spellings first (RR(rel=2), not rr(rel=2))
        vocabulary = tuple(dict.fromkeys(irm_names.NAMES + vocabulary))
    return closest_text(raw, vocabulary, lambda c: ranking_identity(c, diversity))


def unknown_name_error(raw, *, diversity: bool = False, head: str = "") -> MetricNameError:
    """The one-line error of a name that is no accepted ranking measure (``head``, default
    ``unknown metric 'NAME'``), naming the three closest."""
    e = MetricNameError(f"{head or f'unknown metric {str(raw).strip()!r}'}{_closest_text(raw, diversity)}")
    e.unknown = True
    return e


def _refuse_dwell(raw) -> None:
    """A dwell metric (``mean_dwell``, ``sat_click_rate[t=T]``, ...) is not a ranking metric: refused
    in one line naming where it is computed (ranking evaluation reaches it here)."""
    from .online_names import match_online_metric  # the online names import this module

    try:
        spec = match_online_metric(raw)
    except MetricNameError:
        return
    if spec is not None and spec.dwell:
        raise MetricNameError(f"{spec.name} is an online dwell metric (the impressions' dwell_ms), not a ranking "
                              f"metric: the batch and streaming jobs compute it (--metrics {spec.name}); ranking "
                              f"evaluation does not")


# -- ranx's own spellings (ranx 0.3.21, ranx/meta/evaluate.py extract_metric_and_params) -------------------

_RANX_LEVEL = re.compile(r"^(?P<base>.+?)-l(?P<level>[0-9]+)$")
_RANX_BURGES = re.compile(r"^(?P<base>n?dcg)_burges(?:@(?P<k>[0-9]+))?$", re.I)
# ranx spells it in lower case (ir_measures' RBP@10 stays refused: its RBP takes no cutoff)
_RANX_RBP = re.compile(r"^rbp[.@](?P<digits>[0-9]+)$")
_RANX_F1 = re.compile(r"^f1(?:[@_.](?P<k>[0-9]+))?$", re.I)  # a digit in the name: not _FORM's


def _with_opt(spec: MetricSpec, opt: str) -> MetricSpec:
    return replace(spec, opts=";".join(o for o in (spec.opts, opt) if o))


def _ranx_form(name: str) -> list[MetricSpec] | None:
    """ranx's names that are not ours: ``f1`` / ``f1@k`` (its digit is no cutoff), ``dcg_burges@k`` /
    ``ndcg_burges@k`` (gain 2**grade - 1, as
    ``nDCG(dcg='exp-log2')``), ``rbp.95`` (persistence 0.95; ranx's gain, the grade of a judgment at
    or above the relevance level, not divided by the largest grade as trec_eval's rbp). None for
    another name."""
    m = _RANX_BURGES.match(name)
    if m:
        base = m.group("base").lower() + (f"@{m.group('k')}" if m.group("k") else "")
        return [_with_opt(s, "gain=exponential") for s in _parse_one(base)]
    m = _RANX_F1.match(name)
    if m:
        return _specs_for("f1", [int(m.group("k")) if m.group("k") else None], name)
    m = _RANX_RBP.match(name)
    if m:
        p = float("0." + m.group("digits"))
        if not 0 < p < 1:
            raise MetricNameError(f"metric {name!r}: RBP's persistence must be in (0, 1)")
        return [_with_opt(s, "ranx") for s in trec_names.parse(f"rbp.p={p!r}")]
    return None


def _ranx_level(raw: str, specs: list[MetricSpec], level: int) -> list[MetricSpec]:
    """ranx's ``-lN`` suffix: judgments below N are not relevant (its ``rel_lvl``): the relevance level
    of a binary measure (``rel=N``), and for DCG and nDCG the gain floor (grades below N gain 0, in
    the ideal too); ranx's rbp counts the grades from N."""
    out = []
    for s in specs:
        fam = registry.BY_NAME.get(s.family)
        if any(o.startswith(("rel=", "floor=")) for o in s.opts.split(";")):
            raise MetricNameError(f"metric {raw!r}: a relevance level given twice")
        if s.family in ("dcg", "ndcg"):
            out.append(_with_opt(s, f"floor={float(level):g}"))
        elif (s.family == "rbp" and "ranx" in s.opts.split(";")) or \
                (fam is not None and any(p.name == "rel" for p in fam.params)):
            out.append(_with_opt(s, f"rel={float(level):g}"))
        else:
            raise MetricNameError(f"metric {raw!r}: ranx's relevance-level suffix -l{level} does not apply to "
                                  f"{s.canonical} (it takes no relevance level)")
    return out


def _specs_for(family: str, ks: list[int | None], raw: str) -> list[MetricSpec]:
    out = []
    for k in ks:
        if k is None:
            if family in _NEEDS_K:
                raise MetricNameError(f"metric {raw!r} needs a cutoff, e.g. {family}@10")
            if family == "err":
                k = _ERR_DEFAULT_K
        else:
            if family in _NO_K:
                raise MetricNameError(f"metric {raw!r} takes no cutoff (write {_DISPLAY[family]})")
            if k < 1:
                raise MetricNameError(f"metric {raw!r}: cutoff must be a positive integer")
        out.append(MetricSpec(family, k))
    return out


def _parse_one(raw: str, accept_diversity: bool = False) -> list[MetricSpec]:
    name = raw.strip()
    if not name:
        raise MetricNameError("empty metric name, e.g. ndcg@10 (every name: docs/metrics.md)")
    low = name.lower()
    if diversity.is_diversity_name(name):
        if accept_diversity:
            d = diversity.parse_diversity(name)  # MetricNameError for a bad cutoff or parameter
            return [MetricSpec(d.measure, d.k, label=d.label)]
        raise MetricNameError(f"metric {raw!r} is a diversity measure (subtopic judgments): streameval.evaluate() "
                              "with diversity qrels, `streameval ndeval` and `streameval batch` compute it; this "
                              "command does not")
    level = _RANX_LEVEL.match(name)
    if level:  # ranx's relevance-level suffix: ndcg@10-l2, precision@5-l2
        try:
            base = _parse_one(level.group("base"), accept_diversity)
        except MetricNameError as e:
            if e.unknown:  # the whole name and its closest, suffix kept
                raise unknown_name_error(raw, diversity=accept_diversity) from None
            raise
        return _ranx_level(raw, base, int(level.group("level")))
    ranx = _ranx_form(name)
    if ranx is not None:
        return ranx
    irm = irm_names.parse(name)
    if irm is not None:
        return [irm]
    more = trec_names.parse(name)
    if more is not None:
        return more
    if low == "all_trec":
        return list(ALL_TREC)
    if low == "official":
        return list(OFFICIAL_TREC)
    if low.startswith("ndcg.") and "=" in name:
        # trec_eval's gains per relevance level: ndcg.1=3,2=9,4=4.5 (m_ndcg.c, gain_init.c)
        from .trec_measures import gain_pairs

        try:
            gain_pairs(name[5:])
        except ValueError as e:
            raise MetricNameError(f"metric {raw!r}: {e}") from None
        return [MetricSpec("ndcg", None, name[5:])]
    # exact family names (with underscores of their own) first
    if low in _ALIASES and low not in ("map_cut", "ndcg_cut", "dcg_cut"):
        return _specs_for(_ALIASES[low], [None], raw)
    _refuse_dwell(raw)
    m = _FORM.match(name)
    if not m:
        raise unknown_name_error(raw, diversity=accept_diversity)
    base = m.group("base").lower().rstrip("_-")
    params = m.group("params")
    if base not in _ALIASES:
        raise unknown_name_error(raw, diversity=accept_diversity)
    family = _ALIASES[base]
    if params is None:
        return _specs_for(family, [None], raw)
    ks: list[int | None] = []
    for part in params.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise MetricNameError(f"metric {raw!r}: cutoff {part!r} is not a number") from None
        if not 1 <= value < MAX_CUTOFF + 1:  # NaN fails too
            raise MetricNameError(f"metric {raw!r}: cutoff {part!r} must be between 1 and {MAX_CUTOFF}")
        if value != int(value):
            # trec_eval truncates fractional cutoffs (ndcg_cut.23.4 -> 23)
            value = int(value)
        ks.append(int(value))
    if not ks:
        raise MetricNameError(f"metric {raw!r}: empty cutoff list")
    return _specs_for(family, ks, raw)


def as_name(name):
    """``name`` itself, or the name of an ir_measures Measure object (``ir_measures.nDCG@10`` ->
    ``"nDCG@10"``, ``ir_measures.P(rel=2)@5`` -> ``"P(rel=2)@5"``: its own ``str``)."""
    if isinstance(name, str):
        return name
    if type(name).__module__.startswith("ir_measures") and hasattr(name, "NAME") and hasattr(name, "params"):
        return str(name)
    return name


def parse_metric(name: str, *, diversity: bool = False) -> list[MetricSpec]:
    """Parse one user-written metric name into one or more specs.

    ``diversity``: accept the diversity measures of :mod:`streameval.metrics.diversity` (for a
    consumer that scores them, the batch job): a spec whose family is the measure
    (``"alpha-nDCG"``, one of the registry's ``subtopics`` families) and whose label is the name
    as written; otherwise they are refused in one line.
    Raises :class:`MetricNameError` (a ``ValueError``) in one line, naming the three closest accepted
    names for an unknown one.
    """
    name = as_name(name)
    if not isinstance(name, str):
        raise MetricNameError(f"metric names are strings or ir_measures measures, got {type(name).__name__}")
    specs = _parse_one(name, diversity)
    written = name.strip()
    if len(specs) == 1 and not specs[0].label and written != specs[0].canonical:
        return [replace(specs[0], written=written)]  # the row keeps the name as written (issue 42)
    return specs


def is_diversity(spec) -> bool:
    """True when ``spec`` (a MetricSpec) is a diversity measure (subtopic judgments)."""
    f = registry.BY_NAME.get(spec.family)
    return f is not None and f.subtopics


def metric_name_list(names) -> list:
    """``names`` (a name, a :class:`MetricSpec` or an iterable of them) as a list. Raises ``TypeError``
    saying what is accepted for ``None`` (metrics not given), bytes or a value that is not iterable."""
    names = as_name(names)
    if isinstance(names, (str, MetricSpec)):
        return [names]
    if names is None or isinstance(names, (bytes, bytearray)) or not hasattr(names, "__iter__"):
        got = "None" if names is None else f"{type(names).__name__} {names!r}"
        raise TypeError(f"metrics is required: a metric name such as 'ndcg@10' or a list of names such as "
                        f"['ndcg@10', 'map'] (names as docs/metrics.md writes them); got {got}")
    return list(names)


def parse_metrics(names, *, arithmetic: str | None = None, diversity: bool = False) -> list[MetricSpec]:
    """Parse a name or an iterable of names; duplicates are dropped, first order kept.

    ``arithmetic``: for a consumer that aggregates arithmetic means and totals only (the Beam jobs),
    its name: ``all_trec`` / ``official`` then leave out gm_map and gm_bpref, and naming one of them
    raises :class:`MetricNameError` (:func:`check_arithmetic`). ``diversity``: as :func:`parse_metric`.
    ``TypeError`` (:func:`metric_name_list`) for ``None`` or a value that is no name nor names."""
    names = metric_name_list(names)
    seen: dict[MetricSpec, None] = {}
    for n in names:
        specs = [n] if isinstance(n, MetricSpec) else parse_metric(n, diversity=diversity)
        if arithmetic and isinstance(n, str) and n.strip().lower() in ("all_trec", "official"):
            specs = [s for s in specs if s.average != "geometric"]
        for s in specs:
            seen.setdefault(s, None)
    if not seen:
        raise MetricNameError("no metrics requested, e.g. ['ndcg@10', 'map'] (every name: docs/metrics.md)")
    out = list(seen)
    if arithmetic:
        check_arithmetic(out, arithmetic)
    return out


def check_arithmetic(specs, where: str) -> None:
    """Raise :class:`MetricNameError` when a spec is not summarised by an arithmetic mean or a total
    (gm_map, gm_bpref): ``where`` (e.g. "the Beam jobs") aggregates those two only."""
    bad = [s.name for s in specs if s.average == "geometric"]
    if bad:
        raise MetricNameError(f"{', '.join(bad)}: a geometric mean over queries (trec_eval); {where} "
                              "aggregate arithmetic means and totals only (all_trec leaves it out there): "
                              "use 'streameval trec-eval' or evaluate()")


def _trec_set(with_extras: bool) -> tuple[MetricSpec, ...]:
    """The measures of trec_eval's default output (and of ``-m all_trec`` when ``with_extras``) as
    the registry declares them (``trec_sets``, ``cut_trec_sets``, ``trec_defaults``): the default
    output's in trec_eval's print order, then all_trec's families with trec_eval's parameters, then
    its others (recall, ndcg, ndcg_cut, map_cut, success), each group in print order."""
    groups: list[list] = [[], [], []]
    for f in registry.REGISTRY:
        if not f.parsed:
            continue
        for which, cut in ((f.trec_sets, False), (f.cut_trec_sets, True)):
            if "official" in which:
                group = 0
            elif with_extras and "all_trec" in which:
                group = 1 if f.trec_kind else 2
            else:
                continue
            if cut:
                specs = [MetricSpec(f.name, k) for k in f.trec_defaults]
            else:
                specs = trec_names.defaults(f.name) if f.trec_kind else [MetricSpec(f.name)]
            groups[group].append((registry.print_rank(f.name, cut), specs))
    return tuple(s for g in groups for _, specs in sorted(g, key=lambda t: t[0]) for s in specs)


#: every implemented trec_eval measure at trec_eval's default cutoffs (``-m all_trec``)
ALL_TREC = _trec_set(True)
#: the implemented part of trec_eval's default ("official") output, used when no ``-m`` is given
OFFICIAL_TREC = _trec_set(False)
