"""Online metrics and bootstrap intervals in the columnar streaming engine's panes.

The shard stage of :mod:`.coarse` cleans a window's requests with the batch job's
:class:`~..columnar._CleanShard`; given an :class:`~..columnar_online.OnlineColumns`, that stage also
yields the online metrics' partial states of the chunk, per ``(window start, window end, slice,
system)``, exactly as in the batch job (:mod:`streameval.beam.columnar_online`):

* ``auc``, ``auc_hist``: :class:`~streameval.accumulators.online.CountArrays` (positives and
  negatives per distinct score or bin; AUC with its DeLong standard error, the histogram AUC with its
  error bound);
* ``logloss``, ``brier``, ``calibration``, ``ece[bins=B]`` (and the reliability rows):
  :class:`~streameval.accumulators.online.CalibrationOps` states;
* ``clicks@k``, ``rr_first_click``, ``abandonment``: per-request terms summed in
  :class:`~streameval.accumulators.moments.MeanMoments` states;
* ``interleaving``: the per-request win / loss / tie indicators in MeanMoments states.

Every one of these states merges exactly (integer counts, Shewchuk partials), so the shards'
partials merged where a pane fires give the batch job's values to the last bit, and its rows
(the batch job's row functions, :func:`~streameval.beam.online.with_interval`: DeLong / t / Wilson
intervals) for final panes. ``gauc[...]`` is not offered: a group (a user, a query) spans the
stream's request shards, and its AUC needs all of its examples in one place (the batch job groups
them by a shuffle); the labels are the impressions' clicks (``clicked``), as in the batch job's
``--labels clicks``.

``--cluster request|user``: the clean stage's clicks per cluster (tag ``cluster_clicks``:
``{cluster id: [impressions, clicks]}`` per slice, summed over shards and pieces: a user spans the
request shards), and at a pane the batch job's ``ctr[cluster=C]`` rows from their exact sums
(:func:`streameval.beam.clusters.clustered_rows`).

``--ci bootstrap`` (:class:`StreamBootstrap`): the ranking metrics' states are
:class:`~streameval.accumulators.bootstrap.PoissonBootstrap` states (replicate weights from the
stable hash of the query id, the batch job's), merged exactly per window, with the batch job's
percentile interval (:class:`~streameval.beam.stats.BootstrapMeanCombineFn`).
"""

from __future__ import annotations

from apache_beam import pvalue

from ...accumulators.bootstrap import PoissonBootstrap
from ...accumulators.online import CountArrays, HistAucOps, auc_result, hist_auc_result
from ...metrics import online as om
from ..combiners import MeanCombineFn
from ..columnar_online import TAG_AUC, TAG_CALIBRATION, TAG_HIST, TAG_INTERLEAVING, TAG_REQUESTS, OnlineColumns
from ..online import calibration_rows, hist_rows, interleaving_rows, with_interval
from ..stats import BootstrapMeanCombineFn
from ..transforms import metric_row

__all__ = ["StreamOnline", "StreamBootstrap", "online_refusal"]

#: the clean stage's clicks per cluster (--cluster)
TAG_CLUSTER = "cluster_clicks"
#: the tags of the clean stage's online outputs the stream merges
STREAM_TAGS = (TAG_AUC, TAG_HIST, TAG_CALIBRATION, TAG_REQUESTS, TAG_INTERLEAVING, TAG_CLUSTER)
#: the ci fields of a metric_result row
CI_FIELDS = ("ci_low", "ci_high", "ci_level", "ci_method")


def online_refusal(names) -> str | None:
    """Why the streaming job cannot compute the online metrics ``names`` (None: it can)."""
    for s in om.parse_online_metrics(list(names)):
        if s.family == "gauc":
            return (f"{s.name}: GAUC is not computed by the streaming job (a group spans its request shards; "
                    "use streameval batch)")
        if s.score_counts:
            return (f"{s.name}: pr_auc, the threshold metrics and psi / ks are not computed by the streaming job; "
                    "use streameval batch (or streameval.evaluate_log)")
    return None


class StreamOnline:
    """The online metrics of the columnar stream (see the module): ``names`` (online metric names,
    the ``ctr`` family left to the job's CTR), ``window_micros``, ``slice_specs`` as the batch stages,
    ``hist_bins`` / ``hist_range`` of ``auc_hist``, ``cluster`` (``none``, ``request``, ``user``): the
    ``ctr[cluster=C]`` rows. Raises ValueError for a name the stream cannot compute
    (:func:`online_refusal`), bad histogram options or an unknown cluster."""

    def __init__(self, names, window_micros: int, slice_specs, shards: int, hist_bins: int = 1000,
                 hist_range=(0.0, 1.0), cluster: str = "none"):
        from ..clusters import CLUSTERS

        why = online_refusal(names)
        if why:
            raise ValueError(why)
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {CLUSTERS}, got {cluster!r}")
        self.cluster = cluster
        self.specs = [s for s in om.parse_online_metrics(list(names)) if s.family != "ctr"]
        self.hist = HistAucOps(hist_range[0], hist_range[1], hist_bins)  # validates
        self.window_micros = int(window_micros)
        self.slice_specs = slice_specs
        self.shards = int(shards)
        self._columns = None

    def __bool__(self):
        return bool(self.specs) or self.cluster != "none"

    def columns(self) -> OnlineColumns:
        """The clean stage's online part (built once per process: it holds Beam counters)."""
        if self._columns is None:
            self._columns = OnlineColumns(self.specs, self.window_micros, self.slice_specs, self.hist,
                                          self.shards, hold=True, labels="clicks")
        return self._columns

    def __getstate__(self):
        return dict(self.__dict__, _columns=None)

    # -- states -----------------------------------------------------------------------------
    def merge(self, tag: str, states: list):
        """One state of ``tag`` from several (exact)."""
        if len(states) == 1:
            return states[0]
        if tag == TAG_CLUSTER:  # {cluster id: [impressions, clicks]}: integer sums
            out = dict(states[0])
            for st in states[1:]:
                for cid, (n, y) in st.items():
                    a = out.get(cid)
                    out[cid] = (n, y) if a is None else (a[0] + n, a[1] + y)
            return out
        if tag in (TAG_AUC, TAG_HIST):
            return CountArrays.merge(states)
        c = self.columns()
        if tag == TAG_CALIBRATION:
            return c.calibration_ops.merge(states)
        return (c.mm if tag == TAG_REQUESTS else c.mm3).merge(states)

    def add(self, into: dict, by_tag: dict) -> None:
        """Merge states ``{tag: {slice label: state}}`` into ``into`` (the same form), exactly."""
        for tag, by_label in by_tag.items():
            dst = into.setdefault(tag, {})
            for label, state in by_label.items():
                dst[label] = state if label not in dst else self.merge(tag, [dst[label], state])

    def collect(self, outputs, into: dict) -> None:
        """Add the clean stage's tagged online outputs to ``into``: ``{(window start, system): {tag:
        {slice label: state}}}`` (a key's states merged)."""
        for o in outputs:
            if o.tag == TAG_CLUSTER:  # one cluster's (impressions, clicks)
                (ws, _we, label, system, cid), pair = o.value
                self.add(into.setdefault((ws, system), {}), {o.tag: {label: {cid: tuple(pair)}}})
                continue
            (ws, _we, label, system), state = o.value
            self.add(into.setdefault((ws, system), {}), {o.tag: {label: state}})

    @staticmethod
    def is_online(o) -> bool:
        return isinstance(o, pvalue.TaggedOutput) and o.tag in STREAM_TAGS

    # -- rows ----------------------------------------------------------------------------------
    def rows(self, by_tag: dict, start, end, system, level: float, out: dict, bounded: str = "logit",
             kind: str = "fixed") -> dict:
        """Add the rows of one window's merged states ``{tag: {label: state}}`` to ``out``
        (``{label: [(metric, value, num_queries, stderr, ci fields)]}``): the batch job's rows and
        intervals (:mod:`streameval.beam.columnar_online`); ``kind="anytime"``: confidence sequences
        from each row's value, count and standard error (:func:`streameval.metrics.rows.with_interval`:
        AUC's from its DeLong variance)."""
        c = self.columns()
        for tag in STREAM_TAGS:
            for label, state in sorted(by_tag.get(tag, {}).items()):
                key = (start, end, label, system)
                for row in self._tag_rows(c, tag, key, state, level, bounded):
                    row = with_interval(row, level, bounded, kind)
                    ci = {f: row[f] for f in CI_FIELDS}
                    out.setdefault(label, []).append((row["metric"], row["value"], row["num_queries"],
                                                      row["stderr"], ci))
        return out

    def _tag_rows(self, c, tag, key, state, level, bounded):
        if tag == TAG_CLUSTER:
            from ..clusters import cluster_sums, clustered_rows

            return list(clustered_rows((key, cluster_sums(state.values())), self.cluster, level, bounded))
        if tag == TAG_AUC:
            pos, neg = CountArrays.counts(state)
            return [metric_row(*key, "auc", *auc_result(pos, neg))]
        if tag == TAG_HIST:
            pos, neg = CountArrays.counts(state)
            return list(hist_rows((key, hist_auc_result(pos, neg))))
        if tag == TAG_CALIBRATION:
            return list(calibration_rows((key, c.calibration_ops.extract(state)), c.calibration))
        if tag == TAG_REQUESTS:
            names = [s.name for s in c.request_specs]
            res = MeanCombineFn(len(names)).extract_output(list(state))
            return [metric_row(*key, name, v, n, se) for name, (v, n, se) in zip(names, res)]
        totals = MeanCombineFn(3, totals=[True] * 3).extract_output(list(state))  # sums of the indicators
        return list(interleaving_rows((key, totals), level))


class StreamBootstrap:
    """``--ci bootstrap`` in the stream's panes: the ranking metrics' states are PoissonBootstrap
    states of ``n_metrics`` metrics (``replicates``, ``seed``: the batch job's), rows with the
    bootstrap percentile interval at ``level``; ``totals`` flags the num_* totals (no interval)."""

    def __init__(self, n_metrics: int, replicates: int, seed: int, level: float, totals):
        self.ops = PoissonBootstrap(n_metrics, replicates, seed)
        self.fn = BootstrapMeanCombineFn(n_metrics, replicates, level, seed, totals)

    def merge(self, states: list):
        return states[0] if len(states) == 1 else self.ops.merge(states)

    def rows(self, names, state) -> list:
        """``[(metric, value, num_queries, stderr, ci fields)]`` of one merged state."""
        # BootstrapMeanCombineFn gives NaN ends and standard errors as None already
        return [(name, f["value"], f["num_queries"], f["stderr"], {k: f[k] for k in CI_FIELDS})
                for name, f in zip(names, self.fn.extract_output(state))]
