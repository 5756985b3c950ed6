#!/usr/bin/env python3
"""The repository's static checks, one entry point (``make check``; docs/checks.md says what each enforces).

    python .ci/checks.py                  run every check; exit status 1 when any fails
    python .ci/checks.py --only mypy,sizes
    python .ci/checks.py --lower          also write the baselines down to today's numbers (never up)

Checks:

* ``ruff``: ``ruff check`` with pyproject.toml's rule set, must be clean;
* ``long-lines``: lines over the line length (ruff's E501) counted per file, none may go up
  (``.ci/baselines/long-lines.json``);
* ``format``: ``ruff format --check`` on the files listed in ``.ci/baselines/formatted.txt`` (those formatted
  today); the other files are not held to it;
* ``imports``: import-linter's contracts (pyproject.toml ``[tool.importlinter]``);
* ``mypy``: mypy's errors counted per file, none may go up (``.ci/baselines/mypy.json``);
* ``vulture``: dead code at pyproject.toml's ``[tool.vulture]`` confidence; a finding not in
  ``.ci/baselines/vulture.txt`` fails;
* ``sizes``: modules over 800 lines and functions over 80, each either in ``.ci/baselines/sizes.txt`` (with its
  size and reason) or a failure; a listed one may not grow;
* ``beam-patches``: production code (``streameval/``, ``pipelines/``) assigns to no attribute of anything it
  imported from ``apache_beam`` (``x.attr = ...``, ``setattr(x, ...)``, ``del x.attr``), none allowed.

A count that went down passes and is named, so its baseline can be lowered (``--lower``). The tools are the
``test`` extra's (``pip install -e ".[test]"``); they run from the Python running this script.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / ".ci" / "baselines"

MODULE_LIMIT = 800  # lines of a module
FUNCTION_LIMIT = 80  # lines of a function: end_lineno - lineno + 1 (decorators not counted)
SIZE_PATHS = ("streameval", "benchmarks", "pipelines")


@dataclass
class Result:
    ok: bool
    lines: list[str] = field(default_factory=list)  # printed under the check's name
    summary: str = ""


# ---- the logic (tests/test_checks.py) ----


Change = tuple[str, int, int]  # (key, baseline, current)


def compare_counts(current: Mapping[str, int], baseline: Mapping[str, int]) -> tuple[list[Change], list[Change]]:
    """``(worse, better)``: the keys whose count went up / down, each ``(key, baseline, current)``, sorted.

    A key missing from either side counts 0 there."""
    worse: list[Change] = []
    better: list[Change] = []
    for key in sorted(set(current) | set(baseline)):
        now, was = current.get(key, 0), baseline.get(key, 0)
        if now > was:
            worse.append((key, was, now))
        elif now < was:
            better.append((key, was, now))
    return worse, better


def lowered_counts(current: Mapping[str, int], baseline: Mapping[str, int]) -> dict[str, int]:
    """The baseline with each count lowered to the current one where that is lower (never raised); zeros dropped."""
    out = {k: min(v, current.get(k, 0)) for k, v in baseline.items()}
    return {k: v for k, v in sorted(out.items()) if v > 0}


_MYPY_ERROR = re.compile(r"^(?P<path>[^:\n]+\.pyi?):\d+(?::\d+)?: error: ", re.M)


def parse_mypy(output: str) -> dict[str, int]:
    """mypy's error count per file (notes are not errors)."""
    counts = Counter(m["path"].replace("\\", "/") for m in _MYPY_ERROR.finditer(output))
    return dict(sorted(counts.items()))


def parse_ruff_json(text: str, root: Path | None = None) -> dict[str, int]:
    """ruff's ``--output-format json`` findings counted per file (paths relative to ``root``, default ROOT)."""
    root = root or ROOT
    counts: Counter[str] = Counter()
    for finding in json.loads(text or "[]"):
        path = Path(finding["filename"])
        counts[path.relative_to(root).as_posix() if path.is_absolute() else path.as_posix()] += 1
    return dict(sorted(counts.items()))


_VULTURE_LINE = re.compile(r"^(?P<path>[^:\n]+):\d+: (?P<message>.+)$")


def parse_vulture(output: str) -> Counter[str]:
    """vulture's findings as ``path: message`` (no line number: the lines above it may move)."""
    return Counter(f"{m['path']}: {m['message']}" for m in map(_VULTURE_LINE.match, output.splitlines()) if m)


def read_allowed(text: str) -> Counter[str]:
    """The allowed findings of a list file: one a line, ``#`` comments and ``  # reasons`` ignored."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            out[line] += 1
    return out


def compare_findings(current: Counter[str], allowed: Counter[str]) -> tuple[list[str], list[str]]:
    """``(new, gone)``: findings not allowed (as many times as they exceed the list) and listed ones not found."""
    return sorted((current - allowed).elements()), sorted((allowed - current).elements())


def function_sizes(source: str) -> dict[str, int]:
    """Lines of each function of a module by its qualified name (``Class.method``, ``outer.inner``)."""
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    sizes[name] = max(sizes.get(name, 0), child.end_lineno - child.lineno + 1)
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return sizes


def size_offenders(
    files: Iterable[Path],
    root: Path | None = None,
    module_limit: int = MODULE_LIMIT,
    function_limit: int = FUNCTION_LIMIT,
) -> dict[str, int]:
    """``{key: lines}`` of the modules (key: the path) and functions (``path::qualname``) over their limit."""
    root = root or ROOT
    out: dict[str, int] = {}
    for path in sorted(files):
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        lines = len(source.splitlines())
        if lines > module_limit:
            out[rel] = lines
        for name, n in function_sizes(source).items():
            if n > function_limit:
                out[f"{rel}::{name}"] = n
    return out


def read_size_exceptions(text: str) -> dict[str, tuple[int, str]]:
    """``{key: (lines, reason)}`` from the lines ``key lines reason`` (``#`` comments)."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or not parts[1].isdigit():
            raise ValueError(f"line {number}: expected `path[::function] lines reason`, got {line!r}")
        out[parts[0]] = (int(parts[1]), parts[2])
    return out


def compare_sizes(
    offenders: Mapping[str, int], exceptions: Mapping[str, tuple[int, str]]
) -> tuple[list[tuple[str, int | None, int]], list[Change], list[str]]:
    """``(failures, shrank, fixed)``: new or grown offenders ``(key, listed or None, lines)``; listed ones
    now smaller but still over ``(key, listed, lines)``; listed keys no longer over their limit."""
    failures: list[tuple[str, int | None, int]] = []
    shrank: list[Change] = []
    for key, n in sorted(offenders.items()):
        listed = exceptions.get(key)
        if listed is None or n > listed[0]:
            failures.append((key, listed[0] if listed else None, n))
        elif n < listed[0]:
            shrank.append((key, listed[0], n))
    fixed = sorted(set(exceptions) - set(offenders))
    return failures, shrank, fixed


def render_size_exceptions(header: str, exceptions: Mapping[str, tuple[int, str]]) -> str:
    width = max((len(k) for k in exceptions), default=0)
    body = "".join(f"{k:<{width}} {n:>4} {reason}\n" for k, (n, reason) in exceptions.items())
    return header + body


def beam_patches(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` changes something of Beam's: an assignment (``=``, ``+=``, annotated), a ``del`` or a
    ``setattr`` / ``delattr`` on a name bound by ``import apache_beam...`` / ``from apache_beam... import
    ...`` (also through attributes of it: ``apache_beam.io.x.y = ...``). Returns ``"FILE:LINE: what"``
    lines. A name rebound to something else later in the module still counts (kept simple: none here)."""
    tree = ast.parse(source, filename)
    beam_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "apache_beam" or a.name.startswith("apache_beam."):
                    beam_names.add((a.asname or a.name).split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and (node.module == "apache_beam" or node.module.startswith("apache_beam."))
            and node.level == 0
        ):
            beam_names.update(a.asname or a.name for a in node.names)

    def root(expr) -> str | None:
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    returning: set = set()  # functions returning something of Beam's (a module imported inside them)

    def beams(expr) -> bool:
        if isinstance(expr, ast.Call):
            if isinstance(expr.func, ast.Name) and expr.func.id == "getattr" and expr.args:
                return beams(expr.args[0])
            return isinstance(expr.func, ast.Name) and expr.func.id in returning
        return root(expr) in beam_names

    for _ in range(5):  # names bound to Beam's objects: x = getattr(module, "C"); mod = _beam_module()
        before = (len(beam_names), len(returning))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and beams(node.value):
                beam_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(r, ast.Return) and r.value is not None and beams(r.value) for r in ast.walk(node)
            ):
                returning.add(node.name)
        if (len(beam_names), len(returning)) == before:
            break

    found = []
    for node in ast.walk(tree):
        targets: list = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            if root(node.args[0]) in beam_names:
                found.append(f"{filename}:{node.lineno}: {node.func.id}({ast.unparse(node.args[0])}, ...)")
            continue
        for t in targets:
            for sub in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                if isinstance(sub, ast.Attribute) and root(sub) in beam_names:
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(sub)} changed")
    return sorted(found, key=lambda f: int(f.split(":")[-2]))


def _header(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(
        line for line in lines[: next((i for i, s in enumerate(lines) if not s.startswith("#")), len(lines))]
    )


# ---- the checks ----


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True)


def _tool_missing(proc: subprocess.CompletedProcess[str], module: str) -> Result | None:
    if proc.returncode != 0 and re.search(rf"No module named '?{module}\b", proc.stderr):
        return Result(False, [f"{module} is not installed: pip install -e '.[test]'"])
    return None


def _ratchet(name: str, current: dict[str, int], baseline_file: Path, lower: bool) -> Result:
    baseline = json.loads(baseline_file.read_text()) if baseline_file.exists() else {}
    worse, better = compare_counts(current, baseline)
    lines = [f"UP   {k}: {was} -> {now} {name}" for k, was, now in worse]
    lines += [
        f"down {k}: {was} -> {now} {name} (lower {baseline_file.relative_to(ROOT)}: .ci/checks.py --lower)"
        for k, was, now in better
    ]
    if lower and better:
        baseline_file.write_text(json.dumps(lowered_counts(current, baseline), indent=1) + "\n")
        lines.append(f"lowered {baseline_file.relative_to(ROOT)}")
    return Result(
        not worse, lines, f"{sum(current.values())} {name} in {len(current)} files (baseline {sum(baseline.values())})"
    )


def check_ruff(lower: bool) -> Result:
    proc = _run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."])
    if missing := _tool_missing(proc, "ruff"):
        return missing
    findings = [s for s in proc.stdout.splitlines() if re.match(r"^[^:]+:\d+:\d+: ", s)]
    lines = findings if proc.returncode else []
    if proc.returncode and not findings:
        lines = (proc.stdout + proc.stderr).splitlines()
    return Result(proc.returncode == 0, lines, f"{len(findings)} findings")


def check_long_lines(lower: bool) -> Result:
    proc = _run(
        [sys.executable, "-m", "ruff", "check", "--select", "E501", "--output-format", "json", "--exit-zero", "."]
    )
    if missing := _tool_missing(proc, "ruff"):
        return missing
    if proc.returncode:
        return Result(False, (proc.stdout + proc.stderr).splitlines()[-20:])
    return _ratchet("long lines", parse_ruff_json(proc.stdout), BASELINES / "long-lines.json", lower)


def check_format(lower: bool) -> Result:
    listed_file = BASELINES / "formatted.txt"
    listed = set(read_allowed(listed_file.read_text()))
    proc = _run([sys.executable, "-m", "ruff", "format", "--check", "--output-format", "concise", "."])
    if missing := _tool_missing(proc, "ruff"):
        return missing
    unformatted = {m[1] for m in re.finditer(r"^(.+?):\d+:\d+: unformatted", proc.stdout, re.M)}
    if proc.returncode and not unformatted:  # ruff itself failed (a syntax error, a bad option)
        return Result(False, (proc.stdout + proc.stderr).splitlines()[-20:])
    failing = sorted(listed & unformatted)
    missing_files = sorted(p for p in listed if not (ROOT / p).exists())
    shown = _run([sys.executable, "-m", "ruff", "check", "--show-files", "."])  # the files ruff looks at
    every = sorted(Path(s).relative_to(ROOT).as_posix() for s in shown.stdout.splitlines() if s.endswith(".py"))
    newly = [p for p in every if p not in listed and p not in unformatted]
    lines = [f"{p}: not formatted (ruff format {p})" for p in failing]
    lines += [f"{p}: listed in {listed_file.relative_to(ROOT)} but gone (remove it)" for p in missing_files]
    if newly:
        lines.append(
            f"formatted but not listed (could be added to {listed_file.relative_to(ROOT)}): " + ", ".join(newly)
        )
    return Result(not failing, lines, f"{len(listed) - len(failing)} of {len(every)} files held to ruff format")


def check_imports(lower: bool) -> Result:
    proc = _run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
        ]
    )
    if missing := _tool_missing(proc, "importlinter"):
        return missing
    out = proc.stdout + proc.stderr
    kept = re.search(r"Contracts: .*", out)
    ignored = sum(int(n) for n in re.findall(r"\((\d+) ignored imports?\)", out))
    summary = f"{kept[0].rstrip('.') if kept else '?'}, {ignored} ignored imports"
    if proc.returncode:
        start = out.find("Broken contracts")
        return Result(False, out[start if start >= 0 else 0 :].strip().splitlines(), summary)
    return Result(True, [], summary)


def check_mypy(lower: bool) -> Result:
    proc = _run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--show-error-codes"])
    if missing := _tool_missing(proc, "mypy"):
        return missing
    if proc.returncode not in (0, 1) or "error:" in proc.stderr:  # 2: mypy could not run
        return Result(False, (proc.stdout + proc.stderr).splitlines()[-20:])
    counts = parse_mypy(proc.stdout)
    if proc.returncode == 1 and not counts:  # errors reported in a form this script does not read
        return Result(False, ["mypy reported errors but none could be read:", *proc.stdout.splitlines()[-20:]])
    return _ratchet("mypy errors", counts, BASELINES / "mypy.json", lower)


def check_vulture(lower: bool) -> Result:
    allowed_file = BASELINES / "vulture.txt"
    proc = _run([sys.executable, "-m", "vulture"])  # paths and confidence: pyproject.toml [tool.vulture]
    if missing := _tool_missing(proc, "vulture"):
        return missing
    if proc.returncode not in (0, 3):  # 3: dead code found
        return Result(False, (proc.stdout + proc.stderr).splitlines()[-20:])
    found = parse_vulture(proc.stdout)
    if proc.returncode == 3 and not found:  # findings in a form this script does not read
        return Result(False, ["vulture reported dead code but none could be read:", *proc.stdout.splitlines()[-20:]])
    text = allowed_file.read_text()
    new, gone = compare_findings(found, read_allowed(text))
    lines = [f"new: {s} (remove the code, or list it in {allowed_file.relative_to(ROOT)} with its reason)" for s in new]
    lines += [f"gone: {s} (remove it from {allowed_file.relative_to(ROOT)})" for s in gone]
    if lower and gone:
        keep = Counter(gone)
        out = []
        for line in text.splitlines(keepends=True):
            key = line.split("  #", 1)[0].strip()
            if keep[key] > 0:
                keep[key] -= 1
                continue
            out.append(line)
        allowed_file.write_text("".join(out))
        lines.append(f"lowered {allowed_file.relative_to(ROOT)}")
    return Result(not new, lines, f"{sum(found.values())} findings ({len(new)} not listed)")


def check_sizes(lower: bool) -> Result:
    listed_file = BASELINES / "sizes.txt"
    text = listed_file.read_text()
    exceptions = read_size_exceptions(text)
    files = [p for d in SIZE_PATHS for p in (ROOT / d).rglob("*.py")]
    offenders = size_offenders(files)
    failures, shrank, fixed = compare_sizes(offenders, exceptions)
    name = listed_file.relative_to(ROOT)
    lines = []
    for key, was, now in failures:
        limit = FUNCTION_LIMIT if "::" in key else MODULE_LIMIT
        lines.append(f"{key}: {now} lines (limit {limit}; " + (f"listed at {was})" if was else "not listed)"))
    lines += [f"{key}: {now} lines, listed at {was} (lower it in {name})" for key, was, now in shrank]
    lines += [f"{key}: within its limit now (remove it from {name})" for key in fixed]
    if lower and (shrank or fixed):
        lowered = {k: (min(n, offenders[k]), reason) for k, (n, reason) in exceptions.items() if k in offenders}
        listed_file.write_text(render_size_exceptions(_header(text), lowered))
        lines.append(f"lowered {name}")
    modules = sum("::" not in k for k in offenders)
    return Result(
        not failures,
        lines,
        f"{modules} modules over {MODULE_LIMIT} lines, {len(offenders) - modules} functions over {FUNCTION_LIMIT}",
    )


def check_beam_patches(lower: bool) -> Result:
    files = [p for d in ("streameval", "pipelines") for p in sorted((ROOT / d).rglob("*.py"))]
    found = [line for p in files for line in beam_patches(p.read_text(), str(p.relative_to(ROOT)))]
    return Result(not found, found, f"{len(files)} files, {len(found)} changes to Beam")


CHECKS: dict[str, Callable[[bool], Result]] = {
    "ruff": check_ruff,
    "long-lines": check_long_lines,
    "format": check_format,
    "imports": check_imports,
    "mypy": check_mypy,
    "vulture": check_vulture,
    "sizes": check_sizes,
    "beam-patches": check_beam_patches,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated checks of: {', '.join(CHECKS)}")
    parser.add_argument(
        "--lower", action="store_true", help="write the baselines down to today's counts where lower (never up)"
    )
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        parser.error(f"unknown check {', '.join(unknown)}; the checks: {', '.join(CHECKS)}")
    start = time.perf_counter()
    failed = []
    for name in names:
        t0 = time.perf_counter()
        result = CHECKS[name](args.lower)
        status = "ok  " if result.ok else "FAIL"
        print(f"{status} {name:<10} {time.perf_counter() - t0:5.1f} s  {result.summary}", flush=True)
        for line in result.lines:
            print(f"       {line}")
        if not result.ok:
            failed.append(name)
    total = time.perf_counter() - start
    print(f"{'failed: ' + ', '.join(failed) if failed else 'all checks passed'} ({total:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
