"""Ranking and online metrics in one Beam job (the batch job's arguments plus the online metrics).

    python -m pipelines.online --impressions imps.avro --judgments judg.avro \\
        --metrics ndcg@10,auc,gauc[query,impressions],gauc[query,unweighted] --labels judgments \\
        --group-rows --output out/letor

    python -m pipelines.online --impressions yandex.avro \\
        --metrics ctr,rr_first_click,clicks@3,abandonment --output out/yandex

``--metrics`` takes ranking metrics (``ndcg@10``, ``map``, ...: scored against ``--judgments`` by
:class:`~streameval.beam.transforms.ScoreRankings`) and online metrics (``auc``, ``auc_hist``,
``gauc[GROUP,WEIGHTING]``, ``ctr``, ``ctr@pos{p}``, ``clicks@k``, ``rr_first_click``,
``abandonment``: :class:`~streameval.beam.online.OnlineMetrics`) in any mix; only the metrics
listed are computed (CTR only when ``ctr`` is listed). Outputs as ``pipelines.batch``:
``metrics.{avro,jsonl}``, ``dead_letters.{avro,jsonl}``, ``summary.json`` and a printed table.
This is the prototype of the online metrics' integration in ``streameval batch``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import batch
from streameval.beam.online import LABEL_SOURCES, UNJUDGED_POLICIES, OnlineMetrics, split_metric_names
from streameval.beam.transforms import ScoreRankings, ValidateImpressions, ValidateJudgments, parse_window
from streameval.metrics.names import MetricNameError

__all__ = ["main", "build_arg_parser", "build_pipeline"]

DEFAULT_METRICS = "auc,gauc[user,impressions],ctr,rr_first_click,abandonment"


def build_arg_parser():
    p = batch.build_arg_parser()
    p.prog = "streameval online"
    p.description = ("Ranking metrics and online metrics (AUC, GAUC, CTR, clicks@k, reciprocal rank of the first "
                     "click, abandonment) over impression / judgment Avro logs (Apache Beam). Unknown arguments "
                     "are passed to Beam's PipelineOptions.")
    p.set_defaults(metrics=DEFAULT_METRICS)
    for action in p._actions:
        if action.dest == "metrics":
            action.help = (f"comma-separated ranking and online metrics (default {DEFAULT_METRICS}); online: auc, "
                           "auc_hist, gauc[GROUP,WEIGHTING] (GROUP user/query/request, WEIGHTING "
                           "impressions/clicks/unweighted), ctr, ctr@pos{p}, clicks@k, rr_first_click[, [clicked]], "
                           "abandonment")
        if action.dest == "no_ctr":
            action.help = "(ignored: CTR is computed only when ctr is in --metrics)"
    def add(flag, **kw):  # once pipelines.batch has these options (the proposed integration), keep its own
        if flag not in p._option_string_actions:
            p.add_argument(flag, **kw)

    add("--labels", choices=("auto", *LABEL_SOURCES), default="auto",
        help="labels of AUC / GAUC: clicks (the impression's clicked flag) or judgments "
             "(grade >= --relevance-level); auto (default): judgments when --judgments is given")
    add("--unjudged", choices=UNJUDGED_POLICIES, default="exclude",
        help="impressions without a judgment under --labels judgments: exclude (default, counted) "
             "or count as non-relevant")
    add("--hist-bins", type=int, default=1000, help="bins of auc_hist (default 1000)")
    add("--hist-range", default="0,1", help="score range LO,HI of auc_hist's bins (default 0,1)")
    add("--group-rows", action="store_true",
        help="also write each GAUC group's AUC (metric auc, slice '<group>=<id>')")
    return p


def _hist_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--hist-range wants LO,HI, got {text!r}") from None
    return lo, hi


def build_pipeline(p, args, impression_paths, judgment_paths, ranking, online):
    """Add the job's transforms to ``p``: returns (rows, dead_letters)."""
    window = parse_window(args.window)
    slices = batch._slices_from_args(args.slices)
    imps, imp_dead = (p | "ReadImpressions" >> batch.ReadAvro(impression_paths, "impression")
                      | "ValidateImpressions" >> ValidateImpressions(",".join(args.impressions)))
    rows, dead = [], [imp_dead]
    judg = None
    if judgment_paths:
        judg, judg_dead = (p | "ReadJudgments" >> batch.ReadAvro(judgment_paths, "judgment")
                           | "ValidateJudgments" >> ValidateJudgments(",".join(args.judgments)))
        dead.append(judg_dead)
    if ranking:
        score = ScoreRankings(judg, ranking, window=window, slices=slices, relevance_level=args.relevance_level,
                              gain=args.gain, ideal=args.ideal, err_max_grade=args.err_max_grade, order=args.order,
                              tie_break=args.tie_break, depth=args.depth, complete=args.complete,
                              score_precision=args.score_precision)
        rows.append(imps | "ScoreRankings" >> score)
        dead.append(score.rejected)
    if online:
        labels = args.labels if args.labels != "auto" else ("judgments" if judgment_paths else "clicks")
        lo, hi = _hist_range(args.hist_range)
        rows.append(imps | "OnlineMetrics" >> OnlineMetrics(
            online, window=window, slices=slices, labels=labels, judgments=judg,
            relevance_level=args.relevance_level, unjudged=args.unjudged, hist_bins=args.hist_bins,
            hist_range=(lo, hi), group_rows=args.group_rows))
    all_rows = tuple(rows) | "AllRows" >> beam.Flatten()
    all_dead = tuple(dead) | "AllDeadLetters" >> beam.Flatten()
    batch._write(all_rows, args.output, "metrics", "metric_result", "Metrics")
    batch._write(all_dead, args.output, "dead_letters", "dead_letter", "DeadLetters")
    return all_rows, all_dead


def _online_line(counters: dict) -> str:
    keys = ("online:requests", "online:requests_not_logged", "online:no_score", "online:not_labelled",
            "online:unjudged")
    parts = [f"{k.split(':', 1)[1]} {counters[k]}" for k in keys if counters.get(k)]
    parts += [f"{k.split(':', 1)[1]} {v}" for k, v in sorted(counters.items()) if k.startswith("online:no_group:") and v]
    return "online: " + ("; ".join(parts) if parts else "nothing skipped")


def main(argv=None) -> int:
    parser = build_arg_parser()
    args, beam_args = parser.parse_known_args(argv)
    stray = [a for a in beam_args if not a.startswith("-") and os.path.exists(a)]
    if stray:  # an unquoted glob expanded by the shell: Beam would ignore these files
        print(f"error: unexpected paths {stray[:3]}: quote globs, or repeat --impressions / --judgments", file=sys.stderr)
        return 2
    try:
        ranking, online = split_metric_names(args.metrics)
        parse_window(args.window)
        batch._slices_from_args(args.slices)
        _hist_range(args.hist_range)
        impression_paths = batch._expand(args.impressions)
        judgment_paths = batch._expand(args.judgments) if args.judgments else []
        if ranking and not judgment_paths:
            raise ValueError(f"ranking metrics {ranking} need --judgments")
        if args.labels == "judgments" and not judgment_paths:
            raise ValueError("--labels judgments needs --judgments")
        if not ranking and not online:
            raise ValueError("no metrics given")
    except (ValueError, MetricNameError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.output, exist_ok=True) if "://" not in args.output else FileSystems.mkdirs(args.output)
    options = PipelineOptions(["--runner", args.runner, *beam_args])
    start = time.perf_counter()
    p = beam.Pipeline(options=options)
    build_pipeline(p, args, impression_paths, judgment_paths, ranking, online)
    result = p.run()
    state = result.wait_until_finish()
    wall = time.perf_counter() - start
    counters = batch._counters(result)
    rows = batch._read_rows(FileSystems.join(args.output, "metrics.jsonl"))
    names = ranking + online
    summary = {"state": str(state), "wall_seconds": round(wall, 3), "runner": args.runner,
               "impression_files": impression_paths, "judgment_files": judgment_paths, "metrics": names,
               "window": args.window, "slices": batch._slices_from_args(args.slices),
               "options": {"labels": args.labels, "unjudged": args.unjudged, "relevance_level": args.relevance_level,
                           "hist_bins": args.hist_bins, "hist_range": args.hist_range, "gain": args.gain,
                           "ideal": args.ideal, "order": args.order, "tie_break": args.tie_break},
               "num_rows": len(rows), "counters": dict(sorted(counters.items())),
               "outputs": [FileSystems.join(args.output, f) for f in batch.OUTPUT_FILES]}
    with FileSystems.create(FileSystems.join(args.output, "summary.json")) as fo:
        fo.write(json.dumps(summary, indent=2).encode("utf-8"))
    if not args.quiet:
        print(batch.format_table(rows, names))
    print(batch._report_line(counters))
    print(_online_line(counters))
    print(f"wrote {len(rows)} metric rows to {args.output} in {wall:.1f} s ({args.runner})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
