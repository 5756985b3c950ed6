"""Online metrics of an impression log in memory: :func:`evaluate_log` (no Beam).

``streameval.evaluate_log(impressions, ["ctr", "auc", "gauc[user]", "clicks@3"], by="campaign",
window="1d")`` gives the rows the batch job (``streameval batch``) writes to ``metrics.jsonl`` for
the same impressions and options, equal to the last bit: the records pass the job's record check
(:func:`streameval.io.records.check_impression`) and request rules
(:func:`streameval.io.cleaning.clean_request`), and the values come from the same kernels
(:mod:`streameval.metrics.online`, :mod:`streameval.metrics.online_auc`) and exact, mergeable states
(:mod:`streameval.accumulators.online`, :mod:`streameval.accumulators.clicks`,
:class:`~streameval.accumulators.moments.MeanMoments`) as the job's columnar engine, made into rows
by :mod:`streameval.metrics.rows`.

Layer: library API (like :mod:`streameval.api`); imports numpy and pyarrow, and the Beam-free
window and slice rules of :mod:`streameval.beam.keys`; never ``apache_beam``.
"""

from __future__ import annotations

import math
import warnings
from datetime import datetime, timezone

import numpy as np

__all__ = ["evaluate_log", "MetricsWithoutRowsError"]

_FIELDS = ("event_id", "request_id", "query_id", "user_id", "system_id", "item_id", "position", "score", "clicked",
           "timestamp", "propensity", "attributes", "dwell_ms")


class MetricsWithoutRowsError(ValueError):
    """Metrics asked for that produced no row (``names``), while others did: the batch job's
    ``metrics_without_rows`` check (exit status 3). ``rows`` holds the rows that were computed."""

    def __init__(self, message: str, names: list, rows):
        super().__init__(message)
        self.names, self.rows = list(names), rows


# --------------------------------------------------------------------------------------------
# input

def _as_table(impressions):
    import pyarrow as pa

    if isinstance(impressions, pa.Table):
        return impressions
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(impressions, pd.DataFrame):
        return pa.Table.from_pandas(impressions, preserve_index=False)
    raise TypeError(f"impressions must be a pandas DataFrame or a pyarrow Table, got {type(impressions).__name__}")


def _micros(value):
    """An event time as integer microseconds since the epoch (datetimes: UTC when naive)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if hasattr(value, "value") and hasattr(value, "tz_localize"):  # a pandas Timestamp
        return int(value.value) // 1000
    return value


def _column_list(col) -> list:
    """A column's values as Python values; a timestamp column as integer microseconds (UTC)."""
    import pyarrow as pa

    if pa.types.is_timestamp(col.type):
        unit = {"s": 1_000_000, "ms": 1000, "us": 1, "ns": None}[col.type.unit]
        ints = col.cast(pa.int64()).to_pylist()
        return [None if v is None else (v // 1000 if unit is None else v * unit) for v in ints]
    values = col.to_pylist()
    if pa.types.is_floating(col.type):  # pandas' integers with a NaN: integral floats stay integers
        return [int(v) if v is not None and v.is_integer() and abs(v) < 2 ** 53 else v for v in values]
    return values


#: fields of integer type: a float column (pandas' integers beside a NaN) gives them as integers
_INT_FIELDS = ("position", "timestamp", "dwell_ms")


def _records(table, columns: dict, attributes) -> list[dict]:
    """The impression records of ``table`` (dicts with the impression schema's fields); ``columns``
    ``{field: column}``, ``attributes`` the columns kept in the attributes map (as text). Raises
    ValueError naming a required field without a column."""
    from .io import records as rec_rules

    names = table.column_names
    source = {f: columns.get(f, f) for f in _FIELDS}
    unknown = [f for f in columns if f not in _FIELDS]
    if unknown:
        raise ValueError(f"columns: unknown field(s) {', '.join(unknown)}; the impression fields are "
                         f"{', '.join(_FIELDS)}")
    missing = [f"{f}" + (f" (column {source[f]!r})" if source[f] != f else "")
               for f in rec_rules.IMPRESSION_REQUIRED if source[f] not in names]
    if missing:
        raise ValueError(f"no column for the required impression field(s) {', '.join(missing)}; name them with "
                         f"columns={{FIELD: COLUMN}} (columns: {', '.join(names) or 'none'})")
    absent = [a for a in attributes if a not in names]
    if absent:
        raise ValueError(f"attributes: no column(s) {', '.join(absent)} (columns: {', '.join(names) or 'none'})")
    present = {f: c for f, c in source.items() if c in names}
    data = {f: (_column_list(table.column(c)) if f in _INT_FIELDS else table.column(c).to_pylist())
            for f, c in present.items()}
    extra = {a: table.column(a).to_pylist() for a in attributes}
    n = table.num_rows
    out = []
    for i in range(n):
        r = {f: v[i] for f, v in data.items()}
        r["timestamp"] = _micros(r["timestamp"])
        attrs = r.get("attributes")
        if isinstance(attrs, list):  # an Arrow map column: (key, value) pairs
            attrs = dict(attrs)
        # (a struct column, as pandas' dicts become in Arrow, has every key: None where a row lacks it)
        attrs = {k: v for k, v in attrs.items() if v is not None} if attrs else {}
        for a, v in extra.items():
            if v[i] is not None:
                attrs[a] = v[i] if isinstance(v[i], str) else str(v[i]).lower() if isinstance(v[i], bool) else str(v[i])
        r["attributes"] = attrs
        out.append(r)
    return out


def _checked(recs: list[dict], time_range) -> tuple[list[dict], list[tuple[int, str]]]:
    """(records that pass the record check, ``(row, reason)`` of the others)."""
    from .io.records import check_impression

    kept, bad = [], []
    for i, r in enumerate(recs):
        reason = check_impression(r, time_range)
        if reason is None:
            kept.append(r)
        else:
            bad.append((i, reason))
    return kept, bad


def _cleaned(recs: list[dict]) -> tuple[list[dict], int, list]:
    """The batch job's request rules (:func:`streameval.io.cleaning.clean_request`) on the requests
    that need them: (kept records, duplicates, rejected (record, reason))."""
    from .io.cleaning import clean_request

    by_request: dict = {}
    for r in recs:
        by_request.setdefault((r["system_id"], r["request_id"]), []).append(r)
    kept, dup, rejected = [], 0, []
    for group in by_request.values():
        events = {r["event_id"] for r in group}
        items = {r["item_id"] for r in group}
        queries = {r["query_id"] for r in group}
        if len(events) == len(group) and len(items) == len(group) and len(queries) == 1:
            kept.extend(group)
            continue
        k, d, rej = clean_request(group)
        kept.extend(k)
        dup += d
        rejected.extend(rej)
    return kept, dup, rejected


# --------------------------------------------------------------------------------------------
# keys: (window_start, window_end, slice, system) per impression or request, as int codes

class _Keys:
    """Codes of ``(window_start, window_end, slice, system)`` keys (one table for every metric)."""

    def __init__(self):
        self.index: dict = {}
        self.names: list = []

    def code(self, key) -> int:
        c = self.index.get(key)
        if c is None:
            c = self.index[key] = len(self.names)
            self.names.append(key)
        return c

    def per_spec(self, ts, systems, attrs, window_micros, slice_specs) -> list[np.ndarray]:
        """Per slice specification (``all`` first): the key code of each row."""
        from .beam.keys import slice_labels, window_bounds

        out = [np.empty(len(ts), dtype=np.int64) for _ in range(len(slice_specs) + 1)]
        for i, (t, s, a) in enumerate(zip(ts, systems, attrs)):
            ws, we = window_bounds(int(t), window_micros)
            for j, label in enumerate(slice_labels(a, slice_specs)):
                out[j][i] = self.code((ws, we, label, s))
        return out


def _grouped_by_code(code: np.ndarray):
    """(order, starts, ends) of the rows grouped by ``code`` (ascending, stable)."""
    order = np.argsort(code, kind="stable")
    c = code[order]
    starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1]))) if len(c) else np.zeros(0, np.int64)
    ends = np.append(starts[1:], len(c)).astype(np.int64)
    return order, starts, ends


# --------------------------------------------------------------------------------------------
# the metric families

def _ctr_rows(keys, codes, pos, clicked, level):
    from .accumulators import clicks
    from .metrics.rows import click_rows

    rows = []
    for code in codes:
        states: dict = {}
        for k, p, c in zip(code.tolist(), pos.tolist(), clicked.tolist()):
            e = states.setdefault(k, {}).setdefault(p, [0, 0])
            e[0] += 1
            e[1] += c
        for k, st in states.items():
            st = dict(sorted(st.items()))
            out = (clicks.ctr_extract(clicks.ctr_merge(st.values())), clicks.ctr_pos_extract(st))
            rows.extend(click_rows((keys.names[k], out), level))
    return rows


def _score_rows(keys, codes, score, label, gids, specs, hist, groups, weightings, level, bounded, reference=None):
    """Rows of auc, auc_hist, gauc[...] and the calibration metrics of labelled scored examples."""
    from .accumulators.online import CalibrationOps, CountArrays, GaucOps, ScoreCountMetrics, auc_result, \
        gauc_group_sums, hist_auc_result
    from .metrics import calibration as cal
    from .metrics import online as om
    from .metrics.rows import calibration_rows, gauc_rows, hist_rows, metric_row, score_count_rows

    families = {s.family for s in specs}
    rows = []
    if not len(score):
        return rows
    all_codes = np.concatenate(codes)
    all_score = np.tile(score, len(codes))
    all_label = np.tile(label, len(codes))
    counted = [s for s in specs if s.score_counts]
    if counted:  # auc among them: one exact state (counts per distinct score) for all
        scores = ScoreCountMetrics(counted, "auc" in families, reference)
        for k, state in CountArrays.by_key(all_codes, all_score, all_label):
            rows.extend(score_count_rows((keys.names[k], scores(*CountArrays.arrays(state)))))
    elif "auc" in families:
        for k, state in CountArrays.by_key(all_codes, all_score, all_label):
            rows.append(metric_row(*keys.names[k], "auc", *auc_result(*CountArrays.counts(state))))
    if "auc_hist" in families:
        bins = np.tile(om.hist_bin_index(score, hist.lo, hist.hi, hist.bins), len(codes))
        for k, state in CountArrays.by_key(all_codes, bins, all_label):
            rows.extend(hist_rows((keys.names[k], hist_auc_result(*CountArrays.counts(state)))))
    calib = [s for s in specs if s.calibration]
    if calib:
        ops = CalibrationOps(s.k for s in calib if s.family == "ece")
        prob = np.tile(cal.probability_mask(score), len(codes))
        for k, state in ops.by_key(all_codes[prob], all_score[prob], all_label[prob]):
            rows.extend(calibration_rows((keys.names[k], ops.extract(state)), calib))
    for g in groups:
        gid = gids[g]
        valid = np.array([v is not None and v != "" for v in gid], dtype=bool)
        if not valid.any():
            continue
        vocab: dict = {}
        gcode = np.array([vocab.setdefault(v, len(vocab)) if ok else -1 for v, ok in zip(gid, valid)], dtype=np.int64)
        G = max(len(vocab), 1)
        sel = np.tile(valid, len(codes))
        combined = all_codes[sel] * G + np.tile(gcode, len(codes))[sel]
        ids, auc, n_pos, n_neg = om.group_auc(combined, all_score[sel], all_label[sel])
        kid = ids // G
        ops = GaucOps(weightings[g])
        starts = np.flatnonzero(np.concatenate(([True], kid[1:] != kid[:-1])))
        ends = np.append(starts[1:], len(kid))
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            state = ops.merge([gauc_group_sums(auc[lo:hi], n_pos[lo:hi], n_neg[lo:hi], weightings[g])])
            rows.extend(gauc_rows((keys.names[int(kid[lo])], ops.extract(state)), g, weightings[g]))
    return rows


def _mean_states_rows(keys, codes, values, names, totals=None):
    """Rows of per-request values ``values`` (shape (metrics, requests)) averaged per key."""
    from .accumulators.moments import MeanMoments, MomentsState, partials_value

    mm = MeanMoments(len(names))
    rows = []
    for code in codes:
        order, starts, ends = _grouped_by_code(code)
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            members = order[lo:hi]
            state = mm.add_many(mm.create(), values[:, members])
            sums = MomentsState._make(state).sums
            res = []
            for m, (mean, n, se) in enumerate(mm.extract(state)):
                if totals and totals[m]:  # a total (MeanCombineFn's totals)
                    res.append((partials_value(sums[m]) if n else math.nan, n, None if n else math.nan))
                else:
                    res.append((mean, n, se))
            rows.append((keys.names[int(code[members[0]])], res))
    return rows


def _requests(recs):
    """Per request (system_id, request_id): the index of each record's request, and per request the
    earliest timestamp, its system, and its attributes (each key's smallest value)."""
    index: dict = {}
    req = np.empty(len(recs), dtype=np.int64)
    min_ts, systems, attrs = [], [], []
    for i, r in enumerate(recs):
        k = (r["system_id"], r["request_id"])
        j = index.get(k)
        t = int(r["timestamp"])
        if j is None:
            j = index[k] = len(min_ts)
            min_ts.append(t)
            systems.append(r["system_id"])
            attrs.append(dict(r["attributes"]))
        else:
            if t < min_ts[j]:
                min_ts[j] = t
            a = attrs[j]
            for key, v in r["attributes"].items():
                if key not in a or v < a[key]:
                    a[key] = v
        req[i] = j
    return req, np.array(min_ts, dtype=np.int64), systems, attrs


# --------------------------------------------------------------------------------------------
# the function

def evaluate_log(impressions, metrics, *, by=(), window=None, columns=None, attributes=(), slice_missing="show",
                 ci_level=0.95, ci_bounded="logit", hist_bins=1000, hist_range=(0.0, 1.0), event_time_range=None,
                 as_frame=False, reference=None):
    """Online metrics of an impression log, the batch job's rows without Beam.

    ``impressions``: a pandas DataFrame or pyarrow Table, one row per impression with the impression
    schema's fields (``schemas/impression.avsc``): ``event_id``, ``request_id``, ``query_id``,
    ``system_id``, ``item_id`` (text), ``position`` (int, 1-based), ``timestamp`` (int microseconds
    since the epoch, or datetimes, naive ones UTC) required; ``user_id``, ``score`` (float),
    ``clicked`` (bool, null: clicks not logged), ``propensity``, ``dwell_ms`` and ``attributes``
    (a column of ``{str: str}`` dicts) optional. ``columns``: ``{field: column}`` for other column
    names (as ``streameval convert table --map``); ``attributes``: columns whose values (as text) go
    into the attributes map (``convert table --attributes``). In a DataFrame a NaN is a null (a
    missing score); in an Arrow table a NaN score is refused as the job refuses it.

    ``metrics``: online metric names as the batch job's ``--metrics`` takes them
    (docs/metrics.md, "Online metrics"): ``ctr`` (with every ``ctr@pos{p}``), ``ctr@pos{p}``,
    ``auc``, ``auc_hist``, ``gauc``, ``gauc[GROUP]``, ``gauc[GROUP,WEIGHTING]``, ``clicks@k``,
    ``clicks``, ``rr_first_click``, ``rr_first_click[clicked]``, ``abandonment``, ``logloss``,
    ``brier``, ``calibration``, ``ece[bins=B]``, ``mean_dwell``, ``sat_click_rate[t=T]``,
    ``long_click_ctr[t=T]``, ``last_click_ctr[t=T]``, ``interleaving``, ``pr_auc``,
    ``precision[t=T]``, ``recall[t=T]``, ``f1[t=T]``, ``psi[score]``, ``ks[score]``; a list or comma-separated
    text. Labels are the clicks (the job's ``--labels clicks``). ``by``: slice attributes (the
    job's ``--slices``: ``"campaign"``, ``"campaign+device"``, or a list); ``slice_missing``
    ``"show"`` / ``"skip"`` (``--slice-missing``). ``window``: fixed event-time windows as the job's
    ``--window`` (``"1h"``, ``"1d"``; None: the global window). ``ci_level``, ``ci_bounded``,
    ``hist_bins``, ``hist_range``, ``event_time_range`` (``"2019..2020"``) as the job's options.
    ``reference``: the reference scores of ``psi[score]`` / ``ks[score]`` (the job's
    ``--drift-reference``): a path (a text file of one score per line, or an impression Avro file)
    or an array of scores; required by them, refused without them.

    Returns the metric rows (dicts in the ``metric_result`` shape: ``window_start``, ``window_end``
    (micros or None), ``slice``, ``system``, ``metric``, ``value``, ``num_queries`` and its unit
    ``n_unit``: ``"impressions"`` for CTR, AUC, calibration, ``"groups"`` for GAUC, ``"requests"`` for the
    click metrics per request; ``stderr``, ``ci_low``, ...) sorted by window, slice (``all`` first),
    system and metric; ``as_frame=True``: the typed table (:func:`streameval.read_metrics`'s frame:
    ``n``, ``num_impressions``, ``slice_<attr>``...). Values equal the batch job's for the same records.

    Records the job would turn into dead letters (a failed record check, a request naming several
    queries, an item served twice, an event id with different content) are left out with one
    ``UserWarning`` saying how many and the first reason; replays of an event are counted once.

    Raises :class:`~streameval.metrics.names.MetricNameError` (a ValueError) for an unknown name
    (the three closest names) and a ValueError pointing to :func:`streameval.evaluate` for a ranking
    metric; ValueError for a required field without a column, a bad window or slice; and
    :class:`MetricsWithoutRowsError` when a metric asked for has no row while others have (e.g.
    ``gauc[user]`` without user ids: the job's ``metrics_without_rows``, exit status 3; ``.rows``
    holds the rows).
    """
    from .beam.arguments import hist_range as parse_hist_range
    from .beam.arguments import parse_slice_args
    from .beam.arguments import split_metrics
    from .beam.keys import keep_slice_row, parse_slices, parse_window, window_micros as size_micros
    from .io.records import parse_time_range
    from .io.selection import names_without_rows
    from .metrics import interleaving as il
    from .metrics import online as om
    from .metrics import stats
    from .metrics.names import MetricNameError, parse_metrics
    from .metrics.online_names import match_online_metric
    from .metrics.rows import interleaving_rows, metric_row, with_interval
    from .accumulators.online import HistAucOps

    # -- options, checked before any record is read ------------------------------------------
    names = split_metrics(metrics) if isinstance(metrics, str) else [str(m) for m in metrics]
    if not names:
        raise ValueError("metrics: give at least one online metric name, e.g. ['ctr', 'auc']")
    specs = []
    for n in names:
        spec = match_online_metric(n)
        if spec is None:
            try:
                parse_metrics([n], diversity=True)
            except MetricNameError as e:
                if e.unknown:
                    from .metrics.online_names import unknown_metric_error

                    raise unknown_metric_error(n, True) from None
                raise
            raise ValueError(f"{n} is a ranking metric: it needs judgments; score rankings with "
                             f"streameval.evaluate(qrels, run, ...) (or the batch job with --judgments)")
        specs.append(spec)
    if window is not None and "/" in str(window):
        raise ValueError(f"window {window!r} is a sliding window: evaluate_log has fixed windows (e.g. 1h, 1d); "
                         f"the batch job takes sliding windows for CTR and ranking metrics only, not online metrics")
    parse_window(window, "window")  # the job's messages (a size without a unit, ...)
    window_micros = size_micros(window)
    slice_specs = parse_slices(parse_slice_args([by] if isinstance(by, str) else list(by or ())))
    if slice_missing not in ("show", "skip"):
        raise ValueError(f"slice_missing must be 'show' or 'skip', got {slice_missing!r}")
    stats.check_bounded(ci_bounded)
    level = stats.check_level(ci_level)
    lo_hi = parse_hist_range(hist_range) if isinstance(hist_range, str) else tuple(hist_range)
    hist = HistAucOps(lo_hi[0], lo_hi[1], hist_bins)
    time_range = parse_time_range(event_time_range) if event_time_range else None
    drift = [s.name for s in specs if s.drift]
    if drift and reference is None:
        raise ValueError(f"{drift[0]} needs reference= (reference scores: an array, or a path to a text file of one "
                         f"score per line or an impression Avro file; the batch job's --drift-reference)")
    if reference is not None and not drift:
        raise ValueError("reference= is the reference of psi[score] / ks[score]: name one in metrics")
    from .io.reference import drift_reference

    reference = drift_reference(reference)
    attributes = [attributes] if isinstance(attributes, str) else list(attributes or ())

    # -- records: the job's record check and request rules -------------------------------------
    recs = _records(_as_table(impressions), dict(columns or {}), attributes)
    recs, bad = _checked(recs, time_range)
    recs, _, rejected = _cleaned(recs)
    if bad or rejected:
        first = f"row {bad[0][0]}: {bad[0][1]}" if bad else rejected[0][1]
        warnings.warn(f"evaluate_log: {len(bad) + len(rejected)} impressions left out as the batch job's dead "
                      f"letters ({len(bad)} failed the record check, {len(rejected)} the request rules); "
                      f"first: {first}", UserWarning, stacklevel=2)

    n = len(recs)
    ts = np.fromiter((r["timestamp"] for r in recs), dtype=np.int64, count=n)
    systems = [r["system_id"] for r in recs]
    attrs = [r["attributes"] for r in recs]
    pos = np.fromiter((r["position"] for r in recs), dtype=np.int64, count=n)
    clicked = np.fromiter((-1 if r.get("clicked") is None else int(bool(r["clicked"])) for r in recs),
                          dtype=np.int64, count=n)
    score = np.fromiter((math.nan if r.get("score") is None else float(r["score"]) for r in recs),
                        dtype=np.float64, count=n)
    keys = _Keys()
    rows: list = []
    online_rows: list = []

    ctr_specs = [s for s in specs if s.family == "ctr"]
    if ctr_specs and n:
        logged = clicked >= 0
        if logged.any():
            idx = np.flatnonzero(logged)
            codes = keys.per_spec(ts[idx], [systems[i] for i in idx], [attrs[i] for i in idx], window_micros,
                                  slice_specs)
            every = any(s.k is None for s in ctr_specs)
            wanted = {s.name for s in ctr_specs}
            rows.extend(r for r in _ctr_rows(keys, codes, pos[idx], clicked[idx], level)
                        if every or r["metric"] in wanted)

    score_specs = [s for s in specs if s.needs_scores]
    if score_specs and n:
        ex = np.flatnonzero(~np.isnan(score) & (clicked >= 0))
        codes = keys.per_spec(ts[ex], [systems[i] for i in ex], [attrs[i] for i in ex], window_micros, slice_specs)
        groups = sorted({s.group for s in score_specs if s.family == "gauc"})
        weightings = {g: tuple(dict.fromkeys(s.weighting for s in score_specs if s.family == "gauc" and s.group == g))
                      for g in groups}
        gids = {g: [recs[i].get(om.GAUC_GROUPS[g]) for i in ex] for g in groups}
        online_rows.extend(_score_rows(keys, codes, score[ex], clicked[ex] == 1, gids, score_specs, hist, groups,
                                       weightings, level, ci_bounded, reference))

    request_specs = list({s.name: s for s in specs if s.per_request}.values())
    interleaving = any(s.family == "interleaving" for s in specs)
    if (request_specs or interleaving) and n:
        req, min_ts, req_systems, req_attrs = _requests(recs)
        nreq = len(min_ts)
        logged = np.full(nreq, False)
        logged[req[clicked >= 0]] = True
        cl = np.flatnonzero(clicked == 1)
        keep = np.flatnonzero(logged)
        codes = keys.per_spec(min_ts[keep], [req_systems[i] for i in keep], [req_attrs[i] for i in keep],
                              window_micros, slice_specs)
        if request_specs:
            dwell = None
            if any(s.dwell for s in request_specs):
                dwell = np.array([math.nan if recs[i].get("dwell_ms") is None else float(recs[i]["dwell_ms"])
                                  for i in cl], dtype=np.float64)
            terms = om.click_request_terms(request_specs, req[cl], pos[cl], nreq, dwell)
            rnames = [s.name for s in request_specs]
            for key, res in _mean_states_rows(keys, codes, terms[:, keep], rnames):
                online_rows.extend(metric_row(*key, name, *r) for name, r in zip(rnames, res))
        if interleaving:
            team = np.array([recs[i]["attributes"].get(il.TEAM_ATTRIBUTE, "") for i in cl], dtype=object)
            ca = np.bincount(req[cl[team == "A"]], minlength=nreq)
            cb = np.bincount(req[cl[team == "B"]], minlength=nreq)
            other = np.bincount(req[cl[(team != "A") & (team != "B")]], minlength=nreq) > 0
            ik = np.flatnonzero(logged & ~other)
            if len(ik):
                icodes = keys.per_spec(min_ts[ik], [req_systems[i] for i in ik], [req_attrs[i] for i in ik],
                                       window_micros, slice_specs)
                terms = il.request_terms(ca[ik], cb[ik])
                for kv in _mean_states_rows(keys, icodes, np.asarray(terms, dtype=np.float64),
                                            ["wins_a", "wins_b", "ties"], totals=[True] * 3):
                    online_rows.extend(interleaving_rows(kv, level))

    rows.extend(with_interval(r, level, ci_bounded) for r in online_rows)
    if slice_missing == "skip":
        rows = [r for r in rows if keep_slice_row(r)]
    rows = _sorted(rows, [s.name for s in specs])
    without = names_without_rows(names, rows, len(recs))
    if without:
        raise MetricsWithoutRowsError(
            f"{len(without)} of the metrics asked for produced no row (no impression had what "
            f"{'it needs' if len(without) == 1 else 'they need'}, e.g. a score and a logged click for auc, a user "
            f"id for gauc[user,...]; the batch job's metrics_without_rows): {', '.join(without)}",
            without, _frame(rows) if as_frame else rows)
    return _frame(rows) if as_frame else rows


def _sorted(rows, names):
    """Rows by window, slice (``all`` first), system, then metric (requested order, the rest by name)."""
    from .metrics.online_names import canonical_metric

    rank = {canonical_metric(n): i for i, n in enumerate(names)}

    def mkey(m):
        base = m.split(":", 1)[0]
        c = canonical_metric(m)
        return (rank.get(c, rank.get(canonical_metric(base), len(rank))), m)

    return sorted(rows, key=lambda r: (r["window_start"] is not None, r["window_start"] or 0, r["slice"] != "all",
                                       r["slice"], r["system"], mkey(r["metric"])))


def _frame(rows):
    from .io.tables import rows_frame  # (pandas)

    return rows_frame(rows)
