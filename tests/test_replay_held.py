"""The local runner's replays keep the replayed records out of the pipeline graph (issue 38 item 3):
the graph carries one descriptor per step, the plan read when the pipeline was built stays in the
process (``replay.held_plan``), and a plan let go is read again from the files with the same result."""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from streameval.beam.streaming import replay
from streameval.beam.streaming.coarse_replay import ColumnReplayConfig, ReplayColumns, _PlayStep, column_plan
from streameval.beam.streaming.sources import RecordReplayConfig, ReplayAvro, _PlayRecords, record_plan
from streameval.beam.columnar_columns import thaw
from streameval.io import avro
from tests.test_stream import jdg
from tests.test_stream_columnar import _log


def _files(tmp_path, n_requests):
    files, judg = _log(seed=5, n_requests=n_requests)
    paths = []
    for i, recs in enumerate(files):
        paths.append(str(tmp_path / f"part-{i:03d}.avro"))
        avro.write_records(paths[-1], "impression", recs)
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)
    return paths, [str(tmp_path / "judgments.avro")], sum(map(len, files))


def _shard_fn(p):
    """The columnar engine's shards DoFn in pipeline ``p``."""
    from apache_beam.pipeline import PipelineVisitor

    from streameval.beam.streaming.coarse import _ShardFn

    found = []

    class Find(PipelineVisitor):
        def visit_transform(self, node):
            fn = getattr(node.transform, "fn", None)
            if isinstance(fn, _ShardFn):
                found.append(fn)

    p.visit(Find())
    assert len(found) == 1
    return found[0]


def _graph_bytes(make) -> int:
    p = beam.Pipeline(options=PipelineOptions(streaming=True))
    p.options.view_as(StandardOptions).streaming = True
    make(p)
    return len(p.to_runner_api().SerializeToString())


@pytest.mark.parametrize("kind", ["columns", "records"])
def test_the_graph_does_not_grow_with_the_replayed_log(tmp_path, kind):
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir(), large.mkdir()
    sizes = {}
    for folder, n in ((small, 40), (large, 2000)):
        imps, judg, records = _files(folder, n)
        if kind == "columns":
            replay_of = ReplayColumns(imps, step="1h", pace=0)
        else:
            replay_of = ReplayAvro(imps, judg, step="1h", pace=0)
        sizes[n] = _graph_bytes(lambda p, r=replay_of: p | r)
    # 50 times the records (about 9,000 against 180): the graph's size stays within its descriptors' few
    # hundred bytes (the files' names are as long, the steps as many: 6 hours in steps of 1 h)
    assert abs(sizes[2000] - sizes[40]) < 2_000, sizes


def test_a_plan_let_go_is_read_again_from_the_files(tmp_path):
    imps, judg, _ = _files(tmp_path, 300)
    cfg = ColumnReplayConfig(tuple(imps), 3_600_000_000, 100)
    token = replay.new_token()
    held = replay.held_plan(token, cfg, column_plan)
    step = sorted(held.steps)[2]
    element = (token, cfg.paths, cfg.step, cfg.block, step, 123, 0.0, 456)
    first = list(_PlayStep().process(element))
    # the step's blocks with the watermark before it, then the flush of the next one (the shards
    # score the windows that end by then)
    assert [(p, n, wm) for p, _, n, wm in first[:-1]] == [(p, n, 123) for p, _, n in held.steps[step]]
    assert first[-1] == (None, ("flush", None), 0, 456)
    for _ in range(replay.HELD_PLANS):  # later replays push it out
        replay.held_plan(replay.new_token(), cfg, column_plan)
    assert token not in replay._HELD
    again = list(_PlayStep().process(element))
    assert again == first and again[0][1] is not first[0][1]  # read again, equal

    rcfg = RecordReplayConfig((("impressions", tuple(imps)), ("judgments", tuple(judg))), 3_600_000_000)
    token = replay.new_token()
    plan = replay.held_plan(token, rcfg, record_plan)
    element = (token, rcfg.paths, rcfg.step, 1, 0.0)
    first = [(o.tag, o.value.value, o.value.timestamp) for o in _PlayRecords().process(element)]
    assert first and {t for t, _, _ in first} <= {"impressions", "judgments"}
    assert [v for _, v, _ in first] == [(path, recs) for _, path, recs in plan.steps[1][1]]
    replay._HELD.clear()
    again = [(o.tag, o.value.value, o.value.timestamp) for o in _PlayRecords().process(element)]
    assert again == first


def test_the_shards_carry_a_reference_to_the_judgments_on_the_local_runner(tmp_path):
    """The columnar engine's judgments (read when the pipeline is built) are held in the process on the
    in-process runner: the graph does not grow with them, and judgments let go are read again, equal."""
    from streameval.beam.streaming.coarse import ColumnarStreamMetrics
    from streameval.beam.streaming.coarse_judgments import HeldJudgments, held_judgments

    imps, _, _ = _files(tmp_path, 40)
    sizes, refs = {}, []
    for n in (30, 3000):
        path = str(tmp_path / f"judgments-{n}.avro")
        avro.write_records(path, "judgment", [jdg(f"q{i % 30}", f"d{i}", i % 3) for i in range(n)])
        for in_process in (True, False):
            p = beam.Pipeline(options=PipelineOptions(streaming=True))
            sm = ColumnarStreamMetrics([path], ["ndcg@10"], "1h", in_process=in_process)
            _ = p | ReplayColumns(imps, step="1h", pace=0) | sm
            sizes[n, in_process] = len(p.to_runner_api().SerializeToString())
            refs.append(_shard_fn(p).judgments)
    assert abs(sizes[3000, True] - sizes[30, True]) < 2_000, sizes
    assert sizes[3000, False] - sizes[30, False] > 10_000, sizes  # elsewhere the DoFn carries them
    held = refs[2]
    assert isinstance(held, HeldJudgments) and isinstance(refs[3], dict)
    first = held_judgments(held, "unused")
    assert sum(v.columns["n"] for v in first.values()) >= 1
    replay._HELD.clear()
    again = held_judgments(held, "unused")
    assert again is not first

    def columns(by_shard):
        def plain(x):
            return {a: plain(y) for a, y in x.items()} if isinstance(x, dict) else np.asarray(x).tolist()

        return {q: plain(v.columns) for q, v in by_shard.items()}

    assert columns(again) == columns(first)
    assert sum(len(c["query_id"]) for c in columns(first).values()) == 3000  # one grade each


def test_query_judgments_give_the_rows_of_the_queries_asked_in_their_order():
    """The stream's shards score a window's requests against their queries' judgments only
    (coarse_judgments.QueryJudgments): the rows kept are those a filter on the query ids keeps, in the
    same order, the subtopic judgments likewise; queries without judgments give none."""
    import pyarrow as pa

    from streameval.beam.columnar_columns import freeze
    from streameval.beam.streaming.coarse_judgments import QueryJudgments

    rng = np.random.default_rng(3)
    qs = [f"q{i}" for i in rng.integers(0, 40, 500)]
    sub_qs = [f"q{i}" for i in rng.integers(0, 40, 90)]
    cols = {
        "n": 500,
        "query_id": pa.array(qs),
        "item_id": pa.array([f"d{i}" for i in range(500)]),
        "grade": rng.integers(0, 4, 500).astype(np.float64),
        "sub_query_id": pa.array(sub_qs),
        "sub_subtopic": pa.array([str(i % 3) for i in range(90)]),
        "sub_item_id": pa.array([f"d{i}" for i in range(90)]),
        "sub_grade": np.arange(90, dtype=np.float64),
    }
    held = QueryJudgments([freeze(cols, hold=True)])
    asked = ["q3", "q17", "q3", "nope", None, "q39"]
    parts = held.of(pa.array(asked))
    got = thaw(parts[0])
    want = {"q3", "q17", "q39"}
    rows = [i for i, q in enumerate(qs) if q in want]
    srows = [i for i, q in enumerate(sub_qs) if q in want]
    assert got["n"] == len(rows) > 0
    assert got["query_id"].to_pylist() == [qs[i] for i in rows]
    assert got["item_id"].to_pylist() == [f"d{i}" for i in rows]
    assert got["grade"].tolist() == cols["grade"][rows].tolist()
    assert got["sub_query_id"].to_pylist() == [sub_qs[i] for i in srows]
    assert got["sub_grade"].tolist() == [float(i) for i in srows]
    assert held.of(pa.array(["nope", None])) == [] and QueryJudgments([]).of(pa.array(["q3"])) == []


_SCORED: list = []
_ROWS: list = []


def _keep_row(row):
    _ROWS[-1].append(row)


@pytest.mark.parametrize(
    "early,gaps", [([], False), ([], True), (["early_every"], False)], ids=["on-time", "gaps", "early-panes"]
)
def test_a_replay_scores_each_window_once_at_its_flush(tmp_path, monkeypatch, early, gaps):
    """The columnar replay flushes before each move of its watermark; without early panes a shard then
    cleans and scores a window once, at the flush before the watermark passes its end, not again at
    each of its pieces (1 M impressions in one 30-minute window: 19 pieces scored 9.9 M request rows,
    9.4 s; now 1 M, 5.2 s). Every pane equals the shards that score at each piece (``flushes=False``),
    also when the log has gaps longer than a window between its steps (``gaps``: only the first 10
    minutes of each hour; a flush stamped with the next step's start lay after the windows' end, and
    they were never scored), and with early panes asked for the shards score at each piece as before."""
    from streameval.beam.streaming.coarse import ColumnarStreamMetrics, _ShardFn
    from streameval.beam.streaming.replay import replay_clock
    from tests.test_stream import HOUR
    from tests.test_stream_columnar import T0

    imps, judg, n = _files(tmp_path, 300)
    if gaps:  # the records of each hour's first 10 minutes (windows of 30 minutes: some of them empty)
        recs = [r for f in imps for r in avro.read_records(f) if (r["timestamp"] - T0) % HOUR < HOUR // 6]
        imps = [str(tmp_path / "gaps.avro")]
        avro.write_records(imps[0], "impression", recs)
        n = len(recs)
    real = _ShardFn._score_windows

    def counted(self, shard, chunk, rwin, touched, tally):
        _SCORED[-1] += int(chunk["n"])
        return real(self, shard, chunk, rwin, touched, tally)

    monkeypatch.setattr(_ShardFn, "_score_windows", counted)
    out = {}
    for flushes in (True, False):
        _SCORED.append(0)
        _ROWS.append([])
        p = beam.Pipeline(options=PipelineOptions(streaming=True))
        kw = dict(early_every="1s", clock=replay_clock) if early else {}
        sm = ColumnarStreamMetrics(
            judg, ["ndcg@10", "P@5"], "30m" if gaps else "1h", allowed_lateness="1h", flushes=flushes, **kw
        )
        _ = p | ReplayColumns(imps, step="10m", pace=1.0 if early else 0, block=7) | sm | beam.Map(_keep_row)
        p.run().wait_until_finish()
        out[flushes] = sorted(_ROWS[-1], key=lambda r: sorted((k, str(v)) for k, v in r.items()))
    deferred, eager = _SCORED[-2:]
    assert out[True] and out[True] == out[False]
    kinds = {r["pane"] for r in out[True]}
    assert "on_time" in kinds and ("early" in kinds) == bool(early), kinds
    if early:
        assert deferred == eager  # early panes need every piece scored when it comes
    else:
        # each of the log's 6 hours (and a request straddling two) scored once: about the impressions
        assert deferred < 1.2 * n < (eager / 1.5 if gaps else eager / 3), (deferred, n, eager)


def test_a_piece_after_the_flush_of_its_window_is_scored_when_it_comes(tmp_path):
    """Pieces and flushes may reach a shard out of order (bundles of the read stage finishing out of
    order). Before a flush crosses a window's end the shard only marks the window dirty; a flush that
    overtook the crossing one (timestamped at or after the window's end) leaves it dirty, as its
    partial would come after the downstream watermark passed the end; the crossing flush scores it;
    a piece after that is scored when it comes (its outputs hold the downstream watermark, so the
    on-time pane still has it). The window's last partial equals that of a shard scoring every
    piece."""
    import pyarrow as pa

    from streameval.beam.streaming.coarse import ColumnarStreamMetrics, _ReadBlocks
    from streameval.beam.streaming.common import FLUSH
    from apache_beam.utils.timestamp import Timestamp

    from streameval.beam.streaming.live import ipc_bytes
    from tests.test_stream import _Bag, _Timer, _Value

    imps, judg, _ = _files(tmp_path, 120)
    plan = column_plan(ColumnReplayConfig(tuple(imps), 3_600_000_000, 10**6))
    first = sorted(s for s in plan.steps if s >= 0)[0]
    table = pa.concat_tables([pa.ipc.open_stream(b).read_all() for _, (_, b), _ in plan.steps[first]])
    start, end = first * 3_600_000_000, (first + 1) * 3_600_000_000
    cut = table.num_rows * 2 // 3

    def pieces(t):  # the reader's shard pieces of Arrow rows (one request shard)
        read = _ReadBlocks(1, None, "t", hold=False)
        return [
            v
            for o in read.process(("p", ("arrow", ipc_bytes(t)), t.num_rows, None))
            if not isinstance(o, beam.pvalue.TaggedOutput)
            for _, v in [o]
        ]

    def shard(flushes):
        p = beam.Pipeline(options=PipelineOptions(streaming=True))
        _ = (
            p
            | ReplayColumns(imps, step="1h", pace=0)
            | ColumnarStreamMetrics(judg, ["ndcg@10", "P@5"], "1h", request_shards=1, in_process=False, flushes=flushes)
        )
        return _shard_fn(p), _Bag(), _Value(), _Timer()

    def feed(state, element, at=start):
        fn, bag, meta, timer = state
        outs = fn.process((0, element), bag, meta, timer, Timestamp(micros=at))
        return [o for o in outs if not isinstance(o, beam.pvalue.TaggedOutput)]

    def last_part(outs, window):
        parts = [m for _, msgs in outs for m in msgs if window in m[3]]
        return {(s, m[1]): m[3][window] for (s, msgs) in outs for m in msgs if window in m[3]} if parts else None

    early, late = pieces(table.slice(0, cut)), pieces(table.slice(cut))
    eager, deferred = shard(False), shard(True)
    want = None
    for v in early + late:
        want = last_part(feed(eager, v), first) or want
    assert want
    got = [feed(deferred, v) for v in early]
    assert all(not outs for outs in got)  # held: the window is dirty until its flush
    assert deferred[2].read()[6] == [first]
    assert not feed(deferred, (FLUSH, end + 3_600_000_000), at=end)  # overtook the crossing flush
    assert deferred[2].read()[6] == [first]
    after_flush = last_part(feed(deferred, (FLUSH, end)), first)
    assert after_flush and after_flush != want  # the flush scored what had come
    got = None
    for v in late:  # after the flush of its end: scored when it comes
        got = last_part(feed(deferred, v), first) or got
    assert got == want and deferred[2].read()[6] == []
