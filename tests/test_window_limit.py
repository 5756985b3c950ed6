"""Issue 36, item 6: `--window 7d/1s` puts each record in 604,800 sliding windows (7 days / 1 second);
both jobs ran for ever on a handful of impressions, without a message. Sliding windows above a limit
of windows per record (1,000 unless `--max-windows-per-record` raises it) are refused when the window
is parsed, before the job starts: exit 2 and one line naming the count. The library paths that take
a sliding window (`WindowSpec`, `StreamMetrics`, `ColumnarMetrics`, `CleanImpressions`,
`ScoreRankings`, `ClickMetrics`) apply the same limit.

The refusals run the command in a subprocess with a timeout, so that a job that starts (today's
main: it does not end) fails the test instead of hanging it."""
import re
import subprocess
import sys

import apache_beam as beam
import pytest

from streameval import cli
from streameval.io import avro
from streameval.io.tables import read_metrics

from .conftest import REPO

T0 = 1_732_406_400 * 1_000_000  # 2024-11-24T00:00:00Z, micros
S = 1_000_000


@pytest.fixture(scope="module")
def one_impression(tmp_path_factory):
    """One clicked impression at 00:10:00.5 (one request, one item)."""
    path = tmp_path_factory.mktemp("limit") / "imps.avro"
    avro.write_records(path, "impression", [
        {"event_id": "e1", "request_id": "r1", "query_id": "q1", "user_id": None, "system_id": "A",
         "item_id": "d1", "position": 1, "score": 1.0, "clicked": True, "timestamp": T0 + 600 * S + S // 2,
         "propensity": None, "attributes": {}}])
    return str(path)


def _run(*argv, timeout=180):
    return subprocess.run([sys.executable, "-c", "import sys; from streameval.cli import main; sys.exit(main())",
                           *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


JOBS = {"batch": ["batch"], "batch-records": ["batch", "--engine", "records"], "stream": ["stream", "--replay"]}


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("window", [["--window", "7d/1s"], ["--window", "7d", "--every", "1s"]],
                         ids=["short", "long"])
def test_both_jobs_refuse_7d_every_1s_naming_the_count(job, window, one_impression, tmp_path):
    try:
        res = _run(*JOBS[job], "--impressions", one_impression, *window, "--output", str(tmp_path / "out"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"streameval {job} {' '.join(window)} started the job instead of refusing the window")
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr == ("error: --window 7d/1s puts each record in 604,800 windows; the limit is 1,000 "
                          "(--max-windows-per-record)\n")
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("job", JOBS)
def test_a_window_at_the_limit_runs(job, one_impression, tmp_path, capsys):
    """1000s/1s: 1,000 windows per record, the default limit. By hand: the impression at 00:10:00.5
    counts in the 1,000 windows of 1000 s starting every second from 00:10:00 - 999 s to 00:10:00,
    each with CTR 1/1."""
    out = tmp_path / "out"
    assert cli.main([*JOBS[job], "--impressions", one_impression, "--window", "1000s/1s", "--quiet",
                     "--output", str(out)]) == 0, capsys.readouterr().err
    rows = [r for r in read_metrics(str(out), final_only=True) if r["metric"] == "ctr" and r["slice"] == "all"]
    start = T0 + 600 * S
    assert sorted(r["window_start"] for r in rows) == [start - k * S for k in range(999, -1, -1)]
    assert all(r["window_end"] - r["window_start"] == 1000 * S for r in rows)
    assert {(r["value"], r["num_queries"]) for r in rows} == {(1.0, 1)}


class _WouldRun(BaseException):
    """Raised instead of building the Beam pipeline: every option check passed."""


@pytest.mark.parametrize("job", JOBS)
def test_the_option_raises_the_limit(job, one_impression, tmp_path, monkeypatch, capsys):
    """--max-windows-per-record 3600 lets 1h/1s (3,600 windows per record) pass the checks (the job
    is not run: building its pipeline raises); 3599 refuses it naming 3,600."""
    argv = [*JOBS[job], "--impressions", one_impression, "--window", "1h/1s", "--output", str(tmp_path / "out")]
    assert cli.main([*argv, "--max-windows-per-record", "3599"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --window 1h/1s puts each record in 3,600 windows; the limit is 3,599 (--max-windows-per-record)\n"

    def would_run(self, *a, **k):
        raise _WouldRun()

    monkeypatch.setattr(beam.Pipeline, "apply", would_run)
    with pytest.raises(_WouldRun):
        cli.main([*argv, "--max-windows-per-record", "3600"])


@pytest.mark.parametrize("job", ["batch", "stream"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_the_option_must_be_positive(job, value, one_impression, tmp_path, capsys):
    argv = ["stream", "--replay"] if job == "stream" else ["batch"]
    assert cli.main([*argv, "--impressions", one_impression, "--window", "1h", "--max-windows-per-record", value,
                     "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --max-windows-per-record must be a positive whole number of windows, got {value}\n"


def test_the_library_paths_apply_the_limit():
    from streameval.beam.columnar import ColumnarMetrics
    from streameval.beam.streaming import StreamMetrics, WindowSpec
    from streameval.beam.transforms import CleanImpressions, ClickMetrics, ScoreRankings

    week, second = 7 * 86400, "1s"
    message = "puts each record in 604,800 windows; the limit is 1,000 (max_windows_per_record)"
    makers = {
        "WindowSpec.parse": lambda **k: WindowSpec.parse("7d/1s", **k),
        "WindowSpec.sliding": lambda **k: WindowSpec.sliding("7d", "1s", **k),
        "StreamMetrics": lambda **k: StreamMetrics(window="7d/1s", **k),
        "ColumnarMetrics": lambda **k: ColumnarMetrics(["x.avro"], [], window=week, every=second, **k),
        "CleanImpressions": lambda **k: CleanImpressions(window=week, every=second, **k),
        "ScoreRankings": lambda **k: ScoreRankings(None, ["P@1"], window=week, every=second, **k),
        "ClickMetrics": lambda **k: ClickMetrics(window=week, every=second, **k),
    }
    for name, make in makers.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            make()
        make(max_windows_per_record=604_800)  # raised to the count: accepted
    assert WindowSpec.sliding("7d", "1s", max_windows_per_record=604_800).per_window == 604_800
    assert WindowSpec.parse("1000s/1s").per_window == 1000  # at the limit
