"""Outputs shared by the jobs: Avro and JSON-lines files on any Beam file system, the completion
manifest that tells a finished output directory from one a killed job left behind, and a run's hold
on its output folder.

A job calls :func:`start_output` once its inputs are checked and before it builds the pipeline: it
refuses an ``--output`` that overlaps an input, takes the folder's lock (local folders;
:mod:`streameval.io.outdir`) and gives the run a folder of its own to write into (``write_dir``:
a hidden staging folder in a local ``--output``, ``runs/<run id>/`` in a remote one). The job adds
its writers (:func:`write_records`, :func:`write_jsonl`) on ``write_dir``, writes ``summary.json``
there when the pipeline finished, and calls :func:`publish`: it matches each output's files through
``FileSystems`` (the launcher reads no output's content), replaces the previous run's outputs with
them (local: moved into ``--output``) and writes ``manifest.json`` last (remote: the manifest,
naming the run's folder, is the one write that publishes it). :func:`close_output`, called in every
case, removes what a run that did not publish wrote and releases the lock: the previous run's
outputs stay whole and readable until a new run publishes. A local run's ``summary.json`` says
``"state": "RUNNING"`` (its run id, the published run's id) from its start, so a killed rerun does
not look finished; a run that ends without publishing puts the previous summary back (live: FAILED). Readers check :func:`is_complete`. The
streaming job's live panes (``live``) are written into a local ``--output`` in place.

Beam's S3 writer cannot write an empty object (a multipart upload with no parts), so on remote file
systems a JSON-lines output with no records writes no file; the manifest lists it with no files.

Layer 3 (Beam): imports :mod:`streameval.io`; nothing from ``streameval.jobs``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from ..io import avro, outdir
from ..io.outdir import OutputLock
from .arguments import make_output_dir

__all__ = ["MANIFEST", "RUNS", "STAGING_PREFIX", "FORMATS", "DEFAULT_FORMATS", "parse_formats", "OutputRun",
           "start_output", "close_output", "write_records", "write_jsonl", "write_parquet", "write_csv",
           "bigquery_available", "bigquery_sink", "write_bigquery", "publish", "is_complete", "read_jsonl",
           "read_metric_rows", "output_files"]

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


def _folder_files(out_dir: str, name: str) -> dict[str, int]:
    """``{path: size in bytes}`` of every file under the folder output ``name`` (``"metrics_parquet/"``)
    of ``out_dir``, at any depth; empty when there is none."""
    try:
        found = FileSystems.match([FileSystems.join(out_dir, name.rstrip("/"), "**")])[0].metadata_list
    except Exception:  # noqa: BLE001 (a folder that does not exist: nothing)
        return {}
    return {m.path: m.size_in_bytes for m in found}


def output_files(out_dir: str, name: str, listing: dict | None = None) -> list[str]:
    """The files of output ``name`` (``"metrics.jsonl"``: ``metrics.jsonl`` or its shards
    ``metrics-00000-of-00004.jsonl``; ``"metrics-*"``: every file whose name starts with
    ``metrics-``; ``"metrics_parquet/"``: every file under that folder, a dataset's partitions) in
    ``out_dir``, sorted; ``listing`` (:func:`_listing`) saves listing the directory again."""
    if name.endswith("/"):
        return sorted(_folder_files(out_dir, name))
    listing = _listing(out_dir) if listing is None else listing
    return sorted(listing[n][0] for n in _output_names(listing, name))


#: remote outputs: each run's folder under ``--output`` (``runs/<run id>/``), named by the manifest
RUNS = "runs"
#: local outputs: the folder a run writes into (``.streameval-run-<run id>/`` in ``--output``) before it publishes
STAGING_PREFIX = ".streameval-run-"


@dataclasses.dataclass
class OutputRun:
    """One run's hold on an ``--output`` folder (:func:`start_output`).

    ``mode``: ``"staged"`` (a local folder: the pipeline writes into ``write_dir``, a hidden folder
    in ``output``, and :func:`publish` moves the files into ``output``, replacing the previous
    run's, then writes the manifest), ``"live"`` (a local folder written in place, the streaming
    job's live panes: the previous run's outputs are removed when the run starts) or ``"folder"``
    (a remote folder, which has no locks: the run writes into its own folder ``runs/<run id>/`` and
    :func:`publish` writes the manifest that names it, in one write; the previous run's folder is
    removed after). ``lock``: the folder's lock (local folders)."""

    output: str
    write_dir: str
    run_id: str
    mode: str
    names: tuple = ()
    lock: OutputLock | None = None
    published: bool = False
    closed: bool = False
    #: the published run's ``summary.json`` (bytes) that this run's RUNNING one replaced (staged; live
    #: and resumed: the stopped run's), or None
    previous_summary: bytes | None = None

    @property
    def previous_run(self) -> dict | None:
        """:attr:`previous_summary` as JSON, or None (none, or not JSON)."""
        if self.previous_summary is None:
            return None
        try:
            return json.loads(self.previous_summary.decode("utf-8"))
        except ValueError:
            return None

    @property
    def result_dir(self) -> str:
        """Where the outputs are once published: ``output``, or the run's own folder (remote)."""
        return self.write_dir if self.mode == "folder" else self.output

    @property
    def notice(self) -> str | None:
        """The one line to print when the lock of a job that died was taken over."""
        return self.lock.notice if self.lock is not None else None


def _new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def start_output(out_dir: str, names, inputs=(), live: bool = False, command: str = "",
                 resume: bool = False) -> OutputRun:
    """Take the output folder ``out_dir`` for one run, before the pipeline is built.

    1. Refuse an ``out_dir`` that overlaps an input (``inputs``: ``(option, patterns, files)``;
       :func:`streameval.io.outdir.check_overlap` raises ``OutputOverlapError``), before anything is
       touched.
    2. A local folder: make it and take its lock (``OutputInUseError`` when another job holds it);
       remove what killed runs left (their staging folders, Beam's temporary folders); then with
       ``live`` remove the previous run's outputs (manifest first), else make this run's staging
       folder. ``live`` and ``resume`` (a streaming job restored from a savepoint or checkpoint:
       it goes on with the stopped job's windows and pane indexes): the previous run's outputs stay
       and only its manifest goes; its ``summary.json`` is kept in ``previous_summary``. A remote
       folder: this run's folder ``runs/<run id>/`` (``resume``: ValueError, a run's panes are in
       its own folder).

    ``names`` are the outputs a run of this job may write (:func:`output_files`' names), removed
    when a new run publishes (or, ``live``, when it starts). Returns the :class:`OutputRun`; call
    :func:`publish` when the job finished and :func:`close_output` in every case."""
    outdir.check_overlap(out_dir, inputs)
    names = tuple(dict.fromkeys([*names, "summary.json"]))
    run_id = _new_run_id()
    if resume and (_remote(out_dir) or not live):
        raise ValueError(f"{out_dir}: a resumed streaming job goes on writing a local --output folder (a remote one "
                         "keeps each run's panes in a folder of its own): give a local folder")
    if _remote(out_dir):
        out_dir = out_dir.rstrip("/")
        if not FileSystems.exists(out_dir):
            make_output_dir(out_dir)
        return OutputRun(out_dir, FileSystems.join(out_dir, RUNS, run_id), run_id, "folder", names)
    out_dir = os.path.abspath(out_dir)
    make_output_dir(out_dir)  # ValueError naming it: a file in the way, no permission
    lock = outdir.OutputLock(out_dir, command).acquire()
    try:
        # from its first step the folder's summary.json says a run is under way (a killed rerun left
        # the previous run's "state": "DONE"): written at once after the lock, before anything slower
        # (clearing the folder goes through Beam's file systems); a staged run that ends without
        # publishing puts the previous summary back
        previous = None
        summary = os.path.join(out_dir, SUMMARY)
        if (not live or resume) and os.path.isfile(summary):
            with open(summary, "rb") as fo:
                data = fo.read()
            if _state(data) != "RUNNING":  # a killed run's RUNNING summary is not put back
                previous = data
        mode = "live" if live else "staged"
        _write_summary(out_dir, _running_summary(run_id, command, mode, None if live else _published_run(out_dir)), run_id)
        for d in glob.glob(os.path.join(glob.escape(out_dir), STAGING_PREFIX + "*")):  # a killed run's
            shutil.rmtree(d, ignore_errors=True)
        _remove_beam_temp(out_dir)
        if live:
            # the summary is this run's already; a resumed run keeps the stopped run's files
            _clear(out_dir, [] if resume else [n for n in names if n != SUMMARY])
            run = OutputRun(out_dir, out_dir, run_id, "live", names, lock)
            run.previous_summary = previous if resume else None
            return run
        staging = os.path.join(out_dir, STAGING_PREFIX + run_id)
        os.mkdir(staging)
        run = OutputRun(out_dir, staging, run_id, "staged", names, lock)
        run.previous_summary = previous
        return run
    except BaseException:
        try:  # the folder as the run found it: its summary back (staged) or none
            if _summary_run_id(out_dir) == run_id:
                if previous is not None:
                    _write_summary(out_dir, previous, run_id)
                else:
                    os.unlink(os.path.join(out_dir, SUMMARY))
        except OSError:
            pass
        lock.release()
        raise


def _summary_run_id(out_dir: str) -> str | None:
    """The ``run_id`` of ``out_dir/summary.json``, or None."""
    try:
        with open(os.path.join(out_dir, SUMMARY), "rb") as fo:
            return json.loads(fo.read().decode("utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


#: the run's summary: RUNNING from the start of a local run (:func:`start_output`), the job's own when it ends
SUMMARY = "summary.json"


def _state(data: bytes):
    """The ``"state"`` of a summary.json's bytes (None when it has none or is not JSON)."""
    try:
        return json.loads(data.decode("utf-8")).get("state")
    except (ValueError, AttributeError):
        return None


def _published_run(out_dir: str) -> str | None:
    """The run id of the manifest in ``out_dir`` (the outputs a reader gets), or None."""
    try:
        with open(os.path.join(out_dir, MANIFEST), "rb") as fo:
            run_id = json.loads(fo.read().decode("utf-8")).get("run_id")
        return run_id if isinstance(run_id, str) else None
    except (OSError, ValueError, AttributeError):
        return None


def _running_summary(run_id: str, command: str, mode: str, published: str | None) -> dict:
    """The ``summary.json`` of a local run under way (replaced by the job's own when it publishes)."""
    return {
        "state": "RUNNING",
        "run_id": run_id,
        "command": command,
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "published_run_id": published,
        "note": ("this run has not finished: its outputs are not here yet; "
                 + (f"the outputs here are run {published}'s (manifest.json) until it publishes"
                    if published else "manifest.json, written last, marks a finished run's outputs")
                 if mode == "staged" else
                 "this run has not finished: its files here are incomplete until manifest.json is written"),
    }


def _write_summary(out_dir: str, summary: dict | bytes, run_id: str) -> None:
    """``out_dir/summary.json``, replaced in one rename (a reader sees the old file or the new one)."""
    data = summary if isinstance(summary, bytes) else json.dumps(summary, indent=2).encode("utf-8")
    tmp = os.path.join(out_dir, f".{SUMMARY}.{run_id}.tmp")
    with open(tmp, "wb") as fo:
        fo.write(data)
    os.replace(tmp, os.path.join(out_dir, SUMMARY))


def _clear(out_dir: str, names) -> None:
    """Remove the manifest of ``out_dir`` (so it no longer passes for complete), then the files of the
    outputs ``names``."""
    marker = FileSystems.join(out_dir, MANIFEST)
    if FileSystems.exists(marker):
        FileSystems.delete([marker])
    listing = _listing(out_dir)
    old = sorted({f for name in names for f in output_files(out_dir, name, listing)})
    if old:
        FileSystems.delete(old)
    for name in names:  # a local folder output's (now empty) partition folders
        if name.endswith("/") and not _remote(out_dir):
            shutil.rmtree(os.path.join(out_dir, name.rstrip("/")), ignore_errors=True)


def holding_outputs(body, argv) -> int:
    """Run a job's ``body(argv, held)`` and then end every hold in ``held``, the list the body appends
    each :func:`start_output` run to (:func:`close_output`, on every path: success, error, exception).
    Returns the body's exit status."""
    held: list = []
    try:
        return body(argv, held)
    finally:
        for run in held:
            close_output(run)


def close_output(run: OutputRun | None) -> None:
    """End the run's hold on its output folder: a run that did not publish (it failed or was refused)
    removes what it wrote (its staging or run folder; live, Beam's temporary files), leaving the
    previous run's outputs as they were; then the lock is released. Idempotent; errors of the file
    system on this path are ignored."""
    if run is None or run.closed:
        return
    run.closed = True
    try:
        if not run.published:
            if run.mode == "staged":
                shutil.rmtree(run.write_dir, ignore_errors=True)
                _end_running_summary(run)
            elif run.mode == "folder":
                _delete_tree(run.write_dir)
            else:
                _remove_beam_temp(run.write_dir)
                _end_running_summary(run)
    except Exception:  # noqa: BLE001 (best effort on the failure path; the next run clears it)
        pass
    finally:
        if run.lock is not None:
            run.lock.release()


def _end_running_summary(run: OutputRun) -> None:
    """A local run that ends without publishing: its RUNNING ``summary.json`` gives way to what is
    true. Staged: the published run's summary is put back (none: removed), the folder as the run
    found it. Live (files written in place): ``"state": "FAILED"``, the files here incomplete."""
    path = os.path.join(run.output, SUMMARY)
    try:
        with open(path, "rb") as fo:
            mine = json.loads(fo.read().decode("utf-8")).get("run_id") == run.run_id
    except (OSError, ValueError, AttributeError):
        mine = False
    if not mine:  # the job wrote its own (a live run that failed after its summary), or none is there
        return
    if run.mode == "live":
        failed: dict = {"state": "FAILED", "run_id": run.run_id,
                        "note": "this run ended without finishing: its files here are incomplete (no manifest.json)"}
        previous = run.previous_run
        if previous is not None:  # a resumed run: the stopped run's summary stays readable
            failed["previous_run"] = previous
        _write_summary(run.output, failed, run.run_id)
    elif run.previous_summary is not None:
        _write_summary(run.output, run.previous_summary, run.run_id)
    else:
        os.unlink(path)


def _delete_tree(prefix: str) -> None:
    """Delete every file under ``prefix`` (a remote folder: keys ``prefix/...``; Beam's ``**`` matches
    across ``/``)."""
    found = [m.path for m in FileSystems.match([FileSystems.join(prefix, "**")])[0].metadata_list]
    if found:
        FileSystems.delete(found)


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
    for d in glob.glob(os.path.join(glob.escape(out_dir), "beam-temp-*")):
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
from .arguments import DEFAULT_FORMATS, FORMATS  # noqa: E402,F401  (the command line's, Beam-free)


def parse_formats(text: str) -> tuple[str, ...]:
    """``--formats`` (``avro,jsonl,parquet,csv``) as a tuple in :data:`FORMATS` order. Raises
    ``ValueError`` (one line) for an unknown format or a list without ``jsonl`` (the jobs read their
    metric rows back from ``metrics.jsonl`` or the stream's ``metrics-*.jsonl``)."""
    given = [f.strip().lower() for f in str(text).split(",") if f.strip()]
    unknown = [f for f in given if f not in FORMATS]
    if unknown:
        raise ValueError(f"--formats: unknown format {unknown[0]!r} (choose from {', '.join(FORMATS)})")
    if "jsonl" not in given:
        raise ValueError("--formats must include jsonl (the jobs and read_metrics read the metric rows back from "
                         "the JSON-lines files)")
    return tuple(f for f in FORMATS if f in given)


def write_parquet(pcoll, out_dir: str, stem: str, schema_name: str, label: str, shards: int | None = None,
                  table=None):
    """Write ``pcoll`` as ``out_dir/stem.parquet`` through Beam's ``WriteToParquet`` with the Arrow
    schema of ``schema_name`` (:func:`streameval.io.warehouse.arrow_schema`: nullable where the
    Avro type is a union with null, and every double, NaN written as null; timestamps as
    ``timestamp[us, tz=UTC]``), or with ``table`` (metric rows: a
    :class:`streameval.io.metric_table.MetricTable`) the columns of that typed table."""
    from ..io import warehouse

    if table is not None:
        schema, arrow_rows = table.arrow_schema(), beam.Map(table.arrow_record)
    else:
        schema, arrow_rows = warehouse.arrow_schema(schema_name), beam.Map(warehouse.arrow_record, schema_name)
    return (pcoll | f"{label}ArrowRows" >> arrow_rows
            | f"{label}Parquet" >> beam.io.WriteToParquet(
                FileSystems.join(out_dir, stem), schema, file_name_suffix=".parquet", **_shard_args(shards)))


def write_csv(pcoll, out_dir: str, stem: str, schema_name: str, label: str, table=None):
    """Write ``pcoll`` as one file ``out_dir/stem.csv`` through Beam's ``WriteToText``: a header line
    of the field names of ``schema_name`` (with ``table``, a
    :class:`streameval.io.metric_table.MetricTable`: the typed table's columns), then one line per
    record (:func:`streameval.io.warehouse.csv_line`: null and NaN as empty cells, windows as ISO
    8601 UTC text)."""
    from ..io import warehouse

    if table is not None:
        header, lines = table.csv_header(), beam.Map(table.csv_line)
    else:
        header, lines = warehouse.csv_header(schema_name), beam.Map(warehouse.csv_line, schema_name)
    return (pcoll | f"{label}CsvLines" >> lines
            | f"{label}Csv" >> beam.io.WriteToText(
                FileSystems.join(out_dir, stem), file_name_suffix=".csv", header=header, **_shard_args(None)))


def write_records(pcoll, out_dir: str, stem: str, schema_name: str, label: str, shards: int | None = None,
                  formats=DEFAULT_FORMATS, table=None):
    """Write ``pcoll`` as ``out_dir/stem.avro`` (schema ``schema_name``), ``out_dir/stem.jsonl`` and,
    when in ``formats``, ``stem.parquet`` and ``stem.csv`` (``shards``: see :func:`_shard_args`; the
    CSV file is always one file). ``table``: metric rows' Parquet and CSV files as that typed table
    (a :class:`streameval.io.metric_table.MetricTable`: the count's columns by unit, a column per
    slice attribute) rather than the schema's fields."""
    if "avro" in formats:
        schema = avro.load_schema_json(schema_name)
        pcoll | f"{label}Avro" >> beam.io.WriteToAvro(
            FileSystems.join(out_dir, stem), schema=schema, file_name_suffix=".avro", **_shard_args(shards))
    if "jsonl" in formats:
        write_jsonl(pcoll, out_dir, stem, label, shards=shards)
    if "parquet" in formats:
        write_parquet(pcoll, out_dir, stem, schema_name, label, shards=shards, table=table)
    if "csv" in formats:
        write_csv(pcoll, out_dir, stem, schema_name, label, table=table)


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
    :func:`streameval.io.warehouse.bigquery_schema`: creates the table if needed and appends, adding
    the nullable fields a newer schema version has to a table an older one created
    (``schemaUpdateOptions`` ``ALLOW_FIELD_ADDITION``: metric_result's ``n_unit``, version 3)
    (``kwargs`` override these and the method, file loads). Rows must be converted first
    (:func:`streameval.io.warehouse.bigquery_record`; :func:`write_bigquery` does). Raises
    ``ValueError`` for a table not of that form; Beam raises without its BigQuery client libraries."""
    from ..io import warehouse

    if not re.fullmatch(r"[a-z0-9.:-]+:\w+\.[^.:\s]+", table or ""):
        raise ValueError(f"--bigquery-table wants PROJECT:DATASET.TABLE, got {table!r}")
    args = {"schema": warehouse.bigquery_schema(schema_name), "create_disposition": "CREATE_IF_NEEDED",
            "write_disposition": "WRITE_APPEND", "method": "FILE_LOADS",
            "additional_bq_parameters": {"schemaUpdateOptions": ["ALLOW_FIELD_ADDITION"]}, **kwargs}
    return beam.io.WriteToBigQuery(table, **args)


def write_bigquery(pcoll, table: str, schema_name: str = "metric_result", label: str = "Metrics"):
    """Append ``pcoll`` (records of ``schema_name``) to the BigQuery ``table`` (:func:`bigquery_sink`)."""
    from ..io import warehouse

    sink = bigquery_sink(table, schema_name)
    return (pcoll | f"{label}BigQueryRows" >> beam.Map(warehouse.bigquery_record, schema_name)
            | f"{label}BigQuery" >> sink)


def publish(run: OutputRun, names, extra: dict | None = None) -> dict:
    """Publish the run's outputs ``names`` (call it after the pipeline finished and ``summary.json``
    is written into ``run.write_dir``); returns the manifest: each output with its files and their
    sizes in bytes, ``run_id``, ``folder`` (the run's folder relative to ``run.output``, ``""`` when
    the files are in it) and ``extra``.

    * ``staged`` (local; the folder's lock is held): the previous run's manifest is removed, then its
      outputs, the new files are moved (renamed) into ``run.output`` and the manifest is written
      last (a temporary file renamed into place). A run that fails before never touches the
      previous run's outputs.
    * ``live`` (local): the files are in place; the manifest is written.
    * ``folder`` (remote): the manifest naming the run's folder ``runs/<run id>/`` is written in one
      write, the moment the new outputs replace the previous run's for every reader; then the
      previous run's folder (or the top-level files of an output written before run folders) is
      removed (best effort: a reader of the old manifest gets an error naming a missing file, never
      a mix).
    """
    extra = {"run_id": run.run_id, "folder": "", **(extra or {})}
    names = list(names)
    if run.mode == "folder":
        return _publish_folder(run, names, extra)
    if run.mode == "staged":
        # every file the run wrote (its outputs, summary.json), not Beam's temporary ones nor hidden ones
        moving = sorted(n for n in _listing(run.write_dir) if not n.startswith((".", "beam-temp-"))
                        and os.path.isfile(os.path.join(run.write_dir, n)))
        _clear(run.output, run.names)
        for n in moving:
            os.replace(os.path.join(run.write_dir, n), os.path.join(run.output, n))
        for name in run.names:  # a folder output (a dataset's partitions) moves whole
            src = os.path.join(run.write_dir, name.rstrip("/"))
            if name.endswith("/") and os.path.isdir(src):
                os.replace(src, os.path.join(run.output, name.rstrip("/")))
    manifest = _manifest(run.output, names, extra)
    data = json.dumps(manifest, indent=2).encode("utf-8")
    tmp = os.path.join(run.output, f".{MANIFEST}.{run.run_id}.tmp")
    with open(tmp, "wb") as fo:
        fo.write(data)
        fo.flush()
        os.fsync(fo.fileno())
    os.replace(tmp, os.path.join(run.output, MANIFEST))
    run.published = True
    if run.mode == "staged":
        shutil.rmtree(run.write_dir, ignore_errors=True)
    return manifest


def _manifest(folder: str, names, extra: dict) -> dict:
    listing = _listing(folder)  # paths and sizes of every file, one listing
    outputs = {name: ([{"path": path, "bytes": size} for path, size in sorted(_folder_files(folder, name).items())]
                      if name.endswith("/") else
                      [{"path": listing[n][0], "bytes": listing[n][1]} for n in _output_names(listing, name)])
               for name in names}
    return {"complete": True, "outputs": outputs, **extra}


def _publish_folder(run: OutputRun, names, extra: dict) -> dict:
    marker = FileSystems.join(run.output, MANIFEST)
    previous = None
    try:
        with FileSystems.open(marker) as fo:
            previous = json.loads(fo.read().decode("utf-8"))
    except Exception:  # noqa: BLE001 (none, or not readable: nothing of it is removed)
        previous = None
    manifest = _manifest(run.write_dir, names, {**extra, "folder": f"{RUNS}/{run.run_id}"})
    with FileSystems.create(marker) as fo:  # one object: readers see the old manifest or the new one
        fo.write(json.dumps(manifest, indent=2).encode("utf-8"))
    run.published = True
    try:  # what the previous manifest named (its run folder) and files of the layout before run folders
        old = previous.get("folder") if isinstance(previous, dict) else None
        if isinstance(old, str) and old.startswith(f"{RUNS}/") and old != manifest["folder"]:
            _delete_tree(FileSystems.join(run.output, old))
        listing = _listing(run.output)
        top = sorted({f for name in run.names for f in output_files(run.output, name, listing)})
        if top:
            FileSystems.delete(top)
        _remove_beam_temp(run.output)
    except Exception:  # noqa: BLE001 (published already; the next run removes what is left)
        pass
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
