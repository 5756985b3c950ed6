"""Issue 36, item 4: with clicks as separate events (`streameval stream --clicks`), an impression whose
`clicked` is null (how `convert table` writes a log without a clicked column) is "not clicked unless
a click event matches it", as one whose `clicked` is false; it was left out of CTR instead, so 8
impressions and 1 matching click gave `ctr 1.0` over 1 impression (0.125 over 8 with clicked=false).
Without click events a null `clicked` keeps its documented meaning: clicks not logged, left out of
CTR and counted (docs/metrics.md, "Click metrics").

The log: one request of system `bm25` with 8 items at positions 1-8, served at 00:01; one click event
on the item at position 1 at 00:02 (within the 30 minute attribution delay). By hand: CTR = 1 click /
8 impressions = 0.125, standard error sqrt(0.125 * 0.875 / 8); CTR at position 1: 1/1, at 2-8: 0/1.
"""
import math

import fastavro
import pytest

from streameval import cli
from streameval.io.tables import read_metrics

T0 = 1_732_406_400  # 2024-11-24T00:00:00Z, seconds
CLICK_SCHEMA = {"type": "record", "name": "click", "fields": [
    {"name": "request_id", "type": "string"}, {"name": "item_id", "type": "string"},
    {"name": "timestamp", "type": "long"}, {"name": "system_id", "type": ["null", "string"], "default": None},
    {"name": "event_id", "type": ["null", "string"], "default": None}]}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """{"null": impressions.avro without a clicked column, "false": with clicked 0, "clicks": click events},
    the impressions made by `streameval convert table` from CSV files."""
    d = tmp_path_factory.mktemp("click-events")
    rows = [(f"e{i}", "r1", "q1", "bm25", f"d{i}", i, (T0 + 60) * 1000) for i in range(1, 9)]
    out = {}
    for kind, header, extra in (("null", "eid,rid,qid,ranker,doc,rank,ts", ""), ("false", "eid,rid,qid,ranker,doc,rank,ts,clicked", ",0")):
        csv = d / f"imps_{kind}.csv"
        csv.write_text(header + "\n" + "".join(",".join(map(str, r)) + extra + "\n" for r in rows))
        out[kind] = str(d / f"imps_{kind}.avro")
        assert cli.main(["convert", "table", str(csv), "--kind", "impressions", "--out", out[kind],
                         "--timestamp-unit", "ms", "--map", "event_id=eid,request_id=rid,query_id=qid,system_id=ranker,"
                         "item_id=doc,position=rank,timestamp=ts"]) == 0
    with open(out["null"], "rb") as f:
        assert all(r["clicked"] is None for r in fastavro.reader(f))  # what convert table writes without the column
    out["clicks"] = str(d / "clicks.avro")
    with open(out["clicks"], "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(CLICK_SCHEMA), [
            {"request_id": "r1", "item_id": "d1", "timestamp": (T0 + 120) * 1_000_000, "system_id": "bm25",
             "event_id": "c1"}])
    return out


def _stream(tmp_path, capsys, *argv):
    out = tmp_path / "out"
    rc = cli.main(["stream", "--replay", "--window", "1h", "--quiet", "--output", str(out), *argv])
    std = capsys.readouterr()
    assert rc == 0, std.err
    rows = {(r["slice"], r["metric"]): r for r in read_metrics(str(out), final_only=True)}
    return rows, std.out


@pytest.mark.parametrize("shards", ["16", "0"], ids=["request_shards16", "per_request"])
@pytest.mark.parametrize("clicked", ["null", "false"])
def test_click_events_count_impressions_with_clicked_null_as_not_clicked(logs, tmp_path, capsys, clicked, shards):
    rows, out = _stream(tmp_path, capsys, "--impressions", logs[clicked], "--clicks", logs["clicks"],
                        "--request-shards", shards)
    ctr = rows[("all", "ctr")]
    assert (ctr["value"], ctr["num_queries"]) == (1 / 8, 8)
    assert ctr["stderr"] == pytest.approx(math.sqrt(0.125 * 0.875 / 8), rel=1e-12)
    assert (rows[("all", "ctr@pos1")]["value"], rows[("all", "ctr@pos1")]["num_queries"]) == (1.0, 1)
    for p in range(2, 9):
        assert (rows[("all", f"ctr@pos{p}")]["value"], rows[("all", f"ctr@pos{p}")]["num_queries"]) == (0.0, 1)
    assert "click impressions 8, click impressions not logged 0" in out
    assert "clicks: read 1 = accepted 1" in out


def test_without_click_events_clicked_null_stays_not_logged(logs, tmp_path, capsys):
    """The documented meaning without click events: the 8 impressions are left out of CTR and counted."""
    rows, out = _stream(tmp_path, capsys, "--impressions", logs["null"])
    assert not any(m.startswith("ctr") for _, m in rows)
    assert "click impressions 0, click impressions not logged 8" in out


def test_the_rule():
    from streameval.io.records import impression_clicked

    assert impression_clicked(None, click_events=False) is None
    assert impression_clicked(None, click_events=True) is False
    for events in (False, True):
        assert impression_clicked(True, events) is True and impression_clicked(1, events) is True
        assert impression_clicked(False, events) is False and impression_clicked(0, events) is False
