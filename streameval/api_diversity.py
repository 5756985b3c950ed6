"""``streameval.evaluate`` for diversity measures (alpha-nDCG@k, ERR-IA@k, NRBP, P-IA@k, MAP-IA,
S-recall@k): qrels with a subtopic per judgment, scored as ndeval does
(:mod:`streameval.metrics.diversity`).

Diversity qrels may be given as:

* a path to a TREC diversity qrels file (``qid subtopic docno grade``,
  :func:`streameval.io.trec_subtopics.read_diversity_qrels`) or a ``DiversityQrels``;
* a dict ``{qid: {subtopic: {docno: grade}}}``;
* a pandas DataFrame with a query column (``q_id`` / ``query_id`` / ``qid``), a subtopic column
  (``subtopic`` / ``subtopic_id`` / ``iteration`` / ``intent``), a document column (``doc_id`` /
  ``docno`` / ``item_id`` / ``doc``) and a grade column (``rel`` / ``grade`` / ``relevance`` /
  ``label`` / ``score``);
* records with ``query_id``, ``doc_id``, ``relevance`` and ``subtopic_id`` or ``iteration``
  attributes (pyndeval's ``SubtopicQrel``, ir_datasets' TREC Web diversity qrels), or
  ``(qid, subtopic, docno, grade)`` tuples;
* a tuple of four arrays ``(qid, subtopic, docno, grade)``.

A (query, subtopic, document) judged twice is a ValueError naming it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .metrics.diversity import evaluate_lists, parse_diversity

__all__ = ["diversity_qrels_columns", "order_run", "evaluate_diversity"]

_Q_COLS = ("q_id", "query_id", "qid")
_S_COLS = ("subtopic", "subtopic_id", "iteration", "intent")
_D_COLS = ("doc_id", "docno", "item_id", "doc")
_G_COLS = ("rel", "grade", "relevance", "label", "score")
_SHAPE = ("diversity measures need subtopic judgments: a TREC diversity qrels path (qid subtopic docno grade), "
          "{qid: {subtopic: {docno: grade}}}, a DataFrame with a subtopic column, records with subtopic_id or "
          "iteration, or (qid, subtopic, docno, grade) arrays")


def _text(values) -> np.ndarray:
    arr = np.asarray([str(v) for v in values] if not isinstance(values, np.ndarray) else values)
    return arr if arr.dtype.kind == "U" else arr.astype(str)


def _grades(values) -> np.ndarray:
    try:
        g = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"diversity qrels grades must be numbers: {e}") from None
    if g.size and not np.isfinite(g).all():
        raise ValueError("diversity qrels grades must be finite numbers")
    return g


def _pick(df, names, what):
    for n in names:
        if n in df.columns:
            return df[n].to_numpy()
    if what == "subtopic":
        raise ValueError(f"{_SHAPE}; this DataFrame has no subtopic column (one of {', '.join(names)}): "
                         f"columns {list(df.columns)}")
    raise ValueError(f"diversity qrels DataFrame has no {what} column (expected one of {', '.join(names)}); "
                     f"has {list(df.columns)}")


def diversity_qrels_columns(obj):
    """``(qid, subtopic, docno, grade)`` arrays (str, str, str, float64) of any accepted input (module
    docstring). Raises ValueError / TypeError (one line) for judgments without subtopics, a repeated
    (query, subtopic, document) or an input it cannot read; TrecFormatError for a malformed file."""
    from .io.trec_subtopics import DiversityQrels, first_repeat, read_diversity_qrels

    if isinstance(obj, (str, os.PathLike)):
        obj = read_diversity_qrels(obj)  # refuses repeats with their lines
        return obj.qid, obj.subtopic, obj.docno, obj.grade.astype(np.float64)
    if isinstance(obj, DiversityQrels):
        cols = (obj.qid, obj.subtopic, obj.docno, obj.grade)
    elif isinstance(obj, dict):
        q, s, d, g = [], [], [], []
        for qid, subs in obj.items():
            if not isinstance(subs, dict) or any(not isinstance(v, dict) for v in subs.values()):
                raise TypeError(f"{_SHAPE}; the dict's query {qid!r} is not {{subtopic: {{docno: grade}}}}")
            for sub, docs in subs.items():
                for doc, grade in docs.items():
                    q.append(str(qid))
                    s.append(str(sub))
                    d.append(str(doc))
                    g.append(grade)
        cols = (q, s, d, g)
    elif hasattr(obj, "columns") and hasattr(obj, "to_numpy"):
        cols = (_pick(obj, _Q_COLS, "query id"), _pick(obj, _S_COLS, "subtopic"), _pick(obj, _D_COLS, "document id"),
                _pick(obj, _G_COLS, "grade"))
    elif isinstance(obj, tuple) and len(obj) == 4 and all(hasattr(c, "__len__") and not isinstance(c, str)
                                                          for c in obj):
        cols = obj
    elif hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes)):
        q, s, d, g = [], [], [], []
        for i, r in enumerate(obj):
            if hasattr(r, "query_id") and hasattr(r, "doc_id"):
                sub = getattr(r, "subtopic_id", getattr(r, "iteration", None))
                if sub is None:
                    raise ValueError(f"{_SHAPE}; qrels item {i} ({type(r).__name__}) has no subtopic_id or "
                                     "iteration")
                q.append(r.query_id)
                s.append(sub)
                d.append(r.doc_id)
                g.append(r.relevance)
            elif isinstance(r, (tuple, list)) and len(r) == 4:
                q.append(r[0])
                s.append(r[1])
                d.append(r[2])
                g.append(r[3])
            else:
                raise TypeError(f"{_SHAPE}; qrels item {i} is a {type(r).__name__}")
        cols = (q, s, d, g)
    else:
        raise TypeError(f"{_SHAPE}; got a {type(obj).__name__}")
    q, s, d = (_text(c) for c in cols[:3])
    g = _grades(cols[3])
    if not len(q) == len(s) == len(d) == len(g):
        raise ValueError("diversity qrels arrays have different lengths")
    rep = first_repeat(q, s, d)
    if rep is not None:
        r = rep[0]
        raise ValueError(f"diversity qrels: docno {str(d[r])!r} judged twice for subtopic {str(s[r])!r} of query "
                         f"{str(q[r])!r}")
    return q, s, d, g


def order_run(rq, rd, rs, depth: int | None = None):
    """Indices putting a run in trec_eval's (and ``ndeval -traditional``'s) order: per query, score
    descending (compared as doubles, as ndeval reads them), ties by docno descending (byte order);
    then the top ``depth`` of each query. Queries come in byte order."""
    rq, rd = np.asarray(rq), np.asarray(rd)
    rs = np.asarray(rs, dtype=np.float64)
    if len(rq) == 0:
        return np.zeros(0, dtype=np.intp)
    _, dcode = np.unique(rd, return_inverse=True)
    order = np.lexsort((-dcode.reshape(-1), -rs, rq))
    if depth is not None:
        qs = rq[order]
        start = np.searchsorted(qs, qs, side="left")
        order = order[np.arange(len(qs)) - start < depth]
    return order


def evaluate_diversity(qrels, run, names, *, per_query=False, relevance_level: float = 1,
                       complete: bool = False, depth: int | None = None, warn: bool = True):
    """The :class:`~streameval.api.Evaluation` of diversity measure ``names`` (see
    :func:`streameval.evaluate`). Queries: those with both judgments and results (``complete``: every
    judged query, those without results scoring 0, as ``ndeval -c``); means are plain means over them."""
    from .api import Evaluation, _columns, aggregate
    from .metrics.names import MetricNameError, MetricSpec

    specs = []
    for n in names:
        sp = parse_diversity(n)
        if sp is None:
            raise MetricNameError(f"metric {n!r} is not a diversity measure")
        if sp not in specs:
            specs.append(sp)
    if depth is not None and (isinstance(depth, bool) or int(depth) != depth or depth < 1):
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    jq, js, jd, jg = diversity_qrels_columns(qrels)
    rq, rd, rs = _columns(run, "run")
    rq, rd = np.asarray(rq).astype(str), np.asarray(rd).astype(str)
    if len(rq) and not np.isfinite(rs).all():
        raise ValueError("run scores must be finite numbers")
    if len(rq) > 1:
        _, first = np.unique(np.char.add(np.char.add(rq, "\x00"), rd), return_index=True)
        if len(first) != len(rq):
            extra = int(np.setdiff1d(np.arange(len(rq)), first)[0])
            raise ValueError(f"run: docno {str(rd[extra])!r} ranked twice for query {str(rq[extra])!r}")
    order = order_run(rq, rd, rs, depth)
    rq, rd = rq[order], rd[order]
    judged_q, run_q = np.unique(jq), np.unique(rq)
    qids = judged_q if complete else np.intersect1d(judged_q, run_q)
    without = np.setdiff1d(run_q, judged_q)
    if warn and len(without):
        warnings.warn(f"{len(without)} run queries have no judgments and are left out of the averages "
                      f"(first: {str(without[0])!r})", stacklevel=3)
    qids, values = evaluate_lists(jq, js, jd, jg, rq, rd, specs, qids=qids, relevance_level=relevance_level)
    mean_spec = MetricSpec("P", 1)  # an arithmetic mean
    means = {sp.name: aggregate(values[i], mean_spec) for i, sp in enumerate(specs)}
    table = None
    if per_query:
        names_ = [sp.name for sp in specs]
        if per_query == "pandas":
            import pandas as pd

            table = pd.DataFrame(values.T, index=pd.Index([str(q) for q in qids], name="query_id"), columns=names_)
        else:
            table = {str(q): {n: float(values[i, j]) for i, n in enumerate(names_)} for j, q in enumerate(qids)}
    return Evaluation(means=means, per_query=table, num_queries=len(qids))
