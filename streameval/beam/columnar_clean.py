"""Stage 2 of the columnar engine (:mod:`streameval.beam.columnar`): per request shard, the requests
cleaned, the clicks counted, the requests re-sharded by query; with the slice and window labels
of the later stages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue

from ..io import cleaning
from ..io import counters as cn
from .columnar_columns import (_concat, _concat_attributes, _encode, _factorize, _group_bounds, _in_value_order, _obj,
                               _pair_codes, _part, _pick, _repeats, _several, _shards_of, _take, _unique_codes,
                               columns_records, freeze, impression_columns, thaw)
from .keys import window_start
from .threads import ThreadedDoFn, counter, distribution
from .transforms import ALL, NAMESPACE, _category, slice_part
from ..io.dead_letters import dead_letter


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
    epoch-aligned windows holding ``ts`` (:func:`~streameval.beam.keys.window_start`, the per-record
    engine's rule); one ``(None, None)`` global window when ``window_micros`` is None."""
    if window_micros is None:
        return np.zeros(len(ts), np.int64), [(None, None)]
    starts, codes = np.unique(window_start(ts, window_micros), return_inverse=True)
    return codes.reshape(len(ts)).astype(np.int64), [(w, w + window_micros) for w in starts.tolist()]


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
    """Per run [start, end) of a string column (null = absent; the runs follow each other, each
    ending where the next starts): the smallest non-null value (code-point order, as Python compares
    str), its first row when it repeats; a run of nulls only gives null."""
    n = len(values)
    if n == 0 or not len(starts):
        return values.slice(0, 0)
    codes, vocab = _encode(values)
    same = np.ones(n, dtype=bool)
    same[1:] = codes[1:] == codes[:-1]
    same[starts] = True
    pick = starts.copy()
    mixed = np.flatnonzero(np.add.reduceat(~same, starts) > 0)
    if len(mixed):
        ranked, _ = _in_value_order(codes, vocab)  # null last
        least = np.minimum.reduceat(ranked, starts)
        hits = np.flatnonzero(ranked == np.repeat(least, ends - starts))
        pick[mixed] = hits[np.searchsorted(hits, starts[mixed])]
    return _pick(values, pick)


class _CleanShard(ThreadedDoFn):
    def __init__(self, source: str, ranking: bool, ctr: bool, window_micros, slice_specs, order: str, shards: int,
                 hold: bool = False, threads: int = 1, lateness_micros: int | None = None, online=None, systems: bool = False,
                 hot_fraction: float = 0.0, hot_min: int | None = None, units: bool = False, cluster: str = "none",
                 covariate: str | None = None, covariate_values: dict | None = None):
        #: hot queries' fan-out (columnar_hot.fan_out): their share of the shard's requests above which
        #: they are split over sub-elements (0: never), and the fewest requests that make one hot
        self.hot_fraction = float(hot_fraction)
        self.hot_min = hot_min
        self.online = online  # a columnar_online.OnlineColumns, or None
        self.units = units  # requests per (window, slice, system), tag "units" (srm rows)
        self.cluster = cluster  # "request" / "user": clicks per (window, slice, system, cluster), tag "cluster_clicks"
        #: --covariate attr:NAME (with cluster): each cluster's clicks and covariate, tag "cuped_units"
        self.covariate = covariate
        self.covariate_values = covariate_values  # --covariate-log: {cluster id: pre-period clicks}
        self.systems = systems  # emit each chunk's systems (tag "systems"): complete=True needs them all
        #: late data from the end of a request's first window plus this (None: no limit, nothing late)
        self.lateness_micros = None if lateness_micros is None else int(lateness_micros)
        self.late = counter(NAMESPACE, cn.LATE_IMPRESSION)
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
        self.accepted = counter(NAMESPACE, cn.IMPRESSIONS_ACCEPTED)
        self.duplicates = counter(NAMESPACE, cn.DUPLICATE_IMPRESSION)
        self.counted = counter(NAMESPACE, cn.CLICK_IMPRESSIONS)
        self.no_clicks = counter(NAMESPACE, cn.CLICK_IMPRESSIONS_NOT_LOGGED)
        #: impressions per element of this stage (one request shard): bounded by --shards
        self.element_rows = distribution(NAMESPACE, cn.ELEMENT_IMPRESSIONS_CLEAN)
        #: the fan-out F of each hot query of each request shard (no value: no query was hot)
        self.fan_out = distribution(NAMESPACE, cn.HOT_QUERY_FANOUT)

    def work(self, element):
        _, chunks = element
        chunk = _concat([thaw(c) for c in chunks])
        self.element_rows.update(chunk["n"])
        if not chunk["n"]:
            return
        req, first = _pair_codes(chunk["system_id"], chunk["request_id"])
        if self.window_micros is not None and self.lateness_micros is not None:  # late data first, the request rules on the rest (cleaning)
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
                    counter(NAMESPACE, cn.rejected("impression", _category(reason))).inc()
                    yield pvalue.TaggedOutput("dead_letters", dead_letter(self.source, rec, reason))
            chunk = _concat([clean_part, impression_columns(kept)]) if kept else clean_part
        self.duplicates.inc(n_dup)
        self.accepted.inc(chunk["n"])
        if not chunk["n"]:
            return
        if self.ctr:
            yield from self._clicks(chunk)
        if self.units:
            yield from self._units(chunk)
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
        letters = [pvalue.TaggedOutput("dead_letters", dead_letter(
            cn.LATE_IMPRESSION, rec, cleaning.after_close_reason(int(ts[i]), int(close[req[i]]))))
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
        if self.cluster != "none":
            yield from self._cluster_clicks(c, wcode, wkeys, scode, svals, clicked)
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

    def _cluster_clicks(self, c, wcode, wkeys, scode, svals, clicked):
        """``((ws, we, slice, system, cluster id), (impressions, clicks))`` (tag ``"cluster_clicks"``)
        per cluster of :func:`streameval.beam.clusters.cluster_id` (a request; a user, or the request
        when the impression has no user)."""
        by_request = pc.binary_join_element_wise("request:", c["request_id"], "")
        if self.cluster == "user":
            ids = pc.if_else(pc.is_null(c["user_id"]), by_request, pc.binary_join_element_wise("user:", c["user_id"], ""))
        else:
            ids = by_request
        ccode, cvals = _factorize(ids)
        nc = len(cvals)
        x = None
        if self.covariate is not None:
            from .cuped import covariate_column

            if self.covariate_values is not None:
                vals = self.covariate_values
                x = np.array([vals.get(v, np.nan) for v in cvals], dtype=np.float64)[ccode] if nc else np.zeros(0)
            else:
                x = covariate_column(c["attributes"].get(self.covariate), c["n"])
        for lcode, lvals in _labels(c["attributes"], c["n"], self.slice_specs):
            key = ((wcode * len(lvals) + lcode) * len(svals) + scode) * nc + ccode
            uk, inv = _unique_codes(key)
            imps = np.bincount(inv).tolist()
            clicks = np.bincount(inv, weights=clicked).astype(np.int64).tolist()
            cl = (uk % nc).tolist()
            rest = uk // nc
            s = (rest % len(svals)).tolist()
            rest //= len(svals)
            lab = (rest % len(lvals)).tolist()
            w = (rest // len(lvals)).tolist()
            for wi, li, si, ci, n, y in zip(w, lab, s, cl, imps, clicks):
                yield pvalue.TaggedOutput("cluster_clicks", ((*wkeys[wi], lvals[li], svals[si], cvals[ci]), (n, y)))
            if self.covariate is not None:
                yield from self._cuped_units(c, x, uk, inv, w, lab, s, cl, imps, clicks, wkeys, lvals, svals, cvals)

    @staticmethod
    def _cuped_units(c, x, uk, inv, w, lab, s, cl, imps, clicks, wkeys, lvals, svals, cvals):
        """``((ws, we, slice, system, cluster id), (impressions, clicks, smallest covariate or None))``
        (tag ``"cuped_units"``; :mod:`streameval.beam.cuped`)."""
        xmin = np.full(len(uk), np.inf)
        np.minimum.at(xmin, inv, np.where(np.isnan(x), np.inf, x))
        xs = [None if v == np.inf else v for v in xmin.tolist()]
        for wi, li, si, ci, n, y, xv in zip(w, lab, s, cl, imps, clicks, xs):
            yield pvalue.TaggedOutput("cuped_units", ((*wkeys[wi], lvals[li], svals[si], cvals[ci]), (n, y, xv)))

    def _units(self, chunk):
        """``((window_start, window_end, slice, system), requests)`` (tag ``"units"``): each request
        once, in the window of its earliest impression and the slices of its attributes (the
        smallest value of each, as :meth:`_requests` gives them)."""
        req, _ = _pair_codes(chunk["system_id"], chunk["request_id"])
        rows, _, starts, ends = _grouped(chunk, req, ("timestamp", "attributes", "system_id"))
        nreq = len(starts)
        min_ts = np.minimum.reduceat(rows["timestamp"], starts)
        attrs = {a: _first_min(rows["attributes"][a], starts, ends) for a in self.attr_keys if a in rows["attributes"]}
        wcode, wkeys = _windows(min_ts, self.window_micros)
        scode, svals = _factorize(_pick(rows["system_id"], starts))
        for lcode, lvals in _labels(attrs, nreq, self.slice_specs):
            key = (wcode * len(lvals) + lcode) * len(svals) + scode
            uk, inv = _unique_codes(key)
            counts = np.bincount(inv).tolist()
            s = (uk % len(svals)).tolist()
            rest = uk // len(svals)
            lab = (rest % len(lvals)).tolist()
            w = (rest // len(lvals)).tolist()
            for wi, li, si, n in zip(w, lab, s, counts):
                yield pvalue.TaggedOutput("units", ((*wkeys[wi], lvals[li], svals[si]), n))

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


def _range_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + l)`` for each (start, length)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)
