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

from apache_beam import pvalue

from ..columnar_columns import freeze, thaw
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


def _held_columns(judgments) -> dict:
    """The resolved columns of ``judgments`` (see :func:`held_judgments`), each held in this process."""
    if isinstance(judgments, HeldJudgments):
        judgments = held_plan(judgments.token, judgments.read, read_judgments).resolved
    return {q: [freeze(thaw(v), hold=True) for v in vals] for q, vals in judgments.items()}


def held_judgments(judgments, token: str) -> dict:
    """``{query shard: [resolved columns held in this process]}`` of ``judgments`` (a
    :class:`HeldJudgments`, or ``{query shard: [frozen resolved columns]}`` carried by the DoFn, then
    named by the DoFn's ``token``): made once per process and job (the runner copies DoFns)."""
    key = judgments.token if isinstance(judgments, HeldJudgments) else token
    return held_plan(f"{key}/held", judgments, _held_columns)


__all__ = ["JudgmentRead", "ResolvedJudgments", "HeldJudgments", "read_judgments", "held_judgments"]
