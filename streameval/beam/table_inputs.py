"""Parquet inputs of the batch job: its options (``--input-format``, ``--map``, ``--judgments-map``,
``--timestamp-unit``, ``--attributes``), checked in the launcher against each file's columns, so a
mapping that does not fit fails before the job starts (exit status 2, one line), as ``streameval
convert table`` does. The files are read by the columnar engine (:mod:`streameval.beam.columnar_read`,
:mod:`streameval.io.parquet_blocks`).

Layer 3 (Beam): imports :mod:`streameval.io`; nothing from ``streameval.jobs``.
"""

from __future__ import annotations

from apache_beam.io.filesystems import FileSystems

from ..io import convert_table as ct
from ..io.parquet_blocks import TableOptions, is_parquet
from .arguments import add_table_arguments  # noqa: F401  (Beam-free: parsed before Beam is imported)
from .sources import is_remote

__all__ = ["add_table_arguments", "table_options", "parquet_paths", "count_parquet_rows"]


def parquet_paths(paths, input_format: str = "auto") -> list:
    """The paths of ``paths`` read as Parquet."""
    return [p for p in paths if is_parquet(p, input_format)]


def _schema(path):
    """The Arrow schema of the Parquet file ``path`` (local or remote), or None when it cannot be
    read here (damaged, or not delivered: the job's reader reports it)."""
    import pyarrow.parquet as pq

    try:
        if not is_remote(path):
            return pq.read_schema(path)
        with FileSystems.open(path, mime_type="application/octet-stream", compression_type="uncompressed") as f:
            return pq.ParquetFile(f).schema_arrow
    except Exception:  # noqa: BLE001 (any error: the reader in the job says what it is)
        return None


def table_options(args, impression_paths, judgment_paths) -> tuple[TableOptions, TableOptions]:
    """``(impressions' TableOptions, judgments')`` of the job's options, after checking them against
    the columns of every Parquet file. Raises ``ValueError`` (one line; ``TableConvertError`` is
    one) for a field no schema has, a mapped or required column a file lacks, integer timestamps
    without ``--timestamp-unit``, these options without a Parquet input, or Parquet inputs with
    ``--engine records`` (the per-record engine reads Avro only)."""
    fmt = getattr(args, "input_format", "auto")
    imp_pq = parquet_paths(impression_paths, fmt)
    judg_pq = parquet_paths(judgment_paths, fmt)
    given = [f"--{n.replace('_', '-')}" for n in ("map", "judgments_map", "timestamp_unit", "attributes")
             if getattr(args, n, None)]
    if (imp_pq or judg_pq) and getattr(args, "engine", "auto") == "records":
        raise ValueError(f"--engine records reads Avro only; {(imp_pq or judg_pq)[0]} is Parquet: use the columnar "
                         "engine (--engine auto), or convert it with streameval convert table")
    if given and not (imp_pq or judg_pq):
        raise ValueError(f"{given[0]} applies to Parquet inputs, and none was given (--input-format {fmt})")
    mapping = ct.parse_mapping(getattr(args, "map", None))
    imp_fields = ct._field_kinds("impression")
    judg_fields = ct._field_kinds("judgment")
    unknown = [f for f in mapping if f not in imp_fields and f not in judg_fields]
    if unknown:
        raise ct.TableConvertError(f"--map: unknown field(s) {', '.join(unknown)}; the fields are "
                                   f"{', '.join(dict.fromkeys([*imp_fields, *judg_fields]))}")
    jmap = getattr(args, "judgments_map", None)
    judg_mapping = ct.parse_mapping(jmap) if jmap else {f: c for f, c in mapping.items() if f in judg_fields}
    attributes = tuple(a.strip() for a in (getattr(args, "attributes", None) or "").split(",") if a.strip())
    unit = getattr(args, "timestamp_unit", None)
    imp = TableOptions({f: c for f, c in mapping.items() if f in imp_fields}, unit, attributes)
    judg = TableOptions(judg_mapping, unit, ())
    ct.check_options("impressions", imp.mapping, unit, attributes)
    ct.check_options("judgments", judg.mapping, unit, ())
    from ..io.parquet_blocks import plan_file

    for kind, paths, opts in (("impressions", imp_pq, imp), ("judgments", judg_pq, judg)):
        for path in paths:
            schema = _schema(path)
            if schema is not None:
                plan_file(schema, path, kind, opts)  # raises TableConvertError
    return imp, judg


def count_parquet_rows(paths):
    """Rows of the local Parquet files ``paths`` (their footers); None for remote or unreadable ones."""
    if any(is_remote(p) for p in paths):
        return None
    from ..io.parquet_blocks import count_rows

    return count_rows(paths)
