"""The jobs' counter names, written once (issue 22: every record rule in one place).

The batch job (``streameval/jobs/batch.py``: both engines, ``streameval/beam/transforms.py``,
``online.py`` and ``columnar*.py``), the streaming job (``streameval/beam/streaming/``) and the
off-policy job (``streameval/jobs/ope.py``) count records with Beam counters in :data:`NAMESPACE`; the
batch job's columnar engine also counts which Avro decoder read each file in
:data:`DECODER_NAMESPACE`. The launchers read them back from the ``PipelineResult``
(``streameval.beam.accounting.job_counters``), check the record accounting
(``streameval.beam.accounting.account``), print the summary lines and write the values to
``summary.json`` (``"counters"``, and for the stream ``"counts"``): dashboards, summaries and tests
read these names, so they never change.

Who writes what:

* every job: :func:`read`, :func:`valid`, :func:`rejected`, :func:`duplicate`, :func:`late`,
  :data:`SUPERSEDED_JUDGMENT`, :func:`accepted` (the record accounting, ``beam/accounting.py``);
  the fates of the accepted impressions (:data:`IMPRESSIONS_RANKED`, ...) and of the requests
  (:data:`REQUESTS_SCORED`, ...);
* the batch job: :func:`unreadable_files`, :data:`METRIC_ROWS_WRITTEN`, :data:`QUERIES_SCORED`,
  :data:`REQUESTS_COMPLETED`, the ``online:`` counters (:data:`ONLINE_PREFIX`) and the columnar
  engine's distributions of element sizes (:data:`ELEMENT_IMPRESSIONS_CLEAN`, ...);
* the streaming job: clicks (:data:`CLICKS_ACCEPTED`, ``duplicate:click``, ``late:click``),
  :data:`LATE_UPDATE`, :data:`JUDGMENT_LATE_NOTICES`, the panes (:func:`panes`); its console step
  also keeps counts of its own in this process (``streaming/console.py``'s ``LOCAL_COUNTS``:
  :func:`written`, :data:`ALERTS_PRINTED`, the panes again);
* the off-policy job: :data:`OPE_IMPRESSIONS`, :data:`OPE_NOT_LOGGED`;
* the alerts (batch and stream): :data:`ALERTS_FIRED`.

The late-data output's ``source`` field is the ``late:<kind>`` counter name of its record
(the streaming job counts its late records by that field). Pure Python, no Beam.
"""

from __future__ import annotations

#: namespace of every record and job counter
NAMESPACE = "streameval"
#: namespace of the columnar engine's decoder counters (:func:`decoder`, :func:`decoder_parquet`)
DECODER_NAMESPACE = "streameval.decoders"

#: the record kinds counted (``click``: separate click events, streaming only)
KINDS = ("impression", "judgment", "click")

# ---- prefixes and suffixes readers match on ------------------------------------------------------

REJECTED_PREFIX = "rejected:"  # every dead-letter count: rejected:<kind>:<reason key>
LATE_PREFIX = "late:"  # every late-data count: late:<kind>, late:update
ONLINE_PREFIX = "online:"  # the online metrics' counts (batch job)
READ_SUFFIX = "s_read"  # every <kind>s_read


# ---- the record accounting, per kind ------------------------------------------------------------

def read(kind: str) -> str:
    """``<kind>s_read``: records of ``kind`` read from the sources."""
    return f"{kind}{READ_SUFFIX}"


def valid(kind: str) -> str:
    """``<kind>s_valid``: records of ``kind`` passing the record checks (``streameval.io.records``)."""
    return f"{kind}s_valid"


def accepted(kind: str) -> str:
    """``<kind>s_accepted``: records of ``kind`` that reach the metrics."""
    return f"{kind}s_accepted"


def rejected_prefix(kind: str) -> str:
    """``rejected:<kind>:``: what every dead-letter count of ``kind`` starts with."""
    return f"{REJECTED_PREFIX}{kind}:"


def rejected(kind: str, reason_key: str) -> str:
    """``rejected:<kind>:<reason key>``: records of ``kind`` written to the dead letters, by reason
    category (``streameval.io.records.reason_key``, or a cleaning reason's constant)."""
    return f"{rejected_prefix(kind)}{reason_key}"


def rejected_reason(name: str) -> str:
    """The reason key of a :func:`rejected` name (what follows ``rejected:<kind>:``)."""
    return name.split(":", 2)[2]


def duplicate(kind: str) -> str:
    """``duplicate:<kind>``: replays of a record already counted (no effect on any metric)."""
    return f"duplicate:{kind}"


def late(kind: str) -> str:
    """``late:<kind>``: records of ``kind`` written to the late-data output (also that output's
    ``source`` field)."""
    return f"{LATE_PREFIX}{kind}"


def superseded(kind: str) -> str:
    """``superseded:<kind>``: records replaced by another under the conflict policy (judgments)."""
    return f"superseded:{kind}"


def unreadable_files(kind: str) -> str:
    """``unreadable_files:<kind>``: input files of ``kind`` that could not be read to their end (batch)."""
    return f"unreadable_files:{kind}"


IMPRESSIONS_READ = read("impression")
IMPRESSIONS_ACCEPTED = accepted("impression")
JUDGMENTS_READ = read("judgment")
JUDGMENTS_VALID = valid("judgment")
JUDGMENTS_ACCEPTED = accepted("judgment")
CLICKS_ACCEPTED = accepted("click")  # click events joined to an impression (streaming)
DUPLICATE_IMPRESSION = duplicate("impression")
DUPLICATE_JUDGMENT = duplicate("judgment")
DUPLICATE_CLICK = duplicate("click")  # (streaming)
LATE_IMPRESSION = late("impression")
LATE_JUDGMENT = late("judgment")  # the late-data source of a judgment that changed a closed window (streaming)
LATE_CLICK = late("click")  # (streaming)
LATE_UPDATE = late("update")  # (streaming) a request's update that reached a window's aggregate after it closed
SUPERSEDED_JUDGMENT = superseded("judgment")  # judgments replaced under --judgment-conflicts latest or max

# ---- where the accepted impressions and the requests went ---------------------------------------

IMPRESSIONS_RANKED = "impressions_ranked"  # in a request that was scored
IMPRESSIONS_UNJUDGED = "impressions_unjudged"  # in a request whose query has no judgment (unjudged output)
IMPRESSIONS_UNRANKABLE = "impressions_unrankable"  # in a request that could not be ranked (a dead letter of its own)
IMPRESSIONS_UNSCORABLE = "impressions_unscorable"  # of those, the impressions without a finite score
CLICK_IMPRESSIONS = "click_impressions"  # counted in CTR
CLICK_IMPRESSIONS_NOT_LOGGED = "click_impressions_not_logged"  # accepted, but their clicks were not logged
REQUESTS_SCORED = "requests_scored"  # requests ranked and scored
REQUESTS_UNJUDGED = "requests_unjudged"  # requests whose query has no judgment
#: of those, the requests of systems without any judged request (CTR-only traffic): counted, not listed
REQUESTS_UNJUDGED_UNLISTED = "requests_unjudged_unlisted"
REQUESTS_COMPLETED = "requests_completed"  # (query, system) pairs without a request, scored 0 (--complete)
QUERIES_SCORED = "queries_scored"  # queries with at least one request scored (batch)
JUDGMENT_LATE_NOTICES = "judgment_late_notices"  # (streaming) judgments that changed windows already final


def impressions_fate(fate: str) -> str:
    """``impressions_<fate>`` (``ranked``, ``unjudged``, ``unrankable``): the accepted impressions of a
    request by what became of it."""
    return f"impressions_{fate}"


def requests_fate(fate: str) -> str:
    """The requests counter of a request's fate: :data:`REQUESTS_SCORED` for ``ranked``, else
    ``requests_<fate>`` (``requests_unjudged``, ``requests_unrankable``)."""
    return REQUESTS_SCORED if fate == "ranked" else f"requests_{fate}"


# ---- outputs and alerts -----------------------------------------------------------------------

METRIC_ROWS_WRITTEN = "metric_rows_written"  # metric rows the batch job wrote
ALERTS_FIRED = "alerts_fired"  # alert records emitted (batch and stream)

# ---- online metrics (batch job: beam/online.py and beam/columnar_online.py) ----------------------

ONLINE_UNJUDGED = ONLINE_PREFIX + "unjudged"  # impressions without a judgment, left out under --unjudged exclude
ONLINE_NO_SCORE = ONLINE_PREFIX + "no_score"  # impressions without a score (AUC, calibration)
ONLINE_NOT_LABELLED = ONLINE_PREFIX + "not_labelled"  # without a logged click (--labels clicks)
ONLINE_SCORE_NOT_PROBABILITY = ONLINE_PREFIX + "score_not_probability"  # scores outside [0, 1] (calibration)
ONLINE_REQUESTS = ONLINE_PREFIX + "requests"  # requests counted in the per-request click metrics
ONLINE_REQUESTS_NOT_LOGGED = ONLINE_PREFIX + "requests_not_logged"  # requests whose clicks were not logged
ONLINE_CLICKS_NO_DWELL = ONLINE_PREFIX + "clicks_no_dwell"  # clicks without a dwell time (dwell metrics)
ONLINE_INTERLEAVING_NO_TEAM = ONLINE_PREFIX + "interleaving_no_team"  # clicked items without a team (interleaving)


def online_no_group(field: str) -> str:
    """``online:no_group:<field>``: impressions without the GAUC group field ``field``
    (``user_id``, ``query_id``, ``request_id``)."""
    return f"{ONLINE_PREFIX}no_group:{field}"


# ---- off-policy estimates (streameval/jobs/ope.py, beam/online.py) ------------------------------------

OPE_IMPRESSIONS = "ope:impressions"  # impressions the estimates are taken from
OPE_NOT_LOGGED = "ope:not_logged"  # impressions whose clicks were not logged (no reward)
OPE_SLATES = "ope:slates"  # slates (requests) the slate estimators are taken from (ope --slate)

# ---- distributions of the columnar engine's element sizes (summary.json "elements") -------------

ELEMENT_IMPRESSIONS_CLEAN = "element_impressions:clean"  # impressions per element of the clean stage
ELEMENT_IMPRESSIONS_SCORE = "element_impressions:score"  # impressions per element of the score stage
ELEMENT_JUDGMENTS_SCORE = "element_judgments:score"  # judgments per side input of the score stage
HOT_QUERY_FANOUT = "hot_query_fanout"  # elements a hot query is scored in

# ---- decoders (DECODER_NAMESPACE): which decoder read each file --------------------------------


def decoder(used, path: str) -> str:
    """``<decoders>:<path>``: the Avro decoders (names joined by ``+``, sorted; ``none`` when no
    block was decoded) that read ``path``."""
    return f"{'+'.join(sorted(used)) or 'none'}:{path}"


def decoder_parquet(path: str) -> str:
    """``parquet:<path>``: the Parquet file ``path``, read by pyarrow."""
    return decoder(("parquet",), path)


def decoder_parts(name: str) -> tuple[str, str]:
    """``(decoders, path)`` of a :func:`decoder` name."""
    used, path = name.split(":", 1)
    return used, path


# ---- panes and the streaming console's own counts -----------------------------------------------

PANES_FINAL = "panes_final"  # final panes (a Beam counter of the aggregate; the console step counts them in its process too)
ALERTS_PRINTED = "alerts_printed"  # alerts printed by the console step (local runner)
WRITTEN_REJECTED = "written:rejected"  # dead letters the console step passed to the output
WRITTEN_UNRANKABLE = "written:unrankable"  # unrankable requests passed to the output
WRITTEN_UNREADABLE = "written:unreadable"  # damaged-file records passed to the output


def panes(pane: str) -> str:
    """``panes_<pane>`` (``early``, ``on_time``, ``late``): panes fired."""
    return f"panes_{pane}"


def written(source: str) -> str:
    """``written:<source>``: records of a side output's ``source`` (``late:<kind>``) the console
    step passed to the output."""
    return f"written:{source}"
