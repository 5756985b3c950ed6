"""The configuration every streaming stage shares (:class:`_Config`). Durations and window
specifications are :mod:`streameval.plan.windows`' (re-exported here: their former home).

All times are integer microseconds since the epoch (durations: microseconds), except
``_Config.early_seconds`` (seconds of processing time).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...plan.windows import WindowSpec, parse_duration  # noqa: F401 (re-exported: their former home)

# --------------------------------------------------------------------------------------------
# the configuration of the stages

@dataclass
class _Config:
    spec: WindowSpec
    lateness: int
    delay: int
    retention: int
    early_seconds: float | None
    early_count: int | None
    ranking: bool
    ctr: bool
    specs: list
    options: object
    ops: object
    slice_specs: list
    attr_keys: list
    shards: int
    clock: object
    cleanup: int = 1
    run: str = ""
    policy: str = "latest"
    ci_level: float = 0.95
    intervals: str = "fixed"
    click_events: bool = False
    bounded: str = "logit"
    timer_per_deadline: bool = False

    """The settings of one :class:`~streameval.beam.streaming.StreamMetrics`, shared by its stages.

    ``spec``: the windows; ``lateness``, ``delay`` (click attribution), ``retention`` (how long a
    final request is remembered) and ``cleanup`` (the step in which state is freed): microseconds;
    ``early_seconds`` (processing-time seconds) and ``early_count`` (request updates): early
    panes, or None; ``ranking`` / ``ctr``: which metrics; ``specs``, ``options``, ``ops``: the
    ranking metrics as :class:`~streameval.beam.transforms.ScoreRankings` prepares them;
    ``slice_specs`` / ``attr_keys``: the slices and the attributes they read; ``shards``: keyed
    states of requests; ``clock``: processing-time source (None: wall time); ``run``: the id
    under which counts are tallied; ``policy``: the
    judgment conflict policy; ``ci_level``: the level of the rows' intervals; ``intervals``:
    ``"fixed"`` (t / Wilson) or ``"anytime"`` (confidence sequences); ``bounded``: ``"logit"`` or
    ``"t"``, the fixed interval of a metric in [0, 1] whose t interval leaves it
    (:func:`~streameval.metrics.stats.row_interval`); ``click_events``: whether
    clicks come as separate events (then an impression's null ``clicked`` is "not clicked unless
    a click matches": :func:`streameval.io.records.impression_clicked`); ``timer_per_deadline``:
    an event-time timer per pending deadline instead of one per key (:func:`.common.arm`).
    """

    def round_up(self, t: int) -> int:
        """``t`` rounded up to the cleanup step (state is freed in steps, not at every window)."""
        g = self.cleanup
        return -((-t) // g) * g

    def expiry(self, k: int) -> int:
        """When sub-window k stops accepting data: the end of the first window holding it plus the
        allowed lateness (= the sub-window's end + lateness: after that a window containing it is
        final and must not change)."""
        return (k + 1) * self.spec.period + self.lateness
