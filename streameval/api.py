"""``streameval.evaluate``: score a run against qrels in one call, in the spirit of ranx.

Inputs may be dicts (``{qid: {docno: score}}`` / ``{qid: {docno: grade}}``), paths to TREC run and
qrels files, :class:`~streameval.io.trec.TrecRun` / ``TrecQrels`` objects, or pandas DataFrames
(columns ``q_id``/``query_id``/``qid``, ``doc_id``/``docno``/``item_id``, and ``score`` or
``rel``/``grade``/``relevance``). pandas is optional and only imported when given a DataFrame.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass

import numpy as np

from .metrics.kernel import MetricOptions, compute
from .metrics.names import MetricSpec, parse_metrics
from .metrics.prepare import Prepared, prepare, refuse_nul

__all__ = ["evaluate", "Evaluation", "score_queries", "aggregate"]

_Q_COLS = ("q_id", "query_id", "qid")
_D_COLS = ("doc_id", "docno", "item_id", "doc")
_S_COLS = ("score",)
_G_COLS = ("rel", "grade", "relevance", "label")


def _pick(df, names, what):
    for n in names:
        if n in df.columns:
            return df[n].to_numpy()
    raise ValueError(f"DataFrame has no {what} column (looked for {', '.join(names)}); has {list(df.columns)}")


def _ids(values) -> np.ndarray:
    """Query or document ids as text (``str(id)``), whatever the container: ids order as strings
    (trec_eval's strcmp), so ``10`` sorts before ``2`` from a dict, a DataFrame or a numpy array."""
    if isinstance(values, (list, tuple)) or (isinstance(values, np.ndarray) and values.dtype.kind == "O"):
        refuse_nul(values)  # before numpy drops trailing NULs
    arr = np.asarray(values)
    return arr if arr.dtype.kind == "U" else arr.astype(str)


def _columns(obj, kind: str):
    """(qid, docno, value) arrays from any accepted input; kind is 'run' or 'qrels'."""
    if isinstance(obj, (str, os.PathLike)):
        from .io import trec

        # a run is read with check=True: a NaN score or a repeated document is reported with its line
        # (qrels repeats are left to the judgment_conflicts policy)
        obj = trec.read_run(obj, check=True) if kind == "run" else trec.read_qrels(obj)
    if hasattr(obj, "qid") and hasattr(obj, "docno"):
        val = obj.score if kind == "run" else obj.grade
        qid = obj.qid if hasattr(obj.qid, "blocks") else np.asarray(obj.qid)  # runs of qids: kept so
        return qid, np.asarray(obj.docno), np.asarray(val, dtype=np.float64)
    if isinstance(obj, dict):
        q, d, v = [], [], []
        for qid, docs in obj.items():
            for doc, val in docs.items():
                q.append(str(qid))
                d.append(str(doc))
                v.append(val)
        return _ids(q), _ids(d), np.asarray(v, dtype=np.float64)
    if hasattr(obj, "columns") and hasattr(obj, "to_numpy"):  # pandas DataFrame
        q = _ids(_pick(obj, _Q_COLS, "query id"))
        d = _ids(_pick(obj, _D_COLS, "document id"))
        v = _pick(obj, _S_COLS if kind == "run" else _G_COLS, "score" if kind == "run" else "grade")
        return q, d, np.asarray(v, dtype=np.float64)
    if isinstance(obj, tuple) and len(obj) == 3:  # ids as text, as from every other container
        return _ids(obj[0]), _ids(obj[1]), np.asarray(obj[2], dtype=np.float64)
    raise TypeError(f"cannot read a {kind} from {type(obj).__name__}: give a dict, a TREC file path, "
                    "a TrecRun/TrecQrels, a (qid, docno, value) tuple of arrays or a pandas DataFrame")


#: library policies for two judgments of one (query, document): see :func:`resolve_qrels`
QRELS_CONFLICTS = ("error", "latest", "max")


def _qrels_times(qrels, n):
    """The qrels' judgment times when a DataFrame gives a ``timestamp`` column, else the row order."""
    if hasattr(qrels, "columns") and "timestamp" in getattr(qrels, "columns", ()):
        return np.asarray(qrels["timestamp"].to_numpy(), dtype=np.int64)
    return np.arange(n, dtype=np.int64)


def resolve_qrels(jq, jd, jg, times, policy: str = "error"):
    """One grade per (query, document) of flat qrels arrays under ``policy``.

    ``"error"`` (default, as trec_eval): leave the arrays as they are (:func:`prepare` refuses a pair
    judged twice with a ValueError naming it); ``"latest"``: the judgment with the largest ``times``
    value wins (equal times: the larger grade); ``"max"``: the largest grade wins. ``times``: int
    array of the same length (a ``timestamp`` column, or the row order: the later line wins).
    Returns ``(jq, jd, jg)``. Raises ValueError on an unknown policy. (The jobs' policies, with
    ``reject`` and dead letters, are in :mod:`streameval.io.cleaning`.)
    """
    if policy not in QRELS_CONFLICTS:
        raise ValueError(f"judgment_conflicts must be one of {QRELS_CONFLICTS}, got {policy!r}")
    if policy == "error" or len(jq) == 0:
        return jq, jd, jg
    first = (np.asarray(times), np.asarray(jg)) if policy == "latest" else (np.asarray(jg), np.asarray(times))
    # lexsort: last key primary; sort by (query, doc, primary, secondary) and keep each pair's last row
    order = np.lexsort((first[1], first[0], jd, jq))
    q, d = jq[order], jd[order]
    last = np.ones(len(q), dtype=bool)
    last[:-1] = (q[1:] != q[:-1]) | (d[1:] != d[:-1])
    keep = order[last]
    return jq[keep], jd[keep], jg[keep]


def score_queries(qrels, run, metrics, *, relevance_level: float = 1, gain: str = "linear",
                  ideal: str = "judgments", err_max_grade: float = 4, complete: bool = False,
                  depth: int | None = None, tie_break: str = "docno", score_precision: str = "float32",
                  judgment_conflicts: str = "error",
                  warn: bool = True) -> tuple[list[MetricSpec], Prepared, np.ndarray]:
    """Per-query scores: (specs, prepared lists, scores of shape (len(specs), n_queries)).

    Options are those of :func:`evaluate`. Raises ValueError / MetricNameError on bad input.
    """
    specs = parse_metrics(metrics)
    opts = MetricOptions(relevance_level=relevance_level, gain=gain, ideal=ideal, err_max_grade=err_max_grade)
    rq, rd, rs = _columns(run, "run")
    jq, jd, jg = _columns(qrels, "qrels")
    if judgment_conflicts != "error":
        jq, jd, jg = resolve_qrels(jq, jd, jg, _qrels_times(qrels, len(jq)), judgment_conflicts)
    elif judgment_conflicts not in QRELS_CONFLICTS:
        raise ValueError(f"judgment_conflicts must be one of {QRELS_CONFLICTS}, got {judgment_conflicts!r}")
    prep = prepare(rq, rd, rs, jq, jd, jg, depth=depth, complete=complete, tie_break=tie_break,
                   score_precision=score_precision)
    if warn and len(prep.unjudged_qids):
        warnings.warn(f"{len(prep.unjudged_qids)} run queries have no judgments and are left out of the "
                      f"averages (first: {str(prep.unjudged_qids[0])!r})", stacklevel=3)
    if warn and len(prep.missing_qids) and not complete:
        warnings.warn(f"{len(prep.missing_qids)} judged queries have no results and are skipped "
                      "(pass complete=True to score them 0, as trec_eval -c)", stacklevel=3)
    return specs, prep, compute(prep.lists, specs, opts)


def aggregate(values: np.ndarray, spec: MetricSpec) -> float:
    """The summary of one metric over queries: the mean (exactly rounded sum / count, the rule the
    mergeable accumulators use, so batch, stream and library agree to the bit), the total for
    num_ret / num_rel / num_rel_ret / num_nonrel_judged_ret as trec_eval prints them, or for gm_map /
    gm_bpref (``spec.average == "geometric"``) trec_eval's geometric mean, exp of the mean log of the
    per-query values (floored at 0.00001). No queries: NaN."""
    if len(values) == 0:
        return math.nan
    if spec.average == "geometric":
        return math.exp(math.fsum(math.log(v) for v in values.tolist()) / len(values))
    total = math.fsum(values.tolist())
    return total if spec.is_count else total / len(values)


@dataclass
class Evaluation:
    """Result of :func:`evaluate`: ``means`` {metric name: value}; ``per_query`` (on request) a
    DataFrame indexed by query id with one column per metric (a dict of dicts without pandas)."""

    means: dict
    per_query: object = None
    num_queries: int = 0

    def __getitem__(self, name):
        return self.means[name]

    def __iter__(self):
        return iter(self.means)


def evaluate(qrels, run, metrics, *, per_query: bool = False, relevance_level: float = 1,
             gain: str = "linear", ideal: str = "judgments", err_max_grade: float = 4,
             complete: bool = False, depth: int | None = None, tie_break: str = "docno",
             score_precision: str = "float32", judgment_conflicts: str = "error"):
    """Score ``run`` against ``qrels`` on ``metrics`` (names as users write them: ``"ndcg@10"``,
    ``"map"``, ``"mrr@10"``, ``"P_5"``; a single name or a list).

    Options (defaults are trec_eval's; see docs/metrics.md): ``relevance_level`` (``-l``), ``gain``
    (``"linear"`` | ``"exponential"``), ``ideal`` (``"judgments"`` | ``"served"``), ``err_max_grade``,
    ``complete`` (``-c``: judged queries without results score 0), ``depth`` (``-M``),
    ``tie_break`` (``"docno"``), ``score_precision`` (``"float32"``: scores compared in single
    precision as trec_eval stores them; ``"float64"``), ``judgment_conflicts`` (``"error"``: a
    (query, document) judged twice raises, as in trec_eval; ``"latest"``: the later judgment by the
    DataFrame's ``timestamp`` column or by row order; ``"max"``: the larger grade; :func:`resolve_qrels`).

    Returns a float when one metric name is given and ``per_query`` is False, else an
    :class:`Evaluation` with ``means`` ({name: value}) and, when ``per_query``, per-query scores.
    Run queries without any judgment are left out (a warning says how many).
    Raises MetricNameError (ValueError) for unknown names, ValueError for malformed input.
    """
    specs, prep, values = score_queries(qrels, run, metrics, relevance_level=relevance_level, gain=gain,
                                        ideal=ideal, err_max_grade=err_max_grade, complete=complete,
                                        depth=depth, tie_break=tie_break, score_precision=score_precision,
                                        judgment_conflicts=judgment_conflicts)
    means = {s.name: aggregate(values[i], s) for i, s in enumerate(specs)}
    if isinstance(metrics, str) and len(specs) == 1 and not per_query:
        return means[specs[0].name]
    table = None
    if per_query:
        qids = [str(q) for q in prep.qids]
        try:
            import pandas as pd
        except ImportError:
            table = {q: {s.name: float(values[i, j]) for i, s in enumerate(specs)} for j, q in enumerate(qids)}
        else:
            table = pd.DataFrame(values.T, index=pd.Index(qids, name="query_id"), columns=[s.name for s in specs])
    return Evaluation(means=means, per_query=table, num_queries=len(prep.qids))
