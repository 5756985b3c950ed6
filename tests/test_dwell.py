"""Dwell metrics (mean_dwell, sat_click_rate[t=T], long_click_ctr[t=T], last_click_ctr[t=T]).

References: each metric recomputed here with plain Python loops from the records of a seeded
synthetic Avro log (the definitions of docs/metrics.md, "Dwell metrics": per request, then the mean
over requests with ``statistics``), and hand-worked requests with the arithmetic in comments. Both
batch engines must give the same rows, dead letters and counters; files written with the impression
schema before ``dwell_ms`` (version 1) must still be read.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import defaultdict

import fastavro
import numpy as np
import pytest

from streameval.jobs import batch
from streameval.io import arrow_avro, avro, records
from streameval.metrics import online as om
from streameval.metrics.dwell import seconds_text
from streameval.metrics.names import MetricNameError, parse_metrics

BASE_TS = 1_574_553_600_000_000
DWELL = ["mean_dwell", "sat_click_rate", "long_click_ctr", "last_click_ctr"]


def _log(seed: int, n_requests: int = 80) -> list[dict]:
    """Requests of 1-8 impressions, ~10% with clicks not logged, clicks with a dwell (often at the
    30 s boundary) or without one (~15%)."""
    rnd = random.Random(seed)
    recs = []
    for r in range(n_requests):
        system = rnd.choice(["A", "B"])
        logged = rnd.random() > 0.1
        ts0 = BASE_TS + rnd.randint(0, 3_600_000_000)
        for pos in range(1, rnd.randint(1, 8) + 1):
            clicked = (rnd.random() < 0.35) if logged else None
            dwell = None
            if clicked and rnd.random() < 0.85:
                dwell = rnd.choice([0, 9_999, 10_000, 29_999, 30_000, 30_001, rnd.randint(0, 200_000)])
            recs.append({"event_id": f"r{r}/{pos}", "request_id": f"r{r}", "query_id": "q", "user_id": None,
                         "system_id": system, "item_id": f"d{pos}", "position": pos, "score": None,
                         "clicked": clicked, "timestamp": ts0 + pos, "propensity": None,
                         "attributes": {"device": rnd.choice(["pc", "sp"])}, "dwell_ms": dwell})
    return recs


def _indicator(clicks, t_ms):
    """1 with a known dwell >= T, else None (undetermined) with an unknown dwell, else 0."""
    if any(d is not None and d >= t_ms for _, d in clicks):
        return 1.0
    if any(d is None for _, d in clicks):
        return None
    return 0.0


def _reference(recs, t_ms: int):
    """{(system, metric name): (mean, requests, stderr)} and the clicks without a dwell, by loops."""
    reqs = defaultdict(list)
    for r in recs:
        reqs[(r["system_id"], r["request_id"])].append(r)
    values = defaultdict(list)
    no_dwell = 0
    t = seconds_text(t_ms)
    for (system, _), rs in sorted(reqs.items()):
        if all(r["clicked"] is None for r in rs):
            continue  # clicks not logged: not a request of the click metrics
        clicks = [(r["position"], r.get("dwell_ms")) for r in rs if r["clicked"]]
        known = [d for _, d in clicks if d is not None]
        no_dwell += len(clicks) - len(known)
        if known:
            values[(system, "mean_dwell")].append(sum(known) / len(known) / 1000)
            values[(system, f"sat_click_rate[t={t}s]")].append(sum(d >= t_ms for d in known) / len(known))
        long = _indicator(clicks, t_ms)
        last = _indicator([c for c in clicks if c[0] == max(p for p, _ in clicks)], t_ms) if clicks else 0.0
        for name, v in ((f"long_click_ctr[t={t}s]", long), (f"last_click_ctr[t={t}s]", last)):
            if v is not None:
                values[(system, name)].append(v)
    out = {k: (statistics.fmean(v), len(v), statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else None)
           for k, v in values.items()}
    return out, no_dwell


def _write(path, recs, schema=None):
    if schema is None:
        avro.write_records(path, "impression", recs)
    else:
        with open(path, "wb") as f:
            fastavro.writer(f, fastavro.parse_schema(schema), recs)
    return str(path)


def _job(out, paths, metrics, engine, *extra):
    argv = [*(a for p in paths for a in ("--impressions", p)), "--metrics", metrics, "--output", str(out),
            "--quiet", "--engine", engine, "--max-rejected-fraction", "1", *extra]
    code = batch.main(argv)
    res = {"code": code}
    if code == 0:
        for f in ("metrics.jsonl", "dead_letters.jsonl"):
            lines = (out / f).read_text().splitlines() if (out / f).exists() else []
            res[f] = sorted(json.dumps(json.loads(x), sort_keys=True) for x in lines)
        res["counters"] = json.loads((out / "summary.json").read_text())["counters"]
    return res


def _rows(res, slice_="all"):
    out = {}
    for x in res["metrics.jsonl"]:
        d = json.loads(x)
        if d["slice"] == slice_:
            out[(d["system"], d["metric"])] = (d["value"], d["num_queries"], d["stderr"])
    return out


ENGINES = ["records", "columnar"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("t_ms", [30_000, 10_000])
def test_dwell_metrics_equal_loops_over_the_raw_file(tmp_path, engine, t_ms):
    recs = _log(7)
    path = _write(tmp_path / "imps.avro", recs)
    t = seconds_text(t_ms)
    names = ",".join(DWELL[:1] + [f"{m}[t={t}s]" for m in DWELL[1:]])
    res = _job(tmp_path / "out", [path], names + ",clicks", engine)
    assert res["code"] == 0
    want, no_dwell = _reference(recs, t_ms)
    got = _rows(res)
    assert len(want) == 8  # 4 metrics x 2 systems
    for key, (value, n, se) in want.items():
        gv, gn, gse = got[key]
        assert gn == n, key
        assert gv == pytest.approx(value, rel=1e-12, abs=1e-15), key
        assert gse == pytest.approx(se, rel=1e-9), key
    assert res["counters"]["online:clicks_no_dwell"] == no_dwell > 0
    # the threshold matters: 10 s and 30 s give different satisfied-click rates on this log
    if t_ms == 10_000:
        other, _ = _reference(recs, 30_000)
        assert other[("A", "sat_click_rate[t=30s]")][0] != want[("A", "sat_click_rate[t=10s]")][0]


def test_hand_worked_requests():
    # request 0: clicks at positions 1 (40 s) and 3 (5 s); request 1: one click without dwell;
    # request 2: clicks at 2 (30 s exactly) and 4 (unknown); request 3: no click
    specs = om.parse_online_metrics("mean_dwell,sat_click_rate,long_click_ctr,last_click_ctr,last_click_ctr[t=5s]")
    nan = math.nan
    got = om.click_request_terms(specs, [0, 0, 1, 2, 2], [1, 3, 2, 2, 4], 4,
                                 [40_000, 5_000, nan, 30_000, nan])
    want = [
        [(40 + 5) / 2, nan, 30.0, nan],  # mean dwell (s) over known dwells; none known -> left out
        [1 / 2, nan, 1 / 1, nan],  # sat clicks (>= 30 s) / known: 40 s yes, 5 s no; 30 s counts (>=)
        [1.0, nan, 1.0, 0.0],  # a long click: r0 yes; r1 undetermined; r2 30 s; no click -> 0
        [0.0, nan, nan, 0.0],  # last click: r0 pos 3 (5 s < 30 s) -> 0; r2 pos 4 unknown -> left out
        [1.0, nan, nan, 0.0],  # with T = 5 s, r0's last click (5 s) is long
    ]
    np.testing.assert_array_equal(got, np.array(want))


def test_threshold_names():
    assert [s.name for s in om.parse_online_metrics(
        "mean_dwell,sat_click_rate,sat_click_rate[t=10s],long_click_ctr[t=1.5s],last_click_ctr[500ms],"
        "Long_CTR[t=45]")] == ["mean_dwell", "sat_click_rate[t=30s]", "sat_click_rate[t=10s]",
                               "long_click_ctr[t=1.5s]", "last_click_ctr[t=0.5s]", "long_click_ctr[t=45s]"]
    assert om.parse_online_metric("sat_click_rate[t=0.25s]").threshold_ms == 250
    for bad in ("sat_click_rate[t=0s]", "sat_click_rate[t=-3s]", "long_click_ctr[t=0.0001s]", "last_click_ctr[x]",
                "sat_click_rate[t=30min]"):
        with pytest.raises(MetricNameError, match="bad dwell threshold"):
            om.parse_online_metric(bad)


def test_schema_evolution_version_1_files_are_read(tmp_path):
    js = avro.load_schema_json("impression")
    assert js["streameval_schema_version"] == 2
    v1 = dict(js, streameval_schema_version=1, fields=[f for f in js["fields"] if f["name"] != "dwell_ms"])
    recs = _log(3, 30)
    old = [{k: v for k, v in r.items() if k != "dwell_ms"} for r in recs]
    p1 = _write(tmp_path / "v1.avro", old, v1)
    # fastavro resolves the old writer schema: dwell_ms null
    assert list(avro.read_records(p1, "impression")) == [dict(r, dwell_ms=None) for r in old]
    # DataFusion's fast path takes the version 1 file too, with an all-null dwell_ms column
    tables = list(arrow_avro.read_tables(p1, "impression"))
    assert tables and all(not isinstance(t, list) for t in tables)
    assert tables[0].column("dwell_ms").null_count == tables[0].num_rows
    assert tables[0].drop_columns(["dwell_ms"]).to_pylist()[0]["item_id"] == old[0]["item_id"]
    # a job over an old and a new file: the old file's clicks have no dwell (counted), the new
    # file's give the values
    for r in recs:
        r["request_id"] = "new-" + r["request_id"]
        r["event_id"] = "new-" + r["event_id"]
    p2 = _write(tmp_path / "v2.avro", recs)
    for engine in ENGINES:
        res = _job(tmp_path / f"out-{engine}", [p1, p2], "mean_dwell,long_click_ctr", engine)
        assert res["code"] == 0 and not res["dead_letters.jsonl"]
        want, no_dwell = _reference(old + recs, 30_000)
        old_clicks = sum(1 for r in old if r["clicked"])
        assert res["counters"]["online:clicks_no_dwell"] == no_dwell > old_clicks > 0
        got = _rows(res)
        for key in (("A", "mean_dwell"), ("B", "long_click_ctr[t=30s]")):
            assert got[key][0] == pytest.approx(want[key][0], rel=1e-12) and got[key][1] == want[key][1]


def test_bad_dwell_is_a_dead_letter_with_its_reason(tmp_path):
    base = {"event_id": "e", "request_id": "r", "query_id": "q", "user_id": None, "system_id": "A", "item_id": "d",
            "position": 1, "score": None, "clicked": True, "timestamp": BASE_TS, "propensity": None,
            "attributes": {}}
    assert records.check_impression(dict(base, dwell_ms=-1)) == "dwell_ms must be >= 0 milliseconds, got -1"
    assert records.check_impression(dict(base, dwell_ms=5, clicked=False)) == \
        "dwell_ms 5 on an impression that was not clicked (clicked False)"
    assert records.check_impression(dict(base, dwell_ms=5, clicked=None)).startswith("dwell_ms 5 on an impression")
    assert records.check_impression(dict(base, dwell_ms=2.5)) == \
        "dwell_ms must be an integer (milliseconds) or null, got float 2.5"
    assert records.check_impression(dict(base, dwell_ms=0)) is None
    assert records.check_impression(dict(base, dwell_ms=None, clicked=False)) is None
    recs = [dict(base, event_id="e1", item_id="d1", dwell_ms=-1),  # the reason of -1: not a null
            dict(base, event_id="e2", item_id="d2", position=2, dwell_ms=-40_000),
            dict(base, event_id="e3", item_id="d3", position=3, clicked=False, dwell_ms=7),
            dict(base, event_id="e4", item_id="d4", position=4, dwell_ms=45_000)]
    path = _write(tmp_path / "bad.avro", recs)
    got = {}
    for engine in ENGINES:
        res = _job(tmp_path / f"out-{engine}", [path], "mean_dwell", engine)
        assert res["code"] == 0
        letters = [json.loads(x) for x in res["dead_letters.jsonl"]]
        assert sorted(d["reason"] for d in letters) == [
            "dwell_ms 7 on an impression that was not clicked (clicked False)",
            "dwell_ms must be >= 0 milliseconds, got -1", "dwell_ms must be >= 0 milliseconds, got -40000"]
        assert _rows(res)[("A", "mean_dwell")][:2] == (45.0, 1)  # the one valid click: 45 s
        got[engine] = res
    assert got["records"]["metrics.jsonl"] == got["columnar"]["metrics.jsonl"]
    assert got["records"]["dead_letters.jsonl"] == got["columnar"]["dead_letters.jsonl"]


@pytest.mark.parametrize("extra", [[], ["--avro-decoder", "fastavro", "--slices", "device", "--window", "1h"]])
def test_both_engines_give_the_same_rows(tmp_path, extra):
    recs = _log(11, 150)
    recs += [dict(recs[0], event_id="dup")]  # an item served twice: the cleaning rules' dead letter
    path = _write(tmp_path / "imps.avro", recs)
    names = "mean_dwell,sat_click_rate,long_click_ctr[t=10s],last_click_ctr[t=0.5s],rr_first_click,abandonment"
    rec = _job(tmp_path / "rec", [path], names, "records", *extra)
    col = _job(tmp_path / "col", [path], names, "columnar", *extra)
    assert rec["code"] == col["code"] == 0
    assert rec["metrics.jsonl"] and col["metrics.jsonl"] == rec["metrics.jsonl"]  # to the bit
    assert col["dead_letters.jsonl"] == rec["dead_letters.jsonl"]
    nonzero = lambda c: {k: v for k, v in c.items() if v}  # noqa: E731
    assert nonzero(col["counters"]) == nonzero(rec["counters"])


def test_ranking_evaluation_refuses_them_in_one_line():
    for name in ("mean_dwell", "sat_click_rate[t=5s]", "last_click_ctr"):
        with pytest.raises(MetricNameError) as info:
            parse_metrics([name], arithmetic="the Beam jobs")
        msg = str(info.value)
        assert "\n" not in msg and "dwell metric" in msg and "ranking evaluation does not" in msg


def test_the_streams_per_event_engine_refuses_them_in_one_line(tmp_path, capsys):
    from streameval.jobs import stream

    path = _write(tmp_path / "imps.avro", _log(1, 5))
    code = stream.main(["--replay", "--impressions", path, "--metrics", "mean_dwell,sat_click_rate[t=10s]",
                        "--window", "1h", "--engine", "events", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert "mean_dwell, sat_click_rate[t=10s]" in err and "--engine events" in err


def test_table_converter_reads_dwell_ms(tmp_path):
    from streameval.io.convert_table import convert_table

    csv = tmp_path / "t.csv"
    csv.write_text("event_id,request_id,query_id,system_id,item_id,position,clicked,timestamp,dwell_ms\n"
                   "e1,r1,q,A,d1,1,1,1574553600,45000\n"
                   "e2,r1,q,A,d2,2,0,1574553601,\n"
                   "e3,r1,q,A,d3,3,1,1574553602,-5\n"
                   "e4,r1,q,A,d4,4,0,1574553603,7\n"
                   "e5,r1,q,A,d5,5,1,1574553604,\n")
    conv = convert_table(csv, "impressions", tmp_path / "t.avro", timestamp_unit="s")
    assert conv.written == 3
    assert [d["reason"] for d in conv.dead_letters] == [
        "dwell_ms must be >= 0 milliseconds, got -5", "dwell_ms 7 on an impression that was not clicked (clicked False)"]
    assert [(r["event_id"], r["dwell_ms"]) for r in avro.read_records(tmp_path / "t.avro", "impression")] == \
        [("e1", 45_000), ("e2", None), ("e5", None)]
