"""Streaming: the final pane of every window equals the batch job's output for that window, bit for
bit; early, on-time and late panes; late judgments and late data; click events; sliding and
session windows; the replay CLI. Streaming pipelines run on the local streaming runner
(BundleBasedDirectRunner, named explicitly) fed by a TestStream replay; batch references on
FnApiRunner with the batch job's transforms."""

import atexit
import glob
import json
import math
import os
import random
import re
import shutil
import struct
import tempfile
import uuid
from collections import defaultdict

import pytest

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from streameval.jobs import batch
from streameval.jobs import stream as stream_cli
from streameval.accumulators.moments import MeanMoments
from streameval.beam.combiners import MeanCombineFn
from streameval.beam.streaming import (
    Replay,
    StreamMetrics,
    WindowSpec,
    _mm_sub,
    _WindowAggregate,
    parse_duration,
    replay_clock,
)
from streameval.beam.transforms import ClickMetrics, ScoreRankings
from streameval.io import avro, convert, trec
from streameval.metrics.names import ALL_TREC

from .conftest import REPO, data_path

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

MIN = 60_000_000
HOUR = 60 * MIN
DAY = 24 * HOUR
BASE = 1_700_000_000_000_000 - 1_700_000_000_000_000 % DAY  # a day boundary (2023-11-14)
DL_RUNS = ["bm25.run", "bm25+bert(zs).run"]
# the Beam jobs aggregate arithmetic means and totals: all of all_trec but the geometric gm_map, gm_bpref
DL_METRICS = [s.name for s in ALL_TREC if s.average != "geometric"] + ["err@20", "dcg@10"]

# --------------------------------------------------------------------------------------------
# harness

_SINKS: dict = {}


def _put(x, key):
    _SINKS.setdefault(key, []).append(x)


def _collect(outs: dict) -> dict:
    keys = {}
    for name, pc in outs.items():
        keys[name] = uuid.uuid4().hex
        _SINKS[keys[name]] = []
        pc | f"Sink{name}" >> beam.Map(_put, keys[name])
    return keys


def run_stream(build) -> dict:
    """Run ``build(p) -> {name: pcoll}`` on the local streaming runner; {name: [elements]}."""
    opts = PipelineOptions([])
    opts.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(runner=BundleBasedDirectRunner(), options=opts)
    keys = _collect(build(p))
    p.run().wait_until_finish()
    return {name: _SINKS.pop(k) for name, k in keys.items()}


def stream_metrics(p, steps, loader=None, label=None, **kw):
    """Replay ``steps`` into StreamMetrics; {"rows", "late", "dead", "panes"}."""
    src = p | f"Replay{label or ''}" >> Replay(steps, loader=loader)
    kw.setdefault("judgments", src["judgments"] if kw.pop("with_judgments", True) else None)
    sm = StreamMetrics(clicks=src["clicks"], label=label, **kw)
    rows = src["impressions"] | sm
    return {"rows": rows, "late": sm.late, "dead": sm.dead_letters, "panes": sm.panes}


def _records(p, recs, name, label):
    if len(recs) > 2000:  # through an Avro file, as the batch job reads them (beam.Create is slow on big lists)
        tmp = tempfile.mkdtemp(prefix="streameval-test-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # read by the pipeline after this returns
        path = os.path.join(tmp, f"{label}.avro")
        avro.write_records(path, name, recs)
        return p | label >> batch.ReadAvro([path], name)
    created = p | label >> beam.Create(list(recs) or [None]).with_output_types(dict)
    return created | f"{label}NotNone" >> beam.Filter(bool)


def run_batch(imps, judg, metrics=None, window=None, slices=(), ctr=True, windows=None, **opts):
    """The batch job's transforms over the records (FnApiRunner): metric rows (with ``windows``,
    {window: rows} for several window sizes in one pipeline)."""
    p = beam.Pipeline(runner=FnApiRunner())
    i = _records(p, imps, "impression", "I")
    j = _records(p, judg, "judgment", "J") if metrics else None
    outs = {}
    for w in (windows or [window]):
        parts = []
        if metrics:
            parts.append(i | f"Score{w}" >> ScoreRankings(j, metrics, window=w, slices=slices, **opts))
        if ctr:
            parts.append(i | f"Clicks{w}" >> ClickMetrics(window=w, slices=slices))
        outs[str(w)] = tuple(parts) | f"Rows{w}" >> beam.Flatten()
    keys = _collect(outs)
    p.run().wait_until_finish()
    got = {w: _SINKS.pop(k) for w, k in keys.items()}
    return got if windows else got[str(window)]


def key(r):
    return (r["window_start"], r["slice"], r["system"], r["metric"])


def final_rows(rows) -> dict:
    """{key: final row}; every key has exactly one final pane, and it is its last pane."""
    by_key = defaultdict(list)
    for r in rows:
        by_key[key(r)].append(r)
    out = {}
    for k, rs in by_key.items():
        finals = [r for r in rs if r["is_final"]]
        assert len(finals) == 1, (k, [(r["pane"], r["pane_index"], r["is_final"]) for r in rs])
        assert finals[0]["pane_index"] == max(r["pane_index"] for r in rs), k
        idx = sorted(r["pane_index"] for r in rs)
        assert idx == sorted(set(idx)), (k, idx)  # one row per pane
        out[k] = finals[0]
    return out


def _bits(x):
    if x is None:
        return None
    return struct.pack("<d", x)


def assert_final_equals_batch(rows, batch_rows, window_of=None):
    """The final panes equal the batch rows bit for bit (value, n, stderr, interval); a final row with n = 0
    (a window or slice emptied by a late update) stands for a row the batch job does not have."""
    final = final_rows(rows)
    batch = {}
    for r in batch_rows:
        k = key(r) if window_of is None else window_of(r)
        assert k not in batch, k
        batch[k] = r
    present = {k: r for k, r in final.items() if r["num_queries"] > 0}
    assert set(present) == set(batch), (sorted(set(present) ^ set(batch))[:6])
    for k, b in batch.items():
        f = present[k]
        assert (_bits(f["value"]), f["num_queries"], _bits(f["stderr"])) == \
               (_bits(b["value"]), b["num_queries"], _bits(b["stderr"])), (k, f, b)
        # the interval too: the batch job's of the same numbers (Wilson for CTR, t otherwise)
        assert (_bits(f["ci_low"]), _bits(f["ci_high"]), f["ci_level"], f["ci_method"]) == \
               (_bits(b["ci_low"]), _bits(b["ci_high"]), b["ci_level"], b["ci_method"]), (k, f, b)
        if window_of is None:
            assert f["window_end"] == b["window_end"]
    return final


def panes_of(rows):
    """{(window_start, system): [(pane, index, final), ...]} in index order."""
    out = defaultdict(set)
    for r in rows:
        out[(r["window_start"], r["system"])].add((r["pane_index"], r["pane"], r["is_final"]))
    return {k: [(p, i, f) for i, p, f in sorted(v)] for k, v in out.items()}


def imp(req, item, pos, ts, system="A", query="q1", score=None, clicked=None, user=None, attrs=None):
    return {"event_id": f"{system}/{req}/{item}/{ts}", "request_id": req, "query_id": query, "user_id": user,
            "system_id": system, "item_id": item, "position": pos, "score": float(10 - pos) if score is None else score,
            "clicked": clicked, "timestamp": ts, "propensity": None, "attributes": attrs or {}}


def jdg(query, item, grade, ts=0):
    return {"query_id": query, "item_id": item, "grade": grade, "timestamp": ts, "source": "test"}


# --------------------------------------------------------------------------------------------
# pieces

def test_window_spec_and_durations():
    assert WindowSpec.parse("1h") == WindowSpec("fixed", HOUR, HOUR)
    sl = WindowSpec.parse("1h/15m")
    assert (sl.kind, sl.size, sl.period, sl.per_window) == ("sliding", HOUR, 15 * MIN, 4)
    assert list(sl.windows_of(10)) == [7, 8, 9, 10] and sl.bounds(7) == (7 * 15 * MIN, 7 * 15 * MIN + HOUR)
    assert sl.sub(-1) == -1  # floor: times before the epoch
    assert WindowSpec.parse("session:30m/request") == WindowSpec("sessions", 30 * MIN, 0, "request")
    assert WindowSpec.parse("session:30m").by == "user"
    assert WindowSpec.sliding("1h", "1h").kind == "fixed"
    for bad in ("1h/25m", "session:30m/device", "soon", "0"):
        with pytest.raises(ValueError):
            WindowSpec.parse(bad)
    assert parse_duration("0", allow_zero=True) == 0 and parse_duration("90s") == 90_000_000
    with pytest.raises(ValueError):
        StreamMetrics(judgments=None, ctr=False)
    with pytest.raises(ValueError):
        StreamMetrics(judgments=object(), metrics=None)


def test_exact_removal_leaves_the_sums_of_a_fresh_pass():
    """Adding values, then removing some of them (in any order) extracts exactly what adding only
    the rest gives: mean, count and standard error, to the last bit."""
    rnd = random.Random(4)
    n = 3
    mm, fn = MeanMoments(n), MeanCombineFn(n, totals=[False, False, True])
    for trial in range(20):
        values = [[rnd.choice([0.0, 1.0, rnd.random(), rnd.random() * 1e-9, 1e6 * rnd.random(), math.nan])
                   for _ in range(n)] for _ in range(rnd.randint(1, 40))]
        removed = rnd.sample(range(len(values)), rnd.randint(0, len(values)))
        st = mm.create()
        for v in values:
            mm.add(st, v)
        for i in removed:
            _mm_sub(st, values[i])
        ref = mm.create()
        for i, v in enumerate(values):
            if i not in removed:
                mm.add(ref, v)
        got, want = fn.extract_output(st), fn.extract_output(ref)
        assert [(_bits(v), c, _bits(s)) for v, c, s in got] == [(_bits(v), c, _bits(s)) for v, c, s in want], trial


# the aggregate alone, with in-memory state: order and repetition of updates do not matter

class _NoFallback(beam.coders.Coder):
    def encode(self, value):
        raise AssertionError(f"state holds a non-primitive {type(value).__name__}: it would be pickled")

    def decode(self, encoded):
        raise AssertionError("no fallback")


_STRICT = beam.coders.FastPrimitivesCoder(fallback_coder=_NoFallback())


class _Value:
    """ReadModifyWriteState; values go through a coder without a pickle fallback."""

    def __init__(self):
        self.blob = None

    def read(self):
        return None if self.blob is None else _STRICT.decode(self.blob)

    def write(self, v):
        self.blob = _STRICT.encode(v)

    def clear(self):
        self.blob = None


class _Bag:
    def __init__(self):
        self.blobs = []

    def add(self, v):
        self.blobs.append(_STRICT.encode(v))

    def read(self):
        return [_STRICT.decode(b) for b in self.blobs]

    def clear(self):
        self.blobs = []


class _Timer:
    def __init__(self):
        self.at = None
        self.tags = {}

    def set(self, t, dynamic_timer_tag=""):
        self.at = t
        self.tags[dynamic_timer_tag] = t


def _drive(logic, batches, fire_at):
    """Feed message batches to an aggregate's logic, then fire its event timer at ``fire_at``
    (micros); the rows it emitted."""
    from apache_beam.utils.timestamp import Timestamp

    inbox, core, sched, event, proc = _Bag(), _Value(), _Value(), _Timer(), _Timer()
    out = []
    for i, msgs in enumerate(batches):
        out.extend(logic.process(("A", msgs), inbox, core, sched, event, proc, Timestamp(micros=i)))
    out.extend(logic.on_event(inbox, core, sched, event, "A", Timestamp(micros=fire_at)))
    return [o.value for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]


def test_aggregate_ignores_order_and_repetition_of_updates():
    """Request updates delivered in any order, repeated, and stale ones after newer ones, give the
    same panes as the in-order delivery: the latest version (then the latest rescoring) of each
    request counts, once. The state holds primitives only."""
    cfg = StreamMetrics(judgments=object(), metrics=["map", "P@2", "num_ret"], window="1h",
                        allowed_lateness="10m", slices=["device"]).cfg
    rnd = random.Random(5)
    msgs = []
    final = {}
    for r in range(12):
        rkey = f"A\x1fr{r}"
        labels = ["all", f"device={'pc' if r % 3 else 'sp'}"]
        versions = [(1, 0), (2, 0), (2, 1), (3, 1)][: rnd.randint(1, 4)]
        for v, jgen in versions:
            vec = [rnd.random(), rnd.choice([0.0, 0.5, 1.0]), float(rnd.randint(1, 9))]
            msgs.append(("rank", rkey, "q1", [v, jgen], r % 2, labels, vec))
            final[rkey] = (r % 2, labels, vec)
        for v in range(1, len(versions) + 1):
            msgs.append(("ctr", rkey, v, None, {r % 2: {labels[1]: {1: [v, v % 2]}, "all": {1: [v, v % 2]}}}))
    in_order = _drive(_WindowAggregate(cfg), [msgs[i:i + 5] for i in range(0, len(msgs), 5)], 3 * HOUR)
    shuffled = msgs + rnd.sample(msgs, 15)
    rnd.shuffle(shuffled)
    any_order = _drive(_WindowAggregate(cfg), [shuffled[i:i + 7] for i in range(0, len(shuffled), 7)], 3 * HOUR)
    fin = lambda rows: {key(r): (_bits(r["value"]), r["num_queries"], _bits(r["stderr"])) for r in rows  # noqa: E731
                        if r["is_final"]}
    assert fin(in_order) == fin(any_order) and len(fin(in_order)) == 2 * 3 * (3 + 2)  # 2 windows, 3 slices
    # and it is the mean of the latest vectors
    fn = MeanCombineFn(3, [False, False, True])
    for k in (0, 1):
        vecs = [v for sub, labels, v in final.values() if sub == k]
        want = fn.extract_output(_fold(fn, vecs))
        got = {r["metric"]: r for r in any_order if r["is_final"] and r["window_start"] == k * HOUR
               and r["slice"] == "all"}
        assert [(got[m]["value"], got[m]["num_queries"]) for m in ("map", "P@2", "num_ret")] == \
               [(v, n) for v, n, _ in want]


def _fold(fn, items):
    acc = fn.create_accumulator()
    for x in items:
        acc = fn.add_input(acc, x)
    return acc


# --------------------------------------------------------------------------------------------
# DL-HARD: every ranking metric, hourly windows, requests in pieces, straddling requests

@pytest.fixture(scope="module")
def dl_hard_stream():
    qrels = trec.read_qrels(data_path("dl_hard_passage", "dl_hard-passage.qrels"))
    judgments = list(convert.trec_qrels_to_judgments(qrels))
    imps = []
    for run_name in DL_RUNS:
        run = trec.read_run(data_path("dl_hard_passage", "runs", run_name))
        imps.extend(convert.trec_run_to_impressions(run, system_id=run_name))
    qids = sorted({r["query_id"] for r in imps})
    start = {}
    for i, q in enumerate(qids):
        # three hours; every fifth query starts 50 minutes into its hour and straddles the next one
        start[q] = BASE + (i % 3) * HOUR + (50 * MIN if i % 5 == 0 else 5 * MIN)
    for r in imps:
        # each request arrives in three pieces, 15 minutes apart
        r["timestamp"] = start[r["query_id"]] + (r["position"] - 1) // 350 * 15 * MIN + r["position"]
    return {"imps": imps, "judgments": judgments, "qids": qids, "start": start}


@pytest.mark.parametrize("shards", [16, 0], ids=["request_shards16", "per_request"])
def test_dl_hard_hourly_final_panes_equal_batch(dl_hard_stream, shards):
    imps, judgments = dl_hard_stream["imps"], dl_hard_stream["judgments"]
    runs = DL_RUNS
    if shards == 0:  # one key per request: the first run only (CI's time budget; the layout is what differs)
        runs = DL_RUNS[:1]
        imps = [r for r in imps if r["system_id"] == runs[0]]
    rnd = random.Random(2)
    steps = Replay.from_records(imps, judgments, step="10m").steps
    for kind, recs in steps:  # out of order inside each step
        if kind == "impressions":
            rnd.shuffle(recs)
    opts = dict(relevance_level=2, depth=1000)
    out = run_stream(lambda p: stream_metrics(p, steps, request_shards=shards, metrics=DL_METRICS, window="1h", allowed_lateness="45m",
                                              ctr=False, **opts))
    assert out["late"] == [] and out["dead"] == []
    batch = run_batch(imps, judgments, DL_METRICS, window="1h", ctr=False, **opts)
    final = assert_final_equals_batch(out["rows"], batch)
    assert {k[0] for k in final} == {BASE, BASE + HOUR, BASE + 2 * HOUR}
    assert len(final) == len(runs) * len(DL_METRICS) * 3
    # the straddling requests' later pieces arrive after their window's on-time pane: late panes
    panes = panes_of(out["rows"])
    for (ws, system), seq in panes.items():
        assert seq[0][0] == "on_time" and seq[-1][2] is True, seq
        assert [p for p, _, _ in seq[1:]] == ["late"] * (len(seq) - 1)
    assert any(len(seq) > 2 for seq in panes.values())  # late data changed some windows
    # an on-time value that later changed: the late pane replaced it (no double count)
    n_on_time = {key(r): r["num_queries"] for r in out["rows"] if r["pane"] == "on_time"}
    assert all(n_on_time[k] == f["num_queries"] for k, f in final.items())  # requests counted once


# --------------------------------------------------------------------------------------------
# Open Bandit: a week of clicks, hourly and daily windows, clicks as separate events

def _obd_sample():
    imps = []
    for f in sorted(glob.glob(str(REPO / "data" / "sample" / "impressions" / "obd_*.avro"))):
        imps.extend(avro.read_records(f))
    assert len(imps) == 60_000
    return imps


def test_obd_week_hourly_and_daily_equal_batch():
    """Two days of the bundled Open Bandit week (two policies, three campaigns; two of the seven days
    keep the test's time in CI's budget) replayed in event-time order; hourly
    and daily CTR and CTR by position: the final panes equal the batch job's rows for every window,
    campaign and policy."""
    imps = [r for r in _obd_sample() if r["timestamp"] < 1574553600000000 + 2 * DAY]
    steps = Replay.from_records(imps, step="6h", pace=0).steps

    def build(p):
        src = p | Replay(steps)
        return {f"rows{w}": src["impressions"] | f"Stream{w}" >> StreamMetrics(window=w, slices=["campaign"])
                for w in ("1h", "1d")}

    out = run_stream(build)
    batch_rows = run_batch(imps, [], windows=["1h", "1d"], slices=["campaign"])
    for w, n_windows in (("1h", 48), ("1d", 2)):
        final = assert_final_equals_batch(out[f"rows{w}"], batch_rows[w])
        assert len({k[0] for k in final}) == n_windows  # the two days
        assert sum(r["metric"] == "ctr" and r["slice"] == "all" for r in final.values()) == 2 * n_windows
        assert {r["pane"] for r in out[f"rows{w}"]} == {"on_time"}  # no lateness: the on-time pane is final


@pytest.mark.parametrize("shards", [16, 0], ids=["request_shards16", "per_request"])
def test_click_events_join_within_the_attribution_delay(shards):
    """A day of the Open Bandit sample with every click delivered as a separate event 0-20
    minutes after its impression (which says clicked=False): with a 30 minute attribution delay
    the final hourly panes equal the batch job on the original log. Click events that match no
    impression within the delay are dead letters. (One key per request costs more per element on
    the local runner: that variant takes the day's first six hours, for the CI's time.)"""
    span = DAY if shards else DAY // 4
    original = [r for r in _obd_sample() if r["timestamp"] < 1574553600000000 + span]
    rnd = random.Random(8)
    imps, clicks = [], []
    for r in original:
        r2 = dict(r)
        if r["clicked"]:
            r2["clicked"] = False
            clicks.append({"request_id": r["request_id"], "item_id": r["item_id"], "system_id": r["system_id"],
                           "timestamp": r["timestamp"] + rnd.randrange(20 * MIN)})
        imps.append(r2)
    assert len(clicks) == (47 if shards else 12)
    early = next(c for c in clicks if c["timestamp"] % HOUR < 30 * MIN)
    stray = [dict(early, timestamp=early["timestamp"] + 40 * MIN),  # beyond the attribution delay, request open
             {"request_id": "no-such-request", "item_id": "1", "timestamp": original[5]["timestamp"]}]
    steps = Replay.from_records(imps, clicks=clicks + stray, step="2h", pace=0).steps
    out = run_stream(lambda p: stream_metrics(p, steps, request_shards=shards, window="1h", slices=["campaign"], allowed_lateness="40m",
                                              attribution_delay="30m", with_judgments=False))
    final = assert_final_equals_batch(out["rows"], run_batch(original, [], window="1h", slices=["campaign"]))
    assert sum(r["value"] > 0 for r in final.values()) > (50 if shards else 20)
    assert out["late"] == []
    dead = out["dead"]
    assert len(dead) == 2 and all(d["source"] == "unmatched:click" for d in dead), dead
    assert {json.loads(d["raw"])["request_id"] for d in dead} == {"no-such-request", early["request_id"]}
    # clicks arriving after their impression's hour ended changed it in late panes
    assert any(r["pane"] == "late" and not r["is_final"] for r in out["rows"])


# --------------------------------------------------------------------------------------------
# late judgments, late impressions, early panes, several pieces, empty windows

def _small_judged():
    judg = [jdg("q1", f"d{i}", g) for i, g in enumerate([2, 0, 1, 0, 3])] + [jdg("q2", "d0", 1), jdg("q2", "d1", 0)]
    reqs = {  # request: (system, query, start)
        "r1": ("A", "q1", BASE + 5 * MIN), "r2": ("A", "q1", BASE + 20 * MIN), "r3": ("B", "q1", BASE + 30 * MIN),
        "r4": ("A", "q2", BASE + 40 * MIN), "r5": ("A", "q1", BASE + 2 * HOUR + 10 * MIN),
    }
    rnd = random.Random(3)
    imps = []
    for rid, (system, q, t0) in reqs.items():
        for pos, item in enumerate(rnd.sample([f"d{i}" for i in range(7)], 4), 1):
            imps.append(imp(rid, item, pos, t0 + pos, system=system, query=q, score=rnd.random()))
    return imps, judg


@pytest.mark.parametrize("shards", [16, 0], ids=["request_shards16", "per_request"])
def test_late_judgments_within_and_beyond_the_allowed_lateness(shards):
    """A judgment arriving after the window's on-time pane, within the allowed lateness, updates
    the query's requests in a late pane; one arriving after the window closed goes to the late
    output, leaves that window's final pane alone and is used by a later window."""
    imps, judg = _small_judged()
    metrics = ["ndcg@3", "P@2", "map"]
    w0 = [r for r in imps if r["timestamp"] < BASE + HOUR]
    w2 = [r for r in imps if r["timestamp"] >= BASE + 2 * HOUR]
    within = jdg("q1", "d5", 3, ts=BASE + HOUR + 5 * MIN)   # q1 is judged again after hour 0 ended
    beyond = jdg("q1", "d6", 2, ts=BASE + HOUR + 40 * MIN)  # after hour 0 closed (lateness 30m)
    steps = [("judgments", judg), ("impressions", w0), ("watermark", BASE + HOUR + MIN),
             ("judgments", [within]), ("watermark", BASE + HOUR + 35 * MIN),
             ("judgments", [beyond]), ("impressions", w2), ("watermark", BASE + 4 * HOUR)]
    out = run_stream(lambda p: stream_metrics(p, steps, request_shards=shards, metrics=metrics, window="1h", allowed_lateness="30m",
                                              ctr=False))
    # hour 0: its final pane includes `within`, not `beyond`
    batch0 = run_batch(w0, judg + [within], metrics, window="1h", ctr=False)
    batch2 = run_batch(w2, judg + [within, beyond], metrics, window="1h", ctr=False)
    assert_final_equals_batch(out["rows"], batch0 + batch2)
    # the late pane changed the value: on-time (before `within`) differs from the final value
    on_time = {key(r): r["value"] for r in out["rows"] if r["pane"] == "on_time" and r["window_start"] == BASE}
    before = {key(r): r["value"] for r in run_batch(w0, judg, metrics, window="1h", ctr=False)}
    assert on_time == before
    final = final_rows(out["rows"])
    assert any(final[k]["value"] != v for k, v in on_time.items())
    assert panes_of(out["rows"])[(BASE, "A")] == [("on_time", 0, False), ("late", 1, False), ("late", 2, True)]
    assert len(out["late"]) == 1 and out["late"][0]["source"] == "late:judgment"
    assert json.loads(out["late"][0]["raw"])["item_id"] == "d6" and "final" in out["late"][0]["reason"]


@pytest.mark.parametrize("shards", [16, 0], ids=["request_shards16", "per_request"])
def test_late_impressions_and_clicks_beyond_the_allowed_lateness_go_to_the_late_output(shards):
    imps, judg = _small_judged()
    on_time = [r for r in imps if r["timestamp"] < BASE + HOUR]
    too_late = imp("r9", "d1", 1, BASE + 30 * MIN, clicked=True)        # hour 0 closed at 1:10
    late_piece = imp("r1", "d6", 5, BASE + 90 * MIN, clicked=False)     # its own hour is open, r1's is not
    in_time = imp("r8", "d2", 1, BASE + 50 * MIN, clicked=True)         # late, within the lateness
    late_click = {"request_id": "r1", "item_id": imps[0]["item_id"], "timestamp": BASE + 70 * MIN}
    steps = [("judgments", judg), ("impressions", on_time), ("watermark", BASE + HOUR + 5 * MIN),
             ("impressions", [in_time]), ("watermark", BASE + HOUR + 20 * MIN),
             ("impressions", [too_late, late_piece]), ("clicks", [late_click]), ("watermark", BASE + 3 * HOUR)]
    out = run_stream(lambda p: stream_metrics(p, steps, request_shards=shards, metrics=["P@1"], window="1h", allowed_lateness="10m",
                                              attribution_delay="2h"))
    assert sorted(json.loads(r["raw"]).get("event_id", "click") for r in out["late"]) == sorted(
        [too_late["event_id"], late_piece["event_id"], "click"])
    assert {r["source"] for r in out["late"]} == {"late:impression", "late:click"}
    # clicks come as events here: an impression's null clicked is "not clicked unless a click matches"
    # (issue 36 item 4), and the one click event is late, so the batch reference reads null as False
    accepted = [dict(r, clicked=bool(r["clicked"])) for r in on_time + [in_time]]
    batch = run_batch(accepted, judg, ["P@1"], window="1h")
    assert_final_equals_batch(out["rows"], batch)


def test_early_panes_by_count_and_by_processing_time():
    imps, judg = _small_judged()
    w0 = sorted([r for r in imps if r["timestamp"] < BASE + HOUR], key=lambda r: r["timestamp"])
    by_req = defaultdict(list)
    for r in w0:
        by_req[r["request_id"]].append(r)
    reqs = sorted(by_req, key=lambda q: by_req[q][0]["timestamp"])
    steps = [("judgments", judg)]
    for i, rid in enumerate(reqs):
        steps += [("impressions", by_req[rid]), ("watermark", by_req[rid][0]["timestamp"] + 1000), ("advance", 10.0)]
    steps.append(("watermark", BASE + 2 * HOUR))
    out = run_stream(lambda p: {
        **{f"count_{k}": v for k, v in stream_metrics(p, steps, metrics=["P@2"], window="1h", early_count=1,
                                                       ctr=False).items()},
    })
    rows = [r for r in out["count_rows"] if r["system"] == "A" and r["slice"] == "all"]
    early = sorted([r for r in rows if r["pane"] == "early"], key=lambda r: r["pane_index"])
    # one early pane per update of system A, each with the requests seen so far
    a_reqs = [q for q in reqs if by_req[q][0]["system_id"] == "A"]
    assert [r["num_queries"] for r in early] == [1, 2, 3]
    for i, r in enumerate(early):
        seen = [x for q in a_reqs[: i + 1] for x in by_req[q]]
        assert r["value"] == run_batch(seen, judg, ["P@2"], window="1h", ctr=False)[0]["value"]
    assert [r["pane"] for r in sorted(rows, key=lambda r: r["pane_index"])] == ["early"] * 3 + ["on_time"]
    assert_final_equals_batch(out["count_rows"], run_batch(w0, judg, ["P@2"], window="1h", ctr=False))

    # processing time: 10 s per step, early panes every 25 s of processing time
    out = run_stream(lambda p: stream_metrics(p, steps, metrics=["P@2"], window="1h", early_every="25s",
                                              clock=replay_clock, ctr=False))
    rows = [r for r in out["rows"] if r["system"] == "A" and r["slice"] == "all"]
    seq = [(r["pane"], r["num_queries"]) for r in sorted(rows, key=lambda r: r["pane_index"])]
    assert seq[0][0] == "early" and seq[-1] == ("on_time", 3) and 2 <= len(seq) <= 3, seq
    assert_final_equals_batch(out["rows"], run_batch(w0, judg, ["P@2"], window="1h", ctr=False))


@pytest.mark.parametrize("shards", [16, 0], ids=["request_shards16", "per_request"])
def test_request_in_several_pieces_and_an_emptied_window(shards):
    """A request arrives in three pieces (the last after the on-time pane, within the lateness); a
    late, earlier piece moves another request to the previous window, leaving its window empty:
    that window's final pane has empty rows (the batch job has none); windows without any event
    have no rows at all."""
    judg = [jdg("q1", f"d{i}", g) for i, g in enumerate([1, 0, 2, 1, 0, 0])]
    p1 = [imp("r1", "d0", 1, BASE + 10 * MIN, clicked=True), imp("r1", "d1", 2, BASE + 10 * MIN, clicked=False)]
    p2 = [imp("r1", "d2", 3, BASE + 40 * MIN, clicked=True)]    # after the on-time pane, within the lateness
    p3 = [imp("r1", "d3", 4, BASE + 65 * MIN, clicked=True)]    # in the next hour: still r1's window
    mover = [imp("r2", "d4", 1, BASE + 5 * HOUR + 5 * MIN, clicked=False)]
    earlier = [imp("r2", "d5", 2, BASE + 4 * HOUR + 50 * MIN, clicked=True)]
    steps = [("judgments", judg), ("impressions", p1), ("watermark", BASE + 61 * MIN), ("impressions", p2),
             ("watermark", BASE + 70 * MIN), ("impressions", p3), ("watermark", BASE + 5 * HOUR),
             ("impressions", mover), ("watermark", BASE + 6 * HOUR + 5 * MIN), ("impressions", earlier),
             ("watermark", BASE + 9 * HOUR)]
    metrics = ["P@3", "ndcg@3"]
    out = run_stream(lambda p: stream_metrics(p, steps, request_shards=shards, metrics=metrics, window="1h", allowed_lateness="90m"))
    assert out["late"] == [] and out["dead"] == []
    everything = p1 + p2 + p3 + mover + earlier
    final = assert_final_equals_batch(out["rows"], run_batch(everything, judg, metrics, window="1h"))
    # r1 in hour 0 was scored on time with its first piece, then again as the other pieces came
    r1 = sorted([r for r in out["rows"] if r["window_start"] == BASE and r["metric"] == "P@3" and
                 r["system"] == "A" and r["slice"] == "all"], key=lambda r: r["pane_index"])
    values = [r1[0]["value"]] + [b["value"] for a, b in zip(r1, r1[1:]) if b["value"] != a["value"]]
    assert r1[0]["pane"] == "on_time" and values == [1 / 3, 2 / 3]
    assert all(r["pane"] == "late" for r in r1[1:]) and r1[-1]["is_final"]
    # hour 5 had r2 (on time), then lost it to hour 4: its final ranking rows are empty, the
    # impression served in hour 5 still counts for its click rate
    h5 = {k[3]: r for k, r in final.items() if k[0] == BASE + 5 * HOUR and k[1] == "all"}
    assert all(h5[m]["num_queries"] == 0 and math.isnan(h5[m]["value"]) for m in metrics)
    assert [r["value"] for r in out["rows"] if r["window_start"] == BASE + 5 * HOUR and r["metric"] == "P@3"
            and r["pane"] == "on_time"] == [0.0]
    assert h5["ctr"]["num_queries"] == 1
    assert {r["window_start"] for r in out["rows"]} == {BASE, BASE + HOUR, BASE + 4 * HOUR, BASE + 5 * HOUR}


# --------------------------------------------------------------------------------------------
# sliding and session windows

def test_sliding_windows_equal_batch_on_each_window():
    imps, judg = _small_judged()
    imps = [dict(r, clicked=(i % 3 == 0)) for i, r in enumerate(imps)]
    metrics = ["P@2", "map"]
    steps = Replay.from_records(imps, judg, step="20m").steps
    out = run_stream(lambda p: stream_metrics(p, steps, metrics=metrics, window="2h/1h", allowed_lateness="0"))
    starts = sorted({r["window_start"] for r in out["rows"]})
    assert starts == [BASE - HOUR, BASE, BASE + HOUR, BASE + 2 * HOUR]
    batch = []
    first = defaultdict(lambda: math.inf)
    for r in imps:
        first[(r["system_id"], r["request_id"])] = min(first[(r["system_id"], r["request_id"])], r["timestamp"])
    for s in starts:
        rank_sub = [r for r in imps if s <= first[(r["system_id"], r["request_id"])] < s + 2 * HOUR]
        click_sub = [r for r in imps if s <= r["timestamp"] < s + 2 * HOUR]
        for r in run_batch(rank_sub, judg, metrics, ctr=False) + run_batch(click_sub, [], None):
            batch.append(dict(r, window_start=s, window_end=s + 2 * HOUR))
    assert_final_equals_batch(out["rows"], batch)


def test_session_windows_per_user_and_per_request():
    """Sessions of each user (requests less than 30 minutes apart) and of each request; a late
    request bridging two sessions merges them: the absorbed session gets an empty final pane."""
    judg = [jdg("q1", f"d{i}", g) for i, g in enumerate([1, 0, 2, 1])]
    t = BASE
    plan = [("u1", "a", t), ("u1", "b", t + 10 * MIN), ("u1", "c", t + 60 * MIN), ("u2", "d", t + 5 * MIN),
            ("u1", "e", t + 80 * MIN)]
    imps = []
    for user, rid, t0 in plan:
        for pos in (1, 2, 3):
            imps.append(imp(rid, f"d{(pos + ord(rid)) % 4}", pos, t0 + pos * 1000, user=user, clicked=pos == 2,
                            score=float(pos % 3)))
    bridge = [imp("f", "d1", 1, t + 35 * MIN, user="u1", clicked=True)]
    steps = Replay.from_records(imps, judg, step="15m").steps
    # the bridge arrives after u1's sessions [0:00, 0:40) and [1:00, ...) both fired, within the
    # first one's lateness; it joins them into one session
    cut = next(i for i, st in enumerate(steps) if st == ("watermark", t + 75 * MIN)) + 1
    steps = steps[:cut] + [("impressions", bridge)] + steps[cut:] + [("watermark", t + 5 * HOUR)]
    metrics = ["P@2"]
    out = run_stream(lambda p: stream_metrics(p, steps, metrics=metrics, window="session:30m",
                                              allowed_lateness="45m", early_count=1))
    rows = out["rows"]
    assert out["late"] == [] and out["dead"] == []
    everything = imps + bridge
    sessions = {"user=u1": ["a", "b", "f", "c", "e"], "user=u2": ["d"]}
    batch = []
    for label, rids in sessions.items():
        sub = [r for r in everything if r["request_id"] in rids]
        start, end = min(r["timestamp"] for r in sub), max(r["timestamp"] for r in sub) + 30 * MIN
        for r in run_batch(sub, judg, metrics):
            batch.append(dict(r, window_start=start, window_end=end, slice=label))
    final = final_rows(rows)
    gone = [r for r in final.values() if r["num_queries"] == 0]
    assert gone and {r["window_start"] for r in gone} == {t + 60 * MIN + 1000}  # u1's second session, absorbed
    assert {r["pane"] for r in rows if r["window_start"] == t + 60 * MIN + 1000} == {"early"}  # closed early
    assert_final_equals_batch(rows, batch)

    # per request: each request is its own session, closing 30 minutes after its last impression;
    # without lateness, the bridge arriving after later sessions closed is late: its click and
    # ranking parts alike
    late_steps = Replay.from_records(imps, judg, step="15m").steps + [
        ("watermark", t + 120 * MIN), ("impressions", bridge), ("watermark", t + 5 * HOUR)]
    # (one replay per pipeline: the local runner interleaves two replays' steps and timers freely)
    late0 = run_stream(lambda p: stream_metrics(p, late_steps, metrics=metrics, window="session:30m/request"))
    assert {(json.loads(r["raw"])["request_id"], json.loads(r["raw"])["kind"]) for r in late0["late"]} == {
        ("f", "rank"), ("f", "ctr")}
    assert not any(r["slice"] == "request=f" for r in late0["rows"])
    out = run_stream(lambda p: stream_metrics(p, steps, metrics=metrics, window="session:30m/request",
                                              allowed_lateness="45m"))
    assert out["late"] == []
    final = final_rows(out["rows"])
    got = {(k[1], k[3]): r for k, r in final.items()}
    assert {k[0] for k in got} == {f"request={rid}" for rid in "abcdef"}
    for rid in "abcdef":
        sub = [r for r in everything if r["request_id"] == rid]
        for b in run_batch(sub, judg, metrics):
            f = got[(f"request={rid}", b["metric"])]
            assert (f["value"], f["num_queries"]) == (b["value"], b["num_queries"])
            assert (f["window_start"], f["window_end"]) == (min(r["timestamp"] for r in sub),
                                                            max(r["timestamp"] for r in sub) + 30 * MIN)


def _sessions_by_hand(imps, gap):
    """{(user, start): (end, [impressions])}: each user's requests (spans from their first to last
    impression) merged while the next one starts before the current session's end (last + gap)."""
    spans = defaultdict(list)
    for r in imps:
        spans[(r["user_id"], r["request_id"])].append(r)
    by_user = defaultdict(list)
    for (user, _), rs in spans.items():
        ts = [r["timestamp"] for r in rs]
        by_user[user].append((min(ts), max(ts), rs))
    out = {}
    for user, reqs in by_user.items():
        cur = None
        for first, last, rs in sorted(reqs, key=lambda x: x[0]):
            if cur is not None and first < cur[1]:
                cur[1] = max(cur[1], last + gap)
                cur[2].extend(rs)
            else:
                cur = [first, last + gap, list(rs)]
                out[(user, first)] = cur
    return {k: (end, rs) for k, (_, end, rs) in out.items()}


@pytest.mark.parametrize("lateness", ["0", "45m"])
def test_session_windows_final_panes_equal_the_batch_job(lateness):
    """Session windows with many sessions ending within each one-hour replay step (30 users, requests
    minutes apart): every deadline fires at its own time (one event timer each), and the final panes
    equal the batch job on each session (sessions grouped by hand)."""
    rng = random.Random(7)
    judg = [jdg("q1", f"d{i}", g) for i, g in enumerate([1, 0, 2, 1, 0, 3])]
    imps = []
    for n in range(120):
        user, t0 = f"u{rng.randrange(30)}", BASE + rng.randrange(6 * HOUR)
        items = rng.sample(range(6), rng.randint(1, 3))
        for pos, item in enumerate(items, 1):
            imps.append(imp(f"r{n}", f"d{item}", pos, t0 + rng.randrange(3) * MIN + pos, user=user,
                            clicked=rng.random() < 0.3))
    steps = Replay.from_records(imps, judg, step="1h").steps
    metrics = ["P@2", "ndcg@3"]
    on = run_stream(lambda p: stream_metrics(p, steps, metrics=metrics, window="session:30m",
                                             allowed_lateness=lateness))
    sessions = _sessions_by_hand(imps, 30 * MIN)
    assert len(sessions) > 50
    # the batch job on each session at once: a session attribute, sliced by it
    where = {}
    tagged = []
    for n, ((user, start), (end, sub)) in enumerate(sessions.items()):
        where[f"s={n}"] = (start, end, f"user={user}")
        tagged += [dict(r, attributes={"s": str(n)}) for r in sub]
    batch = []
    for r in run_batch(tagged, judg, metrics, slices=["s"]):
        if r["slice"] != "all":
            start, end, label = where[r["slice"]]
            batch.append(dict(r, window_start=start, window_end=end, slice=label))
    assert on["late"] == [] and on["dead"] == []
    assert_final_equals_batch(on["rows"], batch)


# --------------------------------------------------------------------------------------------
# sources, sinks and the command

def test_pubsub_kafka_and_directory_sources_are_constructed():
    from streameval.beam.streaming import sources

    opts = PipelineOptions([])
    opts.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(options=opts)
    ps = p | "PubSub" >> sources.ReadPubSubEvents("projects/my-project/subscriptions/impressions",
                                                  timestamp_attribute="ts")
    watched = p | "Watch" >> sources.WatchAvro("/tmp/nowhere/*.avro", interval=5)
    rows = (ps, watched) | beam.Flatten() | StreamMetrics(window="1h")
    assert isinstance(rows, beam.pvalue.PCollection)
    kafka = sources.ReadKafkaEvents("localhost:9092", "impressions")
    assert type(kafka.read).__name__ == "ReadFromKafka"
    # the watermark follows the records' Kafka timestamps (set by producers to the event time), not the
    # reading time (Beam's default), so a backlog is not late
    assert kafka.timestamp_policy == "CreateTime"
    payload = getattr(kafka.read, "_payload", None)  # the expansion request Beam will send (2.77)
    assert isinstance(payload, bytes), "Beam's ReadFromKafka no longer keeps its payload: check the policy otherwise"
    assert b"CreateTime" in payload and b"ProcessingTime" not in payload
    with pytest.raises(ValueError, match="timestamp_policy"):
        sources.ReadKafkaEvents("localhost:9092", "impressions", timestamp_policy="now")
    ev = sources._json_event(json.dumps({"timestamp": 1_000_123, "x": 1}).encode())
    assert ev.timestamp.micros == 1_000_123 and ev.value["x"] == 1
    # damaged bytes do not fail the bundle: the text goes on, and the per-event engine's check makes
    # it a dead letter
    assert sources._json_event(b"{not json\xff") == "{not json\ufffd"
    from streameval.io.records import check_impression

    assert check_impression(sources._json_event(b"{not json")) == "record is not a mapping but str"


def test_stream_command_replays_the_sample_and_writes_panes(stream_replay):
    """``streameval stream --replay`` on a slice of the bundled sample: the panes are printed as
    they fire and written one file set per window and pane; the final panes in the files equal the
    batch job on the same records (the replay: ``tests/fixtures_stream.py``)."""
    obd, letor, judg, out_dir = stream_replay.obd, stream_replay.letor, stream_replay.judg, stream_replay.out_dir
    assert stream_replay.code == 0
    printed = stream_replay.printed
    assert "pane on_time #" in printed and "pane early #0" in printed and " final " in printed
    assert f"replayed {len(obd) + len(letor)} impression, {len(judg)} judgment and 0 click records" in printed
    n_panes = [int(x) for x in re.search(r"panes: (\d+) early, (\d+) on_time, (\d+) late \((\d+) final\)",
                                         printed).groups()]
    assert n_panes[0] > 0 and n_panes[1] > 0 and n_panes[3] > 0
    assert "late data: none" in printed and "0 invalid records" in printed
    files = sorted(p.name for p in out_dir.iterdir())
    jsonl = [f for f in files if f.startswith("metrics-") and f.endswith(".jsonl")]
    assert jsonl and len([f for f in files if f.endswith(".avro")]) == len(jsonl)
    rows = []
    for f in jsonl:
        part = [json.loads(line) for line in open(out_dir / f)]
        assert part == list(avro.read_records(str(out_dir / f.replace(".jsonl", ".avro")), "metric_result"))
        assert len({(r["window_start"], r["system"], r["pane_index"], r["pane"]) for r in part}) == 1
        rows.extend(part)
    batch = run_batch(obd + letor, judg, ["ndcg@10", "map"], window="6h")
    assert_final_equals_batch(rows, batch)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["replayed"]["impressions"] == len(obd) + len(letor)
    # one file set per window and pane: the panes counted are the files written (two formats each)
    assert summary["counted_here"]["panes_final"] == len([f for f in jsonl if f.endswith("-final.jsonl")])
    assert sum(n_panes[:3]) == len(jsonl)
    assert stream_cli.main(["--replay", "--impressions", stream_replay.inputs]) == 2  # no window
    assert stream_cli.main(["--window", "1h", "--impressions", "x"]) == 2  # no source
