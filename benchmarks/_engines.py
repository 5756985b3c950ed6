"""The engines benchmarks/run.py compares, each written the usual way for that library.

Ranking, from in-memory arrays (integer ids; each engine builds whatever input it needs, and that
is timed): NDCG@10, MAP, MRR@10, P@10 and recall@100, trec_eval's definitions where the engine has
them. ``ranking_<engine>(a)`` returns {metric: mean}; ``ranking_<engine>_per_query(a)`` returns
{metric: {query id (int): value}} for the agreement check.

Conventions that differ, and how the agreement check compares them:

* pytrec_eval has no MRR@10 (``recip_rank`` is uncut): compared on queries whose first relevant
  document is in the top 10, where the two are equal by definition.
* torchmetrics only sees the retrieved documents: its ideal DCG is built from the retrieved
  documents' grades (streameval ``ideal="served"``), its AP divides by the relevant documents
  retrieved (streameval map * num_rel / num_rel_ret) and so does its recall (recall@100 * num_rel /
  num_rel_ret); targets of MAP/MRR/P/recall must be binary (grade >= 1).
"""

from __future__ import annotations

import math

import numpy as np

MEANS = ("ndcg@10", "map", "mrr@10", "P@10", "recall@100")
TREC_MEASURES = {"ndcg_cut.10": "ndcg@10", "map": "map", "recip_rank": "mrr@10", "P.10": "P@10",
                 "recall.100": "recall@100"}
TREC_KEYS = {"ndcg_cut_10": "ndcg@10", "map": "map", "recip_rank": "mrr@10", "P_10": "P@10",
             "recall_100": "recall@100"}


def _cols(a):
    return (a[k] for k in ("rq", "rd", "rs", "jq", "jd", "jg"))


# ---- streameval ---------------------------------------------------------------------------

def ranking_streameval(a):
    from streameval.api import evaluate

    rq, rd, rs, jq, jd, jg = _cols(a)
    return dict(evaluate((jq, jd, jg), (rq, rd, rs), list(MEANS)).means)


def ranking_streameval_per_query(a, ideal="judgments", extra=()):
    from streameval.api import score_queries

    rq, rd, rs, jq, jd, jg = _cols(a)
    specs, prep, values = score_queries((jq, jd, jg), (rq, rd, rs), list(MEANS) + list(extra), ideal=ideal,
                                        warn=False)
    qids = [int(q) for q in prep.qids]
    return {s.name: dict(zip(qids, values[i].tolist())) for i, s in enumerate(specs)}


# ---- pytrec_eval ----------------------------------------------------------------------------

def _pytrec_eval_run(a):
    import pytrec_eval

    rq, rd, rs, jq, jd, jg = _cols(a)
    qrels: dict = {}
    for q, d, g in zip(jq.tolist(), jd.tolist(), jg.tolist()):
        qrels.setdefault(str(q), {})[str(d)] = int(g)
    run: dict = {}
    for q, d, s in zip(rq.tolist(), rd.tolist(), rs.tolist()):
        run.setdefault(str(q), {})[str(d)] = float(s)
    return pytrec_eval.RelevanceEvaluator(qrels, set(TREC_MEASURES)).evaluate(run)


def _trec_means(res) -> dict:
    return {v: math.fsum(r[k] for r in res.values()) / len(res) for k, v in TREC_KEYS.items()}


def ranking_pytrec_eval(a):
    return _trec_means(_pytrec_eval_run(a))


def ranking_pytrec_eval_per_query(a):
    res = _pytrec_eval_run(a)
    return {v: {int(q): r[k] for q, r in res.items()} for k, v in TREC_KEYS.items()}


# ---- ranx -------------------------------------------------------------------------------------

RANX = {"ndcg@10": "ndcg@10", "map": "map", "mrr@10": "mrr@10", "P@10": "precision@10", "recall@100": "recall@100"}


def _ranx_inputs(a):
    import pandas as pd
    from ranx import Qrels, Run

    rq, rd, rs, jq, jd, jg = _cols(a)
    # ranx asserts object (Python str) id columns; pandas 3 infers its own `str` dtype from an object
    # array of strings, so the columns are built as object Series explicitly
    def ids(x):
        return pd.Series(x.astype(str).astype(object), dtype=object)

    qrels = Qrels.from_df(pd.DataFrame({"q_id": ids(jq), "doc_id": ids(jd), "score": jg.astype(np.int64)}))
    run = Run.from_df(pd.DataFrame({"q_id": ids(rq), "doc_id": ids(rd), "score": rs}))
    return qrels, run


def ranking_ranx(a):
    from ranx import evaluate

    qrels, run = _ranx_inputs(a)
    out = evaluate(qrels, run, list(RANX.values()), make_comparable=True)
    return {k: float(out[v]) for k, v in RANX.items()}


def ranking_ranx_per_query(a):
    from ranx import evaluate

    qrels, run = _ranx_inputs(a)
    evaluate(qrels, run, list(RANX.values()), make_comparable=True)
    return {k: {int(q): float(s) for q, s in run.scores[v].items()} for k, v in RANX.items()}


# ---- ir_measures --------------------------------------------------------------------------------

def _irm(a):
    import ir_measures
    import pandas as pd
    from ir_measures import AP, RR, P, R, nDCG

    rq, rd, rs, jq, jd, jg = _cols(a)
    qrels = pd.DataFrame({"query_id": jq.astype(str), "doc_id": jd.astype(str), "relevance": jg.astype(np.int64)})
    run = pd.DataFrame({"query_id": rq.astype(str), "doc_id": rd.astype(str), "score": rs})
    measures = {"ndcg@10": nDCG @ 10, "map": AP, "mrr@10": RR @ 10, "P@10": P @ 10, "recall@100": R @ 100}
    return ir_measures, measures, qrels, run


def ranking_ir_measures(a):
    irm, measures, qrels, run = _irm(a)
    out = irm.calc_aggregate(list(measures.values()), qrels, run)
    return {k: float(out[m]) for k, m in measures.items()}


def ranking_ir_measures_per_query(a):
    irm, measures, qrels, run = _irm(a)
    name = {str(m): k for k, m in measures.items()}
    out: dict = {k: {} for k in measures}
    for r in irm.iter_calc(list(measures.values()), qrels, run):
        out[name[str(r.measure)]][int(r.query_id)] = float(r.value)
    return out


# ---- torchmetrics ---------------------------------------------------------------------------------

def _torch_inputs(a):
    """The run joined to its grades (pandas merge, unjudged 0), as tensors."""
    import pandas as pd
    import torch

    rq, rd, rs, jq, jd, jg = _cols(a)
    run = pd.DataFrame({"q": rq, "d": rd, "s": rs})
    qrels = pd.DataFrame({"q": jq, "d": jd, "g": jg})
    joined = run.merge(qrels, on=["q", "d"], how="left")
    grade = joined["g"].fillna(0).to_numpy(np.int64)
    return (torch.from_numpy(joined["s"].to_numpy(np.float64)), torch.from_numpy(grade),
            torch.from_numpy(joined["q"].to_numpy(np.int64)))


def ranking_torchmetrics(a):
    from torchmetrics.retrieval import (RetrievalMAP, RetrievalMRR, RetrievalNormalizedDCG, RetrievalPrecision,
                                        RetrievalRecall)

    preds, grade, idx = _torch_inputs(a)
    rel = grade >= 1
    out = {"ndcg@10": RetrievalNormalizedDCG(top_k=10)(preds, grade, indexes=idx)}
    out["map"] = RetrievalMAP()(preds, rel, indexes=idx)
    out["mrr@10"] = RetrievalMRR(top_k=10)(preds, rel, indexes=idx)
    out["P@10"] = RetrievalPrecision(top_k=10)(preds, rel, indexes=idx)
    out["recall@100"] = RetrievalRecall(top_k=100)(preds, rel, indexes=idx)
    return {k: float(v) for k, v in out.items()}


def ranking_torchmetrics_per_query(a):
    import torch
    from torchmetrics.functional.retrieval import (retrieval_average_precision, retrieval_normalized_dcg,
                                                   retrieval_precision, retrieval_recall,
                                                   retrieval_reciprocal_rank)

    preds, grade, idx = _torch_inputs(a)
    order = torch.argsort(idx, stable=True)
    preds, grade, idx = preds[order], grade[order], idx[order]
    qs, counts = torch.unique_consecutive(idx, return_counts=True)
    out: dict = {k: {} for k in MEANS}
    for q, p, g in zip(qs.tolist(), torch.split(preds, counts.tolist()), torch.split(grade, counts.tolist())):
        r = g >= 1
        out["ndcg@10"][q] = float(retrieval_normalized_dcg(p, g, top_k=10))
        out["map"][q] = float(retrieval_average_precision(p, r)) if r.any() else 0.0
        out["mrr@10"][q] = float(retrieval_reciprocal_rank(p, r, top_k=10)) if r.any() else 0.0
        out["P@10"][q] = float(retrieval_precision(p, r, top_k=10)) if r.any() else 0.0
        out["recall@100"][q] = float(retrieval_recall(p, r, top_k=100)) if r.any() else 0.0
    return out


def torchmetrics_expected(a) -> dict:
    """streameval's per-query values in torchmetrics' conventions (see the module docstring)."""
    ours = ranking_streameval_per_query(a, extra=("num_rel", "num_rel_ret"))
    served = ranking_streameval_per_query(a, ideal="served")
    out = {"ndcg@10": served["ndcg@10"], "mrr@10": ours["mrr@10"], "P@10": ours["P@10"], "map": {},
           "recall@100": {}}
    for q, nr in ours["num_rel"].items():
        nrr = ours["num_rel_ret"][q]
        scale = nr / nrr if nrr else 0.0
        out["map"][q] = ours["map"][q] * scale
        out["recall@100"][q] = ours["recall@100"][q] * scale
    return out


RANKING = {
    "streameval": (ranking_streameval, ranking_streameval_per_query),
    "pytrec_eval": (ranking_pytrec_eval, ranking_pytrec_eval_per_query),
    "ranx": (ranking_ranx, ranking_ranx_per_query),
    "ir_measures": (ranking_ir_measures, ranking_ir_measures_per_query),
    "torchmetrics": (ranking_torchmetrics, ranking_torchmetrics_per_query),
}
#: the package each peer needs (pip name), for the skip message
PEER_PACKAGES = {"pytrec_eval": "pytrec-eval-terrier", "ranx": "ranx", "ir_measures": "ir-measures",
                 "torchmetrics": "torch torchmetrics", "sklearn": "scikit-learn", "pandas": "pandas"}


# ---- AUC and GAUC ----------------------------------------------------------------------------------

def auc_streameval(a):
    from streameval.metrics.online import auc_score

    return auc_score(a["score"], a["click"])


def auc_sklearn(a):
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(a["click"], a["score"]))


def gauc_streameval(a):
    from streameval.metrics.online import gauc

    return gauc(a["user"], a["score"], a["click"], "impressions")[0]


def group_auc_streameval(a) -> dict:
    from streameval.metrics.online import group_auc

    ids, auc, _, _ = group_auc(a["user"], a["score"], a["click"])
    return {int(i): float(v) for i, v in zip(ids, auc) if not math.isnan(v)}


def _pandas_group_aucs(a):
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    df = pd.DataFrame({"user": a["user"], "score": a["score"], "click": a["click"]})

    def one(d):
        return roc_auc_score(d["click"], d["score"]) if d["click"].nunique() == 2 else np.nan

    aucs = df.groupby("user")[["score", "click"]].apply(one)
    sizes = df.groupby("user").size()
    return aucs, sizes


def gauc_pandas(a):
    aucs, sizes = _pandas_group_aucs(a)
    ok = aucs.notna()
    return float((aucs[ok] * sizes[ok]).sum() / sizes[ok].sum())


def group_auc_pandas(a) -> dict:
    aucs, _ = _pandas_group_aucs(a)
    return {int(i): float(v) for i, v in aucs.items() if not math.isnan(v)}
