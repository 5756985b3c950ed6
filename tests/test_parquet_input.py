"""The batch job reading Parquet impressions and judgments directly (``--map``, ``--attributes``,
``--timestamp-unit``; docs/metrics.md, "Parquet inputs").

The reference is the documented two-step route: ``streameval convert table`` turns each Parquet
file (written here with pyarrow, with its own column names) into Avro plus dead letters, and the
batch job runs on those Avro files. The direct run must give the same metric rows, the same dead
letters (the conversion's, with ``path:row N``, and the job's own) and the same accounting (plus the
rows the conversion rejected, which the direct run reads and rejects itself). FnApiRunner, a few
hundred rows.
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streameval.jobs import batch
from streameval import cli
from streameval.beam.sources import InputUnavailableError, read_parquet_blocks
from streameval.io import parquet_blocks

MAP = "event_id=eid,request_id=rid,query_id=qid,system_id=ranker,item_id=doc,position=rank,timestamp=ts," \
      "clicked=click,score=s,grade=rel"
IMP_MAP = ",".join(x for x in MAP.split(",") if not x.startswith("grade="))
JUDG_MAP = "query_id=qid,item_id=doc,grade=rel,timestamp=ts"
COMMON = ["--metrics", "ndcg@10,map,P@5", "--slices", "region", "--runner", "FnApiRunner", "--quiet",
          "--max-rejected-fraction", "1", "--event-time-range", "2020..2030"]


def _impressions(seed: int, n_requests: int, offset: int):
    """Rows of an impression table with its own column names: 3 systems, 12 queries, 2 regions."""
    rnd = random.Random(seed)
    rows = []
    for r in range(n_requests):
        system, query, region = rnd.choice("ABC"), f"q{rnd.randrange(12)}", rnd.choice(["eu", "us"])
        ts = 1_700_000_000 + rnd.randrange(86_400)
        for pos, doc in enumerate(rnd.sample(range(30), 6), 1):
            rows.append({"eid": f"e{offset + len(rows)}", "rid": f"r{offset + r}", "qid": query, "ranker": system,
                         "doc": f"d{doc}", "rank": pos, "ts": ts, "click": int(rnd.random() < 0.2),
                         "s": round(rnd.uniform(-1, 1), 3), "region": region, "junk": "x"})
    return rows


def _table(rows):
    return pa.table({k: [r[k] for r in rows] for k in rows[0]})


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Two impression files (one in row groups of 50 rows), one judgment file (timestamps in
    nanoseconds, which Arrow's column cast refuses: every row takes the per-value conversion), and
    the same converted by ``streameval convert table``."""
    d = tmp_path_factory.mktemp("parquet_in")
    a, b = _impressions(1, 40, 0), _impressions(2, 30, 10_000)
    a[3]["rank"] = 0                              # row 4: the record check (conversion)
    a[7]["click"] = 2                             # row 8: not a boolean (conversion)
    a[10]["ts"] = 1_000_000_000                   # row 11: 2001, outside --event-time-range (the job)
    b[5] = dict(b[4])                             # row 6: a replay of row 5 (the job: counted once)
    b[9] = dict(b[8], s=0.125)                    # row 10: same event, other content (the job)
    imp_a, imp_b = d / "imp_a.parquet", d / "imp_b.parquet"
    pq.write_table(_table(a), imp_a, row_group_size=50)
    pq.write_table(_table(b), imp_b)
    rnd = random.Random(3)
    judg = [{"qid": f"q{q}", "doc": f"d{x}", "rel": rnd.randrange(4),
             "ts": 1_600_000_000_000_000_123 + x} for q in range(12) for x in rnd.sample(range(30), 12)]
    judg[2]["rel"] = None                         # row 3: no grade (conversion)
    jt = pa.table({"qid": [j["qid"] for j in judg], "doc": [j["doc"] for j in judg],
                   "rel": pa.array([j["rel"] for j in judg], pa.int32()),
                   "ts": pa.array([j["ts"] for j in judg], pa.timestamp("ns"))})
    judg_p = d / "judg.parquet"
    pq.write_table(jt, judg_p)
    conv = d / "conv"
    letters = []
    for src, kind, mapping, extra in ((imp_a, "impressions", IMP_MAP, ["--attributes", "region"]),
                                      (imp_b, "impressions", IMP_MAP, ["--attributes", "region"]),
                                      (judg_p, "judgments", JUDG_MAP, [])):
        out = conv / (src.stem + ".avro")
        dl = conv / (src.stem + ".dl.jsonl")
        assert cli.main(["convert", "table", str(src), "--kind", kind, "--out", str(out), "--map", mapping,
                         "--timestamp-unit", "s", "--dead-letters", str(dl), *extra]) == 0
        letters += [json.loads(x) for x in dl.read_text().splitlines()]
    return {"dir": d, "imp": [imp_a, imp_b], "judg": judg_p, "conv": conv, "conv_letters": letters, "a": a, "b": b}


def _job(out, imps, judg, *extra):
    code = batch.main([*(x for p in imps for x in ("--impressions", str(p))), "--judgments", str(judg),
                       *COMMON, "--output", str(out), *extra])
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
    read = (lambda f: [json.loads(x) for x in (out / f).read_text().splitlines()] if (out / f).exists() else [])
    return code, summary, read("metrics.jsonl"), read("dead_letters.jsonl")


@pytest.fixture(scope="module")
def both(logs, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    conv = logs["conv"]
    via_avro = _job(d / "avro", [conv / "imp_a.avro", conv / "imp_b.avro"], conv / "judg.avro")
    direct = _job(d / "parquet", logs["imp"], logs["judg"], "--map", MAP, "--judgments-map", JUDG_MAP,
                  "--attributes", "region", "--timestamp-unit", "s")
    return via_avro, direct


def _canon(rows):
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_same_metric_rows_as_the_converted_avro(both):
    (code_a, _, rows_a, _), (code_p, summary, rows_p, _) = both
    assert code_a == 0 and code_p == 0
    assert _canon(rows_p) == _canon(rows_a)
    assert {r["metric"] for r in rows_p} >= {"ndcg@10", "map", "P@5", "ctr"}
    assert {r["slice"] for r in rows_p} >= {"region=eu", "region=us"}
    assert set(summary["decoders"].values()) == {"parquet"}


def test_same_dead_letters_with_row_numbers(both, logs):
    (_, _, _, dead_a), (_, _, _, dead_p) = both
    conv = logs["conv_letters"]
    # the conversion's dead letters, exactly as convert table gives them
    assert _canon([x for x in dead_p if x in conv]) == _canon(conv)
    imp_a = str(logs["imp"][0])
    judg = str(logs["judg"])
    assert sorted((x["source"], x["reason"]) for x in conv) == sorted([
        (f"{imp_a}:row 4", "position must be >= 1 (1-based), got 0"),
        (f"{imp_a}:row 8", "clicked must be a boolean (or 0/1), got int 2"),
        (f"{judg}:row 3", "missing required field 'grade'")])
    # the job's own: the same records and reasons; the Avro run names the Avro file, the direct run
    # the Parquet row (row 11 of imp_a: event e10, 2001, outside --event-time-range)
    own_p = [x for x in dead_p if x not in conv]
    assert sorted((x["raw"], x["reason"]) for x in own_p) == sorted((x["raw"], x["reason"]) for x in dead_a)
    assert sorted((json.loads(x["raw"])["event_id"], x["source"], x["reason"][:40]) for x in own_p) == [
        ("e10", f"{imp_a}:row 11", "timestamp 1000000000000000 is outside th"),
        ("e10008", "CleanImpressions", "event_id repeated with different content")]


def test_same_accounting_plus_the_rows_the_conversion_rejected(both, logs):
    (_, sa, _, _), (_, sp, _, _) = both
    acc_a, acc_p = sa["accounting"], sp["accounting"]
    assert sa["accounting_problems"] == [] and sp["accounting_problems"] == []
    conv = Counter(("judgment" if "judg" in x["source"] else "impression") for x in logs["conv_letters"])
    for kind in ("impression", "judgment"):
        a, p = dict(acc_a[kind]), dict(acc_p[kind])
        assert p["read"] == a["read"] + conv[kind]
        assert sum(p["rejected"].values()) == sum(a["rejected"].values()) + conv[kind]
        for k in a:
            if k not in ("read", "rejected"):
                assert p[k] == a[k], (kind, k)
    # impressions read: every Parquet row (240 + 180), judgments 144
    assert acc_p["impression"]["read"] == len(logs["a"]) + len(logs["b"]) == 420
    assert acc_p["judgment"]["read"] == 144
    assert acc_p["impression"]["duplicates"] == 1


def test_damaged_parquet_file_is_a_dead_letter(logs, tmp_path):
    good = logs["imp"][0].read_bytes()
    bad = tmp_path / "cut.parquet"
    bad.write_bytes(good[: len(good) // 2])
    args = ("--map", MAP, "--judgments-map", JUDG_MAP, "--attributes", "region", "--timestamp-unit", "s")
    code, summary, rows, dead = _job(tmp_path / "o", [logs["imp"][1], bad], logs["judg"], *args)
    assert code == 3  # an input check: a damaged file (--allow-unreadable accepts it)
    letters = [x for x in dead if x["source"] == str(bad)]
    assert len(letters) == 1
    assert letters[0]["reason"].startswith("unreadable Parquet file (impressions): ")
    assert letters[0]["reason"].endswith("; 0 records before the damage were read")
    assert summary["accounting"]["unreadable_files"][0].startswith(f"{bad} (impressions): ")
    code, _, rows_ok, _ = _job(tmp_path / "o2", [logs["imp"][1], bad], logs["judg"], *args, "--allow-unreadable")
    assert code == 0 and _canon(rows_ok) == _canon(rows) and rows


def test_environment_errors_are_not_damage(tmp_path, logs):
    """A file that is not there, or whose reads fail, raises: the bundle fails, no dead letter."""
    with pytest.raises(InputUnavailableError, match="cannot read input file"):
        list(read_parquet_blocks(str(tmp_path / "gone.parquet"), "impressions"))

    class Failing(io.BytesIO):
        def read(self, *a):
            raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset") as e:
        list(parquet_blocks.read_blocks(Failing(logs["judg"].read_bytes()), "x.parquet", "judgments"))
    assert not isinstance(e.value, parquet_blocks.ParquetInputError)


def test_options_refused_in_one_line(logs, tmp_path, capsys):
    imp, judg = (str(p) for p in logs["imp"]), str(logs["judg"])
    base = ["--impressions", next(imp), "--judgments", judg, "--output", str(tmp_path / "o"), "--quiet"]
    cases = [(["--map", "grade=rel"], "no column for the required field(s) event_id"),
             (["--map", "colour=c"], "--map: unknown field(s) colour"),
             (["--map", MAP, "--judgments-map", JUDG_MAP], "holds integers; give --timestamp-unit"),
             (["--map", MAP, "--judgments-map", JUDG_MAP, "--timestamp-unit", "s", "--engine", "records"],
              "--engine records reads Avro only")]
    for extra, message in cases:
        assert batch.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_parquet_on_s3_equals_the_local_run(both, logs, s3_server, tmp_path, monkeypatch, capsys):
    """Remote files go through Beam's FileSystems (moto's S3 server): the same metric rows and dead
    letters (named by their s3:// paths); an object gone after matching fails the job (exit 1)."""
    prefix = s3_server.prefix("parquet_in")
    urls = {p: s3_server.upload(p, f"{prefix}in/{p.name}") for p in [*logs["imp"], logs["judg"]]}
    args = ("--map", MAP, "--judgments-map", JUDG_MAP, "--attributes", "region", "--timestamp-unit", "s",
            *s3_server.beam_args)
    code, _, rows, dead = _job(tmp_path / "o", [urls[p] for p in logs["imp"]], urls[logs["judg"]], *args)
    (_, _, rows_local, dead_local) = both[1]
    assert code == 0 and _canon(rows) == _canon(rows_local)
    local_names = {str(p): u for p, u in urls.items()}

    def renamed(x):
        path, _, row = x["source"].rpartition(":row ")
        return dict(x, source=f"{local_names[path]}:row {row}") if path in local_names else x

    assert _canon(dead) == _canon([renamed(x) for x in dead_local])
    gone = s3_server.url(f"{prefix}in/gone.parquet")
    expand = batch.expand_inputs
    monkeypatch.setattr(batch, "expand_inputs",
                        lambda pats: [*expand(pats), gone] if any("imp_" in p for p in pats) else expand(pats))
    capsys.readouterr()
    code, _, _, _ = _job(tmp_path / "o2", [urls[logs["imp"][0]]], urls[logs["judg"]], *args)
    assert code == 1
    assert f"cannot read input file {gone}" in capsys.readouterr().err


def test_err_max_grade_auto_reads_parquet_judgments_mapped_grade_column(tmp_path):
    """``--err-max-grade auto`` on Parquet judgments: the largest grade of the mapped grade column
    (within --grades), not 1 because fastavro cannot read the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from streameval.beam.arguments import max_judgment_grade
    from streameval.beam.table_inputs import TableOptions

    path = tmp_path / "j.parquet"
    pq.write_table(pa.table({"qid": ["q1"] * 4, "doc": ["a", "b", "c", "d"], "rel": [0, 2, 5, 1]}), path)
    table = TableOptions({"grade": "rel"}, None, ())
    assert max_judgment_grade([str(path)], None, table) == 5
    assert max_judgment_grade([str(path)], (0, 3), table) == 2
