"""The streaming job on the columnar engine (``streameval stream --watch --engine columnar``,
:mod:`streameval.beam.streaming.coarse`): watched files are scored by the batch job's vectorised
stages per request shard, and the shards' exact partial sums are merged where the panes fire.

The references are independent of the engine: the final panes equal the batch job's rows (its
per-record engine, ``tests.test_stream.run_batch``) bit for bit, and the stream's record accounting and
dead letters equal the batch job's (``streameval.jobs.batch``, run on the same files) record for record, on a
log with replays, conflicting events, items served twice, unscored items, unjudged queries and
conflicting judgments spread over several files."""

import json
import os
import random

import pytest

from streameval.jobs import batch as batch_cli
from streameval.jobs import stream as stream_cli
from streameval.io import avro

from .test_stream import HOUR, _bits, assert_final_equals_batch, imp, jdg, key, panes_of

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

T0 = 1_700_000_000_000_000 // HOUR * HOUR  # an hour boundary (micros)


def _log(seed=7, n_requests=600):
    """(files of impression records in arrival order, judgments): two systems, 30 queries (25 judged),
    requests of 1-8 items over 6 hours, some straddling the end of an hour; replays (the same records again, in a later file), a reused
    event id with other content, an item served twice, requests without scores, a request split over
    two files, judgments with conflicting grades."""
    rng = random.Random(seed)
    reqs = []
    for r in range(n_requests):
        system = rng.choice(["A", "B"])
        q = f"q{rng.randrange(30)}"
        ts = T0 + rng.randrange(6 * HOUR)
        if r % 41 == 0:  # a request straddling an hour: its later items count in the next hour's CTR
            ts = ts // HOUR * HOUR + HOUR - 2
        n = rng.randint(1, 8)
        items = rng.sample(range(40), n)
        recs = [imp(f"r{r}", f"d{it}", pos + 1, ts + pos, system=system, query=q,
                    score=None if r % 97 == 5 else float(rng.randrange(100)),
                    clicked=rng.random() < 0.2, attrs={"device": rng.choice(["mobile", "desktop"])})
                for pos, it in enumerate(items)]
        reqs.append(recs)
    reqs.sort(key=lambda rs: rs[0]["timestamp"])
    files = [[] for _ in range(8)]
    for i, recs in enumerate(reqs):
        f = i * len(files) // len(reqs)
        if i % 50 == 3 and len(recs) > 1 and f + 1 < len(files):  # a request split over two files
            files[f].extend(recs[:1])
            files[f + 1].extend(recs[1:])
        else:
            files[f].extend(recs)
    for f in range(1, len(files)):
        files[f].extend(files[f - 1][:5])  # replays of the previous file's first records
    bad = dict(files[2][10])
    bad["item_id"] = "other"  # the same event id with other content
    files[3].append(bad)
    twice = dict(files[4][7])
    twice["event_id"] = twice["event_id"] + "/again"  # the same item served twice in its request
    files[4].append(twice)
    judg = [jdg(f"q{q}", f"d{d}", rng.randrange(4)) for q in range(25) for d in rng.sample(range(40), 20)]
    judg += [jdg("q1", judg[0]["item_id"] if judg[0]["query_id"] == "q1" else "d0", 3, ts=5),
             jdg("q1", judg[0]["item_id"] if judg[0]["query_id"] == "q1" else "d0", 1, ts=5)]
    return files, judg


def _jsonl(directory, pattern):
    return [json.loads(line) for f in sorted(directory.glob(pattern)) for line in open(f)]


def _batch(tmp_path, impressions, extra=(), metrics="ndcg@10,map,P@5"):
    """The batch job on its per-record engine (the executable specification, which shares no code
    with the columnar stages): its output directory. The stream's default lateness (0) unless
    ``extra`` names another (the batch job's own default keeps every record)."""
    bout = tmp_path / "batch"
    assert batch_cli.main(["--impressions", impressions, "--judgments", str(tmp_path / "judgments.avro"),
                           "--metrics", metrics, "--window", "1h", "--slices", "device",
                           "--allowed-lateness", "0", *extra,
                           "--runner", "FnApiRunner", "--engine", "records", "--output", str(bout)]) == 0
    return bout


def _stream(tmp_path, files, judg, extra=(), metrics="ndcg@10,map,P@5"):
    watch = tmp_path / "watch"
    watch.mkdir()
    for i, recs in enumerate(files):
        avro.write_records(str(watch / f"part-{i:03d}.avro"), "impression", recs)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    out = tmp_path / "out"
    args = ["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
            "--metrics", metrics, "--window", "1h", "--slices", "device", "--watch-interval", "0.05",
            "--watch-idle-stop", "1", "--quiet", "--output", str(out), *extra]
    code = stream_cli.main(args)
    return code, out


@pytest.mark.parametrize("shards", [[], ["--request-shards", "4"]], ids=["default-shards", "4-shards"])
def test_columnar_stream_equals_the_batch_job(tmp_path, capsys, shards):
    files, judg = _log()
    # the watermark stays 7 h behind the latest event: nothing of the 6-hour log is late, so the
    # replays and the split requests meet their earlier records as in batch (the local runner's
    # default is one request shard; 4 shards exercise the aggregate's merge of the shards' partials)
    code, out = _stream(tmp_path, files, judg, ["--engine", "columnar", "--watch-delay", "7h", *shards])
    assert code == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    rows = _jsonl(out, "metrics-*.jsonl")
    # the batch job on the same files, on its per-record engine (the executable specification, which
    # shares no code with the columnar stages): its rows are the final panes bit for bit, intervals
    # included; its record accounting and dead letters are the stream's
    bout = _batch(tmp_path, str(tmp_path / "watch" / "*.avro"))
    assert_final_equals_batch(rows, _jsonl(bout, "metrics.jsonl"))
    bsum = json.loads((bout / "summary.json").read_text())
    assert summary["accounting"] == bsum["accounting"]
    assert summary["accounting_problems"] == [] and summary["counts"]["requests_scored"] == \
        bsum["counters"]["requests_scored"]
    assert bsum["accounting"]["impression"]["duplicates"] >= 35  # the log has what it claims
    assert len(bsum["accounting"]["impression"]["rejected"]) == 2 and bsum["accounting"]["judgment"]["superseded"] == 2
    assert bsum["accounting"]["impression"]["late"] > 0  # items after their request's hour

    def letters(rs):
        return sorted((r["raw"], r["reason"]) for r in rs)

    # (the stream writes late data, the items of a request after its window closed, to late_data-*;
    # the batch job to its dead letters, with the same source "late:impression" and reason)
    bdead = _jsonl(bout, "dead_letters*.jsonl")
    sdead = _jsonl(out, "dead_letters-*.jsonl") + _jsonl(out, "late_data-*.jsonl")
    assert letters(sdead) == letters(bdead)
    assert sorted({r["source"] for r in sdead}) == ["CleanImpressions", "late:impression"]
    # panes: each window has an on-time pane (lateness 0: it is the final one)
    assert {p for seq in panes_of(rows).values() for p, _, _ in seq} >= {"on_time"}
    printed = capsys.readouterr()
    assert "per-event engine" not in printed.err


def _stream_in_steps(tmp_path, monkeypatch, files, judg, extra=(), metrics="ndcg@10,map,P@5"):
    """As :func:`_stream`, with ``files[:-2]`` in the folder when the job starts and each of the last
    two dropped (complete, by a rename) once the watermark moved past what was read before it: the
    watermark waits while files are being copied, so a file is late only when it arrives after."""
    import threading
    import time

    from streameval.beam.streaming import live

    watch = tmp_path / "watch"
    watch.mkdir()
    for i, recs in enumerate(files[:-2]):
        avro.write_records(str(watch / f"part-{i:03d}.avro"), "impression", recs)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    made = []

    class Recording(live.WatchFiles):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(stream_cli, "WatchFiles", Recording)

    def wait(cond):
        end = time.monotonic() + 120
        while not cond() and time.monotonic() < end:
            time.sleep(0.01)

    def dropper():
        wait(lambda: made and made[0].service is not None)
        w = made[0].watcher
        for i in (len(files) - 2, len(files) - 1):
            top = max(r["timestamp"] for f in files[:i] for r in f) // 1000 * 1000
            wait(lambda: (w.watermark_us or 0) >= top)
            tmp = tmp_path / f".part-{i:03d}.avro"
            avro.write_records(str(tmp), "impression", files[i])
            os.replace(tmp, watch / f"part-{i:03d}.avro")

    t = threading.Thread(target=dropper, daemon=True)
    t.start()
    out = tmp_path / "out"
    args = ["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
            "--metrics", metrics, "--window", "1h", "--slices", "device", "--watch-interval", "0.05",
            "--watch-idle-stop", "1", "--quiet", "--output", str(out), *extra]
    code = stream_cli.main(args)
    t.join(timeout=10)
    return code, out


def test_columnar_stream_late_data_and_late_panes(tmp_path, monkeypatch):
    """A file older than the watermark: records whose window is final (its end plus the allowed
    lateness at or before the watermark) are late data, written with their reason and counted; those
    within the allowed lateness change their window in a late pane; the final panes equal the batch
    job on the records that were not late."""
    files, judg = _log(seed=11, n_requests=300)
    early_hours = [r for r in files[0] if r["timestamp"] < T0 + HOUR]
    assert early_hours
    late_file = [dict(r, event_id=r["event_id"] + "/l", request_id=r["request_id"] + "/l") for r in early_hours]
    within = [dict(r, event_id=r["event_id"] + "/w", request_id=r["request_id"] + "/w") for r in files[-2]]
    files = files[:-1] + [late_file + within] + files[-1:]
    code, out = _stream_in_steps(tmp_path, monkeypatch, files, judg, ["--engine", "columnar", "--allowed-lateness", "2h"])
    assert code == 0
    late = _jsonl(out, "late_data-*.jsonl")
    watermark_before = max(r["timestamp"] for f in files[:-2] for r in f)
    want_late = [r for r in late_file + within if (r["timestamp"] // HOUR + 1) * HOUR + 2 * HOUR <= watermark_before]
    assert sorted(json.loads(r["raw"])["event_id"] for r in late) == sorted(r["event_id"] for r in want_late)
    assert want_late and all(r["source"] == "late:impression" and "is in a window that closed at" in r["reason"]
                             for r in late)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting"]["impression"]["late"] == len(want_late)
    assert summary["accounting_problems"] == []
    late_ids = {r["event_id"] for r in want_late}
    kept = [r for f in files for r in f if r["event_id"] not in late_ids]
    rows = _jsonl(out, "metrics-*.jsonl")
    avro.write_records(str(tmp_path / "kept.avro"), "impression", kept)
    bout = _batch(tmp_path, str(tmp_path / "kept.avro"), ["--allowed-lateness", "2h"])
    assert_final_equals_batch(rows, _jsonl(bout, "metrics.jsonl"))
    assert any(p == "late" for seq in panes_of(rows).values() for p, _, _ in seq)


ONLINE = ("auc,auc_hist,clicks@5,rr_first_click,abandonment,logloss,brier,calibration,ece[bins=10],interleaving,"
          "mean_dwell,sat_click_rate,long_click_ctr[t=10s],last_click_ctr[t=0.5s]")


@pytest.mark.parametrize("metrics, extra", [
    ("ndcg@10,map,P@5," + ONLINE, ["--hist-bins", "20"]),
    ("ndcg@10,map,P@5,num_rel_ret", ["--ci", "bootstrap", "--replicates", "60", "--ci-seed", "5"]),
], ids=["online-metrics", "bootstrap"])
def test_columnar_stream_online_metrics_and_bootstrap_equal_the_batch_job(tmp_path, capsys, metrics, extra):
    """Online metrics (AUC with its DeLong standard error, the histogram AUC, click metrics,
    calibration and its reliability rows, interleaving, dwell metrics) and Poisson bootstrap intervals in the
    stream's panes: the final panes equal the batch job's per-record engine (OnlineMetrics,
    BootstrapMeanCombineFn over per-request values: no code shared with the columnar stages) bit for
    bit, intervals included; the record accounting too."""
    files, judg = _log(seed=5, n_requests=400)
    for f in files:  # scores as click probabilities (calibration), teams for interleaving
        for r in f:
            if r["score"] is not None:
                r["score"] = r["score"] / 100.0
            r["attributes"] = dict(r["attributes"], team="A" if r["position"] % 2 else "B")
            if r["clicked"]:  # dwell of a click (the same for a replayed record), ~1 in 6 unknown
                d = random.Random(r["event_id"]).choice([None, 0, 499, 500, 9_999, 10_000, 30_000, 61_234])
                r["dwell_ms"] = d
    code, out = _stream(tmp_path, files, judg, ["--engine", "columnar", "--watch-delay", "7h", *extra],
                        metrics=metrics)
    assert code == 0, capsys.readouterr()
    rows = _jsonl(out, "metrics-*.jsonl")
    bout = _batch(tmp_path, str(tmp_path / "watch" / "*.avro"), [*extra, "--labels", "clicks"], metrics=metrics)
    brows = _jsonl(bout, "metrics.jsonl")
    final = assert_final_equals_batch(rows, [r for r in brows if r["num_queries"] > 0])
    # rows of no request (interleaving's counts of a slice whose requests had no click): the final
    # pane has them too, n = 0, same value
    zero = [r for r in brows if r["num_queries"] == 0]
    if "auc" in metrics:
        assert zero  # the log has such slices: the loop below checks something
    for r in zero:
        f = final[key(r)]
        assert (f["num_queries"], _bits(f["value"]), f["ci_method"]) == (0, _bits(r["value"]), r["ci_method"]), (r, f)
    got = {r["metric"] for r in final.values()}
    if "auc" in metrics:
        assert {"auc", "auc_hist", "clicks@5", "rr_first_click", "abandonment", "logloss", "ece[bins=10]",
                "interleaving:win_rate_b", "mean_dwell", "sat_click_rate[t=30s]", "long_click_ctr[t=10s]",
                "last_click_ctr[t=0.5s]"} <= got
        assert any(r["metric"] == "auc" and r["ci_method"] == "t" and r["stderr"] for r in brows)
    else:
        assert {r["ci_method"] for r in brows if r["metric"] == "map" and r["num_queries"] > 1} == {"bootstrap"}
    assert json.loads((out / "summary.json").read_text())["accounting"] == \
        json.loads((bout / "summary.json").read_text())["accounting"]


def test_columnar_stream_anytime_intervals_on_every_pane(tmp_path, capsys):
    """Issue 43, item 5: --intervals anytime on the columnar engine (it refused it), online metrics
    included. Every pane's row with a standard error carries the confidence sequence of its own
    numbers (cs-beta-binomial for CTR, cs-normal-mixture otherwise: AUC from its DeLong standard
    error; within [0, 1] for a metric in [0, 1]), wider than the fixed interval of the same numbers
    (from 30 queries: below, the t quantile can be the wider); the ranking and CTR rows
    equal the per-event engine's (values and sequences), and the values equal the fixed run's."""
    from streameval.metrics import stats

    files, judg = _log(seed=11, n_requests=300)
    for f in files:
        for r in f:
            if r["score"] is not None:
                r["score"] = r["score"] / 100.0
    metrics = "ndcg@10,map,auc,clicks@5,logloss"
    args = ["--watch-delay", "7h", "--intervals", "anytime", "--early-count", "40"]
    for d in ("col", "ev", "fixed"):
        (tmp_path / d).mkdir()
    code, out = _stream(tmp_path / "col", files, judg, ["--engine", "columnar", *args], metrics=metrics)
    assert code == 0, capsys.readouterr()
    rows = _jsonl(out, "metrics-*.jsonl")
    assert {r["pane"] for r in rows} >= {"early", "on_time"}
    with_se = [r for r in rows if r["stderr"] is not None and r["num_queries"] >= 2]
    assert {r["metric"] for r in with_se} >= {"ndcg@10", "map", "auc", "clicks@5", "logloss", "ctr"}
    for r in rows:
        cs = stats.row_interval(r["metric"], r["value"], r["num_queries"], r["stderr"], 0.95, "anytime")
        assert {k: r[k] for k in cs} == cs, r
    methods = {r["metric"]: r["ci_method"] for r in with_se}
    assert methods["ctr"] == "cs-beta-binomial" and methods["auc"] == methods["ndcg@10"] == "cs-normal-mixture"
    wide = [r for r in with_se if r["num_queries"] >= 30]  # below, t's quantile can outgrow the sequence's
    assert len(wide) > 20
    for r in wide:
        fixed = stats.row_interval(r["metric"], r["value"], r["num_queries"], r["stderr"], 0.95)
        assert r["ci_low"] <= fixed["ci_low"] and r["ci_high"] >= fixed["ci_high"], r
    for r in with_se:  # a metric in [0, 1]: the sequence within [0, 1]
        if r["metric"] in ("ndcg@10", "map", "auc"):
            assert 0.0 <= r["ci_low"] <= r["value"] <= r["ci_high"] <= 1.0, r
    # the per-event engine (ranking metrics and CTR: it has no online metrics) on the same files
    code, ev = _stream(tmp_path / "ev", files, judg, ["--engine", "events", *args], metrics="ndcg@10,map")
    assert code == 0, capsys.readouterr()
    final = {key(r): r for r in rows if r["is_final"]}
    ev_final = [r for r in _jsonl(ev, "metrics-*.jsonl") if r["is_final"]]
    assert len(ev_final) > 20
    for r in ev_final:
        f = final[key(r)]
        assert (_bits(f["value"]), f["num_queries"], f["ci_low"], f["ci_high"], f["ci_method"]) == \
            (_bits(r["value"]), r["num_queries"], r["ci_low"], r["ci_high"], r["ci_method"]), (r, f)
    # the same job with fixed intervals: the same values
    code, fx = _stream(tmp_path / "fixed", files, judg, ["--engine", "columnar", "--watch-delay", "7h",
                                                        "--early-count", "40"], metrics=metrics)
    assert code == 0, capsys.readouterr()
    fixed_final = {key(r): r for r in _jsonl(fx, "metrics-*.jsonl") if r["is_final"]}
    assert fixed_final.keys() == final.keys()
    assert all(_bits(fixed_final[k]["value"]) == _bits(final[k]["value"]) for k in final)


@pytest.mark.parametrize("cluster, shards", [("request", []), ("user", ["--request-shards", "4"])],
                         ids=["request", "user-4-shards"])
def test_columnar_stream_clustered_ctr_equals_the_batch_job(tmp_path, capsys, cluster, shards):
    """Issue 43, item 1 in stream panes: ``--cluster`` gives the batch job's ``ctr[cluster=C]``,
    ``:clusters`` and ``:design_effect`` rows in every pane; the final panes equal the batch job's
    per-record engine (clusters summed by a shuffle there, no code shared with the stream's shard
    states) bit for bit, interval included. Users span requests, and with 4 request shards a user's
    clicks come from several shards."""
    files, judg = _log(seed=3, n_requests=300)
    for f in files:
        for r in f:
            n = int(r["request_id"][1:])
            r["user_id"] = None if n % 5 == 0 else f"u{n % 23}"  # a fifth without a user: its request
    code, out = _stream(tmp_path, files, judg, ["--engine", "columnar", "--watch-delay", "7h", "--cluster", cluster,
                                                *shards])
    assert code == 0, capsys.readouterr()
    rows = _jsonl(out, "metrics-*.jsonl")
    bout = _batch(tmp_path, str(tmp_path / "watch" / "*.avro"), ["--cluster", cluster])
    final = assert_final_equals_batch(rows, [r for r in _jsonl(bout, "metrics.jsonl") if r["num_queries"] > 0])
    name = f"ctr[cluster={cluster}]"
    got = {r["metric"] for r in final.values()}
    assert {name, f"{name}:clusters", f"{name}:design_effect"} <= got
    assert {r["ci_method"] for r in final.values() if r["metric"] == name} <= {"cluster-delta", "cluster-delta-logit"}
    # every pane with a CTR row has its clustered row (the early ones too: the same states, as they stand)
    panes = {(r["window_start"], r["slice"], r["system"], r["pane_index"]) for r in rows if r["metric"] == "ctr"}
    assert panes == {(r["window_start"], r["slice"], r["system"], r["pane_index"]) for r in rows if r["metric"] == name}


def test_stream_refuses_online_metrics_it_cannot_compute_in_one_line(tmp_path, capsys):
    files, judg = _log(n_requests=20)
    for extra, metrics, message in [
        (["--engine", "columnar"], "map,gauc[user,clicks]", "GAUC is not computed by the streaming job"),
        (["--engine", "events"], "map,auc", "online metrics (auc) need the columnar engine"),
        (["--engine", "events", "--cluster", "user"], "map", "--cluster user need the columnar engine"),
        (["--every", "30m"], "map", "--ci bootstrap need the columnar engine: the columnar engine has fixed"),
    ]:
        if "fixed" in message:
            extra = extra + ["--ci", "bootstrap"]
        work = tmp_path / str(len(message))  # a directory per case
        work.mkdir()
        code, _ = _stream(work, files[:1], judg, extra, metrics=metrics)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], (message, err)


@pytest.mark.parametrize("extra, message", [
    (["--engine", "columnar", "--every", "30m"], "--engine columnar: the columnar engine has fixed windows only"),
    (["--engine", "columnar", "--intervals", "anytime", "--ci", "bootstrap"],
     "--intervals anytime and --ci bootstrap exclude each other"),
])
def test_columnar_engine_refuses_what_it_cannot_run_in_one_line(tmp_path, capsys, extra, message):
    files, judg = _log(n_requests=20)
    code, _ = _stream(tmp_path, files[:1], judg, extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: {err[0][len('error: '):]}"] and message in err[0]


def test_auto_engine_says_why_the_per_event_engine_runs(tmp_path, capsys):
    files, judg = _log(n_requests=20)
    code, out = _stream(tmp_path, files[:2], judg, ["--every", "30m"])
    err = capsys.readouterr().err
    assert code == 0
    assert "note: the per-event engine runs this job: the columnar engine has fixed windows only" in err


def test_columnar_replay_equals_the_batch_job(tmp_path):
    """``--replay`` on the columnar engine (ReplayColumns: the files' blocks per step of event time):
    the final panes equal the batch job's per-record engine; the replay's own counts add up."""
    files, judg = _log(seed=3, n_requests=250)
    watch = tmp_path / "in"
    watch.mkdir()
    for i, recs in enumerate(files):
        avro.write_records(str(watch / f"part-{i:03d}.avro"), "impression", recs)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    out = tmp_path / "out"
    common = ["--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
              "--metrics", "ndcg@10,map,P@5", "--window", "1h", "--slices", "device"]
    assert stream_cli.main(["--replay", "--replay-step", "10m", "--replay-pace", "0", "--engine", "columnar",
                            "--allowed-lateness", "1h", "--quiet", "--output", str(out), *common]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting_problems"] == []
    assert summary["replayed"]["impressions"] == sum(map(len, files))
    # the counts the job used are its own; the local runner's counters (a step's first bundle) are not written
    assert summary["counts"]["impressions_read"] == sum(map(len, files)) and summary["counters"] is None
    bout = _batch(tmp_path, str(watch / "*.avro"), ["--allowed-lateness", "1h"])
    # a replay plays in event-time order: nothing is late, the replays meet their earlier copies
    assert summary["accounting"] == json.loads((bout / "summary.json").read_text())["accounting"]
    assert_final_equals_batch(_jsonl(out, "metrics-*.jsonl"), _jsonl(bout, "metrics.jsonl"))


@pytest.mark.parametrize("timers", ["one", "per_deadline"])
def test_event_blocks_on_the_columnar_engine_equal_the_batch_job(tmp_path, timers):
    """Events of a source that runs on the runner (Kafka's ``(key, JSON value)`` pairs, here from a
    TestStream whose watermark follows the events 7 h behind, as a Kafka reader's would with a bound
    of disorder) enter the columnar engine as blocks without a watermark
    (:class:`~streameval.beam.streaming.coarse_events.EventBlocks`, ``source_watermark=False``): the
    shards learn which windows closed from their timers alone. The final panes equal the batch job's
    per-record engine on the records that were not late, bit for bit; its record accounting and dead
    letters are the stream's; values that are not JSON, or not impressions, are dead letters named by
    the topic; three records of a window that closed hours before are late data, with their reason.
    The same with one event-time timer per key and with one per pending deadline (Flink's choice)."""
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue
    from apache_beam.utils.timestamp import Timestamp

    from streameval.beam.streaming.coarse import ColumnarStreamMetrics
    from streameval.beam.streaming.coarse_events import EventBlocks

    from .test_stream import run_stream

    files, judg = _log(seed=5, n_requests=300)
    events = [r for f in files for r in f]  # arrival order: the files' (replays, split requests)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    late = [imp(f"late{i}", f"d{i}", 1, T0 + 60 + i, system="A", query="q3", clicked=True,
                attrs={"device": "mobile"}) for i in range(3)]
    bad = [b"{not json", b"[1, 2]", json.dumps({**events[0], "position": "first", "event_id": "bad"}).encode()]

    def value(rec):
        return json.dumps(rec).encode()

    stream = TestStream()
    latest = T0
    for i in range(0, len(events), 100):
        chunk = events[i:i + 100]
        stream = stream.add_elements([TimestampedValue((r["request_id"].encode(), value(r)),
                                                       Timestamp(micros=r["timestamp"])) for r in chunk])
        latest = max([latest] + [r["timestamp"] for r in chunk])
        stream = stream.advance_watermark_to(Timestamp(micros=(latest - 7 * HOUR) // 1000 * 1000))
    stream = stream.add_elements([TimestampedValue((b"k", v), Timestamp(micros=latest)) for v in bad])
    stream = stream.advance_watermark_to(Timestamp(micros=T0 + 8 * HOUR))  # every window of the log closed
    stream = stream.add_elements([TimestampedValue((b"k", value(r)), Timestamp(micros=r["timestamp"])) for r in late])
    stream = stream.advance_watermark_to_infinity()

    def build(p):
        sm = ColumnarStreamMetrics([str(tmp_path / "judgments.avro")], ["ndcg@10", "map", "P@5"], window="1h",
                                   slices=["device"], source_watermark=False, request_shards=4, timers=timers)
        rows = p | stream | EventBlocks("kafka:impressions", max_records=64) | sm
        return {"rows": rows, "late": sm.late, "dead": sm.dead_letters}

    got = run_stream(build)
    mine_late = [r for r in got["late"] if json.loads(r["raw"])["request_id"].startswith("late")]
    assert sorted(json.loads(r["raw"])["request_id"] for r in mine_late) == ["late0", "late1", "late2"]
    assert all("in a window that closed at" in r["reason"] for r in mine_late)
    avro.write_records(str(tmp_path / "kept.avro"), "impression", events)
    bout = _batch(tmp_path, str(tmp_path / "kept.avro"))
    assert_final_equals_batch(got["rows"], _jsonl(bout, "metrics.jsonl"))
    mine = [r for r in got["dead"] if r["source"] == "kafka:impressions"]
    assert sorted(r["reason"].split(" (")[0].split(",")[0] for r in mine) == [
        "position must be an integer", "record is not a mapping but list", "value is not JSON"]
    assert {r["raw"] for r in mine} >= {"{not json", "[1,2]"}  # the text, or the value as JSON text

    def letters(rs):
        return sorted((r["raw"], r["reason"]) for r in rs)

    # the log's own dead letters (reused event ids, items served twice) and the late items of its
    # requests, as the batch job writes them
    assert letters([r for r in got["dead"] + got["late"] if r["source"] != "kafka:impressions"
                    and r not in mine_late]) == letters(_jsonl(bout, "dead_letters*.jsonl"))


@pytest.mark.parametrize("extra, message", [
    (["--clicks", "c.avro"], "--clicks names files: with --kafka-impressions, click events come from a topic"),
    (["--impressions", "i.avro"], "--impressions names files: --kafka-impressions is the impressions' source"),
    (["--judgments", "j.avro", "--kafka-judgments", "tj"], "give judgments as files (--judgments) or as a topic"),
    (["--judgments", "j.avro", "--engine", "events"],
     "--judgments files with --kafka-impressions need the columnar engine"),
    (["--kafka-judgments", "tj", "--engine", "columnar"],
     "--engine columnar: judgments from a topic need the per-event engine"),
    (["--judgments", "nothing-here-*.avro"], "nothing-here-*.avro"),
])
def test_topic_source_refuses_files_it_would_not_read_in_one_line(tmp_path, capsys, monkeypatch, extra, message):
    """Impressions from a topic: judgment files are read when the job starts (the columnar engine);
    files of impressions or clicks, which such a job would not read, are refused before anything starts
    (exit 2, one line), as is a judgments pattern that matches nothing."""
    monkeypatch.chdir(tmp_path)
    avro.write_records("j.avro", "judgment", [jdg("q1", "d1", 1)])
    code = stream_cli.main(["--kafka-bootstrap", "127.0.0.1:1", "--kafka-impressions", "t", "--metrics", "map",
                            "--window", "1h", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_a_shard_message_counts_in_its_open_windows_when_one_of_them_closed():
    """The columnar aggregate takes each window of a shard's message on its own (a window's part is
    the shard's whole state of that window): with window 0 closed and window 1 open, the part of
    window 1 counts and the part of window 0 goes to late data as ``late:update`` naming window 0
    only; a message of closed windows alone is late as a whole; an older version is stale. (Before,
    the whole message was late: window 1 lost that shard's latest requests unless another message
    came before it closed; seen on Flink after a restore from a checkpoint.)"""
    from streameval.beam.streaming import StreamMetrics
    from streameval.beam.streaming.coarse_aggregate import _PartialAggregate

    cfg = StreamMetrics(judgments=object(), metrics=["map"], window="1h", allowed_lateness="10m").cfg
    agg = _PartialAggregate(cfg)
    agg._rejects = []
    c = agg.new_core()
    c.closed_upto = cfg.expiry(0)  # window 0 final, window 1 open
    both = ("part", 3, 7, {0: ["rank0", "ctr0", "onl0"], 1: ["rank1", "ctr1", "onl1"]}, 2)
    assert agg.apply("A", c, both, dry=True) == "ok" and agg._rejects == []
    assert agg.apply("A", c, both) == "ok"
    assert c.parts == {1: {3: [7, "rank1", "ctr1", "onl1"]}} and c.panes[1].dirty and 0 not in c.panes
    [late] = agg._rejects
    assert late["source"] == "late:update"
    assert json.loads(late["raw"]) == {"kind": "part", "shard": 3, "system_id": "A",
                                       "windows": [["1970-01-01T00:00:00Z", "1970-01-01T01:00:00Z"]]}
    assert agg.apply("A", c, ("part", 3, 6, {1: ["old", "old", "old"]}, 1), dry=True) == "stale"
    closed_only = ("part", 3, 8, {0: ["rank0b", "ctr0b", "onl0b"]}, 1)
    assert agg.apply("A", c, closed_only, dry=True) == "late"
    assert agg.apply("A", c, closed_only) == "late" and len(agg._rejects) == 2
    assert c.parts == {1: {3: [7, "rank1", "ctr1", "onl1"]}}
