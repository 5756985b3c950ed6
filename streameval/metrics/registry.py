"""One declaration per ranking measure family (issue 17): the registry.

Each family is one :class:`Family` record: its names (ours, trec_eval's, ir_measures'), its
parameters, its cutoff rule, where trec_eval prints it and in which of its measure lists it is, how
it averages over queries, which state it needs (this decides pruning, :func:`keep_for`), the kernel
function that scores it and its documentation row with the source. In the spirit of trec_eval's
``TREC_MEAS`` table (``measures.c``, ``te_trec_measures``) and ir_measures' ``SUPPORTED_PARAMS``.

Derived from it (no hand-kept parallel table): the accepted-names part of the name parser's error
message (:func:`accepted`), the order in which ``streameval trec-eval`` prints families
(:func:`print_rank`, :data:`TREC_PRINT_ORDER`), :func:`streameval.accumulators.ranking.keep_for`
(:func:`needs_every_item`) and the measures table of ``docs/metrics.md`` (:func:`markdown_table`;
``python -m streameval.metrics.registry --markdown`` prints it).

This module is plain data: it imports nothing of the package (names.py, the kernel and the
accumulators import it). Kernel functions are referenced by ``"module:function"``
(:func:`kernel_function` resolves one).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Param", "Family", "REGISTRY", "BY_NAME", "TREC_PRINT_ORDER", "family", "print_rank", "accepted",
           "needs_every_item", "keep_for", "kernel_function", "markdown_table"]

#: trec_eval's default cutoffs for P, recall, relative_P, map_cut and ndcg_cut (measures.c's long cutoffs)
TREC_CUTOFFS = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
#: trec_eval's default cutoffs of success (m_success.c)
SUCCESS_CUTOFFS = (1, 5, 10)
_LEVELS_11 = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

# cutoff rules
NONE, OPTIONAL, REQUIRED, LIST = "none", "optional", "required", "list"
# averages over queries
MEAN, GEOMETRIC, TOTAL = "mean", "geometric", "total"
# state a family reads: only the top k served items (when a cutoff is given), every served item, or none
TOP_K, ALL_ITEMS, NO_ITEMS = "top_k", "all", "none"


@dataclass(frozen=True)
class Param:
    """One parameter of a measure: ``name`` as written (ir_measures' ``rel=``, trec_eval's ``p=``),
    ``type`` ("float", "int", "str", "bool"), its default and the allowed values (a tuple, or a
    one-line description of a range), ``doc`` one line."""

    name: str
    type: str
    default: object
    allowed: object
    doc: str = ""


@dataclass(frozen=True)
class Family:
    """One ranking measure family.

    name: the :class:`~streameval.metrics.names.MetricSpec` family (``"map"``).
    aliases: our lower-case spellings the name parser maps to this family (``"ap"``, ``"mrr"``).
    forms: the spellings listed in the parser's error message.
    cutoff: ``"none"`` (takes no cutoff), ``"optional"``, ``"required"`` or ``"list"`` (trec_eval's
      list of cutoffs or parameter values; without one, trec_eval's defaults).
    default_k: the cutoff a plain name gets (``err`` is ``err@20``), or None.
    trec_kind: how :mod:`~streameval.metrics.trec_names` reads trec_eval's parameters ("" for the
      families :mod:`~streameval.metrics.names` parses: ``plain``, ``dcut``, ``lcut``, ``dparams``, ``pairs``).
    params: the parameters (:class:`Param`).
    trec_name: what trec_eval prints for the measure without cutoff, or None.
    trec_cut_name: the prefix trec_eval prints for its cutoff versions (``map_cut`` -> ``map_cut_10``).
    print_order, cut_print_order: the family's index in trec_eval's ``te_trec_measures`` (measures.c),
      the order ``trec-eval`` prints it in; our own measures sit after the nearest trec_eval one
      (x.5). cut_print_order: where the cutoff versions print when trec_eval has them as another measure.
    trec_sets: the trec_eval measure lists with this family (``"official"``: the default output,
      ``"all_trec"``: ``-m all_trec``), at ``trec_defaults`` (cutoffs or parameter values) for the
      families with trec_eval's parameters; cut_trec_sets: the lists with its cutoff versions, at
      ``trec_defaults``.
    average: ``"mean"``, ``"geometric"`` (trec_eval's exp of the mean log, floored at MIN_GEO_MEAN)
      or ``"total"`` (the num_* counts, summed).
    state: ``"top_k"`` (with a cutoff k only the top k served items are read), ``"all"`` (every
      served item) or ``"none"`` (no served item).
    kernel: the scoring function, ``"module:function"`` under ``streameval.metrics``.
    irm: ir_measures' names of this family (:mod:`~streameval.metrics.irm_names`).
    rows: the rows of docs/metrics.md's measures table, (name as written, trec_eval name, definition, source).
    parsed: False for a trec_eval measure that :func:`~streameval.metrics.names.parse_metrics` does
      not give (relstring: ``streameval trec-eval`` only).
    """

    name: str
    aliases: tuple = ()
    forms: str = ""
    cutoff: str = NONE
    default_k: int | None = None
    trec_kind: str = ""
    params: tuple = ()
    trec_name: str | None = None
    trec_cut_name: str | None = None
    print_order: float = -1.0
    cut_print_order: float | None = None
    trec_sets: tuple = ()
    cut_trec_sets: tuple = ()
    trec_defaults: tuple = ()
    average: str = MEAN
    state: str = ALL_ITEMS
    kernel: str = ""
    irm: tuple = ()
    rows: tuple = ()
    parsed: bool = True
    #: True for a diversity measure (subtopic judgments; :mod:`~streameval.metrics.diversity` parses
    #: its names and scores it; ``parsed`` is False: only the batch job and evaluate() take it)
    subtopics: bool = False


_REL = Param("rel", "float", 1.0, "a number", "relevance level: grade >= rel is relevant (MetricOptions."
             "relevance_level, trec_eval -l, ir_measures rel=)")
_DCG = Param("dcg", "str", "log2", ("log2", "exp-log2"), "gain: the grade (trec_eval) or 2**grade - 1 "
             "(MetricOptions.gain linear / exponential)")
_ALPHA = Param("alpha", "float", 0.5, "[0, 1]", "redundancy penalty: a document's gain for a subtopic already "
               "covered c times is (1 - alpha)^c (Clarke et al., SIGIR 2008; ndeval -alpha)")
_BETA = Param("beta", "float", 0.5, "[0, 1]", "NRBP's patience (Clarke et al., ICTIR 2009; ndeval -beta)")
_MIN_REL = Param("min_rel", "int", 0, "an integer below max_rel", "cwl_eval's gain (grade - min_rel) / (max_rel - "
                 "min_rel), the grade (negative: 0) clipped to [min_rel, max_rel]; ir_measures' min_rel")
_MAX_REL = Param("max_rel", "int", None, "an integer above min_rel; required (as in ir_measures)",
                 "the grade that gains 1 (ir_measures' max_rel)")
_GOAL = Param("T", "float", 1.0, "a positive number", "the (scaled) gain the user wants (INST's T)")
_K = "kernel:"
_T = "trec_measures:"
_C = "cwl_measures:"

REGISTRY: tuple[Family, ...] = (
    Family("P", ("p", "precision", "prec"), "P@k P_k P.k1,k2 precision@k", REQUIRED, params=(_REL,),
           trec_cut_name="P", print_order=11, cut_trec_sets=("official", "all_trec"), trec_defaults=TREC_CUTOFFS,
           state=TOP_K, kernel=_K + "_precision", irm=("P",),
           rows=(("`P@k`, `P_k`", "`P_k`", "(number of relevant in top k) / k; k fixed even if fewer items are "
                  "ranked", "m_P.c"),)),
    Family("recall", ("recall", "r"), "recall@k recall_k", REQUIRED, params=(_REL,), trec_cut_name="recall",
           print_order=13, cut_trec_sets=("all_trec",), trec_defaults=TREC_CUTOFFS, state=TOP_K,
           kernel=_K + "_recall", irm=("R",),
           rows=(("`recall@k`", "`recall_k`", "relevant in top k / R; 0 when R = 0", "m_recall.c"),)),
    Family("success", ("success", "hit", "hitrate", "hit_rate"), "success@k success_k hit@k", REQUIRED,
           params=(_REL,), trec_cut_name="success", print_order=29, cut_trec_sets=("all_trec",),
           trec_defaults=SUCCESS_CUTOFFS, state=TOP_K, kernel=_K + "_success", irm=("Success",),
           rows=(("`success@k`, `hit@k`, `hit_rate@k`", "`success_k`", "1 if a relevant item is in the top k",
                  "m_success.c"),)),
    Family("hits", ("hits",), "hits@k", REQUIRED, params=(_REL,), print_order=29.5, state=TOP_K,
           kernel=_K + "_hits",
           rows=(("`hits@k`", "(none)", "number of relevant items in the top k (a mean over queries; before "
                  "issue 17 `hits@k` was read as success@k)", "ranx 0.3.21 `ranx/metrics/hits.py` (relevant: "
                  "grade >= `rel_lvl` = 1; here the relevance level)"),)),
    Family("f1", ("f1",), "f1 f1@k", OPTIONAL, params=(_REL,), print_order=29.7, state=TOP_K, kernel=_K + "_f1",
           rows=(("`f1`, `f1@k`", "(none)", "harmonic mean of precision (relevant in the top k / k; without k, / "
                  "the ranked items) and recall (/ R): 2 h / (k + R), h the relevant items in the top k; 0 when h "
                  "or R is 0", "ranx 0.3.21 `ranx/metrics/f1.py`"),)),
    Family("recip_rank", ("recip_rank", "mrr", "rr"), "recip_rank mrr rr mrr@k rr@k", OPTIONAL, params=(_REL,),
           trec_name="recip_rank", print_order=9, trec_sets=("official", "all_trec"), state=TOP_K,
           kernel=_K + "_recip_rank", irm=("RR",),
           rows=(("`recip_rank`, `mrr`", "`recip_rank`", "1 / rank of the first relevant item; 0 if none",
                  "m_recip_rank.c"),
                 ("`mrr@k`, `rr@k`", "(none)", "as recip_rank, 0 if the first relevant item is below k", ""))),
    Family("map", ("map", "ap", "map_cut"), "map ap map@k map_cut_k", OPTIONAL, params=(_REL,), trec_name="map",
           trec_cut_name="map_cut", print_order=5, cut_print_order=27, trec_sets=("official", "all_trec"),
           cut_trec_sets=("all_trec",),
           trec_defaults=TREC_CUTOFFS, state=TOP_K, kernel=_K + "_ap", irm=("AP",),
           rows=(("`map`, `ap`", "`map`", "sum over relevant ranked items of precision at their rank, / R",
                  "m_map.c"),
                 ("`map@k`", "`map_cut_k`", "the same sum restricted to the top k, / R (all of R)", "m_map_cut.c"))),
    Family("Rprec", ("rprec", "r-prec", "r-precision", "r_precision"), "Rprec", params=(_REL,), trec_name="Rprec",
           print_order=7, trec_sets=("official", "all_trec"), kernel=_K + "_rprec", irm=("Rprec",),
           rows=(("`Rprec`", "`Rprec`", "precision at rank R", "m_Rprec.c"),)),
    Family("bpref", ("bpref",), "bpref", params=(_REL,), trec_name="bpref", print_order=8,
           trec_sets=("official", "all_trec"), kernel=_K + "_bpref", irm=("Bpref",),
           rows=(("`bpref`", "`bpref`", "(1/R) sum over relevant ranked items of `1 - min(n, R) / min(N, R)`, n = "
                  "judged non-relevant ranked above, N = judged non-relevant of the query; term 1 when n = 0; "
                  "unjudged items skipped", "m_bpref.c; Buckley and Voorhees, SIGIR 2004"),)),
    Family("dcg", ("dcg", "dcg_cut"), "dcg dcg@k", OPTIONAL, params=(_DCG,), print_order=21, state=TOP_K,
           kernel=_K + "_dcg",
           rows=(("`dcg`, `dcg@k`", "(none in 10.0's all_trec)", "sum over ranks r (within k) of gain(g(r)) / "
                  "log2(r + 1)", "m_ndcg.c's DCG"),)),
    Family("ndcg", ("ndcg", "ndcg_cut"), "ndcg ndcg@k ndcg_cut_k ndcg_cut.k1,k2 ndcg.LEVEL=GAIN,...", OPTIONAL,
           params=(_DCG, Param("gains", "str", "", "LEVEL=GAIN pairs", "trec_eval's gains per relevance level "
                               "(ndcg.1=3,2=9; trec_measures:_ndcg_gains)")),
           trec_name="ndcg", trec_cut_name="ndcg_cut", print_order=23, cut_print_order=26,
           trec_sets=("all_trec",), cut_trec_sets=("all_trec",), trec_defaults=TREC_CUTOFFS, state=TOP_K,
           kernel=_K + "_ndcg", irm=("nDCG",),
           rows=(("`ndcg`", "`ndcg`", "DCG over all ranked items / ideal DCG over all positive judgments; 0 when "
                  "the ideal is 0", "m_ndcg.c; Jarvelin and Kekalainen 2002"),
                 ("`ndcg@k`", "`ndcg_cut_k`", "DCG@k / ideal DCG@k", "m_ndcg_cut.c"))),
    Family("err", ("err",), "err@k (default k=20 for plain 'err')", OPTIONAL, default_k=20,
           params=(Param("err_max_grade", "float", 4.0, "a positive number", "g_max (MetricOptions.err_max_grade)"),),
           print_order=27.5, state=TOP_K, kernel=_K + "_err", irm=("ERR",),
           rows=(("`err@k` (`err` = `err@20`)", "(none)", "sum over r <= k of (1/r) R_r prod_{i<r}(1 - R_i), R_i = "
                  "(2^g - 1) / 2^g_max", "Chapelle, Metzler, Zhang, Grinspan, CIKM 2009"),)),
    Family("num_ret", ("num_ret",), "num_ret", trec_name="num_ret", print_order=2,
           trec_sets=("official", "all_trec"), average=TOTAL, kernel=_K + "_num_ret", irm=("NumRet",),
           rows=(("`num_ret`", "`num_ret`", "ranked items (after `depth`)", "m_num_ret.c"),)),
    Family("num_rel", ("num_rel",), "num_rel", params=(_REL,), trec_name="num_rel", print_order=3,
           trec_sets=("official", "all_trec"), average=TOTAL, kernel=_K + "_num_rel", irm=("NumRel",),
           rows=(("`num_rel`", "`num_rel`", "R", "m_num_rel.c"),)),
    Family("num_rel_ret", ("num_rel_ret",), "num_rel_ret", params=(_REL,), trec_name="num_rel_ret", print_order=4,
           trec_sets=("official", "all_trec"), average=TOTAL, kernel=_K + "_num_rel_ret", irm=("NumRelRet",),
           rows=(("`num_rel_ret`", "`num_rel_ret`", "relevant ranked items", "m_num_rel_ret.c"),)),
    Family("num_q", ("num_q",), "num_q", print_order=1, average=TOTAL, state=NO_ITEMS, kernel=_K + "_num_q",
           irm=("NumQ",)),
    Family("judged", (), "", OPTIONAL, state=TOP_K, print_order=56.5, kernel=_K + "_judged", irm=("Judged",)),
    # -- the trec_eval 10 families of trec_names.py ------------------------------------------------------
    Family("gm_map", (), "gm_map", trec_kind="plain", params=(_REL,), trec_name="gm_map", print_order=6,
           trec_sets=("official", "all_trec"), average=GEOMETRIC, kernel=_T + "_gm_map",
           rows=(("`gm_map`", "`gm_map`", "AP per query, floored at 0.00001; the summary is the geometric mean, exp "
                  "of the mean log (trec_eval's `MIN_GEO_MEAN`; under `-c` a query without results counts "
                  "0.00001); trec_eval prints it in the summary only", "m_gm_map.c"),)),
    Family("gm_bpref", (), "gm_bpref", trec_kind="plain", params=(_REL,), trec_name="gm_bpref", print_order=15,
           trec_sets=("all_trec",), average=GEOMETRIC, kernel=_T + "_gm_bpref",
           rows=(("`gm_bpref`", "`gm_bpref`", "bpref, floored and averaged as gm_map", "m_gm_bpref.c"),)),
    Family("iprec_at_recall", (), "iprec_at_recall[.r1,r2]", LIST, trec_kind="dcut",
           params=(Param("recall", "float", _LEVELS_11, "recall levels", "printed %3.2f"),),
           trec_name="iprec_at_recall", print_order=10, trec_sets=("official", "all_trec"),
           trec_defaults=_LEVELS_11, kernel=_T + "_iprec_at_recall", irm=("IPrec",),
           rows=(("`iprec_at_recall` (`.0.1,0.5`, `_0.10`)", "`iprec_at_recall_0.10`", "interpolated precision at "
                  "recall level x: c = lround(x R) relevant items; 0 when c > num_rel_ret, else the largest "
                  "precision at any rank at or below the c-th relevant item (c = 0: the first); defaults 0.0, "
                  "0.1, ..., 1.0", "m_iprec_at_recall.c"),)),
    Family("11pt_avg", (), "11pt_avg[.r1,r2]", trec_kind="dparams",
           params=(Param("levels", "float", _LEVELS_11, "recall levels in increasing order"),),
           trec_name="11pt_avg", print_order=18, trec_sets=("all_trec",), trec_defaults=_LEVELS_11,
           kernel=_T + "_11pt_avg",
           rows=(("`11pt_avg` (`.0.2,0.5,0.8`)", "`11pt_avg`, `11pt_avg_<params>`", "mean of iprec_at_recall over "
                  "the levels (default the 11 above; levels in increasing order)", "m_11pt_avg.c"),)),
    Family("Rprec_mult", (), "Rprec_mult[.m1,m2]", LIST, trec_kind="dcut",
           params=(Param("mult", "float", (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0), "multiples of R",
                         "printed %3.2f"),),
           trec_name="Rprec_mult", print_order=16, trec_sets=("all_trec",),
           trec_defaults=(0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0), kernel=_T + "_rprec_mult",
           rows=(("`Rprec_mult` (`.0.5,2`, `_0.50`)", "`Rprec_mult_0.50`", "precision at c = (long) (x R + 0.9) "
                  "items: relevant in the top c / c; defaults 0.2, 0.4, ..., 2.0", "m_Rprec_mult.c"),)),
    Family("infAP", (), "infAP", trec_kind="plain", params=(_REL,), trec_name="infAP", print_order=14,
           trec_sets=("all_trec",), kernel=_T + "_infap", irm=("infAP",),
           rows=(("`infAP`", "`infAP`", "(1/R) sum over relevant ranked items at 0-based rank j of 1 (j = 0) or "
                  "1/(j+1) + j/(j+1) ((r-1+n+u)/j) ((r-1+e)/(r-1+n+2e)), r, n, u = relevant, judged non-relevant, "
                  "pooled unjudged (negative grade) items at ranks <= j, e = 0.00001; items outside the qrels "
                  "skipped", "m_infap.c; Yilmaz and Aslam, CIKM 2006"),)),
    Family("binG", (), "binG", trec_kind="plain", params=(_REL,), trec_name="binG", print_order=19,
           trec_sets=("all_trec",), kernel=_T + "_bin_g",
           rows=(("`binG`", "`binG`", "(1/R) sum over relevant ranked items of 1 / log2(2 + r - relevant at or "
                  "above r)", "m_binG.c"),)),
    Family("G", (), "G", trec_kind="plain", trec_name="G", print_order=20, trec_sets=("all_trec",),
           kernel=_T + "_g",
           rows=(("`G`", "`G`", "sum over ranked items of gain / log2(2 + cost - gain so far), the cost of rank j "
                  "the j-th ideal gain (at least 1; 1 past the ideal list), / sum of the positive grades; gain = "
                  "grade (trec_eval's default gains; its `rel_level=gain` parameters and `gain=` are not used)",
                  "m_G.c"),)),
    Family("ideal_dcg", (), "ideal_dcg[.LEVEL=GAIN,...]", trec_kind="plain", trec_name="ideal_dcg", print_order=22,
           kernel=_T + "_ideal_dcg",
           rows=(("`ideal_dcg` (`.1=3,2=9`)", "`ideal_dcg`, `ideal_dcg_1=3,2=9`", "ndcg's denominator: DCG of the "
                  "query's judged documents by decreasing gain while the gain is positive, whatever is ranked; "
                  "gain = grade or the `rel_level=gain` pairs (not in 10.0's all_trec; trec_eval shares one parameter "
                  "set among dcg, ideal_dcg and ndcg and crashes when one with pairs is asked with another: here "
                  "each keeps its own)", "m_ndcg.c"),)),
    Family("ndcg_rel", (), "ndcg_rel", trec_kind="plain", trec_name="ndcg_rel", print_order=24,
           trec_sets=("all_trec",), kernel=_T + "_ndcg_rel",
           rows=(("`ndcg_rel`", "`ndcg_rel`", "mean over the positive judgments of nDCG at the rank of each ranked "
                  "one (the ideal cut at the ideal list's end) and the final nDCG for each one not ranked; gain = "
                  "grade", "m_ndcg_rel.c"),)),
    Family("Rndcg", (), "Rndcg", trec_kind="plain", trec_name="Rndcg", print_order=25, trec_sets=("all_trec",),
           kernel=_T + "_rndcg",
           rows=(("`Rndcg`", "`Rndcg`", "mean of nDCG at each change of the ideal gain (after each positive grade "
                  "of the ideal list, the run cut at the ranked items), plus at the end of the ranking when it is "
                  "at least two items longer than the ideal list; 0 when R = 0; gain = grade", "m_Rndcg.c"),)),
    Family("relative_P", (), "relative_P[.k1,k2]", LIST, trec_kind="lcut", params=(_REL,),
           trec_cut_name="relative_P", print_order=28, trec_sets=("all_trec",), trec_defaults=TREC_CUTOFFS,
           state=TOP_K, kernel=_T + "_relative_p",
           rows=(("`relative_P` (`.5,10`, `_5`)", "`relative_P_5`", "relevant in the top k / min(k, R); 0 when "
                  "R = 0; default cutoffs as P", "m_rel_P.c"),)),
    Family("set_P", (), "set_P", trec_kind="plain", params=(_REL,), trec_name="set_P", print_order=30,
           trec_sets=("all_trec",), kernel=_T + "_set_p", irm=("SetP",),
           rows=(("`set_P`", "`set_P`", "num_rel_ret / num_ret", "m_set_P.c"),)),
    Family("set_relative_P", (), "set_relative_P", trec_kind="plain", params=(_REL,), trec_name="set_relative_P",
           print_order=31, trec_sets=("all_trec",), kernel=_T + "_set_relative_p", irm=("SetRelP",),
           rows=(("`set_relative_P`", "`set_relative_P`", "num_rel_ret / min(num_ret, R)", "m_set_rel_P.c"),)),
    Family("set_recall", (), "set_recall", trec_kind="plain", params=(_REL,), trec_name="set_recall",
           print_order=32, trec_sets=("all_trec",), kernel=_T + "_set_recall", irm=("SetR",),
           rows=(("`set_recall`", "`set_recall`", "num_rel_ret / R", "m_set_recall.c"),)),
    Family("set_map", (), "set_map", trec_kind="plain", params=(_REL,), trec_name="set_map", print_order=33,
           trec_sets=("all_trec",), kernel=_T + "_set_map", irm=("SetAP",),
           rows=(("`set_map`", "`set_map`", "num_rel_ret^2 / (num_ret R)", "m_set_map.c"),)),
    Family("set_F", (), "set_F[.beta]", trec_kind="dparams",
           params=(_REL, Param("beta", "float", 1.0, "a number")), trec_name="set_F", print_order=34,
           trec_defaults=(1.0,),
           trec_sets=("all_trec",), kernel=_T + "_set_f", irm=("SetF",),
           rows=(("`set_F` (`.0.5`)", "`set_F`, `set_F_0.5`", "(x+1) P R / (x P + R), set precision P, set recall "
                  "R, x default 1; 0 when num_rel_ret = 0", "m_set_F.c"),)),
    Family("utility", (), "utility[.p1,p2,p3,p4]", trec_kind="dparams",
           params=(Param("coefficients", "float", (1.0, -1.0, 0.0, 0.0), "4 numbers"),), trec_name="utility",
           trec_defaults=(1.0, -1.0, 0.0, 0.0), print_order=17, trec_sets=("all_trec",), kernel=_T + "_utility",
           rows=(("`utility` (`.p1,p2,p3,p4`)", "`utility`, `utility_2,-1,0,0`", "p1 a + p2 b + p3 c + p4 d, a = "
                  "relevant ranked, b = non-relevant ranked, c = relevant not ranked, d = N + num_rel_ret - "
                  "num_ret - R, non-relevant documents not ranked, N the collection's size (trec_eval `-N`, "
                  "`MetricOptions.num_docs_in_coll`; default 0); default 1, -1, 0, 0", "m_utility.c"),)),
    Family("num_nonrel_judged_ret", (), "num_nonrel_judged_ret", trec_kind="plain", params=(_REL,),
           trec_name="num_nonrel_judged_ret", print_order=35, trec_sets=("all_trec",), average=TOTAL,
           kernel=_T + "_num_nonrel_judged_ret",
           rows=(("`num_nonrel_judged_ret`", "`num_nonrel_judged_ret`", "judged non-relevant ranked items (summed "
                  "over queries)", "m_num_nonrel_judged_ret.c"),)),
    Family("yaap", (), "yaap", trec_kind="plain", params=(_REL,), trec_name="yaap", print_order=53,
           kernel=_T + "_yaap"),
    Family("rbp", (), "rbp[.p=P]", trec_kind="pairs",
           params=(Param("p", "float", 0.9, "(0, 1)", "persistence; ir_measures' RBP defaults to 0.8"),),
           trec_name="rbp", print_order=54, trec_sets=("all_trec",), kernel=_T + "_rbp", irm=("RBP",),
           rows=(("`rbp` (`.p=0.95`)", "`rbp`, `rbp_p=0.95`", "(1 - p) sum over ranks i >= 0 of gain p^i, gain = "
                  "grade, divided by the query's largest judged grade when that is above 1; the relevance level "
                  "is not used; p default 0.9 (gains per level not implemented)",
                  "m_rbp.c; Moffat and Zobel, TOIS 2008"),)),
    Family("rbp_resid", (), "rbp_resid[.p=P]", trec_kind="pairs",
           params=(Param("p", "float", 0.9, "(0, 1)", "persistence"),), trec_name="rbp_resid", print_order=55,
           trec_sets=("all_trec",), kernel=_T + "_rbp_resid",
           rows=(("`rbp_resid` (`.p=0.5`)", "`rbp_resid`, `rbp_resid_p=0.5`", "when some ranked items are not judged "
                  "(outside the qrels or negative grade): p^num_ret + (1 - p) sum of p^i over their ranks; else 0",
                  "m_rbp_resid.c"),)),
    Family("unj", (), "unj[.k1,k2]", LIST, trec_kind="lcut", trec_cut_name="unj", print_order=56,
           trec_sets=("all_trec",), trec_defaults=(5, 10, 20), state=TOP_K, kernel=_T + "_unj",
           rows=(("`unj` (`.5,10`, `_5`)", "`unj_5`", "items not judged in the top k / k; defaults 5, 10, 20",
                  "m_unjudged.c"),)),
    # -- diversity measures over subtopic judgments (ndeval 4.5; diversity.py parses and scores them) ----
    *(Family(m, (), forms, REQUIRED if cut else NONE, params=params, average=MEAN, state=TOP_K if cut else ALL_ITEMS,
             kernel="diversity:request_values", parsed=False, subtopics=True, print_order=56.6 + 0.03 * i)
      for i, (m, forms, cut, params, _irm) in enumerate((
          ("alpha-nDCG", "alpha_nDCG(alpha=a,rel=r)@k alpha-nDCG@k", True, (_ALPHA, _REL), ("alpha_nDCG",)),
          ("alpha-DCG", "alpha_DCG@k", True, (_ALPHA, _REL), ()),
          ("ERR-IA", "ERR_IA(alpha=a)@k ERR-IA@k", True, (_ALPHA, _REL), ("ERR_IA",)),
          ("nERR-IA", "nERR_IA@k", True, (_ALPHA, _REL), ()),
          ("NRBP", "NRBP(alpha=a,beta=b)", False, (_ALPHA, _BETA, _REL), ("NRBP",)),
          ("nNRBP", "nNRBP(alpha=a,beta=b)", False, (_ALPHA, _BETA, _REL), ("nNRBP",)),
          ("MAP-IA", "AP_IA MAP-IA", False, (_REL,), ("AP_IA",)),
          ("P-IA", "P_IA@k P-IA@k", True, (_REL,), ("P_IA",)),
          ("strec", "StRecall@k S_recall@k strec@k", True, (_REL,), ("StRecall",))))),
    # -- ir_measures' measures of other providers: cwl_eval's C/W/L measures and Compat (cwl_measures.py) --
    Family("INST", (), "", NONE, params=(_GOAL, _MIN_REL, _MAX_REL), print_order=56.90, kernel=_C + "_inst",
           irm=("INST",),
           rows=(("`INST(T=t, max_rel=m)`", "(none)", "C/W/L expected utility per item, sum W(i) g(i); C(i) = ((i + "
                  "T + T_i - 1) / (i + T + T_i))^2, T_i = T minus the gain to rank i; g the scaled gain (grade "
                  "clipped to [min_rel, max_rel], / (max_rel - min_rel)); 1000 ranks; T default 1",
                  "Moffat, Bailey, Scholer, Thomas, ADCS 2015; cwl_eval 1.0.12 `cwl_inst.py`"),)),
    Family("INSQ", (), "", NONE, params=(_GOAL, _MIN_REL, _MAX_REL), print_order=56.91, kernel=_C + "_insq",
           irm=("INSQ",),
           rows=(("`INSQ(T=t, max_rel=m)`", "(none)", "as INST with C(i) = ((i + 2T - 1) / (i + 2T))^2",
                  "Moffat, Scholer, Thomas, ADCS 2012; `cwl_insq.py`"),)),
    Family("BPM", (), "", REQUIRED, params=(_GOAL, _MIN_REL, _MAX_REL), print_order=56.92, state=TOP_K,
           kernel=_C + "_bpm", irm=("BPM",),
           rows=(("`BPM(T=t, max_rel=m)@K`", "(none)", "static Bejeweled Player Model: C(i) = 1 while the gain to "
                  "rank i is below T and i < K, else 0 (the mean scaled gain of the ranks read)",
                  "Zhang et al., SIGIR 2017; `cwl_bpm.py`"),)),
    Family("SDCG", (), "", REQUIRED, params=(Param("dcg", "str", "log2", ("log2",), "DCG formulation"), _MIN_REL,
                                            _MAX_REL), print_order=56.93, state=TOP_K, kernel=_C + "_sdcg",
           irm=("SDCG",),
           rows=(("`SDCG(max_rel=m)@k`", "(none)", "sum over r <= k of g(r) / log2(r + 1), / sum over r <= k of "
                  "1 / log2(r + 1): DCG@k scaled as if k documents of the top grade existed",
                  "Jarvelin and Kekalainen 2002; `cwl_dcg.py`"),)),
    Family("NERR8", (), "", REQUIRED, params=(_MIN_REL, _MAX_REL), print_order=56.94, state=TOP_K,
           kernel=_C + "_nerr8", irm=("NERR8",),
           rows=(("`NERR8(max_rel=m)@k`", "(none)", "C/W/L, C(i) = 1 - g(i) for i < k, else 0",
                  "Azzopardi, Mackenzie, Moffat, ICTIR 2021, Eq. 8; `cwl_nerr.py`"),)),
    Family("NERR9", (), "", REQUIRED, params=(_MIN_REL, _MAX_REL), print_order=56.95, state=TOP_K,
           kernel=_C + "_nerr9", irm=("NERR9",),
           rows=(("`NERR9(max_rel=m)@k`", "(none)", "C/W/L, C(i) = i / (i + 1) (1 - g(i)) for i < k, else 0",
                  "ICTIR 2021, Eq. 9"),)),
    Family("NERR10", (), "", NONE, params=(Param("p", "float", 0.9, "[0, 1]", "persistence"), _MIN_REL, _MAX_REL),
           print_order=56.96, kernel=_C + "_nerr10", irm=("NERR10",),
           rows=(("`NERR10(p=x, max_rel=m)`", "(none)", "C/W/L, C(i) = p (1 - g(i)); 1000 ranks; p default 0.9",
                  "ICTIR 2021, Eq. 10"),)),
    Family("NERR11", (), "", NONE, params=(_GOAL, _MIN_REL, _MAX_REL), print_order=56.97, kernel=_C + "_nerr11",
           irm=("NERR11",),
           rows=(("`NERR11(T=t, max_rel=m)`", "(none)", "C/W/L, C(i) = ((i + 2T - 1) / (i + 2T))^2 (1 - g(i)); 1000 "
                  "ranks; T default 1", "ICTIR 2021, Eq. 11"),)),
    Family("Compat", (), "", NONE, params=(Param("p", "float", 0.95, "[0, 1]", "RBO's persistence"),
                                           Param("normalize", "bool", True, (True, False),
                                                 "divided by the ideal ranking's own RBO")),
           print_order=56.98, kernel=_C + "_compat", irm=("Compat",),
           rows=(("`Compat(p=x)`", "(none)", "rank-biased overlap (to depth max(ranked, positive judgments)) of the "
                  "run with the ideal ranking (positive judgments by decreasing grade), / the ideal's own RBO; p "
                  "default 0.95", "Clarke, Vtyurina, Smucker, TOIS 2021; ir_measures `compat_provider.py`"),)),
    Family("Accuracy", (), "", OPTIONAL,
           params=(Param("rel", "int", 1, "an integer of at least 1", "relevance level: a grade >= rel is relevant; "
                         "unjudged documents are not (ir_measures' rel=)"),),
           print_order=56.99, state=TOP_K, kernel=_C + "_accuracy", irm=("Accuracy",),
           rows=(("`Accuracy(rel=r)[@k]`", "(none)", "among the top k (all ranked without k): 1 - (sum over the "
                  "relevant documents of the non-relevant ones above each) / (relevant x non-relevant); 1 with no "
                  "non-relevant "
                  "one there, 0 with no relevant one (ir_measures: no value, the query left out of its mean)",
                  "ir_measures `accuracy_provider.py`"),)),
    # trec_eval's string measure: `streameval trec-eval` only (trec_names.relstring)
    Family("relstring", (), "relstring[.N]", trec_name="relstring", print_order=12, trec_sets=("all_trec",),
           trec_defaults=(10,), kernel=_T + "relstrings", parsed=False),
)

#: family name -> record
BY_NAME = {f.name: f for f in REGISTRY}
assert len(BY_NAME) == len(REGISTRY), "a family declared twice"


def family(name: str) -> Family:
    """The record of family ``name``; KeyError for an unknown one."""
    return BY_NAME[name]


def print_rank(name: str, cut: bool = False) -> float:
    """Where trec-eval prints family ``name`` (its cutoff versions when ``cut``): trec_eval's measure
    table order (measures.c). Raises KeyError for an unknown family."""
    f = BY_NAME[name]
    if cut and f.cut_print_order is not None:
        return f.cut_print_order
    return f.print_order


def _print_order() -> tuple:
    rows = [(f.print_order, f.name) for f in REGISTRY]
    rows += [(f.cut_print_order, f.trec_cut_name) for f in REGISTRY if f.cut_print_order is not None]
    return tuple(n for _, n in sorted(rows))


#: the families (and ``map_cut``, ``ndcg_cut``) in the order trec-eval prints them
TREC_PRINT_ORDER = _print_order()


def accepted() -> str:
    """The accepted forms of every parsed family, ``" | "``-joined (:data:`streameval.metrics.names.ACCEPTED`,
    with ir_measures' spellings; since issue 42 the errors name the three closest names instead)."""
    ours = [f.forms for f in REGISTRY if f.parsed and f.forms and not f.trec_kind]
    trec = [f.forms for f in REGISTRY if f.parsed and f.forms and f.trec_kind]
    return " | ".join(ours + ["all_trec official", " ".join(trec)])


def needs_every_item(spec) -> bool:
    """True when scoring ``spec`` (a MetricSpec) reads every served item: its family's state is
    ``"all"``, or it is ``"top_k"`` and ``spec`` has no cutoff."""
    state = _state(spec.family)
    if state == NO_ITEMS:
        return False
    return state == ALL_ITEMS or spec.k is None


def _state(name: str) -> str:
    # a family the registry does not declare (yet) is read as a cutoff measure: all items without k
    f = BY_NAME.get(name)
    return f.state if f is not None else TOP_K


def keep_for(specs, ideal: str = "judgments") -> int | None:
    """The top-K served items a set of metric specs needs, or None (keep every served item) when
    one reads every item (:func:`needs_every_item`) or when ``ideal="served"`` (the ideal DCG is
    then built from every served item's grade). A spec's own options (relevance level, gain) do not
    change which items it reads, only its cutoff does; specs that read no item (num_q) need 1."""
    if ideal == "served":
        return None
    reading = [s for s in specs if _state(s.family) != NO_ITEMS]
    if any(needs_every_item(s) for s in reading):
        return None
    return max((s.k for s in reading), default=1)


def kernel_function(f: Family):
    """The scoring function ``f.kernel`` names (imported on demand: the kernel imports this module)."""
    module, _, name = f.kernel.partition(":")
    return getattr(importlib.import_module(f"streameval.metrics.{module}"), name)


_HEADER = "| name (as written) | trec_eval name | definition | source |\n| --- | --- | --- | --- |\n"


def markdown_table() -> str:
    """docs/metrics.md's measures table, one row per documented form, in registry order."""
    return _HEADER + "".join("".join(f"| {c} " if c else "| " for c in r) + "|\n" for f in REGISTRY for r in f.rows)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m streameval.metrics.registry",
                                description="Print the ranking measure registry.")
    p.add_argument("--markdown", action="store_true", help="docs/metrics.md's measures table")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown_table(), end="")
    else:
        for f in REGISTRY:
            print(f"{f.name:24s} cutoff={f.cutoff:8s} average={f.average:9s} state={f.state:5s} {f.kernel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
