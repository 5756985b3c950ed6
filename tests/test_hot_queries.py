"""Hot queries on the columnar engine (issue 16, docs/scale.md "Hot queries").

A synthetic log where one query has 30 % of the requests (and a second, judged, whose requests all
lack a score, 15 %): with fan-out (``--hot-query-fraction``, the default) its requests are scored in
several sub-elements of its query shard, and the largest score element must be several times
smaller than without (``--hot-query-fraction 0``), while the metric rows, intervals, dead letters,
unjudged requests and counters equal both the run without fan-out and the per-record
engine (``--engine records``, the independent reference: one Beam element per record, no shards).
The local runner is FnApiRunner (the job's default, in process).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from streameval.jobs import batch
from streameval.beam import columnar_hot
from tests.test_columnar import BASE_TS, _conflict_free, write_logs

SHARDS = 8


def _hot_logs(seed: int = 7, requests: int = 1200):
    rnd = random.Random(seed)
    cold = [f"q{i}" for i in range(60)]
    judged = ["hot", "nulls"] + cold[:-8]  # the last 8 cold queries have no judgment
    judg = []
    for q in judged:
        for i in rnd.sample(range(12), 8):
            judg.append({"query_id": q, "item_id": f"d{i}", "grade": rnd.randint(0, 3), "timestamp": rnd.randint(0, 3),
                         "source": "t"})
    judg += [dict(j, grade=j["grade"] + 1, timestamp=j["timestamp"] + 1) for j in rnd.sample(judg, 5)]  # conflicts
    imps = []
    for r in range(requests):
        u = rnd.random()
        q = "hot" if u < 0.30 else "nulls" if u < 0.45 else rnd.choice(cold)
        # the hot query is never served by C: --complete completes (hot, C) in the hot stage
        sys_ = rnd.choice(["A", "B"] if q == "hot" else ["A", "B", "C"])
        attrs = {"device": rnd.choice(["pc", "sp"])} if rnd.random() < 0.9 else {}
        ts0 = BASE_TS + rnd.randint(0, 3 * 3_600_000_000)
        for pos, item in enumerate(rnd.sample(range(12), rnd.randint(1, 6)), 1):
            imps.append({"event_id": f"r{r}/{pos}", "request_id": f"r{r}", "query_id": q, "user_id": None,
                         "system_id": sys_, "item_id": f"d{item}", "position": pos,
                         "score": None if q == "nulls" and pos == 1 else float(rnd.randint(0, 6)) / 2,
                         "clicked": rnd.random() < 0.3, "timestamp": ts0 + pos, "propensity": None,
                         "attributes": dict(attrs)})
    replays = [dict(x) for x in rnd.sample(imps, 20)]
    conflicts = [dict(x, score=(x["score"] or 0) + 1) for x in rnd.sample(imps, 6)]
    bad = [dict(rnd.choice(imps), position=0, event_id="bad1")]
    rnd.shuffle(imps)
    cut = len(imps) // 2
    return [imps[:cut], imps[cut:] + replays + conflicts + bad], judg


def _run(d, args, engine, extra):
    o = d / f"{engine}-{len(extra)}-{abs(hash(tuple(extra))) % 10_000}"
    code = batch.main([*args, "--output", str(o), "--quiet", "--engine", engine, "--max-rejected-fraction", "1",
                       "--shards", str(SHARDS), "--runner", "FnApiRunner", *extra])
    assert code == 0, engine
    res = {}
    for f in ("metrics.jsonl", "dead_letters.jsonl", "unjudged.jsonl", "comparisons.jsonl"):
        lines = (o / f).read_text().splitlines() if (o / f).exists() else []
        res[f] = sorted(json.dumps(json.loads(x), sort_keys=True) for x in lines)
    summary = json.loads((o / "summary.json").read_text())
    res["counters"] = {k: v for k, v in summary["counters"].items() if v}
    res["elements"] = summary.get("elements", {})
    return res


@pytest.mark.parametrize("extra", [
    # windows and slices, bootstrap intervals (hash weights per query, exact sums)
    ["--window", "1h", "--slices", "device", "--ci", "bootstrap", "--replicates", "30", "--ci-seed", "4",
     "--metrics", "ndcg@5,map,P@3,recip_rank,num_ret"],
    # trec_eval -c: the hot query has no request of C, "nulls" no scored request at all (both completed by
    # the hot stage), with bootstrap intervals
    ["--complete", "--slices", "device", "--ci", "bootstrap", "--replicates", "20",
     "--metrics", "map,ndcg@5,P@5,num_rel,num_ret"],
], ids=["windows-bootstrap", "complete-bootstrap"])
def test_fan_out_changes_no_number_and_shrinks_the_largest_score_element(tmp_path, monkeypatch, extra):
    # a hot query needs 100 requests in a request shard by default; this log has about 150 requests per
    # shard, 45 of the hot query's and 22 of "nulls"
    monkeypatch.setattr(columnar_hot, "HOT_MIN_REQUESTS", 10)
    imp_files, judg = _hot_logs()
    args = write_logs(tmp_path, imp_files, judg)
    rec = _run(tmp_path, args, "records", extra)
    plain = _run(tmp_path, args, "columnar", ["--hot-query-fraction", "0", *extra])
    fanned = _run(tmp_path, args, "columnar", extra)  # the default fraction, 0.01
    assert rec["metrics.jsonl"] and rec["unjudged.jsonl"]
    if "--complete" in extra:  # (hot, C) and (nulls, A / B / C) at least
        assert rec["counters"].get("requests_completed", 0) >= 4
    # the hot queries were fanned out: F = ceil(share x 8) is 2 or 3 for the 30 % query
    fan = fanned["elements"].get("hot_query_fanout")
    assert fan and fan["max"] >= 2, fanned["elements"]
    assert "hot_query_fanout" not in plain["elements"]
    for got in (plain, fanned):
        for f in ("metrics.jsonl", "unjudged.jsonl"):
            assert got[f] == rec[f], f
        assert _conflict_free(got["dead_letters.jsonl"]) == _conflict_free(rec["dead_letters.jsonl"])
        assert got["counters"] == rec["counters"]
    # identical to the byte between the two columnar runs (same conflict rule)
    assert fanned["dead_letters.jsonl"] == plain["dead_letters.jsonl"]
    big = plain["elements"]["element_impressions:score"]["max"]
    small = fanned["elements"]["element_impressions:score"]["max"]
    # without fan-out the hot query's shard holds 30 % + about 1/8 of the rest of the impressions; with it
    # the largest element is one of about 8 + F elements
    assert small * 2.5 <= big, (small, big)


def test_fan_out_rule():
    # 1,000 requests: "h" 300 (30 %), "w" 50 (5 %), "c" 5 (0.5 %), the rest single requests
    q = ["h"] * 300 + ["w"] * 50 + ["c"] * 5 + [f"x{i}" for i in range(645)]
    rid = [f"r{i}" for i in range(1000)]
    sub, hot, fans = columnar_hot.fan_out(pa.array(q), pa.array(rid), 16, 0.01, min_requests=20)
    # "h": ceil(0.30 x 16) = 5; "w": ceil(0.05 x 16) = 1, a shard's worth: not split; "c": under 1 %
    assert hot == ["h"] and fans == [5]
    assert set(sub[:300].tolist()) == set(range(5)) and (sub[300:] == -1).all()
    import zlib

    assert sub[:300].tolist() == [zlib.crc32(r.encode()) % 5 for r in rid[:300]]
    # at 64 shards "w" is 3.2 shards' worth: F = 4; at least 100 requests by default: "w" is not
    _, hot, fans = columnar_hot.fan_out(pa.array(q), pa.array(rid), 64, 0.01, min_requests=20)
    assert dict(zip(hot, fans)) == {"h": 20, "w": 4}
    _, hot, _ = columnar_hot.fan_out(pa.array(q), pa.array(rid), 64, 0.01)
    assert hot == ["h"]
    sub, hot, _ = columnar_hot.fan_out(pa.array(q), pa.array(rid), 64, 0.0)
    assert hot == [] and (sub == -1).all()
    assert np.asarray(sub).dtype == np.int64


def test_comparisons_turn_fan_out_off():
    """--compare-baseline keeps a query's requests in one element (columnar_hot's docstring: merging
    the hot stage's comparison states lost states now and then with worker processes)."""
    from streameval.beam.columnar import ColumnarMetrics

    assert ColumnarMetrics(["i.avro"], ["j.avro"], ["map"]).hot_fraction == columnar_hot.HOT_FRACTION
    assert ColumnarMetrics(["i.avro"], ["j.avro"], ["map"], compare_baseline="A").hot_fraction == 0
    assert ColumnarMetrics(["i.avro"], ["j.avro"], ["map"], hot_query_fraction=0.2).hot_fraction == 0.2
    with pytest.raises(ValueError, match="hot_query_fraction"):
        ColumnarMetrics(["i.avro"], ["j.avro"], ["map"], hot_query_fraction=1.5)
