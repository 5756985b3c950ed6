"""Command-line values shared by the batch and streaming jobs: metric lists, slice specifications,
grade ranges, the pipeline and its output directory. Layer 3: the jobs (``streameval/jobs/``) import these instead of each other's helpers."""

from __future__ import annotations

import math
import re
import uuid

__all__ = ["DEFAULT_METRICS", "split_metrics", "split_names", "join_parameter_lists", "parse_slice_args",
           "split_window_arg", "batch_window_spec", "add_window_limit_argument", "sliding_window_spec",
           "parse_grades", "make_pipeline", "make_output_dir", "add_metric_option_arguments", "metric_options"]

DEFAULT_METRICS = "ndcg@10,map,mrr@10,P@10,recall@100"

# The choices and defaults the jobs' command lines name, here (no Beam import) so that a command line
# is parsed, and --help answered, before Beam is imported; the modules that use them import them from here.
#: shards of the requests and of the queries (the unit of work of the columnar engine's stages 2 and
#: 3): the least of ``--shards auto``, and the count of the engine when none is given
SHARDS = 16
#: impressions per shard that ``--shards auto`` aims at (the largest element of stages 2 and 3 is
#: about this many impressions, whatever the input's size)
SHARD_IMPRESSIONS = 500_000
#: --avro-decoder (streameval.beam.columnar_read)
DECODERS = ("datafusion", "fastavro")
#: --hot-query-fraction's default and the fewest requests of a query in one request shard that make it
#: hot (smaller ones are cheap anyway; streameval.beam.columnar_hot)
HOT_FRACTION = 0.01
HOT_MIN_REQUESTS = 100
#: --formats (streameval.beam.sinks)
FORMATS = ("avro", "jsonl", "parquet", "csv")
DEFAULT_FORMATS = ("avro", "jsonl")
#: --labels and --unjudged of the online metrics (streameval.beam.online)
LABEL_SOURCES = ("clicks", "judgments")
UNJUDGED_POLICIES = ("exclude", "nonrelevant")
#: the streaming job's kinds of input (streameval.beam.streaming.live)
KINDS = ("impressions", "judgments", "clicks")
#: --kafka-timestamp-policy: Beam's names (streameval.beam.streaming.sources)
KAFKA_TIMESTAMP_POLICIES = {"create_time": "CreateTime", "log_append_time": "LogAppendTime",
                            "processing_time": "ProcessingTime"}


def split_names(text: str) -> list[str]:
    """Split a comma list of names at the commas outside brackets and parentheses (``gauc[user,clicks]``,
    ``SetF(rel=2, beta=0.5)`` stay whole): the metric filters of report and reconcile."""
    from ..metrics.online_names import _split_names

    return _split_names(text)


def split_metrics(text: str) -> list[str]:
    """Split a comma list of metric names, keeping trec_eval parameter lists together:
    ``"P.5,10,map"`` -> ``["P.5,10", "map"]``, and commas inside brackets or parentheses with their
    name (``gauc[user,clicks]``, ``SetF(rel=2, beta=0.5)``)."""
    from ..metrics.online_names import _split_names

    return join_parameter_lists(p for p in (q.strip() for q in _split_names(text)) if p)


#: a piece of a trec_eval parameter list after a comma: a number (``10``, ``0.5``, ``-1``: utility's
#: coefficients) or a LEVEL=GAIN pair (``2=9``: ndcg's gains); no metric name has this form
_LIST_PART = re.compile(r"-?\d+(?:\.\d*)?(?:=-?\d+(?:\.\d*)?)?")


def join_parameter_lists(parts) -> list[str]:
    """Join the pieces of trec_eval parameter lists split at their commas back to their name:
    ``["P.5", "10", "utility.2", "-1", "0", "0", "ndcg.1=3", "2=9"]`` -> ``["P.5,10",
    "utility.2,-1,0,0", "ndcg.1=3,2=9"]``."""
    out: list[str] = []
    for part in parts:
        if out and _LIST_PART.fullmatch(part) and out[-1][-1:].isdigit():
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_slice_args(values) -> list[str]:
    """``--slices`` values (repeatable, comma-separated, ``a+b`` for a combination) -> slice
    specifications ``["campaign", "campaign,device"]``, each once. Raises ``ValueError`` for an empty
    name in a combination."""
    out: list[str] = []
    for v in values or []:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            names = [n.strip() for n in part.split("+")]
            if any(not n for n in names):
                raise ValueError(f"bad --slices value {v!r}")
            spec = ",".join(names)
            if spec not in out:
                out.append(spec)
    return out


def parse_grades(text):
    """``"0:4"`` -> ``(0, 4)``; None stays None. Raises ``ValueError`` for anything else."""
    if text is None:
        return None
    try:
        lo, hi = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--grades wants LO:HI (integers), got {text!r}") from None
    if lo > hi:
        raise ValueError(f"--grades: {lo} > {hi}")
    return lo, hi


def make_pipeline(options):
    """``beam.Pipeline(options=options)``; a runner Beam does not know (a wrong name, a module path
    that does not import) raises ``ValueError`` with one line, which the jobs report with exit 2."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import (DirectOptions, GoogleCloudOptions, PortableOptions,
                                                      StandardOptions)

    from . import s3_options

    standard = options.view_as(StandardOptions)
    if standard.runner == "FnApiRunner" and not any(
            r.rsplit(".", 1)[-1] == "FnApiRunner" for r in StandardOptions.ALL_KNOWN_RUNNERS):
        # the jobs' default, a name Beam knows since 2.7x; before (2.62), only by its module path
        standard.runner = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
    portable, cloud = options.view_as(PortableOptions), options.view_as(GoogleCloudOptions)
    if portable.job_endpoint and portable.job_endpoint != "embed" and not cloud.job_name:
        # a name of its own among the job service's jobs: the job's counters are read from every
        # report the service holds (streameval.beam.accounting.job_counters)
        cloud.job_name = f"streameval-{uuid.uuid4().hex[:16]}"
    if options.view_as(DirectOptions).direct_running_mode == "multi_processing":
        # the local runner's worker processes start without the pipeline options: they inherit the
        # S3 endpoint and credentials through the environment instead
        s3_options.export_to_environment(options)
    try:
        return beam.Pipeline(options=options.view_as(_cached_views_class()))
    except ImportError as e:  # Beam imports a runner given as a dotted path
        raise ValueError(f"--runner: cannot import the runner ({e})") from None


_CachedViews = None


def _cached_views_class():
    """A PipelineOptions class whose ``view_as(cls)`` makes each view once and then returns it.

    Beam builds a new argparse parser for every ``view_as`` call, and the pipeline's construction
    calls ``view_as(TypeOptions)`` twice per applied transform: about 0.3 s of the batch job's
    start-up (py-spy: 44 % of the construction's samples in ``view_as``, most of it argparse's
    help formatters asking for the terminal size). A view holds no values of its own (it reads and
    writes the options' shared ``_all_options``), so the same view serves every call. Pickled or
    deep-copied (as ``beam.Pipeline`` copies its options) without the views, which the copy makes
    again on demand. Made on first use: Beam is imported only by the jobs."""
    global _CachedViews
    if _CachedViews is None:
        from apache_beam.options.pipeline_options import PipelineOptions

        class CachedViewOptions(PipelineOptions):
            def view_as(self, cls):
                views = self.__dict__.get("_views")
                if views is None:
                    views = {}
                    object.__setattr__(self, "_views", views)
                view = views.get(cls)
                if view is None:
                    view = views[cls] = super().view_as(cls)
                return view

            def __getstate__(self):
                state = super().__getstate__()
                return {k: v for k, v in state.items() if k != "_views"}

        _CachedViews = CachedViewOptions
    return _CachedViews


def make_output_dir(path: str) -> None:
    """Create the output directory ``path`` (local, or on a Beam file system when it has a scheme);
    raises ``ValueError`` naming it when it cannot be made (a file of that name, no permission, a NUL
    in the name)."""
    import os

    from apache_beam.io.filesystems import FileSystems

    try:
        if "://" in path:
            FileSystems.mkdirs(path)
        else:
            os.makedirs(path, exist_ok=True)
    except Exception as e:  # noqa: BLE001 (any file-system error: permission, credentials, a file in the way)
        if "://" in path and FileSystems.exists(path):
            return  # an object store "directory" that exists already
        raise ValueError(f"cannot make the output directory {path!r}: {type(e).__name__}: {e}") from None


def add_bootstrap_arguments(group, ci_help: str) -> None:
    """``--ci {t,bootstrap}``, ``--replicates``, ``--ci-seed`` (the batch and streaming jobs)."""
    group.add_argument("--ci", choices=("t", "bootstrap"), default="t", help=ci_help)
    group.add_argument("--replicates", type=int, default=200, help="bootstrap replicates (default 200)")
    group.add_argument("--ci-seed", type=int, default=0, help="keys the hash of the bootstrap weights (default 0)")
    group.add_argument("--ci-bounded", choices=("logit", "t"), default="logit",
                       help="a metric bounded in [0, 1] (ndcg, map, auc, ...) whose t interval leaves [0, 1]: the "
                            "logit-transformed interval, inside the range (default; ci_method logit), or the t "
                            "interval as it is")


def check_bootstrap_arguments(args) -> None:
    """Raise ValueError (one line) for ``--replicates`` / ``--ci-seed`` out of range."""
    from ..accumulators.bootstrap import ReplicateSums

    if args.replicates < 1:
        raise ValueError("--replicates must be positive")
    ReplicateSums(1, args.replicates, "poisson", args.ci_seed)  # their ranges


def add_metric_option_arguments(group, err_help: str | None = None) -> None:
    """The per-measure options of :class:`~streameval.metrics.kernel.MetricOptions` as the jobs spell
    them, with its defaults and allowed values: ``--relevance-level``, ``--gain``, ``--ideal``,
    ``--err-max-grade`` (the batch and streaming jobs: a number or ``auto``, resolved by the job with
    :func:`parse_err_max_grade` / :func:`auto_err_max_grade` before :func:`metric_options` reads them back;
    ``err_help``: the job's own help text for it)."""
    from ..metrics.choices import DEFAULT_GAIN, DEFAULT_IDEAL, DEFAULT_RELEVANCE_LEVEL, GAINS, IDEALS

    group.add_argument("--relevance-level", type=float, default=DEFAULT_RELEVANCE_LEVEL,
                       help="grade at or above which an item is relevant (trec_eval -l; "
                            f"default {DEFAULT_RELEVANCE_LEVEL:g})")
    group.add_argument("--gain", choices=GAINS, default=DEFAULT_GAIN,
                       help="ndcg/dcg gain: linear (trec_eval, gain = grade) or exponential (2^grade - 1); "
                            f"default {DEFAULT_GAIN}")
    group.add_argument("--ideal", choices=IDEALS, default=DEFAULT_IDEAL,
                       help="ideal DCG from every judgment of the query (trec_eval) or from the served items; "
                            f"default {DEFAULT_IDEAL}")
    group.add_argument("--err-max-grade", default="auto",
                       help=err_help or "g_max of ERR, a number, or auto (default): the largest grade among the "
                            "judgments, at least 1 (see parse_err_max_grade / auto_err_max_grade)")


def metric_options(args):
    """The :class:`~streameval.metrics.kernel.MetricOptions` of :func:`add_metric_option_arguments`'s
    values; ValueError or TypeError (one line) for a bad one."""
    from ..metrics.kernel import MetricOptions

    g = args.err_max_grade
    if isinstance(g, str):
        g = parse_err_max_grade(g)
        if g is None:
            raise ValueError("--err-max-grade auto is resolved by the job (auto_err_max_grade) before metric_options")
    return MetricOptions(relevance_level=args.relevance_level, gain=args.gain, ideal=args.ideal, err_max_grade=g)


def add_hist_arguments(group) -> None:
    """``--hist-bins``, ``--hist-range`` of ``auc_hist``."""
    group.add_argument("--hist-bins", type=int, default=1000, help="bins of auc_hist (default 1000)")
    group.add_argument("--hist-range", default="0,1", help="score range LO,HI of auc_hist's bins (default 0,1)")


def add_window_limit_argument(group) -> None:
    """``--max-windows-per-record N`` (both jobs): the most sliding windows a record may count in."""
    from ..plan.windows import MAX_WINDOWS_PER_RECORD

    group.add_argument("--max-windows-per-record", type=int, default=MAX_WINDOWS_PER_RECORD, metavar="N",
                       help=f"refuse sliding windows that put each record in more than N windows (SIZE / PERIOD; "
                            f"default {MAX_WINDOWS_PER_RECORD:,}): each record's state goes to every one of them")


def add_record_rule_arguments(group) -> None:
    """The record rules both jobs take: ``--judgment-conflicts``, ``--grades``, ``--event-time-range``."""
    from ..io.cleaning import JUDGMENT_POLICIES

    group.add_argument("--judgment-conflicts", choices=JUDGMENT_POLICIES, default="latest",
                       help="judgments of one (query, item) with different grades: latest by timestamp (default; "
                            "equal times: the larger grade), max grade, or reject them all (dead letters)")
    group.add_argument("--grades", default=None, metavar="LO:HI",
                       help="declared grade range, inclusive (e.g. 0:4): judgments outside it are dead letters")
    group.add_argument("--event-time-range", default=None, metavar="FROM..TO",
                       help="accepted event times of impressions (and click events), FROM..TO, each a year or an "
                            "ISO 8601 time (e.g. 1970..2200): timestamps outside are dead letters; those outside "
                            "the years 1 to 9999 always are")


def hist_range(text: str) -> tuple[float, float]:
    """``--hist-range`` text ``LO,HI`` -> (lo, hi); ValueError in one line."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--hist-range wants LO,HI, got {text!r}") from None
    return lo, hi


#: ERR's g_max when the judgments are not known up front (the library's and trec-eval's default:
#: gdeval's MAX_JUDGMENT)
GDEVAL_ERR_MAX_GRADE = 4.0


def parse_err_max_grade(text) -> float | None:
    """``--err-max-grade``: a positive number, or ``"auto"`` -> None (resolve with
    :func:`auto_err_max_grade`). Raises ``ValueError`` for anything else."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"--err-max-grade wants a positive number or auto, got {text!r}")
    return value


def _parquet_grades(f, column: str):
    """The integral grades of a Parquet file's ``column`` (an open binary file), as int64."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    col = pq.read_table(f, columns=[column]).column(column)
    try:
        v = np.asarray(pc.cast(col, "float64").to_numpy(zero_copy_only=False), dtype=np.float64)
    except Exception:  # noqa: BLE001 (grades as text: the job's conversion decides row by row)
        return np.zeros(0, dtype=np.int64)
    v = v[np.isfinite(v) & (v == np.floor(v))]
    return v.astype(np.int64)


def max_judgment_grade(paths, declared=None, table=None, input_format: str = "auto") -> int:
    """The largest grade of the judgment files ``paths`` (Avro; Parquet by its mapped grade column, ``table``) (read through Beam's file systems, local
    or remote), among the grades inside the ``declared`` range ``(lo, hi)`` (``--grades``: the others
    are dead letters), at least 1. A file that cannot be read to its end gives the grades read before
    the damage (the job's reader reports the file)."""
    import fastavro
    from apache_beam.io.filesystems import FileSystems

    from ..io.parquet_blocks import is_parquet

    top = 1
    column = (getattr(table, "mapping", None) or {}).get("grade", "grade")
    for path in paths:
        if is_parquet(path, input_format):  # Parquet judgments: their (mapped) grade column
            try:
                with FileSystems.open(path) as f:  # seekable: Parquet reads the footer, then the column
                    g = _parquet_grades(f, column)
            except Exception:  # noqa: BLE001 (damaged or unreadable: the job's reader reports it)
                continue
            if declared is not None:
                g = g[(g >= declared[0]) & (g <= declared[1])]
            if len(g):
                top = max(top, int(g.max()))
            continue
        try:
            with FileSystems.open(path) as f:
                for rec in fastavro.reader(f):
                    g = rec.get("grade")
                    if isinstance(g, int) and g > top and (declared is None or declared[0] <= g <= declared[1]):
                        top = g
        except Exception:  # noqa: BLE001 (damaged or unreadable: the job's reader reports it)
            continue
    return top


def auto_err_max_grade(specs, judgment_paths, declared=None, table=None, input_format: str = "auto") -> float:
    """``--err-max-grade auto`` of the jobs: with ERR among the metric ``specs`` and judgment files,
    the largest grade they hold (:func:`max_judgment_grade`, at least 1), so that binary judgments
    give a perfect ranking ERR 0.5 at its first item, not (2**1 - 1) / 2**4; otherwise (no ERR, or
    judgments arriving on a stream) :data:`GDEVAL_ERR_MAX_GRADE`. docs/metrics.md, "ERR's g_max"."""
    if judgment_paths and any(getattr(s, "family", None) == "err" for s in specs):
        return float(max_judgment_grade(judgment_paths, declared, table, input_format))
    return GDEVAL_ERR_MAX_GRADE



def split_window_arg(args) -> None:
    """``--window`` written as the library writes a window
    (:meth:`streameval.beam.streaming.windows.WindowSpec.parse`): ``1h/10m`` is ``--window 1h --every
    10m``, ``session:30m`` is ``--sessions 30m`` and ``session:30m/request`` adds ``--session-key
    request``. Rewrites ``args`` in place (so every later check sees one form; a second call changes
    nothing); raises ValueError when the two forms are mixed. Shared by the batch and streaming jobs."""
    text = str(args.window or "").strip().lower()
    every, sessions = getattr(args, "every", None), getattr(args, "sessions", None)
    if text.startswith(("session:", "sessions:")):
        if sessions or every:
            raise ValueError(f"--window {args.window} is a session window: it excludes --sessions / --every")
        gap, _, by = text.split(":", 1)[1].partition("/")
        args.window, args.sessions = None, gap
        if by:
            if by not in ("user", "request"):
                raise ValueError(f"sessions are per 'user' or per 'request', got {by!r} in --window {text}")
            args.session_key = by
    elif "/" in text:
        if every:
            raise ValueError(f"--window {args.window} names its period: it excludes --every")
        args.window, args.every = text.split("/", 1)


def sliding_window_spec(args):
    """The sliding (or, for a size equal to the period, fixed) WindowSpec of ``--window SIZE --every
    PERIOD`` (after :func:`split_window_arg`), refused before the job starts when each record would
    count in more than ``--max-windows-per-record`` windows: ValueError, one line naming the count
    (``--window 7d/1s puts each record in 604,800 windows; the limit is 1,000
    (--max-windows-per-record)``). Shared by the batch and streaming jobs."""
    from ..plan.windows import WindowSpec, parse_duration

    parse_duration(args.window, "--window")  # its message names the option (e.g. a size without a unit)
    parse_duration(args.every, "--every")
    return WindowSpec.sliding(args.window, args.every, max_windows_per_record=args.max_windows_per_record,
                              what=f"--window {args.window}/{args.every}", option="--max-windows-per-record")


def batch_window_spec(args, online=()):
    """The batch job's windows from ``--window`` / ``--every`` (after :func:`split_window_arg`):
    None for the global window or fixed windows (``--window SIZE``: read by
    :func:`streameval.beam.transforms.parse_window`), else the sliding
    :class:`~streameval.beam.streaming.windows.WindowSpec` (``--window 1h --every 10m`` or
    ``--window 1h/10m``: windows of SIZE starting every PERIOD, epoch-aligned; a size equal to the
    period is a fixed window, None). Raises ValueError with the streaming job's messages (a size
    that is not a multiple of the period, a malformed duration, both spellings at once), for
    session windows and ``--every`` without ``--window``, and for sliding windows with ``online``
    metrics (names) or ``args.compare_baseline``, whose states are not sums over a sub-window's
    requests (GAUC's groups, a query's paired means may span sub-windows), and for more windows per
    record than ``--max-windows-per-record`` (:func:`sliding_window_spec`)."""
    from ..plan.windows import check_window_limit, parse_window

    split_window_arg(args)
    check_window_limit(args.max_windows_per_record, "--max-windows-per-record")
    if getattr(args, "sessions", None):
        raise ValueError("session windows are the streaming job's (streameval stream --sessions); the batch job "
                         "has fixed (--window SIZE) and sliding (--window SIZE --every PERIOD) windows")
    if not getattr(args, "every", None):
        return None
    if parse_window(args.window, "--window") is None:
        raise ValueError(f"--every {args.every} needs --window SIZE (sliding windows of SIZE starting every PERIOD)")
    spec = sliding_window_spec(args)
    if spec.kind != "sliding":
        return None
    if online or getattr(args, "compare_baseline", None):
        raise ValueError(f"--every (sliding windows) does not take {'online metrics' if online else '--compare-baseline'}"
                         " (their states are not sums over a sub-window's requests): use fixed windows")
    return spec


def add_table_arguments(p) -> None:
    """The batch job's options of table inputs (see the module docstring)."""
    from ..io.choices import INPUT_FORMATS, TIMESTAMP_UNITS

    g = p.add_argument_group("Parquet inputs (columnar engine; docs/metrics.md, \"Parquet inputs\")")
    g.add_argument("--input-format", choices=INPUT_FORMATS, default="auto",
                   help="format of --impressions and --judgments files: auto (default: Parquet for .parquet and .pq "
                        "names, else Avro), avro or parquet")
    g.add_argument("--map", default=None, metavar="FIELD=COLUMN,...",
                   help="Parquet inputs: the column of each schema field, as streameval convert table's --map (a "
                        "field not named is read from the column of its own name); each kind takes the fields of "
                        "its schema")
    g.add_argument("--judgments-map", default=None, metavar="FIELD=COLUMN,...",
                   help="Parquet judgments: their own mapping, instead of --map's judgment fields")
    g.add_argument("--timestamp-unit", choices=TIMESTAMP_UNITS, default=None,
                   help="Parquet inputs: unit of integer timestamp columns (s, ms, us) or iso for text; timestamp "
                        "columns are read as they are")
    g.add_argument("--attributes", default=None, metavar="COLUMN,...",
                   help="Parquet impressions: columns kept in the attributes map (for --slices)")


#: where docs/cli.md lists the options the jobs pass to Beam (the runner's options)
RUNNER_OPTIONS_DOC = 'docs/cli.md, "Beam\'s pipeline options"'


class _BeamParser(Exception):
    """Carries Beam's parser of every registered PipelineOptions class out of ``get_all_options``."""

    def __init__(self, parser):
        super().__init__("Beam's options parser")
        self.parser = parser


def _beam_options_parser():
    """The argparse parser Beam builds from every registered ``PipelineOptions`` class, got through
    ``get_all_options``'s public ``add_extra_args_fn`` hook (which receives that parser; leaving the
    hook by an exception skips the parse, and its "Discarding unparseable args" warning)."""
    import apache_beam  # noqa: F401  (registers every runner's options class)
    from apache_beam.options.pipeline_options import PipelineOptions

    from . import flink_options  # noqa: F401  (registers the Java Flink runner's options: FlinkJavaOptions)

    def grab(parser):
        raise _BeamParser(parser)

    try:
        PipelineOptions([]).get_all_options(add_extra_args_fn=grab)
    except _BeamParser as got:
        return got.parser
    raise RuntimeError("Beam's PipelineOptions.get_all_options did not call add_extra_args_fn")


def _option_names(parser) -> list[str]:
    """The long option names of an argparse parser, read from its usage line (argparse has no
    public list of its options)."""
    return sorted(set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", parser.format_usage())))


def unknown_arguments_error(parser, rest, beam_names=None) -> str | None:
    """One line for the arguments in ``rest`` (what the job's ``parser.parse_known_args`` left for
    Beam) that Beam's pipeline options do not know either: each unknown option with the closest
    names among the job's options and Beam's (difflib), or a stray value; None when Beam knows every
    one. Beam's parser also checks the values of its own options (``--direct_num_workers two``).
    ``beam_names`` (tests) stands in for Beam's option names."""
    import contextlib
    import difflib
    import io

    rest = list(rest)
    if not rest:
        return None
    beam_parser = _beam_options_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _, unknown = beam_parser.parse_known_args(rest)
    except SystemExit:  # argparse refused the value of one of Beam's options
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        why = lines[-1].split("error: ", 1)[-1] if lines else "refused"
        return f"Beam's pipeline options: {why}"
    if not unknown:
        return None
    if beam_names is None:
        beam_names = ["--" + name for name in vars(beam_parser.parse_known_args([])[0])]
    candidates = sorted(set(_option_names(parser)) | set(beam_names))
    problems, i = [], 0
    while i < len(unknown):
        a = unknown[i]
        if a == "--":
            problems.append("'--' (nothing may follow it)")
            break
        if a.startswith("-") and len(a) > 1:
            name = a.split("=", 1)[0]
            close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.7)
            hint = f" (closest: {', '.join(close)})" if close else ""
            problems.append(f"unknown option {name}{hint}")
            i += 1
            if "=" not in a and i < len(unknown) and not unknown[i].startswith("-"):
                i += 1  # its value
            continue
        problems.append(f"unexpected argument {a!r}")
        i += 1
    return (f"{'; '.join(problems)}; the job's options: {parser.prog} -h; Beam's pipeline options: "
            f"{RUNNER_OPTIONS_DOC}")
