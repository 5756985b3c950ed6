"""Record accounting: every input record ends in exactly one place, and the counts must add up.

The jobs count records with Beam counters (namespace :data:`streameval.io.counters.NAMESPACE`)
named as below (every name is defined once, in :mod:`streameval.io.counters`; the batch job's
stages pass their counts on as data and one step reports them all, :mod:`streameval.beam.counts_as_data`),
then call :func:`account` on the counter values: it returns the summary the job prints and writes
(``summary.json``) and the identities that do not hold. A job whose counts do not add up fails
(exit status 1).

Counter names, for ``kind`` in ``impression``, ``judgment``, ``click`` (separate click events,
streaming only):

=============================  ==================================================================
``<kind>s_read``               records read from the sources
``<kind>s_valid``              records passing :mod:`streameval.io.records`' checks
``rejected:<kind>:<reason>``   records written to the dead letters (reason category)
``duplicate:<kind>``           replays of an event already counted (same event id and content, or
                               for judgments the same (query, item, grade, timestamp)): no effect
``late:<kind>``                (streaming) records written to the late-data output
``superseded:judgment``        judgments replaced by another of the same (query, item) under the
                               conflict policy ``latest`` or ``max`` (counted, not dead letters)
``<kind>s_accepted``           records that reach the metrics
=============================  ==================================================================

and, for impressions, where the accepted ones went: ``impressions_ranked`` (in a request that was
scored), ``impressions_unjudged`` (in a request whose query has no judgment: not ranked, written to
the ``unjudged`` output by request), ``impressions_unrankable`` (in a request that could not be ranked,
a dead letter of its own), ``click_impressions`` and ``click_impressions_not_logged`` (CTR).

Identities checked (a term missing from the counters counts as 0):

* ``read = valid + rejected at validation`` (per kind; unreadable file tails are reported apart, their
  records cannot be counted);
* ``valid = accepted + duplicates + superseded + late + rejected after validation`` (per kind; a
  streaming job stopped with a savepoint or resumed from one adds ``held_in_state``, the records
  its windows' state carried across the savepoint, see :func:`account`);
* ranking metrics: ``accepted impressions = ranked + unjudged + unrankable``;
* CTR: ``accepted impressions = click_impressions + click_impressions_not_logged``.

Rejections after validation are those whose reason category is listed in
:data:`POST_VALIDATION_REASONS` (duplicates with different content, an item served twice in a request,
a request naming several query ids, conflicting judgments under the ``reject`` policy, grades outside the declared range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..io import cleaning
from ..io import counters as cn
from ..io.counters import KINDS, NAMESPACE
from . import flink_rest

__all__ = ["job_counters", "job_distributions", "account", "POST_VALIDATION_REASONS", "KINDS", "format_accounting",
           "InputChecks", "check_inputs", "add_input_check_arguments", "cancel_on_interrupt"]

# a job's exit status from the problems found here: streameval.exits.exit_status

DEFAULT_MAX_REJECTED_FRACTION = 0.05

# KINDS (streameval.io.counters): the record kinds counted, re-exported here

#: reason categories of rejections made after the record checks (by CleanImpressions,
#: the judgment conflict policy, ...): the rest are rejections at validation
POST_VALIDATION_REASONS = frozenset({
    cleaning.REASON_EVENT_CONFLICT,
    cleaning.REASON_ITEM_TWICE,
    cleaning.REASON_QUERY_CONFLICT,
    cleaning.REASON_JUDGMENT_CONFLICT,
    # streaming: a click event that matched no impression (streameval.beam.streaming.REASON_CLICK_UNMATCHED)
    "click matched no impression within the attribution delay",
})


def _rejected(counters: dict, kind: str) -> tuple[dict, dict]:
    """(at validation {reason: n}, after validation {reason: n}) of ``kind``."""
    at, after = {}, {}
    prefix = cn.rejected_prefix(kind)
    for name, n in counters.items():
        if name.startswith(prefix) and n:
            reason = name[len(prefix):]
            (after if reason in POST_VALIDATION_REASONS else at)[reason] = int(n)
    return at, after


def account(counters: dict, *, ranking: bool = False, ctr: bool = False, unreadable: list | None = None,
            carried: str | None = None):
    """``(summary, problems)`` from a job's counter values.

    ``counters``: ``{counter name: int}`` (see the module docstring); ``ranking`` / ``ctr``: whether
    the job computed ranking metrics / CTR (the corresponding identities are then checked);
    ``unreadable``: descriptions of files whose content could not be read to the end (their remaining
    records are unknown; listed in the summary, not an accounting failure); ``carried``: a streaming
    job whose windows' state may cross a savepoint: ``"stop"`` (it may have been stopped with one) or
    ``"resume"`` (it was resumed from one). The valid records neither accepted nor set aside here
    are then ``held_in_state`` (positive: read here and held in the open windows at the stop, counted
    by the run resumed from the savepoint; negative, ``"resume"`` only: read by the stopped run and
    counted here), not a failed identity; a negative one in a run not resumed still fails.

    ``summary`` is ``{kind: {"read", "valid", "accepted", "duplicates", "superseded", "late",
    "rejected": {reason: n}, ...}}`` for each kind with any record, plus ``"unreadable_files"``;
    ``problems`` is a list of the identities that do not hold, as text (empty when all add up).
    """
    c = {k: int(v or 0) for k, v in counters.items()}
    summary: dict = {}
    problems: list[str] = []
    for kind in KINDS:
        read = c.get(cn.read(kind), 0)
        valid = c.get(cn.valid(kind), 0)
        at, after = _rejected(c, kind)
        dup = c.get(cn.duplicate(kind), 0)
        sup = c.get(cn.superseded(kind), 0)
        late = c.get(cn.late(kind), 0)
        accepted = c.get(cn.accepted(kind), 0)
        if not (read or valid or at or after or accepted):
            continue
        entry = {"read": read, "valid": valid, "accepted": accepted, "duplicates": dup, "superseded": sup,
                 "late": late, "rejected": dict(sorted({**at, **after}.items()))}
        n_at, n_after = sum(at.values()), sum(after.values())
        if read != valid + n_at:
            problems.append(f"{kind}s: read {read} != valid {valid} + rejected at validation {n_at}")
        held = valid - (accepted + dup + sup + late + n_after)
        if carried and (held >= 0 or carried == "resume"):
            entry["held_in_state"] = held
        elif held:
            problems.append(f"{kind}s: valid {valid} != accepted {accepted} + duplicates {dup} + superseded {sup}"
                            f" + late {late} + rejected after validation {n_after}")
        if kind == "impression":
            ranked = c.get(cn.IMPRESSIONS_RANKED, 0)
            unjudged = c.get(cn.IMPRESSIONS_UNJUDGED, 0)
            unrankable = c.get(cn.IMPRESSIONS_UNRANKABLE, 0)
            clicks, not_logged = c.get(cn.CLICK_IMPRESSIONS, 0), c.get(cn.CLICK_IMPRESSIONS_NOT_LOGGED, 0)
            if ranking:
                entry.update(ranked=ranked, unjudged=unjudged, unrankable=unrankable)
                if accepted != ranked + unjudged + unrankable:
                    problems.append(f"impressions: accepted {accepted} != ranked {ranked} + in requests without "
                                    f"judgments {unjudged} + unrankable {unrankable}")
            if ctr:
                entry.update(click_impressions=clicks, click_impressions_not_logged=not_logged)
                if accepted != clicks + not_logged:
                    problems.append(f"impressions: accepted {accepted} != counted in CTR {clicks} + clicks not "
                                    f"logged {not_logged}")
        summary[kind] = entry
    summary["unreadable_files"] = list(unreadable or [])
    return summary, problems


def format_accounting(summary: dict) -> str:
    """One line per kind: ``impressions: read 100 = accepted 90 + rejected 5 (...) + duplicates 5``."""
    lines = []
    for kind in KINDS:
        e = summary.get(kind)
        if not e:
            continue
        parts = [f"accepted {e['accepted']}"]
        rej = e["rejected"]
        if rej:
            parts.append(f"rejected {sum(rej.values())} (" + "; ".join(f"{k}: {v}" for k, v in rej.items()) + ")")
        for key in ("duplicates", "superseded", "late"):
            if e[key]:
                parts.append(f"{key} {e[key]}")
        held = e.get("held_in_state", 0)
        if held > 0:
            parts.append(f"held in the open windows at the stop {held} (counted by the run resumed from its savepoint)")
        elif held < 0:
            parts = [f"{parts[0]} (of them {-held} read before the savepoint this run resumed from)", *parts[1:]]
        line = f"{kind}s: read {e['read']} = " + " + ".join(parts)
        used = [f"{k.replace('_', ' ')} {e[k]}" for k in ("ranked", "unjudged", "unrankable", "click_impressions",
                                                          "click_impressions_not_logged") if k in e]
        if used:
            line += "; of the accepted: " + ", ".join(used)
        lines.append(line)
    for f in summary.get("unreadable_files", []):
        lines.append(f"unreadable file: {f}")
    return "\n".join(lines)


@dataclass(frozen=True)
class InputChecks:
    """What makes a job that ran fail on its input (exit status 3, :data:`streameval.exits.EXIT_INPUT_CHECK`), so that a
    scheduler can tell a garbage or truncated input from a good run (docs/metrics.md, "Input checks"):

    * ``max_rejected_fraction``: the largest share of a kind's records read (impressions,
      judgments, click events) that may be rejected (dead letters); duplicates, superseded
      judgments and late data are not rejections. Default 0.05.
    * ``allow_unreadable``: a damaged file (its records up to the damage are used, the rest are
      unknown) fails the job unless this is set.
    * ``allow_empty``: a job that accepted no impression, or that was given judgments and
      accepted none, fails unless this is set.

    Raises ``ValueError`` on a fraction that is not a finite number in [0, 1]."""

    max_rejected_fraction: float = DEFAULT_MAX_REJECTED_FRACTION
    allow_unreadable: bool = False
    allow_empty: bool = False

    def __post_init__(self):
        f = self.max_rejected_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f <= 1:
            raise ValueError(f"max_rejected_fraction must be a number in [0, 1], got {f!r}")


#: rejections that mean one request id was served two different rankings
_CONFLICTING_RANKINGS = (cleaning.REASON_EVENT_CONFLICT, cleaning.REASON_ITEM_TWICE)


def check_inputs(summary: dict, checks: InputChecks, *, judgments: bool = False, inputs=()) -> list[str]:
    """The input checks of ``checks`` that ``summary`` (:func:`account`'s) fails, as text (empty:
    none). ``judgments``: the job was given judgments; ``inputs``: the impression files, named when
    the rejections say that two inputs give one request id different rankings (two runs converted
    with the same system id: the way out is a system id per run)."""
    failed = []
    imp = summary.get("impression") or {}
    if not checks.allow_empty:
        if not imp.get("accepted"):
            failed.append(f"no impression was accepted (read {imp.get('read', 0)}; --allow-empty to accept that)")
        if judgments and not (summary.get("judgment") or {}).get("accepted"):
            failed.append(f"no judgment was accepted (read {(summary.get('judgment') or {}).get('read', 0)}; "
                          "--allow-empty to accept that)")
    for kind in KINDS:
        e = summary.get(kind)
        if not e or not e.get("read"):
            continue
        rejected = sum(e["rejected"].values())
        share = rejected / e["read"]
        if share > checks.max_rejected_fraction:
            top, n_top = max(e["rejected"].items(), key=lambda kv: kv[1])
            text = (f"{rejected} of {e['read']} {kind}s rejected ({100 * share:.1f} %, most: {top}: {n_top}), above "
                    f"--max-rejected-fraction {checks.max_rejected_fraction:g}")
            clash = sum(e["rejected"].get(r, 0) for r in _CONFLICTING_RANKINGS)
            if kind == "impression" and clash * 2 >= rejected:
                files = ", ".join(list(inputs)[:3]) + (" ..." if len(inputs) > 3 else "")
                text += (f"; {clash} impressions give a request id another ranking than it already has: do two "
                         f"inputs ({files}) carry one system id? give each run its own (convert --system NAME)")
            failed.append(text)
    if summary.get("unreadable_files") and not checks.allow_unreadable:
        failed.append(f"{len(summary['unreadable_files'])} input files are damaged and were read only up to the "
                      f"damage ({summary['unreadable_files'][0]}); --allow-unreadable to accept that")
    return failed


def add_input_check_arguments(parser) -> None:
    """The command-line options of :class:`InputChecks` (``--max-rejected-fraction``,
    ``--allow-unreadable``, ``--allow-empty``), shared by the batch and streaming jobs."""
    g = parser.add_argument_group("input checks (exit status 3 when one fails; the outputs are still written)")
    g.add_argument("--max-rejected-fraction", type=float, default=DEFAULT_MAX_REJECTED_FRACTION, metavar="F",
                   help="fail when more than this share of a kind's records are rejected (default "
                        f"{DEFAULT_MAX_REJECTED_FRACTION:g})")
    g.add_argument("--allow-unreadable", action="store_true",
                   help="do not fail on a damaged input file (its records up to the damage are used)")
    g.add_argument("--allow-empty", action="store_true", help="do not fail when no impression (or judgment) is accepted")


def input_checks_from_args(args) -> InputChecks:
    """:class:`InputChecks` of the options of :func:`add_input_check_arguments`; ``ValueError``
    naming the option."""
    try:
        return InputChecks(max_rejected_fraction=args.max_rejected_fraction, allow_unreadable=args.allow_unreadable,
                           allow_empty=args.allow_empty)
    except ValueError as e:
        raise ValueError(f"--{e}".replace("max_rejected_fraction", "max-rejected-fraction", 1)) from None


#: the pipeline option that tells a portable job apart among its job service's jobs
#: (:func:`streameval.beam.arguments.make_pipeline` gives every portable job a unique ``job_name``)
_JOB_NAME_KEYS = ("beam:option:job_name:v1", "job_name")


def _job_service_reports(options) -> list | None:
    """The monitoring infos of a finished portable job, every report its job service holds (public
    job API: ``GetJobs``, the job found by its unique ``job_name``, then ``GetJobMetrics``); None when
    ``options`` name no job endpoint or job name, or when the service knows no single such job.

    Why not ``result.metrics()``: Beam's ``PortableMetrics`` keys the reports by step and metric
    name and keeps the last of a key. On Flink a transform after a flatten runs in one fused stage
    per flatten input, each reporting its own part under the same step, so all parts but one were
    lost (``metric_rows_written`` 10 of 42 on the bundled sample, Beam 2.62 on Flink 1.19)."""
    job = _portable_job(options)
    if job is None:
        return None
    metrics = _job_service_metrics(*job)
    if metrics is None:
        return None
    return list(metrics.committed) or list(metrics.attempted)


def _portable_job(options) -> tuple[str, str] | None:
    """``(job endpoint, job name)`` of a job with ``options`` on a job service, or None (no options,
    no endpoint, Beam's embedded one, or no job name)."""
    if options is None:
        return None
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PortableOptions

    endpoint = options.view_as(PortableOptions).job_endpoint
    name = options.view_as(GoogleCloudOptions).job_name
    if not endpoint or endpoint == "embed" or not name:
        return None
    return endpoint, name


def _job_service_metrics(endpoint: str, name: str):
    """The ``MetricResults`` (committed and attempted monitoring infos) the job service at
    ``endpoint`` holds for its one job named ``name`` (public job API: ``GetJobs``, then
    ``GetJobMetrics``), or None when it knows no single such job."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        service = beam_job_api_pb2_grpc.JobServiceStub(channel)
        jobs = service.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=60).job_info
        ids = [j.job_id for j in jobs
               if any(k in j.pipeline_options.fields and j.pipeline_options.fields[k].string_value == name
                      for k in _JOB_NAME_KEYS)]
        if len(ids) != 1:
            return None
        response = service.GetJobMetrics(beam_job_api_pb2.GetJobMetricsRequest(job_id=ids[0]), timeout=60)
    return response.metrics


def _reported(reports: list, namespace: str, kind: str) -> list:
    """``(name, value)`` of each user counter or distribution of ``namespace`` in ``reports``."""
    from apache_beam.metrics import monitoring_infos as mi

    wanted = mi.is_counter if kind == "counters" else mi.is_distribution
    out = []
    for info in reports:
        if mi.is_user_monitoring_info(info) and wanted(info):
            info_namespace, name = mi.parse_namespace_and_name(info)
            if info_namespace == namespace:
                out.append((name, mi.extract_metric_result_map_value(info)))
    return out


def _results(result, namespace: str, kind: str, options=None) -> list:
    """``(name, value)`` of the metrics of ``kind`` (``"counters"``, ``"distributions"``) in
    ``namespace``: a portable job's from every report of its job service
    (:func:`_job_service_reports`), otherwise Beam's query of the result, committed values where the
    runner supports them, attempted otherwise."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        reports = _job_service_reports(options)
    except Exception:  # noqa: BLE001 (a job service that cannot answer: Beam's own query below)
        reports = None
    if reports is not None:
        return _reported(reports, namespace, kind)
    try:
        res = result.metrics().query(MetricsFilter().with_namespace(namespace))
    except Exception:  # noqa: BLE001 (runner without metrics support)
        return []
    out = []
    for m in res.get(kind, []):
        try:
            value = m.committed
        except Exception:  # noqa: BLE001 (runners that do not commit metrics raise here)
            value = None
        out.append((m.key.metric.name, m.attempted if value is None else value))
    return out


def job_counters(result, namespace: str = NAMESPACE, *, options=None) -> dict:
    """``{counter name: value}`` of ``namespace`` from a finished pipeline's result (the same name's
    values from several steps added up); ``{}`` for a runner without metrics. ``options``: the job's
    pipeline options; a portable job's counters then come from its job service (:func:`_results`)."""
    out: dict = {}
    for name, value in _results(result, namespace, "counters", options):
        out[name] = out.get(name, 0) + int(value or 0)
    return out


def running_counters(result, namespace: str = NAMESPACE, *, options=None) -> dict:
    """:func:`job_counters` of a job that is still running: on a Flink cluster (``--flink_master``),
    whose job server reports a job's metrics only when it ends, Flink's own view of them
    (:func:`streameval.beam.flink_rest.running_counters`) while the job service has none."""
    counters = job_counters(result, namespace, options=options)
    job = _portable_job(options)
    if counters or job is None:
        return counters
    flink = flink_rest.running_counters(options, job[1], namespace)
    return counters if flink is None else flink


def job_distributions(result, namespace: str = NAMESPACE, *, options=None) -> dict:
    """``{distribution name: {"count", "sum", "min", "max"}}`` of ``namespace`` from a finished
    pipeline's result, the same name's values from several steps put together; ``{}`` for a runner
    without metrics; ``options`` as in :func:`job_counters`."""
    out: dict = {}
    for name, value in _results(result, namespace, "distributions", options):
        if value is None or not value.count:
            continue
        cur = {"count": int(value.count), "sum": int(value.sum), "min": int(value.min), "max": int(value.max)}
        prev = out.get(name)
        if prev:
            cur = {"count": prev["count"] + cur["count"], "sum": prev["sum"] + cur["sum"],
                   "min": min(prev["min"], cur["min"]), "max": max(prev["max"], cur["max"])}
        out[name] = cur
    return out


#: how long a portable job may go without progress before the launcher cancels it (``--stall-timeout``)
STALL_TIMEOUT = "10m"
#: seconds between two looks at a running portable job's metrics
PROGRESS_EVERY_S = 5.0


class JobStalledError(RuntimeError):
    """A portable job that its runner kept reporting RUNNING while its metrics stopped changing for
    the stall timeout (:func:`wait_for_job`); the launcher cancelled it."""


def add_stall_timeout_argument(parser) -> None:
    """``--stall-timeout``: the batch and off-policy jobs' watchdog of a portable job (:func:`wait_for_job`)."""
    parser.add_argument("--stall-timeout", default=STALL_TIMEOUT, metavar="DURATION",
                        help="on a portable runner (Prism, Flink, a job service): cancel the job and fail when its "
                             "runner reports it running but its metrics (on Flink with --flink_master: its tasks' I/O "
                             "counters) have not changed for this long (on Prism: since the job runs) "
                             "(a runner waiting for a lost SDK worker: Prism 2.62 waits for ever); default "
                             f"{STALL_TIMEOUT}; none waits for ever")


def stall_timeout_from_args(args) -> float | None:
    """Seconds of ``--stall-timeout`` (None: none, no watchdog); ValueError naming the option."""
    from .keys import parse_window

    return parse_window(getattr(args, "stall_timeout", STALL_TIMEOUT), name="--stall-timeout")


class _ProgressWatch:
    """Whether a running job's metrics (``digest()``: bytes, or None when not known) have stood still
    for ``timeout`` seconds since they last changed.

    ``live`` (the job service reports metrics while the job runs: Prism) arms it when the job is
    first seen RUNNING: a job whose SDK worker was lost before its first progress report keeps the
    same (empty) metrics from its start, and Prism 2.62 keeps such a job RUNNING for ever. Otherwise
    it is armed by a first change only: a job service that reports metrics only at the end (Beam's
    Flink job server; on Flink the digest also holds the job's progress from Flink's REST API) is
    never taken for stalled on metrics that have not changed since the start."""

    def __init__(self, digest, timeout: float, clock, every: float = PROGRESS_EVERY_S, live: bool = False):
        self.digest, self.timeout, self.clock, self.every, self.live = digest, timeout, clock, every, live
        self.last = None
        self.changed_at = None
        self.next_look = clock()

    def stalled(self, running: bool = True) -> bool:
        """Looks (at most every ``every`` seconds) while the job is not in a terminal state;
        ``running``: its state is RUNNING (not STARTING, STOPPED)."""
        now = self.clock()
        if now < self.next_look:
            return False
        self.next_look = now + self.every
        try:
            d = self.digest()
        except Exception:  # noqa: BLE001 (the state call, not this one, tells a lost service)
            return False
        if d is None:
            return False
        if self.last is None or d != self.last:
            if self.last is not None or (self.live and running):
                self.changed_at = now
            self.last = d
            return False
        if self.changed_at is None and self.live and running:
            self.changed_at = now  # first seen RUNNING (the metrics as at the first look)
            return False
        return self.changed_at is not None and now - self.changed_at >= self.timeout


def _metrics_digest(options):
    """A function giving the metrics of the portable job of ``options`` as bytes (its job service,
    :func:`_job_service_metrics`), or None when ``options`` name no job endpoint or job name."""
    job = _portable_job(options)
    if job is None:
        return None
    _, name = job
    flink = _flink_progress(options, name)

    def digest():
        metrics = _job_service_metrics(*job)
        tasks = flink() if flink is not None else None
        if metrics is None and tasks is None:
            return None
        # each list sorted: Prism lists the same monitoring infos in a new order at every call
        return b"\0".join([*(b"\1".join(sorted(info.SerializeToString(deterministic=True) for info in infos))
                             for infos in ((metrics.committed, metrics.attempted) if metrics is not None else ())),
                           tasks or b""])

    return digest


#: the I/O counters of a Flink job's vertices that tell progress (not its busy and idle times:
#: those grow in a task that has stopped too)
_FLINK_PROGRESS = ("read-bytes", "write-bytes", "read-records", "write-records")


def _flink_progress(options, name: str):
    """A function giving, as bytes, each vertex's status and I/O counters of the running Flink job
    named ``name`` (Beam's Flink runner names the Flink job after the pipeline's ``job_name``), from
    the REST API of ``--flink_master`` (``/jobs/overview``, ``/jobs/<jid>``; None when it does not
    answer or has no such running job); None when ``options`` name no Flink master. Beam's Flink job
    server reports a job's metrics only at its end: this is the progress of a job on Flink, so that a
    task left RUNNING with nothing to do (a TaskManager's gRPC thread out of memory: docs/benchmarks.md)
    is seen standing still."""
    import json

    base = flink_rest.master_url(options)
    if base is None:
        return None

    def progress():
        try:
            jid = flink_rest.one_job(base, name, flink_rest.LIVE_STATES)
            if jid is None:
                return None
            job = flink_rest.get(base, f"/jobs/{jid}")
        except (OSError, ValueError, KeyError):
            return None
        return json.dumps([job.get("state"), sorted(
            [v.get("id"), v.get("status"), *((v.get("metrics") or {}).get(k) for k in _FLINK_PROGRESS)]
            for v in job.get("vertices", []))]).encode()

    return progress


def reports_while_running(options) -> bool:
    """Whether the job service of ``options`` is one that reports a job's metrics while it runs,
    told by its description of pipeline options (public job API: ``DescribePipelineOptions``): Beam's
    Java job servers (Flink's, Spark's), which report metrics only when a job ends, describe their
    runner's options; Prism 2.62, which reports them from its bundles' progress, describes none.
    False when ``options`` name no job service or it does not answer (the watch then waits for a
    first change: never taken for stalled without one)."""
    job = _portable_job(options)
    if job is None:
        return False
    endpoint, _ = job
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    try:
        with grpc.insecure_channel(endpoint) as channel:
            described = beam_job_api_pb2_grpc.JobServiceStub(channel).DescribePipelineOptions(
                beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=30)
    except grpc.RpcError:
        return False
    return len(described.options) == 0


def _flink_jobs_left(options, timeout: float = 30.0, sleep=None) -> list[str] | None:
    """After the job service was asked to cancel the job of ``options``: the ids of the Flink jobs
    named after its ``job_name`` that the Flink cluster of ``--flink_master`` still runs ``timeout``
    seconds later, each asked to cancel through Flink's REST API (``PATCH /jobs/ID?mode=cancel``)
    on the way. Beam 2.62's Flink job server answers a cancel of a streaming job without cancelling
    it on the cluster: the job went on reading Kafka, holding a slot, after the launcher had said it
    was cancelled (engine tier, 2026-12-06). None when ``options`` name no Flink master or job, or
    the REST API does not answer."""
    import time
    import urllib.request

    base, job = flink_rest.master_url(options), _portable_job(options)
    if base is None or job is None:
        return None
    _, name = job
    sleep = sleep or time.sleep

    try:
        deadline = time.monotonic() + timeout
        asked: set = set()
        while True:
            left = flink_rest.named_jobs(base, name, flink_rest.LIVE_STATES)
            if not left or time.monotonic() >= deadline:
                return left
            for jid in set(left) - asked:
                req = urllib.request.Request(f"{base}/jobs/{jid}?mode=cancel", method="PATCH")
                with urllib.request.urlopen(req, timeout=10):  # noqa: S310
                    asked.add(jid)
            sleep(1.0)
    except (OSError, ValueError, KeyError):
        return None


def cancel_job(result, options=None) -> str | None:
    """Cancel the portable job of ``result`` (``result.cancel()``: its job service) and, on Flink,
    see it gone from the cluster (:func:`_flink_jobs_left`); returns None when cancelled, else why
    it may still run (one clause). Raises what ``result.cancel()`` raises."""
    result.cancel()
    left = _flink_jobs_left(options)
    if left:
        return f"the Flink cluster still runs it (job {', '.join(left)}) 30 s after it was asked to cancel"
    return None


def cancel_on_interrupt(result, error: BaseException, options=None) -> None:
    """The launcher was interrupted (Ctrl-C, SIGTERM: ``error``) while it waited for a job on a
    portable runner (Flink, Prism): cancel the job there (:func:`cancel_job`; ``options``: the job's
    pipeline options, for the Flink cluster's own view of it), which would otherwise go on without
    its launcher (an unbounded one for ever), and say so as a note of ``error`` (``add_note``: the
    command's one line shows it). Other runners' jobs (in-process) end with the launcher."""
    from apache_beam.runners.portability.portable_runner import PipelineResult as PortableResult
    from apache_beam.runners.runner import PipelineState

    if not isinstance(result, PortableResult):
        return
    try:
        if PipelineState.is_terminal(result.state):
            return
        why = cancel_job(result, options)
    except Exception as e:  # noqa: BLE001 (the job service gone, a deadline): said, not raised over the interrupt
        error.add_note(f"cancelling the job on the runner failed ({type(e).__name__}): it may still run")
        return
    error.add_note("the job on the runner was cancelled" if why is None
                   else f"cancelling the job on the runner did not end it: {why}")


def wait_for_job(result, *, poll: float = 0.5, sleep=None, options=None, stall_timeout: float | None = None,
                 clock=None, digest=None, live=None):
    """Wait until the job of ``result`` (a Beam ``PipelineResult`` of any runner) ends; returns its
    final state. A job that ended in another state than DONE: its error, as ``wait_until_finish``
    raises it.

    Why not ``wait_until_finish`` alone: Beam 2.62's portable runner opens the job's state and
    message streams with ``--job_server_timeout`` (default 60 s) as their deadline, so waiting on them
    ends in ``DEADLINE_EXCEEDED`` once a job on Prism or the local job service runs longer than that,
    and the launcher reported a job still running, or finished, as failed. For a portable job the
    job's state is asked for instead (``result.state``: one call, its own deadline) every ``poll``
    seconds. Other runners' results (in-process, Dataflow) wait in their own ``wait_until_finish``
    (the local DirectRunner's state changes only there).

    ``stall_timeout`` (seconds; None: no watchdog) with ``options`` (the job's pipeline options: its
    job endpoint and name): every :data:`PROGRESS_EVERY_S` seconds the job service's metrics of the
    job (and with ``--flink_master``, the Flink job's progress from Flink's REST API:
    :func:`_flink_progress`) are read (``digest``, for tests: a function giving them as bytes); when
    they changed once (on a job service that reports metrics while a job runs,
    :func:`reports_while_running`, or ``live`` for tests: since the job was first seen RUNNING) and
    then not for ``stall_timeout`` seconds while the job is still RUNNING, the job is cancelled
    (``result.cancel()``) and :class:`JobStalledError` raised. Prism 2.62 keeps a job RUNNING for ever
    when an SDK worker it waits for is lost (its worker pool killed: about one run in three here); Beam's 60 s
    deadline above used to end such a job, and every job longer than a minute with it."""
    import time

    from apache_beam.runners.portability.portable_runner import PipelineResult as PortableResult
    from apache_beam.runners.runner import PipelineState

    if not isinstance(result, PortableResult):
        return result.wait_until_finish()
    sleep = sleep or time.sleep
    if digest is None and stall_timeout:
        digest = _metrics_digest(options)
    if live is None:
        live = bool(digest and stall_timeout) and reports_while_running(options)
    watch = (_ProgressWatch(digest, stall_timeout, clock or time.monotonic, live=live)
             if digest and stall_timeout else None)
    try:
        state = _wait_portable(result, poll, sleep, watch, options)
    except KeyboardInterrupt as e:
        cancel_on_interrupt(result, e, options)
        raise
    if state == PipelineState.DONE:
        return state
    return result.wait_until_finish()


def _wait_portable(result, poll, sleep, watch, options=None):
    """:func:`wait_for_job`'s loop: the portable job's terminal state."""
    from apache_beam.runners.runner import PipelineState

    state = result.state
    while not PipelineState.is_terminal(state):
        sleep(poll)
        state = result.state
        if watch is not None and not PipelineState.is_terminal(state) and \
                watch.stalled(running=str(state).rsplit(".", 1)[-1] == "RUNNING"):
            try:
                why = cancel_job(result, options)
            except Exception as e:  # noqa: BLE001 (cancelled or not, the job is reported failed)
                why = f"the cancel failed ({type(e).__name__})"
            raise JobStalledError(
                f"no progress for {watch.timeout:g} s: the runner still reports the job {state} but its metrics "
                f"have not changed (a lost SDK worker the runner waits for?); "
                + ("the job was cancelled" if why is None else f"cancelling it did not end it: {why}")
                + f" (--stall-timeout {watch.timeout:g}s; none waits for ever)")
    return state
