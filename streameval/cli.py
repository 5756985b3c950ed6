"""The ``streameval`` command.

Subcommands: see COMMANDS below (trec-eval, batch, ...) and ``convert`` (TREC run/qrels, Open
Bandit CSV, LightGBM LETOR and Yandex click logs, and JSON lines, CSV or Parquet tables with their
own column names, to Avro).

``trec-eval`` starts fast: it imports numpy and this package's metric layer only (no Beam).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "trec_eval_main"]

# trec_eval -R: the rel_info formats of its formats.c; qrels feeds the measures of streameval's engine,
# the others trec_eval's preference and judgment-group measures (streameval.commands.trec_prefs)
_REL_FORMATS = ("qrels", "prefs", "qrels_prefs", "qrels_jg")
#: trec_eval -v prints this (its Makefile's VERSIONID)
TREC_EVAL_VERSION = "10.0-rc3"
#: trec_eval.h: the value of a measure or query missing from the -Z file
MISSING_ZSCORE_VALUE = -1000000.0


def _trec_sort_key(spec):
    """trec_eval prints measures in the order of its measure table (measures.c, te_trec_measures),
    cutoffs and recall levels ascending; our own measures (dcg, err, hits, judged) after the nearest
    trec_eval ones: the registry's print order (streameval.metrics.registry.print_rank)."""
    from .metrics import registry

    level = float(spec.param) if registry.family(spec.family).trec_kind == "dcut" else 0.0
    return (registry.print_rank(spec.family, cut=spec.k is not None), -1 if spec.k is None else spec.k, level)


def _trec_eval_parser() -> argparse.ArgumentParser:
    from .metrics.prepare import DEFAULT_SCORE_PRECISION, SCORE_PRECISIONS

    p = argparse.ArgumentParser(
        prog="streameval trec-eval",
        description="Evaluate a TREC run against TREC qrels and print trec_eval's output format "
                    "(measure<TAB>query<TAB>value). A drop-in for trec_eval for the implemented measures.",
    )
    p.add_argument("qrels", help="TREC qrels file: qid iter docno grade ('-': standard input)")
    p.add_argument("run", help="TREC run file: qid Q0 docno rank score tag ('-': standard input)")
    p.add_argument("-m", dest="measures", action="append", default=None, metavar="MEASURE",
                   help="measure(s): trec_eval names (P_10, ndcg_cut_10, map_cut_100, recall_100, success_1, "
                        "recip_rank, Rprec, bpref, num_rel_ret, gm_map, iprec_at_recall_0.10, set_F, infAP, ...; "
                        "docs/metrics.md), trec_eval's parameter forms (P.5,10, ndcg_cut.10, rbp.p=0.95, "
                        "utility.2,-1,0,0, relstring.20), runid, num_q, our forms (ndcg@10, mrr@10, err@20), "
                        "'all_trec' or 'official' (default). Repeatable.")
    p.add_argument("-q", dest="per_query", action="store_true", help="also print each query's values")
    p.add_argument("-c", dest="complete", action="store_true",
                   help="average over every query of the qrels; queries without results score 0")
    p.add_argument("-l", dest="level", type=float, default=1,
                   help="relevance level: grade >= LEVEL is relevant for binary measures (default 1)")
    p.add_argument("-M", dest="depth", type=int, default=None,
                   help="evaluate only the top DEPTH documents of each query")
    p.add_argument("-n", dest="summary", action="store_false",
                   help="no summary: print no 'all' line (runid, num_q and the averages); with -q, the "
                        "queries' lines only")
    p.add_argument("-J", dest="judged_only", action="store_true",
                   help="judged documents only: unjudged retrieved documents are removed from the run "
                        "(after -M) before every measure; trec_eval warns this is easy to misuse")
    p.add_argument("-N", dest="num_docs", type=int, default=0, metavar="NUM",
                   help="number of documents in the collection (default 0); only utility's fourth "
                        "coefficient uses it")
    p.add_argument("-Z", dest="zscores", default=None, metavar="ZMEAN_FILE",
                   help="print Z scores (value - mean) / std_dev instead of values, mean and std_dev per "
                        "query and measure from ZMEAN_FILE ('qid measure mean std_dev' lines); missing: "
                        "-1000000; names prefixed with Z")
    p.add_argument("-R", dest="rel_format", default="qrels", metavar="FORMAT",
                   help="relevance file format: qrels (default), prefs ('qid jg jsg docno rel_level'; "
                        "-m all_prefs, -m prefs, prefs_*), qrels_prefs (qrels read as prefs), qrels_jg "
                        "('qid jg docno rel'; -m qrels_jg, map_avgjg, P_avgjg, Rprec_mult_avgjg)")
    p.add_argument("-D", dest="debug", default=None, metavar="LEVEL[.QID]",
                   help="trec_eval's debug level; LEVEL.QID evaluates query QID only (the level's debug "
                        "printouts are not reproduced)")
    p.add_argument("-o", dest="old_format", action="store_true",
                   help="trec_eval's old output format flag: accepted and ignored, as trec_eval 10 does")
    p.add_argument("-v", "--version", dest="version", action="store_true",
                   help=f"print trec_eval's version line (trec_eval version {TREC_EVAL_VERSION}) on stderr "
                        "and exit")
    p.add_argument("-T", dest="results_format", default="trec_results", metavar="FORMAT",
                   help="results file format: trec_results (the only one trec_eval has)")
    p.add_argument("--gain", choices=("linear", "exponential"), default="linear",
                   help="ndcg/dcg gain: linear (trec_eval, gain = grade) or exponential (2^grade - 1)")
    p.add_argument("--err-max-grade", type=float, default=4, help="ERR's maximum grade (default 4)")
    p.add_argument("--score-precision", choices=SCORE_PRECISIONS, default=DEFAULT_SCORE_PRECISION,
                   help="compare scores as doubles, as trec_eval 10 does (float64, default), or rounded to "
                        "single precision, as trec_eval 9 and pytrec_eval store them (float32)")
    return p


def _summary(spec, values, n, logs=True) -> float:
    """trec_eval's summary of a measure over ``n`` queries (meas_acc.c, meas_avg.c): the values added
    one after the other in query order (``cumsum`` adds sequentially, as trec_eval's accumulator; an
    exactly rounded sum can differ in the last bit, which shows when the mean is a 4-decimal tie),
    then the total of the counts, exp of the mean log for gm_map / gm_bpref (te_calc_avg_meas_s_gm;
    ``logs=False``: the values are logs already, as -Z's Z scores of the logs), else the sum
    divided by ``n``."""
    import math

    if len(values) == 0:
        return 0.0
    if spec.average == "geometric":
        total = 0.0
        for x in (math.log(v) for v in values.tolist()) if logs else values.tolist():
            total += x
        return math.exp(total / n)
    total = float(values.cumsum()[-1])
    return total if spec.is_count else total / n


def _trec_bare_name(m: str) -> str:
    """A cutoff measure named without parameters (``-m P``, ``-m map_cut``, ``-m success``) as
    trec_eval reads it: with its default cutoffs (measures.c: ``P.5,10,...,1000``); other names as
    given (``map`` stays map)."""
    from .metrics import registry

    name = m.strip()
    for f in registry.REGISTRY:
        if f.trec_cut_name == name and f.trec_defaults and f.trec_name != name:
            return name + "." + ",".join("%g" % d for d in f.trec_defaults)
    return m


def _trec_specs(asked, parse_metrics):
    """The specs of the -m arguments ``asked``, with trec_eval's rule for parameters (meas_init.c): a
    measure given with parameters (``-m P.5``, ``-m utility.2,-1,0,0``) is computed with the first
    parameters given for it only, not also with its defaults (``-m all_trec -m P.5`` prints P_5 and
    no other P)."""
    import re

    asked = [_trec_bare_name(m) for m in asked]
    first: dict = {}
    for m in asked:
        if re.fullmatch(r"[A-Za-z0-9_]+\..*", m.strip()):
            specs = parse_metrics([m])
            for key in {_trec_sort_key(s)[0] for s in specs if s.trec_name}:
                first.setdefault(key, [s for s in specs if _trec_sort_key(s)[0] == key])
    specs = [s for s in parse_metrics(asked) if not (s.trec_name and _trec_sort_key(s)[0] in first)]
    return specs + [s for group in first.values() for s in group]


def _fmt_value(spec, v, z=False) -> str:
    """trec_eval's ``%ld`` of a count (not under -Z), else ``%6.4f``; NaN (trec_eval's 0 / 0 under -J,
    whose sign bit is set on x86) as glibc prints it, ``  -nan``."""
    if v != v:
        return "  -nan"
    if spec.is_count and not z:
        return "%d" % round(v)
    return "%.4f" % v


def _to_zscores(values, specs, names, qids, table):
    """trec_eval -Z (convert_zscores.c) on the per-query values (rows: specs, columns: queries), in
    place: (value - mean) / std_dev with the query's mean and std_dev of the measure (by the name
    trec_eval prints) from ``table`` (:func:`streameval.io.trec_zscores.read_zscores`); a std_dev of 0
    gives 0 when the value is the mean; otherwise, or when the query or the measure is not in the
    table, :data:`MISSING_ZSCORE_VALUE`. gm_map / gm_bpref are converted as trec_eval keeps them,
    the log of the floored value."""
    import numpy as np

    for i, s in enumerate(specs):
        row = np.log(values[i]) if s.average == "geometric" else values[i]
        out = np.full(len(qids), MISSING_ZSCORE_VALUE)
        for j, q in enumerate(qids):
            ref = table.get(q, {}).get(names[i])
            if ref is None:
                continue
            mean, std = ref
            v = float(row[j])
            if std:
                out[j] = (v - mean) / std
            elif v == mean:
                out[j] = 0.0
        values[i] = out


from .exits import one_line as _one_line  # noqa: E402  (used by every command here)


def _trec_input_error(err: ValueError, run, qrels, run_path, qrels_path) -> ValueError:
    """The error to report for ``err`` raised while scoring: when the metric layer refused the input
    (non-finite score, duplicate docno or judgment), the same problem located at its file and line."""
    from .io import trec

    try:
        trec.check_run(run, run_path)
        trec.check_qrels(qrels, qrels_path)
    except trec.InputFormatError as located:
        return located
    except OSError:
        pass
    return err


def trec_eval_main(argv=None, out=None) -> int:
    """Run ``streameval trec-eval``; returns the exit status.

    0: ok; 1: nothing to evaluate (no query has both results and judgments); 2: bad input or usage
    (unreadable or malformed file, reported as one ``path:line: reason: 'line'`` line on stderr,
    unknown measure, bad option, a -R / -T format that is refused).

    ``-`` as the qrels or the run path reads that file from standard input (``sys.stdin``'s bytes,
    written to a temporary file first; errors name it ``-``).

    While it runs, numpy does not ask the kernel for transparent huge pages for its large arrays:
    the command touches each of its arrays once or twice, and on the benchmark machine (a VM)
    faulting in 2 MB pages cost 1-1.5 s more system time than 4 kB pages for the same ~800 MB
    (benchmarks/run.py --only files).
    """
    from .tuning import keep_freed_memory, no_numpy_hugepages

    keep_freed_memory()
    with no_numpy_hugepages():
        return _trec_eval_main(argv, out)


def _stdin_to_file(directory) -> str:
    """Standard input's bytes written to ``directory``/stdin; returns the path."""
    import os

    path = os.path.join(directory, "stdin")
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return path


def _trec_eval_main(argv, out) -> int:
    import tempfile

    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    if _asks_version(argv):
        # trec_eval.c: -v prints the version on stderr and exits 0, before reading any file
        print(f"trec_eval version {TREC_EVAL_VERSION}", file=sys.stderr)
        return 0
    try:
        args = _trec_eval_parser().parse_args(argv)
    except SystemExit as e:  # argparse: usage error (2) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    refused = None
    debug_query = None
    if args.debug is not None:
        # trec_eval.c get_debug_level_query: LEVEL or LEVEL.QID (atol of the level)
        level, dot, debug_query = args.debug.partition(".")
        if not dot:
            debug_query = None
        if not level.strip().lstrip("+-").isdigit():
            refused = f"-D {args.debug}: the debug level is not an integer (LEVEL or LEVEL.QID)"
    if refused:
        pass
    elif args.rel_format not in _REL_FORMATS:
        refused = (f"-R {args.rel_format}: unknown relevance file format (trec_eval's: "
                   f"{', '.join(_REL_FORMATS)})")
    elif args.results_format != "trec_results":
        refused = f"-T {args.results_format}: unknown results file format (trec_eval's: trec_results)"
    elif args.qrels == "-" and args.run == "-":
        refused = "qrels and run cannot both be '-' (standard input)"
    if refused:
        print(f"streameval trec-eval: {refused}", file=sys.stderr)
        return 2
    args.debug_query = debug_query
    if args.rel_format != "qrels" and "-" not in (args.qrels, args.run):
        from .commands.trec_prefs import run_trec_eval_rel_format

        return run_trec_eval_rel_format(args, out, debug_query)
    if args.rel_format == "qrels" and _qrels_measure_refused(args):
        return 2
    if "-" not in (args.qrels, args.run):
        return _trec_eval_run(args, out, None)
    with tempfile.TemporaryDirectory(prefix="streameval-trec-eval-") as d:
        path = _stdin_to_file(d)
        if args.qrels == "-":
            args.qrels = path
        else:
            args.run = path
        if args.rel_format != "qrels":
            from .commands.trec_prefs import run_trec_eval_rel_format

            return run_trec_eval_rel_format(args, out, debug_query)
        return _trec_eval_run(args, out, path)


def _asks_version(argv) -> bool:
    """trec_eval's getopt: ``-v`` / ``--version`` alone or among other flags without a value
    (``-qv``), before a ``--``."""
    for a in argv:
        if a == "--":
            return False
        if a == "--version":
            return True
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            for ch in a[1:]:
                if ch == "v":
                    return True
                if ch not in "hqcnJo":
                    break
    return False


def _qrels_measure_refused(args) -> bool:
    """A preference or judgment-group measure asked with -R qrels: one line on stderr (trec_eval
    stops with "Can't calculate measure")."""
    from .commands.trec_prefs import JG_MEASURES, JG_NICKNAMES, PREFS_NICKNAMES
    from .metrics.trec_prefs import PREFS_MEASURES

    for m in args.measures or []:
        name = m.strip().partition(".")[0]
        if name in PREFS_MEASURES or name in PREFS_NICKNAMES:
            need = "prefs or -R qrels_prefs"
        elif name in JG_MEASURES or name in JG_NICKNAMES:
            need = "qrels_jg"
        else:
            continue
        print(f"streameval trec-eval: measure {m!r} needs -R {need} (the relevance file read as "
              f"{'preferences' if 'prefs' in need else 'judgment groups'})", file=sys.stderr)
        return True
    return False


def _trec_eval_run(args, out, stdin_path) -> int:
    from .api import score_queries
    from .io import trec
    from .metrics import trec_names
    from .metrics.names import OFFICIAL_TREC, MetricNameError, parse_metrics

    def fail(e) -> int:
        text = _one_line(e)
        if stdin_path:
            text = text.replace(stdin_path, "-")
        print(f"streameval trec-eval: {text}", file=sys.stderr)
        return 2

    # trec_eval prints runid and num_q with its default measures, all_trec, or when named
    header = not args.measures or any(m in ("all_trec", "official") for m in args.measures)
    show_runid = header or "runid" in args.measures
    show_num_q = header or "num_q" in args.measures
    run = qrels = zscores = None
    try:
        # relstring (a string per query, printed with -q only): on with all_trec or when named; the
        # first parameters given win (trec_eval's meas_init.c)
        relstring = None
        want_relstring = any(m == "all_trec" for m in args.measures or [])
        asked = []
        for m in args.measures or []:
            if m in ("runid", "num_q"):
                continue
            r = trec_names.relstring(m)
            if r is None:
                asked.append(m)
                continue
            want_relstring = True
            if relstring is None and r[0] != "relstring":
                relstring = r
        if want_relstring and relstring is None:
            relstring = ("relstring", trec_names.RELSTRING_DEFAULT)
        specs = _trec_specs(asked, parse_metrics) if asked else ([] if args.measures else list(OFFICIAL_TREC))
        only_header = not specs  # -m runid / -m num_q alone: score one measure for the queries, print none
        specs = specs or parse_metrics(["num_ret"])
        if args.zscores is not None:
            from .io.trec_zscores import read_zscores

            zscores = read_zscores(args.zscores)
        # ids of regular ASCII files stay bytes (no str conversion); the rank column is only checked
        run, qrels = trec._read_for_eval(args.run, args.qrels)
        if len(run) == 0:
            raise trec.InputFormatError(args.run, None, "empty run file (no result lines)")
        if len(qrels) == 0:
            raise trec.InputFormatError(args.qrels, None, "empty qrels file (no judgment lines)")
        if getattr(args, "debug_query", None) is not None:
            # trec_eval -c averages over every query of the qrels even then (meas_avg.c: num_q_rels)
            import numpy as np

            args.complete_queries = len(np.unique(qrels.qid)) if args.complete else None
            args.complete_num_rel = float((qrels.grade > 0).sum())
            _only_query(run, qrels, args.debug_query)
        specs = sorted(specs, key=_trec_sort_key)

        def score(run, qrels, specs=specs):
            return score_queries(qrels, run, specs, relevance_level=args.level, gain=args.gain,
                                 err_max_grade=args.err_max_grade, complete=args.complete, depth=args.depth,
                                 judged_only=args.judged_only, num_docs_in_coll=args.num_docs,
                                 score_precision=args.score_precision, warn=False)

        try:
            try:
                specs, prep, values = score(run, qrels)
            except ValueError:
                if run.qid.dtype.kind != "S" and qrels.qid.dtype.kind != "S":
                    raise
                # refused: read as str (the messages name ids as str) and find the line behind it
                run, qrels = trec.read_run(args.run), trec.read_qrels(args.qrels)
                specs, prep, values = score(run, qrels)
        except ValueError as e:
            # the fast path does not look for bad lines; find the one behind the refusal
            raise _trec_input_error(e, run, qrels, args.run, args.qrels) from e
        if only_header:
            specs, values = [], values[:0]
    except (MetricNameError, ValueError, OSError) as e:
        return fail(e)
    if len(prep.qids) == 0:
        print("streameval trec-eval: no queries with both results and judgments", file=sys.stderr)
        return 1
    _print_trec_eval(args, out, specs, prep, values, run, qrels, relstring, zscores, show_runid, show_num_q)
    return 0


def _only_query(run, qrels, qid) -> None:
    """trec_eval -D LEVEL.QID: only query ``qid`` is evaluated (the others are skipped), in place."""
    import numpy as np

    for table, cols in ((run, ("qid", "docno", "score", "rank")), (qrels, ("qid", "docno", "grade"))):
        ids = np.asarray(table.qid)  # the fast reader's run-length columns too
        key = qid.encode("utf-8") if ids.dtype.kind == "S" else qid
        mask = ids == key
        if table is qrels and not mask.any():
            raise ValueError(f"-D: query {qid!r} is not in the qrels (trec_eval: no queries with both results and relevance info)")
        for c in cols:
            col = getattr(table, c)
            if col is not None:  # the fast reader leaves the run's rank column out
                setattr(table, c, np.asarray(col)[mask])


def _print_trec_eval(args, out, specs, prep, values, run, qrels, relstring, zscores, show_runid, show_num_q):
    """trec_eval's output (meas_print_single.c, meas_print_final.c): with -q each query's lines,
    measures in trec_eval's order, then unless -n the summary ('all') lines; under -Z every value
    is printed %6.4f and each measure's name but runid's is prefixed with Z."""
    write = out.write
    names = [s.trec_name or s.name for s in specs]
    qids = prep.qids.astype(str) if prep.qids.dtype.kind == "S" else prep.qids  # ASCII bytes
    z = zscores is not None
    if z:
        values = values.copy()
        _to_zscores(values, specs, names, [str(q) for q in qids], zscores)
    zp = "Z" if z else ""
    if args.per_query:
        # (sort key, spec index or None for relstring) in trec_eval's measure order
        rows = [(_trec_sort_key(s), i) for i, s in enumerate(specs) if s.average != "geometric"]  # gm_*: summary only
        strings = None
        if relstring is not None:
            from .metrics.trec_measures import relstrings

            strings = relstrings(prep.lists, relstring[1])
            if args.complete and not args.judged_only and relstring[0] != "relstring" and relstring[1] > 0:
                # trec_eval -c clears the string of a query without results only for the measure
                # named exactly relstring; relstring_N keeps its stand-in document's '-' (not judged)
                missing = set(prep.missing_qids.tolist())
                strings = ["-" if q in missing else t for q, t in zip(prep.qids.tolist(), strings)]
            from .metrics import registry

            rows.append(((registry.print_rank("relstring"), -1, 0.0), None))
        rows.sort(key=lambda r: r[0])
        order = [i for _, i in rows]
        for j, q in enumerate(qids):
            for i in order:
                if i is None:
                    write("%-22s\t%s\t'%s'\n" % (relstring[0], q, strings[j]))
                else:
                    write("%s%-22s\t%s\t%s\n" % (zp, names[i], q, _fmt_value(specs[i], values[i, j], z)))
    if not args.summary:
        return
    if show_runid:
        write("%-22s\t%s\t%s\n" % ("runid", "all", run.tag))
    import numpy as np

    n = len(prep.qids)
    # -c -D LEVEL.QID: trec_eval averages over all the queries of the qrels (meas_avg.c: num_q_rels),
    # a geometric mean counting MIN_GEO_MEAN for each query not evaluated
    n_avg = max(n, getattr(args, "complete_queries", None) or 0)
    if show_num_q:
        write("Z%-22s\t%s\t%.4f\n" % ("num_q", "all", n_avg) if z else "%-22s\t%s\t%d\n" % ("num_q", "all", n_avg))
    for i, s in enumerate(specs):
        if s.family == "num_rel" and args.complete:
            # trec_eval 10 (m_num_rel.c, te_calc_avg_num_rel): under -c the summary counts every
            # qrels line with grade > 0, whatever -l says (and -Z does not convert it).
            total = getattr(args, "complete_num_rel", None) or float((qrels.grade > 0).sum())
        elif s.average == "geometric" and n_avg > n:
            from .metrics.trec_names import MIN_GEO_MEAN

            filled = np.concatenate([values[i], np.full(n_avg - n, MIN_GEO_MEAN if not z else np.log(MIN_GEO_MEAN))])
            total = _summary(s, filled, n_avg, logs=not z)
        else:
            total = _summary(s, values[i], n_avg, logs=not z)
        write("%s%-22s\t%s\t%s\n" % (zp, names[i], "all", _fmt_value(s, total, z)))


def _convert_parser(sub) -> None:
    c = sub.add_parser("convert", help="convert TREC, Open Bandit, LETOR, Yandex or generic table logs to Avro; "
                                           "simulate an interleaved log from two TREC runs")
    cs = c.add_subparsers(dest="kind", required=True)
    r = cs.add_parser("trec-run", help="TREC run -> impressions Avro")
    r.add_argument("run")
    r.add_argument("output")
    r.add_argument("--system", default=None, help="system id (default: the run's tag)")
    r.add_argument("--timestamp", type=int, default=0, help="event time of every impression, micros")
    q = cs.add_parser("qrels", help="TREC qrels -> judgments Avro")
    q.add_argument("qrels")
    q.add_argument("output")
    o = cs.add_parser("obd", help="Open Bandit Dataset CSV -> impressions Avro")
    o.add_argument("csv")
    o.add_argument("output")
    o.add_argument("--system", required=True, help="logging policy, e.g. bts or random")
    o.add_argument("--campaign", default=None)
    lt = cs.add_parser("letor", help="LightGBM LETOR sample -> impressions and judgments Avro")
    lt.add_argument("data")
    lt.add_argument("query")
    lt.add_argument("impressions_output")
    lt.add_argument("judgments_output")
    lt.add_argument("--feature", type=int, default=1, help="feature column used as the score")
    y = cs.add_parser("yandex", help="Yandex WSCD click log sample -> impressions Avro")
    y.add_argument("log")
    y.add_argument("output")
    tb = cs.add_parser("table", help="JSON lines, CSV or Parquet log with its own column names -> impressions or "
                                     "judgments Avro (bad rows to dead letters)")
    tb.add_argument("input", help="the log file (.jsonl/.ndjson/.json, .csv, .parquet/.pq, or --format)")
    tb.add_argument("--kind", dest="table_kind", required=True, choices=("impressions", "judgments"))
    tb.add_argument("--out", required=True, help="Avro file to write")
    tb.add_argument("--map", default=None, metavar="FIELD=COLUMN,...",
                    help="schema field = the file's column, e.g. request_id=rid,item_id=doc (a field not named is "
                         "read from the column of its own name)")
    tb.add_argument("--format", default="auto", choices=("auto", "jsonl", "csv", "parquet"))
    tb.add_argument("--dead-letters", default=None, metavar="DL.jsonl",
                    help="where rejected rows go (.jsonl or .avro; default OUT's name + .dead_letters.jsonl, "
                         "written when a row is rejected)")
    tb.add_argument("--timestamp-unit", default=None, choices=("s", "ms", "us", "iso"),
                    help="integer timestamps in s, ms or us since the epoch, or ISO 8601 text (default: iso; "
                         "integer columns need the unit)")
    tb.add_argument("--attributes", default=None, metavar="COL,...",
                    help="columns kept in the impressions' attributes map (for --slices)")
    il = cs.add_parser("interleave", help="two TREC runs + qrels -> a simulated interleaved impression log "
                                          "(team in attributes[\"team\"], cascade clicks)")
    il.add_argument("--run-a", required=True, help="TREC run of ranker A")
    il.add_argument("--run-b", required=True, help="TREC run of ranker B")
    il.add_argument("--qrels", required=True, help="TREC qrels: the grades the simulated clicks follow")
    il.add_argument("--output", required=True, help="impressions Avro")
    il.add_argument("--method", choices=("team_draft", "balanced"), default="team_draft")
    il.add_argument("--seed", type=int, default=0, help="seed of the coins and clicks")
    il.add_argument("--click-model", choices=("cascade",), default="cascade")
    il.add_argument("--depth", type=int, default=10, help="items shown per interleaved list")
    il.add_argument("--sessions", type=int, default=1, help="interleaved requests per query")
    il.add_argument("--system", default=None, help="experiment id (system_id; default TAG_A-vs-TAG_B)")


def _convert_main(args) -> int:
    """Run ``streameval convert``: 0 ok, 2 bad input (one ``path:line: reason: 'line'`` line on stderr)."""
    from .io import avro, convert, trec

    if args.kind == "table":
        return _convert_table_main(args)
    try:
        n = _convert(args, avro, convert, trec)
    except (ValueError, OSError) as e:
        print(f"streameval convert: {_one_line(e)}", file=sys.stderr)
        return 2
    print(f"wrote {n} records", file=sys.stderr)
    return 0


def _convert_table_main(args) -> int:
    """Run ``streameval convert table``: 0 written (some rows may be dead letters), 2 bad options or
    input (one line), 3 every row rejected (the dead letters say why)."""
    import os

    from .exits import EXIT_INPUT_CHECK, EXIT_OK, EXIT_USAGE
    from .io import convert_table as ct

    attributes = [a.strip() for a in (args.attributes or "").split(",") if a.strip()]
    dl = args.dead_letters
    if dl is None:
        stem = args.out[:-5] if args.out.endswith(".avro") else args.out
        dl = stem + ".dead_letters.jsonl"
    try:
        res = ct.convert_table(args.input, args.table_kind, args.out, ct.parse_mapping(args.map), args.format,
                               timestamp_unit=args.timestamp_unit, attributes=attributes)
        if res.dead_letters or args.dead_letters is not None:
            ct._write_dead_letters(dl, res.dead_letters)
        elif os.path.exists(dl):
            os.remove(dl)  # a previous run's dead letters would say this input has bad rows
    except (ValueError, OSError) as e:
        print(f"streameval convert table: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    if res.ignored:
        hint = " (keep them with --attributes)" if args.table_kind == "impressions" else ""
        print(f"ignored {len(res.ignored)} column(s) no field is mapped to: {', '.join(res.ignored)}{hint}",
              file=sys.stderr)
    where = f" ({dl})" if res.dead_letters else ""
    print(f"wrote {res.written} records to {args.out}; {len(res.dead_letters)} rows became dead letters{where}",
          file=sys.stderr)
    if res.written == 0:
        print("streameval convert table: every row was rejected", file=sys.stderr)
        return EXIT_INPUT_CHECK
    return EXIT_OK


def _convert(args, avro, convert, trec) -> int:
    """Convert as ``args`` say; returns the number of records written."""
    if args.kind == "trec-run":
        from .io.records import check_timestamp

        bad_time = check_timestamp(args.timestamp)  # a converter refuses what the jobs would reject
        if bad_time:
            raise ValueError(f"--timestamp: {bad_time}")
        run = trec.read_run(args.run, check=True)
        if len(run) == 0:
            raise trec.InputFormatError(args.run, None, "empty run file (no result lines)")
        recs = convert.trec_run_to_impressions(run, system_id=args.system, timestamp_micros=args.timestamp)
        return _write(avro, args.output, "impression", recs)
    if args.kind == "qrels":
        qrels = trec.read_qrels(args.qrels, check=True)
        if len(qrels) == 0:
            raise trec.InputFormatError(args.qrels, None, "empty qrels file (no judgment lines)")
        convert.check_qrels_grades(qrels, args.qrels)
        return _write(avro, args.output, "judgment", convert.trec_qrels_to_judgments(qrels))
    if args.kind == "obd":
        return _write(avro, args.output, "impression",
                      convert.obd_to_impressions(args.csv, args.system, campaign=args.campaign))
    if args.kind == "interleave":
        runs = []
        for path in (args.run_a, args.run_b):
            run = trec.read_run(path, check=True)
            if len(run) == 0:
                raise trec.InputFormatError(path, None, "empty run file (no result lines)")
            runs.append(run)
        qrels = trec.read_qrels(args.qrels, check=True)
        return _write(avro, args.output, "impression", convert.trec_runs_to_interleaved_impressions(
            runs[0], runs[1], qrels, method=args.method, seed=args.seed, click_model=args.click_model,
            depth=args.depth, sessions=args.sessions, system_id=args.system))
    if args.kind == "letor":
        imps, judg = convert.letor_to_records(args.data, args.query, feature=args.feature)
        return (_write(avro, args.impressions_output, "impression", imps)
                + _write(avro, args.judgments_output, "judgment", judg))
    return _write(avro, args.output, "impression", convert.yandex_to_impressions(args.log))


def _write(avro, path, name, records) -> int:
    records = list(records)
    avro.write_records(path, name, records)
    return len(records)


class _BeamNoise:
    """Drops two messages Beam logs on every local run that say nothing about the user's job:
    the GCP client libraries being absent, and a sink replacing the previous run's output file; and
    the traceback Beam logs when Ctrl-C or SIGTERM stops a bundle (:mod:`streameval.interrupts`)."""

    def filter(self, record) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            return False  # Ctrl-C or SIGTERM inside a bundle: the command says so in one line
        msg = record.getMessage()
        return not (msg.startswith("apitools not found") or msg.startswith("Deleting 1 existing files"))


def _quiet_beam_noise() -> None:
    import logging

    logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")
    noise = _BeamNoise()
    for handler in logging.getLogger().handlers:
        handler.addFilter(noise)


# Subcommands that own their arguments: name -> (module, function, uses Beam, help). Imported only
# when called, so each command starts with just what it needs.
COMMANDS = {
    "trec-eval": ("streameval.cli", "trec_eval_main", False,
                  "trec_eval-compatible evaluation of a TREC run (streameval trec-eval -h)"),
    "ndeval": ("streameval.commands.ndeval", "main", False,
               "ndeval's diversity evaluation (alpha-nDCG, ERR-IA, NRBP, ...) of a TREC run against subtopic qrels"),
    "batch": ("streameval.jobs.batch", "main", True, "Beam batch job over Avro logs (streameval batch -h)"),
    "stream": ("streameval.jobs.stream", "main", True,
               "Beam streaming job with event-time windows, early/on-time/late panes (streameval stream -h)"),
    "ope": ("streameval.jobs.ope", "main", True,
            "off-policy (IPS, SNIPS) estimates of a target policy's CTR from logged propensities (streameval ope -h)"),
    "reconcile": ("streameval.commands.reconcile", "main", False,
                  "compare two metric tables: differences, one-sided rows, correlation"),
    "compare": ("streameval.commands.compare", "main", False, "paired comparison of two runs on the same queries"),
    "report": ("streameval.commands.report", "main", False, "PNG plots and an HTML page from metric rows"),
    "produce": ("streameval.commands.produce", "main", False,
                "impression, judgment or click records from Avro files into a Kafka topic (streameval produce -h)"),
    "dashboard": ("streameval.commands.dashboard", "main", False,
                  "a live page of a job's panes, alerts and record accounting (streameval dashboard -h)"),
    "fuse": ("streameval.commands.fuse", "main", False,
             "rank fusion of TREC runs (RRF, CombSUM, CombMNZ, ISR, Borda, ...) into one TREC run, as ranx"),
    "alerts-to-prometheus": ("streameval.commands.alerts_to_prometheus", "main", False,
                             "TOML alert rules as Prometheus alerting rules over the exported gauges"),
    "cluster": ("streameval.commands.cluster", "main", False,
                "fetch the engines; start, inspect or stop a local Flink cluster or Prism (streameval cluster -h)"),
}

#: the Beam jobs' command lines, in modules that import no Beam: parsed before the job's module (and
#: so Beam, about 2.5 s) is imported, so that --help and argument errors answer at once
PARSERS = {"batch": "streameval.jobs.batch_args", "stream": "streameval.jobs.stream_args", "ope": "streameval.jobs.ope_args"}


def package_version() -> str:
    """The installed package's version (its metadata), else this checkout's ``streameval.__version__``
    (run from a clone without installing)."""
    from importlib import metadata

    try:
        return metadata.version("streameval")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def main(argv=None) -> int:
    """Run ``streameval ARGV``; returns the exit status. A reader that stops reading the output
    (``streameval trec-eval ... | head -1``) ends the command quietly with status 141 (128 + SIGPIPE,
    what the shell reports for a program SIGPIPE ended): Python's recipe (docs of ``signal``, "Note on
    SIGPIPE"): standard output flushed inside the ``try``, then pointed at ``os.devnull`` so that the
    flush at exit raises nothing more."""
    import os

    from . import interrupts
    from .exits import EXIT_BROKEN_PIPE

    own_process = argv is None  # the console script (or ``sys.exit(main())``), not a caller's test
    argv = list(sys.argv[1:] if argv is None else argv)
    name = "streameval " + argv[0] if argv and argv[0] in COMMANDS else "streameval"
    previous = interrupts.install()
    try:
        status = _main(argv)
        sys.stdout.flush()  # a broken pipe shows here, inside the try, not at the interpreter's exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the jobs' cleanup ran on the way out
        stop = e if isinstance(e, interrupts.Interrupted) else interrupts.Interrupted(2)
        # the jobs that publish a run's outputs only when it ends (stream's live sources publish panes)
        staged = argv[:1] in (["batch"], ["ope"]) or (argv[:1] == ["stream"] and "--replay" in argv)
        note = (": nothing of this run was published (an output folder keeps its previous run's outputs)"
                if staged else "")
        # what the job did on the way out, e.g. "the job on the runner was cancelled" (a job on Flink, Prism)
        note += "".join(f"; {n}" for n in getattr(e, "__notes__", ()))
        print(f"{name}: stopped by {stop.name}{note}", file=sys.stderr)
        if own_process:  # a thread Beam left running cannot keep the process from ending
            interrupts.exit_within(128 + stop.signum)
        return 128 + stop.signum
    finally:
        interrupts.restore(previous)
    return status


def _main(argv) -> int:
    import importlib

    if argv[:1] in (["--version"], ["-V"]):
        print(f"streameval {package_version()}")
        return 0
    if argv and argv[0] in COMMANDS:
        module, func, beam, _ = COMMANDS[argv[0]]
        if argv[0] in PARSERS:
            parsing = importlib.import_module(PARSERS[argv[0]])
            try:  # the job parses the same arguments again, once Beam is imported
                args, _ = parsing.build_arg_parser().parse_known_args(argv[1:])
            except SystemExit as e:  # argparse: --help (0) or a usage error (2, its message printed)
                return e.code if isinstance(e.code, int) else 2
            if hasattr(parsing, "check_local_inputs"):
                try:  # a bad glob, a missing file, a CSV given as Avro: before Beam starts
                    parsing.check_local_inputs(args)
                except (ValueError, OSError) as e:
                    print(f"error: {_one_line(e)}", file=sys.stderr)
                    return 2
        if beam:
            from .tuning import keep_freed_memory

            keep_freed_memory()  # before Beam's imports start threads (see its docstring)
            _quiet_beam_noise()
        elif argv[0] in ("trec-eval", "ndeval"):
            from .tuning import one_blas_thread_at_import

            one_blas_thread_at_import()
        return getattr(importlib.import_module(module), func)(argv[1:])
    p = argparse.ArgumentParser(prog="streameval", description=__doc__.split("\n\n")[0])
    p.add_argument("-V", "--version", action="store_true", help="print the package's version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (_, _, _, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text)
    _convert_parser(sub)
    args = p.parse_args(argv)
    if args.command == "convert":
        return _convert_main(args)
    p.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
