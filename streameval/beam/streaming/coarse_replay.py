"""A replay of impression files as column blocks (``stream --replay`` on the columnar engine):
:class:`ReplayColumns`, the input of :class:`~.coarse.ColumnarStreamMetrics` on the local streaming
runner (a ``TestStream`` of one descriptor per step of event time; the files' Arrow blocks stay in the
process that read them, out of the pipeline graph)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import FastPrimitivesCoder

from ...io import records
from .common import FLUSH, _when

NO_TIME = np.iinfo(np.int64).min  # the replay step of records without a usable time (played first)


class ColumnReplayConfig(NamedTuple):
    """What a columnar replay reads: ``paths`` (files, in the order given), ``step`` microseconds of
    event time per step, ``block`` rows at most per element."""

    paths: tuple
    step: int
    block: int


class ColumnReplayPlan(NamedTuple):
    """A columnar replay read: ``steps`` ``{step number (event time // step, :data:`NO_TIME` for records
    without a usable time): [(path, payload, rows), ...]}`` (payload ``("arrow", Arrow IPC bytes)`` or,
    from the fallback decoder, ``("records", [record, ...])``), ``counts`` records read per kind and
    ``unreadable`` one dead letter per file that could not be read to its end."""

    steps: dict
    counts: dict
    unreadable: list


def column_plan(cfg: ColumnReplayConfig) -> ColumnReplayPlan:
    """Read ``cfg``'s impression files into a :class:`ColumnReplayPlan`: each file's Arrow blocks
    (:func:`~streameval.beam.sources.read_avro_blocks`, the batch job's reader) cut by step of event
    time, a file's rows of a step in blocks of ``cfg.block`` rows (its last one smaller; the file's
    Avro blocks joined: each block is a piece that the engine's shards buffer). Raises
    :class:`~streameval.beam.sources.InputUnavailableError` for a file the environment does not
    deliver."""
    from collections import defaultdict

    from ...io import avro
    from ..sources import read_avro_blocks, unreadable_letter
    from .live import event_micros
    from .replay import usable_time

    step_us = cfg.step
    per_step: dict = defaultdict(list)  # step -> [(path, block, records)]
    unreadable: list = []
    total = 0
    for path in cfg.paths:
        n = 0
        held: dict = defaultdict(list)  # step -> the file's Arrow tables of it not yet in a block
        put = functools.partial(_put_blocks, per_step, held, str(path), cfg.block)
        try:
            for block in read_avro_blocks(path, "impression", "datafusion"):
                if isinstance(block, list):  # the fallback decoder's records
                    n += len(block)
                    groups: dict = defaultdict(list)
                    for rec in block:
                        t = usable_time(rec)
                        groups[NO_TIME if t is None else t // step_us].append(rec)
                    for s, recs in groups.items():
                        put(s, done=True)  # the file's order within the step
                        per_step[s].append((str(path), ("records", recs), len(recs)))
                    continue
                n += block.num_rows
                ts = event_micros(block)
                usable = (ts >= records.EVENT_TIME_MIN) & (ts <= records.EVENT_TIME_MAX)
                step = np.where(usable, ts // step_us, NO_TIME)
                order = np.argsort(step, kind="stable")
                s_sorted = step[order]
                cuts = np.flatnonzero(np.diff(s_sorted)) + 1
                for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(order)].tolist()):
                    s = int(s_sorted[lo])
                    held[s].append(block.take(pa.array(order[lo:hi])))
                    put(s)
        except avro.AvroInputError as e:
            unreadable.append(unreadable_letter(path, "impressions", e, n))
        for s in list(held):  # the file's last blocks of each step (also after damage: what was read)
            put(s, done=True)
        total += n
    return ColumnReplayPlan(dict(per_step), {"impressions": total, "judgments": 0, "clicks": 0}, unreadable)


def _put_blocks(per_step: dict, held: dict, path: str, block: int, s: int, done: bool = False) -> None:
    """Move the file ``path``'s tables of step ``s`` from ``held`` to ``per_step`` as blocks of
    ``block`` rows (``done``: the rest too, as a smaller block); see :func:`column_plan`."""
    from .live import ipc_bytes

    tables = held.pop(s, [])
    if not tables:
        return
    part = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    a = 0
    while part.num_rows - a >= block or (done and a < part.num_rows):
        piece = part.slice(a, block)
        per_step[s].append((path, ("arrow", ipc_bytes(piece)), piece.num_rows))
        a += piece.num_rows
    if a < part.num_rows:
        held[s].append(part.slice(a))


class _PlayStep(beam.DoFn):
    """``(token, paths, step, block, step number, watermark, processing seconds, next watermark)`` ->
    the step's ``(path, block, rows, watermark)`` elements from the plan held in this process
    (:func:`~.replay.held_plan`; read again from the files elsewhere), each with the step's timestamp,
    then, when ``next watermark`` is not None, the flush of it (:data:`~.common.FLUSH`); the replay's
    processing time (:func:`~.replay.replay_clock`) moves to the element's. Step number None: the
    flush alone (:class:`ReplayColumns` sends it so, stamped with the watermark it follows)."""

    def process(self, element):
        from . import replay as _replay

        token, paths, step_us, block, s, wm, ptime, nxt = element
        _replay._REPLAY_NOW[0] = float(ptime)
        if s is not None:
            plan = _replay.held_plan(token, ColumnReplayConfig(tuple(paths), step_us, block), column_plan)
            for path, payload, n in plan.steps[s]:
                yield (path, payload, n, wm)
        if nxt is not None:
            yield (None, (FLUSH, None), 0, nxt)


class ReplayColumns(beam.PTransform):
    """``p | ReplayColumns(paths, step="1h", pace=1.0)``: impression files replayed in event-time
    order as :class:`ColumnarStreamMetrics`'s input, on the local streaming runner: the records of each
    ``step`` of event time (per file, in blocks of at most ``block`` rows, Arrow columns) with the
    watermark of the previous step, then the watermark moves to the step's end and processing time
    advances by ``pace`` seconds. Records without a usable time play in the first step (the reader
    makes them dead letters). The files are read when the pipeline is built (a replay holds the log in
    memory; :func:`column_plan`), and the plan stays in this process: each step ends with a flush
    (:data:`~.common.FLUSH`) of the watermark that follows, so give the shards ``flushes=True``
    (:class:`~.coarse.ColumnarStreamMetrics`); the pipeline's ``TestStream``
    carries one small descriptor per step (the replay's token and files, the step), which
    :class:`_PlayStep` turns into the step's blocks, never the records themselves. ``self.counts``
    (records per kind) and ``self.unreadable`` (a dead letter per file that could not be read to its
    end) are known once the transform is applied."""

    #: a flush precedes each move of the watermark (give the engine ``flushes=True``)
    flushes = True

    def __init__(self, paths, step="1h", pace=1.0, block: int = 65_536, label=None):
        super().__init__(label)
        self.paths = list(paths)
        self.step = step
        self.pace = float(pace)
        self.block = int(block)
        self.counts: dict = {}
        self.unreadable: list = []

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream
        from apache_beam.transforms.window import TimestampedValue

        from ...plan.windows import parse_duration
        from .replay import END_OF_TIME_US, held_plan, ms_floor, new_token

        cfg = ColumnReplayConfig(tuple(str(x) for x in self.paths), parse_duration(self.step, "step"), self.block)
        token = new_token()
        plan = held_plan(token, cfg, column_plan)
        self.counts, self.unreadable = dict(plan.counts), list(plan.unreadable)
        stream = TestStream(coder=FastPrimitivesCoder())
        wm = None
        ptime = 0.0
        for s in sorted(plan.steps):
            nxt = ms_floor((s + 1) * cfg.step) if s != NO_TIME else None
            # stamped with the step's start (records without a usable time: 0), never after a record
            events = [TimestampedValue((token, cfg.paths, cfg.step, cfg.block, s, wm, ptime, None),
                                       _when(ms_floor(s * cfg.step) if s != NO_TIME else 0))]
            if nxt is not None:  # then the flush of the next watermark, stamped with the one it follows
                # (the step's start before the first move): below the end of every window it closes
                events.append(TimestampedValue((token, cfg.paths, cfg.step, cfg.block, None, wm, ptime, nxt),
                                               _when(ms_floor(s * cfg.step) if wm is None else wm)))
            stream = stream.add_elements(events)
            if nxt is not None:
                wm = nxt
                stream = stream.advance_watermark_to(_when(wm))
            if self.pace:
                ptime += self.pace
                stream = stream.advance_processing_time(self.pace)
        # the last flush: every window closes
        if wm is not None:
            stream = stream.add_elements([TimestampedValue(
                (token, cfg.paths, cfg.step, cfg.block, None, wm, ptime, END_OF_TIME_US), _when(wm))])
        stream = stream.advance_watermark_to(_when(END_OF_TIME_US)).advance_watermark_to_infinity()
        return pbegin | "TestStream" >> stream | "Play" >> beam.ParDo(_PlayStep())


__all__ = ["ReplayColumns", "ColumnReplayConfig", "ColumnReplayPlan", "column_plan", "NO_TIME"]
