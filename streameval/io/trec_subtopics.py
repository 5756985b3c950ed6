"""TREC diversity qrels: ``qid subtopic docno grade``, one judgment of a document for one subtopic
(intent) of a query per line, as the TREC Web track's diversity task (2009-2014) and ndeval read them.

Blank lines and comment lines (first non-blank character ``#``) are skipped; a gzip file is read as
its content. Every other line must have exactly 4 white-space separated columns and an integer
grade; a (qid, subtopic, docno) judged on two lines is refused (ndeval would count the document
twice in the subtopic's relevant documents). Errors are :class:`~streameval.io.trec.TrecFormatError`
(``path:line: reason: 'line'``, one line).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .trec import PathLike, TrecFormatError, _read_bytes

__all__ = ["DiversityQrels", "read_diversity_qrels", "first_repeat", "natural_number"]


@dataclass
class DiversityQrels:
    """Judgments as arrays of one length: ``qid``, ``subtopic``, ``docno`` (str) and ``grade``
    (int64); ``lineno``: each row's 1-based line in the file (empty when not read from a file)."""

    qid: np.ndarray
    subtopic: np.ndarray
    docno: np.ndarray
    grade: np.ndarray
    lineno: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.qid)


def natural_number(text: str) -> int | None:
    """ndeval.c's ``naturalNumber``: the value of a string of ASCII digits, None for anything else or
    for a number ndeval refuses as too large (it stops once the value passes 100000 before a digit)."""
    if not text or not (text.isdigit() and text.isascii()):
        return None
    value = 0
    for ch in text:
        if value > 100000:
            return None
        value = 10 * value + ord(ch) - 48
    return value


def first_repeat(*columns) -> tuple[int, int] | None:
    """``(row, earlier row)`` of the first row whose key (the columns' values) repeats an earlier
    row's, or None."""
    seen: dict = {}
    for i, key in enumerate(zip(*(np.asarray(c).tolist() for c in columns))):
        j = seen.setdefault(key, i)
        if j != i:
            return i, j
    return None


def read_diversity_qrels(path: PathLike, *, ndeval: bool = False) -> DiversityQrels:
    """Read a TREC diversity qrels file (``qid subtopic docno grade``).

    ``ndeval=True`` also requires what ndeval.c requires (``processQrels``): the query and subtopic
    ids and the grade are natural numbers (digits only, :func:`natural_number`). Raises :class:`TrecFormatError` with the
    path and line for a line without exactly 4 columns, a grade that is not an integer, (under
    ``ndeval``) a non-numeric id or a negative grade, and a (qid, subtopic, docno) judged twice;
    ``OSError`` for a missing file. An empty file gives empty arrays.
    """
    p = os.fspath(path)
    data = _read_bytes(p)
    q, s, d, g, lines = [], [], [], [], []
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        text = raw.decode("utf-8", errors="replace")
        cols = text.split()
        if not cols or cols[0].startswith("#"):
            continue
        if len(cols) != 4:
            raise TrecFormatError(p, lineno, f"expected 4 columns (qid subtopic docno grade), got {len(cols)}",
                                  text)
        try:
            grade = int(cols[3])
        except ValueError:
            raise TrecFormatError(p, lineno, f"grade {cols[3]!r} is not an integer", text) from None
        if ndeval:
            for what, value in (("query id", cols[0]), ("subtopic", cols[1]), ("grade", cols[3])):
                if natural_number(value) is None:
                    raise TrecFormatError(p, lineno, f"{what} {value!r} is not a natural number up to 1000009 "
                                                     "(ndeval reads numeric topics, subtopics and grades)", text)
        q.append(cols[0])
        s.append(cols[1])
        d.append(cols[2])
        g.append(grade)
        lines.append(lineno)
    rep = first_repeat(q, s, d)
    if rep is not None:
        r, first = rep
        raise TrecFormatError(p, lines[r], f"docno {d[r]!r} judged twice for subtopic {s[r]!r} of query {q[r]!r} "
                                           f"(also at line {lines[first]})", data.split(b"\n")[lines[r] - 1]
                              .decode("utf-8", errors="replace"))

    def arr(values):
        return np.asarray(values, dtype=str) if values else np.zeros(0, dtype="U1")

    return DiversityQrels(arr(q), arr(s), arr(d), np.asarray(g, dtype=np.int64), np.asarray(lines, dtype=np.int64))
