"""trec_eval's Z-score reference files (``trec_eval -Z Zmean_file``; trec_eval 10's get_zscores.c).

One line per query and measure: ``qid measure_name mean std_dev`` (whitespace separated; the
measure as trec_eval prints it, e.g. ``P_5``, ``iprec_at_recall_0.10``). trec_eval's own example is
``test/zscores_file`` of its source, made by ``test/make_zscore_file.py``.
"""

from __future__ import annotations

import os

from .trec import InputFormatError

__all__ = ["read_zscores"]


def read_zscores(path) -> dict[str, dict[str, tuple[float, float]]]:
    """``{qid: {measure name: (mean, std_dev)}}`` from a Z-score file.

    Raises :class:`~streameval.io.trec.InputFormatError` (one line: file, line, reason) for an
    empty file, a line without exactly 4 fields (trec_eval: "Malformed line"; a blank line is one),
    a mean or standard deviation that is not a finite number (trec_eval's ``atof`` would read 0),
    or a (qid, measure) given twice (trec_eval's binary search would take either); OSError when
    the file cannot be read.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        data = f.read()
    if not data:
        raise InputFormatError(p, None, "empty Z-score file (trec_eval -Z wants 'qid measure mean std_dev' lines)")
    out: dict[str, dict[str, tuple[float, float]]] = {}
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for lineno, raw in enumerate(lines, 1):
        text = raw.decode("utf-8", errors="replace")
        fields = text.split()
        if len(fields) != 4:
            raise InputFormatError(p, lineno, f"malformed Z-score line: {len(fields)} fields, want 4 "
                                              "(qid measure mean std_dev)", text)
        qid, measure = fields[0], fields[1]
        try:
            mean, std = float(fields[2]), float(fields[3])
        except ValueError:
            raise InputFormatError(p, lineno, "mean and std_dev must be numbers", text) from None
        if not (mean == mean and std == std and abs(mean) != float("inf") and abs(std) != float("inf")):
            raise InputFormatError(p, lineno, "mean and std_dev must be finite", text)
        per_q = out.setdefault(qid, {})
        if measure in per_q:
            raise InputFormatError(p, lineno, f"measure {measure!r} of query {qid!r} given twice", text)
        per_q[measure] = (mean, std)
    return out
