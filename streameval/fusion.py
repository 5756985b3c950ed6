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

import os

from .api import qrels_columns, run_columns
from .metrics.fusion import (METHODS, NORMS, TRAINED, FusedColumns, FusionNameError, fuse_columns, method_name,
                             norm_name, train_columns)

__all__ = ["fuse", "train", "FusedRun", "FusionNameError", "METHODS", "NORMS", "TRAINED",
           "method_name"]


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
