"""``streameval report``: reading metric rows (Avro and JSON lines), choosing panes and intervals,
PNG plots and the self-contained HTML page (rendered in headless Chromium when installed), on rows
made by the batch job; and the progress-bar helper."""

import base64
import io
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sst

from streameval.jobs import batch
from streameval.io import progress
from streameval.beam.transforms import metric_row
from streameval.commands import report
from streameval.io import avro, convert, records, trec
from streameval.metrics import stats

from .conftest import REPO
from .test_compare import write_trec

CHROMIUM = "/usr/bin/chromium"
DAY = 86_400_000_000


def png_size(data: bytes):
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(data), format="png")
    return img.shape[1], img.shape[0]


def constructed_rows():
    rows = []
    for d in range(3):
        for system, p in (("a", 0.02), ("b", 0.03)):
            n = 1000 + d
            rows.append(metric_row(d * DAY, (d + 1) * DAY, "all", system, "ctr", round(p * n) / n, n,
                                   math.sqrt(p * (1 - p) / n)))
    rows.append(metric_row(None, None, "all", "a", "ndcg@10", 0.4, 50, 0.04, ci_low=0.33, ci_high=0.47,
                           ci_level=0.9, ci_method="bootstrap"))
    rows.append(metric_row(None, None, "all", "b", "ndcg@10", 0.5, 50, 0.03))
    rows.append(metric_row(None, None, "all", "b", "num_rel", 1200.0, 50, None))
    return rows


# --------------------------------------------------------------------------------------------
# reading and preparing rows


def test_read_rows_from_avro_and_jsonl(tmp_path):
    rows = constructed_rows()
    avro.write_records(tmp_path / "m.avro", "metric_result", rows)
    (tmp_path / "m.jsonl").write_text("\n".join(records.to_json_text(r) for r in rows) + "\n")
    a = report.read_rows([tmp_path / "m.avro"])
    j = report.read_rows([tmp_path / "m.jsonl"])
    strip = [{k: v for k, v in r.items() if k != "_source"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "_source"} for r in j]
    assert strip == rows
    (tmp_path / "d").mkdir()
    shutil.copy(tmp_path / "m.jsonl", tmp_path / "d" / "metrics.jsonl")
    # a directory is a job's output: without its manifest (a killed job) it is refused
    with pytest.raises(ValueError, match="no manifest.json"):
        report.read_rows([tmp_path / "d"])
    size = (tmp_path / "d" / "metrics.jsonl").stat().st_size
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(
        {"complete": True, "outputs": {"metrics.jsonl": [{"path": "metrics.jsonl", "bytes": size}]}}))
    got = report.read_rows([tmp_path / "d"])
    assert len(got) == len(rows) and {r["_source"] for r in got} == {"d"}
    (tmp_path / "bad.jsonl").write_text('{"metric": "x"}\n')
    with pytest.raises(ValueError, match="lacks"):
        report.read_rows([tmp_path / "bad.jsonl"])


def test_prepare_rows_intervals_panes_and_sources():
    rows = [dict(r, _source="x.avro") for r in constructed_rows()]
    prepared = {(r["window_start"], r["system"], r["metric"]): r for r in report.prepare_rows(rows, 0.95)}
    ctr = prepared[(0, "a", "ctr")]
    want = sst.binomtest(20, 1000).proportion_ci(0.95, method="wilson")
    assert ctr["ci_method"] == "wilson" and ctr["_ci_computed"]
    assert (ctr["ci_low"], ctr["ci_high"]) == pytest.approx((want.low, want.high), abs=1e-12)
    own = prepared[(None, "a", "ndcg@10")]
    assert (own["ci_low"], own["ci_high"], own["ci_method"], own["_ci_computed"]) == (0.33, 0.47, "bootstrap", False)
    t = prepared[(None, "b", "ndcg@10")]
    assert (t["ci_low"], t["ci_high"]) == pytest.approx(sst.t.interval(0.95, 49, loc=0.5, scale=0.03))
    assert prepared[(None, "b", "num_rel")]["ci_low"] is None
    # streaming panes: the final pane wins, else the latest
    panes = [dict(rows[0], value=v, pane_index=i, is_final=f) for i, (v, f) in enumerate([(0.1, False), (0.2, True),
                                                                                          (0.3, False)])]
    assert [r["value"] for r in report.prepare_rows(panes)] == [0.2]
    assert [r["value"] for r in report.prepare_rows([dict(p, is_final=None) for p in panes])] == [0.3]
    # the same key from two files: systems carry the file name
    two = report.prepare_rows(rows[:1] + [dict(rows[0], _source="y.avro")])
    assert sorted(r["system"] for r in two) == ["a [x.avro]", "a [y.avro]"]


# --------------------------------------------------------------------------------------------
# the report of batch rows


@pytest.fixture(scope="module")
def batch_outputs(tmp_path_factory):
    """Two batch jobs: daily CTR of part of the bundled Open Bandit sample (both policies, three
    campaigns), and ranking metrics of two small TREC runs (global window)."""
    tmp = tmp_path_factory.mktemp("report_batch")
    imps = []
    for name in ("obd_bts_all", "obd_random_all", "obd_bts_men", "obd_random_men"):
        recs = list(avro.read_records(str(REPO / "data" / "sample" / "impressions" / f"{name}.avro"), "impression"))
        imps.extend(recs[::15])
    avro.write_records(tmp / "obd.avro", "impression", imps)
    obd_out = tmp / "obd_out"
    assert batch.main(["--impressions", str(tmp / "obd.avro"), "--window", "1d", "--slices", "campaign",
                       "--output", str(obd_out), "--quiet"]) == 0
    paths = write_trec(tmp, np.random.default_rng(6), n_queries=12)
    for name in ("a.run", "b.run"):
        run = trec.read_run(str(paths[name]))
        avro.write_records(tmp / f"{name}.avro", "impression", convert.trec_run_to_impressions(run, system_id=name))
    avro.write_records(tmp / "judg.avro", "judgment", convert.trec_qrels_to_judgments(trec.read_qrels(str(paths["qrels"]))))
    run_out = tmp / "run_out"
    assert batch.main(["--impressions", str(tmp / "*.run.avro"), "--judgments", str(tmp / "judg.avro"),
                       "--metrics", "ndcg@5,map", "--no-ctr", "--complete", "--output", str(run_out), "--quiet"]) == 0
    return {"obd": obd_out, "runs": run_out, "tmp": tmp, "n_obd": len(imps)}


@pytest.fixture(scope="module")
def rendered(batch_outputs):
    out = batch_outputs["tmp"] / "report"
    assert report.main([str(batch_outputs["obd"] / "metrics.avro"), str(batch_outputs["runs"] / "metrics.jsonl"),
                        "--out", str(out), "--title", "test report"]) == 0
    return out


def test_report_writes_pngs_and_one_html_page(batch_outputs, rendered):
    rows = report.read_rows([batch_outputs["obd"] / "metrics.avro", batch_outputs["runs"] / "metrics.jsonl"])
    metrics = {r["metric"] for r in rows}
    assert {"ctr", "ctr@pos1", "ndcg@5", "map"} <= metrics
    pngs = sorted(rendered.glob("*.png"))
    # CTR rows are daily (line plots), ranking rows global (bar charts)
    assert {p.name for p in pngs} == {f"{report._slug(m)}_{'windows' if m.startswith('ctr') else 'global'}.png"
                                      for m in metrics}
    page = (rendered / "report.html").read_text()
    embedded = re.findall(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(embedded) == len(pngs)
    files = {p.read_bytes() for p in pngs}
    for b64 in embedded:
        data = base64.b64decode(b64)
        assert data in files
        w, h = png_size(data)
        assert w >= 400 and h >= 300
    assert "src='http" not in page and "<link" not in page and "<script" not in page  # nothing to fetch
    # every row is in a table, with its interval (computed ones marked *)
    assert page.count("<tr><td>") == len(rows)
    r = next(r for r in rows if r["metric"] == "ctr" and r["window_start"] is not None and r["slice"] == "all")
    ci = stats.row_interval("ctr", r["value"], r["num_queries"], r["stderr"])
    # (the batch rows carry no interval yet, or a Wilson / t one once the job computes them: the
    # report computes the same, marked *)
    assert f"{ci['ci_low']:.4f}" in page and re.search(r"<td>wilson\*?</td>", page) and re.search(r"<td>t\*?</td>", page)


def _render_check(html_path: Path, tmp_path: Path) -> str:
    """Open the page in headless Chromium with a small script appended that writes what it sees
    (images decoded with a width, tables, table rows) into the DOM; return that text."""
    page = html_path.read_text()
    script = """<script>
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  var d = document.createElement('div'); d.id = 'render-check';
  d.textContent = 'images=' + imgs.length + ' decoded=' + ok + ' tables=' + document.querySelectorAll('table').length
    + ' rows=' + document.querySelectorAll('table tbody tr').length;
  document.body.appendChild(d);
});
</script></body>"""
    check = tmp_path / "check.html"
    check.write_text(page.replace("</body>", script))
    profile = tmp_path / f"profile-{os.getpid()}-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", check.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r'<div id="render-check">([^<]*)</div>', out.stdout)
    assert m, f"no render check in Chromium's DOM (exit {out.returncode}): {out.stderr[-2000:]}"
    return m.group(1)


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"headless Chromium not installed ({CHROMIUM} absent; "
                                                            "apt-get install chromium)")
def test_report_renders_in_headless_chromium(rendered, tmp_path):
    page = rendered / "report.html"
    n_img = len(list(rendered.glob("*.png")))
    n_rows = page.read_text().count("<tr><td>")
    n_tables = page.read_text().count("<table")
    assert _render_check(page, tmp_path) == f"images={n_img} decoded={n_img} tables={n_tables} rows={n_rows}"
    # the check sees a broken image: corrupt one embedded PNG
    broken = tmp_path / "broken.html"
    text = page.read_text()
    start = text.index("base64,") + len("base64,")
    broken.write_text(text[:start] + "AAAA" + text[start + 4:])
    assert _render_check(broken, tmp_path).startswith(f"images={n_img} decoded={n_img - 1} ")


def test_report_command_errors(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing.avro"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert report.main([str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "no metric rows" in capsys.readouterr().err
    rows = constructed_rows()
    avro.write_records(tmp_path / "m.avro", "metric_result", rows)
    assert report.main([str(tmp_path / "m.avro"), "--out", str(tmp_path / "o"), "--metrics", "ndcg@10"]) == 0
    assert [p.name for p in (tmp_path / "o").glob("*.png")] == ["ndcg_10_global.png"]


def test_report_refuses_a_metric_filter_that_matches_nothing(tmp_path, capsys):
    """Issue 41: ``report --metrics ndgc@10`` said only "no metric rows to report". A --metrics
    name that is no row's metric is exit 2 naming the three closest metrics present (the rows have
    ctr, ndcg@10 and num_rel: all three, ndcg@10 first, the one a transposition away)."""
    avro.write_records(tmp_path / "m.avro", "metric_result", constructed_rows())
    capsys.readouterr()
    assert report.main([str(tmp_path / "m.avro"), "--out", str(tmp_path / "o"), "--metrics", "ndgc@10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streameval report: --metrics: metric 'ndgc@10' matches no row of the inputs; "
                          "closest metric names present: ndcg@10, ")
    assert sorted(err.strip().split("present: ")[1].split(", ")) == ["ctr", "ndcg@10", "num_rel"]
    # one typo among good names is refused too, before anything is written
    assert report.main([str(tmp_path / "m.avro"), "--out", str(tmp_path / "o2"), "--metrics", "ctr,nmu_rel"]) == 2
    assert "metric 'nmu_rel' matches no row" in capsys.readouterr().err and not (tmp_path / "o2").exists()


def test_report_shows_windows_at_the_ends_of_time(tmp_path):
    """Issue 20, item 11: report died ("year 10000 is out of range") on a window after the year 9999,
    and a float conversion put 9999's last microsecond into the year 10000. The last representable
    day is drawn on a date axis; a table with any int64 window start still gives a report, with
    days since 1970 on the axis and the microseconds in the table."""
    last = records.EVENT_TIME_MAX - records.EVENT_TIME_MAX % DAY  # 9999-12-31, as a job windows it
    rows = [metric_row(last - DAY, last, "all", "a", "map", 0.25, 4, 0.1),
            metric_row(last, last + DAY, "all", "a", "map", 0.5, 4, 0.1)]
    avro.write_records(tmp_path / "last.avro", "metric_result", rows)
    assert report.main([str(tmp_path / "last.avro"), "--out", str(tmp_path / "o1")]) == 0
    page = (tmp_path / "o1" / "report.html").read_text()
    assert "9999-12-31 00:00:00 UTC" in page and "9999-12-30 00:00:00 UTC" in page
    assert report._fmt_time(records.EVENT_TIME_MAX) == "9999-12-31 23:59:59 UTC"
    beyond = [metric_row(last + DAY, last + 2 * DAY, "all", "a", "map", 0.75, 4, 0.1), *rows]
    avro.write_records(tmp_path / "beyond.avro", "metric_result", beyond)
    assert report.main([str(tmp_path / "beyond.avro"), "--out", str(tmp_path / "o2")]) == 0
    page = (tmp_path / "o2" / "report.html").read_text()
    assert f"{last + DAY} us since 1970" in page and "9999-12-31 00:00:00 UTC" in page
    assert png_size((tmp_path / "o2" / "map_windows.png").read_bytes())[0] > 100


def test_one_window_plot_spans_its_window_and_shows_the_interval():
    """Issue 21: a plot of one window had a 1968-1972 axis (matplotlib's default around a single
    date) and no interval (a band between one x has no width). The axis now spans the window's width
    either side of its start, and the interval is an error bar from ci_low to ci_high."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    start = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z
    rows = [metric_row(start, start + DAY, "all", "a", "ctr", 0.02, 1000, 0.004, ci_low=0.013, ci_high=0.031)]
    fig = report._plot_windows(plt, "ctr", rows)
    ax = fig.axes[0]
    lo, hi = (mdates.num2date(x) for x in ax.get_xlim())
    assert (lo.isoformat(), hi.isoformat()) == ("2019-11-23T00:00:00+00:00", "2019-11-25T00:00:00+00:00")
    # the error bar's vertical segment: from ci_low to ci_high at the window start
    segments = [seg for c in ax.collections for seg in c.get_segments()]
    assert len(segments) == 1
    (x0, y0), (x1, y1) = segments[0]
    assert x0 == x1 == mdates.date2num(report._dt(start))
    assert (y0, y1) == pytest.approx((0.013, 0.031), abs=1e-15)
    plt.close(fig)
    # two windows: a band, the axis left to matplotlib
    rows.append(metric_row(start + DAY, start + 2 * DAY, "all", "a", "ctr", 0.03, 1000, 0.005,
                           ci_low=0.021, ci_high=0.043))
    fig = report._plot_windows(plt, "ctr", rows)
    band = fig.axes[0].collections
    assert len(band) == 1 and not hasattr(band[0], "get_segments")
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# progress


def test_progress_bar_on_and_off(capsys):
    silent = progress.bar(range(5), enable=False)
    assert list(silent) == list(range(5)) and silent.n == 5
    shown = progress.bar(total=30, desc="work", enable=True, mininterval=0)
    shown.update(30)
    shown.close()
    err = capsys.readouterr().err
    assert "work" in err and "30/30" in err


_TICKED: list = []


def _keep(x):
    _TICKED.append(x)


def test_ticker_counts_elements_in_a_pipeline(capsys):
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    paths = [str(REPO / "data" / "sample" / "impressions" / "obd_bts_men.avro")]
    total = progress.count_avro_records(paths)
    assert total == sum(1 for _ in avro.read_records(paths, "impression"))
    progress.close_all()  # counts an earlier command left in this process (a stream job's rows) are not this one's
    _TICKED.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        (p | beam.Create(list(range(2500)), reshuffle=False)
         | beam.Map(progress.Ticker("elements", total=2500, every=1000, enable=True)) | beam.Map(_keep))
    assert sorted(_TICKED) == list(range(2500))  # elements pass unchanged
    assert progress.counts() == {"elements": 2500}
    progress.close_all()
    assert progress.counts() == {}
    assert "2.50k/2.50k" in capsys.readouterr().err
