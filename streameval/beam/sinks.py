"""Outputs shared by the jobs: Avro and JSON-lines files on any Beam file system, and the completion
manifest that tells a finished output directory from one a killed job left behind.

A job calls :func:`prepare_output` before it runs (it removes the manifest, then the files of the
previous run's outputs, so a rerun over the same directory replaces them cleanly and a reader never
takes a half-written directory for a complete one), adds its writers (:func:`write_records`,
:func:`write_jsonl`) to the pipeline, and calls :func:`publish` after the pipeline finished: it
matches each output's files through ``FileSystems`` (the launcher reads no output's content) and
writes ``manifest.json`` last. Readers check :func:`is_complete`.

Beam's S3 writer cannot write an empty object (a multipart upload with no parts), so on remote file
systems a JSON-lines output with no records writes no file; the manifest lists it with no files.

Layer 3 (Beam): imports :mod:`streameval.io`; nothing from ``pipelines``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from ..io import avro
from . import s3_clients  # noqa: F401 (installs one boto3 client per process for Beam's S3 file system)

__all__ = ["MANIFEST", "FORMATS", "DEFAULT_FORMATS", "parse_formats", "prepare_output", "write_records", "write_jsonl",
           "write_parquet", "write_csv", "bigquery_available", "bigquery_sink", "write_bigquery", "publish", "is_complete", "read_jsonl", "read_metric_rows",
           "output_files", "remove_temporary"]

#: the completion marker: written last, after every output is in place
MANIFEST = "manifest.json"


def _remote(path: str) -> bool:
    return "://" in str(path)


def _json_line(rec) -> str:
    from ..io.results import json_line

    return json_line(rec)


def _listing(out_dir: str) -> dict[str, tuple[str, int]]:
    """``{file name: (path, size in bytes)}`` of the files directly in ``out_dir``, from one listing
    (on S3 every FileSystems call costs a new boto3 client in Beam 2.77: list once, filter here)."""
    found = FileSystems.match([FileSystems.join(out_dir, "*")])[0].metadata_list
    return {m.path.rstrip("/").rsplit("/", 1)[-1]: (m.path, m.size_in_bytes) for m in found}


def _output_names(listing: dict, name: str) -> list[str]:
    if name.endswith("*"):  # a family of files named by a prefix (the stream's pane files)
        return sorted(n for n in listing if n.startswith(name[:-1]))
    stem, ext = os.path.splitext(name)
    shard = re.compile(re.escape(stem) + r"-\d+-of-\d+" + re.escape(ext))
    return sorted(n for n in listing if n == name or shard.fullmatch(n))


def output_files(out_dir: str, name: str, listing: dict | None = None) -> list[str]:
    """The files of output ``name`` (``"metrics.jsonl"``: ``metrics.jsonl`` or its shards
    ``metrics-00000-of-00004.jsonl``; ``"metrics-*"``: every file whose name starts with
    ``metrics-``) in ``out_dir``, sorted; ``listing`` (:func:`_listing`) saves listing the directory
    again."""
    listing = _listing(out_dir) if listing is None else listing
    return sorted(listing[n][0] for n in _output_names(listing, name))


def prepare_output(out_dir: str, names) -> str:
    """Make ``out_dir`` (a local one as an absolute path, returned) and remove what a previous run
    left in it: first the manifest (so the directory no longer passes for complete), then the files
    of the outputs ``names`` and ``summary.json``, and the temporary directories of Beam's sinks that
    a failed run left."""
    if _remote(out_dir):
        if not FileSystems.exists(out_dir):
            FileSystems.mkdirs(out_dir)
    else:
        out_dir = os.path.abspath(out_dir)
        os.makedirs(out_dir, exist_ok=True)
    marker = FileSystems.join(out_dir, MANIFEST)
    if FileSystems.exists(marker):
        FileSystems.delete([marker])
    listing = _listing(out_dir)
    old = sorted({f for name in {*names, "summary.json"} for f in output_files(out_dir, name, listing)})
    if old:
        FileSystems.delete(old)
    _remove_beam_temp(out_dir)
    return out_dir


def remove_temporary(out_dir: str) -> None:
    """After a failed run: remove the temporary files Beam's sinks left in ``out_dir`` (the outputs
    already published stay, without a manifest, so a reader sees an incomplete directory). Errors of
    the file system are ignored: the next run clears them too (:func:`prepare_output`)."""
    try:
        _remove_beam_temp(out_dir)
    except Exception:  # noqa: BLE001 (best effort on the failure path)
        pass


def _remove_beam_temp(out_dir: str) -> None:
    """Remove the ``beam-temp-*`` directories a failed or killed run of Beam's file sinks left in
    ``out_dir`` (a finished run removes its own)."""
    if _remote(out_dir):
        # an object store has no directories: the temporary files are keys out_dir/beam-temp-<...>/<file>,
        # and Beam's "*" does not match "/" (beam-temp-* alone matches nothing)
        found = [m.path for m in FileSystems.match([FileSystems.join(out_dir, "beam-temp-*/**")])[0].metadata_list]
        if found:
            FileSystems.delete(found)
        return
    for d in glob.glob(os.path.join(out_dir, "beam-temp-*")):
        if os.path.isdir(d):
            shutil.rmtree(d)
        else:
            os.unlink(d)


def _shard_args(shards: int | None) -> dict:
    """WriteToText / WriteToAvro arguments: ``shards`` None writes one file named ``stem.ext``; a number
    (0: as many as the runner chooses, one per bundle) writes ``stem-SSSSS-of-NNNNN.ext``."""
    if shards is None:
        return {"num_shards": 1, "shard_name_template": ""}
    return {"num_shards": int(shards)}


def write_jsonl(pcoll, out_dir: str, stem: str, label: str, lines: bool = False, shards: int | None = None):
    """Write ``pcoll`` (records, or with ``lines`` already formatted text elements) as
    ``out_dir/stem.jsonl`` (``shards``: see :func:`_shard_args`). On a remote file system an empty
    output writes no file."""
    text = pcoll if lines else pcoll | f"{label}Json" >> beam.Map(_json_line)
    return text | f"{label}Text" >> beam.io.WriteToText(
        FileSystems.join(out_dir, stem), file_name_suffix=".jsonl", skip_if_empty=_remote(out_dir),
        **_shard_args(shards))


#: the file formats of the jobs' record outputs (``--formats``)
FORMATS = ("avro", "jsonl", "parquet", "csv")
DEFAULT_FORMATS = ("avro", "jsonl")


def parse_formats(text: str) -> tuple[str, ...]:
    """``--formats`` (``avro,jsonl,parquet,csv``) as a tuple in :data:`FORMATS` order. Raises
    ``ValueError`` (one line) for an unknown format or a list without ``jsonl`` (the job reads its
    metric rows back from ``metrics.jsonl``)."""
    given = [f.strip().lower() for f in str(text).split(",") if f.strip()]
    unknown = [f for f in given if f not in FORMATS]
    if unknown:
        raise ValueError(f"--formats: unknown format {unknown[0]!r} (choose from {', '.join(FORMATS)})")
    if "jsonl" not in given:
        raise ValueError("--formats must include jsonl (the job reads its metric rows back from metrics.jsonl)")
    return tuple(f for f in FORMATS if f in given)


def write_parquet(pcoll, out_dir: str, stem: str, schema_name: str, label: str, shards: int | None = None):
    """Write ``pcoll`` as ``out_dir/stem.parquet`` through Beam's ``WriteToParquet`` with the Arrow
    schema of ``schema_name`` (:func:`streameval.io.warehouse.arrow_schema`: nullable where the
    Avro type is a union with null, and every double, NaN written as null; timestamps as
    ``timestamp[us, tz=UTC]``)."""
    from ..io import warehouse

    schema = warehouse.arrow_schema(schema_name)
    return (pcoll | f"{label}ArrowRows" >> beam.Map(warehouse.arrow_record, schema_name)
            | f"{label}Parquet" >> beam.io.WriteToParquet(
                FileSystems.join(out_dir, stem), schema, file_name_suffix=".parquet", **_shard_args(shards)))


def write_csv(pcoll, out_dir: str, stem: str, schema_name: str, label: str):
    """Write ``pcoll`` as one file ``out_dir/stem.csv`` through Beam's ``WriteToText``: a header line
    of the field names of ``schema_name``, then one line per record
    (:func:`streameval.io.warehouse.csv_line`: null and NaN as empty cells, windows as ISO 8601
    UTC text)."""
    from ..io import warehouse

    return (pcoll | f"{label}CsvLines" >> beam.Map(warehouse.csv_line, schema_name)
            | f"{label}Csv" >> beam.io.WriteToText(
                FileSystems.join(out_dir, stem), file_name_suffix=".csv", header=warehouse.csv_header(schema_name),
                **_shard_args(None)))


def write_records(pcoll, out_dir: str, stem: str, schema_name: str, label: str, shards: int | None = None,
                  formats=DEFAULT_FORMATS):
    """Write ``pcoll`` as ``out_dir/stem.avro`` (schema ``schema_name``), ``out_dir/stem.jsonl`` and,
    when in ``formats``, ``stem.parquet`` and ``stem.csv`` (``shards``: see :func:`_shard_args`; the
    CSV file is always one file)."""
    if "avro" in formats:
        schema = avro.load_schema_json(schema_name)
        pcoll | f"{label}Avro" >> beam.io.WriteToAvro(
            FileSystems.join(out_dir, stem), schema=schema, file_name_suffix=".avro", **_shard_args(shards))
    if "jsonl" in formats:
        write_jsonl(pcoll, out_dir, stem, label, shards=shards)
    if "parquet" in formats:
        write_parquet(pcoll, out_dir, stem, schema_name, label, shards=shards)
    if "csv" in formats:
        write_csv(pcoll, out_dir, stem, schema_name, label)


def bigquery_available() -> bool:
    """Whether the BigQuery client libraries Beam's ``WriteToBigQuery`` needs import (Beam's ``gcp``
    extra: ``pip install 'apache-beam[gcp]'``)."""
    try:
        import apitools.base.py  # noqa: F401
        import google.cloud.bigquery  # noqa: F401
    except ImportError:
        return False
    return True


def bigquery_sink(table: str, schema_name: str = "metric_result", **kwargs):
    """Beam's ``WriteToBigQuery`` for the records of ``schema_name`` into ``table``
    (``PROJECT:DATASET.TABLE``), with the table schema of
    :func:`streameval.io.warehouse.bigquery_schema`: creates the table if needed and appends
    (``kwargs`` override these and the method, file loads). Rows must be converted first
    (:func:`streameval.io.warehouse.bigquery_record`; :func:`write_bigquery` does). Raises
    ``ValueError`` for a table not of that form; Beam raises without its BigQuery client libraries."""
    from ..io import warehouse

    if not re.fullmatch(r"[a-z0-9.:-]+:\w+\.[^.:\s]+", table or ""):
        raise ValueError(f"--bigquery-table wants PROJECT:DATASET.TABLE, got {table!r}")
    args = {"schema": warehouse.bigquery_schema(schema_name), "create_disposition": "CREATE_IF_NEEDED",
            "write_disposition": "WRITE_APPEND", "method": "FILE_LOADS", **kwargs}
    return beam.io.WriteToBigQuery(table, **args)


def write_bigquery(pcoll, table: str, schema_name: str = "metric_result", label: str = "Metrics"):
    """Append ``pcoll`` (records of ``schema_name``) to the BigQuery ``table`` (:func:`bigquery_sink`)."""
    from ..io import warehouse

    sink = bigquery_sink(table, schema_name)
    return (pcoll | f"{label}BigQueryRows" >> beam.Map(warehouse.bigquery_record, schema_name)
            | f"{label}BigQuery" >> sink)


def publish(out_dir: str, names, extra: dict | None = None) -> dict:
    """Write ``manifest.json`` into ``out_dir``: each output of ``names`` with its files and their
    sizes in bytes, plus ``extra``. Call it after the pipeline finished and ``summary.json`` is
    written; returns the manifest."""
    listing = _listing(out_dir)  # paths and sizes of every file, one listing
    outputs = {name: [{"path": listing[n][0], "bytes": listing[n][1]} for n in _output_names(listing, name)]
               for name in names}
    manifest = {"complete": True, "outputs": outputs, **(extra or {})}
    with FileSystems.create(FileSystems.join(out_dir, MANIFEST)) as fo:
        fo.write(json.dumps(manifest, indent=2).encode("utf-8"))
    return manifest


def is_complete(out_dir: str) -> bool:
    """Whether ``out_dir`` holds the complete output of a finished job (its manifest exists)."""
    return FileSystems.exists(FileSystems.join(out_dir, MANIFEST))


def read_jsonl(path: str) -> list[dict]:
    """The records of a small JSON-lines output, read through ``FileSystems`` (the launcher reads only
    small outputs this way: the metric rows, the list of damaged files). Raises ``OSError`` when the
    file cannot be read from this machine."""
    rows = []
    try:
        with FileSystems.open(path) as fo:
            data = fo.read()
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 (Beam wraps file-system errors in its own types)
        raise OSError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def read_metric_rows(path: str) -> list[dict]:
    """The metric rows of a ``metrics.jsonl`` output (:func:`read_jsonl`), numbers as floats (a null
    ``value`` is NaN)."""
    from ..io.results import parse_float_fields

    return [parse_float_fields(r) for r in read_jsonl(path)]
