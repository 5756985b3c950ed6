"""Converters from public data formats to streameval record dicts.

Each converter yields (or returns) dicts shaped like ``schemas/impression.avsc``
or ``schemas/judgment.avsc``, ready for :func:`streameval.io.avro.write_records`
and accepted by :func:`streameval.io.records.check_impression` /
:func:`~streameval.io.records.check_judgment`.  Timestamps are int
microseconds since the epoch (UTC).
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Union

from .records import AVRO_INT_MAX, AVRO_INT_MIN
from .trec import InputFormatError, TrecQrels, TrecRun, trec_order

__all__ = [
    "trec_run_to_impressions",
    "trec_qrels_to_judgments",
    "trec_runs_to_interleaved_impressions",
    "check_qrels_grades",
    "obd_to_impressions",
    "letor_to_records",
    "yandex_to_impressions",
    "datetime_text_to_micros",
    "user_hash",
    "InputFormatError",
]

PathLike = Union[str, os.PathLike]
TimestampSpec = Union[int, Callable[[str], int]]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MICRO = timedelta(microseconds=1)


def datetime_text_to_micros(text: str) -> int:
    """ISO-8601 date-time text to int microseconds since the epoch.

    Text without a UTC offset is taken as UTC.  Exact (integer arithmetic).
    """
    dt = datetime.fromisoformat(text.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH) // _ONE_MICRO


def user_hash(*parts: str) -> str:
    """Short stable id (16 hex digits, BLAKE2b-64) of a tuple of strings."""
    h = hashlib.blake2b(digest_size=8)
    h.update("\x1f".join(parts).encode("utf-8"))
    return h.hexdigest()


def _utf8_error(path: str, exc: UnicodeDecodeError) -> InputFormatError:
    """The line of the first byte of ``path`` that is not UTF-8 (found by a rescan of the bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
        return InputFormatError(path, None, f"not UTF-8 text ({exc})")
    except UnicodeDecodeError as e:
        pos = e.start
    lo = data.rfind(b"\n", 0, pos) + 1
    hi = data.find(b"\n", pos)
    line = data[lo:hi if hi >= 0 else len(data)].decode("utf-8", errors="replace")
    return InputFormatError(path, data.count(b"\n", 0, pos) + 1, f"not UTF-8 text (byte {data[pos]:#04x})", line)


# --------------------------------------------------------------------------
# TREC


def run_digest(run: TrecRun) -> str:
    """SHA-1 (hex) of a run's content: its (qid, docno, score) lines sorted, scores as their shortest
    round-trip text. The tag, the rank column and the order of the lines are not content (trec_eval
    ignores them)."""
    h = hashlib.sha1()
    for q, d, sc in sorted(zip(run.qid.tolist(), run.docno.tolist(), run.score.tolist())):
        h.update(f"{q}\t{d}\t{sc!r}\n".encode("utf-8"))
    return h.hexdigest()


def trec_run_to_impressions(
    run: TrecRun,
    system_id: str | None = None,
    timestamp_micros: TimestampSpec = 0,
) -> Iterator[dict]:
    """Impressions of a TREC run, one per run line.

    Format: TREC run ``qid Q0 docno rank score tag`` (see
    :mod:`streameval.io.trec`; trec_eval's ``get_trec_results.c``).

    Mapping:

    * ``system_id`` = the argument, default ``run.tag``;
    * ``request_id`` = ``f"{system_id}/{qid}"``, ``query_id`` = qid;
    * ``item_id`` = docno, ``score`` = score;
    * ``position`` = 1-based rank in trec_eval's order: score descending, ties
      broken by docno descending (plain string comparison); the run's rank
      column is ignored;
    * ``event_id`` = ``f"{system_id}/{qid}/{docno}@{digest}"``, ``digest`` the first 12 hex digits of
      :func:`run_digest` (the run's content): converting one run twice gives the same ids (a replay
      is a duplicate), two different runs never share one, even with the same tag and system id
      (their impressions of one request then conflict and the job says so, never blends them);
    * ``clicked`` None (a run logs no clicks), ``user_id``/``propensity`` None, ``attributes`` {};
    * ``timestamp`` = ``timestamp_micros`` if an int, else
      ``timestamp_micros(qid)`` (called once per query, e.g. for synthetic
      per-query event times).

    Records come query by query (queries in order of first appearance),
    each query in position order.
    """
    system = run.tag if system_id is None else system_id
    if not system:
        raise ValueError("system_id is empty (and the run has no tag)")
    digest = run_digest(run)[:12]
    order = trec_order(run.qid, run.docno, run.score)
    qids = run.qid[order].tolist()
    docnos = run.docno[order].tolist()
    scores = run.score[order].tolist()
    ts_cache: dict[str, int] = {}
    prev_qid = None
    position = 0
    for qid, docno, score in zip(qids, docnos, scores):
        if qid != prev_qid:
            prev_qid = qid
            position = 0
            ts = _timestamp_for(timestamp_micros, qid, ts_cache)
            request_id = f"{system}/{qid}"
        position += 1
        yield {
            "event_id": f"{request_id}/{docno}@{digest}",
            "request_id": request_id,
            "query_id": qid,
            "user_id": None,
            "system_id": system,
            "item_id": docno,
            "position": position,
            "score": score,
            "clicked": None,
            "timestamp": ts,
            "propensity": None,
            "attributes": {},
        }


def _timestamp_for(spec: TimestampSpec, qid: str, cache: dict) -> int:
    """The timestamp of query ``qid``: ``spec`` itself, or ``spec(qid)`` computed once per query."""
    if not callable(spec):
        return int(spec)
    ts = cache.get(qid)
    if ts is None:
        ts = cache[qid] = int(spec(qid))
    return ts


def check_qrels_grades(qrels: TrecQrels, path) -> None:
    """Raise :class:`~streameval.io.trec.TrecFormatError` (path, line) for the first grade that does
    not fit the judgment schema's Avro ``int``: the jobs would reject it (``streameval.io.records``),
    so the converter refuses to write it (trec_eval itself reads any integer)."""
    import numpy as np

    from .trec import TrecFormatError, _row_lines

    g = np.asarray(qrels.grade)
    bad = np.flatnonzero((g < AVRO_INT_MIN) | (g > AVRO_INT_MAX))
    if bad.size:
        r = int(bad[0])
        lineno, text = _row_lines(path, [r]).get(r, (None, None))
        raise TrecFormatError(os.fspath(path), lineno, f"grade {int(g[r])} does not fit an Avro int", text)


def trec_qrels_to_judgments(
    qrels: TrecQrels,
    source: str = "qrels",
    timestamp_micros: TimestampSpec = 0,
) -> Iterator[dict]:
    """Judgments of a TREC qrels file, one per qrels line, in file order.

    Format: TREC qrels ``qid iter docno grade`` (trec_eval's ``get_qrels.c``).
    Mapping: ``query_id`` = qid, ``item_id`` = docno, ``grade`` = grade
    (negative = pooled but unjudged, kept as is), ``source`` = the argument,
    ``timestamp`` = ``timestamp_micros`` (an int, or a callable qid -> int).
    """
    ts_cache: dict[str, int] = {}
    for qid, docno, grade in zip(qrels.qid.tolist(), qrels.docno.tolist(), qrels.grade.tolist()):
        ts = _timestamp_for(timestamp_micros, qid, ts_cache)
        yield {"query_id": qid, "item_id": docno, "grade": int(grade), "timestamp": ts, "source": source}


def _rankings(run: TrecRun) -> dict[str, list[str]]:
    """qid -> the run's docnos in trec_eval's order."""
    order = trec_order(run.qid, run.docno, run.score)
    out: dict[str, list[str]] = {}
    for qid, docno in zip(run.qid[order].tolist(), run.docno[order].tolist()):
        out.setdefault(qid, []).append(docno)
    return out


#: bounds of ``trec_runs_to_interleaved_impressions``' list length and requests per query
MAX_INTERLEAVE_DEPTH, MAX_INTERLEAVE_SESSIONS = 100_000, 100_000


def trec_runs_to_interleaved_impressions(
    run_a: TrecRun,
    run_b: TrecRun,
    qrels: TrecQrels,
    method: str = "team_draft",
    seed: int = 0,
    click_model: str = "cascade",
    depth: int = 10,
    sessions: int = 1,
    system_id: str | None = None,
    timestamp_micros: int = 0,
) -> Iterator[dict]:
    """A simulated interleaved impression log of two TREC runs, clicks from the qrels.

    For every query of either run (sorted) and each of ``sessions`` sessions, the runs' rankings
    (trec_eval's order) are interleaved (:func:`streameval.metrics.interleaving.interleave`,
    ``method`` team_draft or balanced, cut at ``depth`` items) and a user clicks by the cascade
    model (:func:`streameval.metrics.interleaving.cascade_clicks`, grades from ``qrels``, the
    largest grade as the top; unjudged: not relevant). One ``random.Random(seed)`` draws every coin
    and click, so a seed gives the same log.

    Mapping: ``system_id`` = the argument, default ``f"{tag_a}-vs-{tag_b}"`` (the experiment);
    ``request_id`` = ``f"{system_id}/{qid}/{session}"``, ``query_id`` = qid, ``item_id`` = docno,
    ``position`` = 1-based place in the interleaved list, ``clicked`` the simulated click,
    ``attributes`` = ``{"team": "A" or "B"}`` (the ranker that contributed the item: run A or run B),
    ``event_id`` = ``f"{request_id}/{docno}"``, ``score``/``user_id``/``propensity`` None,
    ``timestamp`` = ``timestamp_micros``."""
    import random

    from ..metrics import interleaving as il

    if click_model != "cascade":
        raise ValueError(f"click model must be cascade, got {click_model!r}")
    if method not in il.METHODS:
        raise ValueError(f"method must be one of {il.METHODS}, got {method!r}")
    if not 1 <= int(depth) <= MAX_INTERLEAVE_DEPTH or not 1 <= int(sessions) <= MAX_INTERLEAVE_SESSIONS:
        raise ValueError(f"depth must be from 1 to {MAX_INTERLEAVE_DEPTH} and sessions from 1 to "
                         f"{MAX_INTERLEAVE_SESSIONS}, got {depth} and {sessions}")
    system = system_id or f"{run_a.tag or 'A'}-vs-{run_b.tag or 'B'}"
    ra, rb = _rankings(run_a), _rankings(run_b)
    grades: dict[tuple[str, str], int] = {}
    for q, d, g in zip(qrels.qid.tolist(), qrels.docno.tolist(), qrels.grade.tolist()):
        grades[(q, d)] = int(g)
    top = max([g for g in grades.values()] + [1])
    rnd = random.Random(seed)
    for qid in sorted(set(ra) | set(rb)):
        for s in range(int(sessions)):
            items, teams = il.interleave(ra.get(qid, []), rb.get(qid, []), method, rnd, length=int(depth))
            clicks = il.cascade_clicks([grades.get((qid, d), 0) for d in items], rnd, max_grade=top)
            request_id = f"{system}/{qid}/{s}"
            for pos, (docno, team, c) in enumerate(zip(items, teams, clicks), 1):
                yield {"event_id": f"{request_id}/{docno}", "request_id": request_id, "query_id": qid,
                       "user_id": None, "system_id": system, "item_id": docno, "position": pos, "score": None,
                       "clicked": bool(c), "timestamp": int(timestamp_micros), "propensity": None,
                       "attributes": {"team": team}}


# --------------------------------------------------------------------------
# Open Bandit Dataset


def obd_to_impressions(
    csv_path: PathLike,
    system_id: str,
    campaign: str | None = None,
    *,
    group_same_page: bool = False,
) -> Iterator[dict]:
    """Impressions of an Open Bandit Dataset CSV, one per row.

    Format: the Open Bandit Dataset (Saito et al., NeurIPS 2021 Datasets and
    Benchmarks; ``obp`` package, ``obp/dataset/obd/{bts,random}/{all,men,
    women}/<campaign>.csv``).  Columns: unnamed row index, ``timestamp``
    (``2019-11-24 00:00:34.762830+00:00``), ``item_id``, ``position`` (1-3),
    ``click`` (0/1), ``propensity_score``, ``user_feature_0..3`` (hashed),
    ``user-item_affinity_*`` (ignored here).

    Mapping:

    * ``system_id`` = the argument (the logging policy, e.g. ``"random"`` or
      ``"bts"``); ``campaign`` defaults to the CSV's folder name
      (``all``/``men``/``women``);
    * ``event_id`` = ``f"{system_id}/{campaign}/{row_index}"`` (row index =
      the CSV's first column);
    * ``request_id`` = the event_id (one request per row, see below);
    * ``query_id`` = the campaign (OBD has no queries);
    * ``user_id`` = :func:`user_hash` of the four ``user_feature_*`` values;
    * ``item_id`` = str(item_id), ``position`` = position, ``clicked`` =
      click == 1, ``propensity`` = propensity_score, ``score`` None;
    * ``timestamp`` = the timestamp as int microseconds UTC;
    * ``attributes`` = ``{"campaign": campaign}``.

    Request grouping (finding from the six sample CSVs of obp 0.4.1): rows do
    **not** group into page views.  Each CSV has 10,000 rows with 9,989 to
    9,999 distinct timestamps (microsecond resolution); a timestamp is never
    shared by more than 2 rows (1 to 11 such pairs per file, always with the
    same user features and two different positions), no page ever has all
    three positions 1-3, and positions are spread evenly (about 3,300 rows
    each).  The sample is a subsample of individual impressions, so each row
    is its own request (``request_id`` = ``event_id``), which is also how
    ``obp`` treats the data (one round per row).  ``group_same_page=True``
    instead gives rows with the same timestamp and user features one
    request id (``f"{system_id}/{campaign}/page{first_row_index}"``); it
    merges only those few pairs.

    The CSV is read with the ``csv`` module, row by row.  A malformed row (too
    few columns, a position that is not a 1-based integer, a click other than
    0/1, a propensity outside (0, 1], a bad timestamp) or an empty file raises
    :class:`~streameval.io.trec.InputFormatError` with the line.
    """
    path = os.fspath(csv_path)
    if campaign is None:
        campaign = os.path.basename(os.path.dirname(os.path.abspath(path)))
    try:
        yield from _obd_rows(path, system_id, campaign, group_same_page)
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e) from None


_OBD_COLUMNS = ("timestamp", "item_id", "position", "click", "propensity_score")


def _obd_rows(path: str, system_id: str, campaign: str, group_same_page: bool) -> Iterator[dict]:
    attributes = {"campaign": campaign}
    page_ids: dict[tuple[str, ...], str] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)

        def bad(reason: str, row: list[str] | None) -> InputFormatError:
            return InputFormatError(path, reader.line_num, reason, None if row is None else ",".join(row))

        try:
            header = next(reader, None)
        except csv.Error as e:
            raise bad(f"unreadable CSV ({e})", None) from None
        if header is None:
            raise InputFormatError(path, None, "empty file: no header line (not an Open Bandit Dataset CSV)")
        col = {name: i for i, name in enumerate(header)}
        missing = [c for c in _OBD_COLUMNS if c not in col]
        feat_cols = [f"user_feature_{i}" for i in range(4)]
        missing += [c for c in feat_cols if c not in col]
        if missing:
            raise bad(f"not an Open Bandit Dataset CSV, missing columns {missing}", header)
        i_idx = 0 if header[0] == "" else None  # the unnamed pandas index column
        i_ts, i_item, i_pos, i_click, i_prop = (col[c] for c in _OBD_COLUMNS)
        i_feats = [col[c] for c in feat_cols]
        width = max(i_ts, i_item, i_pos, i_click, i_prop, *i_feats) + 1
        n = -1
        while True:
            try:
                row = next(reader, None)
            except csv.Error as e:
                raise bad(f"unreadable CSV ({e})", None) from None
            if row is None:
                break
            n += 1
            if not row:
                continue
            if len(row) < width:
                raise bad(f"expected {len(header)} columns, got {len(row)}", row)
            row_index = row[i_idx] if i_idx is not None else str(n)
            ts_text = row[i_ts]
            feats = [row[i] for i in i_feats]
            item = row[i_item]
            if not item:
                raise bad("empty item_id", row)
            try:
                position = int(row[i_pos])
            except ValueError:
                raise bad(f"position is not an integer: {row[i_pos]!r}", row) from None
            if not 1 <= position <= AVRO_INT_MAX:
                raise bad(f"position must be a 1-based rank, got {position}", row)
            click = row[i_click].strip()
            if click not in ("0", "1"):
                raise bad(f"click must be 0 or 1, got {row[i_click]!r}", row)
            try:
                propensity = float(row[i_prop])
            except ValueError:
                raise bad(f"propensity_score is not a number: {row[i_prop]!r}", row) from None
            if not 0.0 < propensity <= 1.0:  # also NaN
                raise bad(f"propensity_score must be in (0, 1], got {row[i_prop]!r}", row)
            try:
                timestamp = datetime_text_to_micros(ts_text)
            except (ValueError, OverflowError):
                raise bad(f"timestamp is not an ISO date-time: {ts_text!r}", row) from None
            event_id = f"{system_id}/{campaign}/{row_index}"
            if group_same_page:
                key = (ts_text, *feats)
                request_id = page_ids.get(key)
                if request_id is None:
                    request_id = page_ids[key] = f"{system_id}/{campaign}/page{row_index}"
            else:
                request_id = event_id
            yield {
                "event_id": event_id,
                "request_id": request_id,
                "query_id": campaign,
                "user_id": user_hash(*feats),
                "system_id": system_id,
                "item_id": item,
                "position": position,
                "score": None,
                "clicked": click == "1",
                "timestamp": timestamp,
                "propensity": propensity,
                "attributes": dict(attributes),
            }


# --------------------------------------------------------------------------
# LETOR (LightGBM lambdarank example)


def _parse_label(text: str, path: str, lineno: int, line: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise InputFormatError(path, lineno, f"label is not a number: {text!r}", line) from None
    if not value.is_integer():
        raise InputFormatError(path, lineno, f"label is not an integer grade: {text!r}", line)
    if not AVRO_INT_MIN <= value <= AVRO_INT_MAX:
        raise InputFormatError(path, lineno, f"label {text!r} does not fit an Avro int", line)
    return int(value)


def _letor_group_sizes(qpath: str) -> tuple[list[int], list[tuple[int, str]]]:
    sizes: list[int] = []
    where: list[tuple[int, str]] = []
    with open(qpath, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                size = int(line)
            except ValueError:
                raise InputFormatError(qpath, lineno, f"group size is not an integer: {line!r}", raw) from None
            if size < 0:
                raise InputFormatError(qpath, lineno, f"negative group size {size}", raw)
            sizes.append(size)
            where.append((lineno, raw))
    return sizes, where


def _letor_rows(dpath: str, feature: int) -> tuple[list[int], list[float], list[int]]:
    """Labels, scores (feature ``feature``, 0.0 when absent) and line numbers of the data rows."""
    labels: list[int] = []
    scores: list[float] = []
    linenos: list[int] = []
    prefix = f"{feature}:"
    with open(dpath, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            parts = raw.split("#", 1)[0].split()
            if not parts:
                continue
            labels.append(_parse_label(parts[0], dpath, lineno, raw))
            score = 0.0
            for tok in parts[1:]:
                if tok.startswith(prefix):
                    try:
                        score = float(tok[len(prefix):])
                    except ValueError:
                        raise InputFormatError(dpath, lineno, f"feature value is not a number: {tok!r}", raw) from None
                    if not math.isfinite(score):
                        raise InputFormatError(dpath, lineno, f"feature value is not finite: {tok!r}", raw)
                    break
            scores.append(score)
            linenos.append(lineno)
    return labels, scores, linenos


def letor_to_records(
    data_path: PathLike,
    query_path: PathLike,
    feature: int = 1,
    system_id: str | None = None,
) -> tuple[list[dict], list[dict]]:
    """Impressions and judgments from a libsvm learning-to-rank file.

    Format: LightGBM's lambdarank example (``examples/lambdarank/rank.train``,
    ``rank.test``): libsvm lines ``label idx:value idx:value ...`` (missing
    features are 0; ``qid:`` tokens and ``#`` comments are ignored), and a
    ``.query`` file listing the group sizes in order (the first N rows are
    query 1, the next M rows query 2, ...).

    One feature column plays the ranker (a "system"):

    * ``query_id`` = ``f"q{group_index + 1}"``, ``item_id`` =
      ``f"d{row_index_within_group + 1}"``;
    * ``system_id`` = the argument, default ``f"feature{feature}"``;
    * ``score`` = value of feature ``feature`` (0.0 when absent);
    * ``position`` = rank by score descending, ties by item_id descending
      (plain string comparison, as trec_eval);
    * ``request_id`` = ``f"{system_id}/{query_id}"``, ``event_id`` =
      ``f"{request_id}/{item_id}"``; ``clicked`` None (no clicks logged), ``timestamp`` 0 (the
      data has no times), other optional fields empty;
    * judgments: ``grade`` = label, ``timestamp`` 0, ``source`` = the data
      file's name.

    Returns ``(impressions, judgments)``; impressions grouped by query in
    position order, judgments in file order.  Raises
    :class:`~streameval.io.trec.InputFormatError` (a ``ValueError``) with the
    file and line for a malformed line (label not an integer, feature value
    not a finite number, group size not a non-negative integer), an empty
    data file, or group sizes that do not add up to the number of rows (the
    group that runs past the data, or the first row in no group).
    """
    dpath = os.fspath(data_path)
    qpath = os.fspath(query_path)
    system = system_id if system_id is not None else f"feature{feature}"
    source = os.path.basename(dpath)
    try:
        sizes, size_lines = _letor_group_sizes(qpath)
    except UnicodeDecodeError as e:
        raise _utf8_error(qpath, e) from None
    try:
        labels, scores, row_lines = _letor_rows(dpath, feature)
    except UnicodeDecodeError as e:
        raise _utf8_error(dpath, e) from None
    if not labels:
        raise InputFormatError(dpath, None, "empty file (no data lines)")
    total = sum(sizes)
    if total != len(labels):
        if total > len(labels):  # the group whose size runs past the data
            acc = 0
            for size, (lineno, text) in zip(sizes, size_lines):
                acc += size
                if acc > len(labels):
                    raise InputFormatError(
                        qpath, lineno, f"group sizes add up to {total} but {dpath} has {len(labels)} rows "
                                       f"(this group ends at row {acc})", text)
        raise InputFormatError(
            dpath, row_lines[total], f"row {total + 1} is in no group: the group sizes of {qpath} add up to "
                                     f"{total} but there are {len(labels)} rows")
    impressions: list[dict] = []
    judgments: list[dict] = []
    row = 0
    for g, size in enumerate(sizes):
        query_id = f"q{g + 1}"
        request_id = f"{system}/{query_id}"
        items = []
        for i in range(size):
            item_id = f"d{i + 1}"
            items.append((scores[row + i], item_id))
            judgments.append(
                {"query_id": query_id, "item_id": item_id, "grade": labels[row + i], "timestamp": 0, "source": source}
            )
        items.sort(reverse=True)  # score descending, ties by item_id descending
        for position, (score, item_id) in enumerate(items, 1):
            impressions.append(
                {
                    "event_id": f"{request_id}/{item_id}",
                    "request_id": request_id,
                    "query_id": query_id,
                    "user_id": None,
                    "system_id": system,
                    "item_id": item_id,
                    "position": position,
                    "score": score,
                    "clicked": None,
                    "timestamp": 0,
                    "propensity": None,
                    "attributes": {},
                }
            )
        row += size
    return impressions, judgments


# --------------------------------------------------------------------------
# Yandex WSCD 2011 click log sample


def _split_stream(path: str, sep: str = ";", chunk_size: int = 1 << 20) -> Iterator[tuple[str, int]]:
    """Pieces of a text file separated by ``sep``, read in chunks, with the line each piece starts on."""
    with open(path, encoding="utf-8") as f:
        rest = ""
        line = 1
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            pieces = (rest + chunk).split(sep)
            rest = pieces.pop()
            for piece in pieces:
                yield piece, line
                line += piece.count("\n")
        yield rest, line


def yandex_to_impressions(path: PathLike, system_id: str = "yandex") -> Iterator[dict]:
    """Impressions of the Yandex relevance-prediction click log sample.

    Format: WSCD 2011 "Relevance Prediction Challenge" log as shipped with
    PyClick (``examples/data/trainSample``, ``testSample``): sessions
    separated by ``;`` (lines group sessions of one query), each session
    ``<qid>_<region>\\t<10 comma-separated url ids in rank order> : <clicked
    url ids in click order, comma-separated>``.

    Mapping, per session (one result page):

    * one request: ``request_id`` = ``f"{system_id}/{qid}/{session_index}"``
      (``session_index`` counts sessions from 0 in file order, so ids are
      unique within a file);
    * 10 impressions at positions 1..10: ``item_id`` = url id,
      ``event_id`` = ``f"{request_id}/{position}"``;
    * ``clicked`` = the url is in the session's click list (repeated clicks
      on one url count once; clicks on urls not among the 10 shown, 417 in
      trainSample, are dropped);
    * ``query_id`` = the qid part, ``attributes`` = ``{"region": region}``;
    * ``timestamp`` = 0: the sample has no times (only the click order), so
      event-time windows are meaningless for it;
    * ``user_id``, ``score``, ``propensity`` None.

    A malformed session raises :class:`~streameval.io.trec.InputFormatError`
    with the file, the line it starts on and its index; so does an empty file.
    """
    p = os.fspath(path)
    try:
        yield from _yandex_sessions(p, system_id)
    except UnicodeDecodeError as e:
        raise _utf8_error(p, e) from None


def _yandex_sessions(p: str, system_id: str) -> Iterator[dict]:
    session_index = 0
    for raw, line in _split_stream(p):
        piece = raw.strip()
        if not piece:
            continue
        lead = raw[: len(raw) - len(raw.lstrip())]
        lineno = line + lead.count("\n")
        head, tab, rest = piece.partition("\t")
        urls_text, colon, clicks_text = rest.partition(":")
        qid, underscore, region = head.strip().rpartition("_")
        urls = [u.strip() for u in urls_text.split(",")]
        if not tab or not colon or not underscore or not qid or not all(urls) or "\t" in rest or "\n" in piece:
            raise InputFormatError(
                p, lineno, f"malformed session {session_index} (expected '<qid>_<region><TAB><url>,... : <click>,...')",
                piece)
        clicked = {c.strip() for c in clicks_text.split(",") if c.strip()}
        request_id = f"{system_id}/{qid}/{session_index}"
        for position, url in enumerate(urls, 1):
            yield {
                "event_id": f"{request_id}/{position}",
                "request_id": request_id,
                "query_id": qid,
                "user_id": None,
                "system_id": system_id,
                "item_id": url,
                "position": position,
                "score": None,
                "clicked": url in clicked,
                "timestamp": 0,
                "propensity": None,
                "attributes": {"region": region},
            }
        session_index += 1
    if session_index == 0:
        raise InputFormatError(p, None, "empty file (no sessions)")
