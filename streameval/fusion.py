"""``streameval.fuse``: rank fusion of several runs, as ranx's ``fuse`` (its methods and normalisations;
definitions in :mod:`streameval.metrics.fusion` and docs/metrics.md, "Rank fusion").

``fuse([run_a, run_b], method="rrf")`` takes runs in any form :func:`streameval.evaluate` reads
(dicts of dicts, TREC run files, ranx ``Run`` objects, ir_measures records, DataFrames, (qid, docno,
score) arrays) and returns a :class:`FusedRun`: the dict of dicts ranx's ``Run.to_dict()`` gives
(``{qid: {docno: score}}``, queries in id order, documents by score), which ``evaluate()`` accepts as
a run, with the same rows as arrays (:meth:`FusedRun.arrays`) and as a TREC run file
(:meth:`FusedRun.write_trec`). Imports no Beam.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import numpy as np

from .api import evaluate, qrels_columns, run_columns
from .metrics.fusion import (METHODS, NORMS, TRAINED, FusedColumns, FusionNameError, fuse_columns, method_name,
                             norm_name, train_columns)

__all__ = ["fuse", "train", "optimize", "Trial", "FusedRun", "FusionNameError", "METHODS", "NORMS", "TRAINED",
           "SEARCHED", "method_name"]

#: the methods :func:`optimize` searches a grid for (ranx's ``optimize_fusion``), and the grid's parameter
SEARCHED = {"wsum": "weights", "wmnz": "weights", "w_bordafuse": "weights", "w_condorcet": "weights",
            "mixed": "weights", "rrf": "k", "combgmnz": "gamma", "logn_isr": "sigma", "rbc": "phi",
            "probfuse": "n_segments", "slidefuse": "w"}


class FusedRun(dict):
    """A fused run: ``{qid: {docno: score}}`` (queries in id order, documents by fused score
    descending, ties by docno descending), with the rows as fused in :attr:`columns`
    (:class:`~streameval.metrics.fusion.FusedColumns`: ``qid``, ``docno``, ``score``, ``rank``);
    editing the dict does not change them."""

    def __init__(self, columns: FusedColumns, method: str, norm: str):
        super().__init__()
        for q, d, s in zip(columns.qid.tolist(), columns.docno.tolist(), columns.score.tolist()):
            docs = self.get(q)
            if docs is None:
                docs = self[q] = {}
            docs[d] = s
        self.columns = columns
        self.method = method
        self.norm = norm

    def arrays(self):
        """(qid, docno, score) numpy arrays, one entry per fused document, in the dict's order."""
        return self.columns.qid, self.columns.docno, self.columns.score

    def to_trec_run(self, tag: str = "fused"):
        """The rows as a :class:`streameval.io.trec.TrecRun` (ranks from 1 per query)."""
        from .io.trec import TrecRun

        c = self.columns
        return TrecRun(c.qid, c.docno, c.score, c.rank, tag)

    def write_trec(self, path: str | os.PathLike, tag: str = "fused") -> None:
        """Write a TREC run file (``qid Q0 docno rank score tag``; ``.gz`` compressed by its name)."""
        from .io.trec import write_run

        write_run(path, self.to_trec_run(tag))


def fuse(runs, method: str = "rrf", norm: str | None = "min-max", *, params: dict | None = None,
         columns: dict | None = None, **kwargs) -> FusedRun:
    """Fuse ``runs`` (a list or tuple of two or more runs, each in any form :func:`streameval.evaluate`
    reads) into one :class:`FusedRun`.

    ``method``: ``rrf`` (default; parameter ``k``, default 60), ``isr``, ``log_isr``, ``logn_isr``
    (``sigma``, 0.01), ``combsum``, ``combmnz``, ``combmax``, ``combmin``, ``combmed``, ``combanz``,
    ``combgmnz`` (``gamma``, required), ``wsum`` and ``wmnz`` (``weights``, one per run, required),
    ``bordafuse``, ``w_bordafuse`` (``weights``), ``rbc`` (``phi``, required), ``condorcet``,
    ``w_condorcet`` (``weights``), ``mixed`` (``weights``), and the methods trained by :func:`train`:
    ``posfuse``, ``probfuse``, ``segfuse`` (``probs``), ``slidefuse`` (``probs`` and ``w``, the window's
    half width, required), ``mapfuse`` (``map_scores``), ``bayesfuse`` (``log_odds``); ranx's spellings
    (``sum``, ``mnz``, ``comb_sum``, ``weighted_condorcet``, ...) are accepted too.
    ``norm``: ``min-max`` (ranx.fuse's default), ``min-max-inverted``, ``max``, ``sum``, ``zmuv``,
    ``rank``, ``borda``, or ``None`` / ``"none"``. Parameters go in ``params`` (as ranx) or as keyword
    arguments: ``fuse(runs, "rrf", k=10)``. ``columns``: DataFrames' column names by role, as in
    ``evaluate()``.

    Ranks within a run follow trec_eval's order (score descending, docno descending on ties), so runs
    with tied scores can fuse differently from ranx, whose tie order is that of an unstable sort; a
    query missing from some runs is fused from the runs that have it (ranx requires the same queries).
    Raises FusionNameError (a ValueError naming the closest names) for an unknown method,
    normalisation or parameter; ValueError for fewer than two runs, a missing required parameter,
    a document twice in one query of a run or a score that is not a finite number; TypeError for a
    run of a type it cannot read.
    """
    if not isinstance(runs, (list, tuple)):
        raise TypeError(f"runs is a list or tuple of runs, got {type(runs).__name__}")
    given = dict(params or {})
    overlap = set(given) & set(kwargs)
    if overlap:
        raise ValueError(f"parameter {sorted(overlap)[0]!r} given both in params and as a keyword")
    given.update(kwargs)
    m, n = method_name(method), norm_name(norm)  # names checked before any run is read
    arrays = [run_columns(r, columns) for r in runs]
    return FusedRun(fuse_columns(arrays, m, n, given), m, n)


def train(qrels, runs, method: str, norm: str | None = "min-max", *, n_segments: int | None = None,
          relevance_level: float = 1, columns: dict | None = None) -> dict:
    """The parameters of a trained method (:data:`TRAINED`: ``posfuse``, ``probfuse``, ``mapfuse``,
    ``segfuse``, ``slidefuse``, ``bayesfuse``) learnt from judgments, as ranx's
    ``optimize_fusion(qrels, runs, norm, method=...)`` / ``probfuse_train(qrels, runs, n_segments)`` /
    ``slidefuse_train``: ``{"probs": [one array per run]}`` (``{"map_scores": [one number per run]}``
    for mapfuse, ``{"log_odds": [...]}`` for bayesfuse), for ``fuse(other_runs, method, norm,
    params=...)`` (the runs fused in the same order; slidefuse also needs ``w``, which is not learnt).
    ``qrels`` as :func:`streameval.evaluate` reads them; ``n_segments`` (probfuse only, required); a
    judgment of at least ``relevance_level`` is relevant; run queries without any judgment are left out
    (ranx requires the same queries)."""
    if not isinstance(runs, (list, tuple)):
        raise TypeError(f"runs is a list or tuple of runs, got {type(runs).__name__}")
    m, n = method_name(method), norm_name(norm)
    return train_columns(qrels_columns(qrels, columns), [run_columns(r, columns) for r in runs], m, n,
                         n_segments=n_segments, relevance_level=relevance_level)


class Trial(NamedTuple):
    """One configuration :func:`optimize` tried: its parameters (as ``fuse`` takes them; probfuse's
    ``n_segments``, not its learnt ``probs``) and the metric's mean over the qrels' queries."""
    params: dict
    score: float


def _weight_grid(step: float, n_runs: int) -> list:
    """ranx's weight grid (``fusion_optimization/optimize_weights.py``): each weight in 0, step, ...,
    1 (rounded to the step's decimals), every combination of one per run whose float sum is 1.0."""
    digits = str(step)[::-1].find(".")
    weights = [round(x, digits) for x in np.arange(0, 1 + step, step)]
    return [list(seq) for seq in itertools.product(*[weights] * n_runs) if sum(seq) == 1.0]


def _unit_grid(step: float) -> list:
    """ranx's grid of gamma / sigma / phi: 0.01, 0.01 + step, ... up to 1 (rounded to the step's decimals)."""
    digits = str(step)[::-1].find(".")
    return [round(x, digits) for x in np.arange(0.01, 1.0 + step, step)]


def optimize(qrels, runs, method: str = "wsum", norm: str | None = "min-max", metric: str = "ndcg", *,
             step: float | None = None, relevance_level: float = 1, columns: dict | None = None,
             return_trials: bool = False):
    """The parameters of ``method`` that fuse ``runs`` best on ``qrels`` by ``metric``, as ranx's
    ``optimize_fusion(qrels, runs, norm, method, metric)``: a grid search, each configuration fused
    (:func:`fuse`) and scored by :func:`streameval.evaluate` (the metric's mean over the qrels' queries, 0
    for one no run has, as ``complete=True``; run queries without judgments left out), the last of the
    best kept (ranx's ``score >= best``).

    Grids (ranx 0.3.21's defaults): ``weights`` of ``wsum``, ``wmnz``, ``w_bordafuse``, ``w_condorcet``,
    ``mixed``: one weight per run in 0, 0.1, ..., 1 (``step``) summing to 1; ``rrf``'s ``k``: 10, 20, ...,
    100 (``step`` 10); ``combgmnz``'s ``gamma``, ``logn_isr``'s ``sigma``, ``rbc``'s ``phi``: 0.01, 0.02,
    ..., 1 (``step`` 0.01); ``probfuse``: ``n_segments`` 1-100, each trained on ``qrels``
    (:func:`train`); ``slidefuse``: its ``probs`` trained once, ``w`` 1-100. The other trained methods
    (``posfuse``, ``mapfuse``, ``segfuse``, ``bayesfuse``) have nothing to search: their :func:`train`
    result is returned. ``metric``: any name :func:`streameval.evaluate` takes (ranx's ``ndcg@10``,
    ``map@100``, ...).

    Returns the parameters for ``fuse(runs, method, norm, params=...)`` (``{"weights": [...]}``,
    ``{"k": 60}``, probfuse's and slidefuse's learnt ``probs`` with the chosen ``w``); with
    ``return_trials``, also the list of :class:`Trial` in the order tried (ranx's optimization report).
    Raises FusionNameError for an unknown method (or one with nothing to learn or search: ``combsum``,
    ...), MetricNameError for an unknown metric, ValueError for fewer than two runs or a ``step``
    outside (0, 1] (``rrf``: a whole number of at least 1)."""
    from .metrics.fusion import FusionNameError

    if not isinstance(runs, (list, tuple)):
        raise TypeError(f"runs is a list or tuple of runs, got {type(runs).__name__}")
    m, n = method_name(method), norm_name(norm)
    if m not in SEARCHED and m not in TRAINED:
        raise FusionNameError(f"{m} has no parameter to search or learn (searched: {', '.join(SEARCHED)}; "
                              f"trained: {', '.join(TRAINED)})")
    if len(runs) < 2:
        raise ValueError(f"fusion needs at least two runs, got {len(runs)}")
    from .metrics.names import parse_metrics

    parse_metrics([metric])  # an unknown metric named before any run is read
    q = qrels_columns(qrels, columns)
    arrays = [run_columns(r, columns) for r in runs]
    judged = np.unique(np.asarray(q[0]).astype(str))
    if m in TRAINED and m not in SEARCHED:
        params = train_columns(q, arrays, m, n, relevance_level=relevance_level)
        return (params, []) if return_trials else params
    grid, key = _grid(m, step, len(arrays))
    learnt = train_columns(q, arrays, "slidefuse", n, relevance_level=relevance_level) if m == "slidefuse" else {}
    trials, best, best_score = [], None, 0.0
    for value in grid:
        if m == "probfuse":
            params = train_columns(q, arrays, m, n, n_segments=value, relevance_level=relevance_level)
        else:
            params = {**learnt, key: value}
        c = fuse_columns(arrays, m, n, params)
        keep = np.isin(c.qid, judged)  # run queries without judgments: left out, as train() does
        score = float(evaluate(q, (c.qid[keep], c.docno[keep], c.score[keep]), metric, complete=True,
                               relevance_level=relevance_level))
        trials.append(Trial({key: value} if m == "probfuse" else params, score))
        if score >= best_score:
            best, best_score = params, score
    if best is None:  # every score NaN
        raise ValueError(f"{m}: no configuration scored a number on {metric}")
    return (best, trials) if return_trials else best


def _grid(method: str, step, n_runs: int):
    """(the values tried, the parameter's name) for ``method`` (ranx's defaults; ``step`` overrides)."""
    key = SEARCHED[method]
    if key == "weights":
        step = 0.1 if step is None else step
        if not 0 < step <= 1:
            raise ValueError(f"{method}: step must be in (0, 1], got {step!r}")
        return _weight_grid(step, n_runs), key
    if key == "k":
        step = 10 if step is None else step
        if isinstance(step, bool) or int(step) != step or step < 1:
            raise ValueError(f"rrf: step must be a whole number of at least 1, got {step!r}")
        return list(range(10, 101, int(step))), key
    if key in ("n_segments", "w"):
        if step is not None:
            raise ValueError(f"{method}: searches {key} 1-100; it takes no step")
        return list(range(1, 101)), key
    step = 0.01 if step is None else step
    if not 0 < step <= 1:
        raise ValueError(f"{method}: step must be in (0, 1], got {step!r}")
    return _unit_grid(step), key
