"""The batch job's scale-out pieces on the local runner: shard counts that follow the input, sharded
outputs with a manifest, the completion marker and reruns, environment errors versus damaged bytes,
and what summary.json reports (shards, element sizes, decoders, workers).

References: the job's own single-shard, single-file run on the same input (itself checked against the
per-record engine, trec_eval and pytrec_eval elsewhere); sharding and output layout must not change a
number. The portable-runner and S3 versions are in tests/test_portable.py and tests/test_s3.py.
"""

from __future__ import annotations

import glob
import json
import os
import pickle

import pytest

from streameval.jobs import batch
from streameval.beam import columnar, sinks, sources
from streameval.io import avro

from .test_columnar import _messy_logs, write_logs


def _lines(out_dir, name):
    """Sorted JSON lines of output ``name`` over all its files (one file or shards)."""
    rows = []
    for f in sinks.output_files(str(out_dir), name):
        rows += [json.dumps(json.loads(x), sort_keys=True) for x in open(f).read().splitlines() if x.strip()]
    return sorted(rows)


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    d = tmp_path_factory.mktemp("messy")
    imp_files, judg = _messy_logs(11)
    return d, write_logs(d / "in", imp_files, judg)


def test_auto_shards_follow_the_input():
    assert columnar.auto_shards(0) == columnar.SHARDS
    assert columnar.auto_shards(1_000_000) == columnar.SHARDS  # 2 shards' worth: the floor holds
    assert columnar.auto_shards(10_000_000) == 20
    assert columnar.auto_shards(30_000_001) == 61
    # estimated from bytes when the records cannot be counted (remote files): 20 bytes an impression
    assert columnar.auto_shards(None, nbytes=20 * 1_000_000_000) == 2000


@pytest.mark.parametrize("extra", [["--metrics", "all_trec", "--slices", "device", "--window", "1h"]])
def test_shard_counts_and_output_shards_change_no_number(messy, extra):
    """--shards 3, auto (16 here) and 40, and dead letters in three files: the same metric rows,
    dead letters, unjudged requests and accounting; summary.json reports the shards and the
    elements' sizes, whose sums account for every accepted impression."""
    d, args = messy
    runs = {}
    for name, more in (("s3", ["--shards", "3"]), ("auto", []), ("s40", ["--shards", "40", "--output-shards", "3"])):
        out = d / name
        assert batch.main([*args, *extra, *more, "--output", str(out), "--quiet"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        runs[name] = ({f: _lines(out, f) for f in ("metrics.jsonl", "dead_letters.jsonl", "unjudged.jsonl")},
                      summary)
    ref, ref_summary = runs["s3"]
    assert ref["metrics.jsonl"] and ref["dead_letters.jsonl"] and ref["unjudged.jsonl"]
    for name in ("auto", "s40"):
        got, summary = runs[name]
        assert got == ref, name
        assert summary["accounting"] == ref_summary["accounting"]
    assert [runs[n][1]["shards"] for n in ("s3", "auto", "s40")] == [3, columnar.SHARDS, 40]
    acc = ref_summary["accounting"]["impression"]
    for name, (_, summary) in runs.items():
        el = summary["elements"]
        # the cleaning stage sees every valid impression, the scoring stage every accepted one
        assert el["element_impressions:clean"]["sum"] == acc["valid"]
        assert el["element_impressions:score"]["sum"] == acc["accepted"] == acc["ranked"] + acc["unjudged"] + \
            acc["unrankable"]
        assert el["element_judgments:score"]["max"] <= ref_summary["accounting"]["judgment"]["accepted"]
        for stage in ("clean", "score"):
            assert el[f"element_impressions:{stage}"]["count"] <= summary["shards"]
            assert el[f"element_impressions:{stage}"]["max"] < acc["valid"]
    # three dead-letter files, listed in the manifest; one file each for the others
    out = d / "s40"
    files = sorted(os.path.basename(f) for f in glob.glob(str(out / "dead_letters-*.jsonl")))
    assert files == [f"dead_letters-0000{i}-of-00003.jsonl" for i in range(3)]
    manifest = json.loads((out / sinks.MANIFEST).read_text())
    assert [os.path.basename(f["path"]) for f in manifest["outputs"]["dead_letters.jsonl"]] == files
    assert [os.path.basename(f["path"]) for f in manifest["outputs"]["metrics.jsonl"]] == ["metrics.jsonl"]


def test_rerun_replaces_outputs_and_a_failed_run_leaves_the_previous_one(messy, monkeypatch, capsys):
    """A rerun with fewer inputs over the same directory leaves none of the first run's rows or shard
    files; a run whose input the environment does not deliver exits 1 naming the file and leaves the
    previous run's outputs as they were (manifest, summary, rows), with no dead letter for the file
    and nothing of its own (issue 36: outputs are replaced only when a run publishes)."""
    d, args = messy
    out = d / "rerun"
    assert batch.main([*args, "--output", str(out), "--quiet", "--output-shards", "2"]) == 0
    assert sinks.is_complete(str(out))
    first = _lines(out, "metrics.jsonl")
    one_file = args[:2] + args[-2:]  # the first impression file and the judgments
    assert batch.main([*one_file, "--output", str(out), "--quiet"]) == 0
    again = d / "fresh"
    assert batch.main([*one_file, "--output", str(again), "--quiet"]) == 0
    assert _lines(out, "metrics.jsonl") == _lines(again, "metrics.jsonl") != first
    assert not glob.glob(str(out / "dead_letters-*"))  # the sharded files of the first run are gone
    assert _lines(out, "dead_letters.jsonl") == _lines(again, "dead_letters.jsonl")

    gone = str(d / "in" / "vanished.avro")
    real = batch.expand_inputs
    monkeypatch.setattr(batch, "expand_inputs", lambda pats: real(pats) + ([gone] if "imps" in pats[0] else []))
    capsys.readouterr()
    assert batch.main([*args, "--output", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"cannot read input file {gone}" in err and "FileNotFoundError" in err
    assert len(err.strip().splitlines()) == 1
    assert sinks.is_complete(str(out))  # the previous run's outputs, whole
    assert json.loads((out / "summary.json").read_text())["impression_files"] == [args[1]]
    assert _lines(out, "metrics.jsonl") == _lines(again, "metrics.jsonl")
    assert _lines(out, "dead_letters.jsonl") == _lines(again, "dead_letters.jsonl")
    assert not glob.glob(str(out / "beam-temp-*"))  # the failed run removed its temporary files
    assert not glob.glob(str(out / (sinks.STAGING_PREFIX + "*"))) and not (out / ".streameval.lock").exists()
    (out / "beam-temp-metrics-0123").mkdir(exist_ok=True)  # as a killed run's sink leaves it
    (out / "beam-temp-metrics-0123" / "part").write_text("x")
    monkeypatch.setattr(batch, "expand_inputs", real)
    assert batch.main([*one_file, "--output", str(out), "--quiet"]) == 0
    assert not glob.glob(str(out / "beam-temp-*"))
    assert _lines(out, "metrics.jsonl") == _lines(again, "metrics.jsonl")


def test_damaged_bytes_stay_dead_letters(messy, tmp_path):
    """A truncated file is not an environment error: the job runs to its end (exit 3: the input check
    on damaged files, the outputs written), the file is one dead letter and one line of
    unreadable_files.jsonl, and the records of its complete blocks are used."""
    d, args = messy
    src = args[1]
    cut = tmp_path / "cut.avro"
    recs = list(avro.read_records(src, "impression"))
    avro.write_records(cut, "impression", recs, sync_interval=2000)
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    out = tmp_path / "o"
    assert batch.main(["--impressions", str(cut), *args[-2:], "--output", str(out), "--quiet"]) == 3
    letters = [json.loads(x) for x in _lines(out, "unreadable_files.jsonl")]
    assert [x["source"] for x in letters] == [str(cut)]
    assert letters[0]["reason"].startswith(sources.UNREADABLE + " (impressions): truncated file")
    summary = json.loads((out / "summary.json").read_text())
    read = summary["accounting"]["impression"]["read"]
    assert 0 < read < len(recs)
    assert json.loads(letters[0]["raw"])["records_read"] == read
    assert summary["decoders"] == {str(cut): "datafusion+fastavro"} or summary["decoders"][str(cut)] in (
        "datafusion", "fastavro")


def test_relative_paths_are_made_absolute(messy, monkeypatch, tmp_path):
    """Workers in another working directory read the launcher's files: inputs and output are made
    absolute before the pipeline is built (summary.json lists them so)."""
    d, args = messy
    monkeypatch.chdir(d)
    rel = [os.path.relpath(a, d) if a.endswith(".avro") else a for a in args]
    assert batch.main([*rel, "--output", "relout", "--quiet"]) == 0
    summary = json.loads((d / "relout" / "summary.json").read_text())
    assert all(os.path.isabs(p) for p in summary["impression_files"] + summary["judgment_files"])
    assert all(os.path.isabs(p) for p in summary["outputs"])
    assert summary["workers"] == 1 and summary["shards"] == columnar.SHARDS
    assert set(summary["decoders"].values()) == {"datafusion"}


def test_input_errors_pickle_and_read_back_from_runner_text():
    """InputUnavailableError crosses process boundaries intact, and the launcher finds its one line in
    the text a runner wraps around a worker's traceback."""
    err = sources.InputUnavailableError("s3://b/k.avro", PermissionError(13, "Access Denied"))
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) == "cannot read input file s3://b/k.avro: PermissionError: [Errno 13] Access Denied"
    assert isinstance(back, OSError)
    wrapped = RuntimeError("Pipeline job-1 failed in state FAILED: Traceback (most recent call last):\n"
                           '  File "x.py", line 1, in process\n'
                           "streameval.beam.sources.InputUnavailableError: cannot read input file /x/y.avro: "
                           "FileNotFoundError: [Errno 2] No such file or directory: '/x/y.avro' "
                           "[while running 'Metrics/ReadImpressions/Blocks']\n")
    assert sources.failure_reason(wrapped) == ("cannot read input file /x/y.avro: FileNotFoundError: [Errno 2] No "
                                               "such file or directory: '/x/y.avro'")
    assert sources.failure_reason(ValueError("line one\nthe last line")) == "the last line"


def test_a_lost_runner_service_is_named_in_one_line():
    """A gRPC call to a runner's service that is gone (here: a port nothing listens on) raises an
    error whose str is a multi-line repr ending in '>'; the reason names its status instead (the
    job said 'the job failed: >' when Prism was killed under it)."""
    import socket

    import grpc

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/beam.JobService/GetState")
    with pytest.raises(grpc.RpcError) as caught:
        call(b"", timeout=5)
    channel.close()
    assert str(caught.value).strip().endswith(">")
    reason = sources.failure_reason(caught.value)
    assert "\n" not in reason
    assert reason.startswith("the runner's service stopped answering (UNAVAILABLE: ")
    assert sources.failure_reason(grpc.FutureTimeoutError()).startswith("the job service did not answer")


def test_reported_workers():
    from apache_beam.options.pipeline_options import PipelineOptions

    args = batch.build_arg_parser().parse_args(["--impressions", "x", "--output", "o"])
    opts = PipelineOptions(["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"])
    assert batch.reported_workers(args, opts, 1) == 2
    assert batch.reported_workers(args, PipelineOptions([]), 1) == 1
    args.runner = "DataflowRunner"
    assert batch.reported_workers(args, PipelineOptions(["--max_num_workers", "100"]), 1) == 100
    assert batch.reported_workers(args, PipelineOptions([]), 1) == "runner"
    assert batch.output_shards(args) == 0  # runner-chosen shards off the local runners
    args.runner = "FnApiRunner"
    assert batch.output_shards(args) is None
