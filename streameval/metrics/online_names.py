"""Names of the online metrics (:mod:`streameval.metrics.online`): ``auc``, ``gauc[GROUP,WEIGHTING]``,
``clicks@k``, calibration, interleaving and dwell names, parsed to :class:`OnlineSpec`."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from .dwell import DWELL_FAMILIES, seconds_text, threshold_ms
from .names import MetricNameError, closest_text, parse_metric, ranking_identity, ranking_vocabulary

# --------------------------------------------------------------------------------------------
# names

#: GAUC group -> the impression field that identifies the group
GAUC_GROUPS = {"user": "user_id", "query": "query_id", "request": "request_id"}
#: GAUC weighting -> what weighs a group's AUC
GAUC_WEIGHTINGS = ("impressions", "clicks", "unweighted")
_GROUP_ALIASES = {"user": "user", "users": "user", "user_id": "user", "query": "query", "queries": "query",
                  "query_id": "query", "request": "request", "requests": "request", "request_id": "request",
                  "session": "request"}
_WEIGHT_ALIASES = {"impressions": "impressions", "impression": "impressions", "imps": "impressions",
                   "views": "impressions", "clicks": "clicks", "click": "clicks", "positives": "clicks",
                   "unweighted": "unweighted", "uniform": "unweighted", "none": "unweighted",
                   "equal": "unweighted", "mean": "unweighted"}
DEFAULT_GAUC_GROUP = "user"
DEFAULT_GAUC_WEIGHTING = "impressions"

_FAMILIES = ("auc", "auc_hist", "gauc", "ctr", "clicks", "rr_first_click", "abandonment", "logloss", "brier",
             "calibration", "ece", "interleaving", "pr_auc", "precision", "recall", "f1", "psi", "ks",
             *DWELL_FAMILIES)

#: the families computed from the exact AUC state's counts per distinct score
#: (:mod:`streameval.metrics.threshold`)
SCORE_COUNT_FAMILIES = ("pr_auc", "precision", "recall", "f1", "psi", "ks")
#: the threshold families: ``precision[t=T]``, ``recall[t=T]``, ``f1[t=T]`` (a score >= T predicts a click)
THRESHOLD_FAMILIES = ("precision", "recall", "f1")
#: the drift families (against a reference distribution): ``psi[score]``, ``ks[score]``
DRIFT_FAMILIES = ("psi", "ks")
#: what a drift metric compares (the only feature so far)
DRIFT_FEATURES = ("score",)


@dataclass(frozen=True)
class OnlineSpec:
    """One online metric. ``family`` one of auc, auc_hist, gauc, ctr, clicks, rr_first_click,
    abandonment, logloss, brier, calibration, ece (:mod:`streameval.metrics.calibration`),
    interleaving (:mod:`streameval.metrics.interleaving`); ``k`` the
    cutoff of clicks@k, the position of ctr@pos{k} or the bins of ece; ``group`` and
    ``weighting`` of GAUC; ``clicked_only`` for ``rr_first_click[clicked]``; ``threshold_ms`` the
    dwell threshold T (milliseconds) of ``sat_click_rate``, ``long_click_ctr`` and ``last_click_ctr``
    (families in :data:`DWELL_FAMILIES`, with ``mean_dwell``)."""

    family: str
    k: int | None = None
    group: str | None = None
    weighting: str | None = None
    clicked_only: bool = False
    threshold_ms: int | None = None
    threshold: float | None = None

    @property
    def name(self) -> str:
        """Canonical name used in result rows: ``auc``, ``auc_hist``, ``gauc[user,impressions]``,
        ``ctr``, ``ctr@pos2``, ``clicks@3``, ``clicks``, ``rr_first_click``,
        ``rr_first_click[clicked]``, ``abandonment``, ``logloss``, ``brier``, ``calibration``,
        ``ece[bins=10]``, ``mean_dwell``, ``sat_click_rate[t=30s]``, ``long_click_ctr[t=30s]``,
        ``last_click_ctr[t=30s]``, ``pr_auc``, ``precision[t=0.5]``, ``recall[t=0.5]``,
        ``f1[t=0.5]``, ``psi[score]``, ``ks[score]``."""
        f = self.family
        if f in THRESHOLD_FAMILIES:
            return f"{f}[t={threshold_text(self.threshold)}]"
        if f in DRIFT_FAMILIES:
            return f"{f}[score]"
        if f in DWELL_FAMILIES and f != "mean_dwell":
            return f"{f}[t={seconds_text(self.threshold_ms)}s]"
        if f == "ece":
            return f"ece[bins={self.k}]"
        if f == "gauc":
            return f"gauc[{self.group},{self.weighting}]"
        if f == "ctr":
            return "ctr" if self.k is None else f"ctr@pos{self.k}"
        if f == "clicks":
            return "clicks" if self.k is None else f"clicks@{self.k}"
        if f == "rr_first_click":
            return "rr_first_click[clicked]" if self.clicked_only else "rr_first_click"
        return f

    @property
    def needs_scores(self) -> bool:
        """True for the score-based metrics (auc, auc_hist, gauc and the calibration metrics)."""
        return self.family in ("auc", "auc_hist", "gauc", "logloss", "brier", "calibration", "ece",
                               *SCORE_COUNT_FAMILIES)

    @property
    def score_counts(self) -> bool:
        """True for the metrics taken from the exact AUC state's counts per distinct score (pr_auc,
        the threshold metrics, psi, ks: :mod:`streameval.metrics.threshold`)."""
        return self.family in SCORE_COUNT_FAMILIES

    @property
    def drift(self) -> bool:
        """True for the drift metrics (psi, ks): they need a reference distribution."""
        return self.family in DRIFT_FAMILIES

    @property
    def calibration(self) -> bool:
        """True for the calibration metrics (logloss, brier, calibration, ece): score as probability."""
        return self.family in ("logloss", "brier", "calibration", "ece")

    @property
    def per_request(self) -> bool:
        """True for the metrics averaged over requests (clicks, rr_first_click, abandonment and the
        dwell metrics)."""
        return self.family in ("clicks", "rr_first_click", "abandonment", *DWELL_FAMILIES)

    @property
    def dwell(self) -> bool:
        """True for the dwell metrics (:data:`DWELL_FAMILIES`: they read the clicks' ``dwell_ms``)."""
        return self.family in DWELL_FAMILIES

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.name


_ACCEPTED = ("auc, auc_hist, gauc, gauc[GROUP] or gauc[GROUP,WEIGHTING] (GROUP user/query/request, "
             "WEIGHTING impressions/clicks/unweighted), ctr, ctr@pos{p}, clicks, clicks@k, rr_first_click, "
             "rr_first_click[clicked], abandonment, logloss, brier, calibration, ece or ece[bins=B] (fixed-width "
             "bins, B from 1 to 10000, default 10), interleaving or interleaving[team_draft] (team-draft credit "
             "from the impressions' attributes[\"team\"]), mean_dwell, sat_click_rate[t=T], "
             "long_click_ctr[t=T], last_click_ctr[t=T] (dwell threshold T in seconds, e.g. t=30s or t=1.5s, or "
             "t=500ms; default 30s), pr_auc (average precision), precision[t=T], recall[t=T], f1[t=T] (a score "
             ">= T predicts a click, e.g. precision[t=0.5]), psi[score], ks[score] (drift against a reference)")


def parse_online_metric(name: str) -> OnlineSpec:
    """Parse one online metric name (forms in :data:`_ACCEPTED`; case-insensitive).

    Raises :class:`~streameval.metrics.names.MetricNameError` naming the three closest accepted names."""
    spec = match_online_metric(name)
    if spec is None:
        raise unknown_online_error(name)
    return spec


def match_online_metric(name: str) -> OnlineSpec | None:
    """The online metric a name gives, or None when it is no online metric's name (no search for the
    closest names: cheap for callers that only ask). Raises
    :class:`~streameval.metrics.names.MetricNameError` for an online metric's name with bad parameters
    (``gauc[nobody]``)."""
    text = str(name).strip()
    low = text.lower().replace(" ", "")
    if low in ("auc", "roc_auc", "auc_exact"):
        return OnlineSpec("auc")
    if low in ("auc_hist", "auc[hist]", "auc_histogram"):
        return OnlineSpec("auc_hist")
    m = re.fullmatch(r"gauc(?:\[([a-z_]+)(?:,([a-z_]+))?\])?", low)
    if m:
        group = _GROUP_ALIASES.get(m.group(1) or DEFAULT_GAUC_GROUP)
        weighting = _WEIGHT_ALIASES.get(m.group(2) or DEFAULT_GAUC_WEIGHTING)
        if group is None or weighting is None:
            raise MetricNameError(f"bad GAUC name {name!r}: group one of {sorted(GAUC_GROUPS)}, weighting one "
                                  f"of {list(GAUC_WEIGHTINGS)}")
        return OnlineSpec("gauc", group=group, weighting=weighting)
    if low == "ctr":
        return OnlineSpec("ctr")
    m = re.fullmatch(r"ctr@pos(\d+)", low)
    if m and int(m.group(1)) >= 1:
        return OnlineSpec("ctr", k=int(m.group(1)))
    if low in ("clicks", "clicks_per_request"):
        return OnlineSpec("clicks")
    m = re.fullmatch(r"clicks@(\d+)", low)
    if m and int(m.group(1)) >= 1:
        return OnlineSpec("clicks", k=int(m.group(1)))
    m = re.fullmatch(r"(?:rr_first_click|rr_click|mrr_click|first_click_rr)(\[clicked\])?", low)
    if m:
        return OnlineSpec("rr_first_click", clicked_only=bool(m.group(1)))
    if low in ("abandonment", "abandonment_rate"):
        return OnlineSpec("abandonment")
    if low in ("mean_dwell", "dwell", "avg_dwell", "mean_dwell_time"):
        return OnlineSpec("mean_dwell")
    m = re.fullmatch(r"(sat_click_rate|sat_clicks|satisfied_click_rate|long_click_ctr|long_ctr|last_click_ctr)"
                     r"(?:\[(.*)\])?", low)
    if m:
        family = {"sat_clicks": "sat_click_rate", "satisfied_click_rate": "sat_click_rate",
                  "long_ctr": "long_click_ctr"}.get(m.group(1), m.group(1))
        return OnlineSpec(family, threshold_ms=threshold_ms(name, m.group(2)))
    if low in ("logloss", "log_loss", "cross_entropy"):
        return OnlineSpec("logloss")
    if low in ("brier", "brier_score", "brier_score_loss"):
        return OnlineSpec("brier")
    if low in ("calibration", "calibration_ratio"):
        return OnlineSpec("calibration")
    if low in ("interleaving", "interleaving[team_draft]", "team_draft"):
        return OnlineSpec("interleaving")
    m = re.fullmatch(r"ece(?:\[(.*)\])?", low)
    if m:
        return OnlineSpec("ece", k=_ece_bins(name, m.group(1)))
    if low in ("pr_auc", "prauc", "average_precision", "auprc", "pr_auc[ap]"):
        return OnlineSpec("pr_auc")
    m = re.fullmatch(r"(precision|recall|f1)\[(.*)\]", low)
    if m:
        return OnlineSpec(m.group(1), threshold=_threshold(name, m.group(1), m.group(2)))
    m = re.fullmatch(r"(psi|ks)(?:\[(.*)\])?", low)
    if m:
        if (m.group(2) or "score") not in DRIFT_FEATURES:
            raise MetricNameError(f"bad drift name {name!r}: expected {m.group(1)}[score] (the score's drift; "
                                  f"features are not offered)")
        return OnlineSpec(m.group(1))
    return None


#: the base names of the online metrics (the closest names of an unknown one draw on them)
ONLINE_VOCABULARY = ("auc", "auc_hist", "gauc", "ctr",
                     "clicks", "rr_first_click", "rr_first_click[clicked]", "abandonment", "logloss", "brier",
                     "calibration", "ece", "interleaving", "pr_auc", "precision[t=0.5]", "recall[t=0.5]",
                     "f1[t=0.5]", "psi[score]", "ks[score]", *DWELL_FAMILIES)


def threshold_text(t: float) -> str:
    """A threshold as the canonical names write it: Python's shortest repr of the float
    (``0.5``, ``1e-05``, ``-2.0`` -> ``-2``, ``3.0`` -> ``3``)."""
    r = repr(float(t))
    return r[:-2] if r.endswith(".0") else r


def _threshold(name, family, params) -> float:
    """The T of ``precision[t=T]`` (also ``[T]`` and ``[score>=T]``): a finite number."""
    m = re.fullmatch(r"(?:t=|score>=|threshold=)?([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)", params)
    value = float(m.group(1)) if m else math.nan
    if not math.isfinite(value):
        raise MetricNameError(f"bad threshold in {name!r}: expected {family}[t=T] with T a finite number "
                              f"(a score >= T predicts a click), e.g. {family}[t=0.5]")
    return value + 0.0


def online_identity(name):
    """The online metric a name gives (its :class:`OnlineSpec`), or None if it is refused."""
    try:
        return parse_online_metric(name)
    except MetricNameError:
        return None


def unknown_online_error(name) -> MetricNameError:
    """The one-line error of a name that is no online metric, naming the three closest."""
    e = MetricNameError(f"unknown online metric {str(name).strip()!r}"
                        f"{closest_text(name, ONLINE_VOCABULARY, online_identity)}")
    e.unknown = True
    return e


def _ece_bins(name, params) -> int:
    """The bins of ``ece[...]``: none (10), ``B`` or ``bins=B``; quantile bins are refused."""
    from .calibration import DEFAULT_BINS, MAX_BINS

    if params is None:
        return DEFAULT_BINS
    parts = params.split(",")
    if any(p in ("quantile", "strategy=quantile") for p in parts):
        raise MetricNameError(f"bad ECE name {name!r}: quantile bins are not exactly mergeable and are not offered; "
                              f"use fixed-width bins ece[bins=B]")
    m = re.fullmatch(r"(?:bins=)?(\d+)(?:,(?:uniform|strategy=uniform))?", params)
    if not m or not 1 <= int(m.group(1)) <= MAX_BINS:
        raise MetricNameError(f"bad ECE name {name!r}: expected ece, ece[bins=B] or ece[B] with B an integer from 1 "
                              f"to {MAX_BINS}")
    return int(m.group(1))


def parse_online_metrics(names) -> list[OnlineSpec]:
    """Parse a name or a list of names (a comma list is split, except inside brackets); duplicates
    are dropped, order kept."""
    if isinstance(names, str):
        names = _split_names(names)
    out: list[OnlineSpec] = []
    for n in names:
        s = parse_online_metric(n)
        if s not in out:
            out.append(s)
    return out


def _split_names(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def is_online_metric(name: str) -> bool:
    """True when ``name`` parses as an online metric (see :func:`parse_online_metric`)."""
    try:
        parse_online_metric(name)
    except MetricNameError:
        return False
    return True


def unknown_metric_error(name, diversity: bool = False) -> MetricNameError:
    """The one-line error of a name that is neither a ranking nor an online metric (the jobs'
    ``--metrics``), naming the three closest of both kinds."""

    def identity(c):
        return ranking_identity(c, diversity) or online_identity(c)

    e = MetricNameError(f"unknown metric {str(name).strip()!r}"
                        f"{closest_text(name, ranking_vocabulary(diversity) + ONLINE_VOCABULARY, identity)}")
    e.unknown = True
    return e


@functools.lru_cache(maxsize=4096)
def _canonical(text: str) -> str:
    try:
        return parse_online_metric(text).name
    except MetricNameError:
        pass
    try:
        specs = parse_metric(text, diversity=True)
    except MetricNameError:
        return text
    return specs[0].canonical if len(specs) == 1 else text


def canonical_metric(name) -> str:
    """The canonical name of a metric written in any spelling (issue 42): a ranking measure's
    :attr:`~streameval.metrics.names.MetricSpec.canonical` (``nDCG@10``, ``ndcg_cut_10`` ->
    ``ndcg@10``; ``AP`` -> ``map``), an online metric's :attr:`OnlineSpec.name` (``GAUC`` ->
    ``gauc[user,impressions]``); any other name (an off-policy estimate's, a list ``P.5,10``) as
    given, stripped. ir_measures Measure objects are read as their names. The rows' ``metric_canonical``
    and what every reader of metric rows matches names on."""
    from .names import as_name

    return _canonical(str(as_name(name)).strip())


def same_metric(a, b) -> bool:
    """True when ``a`` and ``b`` name the same metric in any spelling (:func:`canonical_metric`)."""
    return a == b or canonical_metric(a) == canonical_metric(b)
