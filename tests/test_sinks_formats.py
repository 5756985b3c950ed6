"""The batch job's warehouse formats (--formats avro,jsonl,parquet,csv) and its BigQuery sink.

The job runs once (FnApiRunner) on part of the bundled sample (data/sample: an Open Bandit campaign
with clicks, a LETOR run with judgments) plus one request of the LETOR run copied as system "solo"
with every click false: its calibration (predicted over observed clicks) has no click, so its value
is NaN. ``--grades 0:1``
rejects the judgments of grade 2 as dead letters, so the dead letters' Parquet file has rows, and a
CTR floor of 0.5 fires alerts.

Every Parquet and CSV row is compared with the JSON-lines row, read independently (pyarrow.parquet,
the csv module, json); the schemas with ``schemas/*.avsc`` read as plain JSON. The metric rows'
Parquet and CSV files are the typed table (issue 41, item 5): the count as ``n`` with its unit
``n_unit`` and in the column of that unit (``num_queries``, ``num_impressions``, ``num_requests``,
null elsewhere), and a ``slice_<attr>`` column per slice attribute beside ``slice``.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streameval.jobs import batch
from streameval import read_metrics
from streameval.beam import sinks
from streameval.io import avro, warehouse
from streameval.io.tables import metric_files

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
SCHEMAS = sorted((ROOT / "schemas").glob("*.avsc"))
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _avsc(path) -> dict:
    return json.loads(Path(path).read_text())


def _union_null(t) -> bool:
    return isinstance(t, list) and "null" in t


def _base(t):
    return [x for x in t if x != "null"][0] if isinstance(t, list) else t


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sinks")
    solo = [dict(r, system_id="solo", event_id="solo/" + r["event_id"], request_id="solo/" + r["request_id"],
                 clicked=False, score=min(max(r["score"], 0.0), 1.0), attributes={"campaign": "solo"})
            for r in avro.read_records(SAMPLE / "impressions" / "letor_feature206.avro", "impression")
            if r["query_id"] == "q1"]
    assert solo
    avro.write_records(tmp / "solo.avro", "impression", solo)
    (tmp / "rules.toml").write_text('[[rule]]\nname = "ctr-floor"\nmetric = "ctr"\nbelow = 0.5\nmin_n = 20\n')
    out = tmp / "out"
    code = batch.main([
        "--impressions", str(SAMPLE / "impressions" / "obd_random_men.avro"),
        "--impressions", str(SAMPLE / "impressions" / "letor_feature206.avro"),
        "--impressions", str(tmp / "solo.avro"),
        "--judgments", str(SAMPLE / "judgments" / "letor_test_labels.avro"),
        "--metrics", "ndcg@10,map,calibration,clicks@3", "--labels", "clicks", "--slices", "campaign", "--window", "1d",
        "--grades", "0:1", "--max-rejected-fraction", "1", "--alerts", str(tmp / "rules.toml"),
        "--formats", "avro,jsonl,parquet,csv", "--runner", "FnApiRunner", "--quiet", "--output", str(out)])
    assert code == 4  # the CTR floor fired (alerts written)
    return out


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _key(r):
    return tuple(str(r[k]) for k in ("window_start", "slice", "system", "metric"))


def _micros(dt: datetime) -> int:
    d = dt - EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


#: the unit columns of the typed table: each holds the count where the row's unit is its own
UNIT_COLUMNS = {"queries": "num_queries", "impressions": "num_impressions", "requests": "num_requests"}


def typed_columns(attributes=()) -> list[str]:
    """The typed table's columns: metric_result's fields with ``num_queries`` and ``n_unit`` replaced
    by ``n``, ``n_unit`` and the unit columns, and a ``slice_<attr>`` per attribute after ``slice``."""
    out = []
    for f in _avsc(ROOT / "schemas" / "metric_result.avsc")["fields"]:
        if f["name"] == "num_queries":
            out += ["n", "n_unit", *UNIT_COLUMNS.values()]
        elif f["name"] != "n_unit":
            out.append(f["name"])
        if f["name"] == "slice":
            out += ["slice_" + a for a in attributes]
    return out


def typed_to_row(rec: dict, attributes=()) -> dict:
    """A typed table's row back in the metric_result shape (the JSON lines'), checking its typed
    columns on the way: each slice column the label's value of it (None where the label has none),
    each unit column ``n`` where ``n_unit`` is its unit and None elsewhere."""
    r = dict(rec)
    parts = {} if r["slice"] == "all" else dict(p.split("=", 1) for p in r["slice"].split(","))
    for a in attributes:
        assert r.pop("slice_" + a) == parts.get(a), rec
    n = r.pop("n")
    for unit, column in UNIT_COLUMNS.items():
        assert r.pop(column) == (n if r["n_unit"] == unit else None), rec
    r["num_queries"] = n
    return r


def test_parquet_rows_equal_the_json_lines_rows(job):
    want = _jsonl(job / "metrics.jsonl")
    table = pq.read_table(job / "metrics.parquet")
    assert table.schema.names == typed_columns(["campaign"])
    for name in ("window_start", "window_end"):  # windows as timestamps, not numbers
        assert table.schema.field(name).type == pa.timestamp("us", tz="UTC")
    for name in ("n", *UNIT_COLUMNS.values()):
        assert table.schema.field(name).type == pa.int64()
    got = []
    for r in table.to_pylist():  # timestamps come back as aware datetimes
        for name in ("window_start", "window_end"):
            if r[name] is not None:
                assert r[name].tzinfo is not None
                r[name] = _micros(r[name])
        got.append(typed_to_row(r, ["campaign"]))
    assert len(got) == len(want) > 20
    # JSON lines write every field (null included) and floats in round-trip form: equal exactly
    assert sorted(got, key=_key) == sorted(want, key=_key)
    assert all(r["window_start"] is not None for r in got)  # --window 1d: every row has a window


def test_nan_is_null_in_parquet_and_csv(job):
    nan_rows = [r for r in avro.read_records(job / "metrics.avro", "metric_result") if math.isnan(r["value"])]
    assert nan_rows  # the solo system's calibration: no click
    assert {(r["system"], r["metric"]) for r in nan_rows} == {("solo", "calibration")}
    nan_keys = {_key(r) for r in nan_rows}
    table = pq.read_table(job / "metrics.parquet")
    assert table.column("value").null_count == len(nan_rows)
    assert not any(v is not None and math.isnan(v) for v in table.column("value").to_pylist())
    for name in ("stderr", "ci_low", "ci_high"):  # null or NaN in Avro: null in Parquet, never NaN
        empty = sum(1 for r in avro.read_records(job / "metrics.avro", "metric_result")
                    if r[name] is None or math.isnan(r[name]))
        assert table.column(name).null_count == empty
        assert not any(v is not None and math.isnan(v) for v in table.column(name).to_pylist())
    with open(job / "metrics.csv", newline="") as fo:
        rows = list(csv.DictReader(fo))
    assert {_key({**r, "window_start": _micros(datetime.fromisoformat(r["window_start"]))}) for r in rows
            if r["value"] == ""} == nan_keys


def csv_metric_rows(path, attributes=()) -> list[dict]:
    """The metric rows of a CSV file read with the csv module alone: its header must be the typed
    table's columns (:func:`typed_columns`, a slice column per attribute of ``attributes``);
    empty cells are null, timestamps ISO 8601 UTC text (as int microseconds here), booleans ``true`` /
    ``false``; each row back in the metric_result shape (:func:`typed_to_row`)."""
    types = {f["name"]: f["type"] for f in _avsc(ROOT / "schemas" / "metric_result.avsc")["fields"]}
    types.update({"n": "long", **{c: ["null", "long"] for c in UNIT_COLUMNS.values()}},
                 **{"slice_" + a: ["null", "string"] for a in attributes})
    with open(path, newline="") as fo:
        reader = csv.reader(fo)
        header = next(reader)
        lines = list(reader)
    assert header == typed_columns(attributes)
    fields = [{"name": h, "type": types[h]} for h in header]
    got = []
    for cells in lines:
        r = {}
        for f, cell in zip(fields, cells):
            t = _base(f["type"])
            if cell == "":
                r[f["name"]] = None
            elif isinstance(t, dict) and t.get("logicalType") == "timestamp-micros":
                dt = datetime.fromisoformat(cell.replace("Z", "+00:00"))  # ISO 8601 text, UTC
                assert dt.utcoffset() == timedelta(0)
                r[f["name"]] = _micros(dt)
            elif t == "long":
                r[f["name"]] = int(cell)
            elif t == "double":
                r[f["name"]] = float(cell)
            elif t == "boolean":
                r[f["name"]] = {"true": True, "false": False}[cell]
            else:
                r[f["name"]] = cell
        got.append(typed_to_row(r, attributes))
    return got


def test_csv_rows_equal_the_json_lines_rows(job):
    assert sorted(p.name for p in job.glob("metrics*.csv")) == ["metrics.csv"]  # one file
    got = csv_metric_rows(job / "metrics.csv", ["campaign"])
    want = _jsonl(job / "metrics.jsonl")
    assert len(got) == len(want)
    assert sorted(got, key=_key) == sorted(want, key=_key)


def _csv_dicts(path) -> list[dict]:
    with open(path, newline="") as fo:
        return list(csv.DictReader(fo))


def test_the_count_is_in_the_column_of_its_unit(job):
    """CTR rows count impressions, ranking rows queries, clicks@3 requests: ``n_unit`` says so in the
    JSON lines and Avro rows; the typed table (Parquet, CSV, the frame) has the count as ``n`` and in
    that unit's column only. Before, every row had its count in ``num_queries`` alone."""
    units = {"ctr": "impressions", "calibration": "impressions", "ndcg@10": "queries", "map": "queries",
             "clicks@3": "requests"}
    for rows in (_jsonl(job / "metrics.jsonl"), list(avro.read_records(job / "metrics.avro", "metric_result"))):
        assert {r["metric"] for r in rows} >= set(units)
        for r in rows:
            if r["metric"] in units:
                assert r["n_unit"] == units[r["metric"]], r
    frame = read_metrics(job, as_frame=True).astype(object)
    frame = frame.where(frame.notna(), None).to_dict("records")
    csv_rows = [{k: (int(v) if v else None) if k in ("n", *UNIT_COLUMNS.values()) else v for k, v in r.items()}
                for r in _csv_dicts(job / "metrics.csv")]
    for name, rows in (("parquet", pq.read_table(job / "metrics.parquet").to_pylist()), ("csv", csv_rows),
                       ("frame", frame)):
        seen = set()
        for r in rows:
            unit = units.get(r["metric"])
            if unit is None:  # ctr@pos{p}
                continue
            assert r["n_unit"] == unit and r["n"] is not None, (name, r)
            for u, column in UNIT_COLUMNS.items():
                assert r[column] == (r["n"] if u == unit else None), (name, r)
            seen.add(r["metric"])
        assert seen == set(units), name
    ctr = [r for r in frame if r["metric"] == "ctr" and r["slice"] == "all"]
    assert ctr and all(r["num_impressions"] > 0 and r["num_queries"] is None for r in ctr)
    import pandas as pd  # pandas reads the file with the frame's nullable dtypes (the file's pandas metadata)

    dtypes = pd.read_parquet(job / "metrics.parquet").dtypes
    assert {str(dtypes[c]) for c in ("n", *UNIT_COLUMNS.values(), "pane_index")} == {"Int64"}
    assert str(dtypes["is_final"]) == "boolean"


def test_a_column_per_slice_attribute_in_parquet_and_csv(job):
    """``--slices campaign``: a ``slice_campaign`` column beside ``slice`` in both files, as in the
    frame: the label's value, null on the ``all`` rows."""
    want = {("all", None), ("campaign=men", "men"), ("campaign=solo", "solo"),
            ("campaign=(missing)", "(missing)")}  # the LETOR requests have no campaign
    table = pq.read_table(job / "metrics.parquet")
    assert table.schema.names[2:5] == ["slice", "slice_campaign", "system"]
    assert table.schema.field("slice_campaign").type == pa.string()
    assert {(r["slice"], r["slice_campaign"]) for r in table.to_pylist()} == want
    rows = _csv_dicts(job / "metrics.csv")
    assert list(rows[0])[2:5] == ["slice", "slice_campaign", "system"]
    assert {(r["slice"], r["slice_campaign"] or None) for r in rows} == want
    frame = read_metrics(job, as_frame=True)
    assert list(frame.columns[2:5]) == ["slice", "slice_campaign", "system"]
    values = frame["slice_campaign"].astype(object).where(frame["slice_campaign"].notna(), None)
    assert set(zip(frame["slice"], values)) == want


def test_dead_letters_in_parquet_and_the_manifest(job):
    want = _jsonl(job / "dead_letters.jsonl")
    got = pq.read_table(job / "dead_letters.parquet").to_pylist()
    assert len(want) > 0 and sorted(got, key=lambda r: json.dumps(r, sort_keys=True)) == sorted(want, key=lambda r: json.dumps(r, sort_keys=True))
    assert all("outside the declared range" in r["reason"] for r in got)
    manifest = json.loads((job / "manifest.json").read_text())
    for name in ("metrics.parquet", "metrics.csv", "dead_letters.parquet", "metrics.avro", "metrics.jsonl"):
        files = manifest["outputs"][name]
        assert [Path(f["path"]).name for f in files] == [name]
        assert files[0]["bytes"] == (job / name).stat().st_size
    assert "dead_letters.csv" not in manifest["outputs"]


def test_alerts_in_parquet(job):
    want = _jsonl(job / "alerts.jsonl")
    table = pq.read_table(job / "alerts.parquet")
    assert table.schema.field("window_start").type == pa.timestamp("us", tz="UTC")
    got = [{**r, **{k: _micros(r[k]) for k in ("window_start", "window_end") if r[k] is not None}}
           for r in table.to_pylist()]
    assert len(want) > 0 and sorted(got, key=lambda r: json.dumps(r, sort_keys=True)) == sorted(want, key=lambda r: json.dumps(r, sort_keys=True))
    assert [Path(f["path"]).name for f in json.loads((job / "manifest.json").read_text())["outputs"]["alerts.parquet"]] \
        == ["alerts.parquet"]


def test_read_metrics_reads_the_parquet_output(job):
    assert [Path(f).name for f in metric_files(job)] == ["metrics.parquet"]

    def norm(rows):  # NaN != NaN: compare it as a marker
        return sorted(({k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                       for r in rows), key=_key)

    from_parquet = read_metrics(job)
    from_json = read_metrics(job / "metrics.jsonl")
    assert len(from_parquet) == len(from_json) > 20
    assert norm(from_parquet) == norm(from_json)
    assert all(isinstance(r["window_start"], int) for r in from_parquet)
    assert any(math.isnan(r["value"]) for r in from_parquet)
    assert norm(read_metrics(job / "metrics.parquet")) == norm(from_json)


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.stem)
def test_arrow_schema_follows_every_avro_schema(path):
    js = _avsc(path)
    schema = warehouse.arrow_schema(path.stem)
    assert schema.names == [f["name"] for f in js["fields"]]
    simple = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
              "boolean": pa.bool_()}
    for f in js["fields"]:
        field, t = schema.field(f["name"]), _base(f["type"])
        # nullable where the Avro type is a union with null; doubles too (NaN is written as null)
        assert field.nullable == (_union_null(f["type"]) or t == "double"), f["name"]
        if isinstance(t, dict) and t.get("logicalType") == "timestamp-micros":
            assert field.type == pa.timestamp("us", tz="UTC")
        elif isinstance(t, dict) and t["type"] == "map":
            assert field.type == pa.map_(pa.string(), pa.string())
        else:
            assert field.type == simple[t], f["name"]


def test_bigquery_schema_matches_metric_result_field_by_field():
    fields = _avsc(ROOT / "schemas" / "metric_result.avsc")["fields"]
    bq = warehouse.bigquery_schema("metric_result")["fields"]
    assert [f["name"] for f in bq] == [f["name"] for f in fields]
    types = {"string": "STRING", "long": "INT64", "double": "FLOAT64", "boolean": "BOOL"}
    for f, b in zip(fields, bq):
        t = _base(f["type"])
        want = "TIMESTAMP" if isinstance(t, dict) and t.get("logicalType") == "timestamp-micros" else types[t]
        assert b["type"] == want, f["name"]
        assert b["mode"] == ("NULLABLE" if _union_null(f["type"]) or t == "double" else "REQUIRED"), f["name"]
        assert b["description"] == f["doc"]
    row = warehouse.bigquery_record({"window_start": 86_400_000_000, "window_end": None, "slice": "all",
                                     "system": "s", "metric": "map", "value": math.nan, "num_queries": 0}, "metric_result")
    assert row["window_start"] == "1970-01-02T00:00:00.000000Z" and row["value"] is None


def _table_reference_stand_in(monkeypatch):
    """Without Beam's gcp extra, apitools' TableReference is None and WriteToBigQuery cannot parse a
    table name: stand in a plain class with its three attributes (construction only, nothing runs)."""
    from apache_beam.io.gcp import bigquery_tools

    if bigquery_tools.TableReference is None:
        class TableReference:
            def __init__(self, projectId=None, datasetId=None, tableId=None):
                self.projectId, self.datasetId, self.tableId = projectId, datasetId, tableId

        monkeypatch.setattr(bigquery_tools, "TableReference", TableReference)


def test_bigquery_sink_is_constructed_with_the_derived_schema(monkeypatch):
    import apache_beam as beam

    _table_reference_stand_in(monkeypatch)
    sink = sinks.bigquery_sink("my-project:evaluation.metric_rows")
    assert isinstance(sink, beam.io.WriteToBigQuery)  # constructed, not run (no GCP here)
    ref = sink.table_reference
    assert (ref.projectId, ref.datasetId, ref.tableId) == ("my-project", "evaluation", "metric_rows")
    assert sink.schema == warehouse.bigquery_schema("metric_result")
    assert (sink.create_disposition, sink.write_disposition, sink.method) == ("CREATE_IF_NEEDED", "WRITE_APPEND",
                                                                             "FILE_LOADS")
    # a table created by an older schema version gets the new nullable fields (n_unit) on append
    assert sink.additional_bq_parameters == {"schemaUpdateOptions": ["ALLOW_FIELD_ADDITION"]}
    with pytest.raises(ValueError, match="PROJECT:DATASET.TABLE"):
        sinks.bigquery_sink("just_a_table")


def test_the_job_refuses_bigquery_without_its_client_libraries(tmp_path, capsys):
    if sinks.bigquery_available():
        pytest.skip("the BigQuery client libraries are installed here")
    code = batch.main(["--impressions", str(SAMPLE / "impressions" / "obd_random_men.avro"),
                       "--bigquery-table", "my-project:evaluation.metric_rows", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--bigquery-table needs the BigQuery client libraries" in err
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_formats_option():
    assert sinks.parse_formats("csv,parquet,jsonl,avro") == ("avro", "jsonl", "parquet", "csv")
    assert sinks.parse_formats("jsonl") == ("jsonl",)
    with pytest.raises(ValueError, match="unknown format 'xlsx'"):
        sinks.parse_formats("jsonl,xlsx")
    with pytest.raises(ValueError, match="must include jsonl"):
        sinks.parse_formats("parquet")
    assert warehouse.csv_line({"slice": 'a,"b"', "value": math.inf, "is_final": True}, "metric_result") == \
        ',,"a,""b""",,,,,,,,,,,,,true,'  # n_unit after num_queries (schema version 3), metric_canonical last


def test_parquet_and_csv_on_s3(s3_server, monkeypatch, tmp_path):
    """The job writes its Parquet and CSV outputs to an S3 prefix (a moto server on 127.0.0.1) as it
    does locally, and read_metrics reads the Parquet output there."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    prefix = s3_server.prefix("sinks")
    imps = s3_server.upload(SAMPLE / "impressions" / "obd_random_men.avro", prefix + "in/imps.avro")
    common = ["--impressions", imps, "--window", "1d", "--formats", "jsonl,parquet,csv", "--quiet",
              "--runner", "FnApiRunner"]
    assert batch.main([*common, "--output", s3_server.url(prefix + "out"), *s3_server.beam_args]) == 0
    assert batch.main([*common, "--output", str(tmp_path / "local"), *s3_server.beam_args]) == 0
    names = {k.rsplit("/", 1)[-1] for k in s3_server.keys(prefix + "out/")}
    assert {"metrics.parquet", "metrics.csv", "dead_letters.parquet", "metrics.jsonl", "manifest.json"} <= names
    assert "metrics.avro" not in names
    manifest = json.loads(s3_server.read(prefix + "out/manifest.json"))
    assert manifest["folder"].startswith("runs/")  # the run's own folder, which the manifest publishes
    remote_csv = s3_server.read(prefix + "out/" + manifest["folder"] + "/metrics.csv").splitlines()
    local_csv = (tmp_path / "local" / "metrics.csv").read_bytes().splitlines()
    assert remote_csv[0] == local_csv[0] and sorted(remote_csv) == sorted(local_csv) and len(local_csv) > 1
    assert "metrics.avro" not in manifest["outputs"] and manifest["outputs"]["metrics.parquet"]
    monkeypatch.setattr(FileSystems, "_pipeline_options", FileSystems._pipeline_options)  # restored after
    FileSystems.set_options(PipelineOptions(s3_server.beam_args))
    assert [Path(f).name for f in metric_files(s3_server.url(prefix + "out"))] == ["metrics.parquet"]
    remote = read_metrics(s3_server.url(prefix + "out"))
    local = read_metrics(tmp_path / "local" / "metrics.jsonl")
    assert len(remote) == len(local) > 0
    assert sorted(remote, key=_key) == sorted(local, key=_key)  # CTR rows: no NaN
