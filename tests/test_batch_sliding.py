"""Sliding windows in the batch job (issue 21 item 10): ``streameval batch --window 1h --every 20m``
(or ``--window 1h/20m``) on both engines.

References: (1) the columnar engine equals the per-record engine (the executable specification) row
for row, bit for bit, with the same dead letters and record accounting, on a messy log whose requests
straddle the sub-window boundaries; (2) each sliding window's row equals a direct computation over
that window's records (``streameval.evaluate()`` on the requests whose earliest impression lies in
the window, a direct count of the clicks whose impression does); (3) the rows equal the streaming
job's final panes for ``--replay`` with the same windows; (4) the option's errors, one line each."""

import json
import math
import random

import pytest

import streameval
from streameval.jobs import batch as batch_cli
from streameval.jobs import stream as stream_cli
from streameval.io import avro

from .test_stream import HOUR, MIN, _bits, assert_final_equals_batch, imp, jdg
from .test_stream_columnar import _log

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

METRICS = "ndcg@10,map,P@5"


def _jsonl(directory, pattern):
    return [json.loads(line) for f in sorted(directory.glob(pattern)) for line in open(f)]


def _write(tmp_path, files, judg):
    d = tmp_path / "in"
    d.mkdir()
    for i, recs in enumerate(files):
        avro.write_records(str(d / f"part-{i:03d}.avro"), "impression", recs)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    return str(d / "*.avro"), str(tmp_path / "judgments.avro")


def _batch(out, imps, judg, engine, extra=(), metrics=METRICS):
    assert batch_cli.main(["--impressions", imps, "--judgments", judg, "--metrics", metrics, "--slices", "device",
                           "--runner", "FnApiRunner", "--engine", engine, "--quiet", "--output", str(out),
                           *extra]) == 0
    return (_jsonl(out, "metrics.jsonl"), _jsonl(out, "dead_letters.jsonl"),
            json.loads((out / "summary.json").read_text()))


def _table(rows):
    out = {}
    for r in rows:
        k = (r["window_start"], r["window_end"], r["slice"], r["system"], r["metric"])
        assert k not in out, k
        out[k] = (_bits(r["value"]), r["num_queries"], _bits(r["stderr"]), _bits(r["ci_low"]), _bits(r["ci_high"]),
                  r["ci_method"])
    return out


@pytest.mark.parametrize("window, extra", [
    (["--window", "1h", "--every", "20m"], ["--allowed-lateness", "0"]),
    (["--window", "1h/20m"], ["--ci", "bootstrap", "--replicates", "40", "--allowed-lateness", "0"]),
    (["--window", "30m/10m"], ["--allowed-lateness", "5m"]),
    (["--window", "30m/10m"], []),  # the batch default: every record on time
])
def test_columnar_engine_equals_the_per_record_engine(tmp_path, window, extra):
    files, judg = _log(seed=5, n_requests=400)
    imps, jpath = _write(tmp_path, files, judg)
    c_rows, c_dead, c_sum = _batch(tmp_path / "c", imps, jpath, "columnar", [*window, *extra])
    r_rows, r_dead, r_sum = _batch(tmp_path / "r", imps, jpath, "records", [*window, *extra])
    assert _table(c_rows) == _table(r_rows)
    assert sorted((d["source"], d["raw"], d["reason"]) for d in c_dead) == \
        sorted((d["source"], d["raw"], d["reason"]) for d in r_dead)
    assert c_sum["accounting"] == r_sum["accounting"] and c_sum["accounting_problems"] == []
    # records are counted once: read = the input, however many windows each is scored in
    n_input = sum(map(len, files))
    assert c_sum["accounting"]["impression"]["read"] == n_input == c_sum["counters"]["impressions_read"]
    # lateness 0: straddling requests lose their later items (the end of their first window); 5m and
    # the default (unlimited): none
    assert (c_sum["accounting"]["impression"]["late"] > 0) == ("0" in extra)
    per = {"1h": 3, "1h/20m": 3, "30m/10m": 3}[window[1]]
    assert c_sum["windows_per_record"] == r_sum["windows_per_record"] == per
    # every window is SIZE long, starts on a multiple of PERIOD, and the windows overlap
    size = (HOUR if window[1].startswith("1h") else 30 * MIN)
    starts = sorted({r["window_start"] for r in c_rows})
    assert all(r["window_end"] - r["window_start"] == size for r in c_rows)
    assert all(s % (size // per) == 0 for s in starts) and starts[1] - starts[0] == size // per


@pytest.mark.parametrize("seed, extra", [
    (1, ["--window", "1h", "--every", "15m", "--threads", "2", "--slices", "device", "--slices", "campaign+device",
         "--metrics", "all_trec,err@5"]),
    # the bootstrap's replicate sums merge across sub-windows; hot queries fanned out; two worker processes
    (14, ["--window", "2h/30m", "--ci", "bootstrap", "--replicates", "30", "--shards", "3",
          "--hot-query-fraction", "0.01", "--slices", "device", "--metrics", "ndcg@5,map,P@3,num_ret"]),
    (3, ["--window", "1h/20m", "--workers", "2", "--allowed-lateness", "10m", "--order", "position",
         "--metrics", "ndcg@10,map,recip_rank"]),
])
def test_engines_agree_on_the_messy_logs_of_test_columnar(tmp_path, seed, extra):
    """test_columnar's messy logs (replays, conflicts, invalid records, unjudged queries, missing
    attributes) and its comparison of the two engines: rows, unjudged requests, dead letters, counters."""
    from .test_columnar import _conflict_free, _messy_logs, _run

    imp_files, judg = _messy_logs(seed)
    got = _run(tmp_path, f"s{seed}", imp_files, judg, extra)
    rec, col = got["records"], got["columnar"]
    assert rec["metrics.jsonl"] and rec["unjudged.jsonl"]
    assert col["metrics.jsonl"] == rec["metrics.jsonl"]
    assert col["unjudged.jsonl"] == rec["unjudged.jsonl"]
    assert _conflict_free(col["dead_letters.jsonl"]) == _conflict_free(rec["dead_letters.jsonl"])
    nonzero = lambda c: {k: v for k, v in c.items() if v}  # noqa: E731
    assert nonzero(col["counters"]) == nonzero(rec["counters"])
    assert rec["counters"]["impressions_read"] == sum(map(len, imp_files))


def _clean_log(seed=2, n_requests=300, hot=0.0):
    """Requests without replays or conflicts, each within 3 s (no late item with --allowed-lateness
    1m), over 3 hours, two systems;
    every 7th request starts 1 s before a 20-minute boundary (its items straddle it); a fraction
    ``hot`` of the requests are for query q0."""
    rng = random.Random(seed)
    t0 = 1_700_000_000_000_000 // HOUR * HOUR
    recs = []
    for r in range(n_requests):
        system = rng.choice(["A", "B"])
        ts = t0 + rng.randrange(3 * HOUR)
        if r % 7 == 0:
            ts = ts - ts % (20 * MIN) + 20 * MIN - 1_000_000
        items = rng.sample(range(30), rng.randint(1, 6))
        query, device = "q0" if rng.random() < hot else f"q{rng.randrange(12)}", rng.choice(["mobile", "desktop"])
        recs += [imp(f"r{r}", f"d{it}", p + 1, ts + p * 400_000, system=system, query=query,
                     score=float(rng.randrange(50)), clicked=rng.random() < 0.3, attrs={"device": device})
                 for p, it in enumerate(items)]
    judg = [jdg(f"q{q}", f"d{d}", rng.randrange(4)) for q in range(10) for d in rng.sample(range(30), 15)]
    return recs, judg


@pytest.mark.parametrize("engine", ["columnar", "records"])
def test_each_sliding_window_equals_a_direct_computation(tmp_path, engine):
    recs, judg = _clean_log()
    imps, jpath = _write(tmp_path, [recs], judg)
    rows, dead, summary = _batch(tmp_path / "out", imps, jpath, engine, ["--window", "1h", "--every", "20m",
                                                                         "--allowed-lateness", "1m"])
    assert dead == [] and summary["accounting_problems"] == []
    qrels = {}
    for j in judg:
        qrels.setdefault(j["query_id"], {})[j["item_id"]] = j["grade"]
    requests = {}
    for r in recs:
        requests.setdefault((r["system_id"], r["request_id"]), []).append(r)
    by_key = {(r["window_start"], r["slice"], r["system"], r["metric"]): r for r in rows}
    windows = sorted({r["window_start"] for r in rows})
    # the windows: every 20-minute start whose hour holds an impression
    assert windows == sorted({x["timestamp"] - x["timestamp"] % (20 * MIN) - i * 20 * MIN for x in recs
                              for i in range(3)})
    checked = 0
    for ws in windows:
        we = ws + HOUR
        for system in ("A", "B"):
            for dev in (None, "mobile", "desktop"):
                # the requests whose earliest impression lies in the window: one query each in evaluate()
                chosen = {rid: rs for (s, rid), rs in requests.items() if s == system
                          and ws <= min(x["timestamp"] for x in rs) < we
                          and (dev is None or rs[0]["attributes"]["device"] == dev)}
                label = "all" if dev is None else f"device={dev}"
                judged = {rid: rs for rid, rs in chosen.items() if rs[0]["query_id"] in qrels}
                if judged:
                    run = {rid: {x["item_id"]: x["score"] for x in rs} for rid, rs in judged.items()}
                    q = {rid: qrels[rs[0]["query_id"]] for rid, rs in judged.items()}
                    ref = streameval.evaluate(q, run, METRICS.split(",")).means
                    for m, v in ref.items():
                        row = by_key[(ws, label, system, m)]
                        assert row["window_end"] == we and row["num_queries"] == len(judged)
                        assert math.isclose(row["value"], v, rel_tol=1e-12, abs_tol=1e-15), (ws, label, system, m)
                        checked += 1
                else:
                    assert (ws, label, system, "map") not in by_key
                # CTR: the impressions whose own timestamp lies in the window
                shown = [x for x in recs if x["system_id"] == system and ws <= x["timestamp"] < we
                         and (dev is None or x["attributes"]["device"] == dev)]
                if shown:
                    row = by_key[(ws, label, system, "ctr")]
                    assert row["num_queries"] == len(shown)
                    assert row["value"] == sum(x["clicked"] for x in shown) / len(shown)
                    checked += 1
    assert checked > 150


@pytest.mark.parametrize("extra", [[], ["--ci", "bootstrap", "--replicates", "20"]])
def test_hot_queries_fanned_out_equal_the_per_record_engine(tmp_path, extra):
    """A query with 60 % of the requests is scored in several elements (columnar_hot); its sub-window
    states go to the sliding windows like the others'."""
    recs, judg = _clean_log(seed=4, n_requests=1600, hot=0.6)
    imps, jpath = _write(tmp_path, [recs], judg)
    window = ["--window", "1h/20m", "--shards", "4", "--hot-query-fraction", "0.05", *extra]
    c_rows, _, c_sum = _batch(tmp_path / "c", imps, jpath, "columnar", window)
    r_rows, _, r_sum = _batch(tmp_path / "r", imps, jpath, "records", window)
    assert _table(c_rows) == _table(r_rows)
    assert c_sum["accounting"] == r_sum["accounting"]
    assert c_sum["elements"]["element_impressions:score"]["count"] > 4  # q0 was fanned out


@pytest.mark.parametrize("lateness", ["1h", "0"])
def test_sliding_rows_equal_the_streaming_job_final_panes(tmp_path, lateness):
    """The stream's per-event engine (sliding windows) on --replay of the same files. Lateness 0: the
    items of a request straddling a sub-window's end are late data in both jobs (the same count)."""
    files, judg = _log(seed=3, n_requests=250)
    imps, jpath = _write(tmp_path, files, judg)
    out = tmp_path / "stream"
    common = ["--impressions", imps, "--judgments", jpath, "--metrics", METRICS, "--slices", "device",
              "--allowed-lateness", lateness]
    assert stream_cli.main(["--replay", "--replay-step", "10m", "--replay-pace", "0", "--window", "1h/20m",
                            "--quiet", "--output", str(out), *common]) == 0
    ssum = json.loads((out / "summary.json").read_text())
    assert ssum["accounting_problems"] == []
    for engine in ("columnar", "records"):
        rows, _, bsum = _batch(tmp_path / engine, imps, jpath, engine,
                               ["--window", "1h", "--every", "20m", "--allowed-lateness", lateness])
        assert ssum["accounting"] == bsum["accounting"]
        assert (bsum["accounting"]["impression"]["late"] > 0) == (lateness == "0")
        assert_final_equals_batch(_jsonl(out, "metrics-*.jsonl"), rows)


@pytest.mark.parametrize("argv, message", [
    (["--window", "1h", "--every", "7m"], "must be a multiple of its period"),
    (["--window", "10m", "--every", "1h"], "must be a multiple of its period"),
    (["--window", "1h/10m", "--every", "5m"], "excludes --every"),
    (["--window", "1h/xx"], "cannot parse --every 'xx'"),
    (["--every", "10m"], "needs --window SIZE"),
    (["--window", "session:30m"], "the streaming job's"),
    (["--window", "1h/10m", "--metrics", "map,auc"], "does not take online metrics"),
    (["--window", "1h/10m", "--compare-baseline", "A"], "does not take --compare-baseline"),
])
def test_option_errors_are_one_line(tmp_path, argv, message, capsys):
    recs, judg = _clean_log(n_requests=5)
    imps, jpath = _write(tmp_path, [recs], judg)
    assert batch_cli.main(["--impressions", imps, "--judgments", jpath, "--output", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # refused before the job runs


def test_same_errors_as_the_streaming_job(capsys):
    """The two jobs share the parsing (streameval.beam.arguments.split_window_arg, WindowSpec.sliding)."""
    for argv in (["--window", "1h", "--every", "7m"], ["--window", "1h/10m", "--every", "5m"]):
        assert batch_cli.main(["--impressions", "x.avro", "--output", "o", *argv]) == 2
        b = capsys.readouterr().err
        assert stream_cli.main(["--replay", "--impressions", "x.avro", *argv]) == 2
        assert capsys.readouterr().err == b


def test_library_transforms_take_every():
    """The transforms' own checks (for callers that build a pipeline): the same rules, and the
    combinations the columnar engine cannot merge are refused when the transform is made."""
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.transforms import ClickMetrics, ScoreRankings, slide_keys, sliding_windows

    assert sliding_windows("1h", "20m") == (20 * MIN, (HOUR, 20 * MIN))
    assert sliding_windows("1h", "1h") == (HOUR, None) and sliding_windows("1h") == (HOUR, None)
    # sub-window [40m, 60m) lies in the windows [0m, 60m), [20m, 80m) and [40m, 100m)
    got = list(slide_keys(((40 * MIN, 60 * MIN, "all", "A"), 1), (HOUR, 20 * MIN)))
    assert got == [((s, s + HOUR, "all", "A"), 1) for s in (0, 20 * MIN, 40 * MIN)]
    with pytest.raises(ValueError, match="must be a multiple of its period"):
        ClickMetrics(window="1h", every="25m")
    with pytest.raises(ValueError, match="needs a window size"):
        ScoreRankings(None, ["map"], every="10m")
    for kw in ({"online": ["auc"]}, {"compare_baseline": "A"}):
        with pytest.raises(ValueError, match="sliding windows"):
            ColumnarMetrics(["x.avro"], ["j.avro"], ["map"], window="1h", every="10m", **kw)
