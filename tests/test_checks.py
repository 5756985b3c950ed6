"""The static checks' own logic (.ci/checks.py) on tiny synthetic inputs, so that a check cannot pass silently:
a baseline going up fails, going down passes and is named, an 81-line function and an 801-line module are
flagged, and the tools' real output is read (a format this script cannot read would count nothing)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("ci_checks", ROOT / ".ci" / "checks.py")
assert _spec and _spec.loader
checks = importlib.util.module_from_spec(_spec)
sys.modules["ci_checks"] = checks  # dataclasses looks the module up by name
_spec.loader.exec_module(checks)


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines (its def line included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return None\n"


# ---- count baselines (mypy, long lines) ----


def test_a_count_going_up_fails_and_down_passes():
    worse, better = checks.compare_counts({"a.py": 3, "b.py": 1}, {"a.py": 2, "b.py": 2})
    assert worse == [("a.py", 2, 3)]
    assert better == [("b.py", 2, 1)]
    assert checks.compare_counts({"a.py": 2}, {"a.py": 2}) == ([], [])


def test_a_new_file_with_errors_fails_and_a_fixed_file_is_named():
    worse, better = checks.compare_counts({"new.py": 1}, {"old.py": 4})
    assert worse == [("new.py", 0, 1)]
    assert better == [("old.py", 4, 0)]


def test_lowering_never_raises_a_count():
    assert checks.lowered_counts({"a.py": 5, "b.py": 1, "c.py": 9}, {"a.py": 3, "b.py": 2, "d.py": 1}) == {
        "a.py": 3,
        "b.py": 1,
    }


def test_ratchet_result(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "ROOT", tmp_path)
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps({"a.py": 2, "b.py": 2}))
    up = checks._ratchet("errors", {"a.py": 3, "b.py": 2}, baseline, lower=False)
    assert not up.ok and any(line.startswith("UP   a.py: 2 -> 3") for line in up.lines)
    down = checks._ratchet("errors", {"a.py": 1, "b.py": 2}, baseline, lower=False)
    assert down.ok and any("a.py: 2 -> 1" in line and "--lower" in line for line in down.lines)
    assert json.loads(baseline.read_text()) == {"a.py": 2, "b.py": 2}  # not written without --lower
    checks._ratchet("errors", {"a.py": 1, "b.py": 2}, baseline, lower=True)
    assert json.loads(baseline.read_text()) == {"a.py": 1, "b.py": 2}


def test_parse_mypy_counts_errors_not_notes():
    out = (
        "streameval/a.py:3: error: Incompatible types in assignment  [assignment]\n"
        "streameval/a.py:9:5: error: Name 'x' is not defined  [name-defined]\n"
        "streameval/a.py:9: note: See https://mypy.readthedocs.io\n"
        "streameval/b/c.py:1: error: Module has no attribute  [attr-defined]\n"
    )
    assert checks.parse_mypy(out) == {"streameval/a.py": 2, "streameval/b/c.py": 1}
    assert checks.parse_mypy("") == {}


def test_parse_ruff_json_paths_relative(tmp_path):
    text = json.dumps([{"filename": str(tmp_path / "x" / "a.py")}] * 2 + [{"filename": "b.py"}])
    assert checks.parse_ruff_json(text, tmp_path) == {"x/a.py": 2, "b.py": 1}


# ---- vulture's allowed findings ----


def test_vulture_new_finding_fails_and_a_moved_line_does_not():
    allowed = checks.read_allowed("# comment\np.py: unused variable 'r' (100% confidence)  # a reason\n\n")
    moved = checks.parse_vulture("p.py:99: unused variable 'r' (100% confidence)\n")
    assert checks.compare_findings(moved, allowed) == ([], [])
    more = checks.parse_vulture(
        "p.py:58: unused variable 'r' (100% confidence)\nq.py:3: unused import 'os' (90% confidence)\n"
    )
    assert checks.compare_findings(more, allowed) == (["q.py: unused import 'os' (90% confidence)"], [])
    assert checks.compare_findings(Counter(), allowed) == ([], ["p.py: unused variable 'r' (100% confidence)"])


def test_vulture_a_second_identical_finding_is_new():
    allowed = checks.read_allowed("p.py: unused variable 'r' (100% confidence)\n")
    twice = checks.parse_vulture(
        "p.py:5: unused variable 'r' (100% confidence)\np.py:50: unused variable 'r' (100% confidence)\n"
    )
    assert checks.compare_findings(twice, allowed)[0] == ["p.py: unused variable 'r' (100% confidence)"]


# ---- sizes ----


def test_an_81_line_function_is_flagged_and_an_80_line_one_is_not(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "class C:\n" + _function("method", 81, indent="    ") + _function("ok", 80) + _function("big", 81)
    )
    assert checks.function_sizes(module.read_text()) == {"C.method": 81, "ok": 80, "big": 81}
    assert checks.size_offenders([module], tmp_path) == {"m.py::C.method": 81, "m.py::big": 81}


def test_an_801_line_module_is_flagged(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * 801)
    (tmp_path / "fine.py").write_text("x = 1\n" * 800)
    assert checks.size_offenders(sorted(tmp_path.glob("*.py")), tmp_path) == {"long.py": 801}


def test_size_exceptions_new_grown_shrunk_and_fixed():
    listed = checks.read_size_exceptions(
        "# header\na.py 900 a reason\na.py::f 90 one phrase\nb.py::g 85 another\nc.py 801 gone soon\n"
    )
    assert listed["a.py::f"] == (90, "one phrase")
    failures, shrank, fixed = checks.compare_sizes({"a.py": 901, "a.py::f": 85, "b.py::g": 85, "d.py::h": 81}, listed)
    assert failures == [("a.py", 900, 901), ("d.py::h", None, 81)]
    assert shrank == [("a.py::f", 90, 85)]
    assert fixed == ["c.py"]


def test_size_exceptions_malformed_line_is_an_error():
    with pytest.raises(ValueError, match="line 1"):
        checks.read_size_exceptions("a.py no-number reason\n")


def test_check_sizes_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "ROOT", tmp_path)
    monkeypatch.setattr(checks, "BASELINES", tmp_path / "baselines")
    monkeypatch.setattr(checks, "SIZE_PATHS", ("pkg",))
    (tmp_path / "baselines").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(_function("f", 81) + _function("g", 95))
    listed = tmp_path / "baselines" / "sizes.txt"
    listed.write_text("# header\npkg/m.py::g 100 a reason\npkg/m.py::gone 90 split already\n")
    result = checks.check_sizes(lower=False)
    assert not result.ok
    assert any(line.startswith("pkg/m.py::f: 81 lines (limit 80; not listed)") for line in result.lines)
    assert any("pkg/m.py::g: 95 lines, listed at 100" in line for line in result.lines)
    assert any("pkg/m.py::gone: within its limit now" in line for line in result.lines)
    (tmp_path / "pkg" / "m.py").write_text(_function("f", 80) + _function("g", 95))
    assert checks.check_sizes(lower=True).ok
    assert checks.read_size_exceptions(listed.read_text()) == {"pkg/m.py::g": (95, "a reason")}
    assert listed.read_text().startswith("# header\n")


def test_main_fails_when_one_check_fails(monkeypatch, capsys):
    monkeypatch.setattr(
        checks,
        "CHECKS",
        {"good": lambda lower: checks.Result(True), "bad": lambda lower: checks.Result(False, ["why"])},
    )
    assert checks.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL bad" in out and "why" in out and "failed: bad" in out
    assert checks.main(["--only", "good"]) == 0


# ---- the tools' real output, read by this script (skipped when a tool is not installed) ----


def _tool(module: str, args: list[str], cwd: Path) -> str:
    pytest.importorskip(module)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True).stdout


def test_real_mypy_output_is_read(tmp_path):
    (tmp_path / "bad.py").write_text('x: int = "a"\ny: str = 1\n')
    out = _tool(
        "mypy", ["--no-error-summary", "--no-pretty", "--cache-dir", str(tmp_path / "cache"), "bad.py"], tmp_path
    )
    assert checks.parse_mypy(out) == {"bad.py": 2}


def test_real_vulture_output_is_read(tmp_path):
    (tmp_path / "dead.py").write_text("import os\n\n\ndef f():\n    return 1\n    print('never')\n")
    out = _tool("vulture", ["dead.py", "--min-confidence", "80"], tmp_path)
    assert sum(checks.parse_vulture(out).values()) == 2  # the unused import, the unreachable line


def test_real_ruff_long_lines_are_read(tmp_path):
    (tmp_path / "wide.py").write_text("x = 1\ny = '" + "a" * 130 + "'\n")
    out = _tool(
        "ruff",
        [
            "check",
            "--isolated",
            "--line-length",
            "120",
            "--select",
            "E501",
            "--output-format",
            "json",
            "--exit-zero",
            "wide.py",
        ],
        tmp_path,
    )
    assert checks.parse_ruff_json(out, tmp_path) == {"wide.py": 1}


def test_beam_patches_found_and_not():
    patched = (
        "import apache_beam as beam\n"
        "from apache_beam.transforms import userstate, core as c\n"
        "from apache_beam.io.aws.clients.s3 import boto3_client\n"
        "userstate.get_dofn_specs = lambda d: d\n"
        "c.get_function_arguments += 1\n"
        "setattr(boto3_client, 'boto3', None)\n"
        "beam.io.Thing.x, other = 1, 2\n"
        "del userstate.x\n"
        "def _mod():\n    from apache_beam.io import s3\n    return s3\n"
        "mod = _mod()\nmod.boto3 = None\n"  # 13
        "cls = getattr(c, 'Evaluator', None)\ncls.process = None\n"
    )  # 15
    found = checks.beam_patches(patched, "m.py")
    assert [f.split(":")[1] for f in found] == ["4", "5", "6", "7", "8", "13", "15"], found
    clean = (
        "import apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import StandardOptions\n"
        "class Mine(beam.DoFn):\n    pass\n"
        "o = object()\n"
        "o.runner = 'x'\n"  # not Beam's
        "def f(options):\n    options.view_as(StandardOptions).runner = 'FnApiRunner'\n"  # a value, not Beam
        "mine = Mine()\nmine.attr = 1\n"
    )
    assert checks.beam_patches(clean, "m.py") == []


def test_production_code_patches_nothing_in_beam():
    """Issue 37 item 3: no assignment to an apache_beam attribute outside tests (the check over the tree)."""
    result = checks.check_beam_patches(False)
    assert result.ok, result.lines
