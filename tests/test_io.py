"""Tests of streameval.io: schemas, Avro files, validation, TREC files, converters."""

from __future__ import annotations

import ast
import collections
import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streameval.io import avro, convert, records, trec
from streameval.io.avro import SCHEMA_NAMES, load_schema, read_blocks, read_records, schema_path, write_records
from streameval.io.trec import TrecFormatError

from .conftest import data_path

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# schemas


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schema_files_are_documented_and_versioned(name):
    raw = json.loads(schema_path(name).read_text())
    assert raw["type"] == "record"
    assert raw["namespace"] == "streameval"
    # alert 2: p_value added; judgment 2: subtopic; impression 2: dwell_ms; metric_result 2: metric_canonical,
    # metric_result 3: n_unit
    assert raw["streameval_schema_version"] == {"alert": 2, "judgment": 2, "impression": 2,
                                                 "metric_result": 3}.get(name, 1)
    assert raw["doc"].strip()
    for field in raw["fields"]:
        assert field.get("doc", "").strip(), f"{name}.{field['name']} has no doc"
    parsed = load_schema(name)
    assert parsed is load_schema(name)  # cached
    assert parsed["name"] == "streameval." + {
        "impression": "Impression",
        "judgment": "Judgment",
        "metric_result": "MetricResult",
        "dead_letter": "DeadLetter",
        "alert": "Alert",
    }[name]


def test_schema_field_names_and_defaults():
    def fields(name):
        return {f["name"]: f for f in json.loads(schema_path(name).read_text())["fields"]}

    imp = fields("impression")
    assert list(imp) == [
        "event_id", "request_id", "query_id", "user_id", "system_id", "item_id",
        "position", "score", "clicked", "timestamp", "propensity", "attributes", "dwell_ms",
    ]
    assert imp["timestamp"]["type"] == {"type": "long", "logicalType": "timestamp-micros"}
    assert imp["clicked"]["default"] is None and imp["attributes"]["default"] == {}
    assert imp["user_id"]["default"] is None and imp["score"]["type"] == ["null", "double"]
    jud = fields("judgment")
    assert list(jud) == ["query_id", "item_id", "grade", "timestamp", "source", "subtopic"]
    assert jud["timestamp"]["default"] == 0 and jud["source"]["default"] == ""
    assert jud["subtopic"]["type"] == ["null", "string"] and jud["subtopic"]["default"] is None
    res = fields("metric_result")
    assert list(res) == ["window_start", "window_end", "slice", "system", "metric", "value", "num_queries", "n_unit",
                         "stderr", "ci_low", "ci_high", "ci_level", "ci_method", "pane", "pane_index", "is_final",
                         "metric_canonical"]
    assert res["metric_canonical"]["type"] == ["null", "string"] and res["metric_canonical"]["default"] is None
    assert res["n_unit"]["type"] == ["null", "string"] and res["n_unit"]["default"] is None
    assert res["window_start"]["type"][0] == "null" and res["num_queries"]["type"] == "long"
    assert list(fields("dead_letter")) == ["source", "raw", "reason"]


def test_schema_symlink_ships_in_package():
    link = REPO / "streameval" / "schemas"
    assert link.is_symlink() and os.readlink(link) == "../schemas"
    for name in SCHEMA_NAMES:
        assert (link / f"{name}.avsc").read_text() == (REPO / "schemas" / f"{name}.avsc").read_text()


def test_unknown_schema_name():
    with pytest.raises(ValueError, match="unknown schema"):
        schema_path("impressions")


# ---------------------------------------------------------------------------
# Avro round trips


def _impressions():
    return [
        {
            "event_id": "e1", "request_id": "r1", "query_id": "q1", "user_id": "u1", "system_id": "s",
            "item_id": "d1", "position": 1, "score": 2.5, "clicked": True, "timestamp": 1574553634762830,
            "propensity": 0.0125, "attributes": {"campaign": "men", "device": "ios"},
        },
        {
            "event_id": "e2", "request_id": "r1", "query_id": "q1", "user_id": None, "system_id": "s",
            "item_id": "d2", "position": 2, "score": None, "clicked": False, "timestamp": -5,
            "propensity": None, "attributes": {},
        },
    ]


def test_impression_round_trip_timestamps_are_int(tmp_path):
    path = tmp_path / "imp.avro"
    recs = _impressions()
    assert write_records(path, "impression", recs) == 2
    back = list(read_records(path))
    assert back == [dict(r, dwell_ms=None) for r in recs]  # dwell_ms (version 2) written as its default
    assert all(type(r["timestamp"]) is int for r in back)
    assert list(read_records(str(path), name="impression")) == [dict(r, dwell_ms=None) for r in recs]


def test_write_and_read_take_path_then_name(tmp_path):
    """Issue 21: both functions take (path, schema name); the keyword forms and the old positional
    calls work, and the records given before the name (or the name before the path) is a TypeError
    naming the order instead of a fastavro schema error or a missing file."""
    path = tmp_path / "imp.avro"
    recs = _impressions()
    assert write_records(path=path, name="impression", records=recs) == 2
    want = [dict(r, dwell_ms=None) for r in recs]  # dwell_ms (version 2) written as its default
    assert list(read_records(paths=path, name="impression")) == want
    assert list(read_blocks(path, "impression")) == [want]
    with pytest.raises(TypeError, match=r"write_records\(path, name, records\).*same order as read_records"):
        write_records(tmp_path / "x.avro", recs, "impression")
    assert not (tmp_path / "x.avro").exists()
    with pytest.raises(TypeError, match=r"read_records\(paths, name\): paths first"):
        list(read_records("impression", path))
    with pytest.raises(TypeError, match=r"paths first"):
        list(read_blocks("impression", str(path)))


def test_impression_defaults_and_datetime_input(tmp_path):
    path = tmp_path / "imp.avro"
    rec = {
        "event_id": "e", "request_id": "r", "query_id": "q", "system_id": "s", "item_id": "d", "position": 3,
        "timestamp": datetime(2019, 11, 24, 0, 0, 34, 762830, tzinfo=timezone.utc),
    }
    write_records(path, "impression", [rec])
    (back,) = read_records(path)
    assert back["timestamp"] == 1574553634762830
    assert back["clicked"] is None and back["attributes"] == {} and back["user_id"] is None
    assert back["score"] is None and back["propensity"] is None


def test_judgment_round_trip_with_defaults(tmp_path):
    path = tmp_path / "j.avro"
    recs = [
        {"query_id": "301", "item_id": "FBIS3-1", "grade": 2, "timestamp": 1_600_000_000_000_000, "source": "qrels"},
        {"query_id": "301", "item_id": "FBIS3-2", "grade": -1},
    ]
    write_records(path, "judgment", recs)
    back = list(read_records(path, name="judgment"))
    assert back[0] == {**recs[0], "subtopic": None}
    assert back[1] == {"query_id": "301", "item_id": "FBIS3-2", "grade": -1, "timestamp": 0, "source": "",
                       "subtopic": None}
    assert type(back[0]["timestamp"]) is int


def test_metric_result_round_trip_nan_and_null_window(tmp_path):
    path = tmp_path / "m.avro"
    recs = [
        {"window_start": None, "window_end": None, "slice": "all", "system": "bm25", "metric": "map",
         "value": 0.1731, "num_queries": 50, "stderr": 0.02},
        {"window_start": 1574553600000000, "window_end": 1574557200000000, "slice": "campaign=men",
         "system": "random", "metric": "ctr", "value": float("nan"), "num_queries": 0, "stderr": None},
    ]
    write_records(path, "metric_result", recs, codec="null")
    back = list(read_records(path, name="metric_result"))
    # fields the records did not set (interval, pane) come back as their null defaults
    unset = {"ci_low": None, "ci_high": None, "ci_level": None, "ci_method": None, "pane": None,
             "pane_index": None, "is_final": None, "metric_canonical": None, "n_unit": None}
    assert back[0] == {**recs[0], **unset}
    assert math.isnan(back[1]["value"])
    assert {k: v for k, v in back[1].items() if k != "value"} == {**{k: v for k, v in recs[1].items() if k != "value"},
                                                                   **unset}
    assert type(back[1]["window_start"]) is int and back[1]["window_end"] - back[1]["window_start"] == 3_600_000_000


def test_dead_letter_round_trip(tmp_path):
    path = tmp_path / "d.avro"
    bad = {"event_id": "", "score": float("nan"), "blob": b"\xff\x00"}
    recs = [{"source": "in.avro", "raw": records.to_json_text(bad), "reason": records.check_impression(bad) or ""}]
    write_records(path, "dead_letter", recs)
    (back,) = read_records(path, name="dead_letter")
    assert back == recs[0]
    assert json.loads(back["raw"]) == {"blob": {"$base64": "/wA="}, "event_id": "", "score": "NaN"}
    assert back["reason"] == "missing required field 'request_id'"


def test_read_blocks_multiple_files_and_globs(tmp_path):
    recs = _impressions() * 5000  # several blocks per file
    write_records(tmp_path / "b.avro", "impression", recs, sync_interval=16_000)
    write_records(tmp_path / "a.avro", "impression", recs[:3])
    blocks = list(read_blocks(tmp_path / "b.avro"))
    assert len(blocks) > 5 and all(isinstance(b, list) for b in blocks)
    with open(tmp_path / "b.avro", "rb") as f:  # one list per Avro block
        assert [len(b) for b in blocks] == [blk.num_records for blk in fastavro.block_reader(f)]
    assert sum(len(b) for b in blocks) == 10_000
    assert [r for b in blocks for r in b] == [dict(r, dwell_ms=None) for r in recs]
    # glob: sorted expansion, a.avro first
    got = list(read_records(str(tmp_path / "*.avro")))
    assert len(got) == 10_003 and got[:3] == [dict(r, dwell_ms=None) for r in recs[:3]]
    assert avro.expand_paths([tmp_path / "b.avro", str(tmp_path / "?.avro")]) == [
        str(tmp_path / "b.avro"), str(tmp_path / "a.avro"), str(tmp_path / "b.avro"),
    ]
    assert sum(len(b) for b in read_blocks([tmp_path / "a.avro", tmp_path / "b.avro"], name="impression")) == 10_003


def test_glob_matching_nothing_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing-*.avro")
    with pytest.raises(FileNotFoundError, match=re.escape(pattern)):
        list(read_records(pattern))
    with pytest.raises(FileNotFoundError):
        list(read_blocks([pattern]))


def test_read_with_older_writer_schema_fills_defaults(tmp_path):
    # an "older" impression schema without propensity and attributes
    old = json.loads(schema_path("impression").read_text())
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("propensity", "attributes")]
    rec = {k: v for k, v in _impressions()[0].items() if k not in ("propensity", "attributes")}
    path = tmp_path / "old.avro"
    write_records(path, old, [rec])
    (plain,) = read_records(path)
    assert "attributes" not in plain and plain["timestamp"] == rec["timestamp"]
    (resolved,) = read_records(path, name="impression")
    assert resolved["attributes"] == {} and resolved["propensity"] is None
    assert resolved["timestamp"] == 1574553634762830 and type(resolved["timestamp"]) is int


def test_foreign_timestamp_millis_become_micros(tmp_path):
    schema = {
        "type": "record", "name": "X", "fields": [
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "u", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        ],
    }
    path = tmp_path / "x.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), [{"t": 1_500, "u": 7}, {"t": 0, "u": None}])
    assert list(read_records(path)) == [{"t": 1_500_000, "u": 7}, {"t": 0, "u": None}]


def test_not_an_avro_file(tmp_path):
    p = tmp_path / "x.avro"
    p.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an Avro container file"):
        list(read_records(p))


# ---------------------------------------------------------------------------
# records: validation and dead-letter JSON


def _good_impression(**changes):
    rec = dict(_impressions()[0])
    rec.update(changes)
    return rec


def test_check_impression_accepts_good_records():
    assert records.check_impression(_impressions()[0]) is None
    assert records.check_impression(_impressions()[1]) is None
    minimal = {k: _impressions()[0][k] for k in records.IMPRESSION_REQUIRED}
    assert records.check_impression(minimal) is None
    assert records.check_impression(_good_impression(position=np.int64(4), clicked=np.bool_(True), score=np.float32(1))) is None
    assert records.check_impression(_good_impression(clicked=1, propensity=1.0, query_id="")) is None


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"event_id": None}, "missing required field 'event_id'"),
        ({"request_id": ""}, "empty request_id"),
        ({"item_id": ""}, "empty item_id"),
        ({"system_id": ""}, "empty system_id"),
        ({"query_id": 7}, "query_id must be a string"),
        ({"position": 0}, "position must be >= 1"),
        ({"position": 1.0}, "position must be an integer"),
        ({"position": True}, "position must be an integer"),
        ({"score": float("nan")}, "score is not finite"),
        ({"score": float("inf")}, "score is not finite"),
        ({"score": "1.0"}, "score must be a number"),
        ({"propensity": 0.0}, "propensity must be in (0, 1]"),
        ({"propensity": 1.5}, "propensity must be in (0, 1]"),
        ({"propensity": float("nan")}, "propensity must be in (0, 1]"),
        ({"clicked": "false"}, "clicked must be a boolean"),
        ({"clicked": 2}, "clicked must be a boolean"),
        ({"timestamp": 1.5}, "timestamp must be integer microseconds"),
        ({"timestamp": 2**64}, "is outside the event times a job can window (years 1 to 9999)"),
        ({"user_id": 5}, "user_id must be a string or null"),
        ({"attributes": {"a": 1}}, "attributes must map strings to strings"),
        ({"attributes": None}, "attributes must be a map"),
    ],
)
def test_check_impression_reasons(changes, reason):
    got = records.check_impression(_good_impression(**changes))
    assert got is not None and reason in got


def test_check_impression_missing_field_and_non_mapping():
    rec = _good_impression()
    del rec["timestamp"]
    assert records.check_impression(rec) == "missing required field 'timestamp'"
    assert "not a mapping" in records.check_impression(["a"])


def test_check_judgment():
    good = {"query_id": "1", "item_id": "d", "grade": 0}
    assert records.check_judgment(good) is None
    assert records.check_judgment({**good, "grade": -1, "timestamp": 5, "source": "x"}) is None
    assert records.check_judgment({**good, "grade": np.int32(3)}) is None
    assert records.check_judgment({"item_id": "d", "grade": 1}) == "missing required field 'query_id'"
    assert records.check_judgment({**good, "item_id": None}) == "missing required field 'item_id'"
    assert "grade must be an integer" in records.check_judgment({**good, "grade": 1.5})
    assert "grade must be an integer" in records.check_judgment({**good, "grade": "2"})
    assert "grade must be an integer" in records.check_judgment({**good, "grade": True})
    assert "empty query_id" in records.check_judgment({**good, "query_id": ""})
    assert "timestamp must be integer" in records.check_judgment({**good, "timestamp": "0"})


def test_to_json_text_is_stable_and_valid():
    rec = {"b": float("nan"), "a": b"caf\xc3\xa9", "c": [np.int64(3), np.float64(-np.inf)], 2: {"z": 1, "y": None}}
    text = records.to_json_text(rec)
    assert text == '{"2":{"y":null,"z":1},"a":"café","b":"NaN","c":[3,"-Infinity"]}'
    assert json.loads(text)["b"] == "NaN"
    assert records.to_json_text({"y": 1, "x": 2}) == records.to_json_text({"x": 2, "y": 1})
    assert records.to_json_text("raw line") == '"raw line"'


# ---------------------------------------------------------------------------
# TREC files


def test_read_run_dl_hard_bm25():
    run = trec.read_run(data_path("dl_hard_passage", "runs", "bm25.run"))
    assert len(run) == 50_000
    assert len(np.unique(run.qid)) == 50
    assert run.tag == "PYSERINI"
    assert run.qid.dtype.kind == "U" and run.docno.dtype.kind == "U"
    assert run.score.dtype == np.float64 and run.rank.dtype == np.int64
    assert (run.qid[0], run.docno[0], run.rank[0], run.score[0]) == ("915593", "82107", 1, 25.859501)
    assert collections.Counter(run.qid.tolist()).most_common(1)[0][1] == 1000


def test_read_run_matches_naive_parse_on_all_shared_runs():
    files = sorted((data_path("dl_hard_passage", "runs")).glob("*.run")) + [data_path("trec_eval_test", "results.test")]
    assert len(files) == 7
    for path in files:
        run = trec.read_run(path)
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        assert run.qid.tolist() == [r[0] for r in rows]
        assert run.docno.tolist() == [r[2] for r in rows]
        assert run.rank.tolist() == [int(r[3]) for r in rows]
        assert run.score.tolist() == [float(r[4]) for r in rows]
        assert run.tag == rows[0][5]


def test_read_qrels_dl_hard():
    qrels = trec.read_qrels(data_path("dl_hard_passage", "dl_hard-passage.qrels"))
    # SOURCE.md says 4,255 judgments (the output of `wc -l`: the last line has
    # no newline); the file has 4,256 lines, matching its grade counts.
    assert len(qrels) == 4_256 == 2462 + 810 + 634 + 350
    assert dict(collections.Counter(qrels.grade.tolist())) == {0: 2462, 1: 810, 2: 634, 3: 350}
    assert len(np.unique(qrels.qid)) == 50
    assert (qrels.qid[0], qrels.docno[0], qrels.grade[0]) == ("915593", "1396701", 0)


def test_read_trec_eval_test_files():
    qrels = trec.read_qrels(data_path("trec_eval_test", "qrels.test"))
    assert len(qrels) == 3681 and sorted(set(qrels.qid.tolist())) == ["301", "302", "303"]
    run = trec.read_run(data_path("trec_eval_test", "results.test"))
    assert len(run) == 1500 and run.tag == "STANDARD"
    # results.trunc has lines with junk after the tag, which trec_eval ignores
    trunc_path = data_path("trec_eval_test", "results.trunc")
    trunc = trec.read_run(trunc_path)
    assert len(trunc) == 584
    assert (trunc.qid[0], trunc.docno[0], trunc.rank[0], trunc.score[0]) == ("301", "FBIS3-27619", 99, 2.138276)
    with pytest.raises(TrecFormatError, match=r"results\.trunc:1: expected 6 columns"):
        trec.read_run(trunc_path, strict=True)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, lineno, message",
    [
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 1.4\n", 2, "expected at least 6 columns"),
        ("q1 Q0 d1 1 1.5 t\n\n\nq1 Q0 d2 2\n", 4, "got 4"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 abc t\n", 2, "score is not a number: 'abc'"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 1.2.3 t\n", 2, "score is not a number"),
        ("q1 Q0 d1 1 1_5 t\n", 1, "score is not a number"),
        ("# header\nq1 Q0 d1 1 1.5 t\nq1 Q0 d2 two 1.4 t\n", 3, "rank is not an integer: 'two'"),
        ("q1 Q0 d1 1.0 1.5 t\n", 1, "rank is not an integer"),
    ],
)
def test_run_errors_carry_file_and_line(tmp_path, text, lineno, message):
    path = _write(tmp_path, "bad.run", text)
    with pytest.raises(TrecFormatError) as info:
        trec.read_run(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.lineno == lineno and err.path == str(path)
    assert str(err).startswith(f"{path}:{lineno}: ")
    assert message in str(err)


@pytest.mark.parametrize(
    "text, lineno, message",
    [
        ("1 0 d1 1\n1 0 d2\n", 2, "expected 4 columns"),
        ("1 0 d1 1\n1 0 d2 1 extra\n", 2, "got 5"),
        ("1 0 d1 1\n\n1 0 d2 high\n", 3, "grade is not an integer: 'high'"),
        ("1 0 d1 0.5\n", 1, "grade is not an integer"),
    ],
)
def test_qrels_errors_carry_file_and_line(tmp_path, text, lineno, message):
    path = _write(tmp_path, "bad.qrels", text)
    with pytest.raises(TrecFormatError) as info:
        trec.read_qrels(path)
    assert info.value.lineno == lineno
    assert f"bad.qrels:{lineno}:" in str(info.value) and message in str(info.value)


def test_empty_blank_comment_crlf_and_number_formats(tmp_path):
    empty = trec.read_run(_write(tmp_path, "e.run", ""))
    assert len(empty) == 0 and empty.tag == "" and empty.qid.dtype.kind == "U"
    assert len(trec.read_run(_write(tmp_path, "b.run", "\n  \n\t\n"))) == 0
    assert len(trec.read_qrels(_write(tmp_path, "e.qrels", ""))) == 0
    text = (
        "# a comment\n"
        "q1 Q0 d1 1 1.5 first\r\n"
        "\n"
        "q1\tQ0  d2 2 -2 other\n"
        "q2 Q0 d3 3 1e-3 t\nq2 Q0 d4 4 .5 t\nq2 Q0 d5 5 5. t\nq2 Q0 d6 6 +0.25 t\n"
        "q3 Q0 d7 7 -inf t\nq3 Q0 d8 8 0.12345678901234567890 t\nq3 Q0 döc 9 12345678901234567 t"
    )
    run = trec.read_run(_write(tmp_path, "x.run", text))
    assert run.tag == "first"
    assert run.qid.tolist() == ["q1", "q1", "q2", "q2", "q2", "q2", "q3", "q3", "q3"]
    assert run.docno.tolist()[-1] == "döc"
    assert run.score.tolist() == [1.5, -2.0, 0.001, 0.5, 5.0, 0.25, -math.inf, 0.12345678901234568, 1.2345678901234568e16]
    assert run.rank.tolist() == list(range(1, 10))
    nan = trec.read_run(_write(tmp_path, "n.run", "q Q0 d 1 nan t\n"))
    assert math.isnan(nan.score[0])
    qrels = trec.read_qrels(_write(tmp_path, "q.qrels", "1 0 a -1\n1 0 b +2\n\n2 Q0 c 10"))
    assert qrels.grade.tolist() == [-1, 2, 10] and qrels.qid.tolist() == ["1", "1", "2"]


_score_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12).map(lambda v: f"{v:.6f}"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"{v:.17g}"),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda v: f"{v:.4e}"),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.from_regex(r"\A[+-]?[0-9]{0,12}\.?[0-9]{1,12}\Z"),
)


@settings(max_examples=60, deadline=None)
@given(scores=st.lists(_score_text, min_size=1, max_size=40), ranks=st.lists(st.integers(-(10**18), 10**18), min_size=40, max_size=40))
def test_vectorised_number_parsing_matches_python(tmp_path_factory, scores, ranks):
    path = tmp_path_factory.mktemp("h") / "h.run"
    path.write_text("".join(f"q Q0 d{i} {ranks[i]} {s} tag\n" for i, s in enumerate(scores)))
    run = trec.read_run(path)
    assert run.score.tolist() == [float(s) for s in scores]
    assert run.rank.tolist() == ranks[: len(scores)]


def test_write_read_round_trip_and_dicts(tmp_path):
    run = trec.read_run(data_path("trec_eval_test", "results.test"))
    trec.write_run(tmp_path / "r.run", run)
    back = trec.read_run(tmp_path / "r.run")
    for field in ("qid", "docno", "score", "rank"):
        assert np.array_equal(getattr(back, field), getattr(run, field))
    assert back.tag == run.tag
    qrels = trec.read_qrels(data_path("trec_eval_test", "qrels.rel_level"))
    trec.write_qrels(tmp_path / "q.qrels.gz", qrels)
    qback = trec.read_qrels(tmp_path / "q.qrels.gz")
    assert np.array_equal(qback.grade, qrels.grade) and np.array_equal(qback.docno, qrels.docno)

    d = trec.run_to_dict(run)
    assert len(d) == 3 and sum(len(v) for v in d.values()) == 1500
    rebuilt = trec.run_from_dict(d, tag="STANDARD")
    assert trec.run_to_dict(rebuilt) == d
    qd = trec.qrels_to_dict(qrels)
    assert trec.qrels_to_dict(trec.qrels_from_dict(qd)) == qd


def test_run_from_dict_orders_like_trec_eval():
    run = trec.run_from_dict({"q2": {"a": 1.0, "b": 3.0}, "q1": {"x": 2.0, "y": 2.0, "z": 5.0}}, tag="t")
    assert run.qid.tolist() == ["q2", "q2", "q1", "q1", "q1"]
    assert run.docno.tolist() == ["b", "a", "z", "y", "x"]
    assert run.rank.tolist() == [1, 2, 1, 2, 3]
    assert run.tag == "t"
    q = trec.qrels_from_dict({"1": {"d1": 1, "d2": 0}})
    assert q.grade.dtype == np.int64 and q.grade.tolist() == [1, 0]


# ---------------------------------------------------------------------------
# converters


def test_trec_run_to_impressions_tie_order():
    # rank column deliberately wrong; ties must go to the larger docno
    run = trec.TrecRun(
        qid=np.array(["q1", "q1", "q1", "q1", "q2", "q2", "q2"]),
        docno=np.array(["D1", "D3", "D2", "D10", "b", "a", "c"]),
        score=np.array([1.0, 1.0, 2.0, 1.0, 0.5, 0.5, 0.5]),
        rank=np.array([1, 2, 3, 4, 1, 2, 3]),
        tag="sys",
    )
    imps = list(convert.trec_run_to_impressions(run, timestamp_micros=lambda q: 1000 * int(q[1:])))
    got = [(r["query_id"], r["item_id"], r["position"]) for r in imps]
    assert got == [
        ("q1", "D2", 1),   # highest score
        ("q1", "D3", 2),   # ties at 1.0: D3 > D10 > D1 as strings
        ("q1", "D10", 3),
        ("q1", "D1", 4),
        ("q2", "c", 1),
        ("q2", "b", 2),
        ("q2", "a", 3),
    ]
    first = imps[0]
    assert first == {
        "event_id": f"sys/q1/D2@{convert.run_digest(run)[:12]}", "request_id": "sys/q1", "query_id": "q1", "user_id": None, "system_id": "sys",
        "item_id": "D2", "position": 1, "score": 2.0, "clicked": None, "timestamp": 1000, "propensity": None,
        "attributes": {},
    }
    assert imps[-1]["timestamp"] == 2000
    other = list(convert.trec_run_to_impressions(run, system_id="other", timestamp_micros=7))
    assert {r["system_id"] for r in other} == {"other"} and {r["timestamp"] for r in other} == {7}
    assert other[0]["request_id"] == "other/q1"
    assert all(records.check_impression(r) is None for r in imps)


def test_converted_event_ids_differ_between_runs_and_repeat_for_one():
    """Issue 20, item 12: two different runs converted with one tag shared their event ids (a blended
    job took one run's impressions as replays or conflicts of the other's). The ids now carry the
    run's content digest: equal for the same content (whatever the tag, rank column or line order),
    different when any qid, docno or score differs."""
    base = [("q1", "d1", 2.0), ("q1", "d2", 1.0), ("q2", "d1", 0.5)]

    def run(lines, tag="PYSERINI", shuffle=False):
        lines = list(reversed(lines)) if shuffle else lines
        return trec.TrecRun(np.array([q for q, _, _ in lines]), np.array([d for _, d, _ in lines]),
                            np.array([s for _, _, s in lines], dtype=np.float64),
                            np.arange(1, len(lines) + 1), tag)

    def ids(r):
        return [x["event_id"] for x in convert.trec_run_to_impressions(r, system_id="S")]

    same = sorted(ids(run(base)))
    assert same == sorted(ids(run(base, tag="other", shuffle=True)))
    assert len({i.rsplit("@", 1)[1] for i in same}) == 1
    for changed in ([("q1", "d1", 2.0), ("q1", "d2", 1.5), ("q2", "d1", 0.5)],
                    [("q1", "d1", 2.0), ("q1", "d3", 1.0), ("q2", "d1", 0.5)],
                    [("q1", "d1", 2.0), ("q1", "d2", 1.0), ("q3", "d1", 0.5)],
                    base[:2]):
        assert not set(ids(run(changed))) & set(same)


def test_trec_files_convert_and_write(tmp_path):
    run = trec.read_run(data_path("dl_hard_passage", "runs", "bm25.run"))
    imps = list(convert.trec_run_to_impressions(run))
    assert len(imps) == 50_000 and len({r["request_id"] for r in imps}) == 50
    assert {r["system_id"] for r in imps} == {"PYSERINI"}
    assert max(r["position"] for r in imps) == 1000
    qrels = trec.read_qrels(data_path("dl_hard_passage", "dl_hard-passage.qrels"))
    js = list(convert.trec_qrels_to_judgments(qrels, source="dl-hard"))
    assert len(js) == 4_256 and js[0] == {"query_id": "915593", "item_id": "1396701", "grade": 0, "timestamp": 0, "source": "dl-hard"}
    assert all(records.check_judgment(j) is None for j in js)
    assert write_records(tmp_path / "imp.avro", "impression", imps) == 50_000
    assert write_records(tmp_path / "j.avro", "judgment", js) == 4_256
    back = list(read_records(tmp_path / "imp.avro", name="impression"))
    assert back == [dict(r, dwell_ms=None) for r in imps]  # the converter leaves dwell_ms to its default


OBD_CLICK_RATES = {
    ("random", "all"): 0.0038, ("random", "men"): 0.0046, ("random", "women"): 0.0046,
    ("bts", "all"): 0.0042, ("bts", "men"): 0.0069, ("bts", "women"): 0.0046,
}


@pytest.mark.parametrize("policy, campaign", sorted(OBD_CLICK_RATES))
def test_obd_impressions(policy, campaign):
    path = data_path("obd", policy, campaign, f"{campaign}.csv")
    imps = list(convert.obd_to_impressions(path, system_id=policy))
    assert len(imps) == 10_000
    clicks = sum(r["clicked"] for r in imps)
    assert clicks / len(imps) == pytest.approx(OBD_CLICK_RATES[(policy, campaign)], abs=1e-12)
    assert {r["query_id"] for r in imps} == {campaign}
    assert {r["attributes"]["campaign"] for r in imps} == {campaign}
    assert {r["position"] for r in imps} == {1, 2, 3}
    assert len({r["event_id"] for r in imps}) == 10_000
    assert len({r["request_id"] for r in imps}) == 10_000  # one request per row
    assert all(records.check_impression(r) is None for r in imps)
    if policy == "random":
        assert len({r["propensity"] for r in imps}) == 1  # uniform logging policy
    first = imps[0]
    assert first["event_id"] == f"{policy}/{campaign}/0"
    assert re.fullmatch(r"[0-9a-f]{16}", first["user_id"])
    assert 1574553600000000 <= first["timestamp"] < 1574553600000000 + 86_400_000_000  # 2019-11-24 UTC
    assert all(1574553600000000 <= r["timestamp"] < 1575158400000000 for r in imps)  # 2019-11-24..30


def test_obd_first_row_and_page_grouping():
    path = data_path("obd", "random", "all", "all.csv")
    first = next(convert.obd_to_impressions(path, "random"))
    assert first["timestamp"] == 1574553634762830  # 2019-11-24 00:00:34.762830+00:00
    assert (first["item_id"], first["position"], first["clicked"], first["propensity"]) == ("14", 3, False, 0.0125)
    assert first["user_id"] == convert.user_hash(
        "81ce123cbb5bd8ce818f60fb3586bba5", "03a5648a76832f83c859d46bc06cb64a",
        "c2e4f76cdbabecd33b8c762aeef386b3", "f97571b9c14a786aab269f0b427d2a85",
    )
    grouped = list(convert.obd_to_impressions(path, "random", group_same_page=True))
    pages = collections.Counter(r["request_id"] for r in grouped)
    assert len(pages) == 9_991 and max(pages.values()) == 2
    for rid, n in pages.items():
        if n == 2:
            pos = [r["position"] for r in grouped if r["request_id"] == rid]
            assert len(set(pos)) == 2


@pytest.mark.parametrize("split, groups, rows", [("train", 201, 3005), ("test", 50, 768)])
def test_letor_records(split, groups, rows):
    data = data_path("letor_lightgbm", f"rank.{split}")
    imps, js = convert.letor_to_records(data, str(data) + ".query")
    assert len(imps) == len(js) == rows
    assert len({j["query_id"] for j in js}) == groups
    assert len({r["request_id"] for r in imps}) == groups
    assert {r["system_id"] for r in imps} == {"feature1"}
    assert {j["grade"] for j in js} <= {0, 1, 2, 3, 4}
    # positions are a permutation 1..n per query, in score-desc / item-desc order
    by_q = collections.defaultdict(list)
    for r in imps:
        by_q[r["query_id"]].append(r)
    for items in by_q.values():
        assert [r["position"] for r in items] == list(range(1, len(items) + 1))
        keys = [(r["score"], r["item_id"]) for r in items]
        assert keys == sorted(keys, reverse=True)
    assert all(records.check_impression(r) is None for r in imps)
    assert all(records.check_judgment(j) is None for j in js)


def test_letor_feature_values_and_group_mismatch(tmp_path):
    data = _write(tmp_path, "tiny.txt", "2 1:0.5 3:0.9\n0 3:0.1\n1 1:0.5 2:7 # comment\n3 1:1.5\n")
    query = _write(tmp_path, "tiny.txt.query", "3\n1\n")
    imps, js = convert.letor_to_records(data, query, feature=1, system_id="f1")
    assert [(r["query_id"], r["item_id"], r["score"], r["position"]) for r in imps] == [
        ("q1", "d3", 0.5, 1),  # tie 0.5 with d1: d3 > d1
        ("q1", "d1", 0.5, 2),
        ("q1", "d2", 0.0, 3),  # feature 1 absent -> 0.0
        ("q2", "d1", 1.5, 1),
    ]
    assert [(j["query_id"], j["item_id"], j["grade"]) for j in js] == [("q1", "d1", 2), ("q1", "d2", 0), ("q1", "d3", 1), ("q2", "d1", 3)]
    assert js[0]["source"] == "tiny.txt"
    _write(tmp_path, "bad.query", "3\n2\n")
    with pytest.raises(ValueError, match="add up to 5"):
        convert.letor_to_records(data, tmp_path / "bad.query")


def _raw_yandex_counts(path: Path) -> tuple[int, int]:
    """Independent count: sessions = tab characters, clicks = ids after ' : '."""
    text = path.read_text()
    sessions = text.count("\t")
    clicks = sum(len(re.findall(r"\d+", s.split(":", 1)[1])) for s in text.split(";") if ":" in s)
    return sessions, clicks


# sessions / click-list entries / clicked impressions, counted with grep and awk
# (sessions: tab characters; clicks: ids after " : "; clicked impressions:
# distinct clicked ids that are among the session's 10 urls).
YANDEX = {
    "trainSample": (35_064, 50_321, 42_703),
    "testSample": (21_413, 35_853, 31_243),
}


@pytest.mark.parametrize("name", sorted(YANDEX))
def test_yandex_impressions(name):
    path = data_path("yandex_wscd_sample", name)
    sessions, clicks, clicked_impressions = YANDEX[name]
    assert _raw_yandex_counts(path) == (sessions, clicks)
    imps = list(convert.yandex_to_impressions(path))
    assert len(imps) == 10 * sessions
    assert len({r["request_id"] for r in imps}) == sessions
    assert sum(r["clicked"] for r in imps) == clicked_impressions
    assert len({r["query_id"] for r in imps}) == 19  # 20 qid_region lines, qid 986 in two regions
    assert {r["attributes"]["region"] for r in imps} == {"0", "1", "2", "3"}
    assert {r["timestamp"] for r in imps} == {0}
    assert collections.Counter(r["position"] for r in imps) == {p: sessions for p in range(1, 11)}
    first = imps[0]
    assert first == {
        "event_id": "yandex/98435/0/1", "request_id": "yandex/98435/0", "query_id": "98435", "user_id": None,
        "system_id": "yandex", "item_id": "232429", "position": 1, "score": None, "clicked": True, "timestamp": 0,
        "propensity": None, "attributes": {"region": "1"},
    }
    if name == "trainSample":  # first session: clicks 688835, 232429, 16704940 = positions 2, 1, 4
        assert [r["clicked"] for r in imps[:10]] == [True, True, False, True] + [False] * 6
    assert all(records.check_impression(r) is None for r in imps[:1000])


def test_yandex_malformed_session(tmp_path):
    p = _write(tmp_path, "y", "1_0\ta,b : a; 2_0 c,d\n")
    with pytest.raises(ValueError, match="malformed session 1"):
        list(convert.yandex_to_impressions(p))


# ---------------------------------------------------------------------------
# layering


def test_io_imports_only_numpy_fastavro_and_stdlib():
    """Only streameval.io and the definitions layer (streameval.metrics) from the project; no Beam in
    the I/O layer at import time; pyarrow and datafusion only in the Arrow decoder
    (arrow_avro), pyarrow in ``convert table``'s reader (convert_table, imported by that command only)
    and in the batch job's Parquet reader that uses its rules (parquet_blocks), in evaluate()'s reader of
    a DataFrame's Arrow text columns (arrow_text, imported when such a column is read), in the stream's
    reader of JSON events (json_events, imported by its read stage). Inside a function (imported when called), Beam's FileSystems for remote paths and
    pandas (an optional DataFrame result), pyarrow (Parquet outputs: warehouse, tables) and tqdm (the
    progress bars of io/progress.py, the report extra's, shown on a terminal only) are allowed:
    importing streameval.io never loads them."""
    import sys

    allowed_third_party = {"numpy", "fastavro"}
    lazy_allowed = {"apache_beam.io.filesystems", "pandas", "pyarrow", "pyarrow.parquet", "tqdm", "tqdm.auto"}
    io_dir = REPO / "streameval" / "io"
    for py in sorted(io_dir.glob("*.py")):
        tree = ast.parse(py.read_text())
        nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside streameval.io, or the definitions below it (metrics)
                    assert node.level == 1 or (node.level == 2 and (node.module or "").split(".")[0] == "metrics"), \
                        f"{py.name} imports outside streameval.io and streameval.metrics"
                    continue
                names = [node.module]
            else:
                continue
            for name in names:
                if id(node) in nested and name in lazy_allowed:
                    continue
                top = name.split(".")[0]
                # Arrow modules: the Arrow decoder, and `convert table` (pyarrow reads CSV, JSON lines and
                # Parquet; loaded only by that command, never by `import streameval.io`)
                arrow = {"arrow_avro.py": {"pyarrow", "datafusion"}, "convert_table.py": {"pyarrow"},
                         "parquet_blocks.py": {"pyarrow"}, "arrow_text.py": {"pyarrow"}, "json_events.py": {"pyarrow"}}
                allowed = allowed_third_party | arrow.get(py.name, set())
                assert top in allowed or top in sys.stdlib_module_names, f"{py.name} imports {name}"


def test_clicked_null_means_not_logged():
    """A TREC run logs no clicks: clicked is null, which validation accepts (click metrics skip it)."""
    assert records.check_impression(_good_impression(clicked=None)) is None
    rec = _good_impression()
    rec.pop("clicked", None)
    assert records.check_impression(rec) is None


def test_importing_the_io_layer_loads_no_arrow_or_beam():
    """``import streameval.io`` (and its record rules) in a fresh interpreter loads neither pyarrow nor
    Beam: the Arrow modules are imported by the commands that use them."""
    import subprocess
    import sys

    code = ("import sys, streameval.io, streameval.io.records, streameval.io.avro; "
            "print(sorted(m for m in ('pyarrow', 'apache_beam', 'datafusion') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
