"""The batch job's block-columnar path: one Beam element per block of records, never one per impression.

Same results as the per-record transforms (:class:`~streameval.beam.transforms.ValidateImpressions`,
:class:`~streameval.beam.transforms.CleanImpressions`, :class:`~streameval.beam.transforms.ScoreRankings`,
:class:`~streameval.beam.transforms.ClickMetrics`; the tests compare the two row for row, dead letter
for dead letter and counter for counter), with the Beam overhead paid per block instead of per record:

1. :class:`ReadImpressionColumns` / :class:`ReadJudgmentColumns`: each Avro block becomes a dict of
   columns (:func:`impression_columns`: numbers as numpy arrays, ids and attribute values as Arrow
   string arrays). Validation is vectorised; a row the vectorised screen
   does not clear is checked by :func:`streameval.io.records.check_impression` itself, so the reasons
   are the record checks' own. Rows are split into :data:`SHARDS` shards by a stable hash (CRC-32) of
   their request (impressions) or query (judgments): one element per (block, shard), its value
   compacted and pickled (:func:`freeze`).
2. Per request shard (``GroupByKey``), :class:`_CleanShard`: replays and conflicts are detected
   vectorised (an event id or an item repeated within a request); only the requests that have one go
   through :func:`streameval.io.cleaning.clean_request`. CTR counts by (window, slice, system,
   position) are taken here; the requests (query, earliest timestamp, attributes) and their items
   go on, re-sharded by query.
3. Per query shard of judgments (``GroupByKey``), :class:`_ResolveShard`: one grade per (query, item)
   (:func:`streameval.io.cleaning.resolve_judgment` for the conflicting pairs only). Per query shard
   of requests (``GroupByKey``; the shard's resolved judgments come as a side input),
   :class:`_ScoreShard`: every request of the shard ranked (:func:`streameval.metrics.prepare.rank_order`) and scored by
   one :func:`streameval.metrics.kernel.compute` call; the per-request values are added into exact
   mean states (:class:`~streameval.accumulators.moments.MeanMoments`) per (window, slice, system).
4. The states of all shards are merged per key (``CombinePerKey``) into metric rows.

Counters are those of the per-record transforms (see :mod:`streameval.beam.accounting`).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import typing
import zlib
from operator import itemgetter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue

from ..accumulators.bootstrap import DEFAULT_REPLICATES, PoissonBootstrap
from ..accumulators.moments import MeanMoments
from ..io import avro, cleaning, records
from ..metrics import stats
from ..metrics.kernel import MetricOptions, RankedLists, compute
from ..metrics.names import parse_metrics
from ..metrics.prepare import judgment_histogram, rank_order
from .combiners import BatchedStatesMixin, CtrByPositionCombineFn, MeanCombineFn
from .stats import BootstrapMeanCombineFn
from .sources import UNREADABLE, read_avro_blocks, unreadable_letter
from .threads import ThreadedDoFn, counter, distribution
from .transforms import (ALL, NAMESPACE, SOURCE_UNRANKABLE, judgment_grade_range, _bootstrap_rows, _category, _click_rows, _rows, _window_micros, parse_lateness, parse_slices, reason_key,
                         slice_part, window_bounds)

__all__ = ["SHARDS", "DECODER_NAMESPACE", "SHARD_IMPRESSIONS", "auto_shards", "UNREADABLE", "impression_columns", "judgment_columns", "columns_records", "ReadImpressionColumns",
           "ReadJudgmentColumns", "ColumnarMetrics", "shard_of"]

#: shards of the requests and of the queries (the unit of work of stages 2 and 3): the least of
#: ``--shards auto``, and the count of the engine when none is given
SHARDS = 16
#: impressions per shard that ``--shards auto`` aims at (the largest element of stages 2 and 3 is
#: about this many impressions, whatever the input's size)
SHARD_IMPRESSIONS = 500_000
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

#: decoders of local Avro files: Apache DataFusion to Arrow columns (:mod:`streameval.io.arrow_avro`;
#: fastavro for any file or rest of a file it does not take) or fastavro's dicts only
DECODERS = ("datafusion", "fastavro")
#: namespace of the counters ``<decoders>:<path>`` (1 per input file): the decoders that gave the file's
#: records (apart from the records' counters: how a file was read is not what it holds)
DECODER_NAMESPACE = "streameval.decoders"


def default_decoder() -> str:
    """``"datafusion"`` when datafusion and pyarrow import, else ``"fastavro"``."""
    from ..io import arrow_avro

    return "datafusion" if arrow_avro.available() else "fastavro"


IMPRESSION_FIELDS = ("event_id", "request_id", "query_id", "user_id", "system_id", "item_id", "position", "score",
                     "clicked", "timestamp", "propensity")
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
    has = pc.match_substring(a, "\x00")
    if has.null_count:
        has = pc.fill_null(has, False)
    return ~np.asarray(has.to_numpy(zero_copy_only=False), dtype=bool)


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
    if not runs or not isinstance(a, pa.Array) or len(a) < 16:
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
    """Drop the values :func:`freeze` held in this process (after a run)."""
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
    "attributes": {key: Arrow string array, null where the record lacks the key}}``. The inverse is
    :func:`columns_records`. ``nulls``: a dict to receive the number of null scores and propensities
    (keys ``"score"``, ``"propensity"``)."""
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
    attrs = [r.get("attributes") or {} for r in recs]
    keys = set()
    for a in attrs:
        if a:
            keys.update(a)
    out["attributes"] = {k: _strings([a.get(k) for a in attrs]) for k in sorted(keys)}
    return out


def judgment_columns(recs) -> dict:
    """Columns of judgment dicts: ``{"n", "query_id", "item_id", "source": Arrow string arrays,
    "grade", "timestamp": int64 (0 when null)}``."""
    n = len(recs)
    ts = [r.get("timestamp") for r in recs]
    if None in ts:
        ts = [0 if t is None else t for t in ts]
    return {"n": n, "query_id": _strings(list(map(itemgetter("query_id"), recs))),
            "item_id": _strings(list(map(itemgetter("item_id"), recs))),
            "grade": np.fromiter(map(itemgetter("grade"), recs), dtype=np.int64, count=n),
            "timestamp": np.array(ts, dtype=np.int64).reshape(n), "source": _strings([r.get("source") for r in recs])}


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
    propensity) of an Arrow table of impressions (:func:`streameval.io.arrow_avro.read_tables`)."""
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
    out["attributes"] = _arrow_map_columns(table.column("attributes"), n)
    return out, nulls[0], nulls[1]


def judgment_columns_arrow(table) -> dict:
    """Columns as :func:`judgment_columns` makes them, of an Arrow table of judgments."""
    return {"n": table.num_rows, "query_id": _string_column(table.column("query_id")),
            "item_id": _string_column(table.column("item_id")), "grade": _arrow_ints(table.column("grade")),
            "timestamp": _arrow_ints(table.column("timestamp")), "source": _string_column(table.column("source"))}


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
               "attributes": {k: v[j] for k, v in attrs.items() if v[j] is not None}}
        out.append(rec)
    return out


def _judgment_records(chunk: dict, rows) -> list[dict]:
    rows = np.fromiter(rows, dtype=np.int64)
    q, d, src = (_pylist(chunk[f], rows) for f in ("query_id", "item_id", "source"))
    return [{"query_id": q[j], "item_id": d[j], "grade": int(chunk["grade"][i]), "timestamp": int(chunk["timestamp"][i]),
             "source": src[j]} for j, i in enumerate(rows.tolist())]


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
    crc = np.fromiter(map(zlib.crc32, keys.cast(pa.binary()).to_pylist()), dtype=np.int64, count=len(keys))
    return (crc % shards)[codes]


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
        whole = _take(chunk, order)
    for lo, hi in zip(starts.tolist(), ends.tolist()):
        part = _slice(whole, lo, hi) if hold else _take(chunk, order[lo:hi])
        yield int(shard[order[lo]]), freeze(part, runs, hold)


# --------------------------------------------------------------------------------------------
# stage 1: read, validate, shard

class _ReadColumns(ThreadedDoFn):
    kind = ""
    #: string columns whose runs of equal values are encoded between stages (see freeze)
    runs: tuple = ()

    def __init__(self, shards: int, grade_range=None, decoder: str = "datafusion", hold: bool = False,
                 threads: int = 1, time_range=None):
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}")
        self.threads = int(threads)
        self.hold = hold
        self.shards = shards
        self.decoder = decoder
        self.grade_range = records.as_grade_range(grade_range)
        # the impressions' event times: the representable ones, narrowed by --event-time-range
        lo, hi = time_range if time_range is not None else (records.EVENT_TIME_MIN, records.EVENT_TIME_MAX)
        self.time_range = time_range
        self.ts_lo, self.ts_hi = max(int(lo), records.EVENT_TIME_MIN), min(int(hi), records.EVENT_TIME_MAX)
        self.read = counter(NAMESPACE, f"{self.kind}s_read")
        self.valid = counter(NAMESPACE, f"{self.kind}s_valid")
        self.unreadable = counter(NAMESPACE, f"unreadable_files:{self.kind}")

    def work(self, path):
        n = 0
        used = set()  # the decoders that gave this file's records (counter decoder:<names>:<path>)
        try:
            for recs in read_avro_blocks(path, self.kind, self.decoder):
                if isinstance(recs, list):
                    used.add("fastavro")
                    self.read.inc(len(recs))
                    n += len(recs)
                    yield from self._block(recs, path)
                else:  # an Arrow table (arrow_avro.read_tables)
                    used.add("datafusion")
                    self.read.inc(recs.num_rows)
                    n += recs.num_rows
                    yield from self._table(recs, path)
        except avro.AvroInputError as e:  # damaged content: the records before it and a dead letter
            # (a file the environment does not deliver raises InputUnavailableError: the bundle fails)
            self.unreadable.inc()
            yield pvalue.TaggedOutput("dead_letters", unreadable_letter(path, f"{self.kind}s", e, n))
        counter(DECODER_NAMESPACE, f"{'+'.join(sorted(used)) or 'none'}:{path}").inc()

    def _finish(self, recs, chunk, ok, bad, check, shards, path):
        """Dead letters of the ``bad`` rows the record check rejects (``source``: their file
        ``path``), then the valid rows' columns split by shard."""
        dead = []
        if len(bad):
            passed, dead = self._reject(recs, bad, check, path)
            ok[passed] = True
        yield from dead
        if not ok.all():
            chunk = _take(chunk, ok)
        self.valid.inc(chunk["n"])
        yield from _split(chunk, shards(chunk), self.runs, self.hold)

    def _reject(self, recs, rows, check, path):
        """Run the record check on ``rows`` (read from ``path``): (rows that pass, dead letters)."""
        passed, dead = [], []
        for i in rows:
            reason = check(recs[i])
            if reason is None:
                passed.append(i)
                continue
            counter(NAMESPACE, f"rejected:{self.kind}:{reason_key(reason)}").inc()
            dead.append(pvalue.TaggedOutput("dead_letters", {"source": str(path),
                                                             "raw": records.to_json_text(recs[i]), "reason": reason}))
        return passed, dead


class _ReadImpressionColumns(_ReadColumns):
    kind = "impression"
    runs = ("request_id", "query_id", "user_id", "system_id", "attributes")  # a request's records are adjacent

    def _screen(self, chunk, score_ok, prop_ok) -> np.ndarray:
        """Rows the vectorised screen clears (the others go through the record check, which decides
        and gives the reason): the ranges are :mod:`streameval.io.records`'."""
        pos = chunk["position"]
        ts = chunk["timestamp"]
        ok = (pos >= 1) & (pos <= records.AVRO_INT_MAX) & (ts >= self.ts_lo) & (ts <= self.ts_hi)
        for f in ("event_id", "request_id", "system_id", "item_id"):
            ok &= _nonempty(chunk[f])
        for f in records.ID_FIELDS["impression"]:
            ok &= _no_nul(chunk[f])
        return ok & score_ok & prop_ok

    def _check(self, rec):
        return records.check_impression(rec, self.time_range)

    def _shards(self, chunk):
        return _shards_of(chunk["system_id"], chunk["request_id"], self.shards)

    def _block(self, recs, path):
        nulls: dict = {}
        chunk = impression_columns(recs, nulls)
        # NaN is null (valid) or NaN (not): when the NaNs are as many as the nulls, all are nulls
        fine = {}
        for f in ("score", "propensity"):
            v = chunk[f]
            nan = np.isnan(v)
            n_nan = int(nan.sum())
            fine[f] = np.isfinite(v) if f == "score" else (v > 0) & (v <= 1)
            if n_nan and n_nan == nulls[f]:
                fine[f] |= nan
        ok = self._screen(chunk, fine["score"], fine["propensity"])
        bad = np.flatnonzero(~ok)
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path)

    def _table(self, table, path):
        chunk, score_null, prop_null = impression_columns_arrow(table)
        prop = chunk["propensity"]
        ok = self._screen(chunk, np.isfinite(chunk["score"]) | score_null, ((prop > 0) & (prop <= 1)) | prop_null)
        bad = np.flatnonzero(~ok)
        recs = {}
        for i, rec in zip(bad.tolist(), columns_records(chunk, bad)):
            for f, null in (("score", score_null), ("propensity", prop_null)):
                if not null[i]:  # NaN is a value here, not a null
                    rec[f] = float(chunk[f][i])
            recs[i] = rec
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path)


class _ReadJudgmentColumns(_ReadColumns):
    kind = "judgment"
    runs = ("query_id", "source")

    def _screen(self, chunk) -> np.ndarray:
        g = chunk["grade"]
        ok = _nonempty(chunk["query_id"]) & _nonempty(chunk["item_id"])
        for f in records.ID_FIELDS["judgment"]:
            ok &= _no_nul(chunk[f])
        ok &= (g >= records.AVRO_INT_MIN) & (g <= records.AVRO_INT_MAX)
        ts = chunk["timestamp"]  # 0 when null
        ok &= (ts >= records.EVENT_TIME_MIN) & (ts <= records.EVENT_TIME_MAX)
        if self.grade_range is not None:
            ok &= (g >= self.grade_range[0]) & (g <= self.grade_range[1])
        return ok

    def _check(self, rec):
        return records.check_judgment(rec, self.grade_range)

    def _shards(self, chunk):
        return _shards_of(chunk["query_id"], None, self.shards)

    def _block(self, recs, path):
        chunk = judgment_columns(recs)
        ok = self._screen(chunk)
        bad = np.flatnonzero(~ok)
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path)

    def _table(self, table, path):
        chunk = judgment_columns_arrow(table)
        ok = self._screen(chunk)
        bad = np.flatnonzero(~ok)
        recs = dict(zip(bad.tolist(), _judgment_records(chunk, bad)))
        yield from self._finish(recs, chunk, ok, bad, self._check, self._shards, path)


class _Read(beam.PTransform):
    fn = None

    def __init__(self, paths, shards: int = SHARDS, grade_range=None, decoder: str | None = None,
                 hold: bool = False, threads: int = 1, label=None, time_range=None):
        super().__init__(label)
        self.time_range = time_range
        self.hold = hold
        self.threads = int(threads)
        self.paths = list(paths)
        self.shards = int(shards)
        self.grade_range = grade_range
        self.decoder = decoder or default_decoder()
        self.dead_letters = None

    def expand(self, pbegin):
        read = (pbegin
                | "Paths" >> beam.Create(self.paths)
                | "Spread" >> beam.Reshuffle()
                | "Blocks" >> beam.ParDo(self.fn(self.shards, self.grade_range, self.decoder,
                                                 self.hold, self.threads, self.time_range)).with_outputs(
                    "dead_letters", main="chunks"))
        #: dead letters: records failing the checks, and one per file that could not be read to its end
        self.dead_letters = read.dead_letters
        return read.chunks


class ReadImpressionColumns(_Read):
    """``paths`` of impression Avro files -> ``(request shard, column dict)`` elements, one per
    (block, shard); ``.dead_letters`` after application. Counters ``impressions_read``,
    ``impressions_valid``, ``rejected:impression:<reason>``, ``unreadable_files:impression``."""

    fn = _ReadImpressionColumns


class ReadJudgmentColumns(_Read):
    """As :class:`ReadImpressionColumns` for judgments, sharded by query (``grade_range`` as
    :class:`~streameval.beam.transforms.ValidateJudgments`)."""

    fn = _ReadJudgmentColumns


# --------------------------------------------------------------------------------------------
# slices

def _labels(attrs: dict, n: int, slice_specs) -> list[tuple[np.ndarray, list]]:
    """Per slice specification (``"all"`` first): (int64 label code per row, label texts)."""
    out = [(np.zeros(n, np.int64), [ALL])]
    coded: dict = {}
    for names in slice_specs:
        key = np.zeros(n, np.int64)
        vocabs = []
        for a in names:
            if a not in coded:
                col = attrs.get(a)  # null: the attribute is absent (a None in the vocabulary)
                coded[a] = (np.zeros(n, np.int64), _obj([None])) if col is None else _factorize(col)
            codes, vocab = coded[a]
            key = key * len(vocab) + codes
            vocabs.append(vocab)
        uk, inv = _unique_codes(key)
        texts = []
        for k in uk.tolist():
            parts = []
            for a, vocab in zip(reversed(names), reversed(vocabs)):
                parts.append(slice_part(a, vocab[k % len(vocab)]))
                k //= len(vocab)
            texts.append(",".join(reversed(parts)))
        out.append((inv, texts))
    return out


def _windows(ts: np.ndarray, window_micros) -> tuple[np.ndarray, list]:
    """(int64 window code per row, ``(window_start, window_end)`` per code) of the fixed,
    epoch-aligned windows holding ``ts`` (:func:`~streameval.beam.transforms.window_bounds`);
    one ``(None, None)`` global window when ``window_micros`` is None."""
    if window_micros is None:
        return np.zeros(len(ts), np.int64), [(None, None)]
    starts, codes = np.unique(ts - ts % window_micros, return_inverse=True)
    return codes.reshape(len(ts)).astype(np.int64), [(w, w + window_micros) for w in starts.tolist()]


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


def _grouped(chunk: dict, req: np.ndarray, fields=None):
    """(chunk, req, starts, ends) with each request's rows adjacent, in request-code order: taken
    (``fields`` only, if given) only when they are not so already (the usual case)."""
    order, starts, ends = _group_bounds(req)
    if not (np.diff(order) == 1).all():
        chunk = _take(chunk, order, fields)
        req = req[order]
    return chunk, req, starts, ends


# --------------------------------------------------------------------------------------------
# stage 2: clean the requests, count clicks, re-shard by query

def _first_min(values: pa.Array, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """Per run [start, end) of a string column (null = absent): the smallest non-null value."""
    n = len(values)
    if n == 0 or not len(starts):
        return values.slice(0, 0)
    codes, _ = _encode(values)
    same = np.ones(n, dtype=bool)
    same[1:] = codes[1:] == codes[:-1]
    same[starts] = True
    pick = starts.copy()
    for r in np.flatnonzero(np.add.reduceat(~same, starts) > 0).tolist():
        lo = int(starts[r])
        vals = values.slice(lo, int(ends[r]) - lo).to_pylist()
        present = [(v, j) for j, v in enumerate(vals) if v is not None]
        if present:
            pick[r] = lo + min(present)[1]
    return _pick(values, pick)


class _CleanShard(ThreadedDoFn):
    def __init__(self, source: str, ranking: bool, ctr: bool, window_micros, slice_specs, order: str, shards: int,
                 hold: bool = False, threads: int = 1, lateness_micros: int = 0, online=None, systems: bool = False,
                 hot_fraction: float = 0.0, hot_min: int | None = None):
        #: hot queries' fan-out (columnar_hot.fan_out): their share of the shard's requests above which
        #: they are split over sub-elements (0: never), and the fewest requests that make one hot
        self.hot_fraction = float(hot_fraction)
        self.hot_min = hot_min
        self.online = online  # a columnar_online.OnlineColumns, or None
        self.systems = systems  # emit each chunk's systems (tag "systems"): complete=True needs them all
        self.lateness_micros = int(lateness_micros)
        self.late = counter(NAMESPACE, "late:impression")
        self.hold = hold
        self.threads = int(threads)
        self.source = source
        self.ranking = ranking
        self.ctr = ctr
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.order = order
        self.shards = shards
        self.attr_keys = sorted({a for names in slice_specs for a in names})
        self.accepted = counter(NAMESPACE, "impressions_accepted")
        self.duplicates = counter(NAMESPACE, "duplicate:impression")
        self.counted = counter(NAMESPACE, "click_impressions")
        self.no_clicks = counter(NAMESPACE, "click_impressions_not_logged")
        #: impressions per element of this stage (one request shard): bounded by --shards
        self.element_rows = distribution(NAMESPACE, "element_impressions:clean")
        #: the fan-out F of each hot query of each request shard (no value: no query was hot)
        self.fan_out = distribution(NAMESPACE, "hot_query_fanout")

    def work(self, element):
        _, chunks = element
        chunk = _concat([thaw(c) for c in chunks])
        self.element_rows.update(chunk["n"])
        if not chunk["n"]:
            return
        req, first = _pair_codes(chunk["system_id"], chunk["request_id"])
        if self.window_micros is not None:  # late data first, the request rules on the rest (cleaning)
            chunk, late = self._after_close(chunk, req)
            if late:
                yield from late
                req, first = _pair_codes(chunk["system_id"], chunk["request_id"])
        chunk, req, starts, _ = _grouped(chunk, req)
        bad = np.zeros(len(first), dtype=bool)
        bad[_repeats(req, chunk["event_id"], starts)] = True
        bad[_repeats(req, chunk["item_id"], starts)] = True
        bad[_several(req, chunk["query_id"], starts)] = True  # cleaning.REASON_QUERY_CONFLICT
        n_dup = 0
        rebuilt = bool(bad.any())
        if rebuilt:
            rows_bad = bad[req]
            kept = []
            clean_part = _take(chunk, ~rows_bad)
            order, starts, ends = _group_bounds(req[rows_bad])
            idx = np.flatnonzero(rows_bad)[order]
            for lo, hi in zip(starts, ends):
                recs = columns_records(chunk, idx[lo:hi])
                k, d, rejected = cleaning.clean_request(recs)
                kept.extend(k)
                n_dup += d
                for rec, reason in rejected:
                    counter(NAMESPACE, f"rejected:impression:{_category(reason)}").inc()
                    yield pvalue.TaggedOutput("dead_letters", {"source": self.source,
                                                               "raw": records.to_json_text(rec), "reason": reason})
            chunk = _concat([clean_part, impression_columns(kept)]) if kept else clean_part
        self.duplicates.inc(n_dup)
        self.accepted.inc(chunk["n"])
        if not chunk["n"]:
            return
        if self.ctr:
            yield from self._clicks(chunk)
        if self.online:
            yield from self.online.states(chunk)
        if self.ranking:
            if rebuilt:  # the chunk was rebuilt: code its requests again
                req, _ = _pair_codes(chunk["system_id"], chunk["request_id"])
            yield from self._requests(chunk, req)

    def _after_close(self, chunk, req):
        """(chunk, late dead letters): a request's impressions (``req``: their request codes) at or
        after the end of its earliest impression's window plus the allowed lateness are late data
        (the rule of :func:`streameval.io.cleaning.split_after_close`, vectorised, applied before
        the request rules as there)."""
        ts = chunk["timestamp"]
        t0 = np.full(int(req.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(t0, req, ts)
        close = cleaning.request_close(t0, self.window_micros, self.lateness_micros)
        late = ts >= close[req]
        if not late.any():
            return chunk, []
        rows = np.flatnonzero(late)
        letters = [pvalue.TaggedOutput("dead_letters", {
            "source": "late:impression", "raw": records.to_json_text(rec),
            "reason": cleaning.after_close_reason(int(ts[i]), int(close[req[i]]))})
            for rec, i in zip(columns_records(chunk, rows), rows.tolist())]
        self.late.inc(len(rows))
        return _take(chunk, ~late), letters

    def _clicks(self, chunk):
        logged = chunk["clicked"] >= 0
        n_logged = int(logged.sum())
        self.counted.inc(n_logged)
        self.no_clicks.inc(chunk["n"] - n_logged)
        if not n_logged:
            return
        c = _take(chunk, logged) if n_logged < chunk["n"] else chunk
        wcode, wkeys = _windows(c["timestamp"], self.window_micros)
        scode, svals = _factorize(c["system_id"])
        pos = c["position"]
        clicked = c["clicked"].astype(np.int64)
        npos = int(pos.max()) + 1
        for lcode, lvals in _labels(c["attributes"], c["n"], self.slice_specs):
            key = ((wcode * len(lvals) + lcode) * len(svals) + scode) * npos + pos
            uk, inv = _unique_codes(key)
            imps = np.bincount(inv)
            clicks = np.bincount(inv, weights=clicked).astype(np.int64)
            states: dict = {}
            rest = uk // npos
            p = uk % npos
            s = rest % len(svals)
            rest //= len(svals)
            l = rest % len(lvals)
            w = rest // len(lvals)
            for wi, li, si, pi, ni, ci in zip(w.tolist(), l.tolist(), s.tolist(), p.tolist(), imps.tolist(),
                                              clicks.tolist()):
                states.setdefault((*wkeys[wi], lvals[li], svals[si]), {})[pi] = [ni, ci]
            for key, st in states.items():
                yield pvalue.TaggedOutput("clicks", (key, st))

    def _requests(self, chunk, req):
        rows, _, starts, ends = _grouped(chunk, req, ("query_id", "timestamp", "attributes", "score", "item_id",
                                                     "position", "system_id", "request_id"))
        nreq = len(starts)
        if self.systems:
            for system in pc.unique(rows["system_id"]).to_pylist():
                yield pvalue.TaggedOutput("systems", system)
        query = _first_min(rows["query_id"], starts, ends)
        min_ts = np.minimum.reduceat(rows["timestamp"], starts)
        attrs = {a: _first_min(rows["attributes"][a], starts, ends) for a in self.attr_keys if a in rows["attributes"]}
        out = {"n_requests": nreq, "system_id": _pick(rows["system_id"], starts),
               "request_id": _pick(rows["request_id"], starts), "query_id": query, "min_ts": min_ts,
               "records": (ends - starts).astype(np.int64),
               "unscored": (np.add.reduceat(np.isnan(rows["score"]).astype(np.int64), starts)
                            if self.order == "score" else np.zeros(nreq, np.int64)),
               "attributes": attrs,
               # items: request index, item, score, position
               "row_request": np.repeat(np.arange(nreq, dtype=np.int64), ends - starts),
               "item_id": rows["item_id"], "score": rows["score"], "position": rows["position"]}
        shard = _shards_of(query, None, self.shards)
        if self.hot_fraction > 0:  # a hot query's requests go to sub-elements (query shard, j) of its shard
            from . import columnar_hot as hq

            sub, hot, fans = hq.fan_out(query, out["request_id"], self.shards, self.hot_fraction,
                                        hq.HOT_MIN_REQUESTS if self.hot_min is None else self.hot_min)
            for q, f in zip(hot, fans):
                self.fan_out.update(f)
                yield pvalue.TaggedOutput("hot_queries", q)
            if hot:
                code = shard * (self.shards + 1) + sub + 1
                for c, part in _split_requests(out, code, self.hold):
                    s, j = divmod(c, self.shards + 1)
                    yield (hq.element_key(s, j - 1), freeze(part, hold=self.hold))
                return
        for s, sub in _split_requests(out, shard, self.hold):
            yield (s, freeze(sub, hold=self.hold))


def _take_requests(r: dict, sel: np.ndarray) -> dict:
    """Requests ``sel`` (indices, ascending) of a request dict, with their items."""
    keep = np.zeros(r["n_requests"], dtype=bool)
    keep[sel] = True
    rows = keep[r["row_request"]]
    renum = np.full(r["n_requests"], -1, dtype=np.int64)
    renum[sel] = np.arange(len(sel), dtype=np.int64)
    out = {"n_requests": len(sel)}
    for k in _REQUEST_FIELDS:
        out[k] = _pick(r[k], sel)
    out["attributes"] = {a: _pick(c, sel) for a, c in r["attributes"].items()}
    out["row_request"] = renum[r["row_request"][rows]]
    for k in _ROW_FIELDS:
        out[k] = _pick(r[k], rows)
    return out


_REQUEST_FIELDS = ("system_id", "request_id", "query_id", "min_ts", "records", "unscored")
_ROW_FIELDS = ("item_id", "score", "position")


def _split_requests(r: dict, shard: np.ndarray, hold: bool = False):
    """(shard, requests of that shard) pairs of a request dict whose rows are grouped by request in
    request order, ``shard`` per request. ``hold``: the parts are slices of one copy of ``r`` in
    shard order (one take per column); otherwise each is taken on its own (a pickled Arrow slice
    carries its whole buffers)."""
    if r["n_requests"] == 0:
        return
    us = np.unique(shard)
    if len(us) == 1:
        yield int(us[0]), r
        return
    if not hold:
        for s in us:
            yield int(s), _take_requests(r, np.flatnonzero(shard == s))
        return
    order, starts, ends = _group_bounds(shard)
    lens = np.bincount(r["row_request"], minlength=r["n_requests"])
    row_start = np.cumsum(lens) - lens
    whole = {k: _pick(r[k], order) for k in _REQUEST_FIELDS}
    attrs = {a: _pick(c, order) for a, c in r["attributes"].items()}
    rows = _range_index(row_start[order], lens[order])
    items = {k: _pick(r[k], rows) for k in _ROW_FIELDS}
    row_off = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lens[order], out=row_off[1:])
    for lo, hi in zip(starts.tolist(), ends.tolist()):
        a, b = int(row_off[lo]), int(row_off[hi])
        part = {"n_requests": hi - lo, **{k: _part(v, lo, hi) for k, v in whole.items()},
                "attributes": {k: _part(v, lo, hi) for k, v in attrs.items()},
                "row_request": np.repeat(np.arange(hi - lo, dtype=np.int64), lens[order[lo:hi]]),
                **{k: _part(v, a, b) for k, v in items.items()}}
        yield int(shard[order[lo]]), part


def _concat_requests(parts: list) -> dict:
    parts = [p for p in parts if p["n_requests"]]
    if len(parts) == 1:
        return parts[0]
    out = {"n_requests": sum(p["n_requests"] for p in parts)}
    for k in ("system_id", "request_id", "query_id", "min_ts", "records", "unscored", "item_id", "score", "position"):
        cols = [p[k] for p in parts]
        out[k] = np.concatenate(cols) if isinstance(cols[0], np.ndarray) else pa.concat_arrays(cols)
    base = np.cumsum([0] + [p["n_requests"] for p in parts[:-1]])
    out["row_request"] = np.concatenate([p["row_request"] + b for p, b in zip(parts, base)])
    out["attributes"] = _concat_attributes([(p["attributes"], p["n_requests"]) for p in parts])
    return out


# --------------------------------------------------------------------------------------------
# stage 3: judgments, ranking, means per (window, slice, system)

def _range_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for each (start, length)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)


class _ResolveShard(ThreadedDoFn):
    """Per query shard, its judgments resolved to one grade per (query, item): ``(shard, frozen
    {"n", "query_id", "item_id", "grade" (float64)})``, and dead letters (conflicts, policy reject)."""

    def __init__(self, policy: str, judg_source: str, hold: bool = False, threads: int = 1):
        self.hold = hold
        self.threads = int(threads)
        self.policy = policy
        self.judg_source = judg_source
        self.j_accepted = counter(NAMESPACE, "judgments_accepted")
        self.j_duplicates = counter(NAMESPACE, "duplicate:judgment")
        self.j_superseded = counter(NAMESPACE, "superseded:judgment")
        self.j_rejected = counter(NAMESPACE, f"rejected:judgment:{cleaning.REASON_JUDGMENT_CONFLICT}")

    def work(self, element):
        shard, values = element
        dead: list = []
        q, d, g = self._resolve(_concat([thaw(v) for v in values]), dead)
        for x in dead:
            yield pvalue.TaggedOutput("dead_letters", x)
        if len(g):
            yield shard, freeze({"n": len(g), "query_id": q, "item_id": d, "grade": g}, hold=self.hold)

    def _resolve(self, jc: dict, dead: list):
        """(query ids, item ids, grades float64) of the accepted judgments; their dead letters are
        appended to ``dead``."""
        n = jc["n"]
        if n == 0:
            return _strings([]), _strings([]), np.zeros(0)
        qc, _ = _encode(jc["query_id"])
        ic, ivocab = _encode(jc["item_id"])
        pair = qc * max(len(ivocab), 1) + ic
        order, starts, ends = _group_bounds(pair)
        ts, gr = jc["timestamp"][order], jc["grade"][order]
        sizes = ends - starts
        multi = np.flatnonzero(sizes > 1)
        first = order[starts]
        grades = jc["grade"][first].astype(np.float64)
        keep = np.ones(len(starts), dtype=bool)
        n_dup = 0
        n_sup = 0
        if len(multi):
            same = np.ones(len(order), dtype=bool)
            same[1:] = (ts[1:] == ts[:-1]) & (gr[1:] == gr[:-1])
            same[starts] = True
            conflicted = multi[np.add.reduceat(~same, starts)[multi] > 0]
            n_dup += int((sizes[multi] - 1).sum())
            for g in conflicted:
                lo, hi = starts[g], ends[g]
                entries: dict = {}
                rows: dict = {}
                for i in order[lo:hi]:
                    key = (int(jc["timestamp"][i]), int(jc["grade"][i]))
                    entries[key] = entries.get(key, 0) + 1
                    rows.setdefault(key, []).append(int(i))
                n_dup -= (hi - lo) - 1  # counted by resolve_judgment instead
                grade, dup, superseded, rejected = cleaning.resolve_judgment(entries, self.policy)
                n_dup += dup
                n_sup += len(superseded)
                qid, item = jc["query_id"][int(order[lo])].as_py(), jc["item_id"][int(order[lo])].as_py()
                distinct = sorted({g for _, g in entries})
                for key in rejected:
                    self.j_rejected.inc()
                    recs = _judgment_records(jc, rows[key])
                    rec = min(recs, key=records.to_json_text)
                    dead.append({
                        "source": self.judg_source, "raw": records.to_json_text(rec),
                        "reason": f"{cleaning.REASON_JUDGMENT_CONFLICT} (query {qid!r}, item {item!r}: grades "
                                  f"{distinct}; policy reject)"})
                if grade is None:
                    keep[g] = False
                else:
                    grades[g] = float(grade)
        self.j_duplicates.inc(n_dup)
        self.j_superseded.inc(n_sup)
        self.j_accepted.inc(int(keep.sum()))
        first = first[keep]
        return _pick(jc["query_id"], first), _pick(jc["item_id"], first), grades[keep]


class _ScoreShard(ThreadedDoFn):
    def __init__(self, specs, options: MetricOptions, order: str, tie_break: str, score_precision: str, depth,
                 window_micros, slice_specs, threads: int = 1, bootstrap=None, compare=None):
        self.threads = int(threads)
        #: (baseline system, replicates, seed) of the paired comparisons, or None
        self.compare = compare
        if compare is not None:
            from ..accumulators.bootstrap import PairedComparison

            self.pc = PairedComparison(len(specs), compare[1], seed=compare[2])
        #: (replicates, seed) of the Poisson bootstrap, or None (means only)
        self.bootstrap = bootstrap
        self.specs = specs
        self.options = options
        self.order = order
        self.tie_break = tie_break
        self.score_precision = score_precision
        self.depth = depth
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.mm = MeanMoments(len(specs)) if bootstrap is None else PoissonBootstrap(len(specs), *bootstrap)
        self.scored = counter(NAMESPACE, "requests_scored")
        self.unjudged = counter(NAMESPACE, "requests_unjudged")
        self.queries = counter(NAMESPACE, "queries_scored")
        self.unscorable = counter(NAMESPACE, "impressions_unscorable")
        self.imp_ranked = counter(NAMESPACE, "impressions_ranked")
        self.imp_unjudged = counter(NAMESPACE, "impressions_unjudged")
        self.imp_unrankable = counter(NAMESPACE, "impressions_unrankable")
        self.completed = counter(NAMESPACE, "requests_completed")
        #: impressions per element of this stage (one query shard) and judgments held (the side input)
        self.element_rows = distribution(NAMESPACE, "element_impressions:score")
        self.side_rows = distribution(NAMESPACE, "element_judgments:score")

    def process(self, element, judgments, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        """``element``: (query shard, frozen request chunks); ``judgments``: the resolved judgments
        by shard (a multimap side input of :class:`_ResolveShard`'s output)."""
        # the side input is read here, on the runner's thread; the work may run on a pool thread
        yield from self._submit((element, list(judgments[_element_shard(element[0])])), window, timestamp)

    def work(self, element, judgments, systems=None, hot=None):
        """The outputs of ``element`` given its shard's resolved judgments (frozen values) and, for
        ``complete``, every system of the job (sorted). ``hot``: None, or the set of the queries fanned
        out in any request shard (:mod:`streameval.beam.columnar_hot`): their scored requests are
        counted and completed by the hot stage (tag ``hot``), not here."""
        key, rparts = element
        if not isinstance(key, int):  # a hot query's sub-element: the plain element completes its shard
            systems = None
        rparts = [v for v in rparts if v is not None]  # None: a shard's marker (complete)
        jparts = [thaw(v, keep=True) for v in judgments]  # a side input: may be read again
        if jparts:
            jc = _concat(jparts)
            jq, jd, jg = jc["query_id"], jc["item_id"], jc["grade"]
        else:
            jq, jd, jg = _strings([]), _strings([]), np.zeros(0)
        self.side_rows.update(len(jq))
        cq, cg = jq, jg  # the judged queries completed here: the hot ones are the hot stage's
        if hot and systems is not None and len(jq):
            cold = ~_among(jq, hot)
            cq, cg = _pick(jq, cold), np.asarray(jg)[cold]
        if not rparts:
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        r = _concat_requests([thaw(v) for v in rparts])
        self.element_rows.update(int(r["records"].sum()))
        nreq = r["n_requests"]
        if not nreq:
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        # queries: codes shared by requests and judgments
        rq, jqc, _ = _sorted_codes(r["query_id"], jq)
        nq = int(max(rq.max(initial=-1), jqc.max(initial=-1))) + 1
        judged_q = np.zeros(nq, dtype=bool)
        judged_q[jqc] = True
        judged = judged_q[rq]
        # unjudged requests: one output of the shard's, not one Beam element per request
        rows = np.flatnonzero(~judged)
        if len(rows):
            ids = zip(*(_pylist(r[f], rows) for f in ("query_id", "system_id", "request_id")))
            n_imps = r["records"][rows]
            self.unjudged.inc(len(rows))
            self.imp_unjudged.inc(int(n_imps.sum()))
            yield pvalue.TaggedOutput("unjudged", [
                {"query_id": qid, "system": system, "request_id": rid,
                 "window_start": window_bounds(ts, self.window_micros)[0], "impressions": n}
                for (qid, system, rid), ts, n in zip(ids, r["min_ts"][rows].tolist(), n_imps.tolist())])
        # requests that cannot be ranked
        unrankable = judged & (r["unscored"] > 0)
        rows = np.flatnonzero(unrankable)
        ids = zip(*(_pylist(r[f], rows) for f in ("query_id", "system_id", "request_id")))
        for i, (qid, system, rid) in zip(rows.tolist(), ids):
            missing = int(r["unscored"][i])
            total = int(r["records"][i])
            self.unscorable.inc(missing)
            self.imp_unrankable.inc(total)
            yield pvalue.TaggedOutput("dead_letters", {
                "source": SOURCE_UNRANKABLE,
                "raw": records.to_json_text({"query_id": qid, "system_id": system,
                                             "request_id": rid, "impressions": total,
                                             "without_score": missing}),
                "reason": f"{missing} of the request's {total} impressions have no score: "
                          "order='score' needs a finite score to rank them (use order='position')"})
        sel = np.flatnonzero(judged & ~unrankable)
        if not len(sel):
            if systems is not None:
                yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
            return
        self.scored.inc(len(sel))
        self.imp_ranked.inc(int(r["records"][sel].sum()))
        if len(sel) < nreq:
            rq_sel = rq[sel]
            r = _take_requests(r, sel)
            rq = rq_sel
        is_hot = _among(r["query_id"], hot) if hot else np.zeros(len(rq), dtype=bool)
        self.queries.inc(len(np.unique(rq[~is_hot])))  # the hot ones: counted once by the hot stage
        values = self._values(r, rq, jqc, jd, jg, nq)
        yield from self._means(r, values)  # exact sums: a hot query's requests may be split freely
        if is_hot.any():
            from .columnar_hot import hot_summaries

            for kv in hot_summaries(_take_requests(r, np.flatnonzero(is_hot))):
                yield pvalue.TaggedOutput("hot", kv)
            if is_hot.all():
                if systems is not None:
                    yield from self._complete(cq, cg, systems, _strings([]), _strings([]), None)
                return
            r, values = _take_requests(r, np.flatnonzero(~is_hot)), values[:, ~is_hot]
        if systems is not None:  # trec_eval -c: every judged query, every system
            yield from self._complete(cq, cg, systems, r["query_id"], r["system_id"], (r, values))
        elif self.compare is not None:
            yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)

    def _pairs(self, min_ts, system_id, attributes, query_id, values, all_only=None):
        """Tagged comparison states (``compare``) of scored requests (see columnar_compare)."""
        from .columnar_compare import paired_states

        for kv in paired_states(self.pc, self.compare[0], min_ts, system_id, attributes, query_id, values,
                                self.window_micros, self.slice_specs, all_only):
            yield pvalue.TaggedOutput("comparisons", kv)

    def _complete(self, jq, jg, systems, scored_query, scored_system, scored):
        """``complete``: a (judged query, system) pair of this shard without a scored request scores
        as an empty ranking (trec_eval's -c), in the global window's slice ``all``, as
        :class:`~streameval.beam.transforms.ScoreRankings` with ``complete=True``. ``jq``, ``jg``: the
        shard's resolved judgments; ``scored_*``: the query and system of each scored request;
        ``scored``: None or (the scored requests, their values), compared with the empty rankings
        (``compare``)."""
        pairs = [] if not len(jq) or not systems else None
        if pairs is None:
            yield from self._completions(jq, jg, systems, scored_query, scored_system, scored)
        elif self.compare is not None and scored is not None:
            r, values = scored
            yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)

    def _completions(self, jq, jg, systems, scored_query, scored_system, scored):
        jcode, qvals = _encode(jq)
        qnames = qvals.to_pylist()
        present = set(zip(scored_query.to_pylist(), scored_system.to_pylist()))
        pairs = [(qi, system) for qi, q in enumerate(qnames) for system in systems if (q, system) not in present]
        if not pairs:
            if self.compare is not None and scored is not None:
                r, values = scored
                yield from self._pairs(r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values)
            return
        qidx = np.fromiter((qi for qi, _ in pairs), dtype=np.int64, count=len(pairs))
        qoff, hv, hc = judgment_histogram(jcode, np.asarray(jg, dtype=np.float64), len(qnames))
        lists = RankedLists(offsets=np.zeros(len(pairs) + 1, dtype=np.int64), grades=np.zeros(0),
                            judged_offsets=qoff, judged_values=hv, judged_counts=hc, judged_index=qidx)
        values = compute(lists, self.specs, self.options)
        self.completed.inc(len(pairs))
        counted = set(scored_query.to_pylist())
        self.queries.inc(len({qnames[qi] for qi, _ in pairs} - counted))
        by_system: dict = {}
        for i, (_, system) in enumerate(pairs):
            by_system.setdefault(system, []).append(i)
        for system, idx in by_system.items():
            idx = np.asarray(idx)
            if self.bootstrap is None:
                state = self.mm.add_many(self.mm.create(), values[:, idx])
            else:
                state = self.mm.add_many(self.mm.create(), values[:, idx], keys=[qnames[i] for i in qidx[idx]])
            yield ((None, None, ALL, system), state)
        if self.compare is not None:  # the empty rankings count in the slice "all" only
            n = len(pairs)
            c_query = _strings([qnames[qi] for qi, _ in pairs])
            c_system = _strings([system for _, system in pairs])
            if scored is None:
                yield from self._pairs(np.zeros(n, np.int64), c_system, {}, c_query, values, np.ones(n, dtype=bool))
            else:
                r, rvalues = scored
                nreq = r["n_requests"]
                attrs = _concat_attributes([(r["attributes"], nreq), ({}, n)])
                yield from self._pairs(np.concatenate([r["min_ts"], np.zeros(n, np.int64)]),
                                       pa.concat_arrays([_strings(r["system_id"]), c_system]), attrs,
                                       pa.concat_arrays([_strings(r["query_id"]), c_query]),
                                       np.hstack([rvalues, values]),
                                       np.concatenate([np.zeros(nreq, dtype=bool), np.ones(n, dtype=bool)]))

    def _values(self, r, rq, jqc, jd, jg, nq) -> np.ndarray:
        """(n_metrics, n_requests) metric values of the requests of ``r`` (all judged and rankable)."""
        rr = r["row_request"]
        ic, jic, ni = _sorted_codes(r["item_id"], jd)
        ni = max(ni, 1)
        perm = rank_order(rr, r["score"], ic, r["position"], order=self.order, tie_break=self.tie_break,
                          score_precision=self.score_precision)
        rr_s = rr[perm]
        nreq = r["n_requests"]
        counts = np.bincount(rr_s, minlength=nreq)
        if self.depth is not None:
            starts = np.cumsum(counts) - counts
            rank0 = np.arange(len(rr_s)) - np.repeat(starts, counts)
            cut = rank0 < self.depth
            perm = perm[cut]
            rr_s = rr_s[cut]
            counts = np.bincount(rr_s, minlength=nreq)
        offsets = np.zeros(nreq + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        # join the grades: key (query, item), one judgment per key (resolved), by Arrow's hash table
        key = rq[rr_s] * ni + ic[perm]
        if len(jg):
            at = pc.index_in(pa.array(key), value_set=pa.array(jqc * ni + jic))
            at = np.asarray(at.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            grades = np.where(at >= 0, np.asarray(jg, dtype=np.float64)[at], np.nan)
        else:
            grades = np.full(len(key), np.nan)
        # judgment histogram per query; each request points at its query's
        qoff, hv, hc = judgment_histogram(jqc, jg.astype(np.float64), nq)
        lists = RankedLists(offsets=offsets, grades=grades.astype(np.float64), judged_offsets=qoff,
                            judged_values=hv, judged_counts=hc, judged_index=rq)
        return compute(lists, self.specs, self.options)

    def _means(self, r, values):
        return mean_states(self.mm, r["min_ts"], r["system_id"], r["attributes"], values, self.window_micros,
                           self.slice_specs, r["query_id"] if self.bootstrap else None)


def mean_states(mm, min_ts, system_id, attributes: dict, values, window_micros, slice_specs, query_id=None):
    """``((window_start, window_end, slice, system), state)`` pairs of requests' metric values:
    ``values`` shape (n_metrics, n_requests); ``min_ts`` (int64 micros), ``system_id`` (Arrow
    strings) and ``attributes`` (``{key: Arrow strings}``, the slicing ones) per request. A request
    counts in the window of ``min_ts`` and in its label of every slice specification.

    ``mm``: a :class:`MeanMoments` (states of means), or a
    :class:`~streameval.accumulators.bootstrap.PoissonBootstrap` with ``query_id`` (Arrow strings,
    per request: the bootstrap's key, as in the per-record engine; the weights of each distinct
    query are drawn once)."""
    if query_id is not None:
        qcode, qvocab = _encode(query_id)
        table = mm.rs.weights(qvocab.to_pylist())

        def add(members):
            return mm.add_many(mm.create(), values[:, members], weights=table, index=qcode[members])
    else:
        def add(members):
            return mm.add_many(mm.create(), values[:, members])

    nreq = len(min_ts)
    wcode, wkeys = _windows(min_ts, window_micros)
    scode, svals = _factorize(system_id)
    labels = _labels(attributes, nreq, slice_specs)
    # every slice specification partitions the requests, so the states of "all" are the exact
    # merges of the first specification's states (the exact sums are computed once, not twice)
    derive_all = len(labels) > 1
    merged: dict = {}
    for spec, (lcode, lvals) in enumerate(labels):
        if spec == 0 and derive_all:
            continue
        key = (wcode * len(lvals) + lcode) * len(svals) + scode
        order, starts, ends = _group_bounds(key)
        for lo, hi in zip(starts, ends):
            members = order[lo:hi]
            k = int(key[members[0]])
            si = k % len(svals)
            li = (k // len(svals)) % len(lvals)
            wi = k // len(svals) // len(lvals)
            wkey = wkeys[wi]
            state = add(members)
            if spec == 1 and derive_all:
                merged.setdefault((*wkey, ALL, svals[si]), []).append(state)
            yield ((*wkey, lvals[li], svals[si]), state)
    for key, states in merged.items():
        yield (key, mm.merge(states))


# --------------------------------------------------------------------------------------------
# stage 4: merge the partial states

class _MergeMeans(MeanCombineFn):
    """:class:`MeanCombineFn` whose inputs are MeanMoments states (already summed per shard)."""

    def add_input(self, acc, state):
        return self.merge_accumulators([acc, list(state) + [[]]])


class _CompletingScoreShard(_ScoreShard):
    """:class:`_ScoreShard` with ``complete``: the job's systems as a second side input."""

    def process(self, element, judgments, systems, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), sorted(systems)), window,
                                timestamp)


class _HotScoreShard(_ScoreShard):
    """:class:`_ScoreShard` with hot queries fanned out: the set of hot queries as a second side input."""

    def process(self, element, judgments, hot, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), None, frozenset(hot)),
                                window, timestamp)


class _HotCompletingScoreShard(_ScoreShard):
    """:class:`_CompletingScoreShard` with hot queries fanned out (side inputs: systems, hot queries)."""

    def process(self, element, judgments, systems, hot, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, list(judgments[_element_shard(element[0])]), sorted(systems),
                                 frozenset(hot)), window, timestamp)


def _element_shard(key) -> int:
    """The query shard of a score stage key: the shard, or (shard, sub) for a hot query's sub-element."""
    return key if isinstance(key, int) else key[0]


def _among(values: pa.Array, names) -> np.ndarray:
    """bool per row of an Arrow string column: is its value one of ``names`` (a set of str)."""
    found = pc.is_in(_strings(values), value_set=pa.array(sorted(names), type=pa.string()))
    return np.asarray(found.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class _MergeBootstrap(BatchedStatesMixin, BootstrapMeanCombineFn):
    """:class:`BootstrapMeanCombineFn` whose inputs are PoissonBootstrap states (summed per shard)."""

    @property
    def states_ops(self):
        return self._boot


class _MergeClicks(CtrByPositionCombineFn):
    """:class:`CtrByPositionCombineFn` whose inputs are ``{position: [impressions, clicks]}`` states."""

    def add_input(self, acc, state):
        from ..accumulators import clicks

        return clicks.ctr_pos_merge([acc, state])


class ColumnarMetrics(beam.PTransform):
    """The batch job's ranking metrics and CTR from Avro files, one element per block or shard.

    ``pbegin | ColumnarMetrics(impression_paths, judgment_paths, metrics, ...)`` -> metric rows
    (metric_result dicts), the same rows :class:`~streameval.beam.transforms.ScoreRankings` and
    :class:`~streameval.beam.transforms.ClickMetrics` give after :class:`~streameval.beam.transforms.
    ValidateImpressions` and :class:`~streameval.beam.transforms.CleanImpressions` (same options, same
    counters). After application: ``.dead_letters`` (validation, cleaning, conflicting judgments,
    unrankable requests, unreadable files) and ``.unjudged`` (requests whose query has no judgment,
    in lists: one element per shard, a list of ``{"query_id", "system", "request_id", "window_start",
    "impressions"}`` dicts, not one element per request).

    ``metrics``: ranking metric names (empty or ``judgment_paths`` empty: no ranking); ``ctr``:
    compute CTR and CTR by position. ``online``: online metric names (``auc``, ``auc_hist``,
    ``gauc[...]``, ``clicks@k``, ``rr_first_click``, ``abandonment``) with ``labels`` from clicks or
    judgments, ``unjudged``, ``hist_bins``, ``hist_range`` and ``group_rows`` as in
    :class:`~streameval.beam.online.OnlineMetrics`, whose rows they equal
    (:mod:`streameval.beam.columnar_online`). Not covered (the job uses the per-record transforms for
    them): nothing; ``complete`` as ScoreRankings' (the global window only).

    ``ci="bootstrap"`` (``replicates``, ``ci_seed``): Poisson bootstrap intervals of the ranking
    metrics, as ScoreRankings'. ``compare_baseline``: a system; after application ``.comparisons``
    holds the rows of :class:`~streameval.beam.stats.CompareSystems` with that baseline
    (:mod:`streameval.beam.columnar_compare`).

    ``in_process``: the values between stages stay in this process's memory and only their keys go
    through Beam (:func:`freeze`); only for Beam's in-process local runner (``FnApiRunner`` with no
    worker processes), where every stage runs in the process that built the pipeline. Call
    :func:`release_held` after the run. Default False: the values are pickled bytes, for any runner.

    ``threads``: elements (files, shards) each stage works on at once, on a pool of threads of the
    worker's process (:mod:`streameval.beam.threads`: most of the work is numpy, Arrow and DataFusion
    code that runs without the GIL). Default 1: the work runs in the DoFns' ``process`` itself.

    ``time_range``: ``(lo, hi)`` inclusive micros: impressions whose timestamp lies outside are dead
    letters (:func:`streameval.io.records.parse_time_range`; as ``ValidateImpressions``); those
    outside the years 1 to 9999 always are.

    ``allowed_lateness`` (with a ``window``): a request's impressions at or after the end of its
    earliest impression's window plus this lateness are late data (dead letters with source
    ``late:impression``), as in :class:`~streameval.beam.transforms.CleanImpressions` and the
    streaming job.
    """

    def __init__(self, impression_paths, judgment_paths, metrics=(), *, ctr=True, window=None, slices=(),
                 relevance_level=1, gain="linear", ideal="judgments", err_max_grade=4, order="score",
                 tie_break="docno", depth=None, score_precision="float32", judgment_conflicts="latest",
                 grade_range=None, ci_level=stats.DEFAULT_LEVEL, shards=SHARDS, progress_total=None, decoder=None, in_process=False,
                 threads=1, time_range=None, allowed_lateness=0, online=(), labels="clicks", unjudged="exclude",
                 hist_bins=1000,
                 hist_range=(0.0, 1.0), group_rows=False, ci="t", replicates=DEFAULT_REPLICATES, ci_seed=0,
                 compare_baseline=None, complete=False, hot_query_fraction=None, label=None):
        super().__init__(label)
        from .columnar_hot import HOT_FRACTION

        self.hot_fraction = HOT_FRACTION if hot_query_fraction is None else float(hot_query_fraction)
        if not 0 <= self.hot_fraction <= 1:
            raise ValueError(f"hot_query_fraction must be between 0 and 1 (0: no fan-out), got {hot_query_fraction!r}")
        if compare_baseline:
            # no fan-out with comparisons: merging the hot stage's comparison states with the score
            # stage's (a Flatten before MergeComparisons) lost states now and then on the local runner
            # with worker processes (test_columnar seed 17, 2 runs in 4, even with no hot query; not
            # understood yet), so a comparison job keeps a query's requests in one element, as before
            self.hot_fraction = 0.0
        if ci not in ("t", "bootstrap"):
            raise ValueError("ci must be 't' or 'bootstrap'")
        PoissonBootstrap(1, replicates, ci_seed)  # validates
        self.ci, self.replicates, self.ci_seed = ci, int(replicates), int(ci_seed)
        self.compare_baseline = compare_baseline
        self.comparisons = None
        self.complete = bool(complete)
        if self.complete and _window_micros(window) is not None:
            logging.getLogger(__name__).warning(
                "ColumnarMetrics: complete=True applies to the global window only; ignored with window=%r", window)
            self.complete = False
        from ..accumulators.online import HistAucOps
        from ..metrics.online import parse_online_metrics

        self.online_specs = [s for s in parse_online_metrics(list(online)) if s.family != "ctr"] if online else []
        if self.online_specs and labels == "judgments" and not judgment_paths:
            raise ValueError("labels='judgments' needs judgment files")
        self.labels = labels
        self.unjudged_policy = unjudged
        self.hist = HistAucOps(hist_range[0], hist_range[1], hist_bins)  # validates
        self.group_rows = bool(group_rows)
        self.time_range = time_range
        self.in_process = bool(in_process)
        if int(threads) < 1:
            raise ValueError("threads must be positive")
        self.threads = int(threads)
        self.impression_paths = list(impression_paths)
        self.judgment_paths = list(judgment_paths or [])
        self.specs = parse_metrics(list(metrics), arithmetic="the Beam jobs") if metrics else []
        self.ranking = bool(self.specs) and bool(self.judgment_paths)
        self.ctr = bool(ctr)
        self.window_micros = _window_micros(window)
        self.lateness_micros = parse_lateness(allowed_lateness)
        self.slice_specs = parse_slices(slices)
        self.options = MetricOptions(relevance_level=relevance_level, gain=gain, ideal=ideal,
                                     err_max_grade=err_max_grade)
        from ..metrics.prepare import check_ranking_options

        check_ranking_options(depth=depth, score_precision=score_precision, tie_break=tie_break, order=order)
        if judgment_conflicts not in cleaning.JUDGMENT_POLICIES:
            raise ValueError(f"judgment conflict policy must be one of {cleaning.JUDGMENT_POLICIES}")
        self.order, self.tie_break, self.score_precision, self.depth = order, tie_break, score_precision, depth
        self.policy = judgment_conflicts
        self.grade_range = judgment_grade_range(grade_range, self.specs, self.options)
        self.ci_level = float(ci_level)
        self.shards = int(shards)
        self.progress_total = progress_total
        self.decoder = decoder or default_decoder()
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}")
        self.dead_letters = None
        self.unjudged = None

    def expand(self, pbegin):
        from .. import progress

        read = ReadImpressionColumns(self.impression_paths, self.shards,
                                     decoder=self.decoder, hold=self.in_process, threads=self.threads,
                                     time_range=self.time_range)
        chunks = (pbegin
                  | "ReadImpressions" >> read
                  | "ProgressImpressions" >> beam.Map(progress.Ticker("impressions", self.progress_total,
                                                                      size=lambda kv: kv[1][0])))
        from . import columnar_online

        online = columnar_online.OnlineColumns(
            self.online_specs, self.window_micros, self.slice_specs, self.hist, self.shards, self.in_process,
            self.labels, self.options.relevance_level, self.unjudged_policy) if self.online_specs else None
        cleaned = (chunks
                   | "GroupRequests" >> beam.GroupByKey()
                   | "CleanRequests" >> beam.ParDo(_CleanShard(
                       "CleanImpressions", self.ranking, self.ctr, self.window_micros, self.slice_specs,
                       self.order, self.shards, self.in_process, self.threads, self.lateness_micros, online,
                       self.complete, self.hot_fraction if self.ranking else 0.0))
                   .with_outputs("dead_letters", "clicks", "systems", "hot_queries", *columnar_online.TAGS,
                                 main="requests"))
        dead = [read.dead_letters, cleaned.dead_letters]
        rows = []

        if self.ctr:
            rows.append(cleaned.clicks
                        | "MergeClicks" >> beam.CombinePerKey(_MergeClicks(overall=True))
                        | "ClickRows" >> beam.FlatMap(_click_rows, self.ci_level))
        if self.judgment_paths:  # read and checked also when no ranking metric uses them (accounting)
            jread = ReadJudgmentColumns(self.judgment_paths, self.shards, self.grade_range,
                                        decoder=self.decoder, hold=self.in_process, threads=self.threads)
            judgments = pbegin | "ReadJudgments" >> jread
            dead.append(jread.dead_letters)
            # judgments resolved per shard, then read by the scoring stage as a side input: the requests
            # cross the runner twice (one GroupByKey), not four times as through CoGroupByKey's Flatten
            resolved = (judgments
                        | "GroupJudgments" >> beam.GroupByKey()
                        | "ResolveJudgments" >> beam.ParDo(_ResolveShard(self.policy, "ResolveJudgments",
                                                                         self.in_process, self.threads))
                        .with_output_types(typing.Tuple[int, typing.Tuple[int, typing.Any]])  # a KV, for the multimap
                        .with_outputs("dead_letters", main="judgments"))
            dead.append(resolved.dead_letters)
        if online:
            rows.extend(columnar_online.online_rows(cleaned, online, self.group_rows, self.ci_level,
                                                    resolved.judgments if self.judgment_paths else None))
        if self.ranking:
            requests, extra = cleaned.requests, []
            hot = self.hot_fraction > 0  # hot queries fanned out (columnar_hot)
            if self.complete:  # every query shard is scored, also one without requests; the job's systems
                markers = pbegin | "ShardMarkers" >> beam.Create([(s, None) for s in range(self.shards)])
                requests = (requests, markers) | "RequestsAndMarkers" >> beam.Flatten()
                systems = cleaned.systems | "DistinctSystems" >> beam.Distinct()
                extra = [beam.pvalue.AsList(systems)]
            if hot:
                hot_set = cleaned.hot_queries | "DistinctHotQueries" >> beam.Distinct()
                extra.append(beam.pvalue.AsList(hot_set))
                fn_class = _HotCompletingScoreShard if self.complete else _HotScoreShard
            else:
                fn_class = _CompletingScoreShard if self.complete else _ScoreShard
            shard_fn = fn_class(
                self.specs, self.options, self.order, self.tie_break, self.score_precision, self.depth,
                self.window_micros, self.slice_specs, self.threads,
                (self.replicates, self.ci_seed) if self.ci == "bootstrap" else None,
                (self.compare_baseline, self.replicates, self.ci_seed) if self.compare_baseline else None)
            scored = (requests
                      | "GroupQueries" >> beam.GroupByKey()
                      | "ScoreShards" >> beam.ParDo(shard_fn, beam.pvalue.AsMultiMap(resolved.judgments), *extra)
                      .with_outputs("dead_letters", "unjudged", "comparisons", "hot", main="means"))
            dead.append(scored.dead_letters)
            self.unjudged = scored.unjudged
            means = scored.means
            if hot:  # per hot query: counted once, completed (columnar_hot.HotQueries)
                from .columnar_hot import HotQueries

                hot_markers = hot_set | "HotQueryMarkers" >> beam.Map(lambda q: (q, None))
                side = [beam.pvalue.AsMultiMap(resolved.judgments), beam.pvalue.AsList(systems)] \
                    if self.complete else []
                hot_out = ((scored.hot, hot_markers)
                           | "HotSummaries" >> beam.Flatten()
                           | "GroupHotQueries" >> beam.GroupByKey()
                           | "HotQueries" >> beam.ParDo(HotQueries(
                               self.specs, self.options, shard_fn.mm, self.shards, self.ci == "bootstrap",
                               self.complete), *side))
                means = (means, hot_out) | "MeansAndHot" >> beam.Flatten()
            names = [s.name for s in self.specs]
            if self.compare_baseline:
                from .columnar_compare import PairedStatesCombineFn
                from .stats import _comparison_rows

                self.comparisons = (scored.comparisons
                                    | "MergeComparisons" >> beam.CombinePerKey(PairedStatesCombineFn(
                                        len(names), self.replicates, level=self.ci_level, seed=self.ci_seed))
                                    | "ComparisonRows" >> beam.FlatMap(_comparison_rows, names))
            totals = [s.is_count for s in self.specs]
            if self.ci == "bootstrap":
                rows.append(means
                            | "MergeBootstrap" >> beam.CombinePerKey(_MergeBootstrap(
                                len(self.specs), self.replicates, self.ci_level, self.ci_seed, totals))
                            | "Rows" >> beam.FlatMap(_bootstrap_rows, names))
            else:
                rows.append(means
                            | "MergeMeans" >> beam.CombinePerKey(_MergeMeans(len(self.specs), totals))
                            | "Rows" >> beam.FlatMap(_rows, names, self.ci_level))
        self.dead_letters = tuple(dead) | "DeadLetters" >> beam.Flatten()
        if not rows:
            return pbegin | "NoRows" >> beam.Create([])
        return tuple(rows) | "AllRows" >> beam.Flatten() if len(rows) > 1 else rows[0]
