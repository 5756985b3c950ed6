"""What ``streameval dashboard`` shows, read from a job's output folder while the job writes it.

:class:`OutputFeed` lists the folder at most every ``min_interval`` seconds and reads only what is new:

* **pane files** ``metrics-*.jsonl`` (else ``.avro``: a job run with ``--formats avro``), one per
  pane of one window and system (:func:`streameval.beam.streaming.sinks.pane_file_stem`), complete
  once their name appears (the job writes a hidden temporary file and renames it). A batch job's
  ``metrics.jsonl`` / ``metrics.avro`` is read too, again whenever its size changes. Of the rows of
  one (window, slice, system, metric) the table keeps the latest pane, as
  :func:`streameval.io.tables.final_panes` does: the final one, else the largest ``pane_index``;
* **alerts** ``alerts-*.jsonl`` (the latest :data:`ALERTS_KEPT`, newest first);
* **the record accounting**: the last record of ``running_totals.jsonl`` (the stream job on the local
  runner writes one per pane), the records of ``late_data-*.jsonl`` and ``dead_letters-*.jsonl``
  (a file is counted again when its size changed: a bundle's file is written in place), and
  ``summary.json`` (the job's state, final counts, accounting problems and summary line) and
  ``manifest.json`` (the run is published) once they are there.

A remote output (``s3://``, ``gs://``: any Beam file system) is read in the run's folder: the one the
manifest names, else the newest ``runs/<run id>/`` (run ids begin with their UTC start time). When
that folder changes (a new run), the feed starts again from nothing and its ``run`` number grows.

Every change gets the next sequence number: :meth:`OutputFeed.snapshot` ``since=N`` gives the rows
changed after N, so a page that polls receives each row once per change.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field

from ..io import tables
from ..io.outdir import RUNNING_TOTALS
from ..io.tables import MetricsTableError

__all__ = ["OutputFeed", "ALERTS_KEPT", "ROW_FIELDS"]

#: the newest alerts a snapshot carries
ALERTS_KEPT = 50
#: the fields of a metric row a snapshot carries (NaN and infinities as null)
ROW_FIELDS = ("window_start", "window_end", "slice", "system", "metric", "value", "num_queries", "stderr",
              "ci_low", "ci_high", "ci_level", "pane", "pane_index", "is_final")
_RUNS = "runs"
_SIDE = {"late_data-": "late_data_records", "dead_letters-": "dead_letters"}


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _finite(x):
    return x if not isinstance(x, float) or math.isfinite(x) else None


def _rank(row) -> tuple:
    """The order of a key's rows: a final pane last, else by pane index (a batch row has neither)."""
    return bool(row.get("is_final")), row.get("pane_index") if row.get("pane_index") is not None else -1


@dataclass
class _Run:
    """What the feed has read of one run's folder."""

    folder: str
    seen: dict = field(default_factory=dict)  # file name -> size when read
    rows: dict = field(default_factory=dict)  # (window_start, window_end, slice, system, metric) -> (seq, row)
    alerts: list = field(default_factory=list)
    side: dict = field(default_factory=dict)  # side file name -> (counter, records)
    totals: dict = field(default_factory=dict)  # the last running-totals record's counts
    summary: dict = field(default_factory=dict)
    published: bool = False
    pane_files: int = 0


class OutputFeed:
    """The latest metric rows, alerts and accounting of the job output ``output`` (a local folder or
    a Beam file system URL), read incrementally (see the module docstring). Thread-safe."""

    def __init__(self, output: str, min_interval: float = 1.0, clock=time.monotonic):
        self.output = output.rstrip("/") if "://" in output else output
        self.min_interval = float(min_interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._polled = -math.inf
        self._seq = 0
        self._run_number = 0
        self._run: _Run | None = None
        self.error: str | None = None  # the last poll's one-line error (None when it read)

    # ---- where the run's files are

    def _folder(self) -> str | None:
        """The folder that holds the run's files; None while there is none."""
        out = self.output
        if "://" not in out:
            import os

            return out if os.path.isdir(out) else None
        names = tables.file_sizes(out)
        if tables.MANIFEST in names:
            try:
                folder = json.loads(tables.read_bytes(_join(out, tables.MANIFEST))).get("folder") or ""
            except ValueError:
                folder = ""
            if folder:
                return _join(out, folder)
        from apache_beam.io.filesystems import FileSystems

        found = FileSystems.match([_join(out, f"{_RUNS}/*/*")])[0].metadata_list
        runs = sorted({m.path[len(out) + 1:].split("/")[1] for m in found})
        return _join(out, f"{_RUNS}/{runs[-1]}") if runs else (out if names else None)

    # ---- reading

    def poll(self, force: bool = False) -> None:
        """Read what is new, unless the last poll was less than ``min_interval`` ago."""
        with self._lock:
            now = self._clock()
            if not force and now - self._polled < self.min_interval:
                return
            self._polled = now
            try:
                self._poll()
                self.error = None
            except (MetricsTableError, OSError) as e:
                self.error = " ".join(str(e).split())
            except Exception as e:  # noqa: BLE001 (a file system's own error types: said, the next poll retries)
                self.error = f"{type(e).__name__}: {' '.join(str(e).split())}"

    def _poll(self) -> None:
        folder = self._folder()
        if folder is None:
            self._run = None
            return
        sizes = tables.file_sizes(folder)
        # a new run in the same folder: the stream job removes the previous run's files when it starts
        gone = self._run is not None and any(n.startswith("metrics") and n not in sizes for n in self._run.seen)
        if self._run is None or self._run.folder != folder or gone:
            self._run = _Run(folder)
            self._run_number += 1
            self._seq += 1
        run = self._run
        panes: dict[str, str] = {}
        for name in sorted(sizes):
            if name.startswith("metrics") and name.endswith((".jsonl", ".avro")):
                stem, ext = name.rsplit(".", 1)
                if ext == "jsonl" or stem not in panes:
                    panes[stem] = name
        for name in panes.values():
            if run.seen.get(name) != sizes[name]:
                self._take_rows(run, tables.file_rows(_join(folder, name)))
                run.seen[name] = sizes[name]
                run.pane_files += 1
        for name, size in sizes.items():
            if run.seen.get(name) == size:
                continue
            if name.startswith("alerts-") and name.endswith(".jsonl"):
                run.alerts.extend(self._json_lines(_join(folder, name)))
                run.alerts.sort(key=lambda a: (a.get("window_end") or 0, a.get("pane_index") or 0), reverse=True)
                del run.alerts[ALERTS_KEPT:]
            elif name.endswith(".jsonl") and name.startswith(tuple(_SIDE)):
                counter = next(v for k, v in _SIDE.items() if name.startswith(k))
                run.side[name] = (counter, len(self._json_lines(_join(folder, name))))
            elif name == RUNNING_TOTALS:
                records = self._json_lines(_join(folder, name))
                run.totals = records[-1].get("counts", {}) if records else {}
            elif name == "summary.json":
                try:
                    run.summary = json.loads(tables.read_bytes(_join(folder, name)))
                except ValueError:  # being written: read again at the next poll
                    continue
            elif name == tables.MANIFEST:
                run.published = True
            else:
                continue
            run.seen[name] = size
        if "://" in self.output and tables.MANIFEST in tables.file_sizes(self.output):
            run.published = True

    @staticmethod
    def _json_lines(path: str) -> list[dict]:
        """The complete JSON lines of a file (a line still being written is left for the next poll)."""
        out = []
        for line in tables.read_bytes(path).decode("utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def _take_rows(self, run: _Run, rows) -> None:
        for r in rows:
            key = (r.get("window_start"), r.get("window_end"), r["slice"], r["system"], r["metric"])
            old = run.rows.get(key)
            if old is not None and _rank(r) < _rank(old[1]):
                continue
            self._seq += 1
            run.rows[key] = (self._seq, {k: _finite(r.get(k)) for k in ROW_FIELDS})

    # ---- what the page receives

    def snapshot(self, since: int = 0, run: int | None = None) -> dict:
        """The feed as JSON-ready data: ``rows`` changed after sequence number ``since`` (every row
        when ``run`` is not the current run's number), ``seq`` (the number to ask next),
        ``alerts`` (newest first), ``accounting``, the job's ``state`` and ``summary`` line,
        ``published``, the last poll's ``error`` and ``poll`` (the seconds between two listings:
        the page asks that often)."""
        self.poll()
        with self._lock:
            r = self._run
            fresh = run != self._run_number
            rows = [] if r is None else [row for seq, row in r.rows.values() if fresh or seq > since]
            accounting: dict = {}
            state = None
            if r is not None:
                accounting = {"pane_files": r.pane_files, "rows": len(r.rows),
                              **{k: 0 for k in _SIDE.values()}, **dict(r.totals)}
                for counter, n in r.side.values():
                    accounting[counter] += n
                if r.summary.get("counts"):
                    accounting.update(r.summary["counts"])
                state = r.summary.get("state")
            return {"output": self.output, "folder": None if r is None else r.folder, "run": self._run_number,
                    "seq": self._seq, "rows": rows, "alerts": [] if r is None else list(r.alerts),
                    "accounting": accounting, "state": state,
                    "summary": None if r is None else r.summary.get("summary"),
                    "accounting_problems": None if r is None else r.summary.get("accounting_problems"),
                    "published": bool(r and r.published), "error": self.error, "poll": self.min_interval}
