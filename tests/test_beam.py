"""Beam layer: CombineFn contracts, ScoreRankings / ClickMetrics against the library and trec_eval,
and the batch job end to end. Every pipeline runs on FnApiRunner (named explicitly)."""

import csv
import json
import math
import random
import uuid
import warnings
from collections import Counter, defaultdict
from datetime import datetime

import numpy as np
import pytest

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from streameval.jobs import batch
from streameval import api
from streameval.accumulators.ranking import RankingOps
from streameval.beam.combiners import (
    CtrByPositionCombineFn,
    CtrCombineFn,
    MeanCombineFn,
    RankingStateCombineFn,
)
from streameval.beam.transforms import (
    ClickMetrics,
    ScoreRankings,
    ValidateImpressions,
    parse_slices,
    parse_window,
    slice_labels,
    window_bounds,
)
from streameval.io import avro, convert, trec
from streameval.metrics.kernel import MetricOptions, compute
from streameval.metrics.names import ALL_TREC, parse_metrics

from .conftest import data_path
from .test_dl_hard import _v9

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

DL_RUNS = ["bm25.run", "bm25+bert(zs).run"]
# the Beam jobs aggregate arithmetic means and totals: all of all_trec but the geometric gm_map, gm_bpref
DL_METRICS = [s.name for s in ALL_TREC if s.average != "geometric"] + ["err@20", "dcg@10"]
HOUR = 3_600_000_000
DAY = 24 * HOUR
BASE_TS = 1_700_000_000_000_000 - 1_700_000_000_000_000 % DAY  # a day boundary (2023-11-14)

# --------------------------------------------------------------------------------------------
# helpers

_SINKS: dict = {}


def _put(x, key):
    _SINKS.setdefault(key, []).append(x)


def run_pipeline(build, options=(), counters=None):
    """Run ``build(p) -> {name: pcoll}`` on FnApiRunner; return {name: [elements]}. With
    ``counters`` (a namespace), also ``"counters"``: {name: committed value}."""
    p = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(list(options)))
    outs = build(p)
    keys = {}
    for name, pc in outs.items():
        keys[name] = uuid.uuid4().hex
        _SINKS[keys[name]] = []
        pc | f"Sink{name}" >> beam.Map(_put, keys[name])
    result = p.run()
    result.wait_until_finish()
    got = {name: _SINKS.pop(k) for name, k in keys.items()}
    if counters:
        q = result.metrics().query(MetricsFilter().with_namespace(counters))["counters"]
        got["counters"] = {c.key.metric.name: c.committed for c in q}
    return got


def read_avro(p, paths, name, label):
    return p | label >> batch.ReadAvro(paths, name)


def from_avro(p, tmp_path, items, name, label):
    """Records through an Avro file in tmp_path (much faster than beam.Create on large lists)."""
    path = str(tmp_path / f"{label}-{uuid.uuid4().hex[:8]}.avro")
    avro.write_records(path, name, items)
    return read_avro(p, [path], name, label)


def create(p, items, label):
    """beam.Create without element-type inference (slow on large lists)."""
    return p | label >> beam.Create(items).with_output_types(dict)


def by_key(rows):
    out = {}
    for r in rows:
        k = (r["window_start"], r["slice"], r["system"], r["metric"])
        assert k not in out, f"duplicate row {k}"
        out[k] = r
    return out


def system_means(rows, window_start=None, slice_="all"):
    """{system: {metric: value}} of one window and slice."""
    out = defaultdict(dict)
    for r in rows:
        if r["window_start"] == window_start and r["slice"] == slice_:
            out[r["system"]][r["metric"]] = r["value"]
    return dict(out)


def run_columns(impressions):
    """(qid, docno, score) arrays of impression dicts, for api.evaluate."""
    return (np.array([r["query_id"] for r in impressions], dtype=str),
            np.array([r["item_id"] for r in impressions], dtype=str),
            np.array([r["score"] for r in impressions], dtype=np.float64))


@pytest.fixture(scope="module")
def dl_hard(tmp_path_factory):
    """Two DL-HARD runs as impression Avro files, the qrels as a judgment Avro file."""
    tmp = tmp_path_factory.mktemp("dl_hard")
    qrels_path = data_path("dl_hard_passage", "dl_hard-passage.qrels")
    qrels = trec.read_qrels(qrels_path)
    judgments = list(convert.trec_qrels_to_judgments(qrels))
    avro.write_records(tmp / "judgments.avro", "judgment", judgments)
    runs, paths, imps = {}, [], {}
    for name in DL_RUNS:
        run_path = data_path("dl_hard_passage", "runs", name)
        run = trec.read_run(run_path)
        recs = list(convert.trec_run_to_impressions(run, system_id=name))
        imps[name] = recs
        paths.append(str(tmp / f"{name}.avro"))
        avro.write_records(paths[-1], "impression", recs)
        runs[name] = run_path
    return {"qrels": qrels_path, "qrels_obj": qrels, "judgments": judgments, "judgment_path": str(tmp / "judgments.avro"),
            "runs": runs, "paths": paths, "impressions": imps}


# --------------------------------------------------------------------------------------------
# combiner contracts

def _ranking_inputs(rnd, n=40):
    return [{"item_id": f"d{i}", "score": float(rnd.randint(0, 9)), "position": i + 1,
             "clicked": rnd.random() < 0.3, "timestamp": 1000 + rnd.randint(0, 50), "query_id": "q1",
             "attributes": {"campaign": rnd.choice(["men", "women"]), "device": "pc"}}
            for i in range(n)]


def _combiner_cases():
    ops = RankingOps(order="score", tie_break="docno")
    return [
        ("ranking", RankingStateCombineFn(ops, ["campaign"]), _ranking_inputs),
        ("mean", MeanCombineFn(3, totals=[False, False, True]),
         lambda rnd: [[rnd.random(), rnd.choice([0.0, 1.0, 0.5]), float(rnd.randint(0, 9))] for _ in range(50)]),
        ("ctr", CtrCombineFn(), lambda rnd: [rnd.random() < 0.2 for _ in range(60)]),
        ("ctr_pos", CtrByPositionCombineFn(),
         lambda rnd: [(rnd.randint(1, 4), rnd.random() < 0.2) for _ in range(60)]),
    ]


class _NoFallback(beam.coders.Coder):
    def encode(self, value):
        raise AssertionError(f"accumulator holds a non-primitive {type(value).__name__}: would be pickled")

    def decode(self, encoded):
        raise AssertionError("no fallback")


_STRICT = beam.coders.FastPrimitivesCoder(fallback_coder=_NoFallback())


def _fold(fn, items):
    acc = fn.create_accumulator()
    for x in items:
        acc = fn.add_input(acc, x)
    return acc


def _canon(out):
    """Outputs with NaN made comparable."""
    return json.loads(json.dumps(out, default=str).replace("NaN", '"nan"'))


@pytest.mark.parametrize("name,fn,gen", _combiner_cases(), ids=[c[0] for c in _combiner_cases()])
def test_combiner_contract(name, fn, gen):
    rnd = random.Random(7)
    coder = fn.get_accumulator_coder()
    assert isinstance(coder, beam.coders.FastPrimitivesCoder)
    # merge of nothing is a fresh accumulator; extracting it gives NaN with count 0
    empty = fn.merge_accumulators([])
    assert coder.encode(empty) == coder.encode(fn.create_accumulator())
    out = fn.extract_output(empty)
    if name == "mean":
        assert all(math.isnan(v) and n == 0 for v, n, _ in out)
    elif name == "ctr":
        assert math.isnan(out[0]) and out[1] == 0
    elif name == "ctr_pos":
        assert out == {}
        assert math.isnan(CtrCombineFn().extract_output(CtrCombineFn().merge_accumulators([]))[0])
    else:
        assert out[0] == [{}, {}, 0, None] and out[1] is None and out[2] == {}

    items = gen(rnd)
    whole = fn.extract_output(_fold(fn, items))
    for trial in range(5):
        shuffled = list(items)
        rnd.shuffle(shuffled)
        cuts = sorted(rnd.sample(range(1, len(items)), 4))
        parts = [shuffled[a:b] for a, b in zip([0] + cuts, cuts + [len(items)])]
        accs = [_fold(fn, part) for part in parts] + [fn.create_accumulator()]
        # through the coder, as between workers: plain primitives, no pickle
        for a in accs:  # plain primitives only: a coder without the pickle fallback encodes them
            assert _STRICT.decode(_STRICT.encode(a)) == a
        accs = [coder.decode(coder.encode(a)) for a in accs]
        rnd.shuffle(accs)
        merged = fn.merge_accumulators([fn.merge_accumulators(accs[:2]), fn.merge_accumulators(accs[2:])])
        assert coder.decode(coder.encode(merged)) == merged
        assert _canon(fn.extract_output(merged)) == _canon(whole), trial


def test_mean_combiner_matches_aggregate():
    rnd = random.Random(3)
    specs = parse_metrics(["map", "num_rel"])
    values = np.array([[rnd.random() / 3 for _ in range(101)], [float(rnd.randint(0, 30)) for _ in range(101)]])
    fn = MeanCombineFn(2, totals=[s.is_count for s in specs])
    out = fn.extract_output(_fold(fn, values.T.tolist()))
    for i, s in enumerate(specs):
        assert out[i][0] == api.aggregate(values[i], s)
        assert out[i][1] == 101


def test_ranking_combiner_scores_like_one_pass():
    """A request split into pieces and merged in any order scores like the whole request."""
    rnd = random.Random(11)
    specs = parse_metrics(["ndcg@5", "map", "P@3", "num_ret"])
    ops = RankingOps(depth=8)
    fn = RankingStateCombineFn(ops)
    items = _ranking_inputs(rnd, 30)
    judged = {f"d{i}": float(rnd.randint(0, 3)) for i in range(0, 30, 2)}
    ref = _fold(fn, items)[0]
    ref = [ref[0], judged, ref[2], ref[3]]
    expected = compute(ops.to_lists([ref]), specs, MetricOptions())
    for _ in range(5):
        rnd.shuffle(items)
        parts = [items[i::3] + items[:2] for i in range(3)]  # overlapping duplicates too
        acc = fn.merge_accumulators([fn.merge_accumulators([_fold(fn, parts[2])]), _fold(fn, parts[0]),
                                     _fold(fn, parts[1])])
        st = [acc[0][0], judged, acc[0][2], acc[0][3]]
        assert acc[0][3] == min(r["timestamp"] for r in items)
        assert np.array_equal(compute(ops.to_lists([st]), specs, MetricOptions()), expected)


def test_helpers():
    assert parse_window("1h") == 3600 and parse_window("1d") == 86400 and parse_window("3600s") == 3600
    assert parse_window("none") is None and parse_window(None) is None and parse_window(90) == 90
    with pytest.raises(ValueError):
        parse_window("soon")
    assert parse_slices(["campaign", "campaign,device", "campaign"]) == [("campaign",), ("campaign", "device")]
    assert slice_labels({"campaign": "men"}, parse_slices(["campaign", "campaign,device"])) == [
        "all", "campaign=men", "campaign=men,device=(missing)"]
    assert window_bounds(BASE_TS + 5, HOUR) == (BASE_TS, BASE_TS + HOUR)
    assert window_bounds(BASE_TS + 5, None) == (None, None)
    assert batch.split_metrics("P.5,10,map, ndcg@10") == ["P.5,10", "map", "ndcg@10"]


# --------------------------------------------------------------------------------------------
# ScoreRankings on DL-HARD

def _parse_eval_all(path):
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 3 and parts[1] == "all":
            out[parts[0]] = parts[2]
    return out


def test_score_rankings_dl_hard_equals_evaluate_and_trec_eval(dl_hard):
    opts = dict(relevance_level=2, depth=1000, complete=True)

    def build(p):
        judg = read_avro(p, [dl_hard["judgment_path"]], "judgment", "ReadJ")
        imps = read_avro(p, dl_hard["paths"], "impression", "ReadI")
        st = ScoreRankings(judg, DL_METRICS, **opts)
        rows = imps | st
        return {"rows": rows, "unjudged": st.unjudged}

    out = run_pipeline(build)
    rows = out["rows"]
    assert out["unjudged"] == []
    assert len(rows) == len(DL_RUNS) * len(DL_METRICS)
    got = system_means(rows)
    specs = parse_metrics(DL_METRICS)
    for name, run_path in dl_hard["runs"].items():
        ev = api.evaluate(str(dl_hard["qrels"]), str(run_path), DL_METRICS, **opts)
        assert got[name] == ev.means  # exact, bit for bit
        for r in rows:
            if r["system"] == name:
                assert r["num_queries"] == 50 and r["window_start"] is None and r["slice"] == "all"
        trec_all = _parse_eval_all(str(run_path) + ".eval")
        checked = 0
        for s in specs:
            t = s.trec_name
            if t is None or t == "num_rel":  # num_rel 'all' under -c: grade > 0, ignores -l
                continue
            if t not in trec_all or _v9(t):  # the .eval files are trec_eval 9's (test_dl_hard._v9)
                continue
            assert f"{got[name][s.name]:.4f}" == f"{float(trec_all[t]):.4f}", (name, t)
            checked += 1
        # all but num_rel, gm_map, gm_bpref, and what trec_eval 9 lacks or computes otherwise
        assert checked == len([s for s in specs if s.trec_name in trec_all and not _v9(s.trec_name)]) - 1
        assert int(trec_all["num_q"]) == 50


def test_score_rankings_windows(dl_hard, tmp_path):
    """Two hourly windows of synthetic event times: each window equals evaluate() on its subset;
    a request straddling the boundary belongs to the window of its earliest impression."""
    name = DL_RUNS[0]
    recs = [dict(r) for r in dl_hard["impressions"][name]]
    qids = sorted({r["query_id"] for r in recs})
    win = {q: i % 2 for i, q in enumerate(qids)}
    straddler = qids[0]  # window 0 by its first impression, later impressions in window 1
    for r in recs:
        w = win[r["query_id"]]
        r["timestamp"] = BASE_TS + w * HOUR + 1000 * r["position"]
        if r["query_id"] == straddler and r["position"] > 3:
            r["timestamp"] += HOUR
    path = str(tmp_path / "imps.avro")
    avro.write_records(path, "impression", recs)

    def build(p):
        judg = read_avro(p, [dl_hard["judgment_path"]], "judgment", "ReadJ")
        imps = read_avro(p, [path], "impression", "ReadI")
        return {"rows": imps | ScoreRankings(judg, ["ndcg@10", "map", "P@10", "num_ret", "err@20"], window="1h",
                                             relevance_level=2, complete=True)}

    rows = run_pipeline(build)["rows"]
    assert {(r["window_start"], r["window_end"]) for r in rows} == {
        (BASE_TS, BASE_TS + HOUR), (BASE_TS + HOUR, BASE_TS + 2 * HOUR)}
    for w in (0, 1):
        sub = [r for r in recs if win[r["query_id"]] == w]
        ev = api.evaluate(str(dl_hard["qrels"]), run_columns(sub), ["ndcg@10", "map", "P@10", "num_ret", "err@20"],
                          relevance_level=2)
        got = system_means(rows, window_start=BASE_TS + w * HOUR)
        assert got == {name: ev.means}
        assert {r["num_queries"] for r in rows if r["window_start"] == BASE_TS + w * HOUR} == {len(qids) // 2}


def test_score_rankings_slices(dl_hard, tmp_path):
    """Slices by one attribute and by a combination, with a missing attribute."""
    name = DL_RUNS[1]
    recs = dl_hard["impressions"][name]
    qids = sorted({r["query_id"] for r in recs})
    half = {q: "ab"[i % 2] for i, q in enumerate(qids)}
    dev = {q: ("pc", "sp", None)[i % 3] for i, q in enumerate(qids)}
    sliced = []
    for r in recs:
        attrs = {"half": half[r["query_id"]]}
        if dev[r["query_id"]] is not None and r["position"] % 2 == 1:  # carried by some impressions only
            attrs["dev"] = dev[r["query_id"]]
        sliced.append(dict(r, attributes=attrs))
    metrics = ["ndcg@10", "map", "recall@100", "num_rel"]

    def build(p):
        judg = read_avro(p, [dl_hard["judgment_path"]], "judgment", "J")
        imps = from_avro(p, tmp_path, sliced, "impression", "I")
        return {"rows": imps | ScoreRankings(judg, metrics, slices=["half", "half,dev"], relevance_level=2)}

    rows = run_pipeline(build)["rows"]
    labels = {r["slice"] for r in rows}
    expected_labels = {"all", "half=a", "half=b"} | {f"half={h},dev={d or '(missing)'}"
                                                    for q in qids for h, d in [(half[q], dev[q])]}
    assert labels == expected_labels
    for label in labels:
        def member(q):
            if label == "all":
                return True
            parts = dict(kv.split("=") for kv in label.split(","))
            return half[q] == parts["half"] and ("dev" not in parts or (dev[q] or "(missing)") == parts["dev"])

        sub = [r for r in recs if member(r["query_id"])]
        ev = api.evaluate(str(dl_hard["qrels"]), run_columns(sub), metrics, relevance_level=2)
        assert system_means(rows, slice_=label) == {name: ev.means}, label


# several workers after a shuffle: each request's impressions reach the combiner in several bundles
SPLIT_OPTIONS = ["--direct_num_workers=4", "--direct_running_mode=multi_threading"]


class _CountingRankingCombineFn(RankingStateCombineFn):
    def merge_accumulators(self, accumulators):
        accs = list(accumulators)
        Metrics.counter("test_beam", f"merged_{sum(1 for a in accs if a[0][0])}").inc()
        return super().merge_accumulators(accs)


def test_request_split_across_bundles_and_duplicates(dl_hard):
    """A request's impressions arriving in several PCollections and bundles, some twice, and its
    judgments split too, score like the whole request."""
    name = DL_RUNS[0]
    qids = sorted({r["query_id"] for r in dl_hard["impressions"][name]})[:6]
    recs = [r for r in dl_hard["impressions"][name] if r["query_id"] in qids]
    judg = [j for j in dl_hard["judgments"] if j["query_id"] in qids]
    rnd = random.Random(5)
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    parts = [shuffled[i::4] for i in range(4)] + [rnd.sample(recs, 300)]  # the last part replays events
    jparts = [judg[::2], judg[1::2]]
    metrics = ["ndcg@10", "map", "bpref", "mrr@10", "num_ret", "num_rel_ret"]

    def inputs(p):
        imps = ([create(p, part, f"I{i}") for i, part in enumerate(parts)] | "FlatI" >> beam.Flatten()
                | "ShuffleI" >> beam.Reshuffle())
        js = [create(p, part, f"J{i}") for i, part in enumerate(jparts)] | "FlatJ" >> beam.Flatten()
        return imps, js

    # the setup really hands the combiner several partial accumulators of one request
    def probe(p):
        imps, _ = inputs(p)
        return {"states": imps | beam.Map(lambda r: (r["request_id"], r))
                | beam.CombinePerKey(_CountingRankingCombineFn(RankingOps()))}

    out = run_pipeline(probe, SPLIT_OPTIONS, counters="test_beam")
    assert max(int(k.split("_")[1]) for k, v in out["counters"].items() if v) > 1, out["counters"]
    assert sorted(len(acc[0][0]) for _, acc in out["states"]) == [1000] * 6

    def build(p):
        imps, js = inputs(p)
        return {"rows": imps | ScoreRankings(js, metrics, relevance_level=2)}

    rows = run_pipeline(build, SPLIT_OPTIONS)["rows"]
    ev = api.evaluate(str(dl_hard["qrels"]), run_columns(recs), metrics, relevance_level=2)
    assert system_means(rows) == {name: ev.means}
    assert {r["num_queries"] for r in rows} == {6}


def test_unjudged_requests_and_unscorable_impressions_are_reported():
    imps = []
    for q, sys_ in [("q1", "A"), ("q2", "A"), ("q1", "B"), ("q9", "B")]:
        for i in range(3):
            imps.append({"event_id": f"{sys_}{q}{i}", "request_id": f"{sys_}/{q}", "query_id": q, "system_id": sys_,
                         "item_id": f"d{i}", "position": i + 1, "score": None if (q, sys_, i) == ("q2", "A", 2)
                         else float(3 - i), "clicked": False, "timestamp": 0, "attributes": {}})
    judg = [{"query_id": q, "item_id": f"d{i}", "grade": g, "timestamp": 0, "source": ""}
            for q in ("q1", "q2", "q3") for i, g in enumerate([1, 0, 2])]
    # a later judgment supersedes an earlier one
    judg.append({"query_id": "q1", "item_id": "d0", "grade": 0, "timestamp": 5, "source": "redo"})

    def build(p):
        st = ScoreRankings(create(p, judg, "J"), ["P@2", "num_ret", "num_rel"], complete=True)
        rows = create(p, imps, "I") | st
        return {"rows": rows, "unjudged": st.unjudged, "rejected": st.rejected}

    out = run_pipeline(build)
    assert [(u["query_id"], u["system"]) for u in out["unjudged"]] == [("q9", "B")]
    assert len(out["rejected"]) == 1 and "score" in out["rejected"][0]["reason"]
    got = {(r["system"], r["metric"]): (r["value"], r["num_queries"]) for r in out["rows"]}
    # A: q1 (d0 now grade 0: P@2 = 0); its q2 request lacks a score for d2, so the whole request is
    # a dead letter (ranking it without d2 would change its metrics) and q2, like q3, is filled 0
    # B: q1 (0), q2 and q3 filled 0
    run = {"A": {"q1": {"d0": 3, "d1": 2, "d2": 1}},
           "B": {"q1": {"d0": 3, "d1": 2, "d2": 1}, "q9": {"d0": 3}}}
    qrels = {q: {f"d{i}": g for i, g in enumerate([1, 0, 2])} for q in ("q1", "q2", "q3")}
    qrels["q1"]["d0"] = 0
    for s in ("A", "B"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ev = api.evaluate(qrels, run[s], ["P@2", "num_ret", "num_rel"], complete=True)
        assert {m: got[(s, m)][0] for m in ev.means} == ev.means
        assert got[(s, "P@2")][1] == 3


# --------------------------------------------------------------------------------------------
# ClickMetrics on the Open Bandit Dataset

def test_click_metrics_obd_daily(tmp_path):
    paths = {pol: data_path("obd", pol, "all", "all.csv") for pol in ("bts", "random")}
    imps = []
    for pol, path in paths.items():
        imps.extend(convert.obd_to_impressions(path, pol))
    # the direct count, with the csv module
    exp = Counter()
    for pol, path in paths.items():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                day = datetime.fromisoformat(row["timestamp"]).date().isoformat()
                click = int(row["click"])
                for key in [(pol, day, "ctr"), (pol, day, f"ctr@pos{int(row['position'])}")]:
                    exp[key + ("n",)] += 1
                    exp[key + ("c",)] += click

    def build(p):
        return {"rows": from_avro(p, tmp_path, imps, "impression", "I") | ClickMetrics(window="1d", slices=["campaign"])}

    rows = run_pipeline(build)["rows"]
    seen = 0
    for r in rows:
        day = datetime.utcfromtimestamp(r["window_start"] / 1e6).date().isoformat()
        assert r["window_end"] - r["window_start"] == 86_400_000_000
        assert r["slice"] in ("all", "campaign=all")
        key = (r["system"], day, r["metric"])
        assert r["num_queries"] == exp[key + ("n",)]
        assert r["value"] == exp[key + ("c",)] / exp[key + ("n",)]
        seen += r["slice"] == "all"
    assert seen == len(exp) // 2
    assert sum(r["num_queries"] for r in rows if r["metric"] == "ctr" and r["slice"] == "all") == 20_000
    assert {r["metric"] for r in rows} == {"ctr", "ctr@pos1", "ctr@pos2", "ctr@pos3"}


# --------------------------------------------------------------------------------------------
# the batch job end to end

def _small_logs():
    rnd = random.Random(1)
    imps, judg = [], []
    for q in range(4):
        for item in range(8):
            judg.append({"query_id": f"q{q}", "item_id": f"d{item}", "grade": rnd.randint(0, 3), "timestamp": 0,
                         "source": "test"})
    for sys_ in ("alpha", "beta"):
        for q in range(5):  # q4 has no judgments
            for rep in range(2):  # two requests per query, in two different days
                req = f"{sys_}-{q}-{rep}"
                for pos, item in enumerate(rnd.sample(range(10), 6), 1):
                    imps.append({"event_id": f"{req}/{item}", "request_id": req, "query_id": f"q{q}",
                                 "user_id": None, "system_id": sys_, "item_id": f"d{item}", "position": pos,
                                 "score": float(10 - pos), "clicked": rnd.random() < 0.3,
                                 "timestamp": BASE_TS + rep * 86_400_000_000 + pos, "propensity": None,
                                 "attributes": {"device": rnd.choice(["pc", "sp"])} if q != 2 else {}})
    return imps, judg


def test_batch_main_end_to_end(tmp_path, capsys):
    imps, judg = _small_logs()
    bad = dict(imps[0], event_id="bad", position=0)
    avro.write_records(tmp_path / "in" / "imps-1.avro", "impression", imps[:70])
    avro.write_records(tmp_path / "in" / "imps-2.avro", "impression", imps[70:] + [bad])
    avro.write_records(tmp_path / "judgments.avro", "judgment", judg)
    out_dir = tmp_path / "out"
    metrics = "ndcg@5,map,mrr@10,P@5"
    code = batch.main(["--impressions", str(tmp_path / "in" / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
                       "--metrics", metrics, "--window", "1d", "--slices", "device", "--output", str(out_dir)])
    assert code == 0
    for f in batch.OUTPUT_FILES:
        assert (out_dir / f).is_file(), f
    printed = capsys.readouterr().out
    print(printed)
    assert "requests: scored 16, without judgments 4" in printed
    assert ("impressions: read 121 = accepted 120 + rejected 1 (position must be >= 1 (1-based): 1); "
            "of the accepted: ranked 96, unjudged 24, unrankable 0, click impressions 120, "
            "click impressions not logged 0") in printed
    assert "judgments: read 32 = accepted 32" in printed
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["accounting_problems"] == []
    assert summary["accounting"]["impression"]["rejected"] == {"position must be >= 1 (1-based)": 1}
    unjudged = [json.loads(line) for line in open(out_dir / "unjudged.jsonl")]
    assert len(unjudged) == 4 and sum(u["impressions"] for u in unjudged) == 24

    jsonl = [json.loads(line) for line in open(out_dir / "metrics.jsonl")]
    from_avro = list(avro.read_records(str(out_dir / "metrics.avro"), "metric_result"))
    assert by_key(jsonl) == by_key(from_avro)

    # the same rows in memory, from the transforms
    def build(p):
        valid, _ = create(p, imps, "I") | ValidateImpressions("mem")
        j = create(p, judg, "J")
        a = valid | ScoreRankings(j, metrics.split(","), window="1d", slices=["device"])
        b = valid | ClickMetrics(window="1d", slices=["device"])
        return {"rows": (a, b) | beam.Flatten()}

    mem = run_pipeline(build)["rows"]
    assert by_key(jsonl) == by_key(mem)
    assert {r["metric"] for r in jsonl} == {"ndcg@5", "map", "mrr@10", "P@5", "ctr", *(f"ctr@pos{i}" for i in range(1, 7))}
    assert {r["slice"] for r in jsonl} == {"all", "device=pc", "device=sp", "device=(missing)"}
    # a day's ranking value agrees with evaluate() on that day's requests
    day0 = [r for r in imps if r["timestamp"] < BASE_TS + 86_400_000_000]
    ev = api.evaluate({q: {j["item_id"]: j["grade"] for j in judg if j["query_id"] == q} for q in ("q0", "q1", "q2", "q3")},
                      run_columns([r for r in day0 if r["system_id"] == "alpha"]), metrics.split(","))
    got = system_means(jsonl, window_start=BASE_TS)["alpha"]
    assert {m: got[m] for m in ev.means} == ev.means

    dead = [json.loads(line) for line in open(out_dir / "dead_letters.jsonl")]
    assert len(dead) == 1 and dead[0]["reason"].startswith("position must be >= 1")
    assert json.loads(dead[0]["raw"])["event_id"] == "bad"
    assert list(avro.read_records(str(out_dir / "dead_letters.avro"), "dead_letter")) == dead
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["counters"]["impressions_read"] == 121 and summary["num_rows"] == len(jsonl)


def test_batch_main_rejects_bad_arguments(tmp_path, capsys):
    assert batch.main(["--impressions", str(tmp_path / "none*.avro"), "--output", str(tmp_path / "o")]) == 2
    assert batch.main(["--impressions", "x.avro", "--metrics", "ndgc@10", "--judgments", "y.avro",
                       "--output", str(tmp_path / "o")]) == 2
    assert "error" in capsys.readouterr().err


def test_click_logs_and_judged_runs_in_one_job():
    """An unscored click log (its queries unjudged) and a scored run without click data, together:
    the click log's requests are 'unjudged', not dead letters, and count in CTR; the run's
    impressions (clicked null) are left out of CTR and scored for ranking."""
    imps = []
    for r in range(4):  # click log: no scores, 3 slots, one click per request on slot r % 3 + 1
        for pos in (1, 2, 3):
            imps.append({"event_id": f"c{r}{pos}", "request_id": f"c{r}", "query_id": "page", "system_id": "logger",
                         "item_id": f"i{pos}", "position": pos, "score": None, "clicked": pos == r % 3 + 1,
                         "timestamp": 0, "attributes": {}})
    for i in range(3):  # a run: scores, no clicks
        imps.append({"event_id": f"t{i}", "request_id": "t/q", "query_id": "q", "system_id": "ranker",
                     "item_id": f"d{i}", "position": i + 1, "score": float(3 - i), "clicked": None,
                     "timestamp": 0, "attributes": {}})
    judg = [{"query_id": "q", "item_id": "d1", "grade": 1, "timestamp": 0, "source": ""}]

    def build(p):
        i = create(p, imps, "I")
        st = ScoreRankings(create(p, judg, "J"), ["recip_rank"])
        return {"rank": i | st, "clicks": i | ClickMetrics(), "unjudged": st.unjudged, "rejected": st.rejected}

    out = run_pipeline(build)
    assert out["rejected"] == []
    assert sorted(u["request_id"] for u in out["unjudged"]) == ["c0", "c1", "c2", "c3"]
    assert [(r["system"], r["metric"], r["value"]) for r in out["rank"]] == [("ranker", "recip_rank", 0.5)]
    clicks = {(r["system"], r["metric"]): (r["value"], r["num_queries"]) for r in out["clicks"]}
    assert clicks[("logger", "ctr")] == (4 / 12, 12)
    assert clicks[("logger", "ctr@pos1")] == (2 / 4, 4)  # requests 0 and 3 clicked slot 1
    assert not any(s == "ranker" for s, _ in clicks)


def test_batch_main_refuses_unquoted_glob(tmp_path, capsys):
    """`--impressions a*.avro` unquoted: the shell passes several files; all but the first would be
    ignored by Beam's option parser, so the job refuses with a clear message."""
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f"a{i}.avro"))
        avro.write_records(paths[-1], "impression", [])
    assert batch.main(["--impressions", paths[0], paths[1], "--output", str(tmp_path / "out")]) == 2
    assert "quote the glob" in capsys.readouterr().err


def test_ir_measures_names_score_as_in_evaluate():
    """ir_measures names with their own relevance level / gain (issue 17) next to the global options:
    the batch job's rows, named as written, equal evaluate()'s means; the cutoffs and options of each
    name survive the job's pruning to the top K."""
    rnd = random.Random(17)
    imps, judg = [], []
    for q in range(8):
        qid = f"q{q}"
        docs = [f"d{i}" for i in range(rnd.randint(3, 14))]
        for d in docs:
            if rnd.random() < 0.7:
                judg.append({"query_id": qid, "item_id": d, "grade": rnd.choice([0, 1, 2, 3]), "timestamp": 0,
                             "source": ""})
        for s in ("A", "B"):
            served = rnd.sample(docs, rnd.randint(1, len(docs)))
            for i, d in enumerate(served):
                imps.append({"event_id": f"{s}{qid}{d}", "request_id": f"{s}/{qid}", "query_id": qid,
                             "system_id": s, "item_id": d, "position": i + 1, "score": float(len(served) - i),
                             "clicked": False, "timestamp": 0, "attributes": {}})
    metrics = ["P@3", "P(rel=1)@3", "AP(rel=3)@5", "nDCG(dcg='exp-log2')@4", "ndcg@4", "Judged@3", "hits@2",
               "NumQ", "RR(rel=1)@3", "R@5"]

    def build(p):
        return {"rows": create(p, imps, "I") | ScoreRankings(create(p, judg, "J"), metrics, relevance_level=2)}

    rows = run_pipeline(build)["rows"]
    qrels = defaultdict(dict)
    for j in judg:
        qrels[j["query_id"]][j["item_id"]] = j["grade"]
    got = system_means(rows)
    for s in ("A", "B"):
        sub = [r for r in imps if r["system_id"] == s]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ev = api.evaluate(dict(qrels), run_columns(sub), metrics, relevance_level=2)
        assert got[s] == ev.means
        assert "AP(rel=3)@5" in got[s] and "nDCG(dcg='exp-log2')@4" in got[s]
