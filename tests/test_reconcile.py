"""``streameval reconcile``: matching, tolerances, one-sided rows, panes, correlations, formats and
the exit status, on a real batch job's output and on hand-made tables."""

import csv
import io
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from scipy import stats

from streameval.commands import reconcile
from streameval.io import avro

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 86_400_000_000
T0 = 1_574_553_600_000_000  # 2019-11-24T00:00:00Z


def run(argv):
    out = io.StringIO()
    rc = reconcile.main([str(a) for a in argv], out=out)
    return rc, out.getvalue()


def row(ws, metric, value, system="bts", slice_="all", n=100, **extra):
    r = {"window_start": ws, "window_end": None if ws is None else ws + DAY, "slice": slice_, "system": system,
         "metric": metric, "value": value, "num_queries": n, "stderr": None, "ci_low": None, "ci_high": None,
         "ci_level": None, "ci_method": None, "pane": None, "pane_index": None, "is_final": None}
    r.update(extra)
    return r


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}) + "\n")
    return path


def iso(micros):
    return datetime.fromtimestamp(micros / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def batch_output(tmp_path_factory):
    """A real batch job: daily CTR of one bundled Open Bandit file (metrics.avro and .jsonl)."""
    from streameval.jobs import batch

    out = tmp_path_factory.mktemp("batch") / "out"
    src = os.path.join(REPO, "data", "sample", "impressions", "obd_bts_men.avro")
    if not os.path.exists(src):
        pytest.skip(f"bundled sample not found: {src}")
    assert batch.main(["--impressions", src, "--window", "1d", "--output", str(out), "--quiet"]) == 0
    return out


def test_honest_pair_agrees(batch_output):
    rc, text = run([batch_output / "metrics.avro", batch_output / "metrics.jsonl"])
    n = len(list(avro.read_records(str(batch_output / "metrics.avro"))))
    assert rc == 0, text
    assert f"matched {n} rows" in text and "0 differ" in text and "0 only in A; 0 only in B" in text
    assert text.rstrip().endswith("AGREE")
    # an output directory is read as its metrics.avro
    assert run([batch_output, batch_output / "metrics.jsonl"])[0] == 0


def test_planted_one_window_difference_is_found(batch_output, tmp_path):
    rows = list(avro.read_records(str(batch_output / "metrics.avro")))
    windows = sorted({r["window_start"] for r in rows})
    assert len(windows) == 7  # one week, daily
    victim = next(r for r in rows if r["window_start"] == windows[3] and r["metric"] == "ctr")
    changed = [dict(r) for r in rows]
    for r in changed:
        if r["window_start"] == victim["window_start"] and r["metric"] == "ctr" \
                and r["slice"] == victim["slice"] and r["system"] == victim["system"]:
            r["value"] = r["value"] + 1e-4
    avro.write_records(tmp_path / "changed.avro", "metric_result", changed)
    rc, text = run([batch_output / "metrics.avro", tmp_path / "changed.avro", "--json", tmp_path / "r.json"])
    assert rc == 1 and "1 differ" in text and text.rstrip().endswith("DISAGREE")
    report = json.load(open(tmp_path / "r.json"))
    assert len(report["differences"]) == 1 and not report["only_a"] and not report["only_b"]
    d = report["differences"][0]
    assert (d["window_start"], d["metric"], d["system"], d["slice"]) == (windows[3], "ctr", "bts", victim["slice"])
    assert abs(d["diff"] - 1e-4) < 1e-12 and d["value_differs"] and not d["count_differs"]
    assert iso(windows[3]) in text
    # within a looser tolerance it agrees
    assert run([batch_output / "metrics.avro", tmp_path / "changed.avro", "--abs-tol", "2e-4"])[0] == 0


def test_a_jobs_csv_is_compared_on_its_count_n(tmp_path):
    """A job's metrics.csv (the typed table) holds the count in ``n``; its ``num_queries`` is empty on
    CTR rows (impressions): the counts are compared all the same, and a changed one is found."""
    from streameval.jobs import batch

    out = tmp_path / "out"
    src = os.path.join(REPO, "data", "sample", "impressions", "obd_bts_men.avro")
    assert batch.main(["--impressions", src, "--window", "1d", "--formats", "jsonl,csv", "--output", str(out),
                       "--quiet"]) == 0
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["num_queries"] == "" and int(r["n"]) > 0 for r in rows)
    rc, text = run([out / "metrics.csv", out / "metrics.jsonl", "--json", tmp_path / "r.json"])
    assert rc == 0, text
    rows[0]["n"] = str(int(rows[0]["n"]) + 1)
    with open(tmp_path / "changed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    rc, text = run([tmp_path / "changed.csv", out / "metrics.jsonl", "--json", "-"])
    assert rc == 1 and [d["count_differs"] for d in json.loads(text)["differences"]] == [True]


def test_dashboard_csv_with_rounding_and_iso_windows(tmp_path):
    a = [row(T0 + i * DAY, m, v, n=1000 + i) for i in range(3) for m, v in (("ctr", 0.0051234 + i / 1e4),
                                                                             ("ndcg@10", 0.61 + i / 100))]
    write_jsonl(tmp_path / "a.jsonl", a)
    with open(tmp_path / "dash.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_start", "window_end", "slice", "system", "metric", "value"])
        for r in a:
            w.writerow([iso(r["window_start"]), iso(r["window_end"]), r["slice"], r["system"], r["metric"],
                        f"{r['value']:.4f}"])
    rc, text = run([tmp_path / "a.jsonl", tmp_path / "dash.csv"])
    assert rc == 1 and "3 differ" in text  # the ctr values lost digits
    rc, text = run([tmp_path / "a.jsonl", tmp_path / "dash.csv", "--abs-tol", "5e-5"])
    assert rc == 0, text
    # relative tolerance: 0.0051234 vs 0.0051 is 0.46 % off
    assert run([tmp_path / "a.jsonl", tmp_path / "dash.csv", "--rel-tol", "0.004"])[0] == 1
    assert run([tmp_path / "a.jsonl", tmp_path / "dash.csv", "--rel-tol", "0.005"])[0] == 0
    # integer-microsecond windows and the global window ("" / global) read too
    with open(tmp_path / "micros.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_start", "window_end", "slice", "system", "metric", "value", "num_queries"])
        w.writerow([T0, T0 + DAY, "all", "bts", "ctr", 0.0051234, 1000])
        w.writerow(["global", "", "all", "bts", "map", "", 5])
    write_jsonl(tmp_path / "b.jsonl", [row(T0, "ctr", 0.0051234, n=1000), row(None, "map", math.nan, n=5)])
    assert run([tmp_path / "micros.csv", tmp_path / "b.jsonl"])[0] == 0


def test_one_sided_rows_counts_and_nan(tmp_path):
    a = [row(T0, "ctr", 0.5), row(T0 + DAY, "ctr", 0.4), row(T0, "auc", math.nan)]
    b = [row(T0, "ctr", 0.5), row(T0, "auc", math.nan), row(T0, "map", 0.3)]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    rc, text = run([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert rc == 1 and "0 differ" in text and "1 only in A; 1 only in B" in text
    assert "only in A:" in text and "only in B:" in text
    assert run([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--allow-one-sided"])[0] == 0
    # a different count is a difference; NaN against a number too
    write_jsonl(tmp_path / "c.jsonl", [row(T0, "ctr", 0.5, n=99), row(T0 + DAY, "ctr", 0.4), row(T0, "auc", 0.5)])
    rc, text = run([tmp_path / "a.jsonl", tmp_path / "c.jsonl", "--json", "-"])
    rep = json.loads(text)
    assert rc == 1 and len(rep["differences"]) == 2
    kinds = {(d["metric"], d["count_differs"], d["value_differs"]) for d in rep["differences"]}
    assert kinds == {("ctr", True, False), ("auc", False, True)}
    assert run([tmp_path / "a.jsonl", tmp_path / "c.jsonl", "--ignore-counts", "--metrics", "ctr"])[0] == 0


def test_streaming_panes_use_the_final_pane(tmp_path):
    a = [row(T0, "ctr", 0.1, pane="early", pane_index=0, is_final=False),
         row(T0, "ctr", 0.3, pane="on_time", pane_index=1, is_final=True),
         row(T0, "ctr", 0.2, pane="late", pane_index=2, is_final=False),
         row(T0 + DAY, "ctr", 0.7, pane="early", pane_index=0, is_final=False),
         row(T0 + DAY, "ctr", 0.8, pane="early", pane_index=1, is_final=False)]
    write_jsonl(tmp_path / "s.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", [row(T0, "ctr", 0.3), row(T0 + DAY, "ctr", 0.8)])
    assert run([tmp_path / "s.jsonl", tmp_path / "b.jsonl"])[0] == 0
    write_jsonl(tmp_path / "dup.jsonl", [row(T0, "ctr", 0.3), row(T0, "ctr", 0.4)])
    rc = reconcile.main([str(tmp_path / "dup.jsonl"), str(tmp_path / "b.jsonl")], out=io.StringIO())
    assert rc == 2


def test_correlation_matches_scipy(tmp_path):
    xs = [0.61, 0.64, 0.58, 0.70, 0.66, 0.59, 0.72, 0.63]
    ys = [0.0050, 0.0052, 0.0047, 0.0061, 0.0049, 0.0048, 0.0060, 0.0055]
    offline = [row(T0 + i * DAY, "ndcg@10", x) for i, x in enumerate(xs)]
    online = [row(T0 + i * DAY, "ctr", y, n=5000) for i, y in enumerate(ys)] + [row(T0 + 99 * DAY, "ctr", 0.9)]
    write_jsonl(tmp_path / "off.jsonl", offline)
    write_jsonl(tmp_path / "on.jsonl", online)
    rc, text = run([tmp_path / "off.jsonl", tmp_path / "on.jsonl", "--correlate", "ndcg@10:ctr", "--allow-one-sided",
                    "--json", "-"])
    rep = json.loads(text)
    c = rep["correlations"][0]
    assert c["n"] == 8 and c["source_x"] == "A" and c["source_y"] == "B"
    assert abs(c["pearson"] - stats.pearsonr(xs, ys)[0]) < 1e-12
    assert abs(c["kendall"] - stats.kendalltau(xs, ys)[0]) < 1e-12
    assert abs(c["kendall_p"] - stats.kendalltau(xs, ys)[1]) < 1e-12
    assert rc == 0  # metrics in different tables are one-sided rows, allowed here
    rc, text = run([tmp_path / "off.jsonl", tmp_path / "on.jsonl", "--correlate", "ndcg@10:ctr", "--allow-one-sided",
                    "--min-correlation", "0.9"])
    assert rc == 1 and "below --min-correlation" in text and "Pearson r = " in text
    # both metrics in one table
    write_jsonl(tmp_path / "both.jsonl", offline + online)
    c2 = reconcile.correlate(reconcile.read_table(str(tmp_path / "both.jsonl")),
                             reconcile.read_table(str(tmp_path / "both.jsonl")), "ndcg@10", "ctr")
    assert c2["n"] == 8 and abs(c2["pearson"] - c["pearson"]) < 1e-15


def test_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "bad.csv").write_text("window_start,slice,system,metric,value\n,all,a,ctr,0.1\n")
    write_jsonl(tmp_path / "ok.jsonl", [row(T0, "ctr", 0.1)])
    assert reconcile.main([str(tmp_path / "bad.csv"), str(tmp_path / "ok.jsonl")], out=io.StringIO()) == 2
    assert "window_end" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert reconcile.main([str(tmp_path / "bad.jsonl"), str(tmp_path / "ok.jsonl")], out=io.StringIO()) == 2
    assert reconcile.main([str(tmp_path / "missing.avro"), str(tmp_path / "ok.jsonl")], out=io.StringIO()) == 2
    assert reconcile.main([str(tmp_path / "ok.jsonl"), str(tmp_path / "ok.jsonl"), "--correlate", "x"],
                          out=io.StringIO()) == 2


def test_cli_entry_does_not_import_beam(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [row(T0, "ctr", 0.1)])
    code = ("import sys; from streameval import cli; rc = cli.main(['reconcile', sys.argv[1], sys.argv[1]]); "
            "assert 'apache_beam' not in sys.modules, 'Beam imported'; sys.exit(rc)")
    env = dict(os.environ, PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.jsonl")], capture_output=True, text=True,
                         env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "AGREE" in res.stdout


def test_tolerances_and_csv_panes_cannot_give_a_wrong_verdict(tmp_path, capsys):
    """Issue 20, item 7: ``--abs-tol nan`` said AGREE for 0.5 against 0.9; a CSV's pane_index was
    compared as text (pane 9 beat pane 10) and its is_final "false" counted as true."""
    write_jsonl(tmp_path / "a.jsonl", [row(T0, "ctr", 0.5)])
    write_jsonl(tmp_path / "b.jsonl", [row(T0, "ctr", 0.9)])
    for bad in (["--abs-tol", "nan"], ["--rel-tol", "nan"], ["--abs-tol", "inf"], ["--rel-tol", "-1"],
                ["--min-correlation", "nan"]):
        assert reconcile.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), *bad], out=io.StringIO()) == 2, bad
        assert "must be" in capsys.readouterr().err
    with pytest.raises(ValueError, match="abs_tol"):
        reconcile.compare({}, {}, abs_tol=math.nan)
    assert run([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])[0] == 1
    # a dashboard export of a streaming table: panes as text
    with open(tmp_path / "panes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_start", "window_end", "slice", "system", "metric", "value", "pane_index", "is_final"])
        w.writerow([T0, T0 + DAY, "all", "bts", "ctr", 0.1, "9", "false"])
        w.writerow([T0, T0 + DAY, "all", "bts", "ctr", 0.9, "10", "false"])   # the later pane
        w.writerow([T0 + DAY, T0 + 2 * DAY, "all", "bts", "ctr", 0.2, "0", "true"])  # final
        w.writerow([T0 + DAY, T0 + 2 * DAY, "all", "bts", "ctr", 0.3, "1", "False"])
    write_jsonl(tmp_path / "want.jsonl", [row(T0, "ctr", 0.9), row(T0 + DAY, "ctr", 0.2)])
    rc, text = run([tmp_path / "panes.csv", tmp_path / "want.jsonl"])
    assert rc == 0, text
    with open(tmp_path / "badpane.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["window_start", "window_end", "slice", "system", "metric", "value", "pane_index", "is_final"])
        w.writerow([T0, T0 + DAY, "all", "bts", "ctr", 0.1, "x", "maybe"])
    assert reconcile.main([str(tmp_path / "badpane.csv"), str(tmp_path / "want.jsonl")], out=io.StringIO()) == 2
    assert "badpane.csv:2" in capsys.readouterr().err


def test_zero_rows_compared_is_a_failure(tmp_path, capsys):
    """Issue 36: two empty tables (or no key in both, or --metrics naming none of the tables'
    metrics) compared no row and said AGREE with exit status 0. Nothing compared is no agreement:
    exit status 1 (streameval.exits.EXIT_FAILED) and one line on stderr."""
    from streameval.exits import EXIT_FAILED

    write_jsonl(tmp_path / "e1.jsonl", [])
    write_jsonl(tmp_path / "e2.jsonl", [])
    rc, text = run([tmp_path / "e1.jsonl", tmp_path / "e2.jsonl"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILED == 1
    assert err == ("streameval reconcile: no rows were compared: no (window, slice, system, metric) key is in both "
                   "tables (A 0 rows, B 0 rows)\n")
    assert text.rstrip().endswith("NO ROWS COMPARED") and "AGREE" not in text
    rc, text = run([tmp_path / "e1.jsonl", tmp_path / "e2.jsonl", "--json", "-"])
    rep = json.loads(text)
    assert rc == 1 and rep["matched"] == 0 and rep["agree"] is False and rep["compared"] is False
    # disjoint keys with one-sided rows allowed: nothing compared either
    write_jsonl(tmp_path / "a.jsonl", [row(T0, "ctr", 0.5)])
    write_jsonl(tmp_path / "b.jsonl", [row(T0 + DAY, "ctr", 0.5)])
    capsys.readouterr()
    assert run([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--allow-one-sided"])[0] == 1
    assert "A 1 rows, B 1 rows" in capsys.readouterr().err
    # --metrics naming a metric neither table has: a typo, exit 2 (issue 41; the test below)
    rc, _ = run([tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--metrics", "map"])
    assert rc == 2
    assert capsys.readouterr().err == ("streameval reconcile: --metrics: metric 'map' matches no row of either table; "
                                       "closest metric names present: ctr\n")
    # --correlate over no common key compares nothing either (over common keys it does: above)
    assert run([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--allow-one-sided", "--correlate", "ctr:ctr"])[0] == 1
    assert "nor does a --correlate pair have a (window, slice, system) key in common" in capsys.readouterr().err
    # one row in both: compared, and they agree
    assert run([tmp_path / "a.jsonl", tmp_path / "a.jsonl"])[0] == 0
    assert capsys.readouterr().err == ""


def test_a_metric_filter_that_matches_nothing_is_refused(tmp_path, capsys):
    """Issue 41: ``reconcile A A --metrics ndgc@10`` compared 0 rows. A --metrics or --correlate
    name that is no row's metric in either table is exit 2 naming the three closest metrics the
    tables have (by hand: ndgc@10 is one transposition from ndcg@10; P@10 and mrr@10 share its tail)."""
    from streameval.exits import EXIT_USAGE

    metrics = ["ndcg@10", "map", "mrr@10", "P@10", "err@10", "ctr"]
    write_jsonl(tmp_path / "a.jsonl", [row(T0, m, 0.5) for m in metrics])
    rc, text = run([tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--metrics", "ndgc@10"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE == 2 and "AGREE" not in text
    assert err.startswith("streameval reconcile: --metrics: metric 'ndgc@10' matches no row of either table; "
                          "closest metric names present: ndcg@10, ")
    assert err.count("\n") == 1 and len(err.split("present: ")[1].split(", ")) == 3
    # one typo among good names is still refused; any spelling of a present metric is accepted
    assert run([tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--metrics", "ndcg@10,mapp"])[0] == 2
    assert "metric 'mapp' matches no row" in capsys.readouterr().err
    assert run([tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--metrics", "nDCG@10,ndcg_cut_10,AP"])[0] == 0
    # a metric of one table only selects rows (one-sided), so it is no typo
    write_jsonl(tmp_path / "b.jsonl", [row(T0, "ctr", 0.5)])
    assert run([tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--metrics", "map"])[0] == 1
    capsys.readouterr()
    # --correlate: each side must be some row's metric
    rc, _ = run([tmp_path / "a.jsonl", tmp_path / "a.jsonl", "--correlate", "ndcg@10:crt"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("streameval reconcile: --correlate ndcg@10:crt: metric 'crt' matches no row "
                                      "of either table; closest metric names present: ctr, ")
