"""Streaming evaluation job: event-time windows with early, on-time and late panes.

    streameval stream --replay --impressions 'logs/*.avro' --judgments qrels.avro \\
        --metrics ndcg@10,map --window 1d --allowed-lateness 1h --early-every 30s --output out/

Sources:

* ``--replay``: plays the Avro logs in event-time order with a watermark: ``--replay-step`` of event
  time per watermark step, ``--replay-pace`` seconds of processing time per step (drives
  ``--early-every``). On Beam's local streaming runner (``BundleBasedDirectRunner``, which runs no
  splittable DoFn) a TestStream built from the files; elsewhere a splittable DoFn that reads them on
  a worker (:mod:`streameval.beam.streaming.replay_source`: Prism, Flink, Dataflow).
* ``--watch``: watches ``--impressions`` / ``--judgments`` / ``--clicks`` patterns for new Avro
  files: on the local runner a live watcher (:mod:`streameval.beam.streaming.live`), elsewhere a
  splittable DoFn (:mod:`streameval.beam.streaming.watch_source`: Prism, Flink, Dataflow), both with
  the same event-time watermark policy; ``--watch-idle-stop`` ends the job.
* ``--pubsub-impressions`` / ``--pubsub-judgments`` / ``--pubsub-clicks`` (subscriptions or
  topics, JSON messages, event time from the ``timestamp`` field or ``--pubsub-timestamp-attribute``)
  and ``--kafka-bootstrap`` with ``--kafka-impressions`` etc. (JSON values): Beam's own IOs, on
  runners that provide them (Dataflow; Flink and Spark with the Java expansion service for Kafka).

Outputs (``--output DIR``): one file set per window and pane
(:class:`~streameval.beam.streaming.sinks.WriteWindowedFiles`),
``metrics-<window start>-<window end>-<system>-pane<index>-<pane>.{jsonl,avro}`` (metric_result
schema; ``--formats`` adds ``.csv`` and the Parquet dataset ``metrics_parquet/``, the typed table of
:func:`metric_table`), plus ``late_data-*.jsonl``
and ``dead_letters-*.jsonl`` (dead_letter shape), ``summary.json`` and, last, ``manifest.json``: the
pane files read as one table with ``streameval.read_metrics(DIR)`` (``final_only=True``: the last
pane of each window). ``--replay``
writes into a folder of its own and replaces the previous run's outputs only when it ends
(:func:`streameval.beam.sinks.start_output`); ``--watch`` and the message sources write their panes
into a local ``--output`` as they fire (the previous run's outputs are removed when the job starts,
once its inputs are checked). Either way the folder is locked while the job runs. The console shows each pane as it fires (``--quiet``: only the summary).

Repeated and conflicting input follows the batch job's rules (replayed impressions and click events
are duplicates, reused event ids and items served twice dead letters, ``--judgment-conflicts
latest|max|reject``, ``--grades LO:HI``); a damaged Avro file gives its good records and one dead
letter. The job prints the record accounting (:func:`streameval.beam.accounting.format_accounting`),
writes it to ``summary.json`` (``accounting``, ``accounting_problems``) and exits with status 1 when
the counts do not add up.

This module is the job: its checks, its pipeline and its report. Its command line is
:mod:`streameval.jobs.stream_args`; the transforms it assembles are the library's
(:mod:`streameval.beam.streaming`: ``.sources``, ``.sinks`` for the pane files, ``.console``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from streameval.beam.arguments import (
    GDEVAL_ERR_MAX_GRADE,
    auto_err_max_grade,
    check_bootstrap_arguments,
    hist_range,
    make_pipeline,
    parse_err_max_grade,
    split_metrics,
    unknown_arguments_error,
)
from streameval.beam.sinks import DEFAULT_FORMATS, holding_outputs, parse_formats, publish, start_output
from streameval.exits import EXIT_ALERT, EXIT_FAILED, EXIT_INPUT_CHECK, EXIT_OK, EXIT_USAGE, exit_status, one_line
from streameval.io.outdir import RUNNING_TOTALS  # in --output: the accounting as of each pane
from streameval.io.selection import names_without_rows, without_rows_line
from streameval.beam.arguments import parse_grades as _grades
from streameval.beam.arguments import parse_slice_args as _slices_from_args
from streameval.io.metric_table import MetricTable, slice_columns
from streameval.beam.sources import (expand_inputs, failure_reason, runner_thread_errors_reported_once,
                                     set_file_system_options)
from streameval.beam.accounting import (cancel_on_interrupt, check_inputs, format_accounting,
                                        input_checks_from_args, job_counters, running_counters)
from streameval.beam.online import split_metric_names
from streameval.beam.streaming.coarse import ColumnarStreamMetrics
from streameval.beam.streaming.coarse_events import EventBlocks
from streameval.beam.streaming.coarse_replay import ReplayColumns
from streameval.beam.streaming.coarse_online import online_refusal
from streameval.beam.streaming.live import KINDS, WatchFiles
from streameval.beam.streaming.console import (LOCAL_COUNTS, LOCAL_UNREADABLE, PANE_LOG, ROW_KEYS, PanesOut, SideOut,
                                               print_alert, running_totals_line)
from streameval.beam.streaming.sinks import PARQUET_DATASET, WriteRecords, WriteWindowedFiles
from streameval.beam.streaming.sources import ReadKafkaEvents, ReadPubSubEvents, ReplayAvro
from streameval.beam.streaming.watch_source import WatchConfig, WatchEvents
from streameval.beam.streaming.replay_source import ReplayConfig, ReplayEvents
from streameval.plan.alerts import check_rules_match, load_rules
from streameval.beam.alerts import ALERTS_FIRED, StreamAlerts
from streameval.beam.prometheus import STORE as PROMETHEUS
from streameval.beam.prometheus import serve
from streameval.beam.streaming import (
    REASON_CLICK_UNMATCHED,
    StreamMetrics,
    parse_duration,
    replay_clock,
    stream_counts,
)
from streameval import interrupts
from streameval.io import progress
from streameval.io import counters as cn
from streameval.io.records import parse_time_range
from streameval.metrics.diversity import is_diversity_name
from streameval.metrics.names import MetricNameError, parse_metrics
from streameval.metrics.online import parse_online_metric
from streameval.metrics.stats import check_level

from streameval.jobs.stream_args import (
    build_arg_parser,
    check_local_inputs,
    check_prometheus,
    carries_state,
    job_options,
    engine_options,
    resume_from,
    resumed_summary,
    window_spec,
)

__all__ = ["main", "build_arg_parser"]  # the library's transforms: streameval.beam.streaming.sources, .sinks, .console

LOCAL_STREAM_RUNNERS = ("BundleBasedDirectRunner", "DirectRunner")
#: request shards of the columnar engine by default: the local runner runs one process (one core for
#: Python), where every shard a file is cut into costs a call of each batch stage per window it touches
#: (a fixed cost of milliseconds) and a key's state and timers: one shard (docs/scale.md, 2026-11-27)
COLUMNAR_SHARDS = 1
#: the outputs in --output: a new run's replace a previous run's, the manifest lists them last
OUTPUTS = ("metrics-*", PARQUET_DATASET, "late_data-*", "dead_letters-*", "alerts-*", RUNNING_TOTALS)


# --------------------------------------------------------------------------------------------
# the job

def _runner(args) -> str | None:
    """``--runner``, or the local streaming runner for ``--replay`` and ``--watch`` (None otherwise)."""
    return args.runner or ("BundleBasedDirectRunner" if args.replay or args.watch else None)


def _on_local_runner(args) -> bool:
    return _runner(args) in LOCAL_STREAM_RUNNERS


def _request_shards(args) -> int:
    """``--request-shards``, or its default: 16 on the local runner (it pays per key in every bundle),
    0 (one key per request) on distributed runners."""
    if args.request_shards is not None:
        return args.request_shards
    return 16 if _on_local_runner(args) else 0


def _live_watch(args) -> bool:
    """``--watch`` on the local streaming runner: the live TestStream source (:class:`WatchFiles`)."""
    return bool(args.watch) and _on_local_runner(args)


def _event_blocks(args) -> bool:
    """The impressions come from a source the runner runs (Kafka, Pub/Sub, or ``--watch`` and
    ``--replay`` off the local runner): on the columnar engine, as blocks without a watermark
    (:class:`~streameval.beam.streaming.coarse_events.EventBlocks`)."""
    if getattr(args, "kafka_impressions", None) or getattr(args, "pubsub_impressions", None):
        return True
    return bool(args.watch or args.replay) and not _on_local_runner(args)


def columnar_refusal(args) -> str | None:
    """Why the columnar streaming engine cannot run this job (None: it can)."""
    if not (_live_watch(args) or (args.replay and _on_local_runner(args)) or _event_blocks(args)):
        return "the columnar engine needs an impressions source"
    if args.every or args.sessions:
        return "the columnar engine has fixed windows only"
    if args.clicks or any(getattr(args, f"{s}_clicks", None) for s in ("kafka", "pubsub")):
        return "click events (--clicks) need the per-event engine (the columnar one reads the impressions' clicked field)"
    if any(getattr(args, f"{s}_judgments", None) for s in ("kafka", "pubsub")):
        return ("judgments from a topic need the per-event engine (the columnar one reads judgment files "
                "when the job starts)")
    return None


def _engine(args) -> str:
    """The engine the job runs on: ``columnar`` or ``events`` (``--engine``; ``auto`` picks columnar
    where it applies, else ``args.engine_note`` says why, for --watch and --replay). Raises ValueError for
    ``--engine columnar`` on a job it cannot run."""
    why = columnar_refusal(args)
    if args.engine == "columnar" and why:
        raise ValueError(f"--engine columnar: {why}")
    needs = ([f"online metrics ({', '.join(args.online_names)})"] if getattr(args, "online_names", None) else []) + \
        (["--ci bootstrap"] if getattr(args, "ci", "t") == "bootstrap" else []) + \
        ([f"--cluster {args.cluster}"] if getattr(args, "cluster", "none") != "none" else []) + \
        ([f"diversity measures ({', '.join(args.diversity_names)})"] if getattr(args, "diversity_names", None) else [])
    if needs and (why or args.engine == "events"):
        raise ValueError(f"{' and '.join(needs)} need the columnar engine: "
                         f"{why or 'not --engine events'}")
    if args.engine == "events":
        return "events"
    if why is None:
        return "columnar"
    if args.engine == "auto" and (args.watch or args.replay):
        args.engine_note = f"note: the per-event engine runs this job: {why}"  # printed once the job starts
    return "events"


def _sources(p, args, paths):
    """({kind: PCollection or None}, replay or live source or None)"""
    if getattr(args, "engine_used", None) == "columnar" and _event_blocks(args):
        return _event_block_sources(p, args, paths)
    if getattr(args, "engine_used", None) == "columnar" and args.replay:
        rep = ReplayColumns(paths["impressions"], step=args.replay_step, pace=args.replay_pace)
        out = p | "Replay" >> rep
        return {"impressions": out, "judgments": None, "clicks": None}, rep
    if getattr(args, "engine_used", None) == "columnar":
        live = WatchFiles({"impressions": paths["impressions"]}, interval=args.watch_interval or 1.0,
                          delay=args.watch_delay, idle_stop=args.watch_idle_stop, columnar=True,
                          max_pending=1_000_000)
        out = p | "Watch" >> live
        return {"impressions": out["impressions"], "judgments": None, "clicks": None, "watchers": [live]}, live
    if args.replay and not _on_local_runner(args):  # a source the runner executes: read on a worker
        source = _runner_source(args, {k: paths[k] for k in KINDS if paths[k]})
        out = p | "Replay" >> source
        srcs = {k: out[k] if paths[k] else None for k in KINDS}
        srcs["watchers"] = [source]
        return srcs, None
    if args.replay:
        rep = ReplayAvro(paths["impressions"], paths["judgments"], paths["clicks"], step=args.replay_step,
                         pace=args.replay_pace)
        out = p | "Replay" >> rep
        return {k: out[k] if (paths[k]) else None for k in KINDS}, rep
    if _live_watch(args):
        live = WatchFiles(paths, interval=args.watch_interval or 1.0, delay=args.watch_delay,
                          idle_stop=args.watch_idle_stop)
        out = p | "Watch" >> live
        srcs = {k: out[k] if paths[k] else None for k in KINDS}
        srcs["watchers"] = [live]
        return srcs, live
    out = {"watchers": []}
    watched = None
    if args.watch:  # one source for every kind: its watermark follows the local watcher's policy
        source = _runner_source(args, {k: paths[k] for k in KINDS if paths[k]})
        watched = p | "Watch" >> source
        out["watchers"].append(source)
    for k in KINDS:
        ps, topic = getattr(args, f"pubsub_{k}"), getattr(args, f"kafka_{k}")
        if watched is not None:
            out[k] = watched[k] if paths[k] else None
        elif ps:
            out[k] = p | f"PubSub{k.title()}" >> ReadPubSubEvents(ps, args.pubsub_timestamp_attribute)
        elif topic:
            out[k] = p | f"Kafka{k.title()}" >> ReadKafkaEvents(args.kafka_bootstrap, topic,
                                                                expansion_service=args.kafka_expansion_service,
                                                                timestamp_policy=args.kafka_timestamp_policy)
        else:
            out[k] = None
    return out, None


def _runner_source(args, paths: dict):
    """The replay (``--replay``) or the watch (``--watch``) of ``paths`` (``{kind: [path or pattern,
    ...]}``) as a source the runner executes on its workers (Flink, Prism, ...): one definition of its
    options for the per-event and the columnar engine."""
    if args.replay:
        return ReplayEvents(ReplayConfig(paths, parse_duration(args.replay_step, "--replay-step"), args.replay_pace))
    return WatchEvents(WatchConfig(paths, interval=args.watch_interval or 10.0,
                                   delay=parse_duration(args.watch_delay, "--watch-delay", allow_zero=True),
                                   idle_stop=args.watch_idle_stop))


def _input_paths(args) -> dict:
    """``{kind: [path or pattern, ...]}`` of the job's files: a replay's files (checked here), the
    patterns ``--watch`` follows, or, with a topic, the judgment files read when the job starts.
    Raises ValueError (a usage error) or FileNotFoundError."""
    paths = {k: [] for k in KINDS}
    if args.replay:
        if not args.impressions:
            raise ValueError("--replay needs --impressions")
        check_local_inputs(args)  # a CSV given as Avro, a glob that matches nothing (streameval.cli: before Beam)
        return {k: expand_inputs(getattr(args, k)) if getattr(args, k) else [] for k in KINDS}
    if args.watch:
        return _watched_patterns(args)
    if not (args.pubsub_impressions or args.kafka_impressions):
        raise ValueError("choose a source: --replay, --watch, --pubsub-impressions or --kafka-impressions")
    _check_topic_files(args)
    paths["judgments"] = expand_inputs(args.judgments) if args.judgments else []
    return paths


def _check_topic_files(args) -> None:
    """With impressions from a topic: files are given only for judgments, and not beside a judgments
    topic. Raises ValueError."""
    topic = "--kafka-impressions" if args.kafka_impressions else "--pubsub-impressions"
    if args.impressions:
        raise ValueError(f"--impressions names files: {topic} is the impressions' source (files: --watch or --replay)")
    if args.clicks:
        raise ValueError(f"--clicks names files: with {topic}, click events come from a topic "
                         "(--kafka-clicks, --pubsub-clicks)")
    if args.judgments and (args.kafka_judgments or args.pubsub_judgments):
        raise ValueError("give judgments as files (--judgments) or as a topic, not both")
    if args.judgments and args.engine == "events":
        raise ValueError(f"--judgments files with {topic} need the columnar engine (the per-event engine reads "
                         "judgments from a topic: --kafka-judgments, --pubsub-judgments)")


def _event_block_sources(p, args, paths):
    """The columnar engine's impressions from a source the runner runs, as blocks without a watermark
    (judgments are read from their files when the job starts): ``({kind: PCollection or None}, None)``."""
    srcs = {"judgments": None, "clicks": None, "watchers": []}
    if args.kafka_impressions:
        read = ReadKafkaEvents(args.kafka_bootstrap, args.kafka_impressions,
                               expansion_service=args.kafka_expansion_service,
                               timestamp_policy=args.kafka_timestamp_policy)
        # Kafka's (key, value) pairs: the values are decoded in the blocks (a damaged one is a dead letter)
        events, form = p | "KafkaImpressions" >> read.read, "json"
    elif args.pubsub_impressions:
        events, form = p | "PubSubImpressions" >> ReadPubSubEvents(args.pubsub_impressions,
                                                                   args.pubsub_timestamp_attribute).read, "json"
    else:  # --watch or --replay on Flink, Prism, ...: their sources' (path, records) pairs
        source = _runner_source(args, {"impressions": paths["impressions"]})
        events, form = (p | ("Replay" if args.replay else "Watch") >> source)["impressions"], "records"
        srcs["watchers"].append(source)
    srcs["impressions"] = events | "Blocks" >> EventBlocks(_source_labels(args)["impressions"], form)
    return srcs, None


def _watched_patterns(args) -> dict:
    """``{kind: [pattern, ...]}`` of ``--watch``, local ones made absolute: workers in another working
    directory (Prism's, Flink's) match the same files."""
    return {k: [p if "://" in p else os.path.abspath(os.path.expanduser(p)) for p in getattr(args, k)]
            for k in KINDS}


def _source_labels(args) -> dict:
    """The dead-letter ``source`` of each kind's records that do not come from a file (file sources
    name the file): the Pub/Sub subscription or topic, the Kafka topic."""
    labels = {}
    for k in KINDS:
        ps, topic = getattr(args, f"pubsub_{k}", None), getattr(args, f"kafka_{k}", None)
        labels[k] = ps or (f"kafka:{topic}" if topic else k)
    return labels


def build_pipeline(p, args, paths):
    """Add the job to ``p``: returns (StreamMetrics transform, rows, replay source or None)."""
    spec = window_spec(args)
    srcs, rep = _sources(p, args, paths)
    if srcs["impressions"] is None:
        raise ValueError("no impressions source")
    columnar = getattr(args, "engine_used", None) == "columnar"
    if columnar:
        judgment_paths = expand_inputs(paths["judgments"]) if paths["judgments"] else []
        ranking = bool(judgment_paths)
        make, first = ColumnarStreamMetrics, judgment_paths or None
    else:
        ranking = srcs["judgments"] is not None
        make, first = StreamMetrics, srcs["judgments"]
    sm = make(
        first, ((split_metrics(args.metrics) if ranking else args.online_names) if columnar
                else split_metric_names(args.metrics, diversity=True)[0]) or None,
        window=spec,
        slices=_slices_from_args(args.slices), clicks=srcs["clicks"], early_every=args.early_every,
        early_count=args.early_count, allowed_lateness=args.allowed_lateness, retention=args.retention,
        attribution_delay=args.attribution_delay, relevance_level=args.relevance_level, gain=args.gain,
        ideal=args.ideal, err_max_grade=args.err_max_grade, order=args.order, tie_break=args.tie_break,
        depth=args.depth, score_precision=args.score_precision, ctr=not args.no_ctr,
        request_shards=(args.request_shards or COLUMNAR_SHARDS) if columnar else _request_shards(args), clock=replay_clock if (args.replay and _on_local_runner(args)) or _live_watch(args) else None,
        source=_source_labels(args), judgment_conflicts=args.judgment_conflicts,
        grade_range=_grades(args.grades), time_range=parse_time_range(args.event_time_range),
        ci_level=args.ci_level, intervals=args.intervals, ci_bounded=getattr(args, "ci_bounded", "logit"),
        timers=getattr(args, "timers_used", "one"),
        **(dict(ci=args.ci, replicates=args.replicates, ci_seed=args.ci_seed, hist_bins=args.hist_bins,
                hist_range=hist_range(args.hist_range), cluster=args.cluster, source_watermark=not _event_blocks(args),
                flushes=getattr(rep, "flushes", False)) if columnar else {}))
    rows = srcs["impressions"] | "StreamMetrics" >> sm
    ranking_names = split_metric_names(args.metrics, diversity=True)[0]
    names = [s.name for s in parse_metrics(ranking_names, arithmetic="the Beam jobs", diversity=True)] \
        if ranking and ranking_names else []
    # running totals after each pane: this process's counts are the whole job's on the local runner only
    # (other runners: wait_reporting prints the job's counters from the launcher)
    local = _on_local_runner(args)
    out = getattr(args, "write_dir", None) or args.output  # the run's folder (main: sinks.start_output)
    totals = os.path.join(out, RUNNING_TOTALS) if local and out and "://" not in out else None
    if totals and os.path.exists(totals):
        os.remove(totals)
    sm.panes | "Console" >> beam.ParDo(PanesOut(names, args.quiet, sm.cfg.run if local else None, totals))
    side = [sm.side]
    if isinstance(rep, (ReplayAvro, ReplayColumns)) and rep.unreadable:
        side.append(p | "UnreadableFiles" >> beam.Create(rep.unreadable))
    side.extend(w.unreadable for w in srcs.get("watchers", []))
    side = side[0] if len(side) == 1 else tuple(side) | "AllSideRecords" >> beam.Flatten()
    side | "SideRecords" >> beam.ParDo(SideOut(out, "side"))
    if out:
        formats = getattr(args, "formats", DEFAULT_FORMATS)
        sm.panes | "WritePanes" >> WriteWindowedFiles(out, formats, table=metric_table(args, spec))
    if args.prometheus_port is not None:
        sm.panes | "Prometheus" >> beam.Map(_export_pane)
    if getattr(args, "alert_rules", None):
        rules = StreamAlerts(args.alert_rules)
        alerts = sm.panes | "Alerts" >> rules
        if args.prometheus_port is not None:  # the mSPRT rules' p-values and intervals at every pane
            rules.looks | "PrometheusLooks" >> beam.Map(_export_look)
        alerts | "PrintAlerts" >> beam.Map(print_alert)
        if out:
            alerts | "WriteAlerts" >> WriteRecords(out, "alerts")
    return sm, rows, rep


def metric_table(args, spec) -> MetricTable:
    """The typed table of the panes' Parquet and CSV files: a column per ``--slices`` attribute and,
    with session windows (``spec``), per session key a label starts with (``user=``, and
    ``request=`` for a request without a user; ``request`` alone with ``--session-key request``)."""
    keys = () if spec.windowed else ("user", "request") if spec.by == "user" else ("request",)
    return MetricTable(slice_columns(_slices_from_args(args.slices), keys))


def _row_dicts(keys) -> list[dict]:
    return [{"metric": m, "system": sy, "slice": sl} for m, sy, sl in keys]


def _asked_metrics(args, ranking: bool) -> list[str]:
    """The metric rows ``--metrics`` asks for, as the rows name them: the ranking measures (with
    judgments), the online metrics, and ``ctr`` when named (and not ``--no-ctr``)."""
    ranking_names, online_names = split_metric_names(args.metrics, diversity=True)
    names = [s.name for s in parse_metrics(ranking_names, arithmetic="the Beam jobs", diversity=True)] \
        if ranking and ranking_names else []
    for n in online_names:
        spec = parse_online_metric(n)
        if spec.family != "ctr" or not args.no_ctr:
            names.append(spec.name)
    return names


def _typos(args, in_process: bool, paths) -> list[str]:
    """One-line errors of what the command line named and the job's rows show to be a typo (issue
    41): the first alert rule that matched no row (a rule on ``ndgc@10`` gave "0 fired", exit 0),
    and each ``--slices`` attribute that no record had (every request in ``campain=(missing)``),
    named with the closest attributes the first records of the inputs have. The rows: every pane's,
    as seen in this process on the local runner (``ROW_KEYS``), else the output's (``--output``,
    read through its manifest); on another runner without ``--output`` nothing is checked."""
    from streameval.beam.keys import attributes_without_values, parse_slices
    from streameval.io.selection import NoMatchError, record_attributes, slice_attribute_error

    specs = parse_slices(_slices_from_args(args.slices))
    if not args.alert_rules and not specs:
        return []

    if in_process:
        rows = _row_dicts(ROW_KEYS)
    elif args.output:
        from streameval.io.tables import MetricsTableError, read_metrics

        try:
            rows = read_metrics(args.output)
        except (MetricsTableError, OSError) as e:
            print(f"note: the alert rules and slices were not checked against the output ({one_line(e)})")
            return []
    else:
        return []
    out = []
    if args.alert_rules:
        try:
            check_rules_match(args.alert_rules, rows, where="the job's panes")
        except NoMatchError as e:
            out.append(f"--alerts {args.alerts}: {e}")
    absent = attributes_without_values(specs, {r["slice"] for r in rows})
    if absent and any(r["slice"] == "all" for r in rows):  # (no row at all: nothing was read)
        try:  # suggestions only: a watched folder or a bad glob names none
            files = expand_inputs(paths["impressions"]) if paths.get("impressions") else []
        except Exception:  # noqa: BLE001
            files = []
        have = record_attributes(files)
        out += [str(slice_attribute_error(a, have)) for a in absent]
    return out


def _export_pane(rows):
    """A pane's rows into the store the Prometheus endpoint serves (this process: the local runner)."""
    for r in rows if isinstance(rows, list) else [rows]:
        PROMETHEUS.update(r)


def _export_look(look):
    """An mSPRT rule's look into the store the Prometheus endpoint serves (this process)."""
    PROMETHEUS.update_look(look)


def _runner_counters(counters: dict, in_process: bool) -> dict | None:
    """summary.json's ``counters``: the runner's counters of the job, or None on the local runner (they
    cover a step's first bundle there; the job's counts are its own tally, ``counts``)."""
    return None if in_process else dict(sorted(counters.items()))


def _summary_line(c: dict, replayed: dict, local: dict, verb: str = "replayed") -> str:
    """The one-line summary: records replayed, panes, late data, unmatched clicks, invalid records
    (``c``: the record counts; ``local``: what the command's own steps counted)."""
    invalid = sum(v for k, v in c.items() if k.startswith(cn.REJECTED_PREFIX))
    parts = []
    if replayed:
        parts.append(f"{verb} {replayed.get('impressions', 0)} impression, {replayed.get('judgments', 0)} judgment "
                     f"and {replayed.get('clicks', 0)} click records")
    panes = {**c, **local}
    parts.append("panes: " + ", ".join(f"{panes.get(cn.panes(p), 0)} {p}" for p in ("early", "on_time", "late"))
                 + f" ({panes.get(cn.PANES_FINAL, 0)} final)")
    late = {k[len(cn.LATE_PREFIX):]: v for k, v in c.items() if k.startswith(cn.LATE_PREFIX) and v}
    if c.get(cn.JUDGMENT_LATE_NOTICES):
        late["judgment (applied to open windows)"] = c[cn.JUDGMENT_LATE_NOTICES]
    parts.append("late data: " + (", ".join(f"{v} {k}" for k, v in sorted(late.items())) or "none"))
    parts.append(f"{c.get(cn.rejected('click', REASON_CLICK_UNMATCHED), 0)} click events matched no impression")
    parts.append(f"{invalid} invalid records")
    return "; ".join(parts)


def check_outputs(counts: dict, local: dict, replayed: dict | None) -> list[str]:
    """Identities between the record counts of StreamMetrics and what the command saw on the
    outputs (local runner): records replayed = records read; late records written = ``late:<kind>``;
    dead letters written = records rejected."""
    problems = []
    for kind in (replayed or {}):  # "impressions", "judgments", "clicks"
        name = cn.read(kind[:-1])
        if replayed[kind] != counts.get(name, 0):
            problems.append(f"{kind}: replayed {replayed[kind]} records but {name} is {counts.get(name, 0)}")
    for kind in ("impression", "click"):
        got, want = local.get(cn.written(cn.late(kind)), 0), counts.get(cn.late(kind), 0)
        if got != want:
            problems.append(f"late {kind}s: {got} written to the late-data output, {want} counted late")
    rejected = sum(v for k, v in counts.items() if k.startswith(cn.REJECTED_PREFIX))
    if local.get(cn.WRITTEN_REJECTED, 0) != rejected:
        problems.append(f"dead letters: {local.get(cn.WRITTEN_REJECTED, 0)} written, {rejected} records rejected")
    return problems


def wait_reporting(result, every: float, out=None, sleep=time.sleep, options=None):
    """Waits for a job on another runner (an unbounded one may never end), printing the running
    totals of its Beam counters (:func:`~streameval.beam.streaming.console.running_totals_line`)
    every ``every`` seconds; returns the final state."""
    from apache_beam.runners.runner import PipelineState

    out = out or sys.stdout
    try:
        while not PipelineState.is_terminal(result.state):
            sleep(every)
            try:
                counters = running_counters(result, options=options)
            except Exception as e:  # noqa: BLE001 - a runner that cannot report metrics while running
                counters, note = {}, f" (metrics unavailable: {type(e).__name__})"
            else:
                note = ""
            out.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {result.state}: "
                      f"{running_totals_line(counters)}{note}\n")
            out.flush()
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the job on the runner does not go on without us
        cancel_on_interrupt(result, e, options)
        raise
    if result.state == PipelineState.DONE:
        # finished: Beam 2.62's wait_until_finish on a finished portable job waits for its message
        # stream until the call's deadline (DEADLINE_EXCEEDED after 60 s on Prism); a failed job's
        # error still comes from wait_until_finish
        return result.state
    return result.wait_until_finish()


def main(argv=None) -> int:
    return holding_outputs(_main, argv)  # the run's hold on its --output folder, let go on every path


def _main(argv, held: list) -> int:
    parser = build_arg_parser()
    args, beam_args = parser.parse_known_args(argv)
    unknown = unknown_arguments_error(parser, beam_args)  # Beam's options only: a typo is not dropped
    if unknown:
        print(f"error: {unknown}", file=sys.stderr)
        return 2
    try:
        set_file_system_options(PipelineOptions(beam_args))  # before any remote file is matched
        window_spec(args)
        if args.replay + args.watch > 1:
            raise ValueError("--replay and --watch exclude each other")
        parse_duration(args.allowed_lateness, "--allowed-lateness", allow_zero=True)
        parse_duration(args.attribution_delay, "--attribution-delay", allow_zero=True)
        parse_duration(args.watch_delay, "--watch-delay", allow_zero=True)
        parse_duration(args.replay_step, "--replay-step")
        if args.retention is not None:
            parse_duration(args.retention, "--retention")
        args.alert_rules, args.formats = load_rules(args.alerts) if args.alerts else None, parse_formats(args.formats)
        check_prometheus(args, _on_local_runner(args))
        check_level(args.ci_level, "--ci-level")
        if not 0 < args.progress_interval <= 86400:  # also NaN
            raise ValueError(f"--progress-interval must be a number of seconds in (0, 86400], got {args.progress_interval}")
        if args.early_every:
            parse_duration(args.early_every, "--early-every")
        _slices_from_args(args.slices)
        _grades(args.grades)
        parse_time_range(args.event_time_range)
        ranking_names, online_names = split_metric_names(args.metrics, diversity=True)
        # diversity measures: the columnar engine only (_engine)
        args.diversity_names = [n for n in ranking_names if is_diversity_name(n)]
        if ranking_names and (args.judgments or any(getattr(args, f"{s}_judgments") for s in ("pubsub", "kafka"))):
            parse_metrics(ranking_names, arithmetic="the Beam jobs", diversity=True)
        check_bootstrap_arguments(args)
        hist_range(args.hist_range)
        args.online_names = [n for n in online_names if parse_online_metric(n).family != "ctr"]
        if args.online_names:
            why = online_refusal(args.online_names)
            if why:
                raise ValueError(why)
        paths = _input_paths(args)
        if any(getattr(args, f"kafka_{k}") for k in KINDS) and not args.kafka_bootstrap:
            raise ValueError("Kafka topics need --kafka-bootstrap")
        checks = input_checks_from_args(args)
        err_auto = parse_err_max_grade(args.err_max_grade) is None
        args.err_max_grade = parse_err_max_grade(args.err_max_grade) or GDEVAL_ERR_MAX_GRADE
        if err_auto and args.replay and paths["judgments"]:
            args.err_max_grade = auto_err_max_grade(
                parse_metrics(ranking_names, arithmetic="the Beam jobs", diversity=True) if ranking_names else [],
                paths["judgments"], _grades(args.grades))
        args.engine_used = _engine(args)
        args.timers_used = engine_options(args, beam_args, _runner(args))  # Flink's: checkpoints, timers
    except (ValueError, TypeError, MetricNameError, FileNotFoundError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2

    runner = _runner(args)
    if runner is None:
        print("error: name a streaming runner with --runner (e.g. DataflowRunner, FlinkRunner, PrismRunner)",
              file=sys.stderr)
        return 2
    options = PipelineOptions(job_options(runner, beam_args))  # (Flink's checkpoints and workers)
    options.view_as(StandardOptions).streaming = True
    try:
        p = make_pipeline(options)
        if args.output:  # refuse an output that overlaps the inputs, lock it, give the run its folder
            run = start_output(args.output, OUTPUTS, live=not args.replay, command="streameval stream",
                               inputs=[(f"--{k}", getattr(args, k) or [], paths[k] if args.replay else [])
                                       for k in KINDS], resume=resume_from(options) is not None)
            held.append(run)
            if run.notice:
                print(run.notice, file=sys.stderr)
            args.output, args.write_dir, args.output_run = run.output, run.write_dir, run
    except Exception as e:  # noqa: BLE001 (the runner's name; the output's file system: a file in the way, permission)
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    if getattr(args, "engine_note", None):
        print(args.engine_note, file=sys.stderr)
    local, unreadable = LOCAL_COUNTS, LOCAL_UNREADABLE
    local.clear()
    unreadable.clear()
    PANE_LOG.clear()
    ROW_KEYS.clear()
    try:
        sm, _, rep = build_pipeline(p, args, paths)
    except (ValueError, TypeError) as e:  # an option a transform refuses (each checks its own)
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    exporter = None
    if args.prometheus_port is not None:
        PROMETHEUS.clear()
        try:
            exporter = serve(args.prometheus_port)
        except (OSError, ImportError) as e:
            print(f"error: --prometheus-port {args.prometheus_port}: {one_line(e)}", file=sys.stderr)
            return 2
        print(f"serving the latest values on http://127.0.0.1:{exporter.port}/metrics (Prometheus)")
    try:
        return _run(p, args, paths, sm, rep, exporter, checks, runner, start)
    finally:
        if exporter is not None:
            exporter.close()


def _run(p, args, paths, sm, rep, exporter, checks, runner, start) -> int:
    """The job's run and report (``main``'s second half; ``exporter``: the Prometheus endpoint or None)."""
    local, unreadable = LOCAL_COUNTS, LOCAL_UNREADABLE
    live = rep if isinstance(rep, WatchFiles) else None
    handlers = {}
    if live is not None and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop watching: every window closes, the job reports
            handlers[sig] = signal.signal(sig, lambda *_: live.watcher.stop())
    run_id = getattr(getattr(sm, "cfg", None), "run", None)

    def records_read():
        counts = stream_counts(run_id) if run_id else {}
        return sum(v for k, v in counts.items() if k.endswith(cn.READ_SUFFIX))

    # records read and rows emitted so far (this process's: the local runner's), on stderr every few
    # seconds and at the end; off with --quiet
    line = progress.ProgressLine("streameval stream", read=records_read,
                                 written=lambda: progress.counts().get("stream_rows", 0),
                                 interval=args.progress_interval, enable=not args.quiet).start()
    try:
        with runner_thread_errors_reported_once():
            result = p.run()
            in_process = _on_local_runner(args)
            state = result.wait_until_finish() if in_process else wait_reporting(result, args.report_every, options=p.options)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the runner's error, reported in one line
        line.enable = False
        line.stop()
        stop = interrupts.stop_for(e)  # Ctrl-C or SIGTERM (not --watch's), which the runner may have wrapped
        if stop is not None:
            raise stop  # streameval.cli says so in one line; close_output removes what the run wrote
        reason = failure_reason(e, p.options)
        print(f"error: the job failed: {reason}", file=sys.stderr)
        return 1  # close_output removes what the run wrote (--replay: its folder; the previous run's outputs stay)
    finally:
        if live is not None:
            live.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if live is not None and live.watcher.error is not None:
        line.enable = False
        line.stop()
        print(f"error: the job failed: {failure_reason(live.watcher.error)}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - start
    counters = job_counters(result, options=p.options)
    if not _on_local_runner(args):  # the workers' counts: the job's counters
        line.read = lambda: sum(v for k, v in counters.items() if k.endswith(cn.READ_SUFFIX))
    line.stop()
    progress.add("stream_rows", -progress.counts().get("stream_rows", 0))  # the next run in this process starts at 0
    replayed = rep.counts if rep is not None else {}
    # the local runner reports Beam counters of a step's first bundle only: count in this process
    counts = sm.counts() if in_process else counters
    local_seen = dict(local)
    accounting, problems = sm.accounting(sorted(unreadable), counts, carries_state(args, p.options, in_process))
    checked = {k: v for k, v in replayed.items() if paths[k]}
    if getattr(args, "engine_used", None) == "columnar" and paths["judgments"]:
        # the columnar engine reads the judgments when it starts (not through the watcher)
        checked.pop("judgments", None)
        replayed = {**replayed, "judgments": counts.get(cn.JUDGMENTS_READ, 0)}
    if in_process:
        problems += check_outputs(counts, local_seen, checked)
    failed_checks = check_inputs(accounting, checks, judgments=sm.cfg.ranking and resume_from(p.options) is None,
                                 inputs=paths.get("impressions") or [])  # (resumed: read before the savepoint)
    # a metric asked for that produced no row (gauc[user,...] on a log without user ids) is a failed
    # check (issue 41); known from the panes seen here on the local runner
    without_rows = names_without_rows(_asked_metrics(args, sm.cfg.ranking), _row_dicts(ROW_KEYS),
                                      accounting.get("impression", {}).get("accepted", 0)) if in_process else None
    line = _summary_line(counts, replayed, local_seen if in_process else {}, "read" if live else "replayed")
    print(line)
    print(format_accounting(accounting))
    if args.output:
        summary = {"state": str(state), "wall_seconds": round(wall, 3), "runner": runner, "engine": args.engine_used,
                   "window": sm.cfg.spec.describe(), "allowed_lateness": args.allowed_lateness, "retention": args.retention, "ci_level": args.ci_level, "intervals": args.intervals,
                   "early_every": args.early_every, "early_count": args.early_count, "event_timers": args.timers_used,
                   "judgment_conflicts": args.judgment_conflicts, "grades": args.grades, "inputs": paths,
                   "replayed": replayed, "counts": dict(sorted(counts.items())),
                   "counters": _runner_counters(counters, in_process), "counted_here": dict(sorted(local_seen.items())),
                   "accounting": accounting, "accounting_problems": problems,
                   "input_checks_failed": failed_checks, "metrics_without_rows": without_rows,
                   "summary": line, **resumed_summary(p.options, args.output_run)}
        try:
            totals = os.path.join(args.write_dir, RUNNING_TOTALS)
            if in_process and "://" not in args.write_dir and os.path.exists(totals):
                # the closing record: the job's final counts. The records written as panes fired are
                # snapshots of this process's counts at that moment; on the local runner the last pane
                # may fire before a parallel branch (dead letters, late data) has counted its records
                with open(totals, "a", encoding="utf-8") as fo:
                    fo.write(json.dumps({"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                                         "pane": "end", "window_start": None, "window_end": None, "system": None,
                                         "counts": dict(sorted(counts.items()))}) + "\n")
            with FileSystems.create(FileSystems.join(args.write_dir, "summary.json")) as fo:
                fo.write(json.dumps(summary, indent=2).encode("utf-8"))
            publish(args.output_run, OUTPUTS, {"state": str(state), "accounting_problems": problems,
                                           "input_checks_failed": failed_checks})
        except Exception as e:  # noqa: BLE001 (the output's file system: disk full, permission)
            print(f"error: cannot finish the output {args.output}: {one_line(e)}", file=sys.stderr)
            return 1
        print(f"wrote the panes to {args.output} in {wall:.1f} s ({runner})")
    if exporter is not None and args.prometheus_linger:
        # the job ended: every later scrape collects the final values; wait until one was stored
        got = exporter.wait_for_scrape(exporter.mark(), args.prometheus_linger)
        if got == "stored":
            print("prometheus: a scrape stored the final values")
        else:
            print(f"note: prometheus: {'no scrape collected' if got == 'none' else 'no scrape after the one that collected'}"
                  f" the final values within --prometheus-linger {args.prometheus_linger:g} s")
    status = exit_status(problems, failed_checks)
    if without_rows:
        print(without_rows_line(without_rows, EXIT_INPUT_CHECK), file=sys.stderr)
        if status == EXIT_OK:
            status = EXIT_INPUT_CHECK
    if args.alert_rules:
        # the local runner's counters cover a step's first bundle only: the alerts printed here
        fired = local_seen.get(cn.ALERTS_PRINTED, 0) if in_process else counters.get(ALERTS_FIRED, 0)
        print(f"alerts: {fired} fired" + (f" (alerts-*.jsonl in {args.output})" if args.output else ""))
    typos = _typos(args, in_process, paths)
    for t in typos:
        print(f"error: {t}", file=sys.stderr)
    if typos and status != EXIT_FAILED:
        return EXIT_USAGE
    if args.alert_rules:
        if status == EXIT_OK and fired:
            return EXIT_ALERT
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
