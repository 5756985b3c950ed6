"""The columnar engine's blocks of columns (:mod:`streameval.beam.columnar`): dicts of numpy arrays and
Arrow string arrays, their codes and shards, and their form between stages (:func:`freeze`, :func:`thaw`)."""

from __future__ import annotations

import itertools
import os
import pickle
import zlib
from operator import itemgetter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..io import dwell as dwell_io

#: SHARDS, SHARD_IMPRESSIONS: --shards' least and its aim (streameval.beam.arguments, Beam-free)
from .arguments import SHARD_IMPRESSIONS, SHARDS  # noqa: E402,F401
#: Avro bytes per impression assumed when the input's records cannot be counted from block headers
#: (remote files): about the smallest seen (the bundled sample, deflate), so shards err on the small side
AVRO_BYTES_PER_IMPRESSION = 20


def auto_shards(impressions: int | None = None, nbytes: int = 0) -> int:
    """The shard count of ``--shards auto``: ``SHARDS``, or one shard per ``SHARD_IMPRESSIONS``
    impressions when that is more. ``impressions``: the input's record count (None: estimated from
    ``nbytes``, its size in bytes)."""
    if impressions is None:
        impressions = int(nbytes) // AVRO_BYTES_PER_IMPRESSION
    return max(SHARDS, -(-int(impressions) // SHARD_IMPRESSIONS))

IMPRESSION_FIELDS = ("event_id", "request_id", "query_id", "user_id", "system_id", "item_id", "position", "score",
                     "clicked", "timestamp", "propensity", "dwell_ms")
_STRINGS = ("event_id", "request_id", "query_id", "user_id", "system_id", "item_id")
JUDGMENT_FIELDS = ("query_id", "item_id", "grade", "timestamp", "source")


# --------------------------------------------------------------------------------------------
# columns
#
# Numbers are numpy arrays; strings (ids, attribute values) are Arrow string arrays from the decoder
# to the metric rows: coded by Arrow's hashing (``dictionary_encode``), taken and concatenated by
# Arrow, pickled as Arrow buffers between stages. Python str objects are made only for the few
# values that need them: distinct shard keys, labels of rows, and the records of dead letters and of
# requests that go through the exact cleaning rules.

def _obj(values) -> np.ndarray:
    a = np.empty(len(values), dtype=object)
    a[:] = values
    return a


def _strings(values) -> pa.Array:
    """Arrow string array of a sequence (list, object array) of str, None for null."""
    return values if isinstance(values, pa.Array) else pa.array(values, type=pa.string())


def _string_column(col) -> pa.Array:
    """One Arrow string array of a (chunked) Arrow column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks) if col.num_chunks else \
            pa.array([], type=col.type)
    return col if col.type == pa.string() else col.cast(pa.string())


def _pick(a, idx):
    """Rows ``idx`` (int indices or a bool mask, numpy) of a numpy or Arrow column."""
    if isinstance(a, np.ndarray):
        return a[idx]
    if idx.dtype == bool:
        return a.filter(pa.array(idx, type=pa.bool_()))
    return a.take(pa.array(idx, type=pa.int64()))


def _pylist(a, rows) -> list:
    """Python values of rows ``rows`` of a numpy or Arrow column."""
    rows = np.asarray(rows, dtype=np.int64)
    return a[rows].tolist() if isinstance(a, np.ndarray) else _pick(a, rows).to_pylist()


def _no_nul(a) -> np.ndarray:
    """Bool per row: the string holds no NUL character (null counts as none)."""
    if _no_nul_bytes(a):  # no NUL byte in the bytes of the rows at all (the usual case): one memchr
        return np.ones(len(a), dtype=bool)
    has = pc.match_substring(a, "\x00")
    if has.null_count:
        has = pc.fill_null(has, False)
    return ~np.asarray(has.to_numpy(zero_copy_only=False), dtype=bool)


def _no_nul_bytes(a) -> bool:
    """Whether the character bytes of the rows of an Arrow string (or large string) array hold no
    NUL byte: the bytes between the first row's start offset and the last row's end, searched once
    (one vectorised pass, no copy) instead of one substring match per row. False for anything
    else (another type, no rows): the caller then checks row by row."""
    if not isinstance(a, pa.Array) or not len(a) or a.type not in (pa.string(), pa.large_string()):
        return False
    _, offsets, data = a.buffers()
    offs = np.frombuffer(offsets, dtype=np.int32 if a.type == pa.string() else np.int64)
    lo, hi = int(offs[a.offset]), int(offs[a.offset + len(a)])
    if hi == lo:
        return True
    return bool(np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo).all())


def _nonempty(a: pa.Array) -> np.ndarray:
    """Bool per row: not the empty string (null counts as not empty, as ``None != ""``)."""
    lengths = pc.binary_length(a)
    if lengths.null_count:
        lengths = pc.fill_null(lengths, 1)
    return np.asarray(lengths.to_numpy(zero_copy_only=False)) > 0


class _Ints:
    """An int64 column pickled as its minimum plus the offsets in the narrowest unsigned type."""

    __slots__ = ("base", "offsets")

    def __init__(self, a: np.ndarray):
        self.base = int(a.min())
        span = int(a.max()) - self.base
        kind = np.uint8 if span < 2**8 else np.uint16 if span < 2**16 else np.uint32
        self.offsets = (a - self.base).astype(kind)

    def __getstate__(self):
        return self.base, self.offsets

    def __setstate__(self, state):
        self.base, self.offsets = state

    def column(self) -> np.ndarray:
        return self.offsets.astype(np.int64) + self.base


class _Same:
    """A float64 column of one value (NaN included: all null propensities) pickled as that value
    (a one-element array: the same bits back)."""

    __slots__ = ("value", "n")

    def __init__(self, value: np.ndarray, n: int):
        self.value, self.n = value, n

    def __getstate__(self):
        return self.value, self.n

    def __setstate__(self, state):
        self.value, self.n = state

    def column(self) -> np.ndarray:
        return np.repeat(self.value, self.n)


def _compact(a, runs: bool = False):
    """A column as it is pickled between stages: a string column with long runs of equal values
    (``runs``: worth trying, as for the request, query, system and attributes of a request's
    records) as Arrow run-end encoding; an int64 column whose range fits 32 bits as :class:`_Ints`;
    a float64 column of one value (bit for bit) as :class:`_Same`; otherwise as it is."""
    if isinstance(a, np.ndarray):
        if len(a) < 16:
            return a
        if a.dtype == np.int64:
            return _Ints(a) if int(a.max()) - int(a.min()) < 2**32 else a
        if a.dtype == np.float64:
            bits = a.view(np.int64)
            return _Same(a[:1].copy(), len(a)) if (bits == bits[0]).all() else a
        return a
    if not runs or not isinstance(a, pa.Array) or len(a) < 16 or pa.types.is_run_end_encoded(a.type):
        return a
    r = pc.run_end_encode(a)
    return r if 2 * len(r.values) <= len(a) else a


def _plain(a):
    if isinstance(a, (_Ints, _Same)):
        return a.column()
    return pc.run_end_decode(a) if isinstance(a, pa.RunEndEncodedArray) else a


#: values between stages held in this process (``ColumnarMetrics(in_process=True)``), by key
_HELD: dict = {}
_held_keys = itertools.count()


def release_held() -> None:
    """Drop the values :func:`freeze` held in this process (after a run, or a pipeline that is not
    run); early read work (``_ReadColumns.start_early``) not yet started is cancelled."""
    for value in list(_HELD.values()):
        cancel = getattr(value, "cancel", None)  # a concurrent.futures.Future
        if cancel is not None:
            cancel()
    _HELD.clear()


def freeze(chunk: dict, runs=(), hold: bool = False) -> tuple[int, bytes | str]:
    """A Beam element's value between stages: ``(rows, pickled columns)``, compacted
    (:func:`_compact`; ``runs``: the string columns, ``"attributes"`` for all attributes, whose runs
    of equal values are worth encoding). ``hold``: the compacted columns stay in this process's
    memory and the value is ``(rows, key)``: nothing is pickled or copied, for Beam's in-process
    local runner only, where every stage runs in the process that made the value.

    Beam's local runner decodes and re-encodes every value it groups (``GroupByKey``) and every value
    that crosses to or from a worker process; as bytes that is a copy, as columns a pickle round trip
    each time. ``rows``: the impressions, judgments or requests held (progress counts)."""
    n = chunk["n"] if "n" in chunk else chunk["n_requests"]
    out = {k: ({a: _compact(c, k in runs) for a, c in v.items()} if k == "attributes" else _compact(v, k in runs))
           for k, v in chunk.items()}
    if hold:
        # held arrays are shared with every later reader (the stream's shards thaw them with keep=True):
        # read-only, so that a stage writing into one fails loudly instead of changing a kept piece
        for v in out.values():
            for c in (v.values() if isinstance(v, dict) else (v,)):
                if isinstance(c, np.ndarray):
                    c.flags.writeable = False
        key = f"{os.getpid()}:{next(_held_keys)}"
        _HELD[key] = out
        return int(n), key
    return int(n), pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)


def thaw(value: tuple[int, bytes | str], keep: bool = False) -> dict:
    """The columns of a :func:`freeze` value; a held value is dropped from this process's memory
    unless ``keep`` (a side input may be read again). Raises RuntimeError for a value held in
    another process."""
    if isinstance(value[1], str):
        try:
            chunk = _HELD[value[1]] if keep else _HELD.pop(value[1])
        except KeyError:
            raise RuntimeError("a value between stages was held in another process: in_process=True needs Beam's "
                               "in-process local runner (FnApiRunner without worker processes)") from None
    else:
        chunk = pickle.loads(value[1])
    return {k: ({a: _plain(c) for a, c in v.items()} if k == "attributes" else _plain(v)) for k, v in chunk.items()}


def impression_columns(recs, nulls: dict | None = None) -> dict:
    """Columns of impression dicts as the Avro reader gives them (impression schema types).

    ``{"n", <string fields>: Arrow string arrays (user_id null when null), "position", "timestamp":
    int64, "score", "propensity": float64 (NaN when null), "clicked": int8 (-1 when null),
    "dwell_ms": int64 (:data:`streameval.io.dwell.NULL` when null), "attributes": {key: Arrow string
    array, null where the record lacks the key}}``. The inverse is :func:`columns_records`. ``nulls``:
    a dict to receive the number of null scores and propensities (keys ``"score"``, ``"propensity"``)
    and the rows whose ``dwell_ms`` the vectorised screen clears (``"dwell_ok"``, bool shape (n,):
    :func:`streameval.io.dwell.dwell_columns`; the others go to the record check)."""
    n = len(recs)
    out = {"n": n}
    score = list(map(itemgetter("score"), recs))
    prop = list(map(itemgetter("propensity"), recs))
    if nulls is not None:
        nulls["score"] = score.count(None)
        nulls["propensity"] = prop.count(None)
    for f in _STRINGS:
        out[f] = _strings(list(map(itemgetter(f), recs)))
    out["position"] = np.fromiter(map(itemgetter("position"), recs), dtype=np.int64, count=n)
    out["timestamp"] = np.fromiter(map(itemgetter("timestamp"), recs), dtype=np.int64, count=n)
    out["score"] = np.array(score, dtype=np.float64).reshape(n)  # None -> NaN
    out["propensity"] = np.array(prop, dtype=np.float64).reshape(n)
    clicked = np.array(list(map(itemgetter("clicked"), recs)), dtype=np.float64).reshape(n)
    out["clicked"] = np.where(np.isnan(clicked), -1, clicked).astype(np.int8)
    out["dwell_ms"], dwell_ok = dwell_io.dwell_columns([r.get("dwell_ms") for r in recs], out["clicked"])
    if nulls is not None:
        nulls["dwell_ok"] = dwell_ok
    attrs = [r.get("attributes") or {} for r in recs]
    keys = set()
    for a in attrs:
        if a:
            keys.update(a)
    out["attributes"] = {k: _strings([a.get(k) for a in attrs]) for k in sorted(keys)}
    return out


def judgment_columns(recs) -> dict:
    """Columns of judgment dicts: ``{"n", "query_id", "item_id", "source", "subtopic": Arrow string
    arrays (subtopic null for an ad hoc judgment), "grade", "timestamp": int64 (0 when null)}``."""
    n = len(recs)
    ts = [r.get("timestamp") for r in recs]
    if None in ts:
        ts = [0 if t is None else t for t in ts]
    return {"n": n, "query_id": _strings(list(map(itemgetter("query_id"), recs))),
            "item_id": _strings(list(map(itemgetter("item_id"), recs))),
            "grade": np.fromiter(map(itemgetter("grade"), recs), dtype=np.int64, count=n),
            "timestamp": np.array(ts, dtype=np.int64).reshape(n), "source": _strings([r.get("source") for r in recs]),
            "subtopic": _strings([r.get("subtopic") for r in recs])}


def _arrow_ints(col) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


def _arrow_map_columns(col, n: int) -> dict:
    """``{key: Arrow string array}`` of an Arrow ``map<string, string>`` column (null where a row
    lacks the key; a key twice in one row: the later value, as a Python dict built from the map)."""
    m = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    offs = np.asarray(m.offsets, dtype=np.int64)
    lo, hi = int(offs[0]), int(offs[-1])
    if hi == lo:
        return {}
    every = _same_keys(m, offs)
    if every is not None:  # every row has the same keys in the same order: each key's values are a stride
        width = len(every)
        items = m.items.slice(lo, hi - lo)
        return {k: _string_column(items if width == 1 else items.take(pa.array(np.arange(j, hi - lo, width))))
                for j, k in sorted(enumerate(every), key=lambda jk: jk[1])}
    keys = pc.unique(m.keys.slice(lo, hi - lo)).to_pylist()
    return {k: _string_column(pc.map_lookup(m, pa.scalar(k, type=m.type.key_type), "last")) for k in sorted(keys)}


def _same_keys(m: pa.MapArray, offs: np.ndarray) -> list | None:
    """The keys of every row of a map column when all rows (none null) have the same distinct keys
    in the same order, else None."""
    if m.null_count or len(m) == 0:
        return None
    width = int(offs[1] - offs[0])
    if width == 0 or not (np.diff(offs) == width).all():
        return None
    keys = m.keys.slice(int(offs[0]), int(offs[-1] - offs[0]))
    first = keys.slice(0, width).to_pylist()
    if len(set(first)) != width or None in first:
        return None
    for j, k in enumerate(first):
        column = keys if width == 1 else keys.take(pa.array(np.arange(j, len(keys), width)))
        if not pc.all(pc.equal(column, pa.scalar(k, type=keys.type))).as_py():
            return None
    return first


def impression_columns_arrow(table) -> tuple[dict, np.ndarray, np.ndarray]:
    """(columns as :func:`impression_columns` makes them, null mask of score, null mask of
    propensity) of an Arrow table of impressions (:func:`streameval.io.arrow_avro.read_tables`; a
    table without an ``attributes`` column gives no attributes, one without a ``dwell_ms`` column the
    column all null (:data:`streameval.io.dwell.NULL`))."""
    n = table.num_rows
    out = {"n": n}
    for f in _STRINGS:
        out[f] = _string_column(table.column(f))
    out["position"] = _arrow_ints(table.column("position"))
    out["timestamp"] = _arrow_ints(table.column("timestamp"))
    nulls = []
    for f in ("score", "propensity"):
        c = table.column(f)
        out[f] = np.asarray(c.to_numpy(zero_copy_only=False), dtype=np.float64)  # null -> NaN
        nulls.append(np.asarray(c.is_null().to_numpy(zero_copy_only=False), dtype=bool) if c.null_count
                     else np.zeros(n, dtype=bool))
    out["clicked"] = np.asarray(pc.fill_null(table.column("clicked").cast(pa.int8()), -1).to_numpy(), dtype=np.int8)
    out["dwell_ms"] = dwell_io.dwell_columns_arrow(table.column("dwell_ms"), out["clicked"])[0] \
        if "dwell_ms" in table.column_names else np.full(n, dwell_io.NULL, dtype=np.int64)
    out["attributes"] = _arrow_map_columns(table.column("attributes"), n) if "attributes" in table.column_names else {}
    return out, nulls[0], nulls[1]


def judgment_columns_arrow(table) -> dict:
    """Columns as :func:`judgment_columns` makes them, of an Arrow table of judgments."""
    return {"n": table.num_rows, "query_id": _string_column(table.column("query_id")),
            "item_id": _string_column(table.column("item_id")), "grade": _arrow_ints(table.column("grade")),
            "timestamp": _arrow_ints(table.column("timestamp")), "source": _string_column(table.column("source")),
            "subtopic": (_string_column(table.column("subtopic")) if "subtopic" in table.column_names
                         else pa.nulls(table.num_rows, pa.string()))}


def _take(chunk: dict, idx, fields=None) -> dict:
    """Rows ``idx`` (indices or a boolean mask) of a column dict (of its ``fields`` only, if given)."""
    out = {}
    for k, v in chunk.items():
        if k == "n" or (fields is not None and k not in fields):
            continue
        if k == "attributes":
            out[k] = {a: _pick(c, idx) for a, c in v.items()}
        else:
            out[k] = _pick(v, idx)
    out["n"] = int(idx.sum()) if idx.dtype == bool else len(idx)
    return out


def _concat(chunks: list) -> dict:
    """One column dict from several (attribute keys united; absent ones null)."""
    chunks = [c for c in chunks if c["n"]]
    if len(chunks) == 1:
        return chunks[0]
    if not chunks:
        return impression_columns([])
    out = {"n": sum(c["n"] for c in chunks)}
    for k, v in chunks[0].items():
        if k in ("n", "attributes"):
            continue
        parts = [c[k] for c in chunks]
        out[k] = np.concatenate(parts) if isinstance(v, np.ndarray) else pa.concat_arrays(parts)
    if "attributes" in chunks[0]:
        out["attributes"] = _concat_attributes([(c["attributes"], c["n"]) for c in chunks])
    return out


def _concat_attributes(parts) -> dict:
    """``{key: Arrow array}`` of several (attributes, rows) pairs, null where a part lacks a key."""
    keys = sorted({a for attrs, _ in parts for a in attrs})
    return {a: pa.concat_arrays([attrs.get(a, pa.nulls(n, type=pa.string())) for attrs, n in parts]) for a in keys}


def columns_records(chunk: dict, rows) -> list[dict]:
    """The impression dicts of ``rows`` of a column dict (as the Avro reader would give them)."""
    rows = np.fromiter(rows, dtype=np.int64)
    if not len(rows):
        return []
    s = {f: _pylist(chunk[f], rows) for f in _STRINGS}
    attrs = {k: _pylist(v, rows) for k, v in chunk["attributes"].items()}
    dw = chunk.get("dwell_ms")
    out = []
    for j, i in enumerate(rows.tolist()):
        score = chunk["score"][i]
        prop = chunk["propensity"][i]
        clicked = int(chunk["clicked"][i])
        rec = {"event_id": s["event_id"][j], "request_id": s["request_id"][j], "query_id": s["query_id"][j],
               "user_id": s["user_id"][j], "system_id": s["system_id"][j], "item_id": s["item_id"][j],
               "position": int(chunk["position"][i]), "score": None if np.isnan(score) else float(score),
               "clicked": None if clicked < 0 else bool(clicked), "timestamp": int(chunk["timestamp"][i]),
               "propensity": None if np.isnan(prop) else float(prop),
               "attributes": {k: v[j] for k, v in attrs.items() if v[j] is not None},
               "dwell_ms": None if dw is None else dwell_io.dwell_record_value(dw[i])}
        out.append(rec)
    return out


def _judgment_records(chunk: dict, rows) -> list[dict]:
    rows = np.fromiter(rows, dtype=np.int64)
    q, d, src = (_pylist(chunk[f], rows) for f in ("query_id", "item_id", "source"))
    out = [{"query_id": q[j], "item_id": d[j], "grade": int(chunk["grade"][i]), "timestamp": int(chunk["timestamp"][i]),
            "source": src[j]} for j, i in enumerate(rows.tolist())]
    if "subtopic" in chunk:
        for rec, sub in zip(out, _pylist(chunk["subtopic"], rows)):
            if sub is not None:
                rec["subtopic"] = sub
    return out


def _changes(a: pa.Array) -> np.ndarray:
    """Bool per row but the first: the value differs from the one before (nulls: as values)."""
    prev, cur = a.slice(0, len(a) - 1), a.slice(1)
    ne = pc.not_equal(cur, prev)
    if ne.null_count:
        ne = pc.if_else(pc.is_null(ne), pc.not_equal(pc.is_null(cur), pc.is_null(prev)), ne)
    return np.asarray(ne.to_numpy(zero_copy_only=False), dtype=bool)


def _encode(a) -> tuple[np.ndarray, pa.Array]:
    """(int64 codes, the distinct values as an Arrow array) of a string column (Arrow, or a sequence
    of str and None): Arrow's hash table, codes in order of first appearance, null a value of its own.
    A column of long runs of equal values (a request's records) has only its runs' first values coded."""
    a = _strings(a)
    n = len(a)
    if n > 64 and 4 * int(_changes(a.slice(0, 256)).sum()) < min(n, 256):  # a sample: long runs
        starts = np.flatnonzero(np.concatenate(([True], _changes(a))))
        if 4 * len(starts) <= n:
            codes, vocab = _encode(_pick(a, starts))  # first appearances keep their order: the same codes
            return np.repeat(codes, np.diff(np.append(starts, n))), vocab
    d = pc.dictionary_encode(a, null_encoding="encode")
    return np.asarray(d.indices.to_numpy(zero_copy_only=False), dtype=np.int64), d.dictionary


def _factorize(a, ordered: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(int64 codes, distinct values as an object array) of a string column (Arrow, or a sequence
    of str and None). ``ordered``: codes in the sorted order of the values (code-point order, as
    trec_eval's strcmp on UTF-8; null last)."""
    codes, vocab = _ordered(a) if ordered else _encode(a)
    return codes, _obj(vocab.to_pylist())


def _ordered(a) -> tuple[np.ndarray, pa.Array]:
    """:func:`_encode` with the codes in the sorted order of the values (UTF-8 byte order, which is
    code-point order; null last)."""
    codes, vocab = _encode(a)
    if len(vocab) < 2:
        return codes, vocab
    return _in_value_order(codes, vocab)


def _in_value_order(codes: np.ndarray, vocab: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """:func:`_encode`'s ``(codes, vocab)`` renumbered in the sorted order of the values (UTF-8 byte
    order, which is code-point order; null last), with the vocabulary in that order."""
    order = np.asarray(pc.sort_indices(vocab).to_numpy(), dtype=np.int64)
    rank = np.empty(len(vocab), dtype=np.int64)
    rank[order] = np.arange(len(vocab), dtype=np.int64)
    return rank[codes], vocab.take(pa.array(order))


def _sorted_codes(values: pa.Array, extra: pa.Array) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes that order as the values do: (codes of ``values``, codes of ``extra``, distinct values)."""
    codes, vocab = _ordered(pa.concat_arrays([values, extra]))
    return codes[:len(values)], codes[len(values):], len(vocab)


def _dense(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes 0..k-1 in order of first appearance, first row of each code) of int64 keys; one
    ``np.unique`` over the runs of equal adjacent keys (the records of a request are usually adjacent)."""
    n = len(key)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    _, first, inv = np.unique(key[starts], return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    by_first = np.argsort(first)
    rank[by_first] = np.arange(len(first), dtype=np.int64)
    codes = np.repeat(rank[inv.reshape(-1)], np.diff(np.append(starts, n)))
    return codes, starts[first[by_first]]


def _pair_codes(first, second) -> tuple[np.ndarray, np.ndarray]:
    """(codes of the distinct (first, second) pairs per row, first row of each code) of two string
    columns."""
    a, _ = _encode(first)
    b, vb = _encode(second)
    return _dense(a * max(len(vb), 1) + b)


def _repeats(group: np.ndarray, values, starts: np.ndarray | None = None, piece: int = 1 << 16) -> np.ndarray:
    """Groups (int64 codes) in which a value (a string column) occurs twice. ``starts``: the first
    row of each group when the rows are grouped (each group's rows adjacent): the rows are then
    coded in pieces of about ``piece`` rows cut between groups (smaller hash tables)."""
    n = len(values)
    if starts is not None and n and isinstance(values, pa.Array) and not values.null_count:
        sizes = np.diff(np.append(starts, n))
        longest = int(sizes.max())
        if longest <= _NEARBY:
            return _repeats_nearby(group, values, starts, sizes, longest)
    if starts is not None and n > piece:
        at = np.searchsorted(starts, np.arange(piece, n, piece))
        cuts = np.unique(starts[at[at < len(starts)]])
        bounds = np.concatenate(([0], cuts[(cuts > 0) & (cuts < n)], [n]))
        found = [_repeats(group[lo:hi], values.slice(lo, hi - lo)) for lo, hi in zip(bounds[:-1], bounds[1:])]
        return np.unique(np.concatenate(found))
    codes, vocab = _encode(values)
    if len(vocab) == len(codes):  # all distinct
        return np.zeros(0, np.int64)
    key = group * len(vocab) + codes
    if len(pc.unique(pa.array(key))) == len(key):
        return np.zeros(0, np.int64)
    s = np.sort(key)
    return np.unique(s[1:][s[1:] == s[:-1]] // len(vocab))


_NEARBY = 16  # groups up to this size are checked by comparing each value with the ones before it


def _several(group: np.ndarray, values, starts: np.ndarray) -> np.ndarray:
    """Groups (int64 codes; rows grouped, each group's rows adjacent from ``starts``) whose rows do not
    all carry the same value of the string column ``values`` (nulls: a value of their own)."""
    n = len(values)
    if n < 2:
        return np.zeros(0, np.int64)
    differs = np.concatenate(([False], _changes(_strings(values))))
    differs[starts] = False  # a group's first row starts it, whatever came before
    return np.unique(group[differs])


def _repeats_nearby(group: np.ndarray, values: pa.Array, starts: np.ndarray, sizes: np.ndarray,
                    longest: int) -> np.ndarray:
    """:func:`_repeats` of small adjacent groups (at most ``longest`` rows each; no nulls): each value
    compared with the value ``d`` rows before it, for d = 1 .. longest - 1, where both rows are in
    one group (Arrow's string equality, no hash table)."""
    n = len(values)
    within = np.arange(n, dtype=np.int64) - np.repeat(starts, sizes)  # the row's place in its group
    found = np.zeros(n, dtype=bool)
    for d in range(1, longest):
        eq = np.asarray(pc.equal(values.slice(d), values.slice(0, n - d)).to_numpy(zero_copy_only=False), dtype=bool)
        eq &= within[d:] >= d
        found[d:] |= eq
    return np.unique(group[found])


def _unique_codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` of non-negative int64 keys (inverse as int64), by a
    presence table instead of a sort when the keys are small (windows x slices x systems x positions)."""
    n = len(key)
    if n and key.min() >= 0 and int(key.max()) < max(4 * n, 1 << 16):
        present = np.zeros(int(key.max()) + 1, dtype=bool)
        present[key] = True
        uk = np.flatnonzero(present)
        remap = np.zeros(len(present), dtype=np.int64)
        remap[uk] = np.arange(len(uk), dtype=np.int64)
        return uk, remap[key]
    uk, inv = np.unique(key, return_inverse=True)
    return uk, inv.reshape(n).astype(np.int64)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def shard_of(*parts: str, shards: int = SHARDS) -> int:
    """The shard of a request (``shard_of(system_id, request_id)``) or a query (``shard_of(query_id)``):
    CRC-32 of the parts, stable across processes (Python's ``hash`` of a str is not)."""
    return _crc("\x00".join(parts)) % shards


def _shards_of(first, second, shards: int) -> np.ndarray:
    """:func:`shard_of` per row of one or two string columns (no nulls): one CRC-32 per distinct key,
    of its UTF-8 bytes as Arrow holds them."""
    if not len(first):
        return np.zeros(0, np.int64)
    if second is None:
        codes, keys = _encode(first)
    else:
        codes, rows = _pair_codes(first, second)
        keys = pc.binary_join_element_wise(_pick(first, rows), _pick(second, rows), "\x00")
    return _key_shards(keys, shards)[codes]


def _key_shards(keys: pa.Array, shards: int) -> np.ndarray:
    """:func:`shard_of` of each (distinct) string of ``keys`` (no nulls), int64."""
    crc = np.fromiter(map(zlib.crc32, keys.cast(pa.binary()).to_pylist()), dtype=np.int64, count=len(keys))
    return crc % shards


def _part(a, lo: int, hi: int):
    """Rows ``lo:hi`` of a numpy (a view) or Arrow (a zero-copy slice) column."""
    return a[lo:hi] if isinstance(a, np.ndarray) else a.slice(lo, hi - lo)


def _slice(chunk: dict, lo: int, hi: int) -> dict:
    """Rows ``lo:hi`` of a column dict, as views (numpy) and zero-copy slices (Arrow)."""
    out = {k: ({a: _part(c, lo, hi) for a, c in v.items()} if k == "attributes" else _part(v, lo, hi))
           for k, v in chunk.items() if k != "n"}
    out["n"] = hi - lo
    return out


def _split(chunk: dict, shard: np.ndarray, runs=(), hold: bool = False):
    """(shard, frozen sub-chunk) pairs (``runs``, ``hold``: as :func:`freeze`). Held values are
    slices of one copy of the chunk in shard order (one take per column); pickled ones are taken
    shard by shard (a pickled Arrow slice carries its whole buffers)."""
    if not len(shard):
        return
    order, starts, ends = _group_bounds(shard)
    if hold:
        whole = _take(chunk, order, _fields_not_in_runs(chunk, runs))
        for k, v in chunk.items():  # the run columns: their runs moved, not their rows
            if k in runs and k == "attributes":
                whole[k] = {a: _runs_in_order(c, shard) for a, c in v.items()}
            elif k in runs:
                whole[k] = _runs_in_order(v, shard)
    for lo, hi in zip(starts.tolist(), ends.tolist()):
        part = _slice(whole, lo, hi) if hold else _take(chunk, order[lo:hi])
        yield int(shard[order[lo]]), freeze(part, runs, hold)


def _fields_not_in_runs(chunk: dict, runs) -> tuple:
    return tuple(k for k in chunk if k != "n" and k not in runs)


def _runs_in_order(a, shard: np.ndarray):
    """The Arrow string column ``a`` with its rows in the stable order of ``shard`` (as
    ``_pick(a, _group_bounds(shard)[0])``), as a run-end encoded array when that takes at most half
    the rows: a stretch of rows with one value and one shard stays contiguous in that order, so only
    the first row of each stretch is taken (a request's records are adjacent and share their
    request, query, user, system and attributes), instead of every row and then encoding the runs.
    Otherwise (few runs, another type) the rows taken one by one."""
    n = len(a)
    if not isinstance(a, pa.Array) or n < 16 or pa.types.is_run_end_encoded(a.type):
        return _pick(a, _group_bounds(shard)[0])
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(shard[1:], shard[:-1], out=new[1:])
    new[1:] |= _changes(a)
    seg = np.flatnonzero(new)
    if 2 * len(seg) > n:
        return _pick(a, _group_bounds(shard)[0])
    lengths = np.diff(np.append(seg, n))
    by_shard = _group_bounds(shard[seg])[0]
    ends = np.cumsum(lengths[by_shard]).astype(np.int32)
    values = _pick(a, seg[by_shard])
    # from_buffers, not from_arrays: pyarrow 16's from_arrays refuses an Arrow array of run ends
    # ("TypeError: an integer is required", under Beam 2.62's pyarrow<17); n is the logical length
    return pa.RunEndEncodedArray.from_buffers(pa.run_end_encoded(pa.int32(), values.type), n, [None], 0, 0,
                                              [pa.array(ends, type=pa.int32()), values])


def _group_bounds(codes: np.ndarray):
    """Sort ``codes`` (non-negative ints): (order, starts, ends) of the runs of equal codes. Codes
    below 256 (shard numbers) are sorted as uint8, by numpy's radix sort: the same stable order."""
    small = len(codes) and codes.dtype.kind in "iu" and codes.min() >= 0 and codes.max() < 256
    order = np.argsort(codes.astype(np.uint8) if small else codes, kind="stable")
    s = codes[order]
    if not len(s):
        return order, np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1))
    return order, starts, np.append(starts[1:], len(s))
