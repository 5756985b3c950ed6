"""Batch evaluation job: impression (and judgment) Avro logs in, metric rows and dead letters out.

    python -m streameval.jobs.batch --impressions 'logs/*.avro' --judgments qrels.avro \\
        --metrics ndcg@10,map --window 1d --slices campaign --output out/

Writes ``metrics.avro`` (metric_result schema), ``metrics.jsonl``, ``dead_letters.avro``
(dead_letter schema), ``dead_letters.jsonl`` and ``summary.json`` into ``--output``, then prints
the metric rows as a table and the record counts taken from the pipeline's Beam counters.

Runs on FnApiRunner by default (named explicitly: the default DirectRunner tries to download
Prism). Arguments this parser does not know are passed to Beam's PipelineOptions when Beam knows
them (else refused, exit 2, with the closest names), so
``--runner FlinkRunner --flink_master ...``, ``--runner DataflowRunner --project ...`` or
``--direct_num_workers 4 --direct_running_mode multi_processing`` work as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from streameval.beam.accounting import (account, check_inputs, stall_timeout_from_args, format_accounting, input_checks_from_args,
                                        wait_for_job,
                                        job_counters, job_distributions)
from streameval.plan.alerts import check_rules_match, format_alert, load_rules
from streameval.beam.alerts import ALERTS_FIRED, EvaluateAlerts
from streameval.beam.counts_as_data import PublishCounts, count_elements
from streameval.beam.flink_options import on_flink, reuse_workers
from streameval.beam.prometheus import write_textfile
from streameval.exits import EXIT_ALERT, EXIT_FAILED, EXIT_INPUT_CHECK, EXIT_OK, EXIT_USAGE, exit_status, one_line
from streameval.beam.arguments import (GDEVAL_ERR_MAX_GRADE, auto_err_max_grade, batch_window_spec,
                                       check_bootstrap_arguments, hist_range, make_pipeline, parse_err_max_grade,
                                       split_metrics, unknown_arguments_error)
from streameval.beam.arguments import parse_grades as _grades
from streameval.beam.arguments import parse_slice_args as _slices_from_args
from streameval.beam.columnar import (DECODER_NAMESPACE, ColumnarMetrics, auto_shards, default_decoder,
                                      release_held)
from streameval.beam.transforms import (
    NAMESPACE,
    CleanImpressions,
    ClickMetrics,
    ResolveJudgments,
    ScoreRankings,
    ValidateImpressions,
    ValidateJudgments,
    judgment_grade_range,
    keep_slice_row,
    parse_lateness,
    parse_window,
)
from streameval.beam.sinks import (DEFAULT_FORMATS, bigquery_available, bigquery_sink, holding_outputs, parse_formats,
                                   publish, read_jsonl, read_metric_rows, start_output, write_bigquery, write_jsonl,
                                   write_records)
from streameval.beam.sources import (UNREADABLE, UNREADABLE_PARQUET, ReadAvro, expand_inputs, failure_reason,
                                     runner_thread_errors_reported_once,
                                     input_bytes, is_unreadable_letter, set_file_system_options)
from streameval.beam.table_inputs import count_parquet_rows, parquet_paths, table_options
from streameval.beam.online import OnlineMetrics, split_metric_names
from streameval import interrupts, tuning
from streameval.io import progress
from streameval.beam.stats import CompareSystems
from streameval.beam.threads import default_threads
from streameval.io import counters as cn
from streameval.beam.unjudged import listed_unjudged
from streameval.io.outdir import OutputInUseError, OutputOverlapError
from streameval.io.metric_table import MetricTable, slice_columns
from streameval.beam.cuped import covariate_absent, covariate_attribute_error
from streameval.io.selection import (NoMatchError, names_without_rows, record_attributes, slice_attribute_error,
                                     without_rows_line)
from streameval.beam.keys import attributes_without_values, parse_slices
from streameval.io.records import parse_time_range, to_json_text
from streameval.metrics.names import MetricNameError, parse_metrics
from streameval.metrics.kernel import MetricOptions
from streameval.metrics.prepare import check_ranking_options
from streameval.jobs.batch_args import ENGINES, build_arg_parser, check_local_inputs  # noqa: F401  (Beam-free: parsed first)
from streameval.jobs.batch_table import format_comparisons, format_table, report_line, sort_rows
from streameval.metrics.online import parse_online_metric
from streameval.metrics.online_names import parse_online_metrics
from streameval.metrics.stats import check_level, parse_expected_split

__all__ = ["main", "build_arg_parser", "build_pipeline", "ReadAvro", "format_table", "sort_rows", "split_metrics",
           "OUTPUT_FILES"]

OUTPUT_FILES = ("metrics.avro", "metrics.jsonl", "dead_letters.avro", "dead_letters.jsonl", "unjudged.jsonl",
                "unreadable_files.jsonl", "summary.json")
#: the outputs of --formats parquet / csv (removed before every run, listed in manifest.json when written)
FORMAT_FILES = {"parquet": ("metrics.parquet", "dead_letters.parquet"), "csv": ("metrics.csv",)}
#: runners that run the job in this process (or its children): the process memory settings apply
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def split_all_metrics(text: str) -> tuple[list[str], list[str]]:
    """(ranking metric names, online metric names other than ctr / ctr@pos{p}, which ClickMetrics gives)."""
    ranking, online = split_metric_names(text, diversity=True)
    return ranking, [m for m in online if parse_online_metric(m).family != "ctr"]


# --------------------------------------------------------------------------------------------
# pipeline pieces

#: requests per text element of unjudged.jsonl (the columnar engine's lists, cut to a bounded size)
UNJUDGED_PIECE = 10_000


def _text_pieces(requests):
    """JSON lines of a list of unjudged requests, as text elements of at most ``UNJUDGED_PIECE`` lines."""
    for i in range(0, len(requests), UNJUDGED_PIECE):
        yield "\n".join(map(to_json_text, requests[i:i + UNJUDGED_PIECE]))


def _write_unjudged(args, unjudged, rows, specs, pieces=False, counts=None) -> None:
    """``unjudged.jsonl``: the unjudged requests of systems with a judged request
    (:func:`streameval.beam.unjudged.listed_unjudged`; ``specs``: the ranking measures). ``pieces``:
    the columnar engine's lists of requests, one per shard, written as text elements of lines (an
    empty list writes no line). ``counts``: as :func:`_write_outputs`'."""
    listed = listed_unjudged(unjudged, rows, [m.name for m in specs], counts=counts)
    if pieces:
        listed = listed | "UnjudgedJson" >> beam.FlatMap(_text_pieces)
    write_jsonl(listed, write_dir(args), "unjudged", "Unjudged", lines=pieces, shards=output_shards(args))


def output_shards(args):
    """Files of the outputs that grow with the input (dead letters, unjudged requests, comparisons):
    ``--output-shards`` N, or auto: one file named ``NAME.jsonl`` on the local runners (in-process or
    worker processes of this machine), else as many as the runner chooses (``NAME-00000-of-00004.jsonl``,
    listed in manifest.json). None stands for one file."""
    value = getattr(args, "output_shards", "auto")
    if value == "auto":
        return None if args.runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS else 0
    return None if int(value) == 1 else int(value)


def write_dir(args) -> str:
    """Where the pipeline writes its outputs: the run's own folder (``args.write_dir``, set by
    :func:`main` from :func:`streameval.beam.sinks.start_output`), else ``args.output``."""
    return getattr(args, "write_dir", None) or args.output


def _skip_missing_slices(rows, args):
    """``--slice-missing skip``: the rows without the slices in which a request lacks an attribute
    (``campaign=(missing)``); those requests stay in ``all`` and in the slices of attributes they have."""
    if getattr(args, "slice_missing", "show") != "skip":
        return rows
    return rows | "SkipMissingSlices" >> beam.Filter(keep_slice_row)


def _is_unreadable(letter) -> bool:
    return is_unreadable_letter(letter)


def _write_outputs(rows, dead, out_dir: str, shards, rules=None, formats=DEFAULT_FORMATS, bigquery_table=None,
                   table=None, counts=None, union_outputs=False):
    """The metric rows and dead letters (Avro and JSON lines; the dead letters in ``shards`` files, see
    :func:`output_shards`), the small list of damaged input files (``unreadable_files.jsonl``, which the
    launcher reads), a count of the rows written, and with alert ``rules`` the alerts they raise
    (``alerts.avro`` / ``alerts.jsonl``, counted ``alerts_fired``). ``formats`` (``--formats``) adds
    Parquet files of all three and a CSV file of the metric rows (those two as ``table``, the typed
    table of :func:`metric_table`); ``bigquery_table`` appends the metric rows to that BigQuery table.
    ``counts``: None (Beam counters), or a list to which the counts of rows written and alerts raised
    are added as data (:mod:`streameval.beam.counts_as_data`). ``union_outputs``: the runner writes each
    fused stage's outputs as one data set that each output's consumer reads whole (Beam's Flink batch
    translation): the dead letters are reshuffled first, so that each stage making them has one output
    of them, not one per writer (:func:`streameval.beam.flink_options.on_flink`)."""
    if counts is None:
        rows = rows | "CountRows" >> beam.Map(_count_row)
    else:
        rows = rows | "CountRows" >> beam.Map(_progress_row)
        counts.append(count_elements(rows, NAMESPACE, cn.METRIC_ROWS_WRITTEN, "RowsWritten"))
    write_records(rows, out_dir, "metrics", "metric_result", "Metrics", formats=formats,
                  table=table if table is not None else MetricTable())
    if bigquery_table:
        write_bigquery(rows, bigquery_table)
    if rules:
        alerts = rows | "Alerts" >> EvaluateAlerts(rules, count=counts is None)
        if counts is not None:
            counts.append(count_elements(alerts, NAMESPACE, ALERTS_FIRED, "AlertsFired"))
        write_records(alerts, out_dir, "alerts", "alert", "AlertRecords", formats=[f for f in formats if f != "csv"])
    if union_outputs:  # the writers' steps, fused into each stage, would each re-read the stage's whole output:
        # the reading stage's 406 MB five times at 10 M impressions (docs/benchmarks.md, 2026-12-07)
        dead = dead | "DeadLettersOnce" >> beam.Reshuffle()
    write_records(dead, out_dir, "dead_letters", "dead_letter", "DeadLetters", shards=shards,
                  formats=[f for f in formats if f != "csv"])
    write_jsonl(dead | "UnreadableFiles" >> beam.Filter(_is_unreadable), out_dir, "unreadable_files", "Unreadable")


_ROWS_WRITTEN = Metrics.counter(NAMESPACE, cn.METRIC_ROWS_WRITTEN)


def _count_row(row):
    _ROWS_WRITTEN.inc()
    progress.add("rows")
    return row


def _progress_row(row):
    progress.add("rows")
    return row


def _sink_args(args) -> tuple[tuple[str, ...], str | None, MetricTable]:
    """(formats, BigQuery table, typed table) of ``args`` (defaults for callers that build args by hand)."""
    return (parse_formats(getattr(args, "formats", None) or ",".join(DEFAULT_FORMATS)),
            getattr(args, "bigquery_table", None), metric_table(args))


def metric_table(args) -> MetricTable:
    """The typed table of the job's Parquet and CSV metric files: a column per attribute of
    ``--slices`` and, with ``--group-rows``, per GAUC group of ``--metrics`` (``user``, ``query``,
    ``request``: the key of a group's rows, ``<group>=<id>``)."""
    keys = []
    if getattr(args, "group_rows", False):
        keys = [s.group for s in parse_online_metrics(split_all_metrics(args.metrics)[1]) if s.family == "gauc"]
    return MetricTable(slice_columns([*_slices_from_args(getattr(args, "slices", None)), *keys]))


def _local_total(paths, input_format: str = "auto"):
    """Records in local Avro and Parquet files (the progress bar's total); None for remote files."""
    if any("://" in p for p in paths):
        return None
    tables = parquet_paths(paths, input_format)
    if not tables:
        return progress.count_avro_records(paths)
    avro = [p for p in paths if p not in set(tables)]
    counts = [count_parquet_rows(tables), progress.count_avro_records(avro) if avro else 0]
    return None if None in counts else sum(counts)


def online_labels(args) -> str:
    """The labels of auc / gauc: ``--labels``, or for auto judgments when judgments are given."""
    return args.labels if args.labels != "auto" else ("judgments" if args.judgments else "clicks")


def _drift_reference(args, online):
    """The reference of psi[score] / ks[score] (``--drift-reference``), read once before the pipeline;
    None without a drift metric. Raises ValueError / FileNotFoundError in one line: a drift metric
    without a reference, a reference without a drift metric, a missing or unreadable file."""
    drift = [parse_online_metric(m).name for m in online if parse_online_metric(m).drift]
    path = getattr(args, "drift_reference", None)
    if drift and not path:
        raise ValueError(f"{drift[0]} needs --drift-reference PATH (reference scores: a text file of one score per "
                         f"line, or an impression Avro file)")
    if path and not drift:
        raise ValueError("--drift-reference is the reference of psi[score] / ks[score]: name one in --metrics")
    if not drift:
        return None
    from streameval.io.reference import read_drift_reference

    return read_drift_reference(path)


def _covariate_attribute(args):
    """The attribute of ``--covariate attr:NAME`` (None without it); ValueError in one line: not that
    form, no ``--cluster`` (the experiment's unit), or ``--no-ctr``."""
    text = getattr(args, "covariate", None)
    log = getattr(args, "covariate_log", None)
    if text is None and not log:
        return None
    from streameval.beam.cuped import LOG_COVARIATE, parse_covariate

    if text is not None and log:
        raise ValueError("--covariate and --covariate-log are two sources of one covariate: give one")
    name = parse_covariate(text) if text is not None else LOG_COVARIATE
    if args.cluster == "none":
        raise ValueError("--covariate / --covariate-log (CUPED) need --cluster request or user: the unit the experiment randomises, "
                         "whose clicks the covariate adjusts")
    if args.no_ctr:
        raise ValueError("--covariate gives adjusted ctr rows: not with --no-ctr")
    return name


def build_pipeline(p: beam.Pipeline, args, impression_paths, judgment_paths):
    """Add the job's transforms to ``p``: returns (rows, dead_letters) PCollections."""
    if getattr(args, "engine", "auto") != "records":
        return _build_columnar(p, args, impression_paths, judgment_paths)
    window, every = parse_window(args.window), getattr(args, "every", None)
    slices = _slices_from_args(args.slices)
    # a record check's dead letter names the record's file; a replay or conflict's the stage (the
    # records involved may come from several files)
    read_imps = ReadAvro(impression_paths, "impression", with_file=True)
    valid, imp_dead = (p | "ReadImpressions" >> read_imps
                       | "ProgressImpressions" >> beam.Map(progress.Ticker("impressions", _local_total(impression_paths)))
                       | "ValidateImpressions" >> ValidateImpressions(
                           "impressions", time_range=parse_time_range(args.event_time_range)))
    limit = args.max_windows_per_record
    imps, clean_dead = valid | "CleanImpressions" >> CleanImpressions(window=window, every=every,
                                                                       allowed_lateness=args.allowed_lateness,
                                                                       max_windows_per_record=limit)
    row_parts, dead_parts = [], [read_imps.unreadable, imp_dead, clean_dead]
    if getattr(args, "srm_split", None):
        from streameval.beam.srm import request_units, srm_rows
        from streameval.beam.transforms import slide_keys, sliding_windows

        wm, slide = sliding_windows(window, every, limit)
        units = request_units(imps, wm, slices)
        if slide is not None:
            units = units | "SrmSliding" >> beam.FlatMap(slide_keys, slide)
        row_parts.append(srm_rows(units, args.srm_split))
    ranking, online = split_all_metrics(args.metrics)
    judg = None
    if judgment_paths:
        read_judg = ReadAvro(judgment_paths, "judgment", with_file=True)
        judg, judg_dead = (p | "ReadJudgments" >> read_judg
                           | "ValidateJudgments" >> ValidateJudgments("judgments", grade_range=judgment_grade_range(
                               _grades(args.grades), parse_metrics(ranking, arithmetic="the Beam jobs", diversity=True) if ranking else [],
                               MetricOptions(gain=args.gain, err_max_grade=args.err_max_grade))))
        judg, conflict_dead = judg | "ResolveJudgments" >> ResolveJudgments(args.judgment_conflicts)
        dead_parts.extend([read_judg.unreadable, judg_dead, conflict_dead])
    if judgment_paths and ranking:
        score = ScoreRankings(judg, ranking, window=window, slices=slices,
                              relevance_level=args.relevance_level, gain=args.gain, ideal=args.ideal,
                              err_max_grade=args.err_max_grade, order=args.order,
                              tie_break=args.tie_break, depth=args.depth, complete=args.complete,
                              score_precision=args.score_precision, ci=args.ci, ci_level=args.ci_level,
                              replicates=args.replicates, ci_seed=args.ci_seed, every=every,
                              max_windows_per_record=limit, ci_bounded=getattr(args, "ci_bounded", "logit"))
        row_parts.append(imps | "ScoreRankings" >> score)
        dead_parts.append(score.rejected)
        if getattr(args, "unjudged_file", True):
            _write_unjudged(args, score.unjudged, row_parts[-1], score.specs)
        if args.compare_baseline:
            comparisons = score.scores | "Compare" >> CompareSystems(
                [s.name for s in score.specs], baseline=args.compare_baseline, replicates=args.replicates,
                level=args.ci_level, seed=args.ci_seed)
            write_jsonl(comparisons, write_dir(args), "comparisons", "Comparisons", shards=output_shards(args))
    if not args.no_ctr and getattr(args, "cluster", "none") != "none":
        from streameval.beam.clusters import clustered_ctr_rows, records_cluster_keys
        from streameval.beam.transforms import sliding_windows

        wm, slide = sliding_windows(window, every, limit)
        row_parts.append(clustered_ctr_rows(records_cluster_keys(imps, wm, slices, args.cluster), args.cluster,
                                            args.ci_level, getattr(args, "ci_bounded", "logit"), slide))
    if not args.no_ctr and getattr(args, "covariate_attribute", None) is not None:
        from streameval.beam.cuped import cuped_ctr_rows, records_cuped_keys
        from streameval.beam.transforms import sliding_windows

        wm, slide = sliding_windows(window, every, limit)
        row_parts.append(cuped_ctr_rows(records_cuped_keys(imps, wm, slices, args.cluster, args.covariate_attribute,
                                                           getattr(args, "covariate_values", None)),
                                        args.cluster, args.covariate_attribute, args.ci_level, slide))
    if not args.no_ctr:
        row_parts.append(imps | "ClickMetrics" >> ClickMetrics(window=window, slices=slices, ci_level=args.ci_level,
                                                                             every=every, max_windows_per_record=limit))
    if online:
        labels = online_labels(args)
        row_parts.append(imps | "OnlineMetrics" >> OnlineMetrics(
            online, window=window, slices=slices, labels=labels, judgments=judg,
            relevance_level=args.relevance_level, unjudged=args.unjudged, hist_bins=args.hist_bins,
            hist_range=hist_range(args.hist_range), group_rows=args.group_rows, ci_level=args.ci_level,
            ci_bounded=getattr(args, "ci_bounded", "logit"), reference=getattr(args, "drift", None)))
    rows = _skip_missing_slices(tuple(row_parts) | "AllRows" >> beam.Flatten(), args)
    dead = tuple(dead_parts) | "AllDeadLetters" >> beam.Flatten()
    _write_outputs(rows, dead, write_dir(args), output_shards(args), getattr(args, "alert_rules", None),
                   *_sink_args(args), union_outputs=on_flink(p.options))
    return rows, dead


def _beam_sets_workers(beam_args) -> bool:
    """Beam's own --direct_num_workers / --direct_running_mode are among the options."""
    return any(a.split("=")[0] in ("--direct_num_workers", "--direct_running_mode") for a in beam_args)


def local_workers(args, beam_args) -> int:
    """How many worker processes the local runner gets (see --workers); 1 means in-process."""
    if args.runner != "FnApiRunner" or _beam_sets_workers(beam_args):
        return 1
    if args.engine == "records":
        return 1
    if args.workers == "auto":  # in-process (see --workers)
        return 1
    return int(args.workers)


def reported_workers(args, options, workers: int):
    """The worker count summary.json reports: the local runner's worker processes (``--workers`` or
    Beam's ``--direct_num_workers`` in multi_processing mode; 1 in-process), else the runner's own
    worker option when one was given (``--num_workers``, ``--max_num_workers``, ``--parallelism``),
    else ``"runner"`` (the runner decides)."""
    opts = options.get_all_options(retain_unknown_options=True)
    if args.runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS:
        if opts.get("direct_running_mode") == "multi_processing" and opts.get("direct_num_workers"):
            return int(opts["direct_num_workers"])
        return workers
    for name in ("num_workers", "max_num_workers", "parallelism"):
        if opts.get(name) and int(opts[name]) > 0:  # (Flink's parallelism is -1 when not set)
            return int(opts[name])
    return "runner"


def work_threads(args) -> int:
    """Threads of the columnar engine's stages (see --threads): auto is one per core in-process, else 1."""
    if args.threads != "auto":
        return int(args.threads)
    return default_threads() if getattr(args, "in_process", False) else 1


def shard_count(args, impression_paths, total=None) -> int:
    """``--shards``: the number given, or for auto one per ``SHARD_IMPRESSIONS`` impressions (``total``,
    counted from local files' block headers; else estimated from the files' sizes), at least ``SHARDS``."""
    shards = getattr(args, "shards", "auto")
    if shards != "auto":
        return int(shards)
    return auto_shards(total, 0 if total is not None else input_bytes(impression_paths))


def decoders_used(result, engine: str, paths, options=None) -> dict:
    """{input file: the Avro decoder(s) that read it} (the columnar engine's counters of
    ``DECODER_NAMESPACE``; the per-record engine reads with fastavro)."""
    if engine != "columnar":
        return {p: "fastavro" for p in paths}
    out = {}
    for name, n in job_counters(result, DECODER_NAMESPACE, options=options).items():
        if n:
            used, path = cn.decoder_parts(name)
            out[path] = used
    return {p: out.get(p, "unknown") for p in paths}


def _build_columnar(p: beam.Pipeline, args, impression_paths, judgment_paths):
    ranking, online = split_all_metrics(args.metrics)
    fmt = getattr(args, "input_format", "auto")
    total = _local_total(impression_paths, fmt)
    args.shards_used = shard_count(args, impression_paths, total)
    col = ColumnarMetrics(
        impression_paths, judgment_paths, ranking if judgment_paths else [], ctr=not args.no_ctr,
        window=parse_window(args.window), every=getattr(args, "every", None), slices=_slices_from_args(args.slices),
        max_windows_per_record=args.max_windows_per_record,
        allowed_lateness=args.allowed_lateness,
        relevance_level=args.relevance_level, gain=args.gain, ideal=args.ideal, err_max_grade=args.err_max_grade,
        order=args.order, tie_break=args.tie_break, depth=args.depth, score_precision=args.score_precision,
        judgment_conflicts=args.judgment_conflicts, grade_range=_grades(args.grades), ci_level=args.ci_level,
        shards=args.shards_used, progress_total=total,
        decoder=getattr(args, "avro_decoder", None), in_process=getattr(args, "in_process", False),
        threads=getattr(args, "work_threads", 1), time_range=parse_time_range(args.event_time_range),
        online=online, labels=online_labels(args), unjudged=args.unjudged, hist_bins=args.hist_bins, hist_range=hist_range(args.hist_range),
        group_rows=args.group_rows, ci=args.ci, replicates=args.replicates, ci_seed=args.ci_seed,
        ci_bounded=getattr(args, "ci_bounded", "logit"), srm_split=getattr(args, "srm_split", None),
        cluster=getattr(args, "cluster", "none"), drift_reference=getattr(args, "drift", None),
        covariate=getattr(args, "covariate_attribute", None), covariate_values=getattr(args, "covariate_values", None),
        compare_baseline=args.compare_baseline if judgment_paths and ranking else None, complete=args.complete,
        hot_query_fraction=args.hot_query_fraction, input_format=fmt,
        impression_table=getattr(args, "impression_table", None), judgment_table=getattr(args, "judgment_table", None),
        counts_as_data=True)
    rows = _skip_missing_slices(p | "Metrics" >> col, args)
    counts = col.counts  # every count of the job as data, reported by one step (streameval.beam.counts_as_data)
    if col.unjudged is not None and getattr(args, "unjudged_file", True):
        _write_unjudged(args, col.unjudged, rows, col.specs, pieces=True, counts=counts)
    if col.comparisons is not None:
        write_jsonl(col.comparisons, write_dir(args), "comparisons", "Comparisons", shards=output_shards(args))
    formats, bigquery_table, table = _sink_args(args)
    _write_outputs(rows, col.dead_letters, write_dir(args), output_shards(args), getattr(args, "alert_rules", None),
                   formats, bigquery_table, table, counts=counts, union_outputs=on_flink(p.options))
    _ = tuple(counts) | "Counts" >> PublishCounts()
    return rows, col.dead_letters


def main(argv=None) -> int:
    return holding_outputs(_main, argv)  # the run's hold on its --output folder, let go on every path


def _main(argv, held: list) -> int:
    parser = build_arg_parser()
    args, beam_args = parser.parse_known_args(argv)
    # an unquoted glob expands in the shell: the files after the first would reach Beam's options
    # as unparseable arguments and be ignored; refuse instead
    stray = [a for a in beam_args if not a.startswith("-") and os.path.exists(a)]
    if stray:
        print(f"streameval batch: {len(stray)} file arguments were not read ({stray[0]} ...): quote the "
              "glob (--impressions 'logs/*.avro') or repeat --impressions for each file", file=sys.stderr)
        return 2
    unknown = unknown_arguments_error(parser, beam_args)  # Beam's options only: a typo is not dropped
    if unknown:
        print(f"error: {unknown}", file=sys.stderr)
        return EXIT_USAGE
    try:
        ranking, online = split_all_metrics(args.metrics)
        metric_specs = parse_metrics(ranking, arithmetic="the Beam jobs", diversity=True) if ranking else []
        hist_range(args.hist_range)
        args.drift = _drift_reference(args, online)
        _grades(args.grades)
        parse_time_range(args.event_time_range)
        sliding = batch_window_spec(args, online)  # --window 1h/10m as --window 1h --every 10m (the stream's rules)
        parse_window(args.window, "--window")
        parse_lateness(args.allowed_lateness, "--allowed-lateness")
        _slices_from_args(args.slices)
        if args.workers != "auto" and (not args.workers.isdigit() or int(args.workers) < 1):
            raise ValueError(f"--workers wants a positive number or auto, got {args.workers!r}")
        if args.threads != "auto" and (not args.threads.isdigit() or int(args.threads) < 1):
            raise ValueError(f"--threads wants a positive number or auto, got {args.threads!r}")
        if args.output_shards != "auto" and (not args.output_shards.isdigit() or int(args.output_shards) < 1):
            raise ValueError(f"--output-shards wants a positive number or auto, got {args.output_shards!r}")
        if args.shards != "auto" and (not args.shards.isdigit() or int(args.shards) < 1):
            raise ValueError(f"--shards wants a positive number or auto, got {args.shards!r}")
        if not 0 <= args.hot_query_fraction <= 1:
            raise ValueError(f"--hot-query-fraction must be between 0 and 1 (0: no fan-out), got {args.hot_query_fraction}")
        check_level(args.ci_level, "--ci-level")
        args.srm_split = parse_expected_split(args.expected_split) if args.expected_split is not None else None
        if args.cluster != "none" and args.no_ctr:
            raise ValueError(f"--cluster {args.cluster} gives clustered ctr rows: not with --no-ctr")
        args.covariate_attribute = _covariate_attribute(args)
        if not 0 < args.progress_interval <= 86400:  # also NaN
            raise ValueError(f"--progress-interval must be a number of seconds in (0, 86400], got {args.progress_interval}")
        check_bootstrap_arguments(args)  # --replicates, --ci-seed: one line, exit 2
        checks = input_checks_from_args(args)
        stall = stall_timeout_from_args(args)
        err_auto = parse_err_max_grade(args.err_max_grade) is None
        args.err_max_grade = parse_err_max_grade(args.err_max_grade) or GDEVAL_ERR_MAX_GRADE
        MetricOptions(relevance_level=args.relevance_level, gain=args.gain, ideal=args.ideal,
                      err_max_grade=args.err_max_grade)
        check_ranking_options(depth=args.depth, score_precision=args.score_precision, tie_break=args.tie_break,
                              order=args.order)
        workers = local_workers(args, beam_args)
        if workers > 1:
            beam_args = [*beam_args, "--direct_num_workers", str(workers), "--direct_running_mode",
                         "multi_processing"]
        check_local_inputs(args)  # a CSV given as Avro, a glob that matches nothing (streameval.cli: before Beam)
        options = PipelineOptions(reuse_workers(["--runner", args.runner, *beam_args]))  # (Flink: workers kept)
        p = make_pipeline(options)  # checks the runner's name
        set_file_system_options(options)  # before any remote file is matched (credentials, endpoint)
        impression_paths = expand_inputs(args.impressions)
        args.covariate_values = None
        if getattr(args, "covariate_log", None) and args.covariate_attribute is not None:
            from streameval.beam.cuped import pre_period_clicks

            args.covariate_values = pre_period_clicks(expand_inputs(args.covariate_log), args.cluster)
        judgment_paths = expand_inputs(args.judgments) if args.judgments else []
        args.impression_table, args.judgment_table = table_options(args, impression_paths, judgment_paths)
        if err_auto:
            args.err_max_grade = auto_err_max_grade(metric_specs, judgment_paths, _grades(args.grades),
                                                    table=args.judgment_table,
                                                    input_format=getattr(args, "input_format", "auto"))
        if args.labels == "judgments" and not judgment_paths:
            raise ValueError("--labels judgments needs --judgments")
        if not judgment_paths and args.no_ctr and not online:
            raise ValueError("nothing to compute: no --judgments, no online metrics and --no-ctr")
        args.alert_rules = load_rules(args.alerts) if args.alerts else None
        formats = parse_formats(args.formats)
        if args.bigquery_table is not None:
            if not bigquery_available():
                raise ValueError("--bigquery-table needs the BigQuery client libraries: pip install 'apache-beam[gcp]'")
            bigquery_sink(args.bigquery_table)  # the table's form, checked before the job runs
    except (ValueError, TypeError, MetricNameError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE

    ranked = bool(judgment_paths and ranking)
    outputs = [f for f in OUTPUT_FILES if (ranked and args.unjudged_file) or f != "unjudged.jsonl"]
    if args.compare_baseline and ranked:
        outputs.append("comparisons.jsonl")
    if args.alert_rules:
        outputs += [f"alerts.{f}" for f in formats if f != "csv"]
    outputs = [f for f in outputs if f.rsplit(".", 1)[-1] in formats or not f.startswith(("metrics.", "dead_letters."))]
    outputs += [f for fmt in formats for f in FORMAT_FILES.get(fmt, ())]
    extra = [f for files in FORMAT_FILES.values() for f in files]
    try:  # the inputs are checked: refuse an output that overlaps them, lock it, give the run its folder
        run = start_output(args.output, (*OUTPUT_FILES, *extra, "comparisons.jsonl", "alerts.avro", "alerts.jsonl",
                                         "alerts.parquet"),
                           inputs=[("--impressions", args.impressions, impression_paths),
                                   ("--judgments", args.judgments or [], judgment_paths)],
                           command="streameval batch")
    except (OutputOverlapError, OutputInUseError, ValueError) as e:  # ValueError: a folder that cannot be made
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 (the output's file system: permission, credentials, network)
        print(f"error: cannot prepare the output directory {args.output!r}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_USAGE
    held.append(run)
    if run.notice:
        print(run.notice, file=sys.stderr)
    # the pipeline writes into the run's folder; the previous run's outputs stay until publish()
    args.output, args.write_dir = run.output, run.write_dir
    # Beam's local runner in this process: the columnar engine keeps the values between stages in memory
    args.in_process = args.runner == "FnApiRunner" and not _beam_sets_workers(beam_args)
    args.work_threads = work_threads(args)
    start = time.perf_counter()
    try:
        build_pipeline(p, args, impression_paths, judgment_paths)
    except (ValueError, TypeError) as e:  # an option a transform refuses (each checks its own)
        release_held()  # the read work a transform may have started early (in-process runner)
        print(f"error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    local = args.runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS
    if local:  # the job runs in this process: fewer page faults (streameval/tuning.py)
        tuning.keep_freed_memory()
    # records read and rows written so far (this process's counts: the in-process local runner's),
    # every few seconds on stderr, and the job's own counters in the last line; off with --quiet
    line = progress.ProgressLine("streameval batch", read=lambda: progress.counts().get("impressions", 0),
                                 written=lambda: progress.counts().get("rows", 0),
                                 interval=getattr(args, "progress_interval", 5.0), enable=not args.quiet).start()
    with (tuning.no_numpy_hugepages() if local else contextlib.nullcontext()), \
            (tuning.one_blas_thread() if local else contextlib.nullcontext()), \
            (tuning.for_children() if local else contextlib.nullcontext()), \
            runner_thread_errors_reported_once():
        try:
            result = p.run()
            state = wait_for_job(result, options=options, stall_timeout=stall)  # (not wait_until_finish: its deadline, see there)
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 (the runner reports a failed job as an exception)
            line.enable = False
            line.stop()
            stop = interrupts.stop_for(e)  # Ctrl-C or SIGTERM, which the runner may have wrapped
            if stop is not None:
                raise stop  # streameval.cli says so in one line; close_output removes the run's folder
            print(f"error: the job failed: {failure_reason(e, options)}", file=sys.stderr)
            return 1  # close_output removes the run's folder: the previous run's outputs stay
        finally:
            release_held()
    try:
        final = job_counters(result, options=options)
        line.read = lambda: final.get(cn.IMPRESSIONS_READ, 0) + final.get(cn.JUDGMENTS_READ, 0)
        line.written = lambda: final.get(cn.METRIC_ROWS_WRITTEN, 0)
    except Exception:  # noqa: BLE001 (a runner without counters: this process's counts stay)
        pass
    line.stop()
    progress.close_all()
    wall = time.perf_counter() - start
    if str(state).rsplit(".", 1)[-1] != "DONE":
        print(f"error: the job ended in state {state}", file=sys.stderr)
        return 1
    counters = job_counters(result, options=options)

    # the launcher reads counters and small outputs only, through FileSystems (the workers may be elsewhere)
    rows, note = [], None
    try:
        rows = read_metric_rows(FileSystems.join(run.write_dir, "metrics.jsonl"))
    except (OSError, ValueError) as e:  # e.g. a local --output that exists only on the workers' machines
        note = f"the metric rows are not readable from this machine ({e})"
    try:
        unreadable = [d["reason"].replace(f"{UNREADABLE} ", f"{d['source']} ", 1)
                      .replace(f"{UNREADABLE_PARQUET} ", f"{d['source']} ", 1)
                      for d in read_jsonl(FileSystems.join(run.write_dir, "unreadable_files.jsonl"))]
    except (OSError, ValueError):  # none written (a remote output without damaged files) or not readable here
        unreadable = [f"{counters[cn.unreadable_files(k)]} {k} files (see dead_letters)"
                      for k in ("impression", "judgment") if counters.get(cn.unreadable_files(k))]
    accounting, problems = account(counters, ranking=ranked, ctr=not args.no_ctr, unreadable=unreadable)
    failed_checks = check_inputs(accounting, checks, judgments=bool(judgment_paths), inputs=impression_paths)
    names = ([s.name for s in metric_specs] if judgment_paths else []) + \
        [parse_online_metric(m).name for m in online]
    # issue 41: a rule that matches no row of the output is a typo (exit 2); a metric asked for
    # that produced no row (gauc[user,...] on a log without user ids) is a failed check (exit 3)
    typos, without_rows = [], []
    if note is None:
        if args.alert_rules:
            try:
                check_rules_match(args.alert_rules, rows)
            except NoMatchError as e:
                typos.append(f"--alerts {args.alerts}: {e}")
        without_rows = names_without_rows(names, rows, accounting.get("impression", {}).get("accepted", 0))
        # a --slices attribute no record has (every request in campain=(missing)) is a typo too
        absent = attributes_without_values(parse_slices(_slices_from_args(args.slices)), {r["slice"] for r in rows})
        if absent and any(r["slice"] == "all" for r in rows):  # (no row at all: the input checks say why)
            have = record_attributes(impression_paths)
            typos += [str(slice_attribute_error(a, have)) for a in absent]
        if getattr(args, "covariate", None) is not None and covariate_absent(rows, args.cluster,
                                                                                args.covariate_attribute):
            typos.append(covariate_attribute_error(args.covariate_attribute, record_attributes(impression_paths)))
    engine = "records" if args.engine == "records" else "columnar"
    summary = {
        "state": str(state),
        "wall_seconds": round(wall, 3),
        "runner": args.runner,
        "workers": reported_workers(args, options, workers),
        "threads": getattr(args, "work_threads", 1),
        "engine": engine,
        "avro_decoder": (getattr(args, "avro_decoder", None) or default_decoder()) if engine == "columnar" else "fastavro",
        "decoders": decoders_used(result, engine, impression_paths + judgment_paths, options),
        "shards": args.shards_used if engine == "columnar" else None,
        "elements": job_distributions(result, options=options),
        "impression_files": impression_paths,
        "judgment_files": judgment_paths,
        "metrics": names,
        "window": args.window,
        "every": args.every if sliding else None,  # each record counts in windows_per_record windows
        "windows_per_record": sliding.per_window if sliding else 1,
        "allowed_lateness": args.allowed_lateness,
        "slices": _slices_from_args(args.slices), "slice_missing": args.slice_missing,
        "options": {"judgment_conflicts": args.judgment_conflicts, "grades": args.grades, "labels": args.labels, "unjudged": args.unjudged, "hist_bins": args.hist_bins,
                    "hist_range": args.hist_range, "group_rows": args.group_rows,
                    "drift_reference": getattr(args, "drift_reference", None), "cluster": args.cluster, "covariate": args.covariate, "covariate_log": args.covariate_log,
                    "relevance_level": args.relevance_level, "gain": args.gain, "ideal": args.ideal,
                    "err_max_grade": args.err_max_grade, "order": args.order, "tie_break": args.tie_break,
                    "score_precision": args.score_precision, "depth": args.depth, "complete": args.complete, "ctr": not args.no_ctr},
        "num_rows": counters.get(cn.METRIC_ROWS_WRITTEN, len(rows)),
        "counters": dict(sorted(counters.items())),
        "accounting": accounting,
        "accounting_problems": problems,
        "input_checks_failed": failed_checks,
        "metrics_without_rows": without_rows,
        "usage_errors": typos,
        "outputs": [FileSystems.join(run.result_dir, f) for f in outputs],
    }
    try:
        with FileSystems.create(FileSystems.join(run.write_dir, "summary.json")) as fo:
            fo.write(json.dumps(summary, indent=2, sort_keys=False).encode("utf-8"))
        publish(run, outputs, {"state": str(state), "accounting_problems": problems,
                                       "input_checks_failed": failed_checks})
    except Exception as e:  # noqa: BLE001 (the output's file system: disk full, permission)
        print(f"error: cannot finish the output {args.output}: {one_line(e)}", file=sys.stderr)
        return 1
    if not args.quiet and note is None:
        print(format_table(rows, names))
        if "comparisons.jsonl" in outputs:
            try:  # a small output (one record per window, slice, pair and metric), through FileSystems
                comparisons = [c for m in FileSystems.match([FileSystems.join(run.result_dir, "comparisons*.jsonl")])[0]
                               .metadata_list for c in read_jsonl(m.path)]
                print(f"comparisons with {args.compare_baseline} (comparisons.jsonl):")
                print(format_comparisons(comparisons, names))
            except Exception as e:  # noqa: BLE001 (not readable from this machine)
                print(f"note: the comparisons are not readable from this machine ({one_line(e)})")
    if note:
        print(f"note: {note}")
    if args.prometheus_textfile:
        try:
            write_textfile(args.prometheus_textfile, rows)
        except (OSError, ImportError) as e:
            print(f"error: cannot write --prometheus-textfile {args.prometheus_textfile}: {one_line(e)}",
                  file=sys.stderr)
            return 1
    line = report_line(counters, ranked, args.unjudged_file)
    if line:
        print(line)
    print(format_accounting(accounting))
    if sliding:  # the counts above are of records, each once
        print(f"windows: {sliding.describe()}: each request and click counts in {sliding.per_window} windows")
    on = f"{args.runner}, {workers} worker processes" if workers > 1 else args.runner
    print(f"wrote {summary['num_rows']} metric rows to {args.output} in {wall:.1f} s ({on})")
    status = exit_status(problems, failed_checks)
    if without_rows:
        print(without_rows_line(without_rows, EXIT_INPUT_CHECK), file=sys.stderr)
        if status == EXIT_OK:
            status = EXIT_INPUT_CHECK
    fired = counters.get(ALERTS_FIRED, 0)
    if args.alert_rules:
        print(f"alerts: {fired} fired ({FileSystems.join(run.result_dir, 'alerts.jsonl')})")
        if fired:
            try:  # a small output, through FileSystems; a local --output of remote workers is not here
                fired_alerts = read_jsonl(FileSystems.join(run.result_dir, "alerts.jsonl"))
            except (OSError, ValueError) as e:
                print(f"note: the alerts are not readable from this machine ({one_line(e)})")
                fired_alerts = []
            for a in sorted(fired_alerts,
                            key=lambda a: (a["rule"], a["metric"], a["slice"], a["system"], a["window_start"] or 0)):
                print(format_alert(a))
    for t in typos:
        print(f"error: {t}", file=sys.stderr)
    if typos and status != EXIT_FAILED:
        return EXIT_USAGE
    if status == EXIT_OK and fired:
        return EXIT_ALERT
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
