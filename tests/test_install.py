"""Issue 41 item 6, "install like a library": streameval built as a wheel and installed into a new
virtual environment outside the clone runs both jobs; the wheel installs one top-level package,
``streameval`` (the jobs are :mod:`streameval.jobs`); the repository's ``pipelines/`` scripts are not
installed and run the same jobs from the clone.

The new environment gets the wheel's dependencies from this test's environment (a ``.pth`` line naming
its site-packages, after the new environment's own): pip resolves the wheel's declared requirements
against them (a missing or conflicting one fails the install) without downloading Beam again, and
nothing of the clone is on the new environment's path (the clone's editable install is a ``.pth``
file of this environment, which a path line does not run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from streameval.io import avro
from streameval.jobs import batch
from streameval.jobs import stream as stream_cli

from .conftest import REPO
from .test_beam import _small_logs


# the new environment's commands run without this process's PYTHONPATH (which may name the clone)
CLEAN = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(cmd, cwd, env=CLEAN, timeout=600):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _tracked_sources(dest: Path) -> Path:
    """The clone's files as a fresh clone has them (``git ls-files``; every file but .git, .venv and
    out/ where git is missing): the wheel is built from all of them, so a package the build should
    leave out is there to be left out."""
    dest.mkdir(parents=True)
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and p.relative_to(REPO).parts[0] not in (".git", ".venv", "out")]
    for name in filter(None, names):
        src = REPO / name
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # streameval/schemas -> ../schemas: a link, as git checks it out
            os.symlink(os.readlink(src), dest / name)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("install")
    src = _tracked_sources(work / "src")
    assert (src / "pipelines" / "batch.py").is_file()  # the scripts are in the sources the wheel is built from
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", work / "dist", src], cwd=work)
    wheels = list((work / "dist").glob("streameval-*.whl"))
    assert len(wheels) == 1, wheels
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=work).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # pip of this environment installs into the new one (--python), checking the wheel's requirements
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--no-index", wheels[0]], cwd=work)
    return work, venv


def test_the_wheel_installs_streameval_only_and_the_command(installed):
    work, venv = installed
    py = venv / "bin" / "python"
    where = _run([py, "-c", "import streameval, streameval.jobs.batch as b; print(streameval.__file__); print(b.__file__)"],
                 cwd=work).stdout.split()
    assert all(Path(w).is_relative_to(venv) for w in where), where
    gone = subprocess.run([py, "-c", "import pipelines"], cwd=work, capture_output=True, text=True, env=CLEAN)
    assert gone.returncode == 1 and "No module named 'pipelines'" in gone.stderr, gone.stderr
    top = _run([py, "-c", "import importlib.metadata as m; print(m.distribution('streameval').read_text('top_level.txt') or '')"],
               cwd=work).stdout.split()
    assert top == ["streameval"], top
    assert (venv / "bin" / "streameval").is_file()
    version = _run([venv / "bin" / "streameval", "--version"], cwd=work).stdout
    assert version.startswith("streameval 0.1.0"), version
    # the dashboard's page is package data: installed beside its module
    page = _run([py, "-c", "from streameval.commands import dashboard as d; "
                 "print(*(len(d._page_file(n)) for n in d.PAGE_FILES))"], cwd=work).stdout.split()
    assert len(page) == 3 and all(int(n) > 500 for n in page), page


def _write_logs(d: Path):
    imps, judg = _small_logs()
    d.mkdir(parents=True, exist_ok=True)
    avro.write_records(d / "imps.avro", "impression", imps)
    avro.write_records(d / "judg.avro", "judgment", judg)
    return ["--impressions", d / "imps.avro", "--judgments", d / "judg.avro"]


def _rows(path: Path):
    return sorted(json.dumps(r, sort_keys=True) for f in sorted(path.parent.glob(path.name)) for r in map(json.loads, open(f)))


def test_both_jobs_run_from_the_installed_wheel_outside_the_clone(installed, tmp_path):
    work, venv = installed
    inputs = _write_logs(tmp_path / "logs")
    metrics = ["--metrics", "map,ndcg@10,ctr"]
    # the reference: the batch job of this clone, in this process
    assert batch.main([*map(str, inputs), *metrics, "--slices", "device", "--output", str(tmp_path / "here"), "--quiet"]) == 0
    cmd = venv / "bin" / "streameval"
    _run([cmd, "batch", *inputs, *metrics, "--slices", "device", "--output", tmp_path / "b", "--quiet"], cwd=tmp_path)
    assert _rows(tmp_path / "b" / "metrics.jsonl") == _rows(tmp_path / "here" / "metrics.jsonl")
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["state"] == "DONE"
    _run([cmd, "stream", "--replay", *inputs, *metrics, "--window", "1d", "--output", tmp_path / "s", "--quiet"],
         cwd=tmp_path)
    # the reference: the streaming job of this clone, in this process (its panes, every row as written)
    assert stream_cli.main(["--replay", *map(str, inputs), *metrics, "--window", "1d", "--output", str(tmp_path / "s_here"),
                            "--quiet"]) == 0
    rows = _rows(tmp_path / "s" / "metrics-*.jsonl")
    assert rows and rows == _rows(tmp_path / "s_here" / "metrics-*.jsonl")
    assert any(json.loads(r)["is_final"] for r in rows)


def test_the_pipelines_scripts_run_the_jobs_from_the_clone(tmp_path):
    inputs = _write_logs(tmp_path / "logs")
    _run([sys.executable, REPO / "pipelines" / "batch.py", *inputs, "--metrics", "map", "--output", tmp_path / "b", "--quiet"],
         cwd=tmp_path, env=os.environ)
    assert batch.main([*map(str, inputs), "--metrics", "map", "--output", str(tmp_path / "here"), "--quiet"]) == 0
    assert _rows(tmp_path / "b" / "metrics.jsonl") == _rows(tmp_path / "here" / "metrics.jsonl")
    for job in ("stream", "ope"):
        usage = _run([sys.executable, REPO / "pipelines" / f"{job}.py", "--help"], cwd=tmp_path, env=os.environ).stdout
        assert usage.startswith(f"usage: streameval {job}"), usage[:200]
