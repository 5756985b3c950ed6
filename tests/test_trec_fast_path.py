"""The fast path of the TREC readers (regular ASCII files scanned a chunk of lines at a time,
numbers parsed with vectorised digit arithmetic, ids kept as bytes for ``trec-eval``) against
independent references: Python's ``float()`` / ``int()`` on the same tokens, the general reader
(``_Tokens`` and its column parsers), and ``sorted()`` for the order of the id codes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streameval import cli
from streameval.io import trec
from streameval.metrics import grouped

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.function_scoped_fixture])


def _general_run(data: bytes, path="x.run"):
    tok = trec._Tokens(data, path, 6, trec.RUN_COLUMNS, allow_extra=True)
    return (trec._strings(tok, 0, "qid"), trec._strings(tok, 2, "docno"), trec._parse_ints(tok, 3, "rank"),
            trec._parse_floats(tok, 4, "score"))


def _same_floats(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    # bit for bit (also -0.0 and NaN)
    assert got.view(np.int64).tolist() == want.view(np.int64).tolist() or \
        all((np.isnan(a) and np.isnan(b)) or (a == b and np.signbit(a) == np.signbit(b))
            for a, b in zip(got.tolist(), want.tolist()))


# ---------------------------------------------------------------------------------------------
# numbers against float() / int()

_digits = st.text("0123456789", min_size=0, max_size=25)


@st.composite
def _decimal(draw):
    """Decimal strings as runs write them and more: signs, leading zeros, many digits, a dot at
    either end, exponents, inf/nan."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(["inf", "-inf", "nan", "Infinity", "-0", "+0", "0.0", "-0.0", "1e5",
                                     "1E-5", "-2.5e+3", "9007199254740993", "0.30000000000000004"]))
    if kind == 1:  # a float's shortest repr
        return repr(draw(st.floats(allow_nan=False, allow_infinity=False)))
    sign = draw(st.sampled_from(["", "", "-", "+"]))
    whole, frac = draw(_digits), draw(_digits)
    if not whole and not frac:
        whole = "0"
    text = sign + whole + ("." + frac if frac or draw(st.booleans()) else "")
    if kind == 2:
        text += draw(st.sampled_from(["e", "E"])) + draw(st.sampled_from(["", "-", "+"])) + str(draw(st.integers(0, 40)))
    return text


def _words(tokens: list[bytes]):
    """Tokens laid out as the fast reader gathers them (one per line, 8-byte slack after)."""
    data = b"".join(t + b"\n" for t in tokens)
    ext = np.zeros(len(data) + trec._FAST_SLACK, dtype=np.uint8)
    ext[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])).astype(np.int64)
    return trec._words(ext, starts, lengths), lengths


@SETTINGS
@given(st.lists(_decimal(), min_size=1, max_size=40))
def test_fast_floats_equal_python_float(tokens):
    words, lengths = _words([t.encode() for t in tokens])
    out = np.empty(len(tokens))
    assert trec._fast_floats(words, lengths, out)
    _same_floats(out, [float(t) for t in tokens])


@SETTINGS
@given(st.lists(st.one_of(st.integers(-10**18 + 1, 10**18 - 1).map(str),
                          st.builds(lambda s, z, d: s + "0" * z + d, st.sampled_from(["", "-", "+"]),
                                    st.integers(0, 5), st.text("0123456789", min_size=1, max_size=12))),
                min_size=1, max_size=40))
def test_fast_ints_equal_python_int(tokens):
    words, lengths = _words([t.encode() for t in tokens])
    ok, mant, _, neg = trec._fast_decimal(words, lengths, False)
    digits = [sum(ch.isdigit() for ch in t) for t in tokens]
    assert ok.tolist() == [1 <= n <= 18 for n in digits]
    got = np.where(neg, -mant, mant)
    assert [g for g, k in zip(got.tolist(), ok.tolist()) if k] == [int(t) for t, k in zip(tokens, ok.tolist()) if k]


@pytest.mark.parametrize("token", ["abc", "1.2.3", "1_5", "-", "+", ".", "1-", "--1", "0x10", "1e", "e5", "--5"])
def test_fast_floats_refuse_what_is_not_a_number(token):
    words, lengths = _words([b"1.5", token.encode()])
    assert not trec._fast_floats(words, lengths, np.empty(2))


@pytest.mark.parametrize("token", ["1.0", "two", "-", "+", "1e3", "1_0", "12345678901234567890"])
def test_fast_ints_refuse_what_is_not_an_integer(token):
    words, lengths = _words([b"7", token.encode()])
    ok, _, _, _ = trec._fast_decimal(words, lengths, False)
    assert ok.tolist() == [True, False]


# ---------------------------------------------------------------------------------------------
# whole files against the general reader


_id = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/", min_size=1, max_size=30)
_sep = st.sampled_from([" ", "\t"])


@st.composite
def _run_text(draw):
    rows = draw(st.lists(st.tuples(_id, _id, st.integers(-5, 10**6), _decimal(), _id), min_size=1, max_size=30))
    seps = draw(st.lists(_sep, min_size=5, max_size=5))
    lines = [seps[0].join([q, "Q0"]) + seps[1] + d + seps[2] + str(r) + seps[3] + s + seps[4] + t
             for q, d, r, s, t in rows]
    return "\n".join(lines) + draw(st.sampled_from(["\n", ""]))


@SETTINGS
@given(text=_run_text(), chunk=st.sampled_from([16, 64, 1 << 20]))
def test_fast_run_equals_the_general_reader(monkeypatch, text, chunk):
    monkeypatch.setattr(trec, "_FAST_CHUNK", chunk)  # many chunks: boundaries, wider tokens later
    data = text.encode()
    fast = trec._fast_table(data, 6, trec._RUN_KINDS)
    assert fast is not None
    qid, docno, rank, score = _general_run(data)
    assert trec._ascii_str(fast[0], fast[0, "width"]).tolist() == qid.tolist()
    assert trec._ascii_str(fast[2], fast[2, "width"]).tolist() == docno.tolist()
    assert fast[0].tolist() == [q.encode() for q in qid.tolist()]  # bytes ids: the same ids
    assert fast[3].tolist() == rank.tolist()
    _same_floats(fast[4], score)
    tokens = [line.split() for line in text.splitlines()]
    _same_floats(fast[4], [float(t[4]) for t in tokens])
    assert fast[5] == tokens[0][5].encode()
    assert trec._fast_table(data, 6, trec._RUN_KINDS_EVAL)[3] is None


@pytest.mark.parametrize("text", [
    "q1 Q0 d1 1 1.5 t\n\nq1 Q0 d2 2 1.0 t\n",  # blank line
    "q1 Q0 d1 1 1.5 t\r\nq1 Q0 d2 2 1.0 t\r\n",  # CRLF
    "q1  Q0 d1 1 1.5 t\n",  # two separators
    " q1 Q0 d1 1 1.5 t\n",  # leading blank
    "q1 Q0 d1 1 1.5 t \n",  # trailing blank
    "# comment\nq1 Q0 d1 1 1.5 t\n",
    "q1 Q0 d1 1 1.5 t extra\n",  # a 7th column (trec_eval ignores it; the general reader decides)
    "q1 Q0 d1 1 1.5\n",  # 5 columns
    "q1 Q0 d\xe9 1 1.5 t\n",  # not ASCII
    "q1 Q0 d\x001 1 1.5 t\n",  # NUL
    "q1 Q0 d\x0b1 1 1.5 t\n",  # vertical tab
    "q1 Q0 d1 1 abc t\n",  # not a number
    "q1 Q0 d1 x 1.5 t\n",  # rank not an integer
    "q1 Q0 d1 1 1_5 t\n",
    "",
    "q1 Q0 " + "d" * 300 + " 1 1.5 t\n",  # a token longer than the fast path gathers
])
def test_irregular_files_go_to_the_general_reader(tmp_path, text):
    data = text.encode("utf-8")
    assert trec._fast_table(data, 6, trec._RUN_KINDS) is None
    assert trec._fast_table(data, 6, trec._RUN_KINDS_EVAL) is None
    p = tmp_path / "x.run"
    p.write_bytes(data)
    try:
        want = trec.read_run(p)
    except trec.InputFormatError as e:
        with pytest.raises(trec.InputFormatError) as info:
            trec._read_for_eval(p, p)
        assert str(info.value) == str(e)
        return
    got, _ = _read_for_eval_run_only(p)
    assert got.qid.dtype.kind == "U"  # the general reader: str ids, ranks kept
    assert got.qid.tolist() == want.qid.tolist() and got.rank.tolist() == want.rank.tolist()


def _read_for_eval_run_only(p):
    q = p.parent / "ok.qrels"
    q.write_text("q 0 d 1\n")
    return trec._read_for_eval(p, q)


def test_read_for_eval_keeps_bytes_ids_and_checks_ranks(tmp_path):
    run = tmp_path / "r.run"
    run.write_text("q1 Q0 d10 1 2.5 tag\nq1 Q0 d9 2 2.5 tag\nq2 Q0 d1 1 -1e-3 tag\n")
    qrels = tmp_path / "q.qrels"
    qrels.write_text("q1 0 d9 1\nq2 0 d1 -1\nq2 0 d3 +2\n")
    r, j = trec._read_for_eval(run, qrels)
    assert r.qid.dtype.kind == "S" and r.docno.dtype.kind == "S" and r.rank is None and r.tag == "tag"
    assert np.asarray(r.qid).tolist() == [b"q1", b"q1", b"q2"] and r.docno.tolist() == [b"d10", b"d9", b"d1"]
    assert r.score.tolist() == [2.5, 2.5, -1e-3]
    assert j.qid.tolist() == [b"q1", b"q2", b"q2"] and j.grade.tolist() == [1, -1, 2]
    run.write_text("q1 Q0 d10 1 2.5 tag\nq1 Q0 d9 2.0 2.5 tag\n")
    with pytest.raises(trec.InputFormatError, match=r"r.run:2: rank is not an integer: '2.0'"):
        trec._read_for_eval(run, qrels)


def test_last_line_without_newline_and_line_longer_than_a_chunk(monkeypatch):
    monkeypatch.setattr(trec, "_FAST_CHUNK", 8)
    data = b"q1 Q0 " + b"d" * 40 + b" 1 0.25 t\nq2 Q0 d 2 0.5 t"
    fast = trec._fast_table(data, 6, trec._RUN_KINDS)
    assert fast[2].tolist() == [b"d" * 40, b"d"] and fast[4].tolist() == [0.25, 0.5]


# ---------------------------------------------------------------------------------------------
# the trec-eval command: bytes ids give the output and the errors of str ids


def _trec_eval(argv):
    out = io.StringIO()
    code = cli.trec_eval_main(argv, out=out)
    return code, out.getvalue()


@SETTINGS
@given(text=_run_text(), data=st.data())
def test_trec_eval_same_output_with_bytes_and_str_ids(tmp_path_factory, monkeypatch, text, data):
    d = tmp_path_factory.mktemp("te")
    lines = [ln.split() for ln in text.splitlines()]
    seen, uniq = set(), []
    for t in lines:
        if (t[0], t[2]) not in seen:
            seen.add((t[0], t[2]))
            uniq.append(" ".join(t[:4] + [str(abs(float(t[4]))) if np.isfinite(float(t[4])) else "1.0"] + t[5:]))
    (d / "r.run").write_text("\n".join(uniq) + "\n")
    judged = data.draw(st.lists(st.sampled_from(sorted(seen)), max_size=10, unique=True))
    (d / "q.qrels").write_text("".join(f"{q} 0 {doc} {data.draw(st.integers(-1, 3))}\n" for q, doc in judged)
                               or "zz 0 zz 1\n")
    argv = ["-q", "-m", "all_trec", str(d / "q.qrels"), str(d / "r.run")]
    fast = _trec_eval(argv)
    monkeypatch.setattr(trec, "_read_for_eval", lambda r, q: (trec.read_run(r), trec.read_qrels(q)))
    assert _trec_eval(argv) == fast


# ---------------------------------------------------------------------------------------------
# id codes: bytes and str, byte ranges and byte tables


@SETTINGS
@given(st.lists(st.text("ab-Z09~", max_size=9), min_size=1, max_size=60), st.integers(1, 59))
def test_codes_of_bytes_ids_order_as_the_ids(words, cut):
    cut = min(cut, len(words))
    a = np.array([w.encode() for w in words[:cut]], dtype="S16")  # zero-padded, as the reader makes them
    b = np.array([w.encode() for w in words[cut:]] or [b""], dtype="S9")
    ca, cb = grouped._ascii_codes(a, b)
    ids = [bytes(x) for x in a.tolist()] + [bytes(x) for x in b.tolist()]
    codes = np.concatenate((ca, cb)).tolist()
    # equal ids, equal codes; codes order as the ids (sorted() on bytes: strcmp)
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (codes[i] < codes[j]) == (ids[i] < ids[j]) and (codes[i] == codes[j]) == (ids[i] == ids[j])
    su = grouped._ascii_codes(np.array(words[:cut]), np.array(words[cut:] or [""]))
    assert [np.argsort(x, kind="stable").tolist() for x in su] == [np.argsort(x, kind="stable").tolist()
                                                                   for x in (ca, cb)]


def test_codes_fall_back_to_the_bytes_that_occur():
    # positions whose byte range needs 7 bits but only 2 bytes occur: 20 positions fit only by table
    rng = np.random.default_rng(1)
    ids = np.array(["".join(rng.choice(["0", "z"], size=20)) for _ in range(300)])
    (codes,) = grouped._ascii_codes(ids)
    order = np.argsort(ids, kind="stable")
    assert np.all(np.diff(codes[order]) >= 0)
    assert len(np.unique(codes)) == len(np.unique(ids))
    assert grouped._ascii_codes(ids.astype("S")) is not None


# ---------------------------------------------------------------------------------------------
# the run's qid column as runs of equal qids


@SETTINGS
@given(qids=st.lists(st.sampled_from(["q1", "q2", "q10", "query-long-name-3"]), min_size=1, max_size=40),
       chunk=st.sampled_from([16, 40, 1 << 20]))
def test_qid_runs_lay_out_as_the_column(monkeypatch, qids, chunk):
    monkeypatch.setattr(trec, "_FAST_CHUNK", chunk)  # runs that go on across chunks
    data = "".join(f"{q} Q0 d{i} {i} {1.0 / (i + 1)!r} t\n" for i, q in enumerate(qids)).encode()
    fast = trec._fast_table(data, 6, trec._RUN_KINDS_EVAL)
    runs = fast[0]
    assert len(runs) == len(qids) and runs.dtype.kind == "S"
    assert np.asarray(runs).tolist() == [q.encode() for q in qids]
    values, lengths, starts = runs.blocks()
    assert all(values[1:] != values[:-1])  # maximal runs
    assert np.repeat(values, lengths).tolist() == [q.encode() for q in qids]
    assert starts.tolist() == np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
    assert fast[0, "width"] == max(len(q) for q in qids)


def test_prepare_on_qid_runs_equals_prepare_on_the_column(tmp_path):
    from streameval.metrics.prepare import prepare

    # q1 split in two places (not contiguous): the general path, which lays the column out
    for text in ("q1 Q0 a 1 3 t\nq1 Q0 b 2 2 t\nq2 Q0 a 1 5 t\n",
                 "q1 Q0 a 1 3 t\nq2 Q0 a 1 5 t\nq1 Q0 b 2 2 t\n"):
        (tmp_path / "r.run").write_text(text)
        (tmp_path / "q.qrels").write_text("q1 0 b 1\nq2 0 a 2\nq1 0 a 0\n")
        run, qrels = trec._read_for_eval(tmp_path / "r.run", tmp_path / "q.qrels")
        assert hasattr(run.qid, "blocks")
        args = (run.docno, run.score, qrels.qid, qrels.docno, qrels.grade)
        a, b = prepare(run.qid, *args), prepare(np.asarray(run.qid), *args)
        assert a.qids.tolist() == b.qids.tolist() == [b"q1", b"q2"]
        for name in ("offsets", "grades", "judged_offsets", "judged_values", "judged_counts"):
            np.testing.assert_array_equal(getattr(a.lists, name), getattr(b.lists, name))


@SETTINGS
@given(frac=st.integers(1, 7), data=st.data())
def test_fixed_decimals_equal_python_float(frac, data):
    # scores as runs print them (%.{frac}f), which the SWAR path reads; float() the reference
    whole = st.text("0123456789", min_size=0, max_size=7 - frac)
    tokens = [data.draw(whole) + "." + data.draw(st.text("0123456789", min_size=frac, max_size=frac))
              for _ in range(data.draw(st.integers(1, 30)))]
    words, lengths = _words([t.encode() for t in tokens])
    assert trec._fixed_decimals(words, lengths) is not None
    out = np.empty(len(tokens))
    assert trec._fast_floats(words, lengths, out)
    _same_floats(out, [float(t) for t in tokens])


@pytest.mark.parametrize("tokens", [["0.5", "0.25"], ["1.5", "-1.5"], ["1.5", "1e5"], ["0.123456789"], ["1.5", "1.x"],
                                    ["15", "1.5"], ["1.5", "2"], ["1.5", "1..5"], ["1.5", ".5."], ["1.5", "+1.5"]])
def test_fixed_decimals_leave_other_tokens_to_the_general_path(tokens):
    words, lengths = _words([t.encode() for t in tokens])
    assert trec._fixed_decimals(words, lengths) is None
    out = np.empty(len(tokens))
    if trec._fast_floats(words, lengths, out):
        _same_floats(out, [float(t) for t in tokens])


@SETTINGS
@given(st.lists(st.text("0123456789", min_size=1, max_size=8), min_size=1, max_size=30))
def test_small_uints_equal_python_int(tokens):
    words, lengths = _words([t.encode() for t in tokens])
    got = trec._small_uints(words, lengths)
    assert got is not None and got.tolist() == [int(t) for t in tokens]


@pytest.mark.parametrize("tokens", [["1", "-1"], ["1", "+2"], ["123456789"], ["1", "1.0"], ["1", "a"], ["1", "1e3"],
                                    ["12", ":"], ["12", "/"]])
def test_small_uints_leave_other_tokens_to_the_general_path(tokens):
    words, lengths = _words([t.encode() for t in tokens])
    assert trec._small_uints(words, lengths) is None


def test_trec_eval_imports_no_avro_or_arrow():
    """``streameval trec-eval`` on TREC files, in a fresh interpreter, imports neither fastavro nor the
    Avro, converter and record modules (streameval.io's names are imported on first use), nor pyarrow
    or Beam; the package's names still resolve."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    data = Path(__file__).parent / "data" / "trec_eval_test"
    code = ("import io, sys; from streameval import cli; "
            f"rc = cli.main(['trec-eval', {str(data / 'qrels.test')!r}, {str(data / 'results.test')!r}]); "
            "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('fastavro', 'pyarrow', 'apache_beam') "
            "or m in ('streameval.io.avro', 'streameval.io.convert', 'streameval.io.records')))")
    root = str(Path(__file__).parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=root)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout[-300:] + out.stderr
    import streameval.io as sio

    assert sio.read_records.__module__ == "streameval.io.avro" and sio.TrecRun is trec.TrecRun
    assert set(sio.__all__) <= set(dir(sio))
