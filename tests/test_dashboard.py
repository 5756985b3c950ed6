"""``streameval dashboard``: the feed of a job's output folder (panes, alerts, accounting) read while
it is written, locally and on S3 (moto's server), and the live page in headless Chromium (Debian's
package) driven by Playwright: a ``stream --watch`` job on the local runner scores Avro files dropped
while the page is open, and the page's points appear, early panes first, then the final ones, equal
to the pane files the job wrote.

References: the job's own output read by :func:`streameval.read_metrics` (``final_only``), its
``summary.json`` counts and its ``alerts-*.jsonl`` records."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streameval.commands import dashboard, engines
from streameval.commands.dashboard_feed import ROW_FIELDS, OutputFeed
from streameval.io.tables import read_metrics
from streameval.jobs import stream as stream_cli

from .conftest import REPO
from .test_stream_watch import _drop, _week

CHROMIUM = "/usr/bin/chromium"
SAMPLE = REPO / "data" / "sample"
KEY = ("window_start", "window_end", "slice", "system", "metric")
RULES = """
[[rule]]
name = "ctr-low"
metric = "ctr"
slice = "all"
below = 0.012
"""


def _key(r) -> tuple:
    return tuple(r[k] for k in KEY)


def _final_table(out) -> dict:
    """The job's final pane of every key, as the feed carries its fields (NaN as None)."""
    rows = read_metrics(str(out), final_only=True)
    return {_key(r): {k: (None if isinstance(r.get(k), float) and r[k] != r[k] else r.get(k)) for k in ROW_FIELDS}
            for r in rows}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A finished stream job's output: the bundled sample replayed a day a step, with an alert rule."""
    out = tmp_path_factory.mktemp("replayed") / "out"
    rules = out.parent / "rules.toml"
    rules.write_text(RULES)
    status = stream_cli.main(["--replay", "--impressions", str(SAMPLE / "impressions" / "*.avro"),
                              "--judgments", str(SAMPLE / "judgments" / "letor_test_labels.avro"),
                              "--metrics", "ndcg@10,ctr", "--window", "1d", "--allowed-lateness", "1h",
                              "--replay-step", "1d", "--slices", "campaign", "--alerts", str(rules),
                              "--quiet", "--output", str(out)])
    assert status == 4  # an alert fired
    return out


def test_feed_of_a_finished_output_is_its_final_panes_alerts_and_counts(replayed):
    feed = OutputFeed(str(replayed), min_interval=0)
    snap = feed.snapshot()
    assert snap["error"] is None and snap["published"] and snap["state"] == "DONE" and snap["run"] == 1
    assert {_key(r): r for r in snap["rows"]} == _final_table(replayed)
    summary = json.loads((replayed / "summary.json").read_text())
    for k, v in summary["counts"].items():
        assert snap["accounting"][k] == v, k
    assert snap["accounting"]["impressions_read"] == 61536 and snap["summary"] == summary["summary"]
    alerts = [json.loads(line) for f in replayed.glob("alerts-*.jsonl") for line in f.read_text().splitlines()]
    assert alerts and len(snap["alerts"]) == min(len(alerts), 50)
    assert {(a["window_start"], a["system"]) for a in snap["alerts"]} <= {
        (a["window_start"], a["system"]) for a in alerts}
    # nothing changed: a poll after the last sequence number gives no row
    again = feed.snapshot(since=snap["seq"], run=snap["run"])
    assert again["rows"] == [] and again["seq"] == snap["seq"]
    # a page of another run (or a new page) gets every row
    assert len(feed.snapshot(since=snap["seq"], run=0)["rows"]) == len(snap["rows"])


def test_feed_follows_pane_files_as_they_appear_and_a_new_run(replayed, tmp_path):
    """Pane files copied one at a time, in the order the job wrote them: each poll gives only the rows
    that changed, a later pane replaces its window's earlier one, and the rows the page keeps end equal
    to the final panes. The files removed (a new run starts in the folder): the feed starts again."""
    out = tmp_path / "out"
    out.mkdir()
    feed = OutputFeed(str(out), min_interval=0)
    first = feed.snapshot()
    assert first["rows"] == [] and first["folder"] == str(out)
    panes = sorted(replayed.glob("metrics-*.jsonl"), key=lambda f: (f.name.split("-pane")[1], f.name))
    kept, seq, changed = {}, first["seq"], 0
    for f in panes:
        shutil.copy(f, out / f.name)
        snap = feed.snapshot(since=seq, run=first["run"])
        assert snap["run"] == first["run"]
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        assert {_key(r) for r in snap["rows"]} == {_key(r) for r in rows}  # this pane's rows, nothing else
        changed += sum(_key(r) in kept for r in snap["rows"])
        kept.update({_key(r): r for r in snap["rows"]})
        seq = snap["seq"]
    assert changed > 0  # late panes replaced on-time ones
    assert kept == _final_table(replayed)
    for f in out.iterdir():
        f.unlink()
    (out / panes[0].name).write_bytes(panes[0].read_bytes())
    snap = feed.snapshot(since=seq, run=first["run"])
    assert snap["run"] == first["run"] + 1 and len(snap["rows"]) == len(panes[0].read_text().splitlines())


def test_feed_of_an_output_on_s3_reads_the_published_run_folder(s3_server, monkeypatch, tmp_path):
    """The stream job writes to S3 (moto's server): its run folder ``runs/<id>/`` and the manifest
    naming it; the feed finds the folder and gives the same rows as the job's own reader."""
    from .fixtures_s3 import ACCESS_KEY, REGION, SECRET_KEY

    for name, value in (("AWS_ENDPOINT_URL_S3", s3_server.endpoint), ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY), ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(name, value)
    url = s3_server.url(f"{s3_server.prefix('dashboard')}/out")
    status = stream_cli.main(["--replay", "--impressions", str(SAMPLE / "impressions" / "letor_*.avro"),
                              "--judgments", str(SAMPLE / "judgments" / "letor_test_labels.avro"),
                              "--metrics", "ndcg@10,map", "--window", "1d", "--replay-step", "1d", "--quiet",
                              "--output", url, *s3_server.beam_args])
    assert status == 0
    snap = OutputFeed(url, min_interval=0).snapshot()
    assert snap["error"] is None and snap["published"] and "/runs/" in snap["folder"]
    assert {_key(r): r for r in snap["rows"]} == _final_table(url) and len(snap["rows"]) == 4


def test_dashboard_refusals(tmp_path, monkeypatch, capsys):
    assert dashboard.main([str(tmp_path), "--poll", "0"]) == 2
    assert "--poll must be in [0.05, 3600] seconds" in capsys.readouterr().err
    monkeypatch.setenv("STREAMEVAL_CACHE", str(tmp_path / "empty-cache"))
    assert dashboard.main([str(tmp_path), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uplot is not in the cache" in err[0] and "cluster fetch dashboard" in err[0]


def test_the_port_taken_is_a_usage_error(tmp_path, capsys):
    if engines.missing(["uplot"]):
        pytest.skip(engines.missing(["uplot"])[0])
    server = dashboard.serve(str(tmp_path), port=0)
    try:
        port = server.server_address[1]
        assert dashboard.main([str(tmp_path), "--port", str(port)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"cannot listen on 127.0.0.1:{port}" in err[0]
    finally:
        server.server_close()


# ------------------------------------------------------------------------------------------------
# the page, live, in headless Chromium


def _start(argv, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streameval.cli", *argv], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(30)
    return proc.returncode


def _wait(cond, what, timeout=180.0, logs=()):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            tails = "\n".join(f"--- {p}:\n{Path(p).read_text()[-3000:]}" for p in logs if Path(p).exists())
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.1)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"headless Chromium not installed ({CHROMIUM} absent; "
                                                            "apt-get install chromium)")
def test_page_draws_panes_as_a_watched_stream_writes_them(tmp_path):
    """A ``stream --watch`` job (local runner, daily windows, early panes every 500 request
    updates) and ``streameval dashboard`` on its output; Chromium opens the page before the first file.
    Files of six hours each are dropped one by one: early points appear while the first day is open;
    after SIGINT ends the job, every point is a final pane, the page's rows equal the job's final
    panes, its accounting shows the records read and its alert table the alerts."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    if engines.missing(["uplot"]):
        pytest.fail(engines.missing(["uplot"])[0], pytrace=False)
    imps, judg, day0 = _week()
    six = 6 * 3_600_000_000
    buckets: dict = {}
    for r in imps:
        buckets.setdefault((r["timestamp"] - day0) // six, []).append(r)
    watch, out = tmp_path / "watch", tmp_path / "out"
    watch.mkdir()
    _drop(judg, str(tmp_path / "judgments.avro"), "judgment")
    (tmp_path / "rules.toml").write_text(RULES)
    job_log, dash_log = tmp_path / "stream.log", tmp_path / "dashboard.log"
    job = _start(["stream", "--watch", "--impressions", str(watch / "*.avro"), "--judgments",
                  str(tmp_path / "judgments.avro"), "--metrics", "ndcg@10,ctr", "--window", "1d",
                  "--early-count", "500", "--watch-interval", "0.1", "--alerts", str(tmp_path / "rules.toml"),
                  "--quiet", "--output", str(out)], job_log)
    dash = _start(["dashboard", str(out), "--port", "0", "--poll", "0.2"], dash_log)
    logs = (job_log, dash_log)
    try:
        _wait(lambda: "dashboard: http" in dash_log.read_text(), "the dashboard's address", 60, logs)
        url = dash_log.read_text().split("dashboard: ", 1)[1].split()[0]
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(url)
            page.wait_for_function("window.streamevalDashboard && streamevalDashboard.polls() > 0")
            assert page.evaluate("streamevalDashboard.points()") == 0 and page.is_visible("#waiting")
            order = sorted(buckets)
            for i, b in enumerate(order):
                if i == 4:
                    # before the first file of the second day: the first day's early panes are on the page
                    # (hollow points), its window still open, the job waiting for more files
                    page.wait_for_function("streamevalDashboard.earlyPoints() > 0", timeout=180_000)
                    assert page.evaluate("streamevalDashboard.finalPoints()") == 0 and job.poll() is None
                    page.screenshot(path=str(tmp_path / "dashboard-early.png"), full_page=True)
                _drop(buckets[b], str(watch / f"part-{b:03d}.avro"))
                page.wait_for_timeout(300)
            # a day's final panes come once a later day's file moved the watermark past its end
            page.wait_for_function("streamevalDashboard.finalPoints() > 0", timeout=180_000)
            time.sleep(2)  # the watcher has read the last file
            assert _stop(job, signal.SIGINT) == 4, job_log.read_text()[-3000:]  # 4: an alert fired
            page.wait_for_function("document.getElementById('summary').textContent.includes('published')",
                                   timeout=60_000)
            page.wait_for_timeout(600)
            final = _final_table(out)
            shown = {_key(r): r for r in page.evaluate("streamevalDashboard.rows()")}
            assert shown == final
            assert page.evaluate("streamevalDashboard.earlyPoints()") == 0
            on_all = {(k[0], k[3], k[4]) for k in final if k[2] == page.evaluate("streamevalDashboard.slice()")}
            assert page.evaluate("streamevalDashboard.finalPoints()") == len(on_all)
            read = page.text_content("tr[data-counter=impressions_read] td.n")
            assert read.replace(",", "") == str(len(imps))
            alerts = [line for f in out.glob("alerts-*.jsonl") for line in f.read_text().splitlines()]
            assert alerts and page.locator("tr.alert").count() == min(len(alerts), 50)
            assert sorted(page.evaluate("streamevalDashboard.charts()")) == ["ctr", "ctr@pos1", "ctr@pos2",
                                                                            "ctr@pos3", "ndcg@10"]
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            for png in (shot, tmp_path / "dashboard-early.png"):
                assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
            browser.close()
            assert errors == []
    finally:
        _stop(job, signal.SIGKILL)
        assert _stop(dash) in (143, -signal.SIGTERM)
