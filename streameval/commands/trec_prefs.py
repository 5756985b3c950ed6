"""``streameval trec-eval -R prefs | qrels_prefs | qrels_jg``: trec_eval 10's preference measures
(``-m all_prefs``, ``-m prefs``, ``prefs_*``) and judgment-group measures (``-m qrels_jg``,
``map_avgjg``, ``P_avgjg[.k1,k2]``, ``Rprec_mult_avgjg[.m1,m2]``), printed as trec_eval prints them.

Definitions: :mod:`streameval.metrics.trec_prefs`; file formats: :mod:`streameval.io.trec_prefs`.
Queries: those of the relevance file (trec_eval's order, sorted ids) that the run has; with -c
every query of the relevance file, one without results ranked as trec_eval ranks it (one document
outside the judgments).  Documents are ranked by score, ties broken by docno ascending for the
preferences (form_prefs_counts.c) and descending for the judgment groups (form_res_rels_jg.c).
"""

from __future__ import annotations

import sys

__all__ = ["run_trec_eval_rel_format", "PREFS_NICKNAMES", "JG_NICKNAMES"]

#: measures.c: the nicknames of these formats (runid and num_q included)
PREFS_NICKNAMES = {"all_prefs": 14, "prefs": 6}  # the first N of PREFS_MEASURES
JG_NICKNAMES = {"qrels_jg": ("map_avgjg", "P_avgjg", "Rprec_mult_avgjg")}
JG_MEASURES = ("map_avgjg", "P_avgjg", "Rprec_mult_avgjg")
#: trec_eval.c: the stand-in ranking of a query without results under -c
_BOGUS = ("ceci_nest_pas_un_docno", 1.0)


class _Refused(ValueError):
    pass


def _parse_measures(asked, rel_format):
    """(wanted names in trec_eval's order, P_avgjg cutoffs, Rprec_mult_avgjg multiples, runid shown,
    num_q shown) for the -m arguments ``asked`` under ``-R rel_format``; _Refused (one line) for a
    measure this format does not feed."""
    from ..metrics import trec_prefs as tp

    prefs = rel_format in ("prefs", "qrels_prefs")
    allowed = tp.PREFS_MEASURES if prefs else JG_MEASURES
    wanted, params = set(), {}
    runid = num_q = False
    if not asked:
        raise _Refused(f"-R {rel_format}: the default measures ('official') need -R qrels; name this format's "
                       f"measures with -m ({'all_prefs, prefs' if prefs else 'qrels_jg'} or single names)")
    for raw in asked:
        name, dot, param = raw.strip().partition(".")
        if dot and not param:
            raise _Refused(f"-m {raw}: empty parameter list")
        if prefs and name in PREFS_NICKNAMES or not prefs and name in JG_NICKNAMES:
            members = tp.PREFS_MEASURES[:PREFS_NICKNAMES[name]] if prefs else JG_NICKNAMES[name]
            wanted.update(members)
            runid = num_q = True
            continue
        if name == "runid":
            runid = True
            continue
        if name == "num_q":
            num_q = True
            continue
        if name in allowed:
            wanted.add(name)
            if dot:
                if name not in ("P_avgjg", "Rprec_mult_avgjg"):
                    raise _Refused(f"-m {raw}: {name} takes no parameter")
                params.setdefault(name, param)  # the first parameters given win (meas_init.c)
            continue
        other = ("prefs or qrels_prefs" if name in tp.PREFS_MEASURES or name in PREFS_NICKNAMES
                 else "qrels_jg" if name in JG_MEASURES or name in JG_NICKNAMES else "qrels")
        raise _Refused(f"-R {rel_format}: measure {raw!r} needs -R {other}")
    cut = tp.P_AVGJG_DEFAULT
    if "P_avgjg" in params:
        cut = sorted({_long_cutoff(x, params["P_avgjg"]) for x in params["P_avgjg"].split(",")})
    mult = tp.RPREC_MULT_AVGJG_DEFAULT
    if "Rprec_mult_avgjg" in params:
        mult = sorted({_number(x, params["Rprec_mult_avgjg"]) for x in params["Rprec_mult_avgjg"].split(",")})
    order = [m for m in allowed if m in wanted]
    return order, tuple(cut), tuple(mult), runid, num_q


def _number(text, raw):
    try:
        v = float(text)
    except ValueError:
        raise _Refused(f"-m ...{raw}: parameter {text!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise _Refused(f"-m ...{raw}: parameter {text!r} is not finite")
    return v


def _long_cutoff(text, raw):
    v = _number(text, raw)
    if not 1 <= v < 2**31:
        raise _Refused(f"-m P_avgjg.{raw}: cutoff {text!r} must be a positive integer")
    return int(v)


def _runs_by_query(run, score_precision):
    """{qid: (docnos, scores)} of a :class:`~streameval.io.trec.TrecRun`, the scores as the ranking
    compares them (``score_precision``: :func:`~streameval.metrics.prepare.ranking_scores`)."""
    import numpy as np

    from ..metrics.prepare import ranking_scores

    qid = run.qid.astype(str) if run.qid.dtype.kind == "S" else run.qid
    docno = run.docno.astype(str) if run.docno.dtype.kind == "S" else run.docno
    order = np.argsort(qid, kind="stable")
    q, d, s = qid[order], docno[order], ranking_scores(run.score, score_precision).astype(np.float64)[order]
    cuts = np.flatnonzero(q[1:] != q[:-1]) + 1
    out = {}
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(q)].tolist()):
        if b > a:
            out[str(q[a])] = (d[a:b].tolist(), s[a:b].tolist())
    return out


def _ranked(docnos, scores, depth, docno_descending):
    """trec_eval's ranking: score descending, ties by docno (ascending or descending), the top
    ``depth`` (-M)."""
    idx = sorted(range(len(docnos)), key=lambda i: docnos[i], reverse=docno_descending)
    idx.sort(key=lambda i: -scores[i])
    if depth is not None:
        idx = idx[:max(depth, 0)]
    return [docnos[i] for i in idx]


def _query_values(rel_format, judgments, ranked, wanted, cut, mult, args, notes):
    """[(name, value, is_count)] of one query, in print order; ``notes`` (a set) gets the warnings."""
    from ..metrics import trec_prefs as tp

    if rel_format != "qrels_jg":
        jg, jsg, level, docno = judgments
        q = tp.query_prefs(jg, jsg, level, docno, ranked)
        vals = tp.prefs_values(q, wanted)
        for name in sorted(q.notes):
            notes.add(f"{name}: a judgment group with negative rel_levels and fewer documents in its lowest "
                      f"class than relevant ones; trec_eval reads past that class (undefined), here it stops "
                      f"at its end")
        return [(m, vals[m], m in tp.PREFS_COUNTS) for m in wanted]
    groups = []
    for grades in judgments.values():
        ranked_grades = []
        for d in ranked:
            g = grades.get(d)
            v = tp.NONPOOL if g is None else tp.UNJUDGED if g < 0 else g
            if args.judged_only and v < 0:
                continue
            ranked_grades.append(v)
        groups.append((ranked_grades, list(grades.values())))
    vals = tp.jg_values(groups, level=args.level, p_cutoffs=cut, rprec_mults=mult, wanted=wanted)
    out = []
    if "map_avgjg" in wanted:
        out.append(("map_avgjg", vals["map_avgjg"], False))
    if "P_avgjg" in wanted:
        out += [("P_avgjg_%d" % k, v, False) for k, v in zip(cut, vals["P_avgjg"])]
    if "Rprec_mult_avgjg" in wanted:
        out += [("Rprec_mult_avgjg_%3.2f" % m, v, False) for m, v in zip(mult, vals["Rprec_mult_avgjg"])]
    return out


def _z(table, qid, name, v):
    """convert_zscores.c: (value - mean) / std_dev; missing: -1000000."""
    ref = table.get(qid, {}).get(name)
    if ref is None:
        return -1000000.0
    mean, std = ref
    if std:
        return (v - mean) / std
    return 0.0 if v == mean else -1000000.0


def run_trec_eval_rel_format(args, out, debug_query=None) -> int:
    """``streameval trec-eval`` with ``-R prefs``, ``-R qrels_prefs`` or ``-R qrels_jg`` (``args``:
    the parsed command line); returns the exit status (0, 1 when no query has both judgments and
    results, 2 on bad input or usage, the error on stderr as one line)."""
    from ..exits import one_line
    from ..io import trec
    from ..io.trec_prefs import read_rel_info

    fmt = args.rel_format
    try:
        wanted, cut, mult, show_runid, show_num_q = _parse_measures(args.measures or [], fmt)
        table = None
        if args.zscores is not None:
            from ..io.trec_zscores import read_zscores

            table = read_zscores(args.zscores)
        rel = read_rel_info(args.qrels, fmt)
        if not rel:
            raise trec.InputFormatError(args.qrels, None, f"empty {fmt} file (no judgment lines)")
        if debug_query is not None and debug_query not in rel:
            raise ValueError(f"-D: query {debug_query!r} is not in the {fmt} file (trec_eval: no queries with both results and relevance info)")
        run = trec.read_run(args.run, check=True)
        if len(run) == 0:
            raise trec.InputFormatError(args.run, None, "empty run file (no result lines)")
        by_query = _runs_by_query(run, args.score_precision)
        rows = []  # (qid, [(name, value, is_count)])
        notes: set = set()
        for qid, judgments in rel.items():
            if debug_query is not None and qid != debug_query:
                continue
            if qid in by_query:
                docnos, scores = by_query[qid]
            elif args.complete:
                docnos, scores = [_BOGUS[0]], [_BOGUS[1]]
            else:
                continue
            ranked = _ranked(docnos, scores, args.depth, docno_descending=fmt == "qrels_jg")
            try:
                rows.append((qid, _query_values(fmt, judgments, ranked, wanted, cut, mult, args, notes)))
            except ValueError as e:
                raise ValueError(f"{args.qrels}: query {qid!r}: {e}") from None
    except (ValueError, OSError) as e:
        print(f"streameval trec-eval: {one_line(e)}", file=sys.stderr)
        return 2
    for note in sorted(notes):
        print(f"streameval trec-eval: warning: {note}", file=sys.stderr)
    if not rows:
        print("streameval trec-eval: no queries with both results and judgments", file=sys.stderr)
        return 1
    z = table is not None
    zp = "Z" if z else ""
    write = out.write
    if z:
        rows = [(q, [(n, _z(table, q, n, v), c) for n, v, c in vals]) for q, vals in rows]

    def fmt_value(v, count):
        if v != v:
            return "  -nan"
        return "%d" % v if count and not z else "%6.4f" % v

    if args.per_query:
        for qid, vals in rows:
            for name, v, count in vals:
                write("%s%-22s\t%s\t%s\n" % (zp, name, qid, fmt_value(v, count)))
    if not args.summary:
        return 0
    if show_runid:
        write("%-22s\t%s\t%s\n" % ("runid", "all", run.tag))
    # under -c trec_eval averages over every query of the relevance file (meas_avg.c: num_q_rels),
    # which differs from the queries evaluated with -D LEVEL.QID only
    n = len(rel) if args.complete else len(rows)
    if show_num_q:
        write("Z%-22s\tall\t%.4f\n" % ("num_q", n) if z else "%-22s\tall\t%d\n" % ("num_q", n))
    for i, (name, _, count) in enumerate(rows[0][1]):
        total = 0.0
        for _, vals in rows:
            total += vals[i][1]  # te_acc_meas_s: added in query order
        write("%s%-22s\t%s\t%s\n" % (zp, name, "all", fmt_value(total if count else total / n, count)))
    return 0
