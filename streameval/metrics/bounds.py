"""Which metric rows are means of values in [0, 1] (for intervals that stay in the range,
:func:`streameval.metrics.stats.row_interval`).

A ranking metric is bounded when its family's per-query value lies in [0, 1] for non-negative
grades (trec_eval 10's definitions: precision, recall, success, reciprocal rank, AP, R-precision,
bpref, nDCG, ERR, the set_* measures, interpolated precision, RBP, the unjudged fraction); the online
ones are AUC (exact and histogram), GAUC, the first click's reciprocal rank, abandonment, the Brier
score and SNIPS (a weighted mean of clicks). Not bounded: counts (``num_*``, ``hits@k``,
``clicks@k``), DCG, utility, IPS (a weight times a click can exceed 1), log loss, the dwell times.
With negative grades nDCG can leave [0, 1]: a row whose value is outside (0, 1) keeps its t interval.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["UNIT_RANKING_FAMILIES", "UNIT_ONLINE_FAMILIES", "is_unit_metric"]

#: ranking families (:mod:`~streameval.metrics.registry`) whose per-query value is in [0, 1]
UNIT_RANKING_FAMILIES = frozenset({
    "P", "recall", "success", "recip_rank", "map", "Rprec", "bpref", "ndcg", "err", "judged",
    "iprec_at_recall", "11pt_avg", "set_P", "set_relative_P", "set_recall", "set_map", "set_F", "relative_P",
    "rbp", "unj"})
#: online families (:mod:`~streameval.metrics.online_names`) whose value is in [0, 1]
UNIT_ONLINE_FAMILIES = frozenset({"auc", "auc_hist", "gauc", "rr_first_click", "abandonment", "brier", "pr_auc",
                                  "precision", "recall", "f1"})


@lru_cache(maxsize=4096)
def is_unit_metric(metric: str) -> bool:
    """True when the row ``metric`` (a name as the jobs write it: ``ndcg@10``, ``auc``,
    ``gauc[user,impressions]``, ``snips[random]``) is a mean of values in [0, 1]."""
    from .names import parse_metric
    from .online_names import parse_online_metric

    if metric.startswith("snips["):
        return True
    try:
        specs = parse_metric(metric)
    except ValueError:
        specs = None
    if specs:
        return len(specs) == 1 and specs[0].family in UNIT_RANKING_FAMILIES
    try:
        return parse_online_metric(metric).family in UNIT_ONLINE_FAMILIES
    except ValueError:
        return False
