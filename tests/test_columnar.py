"""The batch job's columnar engine against its per-record engine, on messy logs.

Reference: the per-record engine (``--engine records``: ValidateImpressions, CleanImpressions,
ScoreRankings, ClickMetrics, one Beam element per record), itself checked against ``evaluate()``,
trec_eval's outputs and hand calculations elsewhere. Both engines run on the same files: replays,
conflicting events, items served twice, invalid records, null scores and clicks, missing attributes,
requests across files and windows, conflicting and out-of-range judgments, several systems. Metric
rows must be equal to the bit, and dead letters, unjudged requests and counters equal.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from streameval.jobs import batch
from streameval.beam import columnar, columnar_clean, columnar_columns, columnar_read
from streameval.io import avro
from streameval.io.cleaning import clean_request

BASE_TS = 1_574_553_600_000_000


#: seeds whose scores are probabilities (0, 1/6, ..., 1; the conflicting copies' scores above 1)
_PROBABILITY_SEEDS = {13}
#: seeds whose impressions carry an interleaving team (attributes["team"]: "A", "B", rarely absent or "C")
_TEAM_SEEDS = {18, 19}


def _messy_logs(seed: int):
    rnd = random.Random(seed)
    score_scale = 6 if seed in _PROBABILITY_SEEDS else 2
    queries = [f"q{i}" for i in range(14)]
    judg = []
    for q in queries[:-3]:  # the last three queries have no judgment
        for i in rnd.sample(range(12), 8):
            judg.append({"query_id": q, "item_id": f"d{i}", "grade": rnd.randint(0, 3),
                         "timestamp": rnd.randint(0, 3), "source": "t"})
    judg += [dict(j) for j in rnd.sample(judg, 10)]  # replays
    for j in rnd.sample(judg, 6):  # conflicts
        judg.append(dict(j, grade=j["grade"] + 1, timestamp=j["timestamp"] + rnd.choice([0, 1])))
    judg.append({"query_id": "", "item_id": "d1", "grade": 1, "timestamp": 0, "source": "t"})  # invalid
    judg.append({"query_id": "q1", "item_id": "d1", "grade": 4, "timestamp": 0, "source": "t"})  # beyond --grades 0:3
    imps = []
    for r in range(120):
        sys_ = rnd.choice(["A", "B", "C"])
        req = f"r{r}"
        q = rnd.choice(queries)
        null_scores = rnd.random() < 0.05
        attrs = {}
        if rnd.random() < 0.8:
            attrs["device"] = rnd.choice(["pc", "sp"])
        if rnd.random() < 0.6:
            attrs["campaign"] = rnd.choice(["men", "women"])
        ts0 = BASE_TS + rnd.randint(0, 4 * 3_600_000_000)
        for pos, item in enumerate(rnd.sample(range(12), rnd.randint(1, 9)), 1):
            rec = {"event_id": f"{req}/{pos}", "request_id": req, "query_id": q, "user_id": rnd.choice([None, "u1"]),
                   "system_id": sys_, "item_id": f"d{item}", "position": pos,
                   "score": None if null_scores and pos == 1 else float(rnd.randint(0, 6)) / score_scale,
                   "clicked": None if rnd.random() < 0.1 else rnd.random() < 0.3, "timestamp": ts0 + pos,
                   "propensity": rnd.choice([None, 0.5]), "attributes": dict(attrs)}
            if seed in _TEAM_SEEDS:
                team = rnd.choices(["A", "B", None, "C"], [45, 45, 5, 5])[0]
                if team is not None:
                    rec["attributes"]["team"] = team
            imps.append(rec)
    bad = [dict(rnd.choice(imps), position=0, event_id="bad1"), dict(rnd.choice(imps), item_id="", event_id="bad2"),
           dict(rnd.choice(imps), score=float("nan"), event_id="bad3"),
           dict(rnd.choice(imps), propensity=2.0, event_id="bad4")]
    replays = [dict(x) for x in rnd.sample(imps, 12)]
    conflicts = [dict(x, score=(x["score"] or 0) + 1) for x in rnd.sample(imps, 4)]
    twice = [dict(x, event_id=x["event_id"] + "b", position=x["position"] + 20) for x in rnd.sample(imps, 4)]
    other_query = [dict(x, query_id="q0", event_id=x["event_id"] + "q", item_id="d99") for x in rnd.sample(imps, 2)]
    rest = bad + replays + conflicts + twice + other_query
    rnd.shuffle(imps)
    cut = len(imps) // 2
    return [imps[:cut], imps[cut:] + rest], judg


def write_logs(d, imp_files, judg) -> list[str]:
    """Write the impression files and the judgments into ``d``: the job's input arguments."""
    d.mkdir(parents=True, exist_ok=True)
    args = []
    for i, recs in enumerate(imp_files):
        p = d / f"imps-{i}.avro"
        avro.write_records(p, "impression", recs)
        args += ["--impressions", str(p)]
    jp = d / "judg.avro"
    avro.write_records(jp, "judgment", judg)
    return args + ["--judgments", str(jp)]


def _run(tmp, name, imp_files, judg, extra):
    d = tmp / name
    args = write_logs(d, imp_files, judg)
    out = {}
    for engine in ("records", "columnar"):
        o = d / engine
        code = batch.main([*args, "--output", str(o), "--quiet", "--engine", engine, "--max-rejected-fraction", "1",
                           *extra])
        assert code == 0, engine
        res = {}
        for f in ("metrics.jsonl", "dead_letters.jsonl", "unjudged.jsonl", "comparisons.jsonl"):
            lines = (o / f).read_text().splitlines() if (o / f).exists() else []
            res[f] = sorted(json.dumps(json.loads(x), sort_keys=True) for x in lines)
        res["counters"] = json.loads((o / "summary.json").read_text())["counters"]
        out[engine] = res
    return out


def _conflict_free(letters):
    """Dead letters, with the raw record of conflicting judgments dropped (the per-record engine keeps
    the first copy to arrive, the columnar one the smallest)."""
    out = []
    for x in letters:
        d = json.loads(x)
        if d["reason"].startswith("conflicting judgments"):
            d["raw"] = None
        out.append(json.dumps(d, sort_keys=True))
    return sorted(out)


@pytest.mark.parametrize("seed,extra", [
    (1, ["--threads", "2", "--window", "1h", "--slices", "device", "--slices", "campaign+device", "--metrics",
         "all_trec,err@5"]),
    (2, ["--judgment-conflicts", "reject", "--grades", "0:3", "--metrics", "ndcg@5,map,P@3,recall@10,bpref",
         "--depth", "4", "--avro-decoder", "fastavro"]),
    (3, ["--workers", "2", "--judgment-conflicts", "max", "--order", "position", "--window", "2h", "--slices", "campaign",
         "--gain", "exponential", "--relevance-level", "2", "--metrics", "ndcg@10,map,recip_rank,Rprec"]),
    (4, ["--threads", "1", "--tie-break", "position", "--score-precision", "float32", "--ideal", "served", "--no-ctr",
         "--metrics", "ndcg,map,P@5,success@3"]),
    # every metric with a cutoff and ideal="served": the per-record engine must not prune the served items
    (6, ["--ideal", "served", "--no-ctr", "--metrics", "ndcg@1,P@1,ndcg@2"]),
    # online metrics with labels from clicks (issue 22): every family, weighting and group, windows and slices
    (7, ["--labels", "clicks", "--window", "1h", "--slices", "device", "--slices", "campaign+device", "--group-rows",
         "--hist-bins", "7", "--hist-range", "0.5,2.5", "--metrics", "map,auc,auc_hist,gauc,gauc[user,clicks],"
         "gauc[query,unweighted],gauc[request,impressions],clicks@3,clicks,rr_first_click,rr_first_click[clicked],"
         "abandonment"]),
    # labels from judgments (the default with judgments): the latest judgment after the conflict policy
    (9, ["--window", "2h", "--slices", "campaign", "--judgment-conflicts", "max", "--relevance-level", "2",
         "--metrics", "ndcg@5,auc,auc_hist,gauc[user],gauc[request,clicks],rr_first_click", "--group-rows"]),
    (10, ["--workers", "2", "--shards", "5", "--unjudged", "nonrelevant", "--no-ctr", "--metrics",
          "auc,gauc[query,unweighted],clicks@5,clicks@1,abandonment"]),
    # the "all" slice's exact AUC from the first slice specification's states, with the states
    # pickled between worker processes (not held) and 20 % of the requests without a device
    (11, ["--workers", "2", "--labels", "clicks", "--window", "1h", "--slices", "device", "--slices", "campaign",
          "--no-ctr", "--metrics", "auc,gauc[user]"]),
    # calibration (issue 19): scores 0, 0.5 and 1 are probabilities (0.5 on a bin edge), the others are
    # left out and counted; windows, slices, two ECE bin counts with their reliability rows
    (12, ["--labels", "clicks", "--window", "1h", "--slices", "device", "--shards", "3", "--no-ctr", "--metrics",
          "logloss,brier,calibration,ece,ece[bins=4],auc"]),
    (13, ["--labels", "clicks", "--slices", "campaign", "--shards", "2", "--no-ctr", "--metrics",
          "logloss,brier,calibration,ece[bins=7]"]),
    # the Poisson bootstrap: the same replicate weights (a hash of the query id), bit for bit
    (14, ["--ci", "bootstrap", "--replicates", "64", "--ci-seed", "5", "--window", "1h", "--slices", "device",
          "--metrics", "all_trec,ndcg@3"]),
    # paired comparisons with a baseline: per (window, slice, query) system means of their requests
    (16, ["--compare-baseline", "B", "--window", "1h", "--slices", "device", "--replicates", "40",
          "--metrics", "ndcg@5,map,P@3,num_ret"]),
    (17, ["--compare-baseline", "A", "--ci", "bootstrap", "--workers", "2", "--ci-seed", "3", "--ci-level", "0.9", "--slices",
          "campaign+device", "--metrics", "all_trec"]),
    # interleaving (issue 19): team-draft credit from attributes["team"], clicks on items without a team
    (18, ["--labels", "clicks", "--window", "1h", "--slices", "device", "--shards", "3", "--no-ctr", "--metrics",
          "interleaving,clicks@3"]),
    (19, ["--slices", "campaign+device", "--metrics", "ndcg@5,interleaving"]),
    # ir_measures names with their own options next to the global ones (issue 17): rows named as written
    (20, ["--relevance-level", "2", "--window", "1h", "--metrics", "P@5,P(rel=1)@5,AP(rel=3)@10,nDCG(dcg='exp-log2')@5,"
          "ndcg@5,Judged@5,hits@3,NumQ,RBP(p=0.8),SetF(rel=1, beta=0.5),RR(rel=1)@3"]),
    # trec_eval's -c: every judged query scored for every system (shards without requests too)
    (21, ["--complete", "--shards", "40", "--slices", "device", "--metrics", "all_trec"]),
    (22, ["--complete", "--ci", "bootstrap", "--replicates", "30", "--metrics", "map,P@5,num_rel,num_ret"]),
    (23, ["--complete", "--compare-baseline", "B", "--slices", "device", "--replicates", "30",
          "--metrics", "map,ndcg@5,num_rel"]),
])
def test_columnar_engine_equals_the_record_engine(tmp_path, seed, extra):
    imp_files, judg = _messy_logs(seed)
    got = _run(tmp_path, f"s{seed}", imp_files, judg, extra)
    rec, col = got["records"], got["columnar"]
    assert rec["metrics.jsonl"], "the reference computed no row"
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    assert col["unjudged.jsonl"] == rec["unjudged.jsonl"]
    assert col["comparisons.jsonl"] == rec["comparisons.jsonl"]
    if "--compare-baseline" in extra:
        assert rec["comparisons.jsonl"], "the reference compared nothing"
    if "--complete" in extra:
        assert rec["counters"].get("requests_completed"), "the reference completed nothing"
    assert _conflict_free(col["dead_letters.jsonl"]) == _conflict_free(rec["dead_letters.jsonl"])
    nonzero = lambda c: {k: v for k, v in c.items() if v}  # noqa: E731
    assert nonzero(col["counters"]) == nonzero(rec["counters"])
    if seed == 20:
        names = {json.loads(x)["metric"] for x in rec["metrics.jsonl"]}
        assert {"P(rel=1)@5", "AP(rel=3)@10", "nDCG(dcg='exp-log2')@5", "SetF(rel=1, beta=0.5)", "hits@3"} <= names
    reasons = {json.loads(x)["reason"].split(" (")[0] for x in rec["dead_letters.jsonl"]}
    assert len(reasons) >= 4  # the messy parts did reach the job


def test_columns_round_trip_and_pickle():
    """impression_columns / columns_records are inverse (so the exact cleaning rules see the records
    as read), and the compact pickling of Columns restores them, None and NUL included."""
    import pickle

    recs = [{"event_id": "e1", "request_id": "r", "query_id": "", "user_id": None, "system_id": "A", "item_id": "x\x00y",
             "position": 2, "score": None, "clicked": None, "timestamp": 5, "propensity": 0.25,
             "attributes": {"k": "v"}, "dwell_ms": None},
            {"event_id": "e2", "request_id": "r", "query_id": "q", "user_id": "u", "system_id": "A", "item_id": "é",
             "position": 1, "score": 1.5, "clicked": True, "timestamp": 6, "propensity": None, "attributes": {},
             "dwell_ms": 31_000}]
    cols = columnar.impression_columns(recs)
    assert columnar.columns_records(cols, range(2)) == recs
    back = pickle.loads(pickle.dumps(cols, 5))
    assert columnar.columns_records(back, range(2)) == recs
    assert clean_request(columnar.columns_records(back, range(2)))[0] == clean_request(recs)[0]


def test_factorize_orders_like_the_strings():
    rnd = random.Random(0)
    vals = np.array([rnd.choice(["b", "a", "ab", "", "Z", "é", "d10", "d9"]) for _ in range(500)], dtype=object)
    codes, vocab = columnar_columns._factorize(vals, ordered=True)
    assert list(vocab) == sorted(set(vals.tolist()))
    assert (vocab[codes] == vals).all()


def test_files_on_remote_file_systems_read_the_same(tmp_path, monkeypatch):
    """A path with a scheme is copied through Beam's FileSystems to a local file and read by the local
    readers; the columns, shards and dead letters equal those of the local file."""
    from apache_beam import pvalue
    from apache_beam.io.filesystems import FileSystems

    imp_files, _ = _messy_logs(5)
    path = tmp_path / "imps.avro"
    avro.write_records(path, "impression", imp_files[1])
    monkeypatch.setattr(FileSystems, "open", staticmethod(lambda p, *a, **k: open(p.split("://", 1)[1], "rb")))
    fn = columnar_read._ReadImpressionColumns(4)

    def read(p):
        dead, rows = [], []
        for out in fn.work(p):
            if isinstance(out, pvalue.TaggedOutput):
                assert out.value["source"] == p  # a dead letter names the file it was read from
                dead.append(json.dumps({**out.value, "source": None}, sort_keys=True))
            else:
                shard, chunk = out[0], columnar.thaw(out[1])
                rows += [(shard, json.dumps(r, sort_keys=True)) for r in columnar.columns_records(chunk, range(chunk["n"]))]
        return sorted(dead), sorted(rows)

    local, remote = read(str(path)), read(f"fake://{path}")
    assert len(local[0]) == 4 and len(local[1]) > 300
    assert remote == local


def test_worker_processes_only_when_asked():
    args = batch.build_arg_parser().parse_args(["--impressions", "x", "--output", "o"])
    assert batch.local_workers(args, []) == 1  # auto: in-process
    args.workers = "3"
    assert batch.local_workers(args, []) == 3
    assert batch.local_workers(args, ["--direct_num_workers", "4"]) == 1  # Beam's own options win
    args.engine = "records"
    assert batch.local_workers(args, []) == 1


def test_damaged_remote_file_keeps_every_record_before_the_damage(tmp_path, monkeypatch):
    """A remote file cut short: the records fastavro decodes before the failure reach the job (the
    complete blocks before the damage, as for a local file), then one dead letter names the file (the
    remote path, not the local copy)."""
    import fastavro
    from apache_beam import pvalue
    from apache_beam.io.filesystems import FileSystems

    imp_files, _ = _messy_logs(6)
    path = tmp_path / "imps.avro"
    avro.write_records(path, "impression", imp_files[0], sync_interval=4000)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    expected = 0
    try:
        with open(path, "rb") as fo:
            for _ in fastavro.reader(fo):
                expected += 1
    except Exception:
        pass
    assert 0 < expected < len(imp_files[0])
    monkeypatch.setattr(FileSystems, "open", staticmethod(lambda p, *a, **k: open(p.split("://", 1)[1], "rb")))
    outs = list(columnar_read._ReadImpressionColumns(4).work(f"fake://{path}"))
    dead = [o.value for o in outs if isinstance(o, pvalue.TaggedOutput)]
    rows = sum(columnar.thaw(o[1])["n"] for o in outs if not isinstance(o, pvalue.TaggedOutput))
    assert rows + len([d for d in dead if not d["reason"].startswith(columnar.UNREADABLE)]) == expected
    unreadable = [d for d in dead if d["reason"].startswith(columnar.UNREADABLE)]
    assert [d["source"] for d in unreadable] == [f"fake://{path}"]
    local = list(columnar_read._ReadImpressionColumns(4).work(str(path)))
    assert rows == sum(columnar.thaw(o[1])["n"] for o in local if not isinstance(o, pvalue.TaggedOutput))


def test_repeats_and_unique_codes_against_python():
    """_repeats (whole, coded in pieces cut between groups, or, for groups of at most 16 rows, by
    comparing nearby values) finds exactly the groups in which a value occurs twice (null counting
    as a value); _unique_codes equals np.unique(return_inverse) on small and large keys."""
    import collections

    import pyarrow as pa

    rng = np.random.default_rng(1)
    for t in range(60):
        groups = np.repeat(np.arange(400), rng.integers(1, 30 if t % 3 else 17, 400))
        vals = [f"v{x}" for x in rng.integers(0, 20_000 if t % 2 else 40, len(groups))]
        if t % 5 == 0:
            vals = [None if v.endswith("7") else v for v in vals]
        counts = collections.Counter(zip(groups.tolist(), vals))
        want = sorted({g for (g, _), c in counts.items() if c > 1})
        starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
        for piece in (7, 100, 1 << 16):
            got = columnar_columns._repeats(groups, pa.array(vals), starts, piece=piece)
            assert got.tolist() == want
        key = rng.integers(0, 50 if t % 2 else 2**40, 1000)
        uk, inv = columnar_columns._unique_codes(key)
        ref_uk, ref_inv = np.unique(key, return_inverse=True)
        assert uk.tolist() == ref_uk.tolist() and inv.tolist() == ref_inv.ravel().tolist()
    # the repeat as far apart as the largest group allows; equal values in neighbouring groups only
    groups = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    for vals, want in ((["a", "b", "c", "a", "x", "y", "y", "z"], [0]), (["a", "b", "c", "d", "d", "y", "z", "q"], [])):
        got = columnar_columns._repeats(groups, pa.array(vals), np.array([0, 4, 6]))
        assert got.tolist() == want


def test_encode_by_runs_gives_arrows_codes():
    """_encode codes a column of long runs by its runs' first values: the codes and distinct values
    are those of Arrow's dictionary_encode of the whole column (nulls and "" included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(0)
    for t in range(200):
        n = int(rng.integers(0, 2000))
        vals = rng.choice(np.array(["a", "b", None, "c", "dd", ""], dtype=object), n).tolist()
        reps = rng.integers(1, 40 if t % 3 else 2, n)
        col = pa.array([v for v, r in zip(vals, reps) for _ in range(r)][:n], pa.string())
        codes, vocab = columnar_columns._encode(col)
        ref = pc.dictionary_encode(col, null_encoding="encode")
        assert codes.tolist() == ref.indices.to_pylist() and vocab.equals(ref.dictionary)


def test_held_values_are_taken_once_and_missing_ones_explained():
    """freeze(hold=True) keeps the compacted columns in this process (only a key goes through Beam):
    thaw gives them back once (side inputs: keep=True, again), equal to the pickled round trip; a key
    this process does not hold (another worker's) is a clear error, not a silent loss."""
    import pyarrow as pa

    chunk = {"n": 40, "request_id": pa.array([f"r{i // 10}" for i in range(40)]),
             "item_id": pa.array([f"d{i}" for i in range(40)]), "position": np.arange(40, dtype=np.int64),
             "score": np.full(40, np.nan), "attributes": {"device": pa.array(["pc"] * 40)}}
    runs = ("request_id", "attributes")
    n, key = columnar.freeze(chunk, runs, hold=True)
    assert n == 40 and isinstance(key, str)
    want = columnar.thaw(columnar.freeze(chunk, runs))
    for got in (columnar.thaw((n, key), keep=True), columnar.thaw((n, key))):
        assert got.keys() == want.keys()
        for k in ("request_id", "item_id"):
            assert got[k].equals(want[k]) and got[k].equals(chunk[k])
        np.testing.assert_array_equal(got["position"], chunk["position"])
        assert np.isnan(got["score"]).all() and got["attributes"]["device"].equals(chunk["attributes"]["device"])
    with pytest.raises(RuntimeError, match="held in another process"):
        columnar.thaw((n, key))  # taken already
    columnar.release_held()


def test_requests_split_by_shard_held_equal_taken():
    """_split_requests: the held parts (slices of one copy in shard order) hold, shard by shard, the
    same requests and items, in the same order, as the parts taken one by one, and as Python
    reading of the request dict (requests of 0 to 5 items, some shards empty)."""
    import pyarrow as pa

    rng = np.random.default_rng(3)
    nreq = 60
    lens = rng.integers(0, 6, nreq)
    rr = np.repeat(np.arange(nreq), lens)
    n = len(rr)
    r = {"n_requests": nreq, "system_id": pa.array([f"s{i % 2}" for i in range(nreq)]),
         "request_id": pa.array([f"r{i}" for i in range(nreq)]),
         "query_id": pa.array([f"q{i % 7}" for i in range(nreq)]),
         "min_ts": np.arange(nreq, dtype=np.int64) * 10, "records": lens.astype(np.int64),
         "unscored": np.zeros(nreq, np.int64), "attributes": {"device": pa.array([["pc", "mobile", None][i % 3]
                                                                                  for i in range(nreq)])},
         "row_request": rr, "item_id": pa.array([f"d{i}" for i in range(n)]), "score": rng.random(n),
         "position": np.arange(n, dtype=np.int64)}
    shard = rng.choice([0, 3, 4, 9], nreq)
    held = list(columnar_clean._split_requests(r, shard, hold=True))
    taken = list(columnar_clean._split_requests(r, shard, hold=False))
    assert [s for s, _ in held] == [s for s, _ in taken] == [0, 3, 4, 9]

    def plain(part):
        reqs = part["request_id"].to_pylist()
        items = {q: [] for q in range(part["n_requests"])}
        for j, q in enumerate(part["row_request"].tolist()):
            items[q].append((part["item_id"][j].as_py(), float(part["score"][j]), int(part["position"][j])))
        return [(reqs[q], part["system_id"][q].as_py(), part["query_id"][q].as_py(), int(part["min_ts"][q]),
                 int(part["records"][q]), part["attributes"]["device"][q].as_py(), items[q])
                for q in range(part["n_requests"])]

    for (s, h), (_, t) in zip(held, taken):
        want = []
        for q in np.flatnonzero(shard == s).tolist():
            rows = np.flatnonzero(rr == q).tolist()
            want.append((f"r{q}", f"s{q % 2}", f"q{q % 7}", q * 10, int(lens[q]), ["pc", "mobile", None][q % 3],
                         [(f"d{j}", float(r["score"][j]), j) for j in rows]))
        assert plain(h) == plain(t) == want


def test_map_columns_same_keys_in_every_row_equal_lookup():
    """_arrow_map_columns: when every row has the same keys in the same order (read as strides of the
    values), and otherwise (Arrow's map_lookup), each key's column is what a Python dict of the row
    gives (null where absent; a key twice in a row: the later value)."""
    import pyarrow as pa

    t = pa.map_(pa.string(), pa.string())
    cases = [
        [[("device", "pc")], [("device", None)], [("device", "mobile")]],
        [[("device", "pc"), ("country", "de")], [("device", "tv"), ("country", None)]] * 3,
        [[("device", "pc"), ("country", "de")], [("country", "fr"), ("device", "tv")]],
        [[("device", "pc"), ("device", "tv")], [("device", "a"), ("device", "b")]],
        [[("device", "pc")], [], [("device", "tv")]],
        [[("device", "pc")], [("country", "de")]],
    ]
    for rows in cases:
        col = pa.array(rows, type=t)
        for arr in (col, col.slice(1)):
            got = columnar_columns._arrow_map_columns(arr, len(arr))
            dicts = [dict(r) for r in arr.to_pylist()]
            keys = sorted({k for d in dicts for k in d})
            assert list(got) == keys
            for k in keys:
                assert got[k].to_pylist() == [d.get(k) for d in dicts], (rows, k)


def test_values_outside_avro_int_are_dead_letters_on_both_engines(tmp_path):
    """Issue 20, item 1: an Avro writer that does not check ranges (fastavro) can store grade 2**31 or
    position 2**31 / 2**40 in an ``int`` field. The record rules reject them ("does not fit an Avro
    int"); the columnar engine's vectorised screen used to clear them and score them (map 0.8333
    against 0.3333). Both engines: the same rows, dead letters and counters, and the rows those of the
    clean records alone."""
    def imp(req, item, pos, score):
        return {"event_id": f"{req}/{item}", "request_id": req, "query_id": "q1", "user_id": None, "system_id": "A",
                "item_id": item, "position": pos, "score": score, "clicked": None, "timestamp": 0,
                "propensity": None, "attributes": {}}

    imps = [imp("r1", "d1", 1, 3.0), imp("r1", "d2", 2, 2.0), imp("r1", "d3", 3, 1.0),
            imp("r2", "d1", 2**31, 3.0), imp("r2", "d2", 1, 2.0), imp("r3", "d4", 2**40, 1.0)]
    judg = [{"query_id": "q1", "item_id": "d1", "grade": 0, "timestamp": 0, "source": "t"},
            {"query_id": "q1", "item_id": "d2", "grade": 2**31, "timestamp": 0, "source": "t"},
            {"query_id": "q1", "item_id": "d3", "grade": 1, "timestamp": 0, "source": "t"},
            {"query_id": "q1", "item_id": "d4", "grade": -(2**31) - 1, "timestamp": 0, "source": "t"}]
    got = _run(tmp_path, "range", [imps], judg, ["--metrics", "map,P@3", "--no-ctr"])
    rec, col = got["records"], got["columnar"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    assert _conflict_free(col["dead_letters.jsonl"]) == _conflict_free(rec["dead_letters.jsonl"])
    reasons = sorted(json.loads(x)["reason"] for x in col["dead_letters.jsonl"])
    assert sum("does not fit an Avro int" in r for r in reasons) == 4, reasons
    clean = _run(tmp_path, "clean", [[imps[0], imps[1], imps[2], imps[4]]], [judg[0], judg[2]],
                 ["--metrics", "map,P@3", "--no-ctr"])
    # the rejected impressions and judgments count for nothing: the rows of the clean records alone
    assert col["metrics.jsonl"] == clean["columnar"]["metrics.jsonl"] == clean["records"]["metrics.jsonl"]


def test_a_request_naming_two_query_ids_is_rejected_by_both_engines(tmp_path):
    """Issue 20, item 8: a request whose impressions name two query ids was scored against the smaller
    one, silently. Every impression of it is a dead letter ("request names several query ids"), on
    both engines (and in the streaming job, which cleans with the same rule: test_stream_reliability)."""
    def imp(req, item, pos, query, event=None):
        return {"event_id": event or f"{req}/{item}", "request_id": req, "query_id": query, "user_id": None,
                "system_id": "A", "item_id": item, "position": pos, "score": float(10 - pos), "clicked": pos == 1,
                "timestamp": 0, "propensity": None, "attributes": {}}

    good = [imp("r1", "d1", 1, "q1"), imp("r1", "d2", 2, "q1"), imp("r2", "d1", 1, "q2"), imp("r2", "d3", 2, "q2")]
    mixed = [imp("r3", "d1", 1, "q1"), imp("r3", "d2", 2, "q2"), imp("r3", "d3", 3, "q1")]
    replay = [dict(mixed[0])]  # a replayed copy stays a duplicate
    judg = [{"query_id": q, "item_id": d, "grade": g, "timestamp": 0, "source": "t"}
            for q, d, g in (("q1", "d1", 0), ("q1", "d2", 1), ("q2", "d1", 1), ("q2", "d3", 0), ("q1", "d3", 1))]
    got = _run(tmp_path, "mixed", [good + mixed[:2], mixed[2:] + replay], judg, ["--metrics", "map,P@2"])
    rec, col = got["records"], got["columnar"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    assert sorted(col["dead_letters.jsonl"]) == sorted(rec["dead_letters.jsonl"])
    dead = [json.loads(x) for x in col["dead_letters.jsonl"]]
    assert len(dead) == 3 and all(d["reason"] == "request names several query ids ('q1', 'q2')" for d in dead)
    assert sorted(json.loads(d["raw"])["item_id"] for d in dead) == ["d1", "d2", "d3"]
    nonzero = lambda c: {k: v for k, v in c.items() if v}  # noqa: E731
    assert nonzero(col["counters"]) == nonzero(rec["counters"])
    assert col["counters"]["rejected:impression:request names several query ids"] == 3
    assert col["counters"]["duplicate:impression"] == 1
    clean = _run(tmp_path, "clean", [good], judg, ["--metrics", "map,P@2"])
    assert col["metrics.jsonl"] == clean["columnar"]["metrics.jsonl"]  # r3 counts for nothing, clicks included


def test_slices_never_merge_a_missing_attribute_or_a_value_that_looks_like_a_label(tmp_path):
    """Issue 20, item 4: with ``--slices campaign --slices campaign+device`` a campaign whose value is
    the text ``(missing)`` was merged with the requests that lack the attribute, and a value holding
    ``,`` or ``=`` could spell another slice's label. Each (attribute, value) pair is now its own
    slice on both engines: the row count and every slice's num_queries are counted here by hand."""
    def imp(req, item, pos, attrs):
        return {"event_id": f"{req}/{item}", "request_id": req, "query_id": "q1", "user_id": None,
                "system_id": "A", "item_id": item, "position": pos, "score": float(10 - pos), "clicked": pos == 1,
                "timestamp": 0, "propensity": None, "attributes": attrs}

    attrs = {"r1": {}, "r2": {"campaign": "(missing)"}, "r3": {"campaign": "men,device=pc"},
             "r4": {"campaign": "men", "device": "pc"}, "r5": {"campaign": "men\\", "device": "pc"},
             "r6": {"campaign": "men", "device": "(missing)"}, "r7": {"campaign": "men"}}
    imps = [imp(r, d, p, a) for r, a in attrs.items() for p, d in ((1, "d1"), (2, "d2"))]
    judg = [{"query_id": "q1", "item_id": "d1", "grade": 1, "timestamp": 0, "source": "t"}]
    got = _run(tmp_path, "slices", [imps], judg, ["--metrics", "P@1", "--no-ctr", "--slices", "campaign",
                                                  "--slices", "campaign+device"])
    rec, col = got["records"], got["columnar"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    rows = {json.loads(x)["slice"]: json.loads(x)["num_queries"] for x in col["metrics.jsonl"]}
    # by hand: distinct campaign values (absent counts as one) and distinct (campaign, device) pairs
    by_campaign = {}
    by_pair = {}
    for a in attrs.values():
        c = a.get("campaign")
        by_campaign[c] = by_campaign.get(c, 0) + 1
        by_pair[(c, a.get("device"))] = by_pair.get((c, a.get("device")), 0) + 1
    assert len(rows) == 1 + len(by_campaign) + len(by_pair) == 1 + 5 + 7
    assert sorted(v for k, v in rows.items() if k != "all" and "device=" not in k.replace("\\=", "")) == \
        sorted(by_campaign.values())
    assert rows["all"] == 7
    assert rows["campaign=(missing)"] == 1 and rows["campaign=\\(missing)"] == 1
    assert rows["campaign=men\\,device\\=pc"] == 1 and rows["campaign=men"] == 3
    assert rows["campaign=men,device=\\(missing)"] == 1 and rows["campaign=men,device=(missing)"] == 1
    assert rows["campaign=men\\\\,device=pc"] == 1


def test_every_option_runs_on_the_columnar_engine(tmp_path):
    """Issue 22: online metrics, the bootstrap, comparisons and --complete run on the columnar engine
    (summary.json names the engine that ran)."""
    imp_files, judg = _messy_logs(11)
    args = write_logs(tmp_path / "in", imp_files, judg)
    common = [*args, "--quiet", "--max-rejected-fraction", "1"]
    for i, extra in enumerate([["--metrics", "map,auc,gauc,clicks@3"],
                               ["--metrics", "map,P@5", "--complete", "--compare-baseline", "A", "--ci", "bootstrap",
                                "--replicates", "20"]]):
        assert batch.main([*common, "--output", str(tmp_path / str(i)), *extra]) == 0
        assert json.loads((tmp_path / str(i) / "summary.json").read_text())["engine"] == "columnar"


def test_compare_baseline_prints_the_comparison_table(tmp_path, capsys):
    """--compare-baseline prints its comparisons (issue 21): one line per record of comparisons.jsonl,
    with the record's difference."""
    imp_files, judg = _messy_logs(11)
    args = write_logs(tmp_path / "in", imp_files, judg)
    out = tmp_path / "o"
    assert batch.main([*args, "--max-rejected-fraction", "1", "--output", str(out), "--metrics", "map,P@3",
                       "--compare-baseline", "A", "--replicates", "20"]) == 0
    printed = capsys.readouterr().out.split("comparisons with A (comparisons.jsonl):\n", 1)[1].splitlines()
    records = [json.loads(x) for x in (out / "comparisons.jsonl").read_text().splitlines()]
    assert records and len([x for x in printed if x.startswith("global ")]) == len(records)
    first = next(r for r in records if r["slice"] == "all" and r["metric"] == "map")
    line = next(x for x in printed if f"{first['system_b']} - A" in x and " map " in x)
    assert f"{first['diff']:.4f}" in line
