"""A replay of impression files as column blocks (``stream --replay`` on the columnar engine):
:class:`ReplayColumns`, the input of :class:`~.coarse.ColumnarStreamMetrics` on the local streaming
runner (a ``TestStream`` of the files' Arrow blocks per step of event time)."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.coders import FastPrimitivesCoder

from ...io import records
from .common import _when

NO_TIME = np.iinfo(np.int64).min  # the replay step of records without a usable time (played first)


def _set_clock(element):
    """(path, block, records, watermark, processing seconds) -> the first four; the replay's
    processing time (:func:`~.replay.replay_clock`) moves to the element's."""
    from . import replay as _replay

    _replay._REPLAY_NOW[0] = float(element[4])
    return element[:4]


class ReplayColumns(beam.PTransform):
    """``p | ReplayColumns(paths, step="1h", pace=1.0)``: impression files replayed in event-time
    order as :class:`ColumnarStreamMetrics`'s input, a ``TestStream`` for the local streaming runner:
    the records of each ``step`` of event time (per file, in blocks of at most ``block`` rows, Arrow
    columns) with the watermark of the previous step, then the watermark moves to the step's end and
    processing time advances by ``pace`` seconds. Records without a usable time play in the first step
    (the reader makes them dead letters). The files are read when the pipeline is built (a replay
    holds the log in memory): ``self.counts`` (records per kind) and ``self.unreadable`` (a dead letter
    per file that could not be read to its end) are known then."""

    def __init__(self, paths, step="1h", pace=1.0, block: int = 65_536, label=None):
        super().__init__(label)
        self.paths = list(paths)
        self.step = step
        self.pace = float(pace)
        self.block = int(block)
        self.counts: dict = {}
        self.unreadable: list = []

    def _steps(self):
        from collections import defaultdict

        from ...io import avro
        from ..sources import read_avro_blocks, unreadable_letter
        from .live import event_micros, ipc_bytes
        from .replay import usable_time
        from ...plan.windows import parse_duration

        step_us = parse_duration(self.step, "step")
        per_step: dict = defaultdict(list)  # step -> [(path, block, records)]
        total = 0
        for path in self.paths:
            n = 0
            try:
                for block in read_avro_blocks(path, "impression", "datafusion"):
                    if isinstance(block, list):  # the fallback decoder's records
                        n += len(block)
                        groups: dict = defaultdict(list)
                        for rec in block:
                            t = usable_time(rec)
                            groups[NO_TIME if t is None else t // step_us].append(rec)
                        for s, recs in groups.items():
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
                        part = block.take(pa.array(order[lo:hi]))
                        for a in range(0, part.num_rows, self.block):
                            piece = part.slice(a, self.block)
                            per_step[int(s_sorted[lo])].append((str(path), ("arrow", ipc_bytes(piece)),
                                                                piece.num_rows))
            except avro.AvroInputError as e:
                self.unreadable.append(unreadable_letter(path, "impressions", e, n))
            total += n
        self.counts = {"impressions": total, "judgments": 0, "clicks": 0}
        return per_step, step_us

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream
        from apache_beam.transforms.window import TimestampedValue

        from .replay import END_OF_TIME_US, ms_floor

        per_step, step_us = self._steps()
        stream = TestStream(coder=FastPrimitivesCoder())
        wm = None
        ptime = 0.0
        for s in sorted(per_step):
            for path, payload, n in per_step[s]:
                # stamped with the step's start (records without a usable time: 0), never after a record
                stream = stream.add_elements([TimestampedValue(
                    (path, payload, n, wm, ptime), _when(ms_floor(s * step_us) if s != NO_TIME else 0))])
            if s != NO_TIME:
                wm = ms_floor((s + 1) * step_us)
                stream = stream.advance_watermark_to(_when(wm))
            if self.pace:
                ptime += self.pace
                stream = stream.advance_processing_time(self.pace)
        stream = stream.advance_watermark_to(_when(END_OF_TIME_US)).advance_watermark_to_infinity()
        return pbegin | "TestStream" >> stream | "Clock" >> beam.Map(_set_clock)


__all__ = ["ReplayColumns", "NO_TIME"]
