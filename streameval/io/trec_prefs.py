"""Readers of trec_eval 10's other relevance formats (``trec_eval -R``): ``prefs`` (get_prefs.c),
``qrels_prefs`` (get_qrels_prefs.c) and ``qrels_jg`` (get_qrels_jg.c).

* prefs: ``qid jg jsg docno rel_level`` (5 fields; rel_level a number);
* qrels_prefs: a TREC qrels file ``qid iter docno rel`` read as prefs, the iter column as the
  judgment group and one judgment sub-group ``0`` (4 fields; rel a number);
* qrels_jg: ``qid jg docno rel`` (4 fields; rel an integer), one set of qrels per judgment group.

Fields are separated by whitespace.  Comment lines (first non-blank character ``#``) and blank
lines are skipped (trec_eval skips lines starting with ``#`` and refuses blank ones).  A line with
another number of fields, a rel_level that is not a number, a qrels_jg grade that is not an
integer, or a docno judged twice by one judgment group of a query (qrels_jg) raises
:class:`~streameval.io.trec.InputFormatError` naming the file and the line.  Ids are str (UTF-8;
their order is the byte order trec_eval's ``strcmp`` gives).
"""

from __future__ import annotations

import math
import os

from .trec import InputFormatError

__all__ = ["read_prefs", "read_qrels_prefs", "read_qrels_jg", "read_rel_info"]


def _lines(path):
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InputFormatError(p, None, f"cannot read: {e.strerror or e}") from None
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        text = raw.decode("utf-8", errors="surrogateescape")
        fields = text.split()
        if not fields or fields[0].startswith("#"):
            continue
        yield p, lineno, text, fields


def _number(p, lineno, text, value, what):
    try:
        v = float(value)
    except ValueError:
        raise InputFormatError(p, lineno, f"{what} {value!r} is not a number", text) from None
    if not math.isfinite(v):
        raise InputFormatError(p, lineno, f"{what} {value!r} is not finite", text)
    return v


def read_prefs(path, *, qrels: bool = False) -> dict:
    """A prefs file (or with ``qrels=True`` a qrels file read as prefs): {qid: (jg, jsg, rel_level,
    docno)}, four lists per query, queries in trec_eval's order (sorted)."""
    ncols = 4 if qrels else 5
    form = "qid iter docno rel" if qrels else "qid jg jsg docno rel_level"
    out: dict = {}
    for p, lineno, text, f in _lines(path):
        if len(f) != ncols:
            raise InputFormatError(p, lineno, f"expected {ncols} fields ({form}), got {len(f)}", text)
        if qrels:
            qid, jg, docno, rel = f
            jsg = "0"
        else:
            qid, jg, jsg, docno, rel = f
        q = out.setdefault(qid, ([], [], [], []))
        q[0].append(jg)
        q[1].append(jsg)
        q[2].append(_number(p, lineno, text, rel, "rel_level"))
        q[3].append(docno)
    return dict(sorted(out.items()))


def read_qrels_prefs(path) -> dict:
    """trec_eval ``-R qrels_prefs``: :func:`read_prefs` of a qrels file."""
    return read_prefs(path, qrels=True)


def read_qrels_jg(path) -> dict:
    """A qrels_jg file: {qid: {jg: {docno: grade}}}, queries and judgment groups sorted (trec_eval's
    order)."""
    out: dict = {}
    for p, lineno, text, f in _lines(path):
        if len(f) != 4:
            raise InputFormatError(p, lineno, f"expected 4 fields (qid jg docno rel), got {len(f)}", text)
        qid, jg, docno, rel = f
        try:
            grade = int(rel)
        except ValueError:
            raise InputFormatError(p, lineno, f"rel {rel!r} is not an integer", text) from None
        group = out.setdefault(qid, {}).setdefault(jg, {})
        if docno in group:
            raise InputFormatError(p, lineno, f"docno {docno!r} judged twice for query {qid!r} by judgment "
                                   f"group {jg!r}", text)
        group[docno] = grade
    return {q: dict(sorted(g.items())) for q, g in sorted(out.items())}


def read_rel_info(path, rel_format: str) -> dict:
    """The reader of trec_eval's ``-R`` ``rel_format`` (prefs, qrels_prefs, qrels_jg)."""
    readers = {"prefs": read_prefs, "qrels_prefs": read_qrels_prefs, "qrels_jg": read_qrels_jg}
    return readers[rel_format](path)
