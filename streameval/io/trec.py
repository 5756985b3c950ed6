"""TREC run and qrels files, parsed into numpy arrays.

Formats (whitespace-separated columns, one record per line, blank lines
skipped, as read by trec_eval):

* run:   ``qid Q0 docno rank score tag`` (6 columns, further tokens ignored
  as trec_eval does; the ``Q0`` column is ignored, so is ``rank`` by
  trec_eval, which orders a query's documents by score descending, ties by
  docno descending);
* qrels: ``qid iter docno grade`` (4 columns; ``iter`` is ignored; grade is
  an integer, negative = in the pool but unjudged).

Speed: the readers never loop over lines in Python.  Regular files (ASCII,
one space or tab between tokens, nothing else on a line; :func:`_fast_table`)
are mapped (mmap) and read a chunk of whole lines at a time, on two threads:
separators found with numpy, each token gathered as 8-byte words, numbers
parsed with vectorised digit arithmetic (scores printed with a fixed number
of decimals and small integers 8 bytes at a time; other decimals of up to 18
digits as the exact ``mantissa / 10**k`` when the mantissa is at most 2**53;
anything else, such as exponents, ``inf`` or ``nan``, through numpy's
string-to-float cast).  Any other file goes through the general reader
(:class:`_Tokens`: token boundaries with numpy on the whole file, every line
checked to have the right number of tokens), which also reports the errors.
``streameval trec-eval`` reads with :func:`_read_for_eval`: ids stay bytes
and the run's rank column is checked, not kept.
Errors report the file name, the 1-based line number and the line
(:class:`TrecFormatError`, an :class:`InputFormatError`, which the other text
readers in :mod:`streameval.io.convert` raise too).  Problems that the format
allows but an evaluation does not (``nan``/``inf`` scores, a document ranked or
judged twice) are found with numpy by :func:`check_run` / :func:`check_qrels`
(``check=True``), and only then is the file rescanned in Python for the line.  Lines whose first non-blank character is ``#``
are comments and skipped, as in trec_eval.

Files ending in ``.gz`` are decompressed transparently.
"""

from __future__ import annotations

import gzip
import os
import re
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .repeats import first_repeat

__all__ = [
    "InputFormatError",
    "TrecFormatError",
    "TrecRun",
    "TrecQrels",
    "read_run",
    "read_qrels",
    "check_run",
    "check_qrels",
    "write_run",
    "write_qrels",
    "run_from_dict",
    "qrels_from_dict",
    "run_to_dict",
    "qrels_to_dict",
    "trec_order",
]

PathLike = Union[str, os.PathLike]

RUN_COLUMNS = ("qid", "Q0", "docno", "rank", "score", "tag")
QRELS_COLUMNS = ("qid", "iter", "docno", "grade")

# A column whose longest token is longer than this is gathered with a Python
# loop instead of a (tokens x width) byte matrix, to bound memory.
_MAX_MATRIX_WIDTH = 256
_POW10_FLOAT = 10.0 ** np.arange(23)
_MAX_EXACT_MANTISSA = 2**53


_MAX_LINE_SHOWN = 100


def _shorten(line: str, limit: int = _MAX_LINE_SHOWN) -> str:
    line = line.rstrip("\r\n")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class InputFormatError(ValueError):
    """A malformed line of a text input file (TREC run or qrels, CSV, LETOR, click log).

    Attributes: ``path`` (str), ``lineno`` (1-based line number, or ``None``
    when the problem is the file as a whole, e.g. an empty file), ``reason``
    (what is wrong) and ``line`` (the offending line, shortened to 100
    characters, or ``None``).  ``str(error)`` is
    ``"path:lineno: reason: 'line'"`` (``repr`` of the line, so the message is
    always one line); without a line number, ``"path: reason"``.
    """

    def __init__(self, path, lineno: int | None, reason: str, line: str | None = None):
        self.path = str(path)
        self.lineno = None if lineno is None else int(lineno)
        self.reason = str(reason)
        self.line = None if line is None else _shorten(str(line))
        where = self.path if self.lineno is None else f"{self.path}:{self.lineno}"
        text = f"{where}: {self.reason}"
        if self.line is not None:
            text += f": {self.line!r}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.path, self.lineno, self.reason, self.line))


class TrecFormatError(InputFormatError):
    """Malformed TREC run or qrels input (an :class:`InputFormatError`).  ``path`` and ``lineno`` locate it."""

    def __init__(self, path, lineno: int | None, message: str, line: str | None = None):
        super().__init__(path, lineno, message, line)


def _str_array(values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind != "U":
        if arr.size == 0:
            return np.zeros(0, dtype="U1")
        arr = arr.astype(str)
    return arr


@dataclass(eq=False)
class TrecRun:
    """A TREC run as parallel arrays, one entry per line of the run file.

    ``qid``/``docno`` are numpy ``str`` arrays, ``score`` float64, ``rank``
    int64 (the file's rank column; trec_eval ignores it), ``tag`` the run tag
    of the first line (a run mixing tags keeps the first).
    """

    qid: np.ndarray
    docno: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    tag: str = "run"

    def __post_init__(self) -> None:
        self.qid = _str_array(self.qid)
        self.docno = _str_array(self.docno)
        self.score = np.asarray(self.score, dtype=np.float64)
        self.rank = np.asarray(self.rank, dtype=np.int64)
        n = len(self.qid)
        if not (len(self.docno) == len(self.score) == len(self.rank) == n):
            raise ValueError(
                f"TrecRun arrays differ in length: qid {n}, docno {len(self.docno)}, "
                f"score {len(self.score)}, rank {len(self.rank)}"
            )

    def __len__(self) -> int:
        return len(self.qid)

    def __repr__(self) -> str:
        return f"TrecRun(tag={self.tag!r}, lines={len(self)}, queries={len(np.unique(self.qid))})"


@dataclass(eq=False)
class TrecQrels:
    """TREC relevance judgments as parallel arrays: ``qid``/``docno`` str, ``grade`` int64."""

    qid: np.ndarray
    docno: np.ndarray
    grade: np.ndarray

    def __post_init__(self) -> None:
        self.qid = _str_array(self.qid)
        self.docno = _str_array(self.docno)
        self.grade = np.asarray(self.grade, dtype=np.int64)
        n = len(self.qid)
        if not (len(self.docno) == len(self.grade) == n):
            raise ValueError(
                f"TrecQrels arrays differ in length: qid {n}, docno {len(self.docno)}, grade {len(self.grade)}"
            )

    def __len__(self) -> int:
        return len(self.qid)

    def __repr__(self) -> str:
        return f"TrecQrels(rows={len(self)}, queries={len(np.unique(self.qid))})"


# --------------------------------------------------------------------------
# tokenising


_BOM = b"\xef\xbb\xbf"
_LONE_CR = re.compile(rb"\r(?!\n)")


def _plain_lines(data):
    """``data`` with a leading UTF-8 byte-order mark removed and every line that ends with a CR alone
    (old Mac files) ended with LF, as Python's universal newlines and pytrec_eval read them (a CR
    before LF stays: the readers treat it as trailing space). ``data`` itself when it has neither,
    which is the common case and costs one search for a CR byte."""
    bom = data[:3] == _BOM
    lone_cr = data.find(b"\r") != -1 and _LONE_CR.search(data) is not None
    if not bom and not lone_cr:
        return data
    out = bytes(data[3:] if bom else data)
    return _LONE_CR.sub(b"\n", out) if lone_cr else out


def _read_bytes(path: PathLike) -> bytes:
    p = os.fspath(path)
    if p.endswith(".gz"):
        try:
            with gzip.open(p, "rb") as f:
                return _plain_lines(f.read())
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise InputFormatError(p, None, f"not a readable gzip file ({type(e).__name__}: {e})") from None
    with open(p, "rb") as f:
        return _plain_lines(f.read())


def _line_at(data: bytes, offset: int) -> tuple[int, str]:
    """(1-based line number, text) of the line holding byte ``offset``."""
    lo = data.rfind(b"\n", 0, offset) + 1
    hi = data.find(b"\n", offset)
    if hi < 0:
        hi = len(data)
    return data.count(b"\n", 0, offset) + 1, data[lo:hi].decode("utf-8", errors="replace")


_COMMENT_LINE = re.compile(rb"(?m)^[ \t\r\f\v]*#[^\n]*")


def _blank_comments(data: bytes) -> bytes:
    """Replace comment lines (first non-blank character ``#``) by spaces.

    trec_eval skips such lines; blanking them keeps byte offsets and line
    numbers intact.  Only called when the file contains a ``#``.
    """
    return _COMMENT_LINE.sub(lambda m: b" " * len(m.group()), data)


_SCAN_CHUNK = 1 << 22  # bytes per numpy pass; keeps temporaries cache-sized


def _scan(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token edges and newline positions of a byte buffer.

    Returns ``(edges, newlines)``: ``edges[0::2]`` are token starts,
    ``edges[1::2]`` token ends (exclusive); whitespace is ASCII whitespace as
    ``bytes.split()`` sees it (space, \\t \\n \\v \\f \\r).  Offsets are
    int32 when the buffer is smaller than 2 GiB (halves the memory of the
    largest arrays).
    """
    n = buf.size
    idx_dtype = np.int32 if n < 2**31 - 1 else np.int64
    edge_parts: list[np.ndarray] = []
    nl_parts: list[np.ndarray] = []
    prev_ws = True
    for lo in range(0, n, _SCAN_CHUNK):
        b = buf[lo:lo + _SCAN_CHUNK]
        ws = b == 32
        ws |= (b - np.uint8(9)) < 5
        shifted = np.empty_like(ws)
        shifted[0] = prev_ws
        shifted[1:] = ws[:-1]
        e = np.flatnonzero(ws != shifted)
        if lo:
            e += lo
        edge_parts.append(e.astype(idx_dtype, copy=False))
        nlp = np.flatnonzero(b == 10)
        if lo:
            nlp += lo
        nl_parts.append(nlp.astype(idx_dtype, copy=False))
        prev_ws = bool(ws[-1])
    if not prev_ws:
        edge_parts.append(np.array([n], dtype=idx_dtype))
    if not edge_parts:
        empty = np.zeros(0, dtype=idx_dtype)
        return empty, empty
    return np.concatenate(edge_parts), np.concatenate(nl_parts)


class _Tokens:
    """Token boundaries of a whole file, checked per non-blank line.

    Every non-blank line must have ``ncols`` tokens (at least ``ncols`` when
    ``allow_extra``; the extra tokens are ignored).  Row ``r`` is the r-th
    non-blank line.
    """

    def __init__(self, data: bytes, path: str, ncols: int, columns: tuple[str, ...], allow_extra: bool = False):
        nul = data.find(b"\x00")
        if nul >= 0:
            # numpy's fixed-width strings drop trailing NULs: refuse rather than alter ids
            lineno, text = _line_at(data, nul)
            raise TrecFormatError(path, lineno, "NUL byte in the line (binary data?)", text)
        if b"#" in data:
            data = _blank_comments(data)
        self.data = data
        self.path = path
        self.ncols = ncols
        buf = np.frombuffer(data, dtype=np.uint8)
        self.buf = buf
        edges, self.newlines = _scan(buf)
        self.starts = edges[0::2]
        self.ends = edges[1::2]
        self.first = None  # uniform layout: token (row, c) is row * ncols + c
        if not self._uniform():
            self._general_layout(columns, allow_extra)
        else:
            self.n = self.starts.size // ncols
        self.ascii = bool(buf.size == 0 or int(buf.max()) < 128)

    def _uniform(self) -> bool:
        """True when every line (no blank ones) has exactly ``ncols`` tokens.

        Linear-time check: with L lines and L * ncols tokens, row r's first
        token must start after newline r-1 and its last token end before
        newline r; then each line holds exactly its own row's tokens.
        """
        nc = self.ncols
        nl = self.newlines
        size = self.buf.size
        lines = nl.size + (1 if size and self.data[-1:] != b"\n" else 0)
        if self.starts.size != lines * nc:
            return False
        if lines == 0:
            return True
        first = self.starts[0::nc]
        last_end = self.ends[nc - 1::nc]
        if lines > 1 and not np.all(first[1:] > nl[: lines - 1]):
            return False
        k = min(lines, nl.size)
        return bool(np.all(last_end[:k] <= nl[:k]))

    def _general_layout(self, columns: tuple[str, ...], allow_extra: bool) -> None:
        nc = self.ncols
        # tokens per line: line k spans (newline k-1, newline k]
        line_first = np.searchsorted(self.starts, self.newlines)
        counts = np.diff(line_first, prepend=0, append=self.starts.size)
        if allow_extra:
            bad = np.flatnonzero((counts != 0) & (counts < nc))
        else:
            bad = np.flatnonzero((counts != 0) & (counts != nc))
        if bad.size:
            k = int(bad[0])
            what = f"at least {nc}" if allow_extra else f"{nc}"
            raise TrecFormatError(
                self.path,
                k + 1,
                f"expected {what} columns ({' '.join(columns)}), got {int(counts[k])}",
                self.line_text(k + 1),
            )
        nonblank = counts > 0
        self.n = int(np.count_nonzero(nonblank))
        if self.n * nc != self.starts.size or not np.all(counts[nonblank] == nc):
            self.first = np.concatenate(([0], line_first))[nonblank]
        else:
            # blank lines only: the token layout is still uniform
            self.first = None

    def line_text(self, lineno: int) -> str:
        k = lineno - 1
        lo = 0 if k == 0 else int(self.newlines[k - 1]) + 1
        hi = int(self.newlines[k]) if k < self.newlines.size else len(self.data)
        return self.data[lo:hi].decode("utf-8", errors="replace").rstrip("\r")

    def lineno_of_token(self, token_index: int) -> int:
        return int(np.searchsorted(self.newlines, self.starts[token_index])) + 1

    def token(self, token_index: int) -> bytes:
        return self.data[int(self.starts[token_index]):int(self.ends[token_index])]

    def column_bounds(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        if self.first is None:
            return self.starts[c::self.ncols], self.ends[c::self.ncols]
        idx = self.first + c
        return self.starts[idx], self.ends[idx]

    def token_index(self, row: int, c: int) -> int:
        if self.first is None:
            return row * self.ncols + c
        return int(self.first[row]) + c

    def matrix(self, c: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens x width) zero-padded byte matrix of column ``c`` and the token lengths.

        ``None`` when the column holds a token longer than ``_MAX_MATRIX_WIDTH``.
        """
        s, e = self.column_bounds(c)
        lengths = e - s
        if s.size == 0:
            return np.zeros((0, 1), dtype=np.uint8), lengths
        width = int(lengths.max())
        if width > _MAX_MATRIX_WIDTH:
            return None
        size = self.buf.size
        window = sliding_window_view(self.buf, width)  # rows 0 .. size - width
        last_ok = size - width
        tail = np.flatnonzero(s > last_ok)  # tokens too close to the end of the file
        if tail.size:
            mat = window[np.minimum(s, last_ok)]
            for i in tail.tolist():
                lo, ln = int(s[i]), int(lengths[i])
                mat[i] = 0
                mat[i, :ln] = self.buf[lo:lo + ln]
        else:
            mat = window[s]
        if width > 1:
            np.multiply(mat, np.arange(width, dtype=lengths.dtype) < lengths[:, None], out=mat)
        return mat, lengths

    def column_bytes(self, c: int) -> list[bytes]:
        s, e = self.column_bounds(c)
        data = self.data
        return [data[a:b] for a, b in zip(s.tolist(), e.tolist())]

    def error_at(self, c: int, row: int, message: str) -> TrecFormatError:
        ti = self.token_index(row, c)
        lineno = self.lineno_of_token(ti)
        return TrecFormatError(self.path, lineno, message, self.line_text(lineno))


def _strings(tok: _Tokens, c: int, name: str) -> np.ndarray:
    got = tok.matrix(c)
    if got is None:
        items = tok.column_bytes(c)
        try:
            return np.array([b.decode("utf-8") for b in items], dtype=str)
        except UnicodeDecodeError:
            for row, b in enumerate(items):
                try:
                    b.decode("utf-8")
                except UnicodeDecodeError:
                    raise tok.error_at(c, row, f"{name} is not valid UTF-8") from None
            raise
    mat, _ = got
    k, width = mat.shape
    if k == 0:
        return np.zeros(0, dtype="U1")
    if tok.ascii:
        return mat.astype(np.uint32).view(f"U{width}").reshape(k)
    raw = mat.view(f"S{width}").reshape(k)
    try:
        return np.char.decode(raw, "utf-8")
    except UnicodeDecodeError:
        for row, b in enumerate(raw.tolist()):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError:
                raise tok.error_at(c, row, f"{name} is not valid UTF-8") from None
        raise


def _parse_ints(tok: _Tokens, c: int, name: str) -> np.ndarray:
    got = tok.matrix(c)
    if got is None:
        return _slow_numbers(tok, c, name, np.arange(tok.n), np.zeros(tok.n, np.int64), int)
    mat, lengths = got
    k, width = mat.shape
    val = np.zeros(k, dtype=np.int64)
    if k == 0:
        return val
    cols = np.ascontiguousarray(mat.T)  # one contiguous row per character position
    neg = cols[0] == 45  # '-'
    signed = neg | (cols[0] == 43)  # '+'
    ndig = lengths - signed
    ok = (ndig >= 1) & (ndig <= 18)
    d = np.empty(k, dtype=np.uint8)
    active = np.empty(k, dtype=bool)
    tmp = np.empty(k, dtype=bool)
    nxt = np.empty(k, dtype=np.int64)
    for j in range(width):
        np.subtract(cols[j], np.uint8(48), out=d)
        np.less(j, lengths, out=active)
        if j == 0:
            active &= ~signed
        # ok &= ~active | (d < 10)
        np.less(d, 10, out=tmp)
        tmp |= ~active
        ok &= tmp
        np.multiply(val, 10, out=nxt)
        nxt += d
        np.copyto(val, nxt, where=active)
    np.negative(val, out=val, where=neg)
    bad = np.flatnonzero(~ok)
    if bad.size:
        val = _slow_numbers(tok, c, name, bad, val, int)
    return val


def _parse_floats(tok: _Tokens, c: int, name: str) -> np.ndarray:
    got = tok.matrix(c)
    if got is None:
        return _slow_numbers(tok, c, name, np.arange(tok.n), np.zeros(tok.n, np.float64), float)
    mat, lengths = got
    k, width = mat.shape
    if k == 0:
        return np.zeros(0, dtype=np.float64)
    cols = np.ascontiguousarray(mat.T)
    neg = cols[0] == 45
    signed = neg | (cols[0] == 43)
    mant = np.zeros(k, dtype=np.int64)
    ndig = np.zeros(k, dtype=np.int16)
    nfrac = np.zeros(k, dtype=np.int16)
    seen_dot = np.zeros(k, dtype=bool)
    ok = np.ones(k, dtype=bool)
    d = np.empty(k, dtype=np.uint8)
    active = np.empty(k, dtype=bool)
    isdig = np.empty(k, dtype=bool)
    isdot = np.empty(k, dtype=bool)
    digit = np.empty(k, dtype=bool)
    tmp = np.empty(k, dtype=bool)
    nxt = np.empty(k, dtype=np.int64)
    for j in range(width):
        col = cols[j]
        np.subtract(col, np.uint8(48), out=d)
        np.less(j, lengths, out=active)
        if j == 0:
            active &= ~signed
        np.less(d, 10, out=isdig)
        np.equal(col, 46, out=isdot)
        # a second dot, or any other character, leaves the fast path:
        # ok &= ~active | isdig | (isdot & ~seen_dot)
        np.greater(isdot, seen_dot, out=tmp)  # isdot & ~seen_dot
        tmp |= isdig
        tmp |= ~active
        ok &= tmp
        isdot &= active
        seen_dot |= isdot
        np.logical_and(active, isdig, out=digit)
        np.multiply(mant, 10, out=nxt)
        nxt += d
        np.copyto(mant, nxt, where=digit)
        ndig += digit
        digit &= seen_dot
        nfrac += digit
    ok &= (ndig >= 1) & (ndig <= 18) & (nfrac <= 22)
    ok &= mant <= _MAX_EXACT_MANTISSA
    np.minimum(nfrac, 22, out=nfrac)
    val = mant / _POW10_FLOAT[nfrac]
    np.negative(val, out=val, where=neg)
    bad = np.flatnonzero(~ok)
    if bad.size:
        # exponents, inf/nan, long mantissas: numpy's own parser, then
        # per-token Python parsing only to name the offending line.
        mat_bad = np.ascontiguousarray(mat[bad])
        raw = mat_bad.view(f"S{width}").reshape(bad.size)
        try:
            if (mat_bad == 95).any():  # '_' digit separators: reject (slow path names the line)
                raise ValueError("underscore")
            val[bad] = raw.astype(np.float64)
        except ValueError:
            val = _slow_numbers(tok, c, name, bad, val, float)
    return val


def _slow_numbers(tok: _Tokens, c: int, name: str, rows: np.ndarray, out: np.ndarray, conv) -> np.ndarray:
    s, e = tok.column_bounds(c)
    data = tok.data
    for row in rows.tolist():
        text = data[int(s[row]):int(e[row])]
        try:
            if b"_" in text:  # Python's int()/float() accept digit separators; TREC tools do not
                raise ValueError(text)
            out[row] = conv(text.decode("ascii"))
        except (ValueError, UnicodeDecodeError, OverflowError):
            kind = "an integer" if conv is int else "a number"
            raise tok.error_at(c, row, f"{name} is not {kind}: {text.decode('utf-8', 'replace')!r}") from None
    return out


# --------------------------------------------------------------------------
# fast path: regular files, scanned a chunk of whole lines at a time


_FAST_CHUNK = 1 << 20  # bytes per chunk of whole lines: the temporaries stay in cache
_FAST_SLACK = _MAX_MATRIX_WIDTH + 8  # readable bytes after a chunk (8-byte words read past a token)
_WORD_MASK = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [2**64 - 1], dtype=np.uint64)


def _fast_chunk(chunk: np.ndarray, ncols: int):
    """Token bounds of a chunk of whole lines when every line is regular: exactly ``ncols``
    ASCII tokens separated by one space or tab, no blank in front or at the end, ``\\n`` ends,
    not a comment (``#`` first).

    Returns ``(line starts, ends)``: where each line starts, and the (lines x ncols) offsets in the
    chunk of the whitespace after each token (token ``c > 0`` starts after ``ends[:, c - 1]``); None when
    anything is unusual (blank or comment lines, other whitespace, a NUL or non-ASCII byte, a line
    with another number of tokens): the general reader then decides, and reports errors."""
    if int(chunk.max()) >= 128 or chunk[0] <= 32:
        return None
    le = chunk <= 32
    nl = int(np.count_nonzero(chunk == 10))
    m = int(np.count_nonzero(le))
    if m != nl * ncols or m != nl + int(np.count_nonzero(chunk == 32)) + int(np.count_nonzero(chunk == 9)):
        return None  # other whitespace or control bytes, or lines of another length
    if bool((le[1:] & le[:-1]).any()):
        return None  # an empty token: blank line, two separators, a blank at either end of a line
    ends = np.flatnonzero(le).reshape(nl, ncols)
    if not bool((chunk[ends[:, -1]] == 10).all()):
        return None
    line_starts = np.empty(nl, dtype=ends.dtype)
    line_starts[0] = 0
    np.add(ends[:-1, -1], 1, out=line_starts[1:])
    if bool((chunk[line_starts] == 35).any()):
        return None  # a comment line
    return line_starts, ends


def _words(ext: np.ndarray, s: np.ndarray, lengths: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
    """The tokens ``ext[s:s + lengths]`` as (tokens x words) little-endian uint64 words, zero
    past each token (so the bytes, ``words.view(np.uint8)``, are a zero-padded matrix). Reads up to
    the word after a token: ``ext`` has :data:`_FAST_SLACK` readable bytes past the last token.
    None when a token is longer than ``_MAX_MATRIX_WIDTH``. ``out``: where to write them, as many
    words as the longest token needs."""
    width = int(lengths.max())
    if width > _MAX_MATRIX_WIDTH:
        return None
    nw = max((width + 7) // 8, 1)
    u64 = np.ndarray(shape=(ext.size - 7,), dtype="<u8", buffer=ext, strides=(1,))
    if out is None:
        out = np.empty((s.size, nw), dtype=np.uint64)
    for j in range(nw):
        w = u64[s + 8 * j] if j else u64[s]
        rem = np.clip(lengths - 8 * j, 0, 8) if j or width > 8 else lengths
        np.bitwise_and(w, _WORD_MASK[rem], out=out[:, j])
    return out


def _fast_decimal(words: np.ndarray, lengths: np.ndarray, dot: bool, values: bool = True):
    """Vectorised ``[+-]?digits`` (``dot``: ``[+-]?digits[.digits]``, a digit on at least one side)
    of tokens as :func:`_words` gives them. Returns ``(ok, mantissa, digits after the dot,
    negative)``; ``ok`` is False for tokens of another form or with more than 18 digits (their
    mantissa is then meaningless); without ``values`` only ``ok``."""
    k = words.shape[0]
    mt = np.ascontiguousarray(words.view(np.uint8).reshape(k, -1).T)  # one row per character position
    width = mt.shape[0]
    d = mt - np.uint8(48)
    isdig = d < 10
    c0 = mt[0]
    neg = c0 == 45
    signed = neg | (c0 == 43)
    ndig = isdig.sum(axis=0, dtype=np.int16)
    nchars = ndig + signed
    if dot:
        isdot = mt == 46
        ndot = isdot.sum(axis=0, dtype=np.int16)
        nchars += ndot
        ok = ndot <= 1
    else:
        ok = np.ones(k, dtype=bool)
    ok &= nchars == lengths  # nothing else in the token (zero bytes are the padding)
    ok &= (ndig >= 1) & (ndig <= 18)
    if not values:
        return ok, None, None, neg
    d *= isdig
    mant = np.zeros(k, dtype=np.int64)
    nfrac = np.zeros(k, dtype=np.int16) if dot else None
    seen = np.zeros(k, dtype=bool)
    for j in range(width):
        dj = isdig[j]
        np.multiply(mant, 10, out=mant, where=dj)
        mant += d[j]
        if dot and j:
            seen |= isdot[j - 1]
            nfrac += dj & seen
    return ok, mant, nfrac, neg


_U64 = np.uint64
_ZERO_FILL = np.array([int.from_bytes(b"0" * i + b"\0" * (8 - i), "little") for i in range(9)], dtype=np.uint64)


def _fixed_decimals(words: np.ndarray, lengths: np.ndarray):
    """``(mantissa, digits after the dot)`` of tokens of at most 8 bytes that all are
    ``digits.digits`` with the same number of digits after the dot (``%.6f`` as runs print
    scores), by SWAR arithmetic on each token's 8-byte word; None when they are not all so (the
    per-character path then reads them)."""
    if words.shape[1] != 1 or not len(lengths):
        return None
    first = words[0, 0].tobytes()[:int(lengths[0])]
    frac = len(first) - 1 - first.find(b".")
    if b"." not in first or not 1 <= frac <= 7:
        return None
    # right-align each token in its word (last character in the top byte): the dot is then at
    # byte 7 - frac in every token
    r = words[:, 0] << ((8 - lengths) * 8).astype(np.uint64)
    dot = 7 - frac
    if not bool((((r >> _U64(8 * dot)) & _U64(0xFF)) == _U64(0x2E)).all()):
        return None
    # drop the dot (the whole part moves up a byte), fill the front with '0'
    low = _U64((1 << (8 * dot)) - 1)
    x = r & ~_U64((1 << (8 * (dot + 1))) - 1)
    x |= (r & low) << _U64(8)
    x |= _ZERO_FILL[9 - lengths]
    x = _eight_digits(x)
    return None if x is None else (x, frac)


def _eight_digits(x: np.ndarray) -> np.ndarray | None:
    """Values of words of 8 ASCII digits (first digit in the lowest byte; in place), or None when
    a byte is not a digit."""
    hi_nibbles = _U64(0xF0F0F0F0F0F0F0F0)
    zeros = _U64(0x3030303030303030)
    if not bool((((x & hi_nibbles) == zeros) & (((x + _U64(0x0606060606060606)) & hi_nibbles) == zeros)).all()):
        return None
    x -= zeros
    x = x * _U64(10) + (x >> _U64(8))
    return (((x & _U64(0x000000FF000000FF)) * _U64(100 + (1000000 << 32)))
            + (((x >> _U64(16)) & _U64(0x000000FF000000FF)) * _U64(1 + (10000 << 32)))) >> _U64(32)


def _small_uints(words: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Values (uint64) of tokens of 1 to 8 plain digits (ranks, grades), by SWAR arithmetic on
    each token's word; None when they are not all so (the per-character path then reads them)."""
    if words.shape[1] != 1 or not len(lengths):
        return None
    r = words[:, 0] << ((8 - lengths) * 8).astype(np.uint64)  # right-aligned, '0' in front
    r |= _ZERO_FILL[8 - lengths]
    return _eight_digits(r)


def _fast_floats(words: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> bool:
    """Floats of tokens as :func:`_words` gives them: decimals as ``mantissa / 10**k`` (exact
    operands, so correctly rounded, when the mantissa is at most 2**53 and k at most 22); other
    tokens (exponents, inf, nan, more digits) through numpy's string-to-float cast, as the general
    reader does. Written into ``out``; False when a token is not a number (the general reader then
    reports it)."""
    fixed = _fixed_decimals(words, lengths)
    if fixed is not None:  # (a mantissa below 10**8 and a power of ten: exact operands)
        np.divide(fixed[0], _POW10_FLOAT[fixed[1]], out=out)
        return True
    ok, mant, nfrac, neg = _fast_decimal(words, lengths, True)
    ok &= mant <= _MAX_EXACT_MANTISSA
    ok &= nfrac <= 22
    np.minimum(nfrac, 22, out=nfrac)
    val = out
    np.divide(mant, _POW10_FLOAT[nfrac], out=val)
    np.negative(val, out=val, where=neg)
    bad = np.flatnonzero(~ok)
    if bad.size:
        raw = np.ascontiguousarray(words[bad]).view(f"S{8 * words.shape[1]}").reshape(bad.size)
        if any(b"_" in t for t in raw.tolist()):  # digit separators: not a TREC number
            return False
        try:
            val[bad] = raw.astype(np.float64)
        except ValueError:
            return False
    return True


def _fast_table(data, ncols: int, kinds: dict[int, str], phases: dict | None = None,
                workers: int | None = None) -> dict | None:
    """Columns of a regular file (see :func:`_fast_chunk`), a chunk of whole lines at a time.

    ``data``: the file's bytes (``bytes`` or a read-only ``mmap``). ``kinds`` maps a column to
    ``"bytes"`` (an ``S`` array of the tokens, zero-padded to a multiple of 8 bytes; the longest
    token's length is ``out[column, "width"]``), ``"int"`` (int64), ``"float"`` (float64),
    ``"check_int"`` (checked to be an integer, not kept: ``None``) or ``"first"`` (the first line's
    token, ``bytes``). Returns ``{column: values}``, or None when the file is empty or not regular,
    or a number does not parse or a token is too long: the general reader then takes over (and
    reports errors).

    The chunks are independent: each writes its rows in place into the output arrays (row offsets
    from a count of the newlines first), on ``workers`` threads (default: up to 2, as many as the
    machine has cores; numpy releases the GIL in its loops). A ``bytes`` column is as many 8-byte
    words wide as the first chunk needs; a chunk with longer tokens makes it wider afterwards.

    ``phases`` (for benchmarks/run.py): a dict that receives the seconds spent on the token scan
    (key ``"scan"``) and on each column (its index), summed over the chunks; the chunks are then
    read one after the other."""
    n = len(data)
    if n == 0:
        return None
    buf = np.frombuffer(data, dtype=np.uint8)
    bounds = []
    lo = 0
    while lo < n:
        hi = lo + _FAST_CHUNK
        if hi < n:
            j = data.rfind(b"\n", lo, hi)
            if j < 0:
                j = data.find(b"\n", hi)
            hi = n if j < 0 else j + 1
        if hi + _FAST_SLACK > n:  # the end of the file: one last chunk
            hi = n
        bounds.append((lo, hi))
        lo = hi
    first_row = [0]
    for lo, hi in bounds:
        first_row.append(first_row[-1] + int(np.count_nonzero(buf[lo:hi] == 10)))
    if data[-1] != 10:
        first_row[-1] += 1
    nrows = first_row[-1]
    cols: dict = {}
    for c, kind in kinds.items():
        if kind == "float":
            cols[c] = np.empty(nrows, dtype=np.float64)
        elif kind == "int":
            cols[c] = np.empty(nrows, dtype=np.int64)
    out: dict = {}
    widths: dict = {}
    runs: dict = {}

    def chunk_columns(i: int, only=None):
        """Read chunk ``i`` into the outputs: None when not regular, else {column: words needed}
        for the ``bytes`` columns too narrow for it (those are not written)."""
        last = time.perf_counter() if phases is not None else 0.0

        def tick(key):
            nonlocal last
            if phases is not None:
                t = time.perf_counter()
                phases[key] = phases.get(key, 0.0) + t - last
                last = t

        lo, hi = bounds[i]
        row = first_row[i]
        if hi + _FAST_SLACK <= n:
            ext = buf[lo:hi + _FAST_SLACK]
            got = _fast_chunk(ext[:hi - lo], ncols)
        else:  # a copy with room after it (and the last newline if missing)
            tail = data[lo:hi] if data[hi - 1] == 10 else data[lo:hi] + b"\n"
            ext = np.zeros(len(tail) + _FAST_SLACK, dtype=np.uint8)
            ext[:len(tail)] = np.frombuffer(tail, dtype=np.uint8)
            got = _fast_chunk(ext[:len(tail)], ncols)
        if got is None:
            return None
        line_starts, ends = got
        k = ends.shape[0]
        if row + k != first_row[i + 1]:
            return None
        tick("scan")
        wider = {}
        for c, kind in kinds.items():
            if only is not None and c not in only:
                continue
            s = line_starts if c == 0 else ends[:, c - 1] + 1
            lengths = ends[:, c] - s
            if kind == "first":
                if i == 0:
                    out[c] = ext[int(s[0]):int(s[0] + lengths[0])].tobytes()
                continue
            if kind == "bytes":
                width = int(lengths.max())
                if width > _MAX_MATRIX_WIDTH:
                    return None
                nw = max((width + 7) // 8, 1)
                if c not in cols:  # the first chunk: the column as wide as it needs
                    cols[c] = np.empty((nrows, nw), dtype=np.uint64)
                arr = cols[c]
                widths[c, i] = width
                if nw > arr.shape[1]:
                    wider[c] = nw
                    continue
                dest = arr[row:row + k]
                _words(ext, s, lengths, dest[:, :nw])
                if nw < arr.shape[1]:
                    dest[:, nw:] = 0
            elif kind == "blocks":  # runs of equal consecutive tokens: their token and length
                words = _words(ext, s, lengths)
                if words is None:
                    return None
                new_run = words[1:, 0] != words[:-1, 0]
                for j in range(1, words.shape[1]):
                    new_run |= words[1:, j] != words[:-1, j]
                first = np.flatnonzero(new_run)
                first += 1
                first = np.concatenate(([0], first))
                runs[c, i] = (words[first], np.diff(first, append=k), int(lengths.max()))
            elif kind == "float":
                words = _words(ext, s, lengths)
                if words is None or not _fast_floats(words, lengths, cols[c][row:row + k]):
                    return None
            else:
                words = _words(ext, s, lengths)
                if words is None:
                    return None
                small = _small_uints(words, lengths)
                if small is not None:
                    if kind == "int":
                        cols[c][row:row + k] = small
                else:
                    ok, mant, _, neg = _fast_decimal(words, lengths, False, values=kind == "int")
                    if not bool(ok.all()):
                        return None
                    if kind == "int":
                        dest = cols[c][row:row + k]
                        np.copyto(dest, mant)
                        np.negative(dest, out=dest, where=neg)
            tick(c)
        return wider

    got = chunk_columns(0)
    if got is None:
        return None
    rest = range(1, len(bounds))
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    if phases is not None or workers < 2 or len(rest) < 2:
        results = [chunk_columns(i) for i in rest]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(chunk_columns, rest))
    if any(r is None for r in results):
        return None
    need: dict = {}
    redo: dict = {}
    for i, r in zip(rest, results):
        for c, nw in r.items():
            need[c] = max(need.get(c, 0), nw)
            redo.setdefault(i, set()).add(c)
    for c, nw in need.items():  # tokens longer than the first chunk's: wider columns, chunks redone
        arr = cols[c]
        cols[c] = np.zeros((nrows, nw), dtype=np.uint64)
        cols[c][:, :arr.shape[1]] = arr
    for i, only in redo.items():
        if chunk_columns(i, only) is None:
            return None
    for c, kind in kinds.items():
        if kind == "bytes":
            arr = cols[c]
            out[c] = arr.view(f"S{8 * arr.shape[1]}").reshape(nrows)
            out[c, "width"] = max(w for (cc, _), w in widths.items() if cc == c)
        elif kind in ("int", "float"):
            out[c] = cols[c]
        elif kind == "check_int":
            out[c] = None
        elif kind == "blocks":
            parts = [runs[c, i] for i in range(len(bounds))]
            nw = max(p[0].shape[1] for p in parts)
            values = np.zeros((sum(len(p[1]) for p in parts), nw), dtype=np.uint64)
            at = 0
            for v, _, _ in parts:
                values[at:at + len(v), :v.shape[1]] = v
                at += len(v)
            lengths = np.concatenate([p[1] for p in parts])
            # a run that goes on in the next chunk: one run
            new_run = np.ones(len(values), dtype=bool)
            new_run[1:] = (values[1:] != values[:-1]).any(axis=1)
            first = np.flatnonzero(new_run)
            out[c] = _RunLengths(np.ascontiguousarray(values[first]).view(f"S{8 * nw}").reshape(len(first)),
                                 np.add.reduceat(lengths, first))
            out[c, "width"] = max(p[2] for p in parts)
    return out


class _RunLengths:
    """An id column given as runs of equal consecutive ids (a run file's qid column: each query's
    lines together): ``values`` (one per run, adjacent ones differ) and ``lengths``. ``len()`` and
    ``dtype`` are the column's; ``blocks()`` gives ``(values, lengths, starts)`` (what
    :mod:`streameval.metrics.grouped` wants, without the column ever being laid out);
    ``np.asarray()`` lays it out."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray):
        self.values = values
        self.lengths = lengths.astype(np.int64, copy=False)
        self.dtype = values.dtype
        self._n = int(self.lengths.sum())

    def __len__(self) -> int:
        return self._n

    def blocks(self):
        starts = np.zeros(len(self.lengths), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=starts[1:])
        return self.values, self.lengths, starts

    def __array__(self, dtype=None, copy=None):
        a = np.repeat(self.values, self.lengths)
        return a if dtype is None else a.astype(dtype)


def _map_file(path: str):
    """The bytes of an uncompressed file as a read-only ``mmap`` (no copy: the pages come from the
    page cache as they are read), else (``.gz``, empty, or not mappable) as ``bytes``."""
    if not path.endswith(".gz"):
        import mmap

        with open(path, "rb") as f:
            try:
                return _plain_lines(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            except (ValueError, OSError):  # empty file, or not a regular file
                pass
    return _read_bytes(path)


def _ascii_str(ids: np.ndarray, width: int) -> np.ndarray:
    """An ``S`` array of ASCII ids, none longer than ``width``, as a ``str`` array."""
    mat = ids.view(np.uint8).reshape(ids.size, ids.dtype.itemsize)[:, :max(width, 1)]
    return mat.astype(np.uint32).view(f"U{max(width, 1)}").reshape(ids.size)


_RUN_KINDS = {0: "bytes", 2: "bytes", 3: "int", 4: "float", 5: "first"}
# trec-eval: the qid column as runs of equal qids, the rank column checked, not kept
_RUN_KINDS_EVAL = {**_RUN_KINDS, 0: "blocks", 3: "check_int"}
_QRELS_KINDS = {0: "bytes", 2: "bytes", 3: "int"}


def _new(cls, **fields):
    """A TrecRun / TrecQrels with fields as given (no conversion)."""
    obj = cls.__new__(cls)
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def _read_for_eval(run_path: PathLike, qrels_path: PathLike) -> tuple[TrecRun, TrecQrels]:
    """:func:`read_run` and :func:`read_qrels` for ``streameval trec-eval``: the same checks and
    errors, but on the fast path (regular ASCII files) ``qid``/``docno`` stay ``bytes`` arrays
    (numpy ``S``, zero-padded: they order as the strings do), the run's ``qid`` is a
    :class:`_RunLengths` (runs of equal qids; ``np.asarray`` lays it out) and the run's rank column
    is checked to be integers but not kept (``rank`` is None; trec_eval ignores it). Other files
    are read by the general readers (``str`` ids)."""
    p = os.fspath(run_path)
    fast = _fast_table(_map_file(p), 6, _RUN_KINDS_EVAL)
    if fast is None:
        run = read_run(p)
    else:
        run = _new(TrecRun, qid=fast[0], docno=fast[2], score=fast[4], rank=None, tag=fast[5].decode("ascii"))
    del fast
    p = os.fspath(qrels_path)
    fast = _fast_table(_map_file(p), 4, _QRELS_KINDS)
    qrels = read_qrels(p) if fast is None else _new(TrecQrels, qid=fast[0], docno=fast[2], grade=fast[3])
    return run, qrels


# --------------------------------------------------------------------------
# public readers / writers


def read_run(path: PathLike, *, strict: bool = False, check: bool = False) -> TrecRun:
    """Read a TREC run file (``qid Q0 docno rank score tag``).

    Blank lines and comment lines (first non-blank character ``#``) are
    skipped; an empty file gives empty arrays and tag ``""``.  Raises
    :class:`TrecFormatError` (file, 1-based line) when a line has fewer than
    6 columns or the rank/score is not a number.  Like trec_eval, tokens after
    the 6th (the tag) are ignored (trec_eval's own test file
    ``results.trunc`` has such lines); ``strict=True`` rejects them too.

    Scores ``nan``/``inf`` and a docno ranked twice for one query are read as
    they are (the metric layer refuses them); ``check=True`` refuses them here,
    with the line (see :func:`check_run`).
    """
    p = os.fspath(path)
    fast = _fast_table(_map_file(p), 6, _RUN_KINDS)
    if fast is not None:
        run = TrecRun(qid=_ascii_str(fast[0], fast[0, "width"]), docno=_ascii_str(fast[2], fast[2, "width"]),
                      score=fast[4], rank=fast[3], tag=fast[5].decode("ascii"))
    else:
        tok = _Tokens(_read_bytes(p), p, 6, RUN_COLUMNS, allow_extra=not strict)
        qid = _strings(tok, 0, "qid")
        docno = _strings(tok, 2, "docno")
        rank = _parse_ints(tok, 3, "rank")
        score = _parse_floats(tok, 4, "score")
        tag = tok.token(tok.token_index(0, 5)).decode("utf-8", errors="replace") if tok.n else ""
        run = TrecRun(qid=qid, docno=docno, score=score, rank=rank, tag=tag)
    if check:
        check_run(run, p)
    return run


def read_qrels(path: PathLike, *, check: bool = False) -> TrecQrels:
    """Read a TREC qrels file (``qid iter docno grade``); ``iter`` is ignored.

    Blank lines and comment lines (first non-blank character ``#``) are
    skipped; an empty file gives empty arrays.  Raises
    :class:`TrecFormatError` (file, 1-based line) when a line does not have
    exactly 4 columns (trec_eval rejects extra qrels columns too) or the
    grade is not an integer.  A (qid, docno) judged twice is read as it is;
    ``check=True`` refuses it here, with the line (see :func:`check_qrels`).
    """
    p = os.fspath(path)
    fast = _fast_table(_map_file(p), 4, _QRELS_KINDS)
    if fast is not None:
        qrels = TrecQrels(qid=_ascii_str(fast[0], fast[0, "width"]), docno=_ascii_str(fast[2], fast[2, "width"]),
                          grade=fast[3])
    else:
        tok = _Tokens(_read_bytes(p), p, 4, QRELS_COLUMNS)
        qid = _strings(tok, 0, "qid")
        docno = _strings(tok, 2, "docno")
        grade = _parse_ints(tok, 3, "grade")
        qrels = TrecQrels(qid=qid, docno=docno, grade=grade)
    if check:
        check_qrels(qrels, p)
    return qrels


# --------------------------------------------------------------------------
# checks beyond the format (found with numpy; lines located by a rescan)


def _row_lines(path: PathLike, rows: list[int]) -> dict[int, tuple[int, str]]:
    """``{row: (1-based line number, line text)}`` for data rows of a TREC file.

    Row ``r`` is the r-th line that is neither blank nor a comment, the rows
    of :class:`TrecRun` / :class:`TrecQrels` as read.  Rescans the file in
    Python: only called once a problem is known.
    """
    want = sorted(set(int(r) for r in rows))
    out: dict[int, tuple[int, str]] = {}
    if not want:
        return out
    data = _read_bytes(path)
    row = 0
    i = 0
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        head = raw.lstrip(b" \t\r\x0b\x0c")
        if not head or head.startswith(b"#"):
            continue
        if row == want[i]:
            out[row] = (lineno, raw.decode("utf-8", errors="replace"))
            i += 1
            if i == len(want):
                break
        row += 1
    return out


def check_run(run: TrecRun, path: PathLike) -> None:
    """Raise :class:`TrecFormatError` for the first line of ``path`` with a non-finite score
    (``nan``, ``inf``) or a docno ranked a second time for its query.

    ``run`` must be what :func:`read_run` read from ``path`` (rows = data lines).
    """
    p = os.fspath(path)
    bad: list[tuple[int, str, int | None]] = []
    nonfinite = np.flatnonzero(~np.isfinite(run.score))
    if nonfinite.size:
        r = int(nonfinite[0])
        bad.append((r, f"score is not a finite number ({float(run.score[r])!r})", None))
    rep = first_repeat(run.qid, run.docno)
    if rep is not None:
        r, first = rep
        bad.append((r, f"docno {str(run.docno[r])!r} ranked twice for query {str(run.qid[r])!r}", first))
    if not bad:
        return
    r, reason, first = min(bad)
    lines = _row_lines(p, [r] if first is None else [r, first])
    lineno, text = lines.get(r, (None, None))
    if first is not None and first in lines:
        reason += f" (first at line {lines[first][0]})"
    raise TrecFormatError(p, lineno, reason, text)


def check_qrels(qrels: TrecQrels, path: PathLike) -> None:
    """Raise :class:`TrecFormatError` for the first line of ``path`` judging a (qid, docno)
    judged on an earlier line (trec_eval refuses both identical and conflicting repeats).

    ``qrels`` must be what :func:`read_qrels` read from ``path``.
    """
    p = os.fspath(path)
    rep = first_repeat(qrels.qid, qrels.docno)
    if rep is None:
        return
    r, first = rep
    lines = _row_lines(p, [r, first])
    lineno, text = lines.get(r, (None, None))
    first_line = lines.get(first, (None,))[0]
    q, d = str(qrels.qid[r]), str(qrels.docno[r])
    g, g0 = int(qrels.grade[r]), int(qrels.grade[first])
    if g != g0:
        reason = f"conflicting judgments: docno {d!r} of query {q!r} has grade {g} here and {g0} at line {first_line}"
    else:
        reason = f"docno {d!r} judged twice for query {q!r} (also at line {first_line})"
    raise TrecFormatError(p, lineno, reason, text)


def _check_token(value: str, what: str) -> None:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} cannot be written to a TREC file (empty or contains whitespace)")


def _open_write(path: PathLike):
    p = os.fspath(path)
    parent = os.path.dirname(p)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if p.endswith(".gz"):
        return gzip.open(p, "wt", encoding="utf-8", newline="\n")
    return open(p, "w", encoding="utf-8", newline="\n")


def write_run(path: PathLike, run: TrecRun) -> None:
    """Write ``run`` as a TREC run file, lines in array order.

    Scores are written with ``repr`` (shortest text that reads back to the
    same float64), so ``read_run(write_run(...))`` round-trips exactly.
    """
    tag = run.tag or "run"
    _check_token(tag, "run tag")
    qids = run.qid.tolist()
    docnos = run.docno.tolist()
    for q in set(qids):
        _check_token(q, "qid")
    # docnos are checked lazily via a vectorised test (cheaper for big runs)
    if len(docnos) and (np.char.str_len(run.docno) == 0).any():
        raise ValueError("empty docno cannot be written to a TREC file")
    with _open_write(path) as f:
        chunk = 200_000
        ranks = run.rank.tolist()
        scores = run.score.tolist()
        for lo in range(0, len(qids), chunk):
            hi = lo + chunk
            lines = [
                f"{q} Q0 {d} {r} {s!r} {tag}\n"
                for q, d, r, s in zip(qids[lo:hi], docnos[lo:hi], ranks[lo:hi], scores[lo:hi])
            ]
            f.write("".join(lines))


def write_qrels(path: PathLike, qrels: TrecQrels) -> None:
    """Write ``qrels`` as a TREC qrels file (``qid 0 docno grade``), lines in array order."""
    qids = qrels.qid.tolist()
    for q in set(qids):
        _check_token(q, "qid")
    with _open_write(path) as f:
        f.write(
            "".join(
                f"{q} 0 {d} {g}\n" for q, d, g in zip(qids, qrels.docno.tolist(), qrels.grade.tolist())
            )
        )


def trec_order(qid: np.ndarray, docno: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Indices that put a run in trec_eval's order.

    Queries in order of first appearance; within a query, score descending,
    ties broken by docno descending (plain string comparison, as trec_eval's
    ``strcmp``).  The result is a permutation of ``range(len(qid))``.
    """
    qid = np.asarray(qid)
    n = len(qid)
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    uniq, first, inverse = np.unique(qid, return_index=True, return_inverse=True)
    # rank the unique qids by first appearance
    appearance = np.empty(len(uniq), dtype=np.intp)
    appearance[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    qcode = appearance[inverse.reshape(-1)]
    # lexsort: last key is primary.  Ascending (score, docno) reversed gives
    # score descending, docno descending; then a stable sort by query.
    by_score = np.lexsort((np.asarray(docno), np.asarray(score, dtype=np.float64)))[::-1]
    return by_score[np.argsort(qcode[by_score], kind="stable")]


def _positions_in_order(qid_sorted: np.ndarray) -> np.ndarray:
    """1-based position within each run of equal consecutive qids."""
    n = len(qid_sorted)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = qid_sorted[1:] != qid_sorted[:-1]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    return np.arange(n, dtype=np.int64) - group_start + 1


def run_from_dict(run: Mapping[str, Mapping[str, float]], tag: str = "run") -> TrecRun:
    """Build a :class:`TrecRun` from ``{qid: {docno: score}}`` (pytrec_eval's layout).

    Lines are in trec_eval order (queries in dict order, score descending,
    ties by docno descending) and ``rank`` is the 1-based position in it.
    """
    qids: list[str] = []
    docnos: list[str] = []
    scores: list[float] = []
    for q, docs in run.items():
        for d, s in docs.items():
            qids.append(str(q))
            docnos.append(str(d))
            scores.append(float(s))
    qid = _str_array(qids)
    docno = _str_array(docnos)
    score = np.asarray(scores, dtype=np.float64)
    order = trec_order(qid, docno, score)
    qid, docno, score = qid[order], docno[order], score[order]
    return TrecRun(qid=qid, docno=docno, score=score, rank=_positions_in_order(qid), tag=tag)


def qrels_from_dict(qrels: Mapping[str, Mapping[str, int]]) -> TrecQrels:
    """Build :class:`TrecQrels` from ``{qid: {docno: grade}}`` (rows in dict order)."""
    qids: list[str] = []
    docnos: list[str] = []
    grades: list[int] = []
    for q, docs in qrels.items():
        for d, g in docs.items():
            if isinstance(g, float) and not g.is_integer():
                raise ValueError(f"grade of ({q!r}, {d!r}) is not an integer: {g!r}")
            qids.append(str(q))
            docnos.append(str(d))
            grades.append(int(g))
    return TrecQrels(qid=_str_array(qids), docno=_str_array(docnos), grade=np.asarray(grades, dtype=np.int64))


def _nested(qids, docnos, values) -> dict:
    out: dict = {}
    for q, d, v in zip(qids.tolist(), docnos.tolist(), values.tolist()):
        inner = out.get(q)
        if inner is None:
            inner = out[q] = {}
        inner[d] = v
    return out


def run_to_dict(run: TrecRun) -> dict[str, dict[str, float]]:
    """``{qid: {docno: score}}``; a (qid, docno) repeated in the run keeps its last score."""
    return _nested(run.qid, run.docno, run.score)


def qrels_to_dict(qrels: TrecQrels) -> dict[str, dict[str, int]]:
    """``{qid: {docno: grade}}``; a repeated (qid, docno) keeps its last grade."""
    return _nested(qrels.qid, qrels.docno, qrels.grade)
