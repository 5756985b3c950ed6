"""Counter names are written once, in ``streameval/io/counters.py`` (issue 22, item 2).

* Source checks (``ast``): no call that names a counter or a distribution (``counter``,
  ``Metrics.counter``, ``distribution``, the streaming job's ``_tally`` / ``count_records``, the
  console's ``_count``) passes a string literal, an f-string or a concatenation with one as the name,
  and no other string in ``streameval/`` spells a counter name or a counter prefix
  (a reader's ``counters.get("...")``). Both are checked to fail on a planted literal.
* End to end: a small batch job (both engines) on a log with a replay, a rejected record, a late
  impression, a request without judgments and clicks not logged carries the names users' dashboards
  read, with the counts taken directly from the input.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from streameval.io import counters as cn

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "streameval" / "io" / "counters.py"

#: call name -> index of the argument that is the counter's name
_NAMING_CALLS = {"counter": 1, "distribution": 1, "_tally": 1, "count_records": 1}
#: calls that name a count only in one module (``_count`` is also reconcile's unrelated helper)
_NAMING_CALLS_IN = {"_count": (0, "console.py")}


def _sources():
    files = sorted(p for d in ("streameval",) for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 50, files  # the scan sees the tree
    return [p for p in files if p != MODULE]


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _literal_text(node) -> bool:
    """A string literal, an f-string, or a ``+`` / ``%`` / ``.format`` built on one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _literal_text(node.left) or _literal_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _literal_text(node.func.value)
    return False


def literal_names(tree: ast.AST, filename: str) -> list[tuple[int, str]]:
    """(line, call) of every counter-naming call of ``tree`` whose name argument is literal text."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        idx = _NAMING_CALLS.get(name)
        if name in _NAMING_CALLS_IN:
            idx, only = _NAMING_CALLS_IN[name]
            if not filename.endswith(only):
                idx = None
        if idx is None:
            continue
        arg = node.args[idx] if len(node.args) > idx else None
        if arg is None:
            arg = next((k.value for k in node.keywords if k.arg == "name"), None)
        if arg is not None and _literal_text(arg):
            out.append((node.lineno, ast.unparse(node)))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _fixed_names() -> set[str]:
    skip = {"NAMESPACE", "DECODER_NAMESPACE", "READ_SUFFIX"}
    return {v for k, v in vars(cn).items() if k.isupper() and k not in skip and isinstance(v, str)
            and not k.endswith("_PREFIX")}


#: what every parameterised name starts with (the module's prefixes and functions, with a placeholder)
_PREFIXES = (cn.REJECTED_PREFIX, cn.LATE_PREFIX, cn.ONLINE_PREFIX, cn.duplicate(""), cn.superseded(""),
             cn.unreadable_files(""), cn.written(""), cn.panes(""), "ope:")


def spelled_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string of ``tree`` (docstrings apart; f-string pieces included) that is a
    counter name of :mod:`streameval.io.counters` or starts with one of its prefixes."""
    fixed, docs, out = _fixed_names(), _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            s = node.value
            if s in fixed or (s.startswith(_PREFIXES) and " " not in s.split(":", 1)[0]):
                out.append((node.lineno, s))
    return out


def _scan(check):
    bad = []
    for p in _sources():
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
        bad += [f"{p.relative_to(ROOT)}:{line}: {what}" for line, what in check(tree, str(p))]
    return bad


def test_no_counter_is_named_by_a_literal():
    bad = _scan(literal_names)
    assert not bad, "counter names belong in streameval/io/counters.py:\n" + "\n".join(bad)


#: strings that spell a counter name but are something else: summary.json's accounting fields
#: (``entry.update(click_impressions=...)``), named after the counters they report
_NOT_NAMES = {("streameval/beam/accounting.py", "click_impressions"),
              ("streameval/beam/accounting.py", "click_impressions_not_logged")}


def test_no_reader_spells_a_counter_name():
    bad = _scan(lambda tree, path: [(line, s) for line, s in spelled_names(tree)
                                    if (str(Path(path).relative_to(ROOT)), s) not in _NOT_NAMES])
    assert not bad, "counter names belong in streameval/io/counters.py:\n" + "\n".join(bad)


@pytest.mark.parametrize("code,fixed", [
    ('Metrics.counter(NAMESPACE, "queries_scored").inc()', "Metrics.counter(NAMESPACE, cn.QUERIES_SCORED).inc()"),
    ('counter(NAMESPACE, f"rejected:{kind}:{key}")', "counter(NAMESPACE, cn.rejected(kind, key))"),
    ('distribution(NAMESPACE, "element_" + stage)', "distribution(NAMESPACE, cn.ELEMENT_IMPRESSIONS_CLEAN)"),
    ('_tally(run, "impressions_read", n)', "_tally(run, cn.IMPRESSIONS_READ, n)"),
    ('Metrics.counter(NAMESPACE, "{}s_read".format(kind))', "Metrics.counter(NAMESPACE, cn.read(kind))"),
])
def test_the_source_check_catches_a_planted_literal(code, fixed):
    assert literal_names(ast.parse(code), "streameval/beam/x.py"), code
    assert literal_names(ast.parse(fixed), "streameval/beam/x.py") == []


@pytest.mark.parametrize("code,found", [
    ('counters.get("impressions_ranked", 0)', "impressions_ranked"),
    ('[k for k in c if k.startswith("online:")]', "online:"),
    ('c.get(f"late:{kind}")', "late:"),
    ('c["duplicate:impression"]', "duplicate:impression"),
])
def test_the_reader_check_catches_a_planted_name(code, found):
    assert [s for _, s in spelled_names(ast.parse(code))] == [found]


def test_prose_and_other_strings_are_not_names():
    tree = ast.parse('"""late:impression in a docstring"""\nx = "late data: none"\ny = "impressions"\n')
    assert spelled_names(tree) == []


def test_the_module_imports_no_beam():
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert all(m == "__future__" for m in imported), imported


def test_the_names_are_the_published_ones():
    """The names dashboards and summaries read (docs/design.md, "How a record is accounted for")."""
    assert (cn.NAMESPACE, cn.DECODER_NAMESPACE) == ("streameval", "streameval.decoders")
    assert [cn.read(k) for k in cn.KINDS] == ["impressions_read", "judgments_read", "clicks_read"]
    assert [cn.valid("impression"), cn.accepted("judgment"), cn.duplicate("click"), cn.late("impression"),
            cn.superseded("judgment"), cn.unreadable_files("judgment")] == [
        "impressions_valid", "judgments_accepted", "duplicate:click", "late:impression", "superseded:judgment",
        "unreadable_files:judgment"]
    assert cn.rejected("impression", "position must be >= 1 (1-based)") == \
        "rejected:impression:position must be >= 1 (1-based)"
    assert cn.rejected_reason(cn.rejected("click", "a: b")) == "a: b"
    assert cn.online_no_group("user_id") == "online:no_group:user_id"
    assert (cn.decoder({"fastavro", "datafusion"}, "/x/a.avro"), cn.decoder((), "b"), cn.decoder_parquet("c:d")) == (
        "datafusion+fastavro:/x/a.avro", "none:b", "parquet:c:d")
    assert cn.decoder_parts(cn.decoder_parquet("s3://b/c.parquet")) == ("parquet", "s3://b/c.parquet")
    assert (cn.requests_fate("ranked"), cn.requests_fate("unjudged"), cn.impressions_fate("unrankable")) == (
        "requests_scored", "requests_unjudged", "impressions_unrankable")
    assert (cn.panes("on_time"), cn.written(cn.LATE_CLICK)) == ("panes_on_time", "written:late:click")


# --------------------------------------------------------------------------------------------
# end to end: a small batch job's counters

HOUR = 3_600_000_000


def _imp(req, item, pos, query, ts, clicked, score=None, system="A"):
    return {"event_id": f"{req}/{item}", "request_id": req, "query_id": query, "user_id": None, "system_id": system,
            "item_id": item, "position": pos, "score": float(10 - pos) if score is None else score,
            "clicked": clicked, "timestamp": ts, "propensity": None, "attributes": {}}


def _log():
    imps = [
        _imp("r1", "d1", 1, "q1", 0, True), _imp("r1", "d2", 2, "q1", 1, False), _imp("r1", "d3", 3, "q1", 2, False),
        _imp("r2", "d1", 1, "q1", 10, False), _imp("r2", "d3", 2, "q1", 11, True),
        _imp("r3", "d5", 1, "q9", 20, True), _imp("r3", "d6", 2, "q9", 21, False),  # q9: no judgment
        _imp("r4", "d1", 1, "q1", 30, None), _imp("r4", "d2", 2, "q1", 31, None),  # clicks not logged
        # r5 opens in the first hour; its second impression comes after the window closed: late
        _imp("r5", "d2", 1, "q1", HOUR - 5, False), _imp("r5", "d3", 2, "q1", HOUR + 5, True),
    ]
    replay = dict(imps[0])  # the same event again: a duplicate
    bad = dict(_imp("r6", "d1", 0, "q1", 40, True))  # position 0: rejected
    judg = [{"query_id": "q1", "item_id": d, "grade": g, "timestamp": 0, "source": "t"}
            for d, g in (("d1", 2), ("d2", 0), ("d3", 1))]
    return imps, replay, bad, judg


@pytest.mark.parametrize("engine", ["columnar", "records"])
def test_a_batch_job_carries_the_published_names(tmp_path, capsys, engine):
    from streameval.jobs import batch
    from streameval.io import avro

    imps, replay, bad, judg = _log()
    avro.write_records(tmp_path / "imps.avro", "impression", imps + [replay, bad])
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out = tmp_path / "out"
    code = batch.main(["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
                       "--metrics", "map,P@2,clicks@2", "--window", "1h", "--allowed-lateness", "0",
                       "--max-rejected-fraction", "1", "--engine", engine, "--runner", "FnApiRunner",
                       "--output", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    c = {k: v for k, v in summary["counters"].items() if v}

    # the counts, straight from the log
    read = len(imps) + 2
    late = [r for r in imps if r["timestamp"] >= HOUR]  # r5 opened in window [0, 1h)
    accepted = [r for r in imps if r not in late]
    reqs = {r["request_id"] for r in accepted}
    judged = {j["query_id"] for j in judg}
    unjudged = [r for r in accepted if r["query_id"] not in judged]
    not_logged = [r for r in accepted if r["clicked"] is None]
    logged_reqs = {r["request_id"] for r in accepted if r["clicked"] is not None}
    expected = {
        "impressions_read": read, "impressions_valid": read - 1,
        "rejected:impression:position must be >= 1 (1-based)": 1,
        "duplicate:impression": 1, "late:impression": len(late), "impressions_accepted": len(accepted),
        "impressions_ranked": len(accepted) - len(unjudged), "impressions_unjudged": len(unjudged),
        "requests_scored": len({r["request_id"] for r in accepted if r["query_id"] in judged}),
        "requests_unjudged": len({r["request_id"] for r in unjudged}),
        "click_impressions": len(accepted) - len(not_logged), "click_impressions_not_logged": len(not_logged),
        "judgments_read": len(judg), "judgments_valid": len(judg), "judgments_accepted": len(judg),
        "queries_scored": len({r["query_id"] for r in accepted} & judged),
        "online:requests": len(logged_reqs), "online:requests_not_logged": len(reqs - logged_reqs),
    }
    assert {k: c.get(k, 0) for k in expected} == expected
    assert c["metric_rows_written"] == summary["num_rows"] > 0
    # the accounting read the same names back
    acc = summary["accounting"]["impression"]
    assert (acc["read"], acc["duplicates"], acc["late"], acc["accepted"], acc["unjudged"]) == (
        read, 1, len(late), len(accepted), len(unjudged))
    assert acc["rejected"] == {"position must be >= 1 (1-based)": 1}
    assert summary["accounting_problems"] == []
    # and so did the report line
    printed = capsys.readouterr().out
    assert (f"requests: scored {expected['requests_scored']}, without judgments {expected['requests_unjudged']}"
            in printed), printed
    assert (f"online metrics: requests {expected['online:requests']}, requests_not_logged "
            f"{expected['online:requests_not_logged']}" in printed), printed
    if engine == "columnar":
        assert summary["decoders"] == {str(tmp_path / "imps.avro"): "datafusion",
                                       str(tmp_path / "judg.avro"): "datafusion"}
