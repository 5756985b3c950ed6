"""The replay source on runners that play its TestStream themselves (issue 37: the stream job on
Flink). Flink's runner decodes a TestStream's events with the stream's coder in Java: the events are
length-prefixed bytes (Beam's standard coders) that a Python step unpickles, where a Python-only coder failed
the job ("UnknownCoderWrapper was used to perform an actual decoding in the Java SDK"); and it cannot
advance processing time, which the failure line says how to avoid. The run on Flink itself is the
engine tier's (tests/test_engines.py -k stream_replay_on_flink)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.portability import common_urns
from apache_beam.testing.test_stream import TestStream  # noqa: F401  (the transform the proto names)

from streameval.beam.streaming.replay import Replay
from streameval.jobs import stream


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


def test_a_replay_refused_by_flink_for_its_pace_says_what_to_do():
    class Args:
        replay = True

    reason = ("Pipeline streameval-1 failed in state FAILED: java.lang.UnsupportedOperationException: Advancing "
              "Processing time is not supported by the Flink Runner.")
    assert stream.replay_hint(reason, Args()).startswith(" (--replay advances processing time by --replay-pace")
    assert "--replay-pace 0" in stream.replay_hint(reason, Args())
    assert stream.replay_hint("java.lang.RuntimeException: other", Args()) == ""
