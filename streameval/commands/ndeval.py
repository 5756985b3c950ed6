"""``streameval ndeval [-alpha A] [-beta B] [-traditional] [-c] [-M DEPTH] QRELS RUN``: ndeval's
diversity evaluation (TREC Web track 2009-2014, ndeval.c version 4.5) and its output.

Prints ndeval's CSV: the header ``runid,topic,ERR-IA@5,...,strec@20``, one line per topic of the
run (topics in numeric order; a topic without judgments prints zeros and is left out of the mean)
and the ``amean`` line, every value with C's ``%.6f`` (a NaN, ndeval's nNRBP of a topic without
relevant documents, as glibc prints it: ``-nan``). The measures are
:mod:`streameval.metrics.diversity`'s; the rules of ndeval.c are kept:

* QRELS ``topic subtopic docno grade``: topic, subtopic and grade natural numbers, a grade > 0 is
  relevant; RUN ``topic Q0 docno rank score tag``: a topic may carry a prefix ending in ``-``
  (``wt09-1`` is topic 1), the rank is a natural number, the run id is the first line's tag;
* the run is ordered by its rank column (a rank used twice for a topic is an error); with
  ``-traditional`` by score descending, then docno descending (trec_eval's order);
* ``-M DEPTH`` keeps the top DEPTH of each topic; ``-c`` divides the means by the number of judged
  topics instead of the topics both judged and ranked; ``-a`` is accepted and, as in ndeval, changes
  nothing.

Risk-sensitive evaluation (TREC Web track 2013-2014; ndeval.c 4.5's ``-baseline FILE`` and
``-riskAlpha A``, :func:`risk_table`): the baseline run is read and scored as the run (same
``-traditional``, ``-M``), and every value becomes ndeval's ``RiskBased(r, b, a)``: ``r - b`` when
``r >= b``, else ``(1 + a) (r - b)`` (a loss weighs 1 + a times a gain; Collins-Thompson, Bennett,
Diaz, Clarke and Voorhees, "TREC 2013 Web Track Overview"). Topics: those of the run
(a topic the baseline lacks counts the baseline as 0) and, with ``-c``, also the baseline's (its
run value 0); the mean divides by ndeval's count, raised to the number of printed topics when that
is larger. The run id printed is ``RUNID (rel to. BASEID, rs=1+a, a=A)``, A as written (default
``0``). ``-riskAlpha`` without ``-baseline`` changes nothing, as in ndeval.

Errors (a malformed line, a docno ranked twice, a rank used twice, an empty file) are one line on
stderr (``path:line: reason``) and exit status 2. Does not import Beam.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from ..exits import EXIT_OK, EXIT_USAGE, one_line

__all__ = ["main", "ndeval_table", "format_ndeval", "risk_based", "risk_table"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval ndeval",
        description="ndeval's novelty and diversity measures (ERR-IA, alpha-nDCG, NRBP, MAP-IA, P-IA, strec) of a "
                    "TREC run against TREC diversity qrels (topic subtopic docno grade), in ndeval's CSV output.")
    p.add_argument("qrels", help="diversity qrels: topic subtopic docno grade")
    p.add_argument("run", help="TREC run: topic Q0 docno rank score tag")
    p.add_argument("-alpha", type=float, default=0.5, help="redundancy intolerance of alpha-nDCG, ERR-IA and NRBP "
                                                           "(default 0.5)")
    p.add_argument("-beta", type=float, default=0.5, help="patience of NRBP (default 0.5)")
    p.add_argument("-traditional", action="store_true",
                   help="order the run by score, then docno (descending), as trec_eval; default: by its rank column")
    p.add_argument("-c", dest="complete", action="store_true",
                   help="average over every topic of the qrels (ndeval -c)")
    p.add_argument("-a", dest="all", action="store_true", help="accepted for ndeval's command lines (no effect)")
    p.add_argument("-M", dest="depth", type=int, default=None, help="cut the run at this depth per topic")
    p.add_argument("-baseline", default=None, metavar="FILE",
                   help="baseline run for risk-sensitive evaluation (TREC Web 2013-14): values are run - baseline, "
                        "losses weighted 1 + riskAlpha")
    p.add_argument("-riskAlpha", default=None, metavar="A",
                   help="risk sensitivity a >= 0 (default 0): a loss against the baseline counts (1 + a) times")
    return p


def _topic(text: str) -> int | None:
    """ndeval.c parseTopic: digits, or a prefix up to the first '-' and digits after it; None if not."""
    from ..io.trec_subtopics import natural_number

    if not text[:1].isdigit():
        cut = text.find("-")
        text = "" if cut < 0 else text[cut + 1:]
    return natural_number(text)


def _read(qrels_path, run_path):
    from ..io import trec
    from ..io.trec_subtopics import first_repeat, read_diversity_qrels

    qrels = read_diversity_qrels(qrels_path, ndeval=True)
    if len(qrels) == 0:
        raise trec.TrecFormatError(qrels_path, None, "qrels file is empty (ndeval needs judgments)")
    run = trec.read_run(run_path)
    if len(run) == 0:
        raise trec.TrecFormatError(run_path, None, "run file is empty (no result lines)")

    def bad(row, reason):
        lineno, text = trec._row_lines(run_path, [row]).get(row, (None, None))
        return trec.TrecFormatError(run_path, lineno, reason, text)

    topics = np.empty(len(run), dtype=np.int64)
    for i, q in enumerate(run.qid.tolist()):
        t = _topic(q)
        if t is None:
            raise bad(i, f"topic {q!r} is not a number (ndeval: digits, or a prefix ending in '-' and digits)")
        topics[i] = t
    neg = np.flatnonzero((run.rank < 0) | (run.rank > 1000009))
    if neg.size:
        raise bad(int(neg[0]), f"rank {int(run.rank[neg[0]])} is not a natural number up to 1000009 (ndeval)")
    rep = first_repeat(topics, run.docno)
    if rep is not None:
        raise bad(rep[0], f"docno {str(run.docno[rep[0]])!r} ranked twice for topic {int(topics[rep[0]])}")
    return qrels, run, topics


def ndeval_table(qrels_path, run_path, *, alpha=0.5, beta=0.5, traditional=False, complete=False, depth=None):
    """ndeval's numbers: ``(runid, topics, values, actual_topics)`` with ``topics`` the run's topics
    (int, ascending), ``values`` float64 (21, topics) in ndeval's column order
    (:data:`~streameval.metrics.diversity.NDEVAL_COLUMNS`) and ``actual_topics`` the mean's divisor.
    Raises TrecFormatError / ValueError (one line) on bad input."""
    from ..metrics.diversity import NDEVAL_COLUMNS, DiversitySpec, evaluate_lists

    qrels, run, topics = _read(qrels_path, run_path)
    if traditional:
        _, dcode = np.unique(run.docno, return_inverse=True)
        order = np.lexsort((-dcode.reshape(-1), -run.score, topics))
    else:
        order = np.lexsort((run.rank, topics))
        t, r = topics[order], run.rank[order]
        dup = np.flatnonzero((t[1:] == t[:-1]) & (r[1:] == r[:-1]))
        if dup.size:
            i = int(dup[0]) + 1
            raise ValueError(f"{run_path}: duplicate rank ({int(r[i])}) for topic {int(t[i])} (ndeval orders the run "
                             "by rank; -traditional orders it by score)")
    t = topics[order]
    if depth is not None:
        start = np.searchsorted(t, t, side="left")
        order = order[np.arange(len(t)) - start < depth]
        t = topics[order]
    run_topics = np.unique(topics)
    qtopics = np.unique(qrels.qid.astype(np.int64))
    specs = [DiversitySpec(m, k, alpha, beta, 1) for m, k in NDEVAL_COLUMNS]
    # topics as zero-padded text: byte order = numeric order, and "007" and "7" are one topic
    width = len(str(int(max(run_topics.max(), qtopics.max()))))

    def key(a):
        return np.char.zfill(np.asarray(a).astype(np.int64).astype(str), width)

    subtopics = qrels.subtopic.astype(np.int64)  # in numeric order (ndeval adds gains by subtopic number)
    sub_text = np.char.zfill(subtopics.astype(str), len(str(int(subtopics.max()))))
    _, values = evaluate_lists(key(qrels.qid), sub_text, qrels.docno,
                               np.minimum(qrels.grade, 1), key(t), run.docno[order], specs,
                               qids=key(run_topics))
    actual = len(qtopics) if complete else len(np.intersect1d(run_topics, qtopics))
    return run.tag, run_topics, values, actual


def _f(v: float) -> str:
    return "-nan" if math.isnan(v) else "%.6f" % v  # glibc prints x86's 0.0 / 0.0 as -nan


def format_ndeval(runid, topics, values, actual) -> str:
    """ndeval.c outputMeasures' text: header, one line per topic, amean (with a baseline: the
    numbers and run id of :func:`risk_table`)."""
    from ..metrics.diversity import NDEVAL_COLUMNS

    head = "runid,topic," + ",".join(m if k is None else f"{m}@{k}" for m, k in NDEVAL_COLUMNS)
    lines = [head]
    totals = [0.0] * len(NDEVAL_COLUMNS)
    for j, t in enumerate(topics.tolist()):
        col = values[:, j].tolist()
        lines.append(f"{runid},{t}," + ",".join(_f(v) for v in col))
        for i, v in enumerate(col):
            totals[i] += v  # in topic order, as ndeval adds them
    means = [(x / actual) if actual else math.nan for x in totals]
    lines.append(f"{runid},amean," + ",".join(_f(v) for v in means))
    return "\n".join(lines) + "\n"


def risk_based(run, base, risk_alpha: float):
    """ndeval.c's ``RiskBased(r, b, a)``, elementwise: ``r - b`` where ``r >= b``, else
    ``(a + 1) (r - b)`` (a NaN on either side gives NaN). Arrays of equal shape; float64 out."""
    r, b = np.asarray(run, dtype=np.float64), np.asarray(base, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(r >= b, r - b, (risk_alpha + 1.0) * (r - b))


def risk_table(run_table, base_table, risk_alpha: float, risk_text: str, complete: bool = False):
    """ndeval's risk-sensitive numbers from two :func:`ndeval_table` results (the run's and the
    baseline's, scored against the same qrels with the same options): ``(runid, topics, values,
    actual)`` as :func:`ndeval_table`'s, for :func:`format_ndeval`. ``topics``: the run's, and with
    ``complete`` (``-c``) the baseline's too, ascending; a side without the topic counts 0.
    ``actual``: the run table's divisor, or the number of topics printed when that is larger
    (ndeval.c 4.5 outputMeasures). An empty baseline table leaves the run's numbers as they are."""
    runid, topics, values, actual = run_table
    brunid, btopics, bvalues, _ = base_table
    if len(btopics) == 0:
        return run_table
    mine = {t: j for j, t in enumerate(topics.tolist())}
    theirs = {t: j for j, t in enumerate(btopics.tolist())}
    keep = sorted(set(mine) | (set(theirs) if complete else set()))
    zero = np.zeros(values.shape[0])
    out = np.empty((values.shape[0], len(keep)))
    for c, t in enumerate(keep):
        r = values[:, mine[t]] if t in mine else zero
        b = bvalues[:, theirs[t]] if t in theirs else zero
        out[:, c] = risk_based(r, b, risk_alpha)
    name = f"{runid} (rel to. {brunid}, rs=1+a, a={risk_text})"
    return name, np.asarray(keep, dtype=np.int64), out, max(actual, len(keep))


def _risk_alpha(text):
    """-riskAlpha's value: 0.0 when not given, None when not a finite number >= 0 (ndeval: usage)."""
    if text is None:
        return 0.0
    try:
        v = float(text)
    except ValueError:
        return None
    return v if 0.0 <= v < math.inf else None


def main(argv=None, out=None) -> int:
    out = sys.stdout if out is None else out
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    risk_alpha = _risk_alpha(args.riskAlpha)
    refused = None
    if risk_alpha is None:
        refused = f"-riskAlpha {args.riskAlpha}: the risk sensitivity must be a number >= 0"
    elif not 0.0 <= args.alpha <= 1.0 or not 0.0 <= args.beta <= 1.0:
        refused = f"-alpha and -beta must be between 0 and 1 (got {args.alpha}, {args.beta})"
    elif args.depth is not None and args.depth <= 0:
        refused = f"-M {args.depth}: the depth must be a positive integer"
    if refused:
        print(f"streameval ndeval: {refused}", file=sys.stderr)
        return EXIT_USAGE
    try:
        kw = dict(alpha=args.alpha, beta=args.beta, traditional=args.traditional, complete=args.complete,
                  depth=args.depth)
        table = ndeval_table(args.qrels, args.run, **kw)
        if args.baseline is not None:
            base = ndeval_table(args.qrels, args.baseline, **kw)
            table = risk_table(table, base, risk_alpha, args.riskAlpha if args.riskAlpha is not None else "0",
                               complete=args.complete)
    except (ValueError, OSError) as e:
        print(f"streameval ndeval: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    out.write(format_ndeval(*table))
    return EXIT_OK
