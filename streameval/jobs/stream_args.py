"""The streaming job's command line (``streameval stream``): :func:`build_arg_parser` and the
windows it names (:func:`window_spec`). Imports no Beam, so that ``--help`` and argument errors answer
before Beam is imported (``streameval.cli`` parses with it first). The job itself, its checks and its pipeline:
:mod:`streameval.jobs.stream`."""

from __future__ import annotations

import argparse

from streameval.beam.accounting import add_input_check_arguments
from streameval.beam.arguments import (
    DEFAULT_FORMATS,
    DEFAULT_METRICS,
    KAFKA_TIMESTAMP_POLICIES,
    KINDS,
    add_bootstrap_arguments,
    add_hist_arguments,
    add_metric_option_arguments,
    add_record_rule_arguments,
    add_window_limit_argument,
    sliding_window_spec,
    split_window_arg,
)
from streameval.beam.keys import check_window_limit
from streameval.metrics.choices import DEFAULT_SCORE_PRECISION, SCORE_PRECISIONS

__all__ = ["build_arg_parser", "window_spec", "check_local_inputs"]


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval stream",
        description="Streaming ranking and click metrics over impression / judgment / click events, in "
                    "event-time windows with early, on-time and late panes (Apache Beam). Other arguments "
                    "go to Beam's PipelineOptions; one Beam does not know either is refused (docs/cli.md, "
                    "\"Beam's pipeline options\").")
    _add_source_arguments(p)
    w = p.add_argument_group("windows and triggers")
    w.add_argument("--window", default=None, help="fixed window size (1h, 1d, ...); with --every: sliding; "
                   "also written 1h/10m (sliding), session:30m, session:30m/request")
    w.add_argument("--every", default=None, help="period of sliding windows (the size a multiple of it)")
    w.add_argument("--sessions", default=None, metavar="GAP", help="session windows with this gap instead")
    w.add_argument("--session-key", choices=("user", "request"), default="user")
    add_window_limit_argument(w)
    w.add_argument("--early-every", default=None, help="early panes every this much processing time (e.g. 30s)")
    w.add_argument("--early-count", type=int, default=None, help="early panes every N request updates")
    w.add_argument("--allowed-lateness", default="0", help="data this late still updates a window (default 0)")
    w.add_argument("--attribution-delay", default="30m", help="click events join impressions this recent (30m)")
    w.add_argument("--prometheus-port", type=int, default=None, metavar="PORT",
                   help="serve the latest final and latest pane values on http://127.0.0.1:PORT/metrics "
                        "(Prometheus exposition format; the local runner)")
    w.add_argument("--prometheus-linger", type=float, default=0, metavar="S",
                   help="after the job ended, keep serving until a scraper stored the final values (a scrape "
                        "after the end was sent and the next scrape arrived), at most S seconds (default 0; "
                        "give two scrape intervals or more)")
    w.add_argument("--alerts", default=None, metavar="RULES.toml",
                   help="alert rules (docs/metrics.md, 'Alert rules'), evaluated on every pane: ALERT lines, "
                        "alerts-*.jsonl; exit status 4 when one fired")
    w.add_argument("--retention", default=None,
                   help="how long a final request is remembered, so that its later pieces are late data as in "
                        "the batch job (default: the window size or the allowed lateness, whichever is longer; "
                        "state grows with the request ids of this span)")

    m = p.add_argument_group("metrics (as streameval batch)")
    m.add_argument("--metrics", default=DEFAULT_METRICS)
    m.add_argument("--slices", action="append", default=[])
    add_metric_option_arguments(m, err_help=(
        "g_max of ERR, a number, or auto (default): with --replay, the largest grade of the judgment files (at "
        "least 1), as the batch job; with --watch, Pub/Sub or Kafka, 4 (the judgments are not known when the job "
        "starts)"))
    m.add_argument("--ci-level", type=float, default=0.95,
                   help="level of every pane row's interval (Wilson for CTR, t otherwise; default 0.95)")
    m.add_argument("--cluster", choices=("none", "request", "user"), default="none",
                   help="also ctr[cluster=C] rows: CTR with the delta method's standard error over requests or "
                        "users (the batch job's; columnar engine)")
    m.add_argument("--intervals", choices=("fixed", "anytime"), default="fixed",
                   help="fixed-sample intervals (default) or confidence sequences, valid at every pane at once")
    add_bootstrap_arguments(m, "the ranking metrics' intervals on every pane: t (default) or the Poisson bootstrap "
                               "(the columnar engine)")
    add_hist_arguments(m)
    m.add_argument("--order", choices=("score", "position"), default="score")
    m.add_argument("--tie-break", choices=("docno", "position"), default="docno")
    m.add_argument("--score-precision", choices=SCORE_PRECISIONS, default=DEFAULT_SCORE_PRECISION,
                   help="compare scores as doubles, as trec_eval 10 does (float64, default), or rounded to "
                        "single precision, as trec_eval 9 and pytrec_eval store them (float32)")
    m.add_argument("--depth", type=int, default=None)
    m.add_argument("--no-ctr", action="store_true", help="do not compute click metrics")
    add_record_rule_arguments(m)
    m.add_argument("--engine", choices=("auto", "columnar", "events"), default="auto",
                   help="columnar: the batch job's vectorised stages on each watched file's or replay step's "
                        "columns (--watch, --replay; the local runner, fixed windows, judgments read at the start, clicks in the impression "
                        "records); events: one event at a time (every source and window); auto (default): "
                        "columnar where it applies, saying why when it does not")
    m.add_argument("--event-timers", choices=("auto", "one", "per-deadline"), default="auto",
                   help="event-time timers of the window stages: one per key, set for its next deadline; or one "
                        "per pending deadline (Beam's dynamic timer tags: a watermark step closes every due window "
                        "at once). auto (default): per-deadline on Flink (--runner FlinkRunner or --flink_master), "
                        "one elsewhere (Prism 2.62 fires tagged timers early, apache/beam#35090)")
    m.add_argument("--request-shards", type=int, default=None,
                   help="keyed states holding the open requests: 0 keys them by request id (each element reads "
                        "and writes only its requests' state); default 16 on the local runner, 0 on others")

    _add_output_arguments(p)
    add_input_check_arguments(p)
    return p


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    """The sources group of :func:`build_arg_parser`."""
    src = p.add_argument_group("sources (one of --replay, --watch, Pub/Sub, Kafka)")
    src.add_argument("--impressions", action="append", default=[],
                     help="Avro file(s) or glob of impressions (--replay, --watch); repeatable")
    src.add_argument("--judgments", action="append", default=[], help="Avro file(s) or glob of judgments")
    src.add_argument("--clicks", action="append", default=[],
                     help="Avro file(s) or glob of click events {request_id, item_id, timestamp, system_id?}; with "
                          "them an impression whose clicked is null counts as not clicked unless a click matches")
    src.add_argument("--replay", action="store_true",
                     help="replay the files in event-time order with a watermark (local streaming runner)")
    src.add_argument("--replay-step", default="1h", help="event time per watermark step of the replay (default 1h)")
    src.add_argument("--replay-pace", type=float, default=1.0,
                     help="processing-time seconds per replay step (drives --early-every; default 1)")
    src.add_argument("--watch", action="store_true",
                     help="watch the patterns for new Avro files while the job runs (local runner: a live "
                          "TestStream service; other runners: a splittable DoFn with an event-time watermark)")
    src.add_argument("--watch-interval", type=float, default=None,
                     help="seconds between matches (default 1 on the local runner, 10 elsewhere)")
    src.add_argument("--watch-delay", default="0",
                     help="the watermark stays this far behind the latest impression or click "
                          "time read (default 0). It moves only after a poll in which no file is still being "
                          "copied, so files copied in any order are read before it passes them; a file arriving "
                          "after a quiet poll with events older than the watermark is late")
    src.add_argument("--watch-idle-stop", type=float, default=None, metavar="SECONDS",
                     help="end the job (closing every window) after this long without a new "
                          "file (default: run until stopped)")
    for k in KINDS:
        src.add_argument(f"--pubsub-{k}", default=None, help=f"Pub/Sub subscription or topic of {k} (JSON)")
        src.add_argument(f"--kafka-{k}", default=None, help=f"Kafka topic of {k} (JSON values)")
    src.add_argument("--pubsub-timestamp-attribute", default=None, help="Pub/Sub attribute holding the event time")
    src.add_argument("--kafka-bootstrap", default=None, help="Kafka bootstrap servers (host:port,...)")
    src.add_argument("--kafka-expansion-service", default=None, help="address of a running expansion service")
    src.add_argument("--kafka-timestamp-policy", choices=sorted(KAFKA_TIMESTAMP_POLICIES), default="create_time",
                     help="what the watermark of a Kafka source follows (default create_time: producers set each "
                          "record's timestamp to its event time)")

def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """The output group of :func:`build_arg_parser`."""
    o = p.add_argument_group("output")
    o.add_argument("--output", default=None, help="directory for the windowed files (none: console only)")
    o.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="files of each pane's metric rows: comma-separated avro, jsonl (required), parquet "
                        "(windows as UTC timestamps, NaN as null; one dataset, metrics_parquet/, partitioned by "
                        "window_date) and csv (a header per file), both with the count by unit (n, n_unit, "
                        "num_queries, num_impressions, num_requests) and a slice_<attr> column per slice attribute; "
                        "default avro,jsonl. Late data, dead letters and alerts are JSON lines")
    o.add_argument("--quiet", action="store_true",
                   help="do not print the panes nor the progress line on stderr (records read, rows emitted, rate)")
    o.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                   help="seconds between progress lines on stderr (default 5)")
    o.add_argument("--report-every", type=float, default=60.0, metavar="SECONDS",
                   help="on other runners than the local one: print the running totals of the job's counters "
                        "this often while it runs (default 60)")
    o.add_argument("--runner", default=None,
                   help="Beam runner (default BundleBasedDirectRunner for --replay; e.g. DataflowRunner, "
                        "FlinkRunner, PrismRunner)")


#: ``--window 1h/10m`` and ``session:30m`` as ``--every`` / ``--sessions`` (shared with the batch job)
_split_window_arg = split_window_arg


def window_spec(args):
    """The job's windows from ``--window`` / ``--every`` / ``--sessions`` / ``--session-key`` (after
    :func:`_split_window_arg`, which rewrites ``args`` in place). Raises ValueError for a missing or
    mixed form, or a duration :func:`~streameval.beam.streaming.parse_duration` refuses."""
    from streameval.beam.streaming import WindowSpec, parse_duration

    _split_window_arg(args)
    check_window_limit(args.max_windows_per_record, "--max-windows-per-record")
    if args.sessions:
        if args.window or args.every:
            raise ValueError("--sessions excludes --window / --every")
        parse_duration(args.sessions, "--sessions")  # the message names the option
        return WindowSpec.sessions(args.sessions, by=args.session_key)
    if not args.window:
        raise ValueError("give --window SIZE (with --every PERIOD for sliding windows) or --sessions GAP")
    if not args.every:
        parse_duration(args.window, "--window")
    return sliding_window_spec(args) if args.every else WindowSpec.fixed(args.window)


def check_local_inputs(args) -> None:
    """With ``--replay``: the local files of ``--impressions``, ``--judgments`` and ``--clicks`` exist,
    and none is plainly CSV, JSON, Parquet or text (:func:`streameval.io.inputs.check_local_inputs`):
    checked before Beam is imported. ``--watch`` patterns may match nothing yet. Raises
    FileNotFoundError or ValueError (one line, exit 2)."""
    from streameval.io.inputs import check_local_inputs as check

    if not args.replay:
        return
    for kind, schema in (("impressions", "impression"), ("judgments", "judgment"), ("clicks", None)):
        check(f"--{kind}", getattr(args, kind), schema)


def check_prometheus(args, local: bool) -> None:
    """ValueError for ``--prometheus-port`` / ``--prometheus-linger`` out of range, or the port off the
    local runner (``local``: whether the job runs on it)."""
    if args.prometheus_port is not None and not 0 <= args.prometheus_port <= 65535:
        raise ValueError(f"--prometheus-port must be 0..65535, got {args.prometheus_port}")
    if not (0 <= args.prometheus_linger <= 86400):  # also NaN
        raise ValueError(f"--prometheus-linger must be 0..86400 seconds, got {args.prometheus_linger}")
    if args.prometheus_port is not None and not local:
        raise ValueError("--prometheus-port serves from the launcher's process: the local runner only "
                         f"(got --runner {args.runner})")


def checkpoint_options(beam_args: list) -> list:
    """``beam_args`` with ``--finish_bundle_before_checkpointing=true`` added when Flink's checkpoints
    are on (``--checkpointing_interval`` above 0) and the option is not given.

    By default Beam's Flink runner finishes the open bundles while it takes a checkpoint and holds
    their outputs back until its next bundle starts, but it may send the watermark on before them
    (``DoFnOperator.snapshotState`` and ``BufferedOutputManager``; the option's own help: "buffers
    any remaining bundle output as part of the checkpoint"). A shard's update held back so reached
    the aggregate after the window it changes had closed (``late:update``): final panes short of
    the batch job, seen with checkpoints on and no fault. Finishing the bundles before the barrier
    sends their outputs ahead of it and of any later watermark. An explicit
    ``--finish_bundle_before_checkpointing false`` is kept."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from streameval.beam import flink_options  # noqa: F401  (declares the options read here)

    given = PipelineOptions(beam_args).get_all_options(retain_unknown_options=True)
    if (given.get("checkpointing_interval") or 0) > 0 and given.get("finish_bundle_before_checkpointing") is None:
        return [*beam_args, "--finish_bundle_before_checkpointing=true"]
    return list(beam_args)


def job_options(runner: str, beam_args: list) -> list:
    """The stream job's Beam options: ``--runner runner``, ``beam_args`` with :func:`checkpoint_options`'
    addition and, on Flink, its SDK workers kept for the job
    (:func:`streameval.beam.flink_options.reuse_workers`)."""
    from streameval.beam.flink_options import reuse_workers

    return reuse_workers(["--runner", runner, *checkpoint_options(beam_args)])


def engine_options(args, beam_args, runner: str | None) -> str:
    """The stream transforms' ``timers`` for ``--event-timers`` (``"one"`` or ``"per_deadline"``; auto:
    per deadline on Flink, ``runner`` ``FlinkRunner`` or ``--flink_master`` naming a Flink cluster as
    ``cluster up flink``'s runner_args do, where one timer per key closes one window per watermark
    step; one per key elsewhere). ValueError for Flink's checkpoints (``--checkpointing_interval``
    above 0, :mod:`streameval.beam.flink_options`) on a job that ends (``--replay``,
    ``--watch-idle-stop``): such a job never ended on Flink with checkpoints on; and for
    ``--savepoint_path`` with ``--replay`` (a replay starts from its files' beginning)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from streameval.beam.flink_options import on_flink  # (its module declares --checkpointing_interval)

    options = PipelineOptions(beam_args)
    ends = args.replay or (args.watch and args.watch_idle_stop is not None)
    if ends and (options.get_all_options().get("checkpointing_interval") or 0) > 0:
        raise ValueError("--checkpointing_interval: a job that ends (--replay, --watch-idle-stop) never ended on "
                         "Flink with checkpoints on (Beam keeps its sources running for checkpoints); "
                         "checkpoint the jobs that run until stopped (Kafka, Pub/Sub, --watch)")
    if args.replay and options.get_all_options().get("savepoint_path"):
        raise ValueError("--savepoint_path: a replay starts from its files' beginning; resume the jobs that run "
                         "until stopped (Kafka, Pub/Sub, --watch)")
    if args.event_timers != "auto":
        return args.event_timers.replace("-", "_")
    return "per_deadline" if runner == "FlinkRunner" or on_flink(options) else "one"


def resume_from(options) -> str | None:
    """The savepoint or checkpoint the job is restored from (Flink's ``--savepoint_path``), or None."""
    from streameval.beam import flink_options  # noqa: F401  (declares --savepoint_path)

    return options.get_all_options(retain_unknown_options=True).get("savepoint_path") or None


def resumed_summary(options, run) -> dict:
    """``summary.json``'s ``resumed_from`` (the savepoint) and ``previous_run`` (the stopped run's
    summary, which this one replaces) of a job restored from a savepoint; empty otherwise."""
    where = resume_from(options)
    if where is None:
        return {}
    return {"resumed_from": where, "previous_run": getattr(run, "previous_run", None)}


def carries_state(args, options, in_process: bool) -> str | None:
    """Whether the job's windows' state may cross a savepoint, so that its record accounting has
    records held in state (:func:`streameval.beam.accounting.account`'s ``carried``): ``"resume"``
    for a job resumed from a savepoint (``--savepoint_path``); ``"stop"`` for one off this process on
    a source that never ends by itself (Kafka, Pub/Sub, ``--watch`` without an idle stop), which ends
    only when stopped, maybe with a savepoint; None for a job that ends by itself (a replay, an idle
    stop) or on the local runner (whose open windows close when it is stopped): the identity strict."""
    if resume_from(options) is not None:
        return "resume"
    endless = args.kafka_impressions or args.pubsub_impressions or (args.watch and args.watch_idle_stop is None)
    return "stop" if endless and not in_process else None
