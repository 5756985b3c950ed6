"""``streameval fuse RUN RUN... --method rrf [--norm min-max] [--param k=60] -o OUT``: rank fusion of
TREC run files into one TREC run file (6 columns, run tag ``fused`` or ``--tag``), as ranx's ``fuse``
(:func:`streameval.fusion.fuse`; docs/metrics.md, "Rank fusion"). With ``--qrels QRELS``, a trained
method (posfuse, probfuse, ...) learns its parameters from those judgments first
(:func:`streameval.fusion.train`), and ``--optimize METRIC`` searches the method's parameters as ranx's
``optimize_fusion`` (:func:`streameval.fusion.optimize`); the parameters used are printed to standard
output as one JSON object. Exit 2 with one line for an unknown method, normalisation, parameter or
metric (naming the closest), a missing or malformed run or qrels file or an output that cannot be
written. Does not import Beam.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..exits import EXIT_OK, EXIT_USAGE, one_line

__all__ = ["main", "build_arg_parser", "parse_params"]


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval fuse",
        description="Fuse TREC runs of the same queries into one TREC run (ranx's fusion methods and normalisations).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="TREC run files (two or more; .gz read as gzip)")
    p.add_argument("--method", default="rrf",
                   help="rrf (default), isr, log_isr, logn_isr, combsum, combmnz, combmax, combmin, combmed, "
                        "combanz, combgmnz, wsum, wmnz, bordafuse, w_bordafuse, rbc, condorcet, w_condorcet, mixed "
                        "(ranx's names sum, mnz, ... too; the trained posfuse, probfuse, mapfuse, segfuse, slidefuse, "
                        "bayesfuse are fused in Python)")
    p.add_argument("--norm", default="min-max",
                   help="score normalisation before fusing: min-max (default, as ranx.fuse), min-max-inverted, "
                        "max, sum, zmuv, rank, borda, none")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a method parameter, repeatable: k=60 (rrf), gamma=0.5 (combgmnz), sigma=0.01 (logn_isr), "
                        "phi=0.8 (rbc), weights=0.7,0.3 (wsum, wmnz, w_bordafuse, w_condorcet, mixed: one per run, "
                        "in the order of the runs)")
    p.add_argument("--qrels", metavar="QRELS", help="TREC qrels to learn a trained method's parameters from, or "
                                                    "to search them with --optimize")
    p.add_argument("--optimize", metavar="METRIC", help="search the method's parameters for the best METRIC on "
                                                        "--qrels (ranx's optimize_fusion grid; e.g. ndcg@10)")
    p.add_argument("--n-segments", type=int, help="probfuse's number of segments, learnt with --qrels "
                                                  "(with --optimize: searched 1-100)")
    p.add_argument("-o", "--output", required=True, help="the fused TREC run file to write (.gz: compressed)")
    p.add_argument("--tag", default="fused", help="run tag of the output's 6th column (default fused)")
    return p


def parse_params(items) -> dict:
    """``["k=60", "weights=0.7,0.3"]`` -> ``{"k": "60", "weights": ["0.7", "0.3"]}`` (values checked by
    the method); ValueError for an item without ``=``."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--param {item!r}: expected NAME=VALUE, e.g. k=60 or weights=0.7,0.3")
        name = name.strip()
        if name in out:
            raise ValueError(f"--param {name} given twice")
        out[name] = [v.strip() for v in value.split(",")] if name == "weights" else value.strip()
    return out


def main(argv=None) -> int:
    args = build_arg_parser().parse_args(argv)
    from ..fusion import TRAINED, fuse, method_name
    from ..metrics.names import MetricNameError

    try:
        params = _learnt_params(args, TRAINED, method_name)
        fused = fuse(list(args.runs), args.method, args.norm, params=params)
    except (ValueError, TypeError, OSError, MetricNameError) as e:
        print(f"streameval fuse: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    if args.qrels:
        print(json.dumps(_jsonable(params)))
    try:
        fused.write_trec(args.output, args.tag)
    except (ValueError, OSError) as e:
        print(f"streameval fuse: cannot write {args.output}: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    c = fused.columns
    print(f"fused {len(args.runs)} runs ({fused.method}, norm {fused.norm}): {len(set(c.qid.tolist()))} queries, "
          f"{len(c.qid)} documents -> {args.output}", file=sys.stderr)
    return EXIT_OK


def _learnt_params(args, trained, method_name) -> dict:
    """The parameters to fuse with: ``--param``'s, or learnt / searched on ``--qrels`` (ValueError for a
    trained method without ``--qrels``, or ``--optimize`` without it)."""
    from ..fusion import optimize, train

    method = method_name(args.method)
    if args.optimize and not args.qrels:
        raise ValueError("--optimize needs --qrels (the judgments it scores each configuration on)")
    if not args.qrels:
        if method in trained:
            raise ValueError(f"{method} learns its parameters from judgments: give them with --qrels QRELS "
                             "(or train in Python: streameval.fusion.train)")
        return parse_params(args.param)
    if args.param:
        raise ValueError("--param and --qrels: the parameters are either given or learnt, not both")
    if args.optimize:
        if args.n_segments is not None:
            raise ValueError("--n-segments with --optimize: probfuse's segments are searched (1-100)")
        return optimize(args.qrels, list(args.runs), method, args.norm, args.optimize)
    if method not in trained:
        raise ValueError(f"--qrels: {method} learns nothing (trained methods: {', '.join(trained)}); add "
                         "--optimize METRIC to search its parameters")
    if method == "slidefuse":
        raise ValueError("slidefuse's w is not learnt: add --optimize METRIC to search it")
    return train(args.qrels, list(args.runs), method, args.norm, n_segments=args.n_segments)


def _jsonable(params: dict) -> dict:
    """Parameters as JSON values (numpy arrays and numbers as lists and floats / ints)."""
    import numpy as np

    def conv(v):
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, np.ndarray):
            return v.tolist()
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return float(v)
        return v

    return {k: conv(v) for k, v in params.items()}
