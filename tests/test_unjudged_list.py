"""``unjudged.jsonl`` lists what a judge can act on (issue 41, item 5).

It listed every request whose query has no judgment, so the demo's 60,000 Open Bandit requests
(click logs beside a judged LETOR run) filled 6.1 MB. Now a request is listed when its system has at
least one judged request; the requests of a system none of whose requests is judged are counted
(``requests_unjudged_unlisted``) and named in the report line, not listed. Both engines.

The log is made here: system A serves judged queries q1 and q2 and the unjudged query q3 (one
request each), system B serves q1 and two requests of the unjudged q4, and the CTR-only system Z
serves five queries no judgment covers.
"""

from __future__ import annotations

import json

import pytest

from streameval.io import avro
from streameval.jobs import batch

T0 = 1_700_000_000_000_000


def _log(tmp_path):
    imps = []
    requests = [("A", "q1", "a1"), ("A", "q2", "a2"), ("A", "q3", "a3"), ("B", "q1", "b1"), ("B", "q4", "b2"),
                ("B", "q4", "b3")] + [("Z", f"z{i}", f"z{i}") for i in range(5)]
    for n, (system, query, request) in enumerate(requests):
        for pos, item in enumerate(("d1", "d2", "d3"), 1):
            imps.append({"event_id": f"{request}/{pos}", "request_id": request, "query_id": query,
                         "system_id": system, "item_id": item, "position": pos, "score": float(4 - pos),
                         "clicked": pos == 1, "timestamp": T0 + n * 1000 + pos})
    judgments = [{"query_id": q, "item_id": i, "grade": g, "timestamp": T0, "source": "t"}
                 for q in ("q1", "q2") for i, g in (("d1", 1), ("d2", 0))]
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judgments)
    return ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro")]


@pytest.mark.parametrize("engine", ["columnar", "records"])
def test_requests_of_systems_without_any_judged_request_are_counted_not_listed(tmp_path, capsys, engine):
    out = tmp_path / "out"
    code = batch.main([*_log(tmp_path), "--metrics", "ndcg@10,P@5", "--engine", engine, "--output", str(out)])
    assert code == 0
    listed = sorted((r["system"], r["query_id"], r["request_id"])
                    for r in map(json.loads, (out / "unjudged.jsonl").read_text().splitlines()))
    assert listed == [("A", "q3", "a3"), ("B", "q4", "b2"), ("B", "q4", "b3")]
    counters = json.loads((out / "summary.json").read_text())["counters"]
    assert counters["requests_scored"] == 3
    assert counters["requests_unjudged"] == 8
    assert counters["requests_unjudged_unlisted"] == 5
    assert ("requests: scored 3, without judgments 8 (3 in unjudged.jsonl; 5 of systems without any judged "
            "request, not listed)") in capsys.readouterr().out


def test_every_system_judged_lists_every_unjudged_request(tmp_path, capsys):
    """With only ``all_trec`` asked (row names that are not the name asked), A and B still count as
    judged: their unjudged requests are listed, and the report line says only where they are."""
    out = tmp_path / "out"
    args = _log(tmp_path)
    recs = [r for r in avro.read_records(tmp_path / "imps.avro", "impression") if r["system_id"] != "Z"]
    avro.write_records(tmp_path / "imps.avro", "impression", recs)
    assert batch.main([*args, "--metrics", "all_trec", "--output", str(out)]) == 0
    assert len((out / "unjudged.jsonl").read_text().splitlines()) == 3
    counters = json.loads((out / "summary.json").read_text())["counters"]
    assert counters["requests_unjudged"] == 3 and counters.get("requests_unjudged_unlisted", 0) == 0
    assert "without judgments 3 (unjudged.jsonl)" in capsys.readouterr().out
