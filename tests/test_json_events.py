"""Kafka's and Pub/Sub's JSON impressions read as columns at once
(:func:`streameval.io.json_events.impression_json_table`, used by the columnar stream engine's read
stage) decide every record as the record check decides it on ``json.loads`` of the value (the
reference: :meth:`_ReadImpressionColumns.events_one_by_one`, the per-event engine's rule): the same
dead letters with the same reasons and raw text, the same valid rows with the same values."""

import json
import random

import numpy as np
import pytest
from apache_beam import pvalue

from streameval.beam.columnar_columns import columns_records, thaw
from streameval.beam.columnar_read import _ReadImpressionColumns
from streameval.beam.threads import _collect
from streameval.io.json_events import impression_json_table


def _imp(i, **kw):
    rec = {"event_id": f"e{i}", "request_id": f"r{i // 3}", "query_id": f"q{i % 5}", "user_id": f"u{i % 7}",
           "system_id": "AB"[i % 2], "item_id": f"d{i}", "position": i % 3 + 1, "score": float(i % 10) / 10,
           "clicked": i % 4 == 0, "timestamp": 1_700_000_000_000_000 + i * 1_000_000, "propensity": None,
           "attributes": {"device": "mobile" if i % 2 else "desktop"}, "dwell_ms": None}
    rec.update(kw)
    return rec


def _read(method, values):
    outs, _ = _collect(getattr(_ReadImpressionColumns(4, decoder="datafusion"), method), (values, "kafka:t"))
    dead = sorted((o.value["raw"], o.value["reason"]) for o in outs if isinstance(o, pvalue.TaggedOutput))
    rows = []
    for o in outs:
        if not isinstance(o, pvalue.TaggedOutput):
            shard, frozen = o
            chunk = thaw(frozen)
            rows += [(shard, json.dumps(r, sort_keys=True, default=str))
                     for r in columns_records(chunk, np.arange(chunk["n"]))]
    return dead, sorted(rows)


GOOD = [json.dumps(_imp(i)).encode() for i in range(60)]
TRICKY = {
    "score null, dwell on a click, an attribute only some rows have": [
        json.dumps(_imp(1, score=None, clicked=True, dwell_ms=1200,
                        attributes={"device": "tv", "team": "A"})).encode()],
    "no attributes field; attributes null; a null attribute value": [
        json.dumps({k: v for k, v in _imp(2).items() if k != "attributes"}).encode(),
        json.dumps(_imp(3, attributes=None)).encode(), json.dumps(_imp(4, attributes={"device": None})).encode()],
    "missing and null required fields, empty ids, NUL": [
        json.dumps({k: v for k, v in _imp(5).items() if k != "position"}).encode(),
        json.dumps(_imp(6, request_id=None)).encode(), json.dumps(_imp(7, item_id="")).encode(),
        json.dumps(_imp(8, event_id="a\x00b")).encode()],
    "values out of range": [
        json.dumps(_imp(9, position=0)).encode(), json.dumps(_imp(10, position=2**31)).encode(),
        json.dumps(_imp(11, propensity=1.5)).encode(), json.dumps(_imp(12, score=float("nan"))).encode(),
        json.dumps(_imp(13, dwell_ms=5, clicked=False)).encode(), json.dumps(_imp(14, timestamp=-2**62)).encode()],
    "types Arrow would read otherwise: the block goes value by value": [
        json.dumps(_imp(15, event_id=15)).encode(), json.dumps(_imp(16, clicked=1)).encode()],
    "not JSON, not an object, a blank value": [b"{not json", b"[1, 2]", b""],
    "an escaped lone surrogate, a newline inside a value": [
        json.dumps(_imp(17, item_id="x\ud800")).encode(), json.dumps(_imp(18), indent=1).encode()],
    "an attribute that is a number": [json.dumps(_imp(19, attributes={"n": 3})).encode()],
    "null attribute values spelled otherwise, a key another row lacks": [
        json.dumps(_imp(20, attributes={"team": "B"})).encode(),
        b'{"event_id": "e21", "request_id": "r7", "query_id": "q1", "system_id": "A", "item_id": "d21", '
        b'"position": 1, "timestamp": 1700000000000000, "attributes": {"device" :null}}',
        b'{"event_id": "e22", "request_id": "r7", "query_id": "q1", "system_id": "A", "item_id": "d22", '
        b'"position": 2, "timestamp": 1700000000000000, "attributes": {"\\u0064evice": null}}',
        b'{"event_id": "e23", "request_id": "r7", "query_id": "q1", "system_id": "A", "item_id": "d23", '
        b'"position": 3, "timestamp": 1700000000000000, "attributes": null}'],
}


@pytest.mark.parametrize("case", list(TRICKY))
def test_json_block_decides_as_the_record_check(case):
    values = GOOD[:30] + TRICKY[case] + GOOD[30:]
    random.Random(case).shuffle(values)
    got, ref = _read("events", values), _read("events_one_by_one", values)
    assert got == ref
    assert len(ref[1]) + len(ref[0]) == len(values)  # every value accounted: a row or a dead letter


def test_json_block_is_columns_when_arrow_reads_as_the_check_does():
    """The usual block is read at once (the value-by-value path only for the odd ones)."""
    block = impression_json_table(GOOD + TRICKY["score null, dwell on a click, an attribute only some rows have"])
    assert block is not None and block.table.num_rows == 61
    assert not block.check.any()  # the rows without "team" lack it: no "team": null in their text
    assert impression_json_table(GOOD + [b"{not json"]) is None
    assert impression_json_table(GOOD + TRICKY["types Arrow would read otherwise: the block goes value by value"]) \
        is None
