"""``--replay`` on the runners other than Beam's local one (Prism, Flink, Dataflow): a splittable DoFn
that reads the recorded logs on a worker and plays them in event-time order, moving the event-time
watermark itself after each step (issue 37 item 2: no data in the pipeline graph, no ``TestStream``).

:class:`ReplayEvents` plays what :meth:`~.replay.Replay.from_records` plays on the local runner: the
records of each ``step`` of event time (judgments, then impressions, then clicks; each file's records
in event-time order, in lists of at most ``chunk`` records ``(path, [record, ...])`` timestamped with
their earliest event time), then the watermark moves to the step's end (rounded down to milliseconds).
Records without a usable event time (and judgments without a timestamp) play at time 0, in the first
step, and the preparation stage makes the former dead letters. Between steps the rest of the replay
is deferred by ``pace`` seconds of processing time (``tracker.defer_remainder``: the runner holds the
replay's state in the residual restriction, and early panes by processing time fire in the pause);
with ``pace`` 0 every step plays in one call. After the last step the source ends, which closes every
window. A damaged file gives the records before the damage and one ``unreadable`` dead letter (in the
first step); a file the environment does not deliver raises, failing the bundle.

The restriction is the watch's (:class:`~.watch_source.WatchState`, its ``polls`` counting the steps
played, claimed twice per step by :class:`~.watch_source.WatchTracker`: no split while a step is under
way), and so is the watermark estimator (:class:`~.watch_source.EventTimeWatermark`). The worker reads
the files when the first step plays and keeps the plan for the later steps of the same replay; a step
resumed in another process reads them again (the files of a replay do not change).

Beam's local runner (``BundleBasedDirectRunner``) runs no splittable DoFn; there ``--replay`` stays on
:class:`~.replay.Replay` (a ``TestStream``).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from .replay import PLAY_ORDER, element_time, replay_steps
from .sources import read_files
from .watch_source import WATCH_KINDS, WatchRestrictions, WatchWatermarks, wait_due

__all__ = ["ReplayConfig", "ReplayPlan", "ReplayEvents", "replay_plan"]


class ReplayConfig(NamedTuple):
    """The replay: ``paths`` ``{kind: [file, ...]}`` (any Beam file system; files, not patterns: the job
    expands its globs first, local files as absolute paths, as workers elsewhere read them); ``step``
    microseconds of event time per step; ``pace`` seconds of processing time between steps (0: no
    pause); ``chunk`` records per output element."""

    paths: dict
    step: int
    pace: float = 1.0
    chunk: int = 1000


class ReplayPlan(NamedTuple):
    """What a replay plays: ``steps`` ``[(step number, [(kind, path, records), ...]), ...]`` in
    event-time order (step number: event time // step), and ``unreadable`` the dead letters of the
    damaged files."""

    steps: list
    unreadable: list


def replay_plan(cfg: ReplayConfig) -> ReplayPlan:
    """Read ``cfg``'s files into a :class:`ReplayPlan` (:func:`~.sources.read_files`, in the order
    given, each once; played in :func:`~.replay.replay_steps`'s order, as the local runner's replay).
    Raises :class:`~streameval.beam.sources.InputUnavailableError` for a file the environment does not
    deliver (a missing file is a usage error of the job, checked before it starts)."""
    files, letters = {}, []
    for kind in PLAY_ORDER:
        if cfg.paths.get(kind):
            files[kind], bad = read_files(list(dict.fromkeys(cfg.paths[kind])), kind)
            letters.extend(bad)
    return ReplayPlan(replay_steps(files, cfg.step), letters)


class _ReplayFn(beam.DoFn):
    """One step per claim (two claims: playing, then played with the watermark moved), then the rest
    deferred by the pace; the plan read once per replay in this process."""

    def __init__(self):
        self._cached = None  # (config, plan)

    def _plan(self, cfg: ReplayConfig) -> ReplayPlan:
        if self._cached is None or self._cached[0] != cfg:
            self._cached = (cfg, replay_plan(cfg))
        return self._cached[1]

    def process(self, cfg: ReplayConfig, tracker=beam.DoFn.RestrictionParam(WatchRestrictions()),
                watermark=beam.DoFn.WatermarkEstimatorParam(WatchWatermarks())):
        plan = self._plan(cfg)
        while True:
            state = tracker.current_restriction()
            wait_due(state, cfg.pace)  # a deferred step resumed early waits for its pace (see wait_due)
            i = state.polls  # steps played
            playing = state._replace(polls=i + 1, reading=True)
            if not tracker.try_claim(playing):
                return
            if i == 0:
                for letter in plan.unreadable:
                    yield pvalue.TaggedOutput("unreadable", letter)
            if i < len(plan.steps):
                s, parts = plan.steps[i]
                for kind, path, recs in parts:
                    for a in range(0, len(recs), cfg.chunk):
                        chunk = recs[a:a + cfg.chunk]
                        yield pvalue.TaggedOutput(kind, TimestampedValue((path, chunk),
                                                                         Timestamp(micros=element_time(chunk))))
                watermark.move_to((s + 1) * cfg.step)
            last = i + 1 >= len(plan.steps)
            due = time.time() + cfg.pace if cfg.pace > 0 and not last else None
            if not tracker.try_claim(playing._replace(reading=False, stop_at=i + 1 if last else None, due=due)):
                return  # not expected: nothing splits a step under way
            if last:
                return
            if cfg.pace > 0:
                tracker.defer_remainder(Duration(seconds=cfg.pace))
                return


def _the_config(_, config: ReplayConfig) -> ReplayConfig:
    return config


class ReplayEvents(beam.PTransform):
    """The replay source (see the module): ``p | ReplayEvents(ReplayConfig(...))`` gives ``{kind:
    PCollection}`` for ``impressions``, ``judgments``, ``clicks`` and ``unreadable``; after it is applied
    ``self.unreadable`` is the dead letters' PCollection. Raises ValueError for an unknown kind, no
    path, or a step, pace or chunk out of range."""

    def __init__(self, config: ReplayConfig, label=None):
        super().__init__(label)
        unknown = set(config.paths) - set(WATCH_KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}: use {WATCH_KINDS}")
        paths = {k: [str(x) for x in v] for k, v in config.paths.items() if v}
        if not paths:
            raise ValueError("no file to replay")
        if not config.step > 0 or config.pace < 0 or config.chunk < 1:
            raise ValueError(f"step must be positive, pace at least 0, chunk at least 1: {config}")
        self.config = config._replace(paths=paths, step=int(config.step), pace=float(config.pace))
        self.unreadable = None

    def expand(self, pbegin):
        out = (pbegin
               | "Impulse" >> beam.Impulse()
               | "Start" >> beam.Map(_the_config, self.config)
               | "Play" >> beam.ParDo(_ReplayFn()).with_outputs(*WATCH_KINDS, "unreadable"))
        self.unreadable = out["unreadable"]
        return {k: out[k] for k in (*WATCH_KINDS, "unreadable")}
