"""Avro container files decoded to Arrow tables by Apache DataFusion (compiled, columnar).

fastavro builds a Python dict per record; for the batch job's hot path that decoding alone costs
more than the rest of the job (about 8 microseconds per impression record). DataFusion's Avro
reader (Rust) writes Arrow columns directly, about ten times faster. It is used only where it
gives exactly what :func:`streameval.io.avro.read_blocks` gives:

* a local file whose writer schema is the project's schema ``name`` itself (same parsing canonical
  form; no ``timestamp-millis``), or an earlier version of it that lacks only nullable fields added
  since (:func:`_added_nullable`: their column is all null, as fastavro's resolution fills the default); no
  resolution of other schemas;
* whose header and every block header, size and sync marker check out (the same scan as
  :func:`~streameval.io.avro.read_blocks`), and whose decoded row count equals the sum of the
  block headers' counts.

Any other file, and any file on which DataFusion fails, is read by
:func:`~streameval.io.avro.read_blocks` from the first record not yet given out, so the records
given out and the :class:`~streameval.io.avro.AvroInputError` raised for a damaged file (its
message, its ``records_read``) are the same as with fastavro alone. Tables are only ever cut at
block boundaries, as fastavro's blocks are: no record of a block is given out before the whole
block decoded.

Layer 4 (I/O): imports fastavro's reader module of this package, pyarrow and datafusion; nothing
from Beam.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Union

from . import avro

#: Arrow types of the schemas' fields as DataFusion decodes them (name: type text); a file that
#: decodes to other types is read by fastavro.
_ARROW_TYPES = {
    "impression": {
        "event_id": "string", "request_id": "string", "query_id": "string", "user_id": "string",
        "system_id": "string", "item_id": "string", "position": "int32", "score": "double", "clicked": "bool",
        "timestamp": "timestamp[us, tz=+00:00]", "propensity": "double", "attributes": "map<string, string>",
        "dwell_ms": "int64",
    },
    "judgment": {
        "query_id": "string", "item_id": "string", "grade": "int32", "timestamp": "timestamp[us, tz=+00:00]",
        "source": "string", "subtopic": "string",
    },
}


@functools.lru_cache(maxsize=None)
def _added_nullable(name: str) -> dict:
    """{canonical form of the schema without its last k null-default fields: those k fields' names,
    in schema order} for every k >= 1 (files of the earlier versions: judgment's ``subtopic`` and
    impression's ``dwell_ms``, each added in version 2), so such a file keeps the fast path; its
    tables get those columns all null, as fastavro's resolution fills the default."""
    import copy

    js = copy.deepcopy(avro._reader_schema(name)[1])
    dropped: list = []
    out = {}
    while js["fields"] and js["fields"][-1].get("default", 0) is None:
        dropped.insert(0, js["fields"].pop()["name"])
        out[avro._canonical(js)] = tuple(dropped)
    return out


_GLOB = set("*?[]{}")
_context = None


class _NoFastPath(Exception):
    """DataFusion cannot (or did not) decode the file exactly; fastavro takes over."""


def available() -> bool:
    """Whether datafusion and pyarrow import (the fast path's libraries)."""
    try:
        import datafusion  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _session():
    global _context
    if _context is None:
        import datafusion

        # one partition per file: the job spreads files (and blocks) over its own workers
        config = datafusion.SessionConfig().with_batch_size(131_072).with_target_partitions(1)
        _context = datafusion.SessionContext(config)
    return _context


def _tables(path: str, name: str, rows: int) -> Iterator:
    """Arrow tables of whole blocks (at least ``rows`` rows each but the last); raises
    :class:`_NoFastPath` with ``args[0]`` the rows already given out."""
    import pyarrow as pa

    try:
        fo, header = avro._open_avro(path)
        fo.close()
        canon, _ = avro._reader_schema(name)
        writer = avro._canonical(header.writer_json)
        missing = () if writer == canon else _added_nullable(name).get(writer)
        if header.millis or missing is None:
            raise _NoFastPath(0)
        ends = []
        total = 0
        for _index, _offset, count in avro._scan_blocks(path, header):
            total += count
            ends.append(total)
        if total == 0:
            return
        df = _session().read_avro(path, file_extension=os.path.splitext(path)[1])
        got = {f.name: str(f.type) for f in df.schema()}
        if got != {k: v for k, v in _ARROW_TYPES[name].items() if k not in missing}:
            raise _NoFastPath(0)
        stream = df.execute_stream()
    except _NoFastPath:
        raise
    except Exception:  # noqa: BLE001 (header damage, a path DataFusion will not take, ...): fastavro says why
        raise _NoFastPath(0) from None
    done = 0  # rows given out (a block boundary)
    received = 0
    pending: list = []
    block = 0  # index into ends: the first boundary not yet passed
    try:
        for rb in _ahead(stream):
            if not rb.num_rows:
                continue
            pending.append(rb)
            received += rb.num_rows
            if received > total:
                raise _NoFastPath(done)
            while block < len(ends) and ends[block] <= received:
                block += 1
            cut = ends[block - 1] if block else 0
            if cut - done >= rows or (cut == total and cut > done):
                table = pa.Table.from_batches(pending)
                out = table.slice(0, cut - done)
                for f in missing:
                    out = out.append_column(f, pa.nulls(out.num_rows, pa.type_for_alias(_ARROW_TYPES[name][f])))
                yield out
                rest = table.slice(cut - done)
                pending = rest.to_batches() if rest.num_rows else []
                done = cut
    except _NoFastPath:
        raise
    except Exception:  # noqa: BLE001 (a block DataFusion could not decode): fastavro from `done`
        raise _NoFastPath(done) from None
    if done != total:
        raise _NoFastPath(done)


_END = object()


def _next_batch(stream):
    batch = next(stream, _END)
    return batch if batch is _END else batch.to_pyarrow()


def _ahead(stream) -> Iterator:
    """The record batches of a DataFusion stream as ``pyarrow.RecordBatch``, each decoded on a helper
    thread while the caller works on the one before (DataFusion decodes without holding the GIL).
    An error of the stream is raised where it occurs, after the batches before it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="streameval-avro") as pool:
        pending = pool.submit(_next_batch, stream)
        while True:
            rb = pending.result()
            if rb is _END:
                return
            pending = pool.submit(_next_batch, stream)
            yield rb


def read_tables(path: Union[str, os.PathLike], name: str, rows: int = 65_536) -> Iterator:
    """The records of the local Avro file ``path`` (schema ``name``: ``"impression"`` or
    ``"judgment"``), in order, as a mix of Arrow tables (``pyarrow.Table``, at least ``rows`` rows
    but the last, cut at block boundaries) and lists of record dicts (fastavro's blocks, for files
    or rest of files the fast path does not take; see the module docstring).

    Tables have the Arrow types of ``_ARROW_TYPES`` (a file of an earlier schema version gets the
    columns added since with a null default, judgment's ``subtopic`` or impression's ``dwell_ms``, all
    null; timestamps ``timestamp[us, UTC]``, nullable unions as nulls, ``attributes`` a
    ``map<string, string>``). Raises
    :class:`~streameval.io.avro.AvroInputError` for a damaged file, after every record before the
    damaged block (as :func:`~streameval.io.avro.read_blocks`), and ``OSError`` for I/O errors."""
    path = os.fspath(path)
    done = 0
    if available() and not (_GLOB & set(path)):
        try:
            for table in _tables(path, name, rows):
                done += table.num_rows
                yield table
            return
        except _NoFastPath as e:
            done = e.args[0]
    skip = done
    try:
        for recs in avro.read_blocks(path, name):
            if skip:  # whole blocks the fast path gave out already
                if skip >= len(recs):
                    skip -= len(recs)
                    continue
                raise AssertionError("fast path stopped inside a block")  # pragma: no cover (cut at boundaries)
            yield recs
    except avro.AvroInputError as e:
        if e.records_read >= done:
            raise
        # damage DataFusion decoded without error and fastavro did not: the records are given out
        raise avro.AvroInputError(path, f"{e.reason}; DataFusion had decoded that block and the next ones "
                                        f"without error, and their records up to record {done} were read",
                                  done) from None
