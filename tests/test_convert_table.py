"""``streameval convert table``: JSON lines, CSV and Parquet logs with their own column names.

The expected records are built here from the input file read independently (the csv and json
modules; pyarrow.parquet for Parquet, the only reader of that format at hand), with the mapping
applied by hand; the timestamps by datetime arithmetic.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streameval.jobs import batch
from streameval import cli
from streameval.io import avro, records

from .conftest import REPO

MAPPING = "event_id=eid,request_id=rid,query_id=qid,system_id=ranker,item_id=doc,position=rank,timestamp=ts," \
          "clicked=click,score=s"
#: column -> field of MAPPING
FIELD_OF = {"eid": "event_id", "rid": "request_id", "qid": "query_id", "ranker": "system_id", "doc": "item_id",
            "rank": "position", "ts": "timestamp", "click": "clicked", "s": "score"}
COLUMNS = ["eid", "rid", "qid", "ranker", "doc", "rank", "ts", "click", "s", "region", "junk"]

# two systems, two queries; item ids that look like numbers and dates stay text
GOOD = [
    # eid, rid, qid, ranker, doc, rank, ts (ISO), click, score, region, junk
    ("e1", "r1", "q1", "A", "007", 1, "2024-03-01T10:00:00Z", True, 0.9, "eu", "x"),
    ("e2", "r1", "q1", "A", "d2", 2, "2024-03-01T10:00:00.250000Z", False, 0.5, "eu", "x"),
    ("e3", "r1", "q1", "A", "2024-01-01", 3, "2024-03-01T11:00:00+01:00", False, -1.5, "eu", "y"),
    ("e4", "r2", "q1", "B", "d2", 1, "2024-03-01T12:00:00Z", True, 2.0, "us", "y"),
    ("e5", "r2", "q1", "B", "007", 2, "2024-03-01T12:00:01Z", False, 1.0, "us", "y"),
    ("e6", "r3", "q2", "A", "d9", 1, "2024-03-02T00:00:00Z", False, 3.25, "us", "z"),
    ("e7", "r3", "q2", "A", "d8", 2, "2024-03-02T00:00:00Z", True, 3.0, "us", "z"),
    ("e8", "r4", "q2", "B", "d8", 1, "2024-03-02T01:00:00Z", True, 7.0, "eu", "z"),
]


def _micros_iso(text: str) -> int:
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((dt - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds()) * 1_000_000 + dt.microsecond


def _write_jsonl(path, rows, columns=COLUMNS, blank_after=()):
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps(dict(zip(columns, r))) + "\n")
            if i in blank_after:
                f.write("\n")


def _write_csv(path, rows, columns=COLUMNS):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow(["true" if v is True else "false" if v is False else v for v in r])


def _write_parquet(path, rows, columns=COLUMNS):
    pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(columns)}), path)


WRITERS = {"jsonl": _write_jsonl, "csv": _write_csv, "parquet": _write_parquet}


def _read_back(path, fmt) -> list[dict]:
    """The input rows as dicts, read independently of the converter."""
    if fmt == "jsonl":
        return [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    return pq.read_table(path).to_pylist()


def _expected(row: dict, fmt: str) -> dict:
    """The impression of one input row by hand: CSV cells are text, so they are parsed here."""
    text = fmt == "csv"
    return {
        "event_id": row["eid"], "request_id": row["rid"], "query_id": row["qid"], "user_id": None,
        "system_id": row["ranker"], "item_id": row["doc"],
        "position": int(row["rank"]) if text else row["rank"],
        "score": float(row["s"]) if text else row["s"],
        "clicked": row["click"] == "true" if text else row["click"],
        "timestamp": _micros_iso(row["ts"]), "propensity": None,
        "attributes": {"region": row["region"]},
    }


def _convert(*args) -> int:
    return cli.main(["convert", "table", *map(str, args)])


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_three_formats_give_the_expected_records(tmp_path, fmt, capsys):
    src = tmp_path / f"log.{fmt}"
    WRITERS[fmt](src, GOOD)
    out = tmp_path / "imp.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--attributes", "region") == 0
    err = capsys.readouterr().err
    assert "ignored 1 column(s) no field is mapped to: junk" in err
    assert f"wrote {len(GOOD)} records to {out}; 0 rows became dead letters" in err
    got = list(avro.read_records(out, "impression"))
    rows = _read_back(src, fmt)
    assert len(got) == len(rows) == len(GOOD)
    for g, row in zip(got, rows):
        want = _expected(row, fmt)
        for name in want:  # field by field
            assert g[name] == want[name], (name, row)
        assert type(g["position"]) is int and type(g["item_id"]) is str
        assert records.check_impression(g) is None
    # hand-checked anchors: 2024-03-01T11:00:00+01:00 is 10:00 UTC = 1709287200 s
    assert got[2]["timestamp"] == 1_709_287_200_000_000 and got[2]["item_id"] == "2024-01-01"
    assert got[1]["timestamp"] == 1_709_287_200_250_000 and got[0]["item_id"] == "007"


@pytest.mark.parametrize("unit,factor", [("s", 1_000_000), ("ms", 1_000), ("us", 1)])
def test_integer_timestamps_in_each_unit(tmp_path, unit, factor):
    # 1709287200 s = 2024-03-01T10:00:00Z; the value is written in the unit, read back in micros
    rows = [("e1", "r1", "q1", "A", "d1", 1, 1_709_287_200 * 1_000_000 // factor, True, 1.0, "eu", "x")]
    src = tmp_path / "log.jsonl"
    _write_jsonl(src, rows)
    out = tmp_path / "imp.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--timestamp-unit", unit) == 0
    (rec,) = avro.read_records(out, "impression")
    assert rec["timestamp"] == 1_709_287_200_000_000 and rec["attributes"] == {}
    # without the unit, integers are refused (an s/ms/us mix-up would pass every check)
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING) == 2


BAD_ROWS = [
    GOOD[0],
    ("e2", "r1", "q1", "A", None, 2, "2024-03-01T10:00:00Z", False, 0.5, "eu", "x"),      # missing item
    ("e3", "r1", "q1", "A", "d3", "abc", "2024-03-01T10:00:00Z", False, 0.5, "eu", "x"),  # wrong type
    ("e4", "r1", "q1", "A", "d4", -2, "2024-03-01T10:00:00Z", False, 0.5, "eu", "x"),     # negative position
    ("e5", "r1", "q1", "A", "d5", 5, "2024-13-45T99:00:00Z", False, 0.5, "eu", "x"),      # bad timestamp
    GOOD[5],
]


#: the reasons of BAD_ROWS[1:5], as streameval.io.records and the timestamp conversion give them
REASONS = ["missing required field 'item_id'", "position must be an integer, got str 'abc'",
           "position must be >= 1 (1-based), got -2", "timestamp is not an ISO 8601 date-time: '2024-13-45T99:00:00Z'"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_bad_rows_become_dead_letters_with_their_lines(tmp_path, fmt, capsys):
    src = tmp_path / f"log.{fmt}"
    if fmt == "parquet":  # one Parquet column holds one type: the position column is text here
        # a text position column is the wrong type in every row: all rows are rejected
        _write_parquet(src, [tuple(str(v) if i == 5 else v for i, v in enumerate(r)) for r in BAD_ROWS])
        dl = tmp_path / "dl.jsonl"
        assert _convert(src, "--kind", "impressions", "--out", tmp_path / "o.avro", "--map", MAPPING,
                        "--dead-letters", dl) == 3
        letters = [json.loads(x) for x in dl.read_text().splitlines()]
        assert [d["source"] for d in letters] == [f"{src}:row {n}" for n in range(1, 7)]
        assert letters[0]["reason"] == "position must be an integer, got str '1'"
        assert "every row was rejected" in capsys.readouterr().err
        # with an integer position column, the other reasons and rows
        rows = [r if i != 2 else r[:5] + (3,) + r[6:] for i, r in enumerate(BAD_ROWS)]
        _write_parquet(src, rows)
        where = [f"{src}:row {n}" for n in (2, 4, 5)]
        reasons = [REASONS[0], REASONS[2], REASONS[3]]
        good = 3
    elif fmt == "jsonl":
        _write_jsonl(src, BAD_ROWS, blank_after=(1,))  # a blank line after line 2: the rest move down one
        where = [f"{src}:{n}" for n in (2, 4, 5, 6)]
        reasons = REASONS
        good = 2
    else:
        _write_csv(src, BAD_ROWS)  # header is line 1; None is an empty cell
        where = [f"{src}:{n}" for n in (3, 4, 5, 6)]
        reasons = ["empty item_id", *REASONS[1:]]
        good = 2
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "imp.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--dead-letters", dl) == 0
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [d["source"] for d in letters] == where
    assert [d["reason"] for d in letters] == reasons
    assert all(set(json.loads(d["raw"])) >= {"eid", "rid", "rank"} for d in letters)  # the row as read
    assert f"wrote {good} records to {out}; {len(where)} rows became dead letters ({dl})" in capsys.readouterr().err
    assert len(list(avro.read_records(out, "impression"))) == good


def test_csv_line_numbers_count_quoted_newlines_blank_lines_and_short_rows(tmp_path):
    src = tmp_path / "log.csv"
    src.write_text("eid,rid,qid,ranker,doc,rank,ts\n"
                   "e1,r1,q1,A,\"multi\nline doc\",1,2024-03-01T10:00:00Z\n"   # lines 2-3
                   "\n"                                                         # line 4 (blank)
                   "e2,r1,q1,A,d2\n"                                            # line 5: too few fields
                   "e3,r1,q1,A,d3,0,2024-03-01T10:00:00Z\n")                    # line 6: position 0
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "o.avro"
    m = "event_id=eid,request_id=rid,query_id=qid,system_id=ranker,item_id=doc,position=rank,timestamp=ts"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", m, "--dead-letters", dl) == 0
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [(d["source"], d["reason"]) for d in letters] == [
        (f"{src}:5", "expected 7 CSV fields (the header's), got 5"),
        (f"{src}:6", "position must be >= 1 (1-based), got 0")]
    (rec,) = avro.read_records(out, "impression")
    assert rec["item_id"] == "multi\nline doc"


def test_jsonl_lines_that_are_not_objects_and_mixed_types(tmp_path):
    src = tmp_path / "log.jsonl"
    lines = [json.dumps({"query_id": "q1", "item_id": "d1", "grade": 2}),
             "{not json",
             json.dumps([1, 2]),
             json.dumps({"query_id": "q1", "item_id": "d2", "grade": "high"}),  # a column of mixed types
             json.dumps({"query_id": 17, "item_id": "d3", "grade": 0}),         # integer id: its text
             json.dumps({"query_id": "q1", "item_id": "d4", "grade": 1.5})]
    src.write_text("\n".join(lines) + "\n")
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "j.avro"
    assert _convert(src, "--kind", "judgments", "--out", out, "--dead-letters", dl) == 0
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [d["source"] for d in letters] == [f"{src}:{n}" for n in (2, 3, 4, 6)]
    assert letters[0]["reason"].startswith("not JSON")
    assert letters[1]["reason"] == "not a JSON object but list"
    assert letters[2]["reason"] == "grade must be an integer, got str 'high'"
    assert letters[3]["reason"] == "grade must be an integer, got float 1.5"
    got = list(avro.read_records(out, "judgment"))
    assert [(r["query_id"], r["item_id"], r["grade"], r["timestamp"], r["source"]) for r in got] == [
        ("q1", "d1", 2, 0, ""), ("17", "d3", 0, 0, "")]


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    src = tmp_path / "log.csv"
    _write_csv(src, GOOD)
    out = tmp_path / "o.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING + ",colour=region") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown field(s) colour" in err
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", "event_id=eid") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "required field(s) request_id, query_id, system_id, item_id, position, timestamp" in err
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING.replace("doc", "document")) == 2
    assert "no column(s) item_id=document" in capsys.readouterr().err
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--attributes", "city") == 2
    assert "no column(s) city" in capsys.readouterr().err
    (tmp_path / "log.txt").write_text("x")
    assert _convert(tmp_path / "log.txt", "--kind", "judgments", "--out", out) == 2
    assert "give --format" in capsys.readouterr().err


def _hand_records(rows):
    imps = [{"event_id": r[0], "request_id": r[1], "query_id": r[2], "system_id": r[3], "item_id": r[4],
             "position": r[5], "timestamp": _micros_iso(r[6]), "clicked": r[7], "score": r[8],
             "attributes": {"region": r[9]}} for r in rows]
    return imps


JUDGMENTS = [("q1", "007", 2), ("q1", "d2", 0), ("q1", "2024-01-01", 1), ("q2", "d8", 1), ("q2", "d9", 3)]


def test_converted_file_gives_the_batch_job_the_same_metrics(tmp_path):
    """The table converter's Avro and the same data converted by hand give the same metric rows."""
    src = tmp_path / "log.csv"
    _write_csv(src, GOOD)
    jsrc = tmp_path / "qrels.parquet"
    pq.write_table(pa.table({"topic": [j[0] for j in JUDGMENTS], "docno": [j[1] for j in JUDGMENTS],
                             "rel": [j[2] for j in JUDGMENTS]}), jsrc)
    conv = tmp_path / "conv"
    assert _convert(src, "--kind", "impressions", "--out", conv / "imp.avro", "--map", MAPPING,
                    "--attributes", "region") == 0
    assert _convert(jsrc, "--kind", "judgments", "--out", conv / "judg.avro",
                    "--map", "query_id=topic,item_id=docno,grade=rel") == 0
    hand = tmp_path / "hand"
    avro.write_records(hand / "imp.avro", "impression", _hand_records(GOOD))
    avro.write_records(hand / "judg.avro", "judgment",
                       [{"query_id": q, "item_id": d, "grade": g} for q, d, g in JUDGMENTS])
    tables = []
    for d in (conv, hand):
        o = d / "out"
        assert batch.main(["--impressions", str(d / "imp.avro"), "--judgments", str(d / "judg.avro"),
                           "--metrics", "ndcg@10,map,ctr", "--slices", "region", "--runner", "FnApiRunner",
                           "--output", str(o), "--quiet"]) == 0
        tables.append(sorted(json.dumps(json.loads(x), sort_keys=True)
                             for x in (o / "metrics.jsonl").read_text().splitlines()))
    assert tables[0] == tables[1] and len(tables[0]) > 6
    names = {json.loads(x)["metric"] for x in tables[0]}
    assert {"ndcg@10", "map", "ctr"} <= names


def test_jsonl_fast_path_lines_and_rows_the_check_accepts(tmp_path):
    """pyarrow.json reads this file whole (one type per column); blank lines still count."""
    rows = [("e1", "r1", "q1", "A", "d1", 1, "2024-03-01T10:00:00Z", True, 0.5, 3, "x"),
            ("e2", "r1", "q1", "A", "d2", -1, "2024-03-01T10:00:00Z", False, 0.5, 3, "x"),   # line 3
            ("e3", "r1", "q1", "A", "d3", 3, "2024-03-01T10:00:00", False, None, None, "x"),  # naive: UTC
            ("", "r1", "q1", "A", "d4", 4, "2024-03-01T10:00:00Z", False, 0.5, 4, "x")]       # line 6
    src = tmp_path / "log.jsonl"
    _write_jsonl(src, rows, blank_after=(0, 2))  # lines 2 and 5 blank
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "o.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--attributes", "region",
                    "--dead-letters", dl) == 0
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [(d["source"], d["reason"]) for d in letters] == [
        (f"{src}:3", "position must be >= 1 (1-based), got -1"), (f"{src}:6", "empty event_id")]
    got = list(avro.read_records(out, "impression"))
    assert [r["event_id"] for r in got] == ["e1", "e3"]
    assert got[0]["attributes"] == {"region": "3"} and got[1]["attributes"] == {}  # integer as text; null left out
    assert got[1]["timestamp"] == 1_709_287_200_000_000 and got[1]["score"] is None


def test_rows_the_vectorised_path_cannot_type_keep_their_order(tmp_path):
    """A uint64 position column with one value beyond int64 cannot be cast as a whole: every row goes
    through the per-row conversion and the record check, which keeps the good ones in file order."""
    src = tmp_path / "log.parquet"
    pq.write_table(pa.table({"event_id": ["e1", "e2", "e3"], "request_id": ["r"] * 3, "query_id": ["q"] * 3,
                             "system_id": ["A"] * 3, "item_id": ["d1", "d2", "d3"],
                             "position": pa.array([1, 2**63, 3], pa.uint64()),
                             "timestamp": pa.array([0, 0, 5], pa.timestamp("ms"))}), src)
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "o.avro"
    assert _convert(src, "--kind", "impressions", "--out", out, "--dead-letters", dl) == 0
    (letter,) = [json.loads(x) for x in dl.read_text().splitlines()]
    assert letter["source"] == f"{src}:row 2" and letter["reason"] == f"position {2**63} does not fit an Avro int"
    got = list(avro.read_records(out, "impression"))
    assert [(r["event_id"], r["position"], r["timestamp"]) for r in got] == [("e1", 1, 0), ("e3", 3, 5000)]


def test_csv_integers_beyond_int64_are_named_by_the_check(tmp_path):
    src = tmp_path / "qrels.csv"
    src.write_text("query_id,item_id,grade,timestamp\nq1,d1,99999999999999999999,5\nq1,d2,1,99999999999999999999\n")
    dl = tmp_path / "dl.jsonl"
    assert _convert(src, "--kind", "judgments", "--out", tmp_path / "j.avro", "--dead-letters", dl,
                    "--timestamp-unit", "s") == 3
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [(d["source"], d["reason"]) for d in letters] == [
        (f"{src}:2", "grade 99999999999999999999 does not fit an Avro int"),
        # 99999999999999999999 s in micros is past the year 9999
        (f"{src}:3", "timestamp 99999999999999999999000000 is outside the event times a job can window "
                     "(years 1 to 9999)")]


def test_vectorised_screen_accepts_exactly_what_the_record_check_accepts(tmp_path):
    """Random rows with edge values in typed Parquet columns: the rows written are exactly those
    check_impression accepts when given the row by hand, and the rest are dead letters with its reason."""
    import random

    rnd = random.Random(7)
    ids = ["a", "", "b\x00", "é", None]
    rows = []
    for k in range(400):
        rows.append({
            "eid": f"e{k}" if rnd.random() < 0.9 else rnd.choice(ids),
            "rid": rnd.choice(["r1", "r2", "", None]) if rnd.random() < 0.2 else "r1",
            "qid": rnd.choice(["q", "", "q\x00"]),
            "sys": "A" if rnd.random() < 0.9 else rnd.choice(ids),
            "doc": f"d{k}" if rnd.random() < 0.9 else rnd.choice(ids),
            "rank": rnd.choice([1, 2, 0, -1, 2**31 - 1, 2**31, None]) if rnd.random() < 0.3 else 3,
            "ts": rnd.choice([0, -1, 253_402_300_799_999, 253_402_300_800_000, -62_135_596_800_000,
                              -62_135_596_800_001, None]) if rnd.random() < 0.3 else 1_709_287_200_000,
            "s": rnd.choice([0.5, float("nan"), float("inf"), -1e308, None]) if rnd.random() < 0.3 else 0.25,
            "prop": rnd.choice([0.5, 1.0, 0.0, 1.5, -0.1, float("nan"), None]) if rnd.random() < 0.3 else None,
            "click": rnd.choice([True, False, None]),
        })
    src = tmp_path / "log.parquet"
    pq.write_table(pa.table({c: pa.array([r[c] for r in rows], t) for c, t in [
        ("eid", pa.string()), ("rid", pa.string()), ("qid", pa.string()), ("sys", pa.string()),
        ("doc", pa.string()), ("rank", pa.int64()), ("ts", pa.int64()), ("s", pa.float64()),
        ("prop", pa.float64()), ("click", pa.bool_())]}), src)
    dl = tmp_path / "dl.jsonl"
    out = tmp_path / "o.avro"
    code = _convert(src, "--kind", "impressions", "--out", out, "--dead-letters", dl, "--timestamp-unit", "ms",
                    "--map", "event_id=eid,request_id=rid,query_id=qid,system_id=sys,item_id=doc,position=rank,"
                             "timestamp=ts,score=s,propensity=prop,clicked=click")
    assert code == 0
    want_ok, want_dead = [], []
    for k, r in enumerate(rows):
        rec = {"event_id": r["eid"], "request_id": r["rid"], "query_id": r["qid"], "system_id": r["sys"],
               "item_id": r["doc"], "position": r["rank"], "timestamp": None if r["ts"] is None else r["ts"] * 1000,
               "score": r["s"], "propensity": r["prop"], "clicked": r["click"]}
        reason = records.check_impression(rec)
        (want_ok.append(rec["event_id"]) if reason is None else want_dead.append((f"{src}:row {k + 1}", reason)))
    got = list(avro.read_records(out, "impression"))
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    assert [g["event_id"] for g in got] == want_ok
    assert [(d["source"], d["reason"]) for d in letters] == want_dead
    assert 50 < len(want_ok) < 350  # both kinds of rows are there


def test_default_dead_letter_file_and_avro_dead_letters(tmp_path, capsys):
    src = tmp_path / "qrels.csv"
    src.write_text("query_id,item_id,grade\nq1,d1,1\nq1,,2\n")
    out = tmp_path / "j.avro"
    assert _convert(src, "--kind", "judgments", "--out", out) == 0
    default = tmp_path / "j.dead_letters.jsonl"
    (letter,) = [json.loads(x) for x in default.read_text().splitlines()]
    assert letter == {"source": f"{src}:3", "raw": '{"grade":"2","item_id":"","query_id":"q1"}',
                      "reason": "empty item_id"}
    assert f"1 rows became dead letters ({default})" in capsys.readouterr().err
    dl = tmp_path / "dl.avro"
    assert _convert(src, "--kind", "judgments", "--out", out, "--dead-letters", dl) == 0
    assert list(avro.read_records(dl, "dead_letter")) == [letter]
    src.write_text("query_id,item_id,grade\nq1,d1,1\n")  # fixed: the stale default file goes
    assert _convert(src, "--kind", "judgments", "--out", out) == 0
    assert not default.exists()


def _deep(levels: int) -> str:
    """A JSON array nested ``levels`` deep: ``[[...]]``."""
    return "[" * levels + "]" * levels


def _convert_in_a_process(*args) -> subprocess.CompletedProcess:
    """The command in its own process (a crash of the reader ends that process, not the tests')."""
    code = "import sys; from streameval.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, "convert", "table", *map(str, args)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)


@pytest.mark.parametrize("also_not_json", [False, True])
def test_a_line_nested_deeper_than_the_limit_is_a_dead_letter(tmp_path, also_not_json):
    """Issue 36, item 5: a line nested 20,000 deep crashed pyarrow.json's reader (the process died
    with SIGSEGV, nothing written); with a line that is no JSON too, the line reader's json module
    raised RecursionError. The line is a dead letter naming its depth (the line's object and the
    20,000 arrays in it: 20,001 levels) and the limit; the other lines convert."""
    src = tmp_path / "log.jsonl"
    lines = [json.dumps(dict(zip(COLUMNS, r))) for r in GOOD]
    deep = '{"rid": "r9", "x": ' + _deep(20_000) + "}"  # the line: a column of its own
    lines.insert(2, deep)                                # line 3
    if also_not_json:
        lines.insert(5, "{not json")                     # line 6: the file goes to the line reader
    # a string full of brackets is no nesting: this row converts
    lines.append(json.dumps(dict(zip(COLUMNS, GOOD[0]), eid="e9", junk="[" * 3000)))
    src.write_text("\n".join(lines) + "\n")
    out, dl = tmp_path / "imp.avro", tmp_path / "dl.jsonl"
    res = _convert_in_a_process(src, "--kind", "impressions", "--out", out, "--map", MAPPING, "--dead-letters", dl)
    assert res.returncode == 0, (res.returncode, res.stderr[-500:])
    letters = [json.loads(x) for x in dl.read_text().splitlines()]
    want = [(f"{src}:3", "JSON nested 20001 levels deep (arrays and objects), over the limit of 500", deep)]
    if also_not_json:
        want.append((f"{src}:6", None, "{not json"))
    assert [(d["source"], d["reason"] if d["raw"] == deep else None, d["raw"]) for d in letters] == want
    if also_not_json:
        assert letters[1]["reason"].startswith("not JSON")
    written = len(GOOD) + 1
    assert f"wrote {written} records to {out}; {len(want)} rows became dead letters ({dl})" in res.stderr
    got = list(avro.read_records(out, "impression"))
    rows = [json.loads(x) for x in lines if x not in (deep, "{not json")]
    assert [r["event_id"] for r in got] == [r["eid"] for r in rows] == [r[0] for r in GOOD] + ["e9"]
    for g, row in zip(got, rows):
        want_rec = _expected(row, "jsonl")
        assert {k: g[k] for k in want_rec if k != "attributes"} == {k: v for k, v in want_rec.items()
                                                                   if k != "attributes"}


def test_nesting_at_the_limit_converts_and_one_deeper_is_a_dead_letter(tmp_path):
    """Depth 500 (the line's object and 499 arrays) is read; 501 is not."""
    src = tmp_path / "judg.jsonl"
    src.write_text("\n".join(json.dumps({"query_id": "q1", "item_id": f"d{i}", "grade": 1}) for i in range(3))
                   + '\n{"query_id": "q1", "item_id": "d7", "grade": 2, "x": ' + _deep(499) + "}"
                   + '\n{"query_id": "q1", "item_id": "d8", "grade": 2, "x": ' + _deep(500) + "}\n")
    out, dl = tmp_path / "j.avro", tmp_path / "dl.jsonl"
    assert _convert(src, "--kind", "judgments", "--out", out, "--dead-letters", dl) == 0
    assert [r["item_id"] for r in avro.read_records(out, "judgment")] == ["d0", "d1", "d2", "d7"]
    (letter,) = [json.loads(x) for x in dl.read_text().splitlines()]
    assert (letter["source"], letter["reason"]) == (
        f"{src}:5", "JSON nested 501 levels deep (arrays and objects), over the limit of 500")


def test_a_file_of_lines_too_deep_only_is_refused_in_one_line(tmp_path):
    src = tmp_path / "judg.jsonl"
    src.write_text('{"query_id": "q1", "x": ' + _deep(20_000) + "}\n")
    res = _convert_in_a_process(src, "--kind", "judgments", "--out", tmp_path / "j.avro")
    assert res.returncode == 2
    assert res.stderr == (f"streameval convert table: {src}: no line is a JSON object ({src}:1: JSON nested 20001 levels "
                   "deep (arrays and objects), over the limit of 500)\n")
