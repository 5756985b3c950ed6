"""Issue 41, item 2 (issue 40, item 4): ``streameval stream --watch`` with its defaults must not make
on-time data late. Files copied into the watched folder out of date order (newest first, each
written in pieces as ``cp`` does) sent most impressions to late data with ``--watch-delay 0``: the
watermark jumped to the first (newest) file's events. The watermark now moves only after a poll in
which no matched file is still being written, so a copy in any order is read before it passes.

Reference: the batch job on the same files (its per-record engine, with the stream's lateness 0):
the stream's final panes equal its rows and its record accounting equals the batch job's."""

import json
import os
import threading
import time

import pytest

from streameval.jobs import stream as stream_cli
from streameval.beam.streaming import live
from streameval.io import avro

from .test_stream import assert_final_equals_batch
from .test_stream_columnar import _batch, _jsonl, _log

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

INTERVAL = 0.05  # --watch-interval


def _slow_copy(src, dst, pieces=6):
    """Copies ``src`` to ``dst`` in ``pieces`` writes with short pauses (shorter than a poll interval,
    so that the watcher never takes a part for a complete file), as a copy of a large file goes."""
    data = open(src, "rb").read()
    step = -(-len(data) // pieces)
    with open(dst, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            time.sleep(INTERVAL * 0.4)


@pytest.mark.parametrize("engine", ["columnar", "events"])
def test_files_copied_newest_first_are_not_late(tmp_path, monkeypatch, engine):
    files, judg = _log(seed=11, n_requests=300)
    src, watch = tmp_path / "src", tmp_path / "watch"
    src.mkdir()
    watch.mkdir()
    names = []
    for i, recs in enumerate(files):  # part-000 holds the earliest hour, part-007 the latest
        avro.write_records(str(src / f"part-{i:03d}.avro"), "impression", recs)
        names.append(f"part-{i:03d}.avro")
    avro.write_records(str(tmp_path / "judgments.avro"), "judgment", judg)

    made = []

    class Recording(live.WatchFiles):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(stream_cli, "WatchFiles", Recording)
    copied = []

    def copier():
        end = time.monotonic() + 120
        while not (made and made[0].service is not None) and time.monotonic() < end:
            time.sleep(0.01)
        for name in reversed(names):  # newest first, one after the other, no pause between files
            _slow_copy(src / name, watch / name)
            copied.append(name)

    t = threading.Thread(target=copier, daemon=True)
    t.start()
    out = tmp_path / "out"
    args = ["--watch", "--impressions", str(watch / "*.avro"), "--judgments", str(tmp_path / "judgments.avro"),
            "--metrics", "ndcg@10,map,P@5", "--window", "1h", "--slices", "device", "--engine", engine,
            "--watch-interval", str(INTERVAL), "--watch-idle-stop", "1", "--quiet", "--output", str(out)]
    assert stream_cli.main(args) == 0
    t.join(timeout=10)
    assert copied == names[::-1]
    w = made[0].watcher
    assert set(map(os.path.basename, w.files)) - {"judgments.avro"} == set(names)  # (the events engine
    # watches the judgments file too)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accounting_problems"] == []
    assert summary["accounting"]["impression"]["read"] == sum(map(len, files))
    late = [json.loads(line) for f in out.glob("late_data-*.jsonl") for line in open(f)]
    # nothing is late by arrival: the only late impressions are those the batch job sets aside too
    # (a request's items after its first hour's end, lateness 0 in both)
    bout = _batch(tmp_path, str(watch / "*.avro"))
    bsum = json.loads((bout / "summary.json").read_text())
    batch_late = [d for d in _jsonl(bout, "dead_letters.jsonl") if d["source"] == "late:impression"]
    assert sorted((d["raw"], d["reason"]) for d in late) == sorted((d["raw"], d["reason"]) for d in batch_late)
    assert summary["accounting"]["impression"]["late"] == bsum["accounting"]["impression"]["late"]
    assert summary["accounting"] == bsum["accounting"]
    assert_final_equals_batch(_jsonl(out, "metrics-*.jsonl"), _jsonl(bout, "metrics.jsonl"))
