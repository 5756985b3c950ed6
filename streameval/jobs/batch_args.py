"""The batch job's command line (``streameval batch``): :func:`build_arg_parser`, which imports no
Beam, so that ``--help`` and argument errors answer before Beam is imported (``streameval.cli``
parses with it first). The job itself: :mod:`streameval.jobs.batch`."""

from __future__ import annotations

import argparse

from streameval.beam.accounting import add_input_check_arguments, add_stall_timeout_argument
from streameval.beam.arguments import (DECODERS, DEFAULT_FORMATS, DEFAULT_METRICS, HOT_FRACTION, HOT_MIN_REQUESTS,
                                       LABEL_SOURCES, SHARD_IMPRESSIONS, SHARDS, UNJUDGED_POLICIES,
                                       add_bootstrap_arguments, add_hist_arguments, add_metric_option_arguments,
                                       add_record_rule_arguments, add_table_arguments, add_window_limit_argument)
from streameval.beam.keys import SLICE_MISSING, UNLIMITED
from streameval.metrics.choices import DEFAULT_SCORE_PRECISION, SCORE_PRECISIONS

__all__ = ["build_arg_parser", "check_local_inputs", "ENGINES"]

ENGINES = ("auto", "columnar", "records")



def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streameval batch",
        description="Batch ranking and click metrics over impression / judgment Avro logs (Apache Beam). "
                    "Other arguments go to Beam's PipelineOptions; one Beam does not know either is refused "
                    "(docs/cli.md, \"Beam's pipeline options\").")
    p.add_argument("--impressions", required=True, action="append",
                   help="Avro (or Parquet, see --input-format) file(s) or glob of impressions (impression "
                        "schema); repeatable")
    p.add_argument("--judgments", action="append", default=None,
                   help="Avro (or Parquet) file(s) or glob of judgments (judgment schema); repeatable. "
                        "Without it only click metrics are computed")
    p.add_argument("--metrics", default=DEFAULT_METRICS,
                   help=f"comma-separated ranking metrics (default {DEFAULT_METRICS}; e.g. all_trec, err@20) and "
                        "online metrics: auc, auc_hist, gauc[GROUP,WEIGHTING] (GROUP user/query/request, WEIGHTING "
                        "impressions/clicks/unweighted), clicks@k, rr_first_click, abandonment, the dwell metrics "
                        "mean_dwell, sat_click_rate[t=30s], long_click_ctr[t=T], last_click_ctr[t=T] (impressions' "
                        "dwell_ms), and the calibration of "
                        "scores in [0, 1] as click probabilities: logloss, brier, calibration, ece[bins=B]; pr_auc, "
                        "precision[t=T], recall[t=T], f1[t=T] (score >= T predicts a click), psi[score], ks[score] "
                        "(drift against --drift-reference) (ctr and "
                        "ctr@pos{p} are always computed unless --no-ctr)")
    p.add_argument("--window", default="none",
                   help="fixed event-time window, aligned to the epoch: e.g. 3600s, 30m, 1h, 1d, or none "
                        "(default: one global window); SIZE/PERIOD (1h/10m) is --window SIZE --every PERIOD")
    p.add_argument("--every", default=None, metavar="PERIOD",
                   help="with --window SIZE: sliding windows of SIZE starting every PERIOD (epoch-aligned, SIZE a "
                        "multiple of PERIOD, as the streaming job's): a request counts in the SIZE/PERIOD windows "
                        "holding its earliest impression, a click in those holding its impression; late data is "
                        "judged at the end of the first of them. Not with online metrics or --compare-baseline")
    add_window_limit_argument(p)
    p.add_argument("--allowed-lateness", default=UNLIMITED,
                   help="with --window: a request belongs to the window of its earliest impression; by default "
                        f"({UNLIMITED}) all its impressions count there: a batch job's whole input is on time. A "
                        "duration (0, 30m, 1h) reproduces a stream's decision: the request's impressions at or after "
                        "that window's end plus this lateness are late data (dead letters with source "
                        "late:impression), as in the streaming job with the same option")
    p.add_argument("--slices", action="append", default=[],
                   help="comma-separated attributes to slice by, each on its own; join attributes with '+' "
                        "for a combination (campaign+device); repeatable")
    p.add_argument("--slice-missing", choices=SLICE_MISSING, default="show",
                   help="requests without a slice attribute: show (default) puts them in a slice named "
                        "ATTRIBUTE=(missing); skip leaves them out of that attribute's slices (they stay in 'all')")
    add_metric_option_arguments(p, err_help=(
        "g_max of ERR, a number, or auto (default): the largest grade among the judgments (within --grades), at "
        "least 1, so that a perfect ranking of binary judgments scores ERR 0.5 at its first relevant item, not "
        "(2**1 - 1) / 2**4; the trec-eval command and the library keep gdeval's 4"))
    p.add_argument("--order", choices=("score", "position"), default="score",
                   help="rank the served items by score (default) or by logged position")
    p.add_argument("--tie-break", choices=("docno", "position"), default="docno",
                   help="score ties broken by item id descending (trec_eval, default) or by position")
    p.add_argument("--score-precision", choices=SCORE_PRECISIONS, default=DEFAULT_SCORE_PRECISION,
                   help="compare scores as doubles, as trec_eval 10 does (float64, default), or rounded to "
                        "single precision, as trec_eval 9 and pytrec_eval store them (float32)")
    p.add_argument("--depth", type=int, default=None, help="score the top DEPTH items per request (trec_eval -M)")
    add_record_rule_arguments(p)
    p.add_argument("--complete", action="store_true",
                   help="judged queries without a request score 0 (trec_eval -c; global window only)")
    p.add_argument("--no-ctr", action="store_true", help="do not compute click metrics")
    p.add_argument("--labels", choices=("auto", *LABEL_SOURCES), default="auto",
                   help="labels of auc / gauc / calibration metrics: clicks (clicked flag) or judgments (grade >= --relevance-level); "
                        "auto (default): judgments when --judgments is given, else clicks")
    p.add_argument("--unjudged", choices=UNJUDGED_POLICIES, default="exclude",
                   help="impressions without a judgment under --labels judgments: exclude (default, counted) or "
                        "count as non-relevant")
    p.add_argument("--no-unjudged-file", dest="unjudged_file", action="store_false",
                   help="do not write unjudged.jsonl (the requests whose query has no judgment, one line each): "
                        "they are still counted in the report line and summary.json")
    add_hist_arguments(p)
    p.add_argument("--drift-reference", default=None, metavar="PATH",
                   help="reference scores of psi[score] / ks[score]: a text file of one score per line, or an "
                        "impression Avro file (its scores with a logged click flag); docs/metrics.md")
    p.add_argument("--group-rows", action="store_true",
                   help="also write each GAUC group's AUC (metric auc, slice '<group>=<id>')")
    add_bootstrap_arguments(p, "interval of ranking metrics: Student t (default) or Poisson bootstrap percentile; "
                               "CTR rows always get a Wilson interval")
    p.add_argument("--ci-level", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    p.add_argument("--cluster", choices=("none", "request", "user"), default="none",
                   help="also ctr[cluster=C] rows: CTR with the standard error of clustered impressions (delta method "
                        "over per-request or per-user sums), the number of clusters and the design effect (default none)")
    p.add_argument("--covariate", default=None, metavar="attr:NAME",
                   help="CUPED with --cluster request|user: also ctr[cluster=C,cuped=NAME] rows, the CTR adjusted by the "
                        "impression attribute NAME (the unit's pre-period value, e.g. attr:pre_clicks), theta pooled "
                        "over the systems, with its interval and variance reduction (docs/metrics.md, CUPED)")
    p.add_argument("--covariate-log", action="append", default=None, metavar="PATH",
                   help="CUPED with --cluster user (or request): the covariate is each unit's clicks in this "
                        "pre-period impression log (Avro, a glob; repeatable); rows ctr[cluster=C,cuped=log_clicks]; "
                        "units absent from it get the pooled mean")
    p.add_argument("--expected-split", default=None, metavar="SYSTEM=WEIGHT,...",
                   help="the experiment's declared split of requests between systems, e.g. A=50,B=50: srm rows per "
                        "window and slice (sample-ratio mismatch: chi-square p-value, statistic, each system's share)")
    p.add_argument("--compare-baseline", default=None, metavar="SYSTEM",
                   help="also compare SYSTEM with every other system on the same queries (paired, per window "
                        "and slice): comparisons.jsonl")
    p.add_argument("--alerts", default=None, metavar="RULES.toml",
                   help="alert rules (docs/metrics.md, 'Alert rules'): alerts.avro / alerts.jsonl, printed; exit "
                        "status 4 when one fired")
    p.add_argument("--prometheus-textfile", default=None, metavar="PATH",
                   help="also write the latest value of every (metric, slice, system) in Prometheus' exposition "
                        "format to this local file (node_exporter's textfile collector; docs/metrics.md)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="columnar (and auto, the default): one Beam element per block of records or shard of "
                        "requests, every metric and option; records: one element per record, the per-record "
                        "engine the tests compare with (much slower)")
    p.add_argument("--workers", default="auto",
                   help="worker processes of the local runner (FnApiRunner) for the columnar engine: a number, "
                        "or auto (default): 1, in-process (on 2 cores two workers were slower at 2, 10 and "
                        "20 million impressions: the runner's own process moves every value between stages). "
                        "Beam's --direct_num_workers / --direct_running_mode, when given, take precedence")
    p.add_argument("--threads", default="auto",
                   help="columnar engine: files or shards each stage works on at once, on threads of the job's "
                        "process (numpy, Arrow and DataFusion work without the GIL): a number, or auto (default): "
                        "one per core when the job runs in this process (FnApiRunner, no worker processes), else 1")
    p.add_argument("--avro-decoder", choices=DECODERS, default=None,
                   help="columnar engine, local files: datafusion (default when installed) decodes Avro to Arrow "
                        "columns, about ten times faster than fastavro, and hands any file it cannot read exactly "
                        "to fastavro; fastavro: fastavro only (catches more damaged blocks, see docs/metrics.md)")
    p.add_argument("--shards", default="auto",
                   help=f"columnar engine: shards of the requests and of the queries, the unit of work of the "
                        f"cleaning and scoring stages: a number, or auto (default): one per {SHARD_IMPRESSIONS:,} "
                        f"impressions of input, at least {SHARDS} (so an element's size does not grow with the input)")
    p.add_argument("--hot-query-fraction", type=float, default=HOT_FRACTION,
                   help=f"columnar engine: a query with more than this share of a request shard's requests (and "
                        f"at least {HOT_MIN_REQUESTS}) is hot: its requests are scored in F sub-elements of its "
                        f"query shard, F = ceil(share x shards), instead of one (default {HOT_FRACTION}; 0: never; "
                        "off with --compare-baseline). Changes no number (docs/scale.md, \"Hot queries\")")
    p.add_argument("--output", required=True, help="output directory (local or any Beam file system: s3://, gs://)")
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="files of the metric rows, dead letters and alerts: comma-separated avro, jsonl (required), "
                        "parquet (all three; UTC timestamps, NaN as null) and csv (metric rows, one file); their "
                        "metric rows: n, n_unit, num_queries/_impressions/_requests, slice_<attr>; default avro,jsonl")
    p.add_argument("--bigquery-table", default=None, metavar="PROJECT:DATASET.TABLE",
                   help="also append the metric rows to this BigQuery table (Beam's WriteToBigQuery, file loads; "
                        "created if needed; needs apache-beam[gcp])")
    p.add_argument("--output-shards", default="auto",
                   help="files of the dead letters, unjudged requests and comparisons: a number, or auto "
                        "(default): one file on the local runners, else as many as the runner chooses "
                        "(NAME-00000-of-0000N.jsonl; manifest.json lists them)")
    p.add_argument("--runner", default="FnApiRunner",
                   help="Beam runner (default FnApiRunner; e.g. PrismRunner, FlinkRunner, SparkRunner, "
                        "DataflowRunner)")
    p.add_argument("--quiet", action="store_true",
                   help="do not print the table of metric rows nor the progress line on stderr (records read, "
                        "rows written, rate: every --progress-interval seconds and at the end)")
    p.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                   help="seconds between progress lines on stderr (default 5)")
    add_input_check_arguments(p)
    add_stall_timeout_argument(p)
    add_table_arguments(p)
    return p


def check_local_inputs(args) -> None:
    """The local files of ``--impressions`` and ``--judgments`` exist, and none read as Avro is
    plainly CSV, JSON or text (:func:`streameval.io.inputs.check_local_inputs`): checked before Beam
    is imported. Raises FileNotFoundError or ValueError (one line, exit 2)."""
    from streameval.io.inputs import check_local_inputs as check
    from streameval.io.parquet_blocks import is_parquet

    def parquet(path):
        return is_parquet(path, args.input_format)

    check("--impressions", args.impressions, "impression", parquet)
    check("--judgments", args.judgments, "judgment", parquet)
