"""What a metric row's count counts (issue 41, item 5): ``streameval.metrics.units.count_unit`` against
every row of docs/metrics.md's "Names" table, the rows' ``n_unit`` (schema version 3; filled in from
the metric for older files), and the typed table's columns (``streameval.io.metric_table``): the
count by unit, a column per slice attribute, the jobs' slice columns from their options."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streameval import read_metrics
from streameval.io import avro, warehouse
from streameval.io.metric_table import MetricTable, plain_row, slice_attributes, slice_columns
from streameval.metrics.rows import metric_row
from streameval.metrics.units import COUNT_UNITS, UNKNOWN_UNIT, count_unit

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "metrics.md"
HEADING = "| name (as written) | row metric name | `n_unit`"
# the docs' placeholders, as a row writes them
PLACES = (("k=b", "k=3"), ("bins=B", "bins=10"), ("{p}", "2"), ("@k", "@3"), ("GROUP", "user"),
          ("WEIGHTING", "clicks"), ("TARGET", "random"), ("tau=T", "tau=1"), ("cluster=C", "cluster=user"),
          ("cuped=NAME", "cuped=pre_clicks"))


def _docs_rows() -> list[tuple[str, str]]:
    """(row metric name, unit) of every name in the docs table: the names of its second column (its
    first where the second has none), the unit the first code span of its third."""
    lines = DOCS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADING))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == 3, line
        names = re.findall(r"`([^`]+)`", cells[1]) or re.findall(r"`([^`]+)`", cells[0])
        unit = re.findall(r"`([^`]+)`", cells[2])[0]
        for name in names:
            if name.startswith((":", "-")) or "..." in name:
                continue
            for place, value in PLACES:
                name = name.replace(place, value)
            out.append((name, unit))
    return out


DOC_ROWS = _docs_rows()


def test_the_docs_table_covers_every_family():
    assert len(DOC_ROWS) > 50
    assert {u for _, u in DOC_ROWS} == set(COUNT_UNITS) - {UNKNOWN_UNIT}


@pytest.mark.parametrize("name, unit", DOC_ROWS, ids=[n for n, _ in DOC_ROWS])
def test_count_unit_follows_the_docs_table(name, unit):
    assert count_unit(name) == unit


@pytest.mark.parametrize("name, unit", [
    ("nDCG@10", "queries"), ("ndcg_cut_10", "queries"), ("AP", "queries"), ("P.5,10", "queries"),
    ("num_q", "queries"), ("RBP(p=0.8)", "queries"), ("ERR-IA@20", "queries"), ("GAUC", "groups"),
    ("gauc[query,unweighted]", "groups"), ("CTR@pos2", "impressions"), ("ece", "impressions"),
    ("calibration_bin[bins=10,k=0]:observed", "impressions"), ("Clicks@3", "requests"),
    ("rr_click", "requests"), ("long_click_ctr[t=500ms]", "requests"), ("srm:share", "requests"),
    ("iips[bts]:ess", "impressions"), ("pi[bts]:ess", "slates"), ("switch_dr[bts,tau=0.5]", "impressions"),
    ("ope[my:policy]:ess", "impressions"),
    ("no_such_metric", UNKNOWN_UNIT), ("gauc[nobody]", UNKNOWN_UNIT), ("", UNKNOWN_UNIT),
])
def test_count_unit_of_other_spellings_and_unknown_names(name, unit):
    assert count_unit(name) == unit


def test_count_unit_of_an_ir_measures_object():
    ir_measures = pytest.importorskip("ir_measures")
    assert count_unit(ir_measures.nDCG @ 10) == "queries"


def test_every_row_carries_its_unit():
    assert metric_row(None, None, "all", "A", "ctr", 0.1, 50, 0.01)["n_unit"] == "impressions"
    assert metric_row(None, None, "all", "A", "nDCG@10", 0.5, 8, 0.1)["n_unit"] == "queries"
    assert metric_row(None, None, "all", "A", "abandonment", 0.5, 8, 0.1)["n_unit"] == "requests"
    fields = [f["name"] for f in json.loads((ROOT / "schemas" / "metric_result.avsc").read_text())["fields"]]
    assert list(metric_row(None, None, "all", "A", "ctr", 0.1, 50, 0.01)) == fields


def _row(metric, n, sl="all", **extra):
    return dict(metric_row(None, None, sl, "A", metric, 0.5, n, None), **extra)


def test_older_files_read_with_the_unit_from_the_metric(tmp_path):
    """Files written before ``n_unit`` (schema version 2: Avro, JSON lines, the Parquet files of the
    metric_result columns) read with it filled in from the metric's name."""
    old_rows = [{k: v for k, v in _row(m, n).items() if k != "n_unit"} for m, n in (("ctr", 40), ("map", 3))]
    v2 = avro.load_schema_json("metric_result")
    v2 = dict(v2, streameval_schema_version=2, fields=[f for f in v2["fields"] if f["name"] != "n_unit"])
    with open(tmp_path / "v2.avro", "wb") as fo:
        fastavro.writer(fo, fastavro.parse_schema(v2), old_rows)
    (tmp_path / "v2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old_rows))
    pq.write_table(pa.Table.from_pylist([warehouse.arrow_record(r, v2) for r in old_rows],
                                        schema=warehouse.arrow_schema(v2)), tmp_path / "v2.parquet")
    for name in ("v2.avro", "v2.jsonl", "v2.parquet"):
        rows = read_metrics(tmp_path / name)
        assert [(r["metric"], r["num_queries"], r["n_unit"]) for r in rows] == [
            ("ctr", 40, "impressions"), ("map", 3, "queries")], name
    assert avro.load_schema_json("metric_result")["streameval_schema_version"] == 3


def test_the_typed_record_and_its_way_back():
    table = MetricTable(("campaign", "device"))
    rec = table.record(_row("clicks@3", 12, "campaign=men,device=pc"))
    assert list(rec) == table.columns
    assert (rec["n"], rec["n_unit"], rec["num_queries"], rec["num_impressions"], rec["num_requests"]) == \
        (12, "requests", None, None, 12)
    assert (rec["slice_campaign"], rec["slice_device"]) == ("men", "pc")
    rec = table.record({k: v for k, v in _row("ctr", 30, "device=sp").items() if k != "n_unit"})
    assert (rec["n_unit"], rec["num_impressions"], rec["num_queries"], rec["slice_campaign"]) == \
        ("impressions", 30, None, None)
    back = plain_row(table.record(_row("map", 7, "campaign=men")))
    assert back == _row("map", 7, "campaign=men")
    schema = table.arrow_schema()
    assert schema.names[2:5] == ["slice", "slice_campaign", "slice_device"]
    assert schema.field("n").type == pa.int64() and not schema.field("n").nullable
    assert schema.field("num_requests").nullable
    assert table.csv_header().split(",")[7:12] == ["value", "n", "n_unit", "num_queries", "num_impressions"]


def test_slice_attributes_undo_the_labels_escapes():
    assert slice_attributes("all") == {} and slice_attributes("campaign=all") == {}
    assert slice_attributes("campaign=men,device=pc") == {"campaign": "men", "device": "pc"}
    assert slice_attributes("campaign=(missing)") == {"campaign": "(missing)"}
    assert slice_attributes(r"campaign=a\,b,device=x\=y") == {"campaign": "a,b", "device": "x=y"}
    assert slice_attributes(r"path=c:\\d") == {"path": "c:\\d"}


def test_the_jobs_slice_columns_follow_their_options():
    from streameval.jobs import batch, stream
    from streameval.jobs.stream_args import window_spec

    assert slice_columns(["campaign", "campaign,device", ("device", "region")]) == ("campaign", "device", "region")
    args = argparse.Namespace(slices=["campaign+device", "campaign"], group_rows=True,
                              metrics="ndcg@10,gauc[query],gauc,auc")
    assert batch.metric_table(args).attributes == ("campaign", "device", "query", "user")
    args.group_rows = False
    assert batch.metric_table(args).attributes == ("campaign", "device")
    parser = stream.build_arg_parser()
    for extra, want in ((["--window", "1h"], ("campaign",)), (["--sessions", "30m"], ("user", "request", "campaign")),
                        (["--sessions", "30m", "--session-key", "request"], ("request", "campaign"))):
        args = parser.parse_args(["--replay", "--impressions", "x.avro", "--slices", "campaign", *extra])
        assert stream.metric_table(args, window_spec(args)).attributes == want, extra
