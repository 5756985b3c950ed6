"""The one builder of dead letters (streameval/io/dead_letters.py), against the dead_letter Avro
schema's fields and the JSON text of records (keys sorted, non-ASCII kept)."""

from streameval.io.avro import load_schema_json
from streameval.io.dead_letters import dead_letter


def test_a_record_becomes_its_json_text_and_text_stays_as_given():
    d = dead_letter("imps.avro:3", {"request_id": "r1", "query_id": "qü", "position": 2}, "position out of range")
    assert d == {"source": "imps.avro:3", "raw": '{"position":2,"query_id":"qü","request_id":"r1"}',
                 "reason": "position out of range"}
    line = '{"not": json'
    assert dead_letter("events.jsonl:7", line, "not JSON")["raw"] == line  # an unreadable line as it was
    fields = [f["name"] for f in load_schema_json("dead_letter")["fields"]]
    assert sorted(d) == sorted(fields)
