"""DataFusion's Avro decoding (streameval.io.arrow_avro) against fastavro's (streameval.io.avro).

Reference: fastavro through :func:`streameval.io.avro.read_blocks` and the columns
:func:`streameval.beam.columnar.impression_columns` builds from its dicts. The fast path must give
the same records, and for files it does not take (other writer schema, damage, a failure of
DataFusion) the same records and the same errors as fastavro alone.
"""

from __future__ import annotations

import json

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from streameval.beam import columnar, columnar_columns
from streameval.io import arrow_avro, avro

pytestmark = pytest.mark.skipif(not arrow_avro.available(), reason="datafusion not installed")


@pytest.fixture
def small_batches(monkeypatch):
    """DataFusion batches of 4,000 rows (65,536 in the job), so that small files come in several."""
    import datafusion

    config = datafusion.SessionConfig().with_batch_size(4_000).with_target_partitions(1)
    monkeypatch.setattr(arrow_avro, "_context", datafusion.SessionContext(config))


def _impressions(n: int, seed: int = 0) -> list[dict]:
    rnd = np.random.default_rng(seed)
    out = []
    for i in range(n):
        attrs = {}
        if rnd.random() < 0.7:
            attrs["device"] = str(rnd.choice(["pc", "sp", "ñ"]))
        if rnd.random() < 0.3:
            attrs["campaign"] = "c\x00" if rnd.random() < 0.1 else "c1"
        out.append({"event_id": f"e{i}", "request_id": f"r{i // 7}", "query_id": f"q{i % 13}",
                    "user_id": None if rnd.random() < 0.3 else f"u{i % 5}", "system_id": "AB"[i % 2],
                    "item_id": f"d{i % 31}", "position": int(i % 7) + (0 if rnd.random() < 0.02 else 1),
                    "score": (None if rnd.random() < 0.1 else float("nan") if rnd.random() < 0.02
                              else float(rnd.normal())),
                    "clicked": None if rnd.random() < 0.2 else bool(rnd.random() < 0.3),
                    "timestamp": 1_600_000_000_000_000 + i * 1_000_003,
                    "propensity": None if rnd.random() < 0.5 else float(rnd.choice([0.5, 1.0, 0.0])),
                    "attributes": attrs})
    return out


def _flatten(parts) -> list:
    """Records of read_tables' output: Arrow tables through the columnar conversion, lists as they are."""
    out = []
    for part in parts:
        if isinstance(part, list):
            out += [("list", r) for r in part]
            continue
        chunk, score_null, prop_null = columnar.impression_columns_arrow(part)
        for i, r in enumerate(columnar.columns_records(chunk, range(chunk["n"]))):
            for f, null in (("score", score_null), ("propensity", prop_null)):
                if not null[i]:
                    r[f] = float(chunk[f][i])
            out.append(("table", r))
    return out


def _same(a: list, b: list) -> bool:
    return [json.dumps(r, sort_keys=True, default=str) for r in a] == \
        [json.dumps(r, sort_keys=True, default=str) for r in b]


def test_tables_give_fastavros_records(tmp_path, small_batches):
    recs = _impressions(30_000)
    p = tmp_path / "imps.avro"
    avro.write_records(p, "impression", recs, sync_interval=20_000)
    parts = list(arrow_avro.read_tables(p, "impression", rows=5_000))
    assert all(isinstance(x, pa.Table) for x in parts) and len(parts) > 2  # the fast path, cut in pieces
    got = [r for _, r in _flatten(parts)]
    want = [r for block in avro.read_blocks(p, "impression") for r in block]
    assert len(got) == len(want) == 30_000
    assert _same(got, want)
    # the columns equal those built from fastavro's dicts
    table = pa.concat_tables(parts)
    a, score_null, _ = columnar.impression_columns_arrow(table)
    b = columnar.impression_columns(want)
    for k in b:
        if k == "attributes":
            assert sorted(a[k]) == sorted(b[k])
            for key in b[k]:
                assert a[k][key].tolist() == b[k][key].tolist()
        elif k != "n":
            np.testing.assert_array_equal(a[k], b[k])
    assert score_null.sum() == sum(r["score"] is None for r in want)


def test_judgment_tables(tmp_path):
    judg = [{"query_id": f"q{i % 7}", "item_id": f"d{i}", "grade": i % 5 - 1, "timestamp": i, "source": "s" * (i % 2),
             "subtopic": None if i % 3 else str(i % 4)} for i in range(1000)]
    p = tmp_path / "j.avro"
    avro.write_records(p, "judgment", judg)
    parts = list(arrow_avro.read_tables(p, "judgment"))
    assert isinstance(parts[0], pa.Table)
    chunk = columnar.judgment_columns_arrow(pa.concat_tables(parts))
    ref = columnar.judgment_columns(judg)
    for k in ("query_id", "item_id", "grade", "timestamp", "source", "subtopic"):
        assert chunk[k].tolist() == ref[k].tolist()
    assert chunk["subtopic"].null_count == sum(j["subtopic"] is None for j in judg)


def test_other_writer_schema_is_read_by_fastavro(tmp_path):
    """A file of an older schema (no propensity, no attributes) is resolved by fastavro, defaults filled."""
    schema = avro.load_schema_json("impression")
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in ("propensity", "attributes")]
    recs = [{k: v for k, v in r.items() if k not in ("propensity", "attributes")} for r in _impressions(50)]
    p = tmp_path / "old.avro"
    with open(p, "wb") as fo:
        fastavro.writer(fo, fastavro.parse_schema(schema), recs)
    parts = list(arrow_avro.read_tables(p, "impression"))
    assert parts and all(isinstance(x, list) for x in parts)
    assert _same([r for x in parts for r in x], [r for b in avro.read_blocks(p, "impression") for r in b])


def _errors(fn):
    got = []
    try:
        for part in fn():
            got.append(part)
    except avro.AvroInputError as e:
        return got, (e.records_read, e.reason)
    return got, None


def test_truncated_file_same_records_and_error(tmp_path):
    p = tmp_path / "imps.avro"
    avro.write_records(p, "impression", _impressions(20_000), sync_interval=16_000)
    data = p.read_bytes()
    cut = tmp_path / "cut.avro"
    cut.write_bytes(data[: len(data) * 2 // 3])
    fast, ferr = _errors(lambda: arrow_avro.read_tables(cut, "impression"))
    ref, rerr = _errors(lambda: avro.read_blocks(cut, "impression"))
    assert rerr is not None and ferr == rerr
    assert _same([r for _, r in _flatten(fast)], [r for b in ref for r in b])


class _FailingSession:
    """DataFusion's session, whose stream fails after ``after`` batches (a block it cannot decode)."""

    def __init__(self, real, after):
        self.real, self.after = real, after

    def read_avro(self, *a, **k):
        df = self.real.read_avro(*a, **k)
        after = self.after

        class _DF:
            def schema(self):
                return df.schema()

            def execute_stream(self):
                for i, batch in enumerate(df.execute_stream()):
                    if i == after:
                        raise RuntimeError("decoding failed")
                    yield batch
        return _DF()


@pytest.mark.parametrize("after", [0, 1, 3])
def test_datafusion_failing_mid_file_fastavro_goes_on_from_the_block_boundary(tmp_path, monkeypatch, small_batches,
                                                                                    after):
    recs = _impressions(40_000, seed=3)
    p = tmp_path / "imps.avro"
    avro.write_records(p, "impression", recs, sync_interval=30_000)
    real = arrow_avro._session()
    monkeypatch.setattr(arrow_avro, "_session", lambda: _FailingSession(real, after))
    # small batches so that several come before the failure
    parts = list(arrow_avro.read_tables(p, "impression", rows=1))
    kinds = [type(x).__name__ for x in parts]
    assert "list" in kinds and (after == 0) == ("Table" not in kinds)
    assert kinds == sorted(kinds, key=lambda k: k != "Table")  # tables first, then fastavro's blocks
    got = _flatten(parts)
    assert _same([r for _, r in got], [r for b in avro.read_blocks(p, "impression") for r in b])


def test_damage_only_fastavro_sees_after_the_fast_path_is_reported(tmp_path, monkeypatch, small_batches):
    """Records DataFusion gave out before fastavro finds damage in them: the error says so and counts them."""
    recs = _impressions(3_000, seed=4)
    p = tmp_path / "imps.avro"
    avro.write_records(p, "impression", recs, sync_interval=20_000)

    real = arrow_avro._tables

    def half(path, name, rows):
        gen = real(path, name, rows)
        first = next(gen)
        yield first
        raise arrow_avro._NoFastPath(first.num_rows)

    def damaged(path, name=None):
        raise avro.AvroInputError(str(path), "corrupt block 1 at byte 100: bad", 0)
        yield  # pragma: no cover

    monkeypatch.setattr(arrow_avro, "_tables", half)
    monkeypatch.setattr(avro, "read_blocks", damaged)
    got, err = _errors(lambda: arrow_avro.read_tables(p, "impression", rows=1))
    n = sum(x.num_rows for x in got)
    assert n > 0 and err is not None
    assert err[0] == n and "DataFusion had decoded" in err[1] and err[1].startswith("corrupt block 1")


def test_map_column_keeps_the_last_of_a_repeated_key():
    m = pa.array([[("a", "1"), ("b", "2"), ("a", "3")], [], [("b", "4")]], type=pa.map_(pa.string(), pa.string()))
    cols = columnar_columns._arrow_map_columns(m.slice(0, 3), 3)
    assert cols["a"].tolist() == ["3", None, None]
    assert cols["b"].tolist() == ["2", None, "4"]
    cols = columnar_columns._arrow_map_columns(m.slice(1, 2), 2)  # offsets not starting at 0
    assert cols == {"b": cols["b"]} and cols["b"].tolist() == [None, "4"]
