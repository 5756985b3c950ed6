"""Rank fusion as a Beam transform: :class:`FuseRuns` fuses runs held as PCollections of (qid, docno,
score), given as a tuple (``(run_a, run_b) | FuseRuns("rrf")``: Beam takes a tuple of PCollections as
a transform's input, where it would read a list as a value), and :class:`ReadTrecRunRows` reads a TREC
run file (or glob) into one.

Every method and normalisation of :mod:`streameval.metrics.fusion` works on one query at a time, so
the runs' rows are grouped by query (one element per query: its rows from every run) and each query
is fused by :func:`streameval.metrics.fusion.fuse_columns`, the library's own code: the rows equal
``streameval.fuse``'s. A malformed line, a non-finite score or a document twice in one query of a run
fails the pipeline with that line or query in the message, as the library raises; nothing is dropped.
"""

from __future__ import annotations

import math
import typing

import apache_beam as beam
import numpy as np

from ..metrics.fusion import check_params, fuse_columns, method_name, norm_name

__all__ = ["FuseRuns", "ReadTrecRunRows", "parse_trec_run_line"]


def parse_trec_run_line(line: str, source: str = "run") -> tuple:
    """``qid Q0 docno rank score tag`` -> (qid, docno, score); ValueError naming ``source`` and the line."""
    parts = line.split()
    if len(parts) != 6:
        raise ValueError(f"{source}: malformed TREC run line (expected 6 columns: qid Q0 docno rank score tag): "
                         f"{line.strip()!r}")
    try:
        score = float(parts[4])
    except ValueError:
        raise ValueError(f"{source}: score {parts[4]!r} is not a number: {line.strip()!r}") from None
    if not math.isfinite(score):
        raise ValueError(f"{source}: score {parts[4]!r} is not a finite number: {line.strip()!r}")
    return parts[0], parts[2], score


class ReadTrecRunRows(beam.PTransform):
    """A TREC run file or glob (any Beam file system) -> PCollection of (qid, docno, score); blank
    lines are skipped, a malformed one fails the pipeline naming the pattern and the line."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = pattern

    def expand(self, pbegin):
        pattern = self.pattern
        return (pbegin
                | "Read" >> beam.io.ReadFromText(pattern)
                | "NonBlank" >> beam.Filter(lambda line: bool(line.strip()))
                | "Parse" >> beam.Map(parse_trec_run_line, pattern))


class _FuseQuery(beam.DoFn):
    """One query's rows from every run -> its fused rows (qid, docno, score, rank)."""

    def __init__(self, n_runs: int, method: str, norm: str, params: dict):
        self.n_runs, self.method, self.norm, self.params = n_runs, method, norm, params

    def process(self, element):
        qid, rows = element
        by_run: list[list] = [[] for _ in range(self.n_runs)]
        for run_index, docno, score in rows:
            by_run[run_index].append((docno, score))
        runs = [(np.full(len(r), qid, dtype=object).astype(str), np.array([d for d, _ in r], dtype=str),
                 np.array([s for _, s in r], dtype=np.float64)) for r in by_run]
        fused = fuse_columns(runs, self.method, self.norm, self.params)
        yield from zip(fused.qid.tolist(), fused.docno.tolist(), fused.score.tolist(), fused.rank.tolist())


class FuseRuns(beam.PTransform):
    """A tuple of PCollections of (qid, docno, score), one per run, -> one PCollection of the fused rows
    (qid, docno, score, rank), equal to :func:`streameval.fuse`'s (``method``, ``norm`` and ``params``
    as it takes them; names and parameters checked when the pipeline is built)."""

    def __init__(self, method: str = "rrf", norm: str | None = "min-max", params: dict | None = None):
        super().__init__()
        self.method, self.norm, self.params = method_name(method), norm_name(norm), dict(params or {})

    def expand(self, runs: typing.Sequence):
        runs = list(runs)
        if len(runs) < 2:
            raise ValueError(f"fusion needs at least two runs, got {len(runs)}")
        params = check_params(self.method, self.params, len(runs))
        tagged = [run | f"Tag{i}" >> beam.Map(lambda row, i=i: (str(row[0]), (i, str(row[1]), float(row[2]))))
                  for i, run in enumerate(runs)]
        return (tagged
                | "Flatten" >> beam.Flatten()
                | "ByQuery" >> beam.GroupByKey()
                | "Fuse" >> beam.ParDo(_FuseQuery(len(runs), self.method, self.norm, params)))
