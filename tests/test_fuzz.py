"""Property-based fuzzing of the input paths (hypothesis, bounded: the file runs in well under 60 s).

* Avro readers on random bytes and on mutated real files: only ``AvroInputError`` (never another
  exception, never a hang), and the records before the damage come out unchanged.
* ``check_impression`` / ``check_judgment`` on random records: a reason (str) or None, never an
  exception; every record they accept is written by ``write_records`` and read back equal.
* TREC run and qrels readers on random lines: only ``InputFormatError``; what they accept matches
  a naive parse.  ``streameval trec-eval`` in-process on random files: an exit code, never an exception.

A SIGALRM guard fails a test that runs too long instead of blocking the run.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streameval import cli
from streameval.io import records, trec
from streameval.io.avro import AvroInputError, read_blocks, read_records, write_records
from streameval.io.trec import InputFormatError
from .conftest import fail_after

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample" / "impressions" / "letor_feature206.avro"

FUZZ = settings(max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _fail_instead_of_hanging():
    with fail_after(180, "fuzz test"):
        yield


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="streameval-fuzz-") as d:
        yield Path(d)


# ---------------------------------------------------------------------------
# Avro


def _blocks_of(data: bytes):
    return [list(b) for b in fastavro.block_reader(io.BytesIO(data))]


@pytest.fixture(scope="module")
def real_files(workdir):
    """The LETOR sample as is (one deflate block) and re-blocked small (null and deflate)."""
    recs = list(read_records(SAMPLE))[:150]
    out = {"sample": SAMPLE.read_bytes()}
    for codec in ("null", "deflate"):
        p = workdir / f"real-{codec}.avro"
        write_records(p, "impression", recs, codec=codec, sync_interval=1200)
        out[codec] = p.read_bytes()
    return {k: (v, list(read_blocks(_write_bytes(workdir / f"orig-{k}.avro", v)))) for k, v in out.items()}


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _consume(fn, path, name):
    got = []
    try:
        for item in fn(str(path), name):
            got.append(item)
    except AvroInputError as e:
        assert e.path == str(path)
        assert isinstance(e.reason, str) and e.reason and "\n" not in str(e)
        return got, e
    return got, None


def _check_reader_outcome(path: Path):
    for name in (None, "impression"):
        blocks, err = _consume(read_blocks, path, name)
        if err is not None:
            assert err.records_read == sum(len(b) for b in blocks)
        recs, err = _consume(read_records, path, name)
        if err is not None:
            assert err.records_read == len(recs)


@FUZZ
@given(data=st.binary(max_size=600), magic=st.booleans())
def test_random_bytes_only_avro_input_error(workdir, data, magic):
    path = _write_bytes(workdir / "random.avro", (b"Obj\x01" if magic else b"") + data)
    _check_reader_outcome(path)


@st.composite
def _mutations(draw):
    kind = draw(st.sampled_from(["sample", "null", "deflate"]))
    edits = draw(st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=4))
    cut = draw(st.none() | st.floats(0, 1))
    splice = draw(st.none() | st.tuples(st.floats(0, 1), st.binary(min_size=1, max_size=8)))
    return kind, edits, cut, splice


@settings(FUZZ, max_examples=80)
@given(mutation=_mutations())
def test_mutated_real_files_only_avro_input_error(workdir, real_files, mutation):
    kind, edits, cut, splice = mutation
    data, orig_blocks = real_files[kind]
    damaged = bytearray(data)
    first = len(damaged)  # first damaged byte
    for where, value in edits:
        pos = int(where * len(damaged))
        if damaged[pos] != value:
            damaged[pos] = value
            first = min(first, pos)
    if splice is not None:
        pos = int(splice[0] * len(damaged))
        damaged[pos:pos] = splice[1]
        first = min(first, pos)
    if cut is not None:
        n = int(cut * len(damaged))
        del damaged[n:]
        first = min(first, n)
    path = _write_bytes(workdir / "mutated.avro", bytes(damaged))
    _check_reader_outcome(path)
    # blocks wholly before the first damaged byte come out unchanged
    layout = list(fastavro.block_reader(io.BytesIO(data)))
    intact = sum(1 for b in layout if b.offset + b.size <= first) if first >= layout[0].offset else 0
    got, err = _consume(read_blocks, path, None)
    if first >= layout[0].offset:
        assert got[:intact] == orig_blocks[:intact]
        assert len(got) >= intact
    if first == len(data) and len(damaged) == len(data):
        assert err is None and got == orig_blocks


# ---------------------------------------------------------------------------
# records: validation, then the Avro round trip


_text = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udcff", "\U0001f600", "\x00"])  # lone surrogates too
_junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    _text, st.binary(max_size=4), st.lists(st.integers(), max_size=2), st.dictionaries(_text, _text, max_size=2),
    st.integers(-(2**31), 2**31).map(np.int64), st.floats(width=32).map(np.float32), st.just(np.bool_(True)),
)

_good_impression = {
    "event_id": _text, "request_id": _text, "query_id": _text, "user_id": st.none() | _text,
    "system_id": _text, "item_id": _text, "position": st.integers(-3, 2**31 + 3),
    "score": st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**64), 2**64),
    "clicked": st.none() | st.booleans() | st.integers(-1, 2),
    "timestamp": st.integers(-(2**64), 2**64),
    "propensity": st.none() | st.floats(-0.5, 1.5) | st.integers(0, 2),
    "attributes": st.dictionaries(_text, _text, max_size=3),
    "dwell_ms": st.none() | st.integers(-3, 2**63 + 3),
}
_good_judgment = {
    "query_id": _text, "item_id": _text, "grade": st.integers(-(2**32), 2**32),
    "timestamp": st.integers(-(2**64), 2**64), "source": _text,
}


@st.composite
def _record(draw, fields):
    rec = {}
    for name, good in fields.items():
        choice = draw(st.integers(0, 9))
        if choice == 0:
            continue  # missing
        rec[name] = draw(_junk) if choice == 1 else draw(good)
    if draw(st.integers(0, 19)) == 0:
        rec["unexpected"] = draw(_junk)
    return rec


def _expected(rec: dict, schema: str) -> dict:
    """What reading back a written record gives: defaults filled, 0/1 clicks as bools, numbers as floats."""
    if schema == "judgment":
        out = {"timestamp": 0, "source": "", "subtopic": None}
        out.update({k: rec[k] for k in ("query_id", "item_id", "grade", "timestamp", "source", "subtopic") if k in rec})
        out["grade"] = int(out["grade"])
        out["timestamp"] = int(out["timestamp"] if out["timestamp"] is not None else 0)
        if out["source"] is None:
            out["source"] = ""
        return out
    out = {"user_id": None, "score": None, "clicked": None, "propensity": None, "attributes": {}, "dwell_ms": None}
    out.update({k: v for k, v in rec.items() if k != "unexpected"})
    for k in ("position", "timestamp"):
        out[k] = int(out[k])
    if out["dwell_ms"] is not None:
        out["dwell_ms"] = int(out["dwell_ms"])
    for k in ("score", "propensity"):
        if out[k] is not None:
            out[k] = float(out[k])
    if out["clicked"] is not None:
        out["clicked"] = bool(out["clicked"])
    return out


#: an accepted record of each schema, so that every run checks the round trip (random records are
#: rarely accepted: the CI run of 2026-12-05 met the first one after the schema gained dwell_ms)
_ACCEPTED_IMPRESSION = {"event_id": "e", "request_id": "r", "query_id": "q", "system_id": "s", "item_id": "i",
                        "position": 1, "timestamp": 0, "clicked": True, "dwell_ms": 1500}
_ACCEPTED_JUDGMENT = {"query_id": "q", "item_id": "i", "grade": 2}


@settings(FUZZ, max_examples=150)
@given(imps=st.lists(_record(_good_impression), max_size=6), judgments=st.lists(_record(_good_judgment), max_size=6))
@example(imps=[_ACCEPTED_IMPRESSION, {"unexpected": None},
               {k: v for k, v in _ACCEPTED_IMPRESSION.items() if k not in ("clicked", "dwell_ms")}],
         judgments=[_ACCEPTED_JUDGMENT])
def test_checks_never_raise_and_accepted_records_round_trip(workdir, imps, judgments):
    for recs, check, schema in ((imps, records.check_impression, "impression"),
                                (judgments, records.check_judgment, "judgment")):
        accepted = []
        for rec in recs:
            reason = check(rec)
            assert reason is None or (isinstance(reason, str) and reason)
            if reason is None:
                accepted.append(rec)
        path = workdir / f"round-{schema}.avro"
        assert write_records(path, schema, accepted) == len(accepted)
        back = list(read_records(path, schema))
        assert back == [_expected(r, schema) for r in accepted]
        assert all(check(r) is None for r in back)


def test_check_rejects_what_cannot_be_written():
    base = {"event_id": "e", "request_id": "r", "query_id": "q", "system_id": "s", "item_id": "i",
            "position": 1, "timestamp": 0}
    assert records.check_impression(base) is None
    assert records.check_impression(dict(base, score=10**400)).startswith("score does not fit a double: 1000")
    assert records.check_impression(dict(base, item_id="a\ud800")) == (
        "item_id is not valid Unicode (lone surrogate): 'a\\ud800'")
    assert records.check_impression(dict(base, attributes={"k": "\udcff"})).startswith(
        "attributes are not valid Unicode")
    assert records.check_judgment({"query_id": "\ud83d", "item_id": "d", "grade": 1}).startswith(
        "query_id is not valid Unicode")
    # what the checks accept, write_records writes: 0/1 clicks, null judgment timestamp and source
    accepted = [dict(base, clicked=1), dict(base, clicked=np.bool_(False)), dict(base, clicked=None)]
    assert all(records.check_impression(r) is None for r in accepted)


# ---------------------------------------------------------------------------
# TREC readers and the trec-eval command


_token = st.one_of(
    # no "\n" and no "\r" inside a token: a random line stays one line (the tests locate it by its line
    # number; a CR alone ends a line, as universal newlines and pytrec_eval read it: tests/test_io_reliability)
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1,
            max_size=6),
    st.sampled_from(["q1", "q2", "Q0", "d1", "d2", "0", "1", "2", "-1", "1.5", "nan", "inf", "-inf", "1e400",
                     "#", "1_0", "0x10", "+3", "", "\x00", "\t", "\x0b"]),
    st.integers(-(10**20), 10**20).map(str),
    st.floats().map(repr),
)
_line = st.lists(_token, max_size=8).map(" ".join)
_good_run_line = st.builds(lambda q, d, r, s: f"{q} Q0 {d} {r} {s} tag", st.sampled_from(["q1", "q2", "q3"]),
                           st.sampled_from(["d1", "d2", "d3", "d4"]), st.integers(0, 9), st.floats(-5, 5))
_good_qrels_line = st.builds(lambda q, d, g: f"{q} 0 {d} {g}", st.sampled_from(["q1", "q2", "q4"]),
                             st.sampled_from(["d1", "d2", "d3", "d5"]), st.integers(-1, 3))


def _text_file(lines, newline):
    return newline.join(lines) + (newline if lines and len(lines) % 2 else "")


def _naive_rows(data: bytes, ncols: int):
    rows = []
    for raw in data.split(b"\n"):
        head = raw.lstrip(b" \t\r\x0b\x0c")
        if head and not head.startswith(b"#"):
            rows.append(raw.split())
    return rows


@settings(FUZZ, max_examples=150)
@given(lines=st.lists(st.one_of(_line, _good_run_line, _good_qrels_line), max_size=12),
       newline=st.sampled_from(["\n", "\r\n"]), check=st.booleans())
def test_trec_readers_only_input_format_error(workdir, lines, newline, check):
    path = workdir / "fuzz.trec"
    data = _text_file(lines, newline).encode("utf-8", "surrogatepass")
    path.write_bytes(data)
    for read, ncols in ((trec.read_run, 6), (trec.read_qrels, 4)):
        try:
            got = read(path, check=check)
        except InputFormatError as e:
            assert e.path == str(path) and "\n" not in str(e)
            if e.lineno is not None:
                assert 1 <= e.lineno <= data.count(b"\n") + 1
            continue
        rows = _naive_rows(data, ncols)
        assert len(got) == len(rows)
        assert got.qid.tolist() == [r[0].decode() for r in rows]
        assert got.docno.tolist() == [r[2].decode() for r in rows]
        if read is trec.read_run:
            assert [float(r[4]) for r in rows] == pytest.approx(got.score.tolist(), nan_ok=True, rel=0, abs=0)
            if check:
                assert np.isfinite(got.score).all()
        else:
            assert got.grade.tolist() == [int(r[3]) for r in rows]


def _key(line: str):
    return tuple(line.split()[:3:2])  # (qid, docno)


@st.composite
def _trec_file(draw, good):
    """Well-formed lines (no (qid, docno) twice), and half the time one random line put among them."""
    lines = draw(st.lists(good, max_size=10, unique_by=_key))
    bad = None
    if draw(st.booleans()):
        bad = draw(st.integers(0, len(lines)))
        lines.insert(bad, draw(_line))
    return lines, bad


@settings(FUZZ, max_examples=80)
@given(run=_trec_file(_good_run_line), qrels=_trec_file(_good_qrels_line),
       measures=st.lists(st.sampled_from(["map", "P.5", "ndcg_cut.10", "all_trec", "err@5", "bpref", "bogus"]),
                         max_size=2),
       flags=st.lists(st.sampled_from(["-q", "-c", "-l2", "-M2", "--gain=exponential"]), unique=True))
def test_trec_eval_command_returns_an_exit_code(workdir, run, qrels, measures, flags):
    (run_lines, run_bad), (qrels_lines, qrels_bad) = run, qrels
    run_path = workdir / "cli.run"
    qrels_path = workdir / "cli.qrels"
    run_path.write_bytes(_text_file(run_lines, "\n").encode("utf-8", "surrogatepass"))
    qrels_path.write_bytes(_text_file(qrels_lines, "\n").encode("utf-8", "surrogatepass"))
    argv = ["trec-eval", *flags, *[a for m in measures for a in ("-m", m)], str(qrels_path), str(run_path)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert code in (0, 1, 2)
    message = err.getvalue()
    assert "Traceback" not in message
    if code == 0:
        assert message == ""
        for line in out.getvalue().splitlines():
            name, qid, value = line.split("\t")
            if name.strip() != "runid" and not name.startswith("relstring"):  # relstring: a quoted string
                float(value)
        return
    assert len(message.splitlines()) == 1 and message.startswith("streameval trec-eval: ")
    text = message[len("streameval trec-eval: "):]
    if code == 1:
        assert text.strip() == "no queries with both results and judgments"
        return
    if "bogus" in measures:
        return
    # a malformed or empty file, located; the well-formed files are never refused
    path, rest = (run_path, run_bad) if text.startswith(str(run_path)) else (qrels_path, qrels_bad)
    assert text.startswith(str(path)), text
    if rest is None:
        assert text.startswith(f"{path}: empty"), text  # only whole-file problems
    else:
        where = text[len(str(path)):].split(":")[1]
        if where.strip().isdigit():
            # the line put in (or, when it repeats a good line's document, the good line naming it)
            assert int(where) == rest + 1 or f"line {rest + 1})" in text or f"line {rest + 1}:" in text, (text, rest)
