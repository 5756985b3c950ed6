"""Avro container files for the streameval record types.

The schemas in ``schemas/*.avsc`` are the source of truth; this module loads
them, writes and reads Avro container files with fastavro, and expands path
globs.

Timestamps
----------
All ``timestamp-micros`` fields come back from :func:`read_records` and
:func:`read_blocks` as **int microseconds since the Unix epoch (UTC)**, never
as ``datetime``.  fastavro applies logical-type conversion according to the
*writer* schema stored in the file header (a reader schema cannot turn it
off), so the readers hand fastavro a copy of the header whose writer schema has
``"logicalType": "timestamp-micros"`` removed; the bytes of the data blocks are
the same, so the values decode as plain longs without the datetime round trip
(about 15% faster than decoding to ``datetime`` and converting back;
measured 196k vs 170k impression records/s).
``timestamp-millis`` fields written by other tools are converted to int
microseconds after decoding.  Writers accept ints (microseconds) or aware
``datetime`` objects.

This module imports only the standard library and fastavro (nothing from Beam,
pandas or the metric code).
"""

from __future__ import annotations

import functools
import glob
import io
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Union

import fastavro
from fastavro.read import HEADER_SCHEMA

__all__ = [
    "SCHEMA_NAMES",
    "SCHEMA_VERSION",
    "PathLike",
    "schema_path",
    "schema_dir",
    "load_schema",
    "load_schema_json",
    "write_records",
    "read_records",
    "read_blocks",
    "expand_paths",
]

SCHEMA_NAMES = ("impression", "judgment", "metric_result", "dead_letter")
SCHEMA_VERSION = 1

PathLike = Union[str, os.PathLike]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MICRO = timedelta(microseconds=1)
_MAGIC = b"Obj\x01"


# --------------------------------------------------------------------------
# schemas


def schema_dir() -> Path:
    """Directory holding the ``.avsc`` files.

    ``streameval/schemas`` (a symlink to the repository's ``schemas/`` in a
    checkout, a real directory in an installed wheel), else the repository's
    ``schemas/`` folder.
    """
    here = Path(__file__).resolve().parent.parent  # the streameval package
    for cand in (here / "schemas", here.parent / "schemas"):
        if (cand / "impression.avsc").is_file():
            return cand
    raise FileNotFoundError(
        f"streameval schemas not found (looked in {here / 'schemas'} and {here.parent / 'schemas'})"
    )


def _check_name(name: str) -> str:
    if name not in SCHEMA_NAMES:
        raise ValueError(f"unknown schema {name!r}; expected one of {', '.join(SCHEMA_NAMES)}")
    return name


def schema_path(name: str) -> Path:
    """Path of the ``.avsc`` file of schema ``name`` (one of :data:`SCHEMA_NAMES`)."""
    return schema_dir() / f"{_check_name(name)}.avsc"


@functools.lru_cache(maxsize=None)
def _schema_json_text(name: str) -> str:
    return schema_path(name).read_text(encoding="utf-8")


def load_schema_json(name: str) -> dict:
    """The schema ``name`` as plain JSON (a fresh dict, safe to modify)."""
    return json.loads(_schema_json_text(name))


@functools.lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """The fastavro-parsed schema ``name`` (cached; do not modify the result)."""
    return fastavro.parse_schema(load_schema_json(name))


def _resolve_schema(schema_or_name: Union[str, dict]) -> dict:
    if isinstance(schema_or_name, str):
        return load_schema(schema_or_name)
    return fastavro.parse_schema(schema_or_name)


# --------------------------------------------------------------------------
# paths


def expand_paths(paths: Union[PathLike, Iterable[PathLike]]) -> list[str]:
    """Expand a path, a glob pattern, or a list of them, into a list of files.

    Each entry containing a glob character (``*``, ``?``, ``[``) is expanded
    with :func:`glob.glob` (``**`` recursive) and the matches are sorted; a
    pattern that matches nothing raises :class:`FileNotFoundError` naming the
    pattern.  Plain paths are kept as given (they must exist when read).
    The order of the entries is kept; duplicates are not removed.
    """
    if isinstance(paths, (str, os.PathLike)):
        entries = [paths]
    else:
        entries = list(paths)
    out: list[str] = []
    for entry in entries:
        p = os.fspath(entry)
        if glob.has_magic(p):
            matches = sorted(m for m in glob.glob(p, recursive=True) if not os.path.isdir(m))
            if not matches:
                raise FileNotFoundError(f"no files match the pattern {p!r}")
            out.extend(matches)
        else:
            out.append(p)
    return out


# --------------------------------------------------------------------------
# writing


def write_records(
    path: PathLike,
    name: Union[str, dict],
    records: Iterable[dict],
    codec: str = "deflate",
    *,
    sync_interval: int = 16000 * 100,
    metadata: dict[str, str] | None = None,
) -> int:
    """Write ``records`` (dicts) to the Avro container file ``path``.

    ``name`` is one of :data:`SCHEMA_NAMES` (or a schema dict).  Timestamps
    may be int microseconds or aware ``datetime``.  Missing fields that have
    a default take the default.  Returns the number of records written.
    The parent directory is created if needed.
    """
    schema = _resolve_schema(name)
    count = 0

    def counted(it: Iterable[dict]) -> Iterator[dict]:
        nonlocal count
        for rec in it:
            count += 1
            yield rec

    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as fo:
        fastavro.writer(
            fo,
            schema,
            counted(records),
            codec=codec,
            sync_interval=sync_interval,
            metadata=metadata,
        )
    return count


# --------------------------------------------------------------------------
# reading


def _strip_micros(schema: Any) -> Any:
    """Copy of a JSON schema with ``timestamp-micros`` logical types removed."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "logicalType" and value == "timestamp-micros" and schema.get("type") == "long":
                continue
            out[key] = _strip_micros(value)
        return out
    if isinstance(schema, list):
        return [_strip_micros(s) for s in schema]
    return schema


def _has_logical(schema: Any, logical: str) -> bool:
    if isinstance(schema, dict):
        if schema.get("logicalType") == logical:
            return True
        return any(_has_logical(v, logical) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_logical(s, logical) for s in schema)
    return False


def _millis_fields(schema: Any) -> list[str]:
    """Top-level record fields holding a ``timestamp-millis`` (possibly in a union)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return []
    return [f["name"] for f in schema.get("fields", []) if _has_logical(f.get("type"), "timestamp-millis")]


class _SwappedHeader:
    """Read-only file object: a replacement header followed by the rest of ``fo``.

    ``tell()`` inside the header is the position in the replacement header,
    afterwards the position in the original file (so block offsets reported
    by fastavro are true file offsets).
    """

    def __init__(self, header: bytes, fo):
        self._head = header
        self._pos = 0
        self._fo = fo

    def read(self, n: int = -1) -> bytes:
        if self._pos < len(self._head):
            if n is None or n < 0:
                chunk = self._head[self._pos:]
                self._pos = len(self._head)
                return chunk + self._fo.read()
            chunk = self._head[self._pos:self._pos + n]
            self._pos += len(chunk)
            if len(chunk) < n:
                chunk += self._fo.read(n - len(chunk))
            return chunk
        return self._fo.read(n)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def tell(self) -> int:
        if self._pos < len(self._head):
            return self._pos
        return self._fo.tell()

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._fo.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _open_avro(path: str):
    """Open ``path`` for fastavro.

    Returns ``(file object, millis fields, writer schema json, header size)``;
    the file object replays a header whose writer schema has no
    ``timestamp-micros`` logical types.
    """
    fo = open(path, "rb")
    try:
        magic = fo.read(4)
        if magic != _MAGIC:
            raise ValueError(f"{path}: not an Avro container file (bad magic {magic!r})")
        fo.seek(0)
        header = fastavro.schemaless_reader(fo, HEADER_SCHEMA)
        header_size = fo.tell()
        meta = dict(header["meta"])
        writer_json = json.loads(meta["avro.schema"].decode("utf-8"))
        millis = _millis_fields(writer_json)
        if not _has_logical(writer_json, "timestamp-micros"):
            fo.seek(0)
            return fo, millis, writer_json, header_size
        meta["avro.schema"] = json.dumps(_strip_micros(writer_json)).encode("utf-8")
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, HEADER_SCHEMA, {"magic": header["magic"], "meta": meta, "sync": header["sync"]})
        return _SwappedHeader(buf.getvalue(), fo), millis, writer_json, header_size
    except BaseException:
        fo.close()
        raise


def _read_long(f) -> int | None:
    """One zig-zag varint long from ``f``; ``None`` at a clean end of file."""
    shift = 0
    acc = 0
    while True:
        b = f.read(1)
        if not b:
            if shift == 0:
                return None
            raise EOFError("truncated Avro block header")
        acc |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            return (acc >> 1) ^ -(acc & 1)


def _block_counts(path: str, header_size: int) -> Iterator[int]:
    """Record counts of the data blocks of an Avro file, from the block headers only.

    Each block is ``count, byte size, data, 16-byte sync``; the data is
    skipped with ``seek``, so this costs a few small reads per block.
    """
    with open(path, "rb") as f:
        f.seek(header_size)
        while True:
            count = _read_long(f)
            if count is None:
                return
            size = _read_long(f)
            if size is None:
                raise EOFError(f"{path}: truncated Avro block header")
            f.seek(size + 16, os.SEEK_CUR)
            yield count


def _canonical(schema_json: Any) -> str:
    return fastavro.schema.to_parsing_canonical_form(_strip_micros(schema_json))


@functools.lru_cache(maxsize=None)
def _reader_schema(name: str) -> tuple[str, dict]:
    """(canonical form, reader schema without timestamp-micros) of schema ``name``."""
    js = _strip_micros(load_schema_json(name))
    return fastavro.schema.to_parsing_canonical_form(js), js


def _to_micros(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return (value - _EPOCH) // _ONE_MICRO
    return value


def _iter_file(path: str, name: str | None, blocks: bool):
    fo, millis, writer_json, header_size = _open_avro(path)
    with fo:
        reader_schema = None
        if name is not None:
            canon, reader_js = _reader_schema(_check_name(name))
            if _canonical(writer_json) != canon:
                # Different (e.g. older) writer schema: let fastavro resolve
                # it against ours (fills defaults, rejects incompatible files).
                reader_schema = reader_js
                millis = []  # the reader schema has no timestamp-millis fields
        rd = fastavro.reader(fo, reader_schema=reader_schema)
        if millis:
            rd = _convert_millis(rd, millis)
        if not blocks:
            yield from rd
            return
        # fastavro.block_reader decodes about 30% slower than reader (Cython
        # fast path), so cut the reader's output at the block boundaries,
        # which are read from the block headers.
        for count in _block_counts(path, header_size):
            recs = list(itertools.islice(rd, count))
            if len(recs) != count:
                raise EOFError(f"{path}: Avro block announced {count} records, decoded {len(recs)}")
            yield recs


def _convert_millis(rd: Iterable[dict], fields: list[str]) -> Iterator[dict]:
    for rec in rd:
        for f in fields:
            rec[f] = _to_micros(rec.get(f))
        yield rec


def read_records(paths: Union[PathLike, Iterable[PathLike]], name: str | None = None) -> Iterator[dict]:
    """Iterate the records (dicts) of one or more Avro container files.

    ``paths`` is a path, a glob pattern or a list of them (see
    :func:`expand_paths`); files are read in that order.  With ``name`` (one of
    :data:`SCHEMA_NAMES`) the files are read against that schema: a file
    written with an older or different but compatible schema is resolved to
    it (missing fields take their defaults), an incompatible one raises
    ``fastavro.read.SchemaResolutionError``.  ``timestamp-micros`` values are
    int microseconds since the epoch (UTC).
    """
    for path in expand_paths(paths):
        yield from _iter_file(path, name, blocks=False)


def read_blocks(paths: Union[PathLike, Iterable[PathLike]], name: str | None = None) -> Iterator[list[dict]]:
    """Iterate lists of records, one list per Avro file block.

    The lists follow the file's data blocks exactly (the blocks
    ``fastavro.block_reader`` would give); the records are decoded by
    ``fastavro.reader``, which is faster than decoding ``Block`` objects.

    Same paths, schema and timestamp handling as :func:`read_records`.  Blocks
    hold ``sync_interval`` bytes of records (about 1.6 MB with
    :func:`write_records`' default), convenient for coarse-grained
    processing (a Beam ``DoFn`` per block, numpy conversion per block).
    """
    for path in expand_paths(paths):
        yield from _iter_file(path, name, blocks=True)
