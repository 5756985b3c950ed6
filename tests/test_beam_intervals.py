"""Every batch row carries its interval (t for ranking metrics, Wilson for CTR, or the Poisson
bootstrap), and the batch job's paired comparisons equal ``streameval compare``'s."""

import json

import pytest

from streameval.jobs import batch
from streameval import api
from streameval.accumulators.bootstrap import PoissonBootstrap
from streameval.commands import compare
from streameval.io import avro, convert, trec
from streameval.metrics import stats

from .conftest import REPO, data_path

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]

RUNS = ["bm25", "bm25+bert(zs)"]
METRICS = ["ndcg@10", "map"]


@pytest.fixture(scope="module")
def dl_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dl_ci")
    qrels = data_path("dl_hard_passage", "dl_hard-passage.qrels")
    avro.write_records(tmp / "judgments.avro", "judgment", convert.trec_qrels_to_judgments(trec.read_qrels(qrels)))
    for name in RUNS:
        run = trec.read_run(data_path("dl_hard_passage", "runs", f"{name}.run"))
        avro.write_records(tmp / f"{name}.avro", "impression", convert.trec_run_to_impressions(run, system_id=name))
    return tmp, qrels


@pytest.mark.parametrize("ci", ["t", "bootstrap"])
def test_batch_rows_carry_intervals(dl_inputs, ci):
    tmp, qrels = dl_inputs
    out = tmp / f"out_{ci}"
    args = ["--impressions", str(tmp / "bm25*.avro"), "--judgments", str(tmp / "judgments.avro"),
            "--metrics", ",".join(METRICS), "--relevance-level", "2", "--complete", "--depth", "1000",
            "--no-ctr", "--ci", ci, "--output", str(out), "--quiet"]
    if ci == "bootstrap":
        args += ["--compare-baseline", "bm25", "--replicates", "200"]
    assert batch.main(args) == 0
    rows = list(avro.read_records(str(out / "metrics.avro"), "metric_result"))
    assert len(rows) == len(RUNS) * len(METRICS)
    for r in rows:
        assert r["ci_level"] == 0.95 and r["ci_method"] == ci
        if ci == "t":
            assert (r["ci_low"], r["ci_high"]) == stats.t_interval(r["value"], r["num_queries"], r["stderr"])
    if ci == "bootstrap":
        for name in RUNS:
            specs, prep, values = api.score_queries(str(qrels), str(data_path("dl_hard_passage", "runs", f"{name}.run")),
                                                    METRICS, relevance_level=2, complete=True, depth=1000)
            boot = PoissonBootstrap(len(specs))
            s = boot.create()
            for j, q in enumerate(prep.qids):
                boot.add(s, str(q), values[:, j])
            want = {sp.name: res for sp, res in zip(specs, boot.extract(s))}
            for r in rows:
                if r["system"] == name:
                    w = want[r["metric"]]
                    assert (r["value"], r["ci_low"], r["ci_high"]) == (w["value"], w["ci_low"], w["ci_high"])
        # the job's comparisons are the command's, to the bit
        got = [json.loads(line) for line in open(out / "comparisons.jsonl")]
        cli, _ = compare.compare_runs(str(qrels), str(data_path("dl_hard_passage", "runs", "bm25.run")),
                                      [str(data_path("dl_hard_passage", "runs", "bm25+bert(zs).run"))], METRICS,
                                      names=RUNS, relevance_level=2, complete=True, depth=1000)
        assert len(got) == len(cli) == 2
        by = {g["metric"]: g for g in got}
        for c in cli:
            g = by[c["metric"]]
            assert g["system_a"] == "bm25" and g["system_b"] == "bm25+bert(zs)" and g["slice"] == "all"
            for k in ("num_queries", "mean_a", "mean_b", "diff", "t_low", "t_high", "boot_low", "boot_high", "t",
                      "p_t", "p_perm", "perm_method"):
                assert g[k] == c[k], k


def test_ctr_rows_carry_wilson_intervals(tmp_path):
    out = tmp_path / "out"
    assert batch.main(["--impressions", str(REPO / "data" / "sample" / "impressions" / "obd_*_men.avro"),
                       "--window", "1d", "--output", str(out), "--quiet"]) == 0
    rows = list(avro.read_records(str(out / "metrics.avro"), "metric_result"))
    assert rows
    for r in rows:
        lo, hi = stats.wilson_interval(round(r["value"] * r["num_queries"]), r["num_queries"])
        assert (r["ci_low"], r["ci_high"], r["ci_method"]) == (lo, hi, "wilson")
