"""Local input files checked before a job starts: every path or glob of a local option matches a
file, and a file read as Avro that is plainly another format (CSV or other text, JSON, Parquet) is
named for what it is, with the way to read it. No Beam: the jobs call this before Beam is imported
(``streameval.cli``) and again in their own launchers. Remote paths (``scheme://``) are left to the
job, which matches them through Beam's file systems once its pipeline options are set.

A file that starts like none of those (binary bytes, an empty file, a truncated or damaged Avro
file) is left to the job's reader, which reports a damaged Avro file as a dead letter
(docs/metrics.md, "Avro files")."""

from __future__ import annotations

import contextlib
import logging
import os

from . import avro

__all__ = ["check_local_inputs", "sniff_format", "AVRO_MAGIC"]

#: the first bytes of an Avro object container file
AVRO_MAGIC = b"Obj\x01"
PARQUET_MAGIC = b"PAR1"
#: bytes read from a file's start to tell what it is
SNIFF_BYTES = 4096


def sniff_format(head: bytes) -> str | None:
    """What the first bytes ``head`` of a file are when plainly not Avro: ``"parquet"``, ``"json"``
    (JSON or JSON lines), ``"csv"`` (text whose first line has a comma, tab or semicolon) or
    ``"text"``; None for Avro and for anything else (binary or empty: the Avro reader says what is
    wrong with it)."""
    if not head or head.startswith(AVRO_MAGIC):
        return None
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if b"\x00" in head:
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not a character cut at the end of the sample
            return None
        text = head[:e.start].decode("utf-8")
    text = text.lstrip("\ufeff")
    stripped = text.lstrip()
    if not stripped or any(not (c.isprintable() or c in "\r\n\t") for c in stripped):
        return None
    if stripped[0] in "{[":
        return "json"
    first = stripped.splitlines()[0]
    return "csv" if any(sep in first for sep in ",\t;") else "text"


def _refusal(option: str, path: str, kind: str, schema: str | None, reads_parquet: bool) -> str:
    base = os.path.splitext(os.path.basename(path))[0]
    if kind == "parquet" and reads_parquet:
        return (f"{option} {path}: a Parquet file, read as Avro by its name: give --input-format parquet, "
                "or name it .parquet")
    what = {"parquet": "a Parquet file", "json": "a JSON file", "csv": "a CSV file", "text": "a text file"}[kind]
    how = []
    if schema:
        how.append(f"convert it with 'streameval convert table {path} --kind {schema}s --out {base}.avro' "
                   "(--map names its columns)")
    if reads_parquet:
        how.append("write it as Parquet and give that (--input-format parquet, or a .parquet name)")
    return f"{option} {path}: {what}, not an Avro file" + (f": {', or '.join(how)}" if how else "")


@contextlib.contextmanager
def _no_warnings(logger: str):
    """The records of ``logger`` dropped while the block runs."""
    log = logging.getLogger(logger)
    drop = logging.Filter("-")  # matches no logger's name: every record of ``log`` is dropped
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def check_local_inputs(option: str, patterns, schema: str | None, parquet=None) -> list[str]:
    """The local files of ``patterns`` (the values of ``option``, e.g. ``--impressions``; remote ones
    skipped), in order. Raises ``FileNotFoundError`` for a glob that matches nothing or a file that
    does not exist, ``ValueError`` for a file read as Avro that is plainly another format, naming it
    and ``streameval convert table`` (``schema``: impression or judgment; None for a kind it does
    not convert). ``parquet``: for a job that reads Parquet, whether it reads ``path`` as Parquet
    (those files are not sniffed); None for a job that reads Avro only."""
    files = []
    for pattern in patterns or ():
        if "://" in str(pattern):
            continue
        try:
            with _no_warnings(avro.__name__):  # the job's own expansion warns (links matched twice), once
                paths = avro.expand_paths(pattern)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{option}: {e}") from None
        for path in paths:
            if os.path.isdir(path):
                raise FileNotFoundError(f"{option} {path}: a directory, not a file (give a glob: '{path}/*.avro')")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{option}: input file not found: {path}")
            files.append(path)
            if parquet is not None and parquet(path):
                continue
            try:
                with open(path, "rb") as f:
                    head = f.read(SNIFF_BYTES)
            except OSError:
                continue  # the job's reader reports an unreadable file
            kind = sniff_format(head)
            if kind is not None:
                raise ValueError(_refusal(option, path, kind, schema, parquet is not None))
    return files
