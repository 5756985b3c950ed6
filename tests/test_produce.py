"""``streameval produce`` without a broker: what each Kafka record carries (JSON value, event time in
milliseconds, key), the order, a full client queue, undelivered records, and the refusals. The
broker itself: ``tests/test_engines.py -k stream_job_reads_kafka`` (marker ``kafka``)."""

import json

import pytest

from streameval.commands import produce as produce_cmd
from streameval.io import avro
from streameval.io.records import to_json_text

from .conftest import REPO

SAMPLE = REPO / "data" / "sample"


class FakeProducer:
    """confluent-kafka's Producer as far as ``produce`` uses it; ``full`` BufferErrors first."""

    def __init__(self, full=0, fail=None):
        self.sent, self.full, self.fail, self.callbacks = [], full, fail, []

    def produce(self, topic, value, key=None, on_delivery=None, timestamp=None):
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        self.sent.append((topic, value, key, timestamp))
        self.callbacks.append(on_delivery)

    def poll(self, _timeout):
        for cb in self.callbacks:
            cb(self.fail, None)
        self.callbacks = []

    def flush(self, _timeout):
        self.poll(0)
        return 0


def test_each_record_is_its_json_keyed_by_request_with_its_event_time():
    recs = list(avro.read_records(str(SAMPLE / "impressions" / "obd_bts_men.avro"), "impression"))[:50]
    fake = FakeProducer(full=3)
    done = produce_cmd.produce("b:1", "t", recs, "impression", producer=fake)
    assert done == {"topic": "t", "produced": 50, "first_timestamp": min(r["timestamp"] for r in recs),
                    "last_timestamp": max(r["timestamp"] for r in recs)}
    assert [json.loads(v) for _, v, _, _ in fake.sent] == [json.loads(to_json_text(r)) for r in recs]
    assert [k.decode() for _, _, k, _ in fake.sent] == [r["request_id"] for r in recs]
    assert [ts for _, _, _, ts in fake.sent] == [r["timestamp"] // 1000 for r in recs]
    judg = list(avro.read_records(str(SAMPLE / "judgments" / "letor_test_labels.avro"), "judgment"))[:5]
    fake = FakeProducer()
    produce_cmd.produce("b:1", "j", judg, "judgment", producer=fake)
    assert [k.decode() for _, _, k, _ in fake.sent] == [r["query_id"] for r in judg]


def test_records_not_delivered_fail_in_one_line():
    recs = list(avro.read_records(str(SAMPLE / "impressions" / "obd_bts_men.avro"), "impression"))[:3]
    with pytest.raises(RuntimeError, match="3 of 3 records not delivered to t: broker down"):
        produce_cmd.produce("b:1", "t", recs, producer=FakeProducer(fail="broker down"))


def test_the_command_sends_in_event_time_order_unless_told_files(monkeypatch, capsys):
    pytest.importorskip("confluent_kafka")
    got = {}

    def fake(bootstrap, topic, records, kind, rate):
        got[topic] = [r["timestamp"] for r in records]
        return {"topic": topic, "produced": len(got[topic])}

    monkeypatch.setattr(produce_cmd, "produce", fake)
    files = [str(SAMPLE / "impressions" / f) for f in ("obd_random_men.avro", "obd_bts_men.avro")]
    assert produce_cmd.main(["--bootstrap-servers", "b:1", "--topic", "time", *files]) == 0
    assert produce_cmd.main(["--bootstrap-servers", "b:1", "--topic", "files", "--order", "files", *files]) == 0
    in_files = [r["timestamp"] for f in files for r in avro.read_records(f, "impression")]
    assert got["time"] == sorted(in_files) and got["files"] == in_files != sorted(in_files)
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"topic": "time", "produced": len(in_files)}


def test_refusals(capsys):
    assert produce_cmd.main(["--bootstrap-servers", "b:1", "--topic", "t", "--rate", "0", "x.avro"]) == 2
    assert "--rate must be a positive number" in capsys.readouterr().err
    assert produce_cmd.main(["--bootstrap-servers", "b:1", "--topic", "t", "--create-topic", "0", "x.avro"]) == 2
    pytest.importorskip("confluent_kafka")
    assert produce_cmd.main(["--bootstrap-servers", "b:1", "--topic", "t", "nothing-here-*.avro"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("streameval produce: ") and "nothing-here-*.avro" in err[1]
