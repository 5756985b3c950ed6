"""The judgments of the columnar stream engine (:class:`~.coarse.ColumnarStreamMetrics`): read and
resolved when the pipeline is built (the batch job's reader and conflict policy), not by a side input
(Beam's local streaming runner does not hold the main input until a side input is complete).

On the in-process local runner the shards' DoFn carries a :class:`HeldJudgments` reference, not the
judgments: the runner pickles a DoFn for every bundle, and judgments inside it were pickled (and
bz2-compressed) again each time (23 KB for 4,000 judgments, 162 times for a replay of 1 M impressions).
The resolved judgments stay in the process (:func:`~.replay.held_plan`) and are read again from the
files if they were let go. Elsewhere (Flink, Prism) the DoFn carries them, read once by the launcher.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow.compute as pc
from apache_beam import pvalue

from ..columnar_columns import _concat, _encode, _pick, freeze, thaw
from ..columnar_read import _ReadJudgmentColumns
from ..columnar_score import _ResolveShard
from ..threads import _collect
from .replay import held_plan


class JudgmentRead(NamedTuple):
    """How the judgments are read: ``paths`` (Avro files, in order), ``shards`` (query shards),
    ``grade_range`` (grades outside are dead letters), ``decoder`` (the Avro block decoder) and
    ``policy`` (conflicting grades: :func:`streameval.io.cleaning.check_judgment_policy`)."""

    paths: tuple
    shards: int
    grade_range: tuple | None
    decoder: str
    policy: str


class ResolvedJudgments(NamedTuple):
    """``resolved`` ``{query shard: [frozen resolved columns]}``, ``dead`` the dead letters, ``counts``
    the counter increments (``[[counter key, n], ...]``) of a :func:`read_judgments`."""

    resolved: dict
    dead: list
    counts: list


class HeldJudgments(NamedTuple):
    """A reference to judgments held in this process: the token of :func:`~.replay.held_plan` and how
    to read them again."""

    token: str
    read: JudgmentRead


def read_judgments(cfg: JudgmentRead) -> ResolvedJudgments:
    """Read and resolve ``cfg``'s judgment files (each file's blocks by query shard, then each shard's
    conflicts resolved by ``cfg.policy``). Raises
    :class:`~streameval.beam.sources.InputUnavailableError` for a file the environment does not
    deliver."""
    reader = _ReadJudgmentColumns(cfg.shards, cfg.grade_range, cfg.decoder, input_format="avro")
    by_shard: dict = {}
    dead: list = []
    tally: dict = {}

    def run(work, args):
        outs, counts = _collect(work, args)
        for k, n in counts.items():
            tally[k] = tally.get(k, 0) + n if len(k) == 2 else tally.get(k, []) + list(n)
        for o in outs:
            if isinstance(o, pvalue.TaggedOutput):
                dead.append(o.value)
            else:
                yield o

    for path in cfg.paths:
        for shard, frozen in run(reader.work, (path,)):
            by_shard.setdefault(shard, []).append(frozen)
    resolver = _ResolveShard(cfg.policy, "ResolveJudgments")
    resolved: dict = {}
    for shard, values in sorted(by_shard.items()):
        for s, frozen in run(resolver.work, ((shard, values),)):
            resolved.setdefault(int(s), []).append(frozen)
    return ResolvedJudgments(resolved, dead, [[list(k), n] for k, n in tally.items()])


class _ByQuery(NamedTuple):
    """Rows of columns grouped by query: ``rows[bounds[c]:bounds[c + 1]]`` are the rows of the query
    ``codes[query id]``."""

    codes: dict
    rows: np.ndarray
    bounds: np.ndarray

    @classmethod
    def of(cls, query_id) -> "_ByQuery":
        code, vocab = _encode(query_id)
        rows = np.argsort(code, kind="stable")
        bounds = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(np.bincount(code, minlength=len(vocab)), out=bounds[1:])
        return cls({q: i for i, q in enumerate(vocab.to_pylist())}, rows, bounds)

    def rows_of(self, queries: list) -> np.ndarray:
        """The rows of ``queries`` (query ids; unknown ones have none), in their columns' order."""
        c = np.fromiter((self.codes[q] for q in queries if q in self.codes), dtype=np.int64)
        lo, hi = self.bounds[c], self.bounds[c + 1]
        n = hi - lo
        at = np.arange(int(n.sum()), dtype=np.int64) + np.repeat(lo - (np.cumsum(n) - n), n)
        return np.sort(self.rows[at])


class QueryJudgments:
    """A query shard's resolved judgments held in this process, by query: :meth:`of` gives those of
    the queries of a chunk of requests, so that scoring a window's requests reads their queries'
    judgments, not the whole collection (a replay scores every window against the same judgments).

    Scores are those of the whole collection: every rule of the scoring stage
    (:class:`~..columnar_score._ScoreShard`) reads the judgments of a request's own query, and the rows
    kept are in their original order."""

    def __init__(self, parts: list):
        jc = _concat([thaw(v, keep=True) for v in parts]) if parts else None
        self.columns = jc
        if jc is not None:
            self.main = _ByQuery.of(jc["query_id"])
            self.sub = _ByQuery.of(jc["sub_query_id"]) if "sub_query_id" in jc else None

    def of(self, query_id) -> list:
        """``[frozen columns]`` (held in this process: :func:`release` them after use) of the judgments
        of the distinct values of ``query_id`` (an Arrow string column); ``[]`` when none is judged."""
        jc = self.columns
        if jc is None:
            return []
        queries = pc.unique(query_id).to_pylist()
        rows = self.main.rows_of(queries)
        if not len(rows):
            return []
        out = {k: _pick(v, rows) for k, v in jc.items() if k != "n" and not k.startswith("sub_")}
        out["n"] = len(rows)
        if self.sub is not None:
            srows = self.sub.rows_of(queries)
            out.update({k: _pick(v, srows) for k, v in jc.items() if k.startswith("sub_")})
        return [freeze(out, hold=True)]

    @staticmethod
    def release(parts: list) -> None:
        """Drop the held values of an :meth:`of`."""
        for v in parts:
            thaw(v)


def _held_columns(judgments) -> dict:
    """The resolved columns of ``judgments`` (see :func:`held_judgments`) by query shard, held in this
    process (:class:`QueryJudgments`)."""
    if isinstance(judgments, HeldJudgments):
        judgments = held_plan(judgments.token, judgments.read, read_judgments).resolved
    return {q: QueryJudgments([freeze(thaw(v), hold=True) for v in vals]) for q, vals in judgments.items()}


def held_judgments(judgments, token: str) -> dict:
    """``{query shard: QueryJudgments}`` of ``judgments`` (a :class:`HeldJudgments`, or ``{query shard:
    [frozen resolved columns]}`` carried by the DoFn, then named by the DoFn's ``token``): made once per
    process and job (the runner copies DoFns)."""
    key = judgments.token if isinstance(judgments, HeldJudgments) else token
    return held_plan(f"{key}/held", judgments, _held_columns)


__all__ = ["JudgmentRead", "ResolvedJudgments", "HeldJudgments", "QueryJudgments", "read_judgments", "held_judgments"]
