"""Bad input gets a clear reason, never a crash and never a silent drop.

* Avro: truncated, corrupt and foreign files raise only ``AvroInputError`` (with the file, the
  reason and the records read before the damage) after yielding everything before the damage;
  files of older / newer schema versions resolve when compatible and are refused, naming the
  field and both versions, when not.
* TREC run / qrels, Open Bandit CSV, LETOR and Yandex click logs: a malformed line raises
  ``InputFormatError`` whose message is ``path:line: reason: 'line'``; ``streameval trec-eval``
  and ``streameval convert`` print it as one line on stderr and exit 2.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import pickle
from pathlib import Path

import fastavro
import numpy as np
import pytest

from streameval import cli
from streameval.io import avro, convert, repeats, trec
from streameval.io.avro import AvroInputError, read_blocks, read_records, write_records
from streameval.io.trec import InputFormatError, TrecFormatError
from .conftest import fail_after

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "impressions" / "letor_feature206.avro"
SCHEMAS = REPO / "schemas"


@pytest.fixture(autouse=True)
def _fail_instead_of_hanging():
    """A reader that loops forever fails the test instead of blocking the run."""
    with fail_after(120, "test (a reader hangs?)"):
        yield


# ---------------------------------------------------------------------------
# helpers


def _sample_records(n=240):
    return list(read_records(SAMPLE))[:n]


def _layout(data: bytes):
    """Independent view of a file's blocks (fastavro.block_reader): header end, [(start, end, records)]."""
    blocks = []
    for b in fastavro.block_reader(io.BytesIO(data)):
        blocks.append((b.offset, b.offset + b.size, list(b)))
    return blocks[0][0], blocks


@pytest.fixture(scope="module")
def multi_block_files(tmp_path_factory):
    """The LETOR sample's first 240 impressions in ~20-record blocks, null and deflate codecs."""
    d = tmp_path_factory.mktemp("blocks")
    recs = _sample_records()
    out = {}
    for codec in ("null", "deflate"):
        p = d / f"{codec}.avro"
        write_records(p, "impression", recs, codec=codec, sync_interval=1500)
        data = p.read_bytes()
        header_end, blocks = _layout(data)
        assert len(blocks) >= 8
        orig = list(read_blocks(p))
        assert [len(b) for b in orig] == [len(b[2]) for b in blocks]
        out[codec] = (data, header_end, blocks, orig)
    return out


def _read_all(fn, path, name=None):
    """(items yielded, error or None) of a reader."""
    got = []
    try:
        for item in fn(path, name):
            got.append(item)
    except AvroInputError as e:
        return got, e
    return got, None


# ---------------------------------------------------------------------------
# Avro: error type and message


def test_avro_input_error_api():
    e = AvroInputError("x.avro", "truncated file: block 3 announced 1000 records, 412 decoded", 2412)
    assert isinstance(e, ValueError)
    assert (e.path, e.records_read) == ("x.avro", 2412)
    assert str(e) == "x.avro: truncated file: block 3 announced 1000 records, 412 decoded (after 2412 records)"
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.records_read) == (AvroInputError, str(e), 2412)


def test_not_avro_empty_and_missing(tmp_path):
    zip_like = tmp_path / "a.avro"
    zip_like.write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    for fn in (read_records, read_blocks):
        with pytest.raises(AvroInputError) as info:
            list(fn(zip_like))
        assert info.value.reason == "not an Avro container file (bad magic b'PK\\x03\\x04')"
        assert str(info.value) == f"{zip_like}: not an Avro container file (bad magic b'PK\\x03\\x04') (after 0 records)"
    empty = tmp_path / "e.avro"
    empty.write_bytes(b"")
    with pytest.raises(AvroInputError, match=r"empty file \(0 bytes\)"):
        list(read_blocks(empty))
    with pytest.raises(FileNotFoundError):
        list(read_records(tmp_path / "missing.avro"))
    with pytest.raises(IsADirectoryError):
        list(read_blocks(str(tmp_path)))


def test_corrupt_header_reasons(tmp_path):
    data = SAMPLE.read_bytes()
    cases = {
        # the schema JSON damaged (same length): invalid JSON
        "json": data.replace(b'"type": "record"', b'"type"; "record"', 1),
        # a field type that does not exist
        "type": data.replace(b'"type": "string"', b'"type": "strinG"', 1),
        # codec name damaged
        "codec": data.replace(b"deflate", b"deflatX", 1),
    }
    reasons = {}
    for key, damaged in cases.items():
        assert damaged != data
        p = tmp_path / f"{key}.avro"
        p.write_bytes(damaged)
        with pytest.raises(AvroInputError) as info:
            list(read_records(p, "impression"))
        assert info.value.records_read == 0
        reasons[key] = info.value.reason
    assert reasons["json"].startswith("corrupt header: the writer schema is not valid JSON")
    assert reasons["type"].startswith("corrupt header: invalid writer schema (UnknownType: streameval.strinG)")
    assert reasons["codec"] == "unsupported codec 'deflatX'"


def test_sync_marker_mismatch_names_the_block(tmp_path, multi_block_files):
    data, header_end, blocks, orig = multi_block_files["null"]
    # damage the sync marker that closes block 3
    start, end, recs = blocks[2]
    damaged = bytearray(data)
    damaged[end - 5] ^= 0xFF
    p = tmp_path / "sync.avro"
    p.write_bytes(bytes(damaged))
    got, err = _read_all(read_blocks, p)
    assert got == orig[:2]  # block 3 is not yielded: its closing marker is damaged
    assert err.records_read == len(orig[0]) + len(orig[1])
    assert err.reason == (f"corrupt block 3 at byte {start}: sync marker mismatch "
                          f"(the block's size or the marker is damaged)")
    got, err = _read_all(read_records, p)
    n3 = sum(len(b) for b in orig[:3])
    assert err.records_read == n3 and got == [r for b in orig[:3] for r in b]
    assert err.reason.startswith(f"corrupt block 3 at byte {start}: sync marker mismatch")


def test_truncated_block_message(tmp_path, multi_block_files):
    data, header_end, blocks, orig = multi_block_files["null"]
    start, end, recs = blocks[2]
    cut = start + 40
    p = tmp_path / "cut.avro"
    p.write_bytes(data[:cut])
    got, err = _read_all(read_blocks, p)
    assert got == orig[:2]
    before = len(orig[0]) + len(orig[1])
    assert err.records_read == before
    # the block header: count and size varints, then the data
    f = io.BytesIO(data[start:])
    count = fastavro.schemaless_reader(f, "long")
    size = fastavro.schemaless_reader(f, "long")
    left = cut - (start + f.tell())
    assert count == len(recs)
    assert err.reason == (f"truncated file: block 3 at byte {start} announced {count} records in {size} bytes, "
                          f"the file ends {left} bytes into them")
    assert str(err) == f"{p}: {err.reason} (after {before} records)"
    got, err = _read_all(read_records, p)
    assert err.records_read == before == len(got)
    assert err.reason.endswith(f"the file ends {left} bytes into them (0 of its records decoded)")


@pytest.mark.parametrize("codec, step", [("null", 17), ("deflate", 5)])
def test_file_cut_at_every_offset(tmp_path, multi_block_files, codec, step):
    """Cut anywhere: everything before the cut comes out, then AvroInputError (or a clean end
    when the cut falls exactly between blocks: Avro has no end marker)."""
    data, header_end, blocks, orig = multi_block_files[codec]
    ends = [end for _, end, _ in blocks]
    cuts = set(range(0, len(data), step)) | {header_end} | {e + d for e in ends for d in (-17, -16, -1, 0, 1, 2)}
    p = tmp_path / "t.avro"
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        p.write_bytes(data[:cut])
        complete = sum(1 for e in ends if e <= cut)  # blocks wholly before the cut
        n_before = sum(len(b) for b in orig[:complete])
        got_blocks, err_b = _read_all(read_blocks, p)
        got_recs, err_r = _read_all(read_records, p)
        assert got_blocks == orig[:complete], cut
        if cut == header_end or cut in ends:
            assert err_b is None and err_r is None and len(got_recs) == n_before, cut
            continue
        assert err_b is not None and err_r is not None, cut
        assert err_b.records_read == n_before, cut
        assert got_recs == [r for b in orig for r in b][: err_r.records_read], cut
        if cut < 4:
            assert err_b.reason.startswith(("empty file", "not an Avro container file")), cut
        elif cut < header_end:
            assert err_b.reason.startswith("truncated file: header"), (cut, err_b.reason)
            assert err_r.records_read == 0
        else:
            k = complete + 1
            prefix = f"truncated file: block {k} at byte {blocks[complete][0]}"
            assert err_b.reason.startswith(prefix), (cut, err_b.reason)
            assert err_r.reason.startswith(prefix), (cut, err_r.reason)
            assert n_before <= err_r.records_read <= n_before + len(orig[complete])


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_flipped_bytes_only_avro_input_error(tmp_path, multi_block_files, codec):
    """A damaged byte anywhere: AvroInputError or a successful read, and the blocks before the
    damaged one come out intact (damage that still decodes cannot be seen: Avro has no checksum)."""
    data, header_end, blocks, orig = multi_block_files[codec]
    flat = [r for b in orig for r in b]
    p = tmp_path / "f.avro"
    offsets = sorted(set(range(0, len(data), 37 if codec == "null" else 9)))
    for i, pos in enumerate(offsets):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << (i % 8) if i % 3 else 0xFF
        p.write_bytes(bytes(damaged))
        before = sum(1 for _, end, _ in blocks if end <= pos) if pos >= header_end else 0
        for name in (None, "impression"):
            got, err = _read_all(read_blocks, p, name)
            assert got[:before] == orig[:before] or pos < header_end, pos
            if err is not None:
                assert err.records_read == sum(len(b) for b in got), pos
                assert err.path == str(p)
                if pos >= header_end:
                    assert len(got) >= before, (pos, err)
            got, err = _read_all(read_records, p, name)
            if pos >= header_end:
                n = sum(len(b) for b in orig[:before])
                assert got[:n] == flat[:n], pos
            if err is not None:
                assert err.records_read == len(got), pos


def test_error_in_second_file_counts_that_file(tmp_path, multi_block_files):
    data, header_end, blocks, orig = multi_block_files["deflate"]
    good = tmp_path / "a.avro"
    bad = tmp_path / "b.avro"
    good.write_bytes(data)
    bad.write_bytes(data[: blocks[1][1] + 3])  # two whole blocks, then 3 bytes of the third
    got, err = _read_all(read_blocks, [good, bad])
    assert got == orig + orig[:2]
    assert err.path == str(bad) and err.records_read == len(orig[0]) + len(orig[1])
    got, err = _read_all(read_records, str(tmp_path / "*.avro"))
    assert len(got) == sum(map(len, orig)) + err.records_read and err.path == str(bad)


# ---------------------------------------------------------------------------
# Avro: schema versions


def _schema(name):
    return json.loads((SCHEMAS / f"{name}.avsc").read_text())


def _field(schema, name):
    return next(f for f in schema["fields"] if f["name"] == name)


def _write_raw(path, schema, records):
    """Write with fastavro directly (hand-edited schemas, as another tool or version would)."""
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), records)
    return path


JUDGMENTS = [
    {"query_id": "q1", "item_id": "d1", "grade": 2, "timestamp": 1_600_000_000_000_000, "source": "qrels",
     "subtopic": None},
    {"query_id": "q1", "item_id": "d2", "grade": 0, "timestamp": 5, "source": "", "subtopic": "2"},
]


def _impressions():
    return [
        {"event_id": "e1", "request_id": "r1", "query_id": "q1", "user_id": "u1", "system_id": "s",
         "item_id": "d1", "position": 1, "score": 2.5, "clicked": True, "timestamp": 1574553634762830,
         "propensity": 0.5, "attributes": {"campaign": "men"}},
        {"event_id": "e2", "request_id": "r1", "query_id": "q1", "user_id": None, "system_id": "s",
         "item_id": "d2", "position": 2, "score": None, "clicked": None, "timestamp": -5,
         "propensity": None, "attributes": {}},
    ]


def test_newer_writer_with_added_field_is_read_without_it(tmp_path):
    v2 = _schema("judgment")
    v2["streameval_schema_version"] = 3
    v2["fields"].append({"name": "annotator", "type": ["null", "string"], "default": None})
    v2["fields"].append({"name": "confidence", "type": "double"})  # no default: fine for an older reader
    recs = [dict(j, annotator="ann", confidence=0.9) for j in JUDGMENTS]
    p = _write_raw(tmp_path / "v2.avro", v2, recs)
    assert list(read_records(p, "judgment")) == JUDGMENTS
    assert list(read_blocks(p, "judgment")) == [JUDGMENTS]
    assert list(read_records(p))[0]["annotator"] == "ann"  # without a name: the writer's fields


def test_older_writer_without_optional_fields_gets_defaults(tmp_path):
    v0 = _schema("impression")
    v0["streameval_schema_version"] = 0
    v0["fields"] = [f for f in v0["fields"] if f["name"] not in ("user_id", "propensity", "attributes", "clicked")]
    dropped = ("user_id", "propensity", "attributes", "clicked")
    recs = [{k: v for k, v in r.items() if k not in dropped} for r in _impressions()]
    p = _write_raw(tmp_path / "v0.avro", v0, recs)
    (a, b), = list(read_blocks(p, "impression"))
    assert a == dict(recs[0], user_id=None, propensity=None, attributes={}, clicked=None, dwell_ms=None)
    assert b["score"] is None and b["timestamp"] == -5 and type(a["timestamp"]) is int
    j0 = _schema("judgment")
    j0["fields"] = [f for f in j0["fields"] if f["name"] not in ("timestamp", "source")]
    p = _write_raw(tmp_path / "j0.avro", j0, [{"query_id": "q", "item_id": "d", "grade": 3}])
    assert list(read_records(p, "judgment")) == [{"query_id": "q", "item_id": "d", "grade": 3, "timestamp": 0,
                                                   "source": "", "subtopic": None}]


def test_promoted_types(tmp_path):
    w = _schema("impression")
    _field(w, "timestamp")["type"] = "int"  # int -> long
    _field(w, "score")["type"] = ["null", "float"]  # float -> double
    _field(w, "propensity")["type"] = ["null", "int"]  # int -> double (a 0/1 propensity)
    _field(w, "user_id")["type"] = "string"  # string -> [null, string]
    del _field(w, "user_id")["default"]
    recs = [dict(r) for r in _impressions()]
    recs[0].update(timestamp=1_000_000, score=0.1, propensity=1, user_id="u")
    recs[1].update(timestamp=7, score=None, propensity=None, user_id="v")
    p = _write_raw(tmp_path / "p.avro", w, recs)
    a, b = read_records(p, "impression")
    assert a["timestamp"] == 1_000_000 and type(a["timestamp"]) is int
    assert a["score"] == float(np.float32(0.1)) and a["score"] != 0.1  # written as a float
    assert a["propensity"] == 1.0 and type(a["propensity"]) is float
    assert (b["user_id"], b["score"], b["timestamp"]) == ("v", None, 7)


def test_timestamp_millis_in_an_older_schema_become_micros(tmp_path):
    w = _schema("judgment")
    _field(w, "timestamp")["type"] = {"type": "long", "logicalType": "timestamp-millis"}
    w["fields"].append({"name": "extra", "type": "string", "default": ""})  # differs: resolution path
    p = _write_raw(tmp_path / "m.avro", w, [{"query_id": "q", "item_id": "d", "grade": 1, "timestamp": 1500,
                                              "source": "s", "extra": "x"}])
    (rec,) = read_records(p, "judgment")
    assert rec["timestamp"] == 1_500_000 and type(rec["timestamp"]) is int and "extra" not in rec


def test_renamed_field_and_record_via_aliases(tmp_path, monkeypatch):
    old = _schema("judgment")
    old["name"] = "Qrel"
    _field(old, "grade")["name"] = "label"
    p = _write_raw(tmp_path / "old.avro", old, [{"query_id": "q", "item_id": "d", "label": 2, "timestamp": 0,
                                                  "source": ""}])
    # without aliases in the reader: refused, naming the field
    with pytest.raises(AvroInputError) as info:
        list(read_records(p, "judgment"))
    assert "record Qrel, reader expects record Judgment (different names, no alias)" in info.value.reason
    # a reader schema version that renamed them keeps the old names as aliases
    new = _schema("judgment")
    new["streameval_schema_version"] = 2
    new["aliases"] = ["Qrel"]
    _field(new, "grade")["aliases"] = ["label"]
    stripped = avro._strip_micros(new)
    monkeypatch.setattr(avro, "_reader_schema",
                        lambda name: (fastavro.schema.to_parsing_canonical_form(stripped), stripped))
    assert list(read_records(p, "judgment")) == [{"query_id": "q", "item_id": "d", "grade": 2, "timestamp": 0,
                                                   "source": "", "subtopic": None}]


@pytest.mark.parametrize(
    "edit, records, reason",
    [
        (lambda s: _field(s, "grade").update(type="string"), [dict(JUDGMENTS[0], grade="2")],
         "writer field 'grade' is string, reader expects int"),
        (lambda s: _field(s, "grade").update(type="long"), [JUDGMENTS[0]],
         "writer field 'grade' is long, reader expects int"),
        (lambda s: _field(s, "grade").update(type=["null", "int"]), [JUDGMENTS[0]],
         "writer field 'grade' is [null, int], reader expects int"),
        (lambda s: s.update(fields=[f for f in s["fields"] if f["name"] != "item_id"]),
         [{k: v for k, v in JUDGMENTS[0].items() if k != "item_id"}],
         "field 'item_id' is missing from the writer schema and has no default in the reader schema"),
        (lambda s: _field(s, "timestamp").update(type="string", default=""), [dict(JUDGMENTS[0], timestamp="x")],
         "writer field 'timestamp' is string, reader expects long"),
    ],
)
def test_incompatible_judgment_schema_names_field_and_versions(tmp_path, edit, records, reason):
    w = _schema("judgment")
    w["streameval_schema_version"] = 3
    edit(w)
    for recs in (records, []):  # refused up front, even without records
        p = _write_raw(tmp_path / "w.avro", w, recs)
        for fn in (read_records, read_blocks):
            with pytest.raises(AvroInputError) as info:
                list(fn(p, "judgment"))
            assert info.value.reason == f"incompatible schema: {reason} (writer streameval_schema_version 3, reader 2)"
            assert info.value.records_read == 0
    # without a schema name the file is read as written
    assert len(list(read_records(p))) == 0


def test_incompatible_impression_schema(tmp_path):
    w = _schema("impression")
    del w["streameval_schema_version"]
    _field(w, "attributes")["type"] = {"type": "map", "values": "int"}
    _field(w, "attributes")["default"] = {}
    recs = [dict(r, attributes={"n": 1}) for r in _impressions()]
    p = _write_raw(tmp_path / "i.avro", w, recs)
    with pytest.raises(AvroInputError) as info:
        list(read_blocks(p, "impression"))
    assert info.value.reason == ("incompatible schema: writer field 'attributes' values is int, reader expects "
                                 "string (writer schema without streameval_schema_version, reader 2)")
    w = _schema("impression")
    _field(w, "position")["type"] = "long"
    p = _write_raw(tmp_path / "l.avro", w, _impressions())
    with pytest.raises(AvroInputError, match="writer field 'position' is long, reader expects int"):
        list(read_records(p, "impression"))


# ---------------------------------------------------------------------------
# TREC run and qrels


def _write(tmp_path, name, text, mode="w"):
    p = tmp_path / name
    if mode == "wb":
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_input_format_error_api(tmp_path):
    e = InputFormatError("a.run", 3, "score is not a number: 'x'", "q1 Q0 d1 1 x t\n")
    assert isinstance(e, ValueError)
    assert (e.path, e.lineno, e.line) == ("a.run", 3, "q1 Q0 d1 1 x t")
    assert str(e) == "a.run:3: score is not a number: 'x': 'q1 Q0 d1 1 x t'"
    assert str(InputFormatError("a.run", None, "empty file")) == "a.run: empty file"
    long = InputFormatError("a.run", 1, "bad", "x" * 500)
    assert long.line == "x" * 97 + "..." and len(str(long)) < 130
    assert issubclass(TrecFormatError, InputFormatError)
    assert str(pickle.loads(pickle.dumps(e))) == str(e)


@pytest.mark.parametrize(
    "text, lineno, reason",
    [
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 1.4\n", 2, "expected at least 6 columns (qid Q0 docno rank score tag), got 5"),
        ("q1 Q0 d1 1 1.5 t\n\nq1 Q0 d2 2 x1 t\n", 3, "score is not a number: 'x1'"),
        ("# c\nq1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 nan t\n", 3, "score is not a finite number (nan)"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 -inf t\n", 2, "score is not a finite number (-inf)"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 1e999 t\n", 2, "score is not a finite number (inf)"),
        ("q1 Q0 d1 1 1.5 t\nq2 Q0 d1 1 1.5 t\n\nq1 Q0 d1 3 0.5 t\n", 4,
         "docno 'd1' ranked twice for query 'q1' (first at line 1)"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d\x002 2 1.4 t\n", 2, "NUL byte in the line (binary data?)"),
        ("q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2.5 1.4 t\n", 2, "rank is not an integer: '2.5'"),
    ],
)
def test_run_line_errors(tmp_path, text, lineno, reason):
    p = _write(tmp_path, "bad.run", text)
    with pytest.raises(InputFormatError) as info:
        trec.read_run(p, check=True)
    err = info.value
    assert (err.path, err.lineno, err.reason) == (str(p), lineno, reason)
    line = text.split("\n")[lineno - 1]
    assert str(err) == f"{p}:{lineno}: {reason}: {line!r}"


def test_run_nonfinite_and_duplicates_are_read_without_check(tmp_path):
    # the library reader keeps trec_eval's reading (the metric layer refuses these); check=True refuses here
    p = _write(tmp_path, "r.run", "q1 Q0 d1 1 nan t\nq1 Q0 d1 2 1 t\n")
    run = trec.read_run(p)
    assert len(run) == 2 and math.isnan(run.score[0])


def test_non_utf8_qid_and_bad_gzip(tmp_path):
    p = _write(tmp_path, "u.run", b"q1 Q0 d1 1 1 t\nq\xff Q0 d2 2 1 t\n", mode="wb")
    with pytest.raises(InputFormatError) as info:
        trec.read_run(p)
    assert info.value.lineno == 2 and info.value.reason == "qid is not valid UTF-8"
    gz = _write(tmp_path, "r.run.gz", gzip.compress(b"q1 Q0 d1 1 1 t\n" * 100)[:-30], mode="wb")
    with pytest.raises(InputFormatError, match=r"r\.run\.gz: not a readable gzip file"):
        trec.read_run(gz)


@pytest.mark.parametrize(
    "text, lineno, reason",
    [
        ("1 0 d1 1\n1 0 d2\n", 2, "expected 4 columns (qid iter docno grade), got 3"),
        ("1 0 d1 1\n1 0 d2 x\n", 2, "grade is not an integer: 'x'"),
        ("1 0 d1 1\n2 0 d1 0\n\n# c\n1 0 d1 1\n", 5, "docno 'd1' judged twice for query '1' (also at line 1)"),
        ("1 0 d1 1\n1 0 d2 0\n1 0 d2 3\n", 3,
         "conflicting judgments: docno 'd2' of query '1' has grade 3 here and 0 at line 2"),
    ],
)
def test_qrels_line_errors(tmp_path, text, lineno, reason):
    p = _write(tmp_path, "bad.qrels", text)
    with pytest.raises(InputFormatError) as info:
        trec.read_qrels(p, check=True)
    assert (info.value.lineno, info.value.reason) == (lineno, reason)
    assert str(info.value).startswith(f"{p}:{lineno}: {reason}: ")


# ---------------------------------------------------------------------------
# the commands: one line on stderr, exit 2


QRELS = "q1 0 d1 1\nq1 0 d2 0\nq2 0 d1 2\n"
RUN = "q1 Q0 d1 1 1.5 t\nq1 Q0 d2 2 1.0 t\nq2 Q0 d1 1 3 t\n"


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "run_text, qrels_text, bad, lineno, reason",
    [
        (RUN + "q2 Q0 d3 2 abc t\n", QRELS, "run", 4, "score is not a number: 'abc'"),
        (RUN + "q2 Q0 d3 2 NaN t\n", QRELS, "run", 4, "score is not a finite number (nan)"),
        (RUN + "q2 Q0 d3\n", QRELS, "run", 4, "expected at least 6 columns"),
        (RUN + "q1 Q0 d2 3 0.5 t\n", QRELS, "run", 4, "docno 'd2' ranked twice for query 'q1' (first at line 2)"),
        (RUN, QRELS + "q1 0 d2 1\n", "qrels", 4,
         "conflicting judgments: docno 'd2' of query 'q1' has grade 1 here and 0 at line 2"),
        (RUN, QRELS + "q1 0 d2 0\n", "qrels", 4, "docno 'd2' judged twice for query 'q1' (also at line 2)"),
        (RUN, "q1 0 d1 one\n", "qrels", 1, "grade is not an integer: 'one'"),
        ("", QRELS, "run", None, "empty run file (no result lines)"),
        (RUN, "# nothing\n", "qrels", None, "empty qrels file (no judgment lines)"),
    ],
)
def test_trec_eval_reports_the_line_and_exits_2(tmp_path, capsys, run_text, qrels_text, bad, lineno, reason):
    run = _write(tmp_path, "x.run", run_text)
    qrels = _write(tmp_path, "x.qrels", qrels_text)
    assert cli.main(["trec-eval", "-m", "map", str(qrels), str(run)]) == 2
    line = _stderr_line(capsys)
    path = run if bad == "run" else qrels
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    assert line.startswith(f"streameval trec-eval: {where}: {reason}")


def test_trec_eval_other_failures(tmp_path, capsys):
    run = _write(tmp_path, "x.run", RUN)
    qrels = _write(tmp_path, "x.qrels", QRELS)
    assert cli.main(["trec-eval", "-m", "map", str(qrels), str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split("\t")[-1] == "1.0000"
    assert cli.main(["trec-eval", str(qrels), str(tmp_path / "missing.run")]) == 2
    assert "No such file or directory" in _stderr_line(capsys)
    assert cli.main(["trec-eval", "-m", "nosuchmeasure", str(qrels), str(run)]) == 2
    assert "unknown metric 'nosuchmeasure'" in _stderr_line(capsys)
    assert cli.main(["trec-eval", "--no-such-flag", str(qrels), str(run)]) == 2  # argparse usage error
    capsys.readouterr()
    other = _write(tmp_path, "o.qrels", "q9 0 d1 1\n")
    assert cli.main(["trec-eval", str(other), str(run)]) == 1  # well formed, nothing in common
    assert "no queries with both results and judgments" in _stderr_line(capsys)


def _convert(capsys, *argv):
    code = cli.main(["convert", *map(str, argv)])
    return code, (_stderr_line(capsys) if code else capsys.readouterr().err)


def test_convert_trec_errors(tmp_path, capsys):
    run = _write(tmp_path, "x.run", RUN + "q2 Q0 d3 2 inf t\n")
    code, line = _convert(capsys, "trec-run", run, tmp_path / "o.avro")
    assert code == 2 and line == f"streameval convert: {run}:4: score is not a finite number (inf): 'q2 Q0 d3 2 inf t'"
    assert not (tmp_path / "o.avro").exists()
    qrels = _write(tmp_path, "x.qrels", QRELS + "q2 0 d1 1\n")
    code, line = _convert(capsys, "qrels", qrels, tmp_path / "j.avro")
    assert code == 2 and line.startswith(f"streameval convert: {qrels}:4: conflicting judgments")
    good = _write(tmp_path, "g.run", RUN)
    code, err = _convert(capsys, "trec-run", good, tmp_path / "g.avro")
    assert code == 0 and "wrote 3 records" in err
    assert [r["item_id"] for r in read_records(tmp_path / "g.avro", "impression")] == ["d1", "d2", "d1"]


# ---------------------------------------------------------------------------
# Open Bandit CSV


OBD_HEADER = ",timestamp,item_id,position,click,propensity_score,user_feature_0,user_feature_1,user_feature_2,user_feature_3"
OBD_ROW = "{i},2019-11-24 00:00:34.762830+00:00,{item},{pos},{click},{prop},a,b,c,d"


def _obd(tmp_path, rows, name="all.csv"):
    lines = [OBD_HEADER] + rows
    return _write(tmp_path, name, "\n".join(lines) + "\n")


def _row(i=0, item="12", pos="1", click="0", prop="0.0125"):
    return OBD_ROW.format(i=i, item=item, pos=pos, click=click, prop=prop)


@pytest.mark.parametrize(
    "bad_row, reason",
    [
        ("3,2019-11-24 00:00:34+00:00,12,1", "expected 10 columns, got 4"),
        (_row(pos="x"), "position is not an integer: 'x'"),
        (_row(pos="0"), "position must be a 1-based rank, got 0"),
        (_row(pos="2147483648"), "position must be a 1-based rank, got 2147483648"),
        (_row(click="2"), "click must be 0 or 1, got '2'"),
        (_row(prop="abc"), "propensity_score is not a number: 'abc'"),
        (_row(prop="nan"), "propensity_score must be in (0, 1], got 'nan'"),
        (_row(prop="0"), "propensity_score must be in (0, 1], got '0'"),
        (_row(item=""), "empty item_id"),
        ("3,yesterday,12,1,0,0.5,a,b,c,d", "timestamp is not an ISO date-time: 'yesterday'"),
    ],
)
def test_obd_malformed_row(tmp_path, capsys, bad_row, reason):
    p = _obd(tmp_path, [_row(0), _row(1, pos="2"), "", bad_row, _row(4)])
    with pytest.raises(InputFormatError) as info:
        list(convert.obd_to_impressions(p, "bts"))
    assert (info.value.lineno, info.value.reason) == (5, reason)
    assert str(info.value) == f"{p}:5: {reason}: {bad_row!r}"
    code, line = _convert(capsys, "obd", p, tmp_path / "o.avro", "--system", "bts")
    assert code == 2 and line == f"streameval convert: {p}:5: {reason}: {bad_row!r}"


def test_obd_good_rows_header_empty_and_encoding(tmp_path):
    p = _obd(tmp_path, [_row(0), _row(1, pos="3", click="1", prop="1")])
    recs = list(convert.obd_to_impressions(p, "bts"))
    assert [(r["position"], r["clicked"], r["propensity"]) for r in recs] == [(1, False, 0.0125), (3, True, 1.0)]
    empty = _write(tmp_path, "e.csv", "")
    with pytest.raises(InputFormatError) as info:
        list(convert.obd_to_impressions(empty, "bts"))
    assert info.value.lineno is None and "empty file" in str(info.value)
    wrong = _write(tmp_path, "w.csv", "a,b,c\n1,2,3\n")
    with pytest.raises(InputFormatError) as info:
        list(convert.obd_to_impressions(wrong, "bts"))
    assert info.value.lineno == 1 and "missing columns ['timestamp'" in info.value.reason
    latin = _write(tmp_path, "l.csv", (OBD_HEADER + "\n" + _row(0) + "\n" + _row(1, item="caf\xe9") + "\n")
                   .encode("latin-1"), mode="wb")
    with pytest.raises(InputFormatError) as info:
        list(convert.obd_to_impressions(latin, "bts"))
    assert info.value.lineno == 3 and info.value.reason == "not UTF-8 text (byte 0xe9)"


# ---------------------------------------------------------------------------
# LETOR


@pytest.mark.parametrize(
    "data, query, bad, lineno, reason",
    [
        ("2 1:0.5\nx 1:0.2\n", "2\n", "data", 2, "label is not a number: 'x'"),
        ("2 1:0.5\n1.5 1:0.2\n", "2\n", "data", 2, "label is not an integer grade: '1.5'"),
        ("2 1:0.5\n# c\n1 1:nan\n", "2\n", "data", 3, "feature value is not finite: '1:nan'"),
        ("2 1:0.5\n1 2:3 1:abc\n", "2\n", "data", 2, "feature value is not a number: '1:abc'"),
        ("2 1:0.5\n1 1:0.2\n", "1\ntwo\n", "query", 2, "group size is not an integer: 'two'"),
        ("2 1:0.5\n1 1:0.2\n", "\n-1\n", "query", 2, "negative group size -1"),
        ("2 1:0.5\n1 1:0.2\n0 1:0\n", "1\n3\n", "query", 2,
         "group sizes add up to 4 but {data} has 3 rows (this group ends at row 4)"),
        ("2 1:0.5\n1 1:0.2\n\n0 1:0\n", "1\n1\n", "data", 4,
         "row 3 is in no group: the group sizes of {query} add up to 2 but there are 3 rows"),
        ("", "", "data", None, "empty file (no data lines)"),
    ],
)
def test_letor_errors(tmp_path, capsys, data, query, bad, lineno, reason):
    d = _write(tmp_path, "rank.txt", data)
    q = _write(tmp_path, "rank.txt.query", query)
    reason = reason.format(data=d, query=q)
    with pytest.raises(InputFormatError) as info:
        convert.letor_to_records(d, q)
    assert (info.value.path, info.value.lineno, info.value.reason) == (str(d if bad == "data" else q), lineno, reason)
    code, line = _convert(capsys, "letor", d, q, tmp_path / "i.avro", tmp_path / "j.avro")
    assert code == 2 and line.startswith(f"streameval convert: {info.value.path}")


# ---------------------------------------------------------------------------
# Yandex click log


def test_yandex_malformed_session_line(tmp_path, capsys):
    good = "1_0\ta,b,c : a , c"
    p = _write(tmp_path, "y", f"{good}; {good};\n{good};\n{good}; 2_0 c,d : c\n")
    with pytest.raises(InputFormatError) as info:
        list(convert.yandex_to_impressions(p))
    assert info.value.lineno == 3
    assert info.value.reason.startswith("malformed session 4 ")
    assert info.value.line == "2_0 c,d : c"
    code, line = _convert(capsys, "yandex", p, tmp_path / "y.avro")
    assert code == 2 and line.startswith(f"streameval convert: {p}:3: malformed session 4")
    merged = _write(tmp_path, "m", f"{good};\n{good};\n{good}\n{good};\n")  # ';' missing at the end of line 3
    with pytest.raises(InputFormatError) as info:
        list(convert.yandex_to_impressions(merged))
    assert (info.value.lineno, info.value.line) == (3, f"{good}\n{good}")
    assert "malformed session 2" in str(info.value) and "\n" not in str(info.value)
    empty = _write(tmp_path, "e", " ;\n;")
    with pytest.raises(InputFormatError, match="empty file"):
        list(convert.yandex_to_impressions(empty))
    ok = _write(tmp_path, "ok", f"{good};\n{good}\n")
    recs = list(convert.yandex_to_impressions(ok))
    assert len(recs) == 6 and [r["clicked"] for r in recs[:3]] == [True, False, True]


def test_count_records_reads_block_headers_only(tmp_path):
    recs = list(read_records(SAMPLE))
    path = tmp_path / "many.avro"
    write_records(path, "impression", recs, sync_interval=2000)
    assert avro.count_records(path) == len(recs) == avro.count_records([SAMPLE])
    data = path.read_bytes()
    (tmp_path / "cut.avro").write_bytes(data[: len(data) // 2])
    with pytest.raises(AvroInputError, match="truncated file"):
        avro.count_records(tmp_path / "cut.avro")
    from streameval.io import progress

    assert progress.count_avro_records(tmp_path / "cut.avro") is None


# --------------------------------------------------------------------------------------------
# line endings and byte-order marks (issue 20, item 6: a CR-only run file was read as one line)

_RUN_LINES = ["q1 Q0 d1 1 5.0 tagA", "q1 Q0 d2 2 4.0 tagA", "q1 Q0 d3 3 3.5 tagA", "q2 Q0 d1 1 2.0 tagA",
              "q2 Q0 d9 2 1.0 tagA"]
_QRELS_LINES = ["q1 0 d1 1", "q1 0 d3 2", "q2 0 d9 1", "q2 0 d4 0"]


@pytest.mark.parametrize("ending,bom", [("\r", False), ("\r", True), ("\r\n", True), ("\n", True),
                                        ("\r\n", False)])
def test_cr_line_endings_and_a_bom_read_as_lf_files(tmp_path, ending, bom, capsys):
    """Old Mac line ends (CR alone), Windows ones (CRLF) and a UTF-8 byte-order mark: the same runs and
    qrels as the plain LF file, on every reader (the fast path, the general one, trec-eval's)."""
    def write(name, lines, end, with_bom):
        p = tmp_path / name
        p.write_bytes((b"\xef\xbb\xbf" if with_bom else b"") + (end.join(lines) + end).encode())
        return p

    ref_run, ref_qrels = write("ref.run", _RUN_LINES, "\n", False), write("ref.qrels", _QRELS_LINES, "\n", False)
    run, qrels = write("x.run", _RUN_LINES, ending, bom), write("x.qrels", _QRELS_LINES, ending, bom)
    want, got = trec.read_run(ref_run), trec.read_run(run)
    assert len(got.qid) == 5
    for f in ("qid", "docno", "score", "rank"):
        assert list(getattr(got, f)) == list(getattr(want, f)), f
    assert got.tag == want.tag == "tagA"
    wq, gq = trec.read_qrels(ref_qrels), trec.read_qrels(qrels)
    for f in ("qid", "docno", "grade"):
        assert list(getattr(gq, f)) == list(getattr(wq, f)), f
    strict = trec.read_run(run, strict=True)
    assert list(strict.docno) == list(want.docno)
    assert cli.main(["trec-eval", "-q", str(ref_qrels), str(ref_run)]) == 0
    ref_out = capsys.readouterr().out
    assert cli.main(["trec-eval", "-q", str(qrels), str(run)]) == 0
    assert capsys.readouterr().out == ref_out
    cells = {(m.strip(), q): v.strip() for m, q, v in (line.split("\t") for line in ref_out.splitlines())}
    assert cells[("num_ret", "q1")] == "3" and cells[("num_ret", "q2")] == "2" and cells[("num_ret", "all")] == "5"


def test_a_cr_inside_a_line_of_an_lf_file_still_ends_nothing(tmp_path):
    """A CR directly before LF (Windows) is part of the line end; the rules above apply to files whose
    lines end with a CR alone."""
    p = tmp_path / "w.run"
    p.write_bytes(b"q1 Q0 d1 1 5.0 t\r\nq1 Q0 d2 2 4.0 t\r\n")
    assert list(trec.read_run(p).docno) == ["d1", "d2"]


def test_convert_refuses_grades_the_jobs_would_reject(tmp_path, capsys):
    """Issue 20, item 1: ``convert qrels`` wrote grade 2147483648 into the Avro int field, which the jobs
    then disagreed about; it now refuses it with path:line, as the jobs' record rules would."""
    q = tmp_path / "q.qrels"
    q.write_text("q1 0 d1 1\nq1 0 d2 2147483648\nq1 0 d3 -2147483648\n")
    out = tmp_path / "j.avro"
    code, line = _convert(capsys, "qrels", q, out)
    assert code == 2 and line == f"streameval convert: {q}:2: grade 2147483648 does not fit an Avro int: 'q1 0 d2 2147483648'"
    assert not out.exists()
    q.write_text("q1 0 d1 1\nq1 0 d3 -2147483648\nq1 0 d4 2147483647\n")  # the limits themselves fit
    assert _convert(capsys, "qrels", q, out)[0] == 0
    assert [r["grade"] for r in read_records(str(out), "judgment")] == [1, -2147483648, 2147483647]


@pytest.mark.parametrize(
    "run_text, lineno, reason",
    [
        (RUN + "q2 Q0 d3 2 NaN t\n", 4, "score is not a finite number (nan)"),
        (RUN + "q1 Q0 d2 3 0.5 t\n", 4, "docno 'd2' ranked twice for query 'q1' (first at line 2)"),
    ],
)
def test_evaluate_on_a_run_file_reports_the_line(tmp_path, run_text, lineno, reason):
    """evaluate() reads a run file without checking it first (the check cost 5 s at 3 M lines) and,
    when the metric layer refuses the run, raises the error read_run(check=True) gives: its line."""
    import streameval

    run = _write(tmp_path, "x.run", run_text)
    qrels = _write(tmp_path, "x.qrels", QRELS)
    with pytest.raises(InputFormatError) as info:
        streameval.evaluate(str(qrels), str(run), "map")
    assert (info.value.path, info.value.lineno, info.value.reason) == (str(run), lineno, reason)
    ok = _write(tmp_path, "ok.run", RUN)
    assert streameval.evaluate(str(qrels), ok, "map").value() == 1.0  # each query's relevant document first


@pytest.mark.parametrize("collide", [False, True])
def test_first_repeat_by_hashes_equals_sorting_the_ids(monkeypatch, collide):
    """io.repeats.first_repeat (hashes of the rows; exact only on the rows whose hash repeats) finds the
    row and earlier row that sorting the ids themselves finds, for str, bytes and integer ids, also
    when every hash collides (``collide``)."""
    if collide:
        monkeypatch.setattr(repeats, "row_hashes", lambda columns: np.zeros(len(columns[0]), dtype=np.uint64))
    rng = np.random.default_rng(5)
    for trial in range(60):
        n = int(rng.integers(0, 50))
        q = rng.integers(0, 4, n)
        d = rng.integers(0, 30 if trial % 3 else 200, n)
        forms = [(q, d), (q.astype(str), np.char.add("d", d.astype(str))),
                 (q.astype(str).astype("S"), np.char.add("doc-", d.astype(str)).astype("S")), (q, d.astype(str))]
        for cols in forms:
            assert repeats.first_repeat(*cols) == repeats.first_repeat_exact(*cols), (trial, cols)
    assert repeats.first_repeat(np.array(["a", "a"]), np.array(["", ""])) == (1, 0)


def test_trec_eval_with_one_file_on_the_fast_reader_and_one_on_the_general(tmp_path, capsys):
    """A regular run file (the fast reader: bytes ids, the query ids as runs of equal ids) with qrels
    that the general reader reads (a blank line: str ids): the ids meet as text and the numbers are
    those of two regular files (found by tests/test_fuzz.py)."""
    run = _write(tmp_path, "x.run", RUN)
    plain = _write(tmp_path, "plain.qrels", QRELS)
    blank = _write(tmp_path, "blank.qrels", "\n" + QRELS)
    outs = []
    for qrels in (plain, blank):
        assert cli.main(["trec-eval", "-q", "-m", "map", "-m", "P.1", str(qrels), str(run)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "map                   \tq1\t1.0000" in outs[0]
