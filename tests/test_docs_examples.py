"""The documentation's examples run as written (issue 21 item 7).

Every fenced code block of README.md and docs/*.md is collected:

* ```` ```python ```` blocks run as a script with the repository's Python;
* ```` ```sh ```` / ``bash`` / ``shell`` / ``console`` blocks run as a bash script (``set -euo pipefail``);
  an unlabelled block with lines starting ``$ `` is a transcript: its ``$`` lines (and their ``\\``
  continuation lines) are the commands, the rest is output;
* every other block (program output, TOML, a Dockerfile) is not an example.

A block that needs ../shared, a cloud service or a cluster, or a long benchmark is marked by an HTML
comment on the line before its fence, ``<!-- no-test: reason -->``: it is reported as skipped with
that reason (``pytest -rs`` lists them). A marker not followed by a block is an error.

The examples run one after the other in one temporary directory (the repository's ``data``,
``docs``, ``schemas``, ``tests``, ``benchmarks`` and ``pipelines`` linked into it, ``.venv`` linked
to the environment running the tests, its ``bin`` first on ``PATH``, the checkout first on
``PYTHONPATH``), after a session fixture has run the Makefile's ``demo`` recipe there (its batch
job on the bundled sample: ``out/demo``), as ``make demo`` does on a fresh machine. A documented
command that fails, or a Python block that raises, fails its test with the block's location and
output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
PYTHON_LANGS = {"python", "py", "python3"}
LINKED = ("data", "docs", "schemas", "tests", "benchmarks", "pipelines")
TIMEOUT = 300  # seconds per block: a hung command fails instead of hanging the suite

FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)\s*$")
NO_TEST = re.compile(r"^\s*<!--\s*no-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the no-test reason, or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``"python"``, ``"shell"`` or None (not an example)."""
        if self.lang in PYTHON_LANGS:
            return "python"
        if self.lang in SHELL_LANGS:
            return "shell"
        if not self.lang and any(ln.lstrip().startswith("$ ") for ln in self.code.splitlines()):
            return "shell"
        return None

    def script(self) -> str:
        """The code to run: the block, or a transcript's ``$`` commands."""
        lines = self.code.splitlines()
        if not any(ln.lstrip().startswith("$ ") for ln in lines):
            return self.code
        out, cont = [], False
        for ln in lines:
            s = ln.strip()
            if s.startswith("$ ") or cont:
                out.append(s[2:] if s.startswith("$ ") and not cont else s)
                cont = s.endswith("\\")
        return "\n".join(out) + "\n"


def extract(path: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of ``path`` and the problems found (a no-test marker without a block)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, problems = [], []
    i, pending = 0, None  # pending: (line, reason) of a marker waiting for its block
    while i < len(lines):
        m = FENCE.match(lines[i])
        marker = NO_TEST.match(lines[i])
        if marker:
            if pending:
                problems.append(f"{path.name}:{pending[0]}: no-test marker not followed by a code block")
            pending = (i + 1, marker.group(1))
            if not pending[1]:
                problems.append(f"{path.name}:{i + 1}: no-test marker without a reason")
            i += 1
            continue
        if not m:
            if lines[i].strip() and pending:
                problems.append(f"{path.name}:{pending[0]}: no-test marker not followed by a code block")
                pending = None
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            problems.append(f"{path.name}:{i + 1}: code block never closed")
        blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", pending[1] if pending else None))
        pending = None
        i = j + 1
    if pending:
        problems.append(f"{path.name}:{pending[0]}: no-test marker not followed by a code block")
    return blocks, problems


ALL = [(b, p) for path in DOCS for b, p in [extract(path)]]
BLOCKS = [b for blocks, _ in ALL for b in blocks]
EXAMPLES = [b for b in BLOCKS if b.kind]


def demo_recipe() -> str:
    """The Makefile's ``demo`` recipe as a shell command: ``$(BIN)/`` dropped (the venv is on PATH),
    make's ``@``/``-``/``+`` line prefixes dropped, ``$(CURDIR)`` as ``$PWD``."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    m = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, "the Makefile has no demo target"
    lines = [line.lstrip("\t").lstrip("@-+") for line in m.group(1).splitlines()]  # make's line prefixes
    return "\n".join(lines).replace("$(BIN)/", "").replace("$(CURDIR)", "$PWD") + "\n"


def _env(work: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["HOME"] = env.get("HOME", str(work))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["MPLBACKEND"] = "Agg"
    return env


def _run(cmd: list[str], work: Path, what: str) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: still running after {TIMEOUT} s\n{e.stdout or ''}\n{e.stderr or ''}")
    if res.returncode != 0:
        pytest.fail(f"{what}: exit status {res.returncode}\n--- stdout (tail)\n{res.stdout[-3000:]}\n"
                    f"--- stderr (tail)\n{res.stderr[-3000:]}", pytrace=False)
    return res


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    """The directory the examples run in, with the demo's output (``out/demo``) made once."""
    work = tmp_path_factory.mktemp("docs_examples")
    for name in LINKED:
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    (work / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    _run(["bash", "-euo", "pipefail", "-c", demo_recipe()], work, "the Makefile's demo recipe")
    assert (work / "out" / "demo" / "manifest.json").is_file()
    yield work
    shutil.rmtree(work, ignore_errors=True)


def test_markers_and_blocks_are_well_formed():
    """Every no-test marker belongs to a block and has a reason; every block is closed."""
    problems = [p for _, ps in ALL for p in ps]
    assert not problems, problems
    assert len(EXAMPLES) >= 10, [b.where for b in EXAMPLES]  # the collector found the examples


def test_skipped_blocks_are_listed(capsys):
    """The list of examples not run, with their reasons (also shown by ``pytest -rs``)."""
    skipped = [b for b in EXAMPLES if b.skip]
    with capsys.disabled():
        print(f"\n{len(EXAMPLES)} examples in the docs, {len(skipped)} marked no-test:")
        for b in skipped:
            print(f"  {b.where}: {b.skip}")
    assert all(b.skip.strip() for b in skipped)


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.where for b in EXAMPLES])
def test_example_runs(block: Block, workdir: Path):
    if block.skip:
        pytest.skip(f"no-test: {block.skip}")
    if "streameval cluster" in block.code and not (shutil.which("java") and shutil.which("go")):
        pytest.skip("needs Java and Go: streameval cluster fetch gets Flink's jars and builds Prism")
    if block.kind == "python":
        script = workdir / f"example_{block.path.stem}_{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        _run([sys.executable, str(script)], workdir, f"{block.where} (python)")
    else:
        # a cluster the example starts is stopped also when a later step fails (by its recorded PIDs)
        states = re.findall(r"streameval cluster up \S+.*?--state-dir (\S+)", block.code)
        try:
            _run(["bash", "-euo", "pipefail", "-c", block.script()], workdir, f"{block.where} (shell)")
        finally:
            for state in states:
                if (workdir / state / "cluster.json").exists():
                    subprocess.run([sys.executable, "-m", "streameval.cli", "cluster", "down", "--state-dir", state],
                                   cwd=workdir, capture_output=True, timeout=120)
