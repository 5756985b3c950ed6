"""Diversity measures (alpha-nDCG, ERR-IA, NRBP, MAP-IA, P-IA, S-recall) in the batch job.

Oracle: pyndeval 0.0.8 (ndeval.c 4.5; the test extra), called per system on the run each system served,
its per-query values averaged per (system, slice) over the requests here, independently of the job.
The two engines (per-record, the executable specification, and columnar) must agree bit for bit.
The ad hoc measures on subtopic judgments use the largest grade of a document over its judgments
(docs/metrics.md, "Diversity measures in the batch job"): checked against evaluate() on such qrels.
"""

from __future__ import annotations

import json
import math
import random

import pytest

import streameval
from streameval.jobs import batch
from streameval.io import avro
from streameval.io.cleaning import REASON_JUDGMENT_CONFLICT

try:
    import pyndeval
except ImportError:  # pragma: no cover
    pyndeval = None

needs_pyndeval = pytest.mark.skipif(pyndeval is None, reason="pyndeval is not installed (pip install "
                                    "'streameval[test]')")

BASE_TS = 1_574_553_600_000_000
# (name in the job, ndeval's column, alpha)
DIV = [("alpha_nDCG@5", "alpha-nDCG@5", 0.5), ("alpha-nDCG@10", "alpha-nDCG@10", 0.5),
       ("alpha_nDCG(alpha=0.3)@10", "alpha-nDCG@10", 0.3), ("ERR_IA@10", "ERR-IA@10", 0.5),
       ("nERR_IA@20", "nERR-IA@20", 0.5), ("NRBP", "NRBP", 0.5), ("AP_IA", "MAP-IA", 0.5),
       ("P_IA@5", "P-IA@5", 0.5), ("S_recall@10", "strec@10", 0.5), ("alpha_DCG@3", "alpha-DCG@3", 0.5),
       ("nNRBP", "nNRBP", 0.5)]
ADHOC = ["ndcg@10", "map", "P@5"]


def collection(seed: int, n_queries: int = 12):
    """Subtopic judgments (plus a few ad hoc ones), and one request per (system, query) with a
    device attribute: (qrels tuples, judgment records, impression records, {system: [(q, d) in
    rank order]}, {request: device})."""
    rnd = random.Random(seed)
    qrels, judg = [], []
    for q in range(1, n_queries + 1):
        qid = f"q{q}"
        docs = sorted(rnd.sample(range(40), rnd.randint(5, 20)))
        none_relevant = q == 4  # judged, but no relevant subtopic: 0 on every measure here
        for d in docs:
            for sub in range(1, rnd.randint(1, 5) + 1):
                if rnd.random() < 0.6:
                    g = 0 if none_relevant else rnd.randint(0, 2)
                    qrels.append((qid, str(sub), f"d{d:02d}", g))
                    judg.append({"query_id": qid, "subtopic": str(sub), "item_id": f"d{d:02d}", "grade": g,
                                 "timestamp": rnd.randint(0, 3), "source": "div"})
        if q % 3 == 0:  # ad hoc judgments (no subtopic) of some documents: the ad hoc measures only
            for d in rnd.sample(docs, 2):
                judg.append({"query_id": qid, "subtopic": None, "item_id": f"d{d:02d}", "grade": 3, "timestamp": 0,
                             "source": "adhoc"})
    judg += [dict(j) for j in rnd.sample(judg, 8)]  # replays: counted once
    imps, runs, device = [], {}, {}
    for system in ("A", "B"):
        for q in range(1, n_queries + 1):
            qid = f"q{q}"
            req = f"{system}-{qid}"
            device[req] = rnd.choice(["pc", "sp"])
            ranked = rnd.sample(range(45), rnd.randint(1, 25))
            for pos, d in enumerate(ranked, 1):
                imps.append({"event_id": f"{req}/{pos}", "request_id": req, "query_id": qid, "user_id": None,
                             "system_id": system, "item_id": f"d{d:02d}", "position": pos, "score": float(-pos),
                             "clicked": None, "timestamp": BASE_TS + q * 1000 + pos, "propensity": None,
                             "attributes": {"device": device[req]}})
                runs.setdefault(system, []).append((qid, f"d{d:02d}"))
    rnd.shuffle(imps)
    return qrels, judg, imps, runs, device


def run_job(tmp, imps, judg, metrics, extra=(), engines=("records", "columnar")):
    tmp.mkdir(parents=True, exist_ok=True)
    ip, jp = tmp / "imps.avro", tmp / "judg.avro"
    avro.write_records(ip, "impression", imps)
    avro.write_records(jp, "judgment", judg)
    out = {}
    for engine in engines:
        o = tmp / engine
        code = batch.main(["--impressions", str(ip), "--judgments", str(jp), "--output", str(o), "--quiet",
                           "--engine", engine, "--no-ctr", "--max-rejected-fraction", "1", "--metrics",
                           ",".join(metrics), *extra])
        assert code == 0, engine
        res = {}
        for f in ("metrics.jsonl", "dead_letters.jsonl"):
            lines = (o / f).read_text().splitlines() if (o / f).exists() else []
            res[f] = sorted(json.dumps(json.loads(x), sort_keys=True) for x in lines)
        res["counters"] = {k: v for k, v in json.loads((o / "summary.json").read_text())["counters"].items() if v}
        out[engine] = res
    return out


def rows_of(res) -> dict:
    return {(r["slice"], r["system"], r["metric"]): r for r in map(json.loads, res["metrics.jsonl"])}


def oracle(qrels, ranked, name_alpha):
    """{ndeval column: {qid: value}} of pyndeval on one system's run (rank order given)."""
    run = [(q, d, -float(i)) for i, (q, d) in enumerate(ranked)]
    out = {}
    for alpha in sorted({a for _, a in name_alpha}):
        cols = [c for c, a in name_alpha if a == alpha]
        per_q = pyndeval.RelevanceEvaluator(qrels, cols, alpha=alpha).evaluate(run)
        out[alpha] = per_q
    return out


@needs_pyndeval
@pytest.mark.parametrize("seed,extra", [(1, []), (2, ["--shards", "3", "--threads", "2"]),
                                        (3, ["--avro-decoder", "fastavro", "--judgment-conflicts", "max"])])
def test_batch_job_equals_pyndeval_per_system_and_slice(tmp_path, seed, extra):
    qrels, judg, imps, runs, device = collection(seed)
    names = [n for n, _, _ in DIV]
    # auc: labels from the judgments (an item's largest grade), the same on both engines
    got = run_job(tmp_path, imps, judg, names + ADHOC + ["auc"], ["--slices", "device", *extra])
    rec, col = got["records"], got["columnar"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]  # bit for bit
    assert col["dead_letters.jsonl"] == rec["dead_letters.jsonl"] == []
    assert col["counters"] == rec["counters"]
    rows = rows_of(col)
    assert rows[("all", "A", "nNRBP")]["num_queries"] == 11  # q4: NaN, left out
    for system, ranked in runs.items():
        ref = oracle(qrels, ranked, [(c, a) for _, c, a in DIV])
        qids = sorted({q for q, _ in ranked})
        for name, column, alpha in DIV:
            per_q = ref[alpha]
            assert set(per_q) == set(qids), (set(per_q) ^ set(qids))
            for sl in ("all", "device=pc", "device=sp"):
                members = [q for q in qids if sl == "all" or f"device={device[f'{system}-{q}']}" == sl]
                if not members:
                    continue
                # nNRBP is NaN where no subtopic has a relevant document (ndeval's 0 / 0): the
                # jobs' means skip a NaN value, as for every measure
                vals = [per_q[q][column] for q in members if not math.isnan(per_q[q][column])]
                if not vals:
                    continue
                want = math.fsum(vals) / len(vals)
                row = rows[(sl, system, name)]
                assert row["num_queries"] == len(vals)
                assert abs(row["value"] - want) <= 1e-9, (system, sl, name, row["value"], want)
    # the ad hoc measures on subtopic judgments: a document's grade is its largest (docs/metrics.md)
    adhoc: dict = {}
    for j in judg:
        g = adhoc.setdefault(j["query_id"], {}).get(j["item_id"])
        adhoc[j["query_id"]][j["item_id"]] = j["grade"] if g is None else max(g, j["grade"])
    for system, ranked in runs.items():
        run: dict = {}
        for i, (q, d) in enumerate(ranked):
            run.setdefault(q, {})[d] = -float(i)
        ev = streameval.evaluate(adhoc, run, ADHOC)
        for name in ADHOC:
            assert abs(rows[("all", system, name)]["value"] - ev[name]) <= 1e-12, (system, name)


@needs_pyndeval
def test_web_track_style_example(tmp_path):
    """A TREC Web track diversity topic (binary judgments per subtopic, several subtopics per document,
    a document relevant to none, an ad hoc query without subtopics next to it), checked by hand and
    against pyndeval."""
    # topic 51 "horse hooves"-like: 4 subtopics; d1 covers 1 and 2, d2 covers 1, d3 covers 3, d4 nothing
    qrels = [("51", "1", "d1", 1), ("51", "2", "d1", 1), ("51", "1", "d2", 1), ("51", "3", "d3", 1),
             ("51", "4", "d4", 0), ("51", "2", "d5", 1)]
    judg = [{"query_id": q, "subtopic": s, "item_id": d, "grade": g, "timestamp": 0, "source": "qrels.diversity"}
            for q, s, d, g in qrels]
    judg.append({"query_id": "52", "subtopic": None, "item_id": "x1", "grade": 1, "timestamp": 0, "source": "adhoc"})
    ranking = ["d2", "d1", "d4", "d3"]
    imps = [{"event_id": f"r1/{i}", "request_id": "r1", "query_id": "51", "user_id": None, "system_id": "S",
             "item_id": d, "position": i, "score": None, "clicked": None, "timestamp": BASE_TS + i,
             "propensity": None, "attributes": {}} for i, d in enumerate(ranking, 1)]
    imps += [{"event_id": "r2/1", "request_id": "r2", "query_id": "52", "user_id": None, "system_id": "S",
              "item_id": "x1", "position": 1, "score": None, "clicked": None, "timestamp": BASE_TS,
              "propensity": None, "attributes": {}}]
    names = ["S_recall@1", "S_recall@4", "P_IA@2", "alpha_nDCG@4", "ERR_IA@4", "AP_IA", "ndcg@4"]
    got = run_job(tmp_path, imps, judg, names, ["--order", "position"])
    assert got["columnar"]["metrics.jsonl"] == got["records"]["metrics.jsonl"]
    rows = rows_of(got["columnar"])
    # query 52 has no subtopic judgment: 0 on the diversity measures (S = 0), 1 on ndcg@4
    # subtopics with a relevant document: 1, 2, 3 (S = 3; subtopic 4 has none)
    # S-recall@1: d2 covers {1} -> 1/3; @4: {1, 2, 3} -> 1; mean with query 52's 0
    assert rows[("all", "S", "S_recall@1")]["value"] == pytest.approx((1 / 3 + 0) / 2, abs=1e-15)
    assert rows[("all", "S", "S_recall@4")]["value"] == pytest.approx((1 + 0) / 2, abs=1e-15)
    # P-IA@2: (d2: 1 pair, d1: 2 pairs) / (2 * 3)
    assert rows[("all", "S", "P_IA@2")]["value"] == pytest.approx((3 / 6 + 0) / 2, abs=1e-15)
    # MAP-IA: subtopic 1 (d2 at 1, d1 at 2: AP 1), 2 (d1 at 2, d5 not ranked: 1/2 / 2), 3 (d3 at 4: 1/4)
    assert rows[("all", "S", "AP_IA")]["value"] == pytest.approx(((1 + 0.25 + 0.25) / 3 + 0) / 2, abs=1e-15)
    assert rows[("all", "S", "ndcg@4")]["value"] == pytest.approx(
        (streameval.evaluate({"51": {"d1": 1, "d2": 1, "d3": 1, "d4": 0, "d5": 1}},
                             {"51": {d: -i for i, d in enumerate(ranking)}}, "ndcg@4").value() + 1) / 2, abs=1e-15)
    ref = pyndeval.RelevanceEvaluator(qrels, ["alpha-nDCG@4", "ERR-IA@4", "MAP-IA", "strec@4"]).evaluate(
        [("51", d, -float(i)) for i, d in enumerate(ranking)])["51"]
    for name, column in (("alpha_nDCG@4", "alpha-nDCG@4"), ("ERR_IA@4", "ERR-IA@4"), ("AP_IA", "MAP-IA"),
                         ("S_recall@4", "strec@4")):
        assert abs(rows[("all", "S", name)]["value"] - ref[column] / 2) <= 1e-12, name


def test_subtopic_conflicts_are_conflicts_of_their_own_key(tmp_path):
    """Two grades of one (query, subtopic, docno) conflict (policy reject: dead letters naming the
    subtopic); the same docno judged for two subtopics does not; both engines alike."""
    judg = [
        {"query_id": "q1", "subtopic": "1", "item_id": "d1", "grade": 1, "timestamp": 0, "source": "s"},
        {"query_id": "q1", "subtopic": "2", "item_id": "d1", "grade": 0, "timestamp": 0, "source": "s"},
        {"query_id": "q1", "subtopic": "1", "item_id": "d2", "grade": 1, "timestamp": 0, "source": "s"},
        {"query_id": "q1", "subtopic": "1", "item_id": "d2", "grade": 0, "timestamp": 0, "source": "s"},  # conflict
        {"query_id": "q1", "subtopic": None, "item_id": "d2", "grade": 2, "timestamp": 0, "source": "s"},  # ad hoc
        {"query_id": "q1", "subtopic": "2", "item_id": "d3", "grade": 1, "timestamp": 0, "source": "s"},
    ]
    imps = [{"event_id": f"r1/{i}", "request_id": "r1", "query_id": "q1", "user_id": None, "system_id": "S",
             "item_id": d, "position": i, "score": None, "clicked": None, "timestamp": BASE_TS + i,
             "propensity": None, "attributes": {}} for i, d in enumerate(["d2", "d1", "d3"], 1)]
    got = run_job(tmp_path, imps, judg, ["S_recall@1", "S_recall@3", "P_IA@3", "P@1"],
                  ["--order", "position", "--judgment-conflicts", "reject"])
    rec, col = got["records"], got["columnar"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    assert col["dead_letters.jsonl"] == rec["dead_letters.jsonl"]
    letters = [json.loads(x) for x in col["dead_letters.jsonl"]]
    assert len(letters) == 2
    assert all("query 'q1', subtopic '1', item 'd2': grades [0, 1]; policy reject" in x["reason"] for x in letters)
    assert col["counters"]["judgments_accepted"] == rec["counters"]["judgments_accepted"] == 4
    assert col["counters"][f"rejected:judgment:{REASON_JUDGMENT_CONFLICT}"] == 2
    rows = rows_of(col)
    # left: (1, d1) relevant, (2, d1) not, (2, d3) relevant; S = 2; d2 has no subtopic judgment left
    assert rows[("all", "S", "S_recall@1")]["value"] == 0.0
    assert rows[("all", "S", "S_recall@3")]["value"] == 1.0
    assert rows[("all", "S", "P_IA@3")]["value"] == 2 / 6
    assert rows[("all", "S", "P@1")]["value"] == 1.0  # d2's ad hoc grade 2


def test_other_commands_refuse_diversity_measures_in_one_line():
    from streameval.metrics.names import MetricNameError, parse_metrics

    with pytest.raises(MetricNameError, match="is a diversity measure.*`streameval batch` compute it"):
        parse_metrics(["alpha_nDCG@20"], arithmetic="the Beam jobs")
    specs = parse_metrics(["alpha_nDCG(alpha=0.3)@20", "NRBP"], arithmetic="the Beam jobs", diversity=True)
    assert [(s.family, s.k, s.name) for s in specs] == [("alpha-nDCG", 20, "alpha_nDCG(alpha=0.3)@20"),
                                                        ("NRBP", None, "NRBP")]


@needs_pyndeval
def test_columnar_stream_final_panes_equal_the_batch_job(tmp_path, capsys):
    """The streaming job's columnar engine (--watch) scores the diversity measures with the batch
    job's stages: its final panes equal the batch job's rows (per-record engine), bit for bit."""
    from streameval.jobs import stream

    qrels, judg, imps, runs, device = collection(5)
    names = [n for n, _, _ in DIV[:4]] + ["AP_IA", "S_recall@10", "ndcg@10"]
    watch = tmp_path / "watch"
    watch.mkdir()
    imps.sort(key=lambda r: r["timestamp"])
    half = len(imps) // 2
    for i, part in enumerate((imps[:half], imps[half:])):
        avro.write_records(watch / f"part-{i}.avro", "impression", part)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out = tmp_path / "stream"
    code = stream.main(["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judg.avro"),
                        "--metrics", ",".join(names), "--window", "1h", "--slices", "device", "--watch-interval",
                        "0.05", "--watch-idle-stop", "1", "--watch-delay", "7h", "--quiet", "--engine", "columnar",
                        "--no-ctr", "--output", str(out)])
    assert code == 0, capsys.readouterr()
    bout = tmp_path / "batch"
    assert batch.main(["--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judg.avro"),
                       "--metrics", ",".join(names), "--window", "1h", "--slices", "device", "--no-ctr", "--quiet",
                       "--engine", "records", "--output", str(bout)]) == 0
    from .test_stream import assert_final_equals_batch

    rows = [json.loads(line) for f in sorted(out.glob("metrics-*.jsonl")) for line in open(f)]
    brows = [json.loads(line) for line in open(bout / "metrics.jsonl")]
    assert {r["metric"] for r in brows} == set(names)
    assert_final_equals_batch(rows, brows)


def test_per_event_stream_engine_refuses_diversity_measures_in_one_line(tmp_path, capsys):
    from streameval.jobs import stream

    avro.write_records(tmp_path / "i.avro", "impression", [
        {"event_id": "e", "request_id": "r", "query_id": "q", "system_id": "S", "item_id": "d", "position": 1,
         "timestamp": BASE_TS}])
    avro.write_records(tmp_path / "j.avro", "judgment", [{"query_id": "q", "subtopic": "1", "item_id": "d",
                                                          "grade": 1}])
    code = stream.main(["--replay", "--impressions", str(tmp_path / "i.avro"), "--judgments", str(tmp_path / "j.avro"),
                        "--metrics", "alpha_nDCG@5", "--window", "1h", "--engine", "events", "--output",
                        str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "diversity measures (alpha_nDCG@5) need the columnar engine" in err


@needs_pyndeval
def test_complete_scores_a_missing_query_as_an_empty_ranking(tmp_path):
    """--complete (trec_eval -c): a judged query a system did not serve counts 0 (ndeval -c), on both
    engines, with the bootstrap too."""
    qrels, judg, imps, runs, device = collection(7)
    imps = [r for r in imps if not (r["system_id"] == "B" and r["query_id"] in ("q1", "q2"))]
    ranked = [(q, d) for q, d in runs["B"] if q not in ("q1", "q2")]
    got = run_job(tmp_path, imps, judg, ["alpha_nDCG@5", "NRBP"], ["--complete", "--ci", "bootstrap",
                                                                   "--replicates", "20"])
    assert got["records"]["metrics.jsonl"] == got["columnar"]["metrics.jsonl"]
    assert got["columnar"]["counters"]["requests_completed"] == 2
    rows = rows_of(got["columnar"])
    ref = oracle(qrels, ranked, [("alpha-nDCG@5", 0.5), ("NRBP", 0.5)])[0.5]
    for name, column in (("alpha_nDCG@5", "alpha-nDCG@5"), ("NRBP", "NRBP")):
        row = rows[("all", "B", name)]
        assert row["num_queries"] == 12
        assert abs(row["value"] - math.fsum(v[column] for v in ref.values()) / 12) <= 1e-9
