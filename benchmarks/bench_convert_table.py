"""``streameval convert table`` on 1 million impression rows in each input format.

    python benchmarks/bench_convert_table.py --rows 1000000 [--repeat 1]

Writes a synthetic impression log (10 rows per request, 9 mapped columns with their own names, one
attribute column, one ignored column) as Parquet, CSV and JSON lines, then times
:func:`streameval.io.convert_table.convert_table` on each, split into the part before the Avro
writer (reading, converting, screening with Arrow, building the record dicts) and the whole
conversion with :func:`streameval.io.avro.write_records` (fastavro, deflate); wall and CPU seconds
(the CPU time of the process says more on a machine other jobs load).

Target (issue 21 item 3): 1 M rows "in seconds"; the Avro writer's share is the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.csv as pcsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from streameval.io import convert_table as ct  # noqa: E402

MAPPING = "event_id=eid,request_id=rid,query_id=q,system_id=sys,item_id=doc,position=rank,timestamp=ts," \
          "clicked=clk,score=sc"


def write_inputs(n: int, d: str) -> dict:
    k = np.arange(n)
    rng = np.random.default_rng(0)
    t = pa.table({"eid": pa.array(np.char.add("e", k.astype(str))), "rid": pa.array(np.char.add("r", (k // 10).astype(str))),
                  "q": pa.array(np.char.add("q", (k // 10 % 500).astype(str))), "sys": pa.array(np.where(k % 2, "A", "B")),
                  "doc": pa.array(np.char.add("d", (k % 997).astype(str))), "rank": pa.array(k % 10 + 1),
                  "ts": pa.array(1_600_000_000_000 + k), "clk": pa.array(k % 7 == 0), "sc": pa.array(rng.random(n)),
                  "region": pa.array(np.where(k % 3, "eu", "us")), "junk": pa.array(k)})
    paths = {f: os.path.join(d, f"log.{f}") for f in ("parquet", "csv", "jsonl")}
    pq.write_table(t, paths["parquet"])
    pcsv.write_csv(t, paths["csv"])
    with open(paths["jsonl"], "w") as f:
        for b in t.to_batches(100_000):
            f.writelines(json.dumps(r) + "\n" for r in b.to_pylist())
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    m = ct.parse_mapping(MAPPING)
    with tempfile.TemporaryDirectory() as d:
        paths = write_inputs(args.rows, d)
        out = os.path.join(d, "out.avro")
        print(f"{'format':<8} {'rows':>9} {'before Avro s':>14} {'total s':>8} {'rows/s':>10} {'CPU before s':>12} {'CPU total s':>11}  (load {os.getloadavg()[0]:.1f})")
        for fmt, path in paths.items():
            before = total = cpu_before = cpu_total = float("inf")
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                with mock.patch.object(ct, "write_records", lambda o, name, it: sum(1 for _ in it)):
                    ct.convert_table(path, "impressions", out, m, timestamp_unit="ms", attributes=["region"])
                before, cpu_before = min(before, time.perf_counter() - t0), min(cpu_before, time.process_time() - c0)
                t0, c0 = time.perf_counter(), time.process_time()
                res = ct.convert_table(path, "impressions", out, m, timestamp_unit="ms", attributes=["region"])
                total, cpu_total = min(total, time.perf_counter() - t0), min(cpu_total, time.process_time() - c0)
                assert res.written == args.rows and not res.dead_letters
            print(f"{fmt:<8} {args.rows:>9} {before:>14.1f} {total:>8.1f} {args.rows / total:>10,.0f} "
                  f"{cpu_before:>12.1f} {cpu_total:>11.1f}")


if __name__ == "__main__":
    main()
