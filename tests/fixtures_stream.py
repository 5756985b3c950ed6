"""One replay of the streaming job on a slice of the bundled sample, shared by the tests that read
its output (``tests/test_stream.py``, ``tests/test_tables.py``): replaying costs most of those tests'
time, so it runs once per session.

    def test_x(stream_replay):
        stream_replay.out_dir       # the job's --output (metrics-*.jsonl/.avro, summary.json, manifest.json)
        stream_replay.printed       # what the job printed (the panes, the summary line)
        stream_replay.inputs        # the impression files' pattern; .judgments: the judgment file
        stream_replay.obd, .letor, .judg   # the records replayed
"""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import pytest

from streameval.io import avro

from .conftest import REPO

#: the job's options besides the inputs and the output
STREAM_OPTIONS = ["--metrics", "ndcg@10,map", "--window", "6h", "--early-count", "150", "--allowed-lateness", "10m",
                  "--replay-step", "2h"]


@pytest.fixture(scope="session")
def stream_replay(tmp_path_factory):
    """``streameval stream --replay`` on 400 Open Bandit impressions and the LETOR impressions and
    judgments of 10 queries, hourly steps of 2 h, 6 h windows, early panes every 150 updates."""
    from streameval.jobs import stream as stream_cli

    tmp = tmp_path_factory.mktemp("stream_replay")
    sample = REPO / "data" / "sample"
    if not sample.is_dir():
        pytest.skip(f"bundled sample not found: {sample}")
    obd = list(avro.read_records(str(sample / "impressions" / "obd_bts_men.avro")))[:400]
    letor = list(avro.read_records(str(sample / "impressions" / "letor_feature253.avro")))
    letor_q = sorted({r["query_id"] for r in letor})[:10]
    letor = [r for r in letor if r["query_id"] in letor_q]
    judg = [j for j in avro.read_records(str(sample / "judgments" / "letor_test_labels.avro"), "judgment")
            if j["query_id"] in letor_q]
    avro.write_records(tmp / "in" / "obd.avro", "impression", obd)
    avro.write_records(tmp / "in" / "letor.avro", "impression", letor)
    avro.write_records(tmp / "judgments.avro", "judgment", judg)
    out_dir = tmp / "out"
    inputs = str(tmp / "in" / "*.avro")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = stream_cli.main(["--replay", "--impressions", inputs, "--judgments", str(tmp / "judgments.avro"),
                                *STREAM_OPTIONS, "--output", str(out_dir)])
    return SimpleNamespace(code=code, printed=printed.getvalue(), out_dir=out_dir, tmp=tmp, inputs=inputs,
                           judgments=str(tmp / "judgments.avro"), obd=obd, letor=letor, judg=judg)
