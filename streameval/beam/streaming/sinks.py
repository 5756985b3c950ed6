"""Sinks of the streaming job (``streameval stream --output DIR``): one file per pane and format of
``--formats`` (:class:`WriteWindowedFiles`, named by :func:`pane_file_stem`) and JSON-lines files of unwindowed
records per bundle (:class:`WriteRecords`: late data, dead letters, alerts), on any Beam file
system. A pane's file is written to a temporary name and renamed; a bundle's records go to a new
file of a unique name. The job's manifest (:func:`streameval.beam.sinks.publish`) lists them last.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from ...io import avro

__all__ = ["WriteWindowedFiles", "WriteRecords", "pane_file_stem", "PARQUET_DATASET"]


def _iso(us) -> str:
    """A time in int microseconds as ISO 8601 UTC (``global`` for None; the number when out of range)."""
    if us is None:
        return "global"
    try:
        dt = datetime.fromtimestamp(us / 1e6, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(us)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if us % 1_000_000 == 0 else dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _safe(text) -> str:
    """``text`` as a file-name part: unchanged when it is short and plain; otherwise its characters
    outside ``[A-Za-z0-9._=+-]`` replaced, cut to 80 characters and followed by ``~`` and 8 hex
    digits of its SHA-1, so two different names never give the same file (``sys/1`` and ``sys_1``)."""
    import hashlib

    text = str(text)
    safe = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text)[:80] or "_"
    if safe == text:
        return safe
    return f"{safe}~{hashlib.sha1(text.encode('utf-8')).hexdigest()[:8]}"


#: the folder of the panes' Parquet files (``--formats ...,parquet``): one dataset, Hive-partitioned
#: by the window's UTC date (``window_date=YYYY-MM-DD/``)
PARQUET_DATASET = "metrics_parquet/"


def _window_date(us) -> str:
    """The UTC date of a window start (int microseconds) as ``YYYY-MM-DD`` (``global`` for None)."""
    if us is None:
        return "global"
    return datetime.fromtimestamp(us // 1_000_000, tz=timezone.utc).strftime("%Y-%m-%d")


def pane_file_stem(rows) -> str:
    """``metrics-<start>-<end>-<system>-pane<index>-<pane>[-final]`` for the rows of one pane (one
    window, one system); a session's key is part of its slice, so it is added too."""
    r = rows[0]
    stem = f"metrics-{_iso(r['window_start'])}-{_iso(r['window_end'])}-{_safe(r['system'])}"
    sl = r["slice"]
    if sl.startswith(("user=", "request=")):
        stem += "-" + _safe(sl.split(",", 1)[0])
    stem += f"-pane{r['pane_index']:03d}-{r['pane']}"
    if r["is_final"]:
        stem += "-final"
    return stem.replace(":", "")


class _JsonLinesSink(fileio.FileSink):
    """Writes each element (a pane: a list of rows) as JSON lines."""

    def open(self, fh):
        self._fh = fh

    def write(self, rows):
        from streameval.io.results import json_line

        for r in rows:
            self._fh.write(json_line(r).encode("utf-8") + b"\n")

    def flush(self):
        self._fh.flush()


class _RowsSink(fileio.FileSink):
    """Collects each element's rows (a pane: a list of rows); ``flush`` writes them as one file."""

    def open(self, fh):
        self._fh = fh
        self._rows = []

    def write(self, rows):
        self._rows.extend(rows)


class _AvroSink(_RowsSink):
    """Writes each element (a pane: a list of rows) as one Avro container file (metric_result)."""

    def flush(self):
        import fastavro

        fastavro.writer(self._fh, avro.load_schema("metric_result"), self._rows)
        self._fh.flush()


class _ParquetSink(_RowsSink):
    """Writes each element (a pane: a list of rows) as one Parquet file of the typed metric table
    (:class:`streameval.io.metric_table.MetricTable` of the job's slice attributes: window bounds
    ``timestamp[us, tz=UTC]``, NaN as null, the count by unit, a column per slice attribute), the
    schema of the batch job's ``metrics.parquet``, the same in every pane's file: every pane's file
    is a file of one dataset (:data:`PARQUET_DATASET`)."""

    def __init__(self, table):
        self.table = table

    def flush(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = self.table
        pq.write_table(pa.Table.from_pylist([t.arrow_record(r) for r in self._rows], schema=t.arrow_schema()),
                       self._fh)
        self._fh.flush()


class _CsvSink(fileio.FileSink):
    """Writes each element (a pane: a list of rows) as one CSV file with a header line, the typed
    metric table's columns (:class:`streameval.io.metric_table.MetricTable`: the batch job's
    ``metrics.csv`` columns)."""

    def __init__(self, table):
        self.table = table

    def open(self, fh):
        self._fh = fh
        self._header = False

    def write(self, rows):
        if not self._header:
            self._fh.write((self.table.csv_header() + "\n").encode("utf-8"))
            self._header = True
        for r in rows:
            self._fh.write((self.table.csv_line(r) + "\n").encode("utf-8"))

    def flush(self):
        self._fh.flush()


_SINKS = {"avro": _AvroSink, "jsonl": _JsonLinesSink, "parquet": _ParquetSink, "csv": _CsvSink}


def _pane_sink(dest, table):
    kind = _SINKS[dest.rsplit(".", 1)[-1]]
    return kind(table) if kind in (_ParquetSink, _CsvSink) else kind()


class WriteWindowedFiles(beam.PTransform):
    """``panes | WriteWindowedFiles(directory, formats)``: each pane (the list of rows one firing
    emits for one window and system) to ``<stem>.<format>`` for each of ``formats`` (``jsonl``,
    ``avro``, ``parquet``, ``csv``; see :func:`pane_file_stem`): one file per pane and format,
    written by the step that receives the pane (to a temporary name, then renamed), in whatever
    window the pane comes, so no pane is ever late for the writer. The files of a format are one
    table (same columns: the metric_result schema in Avro and JSON lines; in Parquet and CSV the
    typed table ``table``, a :class:`streameval.io.metric_table.MetricTable` whose slice columns are
    the job's slice attributes, whichever slices a pane holds). The Parquet files form one dataset in the
    folder :data:`PARQUET_DATASET`, Hive-partitioned by the window's UTC date
    (``metrics_parquet/window_date=2019-11-24/<stem>.parquet``): ``pd.read_parquet(folder)``,
    ``pyarrow.dataset.dataset(folder, partitioning="hive")``, Spark's ``spark.read.parquet(folder)``
    and DuckDB's ``read_parquet('folder/*/*.parquet', hive_partitioning=true)`` read it as one
    table with a ``window_date`` column.

    It replaced ``fileio.WriteToFiles`` in the global window with a per-element trigger (issue 21):
    that grouped the panes by file name, and the local runner scans the trigger state of every key
    it has seen (one per file, never released in the global window) at every watermark step and
    lists the output directory at every firing, so a job of many small windows (sessions) slowed
    down quadratically with the number of files written."""

    def __init__(self, directory, formats=("jsonl", "avro"), label=None, table=None):
        super().__init__(label)
        self.directory = directory
        self.formats = tuple(formats)
        self.table = table

    def expand(self, panes):
        return panes | "WritePaneFiles" >> beam.ParDo(_WritePaneFiles(self.directory, self.formats, self.table))


class _WritePaneFiles(beam.DoFn):
    """Writes a pane's files (:class:`WriteWindowedFiles`); yields nothing."""

    def __init__(self, directory, formats, table=None):
        from ...io.metric_table import MetricTable

        self.directory = directory
        self.formats = tuple(formats)
        self.table = table if table is not None else MetricTable()

    def process(self, rows):
        if not rows:
            return ()
        stem = pane_file_stem(rows)
        for f in self.formats:
            name = f"{stem}.{f}"
            folder = self.directory if f != "parquet" else FileSystems.join(
                self.directory, PARQUET_DATASET.rstrip("/"), f"window_date={_window_date(rows[0]['window_start'])}")
            final = FileSystems.join(folder, name)
            temp = FileSystems.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
            sink = _pane_sink(name, self.table)
            with FileSystems.create(temp) as fh:
                sink.open(fh)
                sink.write(rows)
                sink.flush()
            if FileSystems.exists(final):  # a retried bundle: the same pane, the same content
                FileSystems.delete([final])
            FileSystems.rename([temp], [final])
        return ()  # outputs nothing (said so, or Beam warns at every run that no iterator is returned)


class _AppendJsonl(beam.DoFn):
    """Records of a bundle to one new JSON-lines file ``<prefix>-<uuid>.jsonl`` (late data and
    dead letters: unwindowed side outputs)."""

    def __init__(self, directory, prefix):
        self.directory = directory
        self.prefix = prefix

    def start_bundle(self):
        self._recs = []

    def process(self, rec):
        self._recs.append(rec)

    def finish_bundle(self):
        if not self._recs:
            return
        from streameval.io.results import json_line

        path = FileSystems.join(self.directory, f"{self.prefix}-{uuid.uuid4().hex[:12]}.jsonl")
        with FileSystems.create(path) as fo:
            for r in self._recs:
                fo.write(json_line(r).encode("utf-8") + b"\n")
        self._recs = []


class WriteRecords(beam.PTransform):
    """``records | WriteRecords(directory, prefix)``: one JSON-lines file per bundle."""

    def __init__(self, directory, prefix, label=None):
        super().__init__(label)
        self.directory = directory
        self.prefix = prefix

    def expand(self, pcoll):
        return pcoll | "Append" >> beam.ParDo(_AppendJsonl(self.directory, self.prefix))

