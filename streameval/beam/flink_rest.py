"""Flink's REST API as the launcher reads it: the jobs of a cluster by name, and the Beam counters of a
job while it runs.

Beam's Flink job server reports a job's metrics (``GetJobMetrics``) only when the job ends, so a
stream job on Flink, which runs until stopped, printed "running totals: nothing read yet" for its
whole life (1 M impressions read from Kafka, 2026-12-07). Flink itself has them while the job runs:
Beam's Flink runner registers each Beam counter of a running task as a Flink metric of its operator
(``<namespace>.<name>``), which the REST API serves per vertex
(``/jobs/ID/vertices/VID/subtasks/metrics?get=...&agg=sum``, the subtasks added up), its name passed
through Flink's character filter (``.``, ``:``, ``,`` and spaces become ``_``:
``streameval.late:impression`` is served as ``streameval_late_impression``); the metrics of a task
that has finished (the judgments read when the job starts) leave with it, and stay in the job's
accumulators (``/jobs/ID/accumulators``: Beam's ``__metricscontainers``, its monitoring infos as
JSON). :func:`running_counters` puts the two together.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import urllib.parse
import urllib.request

from ..io import counters as cn

__all__ = ["LIVE_STATES", "master_url", "get", "named_jobs", "one_job", "running_counters", "flink_name",
           "no_taskmanager_hint"]

#: Flink's job states that hold the cluster's slots
LIVE_STATES = ("CREATED", "RUNNING", "FAILING", "CANCELLING", "RESTARTING", "RECONCILING", "INITIALIZING",
               "SUSPENDED")

_USER_SUM = "beam:metric:user:sum_int64:v1"
_FILTERED = re.compile(r"[ ,.:]")


def master_url(options) -> str | None:
    """``http://HOST:PORT`` of ``--flink_master`` in ``options``, or None (none given, or ``[auto]``,
    ``[local]``: no cluster to ask)."""
    master = (options.get_all_options().get("flink_master") or "").strip() if options is not None else ""
    if not master or master.startswith("["):
        return None
    return master.rstrip("/") if "://" in master else f"http://{master.rstrip('/')}"


def get(base: str, path: str):
    """A JSON answer of the Flink REST API at ``base`` (``http://HOST:PORT``); OSError, ValueError."""
    with urllib.request.urlopen(base + path, timeout=10) as r:  # noqa: S310 (the job's own master)
        return json.load(r)


def named_jobs(base: str, name: str, states) -> list[str]:
    """The ids of the Flink jobs named ``name`` (Beam's Flink runner names a job after the pipeline's
    ``job_name``) in one of ``states``, from ``/jobs/overview``."""
    return [j["jid"] for j in get(base, "/jobs/overview").get("jobs", [])
            if j.get("name") == name and j.get("state") in states]


def one_job(base: str, name: str, states) -> str | None:
    """The id of the one Flink job named ``name`` in one of ``states`` (:func:`named_jobs`), or None
    when there is none or more than one."""
    jids = named_jobs(base, name, states)
    return jids[0] if len(jids) == 1 else None


def no_taskmanager_hint(options) -> str:
    """``"; the Flink cluster at URL has no TaskManager left ..."`` when ``--flink_master`` in ``options``
    names a cluster whose REST API counts no TaskManager, else ``""`` (no cluster named, none answering,
    or TaskManagers left); :func:`~streameval.beam.sources.failure_reason` adds it. A job whose
    TaskManagers all died fails with Flink's bare slot-request timeout
    (``TimeoutException: Timeout has occurred: 60000 ms``), which does not say why."""
    base = master_url(options)
    if base is None:
        return ""
    try:
        left = get(base, "/overview").get("taskmanagers")
    except (OSError, ValueError, AttributeError):
        return ""
    if left != 0:
        return ""
    return (f"; the Flink cluster at {base} has no TaskManager left (one out of memory exits: its log says "
            "'Terminating due to java.lang.OutOfMemoryError'; docs/deploy.md, TaskManager memory)")


def flink_name(text: str) -> str:
    """``text`` as Flink's REST API serves it in a metric's name (``.``, ``:``, ``,`` and spaces as ``_``)."""
    return _FILTERED.sub("_", text)


@functools.lru_cache(maxsize=1)
def _known_names() -> tuple[dict, list]:
    """(``{served name: counter name}`` of the fixed counter names of :mod:`streameval.io.counters`,
    ``[(served prefix, prefix)]`` of its families whose last part is free text: a rejection's reason,
    a field's name)."""
    fixed = {v for k, v in vars(cn).items() if k.isupper() and isinstance(v, str)}
    for kind in cn.KINDS:
        fixed.update(f(kind) for f in (cn.read, cn.valid, cn.accepted, cn.duplicate, cn.late, cn.superseded,
                                       cn.unreadable_files))
    prefixes = [cn.rejected_prefix(kind) for kind in cn.KINDS] + [cn.online_no_group("")]
    return {flink_name(n): n for n in fixed}, [(flink_name(p), p) for p in prefixes]


def _counter_name(served: str) -> str:
    """The counter name behind a served one (the part after the namespace): a known name or family
    given back its ``:``; any other as served."""
    fixed, prefixes = _known_names()
    if served in fixed:
        return fixed[served]
    for sp, p in prefixes:
        if served.startswith(sp):
            return p + served[len(sp):]
    return served


def _varint(payload: str) -> int:
    """A monitoring info's int64 sum: its payload (base64 in JSON) as Beam's variable-length integer."""
    from apache_beam.coders.coders import VarIntCoder

    return int(VarIntCoder().decode(base64.b64decode(payload)))


def running_counters(options, name: str, namespace: str = cn.NAMESPACE) -> dict | None:
    """``{counter name: value}`` of ``namespace`` of the running Flink job named ``name`` on the cluster
    of ``--flink_master`` in ``options`` (see the module): each running vertex's operator metrics whose
    name is ``namespace`` and a counter's (a namespace beginning with ``namespace.``, such as the
    decoders', is left out), added over its subtasks, and the counters of the transforms that no
    running vertex runs from the job's accumulators (finished tasks). Values are those of the
    attempts running now (a task restarted after a failure counts again from its restart). None when
    ``options`` name no Flink master, the cluster runs no single such job, or its REST API does not
    answer."""
    base = master_url(options)
    if base is None:
        return None
    try:
        jid = one_job(base, name, ("RUNNING",))
        if jid is None:
            return None
        job = get(base, f"/jobs/{jid}")
        out: dict = {}
        running: set = set()  # served names of the transforms the running vertices run
        ours = flink_name(namespace) + "_"
        others = tuple(flink_name(n) + "_" for n in (cn.DECODER_NAMESPACE,) if n.startswith(namespace + "."))
        for v in job.get("vertices", []):
            if v.get("status") != "RUNNING":
                continue
            path = f"/jobs/{jid}/vertices/{v['id']}/subtasks/metrics"
            wanted = []
            for m in get(base, path):
                scope, _, metric = m["id"].partition(".")
                if "_metric_" in metric:  # a system metric of one transform: <transform>_metric_<urn>
                    running.add(metric.split("_metric_", 1)[0])
                if metric.startswith(ours) and not metric.startswith(others):
                    wanted.append(m["id"])
            if wanted:
                query = urllib.parse.quote(",".join(wanted), safe="")
                for m in get(base, f"{path}?agg=sum&get={query}"):
                    counter = _counter_name(m["id"].partition(".")[2][len(ours):])
                    out[counter] = out.get(counter, 0) + int(round(float(m.get("sum") or 0)))
        for acc in get(base, f"/jobs/{jid}/accumulators").get("user-task-accumulators", []):
            if acc.get("name") != "__metricscontainers":
                continue
            infos = json.loads(acc.get("value") or "{}").get("metrics", {})
            for info in infos.get("committed") or infos.get("attempted") or []:
                labels = info.get("labels", {})
                if info.get("urn") != _USER_SUM or labels.get("NAMESPACE") != namespace or \
                        flink_name(labels.get("PTRANSFORM", "")) in running:
                    continue
                out[labels["NAME"]] = out.get(labels["NAME"], 0) + _varint(info.get("payload", ""))
        return out
    except (OSError, ValueError, KeyError, TypeError):
        return None
