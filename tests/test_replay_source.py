"""The replay's two sources (issue 37 item 2).

* :class:`~streameval.beam.streaming.replay_source.ReplayEvents`, ``--replay`` on Prism, Flink and
  every runner but Beam's local one: a splittable DoFn that reads the logs on a worker and plays them
  step by step, moving the watermark itself. Here: its plan against :meth:`Replay.from_records` (the
  same elements in the same steps), its steps driven by hand (one step per call, the watermark at each
  step's end, the rest deferred by the pace, a resumed replay playing no step twice), and the whole
  source on Beam's FnApiRunner (which runs splittable DoFns with their checkpoints). The stream job
  with it on Prism and Flink is the engine tier's (tests/test_engines.py -k stream_replay).
* :class:`~streameval.beam.streaming.replay.Replay`, a ``TestStream`` for the local runner (which runs
  no splittable DoFn) and for tests: its events are length-prefixed bytes (Beam's standard coders),
  which a runner that plays a TestStream itself can decode (Flink in Java: a Python-only coder failed
  there, "UnknownCoderWrapper was used to perform an actual decoding in the Java SDK")."""

from __future__ import annotations

import json
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.portability import common_urns
from apache_beam.testing.test_stream import TestStream  # noqa: F401  (the transform the proto names)
from apache_beam.utils.timestamp import Timestamp

from streameval.beam.streaming.replay import Replay
from streameval.beam.streaming.replay_source import ReplayConfig, ReplayEvents, _ReplayFn, replay_plan
from streameval.beam.streaming.watch_source import EventTimeWatermark, WatchState, WatchTracker
from streameval.io import avro

BASE = 1_700_000_000_000_000
HOUR = 3_600_000_000


def _proto():
    opts = PipelineOptions([])
    opts.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(options=opts)
    recs = [{"request_id": "r1", "timestamp": 1_000_000}]
    out = p | Replay.from_records(impressions={"a.avro": recs}, step="1h", pace=1.0)
    out["impressions"] | beam.Map(len)
    return p.to_runner_api()


def test_the_replay_teststream_carries_its_events_with_a_standard_coder():
    proto = _proto()
    urn = common_urns.primitives.TEST_STREAM.urn
    streams = [t for t in proto.components.transforms.values() if t.spec.urn == urn]
    assert len(streams) == 1
    from apache_beam.portability.api import beam_runner_api_pb2

    payload = beam_runner_api_pb2.TestStreamPayload.FromString(streams[0].spec.payload)
    coders = proto.components.coders
    # length-prefixed bytes: Prism 2.62 reads a bytes event so (with the bare bytes coder its first
    # event failed to unpickle: truncated)
    event_coder = coders[payload.coder_id]
    assert event_coder.spec.urn == common_urns.coders.LENGTH_PREFIX.urn
    assert [coders[c].spec.urn for c in event_coder.component_coder_ids] == [common_urns.coders.BYTES.urn]
    (pcoll,) = streams[0].outputs.values()
    # and the collection it makes (the next step, in Python, decoded it with the Python coder)
    assert coders[proto.components.pcollections[pcoll].coder_id].spec.urn == common_urns.coders.BYTES.urn
    # every event an element of bytes; the watermark and processing-time steps as the replay asks
    kinds = [e.WhichOneof("event") for e in payload.events]
    assert kinds.count("element_event") == 1 and "processing_time_event" in kinds


def _imp(i: int, t, req: str = "r"):
    return {"event_id": f"{req}-{i}", "request_id": f"{req}-{i}", "query_id": "q1", "user_id": None, "system_id": "A",
            "item_id": f"d{i}", "position": 1, "score": 1.0, "clicked": None, "timestamp": t, "propensity": None,
            "attributes": {}, "dwell_ms": None}


def _readable(path, kind="impression"):
    """The records of ``path`` before any damage."""
    recs = []
    try:
        for block in avro.read_blocks(path, kind):
            recs.extend(block)
    except avro.AvroInputError:
        pass
    return recs


def _logs(d):
    """Two impression files out of time order (one with a record of no usable time), a judgment file
    without timestamps, a damaged impression file; ``{kind: {path: records}}`` as they read."""
    d.mkdir(parents=True, exist_ok=True)
    late = [_imp(i, BASE + (3 - i % 3) * HOUR + i, "late") for i in range(7)]
    # the last record's time is past the year 9999: no usable time
    early = [_imp(i, BASE + (i % 2) * HOUR + 5 - i, "early") for i in range(6)] + [_imp(99, 2 ** 62, "untimed")]
    judg = [{"query_id": "q1", "item_id": f"d{i}", "grade": i % 3, "timestamp": None, "source": "t"} for i in range(4)]
    avro.write_records(d / "b.avro", "impression", late)
    avro.write_records(d / "a.avro", "impression", early)
    avro.write_records(d / "j.avro", "judgment", judg)
    whole = d / "whole.avro"
    avro.write_records(whole, "impression", [_imp(i, BASE + 2 * HOUR + i, "cut") for i in range(300)],
                       sync_interval=2000)
    data = whole.read_bytes()
    (d / "c-cut.avro").write_bytes(data[: len(data) * 2 // 3])
    whole.unlink()
    imps = {str(d / n): _readable(d / n) for n in ("a.avro", "b.avro", "c-cut.avro")}
    assert 0 < len(imps[str(d / "c-cut.avro")]) < 300
    return {"impressions": imps, "judgments": {str(d / "j.avro"): _readable(d / "j.avro", "judgment")}}


def _config(d, pace=1.0, chunk=1000):
    return ReplayConfig({"impressions": [str(d / n) for n in ("a.avro", "b.avro", "c-cut.avro")],
                         "judgments": [str(d / "j.avro")]}, HOUR, pace, chunk)


def test_the_plan_plays_what_the_local_runners_replay_plays(tmp_path):
    """The steps of the source's plan, written as Replay.from_records writes its TestStream's steps
    (elements per step, kind and file; then the watermark at the step's end): equal to the local
    runner's replay of the same records, and one dead letter for the damaged file."""
    d = tmp_path / "logs"
    files = _logs(d)
    plan = replay_plan(_config(d))
    steps = []
    for s, parts in plan.steps:
        steps += [(kind, (path, recs)) for kind, path, recs in parts]
        steps += [("watermark", (s + 1) * HOUR), ("advance", 1.0)]
    ref = Replay.from_records(files["impressions"], files["judgments"], step="1h", pace=1.0).steps
    assert steps == ref
    assert sum(len(recs) for kind, x in steps if kind == "impressions" for recs in [x[1]]) == 14 + len(
        files["impressions"][str(d / "c-cut.avro")])
    assert steps[0][0] == "judgments"  # judgments (no timestamp) and the untimed impression: step 0 first
    assert [letter["source"] for letter in plan.unreadable] == [str(d / "c-cut.avro")]
    n_cut = len(files["impressions"][str(d / "c-cut.avro")])
    assert "(impressions)" in plan.unreadable[0]["reason"]
    assert json.loads(plan.unreadable[0]["raw"])["records_read"] == n_cut


def _call(fn, cfg, tracker, wm):
    """One call of the DoFn as the runner makes it: its outputs (tag, value), the deferral if any, and
    the tracker of the rest (after the runner's checkpoint) or None when the replay ended."""
    deferred = []
    tracker.defer_remainder = lambda delay: deferred.append(delay)
    out = [(x.tag, x.value.value if hasattr(x.value, "value") else x.value, getattr(x.value, "timestamp", None))
           for x in fn.process(cfg, tracker=tracker, watermark=wm)]
    if deferred:
        primary, residual = tracker.try_split(0)
        tracker.check_done()
        # the rest is due a pace after the step (a runner that resumed it earlier would see it wait:
        # tests/test_watch_source.py); this runner waited the deferral
        assert 0 < residual.due - time.time() <= cfg.pace
        return out, deferred, WatchTracker(residual._replace(due=None))
    tracker.check_done()
    return out, deferred, None


def test_one_step_per_call_the_watermark_at_its_end_and_a_resumed_replay_plays_no_step_twice(tmp_path):
    d = tmp_path / "logs"
    files = _logs(d)
    cfg = _config(d, pace=2.5, chunk=4)
    plan = replay_plan(cfg)
    tracker, wm = WatchTracker(WatchState()), EventTimeWatermark(None)
    played, calls, fn = [], 0, _ReplayFn()
    while tracker is not None:
        fn = _ReplayFn() if calls % 2 == 0 else fn  # every other call in another process (its own plan)
        out, deferred, tracker = _call(fn, cfg, tracker, wm)
        s, parts = plan.steps[calls]
        calls += 1
        letters = [v for tag, v, _ in out if tag == "unreadable"]
        assert len(letters) == (1 if calls == 1 else 0)
        elements = [(tag, v, ts) for tag, v, ts in out if tag != "unreadable"]
        assert all(len(v[1]) <= 4 for _, v, _ in elements)
        # each element stamped with its earliest usable time (0 when none), never before the watermark
        # of the step before
        for _, (path, recs), ts in elements:
            times = [r["timestamp"] for r in recs if r.get("timestamp") not in (None, 2 ** 62)]
            assert ts == Timestamp(micros=min(times, default=0))
        played += [(tag, v) for tag, v, _ in elements]
        assert wm.current_watermark() == Timestamp(micros=(s + 1) * HOUR)
        assert [x.micros for x in deferred] == ([] if tracker is None else [2_500_000])
    assert calls == len(plan.steps) >= 4
    got = {}
    for tag, (path, recs) in played:
        got.setdefault(tag, {}).setdefault(path, []).extend(recs)
    # every record once, whatever the step and the process
    for kind in ("impressions", "judgments"):
        for path, recs in files[kind].items():
            key = sorted(r.get("event_id") or r["item_id"] for r in recs)
            assert sorted(r.get("event_id") or r["item_id"] for r in got[kind][path]) == key


def test_without_a_pace_every_step_plays_in_one_call(tmp_path):
    d = tmp_path / "logs"
    files = _logs(d)
    cfg = _config(d, pace=0)
    out, deferred, rest = _call(_ReplayFn(), cfg, WatchTracker(WatchState()), EventTimeWatermark(None))
    assert deferred == [] and rest is None
    n = sum(len(v[1]) for tag, v, _ in out if tag == "impressions")
    assert n == sum(len(r) for r in files["impressions"].values())


def test_the_source_on_the_fn_api_runner_plays_every_record_once(tmp_path):
    d = tmp_path / "logs"
    files = _logs(d)
    seen = tmp_path / "seen.jsonl"
    fn_api = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
    with beam.Pipeline(options=PipelineOptions(["--runner", fn_api])) as p:
        out = p | ReplayEvents(_config(d, pace=0.1, chunk=3))
        flat = ((out["impressions"] | "I" >> beam.Map(lambda x: ("impressions", x)),
                 out["judgments"] | "J" >> beam.Map(lambda x: ("judgments", x)),
                 out["unreadable"] | "U" >> beam.Map(lambda x: ("unreadable", (x["source"], [x]))))
                | beam.Flatten())
        flat | beam.Map(lambda kv, f=str(seen): _append(f, kv))
    got = {}
    for line in seen.read_text().splitlines():
        kind, path, n = json.loads(line)
        got[(kind, path)] = got.get((kind, path), 0) + n
    want = {(k, path): len(recs) for k, by_path in files.items() for path, recs in by_path.items()}
    want[("unreadable", str(d / "c-cut.avro"))] = 1
    assert got == want


def _append(path, kv):
    kind, (src, recs) = kv
    with open(path, "a") as f:
        f.write(json.dumps([kind, src, len(recs)]) + "\n")


def test_bad_configurations(tmp_path):
    with pytest.raises(ValueError, match="unknown kinds"):
        ReplayEvents(ReplayConfig({"views": ["x"]}, HOUR))
    with pytest.raises(ValueError, match="no file to replay"):
        ReplayEvents(ReplayConfig({"impressions": []}, HOUR))
    for bad in (dict(step=0), dict(pace=-1), dict(chunk=0)):
        with pytest.raises(ValueError, match="step must be positive"):
            ReplayEvents(ReplayConfig({"impressions": ["x"]}, **{"step": HOUR, **bad}))
