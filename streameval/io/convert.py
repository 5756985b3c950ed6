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
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Union

from .trec import TrecQrels, TrecRun, trec_order

__all__ = [
    "trec_run_to_impressions",
    "trec_qrels_to_judgments",
    "obd_to_impressions",
    "letor_to_records",
    "yandex_to_impressions",
    "datetime_text_to_micros",
    "user_hash",
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


# --------------------------------------------------------------------------
# TREC


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
    * ``event_id`` = ``f"{system_id}/{qid}/{docno}"``;
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
            "event_id": f"{request_id}/{docno}",
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

    The CSV is read with the ``csv`` module, row by row.
    """
    path = os.fspath(csv_path)
    if campaign is None:
        campaign = os.path.basename(os.path.dirname(os.path.abspath(path)))
    attributes = {"campaign": campaign}
    page_ids: dict[tuple[str, ...], str] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        col = {name: i for i, name in enumerate(header)}
        missing = [c for c in ("timestamp", "item_id", "position", "click", "propensity_score") if c not in col]
        feat_cols = [f"user_feature_{i}" for i in range(4)]
        missing += [c for c in feat_cols if c not in col]
        if missing:
            raise ValueError(f"{path}: not an Open Bandit Dataset CSV, missing columns {missing}")
        i_idx = 0 if header[0] == "" else None  # the unnamed pandas index column
        i_ts, i_item, i_pos, i_click, i_prop = (
            col["timestamp"], col["item_id"], col["position"], col["click"], col["propensity_score"],
        )
        i_feats = [col[c] for c in feat_cols]
        for n, row in enumerate(reader):
            if not row:
                continue
            row_index = row[i_idx] if i_idx is not None else str(n)
            ts_text = row[i_ts]
            feats = [row[i] for i in i_feats]
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
                "item_id": str(row[i_item]),
                "position": int(row[i_pos]),
                "score": None,
                "clicked": int(row[i_click]) == 1,
                "timestamp": datetime_text_to_micros(ts_text),
                "propensity": float(row[i_prop]),
                "attributes": dict(attributes),
            }


# --------------------------------------------------------------------------
# LETOR (LightGBM lambdarank example)


def _parse_label(text: str, path: str, lineno: int) -> int:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{path}:{lineno}: label is not a number: {text!r}") from None
    if not value.is_integer():
        raise ValueError(f"{path}:{lineno}: label is not an integer grade: {text!r}")
    return int(value)


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
    position order, judgments in file order.  Raises ``ValueError`` when the
    group sizes do not add up to the number of rows.
    """
    dpath = os.fspath(data_path)
    qpath = os.fspath(query_path)
    system = system_id if system_id is not None else f"feature{feature}"
    source = os.path.basename(dpath)
    with open(qpath, encoding="utf-8") as f:
        sizes = []
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                size = int(line)
            except ValueError:
                raise ValueError(f"{qpath}:{lineno}: group size is not an integer: {line!r}") from None
            if size < 0:
                raise ValueError(f"{qpath}:{lineno}: negative group size {size}")
            sizes.append(size)
    labels: list[int] = []
    scores: list[float] = []
    prefix = f"{feature}:"
    with open(dpath, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0]
            parts = line.split()
            if not parts:
                continue
            labels.append(_parse_label(parts[0], dpath, lineno))
            score = 0.0
            for tok in parts[1:]:
                if tok.startswith(prefix):
                    try:
                        score = float(tok[len(prefix):])
                    except ValueError:
                        raise ValueError(f"{dpath}:{lineno}: feature value is not a number: {tok!r}") from None
                    break
            scores.append(score)
    if sum(sizes) != len(labels):
        raise ValueError(
            f"{qpath}: group sizes add up to {sum(sizes)} but {dpath} has {len(labels)} rows"
        )
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


def _split_stream(path: str, sep: str = ";", chunk_size: int = 1 << 20) -> Iterator[str]:
    """Pieces of a text file separated by ``sep``, read in chunks."""
    with open(path, encoding="utf-8") as f:
        rest = ""
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            pieces = (rest + chunk).split(sep)
            rest = pieces.pop()
            yield from pieces
        yield rest


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

    Raises ``ValueError`` naming the session index on a malformed session.
    """
    p = os.fspath(path)
    session_index = 0
    for piece in _split_stream(p):
        piece = piece.strip()
        if not piece:
            continue
        head, tab, rest = piece.partition("\t")
        urls_text, colon, clicks_text = rest.partition(":")
        qid, underscore, region = head.strip().rpartition("_")
        urls = [u.strip() for u in urls_text.split(",")]
        if not tab or not colon or not underscore or not qid or not all(urls):
            raise ValueError(f"{p}: malformed session {session_index}: {piece[:120]!r}")
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
