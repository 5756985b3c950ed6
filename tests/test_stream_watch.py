"""``streameval stream --watch`` live on Beam's local streaming runner: Avro files dropped into a
directory while the job runs become early, on-time and late panes, written while the job still
waits for more files; the final panes equal the batch job on the same records; late data,
damaged files and a file the environment does not deliver behave as in the batch job. The watcher's
watermark policy on its own (no Beam): :class:`streameval.beam.streaming.live.FileWatcher`."""

import glob
import json
import os
import threading
import time

import pytest
from apache_beam.testing.test_stream import ElementEvent, WatermarkEvent

from streameval.jobs import stream as stream_cli
from streameval.beam.sources import InputUnavailableError
from streameval.beam.streaming import live, sinks
from streameval.io import avro

from .conftest import REPO
from .test_stream import DAY, HOUR, assert_final_equals_batch, panes_of, run_batch
from .test_stream_reliability import _truncated_copy

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

SAMPLE = REPO / "data" / "sample"


def _wait(cond, what, timeout=180.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _drop(records, path, name="impression"):
    """Writes the file elsewhere and renames it into the watched directory (a complete file)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}")
    avro.write_records(tmp, name, records)
    os.replace(tmp, path)


def _week():
    """Two Open Bandit policies of the bundled week (clicks) and ten LETOR queries (judged rankings)
    placed in its second day; the LETOR judgments."""
    obd = []
    for f in ("obd_bts_men.avro", "obd_random_men.avro"):
        obd.extend(avro.read_records(str(SAMPLE / "impressions" / f)))
    day0 = min(r["timestamp"] for r in obd) // DAY * DAY
    letor = list(avro.read_records(str(SAMPLE / "impressions" / "letor_feature253.avro")))
    queries = sorted({r["query_id"] for r in letor})[:10]
    letor = [r for r in letor if r["query_id"] in queries]
    for r in letor:
        r["timestamp"] = day0 + DAY + 3 * HOUR + queries.index(r["query_id"]) * HOUR + r["position"]
    judg = [j for j in avro.read_records(str(SAMPLE / "judgments" / "letor_test_labels.avro"), "judgment")
            if j["query_id"] in queries]
    return obd + letor, judg, day0


@pytest.mark.parametrize("engine", ["columnar", "events"])
def test_watch_scores_files_dropped_while_the_job_runs(tmp_path, monkeypatch, capsys, engine):
    imps, judg, day0 = _week()
    six = 6 * HOUR
    buckets = {}
    for r in imps:
        buckets.setdefault((r["timestamp"] - day0) // six, []).append(r)
    order = sorted(buckets)
    # held back: the fourth quarter of day 2 arrives after the first quarter of day 3 (late but within
    # the 12 h allowed lateness: late panes), and 40 records of day 1 arrive at the end (too late)
    held = buckets.pop(order[7])
    too_late = buckets[order[1]][:40]
    buckets[order[1]] = buckets[order[1]][40:]
    watch, out_dir = tmp_path / "watch", tmp_path / "out"
    watch.mkdir()
    _drop(judg, str(tmp_path / "judgments.avro"), "judgment")

    made = []

    class Recording(live.WatchFiles):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(stream_cli, "WatchFiles", Recording)
    seen_while_running = {}

    def dropper():
        _wait(lambda: made and made[0].service is not None, "the job to start")
        w = made[0].watcher

        def put(name, recs):
            path = str(watch / name)
            _drop(recs, path)
            _wait(lambda: path in w.files, f"the watcher to read {name}")

        for b in sorted(buckets):
            if b == order[8]:
                # day 1's window closed (watermark past its end + 12 h): its final pane is written while
                # the job still waits for the rest of the week
                _wait(lambda: glob.glob(str(out_dir / "metrics-*-final.jsonl")), "day 1's final pane")
                seen_while_running["final"] = sorted(os.path.basename(f) for f in glob.glob(
                    str(out_dir / "metrics-*.jsonl")))
            put(f"part-{b:03d}.avro", buckets[b])
            if b == order[8]:
                put(f"part-{order[7]:03d}.avro", held)
        put("part-999-late.avro", too_late)
        w.stop()  # as SIGINT / SIGTERM do: every window closes, the job ends

    t = threading.Thread(target=dropper, daemon=True)
    t.start()
    args = ["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
            "--metrics", "ndcg@10,map", "--window", "1d", "--allowed-lateness", "12h", "--early-count", "2000",
            "--watch-interval", "0.05", "--quiet", "--output", str(out_dir), "--engine", engine]
    assert stream_cli.main(args) == 0
    t.join(timeout=5)
    printed = capsys.readouterr().out
    assert f"read {len(imps)} impression, {len(judg)} judgment and 0 click records" in printed
    assert f"late data: {len(too_late)} impression" in printed
    # day 1's panes existed before the job ended (and before the later files were dropped)
    day1 = [f for f in seen_while_running["final"] if f.startswith(f"metrics-{sinks._iso(day0)}".replace(":", ""))]
    assert any(f.endswith("-final.jsonl") for f in day1), seen_while_running["final"]

    rows = [json.loads(line) for f in out_dir.glob("metrics-*.jsonl") for line in open(f)]
    kept = [r for b in buckets.values() for r in b] + held
    assert len(kept) + len(too_late) == len(imps)
    assert_final_equals_batch(rows, run_batch(kept, judg, ["ndcg@10", "map"], window="1d"))
    panes = panes_of(rows)
    kinds = {p for seq in panes.values() for p, _, _ in seq}
    assert kinds == {"early", "on_time", "late"}, kinds
    day2 = [seq for (ws, _), seq in panes.items() if ws == day0 + DAY]
    assert day2 and all(any(p == "late" for p, _, _ in seq) for seq in day2)  # the held-back quarter
    late = [json.loads(line) for f in out_dir.glob("late_data-*.jsonl") for line in open(f)]
    assert sorted(json.loads(r["raw"])["event_id"] for r in late) == sorted(r["event_id"] for r in too_late)
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["accounting_problems"] == [] and summary["replayed"]["impressions"] == len(imps)
    # the accounting as it went: one running-totals record per pane, never decreasing, then a closing
    # record ("end") equal to the job's final counts
    *totals, end = [json.loads(line) for line in open(out_dir / stream_cli.RUNNING_TOTALS)]
    assert len(totals) == sum(len(seq) for seq in panes.values())
    assert end["pane"] == "end" and end["counts"] == summary["counts"]
    reads = [t["counts"].get("impressions_read", 0) for t in totals + [end]]
    assert reads == sorted(reads) and 0 < reads[0] < len(imps) and reads[-1] == len(imps)
    for key in end["counts"]:  # counts only grow
        seq = [t["counts"].get(key, 0) for t in totals + [end]]
        assert seq == sorted(seq), key
    assert {t["pane"] for t in totals} == {"early", "on_time", "late"}


class _Result:
    """A job on another runner, as far as the launcher sees it: its state and its counters."""

    def __init__(self, states, counts):
        self.states = list(states)
        self.counts = counts

    @property
    def state(self):
        return self.states[0]

    def metrics(self):
        from apache_beam.metrics.execution import MetricKey
        from apache_beam.metrics.metricbase import MetricName

        class _Res:
            def __init__(self, name, v):
                self.key = MetricKey("step", MetricName("streameval", name))
                self.committed = self.attempted = v

        counts = self.counts.pop(0)

        class _M:
            def query(self, _filter=None):
                return {"counters": [_Res(k, v) for k, v in counts.items()], "distributions": [], "gauges": []}

        return _M()

    def wait_until_finish(self, duration=None):
        return self.states[-1]


def test_launcher_reports_the_counters_of_a_job_on_another_runner_as_it_runs():
    import io

    res = _Result(["RUNNING", "RUNNING", "DONE"],
                  [{"impressions_read": 10, "impressions_valid": 9, "rejected:impression:bad": 1},
                   {"impressions_read": 25, "impressions_valid": 23, "rejected:impression:bad": 2, "late:impression": 1}])
    out = io.StringIO()
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        res.states.pop(0)

    assert stream_cli.wait_reporting(res, 30, out=out, sleep=sleep) == "DONE"
    lines = out.getvalue().splitlines()
    assert sleeps == [30, 30] and len(lines) == 2
    assert lines[0].endswith("RUNNING: running totals: impressions read 10, valid 9, late 0, rejected 1")
    assert lines[1].endswith("DONE: running totals: impressions read 25, valid 23, late 1, rejected 2")


def test_watch_damaged_file_is_a_dead_letter_and_an_undeliverable_one_fails_the_job(tmp_path, capsys, monkeypatch):
    imps, judg, day0 = _week()
    imps = [r for r in imps if r["timestamp"] < day0 + DAY]
    watch = tmp_path / "watch"
    watch.mkdir()
    half = len(imps) // 2
    _drop(imps[:half], str(watch / "a.avro"))
    # b.avro truncated in its middle: a damaged file (written elsewhere, then moved in complete)
    good = _truncated_copy(imps[half:], str(tmp_path / "b.avro"))
    assert 0 < len(good) < len(imps) - half
    os.replace(tmp_path / "b.avro", watch / "b.avro")
    args = ["--watch", "--impressions", str(watch / "*.avro"), "--window", "1d", "--watch-interval", "0.05",
            "--watch-idle-stop", "1", "--quiet", "--output", str(tmp_path / "out")]
    assert stream_cli.main([*args, "--allow-unreadable"]) == 0  # without it: exit 3 (test_stream_reliability)
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    read = summary["replayed"]["impressions"]
    assert read == half + len(good)
    assert "unreadable file: " in printed and "b.avro" in printed
    dead = [json.loads(line) for f in (tmp_path / "out").glob("dead_letters-*.jsonl") for line in open(f)]
    assert len(dead) == 1 and json.loads(dead[0]["raw"])["records_read"] == len(good)
    rows = [json.loads(line) for f in (tmp_path / "out").glob("metrics-*.jsonl") for line in open(f)]
    assert_final_equals_batch(rows, run_batch(imps[:read], [], window="1d"))

    # a file the environment does not deliver (permission denied: simulated, the tests may run as root)
    (watch / "c.avro").write_bytes((watch / "a.avro").read_bytes())
    real = live.read_avro_blocks

    def denied(path, name, *a):
        if path.endswith("c.avro"):
            raise InputUnavailableError(path, PermissionError(13, "Permission denied"))
        return real(path, name, *a)

    monkeypatch.setattr(live, "read_avro_blocks", denied)
    assert stream_cli.main(args) == 1
    err = capsys.readouterr().err
    assert "error: the job failed: cannot read input file" in err and "c.avro: " in err and "Permission denied" in err


# --------------------------------------------------------------------------------------------
# the watcher on its own: files, watermark policy, idle stop

class _Clock:
    """A fake wall clock; ``sleep`` advances it and runs the action scripted for that poll."""

    def __init__(self, actions=None):
        self.now = 100.0
        self.polls = 0
        self.actions = actions or {}

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.polls += 1
        if self.polls in self.actions:
            self.actions[self.polls]()


def _imps(times, req="r"):
    return [{"event_id": f"{req}{i}", "request_id": f"{req}{i}", "query_id": "q", "user_id": None, "system_id": "A",
             "item_id": "d", "position": 1, "score": 1.0, "clicked": True, "timestamp": t, "propensity": None,
             "attributes": {}} for i, t in enumerate(times)]


def _describe(events):
    out = []
    for e in events:
        if isinstance(e, ElementEvent):
            # an element: (kind, (path, records), processing time)
            out.extend((tv.value[0], len(tv.value[1][1]), tv.value[2], tv.timestamp.micros) for tv in e.timestamped_values)
        elif isinstance(e, WatermarkEvent):
            out.append(("watermark", e.new_watermark.micros))
        else:
            out.append(("advance", e.advance_by.micros))
    return out


def test_file_watcher_watermark_policy(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    _drop(_imps([10_000_000, 50_000_000, 30_000_000]), str(d / "a.avro"))
    (d / "_tmp.avro").write_bytes(b"not yet")  # a temporary name: skipped
    _drop([{"query_id": "q", "item_id": "d", "grade": 1, "timestamp": 10**15, "source": "x"}],
          str(tmp_path / "j.avro"), "judgment")

    def partial():
        (d / "b.avro").write_bytes(b"x")  # still being written

    clock = _Clock({1: partial, 2: lambda: _drop(_imps([20_000_000], "s"), str(d / "b.avro"))})
    w = live.FileWatcher({"impressions": [str(d / "*.avro")], "judgments": [str(tmp_path / "j*.avro")]},
                         interval=1.0, delay=5_000_000, idle_stop=3.0, chunk=2, clock=clock, sleep=clock.sleep)
    got = _describe(w.events())
    second = 1_000_000
    assert got == [
        # poll 0 only notes the sizes; poll 1: the complete files, judgments first, then impressions, each in
        # name order, in chunks of two records, each element timestamped with its earliest event time
        # (milliseconds), with the processing time sent so far; no watermark yet: b.avro is being written
        # (issue 41: a file copied after a newer one was late data)
        ("judgments", 1, 0.0, 10**15),
        ("impressions", 2, 0.0, 10_000_000), ("impressions", 1, 0.0, 30_000_000),
        ("advance", second),
        ("advance", second),  # poll 2: b.avro changed size since poll 1: it waits, and so does the watermark
        # poll 3: b.avro (20 s, older than a.avro's latest) is read before the watermark moves: no file is
        # pending, so it goes to the latest impression time minus the delay (the judgment's far-future
        # time does not count)
        ("impressions", 1, 2.0, 20_000_000), ("watermark", 45_000_000), ("advance", second),
        ("advance", second), ("advance", second), ("advance", second),  # idle 3 s: every window closes
        ("watermark", live.END_OF_TIME_US)]
    assert w.records == {"impressions": 4, "judgments": 1, "clicks": 0}
    assert [os.path.basename(f) for f in w.files] == ["j.avro", "a.avro", "b.avro"]
    assert w.error is None


def test_file_watcher_stops_on_a_file_it_cannot_read(tmp_path, monkeypatch):
    """An environment error while reading (here a network error of a remote file system, simulated)
    stops the watcher before any of the file's records are sent, and is kept for the job to fail on;
    the events end without closing the windows."""
    _drop(_imps([1_000_000]), str(tmp_path / "x.avro"))

    def broken(path, name, *a):
        raise InputUnavailableError(path, ConnectionResetError(104, "Connection reset by peer"))
        yield  # a generator, as the real reader

    monkeypatch.setattr(live, "read_avro_blocks", broken)
    clock = _Clock()
    w = live.FileWatcher({"impressions": [str(tmp_path / "*.avro")]}, interval=1.0, idle_stop=5,
                         clock=clock, sleep=clock.sleep)
    events = _describe(w.events())
    assert events == []  # poll 0 notes the size (processing time 0: nothing to send), poll 1 fails
    assert isinstance(w.error, InputUnavailableError) and "x.avro: " in str(w.error)
    assert "Connection reset" in str(w.error) and w.records["impressions"] == 0


def test_request_state_is_keyed_by_request_id_on_distributed_runners():
    parse = stream_cli.build_arg_parser().parse_known_args
    assert stream_cli._request_shards(parse(["--replay"])[0]) == 16  # the local runner pays per key
    assert stream_cli._request_shards(parse(["--runner", "DataflowRunner"])[0]) == 0
    assert stream_cli._request_shards(parse(["--runner", "FlinkRunner", "--request-shards", "64"])[0]) == 64


def test_pane_file_names_never_collide():
    """Issue 20, item 11: systems ``sys/1`` and ``sys_1`` (or two long names sharing 80 characters) gave
    the same pane file name, so one pane overwrote the other."""
    def stem(system, sl="all"):
        return sinks.pane_file_stem([{"window_start": 0, "window_end": 3_600_000_000, "system": system,
                                      "slice": sl, "pane_index": 0, "pane": "on_time", "is_final": True}])

    names = ["sys/1", "sys_1", "sys 1", "a" * 80 + "x", "a" * 80 + "y", "A"]
    stems = [stem(n) for n in names]
    assert len(set(stems)) == len(names), stems
    assert stem("A") == "metrics-1970-01-01T000000Z-1970-01-01T010000Z-A-pane000-on_time-final"  # plain names as before
    assert stem("sys_1").endswith("-sys_1-pane000-on_time-final")
    assert stem("A", "user=u/1") != stem("A", "user=u_1")


def test_an_interrupted_launcher_cancels_its_job_on_a_portable_runner():
    """Ctrl-C or SIGTERM while the launcher waits for a job on Flink or Prism (a portable job): the job
    is cancelled there (an unbounded one would run on for ever without its launcher) and the interrupt
    carries a note saying so, which ``interrupts.stop_for`` keeps on the interrupt it raises."""
    from apache_beam.runners.portability.portable_runner import PipelineResult as PortableResult

    from streameval import interrupts
    from streameval.beam.accounting import wait_for_job

    class Job(PortableResult):
        def __init__(self, fail_cancel=False):  # no job service: the state and cancel of a fake job
            self.cancelled, self.fail_cancel = 0, fail_cancel

        @property
        def state(self):
            return "CANCELLED" if self.cancelled else "RUNNING"

        def cancel(self):
            if self.fail_cancel:
                raise RuntimeError("job service gone")
            self.cancelled += 1

    def ctrl_c(_seconds):
        raise interrupts.Interrupted(2)

    waits = (lambda job: wait_for_job(job, sleep=ctrl_c), lambda job: stream_cli.wait_reporting(job, 30, sleep=ctrl_c))
    for wait in waits:
        job = Job()
        with pytest.raises(interrupts.Interrupted) as got:
            wait(job)
        assert job.cancelled == 1 and got.value.__notes__ == ["the job on the runner was cancelled"]
        job = Job(fail_cancel=True)
        with pytest.raises(interrupts.Interrupted) as got:
            wait(job)
        assert got.value.__notes__ == ["cancelling the job on the runner failed (RuntimeError): it may still run"]
    # no signal recorded: the interrupt itself, notes and all; not an interrupt: nothing to raise
    assert interrupts.stop_for(got.value) is got.value and interrupts.stop_for(ValueError("x")) is None
