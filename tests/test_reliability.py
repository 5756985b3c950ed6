"""Bad, repeated and conflicting input in the library and the batch job: every record accounted for.

References: a clean run of the same job (a replayed event must change nothing), hand calculations of
the judgment policies, and the record counts the test itself injected.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest

import streameval as se
from streameval.jobs import batch
from streameval import api
from streameval.api import resolve_qrels
from streameval.beam.accounting import account
from streameval.io import avro
from streameval.io.cleaning import REASON_EVENT_CONFLICT, REASON_ITEM_TWICE, clean_request, resolve_judgment

BASE_TS = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z in microseconds


def _logs(seed=3, queries=6, reps=3):
    rnd = random.Random(seed)
    judg = [{"query_id": f"q{q}", "item_id": f"d{i}", "grade": rnd.randint(0, 3), "timestamp": 0, "source": "t"}
            for q in range(queries - 1) for i in range(8)]  # the last query has no judgment
    imps = []
    for q in range(queries):
        for rep in range(reps):
            for sys_ in ("A", "B"):
                req = f"r{q}-{rep}-{sys_}"
                for pos, item in enumerate(rnd.sample(range(10), 6), 1):
                    imps.append({"event_id": f"{req}/{item}", "request_id": req, "query_id": f"q{q}", "user_id": None,
                                 "system_id": sys_, "item_id": f"d{item}", "position": pos,
                                 "score": float(rnd.randint(0, 5)), "clicked": rnd.random() < 0.3,
                                 "timestamp": BASE_TS + rep * 3_600_000_000 + pos, "propensity": None,
                                 "attributes": {"device": rnd.choice(["pc", "sp"])}})
    return imps, judg


def _run(tmp_path, name, imp_files, judg_files, extra=(), metrics="ndcg@5,map,mrr@10,P@5,bpref"):
    """Write the given record lists to Avro, run the batch job: (exit code, rows by key, summary, dead)."""
    d = tmp_path / name
    imp_paths, judg_paths = [], []
    for i, recs in enumerate(imp_files):
        path = d / f"imps-{i}.avro"
        if isinstance(recs, bytes):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(recs)
        else:
            avro.write_records(path, "impression", recs)
        imp_paths += ["--impressions", str(path)]
    for i, recs in enumerate(judg_files):
        path = d / f"judg-{i}.avro"
        avro.write_records(path, "judgment", recs)
        judg_paths += ["--judgments", str(path)]
    out = d / "out"
    code = batch.main([*imp_paths, *judg_paths, "--metrics", metrics, "--window", "1h", "--slices", "device",
                       "--output", str(out), "--quiet", *extra])
    if code not in (0, 1, 3):
        return code, None, None, None
    rows = {(r["window_start"], r["slice"], r["system"], r["metric"]): (r["value"], r["num_queries"], r["stderr"])
            for r in map(json.loads, open(out / "metrics.jsonl"))}
    summary = json.loads((out / "summary.json").read_text())
    dead = [json.loads(line) for line in open(out / "dead_letters.jsonl")]
    return code, rows, summary, dead


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        for x, y in zip(a[k], b[k]):
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (k, a[k], b[k])


# --------------------------------------------------------------------------------------------
# the rules (pure functions)

def test_clean_request_rules_do_not_depend_on_order():
    base = {"request_id": "r", "system_id": "A", "query_id": "q", "timestamp": 10, "score": 1.0, "clicked": False}
    a = dict(base, event_id="e1", item_id="a", position=1)
    b = dict(base, event_id="e2", item_id="b", position=2)
    a_again = dict(a)                                   # a replay
    a_other = dict(a, clicked=True)                      # same event id, other content
    b_twice = dict(base, event_id="e3", item_id="b", position=3, timestamp=11)  # item served twice
    recs = [a, b, a_again, a_other, b_twice]
    for seed in range(5):
        random.Random(seed).shuffle(recs)
        kept, dup, rejected = clean_request(recs)
        assert kept == [a, b] and dup == 1
        assert sorted((r["event_id"], why.split(" (")[0]) for r, why in rejected) == [
            ("e1", REASON_EVENT_CONFLICT), ("e3", REASON_ITEM_TWICE)]
        assert all(r is not a for r, _ in rejected)


def test_resolve_judgment_policies():
    entries = {(5, 1): 1, (9, 0): 2}  # grade 1 at t=5; grade 0 at t=9, delivered twice
    assert resolve_judgment(entries, "latest") == (0, 1, [(5, 1)], [])
    assert resolve_judgment(entries, "max") == (1, 1, [(9, 0)], [])
    assert resolve_judgment(entries, "reject") == (None, 1, [], [(5, 1), (9, 0)])
    assert resolve_judgment({(5, 2): 1, (9, 2): 1}, "reject") == (2, 0, [(5, 2)], [])
    with pytest.raises(ValueError, match="policy"):
        resolve_judgment(entries, "first")


def test_account_checks_each_identity():
    good = {"impressions_read": 10, "impressions_valid": 8, "rejected:impression:position must be >= 1 (1-based)": 2,
            "impressions_accepted": 6, "duplicate:impression": 1,
            f"rejected:impression:{REASON_ITEM_TWICE}": 1, "impressions_ranked": 4, "impressions_unjudged": 2,
            "click_impressions": 5, "click_impressions_not_logged": 1}
    summary, problems = account(good, ranking=True, ctr=True)
    assert problems == [] and summary["impression"]["rejected"][REASON_ITEM_TWICE] == 1
    assert account(dict(good, impressions_read=11), ranking=True, ctr=True)[1][0].startswith("impressions: read 11")
    assert "ranked 3" in account(dict(good, impressions_ranked=3), ranking=True)[1][0]
    assert "counted in CTR 4" in account(dict(good, click_impressions=4), ctr=True)[1][0]


def test_account_of_a_stream_whose_state_crossed_a_savepoint():
    """A streaming job stopped with a savepoint holds the valid records of its open windows in the
    savepoint (``held_in_state``, positive); the job resumed from it counts them (negative). Neither is
    a failed identity then, and the two runs add up; the other identities stay checked, and more
    counted than read fails in a run not resumed."""
    from streameval.beam.accounting import format_accounting

    stopped = {"impressions_read": 10, "impressions_valid": 10, "impressions_accepted": 6, "impressions_ranked": 6}
    resumed = {"impressions_read": 5, "impressions_valid": 5, "impressions_accepted": 9, "impressions_ranked": 9}
    assert account(stopped, ranking=True)[1] == ["impressions: valid 10 != accepted 6 + duplicates 0 + superseded 0 "
                                                 "+ late 0 + rejected after validation 0"]
    s1, p1 = account(stopped, ranking=True, carried="stop")
    s2, p2 = account(resumed, ranking=True, carried="resume")
    assert p1 == p2 == []
    assert s1["impression"]["held_in_state"] == 4 and s2["impression"]["held_in_state"] == -4
    assert format_accounting(s1).startswith("impressions: read 10 = accepted 6 + held in the open windows at the "
                                            "stop 4 (counted by the run resumed from its savepoint)")
    assert format_accounting(s2).startswith("impressions: read 5 = accepted 9 (of them 4 read before the savepoint "
                                            "this run resumed from)")
    assert account(dict(stopped, impressions_read=11), carried="stop")[1][0].startswith("impressions: read 11")
    assert "ranked 5" in account(dict(stopped, impressions_ranked=5), ranking=True, carried="stop")[1][0]
    # more counted than read, in a run not resumed from a savepoint: still a failed identity
    assert account(resumed, carried="stop")[1] == ["impressions: valid 5 != accepted 9 + duplicates 0 + superseded 0 "
                                                   "+ late 0 + rejected after validation 0"]


# --------------------------------------------------------------------------------------------
# library

def test_library_judgment_conflicts():
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    qrels = pd.DataFrame({"query_id": ["q", "q", "q"], "item_id": ["b", "a", "a"], "grade": [1, 1, 0],
                          "timestamp": [0, 5, 9]})
    with pytest.raises(ValueError, match="qrels judge docno 'a' twice for query 'q'"):
        se.evaluate(qrels, run, ["map", "bpref"])
    # latest: a is judged non-relevant (t=9): AP 1/2, bpref 0 (a judged non-relevant above b)
    latest = se.evaluate(qrels, run, ["map", "bpref"], judgment_conflicts="latest").means
    assert latest == {"map": 0.5, "bpref": 0.0}
    # max: a relevant: AP (1 + 1) / 2 = 1, bpref 1
    assert se.evaluate(qrels, run, ["map", "bpref"], judgment_conflicts="max").means == {"map": 1.0, "bpref": 1.0}
    # without a timestamp column the later row wins
    no_ts = qrels.drop(columns="timestamp").iloc[[0, 2, 1]]
    assert se.evaluate(no_ts, run, "map", judgment_conflicts="latest").value() == 1.0
    with pytest.raises(ValueError, match="judgment_conflicts"):
        se.evaluate(qrels, run, "map", judgment_conflicts="reject")
    q, d, g = resolve_qrels(*(pd.Series(x).to_numpy() for x in (["q", "q"], ["a", "a"], [2.0, 1.0])),
                            [7, 7], "latest")
    assert list(g) == [2.0]  # equal times: the larger grade


def test_library_bad_input_messages():
    with pytest.raises(ValueError, match="not finite"):
        se.evaluate({"q": {"a": 1}}, {"q": {"a": float("nan")}}, "map")
    with pytest.raises(ValueError, match="run ranks docno 'a' twice for query 'q'"):
        se.evaluate({"q": {"a": 1}}, pd.DataFrame({"query_id": ["q", "q"], "item_id": ["a", "a"],
                                                    "score": [1.0, 2.0]}), "map")
    with pytest.raises(se.MetricNameError, match="unknown metric 'mapp'"):
        se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, "mapp")
    assert math.isnan(se.evaluate({}, {}, "map").value())


@pytest.mark.parametrize("metrics,got", [(None, "None"), (5, "int 5"), (b"map", "bytes b'map'")])
def test_evaluate_without_metrics_says_what_it_takes(metrics, got):
    """Issue 36: evaluate(qrels, run, None) raised a bare "'NoneType' object is not iterable" from
    deep inside; the error says metrics is required and what it accepts."""
    want = ("metrics is required: a metric name such as 'ndcg@10' or a list of names such as ['ndcg@10', 'map'] "
            f"(names as docs/metrics.md writes them); got {got}")
    with pytest.raises(TypeError) as e:
        se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, metrics)
    assert str(e.value) == want
    with pytest.raises(TypeError) as e:  # the per-query scores too (compare's path)
        api.score_queries({"q": {"a": 1}}, {"q": {"a": 1.0}}, metrics)
    assert str(e.value) == want
    # what it says works
    assert se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, "ndcg@10").means == {"ndcg@10": 1.0}
    assert se.evaluate({"q": {"a": 1}, "r": {"b": 1}}, {"q": {"a": 1.0}, "r": {"c": 1.0}},
                       ["ndcg@10", "map"]).means == {"ndcg@10": 0.5, "map": 0.5}


# --------------------------------------------------------------------------------------------
# batch job

@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    imps, judg = _logs()
    code, rows, summary, dead = _run(tmp_path_factory.mktemp("clean"), "clean", [imps], [judg])
    assert code == 0 and dead == [] and summary["accounting_problems"] == []
    return imps, judg, rows, summary


def test_replays_change_no_metric(clean, tmp_path):
    imps, judg, rows, _ = clean
    rnd = random.Random(1)
    replays = rnd.sample(imps, 20)
    judg_replays = rnd.sample(judg, 5)
    mixed = imps + replays
    rnd.shuffle(mixed)
    code, rows2, summary, dead = _run(tmp_path, "replayed", [mixed[:100], mixed[100:]], [judg, judg_replays])
    assert code == 0 and dead == []
    _same(rows2, rows)
    acc = summary["accounting"]
    assert acc["impression"]["read"] == len(imps) + 20 and acc["impression"]["duplicates"] == 20
    assert acc["impression"]["accepted"] == len(imps)
    assert acc["judgment"]["duplicates"] == 5 and acc["judgment"]["accepted"] == len(judg)


def test_bad_records_go_to_dead_letters_with_reasons(clean, tmp_path):
    imps, judg, rows, _ = clean
    i0 = next(r for r in imps if not r["clicked"])
    conflict = dict(i0, clicked=True)                       # same event id, other content: rejected
    twice = dict(imps[1], event_id="x-twice", position=9, timestamp=imps[1]["timestamp"] + 1)  # item again
    nan_score = dict(imps[2], event_id="x-nan", item_id="new1", score=float("nan"))
    pos0 = dict(imps[3], event_id="x-pos0", item_id="new2", position=0)
    bad_grade = dict(judg[0], item_id="d99", grade=7)
    code, rows2, summary, dead = _run(tmp_path, "bad", [imps + [conflict, twice, nan_score, pos0]],
                                      [judg + [bad_grade]], extra=["--grades", "0:3"])
    assert code == 0
    _same(rows2, rows)  # the originals are kept: metrics unchanged
    reasons = sorted(d["reason"].split(" (")[0].split(",")[0] for d in dead)
    assert reasons == sorted([REASON_EVENT_CONFLICT, REASON_ITEM_TWICE, "score is not finite",
                              "position must be >= 1", "grade outside the declared range 0..3"])
    acc = summary["accounting"]["impression"]
    assert acc["read"] == len(imps) + 4 and acc["accepted"] == len(imps) and sum(acc["rejected"].values()) == 4
    assert acc["ranked"] + acc["unjudged"] == len(imps) and acc["unjudged"] == 36  # query q5: 6 requests x 6
    assert summary["accounting"]["judgment"]["rejected"] == {"grade outside the declared range 0..3": 1}


@pytest.mark.parametrize("policy,expected,rejected", [
    ("latest", {"map": 0.5, "bpref": 0.0}, 0),   # a: grade 0 (t=9) supersedes grade 1 (t=5)
    ("max", {"map": 1.0, "bpref": 1.0}, 0),      # a: grade 1
    ("reject", {"map": 0.5, "bpref": 1.0}, 2),   # a: unjudged, both judgments dead letters
])
def test_judgment_policies_in_the_job(tmp_path, policy, expected, rejected):
    imps = [{"event_id": f"e{i}", "request_id": "r", "query_id": "q", "user_id": None, "system_id": "A",
             "item_id": item, "position": i + 1, "score": float(3 - i), "clicked": None, "timestamp": BASE_TS,
             "propensity": None, "attributes": {"device": "pc"}} for i, item in enumerate("abc")]
    # (a device: _run slices by it, and an attribute no record has is a usage error)
    judg = [{"query_id": "q", "item_id": "b", "grade": 1, "timestamp": 0, "source": ""},
            {"query_id": "q", "item_id": "a", "grade": 1, "timestamp": 5, "source": ""},
            {"query_id": "q", "item_id": "a", "grade": 0, "timestamp": 9, "source": ""}]
    code, rows, summary, dead = _run(tmp_path, policy, [imps], [judg], metrics="map,bpref",
                                     extra=["--judgment-conflicts", policy, "--no-ctr"])
    # rejecting 2 of 3 judgments fails the input check (exit 3, outputs written): see test_input_checks
    assert code == (3 if rejected else 0)
    got = {k[3]: v[0] for k, v in rows.items() if k[1] == "all"}
    assert got == expected
    assert len(dead) == rejected
    acc = summary["accounting"]["judgment"]
    assert acc["superseded"] == (0 if rejected else 1) and acc["accepted"] == (1 if rejected else 2)


def test_truncated_file_keeps_the_records_before_the_damage(clean, tmp_path):
    imps, judg, _, _ = clean
    extra_imps = [dict(r, event_id="x" + r["event_id"], request_id="x" + r["request_id"]) for r in imps]
    whole = tmp_path / "whole.avro"
    avro.write_records(whole, "impression", extra_imps, sync_interval=2000)
    data = whole.read_bytes()
    code, rows, summary, dead = _run(tmp_path, "cut", [imps, data[: len(data) * 2 // 3]], [judg])
    assert code == 3  # a damaged file fails the input check unless --allow-unreadable (the outputs are written)
    assert len(summary["input_checks_failed"]) == 1 and "damaged" in summary["input_checks_failed"][0]
    assert len(dead) == 1 and "unreadable Avro file" in dead[0]["reason"]
    n = json.loads(dead[0]["raw"])["records_read"]
    assert 0 < n < len(extra_imps)
    assert summary["accounting"]["unreadable_files"] and summary["accounting"]["impression"]["read"] == len(imps) + n
    # the metrics are those of the records that could be read
    code, ref, _, _ = _run(tmp_path, "prefix", [imps, extra_imps[:n]], [judg])
    _same(rows, ref)


def test_empty_and_missing_inputs(tmp_path, capsys):
    code, rows, summary, dead = _run(tmp_path, "empty", [[]], [[]], extra=["--allow-empty"])
    assert code == 0 and rows == {} and dead == []
    assert summary["accounting"] == {"unreadable_files": []}
    assert batch.main(["--impressions", str(tmp_path / "nothing*.avro"), "--output", str(tmp_path / "o")]) == 2
    assert "nothing*.avro" in capsys.readouterr().err
    assert batch.main(["--impressions", str(tmp_path / "empty" / "imps-0.avro"), "--metrics", "mapp",
                       "--judgments", str(tmp_path / "empty" / "judg-0.avro"), "--output", str(tmp_path / "o")]) == 2
    assert "unknown metric 'mapp'" in capsys.readouterr().err
    assert batch.main(["--impressions", str(tmp_path / "empty" / "imps-0.avro"), "--grades", "3:1",
                       "--output", str(tmp_path / "o")]) == 2


def test_a_glob_through_a_symbolic_link_loop_reads_each_file_once(clean, tmp_path, caplog):
    """Issue 36: ``**`` through a link to the directory itself (or to its parent) matched each file
    up to 41 times, and the job read it as often without a word. Each file is read once, and one
    warning per pattern says how many matches were dropped (the count of Python's glob)."""
    import glob
    import logging

    imps, judg, rows, _ = clean
    d = tmp_path / "links"
    avro.write_records(d / "imps" / "imps-0.avro", "impression", imps[:50])
    avro.write_records(d / "imps" / "imps-1.avro", "impression", imps[50:])
    avro.write_records(d / "judg" / "judg.avro", "judgment", judg)
    (d / "imps" / "loop").symlink_to(".")          # the directory itself
    (d / "judg" / "sub").mkdir()
    (d / "judg" / "sub" / "up").symlink_to("..")   # the parent of the link's directory
    pats = {k: str(d / k / "**" / "*.avro") for k in ("imps", "judg")}
    matched = {k: len(glob.glob(p, recursive=True)) for k, p in pats.items()}
    assert matched["imps"] > 2 and matched["judg"] > 1  # the loop is there
    out = d / "out"
    with caplog.at_level(logging.WARNING):
        code = batch.main(["--impressions", pats["imps"], "--judgments", pats["judg"], "--metrics",
                           "ndcg@5,map,mrr@10,P@5,bpref", "--window", "1h", "--slices", "device", "--output",
                           str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting"]["impression"]["read"] == len(imps)
    assert summary["accounting"]["judgment"]["read"] == len(judg)
    assert summary["accounting"]["impression"]["duplicates"] == 0
    warned = [r.getMessage() for r in caplog.records if "symbolic links" in r.getMessage()]
    assert warned == [f"the pattern {pats['imps']!r} matched {matched['imps']} paths to 2 files through symbolic "
                      f"links: each file is read once ({matched['imps'] - 2} duplicate matches dropped)",
                      f"the pattern {pats['judg']!r} matched {matched['judg']} paths to 1 file through symbolic "
                      f"links: each file is read once ({matched['judg'] - 1} duplicate matches dropped)"]
    got = {(r["window_start"], r["slice"], r["system"], r["metric"]): (r["value"], r["num_queries"], r["stderr"])
           for r in map(json.loads, open(out / "metrics.jsonl"))}
    _same(got, rows)  # the same metrics as the files named one by one


def test_counts_that_do_not_add_up_fail_the_job(clean, tmp_path, monkeypatch, capsys):
    imps, judg, _, _ = clean
    real = batch.job_counters

    def lossy(result, *namespace, **kw):
        c = real(result, *namespace, **kw)
        if not namespace:  # the record counters (not the decoders' namespace)
            c["impressions_read"] += 1  # a record read but found nowhere
        return c

    monkeypatch.setattr(batch, "job_counters", lossy)
    code, _, summary, _ = _run(tmp_path, "lossy", [imps[:30]], [judg])
    assert code == 1
    assert summary["accounting_problems"] and "read 31" in summary["accounting_problems"][0]
    assert "do not add up" in capsys.readouterr().err


def test_ope_ignores_replayed_log_events(tmp_path, capsys):
    from streameval.jobs import ope

    logs = list(avro.read_records("data/sample/impressions/obd_bts_*.avro", "impression"))[:3000]
    avro.write_records(tmp_path / "logs" / "a.avro", "impression", logs)
    common = ["--target", "random", "--n-items", "all=80,men=34,women=46"]
    assert ope.main(["--logs", str(tmp_path / "logs" / "*.avro"), *common, "--output", str(tmp_path / "o1")]) == 0
    avro.write_records(tmp_path / "logs" / "b.avro", "impression", logs[:500])  # delivered again
    assert ope.main(["--logs", str(tmp_path / "logs" / "*.avro"), *common, "--output", str(tmp_path / "o2")]) == 0
    assert "replayed events ignored 500" in capsys.readouterr().out
    one, two = ([json.loads(line) for line in open(tmp_path / o / "metrics.jsonl")] for o in ("o1", "o2"))
    key = lambda r: (r["slice"], r["metric"])  # noqa: E731
    assert sorted(one, key=key) == sorted(two, key=key)


def _write_with_schema(path, schema, recs):
    import fastavro

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fo:
        fastavro.writer(fo, fastavro.parse_schema(schema), recs)


def test_batch_job_reads_compatible_schema_versions_and_refuses_others(clean, tmp_path):
    imps, judg, rows, _ = clean
    imp_schema = avro.load_schema_json("impression")
    judg_schema = avro.load_schema_json("judgment")
    # newer impressions: an added field with a default, score written as float (promoted to double)
    newer = json.loads(json.dumps(imp_schema))
    newer["streameval_schema_version"] = imp_schema.get("streameval_schema_version", 1) + 1
    newer["fields"].append({"name": "device_type", "type": "string", "default": "pc"})
    for f in newer["fields"]:
        if f["name"] == "score":
            f["type"] = ["null", "float"]
    # older judgments: without the optional timestamp and source fields
    older = json.loads(json.dumps(judg_schema))
    older["fields"] = [f for f in older["fields"] if f["name"] not in ("timestamp", "source")]
    d = tmp_path / "evolved"
    _write_with_schema(d / "imps.avro", newer, [dict(r, device_type="sp") for r in imps])
    _write_with_schema(d / "judg.avro", older, [{k: j[k] for k in ("query_id", "item_id", "grade")} for j in judg])
    # incompatible: position written as a string
    broken = json.loads(json.dumps(imp_schema))
    for f in broken["fields"]:
        if f["name"] == "position":
            f["type"] = "string"
    _write_with_schema(d / "broken.avro", broken, [dict(imps[0], position="1")])
    (d / "noise.avro").write_bytes(bytes(random.Random(0).getrandbits(8) for _ in range(3000)))
    out = d / "out"
    code = batch.main(["--impressions", str(d / "imps.avro"), "--impressions", str(d / "broken.avro"),
                       "--impressions", str(d / "noise.avro"), "--judgments", str(d / "judg.avro"),
                       "--metrics", "ndcg@5,map,mrr@10,P@5,bpref", "--window", "1h", "--slices", "device",
                       "--output", str(out), "--quiet", "--allow-unreadable"])
    assert code == 0
    got = {(r["window_start"], r["slice"], r["system"], r["metric"]): (r["value"], r["num_queries"], r["stderr"])
           for r in map(json.loads, open(out / "metrics.jsonl"))}
    # scores are all small integers, exact in float32: the metrics equal the clean run's
    _same(got, rows)
    dead = [json.loads(line) for line in open(out / "dead_letters.jsonl")]
    assert sorted(x["source"].rsplit("/", 1)[-1] for x in dead) == ["broken.avro", "noise.avro"]
    assert all("unreadable Avro file" in x["reason"] for x in dead)
    assert any("position" in x["reason"] for x in dead if x["source"].endswith("broken.avro"))
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["accounting"]["unreadable_files"]) == 2 and summary["accounting_problems"] == []


# --------------------------------------------------------------------------------------------
# issue 20, items 12 and 13: input checks (exit status 3) and runs that share a tag

def _imp(i, position=None, req=None):
    return {"event_id": f"e{i}", "request_id": req or f"r{i // 4}", "query_id": "q", "user_id": None,
            "system_id": "A", "item_id": f"d{i % 4}", "position": position if position is not None else i % 4 + 1,
            "score": float(4 - i % 4), "clicked": i % 4 == 0, "timestamp": BASE_TS, "propensity": None,
            "attributes": {"device": "pc"}}  # (_run slices by device: an attribute no record has is a usage error)


def test_input_checks_fail_a_garbage_or_partly_rejected_input(tmp_path, capsys):
    """Issue 20, item 13: a job whose every impression is garbage wrote 0 rows and exited 0. Now it
    exits 3 (outputs written, the reason on one stderr line, in summary.json and the manifest); the
    share of rejected records is checked against --max-rejected-fraction (not above: passes)."""
    judg = [{"query_id": "q", "item_id": "d0", "grade": 1, "timestamp": 0, "source": ""}]
    garbage = [_imp(i, position=0) for i in range(20)]
    code, rows, summary, dead = _run(tmp_path, "garbage", [garbage], [judg], metrics="map")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and rows == {} and len(dead) == 20
    assert len(err) == 1 and "20 of 20 impressions rejected (100.0 %, most: position must be >= 1" in err[0]
    assert "no impression was accepted (read 20" in err[0]
    assert len(summary["input_checks_failed"]) == 2 and "; ".join(summary["input_checks_failed"]) in err[0]
    manifest = json.loads((tmp_path / "garbage" / "out" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["input_checks_failed"] == summary["input_checks_failed"]
    code, *_ = _run(tmp_path, "garbage-allowed", [garbage], [judg], metrics="map",
                    extra=["--max-rejected-fraction", "1", "--allow-empty"])
    assert code == 0
    # the threshold: 1 of 20 rejected is 5 % (not above the default), 2 of 20 is above it
    good = [_imp(i) for i in range(20)]
    one_bad = good[:19] + [dict(good[19], event_id="bad", item_id="")]
    two_bad = good[:18] + [dict(g, event_id=f"bad{k}", item_id="") for k, g in enumerate(good[18:])]
    assert _run(tmp_path, "one", [one_bad], [judg], metrics="map")[0] == 0
    code, _, summary, _ = _run(tmp_path, "two", [two_bad], [judg], metrics="map")
    assert code == 3 and summary["input_checks_failed"][0].startswith("2 of 20 impressions rejected (10.0 %")
    assert _run(tmp_path, "two-ok", [two_bad], [judg], metrics="map", extra=["--max-rejected-fraction", "0.1"])[0] == 0
    capsys.readouterr()
    for bad in ("nan", "1.5", "-0.1", "inf"):
        code = batch.main(["--impressions", str(tmp_path / "one" / "imps-0.avro"), "--output", str(tmp_path / "o"),
                           "--max-rejected-fraction", bad])
        assert code == 2, bad
        assert "max-rejected-fraction" in capsys.readouterr().err


def _trec_run(path, lines, tag="PYSERINI"):
    path.write_text("".join(f"{q} Q0 {d} {r} {s} {tag}\n" for r, (q, d, s) in enumerate(lines, 1)))
    return str(path)


def test_two_runs_with_one_tag_are_not_blended(tmp_path, capsys):
    """Issue 20, item 12: two different runs both tagged PYSERINI, converted and scored in one job, were
    blended into one system (exit 0, a value neither run has). The converted event ids now differ
    between runs, every overlapping item is a conflict, and the job exits 3 naming the inputs and the
    way out (a system id per run); with one, each system equals pytrec_eval on its own run."""
    import pytrec_eval

    from streameval import cli

    rnd = random.Random(3)
    qrels = {f"q{q}": {f"d{d}": rnd.randint(0, 2) for d in range(8)} for q in range(5)}
    runs = {name: [(q, f"d{d}", float(rnd.randint(0, 50)) / 4) for q in qrels for d in rnd.sample(range(10), 7)]
            for name in ("bm25", "rm3")}
    (tmp_path / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, js in qrels.items() for d, g in js.items()))
    assert cli.main(["convert", "qrels", str(tmp_path / "qrels.txt"), str(tmp_path / "judg.avro")]) == 0
    for name, lines in runs.items():
        run = _trec_run(tmp_path / f"{name}.run", lines)
        assert cli.main(["convert", "trec-run", run, str(tmp_path / f"{name}.avro")]) == 0
        assert cli.main(["convert", "trec-run", run, str(tmp_path / f"{name}-own.avro"), "--system", name]) == 0
    capsys.readouterr()
    # (pytrec_eval is trec_eval 9: scores as C floats)
    common = ["--judgments", str(tmp_path / "judg.avro"), "--metrics", "ndcg_cut_10", "--no-ctr", "--quiet",
              "--score-precision", "float32"]
    code = batch.main(["--impressions", str(tmp_path / "bm25.avro"), "--impressions", str(tmp_path / "rm3.avro"),
                       *common, "--output", str(tmp_path / "blended")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1
    assert "another ranking" in err[0] and "bm25.avro" in err[0] and "rm3.avro" in err[0] and "--system" in err[0]
    code = batch.main(["--impressions", str(tmp_path / "bm25-own.avro"), "--impressions", str(tmp_path / "rm3-own.avro"),
                       *common, "--output", str(tmp_path / "apart")])
    assert code == 0
    got = {r["system"]: r["value"] for r in map(json.loads, open(tmp_path / "apart" / "metrics.jsonl"))}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"})
    for name, lines in runs.items():
        run = {}
        for q, d, s in lines:
            run.setdefault(q, {})[d] = s
        per_q = evaluator.evaluate(run)
        assert got[name] == pytest.approx(sum(v["ndcg_cut_10"] for v in per_q.values()) / len(per_q), abs=1e-12)


def test_ids_order_as_text_whatever_the_container():
    """Issue 20, item 10: tied scores gave recip_rank 0.5 from a dict with int ids and 1.0 from numpy
    int arrays (10 sorted after 2 as numbers). Ids are text in every container (trec_eval's strcmp):
    every form gives pytrec_eval's value on the string ids."""
    import pytrec_eval

    qrels_s = {"1": {"10": 1, "3": 0}}
    run_s = {"1": {"2": 1.0, "10": 1.0, "3": 0.5}}
    want = pytrec_eval.RelevanceEvaluator(qrels_s, {"recip_rank"}).evaluate(run_s)["1"]["recip_rank"]
    assert want == 0.5  # "2" > "10" as text: d2 ranks first on the tie
    q = np.array([1, 1, 1])
    forms = [
        (qrels_s, run_s),
        ({1: {10: 1, 3: 0}}, {1: {2: 1.0, 10: 1.0, 3: 0.5}}),
        ((np.array([1, 1]), np.array([10, 3]), np.array([1, 0])), (q, np.array([2, 10, 3]), np.array([1.0, 1.0, 0.5]))),
        (pd.DataFrame({"q_id": [1, 1], "doc_id": [10, 3], "rel": [1, 0]}),
         pd.DataFrame({"q_id": q, "doc_id": [2, 10, 3], "score": [1.0, 1.0, 0.5]})),
    ]
    for qrels, run in forms:
        assert se.evaluate(qrels, run, "recip_rank", score_precision="float32").value() == want


@pytest.mark.parametrize("kwargs,error,name", [
    ({"score_precision": "float16"}, ValueError, "score_precision"),
    ({"relevance_level": float("nan")}, ValueError, "relevance_level"),
    ({"relevance_level": "2"}, TypeError, "relevance_level"),
    ({"relevance_level": True}, TypeError, "relevance_level"),
    ({"depth": 1.5}, TypeError, "depth"),
    ({"depth": 0}, ValueError, "depth"),
    ({"err_max_grade": float("inf")}, ValueError, "err_max_grade"),
    ({"complete": "yes"}, TypeError, "complete"),
    ({"tie_break": "random"}, ValueError, "tie_break"),
])
def test_bad_library_arguments_are_named(kwargs, error, name):
    """Issue 20, item 10: such arguments were accepted (``score_precision="float16"``, ``depth=1.5``) or
    failed deep inside numpy (``relevance_level="2"``); each now raises at once, naming itself, in
    ``evaluate()`` and in the Beam transforms of both engines."""
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.transforms import ScoreRankings

    with pytest.raises(error, match=name):
        se.evaluate({"q": {"d": 1}}, {"q": {"d": 1.0}}, "ndcg@10", **kwargs)
    if "complete" not in kwargs:
        with pytest.raises(error, match=name):
            ScoreRankings(None, ["ndcg@10"], **kwargs)
        with pytest.raises(error, match=name):
            ColumnarMetrics([], [], ["ndcg@10"], **kwargs)


def test_bad_option_values_exit_2_on_every_command(tmp_path, capsys):
    from streameval.jobs import stream as stream_cli
    from streameval import cli

    (tmp_path / "q.txt").write_text("q 0 d 1\n")
    (tmp_path / "r.txt").write_text("q Q0 d 1 1.0 t\n")
    assert cli.main(["trec-eval", "-l", "nan", str(tmp_path / "q.txt"), str(tmp_path / "r.txt")]) == 2
    imps = tmp_path / "i.avro"
    avro.write_records(imps, "impression", [_imp(0)])
    avro.write_records(tmp_path / "j.avro", "judgment", [{"query_id": "q", "item_id": "d0", "grade": 1,
                                                         "timestamp": 0, "source": ""}])
    common = ["--impressions", str(imps), "--judgments", str(tmp_path / "j.avro"), "--metrics", "map"]
    assert batch.main([*common, "--relevance-level", "nan", "--output", str(tmp_path / "o")]) == 2
    assert stream_cli.main(["--replay", *common, "--window", "1h", "--relevance-level", "nan"]) == 2
    err = capsys.readouterr().err
    assert err.count("relevance_level must be finite") == 3


def test_timestamps_beyond_the_years_a_job_can_window_are_dead_letters(tmp_path):
    """Issue 20, item 2: a timestamp near +-2**63 passed the record checks, then the batch job died in
    the metrics writer (window_end overflowed) and the streaming job on Beam's MAX_TIMESTAMP. Event
    times outside the years 1 to 9999 are dead letters on both engines and in the streaming job (its
    sources stamp elements with usable times only), and --event-time-range narrows the range."""
    from streameval.jobs import stream as stream_cli
    from streameval.io.records import EVENT_TIME_MAX, EVENT_TIME_MIN

    def imp(req, item, pos, ts):
        return dict(_imp(0), event_id=f"{req}/{item}", request_id=req, item_id=item, position=pos, timestamp=ts,
                    query_id="q1")

    good = [imp("r1", "d1", 1, BASE_TS), imp("r1", "d2", 2, BASE_TS + 5), imp("r2", "d2", 1, BASE_TS + 9),
            imp("r5", "d1", 1, EVENT_TIME_MAX), imp("r6", "d2", 1, EVENT_TIME_MIN), imp("r7", "d1", 1, -1)]
    bad = [imp("r2", "d1", 2, 2**63 - 1), imp("r3", "d1", 1, -2**63), imp("r4", "d1", 1, EVENT_TIME_MAX + 1),
           imp("r8", "d1", 1, EVENT_TIME_MIN - 1)]
    avro.write_records(tmp_path / "imps.avro", "impression", good + bad)
    # judged before the first event (a judgment has an event time too: later, it would be late for year 1)
    avro.write_records(tmp_path / "judg.avro", "judgment", [{"query_id": "q1", "item_id": "d1", "grade": 1,
                                                              "timestamp": EVENT_TIME_MIN, "source": ""}])
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "map,P@2", "--window", "1d", "--quiet", "--max-rejected-fraction", "1"]

    def batch_rows(out, *extra):
        outs = {}
        for engine in ("columnar", "records"):
            o = tmp_path / f"{out}-{engine}"
            assert batch.main([*common, "--engine", engine, "--output", str(o), *extra]) == 0
            assert not list(o.glob("beam-temp-*"))
            rows = sorted((r["window_start"], r["metric"], r["value"], r["num_queries"])
                          for r in map(json.loads, open(o / "metrics.jsonl")))
            dead = sorted((json.loads(d["raw"])["request_id"], d["reason"]) for d in map(json.loads, open(o / "dead_letters.jsonl")))
            outs[engine] = (rows, dead)
        assert outs["columnar"] == outs["records"]
        return outs["columnar"]

    rows, dead = batch_rows("all")
    assert [r for r, _ in dead] == ["r2", "r3", "r4", "r8"]
    assert all("is outside the event times a job can window (years 1 to 9999)" in reason for _, reason in dead)
    # the first and last representable days are windows like any other: 4 windows (r1 and r2 share one)
    assert len({r[0] for r in rows}) == 4 and max(r[0] for r in rows) == EVENT_TIME_MAX - EVENT_TIME_MAX % 86_400_000_000
    assert stream_cli.main(["--replay", *common, "--output", str(tmp_path / "stream")]) == 0
    finals = sorted((r["window_start"], r["metric"], r["value"], r["num_queries"])
                    for f in (tmp_path / "stream").glob("metrics-*.jsonl") for r in map(json.loads, open(f))
                    if r["is_final"] and r["slice"] == "all" and r["metric"] in ("map", "P@2"))
    assert finals == [r for r in rows if r[1] in ("map", "P@2")]
    stream_dead = sorted((json.loads(d["raw"])["request_id"], d["reason"])
                         for f in (tmp_path / "stream").glob("dead_letters-*.jsonl") for d in map(json.loads, open(f)))
    assert stream_dead == dead
    # a plausible range, by option: 1969's and the far years' impressions are dead letters as well
    rows, dead = batch_rows("range", "--event-time-range", "1970..2200")
    assert [r for r, _ in dead] == ["r2", "r3", "r4", "r5", "r6", "r7", "r8"]
    assert sum("outside the accepted event times 1970-01-01T00:00:00Z..2200-01-01T00:00:00Z" in reason
               for _, reason in dead) == 3
    assert len({r[0] for r in rows}) == 1


def test_json_lines_outputs_write_nan_as_null(tmp_path, capsys):
    """Issue 20, item 11: metrics.jsonl wrote NaN as the string "NaN" (JSON has no NaN, and a column
    that mixes strings with numbers breaks a warehouse load). Every JSON-lines output writes null; the
    Avro table keeps NaN; reconcile and report read null as NaN."""
    from streameval import cli
    from streameval.io import results

    imps, judg = _logs()
    # a slice with no click: its AUC is NaN (one class absent)
    imps += [dict(imps[0], event_id=f"u/{i}", request_id="u", item_id=f"d{i}", position=i, clicked=False,
                  attributes={"device": "tv"}) for i in range(1, 4)]
    code, rows, _, _ = _run(tmp_path, "nan", [imps], [judg], extra=("--ci", "t"), metrics="ndcg@5,auc")
    assert code == 0
    out = tmp_path / "nan" / "out"

    def strict(text):  # json.loads accepts NaN unless told not to
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in {text}"))

    lines = [strict(line) for line in open(out / "metrics.jsonl")]
    nan = [r for r in lines if r["value"] is None]
    assert {(r["slice"], r["metric"]) for r in nan} == {("device=tv", "auc")}
    assert not any(isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity") for r in lines for v in r.values())
    # one query (the tv request's ndcg@5): no standard error, written null as well
    one = [r for r in lines if r["slice"] == "device=tv" and r["metric"] == "ndcg@5"]
    assert [(r["num_queries"], r["stderr"], r["ci_low"]) for r in one] == [(1, None, None)]
    avro_rows = {(r["window_start"], r["slice"], r["metric"], r["system"]): r
                 for r, _ in results.iter_rows(out / "metrics.avro")}
    back = list(results.iter_rows(out / "metrics.jsonl"))
    assert len(back) == len(avro_rows) == len(lines)
    for r, _ in back:
        a = avro_rows[(r["window_start"], r["slice"], r["metric"], r["system"])]
        assert (math.isnan(a["value"]) and math.isnan(r["value"])) or a["value"] == r["value"]
    assert all(isinstance(strict(line), dict) for line in open(out / "dead_letters.jsonl"))
    # the two formats of one table agree, and report reads the null rows
    capsys.readouterr()
    assert cli.main(["reconcile", str(out / "metrics.avro"), str(out / "metrics.jsonl"),
                     "--json", str(tmp_path / "rec.json")]) == 0
    strict((tmp_path / "rec.json").read_text())


def test_dead_letters_name_the_file_of_the_record(tmp_path):
    """Issue 20, item 11: a rejected record's dead letter named the glob (batch) or every impression
    file joined by commas, also for judgments (stream). A record check's dead letter names the file
    the record was read from, on both engines and in the stream; a replay or conflict (decided across
    files) names the stage."""
    from streameval.jobs import stream as stream_cli

    imps, judg = _logs(queries=3, reps=1)
    bad_pos = dict(imps[0], event_id="bad/1", request_id="bad", position=0)
    conflict = dict(imps[1], score=99.0)  # the event id of imps[1] with other content, in another file
    d = tmp_path / "in"
    avro.write_records(d / "imps-0.avro", "impression", imps)
    avro.write_records(d / "imps-1.avro", "impression", [bad_pos, conflict])
    avro.write_records(d / "judg-0.avro", "judgment", judg)
    avro.write_records(d / "judg-1.avro", "judgment", [dict(judg[0], item_id="")])
    common = ["--impressions", str(d / "imps-*.avro"), "--judgments", str(d / "judg-*.avro"), "--metrics", "map",
              "--quiet", "--max-rejected-fraction", "1"]
    expected = sorted([(str(d / "imps-1.avro"), "bad/1"), ("CleanImpressions", imps[1]["event_id"]),
                       (str(d / "judg-1.avro"), None)])

    def letters(files):
        return sorted((x["source"], json.loads(x["raw"]).get("event_id")) for f in files for x in map(json.loads, open(f)))

    for engine in ("columnar", "records"):
        out = tmp_path / engine
        assert batch.main([*common, "--engine", engine, "--output", str(out)]) == 0
        assert letters([out / "dead_letters.jsonl"]) == expected, engine
    assert stream_cli.main(["--replay", *common, "--window", "1d", "--output", str(tmp_path / "stream")]) == 0
    assert letters((tmp_path / "stream").glob("dead_letters-*.jsonl")) == expected


def test_stream_rerun_replaces_the_panes_and_a_failed_run_leaves_the_previous_one(tmp_path, monkeypatch, capsys):
    """Issue 20, item 5: a rerun of the streaming job into its output directory left the first run's
    pane files beside the new ones (windows of the old input stayed), with nothing to tell a complete
    directory from a killed run's. The job now replaces its outputs and writes manifest.json last
    (the batch job's mechanism). Issue 36: a --replay run that fails leaves the previous run's panes
    and manifest as they were, and nothing of its own (no staging folder, no temporary files)."""
    from streameval.jobs import stream as stream_cli
    from streameval.beam import sinks

    imps, judg = _logs(queries=3, reps=2)
    day1 = tmp_path / "day1.avro"
    day2 = tmp_path / "day2.avro"
    avro.write_records(day1, "impression", imps)
    avro.write_records(day2, "impression", [dict(r, timestamp=r["timestamp"] + 86_400_000_000) for r in imps])
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out, fresh = tmp_path / "out", tmp_path / "fresh"

    def run(imp, o):
        return stream_cli.main(["--replay", "--impressions", str(imp), "--judgments", str(tmp_path / "judg.avro"),
                                "--metrics", "map", "--window", "1h", "--quiet", "--output", str(o)])

    def panes(o):
        return sorted(f.name for f in o.glob("metrics-*"))

    assert run(day1, out) == 0 and sinks.is_complete(str(out))
    first = panes(out)
    assert run(day2, out) == 0 and run(day2, fresh) == 0
    assert panes(out) == panes(fresh) and not set(panes(out)) & set(first)
    manifest = json.loads((out / "manifest.json").read_text())
    listed = sorted(f["path"].rsplit("/", 1)[-1] for f in manifest["outputs"]["metrics-*"])
    assert listed == panes(out) and manifest["complete"] is True
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    # a run that fails: the previous run's outputs stay, byte for byte; nothing of the failed run is left
    monkeypatch.setattr(stream_cli, "ReplayAvro", _failing_replay(stream_cli.ReplayAvro))
    monkeypatch.setattr(stream_cli, "ReplayColumns", _failing_replay(stream_cli.ReplayColumns))
    capsys.readouterr()
    assert run(day1, out) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the job failed" in err[0], err
    assert sinks.is_complete(str(out)) and {f.name: f.read_bytes() for f in out.iterdir()} == before


def _failing_replay(replay):
    """A replay source whose records make the pipeline fail: a DoFn raising in the middle of the job."""
    import apache_beam as beam

    class Failing(replay):
        def expand(self, pbegin):
            out = super().expand(pbegin)

            def boom(x):
                raise RuntimeError("disk full (simulated)")

            if isinstance(out, dict):  # the per-event engine's replay
                return {**out, "impressions": out["impressions"] | "Boom" >> beam.Map(boom)}
            return out | "Boom" >> beam.Map(boom)  # the columnar engine's (blocks)

    return Failing


def test_requests_spanning_windows_follow_one_rule_in_batch_and_stream(tmp_path):
    """Issue 20, item 3: the stream scored a request's impressions after its window closed as a new
    request (or as late data, depending on when they arrived), the batch job kept them all in the
    request's first window; an impression at timestamp -1 split its request. One rule now, by event
    time, on both batch engines and in the stream: a request belongs to the window of its earliest
    impression, and its impressions at or after that window's end plus the allowed lateness are late
    data (late:impression, with the reason), counted as late."""
    from streameval.jobs import stream as stream_cli

    hour = 3_600_000_000

    def imp(req, item, pos, ts, query="q1"):
        return dict(_imp(0), event_id=f"{req}/{item}", request_id=req, item_id=item, position=pos, timestamp=ts,
                    query_id=query, attributes={"device": "pc"})

    base = BASE_TS
    imps = [imp("a", "d1", 1, base + 10), imp("a", "d2", 2, base + 20), imp("a", "d3", 3, base + 30),
            # b: two pieces; the second 50 minutes into the next window (inside 1h of lateness, after 0)
            imp("b", "d1", 1, base + 59 * 60_000_000), imp("b", "d2", 2, base + hour + 50 * 60_000_000),
            imp("b", "d3", 3, base + hour + 55 * 60_000_000),
            # c: an impression at -1 makes its window 1969's last hour: the rest is after its close
            imp("c", "d3", 1, -1, "q2"), imp("c", "d1", 2, base + 40, "q2"), imp("c", "d2", 3, base + 50, "q2")]
    judg = [{"query_id": q, "item_id": f"d{i}", "grade": g, "timestamp": -2, "source": ""}
            for q in ("q1", "q2") for i, g in ((1, 0), (2, 1), (3, 2))]
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "map,P@3,ndcg@3", "--window", "1h", "--quiet", "--max-rejected-fraction", "1"]

    def late_of(letters):
        return sorted((json.loads(d["raw"])["event_id"], d["reason"]) for d in letters if d["source"] == "late:impression")

    for lateness, late_ids in (("0", ["b/d2", "b/d3", "c/d1", "c/d2"]), ("1h", ["c/d1", "c/d2"])):
        outs = {}
        for engine in ("columnar", "records"):
            o = tmp_path / f"b-{engine}-{lateness}"
            assert batch.main([*common, "--engine", engine, "--allowed-lateness", lateness, "--output", str(o)]) == 0
            rows = sorted((r["window_start"], r["slice"], r["system"], r["metric"], r["value"], r["num_queries"])
                          for r in map(json.loads, open(o / "metrics.jsonl")))
            letters = [json.loads(line) for line in open(o / "dead_letters.jsonl")]
            summary = json.loads((o / "summary.json").read_text())
            outs[engine] = (rows, late_of(letters), summary["accounting"]["impression"]["late"])
        assert outs["columnar"] == outs["records"]
        rows, late, n_late = outs["columnar"]
        assert [e for e, _ in late] == late_ids and n_late == len(late_ids)
        assert all("impression after its request's window closed" in reason for _, reason in late)
        # c is scored on d3 alone (grade 2; q2 has 2 relevant items): AP 1/2 in 1969's last hour
        by = {(r[0], r[3]): r for r in rows if r[1] == "all"}
        assert by[(-hour, "map")][4:] == (0.5, 1) and by[(-hour, "P@3")][4:] == (1 / 3, 1)
        # a and b's first piece in the first hour; with 1h of lateness b keeps all three impressions
        assert by[(base - base % hour, "map")][5] == 2 and (base - base % hour + hour, "map") not in by
        so = tmp_path / f"s-{lateness}"
        assert stream_cli.main(["--replay", *common, "--allowed-lateness", lateness, "--output", str(so)]) == 0
        finals = sorted((r["window_start"], r["slice"], r["system"], r["metric"], r["value"], r["num_queries"])
                        for f in so.glob("metrics-*.jsonl") for r in map(json.loads, open(f))
                        if r["is_final"] and r["num_queries"] > 0)
        assert [r for r in finals if r[3] != "ctr" and "@pos" not in r[3]] == \
            [r for r in rows if r[3] != "ctr" and "@pos" not in r[3]]
        assert [r for r in finals if r[3] == "ctr"] == [r for r in rows if r[3] == "ctr"]
        stream_late = late_of(json.loads(line) for f in so.glob("late_data-*.jsonl") for line in open(f))
        assert stream_late == late
        assert json.loads((so / "summary.json").read_text())["accounting"]["impression"]["late"] == len(late_ids)


def test_grades_the_measures_cannot_score_and_ids_with_nul_are_dead_letters(tmp_path):
    """Issue 20, item 1 (found by the differential test): a judgment of grade 2000 failed the whole
    batch job with err@k (ERR raises above err_max_grade) and, with the exponential gain, made nDCG
    NaN: the query silently left out (a row of 0 queries). The jobs now reject a judgment above the
    highest grade the requested measures can score, as a dead letter with its reason, on both engines
    and in the stream; the library raises ValueError naming the limit."""
    from streameval.jobs import stream as stream_cli

    imps = [dict(_imp(i), query_id="q", item_id=f"d{i}", position=i, score=float(9 - i)) for i in (1, 2)]
    # and an id with a trailing NUL, which numpy's string arrays read as "d2" (the per-record engine
    # joined it with d2's judgment): a dead letter too, and the library refuses it
    nul = dict(_imp(3), query_id="q", item_id="d2\x00", position=3, score=9.0)
    avro.write_records(tmp_path / "imps.avro", "impression", imps + [nul])
    avro.write_records(tmp_path / "judg.avro", "judgment", [
        {"query_id": "q", "item_id": "d1", "grade": 2000, "timestamp": 0, "source": ""},
        {"query_id": "q", "item_id": "d2", "grade": 1, "timestamp": 0, "source": ""}])
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"), "--quiet",
              "--max-rejected-fraction", "1", "--no-ctr"]
    # d2 alone, grade 1 at position 2: ERR = 1/2 * (2**1 - 1) / 2**4; nDCG (exp. gain) = 1 / log2(3)
    for extra, metric, value, why, engines in (
            (["--metrics", "err@5", "--err-max-grade", "4"], "err@5", 0.5 / 16, "grade 2000 is above 4, the largest grade ERR scores",
             ("columnar", "records", "stream")),
            (["--metrics", "ndcg@5", "--gain", "exponential"], "ndcg@5", 1 / math.log2(3),
             "grade 2000 is above 1023, the largest grade whose exponential gain", ("columnar",))):
        for engine in engines[:2]:
            o = tmp_path / f"{metric}-{engine}"
            assert batch.main([*common, *extra, "--engine", engine, "--output", str(o)]) == 0
            assert [(r["metric"], r["num_queries"]) for r in map(json.loads, open(o / "metrics.jsonl"))] == [(metric, 1)]
            assert json.loads((o / "metrics.jsonl").read_text())["value"] == pytest.approx(value, abs=1e-15)
            dead = sorted(json.loads(x)["reason"] for x in open(o / "dead_letters.jsonl"))
            assert len(dead) == 2 and dead[0].startswith(why) and dead[1] == "item_id contains a NUL character: 'd2\\x00'"
        if "stream" not in engines:
            continue
        so = tmp_path / f"{metric}-stream"
        assert stream_cli.main(["--replay", *common, *extra, "--window", "1d", "--output", str(so)]) == 0
        dead = sorted(json.loads(x)["reason"] for f in so.glob("dead_letters-*.jsonl") for x in open(f))
        assert len(dead) == 2 and dead[0].startswith(why) and dead[1].startswith("item_id contains a NUL"), dead
    with pytest.raises(ValueError, match="grade 2000 is above 1023"):
        se.evaluate({"q": {"d1": 2000, "d2": 1}}, {"q": {"d1": 2.0, "d2": 1.0}}, "ndcg", gain="exponential")
    with pytest.raises(ValueError, match="ids must not contain NUL"):
        se.evaluate({"q": {"d2": 1}}, {"q": {"d2\x00": 2.0, "d1": 1.0}}, "P@1")


def test_an_unknown_judgment_policy_is_refused_alike_everywhere():
    """One check of the judgment conflict policy (io/cleaning.check_judgment_policy) for the
    columnar and per-record batch transforms, the stream transform and the record rule: the same
    one line, naming the choices and the closest."""
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.streaming.transform import StreamMetrics
    from streameval.beam.transforms import ResolveJudgments
    from streameval.io import cleaning

    want = "must be one of latest, max, reject, got 'lastest' (did you mean latest?)"
    with pytest.raises(ValueError) as e:
        cleaning.resolve_judgment({(1, 2): 1}, "lastest")
    assert str(e.value) == f"judgment conflict policy {want}"
    with pytest.raises(ValueError) as e:
        ResolveJudgments("lastest")
    assert str(e.value) == f"judgment conflict policy {want}"
    for make in (lambda: ColumnarMetrics(["i.avro"], ["j.avro"], ["map"], judgment_conflicts="lastest"),
                 lambda: StreamMetrics(metrics=["map"], judgment_conflicts="lastest")):
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == f"judgment_conflicts {want}"
    assert cleaning.check_judgment_policy("max") == "max"
    assert str(pytest.raises(ValueError, cleaning.check_judgment_policy, "zzz").value) == \
        "judgment conflict policy must be one of latest, max, reject, got 'zzz'"


def test_the_interval_options_are_checked_once_with_one_message(tmp_path, capsys):
    """--ci-level and ci_bounded: one check each (metrics/stats.check_level, check_bounded) for the
    API, the transforms of both engines and both jobs' command lines."""
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.streaming.transform import StreamMetrics
    from streameval.metrics import stats

    from .test_first_day import _write_small

    assert batch.main([*_write_small(tmp_path), "--metrics", "map", "--output", str(tmp_path / "o"),
                       "--ci-level", "1.5"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: --ci-level must be in (0, 1), got 1.5"
    for make in (lambda: ColumnarMetrics(["i.avro"], ["j.avro"], ["map"], ci_bounded="logt"),
                 lambda: StreamMetrics(metrics=["map"], ci_bounded="logt")):
        with pytest.raises(ValueError) as e:
            make()
        assert str(e.value) == "ci_bounded must be one of logit, t, got 'logt'"
    with pytest.raises(ValueError, match="^bounded must be one of logit, t, got 'x'$"):
        stats.row_interval("map", 0.5, 10, 0.1, bounded="x")
    with pytest.raises(ValueError, match=r"^confidence level must be in \(0, 1\), got 0$"):
        stats.check_level(0)
