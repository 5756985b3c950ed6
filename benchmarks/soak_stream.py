"""Soak test of the streaming job's record accounting: every event ends in exactly one place.

    python benchmarks/soak_stream.py                      # 1,000,000 events
    python benchmarks/soak_stream.py --events 20000

Streams N synthetic events (impressions in requests of 10, click events, judgments) through
``StreamMetrics`` on the local streaming runner (``BundleBasedDirectRunner``, a TestStream replay
played in chunks: each chunk is generated when it plays, so the driver never holds the log), with

* 5% malformed records (a mix of missing fields, NaN scores, position 0 and wrong types, among
  impressions, click events and judgments),
* 2% duplicates (at-least-once replays of good impressions, click events and judgments, in the
  same chunk as the original or in the next one),
* 3% late events (impressions of new requests and click events in windows that closed more than
  the allowed lateness ago),

then checks that

1. the accounting adds up exactly: for each kind, read = accepted + rejected + duplicates + late,
   and each figure equals what the generator injected (rejections per reason category);
2. the final pane of every window equals the batch computation (``ScoreRankings`` and
   ``ClickMetrics`` on ``FnApiRunner``) on the clean subset, bit for bit.

It prints the figures, the times and ``OK`` or the differences (exit status 1).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MIN = 60_000_000
DAY = 24 * 60 * MIN
BASE = 1_700_000_000_000_000 - 1_700_000_000_000_000 % DAY
STEP = 5 * MIN  # event time per chunk (one replay step)
PER_REQUEST = 10
WINDOW, LATENESS, DELAY = "10m", "5m", "5m"
METRICS = ["ndcg@10", "map", "mrr@10", "P@10"]
SLICES = ["device"]
MALFORMED, DUPLICATES, LATE = 0.05, 0.02, 0.03
LATE_FROM = 6  # late events from this chunk on, in the windows of the chunk this many steps back
CLICK_EVENTS = 0.5  # share of clicks delivered as click events (the rest on the impression)

#: impression defects and the reason category each must be rejected with
IMPRESSION_DEFECTS = {
    "missing": "missing required field 'item_id'",
    "nan_score": "score is not finite",
    "position_0": "position must be >= 1 (1-based)",
    "wrong_type": "position must be an integer",
}
CLICK_DEFECTS = {"missing": "item_id must be a non-empty string",
                 "wrong_type": "timestamp must be integer microseconds since the epoch"}
JUDGMENT_DEFECTS = {"wrong_type": "grade must be an integer", "missing": "missing required field 'grade'"}


class Plan:
    """The shape of the synthetic stream for about ``events`` events."""

    def __init__(self, events: int, per_step: int = 2000, seed: int = 0):
        self.seed = seed
        self.per_step = per_step
        self.n_queries = max(20, min(200, events // 5000))
        self.judged_queries = int(self.n_queries * 0.9)  # the rest have no judgment (unjudged requests)
        # good events per chunk: per_step impressions, about 2.5% click events; judgments in chunk 0
        good_per_chunk = per_step * (1 + 0.05 * CLICK_EVENTS)
        self.chunks = max(LATE_FROM + 2, round((events * (1 - MALFORMED - DUPLICATES - LATE) - self.n_judgments)
                                               / good_per_chunk))

    @property
    def n_judgments(self) -> int:
        return self.judged_queries * 20


def _judgments(plan: Plan) -> list:
    rnd = random.Random(plan.seed * 7919 + 7)
    out = []
    for q in range(plan.judged_queries):
        for d in rnd.sample(range(60), 20):
            out.append({"query_id": f"q{q}", "item_id": f"d{d}", "grade": rnd.randint(0, 3), "timestamp": 0,
                        "source": "soak"})
    return out


def _requests(rnd, plan, k, t0, t1, prefix, n):
    """``n`` requests of PER_REQUEST impressions with times in [t0, t1): (impressions, clicks
    as events); each clicked impression's click is on the impression or, for about half,
    a separate click event (the impression then says clicked=False)."""
    imps, clicks, original = [], [], []
    for r in range(n):
        rid = f"{prefix}{k}-{r}"
        q = rnd.randrange(plan.n_queries)
        system = "A" if r % 2 else "B"
        ts = t0 + rnd.randrange(max(1, t1 - t0 - 1000))
        device = "pc" if rnd.random() < 0.6 else "mobile"
        for pos, d in enumerate(rnd.sample(range(60), PER_REQUEST), 1):
            clicked = rnd.random() < 0.05
            rec = {"event_id": f"{rid}/{pos}", "request_id": rid, "query_id": f"q{q}", "user_id": f"u{r % 997}",
                   "system_id": system, "item_id": f"d{d}", "position": pos, "score": rnd.random(),
                   "clicked": clicked, "timestamp": ts + pos, "propensity": None, "attributes": {"device": device}}
            original.append(rec)
            if clicked and rnd.random() < CLICK_EVENTS:
                clicks.append({"request_id": rid, "item_id": rec["item_id"], "system_id": system,
                               "timestamp": rec["timestamp"] + rnd.randrange(3 * MIN),
                               **({"event_id": f"c/{rid}/{pos}"} if rnd.random() < 0.5 else {})})
                rec = dict(rec, clicked=False)
            imps.append(rec)
    return imps, clicks, original


def _malformed_impression(rnd, rec, defect):
    bad = dict(rec, event_id=rec["event_id"] + "/bad")
    if defect == "missing":
        del bad["item_id"]
    elif defect == "nan_score":
        bad["score"] = math.nan
    elif defect == "position_0":
        bad["position"] = 0
    else:
        bad["position"] = str(rec["position"])
    return bad


@functools.lru_cache(maxsize=4)
def _good(plan_key, k):
    """The good events of chunk k: (stream impressions, click events, clean impressions)."""
    plan = _PLANS[plan_key]
    rnd = random.Random(plan.seed * 1_000_003 + k)
    t0 = BASE + k * STEP
    return _requests(rnd, plan, k, t0, t0 + STEP, "r", plan.per_step // PER_REQUEST)


_PLANS: dict = {}


def chunk(plan: Plan, k: int) -> dict:
    """Everything chunk k delivers, by kind, and what the generator injected (``injected``:
    ``{kind: {"good", "malformed": {category: n}, "duplicates", "late"}}``)."""
    key = id(plan)
    _PLANS[key] = plan
    imps, clicks, _ = _good(key, k)
    imps, clicks = list(imps), list(clicks)
    judg = _judgments(plan) if k == 0 else []
    rnd = random.Random(plan.seed * 999_983 + k + 17)
    inj = {kind: {"good": 0, "malformed": {}, "duplicates": 0, "late": 0} for kind in ("impression", "click",
                                                                                        "judgment")}
    inj["impression"]["good"], inj["click"]["good"], inj["judgment"]["good"] = len(imps), len(clicks), len(judg)
    total = (len(imps) + len(clicks) + len(judg)) / (1 - MALFORMED - DUPLICATES - LATE)
    # (late events need closed windows: none in the first LATE_FROM chunks, more in the others)
    late_share = LATE * plan.chunks / max(1, plan.chunks - LATE_FROM)
    n_bad, n_dup, n_late = round(total * MALFORMED), round(total * DUPLICATES), round(total * late_share)
    out_i, out_c, out_j = [], [], []

    def bump(kind, field, cat=None, n=1):
        if cat is None:
            inj[kind][field] += n
        else:
            inj[kind][field][cat] = inj[kind][field].get(cat, 0) + n

    # malformed: mostly impressions, some click events and (in chunk 0) judgments
    for i in range(n_bad):
        which = rnd.random()
        if which < 0.1 and clicks:
            defect = rnd.choice(sorted(CLICK_DEFECTS))
            bad = dict(rnd.choice(clicks), event_id=f"badclick/{k}/{i}")
            if defect == "missing":
                del bad["item_id"]
            else:
                bad["timestamp"] = str(bad["timestamp"])
            out_c.append(bad)
            bump("click", "malformed", CLICK_DEFECTS[defect])
        elif which < 0.2 and judg:
            defect = rnd.choice(sorted(JUDGMENT_DEFECTS))
            bad = dict(rnd.choice(judg))
            if defect == "missing":
                del bad["grade"]
            else:
                bad["grade"] = str(bad["grade"])
            out_j.append(bad)
            bump("judgment", "malformed", JUDGMENT_DEFECTS[defect])
        else:
            defect = rnd.choice(sorted(IMPRESSION_DEFECTS))
            out_i.append(_malformed_impression(rnd, rnd.choice(imps), defect))
            bump("impression", "malformed", IMPRESSION_DEFECTS[defect])
    # duplicates: replays of good events of this chunk or the previous one (its windows are open)
    prev_i, prev_c, _ = _good(key, k - 1) if k > 0 else ([], [], None)
    for i in range(n_dup):
        which = rnd.random()
        if which < 0.05 and judg:
            out_j.append(dict(rnd.choice(judg)))
            bump("judgment", "duplicates")
        elif which < 0.15 and (clicks or prev_c):
            out_c.append(dict(rnd.choice(clicks if clicks and (not prev_c or rnd.random() < 0.5) else prev_c)))
            bump("click", "duplicates")
        else:
            out_i.append(dict(rnd.choice(imps if not prev_i or rnd.random() < 0.5 else prev_i)))
            bump("impression", "duplicates")
    # late: new requests (and click events on them) in windows long closed; none in the first
    # chunks (no window has closed yet)
    if k >= LATE_FROM:
        lt0 = BASE + (k - LATE_FROM) * STEP
        late_i, late_c, _ = _requests(rnd, plan, k, lt0, lt0 + STEP, "late", n_late // PER_REQUEST + 1)
        late_events = late_i[: n_late - min(len(late_c), n_late // 20)] + late_c[: n_late // 20]
        for ev in late_events:
            if "event_id" in ev and ev.get("position") is not None:
                out_i.append(ev)
                bump("impression", "late")
            else:
                out_c.append(ev)
                bump("click", "late")
    stream = {"judgments": judg + out_j, "impressions": imps + out_i, "clicks": clicks + out_c}
    for recs in stream.values():
        rnd.shuffle(recs)
    return {"stream": stream, "injected": inj}


def clean_records(plan: Plan, k: int) -> list:
    """The clean impressions of chunk k (clicks from the click events folded in): what batch sees."""
    _PLANS[id(plan)] = plan
    return _good(id(plan), k)[2]


def expected_counts(plan: Plan) -> dict:
    """The injected figures summed over the chunks: ``{kind: {"good", "malformed", "duplicates", "late"}}``."""
    tot = {kind: {"good": 0, "malformed": {}, "duplicates": 0, "late": 0} for kind in ("impression", "click",
                                                                                        "judgment")}
    for k in range(plan.chunks):
        for kind, inj in chunk(plan, k)["injected"].items():
            for f in ("good", "duplicates", "late"):
                tot[kind][f] += inj[f]
            for cat, n in inj["malformed"].items():
                tot[kind]["malformed"][cat] = tot[kind]["malformed"].get(cat, 0) + n
    return tot


# --------------------------------------------------------------------------------------------
# running

_ROWS: list = []


def _keep_row(row):
    _ROWS.append(row)


def run_stream(plan: Plan):
    """Replays the plan through StreamMetrics: (rows, StreamMetrics transform, wall seconds)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

    from streameval.beam.streaming import Replay, StreamMetrics

    steps = []
    for k in range(plan.chunks):
        steps += [("chunk", (BASE + k * STEP, k)), ("watermark", BASE + (k + 1) * STEP)]

    def load(desc):
        c = chunk(plan, desc[1])["stream"]
        return [(kind, c[kind]) for kind in ("judgments", "impressions", "clicks")]

    me = sys.modules[__name__]  # by reference: the local runner shares this module's list
    me._ROWS.clear()
    opts = PipelineOptions([])
    opts.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(runner=BundleBasedDirectRunner(), options=opts)
    src = p | Replay(steps, loader=load)
    sm = StreamMetrics(src["judgments"], METRICS, window=WINDOW, slices=SLICES, clicks=src["clicks"],
                       allowed_lateness=LATENESS, attribution_delay=DELAY, request_shards=16)
    src["impressions"] | sm | beam.Map(me._keep_row)
    t0 = time.perf_counter()
    p.run().wait_until_finish()
    return list(me._ROWS), sm, time.perf_counter() - t0


def run_batch(plan: Plan):
    """The batch job's transforms (FnApiRunner) on the clean subset: (rows, wall seconds)."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from streameval.jobs.batch import ReadAvro
    from streameval.beam.transforms import ClickMetrics, ScoreRankings
    from streameval.io import avro

    tmp = tempfile.mkdtemp(prefix="streameval-soak-")
    paths = []
    per_file = 50
    for f in range(0, plan.chunks, per_file):
        path = os.path.join(tmp, f"clean-{f:05d}.avro")
        avro.write_records(path, "impression", (r for k in range(f, min(plan.chunks, f + per_file))
                                                for r in clean_records(plan, k)))
        paths.append(path)
    jpath = os.path.join(tmp, "judgments.avro")
    avro.write_records(jpath, "judgment", _judgments(plan))
    me = sys.modules[__name__]
    me._ROWS.clear()
    t0 = time.perf_counter()
    p = beam.Pipeline(runner=FnApiRunner())
    imps = p | "I" >> ReadAvro(paths, "impression")
    judg = p | "J" >> ReadAvro([jpath], "judgment")
    ranked = imps | ScoreRankings(judg, METRICS, window=WINDOW, slices=SLICES)
    clicked = imps | ClickMetrics(window=WINDOW, slices=SLICES)
    (ranked, clicked) | beam.Flatten() | beam.Map(me._keep_row)
    p.run().wait_until_finish()
    return list(me._ROWS), time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# checks

def _bits(x):
    return None if x is None else struct.pack("<d", x)


def compare_final(stream_rows, batch_rows) -> list[str]:
    """Differences between the final panes and the batch rows (value, n, stderr to the bit)."""
    final = {}
    for r in stream_rows:
        if r["is_final"]:
            k = (r["window_start"], r["slice"], r["system"], r["metric"])
            if k in final:
                return [f"two final panes for {k}"]
            final[k] = r
    present = {k: r for k, r in final.items() if r["num_queries"] > 0}
    batch = {(r["window_start"], r["slice"], r["system"], r["metric"]): r for r in batch_rows}
    out = []
    if set(present) != set(batch):
        diff = sorted(set(present) ^ set(batch), key=str)
        out.append(f"{len(diff)} rows in only one of stream and batch, e.g. {diff[:3]}")
    for k in sorted(set(present) & set(batch), key=str):
        f, b = present[k], batch[k]
        if (_bits(f["value"]), f["num_queries"], _bits(f["stderr"])) != (_bits(b["value"]), b["num_queries"],
                                                                         _bits(b["stderr"])):
            out.append(f"{k}: stream {f['value']!r} n={f['num_queries']} se={f['stderr']!r}, batch {b['value']!r} "
                       f"n={b['num_queries']} se={b['stderr']!r}")
            if len(out) > 5:
                break
    return out


def check_accounting(counts: dict, summary: dict, problems: list, expected: dict, plan: Plan) -> list[str]:
    """The accounting's identities hold and each figure equals what the generator injected."""
    out = list(problems)
    for kind, exp in expected.items():
        e = summary.get(kind)
        if e is None:
            out.append(f"{kind}s: missing from the accounting")
            continue
        n_bad = sum(exp["malformed"].values())
        want_read = exp["good"] + n_bad + exp["duplicates"] + exp["late"]
        got = {"read": e["read"], "accepted": e["accepted"], "duplicates": e["duplicates"], "late": e["late"],
               "superseded": e["superseded"], "rejected": e["rejected"]}
        want = {"read": want_read, "accepted": exp["good"], "duplicates": exp["duplicates"], "late": exp["late"],
                "superseded": 0, "rejected": dict(sorted(exp["malformed"].items()))}
        if got != want:
            out.append(f"{kind}s: counted {got}, injected {want}")
        parts = e["accepted"] + sum(e["rejected"].values()) + e["duplicates"] + e["late"]
        if e["read"] != parts:
            out.append(f"{kind}s: read {e['read']} != accepted + rejected + duplicates + late = {parts}")
    imp = summary.get("impression", {})
    if imp.get("unrankable", 0) or imp.get("ranked", 0) + imp.get("unjudged", 0) != imp.get("accepted"):
        out.append(f"impressions: ranked {imp.get('ranked')} + unjudged {imp.get('unjudged')} + unrankable "
                   f"{imp.get('unrankable')} != accepted {imp.get('accepted')}")
    if imp.get("click_impressions") != imp.get("accepted"):
        out.append(f"impressions: counted in CTR {imp.get('click_impressions')} != accepted {imp.get('accepted')}")
    return out


def soak(events: int, per_step: int = 2000, seed: int = 0, quiet: bool = False) -> dict:
    """Runs the stream and the batch reference and checks them; returns the figures and problems."""
    plan = Plan(events, per_step, seed)
    expected = expected_counts(plan)
    n_events = sum(e["good"] + sum(e["malformed"].values()) + e["duplicates"] + e["late"] for e in expected.values())
    rows, sm, stream_s = run_stream(plan)
    counts = sm.counts()
    summary, problems = sm.accounting()
    batch_rows, batch_s = run_batch(plan)
    problems = check_accounting(counts, summary, problems, expected, plan)
    diffs = compare_final(rows, batch_rows)
    n_imps = summary.get("impression", {}).get("read", 0)
    return {"events": n_events, "chunks": plan.chunks, "expected": expected, "summary": summary,
            "stream_seconds": stream_s, "batch_seconds": batch_s, "impressions_per_second": n_imps / stream_s,
            "events_per_second": n_events / stream_s, "rows": len(rows),
            "final_rows": sum(bool(r["is_final"]) for r in rows), "batch_rows": len(batch_rows),
            "windows": len({r["window_start"] for r in rows}), "problems": problems, "pane_differences": diffs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="about this many events (default 1,000,000)")
    ap.add_argument("--per-step", type=int, default=2000, help="good impressions per 5-minute replay step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from streameval.beam.accounting import format_accounting

    res = soak(args.events, args.per_step, args.seed)
    exp = res["expected"]
    print(f"streamed {res['events']:,d} events in {res['chunks']} steps of 5 minutes ({res['windows']} windows of "
          f"{WINDOW}, allowed lateness {LATENESS}): {res['stream_seconds']:.1f} s, "
          f"{res['events_per_second']:,.0f} events/s ({res['impressions_per_second']:,.0f} impressions/s)")
    for kind, e in exp.items():
        print(f"  injected {kind}s: {e['good']:,d} good, {sum(e['malformed'].values()):,d} malformed "
              f"{dict(sorted(e['malformed'].items()))}, {e['duplicates']:,d} duplicates, {e['late']:,d} late")
    print(format_accounting(res["summary"]))
    print(f"metric rows: {res['rows']:,d} ({res['final_rows']:,d} final); batch reference on the clean subset: "
          f"{res['batch_rows']:,d} rows in {res['batch_seconds']:.1f} s (FnApiRunner)")
    bad = res["problems"] + res["pane_differences"]
    for line in bad:
        print("PROBLEM:", line)
    print("OK: the accounting adds up to the injected figures and every final pane equals batch on the clean "
          "subset, bit for bit" if not bad else f"FAILED: {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    # run as the module soak_stream (imported, not __main__), so the pipeline's steps refer to it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import soak_stream

    sys.exit(soak_stream.main())
