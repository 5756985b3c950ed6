"""Prometheus export (issue 18, item 4): the streaming job's endpoint scraped by a real Prometheus
server (Debian's ``prometheus`` package, started here on 127.0.0.1 and stopped by PID), and the batch
job's textfile. Reference: the metric rows the jobs wrote (metrics-*.jsonl / metrics.jsonl)."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from streameval.jobs import batch
from streameval.jobs import stream as stream_cli
from streameval.beam.prometheus import LatestValues
from streameval.io import avro

from .test_alerts import _logs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode("utf-8")


@pytest.fixture
def prometheus_server(tmp_path):
    """A Prometheus server on 127.0.0.1 scraping 127.0.0.1:<target> every second (timeout one second):
    (web port, target port). Stopped by its PID. Skips, naming the package, when the binary is not
    installed."""
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus; .ci/run does it)")
    web, target = _free_port(), _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: streameval\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{target}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if "Ready" in _get(f"http://127.0.0.1:{web}/-/ready"):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not start: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield web, target
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _latest_final(rows):
    """{(metric, slice, system): value} of the final row of each series' latest window."""
    best = {}
    for r in rows:
        if r["is_final"] is False or r["value"] is None:
            continue
        key = (r["metric"], r["slice"], r["system"])
        if key not in best or r["window_end"] >= best[key]["window_end"]:
            best[key] = r
    return {k: r["value"] for k, r in best.items()}


def _query(web: int, promql: str) -> dict:
    """{(metric, slice, system, pane): value} of an instant query's result (now)."""
    res = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/query?query={urllib.parse.quote(promql)}"))
    assert res["status"] == "success", res
    return {(m["metric"]["metric"], m["metric"]["slice"], m["metric"]["system"], m["metric"]["pane"]):
            float(m["value"][1]) for m in res["data"]["result"]}


def test_a_real_prometheus_scrapes_the_streams_final_values(tmp_path, prometheus_server, capsys):
    """No race with the job's end by design: the job serves until a scrape that started after its
    end was sent and Prometheus' next scrape arrived (it stores a scrape before starting the next),
    at most --prometheus-linger; the query reads the last sample of the past 5 minutes, since the
    series go stale as soon as a scrape of the stopped endpoint fails."""
    web, target = prometheus_server
    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out = tmp_path / "stream"
    assert stream_cli.main(["--replay", "--impressions", str(tmp_path / "imps.avro"), "--judgments",
                            str(tmp_path / "judg.avro"), "--metrics", "ndcg@5,map", "--window", "1h", "--quiet",
                            "--output", str(out), "--prometheus-port", str(target),
                            "--prometheus-linger", "20"]) == 0
    assert "prometheus: a scrape stored the final values" in capsys.readouterr().out
    expected = _latest_final(r for f in out.glob("metrics-*.jsonl") for r in map(json.loads, open(f)))
    assert len(expected) >= 6
    got, deadline = {}, time.monotonic() + 10
    while time.monotonic() < deadline:  # stored already; the deadline only covers a slow query engine
        got = _query(web, 'last_over_time(streameval_value{job="streameval"}[5m])')
        if {k[:3] for k in got if k[3] == "final"} == expected.keys():
            break
        time.sleep(0.2)
    final = {k[:3]: v for k, v in got.items() if k[3] == "final"}
    assert final.keys() == expected.keys()
    for k, v in expected.items():
        assert final[k] == pytest.approx(v, rel=1e-12, abs=1e-15), k
    assert {k[:3] for k in got if k[3] == "latest"} == expected.keys()  # the early panes' series too


def test_a_real_prometheus_scrapes_the_msprt_p_values_of_the_alert_rules(tmp_path, prometheus_server, capsys):
    """Issue 43, item 5: the always-valid p-value of a ``test = "msprt"`` rule was only in the alert
    records of the panes where the rule fired. Now every look is exported: Prometheus holds, for the
    latest window, the running p-value and the always-valid interval of the difference that
    :func:`streameval.plan.alerts.change_look` gives on the job's own pane rows (B's CTR against A's)."""
    from streameval.plan import alerts

    web, target = prometheus_server
    imps, judg = _logs()
    for r in imps:  # A's first item clicked in both hours (B's CTR lower in the latest window too)
        r["clicked"] = r["clicked"] or (r["system_id"] == "A" and r["position"] == 1)
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    (tmp_path / "rules.toml").write_text('[[rule]]\nname = "ctr-vs-A"\nmetric = "ctr"\nbaseline = "system:A"\n'
                                         'change_below = 0.0\ntest = "msprt"\ntau = 0.1\n')
    out = tmp_path / "stream"
    code = stream_cli.main(["--replay", "--impressions", str(tmp_path / "imps.avro"), "--judgments",
                            str(tmp_path / "judg.avro"), "--metrics", "ndcg@5", "--window", "1h", "--quiet",
                            "--alerts", str(tmp_path / "rules.toml"), "--output", str(out),
                            "--prometheus-port", str(target), "--prometheus-linger", "20"])
    assert code in (0, 4), capsys.readouterr()
    rows = [r for f in out.glob("metrics-*.jsonl") for r in map(json.loads, open(f)) if r["metric"] == "ctr"]
    rule, = alerts.load_rules(str(tmp_path / "rules.toml"))
    end = max(r["window_end"] for r in rows)
    latest = sorted((r for r in rows if r["window_end"] == end and r["slice"] == "all"), key=lambda r: r["pane_index"])
    base = [r for r in latest if r["system"] == "A"]
    want, p = None, 1.0
    for r in (r for r in latest if r["system"] == "B"):  # B's panes of the latest window, in order
        want = alerts.change_look(rule, r, [b for b in base if b["pane_index"] <= r["pane_index"]], p) or want
        p = want["p_value"] if want else p
    assert want is not None and 0 < want["p_value"] < 1
    got, deadline = {}, time.monotonic() + 10
    while time.monotonic() < deadline and not got:
        res = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/query?query=" + urllib.parse.quote(
            '{__name__=~"streameval_msprt_.*", job="streameval", rule="ctr-vs-A", slice="all", system="B"}')))
        got = {m["metric"]["__name__"]: float(m["value"][1]) for m in res["data"]["result"]}
        time.sleep(0.2)
    assert got["streameval_msprt_p_value"] == pytest.approx(want["p_value"], rel=1e-12)
    assert got["streameval_msprt_diff"] == pytest.approx(want["diff"], rel=1e-12)
    assert got["streameval_msprt_diff_low"] == pytest.approx(want["diff_low"], rel=1e-12)
    assert got["streameval_msprt_diff_high"] == pytest.approx(want["diff_high"], rel=1e-12)
    assert got["streameval_msprt_window_end_seconds"] == end / 1e6


def test_exported_msprt_rules_fire_on_the_streams_looks_as_the_job_does(tmp_path):
    """``alerts-to-prometheus`` refused ``test = "msprt"`` rules (no gauge held the p-value). Now the
    rule reads the look gauges; Prometheus' own rule evaluation (``promtool test rules``) on what the
    stream's endpoint serves at the end raises the alerts the job raised in the latest window: B's
    CTR below A's (fires), and C's, equal to A's (does not)."""
    import yaml
    from prometheus_client import generate_latest

    from streameval.beam.prometheus import STORE, _registry
    from streameval.cli import main as cli

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it; .ci/run installs it)")
    imps, judg = _logs()
    for r in imps:  # A's first item clicked in both hours; C a copy of A
        r["clicked"] = r["clicked"] or (r["system_id"] == "A" and r["position"] == 1)
    imps += [dict(r, system_id="C", event_id="C" + r["event_id"], request_id="C" + r["request_id"])
             for r in imps if r["system_id"] == "A"]
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    toml = tmp_path / "rules.toml"
    toml.write_text('[[rule]]\nname = "ctr-vs-A"\nmetric = "ctr"\nbaseline = "system:A"\nchange_below = 0.0\n'
                    'test = "msprt"\ntau = 0.1\n')
    out = tmp_path / "stream"
    code = stream_cli.main(["--replay", "--impressions", str(tmp_path / "imps.avro"), "--metrics", "ndcg@5",
                            "--judgments", str(tmp_path / "judg.avro"), "--window", "1h", "--quiet",
                            "--alerts", str(toml), "--output", str(out), "--prometheus-port", "0"])
    assert code == 4
    fired = [json.loads(line) for f in out.glob("alerts-*.jsonl") for line in open(f)]
    end = max(a["window_end"] for a in fired)
    latest = {(a["slice"], a["system"]) for a in fired if a["window_end"] == end}
    assert latest == {("all", "B")}
    exposition = generate_latest(_registry(STORE)).decode()
    assert "streameval_msprt_p_value" in exposition
    rules_yml = tmp_path / "rules.yml"
    assert cli(["alerts-to-prometheus", str(toml), "-o", str(rules_yml)]) == 0
    doc = yaml.safe_load(rules_yml.read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            r.pop("annotations", None)
    rules_yml.write_text(yaml.safe_dump(doc))
    want = [{"exp_labels": {"metric": "ctr", "slice": sl, "system": sy, "rule": "ctr-vs-A",
                            "condition": "change_below"}} for sl, sy in sorted(latest)]
    test = {"rule_files": [str(rules_yml)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": _promtool_series(exposition),
                       "alert_rule_test": [{"eval_time": "2m", "alertname": "ctr-vs-A", "exp_alerts": want}]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_store_keeps_the_latest_window_s_look_of_each_rule():
    """A look of an older window (a late pane) never replaces a newer window's; the gauges carry the
    rule in their labels; without looks no msprt family is exported."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    store = LatestValues()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(store)
    assert b"streameval_msprt" not in generate_latest(reg)
    look = {"rule": "r", "metric": "ctr", "slice": "all", "system": "B", "window_start": 0, "window_end": 3_600_000_000,
            "p_value": 0.2, "diff": -0.01, "diff_low": -0.03, "diff_high": 0.01}
    store.update_look(dict(look, window_start=3_600_000_000, window_end=7_200_000_000, p_value=0.04))
    store.update_look(look)  # older window: kept out
    text = generate_latest(reg).decode()
    assert 'streameval_msprt_p_value{metric="ctr",rule="r",slice="all",system="B"} 0.04' in text
    assert 'streameval_msprt_window_end_seconds{metric="ctr",rule="r",slice="all",system="B"} 7200.0' in text


def test_the_batch_textfile_and_the_latest_window_rule(tmp_path):
    """The batch textfile parses (prometheus-client's own parser) to the latest window's rows; a late
    pane of an older window never replaces a newer window's value in the stream's store."""
    from prometheus_client.parser import text_string_to_metric_families

    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out, prom = tmp_path / "out", tmp_path / "streameval.prom"
    assert batch.main(["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
                       "--metrics", "ndcg@5,map", "--window", "1h", "--quiet", "--output", str(out),
                       "--prometheus-textfile", str(prom)]) == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    expected = _latest_final(rows)
    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    got = {(s.labels["metric"], s.labels["slice"], s.labels["system"]): s.value
           for s in fams["streameval_value"].samples if s.labels["pane"] == "final"}
    assert got == expected
    ends = {s.labels["metric"]: s.value for s in fams["streameval_window_end_seconds"].samples}
    assert set(ends.values()) == {max(r["window_end"] for r in rows) / 1e6}

    store = LatestValues()
    new = {"metric": "map", "slice": "all", "system": "A", "value": 0.5, "num_queries": 3, "window_end": 7200,
           "is_final": False, "ci_low": None, "ci_high": None}
    store.update(new)
    store.update(dict(new, value=0.1, window_end=3600, is_final=True))  # a late pane of the older window
    rows = store.rows()
    assert rows[("map", "all", "A", "latest")]["value"] == 0.5
    assert rows[("map", "all", "A", "final")]["value"] == 0.1  # the only final one so far
    store.update(dict(new, value=math.nan, window_end=10800))  # an emptied slice: left out
    assert store.rows()[("map", "all", "A", "latest")]["value"] == 0.5


_RULES = """
[[rule]]
name = "ctr-men-low"
metric = "ctr"
slice = "campaign=men"
min_n = 1000
below = 0.004

[[rule]]
name = "map-band"
metric = "map"
system = "bts"
below = 0.45
above = 0.9

[[rule]]
name = "map-vs-prod"
metric = "map"
baseline = "system:prod"
change_below = -0.02
"""


def _row(metric, slice_, system, value, se, n, start=0, ci=None):
    lo, hi = ci or (value - 2 * se, value + 2 * se)
    return {"metric": metric, "slice": slice_, "system": system, "value": value, "stderr": se, "num_queries": n,
            "ci_low": lo, "ci_high": hi, "window_start": start, "window_end": start + 3_600_000_000,
            "is_final": True}


def test_alert_rules_as_prometheus_alerting_rules(tmp_path, capsys):
    """``alerts-to-prometheus``: promtool accepts the file, a threshold rule's expression is the
    interval gauge against the threshold, and Prometheus' own rule evaluation (``promtool test
    rules``) on the gauges of some rows fires exactly the alerts ``streameval.plan.alerts.evaluate``
    raises on those rows; what the gauges cannot express is refused in one line."""
    import yaml
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from streameval.plan.alerts import evaluate, load_rules
    from streameval.cli import main as cli

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it; .ci/run installs it)")
    toml, out = tmp_path / "rules.toml", tmp_path / "rules.yml"
    toml.write_text(_RULES)
    assert cli(["alerts-to-prometheus", str(toml), "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    rules = doc["groups"][0]["rules"]
    assert [(r["alert"], r["labels"]["condition"]) for r in rules] == [
        ("ctr-men-low", "below"), ("map-band", "below"), ("map-band", "above"), ("map-vs-prod", "change_below")]
    assert rules[0]["expr"] == ('streameval_ci_high{metric="ctr", pane="latest", slice="campaign=men"} < 0.004 '
                                'and streameval_num_queries{metric="ctr", pane="latest", slice="campaign=men"} >= 1000')
    check = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    rows = [_row("map", "all", "prod", 0.5, 0.01, 100), _row("map", "all", "bts", 0.40, 0.01, 100),  # both fire
            _row("map", "men", "prod", 0.5, 0.05, 100), _row("map", "men", "bts", 0.47, 0.05, 100),  # neither
            _row("map", "kids", "prod", 0.5, 0.01, 100),  # a different window: no baseline; the band fires
            _row("map", "kids", "bts", 0.1, 0.01, 100, start=3_600_000_000),
            _row("map", "few", "prod", 0.5, 0.01, 100), _row("map", "few", "bts", 0.1, 0.01, 1),  # min_n
            _row("map", "high", "bts", 0.95, 0.01, 100), _row("map", "high", "prod", 0.95, 0.01, 100),
            _row("ctr", "campaign=men", "bts", 0.003, 0.0002, 5000, ci=(0.0025, 0.0035)),
            _row("ctr", "all", "bts", 0.003, 0.0002, 5000, ci=(0.0025, 0.0035))]
    expected = evaluate(load_rules(str(toml)), rows)
    assert len(expected) == 5
    store = LatestValues()
    for r in rows:
        store.update(r)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(store)
    series = [{"series": s.name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(s.labels.items())) + "}",
               "values": f"{s.value!r}+0x5"}
              for fam in text_string_to_metric_families(generate_latest(reg).decode()) for s in fam.samples]
    summary = {(r["alert"], r["labels"]["condition"]): r["annotations"]["summary"] for r in rules}
    want: dict = {name: [] for name in ("ctr-men-low", "map-band", "map-vs-prod")}
    for a in expected:
        words = a["condition"].split()
        cond = words[4] if a["baseline_of"] == "threshold" else "change_" + words[3]
        labels = {"metric": a["metric"], "slice": a["slice"], "system": a["system"], "pane": "latest"}
        text = summary[(a["rule"], cond)]
        for k, v in labels.items():
            text = text.replace("{{ $labels.%s }}" % k, v)
        want[a["rule"]].append({"exp_labels": dict(labels, rule=a["rule"], condition=cond),
                                "exp_annotations": {"summary": text}})
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(out)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series,
                   "alert_rule_test": [{"eval_time": "2m", "alertname": k, "exp_alerts": v} for k, v in want.items()]}]}))
    run = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr

    capsys.readouterr()
    for text, message in [('baseline = "trailing:3"\nchange_below = -0.1', "needs the preceding windows"),
                          ('baseline = "offset:1d"\nchange_below = -0.1', "needs an earlier window"),
                          ('baseline = "system:p"\nsystem = "p"\nchange_below = -0.1\ntest = "msprt"',
                           "is its own baseline"),
                          ("below = 0.1\nfor_panes = 3", "counts panes")]:
        toml.write_text(f'[[rule]]\nname = "r"\nmetric = "map"\n{text}\n')
        assert cli(["alerts-to-prometheus", str(toml)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and str(toml) in err, err


def test_alerts_to_prometheus_refuses_a_metric_that_is_no_measure_name(tmp_path, capsys):
    """Issue 41: ``alerts-to-prometheus`` wrote a rule on ``ndgc@10`` (a typo) that can never match
    a series. A rule whose metric is no measure name is exit 2, one line naming the rule and the
    closest measure names (ndcg@10 first: one transposition away); measure names in any spelling
    and the rows derived from them are accepted."""
    from streameval.cli import main as cli

    toml = tmp_path / "rules.toml"
    toml.write_text('[[rule]]\nname = "typo"\nmetric = "ndgc@10"\nbelow = 0.3\n')
    capsys.readouterr()
    assert cli(["alerts-to-prometheus", str(toml), "-o", str(tmp_path / "r.yml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rule 'typo': unknown metric 'ndgc@10'" in err and str(toml) in err
    assert "closest accepted names: ndcg@10, " in err and not (tmp_path / "r.yml").exists()
    for good in ("nDCG@10", "ctr", "ctr@pos2", "gauc[user,impressions]", "srm:chi2", "ips[bts]", "ctr:clusters"):
        toml.write_text(f'[[rule]]\nname = "ok"\nmetric = "{good}"\nbelow = 0.3\n')
        assert cli(["alerts-to-prometheus", str(toml), "-o", str(tmp_path / "r.yml")]) == 0, good


def _promtool_series(text: str) -> list[dict]:
    """promtool's input series of an exposition text (a batch --prometheus-textfile): each sample
    held for five minutes (``Inf`` written the way promtool's series notation reads it)."""
    from prometheus_client.parser import text_string_to_metric_families

    def num(v):
        return ("Inf" if v > 0 else "-Inf") if math.isinf(v) else repr(v)

    return [{"series": s.name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(s.labels.items())) + "}",
             "values": " ".join([num(s.value)] * 6)}
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_exported_system_baseline_rules_fire_on_a_batch_output_without_windows(tmp_path):
    """Issue 41, item 8: a ``baseline = "system:A"`` rule exported by ``alerts-to-prometheus``
    never fired on the textfile of a batch job without ``--window`` (one global window): the rule
    joins the two systems on ``streameval_window_end_seconds``, which a global row did not have, so
    the job raised 1 alert and promtool's rule test 0. Reference: Prometheus' own rule evaluation
    (``promtool test rules``) on the job's textfile must raise exactly the alerts the job wrote."""
    import yaml

    from streameval.cli import main as cli

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package has it; .ci/run installs it)")
    imps, judg = _logs()
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    toml = tmp_path / "rules.toml"
    toml.write_text('[[rule]]\nname = "ndcg-vs-A"\nmetric = "ndcg@5"\nbaseline = "system:A"\nchange_below = -0.05\n'
                    '[[rule]]\nname = "map-floor"\nmetric = "map"\nbelow = 0.9\n')
    out, prom = tmp_path / "out", tmp_path / "streameval.prom"
    assert batch.main(["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
                       "--metrics", "ndcg@5,map", "--quiet", "--output", str(out), "--alerts", str(toml),
                       "--prometheus-textfile", str(prom)]) == 4
    fired = [json.loads(line) for line in open(out / "alerts.jsonl")]
    by_rule = {name: [a for a in fired if a["rule"] == name] for name in ("ndcg-vs-A", "map-floor")}
    assert len(by_rule["ndcg-vs-A"]) == 1 and by_rule["ndcg-vs-A"][0]["window_end"] is None  # global window
    rules_yml = tmp_path / "rules.yml"
    assert cli(["alerts-to-prometheus", str(toml), "-o", str(rules_yml), "--pane", "final"]) == 0
    # promtool must give the same alerts: each with the rule's labels and the series' own
    want = {name: [{"exp_labels": {"metric": a["metric"], "slice": a["slice"], "system": a["system"],
                                   "pane": "final", "rule": name,
                                   "condition": "change_below" if name == "ndcg-vs-A" else "below"}}
                   for a in alerts] for name, alerts in by_rule.items()}
    test = {"rule_files": [str(rules_yml)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": _promtool_series(prom.read_text()),
                       "alert_rule_test": [{"eval_time": "2m", "alertname": k, "exp_alerts": v}
                                           for k, v in want.items()]}]}
    # promtool compares the annotations too when a test gives them; these give labels only
    doc = yaml.safe_load(rules_yml.read_text())
    for group in doc["groups"]:
        for r in group["rules"]:
            r.pop("annotations", None)
    rules_yml.write_text(yaml.safe_dump(doc))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
