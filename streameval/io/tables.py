"""A job's metric rows as one table: :func:`read_metrics` reads the ``metric_result`` rows of a
finished batch or streaming job's output directory (local, or a prefix on any Beam file system such
as ``s3://`` or ``gs://``) through the job's ``manifest.json``.

The batch job writes its rows to ``metrics.jsonl`` (and ``metrics.avro``; shards
``metrics-00000-of-0000N.jsonl`` off the local runners; with ``--formats ...,parquet`` also
``metrics.parquet``, which is read when present). The streaming job writes one file set per
window, system and pane, ``metrics-<window>-<system>-pane<index>-<pane>[-final].{jsonl,avro}``.
Both write ``manifest.json`` last, listing every output file with its size; a directory without it
is a job that was killed or failed half way (or is no job's output) and is refused. The manifest is
the table's list of files: a file it lists that is missing, or whose size changed since, is an
error; a file it does not list (a stray pane of another run) is not read. On a remote file system
each run writes into its own folder ``runs/<run id>/`` and the manifest, written in one piece when
the run ends, names it (``folder``): the files read are that run's, never a mix of two. The manifest
is read again after the files: when a new run published meanwhile, the rows are read again.

Rows are dicts with the fields of ``schemas/metric_result.avsc`` (:data:`METRIC_FIELDS`): window
bounds as int microseconds since the Unix epoch, UTC (None for the global window), ``value`` a float
(NaN for an empty set; JSON lines write it as null), ``num_queries`` an int, the count behind the
value in the unit ``n_unit`` names (``"queries"``, ``"impressions"``, ``"requests"``...:
:func:`streameval.metrics.units.count_unit`; filled in from the metric's name for files written
before schema version 3, and from a Parquet file's typed columns, ``n`` and ``n_unit``); streaming rows keep
their pane fields (``pane``: ``"early"``, ``"on_time"`` or ``"late"``; ``pane_index`` from 0 within
the window; ``is_final``), batch rows have them None.

Layer 4 (I/O): imports the standard library, fastavro (through :mod:`.avro`), pyarrow for a
Parquet output and, for remote paths
only, Beam's ``FileSystems`` (``apache_beam.io.filesystems``, not :mod:`streameval.beam`); pandas
only for ``as_frame=True`` (the typed table of :mod:`.metric_table`); the metric names of
:mod:`streameval.metrics.online_names` (any spelling of a metric matches its rows) and their units
(:mod:`streameval.metrics.units`).
"""

from __future__ import annotations

import json
import os
import tempfile

from ..metrics.online_names import canonical_metric
from ..metrics.units import count_unit
from .metric_table import SLICE_PREFIX, plain_row, slice_attributes
from .metric_table import rows_frame as _table_frame
from .results import parse_float_fields

__all__ = ["MANIFEST", "METRIC_FIELDS", "KEY_FIELDS", "MetricsTableError", "read_metrics", "final_panes",
           "select_metrics", "metric_files", "rows_frame", "SLICE_PREFIX", "slice_attributes", "file_sizes",
           "file_rows", "read_bytes"]

#: the completion marker the jobs write last (``streameval.beam.sinks.MANIFEST``)
MANIFEST = "manifest.json"
#: the fields of a metric row, in the order of ``schemas/metric_result.avsc``
METRIC_FIELDS = ("window_start", "window_end", "slice", "system", "metric", "value", "num_queries", "n_unit",
                 "stderr", "ci_low", "ci_high", "ci_level", "ci_method", "pane", "pane_index", "is_final",
                 "metric_canonical")
#: the fields that name one value of the table (one row per key and pane)
KEY_FIELDS = ("window_start", "window_end", "slice", "system", "metric")
_REQUIRED = ("slice", "system", "metric", "value", "num_queries")


class MetricsTableError(ValueError):
    """A job output that cannot be read as one metric table: no manifest (an unfinished job), a
    listed file missing or changed, a row that is not a metric row, two rows for one pane. The
    message is one line and names the directory or file (and the line)."""


# --------------------------------------------------------------------------------------------
# files

def _remote(path: str) -> bool:
    return "://" in path


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if _remote(base) else os.path.join(base, name)


def _fs_error(path: str, e: Exception) -> MetricsTableError:
    """A file system's error (Beam's own types, boto3's, a scheme Beam does not know) as one line."""
    return MetricsTableError(f"{path}: cannot read: {type(e).__name__}: {' '.join(str(e).split())}")


def read_bytes(path: str) -> bytes:
    """The bytes of a local file or of any Beam file system's file; ``MetricsTableError`` (one line)
    when it cannot be read."""
    try:
        if not _remote(path):
            with open(path, "rb") as fo:
                return fo.read()
        with _filesystems().open(path) as fo:
            return fo.read()
    except OSError as e:
        raise MetricsTableError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    except Exception as e:  # noqa: BLE001 (Beam wraps file-system errors in its own types)
        raise _fs_error(path, e) from None


def file_sizes(directory: str) -> dict[str, int]:
    """``{file name: size in bytes}`` of the files directly in ``directory`` (one listing)."""
    if not _remote(directory):
        out = {}
        with os.scandir(directory) as it:
            for e in it:
                if e.is_file():
                    out[e.name] = e.stat().st_size
        return out
    try:
        found = _filesystems().match([_join(directory, "*")])[0].metadata_list
    except Exception as e:  # noqa: BLE001 (see _fs_error)
        raise _fs_error(directory, e) from None
    return {m.path.rstrip("/").rsplit("/", 1)[-1]: m.size_in_bytes for m in found}


def _is_file(path: str) -> bool:
    if not _remote(path):
        return os.path.isfile(path)
    return path.endswith((".jsonl", ".avro", ".parquet"))


def _manifest(directory: str) -> dict:
    return _parse_manifest(directory, _manifest_bytes(directory))


def _manifest_bytes(directory: str) -> bytes:
    marker = _join(directory, MANIFEST)
    if _remote(directory):
        try:
            exists = _filesystems().exists(marker)
        except Exception as e:  # noqa: BLE001 (see _fs_error)
            raise _fs_error(directory, e) from None
    else:
        if not os.path.isdir(directory):
            raise MetricsTableError(f"{directory}: no such file or directory")
        exists = os.path.isfile(marker)
    if not exists:
        raise MetricsTableError(f"{directory}: no {MANIFEST}: the job did not finish (killed or failed half way) "
                                "or this is not a job's output directory; its files are not read as a table")
    return read_bytes(marker)


def _parse_manifest(directory: str, data: bytes) -> dict:
    marker = _join(directory, MANIFEST)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetricsTableError(f"{marker}: not a manifest (not JSON: {e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
        raise MetricsTableError(f"{marker}: not a manifest (no 'outputs')")
    if manifest.get("complete") is not True:
        raise MetricsTableError(f"{marker}: the manifest does not mark the output complete")
    return manifest


def metric_files(path, manifest: dict | None = None) -> list[str]:
    """The files that hold the metric rows of the output directory ``path`` (a local directory or a
    remote prefix, e.g. ``s3://bucket/out``), in the manifest's order (by name): the batch job's
    ``metrics.parquet`` when it wrote one (``--formats ...,parquet``), else ``metrics.jsonl`` (or
    their shards), or the streaming job's ``metrics-*.jsonl`` pane files; the ``.avro`` twins only
    when the job wrote no JSON lines. Paths are ``path`` joined with the names
    the manifest lists (the directory may have been moved or copied since), in the run's folder
    the manifest names (``folder``: ``runs/<run id>`` on remote file systems, where each run writes
    into its own folder and the manifest publishes it). ``manifest``: the manifest already read.

    Raises :class:`MetricsTableError` when ``path`` has no ``manifest.json`` (a killed or failed
    job), the manifest lists no metric output, or a listed file is missing or its size differs from
    the manifest's."""
    directory = os.fspath(path)
    if not _remote(directory):
        directory = os.path.abspath(directory)
    manifest = _manifest(directory) if manifest is None else manifest
    outputs = manifest["outputs"]
    folder = manifest.get("folder") or ""
    if not isinstance(folder, str) or folder.startswith("/") or ".." in folder.split("/"):
        raise MetricsTableError(f"{_join(directory, MANIFEST)}: not a manifest (folder {folder!r})")
    if folder:  # the run's own folder (remote outputs)
        directory = _join(directory, folder) if _remote(directory) else os.path.join(directory, *folder.split("/"))

    def names(key):
        """{file name: bytes} of the files the manifest lists for output ``key``."""
        return {str(e.get("path", "")).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]: e.get("bytes")
                for e in outputs.get(key) or [] if isinstance(e, dict)}

    if "metrics.parquet" in outputs:  # the batch job with --formats ...,parquet: typed columns
        sizes = names("metrics.parquet")
        chosen = list(sizes)
    elif "metrics.jsonl" in outputs:  # the batch job (an empty output on S3 lists no file: no rows)
        sizes = names("metrics.jsonl")
        chosen = list(sizes)
    elif "metrics.avro" in outputs:
        sizes = names("metrics.avro")
        chosen = list(sizes)
    elif "metrics-*" in outputs:  # the streaming job: one file per window, system, pane and format
        sizes = names("metrics-*")
        chosen = [n for n in sizes if n.endswith(".jsonl")] or [n for n in sizes if n.endswith(".avro")]
    else:
        raise MetricsTableError(f"{_join(directory, MANIFEST)}: lists no metric output (metrics.jsonl or metrics-*)")
    chosen = sorted(chosen)
    if chosen:
        present = file_sizes(directory)
        for n in chosen:
            if n not in present:
                raise MetricsTableError(f"{_join(directory, n)}: listed in {MANIFEST} but missing")
            want = sizes.get(n)
            if isinstance(want, int) and present[n] != want:
                raise MetricsTableError(f"{_join(directory, n)}: {present[n]} bytes, {MANIFEST} lists {want}: "
                                        "the file changed after the job finished")
    return [_join(directory, n) for n in chosen]


# --------------------------------------------------------------------------------------------
# rows

def _check(rec, where: str) -> dict:
    if not isinstance(rec, dict):
        raise MetricsTableError(f"{where}: not a JSON object")
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        raise MetricsTableError(f"{where}: not a metric row (lacks {', '.join(missing)})")
    for k in METRIC_FIELDS:
        rec.setdefault(k, None)
    if rec["metric_canonical"] is None and rec["metric"] is not None:  # a row of schema version 1
        rec["metric_canonical"] = canonical_metric(rec["metric"])
    if rec["n_unit"] is None and rec["metric"] is not None:  # a row of schema version 2 or older
        rec["n_unit"] = count_unit(rec["metric"])
    return rec


def _jsonl_rows(path: str) -> list[dict]:
    rows = []
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetricsTableError(f"{path}: not UTF-8 text ({e.reason})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsTableError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        rows.append(parse_float_fields(_check(rec, f"{path}:{lineno}")))
    return rows


def _avro_rows(path: str) -> list[dict]:
    from . import avro

    local, tmp = path, None
    try:
        if _remote(path):
            fd, tmp = tempfile.mkstemp(suffix=".avro", prefix="streameval-metrics-")
            with os.fdopen(fd, "wb") as fo:
                fo.write(read_bytes(path))
            local = tmp
        try:
            recs = avro.read_records(local, "metric_result")
            return [_check(r, f"{path}: record {i + 1}") for i, r in enumerate(recs)]
        except avro.AvroInputError as e:
            raise MetricsTableError(" ".join(str(e).split())) from None
    finally:
        if tmp is not None:
            os.unlink(tmp)


def _parquet_rows(path: str) -> list[dict]:
    """The rows of a ``metrics.parquet`` file (the typed table, :class:`streameval.io.metric_table.
    MetricTable`, or the metric_result columns of files written before it) in the metric_result
    shape (:func:`~streameval.io.metric_table.plain_row`): timestamps back to int microseconds, a
    null ``value`` as NaN, ``num_queries`` the count ``n``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(read_bytes(path)))
    except (pa.ArrowException, OSError) as e:
        raise MetricsTableError(f"{path}: not a Parquet file ({' '.join(str(e).split())})") from None
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):  # as int microseconds since the epoch, UTC
            col = table.column(i).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            table = table.set_column(i, field.name, col)
    return [parse_float_fields(_check(plain_row(r), f"{path}: row {i + 1}")) for i, r in enumerate(table.to_pylist())]


def file_rows(path: str) -> list[dict]:
    """The metric rows of one file (Avro, Parquet, else JSON lines) as metric_result dicts;
    ``MetricsTableError`` (one line, naming the file and line) for what is not a metric row."""
    if path.endswith(".avro"):
        return _avro_rows(path)
    return _parquet_rows(path) if path.endswith(".parquet") else _jsonl_rows(path)


def _key_text(key) -> str:
    return ", ".join(f"{f} {v}" for f, v in zip(KEY_FIELDS, key))


def final_panes(rows) -> list[dict]:
    """The last pane of each (window_start, window_end, slice, system, metric): the row with
    ``is_final`` true, else the one with the largest ``pane_index``; batch rows (one per key, no
    pane) are kept as they are. Rows stay in the order of their key's first row.

    Raises :class:`MetricsTableError` when two rows of one key cannot be ordered (no pane fields,
    or the same ``pane_index`` and finality): not one job's table."""
    best: dict = {}
    for r in rows:
        key = tuple(r.get(f) for f in KEY_FIELDS)
        old = best.get(key)
        if old is None:
            best[key] = r
            continue
        ra = (bool(old.get("is_final")), old.get("pane_index"))
        rb = (bool(r.get("is_final")), r.get("pane_index"))
        if ra[1] is None or rb[1] is None or ra == rb:
            raise MetricsTableError(f"two rows for {_key_text(key)} and no pane to choose between them "
                                    f"(pane_index {ra[1]} and {rb[1]}): not one job's table")
        if rb > ra:
            best[key] = r
    return list(best.values())


def rows_frame(rows):
    """Metric rows (dicts) as the pandas DataFrame :func:`read_metrics` gives with ``as_frame=True``
    (the typed table's columns and dtypes, :func:`streameval.io.metric_table.rows_frame`; also
    :func:`streameval.evaluate_log`'s). Raises ImportError without pandas."""
    return _frame(rows)


def _frame(rows):
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise ImportError("read_metrics(as_frame=True) needs pandas (pip install pandas); "
                          "without it, read the rows as dicts") from None
    return _table_frame(rows)


#: reads of a directory whose manifest changed while its files were read (a new run published) before giving up
READ_ATTEMPTS = 3


def _directory_rows(path: str) -> list[dict]:
    """The rows of the files the manifest of ``path`` lists, all of one run: the manifest is read
    again after the files, and when a new run published meanwhile (another manifest) the files are
    read again (:data:`READ_ATTEMPTS` times at most)."""
    directory = path if _remote(path) else os.path.abspath(path)
    for _ in range(READ_ATTEMPTS):
        data = _manifest_bytes(directory)
        try:
            rows = []
            for f in metric_files(path, _parse_manifest(directory, data)):
                rows.extend(file_rows(f))
            error = None
        except MetricsTableError as e:  # a file replaced or removed by a run that published meanwhile?
            rows, error = None, e
        try:
            same = _manifest_bytes(directory) == data
        except MetricsTableError:
            same = False
        if same:
            if error is not None:
                raise error
            return rows
    raise MetricsTableError(f"{directory}: a new run published while its rows were read, {READ_ATTEMPTS} times: "
                            "read it again when no job writes it")


def read_metrics(path, final_only: bool = False, as_frame: bool = False, metrics=None):
    """The metric rows of a finished job's output ``path``: a batch or a streaming job's
    ``--output`` directory (local, or a prefix on a Beam file system: ``s3://``, ``gs://``; remote
    paths are read through ``FileSystems``, so its options must be set as for the jobs), read
    through its ``manifest.json`` (:func:`metric_files`; its ``metrics.parquet`` when the job wrote
    one). A single ``metric_result`` file (``.jsonl``, ``.avro`` or ``.parquet``) is read as it is,
    without a manifest.

    Returns a list of dicts with the :data:`METRIC_FIELDS` (see the module docstring for types and
    units): one per row written, every pane of a streaming job in file order (by window, system and
    pane index). ``final_only``: only the last pane of each window, slice, system and metric
    (:func:`final_panes`), what a reconciliation compares with the batch job. ``as_frame``: a pandas
    DataFrame of the typed table instead (:mod:`streameval.io.metric_table`, the columns of the
    jobs' Parquet and CSV files): window bounds as ``datetime64[us, UTC]``, NaT for the global
    window; after ``slice`` one ``string`` column per slice attribute of the rows (``slice_campaign``
    for ``campaign=men``; null where a row's slice does not fix it: :func:`slice_attributes`); the
    count as ``n`` with its unit ``n_unit``, then ``num_queries``, ``num_impressions`` and
    ``num_requests`` holding it where the unit is that and null elsewhere (all nullable ``Int64``, as
    ``pane_index``); ``is_final`` as nullable ``boolean``. ``metrics``: only the rows of these
    metrics (a name or a list; any spelling, ``nDCG@10`` finds ``ndcg_cut_10``'s rows, and
    ir_measures Measure objects), matched on ``metric_canonical`` (filled in for the rows of files
    written before it, schema version 1).

    Raises :class:`MetricsTableError` (a ``ValueError``, one line) for a directory without manifest
    (a job killed or failed half way), a listed file missing or changed, a row that is not a metric
    row, or two rows that ``final_only`` cannot choose between; ``ImportError`` for ``as_frame``
    without pandas."""
    path = os.fspath(path)
    if not path:
        raise MetricsTableError("no path given")
    if _is_file(path):
        rows = file_rows(path)
    else:
        rows = _directory_rows(path)
    if metrics is not None:
        rows = select_metrics(rows, metrics)
    if final_only:
        rows = final_panes(rows)
    return _frame(rows) if as_frame else rows


def select_metrics(rows, metrics) -> list[dict]:
    """The rows of ``metrics`` (a name or names in any spelling, :func:`~streameval.metrics.
    online_names.canonical_metric`), matched on the rows' ``metric_canonical`` (computed from
    ``metric`` where a row lacks it)."""
    if isinstance(metrics, str) or not hasattr(metrics, "__iter__"):
        metrics = [metrics]
    wanted = {canonical_metric(m) for m in metrics}
    return [r for r in rows if (r.get("metric_canonical") or canonical_metric(r["metric"])) in wanted]

