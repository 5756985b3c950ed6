#!/usr/bin/env python3
"""The structure numbers of issue 39 ("one evaluation plan"), measured on ``streameval/`` with ``ast``
and pyproject.toml's import-linter exceptions; reported, never failing (the failing checks are
``.ci/checks.py``'s).

    python .ci/structure.py            a table of the numbers
    python .ci/structure.py --json     the same as JSON

What each number counts:

* ``params <Class>.__init__``: the parameters of the engines' constructors (``self`` not counted);
* ``functions with >= 10 parameters``;
* ``functions over 50 lines`` (decorators and docstrings included, as ``sizes`` counts them);
* ``literal-index reads``: subscripts by an integer literal read (``state[2]``, ``x[-1]``; not slices,
  not stores), in ``accumulators/`` and in the whole package;
* ``_private names imported from another module`` (``from .x import _y, _z``: 2; dunders not counted);
* ``imports inside functions``;
* ``dead-letter dicts written by hand``: dict displays with the keys source, raw and reason outside
  ``io/dead_letters.py``;
* ``import-linter exceptions``: the ignored imports of the layer contract (back-arrows) and of the
  no-cycle contract (each one import whose removal leaves no circle).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "streameval"
#: the engines whose constructors issue 39 counts
ENGINES = {"ColumnarMetrics": "beam/columnar.py", "StreamMetrics": "beam/streaming/transform.py",
           "ScoreRankings": "beam/transforms.py"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if names and names[0].arg in ("self", "cls") else 0)


def _int_literal(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def measure() -> dict:
    out: dict = {}
    long_functions, many_params, index_all, index_acc, private, inner, letters = [], [], 0, 0, 0, 0, 0
    for path, tree in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        parents: dict = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > 50:
                    long_functions.append((node.end_lineno - start + 1, f"{rel}::{node.name}"))
                if _params(node) >= 10:
                    many_params.append((_params(node), f"{rel}::{node.name}"))
                cls = parents.get(node)
                if node.name == "__init__" and isinstance(cls, ast.ClassDef) and cls.name in ENGINES \
                        and ENGINES[cls.name] == rel:
                    out[f"params {cls.name}.__init__"] = _params(node)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _int_literal(node.slice):
                index_all += 1
                index_acc += rel.startswith("accumulators/")
            elif isinstance(node, ast.ImportFrom):
                internal = node.level > 0 or (node.module or "").startswith("streameval")
                if internal:
                    private += sum(a.name.startswith("_") and not a.name.startswith("__") for a in node.names)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                p = parents.get(node)
                while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                    p = parents.get(p)
                inner += isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(node, ast.Dict) and rel != "io/dead_letters.py":
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                letters += {"source", "raw", "reason"} <= keys
    out["functions with >= 10 parameters"] = len(many_params)
    out["functions over 50 lines"] = len(long_functions)
    out["largest functions (lines)"] = [f"{name} {n}" for n, name in sorted(long_functions, reverse=True)[:5]]
    out["literal-index reads, accumulators/"] = index_acc
    out["literal-index reads, streameval/"] = index_all
    out["_private names imported from another module"] = private
    out["imports inside functions"] = inner
    out["dead-letter dicts written by hand"] = letters
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    for c in contracts:
        if c["type"] == "layers":
            out["import-linter exceptions: imports up a layer"] = len(c.get("ignore_imports", []))
        elif c["type"] == "acyclic_siblings":
            out["import-linter exceptions: import circles"] = len(c.get("ignore_imports", []))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    got = measure()
    if args.json:
        print(json.dumps(got, indent=1))
        return 0
    for k, v in got.items():
        print(f"{k:<52} {', '.join(v) if isinstance(v, list) else v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
