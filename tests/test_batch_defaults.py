"""Issue 41, item 2: the batch job's defaults keep every record.

A batch job's whole input is on time (Beam's batch semantics): with ``--window`` and no
``--allowed-lateness`` no impression is late data, and every windowed row equals an independent
computation on the raw records grouped by window (pytrec_eval for the ranking metrics over the
requests whose earliest impression lies in the window, scikit-learn's ROC AUC and a direct count of
the clicks over the impressions whose own timestamp does); ``--allowed-lateness 0`` still reproduces
the stream's decision (late data at the end of a request's first window)."""

import json
import math
import random
from collections import defaultdict

import pytest

from streameval.jobs import batch as batch_cli
from streameval.io import avro

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

HOUR = 3_600_000_000
BASE = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z


def _log(seed=7, n_requests=120):
    """Requests of 4 to 6 impressions a few minutes apart, a third of them starting in the last
    minutes of an hour (so they straddle the hour's end), every query judged."""
    rnd = random.Random(seed)
    judg = [{"query_id": f"q{q}", "item_id": f"d{i}", "grade": rnd.randint(0, 3), "timestamp": 0, "source": "t"}
            for q in range(5) for i in range(10)]
    imps = []
    for r in range(n_requests):
        hour = rnd.randrange(4)
        start = BASE + hour * HOUR + (HOUR - rnd.randint(1, 5) * 60_000_000 if r % 3 == 0
                                      else rnd.randint(0, 40) * 60_000_000)
        q = rnd.randrange(5)
        for pos, item in enumerate(rnd.sample(range(10), rnd.randint(4, 6)), 1):
            imps.append({"event_id": f"r{r}/{pos}", "request_id": f"r{r}", "query_id": f"q{q}", "user_id": None,
                         "system_id": "A", "item_id": f"d{item}", "position": pos, "score": rnd.random(),
                         "clicked": rnd.random() < 0.3, "timestamp": start + pos * 90_000_000,
                         "propensity": None, "attributes": {}})
    return imps, judg


def _reference(imps, judg):
    """{(window_start, metric): (value, n)} computed without streameval."""
    import pytrec_eval
    from sklearn.metrics import roc_auc_score

    qrels = defaultdict(dict)
    for j in judg:
        qrels[j["query_id"]][j["item_id"]] = j["grade"]
    requests = defaultdict(list)
    for r in imps:
        requests[r["request_id"]].append(r)
    by_window = defaultdict(list)  # a request: the window of its earliest impression
    for rid, recs in requests.items():
        t0 = min(r["timestamp"] for r in recs)
        by_window[t0 - t0 % HOUR].append(rid)
    out = {}
    for ws, rids in by_window.items():
        run = {rid: {r["item_id"]: r["score"] for r in requests[rid]} for rid in rids}
        rq = {rid: dict(qrels[requests[rid][0]["query_id"]]) for rid in rids}
        per = pytrec_eval.RelevanceEvaluator(rq, {"map", "ndcg_cut.5"}).evaluate(run)
        for metric, key in (("map", "map"), ("ndcg@5", "ndcg_cut_5")):
            out[(ws, metric)] = (sum(per[rid][key] for rid in rids) / len(rids), len(rids))
    imp_window = defaultdict(list)  # clicks and AUC: the window of the impression's own timestamp
    for r in imps:
        imp_window[r["timestamp"] - r["timestamp"] % HOUR].append(r)
    for ws, recs in imp_window.items():
        clicks = [int(r["clicked"]) for r in recs]
        out[(ws, "ctr")] = (sum(clicks) / len(recs), len(recs))
        out[(ws, "auc")] = (roc_auc_score(clicks, [r["score"] for r in recs]), None)
    return out


@pytest.mark.parametrize("engine", ["columnar", "records"])
def test_batch_default_keeps_every_record_of_requests_spanning_windows(tmp_path, engine):
    imps, judg = _log()
    avro.write_records(str(tmp_path / "imps.avro"), "impression", imps)
    avro.write_records(str(tmp_path / "judg.avro"), "judgment", judg)
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "map,ndcg@5,auc", "--labels", "clicks", "--window", "1h", "--engine", engine, "--quiet"]
    out = tmp_path / "default"
    assert batch_cli.main([*common, "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    acc = summary["accounting"]["impression"]
    assert acc["read"] == len(imps) and acc["late"] == 0 and acc["accepted"] == len(imps)
    assert summary["counters"].get("late:impression", 0) == 0
    assert not [d for d in map(json.loads, open(out / "dead_letters.jsonl"))]
    ref = _reference(imps, judg)
    rows = {(r["window_start"], r["metric"]): r for r in map(json.loads, open(out / "metrics.jsonl"))
            if r["slice"] == "all" and r["metric"] in ("map", "ndcg@5", "ctr", "auc")}
    assert set(rows) == set(ref)
    for key, (value, n) in ref.items():
        assert math.isclose(rows[key]["value"], value, rel_tol=1e-12, abs_tol=1e-12), (key, rows[key], value)
        if n is not None:
            assert rows[key]["num_queries"] == n, key
    # every impression counted in CTR: the rows' impression counts add up to the input
    assert sum(n for (_, m), (_, n) in ref.items() if m == "ctr") == len(imps)

    # --allowed-lateness 0 reproduces a stream's decision: the straddling requests' later impressions
    # (at or after the end of their first window) are late data, each accounted for
    late_out = tmp_path / "late0"
    assert batch_cli.main([*common, "--allowed-lateness", "0", "--output", str(late_out)]) == 0
    expected_late = set()
    by_req = defaultdict(list)
    for r in imps:
        by_req[r["request_id"]].append(r)
    for recs in by_req.values():
        t0 = min(r["timestamp"] for r in recs)
        expected_late |= {r["event_id"] for r in recs if r["timestamp"] >= t0 - t0 % HOUR + HOUR}
    assert expected_late  # the log does straddle
    letters = [d for d in map(json.loads, open(late_out / "dead_letters.jsonl"))]
    assert {json.loads(d["raw"])["event_id"] for d in letters if d["source"] == "late:impression"} == expected_late
    acc0 = json.loads((late_out / "summary.json").read_text())["accounting"]["impression"]
    assert acc0["late"] == len(expected_late) and acc0["accepted"] == len(imps) - len(expected_late)


def test_allowed_lateness_values():
    from streameval.beam.keys import parse_lateness

    assert parse_lateness(None) is None and parse_lateness("unlimited") is None
    assert parse_lateness("0") == 0 and parse_lateness("30m") == 30 * 60_000_000
    for bad in ("none", "-1", "soon"):
        with pytest.raises(ValueError):
            parse_lateness(bad)


# --------------------------------------------------------------------------------------------
# issue 41, item 2: a duration without a unit is refused (``--window 1`` meant one second)

UNITLESS = [
    ("batch", ["--window", "1"], "--window"),
    ("batch", ["--window", "3600"], "--window"),
    ("batch", ["--window", "1h", "--every", "10"], "--every"),
    ("batch", ["--window", "1/10m"], "--window"),
    ("batch", ["--window", "1h", "--allowed-lateness", "5"], "--allowed-lateness"),
    ("stream", ["--window", "1"], "--window"),
    ("stream", ["--window", "1h/10"], "--every"),
    ("stream", ["--window", "session:30"], "--sessions"),
    ("stream", ["--sessions", "30"], "--sessions"),
    ("stream", ["--window", "1h", "--allowed-lateness", "5"], "--allowed-lateness"),
    ("stream", ["--window", "1h", "--watch-delay", "30"], "--watch-delay"),
    ("stream", ["--window", "1h", "--replay-step", "60"], "--replay-step"),
    ("stream", ["--window", "1h", "--early-every", "30"], "--early-every"),
    ("stream", ["--window", "1h", "--retention", "2"], "--retention"),
    ("stream", ["--window", "1h", "--attribution-delay", "30"], "--attribution-delay"),
]


@pytest.mark.parametrize("job, argv, option", UNITLESS)
def test_a_duration_without_a_unit_is_refused_in_one_line(tmp_path, capsys, job, argv, option):
    from streameval.jobs import stream as stream_cli

    imps = tmp_path / "imps.avro"
    avro.write_records(str(imps), "impression", _log(n_requests=2)[0])
    main = batch_cli.main if job == "batch" else stream_cli.main
    extra = ["--replay"] if job == "stream" else []
    assert main([*extra, "--impressions", str(imps), "--output", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{option} '" in err and "has no unit" in err
    assert all(form in err for form in ("1s", "30m", "1h", "1d")), err
    assert not (tmp_path / "out").exists()


def test_the_library_refuses_a_duration_without_a_unit():
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.keys import parse_window
    from streameval.beam.streaming import WindowSpec, parse_duration
    from streameval.beam.transforms import CleanImpressions, ClickMetrics

    for make in (lambda: parse_window("1"), lambda: parse_duration("90", "delay"), lambda: WindowSpec.parse("1"),
                 lambda: WindowSpec.parse("1h/10"), lambda: ColumnarMetrics(["x.avro"], [], window="3600"),
                 lambda: CleanImpressions(window="1"), lambda: ClickMetrics(window="1d", every="10")):
        with pytest.raises(ValueError, match="has no unit"):
            make()
    # units (and a Python number of seconds, the library's documented form) are accepted
    assert parse_window("1s") == 1 and parse_window("1d") == 86400 and parse_window(3600) == 3600
    assert parse_duration("0", allow_zero=True) == 0 and WindowSpec.parse("1h/10m").period == 600_000_000
