"""The watch source of the runners other than Beam's local one (streameval.beam.streaming.watch_source,
issue 37 item 2): a splittable DoFn that polls, reads each complete file once and sets the event-time
watermark itself.

In-process here: the DoFn's polls driven by hand (the watermark policy, checkpoints, a resumed watch
reading no file twice) and the whole source on Beam's FnApiRunner, which runs splittable DoFns with
their checkpoints (``defer_remainder``), against the records written. On Prism and Flink the stream job
with ``--watch`` is in tests/test_engines.py (marker ``engines``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.timestamp import Timestamp

from streameval.beam.streaming.watch_source import (EventTimeWatermark, WatchConfig, WatchEvents, WatchState,
                                                    WatchStateCoder, WatchTracker, _WatchFn)
from streameval.io import avro

BASE = 1_700_000_000_000_000
HOUR = 3_600_000_000


def _imps(hour: int, n: int = 5, req: str = "r"):
    return [{"event_id": f"{req}{hour}-{i}", "request_id": f"{req}{hour}-{i}", "query_id": "q1", "user_id": None,
             "system_id": "A", "item_id": f"d{i}", "position": 1, "score": 1.0, "clicked": None,
             "timestamp": BASE + hour * HOUR + i, "propensity": None, "attributes": {}, "dwell_ms": None}
            for i in range(n)]


def _write(path, recs, kind="impression"):
    avro.write_records(str(path), kind, recs)
    return str(path)


def _poll(fn, cfg, tracker, wm):
    """One call of the DoFn as the runner makes it: its outputs (kind, records) and whether it deferred."""
    deferred = []
    tracker.defer_remainder = lambda delay: deferred.append(delay)
    out = [(x.tag, x.value.value if hasattr(x.value, "value") else x.value)
           for x in fn.process(cfg, tracker=tracker, watermark=wm)]
    if deferred:  # the runner checkpoints: the rest goes on in a residual restriction
        primary, residual = tracker.try_split(0)
        assert primary.stop_at == primary.polls and residual.stop_at is None
        # due an interval after the poll (test_a_watch_resumed_before_its_time_waits_for_it); this
        # runner waited the deferral
        assert 0 < residual.due - time.time() <= cfg.interval
        tracker.check_done()
        return out, WatchTracker(residual._replace(due=None))
    tracker.check_done()
    return out, None


def test_polls_read_each_complete_file_once_and_the_watermark_follows_the_policy(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    cfg = WatchConfig({"impressions": [str(d / "*.avro")], "judgments": [str(tmp_path / "j" / "*.avro")]},
                      interval=5, delay=HOUR // 2)
    fn = _WatchFn()
    tracker, wm = WatchTracker(WatchState(last_new=time.time())), EventTimeWatermark(None)
    late = _write(d / "b.avro", _imps(3))  # copied first: the newest hour
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert out == [] and wm.current_watermark() is None  # seen once: not complete yet
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert [(k, len(v[1])) for k, v in out] == [("impressions", 5)] and out[0][1][0] == late
    # read, and nothing pending: the watermark is the latest event time read minus the delay (ms)
    assert wm.current_watermark() == Timestamp(micros=(BASE + 3 * HOUR + 4 - HOUR // 2) // 1000 * 1000)
    # an older file and a judgment file arrive; the older file's events are behind the watermark: late,
    # as in any stream; judgments never move the watermark
    (tmp_path / "j").mkdir()
    _write(d / "a.avro", _imps(1))
    _write(tmp_path / "j" / "j.avro", [{"query_id": "q1", "item_id": "d1", "grade": 9, "timestamp": BASE + 9 * HOUR,
                                                   "source": "test"}],
           "judgment")
    before = wm.current_watermark()
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert out == [] and wm.current_watermark() == before  # both pending: held
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert [k for k, _ in out] == ["judgments", "impressions"]  # judgments first
    assert wm.current_watermark() == before  # hour 1 is older; the judgment's time does not count
    # the state survives the checkpoints: files read are not read again, a removed one is forgotten
    state = tracker.current_restriction()
    assert state.polls == 4 and set(state.done) == {late, str(d / "a.avro"), str(tmp_path / "j" / "j.avro")}
    os.remove(late)
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert out == [] and late not in tracker.current_restriction().done
    # the estimator's state (kept by the runner with the checkpoint) gives the same watermark back
    again = EventTimeWatermark(wm.get_estimator_state())
    assert again.current_watermark() == wm.current_watermark() and again.max_event == wm.max_event


def test_files_pending_hold_the_watermark_until_read(tmp_path):
    """A file still being written (its size changed since the last poll) holds the watermark: a copy
    of older events running while newer ones are read is read before the watermark passes it."""
    d = tmp_path / "in"
    d.mkdir()
    cfg = WatchConfig({"impressions": [str(d / "*.avro")]}, interval=1)
    fn, wm = _WatchFn(), EventTimeWatermark(None)
    tracker = WatchTracker(WatchState(last_new=time.time()))
    _write(d / "new.avro", _imps(5))
    _, tracker = _poll(fn, cfg, tracker, wm)
    growing = d / "old.avro"
    growing.write_bytes(b"Obj")  # the start of a copy
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert len(out) == 1 and wm.current_watermark() is None  # new.avro read, old.avro pending: held
    _write(growing, _imps(0))  # the copy finished (another size)
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert out == [] and wm.current_watermark() is None
    out, tracker = _poll(fn, cfg, tracker, wm)
    assert len(out) == 1 and wm.current_watermark() == Timestamp(micros=(BASE + 5 * HOUR + 4) // 1000 * 1000)


def test_idle_stop_ends_the_restriction(tmp_path):
    cfg = WatchConfig({"impressions": [str(tmp_path / "*.avro")]}, interval=1, idle_stop=0.5)
    fn, wm = _WatchFn(), EventTimeWatermark(None)
    tracker = WatchTracker(WatchState(last_new=time.time() - 1.0))  # quiet for a second already
    out, rest = _poll(fn, cfg, tracker, wm)
    assert out == [] and rest is None and tracker.current_restriction().finished


def test_a_watch_resumed_before_its_time_waits_for_it(tmp_path):
    """Beam 2.62's Flink runner resumes a deferred restriction at once once the source's upstream has
    finished (it fires every pending processing-time timer): the watch polled every ~6 ms instead of
    every interval, and each deferral left a state in the TaskManager's heap until it died (7,262 in
    40 s; docs/deploy.md). A restriction resumed before its time now waits for it, then polls; one
    resumed on time (or never deferred) does not wait."""
    cfg = WatchConfig({"impressions": [str(tmp_path / "*.avro")]}, interval=0.4)
    fn, wm = _WatchFn(), EventTimeWatermark(None)
    tracker = WatchTracker(WatchState())
    t0 = time.monotonic()
    out, rest = _poll(fn, cfg, tracker, wm)
    assert time.monotonic() - t0 < 0.2  # the first poll: no wait
    early = rest.current_restriction()._replace(due=time.time() + 0.4)  # resumed at once: due in 0.4 s
    t0 = time.monotonic()
    _, rest = _poll(fn, cfg, WatchTracker(early), wm)
    assert 0.35 <= time.monotonic() - t0 < 1.0 and rest.current_restriction().polls == 2
    late = rest.current_restriction()._replace(due=time.time() - 5)  # resumed after its time: at once
    t0 = time.monotonic()
    _poll(fn, cfg, WatchTracker(late), wm)
    assert time.monotonic() - t0 < 0.2
    # a due far away waits at most one interval
    far = rest.current_restriction()._replace(due=time.time() + 3600)
    t0 = time.monotonic()
    _poll(fn, cfg, WatchTracker(far), wm)
    assert time.monotonic() - t0 < 1.0


def test_tracker_and_coder():
    t = WatchTracker(WatchState(polls=2, done=("a",), sizes=(("b", 10),), last_new=1.5))
    assert not t.try_claim(WatchState(polls=4, reading=True))  # positions go one poll at a time
    assert not t.try_claim(WatchState(polls=3))  # a poll starts reading first
    assert t.try_claim(WatchState(polls=3, done=("a", "b"), reading=True))
    # no split while a poll is under way (a residual would move the watermark past what it has not given)
    assert t.try_split(0) is None and t.try_split(0.5) is None
    with pytest.raises(ValueError, match="in the middle of a poll"):
        t.check_done()
    assert not t.try_claim(WatchState(polls=4, reading=True))
    assert t.try_claim(WatchState(polls=3, done=("a", "b")))
    with pytest.raises(ValueError, match="without a checkpoint or an end"):
        t.check_done()
    primary, residual = t.try_split(0.5)  # a checkpoint whatever the fraction
    assert primary.finished and not residual.finished and t.current_restriction() == primary
    assert t.try_split(0) is None and not t.try_claim(WatchState(polls=4))
    t.check_done()
    assert not t.is_bounded() and t.current_progress().fraction_completed == 1.0
    coder = WatchStateCoder()
    for s in (residual, primary, WatchState(), WatchState(polls=1, reading=True), residual._replace(due=12.5)):
        assert coder.decode(coder.encode(s)) == s
    # a restriction checkpointed before ``due`` was added (six fields) still decodes
    assert coder.decode(b'[3, ["a"], [], 1.5, null, false]') == WatchState(3, ("a",), (), 1.5, None, False, None)
    assert coder.is_deterministic()


class _Append(beam.DoFn):
    """Appends ``[kind, element, timestamp micros]`` as a JSON line to ``path`` (one process here)."""

    def __init__(self, path, kind):
        self.path, self.kind = path, kind

    def process(self, el, ts=beam.DoFn.TimestampParam):
        with open(self.path, "a") as f:
            f.write(json.dumps([self.kind, el, int(ts.micros)]) + "\n")


def _run_source(cfg, out_path, extra_files=None):
    opts = PipelineOptions(["--runner", "apache_beam.runners.portability.fn_api_runner.FnApiRunner"])
    with beam.Pipeline(options=opts) as p:
        out = p | WatchEvents(cfg)
        for k in ("impressions", "judgments", "unreadable"):
            out[k] | f"Write{k}" >> beam.ParDo(_Append(str(out_path), k))
        if extra_files:
            threading.Thread(target=extra_files, daemon=True).start()
    return [json.loads(line) for line in open(out_path)] if os.path.exists(out_path) else []


def test_the_source_on_the_fn_api_runner_reads_every_record_once(tmp_path):
    """The whole source with checkpoints (FnApiRunner runs splittable DoFns): files there at the start,
    one added while it runs, a damaged one (its complete blocks and a dead letter), then the idle stop
    ends the job. Every record once, each list stamped with its earliest event time."""
    d = tmp_path / "in"
    d.mkdir()
    written = {}
    for h in (0, 1):
        written[_write(d / f"h{h}.avro", _imps(h, 40))] = _imps(h, 40)
    good = _imps(7, 3000)
    damaged = str(d / "damaged.avro")
    avro.write_records(damaged, "impression", good, sync_interval=20_000)  # blocks of some 100 records
    data = open(damaged, "rb").read()
    open(damaged, "wb").write(data[:len(data) - 300])  # cut inside its last block

    def later():
        time.sleep(0.8)
        tmp = tmp_path / "h2.avro"
        _write(tmp, _imps(2, 40))
        shutil.move(str(tmp), str(d / "h2.avro"))  # renamed into the folder whole

    written[str(d / "h2.avro")] = _imps(2, 40)
    cfg = WatchConfig({"impressions": [str(d / "*.avro")]}, interval=0.2, idle_stop=2.0, chunk=25)
    got = _run_source(cfg, tmp_path / "got.jsonl", later)
    by_path: dict = {}
    for kind, el, ts in got:
        if kind == "impressions":
            path, recs = el
            assert ts == min(r["timestamp"] for r in recs) // 1000 * 1000 or ts == min(r["timestamp"] for r in recs)
            assert len(recs) <= 25
            by_path.setdefault(path, []).extend(recs)
    for path, recs in written.items():
        assert by_path.pop(path) == recs, path  # each file once, in order
    partial = by_path.pop(damaged)
    assert 0 < len(partial) < len(good) and partial == good[:len(partial)] and not by_path
    letters = [el for kind, el, _ in got if kind == "unreadable"]
    assert len(letters) == 1 and "damaged.avro" in letters[0]["source"] + letters[0]["raw"]


def test_bad_configurations():
    with pytest.raises(ValueError, match="unknown kinds"):
        WatchEvents(WatchConfig({"impression": ["x"]}))
    with pytest.raises(ValueError, match="no pattern"):
        WatchEvents(WatchConfig({"impressions": []}))
    with pytest.raises(ValueError, match="must be positive"):
        WatchEvents(WatchConfig({"impressions": ["x"]}, interval=0))
