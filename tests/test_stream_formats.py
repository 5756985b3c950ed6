"""The streaming job's ``--formats`` (issue 41, item 5): each pane's metric rows in every format asked
for, the files of a format one table.

The stream replays part of the bundled sample (an Open Bandit campaign with clicks, a LETOR run with
judgments) in day windows with early panes (``--early-count``) and ``--slices campaign``, writing
avro, jsonl, parquet and csv. Every Parquet and CSV row is compared with the JSON-lines row of the
same pane, read independently (pyarrow, the csv module, json); the schema with
``schemas/metric_result.avsc`` read as plain JSON. Parquet and CSV hold the typed table (the count by
unit, a ``slice_campaign`` column: ``tests/test_sinks_formats.py``), the same columns in every pane's
file whichever slices the pane has.
Before, ``--formats`` was refused as an unknown option (exit 2) and the stream wrote Avro and JSON
lines only.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from streameval import read_metrics
from streameval.jobs import stream

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
FIELDS = json.loads((ROOT / "schemas" / "metric_result.avsc").read_text())["fields"]


def _micros(dt: datetime) -> int:
    d = dt - EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _key(r):
    return tuple(str(r[k]) for k in ("window_start", "system", "slice", "metric", "pane_index"))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("stream_formats") / "out"
    code = stream.main([
        "--replay", "--impressions", str(SAMPLE / "impressions" / "obd_random_men.avro"),
        "--impressions", str(SAMPLE / "impressions" / "letor_feature206.avro"),
        "--judgments", str(SAMPLE / "judgments" / "letor_test_labels.avro"),
        "--metrics", "ndcg@10,map", "--window", "1d", "--early-count", "500", "--slices", "campaign",
        "--formats", "csv,parquet,jsonl,avro", "--quiet", "--output", str(out)])
    assert code == 0
    return out


def _stems(out: Path, ext: str) -> set[str]:
    return {p.name[: -len(ext) - 1] for p in out.glob(f"metrics-*.{ext}")}


def _parquet(out: Path) -> list[Path]:
    return sorted(out.glob("metrics_parquet/window_date=*/metrics-*.parquet"))


def test_one_file_per_pane_and_format_all_in_the_manifest(out):
    stems = _stems(out, "jsonl")
    assert len(stems) > 3 and any("early" in s for s in stems) and any("final" in s for s in stems)
    for ext in ("avro", "csv"):
        assert _stems(out, ext) == stems, ext
    assert {p.name[:-len(".parquet")] for p in _parquet(out)} == stems
    for p in _parquet(out):  # each pane's file in the partition of its window's UTC date
        date = datetime.fromisoformat(p.name[len("metrics-"):len("metrics-") + 10])
        assert p.parent.name == f"window_date={date:%Y-%m-%d}"
    outputs = json.loads((out / "manifest.json").read_text())["outputs"]
    listed = {Path(f["path"]).name for f in outputs["metrics-*"]}
    assert listed == {f"{s}.{e}" for s in stems for e in ("avro", "jsonl", "csv")}
    assert sorted(Path(f["path"]) for f in outputs["metrics_parquet/"]) == _parquet(out)


def _bounds(name: str):
    """(window start, window end) of a pane file's name ``metrics-<start>-<end>-...``."""
    start, end = name[len("metrics-"):len("metrics-") + 18], name[len("metrics-") + 19:len("metrics-") + 37]
    return tuple(datetime.strptime(t, "%Y-%m-%dT%H%M%SZ") for t in (start, end))


def test_a_rerun_replaces_the_parquet_dataset(out, tmp_path):
    """A rerun with other windows leaves no partition of the previous run's (a copy of the output)."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    code = stream.main(["--replay", "--impressions", str(SAMPLE / "impressions" / "obd_random_men.avro"),
                        "--window", "6h", "--formats", "jsonl,parquet", "--quiet", "--output", str(copy)])
    assert code == 0
    files = _parquet(copy)
    assert files and {p.name[:-len(".parquet")] for p in files} == _stems(copy, "jsonl")
    for p in files:  # 6-hour windows only: none of the first run's day windows is left
        start, end = _bounds(p.name)
        assert end - start == timedelta(hours=6), p.name
    assert not list(copy.glob("metrics-*.avro"))


def test_parquet_files_are_one_dataset_equal_to_the_json_lines(out):
    from .test_sinks_formats import typed_columns, typed_to_row

    files = [str(p) for p in _parquet(out)]
    schemas = {pq.read_schema(f).remove_metadata() for f in files}
    assert len(schemas) == 1  # one table: every pane's file has the same columns and types
    schema = schemas.pop()
    assert schema.names == typed_columns(["campaign"])
    for name in ("window_start", "window_end"):  # windows as timestamps, not numbers
        assert schema.field(name).type == pa.timestamp("us", tz="UTC")
    table = ds.dataset(str(out / "metrics_parquet"), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == ds.dataset(files, format="parquet").to_table().num_rows
    got = []
    for r in table.to_pylist():
        date = r.pop("window_date")  # the partition column
        assert date == f"{r['window_start']:%Y-%m-%d}"
        for name in ("window_start", "window_end"):
            assert r[name].tzinfo is not None
            r[name] = _micros(r[name])
        got.append(typed_to_row(r, ["campaign"]))
    want = [r for p in sorted(out.glob("metrics-*.jsonl")) for r in _jsonl(p)]
    assert len(got) == len(want) > 20
    assert sorted(got, key=_key) == sorted(want, key=_key)
    assert {r["pane"] for r in got} >= {"early", "on_time"}
    # each pane's own file holds that pane's rows
    one = [p for p in _parquet(out) if "early" in p.name][0]
    assert pq.read_table(one).num_rows == len(_jsonl(out / one.with_suffix(".jsonl").name))


def test_csv_files_have_a_header_and_the_json_lines_rows(out):
    from .test_sinks_formats import csv_metric_rows

    got = [r for p in sorted(out.glob("metrics-*.csv")) for r in csv_metric_rows(p, ["campaign"])]
    want = [r for p in sorted(out.glob("metrics-*.jsonl")) for r in _jsonl(p)]
    assert len(got) == len(want) > 20
    assert sorted(got, key=_key) == sorted(want, key=_key)


def test_the_dataset_has_the_slice_and_count_columns_in_every_file(out):
    """Each pane's Parquet and CSV file has ``slice_campaign`` beside ``slice`` (null on ``all``) and
    the count by unit (CTR: impressions, ranking: queries); the dataset reads as one table with
    pyarrow.dataset and with pandas. Before, the files had neither."""
    import pandas as pd

    want = {("all", None), ("campaign=men", "men"), ("campaign=(missing)", "(missing)")}
    table = ds.dataset(str(out / "metrics_parquet"), format="parquet", partitioning="hive").to_table()
    names = table.schema.names
    assert names[names.index("slice") + 1] == "slice_campaign"
    rows = table.to_pylist()
    assert {(r["slice"], r["slice_campaign"]) for r in rows} == want
    for r in rows:
        unit = {"ctr": "impressions", "ndcg@10": "queries", "map": "queries"}.get(r["metric"])
        if unit is not None:
            assert r["n_unit"] == unit and r["num_" + unit] == r["n"], r
            assert [r[c] for c in ("num_queries", "num_impressions", "num_requests") if c != "num_" + unit] == \
                [None, None], r
    frame = pd.read_parquet(out / "metrics_parquet")
    assert len(frame) == len(rows) and "slice_campaign" in frame.columns
    ctr = frame[frame["metric"] == "ctr"]
    assert len(ctr) and ctr["num_queries"].isna().all() and (ctr["num_impressions"] == ctr["n"]).all()
    assert str(frame["num_impressions"].dtype) == "Int64"
    import csv

    for p in sorted(out.glob("metrics-*.csv")):  # a slice column in every pane's CSV file
        with open(p, newline="") as fo:
            header = next(csv.reader(fo))
        assert header[header.index("slice") + 1] == "slice_campaign", p.name


def test_read_metrics_reads_the_panes_once_whatever_the_formats(out):
    rows = read_metrics(str(out))
    want = [r for p in sorted(out.glob("metrics-*.jsonl")) for r in _jsonl(p)]
    assert len(rows) == len(want)


@pytest.mark.parametrize("formats, message", [
    ("parquet", "--formats must include jsonl"),
    ("jsonl,xlsx", "unknown format 'xlsx'"),
])
def test_bad_formats_are_a_usage_error(tmp_path, capsys, formats, message):
    code = stream.main(["--replay", "--impressions", str(SAMPLE / "impressions" / "obd_random_men.avro"),
                        "--window", "1d", "--formats", formats, "--output", str(tmp_path / "out")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
