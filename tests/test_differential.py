"""Differential test: random and boundary records through both batch engines and the streaming job.

Issue 20, item 1. The reference is the per-record engine (``--engine records``: one Beam element per
record, the record rules of :mod:`streameval.io.records` and :mod:`streameval.io.cleaning` applied
one record at a time), itself checked against ``evaluate()``, trec_eval and hand calculations
elsewhere. The columnar engine and the streaming job (``--replay``, final panes) must give the same
metric rows, the same dead letters and late records (source, reason, raw record) and the same record
accounting on logs where a random share of the records carries a boundary value in one field: every
Avro int and long limit and the values just past them, NaN, infinities, subnormals, negative zero,
empty strings, NUL, 1 MB strings, ids that look like slice labels, timestamps at and past the years a
job can window. The Avro files are written by fastavro without range checks, as any writer may.
"""

from __future__ import annotations

import json
import math
import os
import random

import pytest

from streameval.jobs import batch
from streameval.jobs import stream as stream_cli
from streameval.io import avro
from streameval.io.records import EVENT_TIME_MAX, EVENT_TIME_MIN

BASE_TS = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z
HOUR = 3_600_000_000
MB = "m" * (1 << 20)

STRINGS = ["", "\x00", "d1\x00", "\x00q1", MB, "é", " ", "(missing)", "men,device=phone", "a=b", "sys/1", "sys_1"]
INTS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**40, 2**63 - 1, -(2**63)]
LONGS = [0, -1, 1, EVENT_TIME_MIN, EVENT_TIME_MIN - 1, EVENT_TIME_MAX, EVENT_TIME_MAX + 1, 2**63 - 1, -(2**63),
         BASE_TS + HOUR - 1, BASE_TS + HOUR, BASE_TS + 2 * HOUR + 7]
DOUBLES = [math.nan, math.inf, -math.inf, 5e-324, -5e-324, -0.0, 0.0, 1.7976931348623157e308,
           2.2250738585072014e-308, 1.0, 1.0 + 2**-52, 0.5, -1.0]
IMP_FIELDS = {"event_id": STRINGS, "request_id": STRINGS, "query_id": STRINGS, "system_id": STRINGS,
              "item_id": STRINGS, "user_id": STRINGS + [None], "position": INTS, "score": DOUBLES + [None],
              "clicked": [None, True, False], "timestamp": LONGS, "propensity": DOUBLES + [None],
              "attributes": [{"device": s} for s in STRINGS] + [{s: "x"} for s in STRINGS] + [{}]}
# a judgment is an event of the stream: one made after a window closed is a notice there, not applied to
# it (documented), where the batch job applies every judgment; the judgments are made before the logs
JUDG_TIMES = [EVENT_TIME_MIN, EVENT_TIME_MIN - 1, EVENT_TIME_MAX + 1, 2**63 - 1, -(2**63)]
JUDG_FIELDS = {"query_id": STRINGS, "item_id": STRINGS, "grade": INTS, "timestamp": JUDG_TIMES, "source": STRINGS}


def _logs(seed: int):
    """(impression files, judgments): clean requests over 3 h and 3 systems, then boundary values."""
    rnd = random.Random(seed)
    queries = [f"q{i}" for i in range(8)]
    judg = [{"query_id": q, "item_id": f"d{i}", "grade": rnd.randint(0, 3), "timestamp": EVENT_TIME_MIN, "source": "t"}
            for q in queries[:-1] for i in rnd.sample(range(12), 7)]
    imps = []
    for r in range(60):
        req, q, sys_ = f"r{r}", rnd.choice(queries), rnd.choice(["A", "B", "C"])
        attrs = {"device": rnd.choice(["pc", "sp"])} if rnd.random() < 0.8 else {}
        ts0 = BASE_TS + rnd.randint(0, 3 * HOUR)
        for pos, item in enumerate(rnd.sample(range(12), rnd.randint(1, 7)), 1):
            imps.append({"event_id": f"{req}/{pos}", "request_id": req, "query_id": q,
                         "user_id": rnd.choice([None, "u1"]), "system_id": sys_, "item_id": f"d{item}",
                         "position": pos, "score": float(rnd.randint(0, 6)) / 2,
                         "clicked": None if rnd.random() < 0.1 else rnd.random() < 0.3,
                         "timestamp": ts0 + pos, "propensity": rnd.choice([None, 0.5, 1.0]),
                         "attributes": dict(attrs)})
    # boundary values: copies with a new event id (a new impression of the same request), copies with
    # the same event id (a conflict with the original), and records changed in place
    extra = []
    for k in range(70):
        src = rnd.choice(imps)
        field = rnd.choice(list(IMP_FIELDS))
        value = rnd.choice(IMP_FIELDS[field])
        how = rnd.random()
        if how < 0.5:
            rec = dict(src, event_id=f"x{k}", item_id=f"d{rnd.randint(12, 20)}", position=src["position"] + 30)
            rec[field] = value
            extra.append(rec)
        elif how < 0.7:
            extra.append(dict(src, **{field: value}))
        else:
            src[field] = value
    extra += [dict(x) for x in rnd.sample(imps, 8)]  # replays
    for k in range(30):
        src = dict(rnd.choice(judg))
        field = rnd.choice(list(JUDG_FIELDS))
        src[field] = rnd.choice(JUDG_FIELDS[field])
        if rnd.random() < 0.5:
            src["item_id"] = f"d{rnd.randint(12, 20)}"
        judg.append(src)
    rest = imps + extra
    rnd.shuffle(rest)
    cut = len(rest) // 2
    return [rest[:cut], rest[cut:]], judg


def _write(d, imp_files, judg):
    args = []
    for i, recs in enumerate(imp_files):
        p = d / f"imps-{i}.avro"
        avro.write_records(p, "impression", recs)
        args += ["--impressions", str(p)]
    avro.write_records(d / "judg.avro", "judgment", judg)
    return args + ["--judgments", str(d / "judg.avro")]


def _row(r):
    return (r["window_start"], r["window_end"], r["slice"], r["system"], r["metric"], r["value"], r["num_queries"],
            r["stderr"], r["ci_low"], r["ci_high"], r["ci_method"])


def _letter(x):
    """A dead letter or late record as compared: the raw record of a judgment conflict left out (the
    per-record engine keeps the first copy to arrive, the columnar one the smallest)."""
    raw = None if x["reason"].startswith("conflicting judgments") else x["raw"]
    return (x["source"], x["reason"], raw)


def _lines(files):
    return [json.loads(line) for f in files for line in open(f)]


def _same_rows(a, b):
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        same = x == y or all(p == q or (isinstance(p, float) and math.isnan(p) and math.isnan(q))
                             for p, q in zip(x, y))
        assert same, (x, y)


OPTIONS = [["--window", "1h", "--slices", "device"],
           ["--window", "1h", "--allowed-lateness", "30m", "--relevance-level", "2"],
           ["--window", "2h", "--allowed-lateness", "1h", "--slices", "device", "--judgment-conflicts", "max"],
           ["--window", "30m", "--slices", "device", "--gain", "exponential", "--metrics", "ndcg@5,err@3,map"]]


def _seeds():
    """Two seeds in CI; ``STREAMEVAL_DIFF_SEEDS=3-60`` runs more (each with the options of its seed
    modulo 4): 60 seeds found the disagreements fixed with this test."""
    lo, _, hi = os.environ.get("STREAMEVAL_DIFF_SEEDS", "1-2").partition("-")
    return [(s, OPTIONS[s % len(OPTIONS)]) for s in range(int(lo), int(hi or lo) + 1)]


@pytest.mark.parametrize("seed,extra", _seeds())
def test_boundary_records_give_one_answer_on_both_engines_and_the_stream(tmp_path, seed, extra):
    imp_files, judg = _logs(seed)
    common = [*_write(tmp_path, imp_files, judg), "--metrics", "ndcg@5,map,P@3,recip_rank", "--quiet",
              "--max-rejected-fraction", "1", *extra]  # a later --metrics wins
    got = {}
    for engine in ("records", "columnar"):
        o = tmp_path / engine
        assert batch.main([*common, "--engine", engine, "--output", str(o)]) == 0, engine
        summary = json.loads((o / "summary.json").read_text())
        got[engine] = (sorted(map(_row, _lines([o / "metrics.jsonl"])), key=repr),
                       sorted(map(_letter, _lines([o / "dead_letters.jsonl"]))),
                       summary["accounting"])
    rows, letters, accounting = got["records"]
    assert rows and len(letters) > 40, "the reference scored nothing or rejected nothing"
    _same_rows(got["columnar"][0], rows)
    assert got["columnar"][1] == letters
    assert got["columnar"][2] == accounting
    reasons = {r.split(" (")[0].split(":")[0] for _, r, _ in letters}
    assert len(reasons) >= 6, reasons  # the boundary values did reach the rules

    # the stream remembers a final request for --retention (by default a window): the logs put pieces
    # of one request id 50 years apart (timestamps -1, 0, 1), so it remembers them for 10000 years
    so = tmp_path / "stream"
    assert stream_cli.main(["--replay", *common, "--retention", "3660000d", "--output", str(so)]) == 0
    finals = sorted((_row(r) for r in _lines(so.glob("metrics-*.jsonl")) if r["is_final"] and r["num_queries"] > 0),
                    key=repr)
    _same_rows([r for r in finals if "@pos" not in r[4]], [r for r in rows if "@pos" not in r[4]])
    stream_letters = sorted(map(_letter, _lines([*so.glob("dead_letters-*.jsonl"), *so.glob("late_data-*.jsonl")])))
    assert stream_letters == letters
    assert json.loads((so / "summary.json").read_text())["accounting"] == accounting
