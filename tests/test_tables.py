"""``streameval.read_metrics``: a batch or a streaming job's output directory as one table of metric
rows, read through its manifest; the final panes of a stream replay equal the batch job on the same
files; an unfinished job's directory is refused; ``reconcile`` and ``report`` take a stream output.
The replay is the session's (``tests/fixtures_stream.py``), shared with ``tests/test_stream.py``."""

import io
import json
import math
import shutil

import pytest

import streameval
from streameval.commands import reconcile, report
from streameval.io.results import parse_float_fields
from streameval.io.metric_table import MetricTable
from streameval.io.tables import METRIC_FIELDS, MetricsTableError, read_metrics

from .fixtures_stream import STREAM_OPTIONS
from .test_stream import assert_final_equals_batch, key

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]


@pytest.fixture(scope="module")
def batch_twin(stream_replay, tmp_path_factory):
    """The batch job on the replay's files with the replay's metrics and window."""
    from streameval.jobs import batch

    out = tmp_path_factory.mktemp("batch_twin") / "out"
    opts = STREAM_OPTIONS[:STREAM_OPTIONS.index("--early-count")]  # --metrics and --window
    assert batch.main(["--impressions", stream_replay.inputs, "--judgments", stream_replay.judgments, *opts,
                       "--output", str(out), "--quiet"]) == 0
    return out


def _nan_safe(rows):
    return [{k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]


def _lines(paths):
    return [json.loads(line) for p in paths for line in open(p) if line.strip()]


def test_batch_output_reads_as_its_metrics_jsonl(batch_twin):
    rows = streameval.read_metrics(batch_twin)
    expected = [parse_float_fields(r) for r in _lines([batch_twin / "metrics.jsonl"])]
    assert rows and _nan_safe(rows) == _nan_safe(expected)
    assert all(tuple(r) == METRIC_FIELDS or set(r) == set(METRIC_FIELDS) for r in rows)
    assert all(r["pane"] is None and r["is_final"] is None for r in rows)
    assert _nan_safe(read_metrics(str(batch_twin), final_only=True)) == _nan_safe(rows)  # one row per key
    df = read_metrics(batch_twin, as_frame=True)
    # the typed table: the count as n with its unit, and in the column of its unit (no slices here)
    assert list(df.columns) == MetricTable().columns and len(df) == len(rows)
    assert list(df.columns[5:13]) == ["value", "n", "n_unit", "num_queries", "num_impressions", "num_requests",
                                      "stderr", "ci_low"]
    assert str(df["n"].dtype) == "Int64" and str(df["is_final"].dtype) == "boolean"
    assert str(df["num_queries"].dtype) == str(df["num_impressions"].dtype) == "Int64"
    assert df["n"].tolist() == [r["num_queries"] for r in rows]
    assert {r["n_unit"] for r in rows} == {"queries", "impressions"}  # ndcg@10, map; ctr
    for unit, column in (("queries", "num_queries"), ("impressions", "num_impressions")):
        assert df[column].astype(object).where(df[column].notna(), None).tolist() == [
            r["num_queries"] if r["n_unit"] == unit else None for r in rows]
    assert df["num_requests"].isna().all()


def test_stream_output_is_one_table_and_its_final_panes_equal_batch(stream_replay, batch_twin):
    out = stream_replay.out_dir
    assert stream_replay.code == 0
    files = sorted(out.glob("metrics-*.jsonl"))
    assert len(files) > 3  # one per window, system and pane
    rows = read_metrics(out)
    assert len(rows) == sum(1 for p in files for line in open(p) if line.strip())
    assert _nan_safe(rows) == _nan_safe([parse_float_fields(r) for r in _lines(files)])
    assert {r["pane"] for r in rows} >= {"early", "on_time"} and {r["is_final"] for r in rows} == {True, False}
    assert all(isinstance(r["pane_index"], int) for r in rows)
    final = read_metrics(out, final_only=True)
    assert len(final) == len({key(r) for r in rows}) < len(rows)
    assert all(r["is_final"] for r in final)
    # value, num_queries, stderr and interval bit for bit, per window, slice, system and metric
    assert_final_equals_batch(final, read_metrics(batch_twin))
    df = read_metrics(out, final_only=True, as_frame=True)
    assert len(df) == len(final) and df["is_final"].all() and set(df["pane"]) <= {"early", "on_time", "late"}
    # window bounds as UTC timestamps (issue 41, item 5: they were integer microseconds), the same instants
    assert str(df["window_start"].dtype) == "datetime64[us, UTC]"
    import pandas as pd

    assert [int(t.value // 1000) for t in df["window_start"]] == [r["window_start"] for r in final]
    assert (df["window_end"] - df["window_start"]).min() > pd.Timedelta(0)


def test_the_frame_has_a_column_per_slice_attribute():
    """``slice`` is one ``key=value`` text; the frame adds a column per attribute: null where the
    row's slice does not fix it (``all``, ``campaign=all``), the value otherwise."""
    from streameval.io.tables import rows_frame, slice_attributes

    assert slice_attributes("all") == {} and slice_attributes("campaign=all") == {}
    assert slice_attributes("campaign=men,device=pc") == {"campaign": "men", "device": "pc"}
    assert slice_attributes("campaign=all,device=pc") == {"device": "pc"}
    rows = [{"window_start": None, "window_end": None, "slice": sl, "system": "A", "metric": "ctr", "value": 0.5,
             "num_queries": 2} for sl in ("all", "campaign=men", "campaign=men,device=pc", "device=sp")]
    df = rows_frame(rows)
    assert list(df.columns[:5]) == ["window_start", "window_end", "slice", "slice_campaign", "slice_device"]
    assert df["slice_campaign"].tolist()[1:3] == ["men", "men"] and df["slice_campaign"].isna().tolist() == [
        True, False, False, True]
    assert df["slice_device"].isna().tolist() == [True, True, False, False] and df["slice_device"][3] == "sp"
    assert df["window_start"].isna().all()


def test_an_unfinished_or_changed_output_is_refused(stream_replay, tmp_path):
    src = stream_replay.out_dir
    moved = tmp_path / "moved"
    shutil.copytree(src, moved)  # the manifest's paths are the old directory's: read by name
    n = len(read_metrics(moved))
    assert n == len(read_metrics(src))
    stray = moved / "metrics-stray-pane000-early.jsonl"  # a file the manifest does not list is not read
    shutil.copy(sorted(moved.glob("metrics-*.jsonl"))[0], stray)
    assert len(read_metrics(moved)) == n
    killed = tmp_path / "killed"
    shutil.copytree(src, killed, ignore=shutil.ignore_patterns("manifest.json"))
    with pytest.raises(MetricsTableError, match="no manifest.json: the job did not finish") as e:
        read_metrics(killed)
    assert "\n" not in str(e.value) and str(killed) in str(e.value)
    first = sorted(moved.glob("metrics-*.jsonl"))[0]
    first.write_text(first.read_text() + "\n")
    with pytest.raises(MetricsTableError, match="changed after the job finished"):
        read_metrics(moved)
    first.unlink()
    with pytest.raises(MetricsTableError, match="listed in manifest.json but missing"):
        read_metrics(moved)
    with pytest.raises(MetricsTableError, match="no such file or directory"):
        read_metrics(tmp_path / "nothing")


def test_reconcile_and_report_take_a_stream_output(stream_replay, batch_twin, tmp_path, capsys):
    out = io.StringIO()
    assert reconcile.main([str(stream_replay.out_dir), str(batch_twin)], out=out) == 0, out.getvalue()
    n = len(read_metrics(batch_twin))
    assert f"matched {n} rows" in out.getvalue() and out.getvalue().rstrip().endswith("AGREE")
    killed = tmp_path / "killed"
    shutil.copytree(stream_replay.out_dir, killed, ignore=shutil.ignore_patterns("manifest.json"))
    assert reconcile.main([str(killed), str(batch_twin)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "no manifest.json" in err and err.count("\n") == 1
    pytest.importorskip("matplotlib")
    assert report.main([str(stream_replay.out_dir), "--out", str(tmp_path / "rep"), "--metrics", "ndcg@10,map"]) == 0
    printed = capsys.readouterr().out
    final = [r for r in read_metrics(stream_replay.out_dir, final_only=True) if r["metric"] in ("ndcg@10", "map")]
    assert f"({len(final)} rows)" in printed and (tmp_path / "rep" / "report.html").is_file()
    assert report.main([str(killed), "--out", str(tmp_path / "rep2")]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_a_stream_output_on_s3_reads_as_locally(stream_replay, batch_twin, s3_server,
                                                monkeypatch):
    """The replay's output uploaded to an S3 prefix (its manifest names the local paths: files are
    read by name under the prefix) reads as the local directory; a prefix without manifest is refused."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    monkeypatch.setattr(FileSystems, "_pipeline_options", FileSystems._pipeline_options)  # restored after
    FileSystems.set_options(PipelineOptions(s3_server.beam_args))
    prefix = s3_server.prefix("tables")
    for f in stream_replay.out_dir.iterdir():
        if f.is_file():
            s3_server.upload(f, prefix + "out/" + f.name)
            if f.name != "manifest.json":
                s3_server.upload(f, prefix + "killed/" + f.name)
    url = s3_server.url(prefix + "out")
    assert _nan_safe(read_metrics(url)) == _nan_safe(read_metrics(stream_replay.out_dir))
    assert _nan_safe(read_metrics(url + "/", final_only=True)) == \
        _nan_safe(read_metrics(stream_replay.out_dir, final_only=True))
    with pytest.raises(MetricsTableError, match="no manifest.json"):
        read_metrics(s3_server.url(prefix + "killed"))
    assert reconcile.main([url, str(batch_twin)], out=io.StringIO()) == 0
