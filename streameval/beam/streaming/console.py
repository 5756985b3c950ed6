"""The streaming job's console and its own counts: each pane as a table (:func:`format_pane`,
:class:`ConsoleTable`), the running totals of the record accounting after each pane
(:func:`running_totals_line`, :class:`PanesOut`), the records set aside (:class:`SideOut`: late data
and dead letters, counted and written) and the ``ALERT`` lines (:func:`print_alert`).

The local runner drops the Beam counters of elements that come from timers (every pane does), so
these steps count in this process: :data:`LOCAL_COUNTS`, :data:`LOCAL_UNREADABLE` and
:data:`PANE_LOG` hold the whole job's on the local runner (the job clears them before each run).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from datetime import datetime, timezone

import apache_beam as beam

from ...io import progress
from ...plan.alerts import format_alert
from ...io import counters as cn
from ..sources import UNREADABLE
from ..transforms import SOURCE_UNRANKABLE
from .common import stream_counts
from .sinks import _AppendJsonl, _iso

__all__ = ["format_pane", "running_totals_line", "ConsoleTable", "PanesOut", "SideOut", "print_alert",
           "LOCAL_COUNTS", "LOCAL_UNREADABLE", "PANE_LOG", "ROW_KEYS"]


def format_pane(rows, metric_names=()) -> str:
    """A pane as text: a header line (pane, index, final, window, system) and a table of its rows."""
    r0 = rows[0]
    order = {n: i for i, n in enumerate(metric_names)}

    def mkey(m):
        if m in order:
            return (0, order[m], 0)
        if m.startswith("ctr@pos"):
            try:
                return (1, 1, int(m[7:]))
            except ValueError:
                pass
        return (1, 0 if m == "ctr" else 2, 0)

    head = (f"pane {r0['pane']} #{r0['pane_index']}{' final' if r0['is_final'] else ''}  "
            f"window {_iso(r0['window_start'])} .. {_iso(r0['window_end'])}  system {r0['system']}")
    lines = []
    for r in sorted(rows, key=lambda r: (r["slice"] != "all" and not r["slice"].count(",") == 0,
                                         r["slice"], mkey(r["metric"]))):
        v, se = r["value"], r.get("stderr")
        lines.append((r["slice"], r["metric"], "nan" if v is None or math.isnan(v) else f"{v:.4f}",
                      str(r["num_queries"]), "-" if se is None or math.isnan(se) else f"{se:.4f}"))
    header = ("slice", "metric", "value", "n", "stderr")
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  " + "  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([head, fmt(header)] + [fmt(l) for l in lines])


# Panes and side records counted in this process: the local runner drops Beam counters of elements
# that come from timers (every pane does), so the summary of a local run counts them here.
LOCAL_COUNTS: dict = {}
# (monotonic time, pane, window end, is_final) of the latest panes as they reached the console step
# (local runner; bounded: a live job runs for ever)
PANE_LOG: deque = deque(maxlen=100_000)
# the (metric, system, slice) of every row that reached the console step (local runner): what the
# job's alert rules are checked against when it ends (a rule matching none is a typo: issue 41)
ROW_KEYS: set = set()


def _count(key, n=1):
    LOCAL_COUNTS[key] = LOCAL_COUNTS.get(key, 0) + n


class PanesOut(beam.DoFn):
    """Counts each pane (``LOCAL_COUNTS``) and prints it unless ``quiet``: one step, since every
    step after the aggregate costs a bundle per aggregate bundle on the local runner. With ``run``
    (the StreamMetrics' run id) it also reports the running totals of the record accounting as of
    each pane: a line on the console (unless ``quiet``) and, with a local ``totals_path``, a JSON
    line ``{"at", "pane", "window_start", "window_end", "system", "counts"}`` appended to it. The
    totals are this process's (:func:`streameval.beam.streaming.stream_counts`): the whole job's on
    the local runner; other runners report Beam counters (see ``streameval/jobs/stream.py``)."""

    def __init__(self, metric_names, quiet, run=None, totals_path=None):
        self.metric_names = list(metric_names)
        self.quiet = quiet
        self.run = run
        self.totals_path = totals_path

    def process(self, rows):
        if not rows:
            return ()
        r0 = rows[0]
        progress.add("stream_rows", len(rows))
        _count(cn.panes(r0["pane"]))
        PANE_LOG.append((time.monotonic(), r0["pane"], r0["window_end"], r0["is_final"]))
        ROW_KEYS.update((r["metric"], r["system"], r["slice"]) for r in rows)
        if r0["is_final"]:
            _count(cn.PANES_FINAL)
        if not self.quiet:
            sys.stdout.write(format_pane(rows, self.metric_names) + "\n\n")
        if self.run is not None:
            counts = stream_counts(self.run)
            if not self.quiet:
                sys.stdout.write(running_totals_line(counts) + "\n\n")
            if self.totals_path:
                rec = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "pane": r0["pane"],
                       "window_start": r0["window_start"], "window_end": r0["window_end"], "system": r0["system"],
                       "counts": dict(sorted(counts.items()))}
                with open(self.totals_path, "a", encoding="utf-8") as fo:
                    fo.write(json.dumps(rec) + "\n")
        if not self.quiet:
            sys.stdout.flush()
        return ()  # outputs nothing (said so, or Beam warns at every run that no iterator is returned)


def running_totals_line(counts: dict) -> str:
    """One line of running totals: records read, accepted, late and rejected per kind so far."""
    parts = []
    for kind in cn.KINDS:
        read = counts.get(cn.read(kind), 0)
        if not read:
            continue
        rejected = sum(v for k, v in counts.items() if k.startswith(cn.rejected_prefix(kind)))
        parts.append(f"{kind}s read {read}, valid {counts.get(cn.valid(kind), 0)}, late "
                     f"{counts.get(cn.late(kind), 0)}, rejected {rejected}")
    return "running totals: " + ("; ".join(parts) or "nothing read yet")


# files that could not be read to their end (their dead letters' reasons), seen by SideOut
LOCAL_UNREADABLE: list = []


class SideOut(_AppendJsonl):
    """Counts the records the stream set aside (``LOCAL_COUNTS``: ``written:late:<kind>``,
    ``written:rejected``, ``written:unrankable``, ``written:unreadable``, and by source for the
    summary line) and, with a directory, writes them per bundle: ``late_data-*.jsonl`` (late data)
    and ``dead_letters-*.jsonl`` (the rest)."""

    def process(self, rec):
        src = rec.get("source", "")
        late = src.startswith(cn.LATE_PREFIX)
        if late:
            _count(cn.written(src))
            _count(src)
        elif rec.get("reason", "").startswith(UNREADABLE):
            _count(cn.WRITTEN_UNREADABLE)
            LOCAL_UNREADABLE.append(rec["reason"].replace(f"{UNREADABLE} ", f"{src} ", 1))
        elif src == SOURCE_UNRANKABLE:  # a request that cannot be ranked (its impressions are accepted)
            _count(cn.WRITTEN_UNRANKABLE)
        else:
            _count(cn.WRITTEN_REJECTED)
            if src.startswith("unmatched:"):
                _count(src)
        if self.directory:
            (self._late if late else self._dead).append(rec)
        return ()  # outputs nothing (said so, or Beam warns at every run that no iterator is returned)

    def start_bundle(self):
        self._late, self._dead = [], []

    def finish_bundle(self):
        for prefix, recs in (("late_data", self._late), ("dead_letters", self._dead)):
            if recs:
                self._recs, self.prefix = recs, prefix
                super().finish_bundle()
        self._late, self._dead = [], []


class _PrintPanes(beam.DoFn):
    def __init__(self, metric_names, stream=None):
        self.metric_names = list(metric_names)
        self.stream = stream

    def process(self, rows):
        if rows:
            out = self.stream or sys.stdout
            out.write(format_pane(rows, self.metric_names) + "\n\n")
            out.flush()
        return ()


class ConsoleTable(beam.PTransform):
    """``panes | ConsoleTable(metric_names)``: prints each pane as it fires (the process's
    stdout: meaningful on the local runner)."""

    def __init__(self, metric_names=(), label=None):
        super().__init__(label)
        self.metric_names = list(metric_names)

    def expand(self, panes):
        return panes | "Print" >> beam.ParDo(_PrintPanes(self.metric_names))


def print_alert(a):
    """One ``ALERT`` line on stdout as an alert fires (the local runner's process; counted in
    :data:`LOCAL_COUNTS` as ``alerts_printed``)."""
    _count(cn.ALERTS_PRINTED)
    print(format_alert(a), flush=True)
