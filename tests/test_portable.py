"""The batch job off the single process: Beam's portable runner with an EXTERNAL worker pool
(tests/fixtures_portable.py: a local job service and SDK workers in other processes and another
working directory), against the same job on FnApiRunner in this process.

Reference: the in-process FnApiRunner run of the same arguments (itself checked against evaluate(),
trec_eval, pytrec_eval and hand calculations elsewhere). Equal means: the metric rows (JSON lines and
Avro, as sorted lists, floats to the bit), the dead letters, the unjudged requests, the list of
damaged files, the comparisons and the summary's accounting and counters. The job is launched from a
working directory that is not the workers' one, with relative --impressions / --output paths.

The streaming job's columnar stages run there too (test (i)), over a bounded input: the local job
service has no unbounded source.

Runs share jobs through module fixtures (each job once on each runner); the whole file takes about
three minutes on two cores. ``pytest -m "not portable"`` leaves it out.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from streameval.jobs import batch
from streameval.io import avro

from .conftest import fail_after
from .fixtures_portable import worker_pool
from .test_columnar import _messy_logs

pytestmark = [
    pytest.mark.portable,
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
#: seconds a job may take before it counts as hung (workers that cannot start make a portable job wait)
JOB_TIMEOUT = 300
JSONL = ("metrics.jsonl", "dead_letters.jsonl", "unjudged.jsonl", "unreadable_files.jsonl", "comparisons.jsonl")
AVRO = {"metrics.avro": "metric_result", "dead_letters.avro": "dead_letter"}

# the jobs (paths relative to the launcher's working directory, the module's `launch` directory)
JUDGMENTS = ["--judgments", "sample/judgments/letor_test_labels.avro"]
#: (a) columnar engine, the bundled sample, ranking metrics and CTR, a window and slices
SAMPLE_COLUMNAR = ["--impressions", "sample/impressions/*.avro", *JUDGMENTS, "--engine", "columnar",
                   "--metrics", "ndcg@10,map,P@5,recip_rank,err@10", "--window", "1d", "--slices", "campaign"]
#: messy logs (tests/test_columnar.py) and a file cut short: dead letters of every kind
MESSY = ["--impressions", "messy/imps-*.avro", "--judgments", "messy/judg.avro", "--window", "1h",
         "--slices", "device,campaign", "--grades", "0:3"]
#: (b), (e) the records engine, online metrics (labels: clicks) and ranking metrics
MESSY_RECORDS = [*MESSY, "--engine", "records", "--labels", "clicks",
                 "--metrics", "ndcg@5,map,auc,gauc[user,impressions],clicks@10,rr_first_click"]
#: (e) the columnar engine, online metrics (labels: clicks) beside the ranking metrics
MESSY_COLUMNAR = [*MESSY, "--engine", "columnar", "--labels", "clicks",
                  "--metrics", "ndcg@5,map,P@3,bpref,recip_rank,auc,gauc[user,impressions],clicks@10,rr_first_click"]
#: (c), (d) bootstrap intervals and paired comparisons with a baseline (the default, columnar engine)
BOOTSTRAP_COMPARE = ["--impressions", "sample/impressions/letor_*.avro", *JUDGMENTS, "--metrics", "ndcg@10,map,P@5",
                     "--ci", "bootstrap", "--replicates", "50", "--compare-baseline", "feature206"]
#: (h), packaging: a small job (one ranker, columnar engine)
SMALL = ["--impressions", "sample/impressions/letor_feature253.avro", *JUDGMENTS, "--metrics", "ndcg@10,map"]


# --------------------------------------------------------------------------------------------
# helpers

def _canon(records) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in records)


_SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.\w+)$")


def output_name(file_name: str) -> str:
    """The output a file belongs to: ``dead_letters-00001-of-00002.jsonl`` -> ``dead_letters.jsonl``."""
    m = _SHARD.match(file_name)
    return f"{m['stem']}{m['ext']}" if m else file_name


def _output_files(out: Path) -> dict[str, list[Path]]:
    """The files of each output in ``out`` (one file, or a complete set of shards)."""
    parts: dict[str, list[Path]] = {}
    for p in sorted(out.iterdir()) if out.is_dir() else ():
        parts.setdefault(output_name(p.name), []).append(p)
    for name, files in parts.items():
        shards = [_SHARD.match(f.name) for f in files]
        if len(files) > 1 or shards[0]:
            assert all(shards), f"{name}: one file and shards: {[f.name for f in files]}"
            counts = {int(m["count"]) for m in shards}
            assert len(counts) == 1 and sorted(int(m["index"]) for m in shards) == list(range(counts.pop())), \
                f"{name}: incomplete shards {[f.name for f in files]}"
    return parts


def read_output(out: Path) -> dict:
    """Every output of a job directory: JSON-lines and Avro outputs (all shards) as sorted canonical
    JSON lines (None when absent), ``summary``, ``manifest`` (None when absent), ``files`` (the names
    in the directory) and ``outputs`` (the outputs they make up)."""
    parts = _output_files(out)
    res = {"files": sorted(f.name for files in parts.values() for f in files), "outputs": sorted(parts)}
    for name in JSONL:
        res[name] = None if name not in parts else _canon(
            json.loads(line) for f in parts[name] for line in f.read_text().splitlines() if line.strip())
    for name, schema in AVRO.items():
        res[name] = None if name not in parts else _canon(
            r for f in parts[name] for r in avro.read_records(str(f), schema))
    for name in ("summary", "manifest"):
        p = out / f"{name}.json"
        res[name] = json.loads(p.read_text()) if p.exists() else None
    return res


def assert_manifest_lists_every_file(out: Path, manifest: dict):
    """The manifest lists each file in ``out`` (but itself) with its size, and nothing else: no file
    of a previous run is left over."""
    listed = {}
    for files in manifest["outputs"].values():
        for f in files:
            assert Path(f["path"]).parent == out.resolve(), f
            listed[Path(f["path"]).name] = f["bytes"]
    on_disk = {p.name: p.stat().st_size for p in out.iterdir() if p.name != "manifest.json"}
    assert on_disk == listed


def _diff(a, b, n=3) -> str:
    if a is None or b is None:
        return f"present: {a is not None} vs {b is not None}"
    sa, sb = set(a), set(b)
    return (f"{len(a)} vs {len(b)} lines; only in the first: {sorted(sa - sb)[:n]}; "
            f"only in the second: {sorted(sb - sa)[:n]}")


def _nonzero(counters: dict) -> dict:
    return {k: v for k, v in counters.items() if v}


def assert_same(got: dict, ref: dict, names=(*JSONL, *AVRO)):
    """``got`` (portable) and ``ref`` (FnApiRunner) outputs are equal: each file, the accounting and
    the counters."""
    for name in names:
        assert got[name] == ref[name], f"{name}: {_diff(got[name], ref[name])}"
    assert got["summary"]["accounting"] == ref["summary"]["accounting"]
    assert got["summary"]["accounting_problems"] == ref["summary"]["accounting_problems"] == []
    assert _nonzero(got["summary"]["counters"]) == _nonzero(ref["summary"]["counters"])
    assert got["summary"]["num_rows"] == ref["summary"]["num_rows"] == len(ref["metrics.jsonl"])


def run_job(argv, out: str, runner_args=()) -> tuple[int, dict]:
    """``batch.main`` (quiet) with ``--output out``: (exit code, :func:`read_output`)."""
    with fail_after(JOB_TIMEOUT, f"the job writing {out}"):
        code = batch.main([*argv, "--output", out, "--quiet", *runner_args])
    return code, read_output(Path(out))


def run_pair(portable_runner, name: str, argv, expect: int = 0) -> tuple[dict, dict]:
    """The job on the portable runner (output ``name/portable``) and on FnApiRunner (``name/fnapi``),
    both ending with exit status ``expect`` (3: an input check failed, the outputs written)."""
    started = portable_runner.pool.workers_started()
    code, port = run_job(argv, f"{name}/portable", portable_runner.args)
    assert code == expect, f"portable run of {name}: exit {code}\n{portable_runner.pool.log_tail()}"
    assert portable_runner.pool.workers_started() > started, "the job started no worker of the pool"
    assert port["summary"]["runner"] == "PortableRunner" and port["manifest"]["complete"]
    code, ref = run_job(argv, f"{name}/fnapi")
    assert code == expect, f"FnApiRunner run of {name}: exit {code}"
    assert port["summary"]["input_checks_failed"] == ref["summary"]["input_checks_failed"]
    assert bool(ref["summary"]["input_checks_failed"]) == (expect == 3)
    assert ref["summary"]["runner"] == "FnApiRunner"
    assert ref["metrics.jsonl"], f"the reference run of {name} wrote no metric row"
    assert_manifest_lists_every_file(Path(f"{name}/portable"), port["manifest"])
    assert_manifest_lists_every_file(Path(f"{name}/fnapi"), ref["manifest"])
    assert port["outputs"] == ref["outputs"]
    return port, ref


def _raise_in_pipeline(row):  # replaces batch._progress_row: a stage of the pipeline raises
    raise RuntimeError("a stage of the pipeline raised (test)")


# --------------------------------------------------------------------------------------------
# the launcher's directory and the shared runs

@pytest.fixture(scope="module")
def launch(tmp_path_factory, portable_runner):
    """The launcher's working directory (not the workers'): a copy of the sample and the messy logs,
    with one file cut short."""
    d = tmp_path_factory.mktemp("launch")
    for sub in ("impressions", "judgments"):
        shutil.copytree(SAMPLE / sub, d / "sample" / sub)
    imp_files, judg = _messy_logs(11)
    for i, recs in enumerate(imp_files):
        avro.write_records(d / "messy" / f"imps-{i}.avro", "impression", recs)
    avro.write_records(d / "messy" / "judg.avro", "judgment", judg)
    # the same requests again under other ids, in small blocks, cut at two thirds: a damaged file
    extra = [dict(r, event_id="x" + r["event_id"], request_id="x" + r["request_id"]) for r in imp_files[0]]
    whole = d / "whole.avro"
    avro.write_records(whole, "impression", extra, sync_interval=2000)
    data = whole.read_bytes()
    (d / "messy" / "imps-cut.avro").write_bytes(data[: len(data) * 2 // 3])
    whole.unlink()
    assert d.resolve() != portable_runner.workers_cwd.resolve()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        yield d


@pytest.fixture(scope="module")
def sample_columnar(portable_runner, launch):
    return run_pair(portable_runner, "sample-columnar", SAMPLE_COLUMNAR)


@pytest.fixture(scope="module")
def messy_records(portable_runner, launch):
    return run_pair(portable_runner, "messy-records", MESSY_RECORDS, expect=3)  # the file cut short


@pytest.fixture(scope="module")
def messy_columnar(portable_runner, launch):
    return run_pair(portable_runner, "messy-columnar", MESSY_COLUMNAR, expect=3)


@pytest.fixture(scope="module")
def bootstrap_compare(portable_runner, launch):
    return run_pair(portable_runner, "bootstrap-compare", BOOTSTRAP_COMPARE)


@pytest.fixture(scope="module")
def small_ref(launch):
    code, ref = run_job(SMALL, "small/fnapi")
    assert code == 0 and ref["metrics.jsonl"]
    return ref


# --------------------------------------------------------------------------------------------
# (a) - (f): the same numbers as in-process

def test_columnar_sample_with_slices_and_window(sample_columnar, launch):
    port, ref = sample_columnar
    assert_same(port, ref)
    assert port["summary"]["engine"] == "columnar"
    rows = [json.loads(r) for r in ref["metrics.jsonl"]]
    assert {"ndcg@10", "map", "P@5", "recip_rank", "err@10", "ctr"} <= {r["metric"] for r in rows}
    assert {"all", "campaign=men", "campaign=women", "campaign=all"} <= {r["slice"] for r in rows}
    assert len({r["window_start"] for r in rows}) > 2
    # the click logs' requests have no judgment, nor does any request of their systems: counted, not listed
    assert ref["unjudged.jsonl"] == [] and port["unjudged.jsonl"] == []
    for run in (ref, port):
        assert run["summary"]["counters"]["requests_unjudged"] == 60_000
        assert run["summary"]["counters"]["requests_unjudged_unlisted"] == 60_000
    # the relative input paths reached the workers as absolute ones
    assert port["summary"]["impression_files"] == ref["summary"]["impression_files"]
    assert all(Path(p).is_absolute() and Path(p).parent == launch / "sample" / "impressions"
               for p in port["summary"]["impression_files"])


def test_records_engine_online_metrics(messy_records):
    port, ref = messy_records
    assert_same(port, ref)
    assert port["summary"]["engine"] == "records"
    metrics = {json.loads(r)["metric"] for r in ref["metrics.jsonl"]}
    assert {"ndcg@5", "map", "auc", "gauc[user,impressions]", "clicks@10", "rr_first_click", "ctr"} <= metrics


def test_bootstrap_intervals(bootstrap_compare):
    port, ref = bootstrap_compare
    assert port["summary"]["engine"] == "columnar"
    assert_same(port, ref, names=("metrics.jsonl", "metrics.avro", "dead_letters.jsonl", "unjudged.jsonl"))
    ranking = [json.loads(r) for r in ref["metrics.jsonl"]]
    ranking = [r for r in ranking if r["metric"] in ("ndcg@10", "map", "P@5")]
    assert len(ranking) == 6 and all(r["ci_method"] == "bootstrap" and r["ci_low"] < r["ci_high"] for r in ranking)


def test_comparisons_with_a_baseline(bootstrap_compare):
    port, ref = bootstrap_compare
    assert_same(port, ref)
    assert ref["comparisons.jsonl"] and len(ref["comparisons.jsonl"]) == 3  # feature253 - feature206, 3 metrics
    assert "comparisons.jsonl" in port["manifest"]["outputs"]


@pytest.mark.parametrize("run", ["messy_records", "messy_columnar"])
def test_messy_input_and_a_damaged_file_are_dead_letters(request, run, launch):
    port, ref = request.getfixturevalue(run)
    assert_same(port, ref)
    dead = [json.loads(x) for x in ref["dead_letters.jsonl"]]
    cut = str(launch / "messy" / "imps-cut.avro")
    unreadable = [d for d in dead if d["reason"].startswith("unreadable Avro file")]
    assert [d["source"] for d in unreadable] == [cut]
    assert 0 < json.loads(unreadable[0]["raw"])["records_read"]
    assert [json.loads(x)["source"] for x in port["unreadable_files.jsonl"]] == [cut]
    reasons = {d["reason"].split(" (")[0] for d in dead}
    assert len(reasons) >= 5  # the messy parts reached the job
    assert port["summary"]["accounting"]["unreadable_files"]
    metrics = {json.loads(r)["metric"] for r in ref["metrics.jsonl"]}
    assert {"auc", "gauc[user,impressions]", "clicks@10", "rr_first_click"} <= metrics


def test_fnapi_multi_processing_equals_in_process(sample_columnar):
    _, ref = sample_columnar
    code, got = run_job([*SAMPLE_COLUMNAR, "--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
                        "sample-columnar/multi-processing")
    assert code == 0
    assert got["summary"]["runner"] == "FnApiRunner" and got["summary"]["counters"]
    assert_same(got, ref)


# --------------------------------------------------------------------------------------------
# (g), (h): failures and reruns

@pytest.mark.parametrize("engine,kind", [("columnar", "judgments"), ("records", "impressions")])
def test_an_input_the_workers_cannot_open_fails_the_job(portable_runner, launch, monkeypatch, capsys, engine, kind):
    """The launcher matches the file, then it is gone before the workers open it: the job fails
    (exit 1) naming the file, and the output directory still holds the previous run's manifest, with
    nothing of the failed run published (issue 36: outputs are replaced only when a run publishes)."""
    src = SAMPLE / "judgments" / "letor_test_labels.avro" if kind == "judgments" \
        else SAMPLE / "impressions" / "letor_feature206.avro"
    victim = launch / f"vanishing-{engine}.avro"
    shutil.copy(src, victim)
    real = batch.expand_inputs

    def expand(patterns):
        paths = real(patterns)  # the file exists when the launcher matches it ...
        if str(victim) in paths:
            victim.unlink()  # ... and is gone when the workers open it
        return paths

    monkeypatch.setattr(batch, "expand_inputs", expand)
    out = launch / f"failed-{engine}"
    out.mkdir()
    (out / "manifest.json").write_text('{"complete": true}')  # a previous run's
    argv = ["--impressions", "sample/impressions/letor_feature253.avro", *JUDGMENTS, f"--{kind}", victim.name,
            "--engine", engine, "--metrics", "ndcg@10,map"]
    capsys.readouterr()
    started = portable_runner.pool.workers_started()
    with fail_after(JOB_TIMEOUT, "the job with a vanished input"):
        code = batch.main([*argv, "--output", out.name, "--quiet", *portable_runner.args])
    err = capsys.readouterr().err
    assert not victim.exists()
    assert code == 1, err[-2000:]
    assert f"error: the job failed: cannot read input file {victim}" in err, err[-2000:]
    assert portable_runner.pool.workers_started() > started
    assert (out / "manifest.json").read_text() == '{"complete": true}'
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["manifest.json"]


def test_a_job_longer_than_the_job_server_timeout_finishes(portable_runner, small_ref, capsys):
    """Beam 2.62's portable runner opens the job's state and message streams with --job_server_timeout
    (default 60 s) as their deadline: waiting on them, a job running longer than that was reported
    failed (DEADLINE_EXCEEDED: "the runner's service stopped answering") though it finished. With a
    3-second timeout and a job that takes longer, the job finishes with the in-process rows."""
    out = "small-timeout/portable"
    code, got = run_job(SMALL, out, [*portable_runner.args, "--job_server_timeout", "3"])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert_same(got, small_ref)


def test_rerun_replaces_every_output_and_a_failed_run_leaves_the_previous_one(
        portable_runner, bootstrap_compare, small_ref, monkeypatch, capsys):
    """A rerun with fewer inputs over the directory of the bootstrap / comparison job: every output
    is the new job's (the same as a fresh directory's), the comparisons are gone. Then a run over it
    whose pipeline raises: exit 1, and the previous run's outputs and manifest as they were
    (issue 36: outputs are replaced only when a run publishes)."""
    out = "bootstrap-compare/portable"
    before = read_output(Path(out))
    assert before["manifest"] and before["comparisons.jsonl"]
    code, got = run_job(SMALL, out, portable_runner.args)
    assert code == 0, capsys.readouterr().err[-2000:]
    assert got["outputs"] == small_ref["outputs"] and "comparisons.jsonl" not in got["outputs"]
    assert_manifest_lists_every_file(Path(out), got["manifest"])  # no file of the first run is left
    assert_same(got, small_ref)
    assert sorted(got["manifest"]["outputs"]) == sorted(small_ref["manifest"]["outputs"])

    monkeypatch.setattr(batch, "_progress_row", _raise_in_pipeline)
    capsys.readouterr()
    code = batch.main([*SMALL, "--output", out, "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "error: the job failed" in err and "a stage of the pipeline raised" in err, err[-2000:]
    assert read_output(Path(out)) == got


# --------------------------------------------------------------------------------------------
# packaging: workers that import the project from its wheel

def _project_sources(root: Path, dest: Path) -> Path:
    """A copy of what the wheel is built from (the files at the root and the packages the build
    includes, symlinks followed): building in place would write build/ and *.egg-info into the
    working tree."""
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    dest.mkdir(parents=True)
    for p in root.iterdir():
        if p.is_file():
            shutil.copy2(p, dest / p.name)
        elif p.is_dir() and any(fnmatch.fnmatch(p.name, pat) for pat in include):
            shutil.copytree(p, dest / p.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _pip(*args, cwd):
    done = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"pip {' '.join(args)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_workers_run_the_installed_wheel(portable_runner, launch, small_ref, tmp_path_factory):
    work = tmp_path_factory.mktemp("wheel")
    src = _project_sources(ROOT, work / "src")
    _pip("wheel", "--no-deps", "-w", str(work / "dist"), str(src), cwd=work)
    wheels = list((work / "dist").glob("streameval-*.whl"))
    assert len(wheels) == 1, wheels
    site = work / "site"
    _pip("install", "--no-deps", "--target", str(site), str(wheels[0]), cwd=work)
    assert (site / "streameval" / "schemas" / "impression.avsc").is_file()
    assert (site / "streameval" / "jobs" / "batch.py").is_file()
    # the wheel installs one top-level package: the repository's pipelines/ scripts are not a package
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin") == ["streameval"]

    with worker_pool(portable_runner.log_dir, work / "workers", name="wheel_worker_pool", pythonpath=site) as pool:
        args = portable_runner.args_with(pool)
        # where the workers import the project from (a lambda pickled by value with cloudpickle, Beam
        # 2.77's default: this module is not importable on the workers, and Beam 2.62's default,
        # dill, pickles a module's function by reference)
        where = work / "where" / "modules"
        p = beam.Pipeline(options=PipelineOptions([*args, "--pickle_library", "cloudpickle"]))
        (p
         | beam.Create(["streameval", "streameval.beam.sources", "streameval.jobs.batch"])
         | beam.Map(lambda name: json.dumps([name, importlib.import_module(name).__file__]))
         | beam.io.WriteToText(str(where), file_name_suffix=".txt", num_shards=1, shard_name_template=""))
        with fail_after(JOB_TIMEOUT, "the pipeline on the wheel's workers"):
            state = p.run().wait_until_finish()
        assert str(state).endswith("DONE"), pool.log_tail()
        found = dict(json.loads(line) for line in (work / "where" / "modules.txt").read_text().splitlines())
        assert sorted(found) == ["streameval", "streameval.beam.sources", "streameval.jobs.batch"]
        for name, path in found.items():
            assert Path(path).resolve().is_relative_to(site.resolve()), (name, path)

        started = pool.workers_started()
        code, got = run_job(SMALL, "wheel-run", args)
        assert code == 0, pool.log_tail()
        assert pool.workers_started() > started
        assert got["outputs"] == small_ref["outputs"]
        assert_manifest_lists_every_file(Path("wheel-run"), got["manifest"])
        assert_same(got, small_ref)


# --------------------------------------------------------------------------------------------
# (i) the streaming job's columnar engine on the portable runner's workers

def _stream_blocks(paths, rows: int = 400) -> list:
    """The blocks the live source sends for ``paths`` (``(path, ("arrow", IPC bytes), n, None)``;
    several per file), without a watermark: a bounded input."""
    from streameval.beam.streaming.live import ipc_bytes
    from streameval.io.arrow_avro import read_tables

    out = []
    for path in paths:
        for t in read_tables(path, "impression", rows=rows):
            out.append((path, ("arrow", ipc_bytes(t)), t.num_rows, None) if hasattr(t, "num_rows")
                       else (path, ("records", t), len(t), None))
    return out


def test_stream_columnar_engine_on_the_portable_runner(portable_runner, launch):
    """The streaming job's columnar stages (request shards with keyed state and event-time timers,
    the system aggregate merging the shards' exact partials, online metrics beside the ranking
    metrics) on the portable runner's workers, over a bounded input (Beam's local job service runs
    no unbounded source: see docs/deploy.md): each window's final pane equals the batch job's row
    (its per-record engine, in this process), bit for bit with the interval."""
    from streameval.beam.streaming.coarse import ColumnarStreamMetrics

    from .test_stream import assert_final_equals_batch

    paths = sorted(str(p) for p in Path("messy").glob("imps-[0-9]*.avro"))
    metrics = ["ndcg@5", "map", "P@3", "auc", "clicks@10"]
    p = beam.Pipeline(options=PipelineOptions(portable_runner.args))
    sm = ColumnarStreamMetrics([str(Path("messy/judg.avro").resolve())], metrics, window="1h", slices=["device", "campaign"],
                               grade_range=(0, 3))
    (p
     | beam.Create(_stream_blocks(paths), reshuffle=False)
     | sm
     | beam.Map(json.dumps, sort_keys=True)
     | beam.io.WriteToText(str(Path("stream-portable").resolve() / "rows"), file_name_suffix=".jsonl"))
    started = portable_runner.pool.workers_started()
    with fail_after(JOB_TIMEOUT, "the streaming stages on the portable runner"):
        result = p.run()
        state = result.wait_until_finish()
    assert str(state).endswith("DONE"), portable_runner.pool.log_tail()
    assert portable_runner.pool.workers_started() > started
    # NaN as null, as the jobs' JSON-lines sinks write it
    rows = [{k: None if isinstance(v, float) and v != v else v for k, v in json.loads(line).items()}
            for f in sorted(Path("stream-portable").glob("rows*.jsonl")) for line in f.read_text().splitlines()]
    assert rows and {(r["pane"], r["is_final"]) for r in rows} == {("on_time", True)}
    # the panes counted on the workers reach the launcher as Beam counters, the final ones too (the
    # stream command's summary line: "panes: ... (N final)")
    from streameval.beam.accounting import job_counters
    from streameval.io import counters as cn

    counted = job_counters(result)
    final_panes = len({(r["window_start"], r["system"]) for r in rows if r["is_final"]})
    assert counted.get(cn.PANES_FINAL) == counted.get(cn.panes("on_time")) == final_panes > 0
    code, ref = run_job(["--impressions", "messy/imps-[0-9]*.avro", "--judgments", "messy/judg.avro", "--window", "1h",
                         "--slices", "device,campaign", "--grades", "0:3", "--engine", "records", "--labels",
                         "clicks", "--metrics", ",".join(metrics)], "stream-portable/batch")
    assert code == 0
    assert_final_equals_batch(rows, [json.loads(r) for r in ref["metrics.jsonl"]])
