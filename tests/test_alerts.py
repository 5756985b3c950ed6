"""Alert rules (issue 18, item 3): a TOML rules file checked up front, rules that fire on intervals
only, alert records from the batch job, exit status 4.

References: hand-made rows whose intervals are worked out here (scipy's normal quantile for the
difference of two rows), and the rule evaluation run in this process on the job's own metric rows.
"""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats as sst

from streameval.jobs import batch
from streameval.plan import alerts
from streameval.io import avro, results

HOUR = 3_600_000_000


def row(ws, system, value, n, se, lo=None, hi=None, metric="ndcg@10", slice_="all"):
    return {"window_start": ws, "window_end": None if ws is None else ws + HOUR, "slice": slice_, "system": system,
            "metric": metric, "value": value, "num_queries": n, "stderr": se, "ci_low": lo, "ci_high": hi}


def rules(text, tmp_path):
    p = tmp_path / "rules.toml"
    p.write_text(text)
    return alerts.load_rules(str(p))


def test_a_threshold_fires_on_the_interval_never_on_the_value_alone(tmp_path):
    rs = rules('[[rule]]\nname = "low"\nmetric = "ndcg@10"\nbelow = 0.5\nmin_n = 10\n', tmp_path)
    got = alerts.evaluate(rs, [
        row(0, "A", 0.40, 50, 0.02, 0.36, 0.44),   # interval below 0.5: fires
        row(HOUR, "A", 0.45, 50, 0.05, 0.35, 0.55),  # value below, interval not: no alert
        row(2 * HOUR, "A", 0.40, 5, 0.02, 0.36, 0.44),  # n below min_n
        row(3 * HOUR, "A", 0.40, 1, None),  # no interval
        row(0, "A", 0.1, 50, 0.01, 0.08, 0.12, metric="map"),  # another metric
    ])
    assert [(a["window_start"], a["baseline"], a["baseline_of"]) for a in got] == [(0, 0.5, "threshold")]
    assert got[0]["condition"] == "interval 0.36 .. 0.44 below 0.5"
    above = rules('[[rule]]\nname = "high"\nmetric = "ctr"\nabove = 0.1\nslice = "device=pc"\n', tmp_path)
    got = alerts.evaluate(above, [row(0, "A", 0.2, 100, 0.04, 0.12, 0.28, metric="ctr", slice_="device=pc"),
                                  row(0, "A", 0.2, 100, 0.04, 0.12, 0.28, metric="ctr", slice_="all")])
    assert [a["slice"] for a in got] == ["device=pc"]


def test_changes_against_another_system_and_the_trailing_windows(tmp_path):
    z = sst.norm.ppf(0.975)
    rs = rules('[[rule]]\nname = "vs-prod"\nmetric = "ndcg@10"\nbaseline = "system:prod"\nchange_below = 0.0\n'
               '[[rule]]\nname = "trend"\nmetric = "ndcg@10"\nsystem = "prod"\nbaseline = "trailing:2"\n'
               'change_above = 0.01\n', tmp_path)
    rows = [row(0, "prod", 0.50, 100, 0.010), row(0, "new", 0.45, 100, 0.012),   # drop of 0.05: fires
            row(HOUR, "prod", 0.50, 100, 0.010), row(HOUR, "new", 0.49, 100, 0.012),  # within noise
            row(2 * HOUR, "prod", 0.60, 100, 0.010)]  # prod jumps against its own two previous windows
    got = {(a["rule"], a["window_start"]): a for a in alerts.evaluate(rs, rows)}
    assert set(got) == {("vs-prod", 0), ("trend", 2 * HOUR)}
    a = got[("vs-prod", 0)]
    half = z * math.sqrt(0.012 ** 2 + 0.010 ** 2)
    assert a["system"] == "new" and a["baseline"] == 0.5 and a["baseline_of"] == "system prod"
    assert a["diff_low"] == pytest.approx(-0.05 - half, abs=1e-12) and a["diff_high"] == pytest.approx(-0.05 + half, abs=1e-12)
    t = got[("trend", 2 * HOUR)]
    se_b = math.sqrt(2 * 0.010 ** 2) / 2
    assert t["baseline"] == pytest.approx(0.5) and t["baseline_of"] == "trailing 2 windows"
    assert t["diff_low"] == pytest.approx(0.1 - z * math.sqrt(0.010 ** 2 + se_b ** 2), abs=1e-12)
    # the first two windows of prod have no two earlier windows: no trailing baseline, no alert
    assert not [k for k in got if k[0] == "trend" and k[1] < 2 * HOUR]


@pytest.mark.parametrize("text,error", [
    ('[[rule]]\nmetric = "map"\nbelow = 1\n', "rule 1: name is required"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbelo = 1\n', "rule 1 ('x'): unknown key 'belo'"),
    ('[[rule]]\nname = "x"\nmetric = "map"\n', "rule 1 ('x'): no condition"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nchange_below = 0\n', "need a baseline"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "week:1"\nchange_below = 0\n', "baseline must be"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "system:p"\nbelow = 0\n', "takes change_below"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbelow = nan\n', "below must be a finite number"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "offset:1w"\nchange_below = 0\n', "'offset:Nd' / 'offset:Nh'"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "offset:0d"\nchange_below = 0\n', "baseline must be"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "offset:"\nchange_below = 0\n', "baseline must be"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "system:p"\nchange_below = 0\ntest = "sprt"\n',
     "test must be one of 'interval', 'msprt'"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "trailing:3"\nchange_below = 0\ntest = "msprt"\n',
     "test = 'msprt' needs baseline = 'system:NAME'"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "offset:1d"\nchange_below = 0\ntest = "msprt"\n',
     "test = 'msprt' needs baseline = 'system:NAME'"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "system:p"\nchange_below = 0\nchange_above = 1\n'
     'test = "msprt"\n', "takes one of change_below / change_above"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "system:p"\nchange_below = 0\ntau = 0.1\n', "tau is the mSPRT"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbaseline = "system:p"\nchange_below = 0\ntest = "msprt"\ntau = 0\n',
     "tau is the mSPRT"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbelow = 1\nmin_n = 0\n', "min_n must be a positive integer"),
    ('[[rule]]\nname = "x"\nmetric = "map"\nbelow = 1\n[[rule]]\nname = "x"\nmetric = "map"\nabove = 1\n',
     "rule 2 ('x'): the name is used by an earlier rule"),
    ('name = "x"\n', "only [[rule]] tables"),
    ("[[rule]\n", "not TOML"),
])
def test_a_bad_rules_file_is_one_line_naming_the_rule(tmp_path, text, error):
    with pytest.raises(ValueError) as e:
        rules(text, tmp_path)
    assert error in str(e.value) and "\n" not in str(e.value) and str(tmp_path / "rules.toml") in str(e.value)


def _logs():
    """Two systems over two hours; system B ranks the relevant items low and is clicked less."""
    imps, judg = [], []
    for q in range(30):
        judg += [{"query_id": f"q{q}", "item_id": f"d{i}", "grade": int(i < 2), "timestamp": 0, "source": ""}
                 for i in range(5)]
        for system in ("A", "B"):
            order = range(5) if system == "A" else range(4, -1, -1)
            req = f"{system}{q}"
            for pos, i in enumerate(order, 1):
                imps.append({"event_id": f"{req}/{i}", "request_id": req, "query_id": f"q{q}", "user_id": None,
                             "system_id": system, "item_id": f"d{i}", "position": pos, "score": float(10 - pos),
                             "clicked": (system == "A" and pos == 1 and q % 2 == 0) or (q % 7 == 0 and pos == 2),
                             "timestamp": (q % 2) * HOUR + q, "propensity": None, "attributes": {}})
    return imps, judg


def test_the_batch_job_writes_prints_and_exits_4_on_an_alert(tmp_path, capsys):
    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    (tmp_path / "rules.toml").write_text(
        '[[rule]]\nname = "ndcg-vs-A"\nmetric = "ndcg@5"\nbaseline = "system:A"\nchange_below = -0.05\n'
        '[[rule]]\nname = "ctr-floor"\nmetric = "ctr"\nbelow = 0.5\nmin_n = 20\n')
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "ndcg@5,map", "--window", "1h", "--quiet"]
    out = tmp_path / "out"
    capsys.readouterr()
    assert batch.main([*common, "--alerts", str(tmp_path / "rules.toml"), "--output", str(out)]) == 4
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ALERT ")]
    written = [json.loads(line) for line in open(out / "alerts.jsonl")]
    # the reference: the same rules evaluated here on the rows the job wrote
    rows = [r for r, _ in results.iter_rows(out / "metrics.jsonl")]
    expected = alerts.evaluate(alerts.load_rules(str(tmp_path / "rules.toml")), rows)
    key = lambda a: (a["rule"], a["system"], a["window_start"])  # noqa: E731
    assert sorted(written, key=key) == sorted(expected, key=key)
    assert {a["rule"] for a in written} == {"ndcg-vs-A", "ctr-floor"} and len(printed) == len(written)
    assert all(a["system"] == "B" for a in written if a["rule"] == "ndcg-vs-A")
    assert sorted(avro.read_records(str(out / "alerts.avro"), "alert"), key=key) == sorted(written, key=key)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counters"]["alerts_fired"] == len(written)
    # a rule that holds nowhere: exit 0, an empty alerts table; a broken rules file: exit 2 before the job
    (tmp_path / "quiet.toml").write_text('[[rule]]\nname = "never"\nmetric = "map"\nbelow = -1\n')
    assert batch.main([*common, "--alerts", str(tmp_path / "quiet.toml"), "--output", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2" / "alerts.jsonl").read_text() == ""
    (tmp_path / "bad.toml").write_text('[[rule]]\nname = "x"\nmetric = "map"\n')
    capsys.readouterr()
    assert batch.main([*common, "--alerts", str(tmp_path / "bad.toml"), "--output", str(tmp_path / "o3")]) == 2
    assert "no condition" in capsys.readouterr().err


def test_the_stream_raises_each_alert_once_on_the_pane_where_it_first_held_long_enough(tmp_path, capsys):
    """Issue 18, item 3, in the streaming job: rules are evaluated on every pane; a rule fires once
    per window, slice and system, on the first pane that completes ``for_panes`` consecutive panes
    on which it held. Reference: the pane rows the job wrote, scanned here in pane order for the
    threshold rule; for the baseline rule, every window the batch job alerts on (final values) was
    alerted on by some pane of the stream."""
    from streameval.jobs import stream as stream_cli

    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    rules_path = tmp_path / "rules.toml"
    rules_path.write_text(
        '[[rule]]\nname = "ndcg-vs-A"\nmetric = "ndcg@5"\nbaseline = "system:A"\nchange_below = -0.05\n'
        '[[rule]]\nname = "ctr-floor"\nmetric = "ctr"\nbelow = 0.5\nmin_n = 5\nfor_panes = 2\n')
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "ndcg@5,map", "--window", "1h", "--quiet", "--alerts", str(rules_path)]
    capsys.readouterr()
    so = tmp_path / "stream"
    assert stream_cli.main(["--replay", *common, "--early-count", "4", "--output", str(so)]) == 4
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ALERT ")]
    got = [json.loads(line) for f in so.glob("alerts-*.jsonl") for line in open(f)]
    assert len(got) == len(printed) and {a["rule"] for a in got} == {"ndcg-vs-A", "ctr-floor"}
    once = [(a["rule"], a["window_start"], a["slice"], a["system"]) for a in got]
    assert len(once) == len(set(once))
    # the threshold rule, from the pane rows written: the first pane closing two in a row below 0.5
    panes: dict = {}
    for f in so.glob("metrics-*.jsonl"):
        for r in map(json.loads, open(f)):
            if r["metric"] == "ctr":
                panes.setdefault((r["window_start"], r["slice"], r["system"]), []).append(r)
    expected = set()
    for key, rows in panes.items():
        run = 0
        for r in sorted(rows, key=lambda r: r["pane_index"]):
            held = r["num_queries"] >= 5 and r["ci_high"] is not None and r["ci_high"] < 0.5
            run = run + 1 if held else 0
            if run == 2:
                expected.add((*key, r["pane_index"]))
                break
    assert expected and {(a["window_start"], a["slice"], a["system"], a["pane_index"]) for a in got
                         if a["rule"] == "ctr-floor"} == expected
    # the baseline rule: each window the batch job alerts on was alerted on by the stream
    assert batch.main([*common, "--output", str(tmp_path / "batch")]) == 4
    in_batch = {(a["window_start"], a["slice"], a["system"]) for a in map(json.loads, open(tmp_path / "batch" / "alerts.jsonl"))
                if a["rule"] == "ndcg-vs-A"}
    assert in_batch and in_batch <= {(a["window_start"], a["slice"], a["system"]) for a in got if a["rule"] == "ndcg-vs-A"}


DAY = 24 * HOUR


def test_an_offset_baseline_is_the_same_window_a_day_or_a_week_earlier(tmp_path):
    """``offset:1d`` / ``offset:7d``: the same window, slice and system that long before; the normal
    interval of two independent samples; min_n on both rows; no earlier window, no alert."""
    z = sst.norm.ppf(0.975)
    rs = rules('[[rule]]\nname = "dod"\nmetric = "ndcg@10"\nbaseline = "offset:1d"\nchange_below = -0.02\n'
               'min_n = 50\n'
               '[[rule]]\nname = "wow"\nmetric = "ndcg@10"\nbaseline = "offset:7d"\nchange_above = 0.0\n', tmp_path)
    assert rs[0].baseline == ("offset", DAY, "1d") and rs[1].baseline == ("offset", 7 * DAY, "7d")
    rows = [row(0, "A", 0.50, 100, 0.01), row(0, "B", 0.50, 100, 0.01),
            row(HOUR, "A", 0.50, 100, 0.01), row(HOUR, "B", 0.50, 40, 0.01),
            row(DAY, "A", 0.44, 100, 0.01),        # A a day later: drop of 0.06, interval below -0.02: fires
            row(DAY, "B", 0.47, 100, 0.01),        # B: drop of 0.03, interval -0.058 .. -0.002 reaches -0.02
            row(DAY + HOUR, "A", 0.44, 30, 0.01),  # the same drop on 30 queries: below min_n
            row(DAY + HOUR, "B", 0.40, 100, 0.01),  # a day earlier B had 40 queries: below min_n
            row(2 * DAY + 5 * HOUR, "A", 0.30, 100, 0.01),  # no window a day earlier: no baseline
            row(7 * DAY, "A", 0.53, 100, 0.01),    # A a week after window 0: up 0.03, interval above 0
            row(7 * DAY, "B", 0.51, 100, 0.01)]    # up 0.01, interval reaches 0
    got = {(a["rule"], a["window_start"], a["system"]): a for a in alerts.evaluate(rs, rows)}
    assert set(got) == {("dod", DAY, "A"), ("wow", 7 * DAY, "A")}
    a = got[("dod", DAY, "A")]
    half = z * math.sqrt(2) * 0.01
    assert a["baseline"] == 0.5 and a["baseline_of"] == "same window 1d earlier" and a["p_value"] is None
    assert a["diff_low"] == pytest.approx(-0.06 - half, abs=1e-12) and a["diff_high"] == pytest.approx(-0.06 + half)
    assert got[("wow", 7 * DAY, "A")]["baseline_of"] == "same window 7d earlier"
    # interval-aware: B's drop of 0.03 is past -0.02 as a point value, not as an interval
    assert -0.03 < -0.02 and -0.03 + half > -0.02
    # the global window has no earlier window
    assert alerts.evaluate(rs, [row(None, "A", 0.1, 100, 0.01)]) == []


def test_an_msprt_rule_fires_on_the_always_valid_p_value_carried_over_panes(tmp_path):
    """``test = "msprt"``: the p-value of value - baseline = change_below, by hand from the closed
    form; fires when the running minimum is at most 1 - level and the difference is below; the
    record carries it and the mSPRT confidence sequence of the difference."""
    from streameval.metrics import stats

    rs = rules('[[rule]]\nname = "m"\nmetric = "ndcg@10"\nbaseline = "system:prod"\nchange_below = 0.0\n'
               'test = "msprt"\ntau = 0.05\nmin_n = 10\n', tmp_path)
    r = rs[0]
    assert (r.test, r.tau) == ("msprt", 0.05)
    prod, new = row(0, "prod", 0.50, 100, 0.010), row(0, "new", 0.45, 100, 0.012)
    a = alerts.evaluate_row(r, new, [prod, new])
    v = 0.010 ** 2 + 0.012 ** 2
    lam = math.sqrt(v / (v + 0.05 ** 2)) * math.exp(0.05 ** 2 * 0.05 ** 2 / (2 * v * (v + 0.05 ** 2)))
    assert a["p_value"] == pytest.approx(1 / lam, rel=1e-12) and a["p_value"] < 0.05
    assert a["baseline"] == 0.5 and a["baseline_of"] == "system prod"
    assert (a["diff_low"], a["diff_high"]) == pytest.approx(stats.msprt_cs(-0.05, v, 0.05, 0.95))
    assert "always-valid p" in a["condition"] and "mSPRT" in a["condition"]
    assert alerts.change_pvalue(r, new, [prod]) == pytest.approx(1 / lam, rel=1e-12)
    # a smaller drop: p above 0.05 at this look, no alert; but an earlier pane's p of 0.01 carries
    small = row(0, "new", 0.48, 100, 0.012)
    p_small = alerts.change_pvalue(r, small, [prod])
    assert p_small > 0.05 and alerts.evaluate_row(r, small, [prod]) is None
    assert alerts.change_pvalue(r, small, [prod], 0.01) == 0.01
    assert alerts.evaluate_row(r, small, [prod], p_prev=0.01)["p_value"] == 0.01
    # the wrong side (a rise), too few queries, the baseline system itself: no alert, p-value of a rise
    rise = row(0, "new", 0.55, 100, 0.012)
    assert alerts.evaluate_row(r, rise, [prod], p_prev=0.001) is None
    assert alerts.evaluate_row(r, row(0, "new", 0.2, 5, 0.05), [prod]) is None
    assert alerts.change_pvalue(r, row(0, "new", 0.2, 5, 0.05), [prod]) is None
    assert alerts.evaluate_row(r, prod, [prod]) is None
    # an interval rule on the same rows fires too (its fixed-sample interval, not the p-value)
    fixed = rules('[[rule]]\nname = "f"\nmetric = "ndcg@10"\nbaseline = "system:prod"\nchange_below = 0.0\n', tmp_path)
    assert alerts.evaluate_row(fixed[0], new, [prod])["p_value"] is None


class _State:
    def __init__(self):
        self.value = None

    def read(self):
        return self.value

    def write(self, v):
        self.value = v


def _fired(outputs) -> list:
    """The alerts a ``_StreamAlertsFn.process`` call yields (its mSPRT looks, tagged, left out)."""
    import apache_beam as beam

    return [o for o in outputs if not isinstance(o, beam.pvalue.TaggedOutput)]


def test_the_stream_keeps_the_rows_an_offset_reaches_and_carries_the_msprt_minimum():
    """The streaming DoFn on hand-made panes: with ``offset:1d`` and hourly windows it keeps the
    windows of the last day of each system (25 rows; the older ones are dropped), fires against the
    window a day earlier, and for an mSPRT rule carries the running minimum of the p-value over the
    panes of a window: a later pane with a weaker difference still fires on it."""
    from streameval.beam.alerts import _StreamAlertsFn

    text = ('[[rule]]\nname = "dod"\nmetric = "ndcg@10"\nbaseline = "offset:1d"\nchange_below = -0.02\n'
            '[[rule]]\nname = "m"\nmetric = "ndcg@10"\nbaseline = "system:prod"\nchange_below = 0.0\n'
            'test = "msprt"\ntau = 0.05\nfor_panes = 2\n')
    fn = _StreamAlertsFn(alerts.parse_rules(__import__("tomllib").loads(text)))
    st = _State()
    key = ("ndcg@10", "all")
    fired = []
    for h in range(30):
        fired += _fired(fn.process((key, row(h * HOUR, "A", 0.5, 100, 0.01)), state=st))
    assert fired == []
    rows = st.value[0]
    assert sorted(w for _, w in rows) == [h * HOUR for h in range(5, 30)]  # a day back from the newest: 25
    fired += _fired(fn.process((key, row(30 * HOUR, "A", 0.4, 100, 0.01)), state=st))
    assert [(a["rule"], a["window_start"], a["baseline_of"]) for a in fired] == [("dod", 30 * HOUR, "same window 1d earlier")]
    # mSPRT over three panes of window 0 of system new against prod: p carried as the running minimum
    fn2 = _StreamAlertsFn(fn.rules)
    st2 = _State()
    prod = dict(row(0, "prod", 0.50, 100, 0.010), pane="early", pane_index=0)
    assert _fired(fn2.process((key, prod), state=st2)) == []
    out = []
    for i, v in enumerate((0.45, 0.48, 0.48)):
        out.append(_fired(fn2.process((key, dict(row(0, "new", v, 100, 0.012), pane="early", pane_index=i + 1)),
                                    state=st2)))
    p0 = alerts.change_pvalue(fn.rules[1], row(0, "new", 0.45, 100, 0.012), [prod])
    assert p0 < 0.05
    # pane 1 holds (1 of 2), pane 2 holds on the carried minimum (2 of 2: fires), pane 3: already fired
    assert out[0] == [] and [a["rule"] for a in out[1]] == ["m"] and out[2] == []
    assert out[1][0]["p_value"] == pytest.approx(p0) and out[1][0]["pane_index"] == 2


def test_alert_files_of_schema_version_1_read_with_a_null_p_value(tmp_path):
    """Schema evolution: version 2 adds ``p_value`` (null by default); a version 1 file (written
    with the old schema, without it) reads under the current schema with ``p_value`` None, and a
    version 2 file reads under the version 1 schema without it."""
    import fastavro

    from streameval.io.avro import schema_path

    v2 = json.loads(schema_path("alert").read_text())
    assert v2["streameval_schema_version"] == 2 and v2["fields"][-1]["name"] == "p_value"
    v1 = dict(v2, streameval_schema_version=1, fields=v2["fields"][:-1])
    rec = {"rule": "r", "window_start": 0, "window_end": HOUR, "slice": "all", "system": "A", "metric": "map",
           "value": 0.3, "num_queries": 10, "ci_low": 0.2, "ci_high": 0.4, "baseline": 0.5, "baseline_of": "threshold",
           "diff_low": None, "diff_high": None, "condition": "c", "pane": None, "pane_index": None}
    with open(tmp_path / "v1.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(v1), [rec])
    assert list(avro.read_records(str(tmp_path / "v1.avro"), "alert")) == [dict(rec, p_value=None)]
    avro.write_records(tmp_path / "v2.avro", "alert", [dict(rec, p_value=0.01)])
    with open(tmp_path / "v2.avro", "rb") as f:
        old, = fastavro.reader(f, reader_schema=fastavro.parse_schema(v1))
    assert "p_value" not in old and old["rule"] == "r" and old["value"] == 0.3  # fastavro gives datetimes


def test_the_beam_transforms_run_offset_and_msprt_rules(tmp_path):
    """In Beam (direct runner): EvaluateAlerts on rows of several days gives what ``evaluate``
    gives (an offset baseline found among the windows of one run); StreamAlerts carries the mSPRT
    minimum in its state across panes (the state's coder takes it) and fires once (the panes in
    order: one bundle, no reshuffle)."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from streameval.beam.alerts import EvaluateAlerts, StreamAlerts

    rs = rules('[[rule]]\nname = "dod"\nmetric = "ndcg@10"\nbaseline = "offset:1d"\nchange_below = -0.02\n'
               '[[rule]]\nname = "m"\nmetric = "ndcg@10"\nbaseline = "system:prod"\nchange_below = 0.0\n'
               'test = "msprt"\ntau = 0.05\nfor_panes = 2\n', tmp_path)
    rows = [row(d * DAY + h * HOUR, s, 0.5 - 0.05 * d * (s == "new"), 100, 0.01)
            for d in range(3) for h in range(2) for s in ("prod", "new")]
    expected = alerts.evaluate(rs, rows)
    assert {(a["rule"], a["window_start"]) for a in expected if a["rule"] == "dod"} == {
        ("dod", DAY), ("dod", DAY + HOUR), ("dod", 2 * DAY), ("dod", 2 * DAY + HOUR)}
    prod = dict(row(0, "prod", 0.50, 100, 0.010), pane="early", pane_index=0)
    panes = [[prod]] + [[dict(row(0, "new", v, 100, 0.012), pane="early", pane_index=i)]
                        for i, v in enumerate((0.45, 0.48, 0.48), 1)]
    with beam.Pipeline() as p:
        assert_that(p | "Rows" >> beam.Create(rows) | EvaluateAlerts(rs), equal_to(expected), label="Batch")
        stream_alerts = StreamAlerts(rs[1:])
        streamed = (p | "Panes" >> beam.Create(panes, reshuffle=False) | stream_alerts
                    | beam.Map(lambda a: (a["rule"], a["pane_index"], round(a["p_value"], 12))))
        p0 = alerts.change_pvalue(rs[1], panes[1][0], [prod])
        assert_that(streamed, equal_to([("m", 2, round(p0, 12))]), label="Stream")
        # every look of the mSPRT rule, the running minimum (also after it fired at pane 2)
        want, p_run = [], 1.0
        for pane in panes[1:]:
            p_run = alerts.change_pvalue(rs[1], pane[0], [prod], p_run)
            want.append((pane[0]["pane_index"], round(p_run, 12)))
        looks = stream_alerts.looks | beam.Map(lambda lk: (lk["pane_index"], round(lk["p_value"], 12)))
        assert_that(looks, equal_to(want), label="Looks")


def test_a_rule_that_matches_no_row_is_exit_2_naming_the_closest_values(tmp_path, capsys):
    """Issue 41: an alert rule on ``ndgc@10`` (a typo) gave "0 fired", exit 0. A rule whose metric,
    system or slice matches no row of the job's output is exit 2 with one line naming the rule and
    the closest values present (the log below has the metrics ndcg@5, map, ctr and ctr@pos1..5, the
    systems A and B, the slice all), in the batch job and in the stream."""
    from streameval.jobs import stream as stream_cli

    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    common = ["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
              "--metrics", "ndcg@5,map", "--window", "1h", "--quiet"]
    cases = [('metric = "ndgc@5"\nbelow = 0.5', "metric 'ndgc@5' matches no row", ["ndcg@5"]),
             ('metric = "ndcg@5"\nsystem = "C"\nbelow = 0.5', "system 'C' matches no row", "A, B"),
             ('metric = "ndcg@5"\nslice = "campaign=men"\nbelow = 0.5', "slice 'campaign=men' matches no row", "all"),
             ('metric = "ndcg@5"\nbaseline = "system:a"\nchange_below = -0.05', "system 'a' matches no row", "A, B")]
    for i, (body, said, closest) in enumerate(cases):
        (tmp_path / f"r{i}.toml").write_text(f'[[rule]]\nname = "typo"\n{body}\n')
        capsys.readouterr()
        assert batch.main([*common, "--alerts", str(tmp_path / f"r{i}.toml"), "--output", str(tmp_path / f"o{i}")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"alert rule 'typo': {said}" in err, err
        picks = err.split("present: ")[1].split(", ")
        assert (picks[0] == closest[0]) if isinstance(closest, list) else (sorted(picks) == closest.split(", ")), err
    # the stream: the same typo, exit 2 after the replay
    assert stream_cli.main(["--replay", *common, "--alerts", str(tmp_path / "r0.toml"),
                            "--output", str(tmp_path / "s0")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "alert rule 'typo': metric 'ndgc@5' matches no row of the job's panes" in err
    assert "present: ndcg@5, " in err
    # a rule spelled right passes (any spelling of the metric: nDCG@5)
    (tmp_path / "ok.toml").write_text('[[rule]]\nname = "ok"\nmetric = "nDCG@5"\nbelow = -1\n')
    assert batch.main([*common, "--alerts", str(tmp_path / "ok.toml"), "--output", str(tmp_path / "ok")]) == 0


def test_a_metric_without_rows_is_a_failed_check(tmp_path, capsys):
    """Issue 41: ``gauc[user,impressions]`` on a log without user ids gave no row, exit 0. The log
    below has no user id at all (built so), so gauc has no user to group by: the job says so on one
    line, lists it in summary.json's metrics_without_rows and exits 3 (a failed check); ctr, which
    every impression feeds, has its rows."""
    from streameval.exits import EXIT_INPUT_CHECK

    imps, _ = _logs()
    assert all(r["user_id"] is None for r in imps)
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    capsys.readouterr()
    out = tmp_path / "out"
    assert batch.main(["--impressions", str(tmp_path / "imps.avro"), "--metrics", "gauc[user,impressions],ctr",
                       "--quiet", "--output", str(out)]) == EXIT_INPUT_CHECK == 3
    err = [line for line in capsys.readouterr().err.splitlines() if "produced no row" in line]
    assert len(err) == 1 and err[0].endswith(": gauc[user,impressions]")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics_without_rows"] == ["gauc[user,impressions]"]
    assert any(r["metric"] == "ctr" for r, _ in results.iter_rows(out / "metrics.jsonl"))


def test_a_job_without_any_row_reports_what_was_asked(tmp_path, capsys):
    """``gauc[user,impressions]`` on a log whose clicks are all unlogged (the bundled LETOR run):
    every impression accepted, not one metric row, and the job exited 0 ("no row at all" was taken
    for an empty input). Now every metric asked for is without rows: one line, exit 3; an input
    whose every record is refused still says so once, through the input checks."""
    from streameval import evaluate_log
    from streameval.api_log import MetricsWithoutRowsError

    imps = [dict(r, clicked=None) for r in _logs()[0]]
    avro.write_records(tmp_path / "unlogged.avro", "impression", imps)
    capsys.readouterr()
    out = tmp_path / "out"
    assert batch.main(["--impressions", str(tmp_path / "unlogged.avro"), "--metrics", "gauc[user,impressions]",
                       "--quiet", "--output", str(out)]) == 3
    err = [line for line in capsys.readouterr().err.splitlines() if "produced no row" in line]
    assert len(err) == 1 and err[0].endswith(": gauc[user,impressions]")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics_without_rows"] == ["gauc[user,impressions]"]
    assert not (out / "metrics.jsonl").read_text().strip()  # not one row
    import pandas as pd

    with pytest.raises(MetricsWithoutRowsError, match="auc"):
        evaluate_log(pd.DataFrame(imps), ["auc"])


def test_the_stream_reports_a_metric_without_rows_as_a_failed_check(tmp_path, capsys):
    """Issue 41 in the streaming job (which refuses gauc up front): ``auc`` on a log whose records
    carry no score (built so) has nothing to rank, so it gives no row: one line on stderr,
    summary.json's metrics_without_rows, exit 3; with the scores it has rows and the job exits 0."""
    from streameval.jobs import stream as stream_cli

    imps, _ = _logs()
    avro.write_records(tmp_path / "scored.avro", "impression", imps)
    avro.write_records(tmp_path / "unscored.avro", "impression", [dict(r, score=None) for r in imps])
    common = ["--replay", "--metrics", "auc,ctr", "--window", "1h", "--quiet"]
    capsys.readouterr()
    out = tmp_path / "out"
    assert stream_cli.main([*common, "--impressions", str(tmp_path / "unscored.avro"), "--output", str(out)]) == 3
    err = [line for line in capsys.readouterr().err.splitlines() if "produced no row" in line]
    assert len(err) == 1 and err[0].endswith(": auc")
    assert json.loads((out / "summary.json").read_text())["metrics_without_rows"] == ["auc"]
    out2 = tmp_path / "out2"
    assert stream_cli.main([*common, "--impressions", str(tmp_path / "scored.avro"), "--output", str(out2)]) == 0
    assert json.loads((out2 / "summary.json").read_text())["metrics_without_rows"] == []
