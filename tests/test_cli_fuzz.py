"""Issue 20, item 9: every option of every ``streameval`` subcommand, given hostile values, ends in
one line on stderr and a documented exit status (docs/cli.md, "`streameval batch`"): 0 done, 2 usage or input
error, 3 an input check failed; 1 only for what a command documents as a failed run or check
(``reconcile``: the tables disagree). Never a traceback.

The jobs (batch, stream, ope) are fuzzed up to the first transform applied to their Beam pipeline
(``Pipeline.apply`` raises :class:`_WouldRun`): option handling (each job checks every option before
it builds anything), input matching, output preparation and the runner's name, where these errors
live. Building the whole pipeline costs about 0.2 s a case in Beam's type inference, too slow for
thousands of cases; what happens to records inside a running pipeline is the differential and
record tests' business. Each case has a fresh output directory.
"""

from __future__ import annotations

import argparse
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import apache_beam as beam
import pytest

from streameval import cli
from streameval.io import avro

BASE_TS = 1_574_553_600_000_000

#: values a text option or positional argument gets, one at a time
HOSTILE = ["", " ", "nan", "inf", "-1", "0", "1.5", "9223372036854775808", "-9223372036854775809", "1e23",
           "\u00e9\x00x", "@@", "P@9223372036854775807", "{missing}", "{dir}", "{file}", "{garbage}"]
#: an option argparse converts gets the values that pass its conversion and are out of range, and one
#: that does not (argparse's own error); an option with choices, one value outside them
HOSTILE_INT = ["-1", "0", "9223372036854775808", "-9223372036854775809", "1.5"]
HOSTILE_FLOAT = ["nan", "inf", "-inf", "-1", "0", "1e308", "x"]
HOSTILE_CHOICE = ["@@"]


def _values(action):
    if action.choices is not None:
        return HOSTILE_CHOICE
    if action.type is int:
        return HOSTILE_INT
    if action.type is float:
        return HOSTILE_FLOAT
    return HOSTILE


class _WouldRun(BaseException):
    """Raised instead of running a Beam pipeline (not an Exception: no handler of a job catches it)."""


def _would_run(self, *a, **k):
    raise _WouldRun()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-in")
    imps = [{"event_id": f"r{q}/{i}", "request_id": f"r{q}", "query_id": f"q{q}", "user_id": None, "system_id": "A",
             "item_id": f"d{i}", "position": i, "score": float(5 - i), "clicked": i == 1,
             "timestamp": BASE_TS + q, "propensity": 0.5, "attributes": {"device": "pc"}}
            for q in range(3) for i in range(1, 4)]
    judg = [{"query_id": f"q{q}", "item_id": f"d{i}", "grade": i % 2, "timestamp": 0, "source": ""}
            for q in range(3) for i in range(1, 4)]
    avro.write_records(d / "imps.avro", "impression", imps)
    avro.write_records(d / "judg.avro", "judgment", judg)
    (d / "qrels").write_text("".join(f"q{q} 0 d{i} {i % 2}\n" for q in range(3) for i in range(1, 4)))
    (d / "a.run").write_text("".join(f"q{q} Q0 d{i} {i} {5 - i} A\n" for q in range(3) for i in range(1, 4)))
    (d / "div.qrels").write_text("".join(f"{q + 1} {s} d{i} {(i + s) % 3}\n" for q in range(3) for s in (1, 2)
                                          for i in range(1, 4)))
    (d / "div.run").write_text("".join(f"{q + 1} Q0 d{i} {i} {5 - i} A\n" for q in range(3) for i in range(1, 4)))
    (d / "b.run").write_text("".join(f"q{q} Q0 d{i} {i} {i} B\n" for q in range(3) for i in range(1, 4)))
    rows = [{"window_start": None, "window_end": None, "slice": "all", "system": "A", "metric": "map", "value": 0.5,
             "num_queries": 3, "stderr": 0.1}]
    (d / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "obd.csv").write_text(",timestamp,item_id,position,click,propensity_score," + ",".join(
        f"user_feature_{i}" for i in range(4)) + "\n" + "".join(
        f"{k},2019-11-24 00:0{k}:00+00:00,{k % 3},{k % 3 + 1},{k % 2},0.3,a,b,c,d\n" for k in range(6)))
    (d / "letor.txt").write_text("1 1:0.5 2:0.1\n0 1:0.2 2:0.3\n")
    (d / "letor.query").write_text("2\n")
    (d / "yandex.txt").write_text("7_1\t11,12,13 : 12; 7_1\t12,11,13 :\n")
    (d / "table.csv").write_text("eid,rid,q,sys,doc,rank,ts,region\n" + "".join(
        f"e{k},r{k // 3},q{k // 3},A,d{k},{k % 3 + 1},2019-11-24T00:00:0{k}Z,eu\n" for k in range(6)))
    (d / "garbage").write_bytes(b"Obj\x01\xff\xfe not avro \x00 at all\n")
    (d / "dir").mkdir()
    return d


def _commands(d):
    """name -> (parser, positional arguments, option arguments) of a valid call, with ``{out}`` for
    a fresh output path."""
    from streameval.jobs import batch, ope, stream
    from streameval.commands import compare, ndeval, reconcile, report

    job = ["--impressions", str(d / "imps.avro"), "--judgments", str(d / "judg.avro"), "--metrics", "map,P@2",
           "--output", "{out}", "--quiet"]
    convert = argparse.ArgumentParser()
    cli._convert_parser(convert.add_subparsers(dest="command"))
    kinds = {a.dest: a for a in convert._actions if isinstance(a, argparse._SubParsersAction)}["command"]
    conv = {a.dest: a for a in kinds.choices["convert"]._actions if isinstance(a, argparse._SubParsersAction)}["kind"]
    return {
        "trec-eval": (cli._trec_eval_parser(), [str(d / "qrels"), str(d / "a.run")], []),
        "ndeval": (ndeval._parser(), [str(d / "div.qrels"), str(d / "div.run")], []),
        "batch": (batch.build_arg_parser(), [], job),
        "stream": (stream.build_arg_parser(), [], ["--replay", "--window", "1h", *job]),
        "ope": (ope.build_arg_parser(), [], ["--logs", str(d / "obd.csv"), "--target", "random", "--n-items", "3",
                                             "--system", "bts", "--output", "{out}"]),
        "reconcile": (reconcile._parser(), [str(d / "m.jsonl"), str(d / "m.jsonl")], []),
        "compare": (compare.build_arg_parser(), [str(d / "qrels"), str(d / "a.run"), str(d / "b.run")], []),
        "report": (report.build_arg_parser(), [str(d / "m.jsonl")], ["--out", "{out}"]),
        "convert trec-run": (conv.choices["trec-run"], [str(d / "a.run"), "{out}.avro"], []),
        "convert qrels": (conv.choices["qrels"], [str(d / "qrels"), "{out}.avro"], []),
        "convert obd": (conv.choices["obd"], [str(d / "obd.csv"), "{out}.avro"], ["--system", "bts"]),
        "convert letor": (conv.choices["letor"], [str(d / "letor.txt"), str(d / "letor.query"), "{out}-i.avro",
                                                  "{out}-j.avro"], []),
        "convert yandex": (conv.choices["yandex"], [str(d / "yandex.txt"), "{out}.avro"], []),
        "convert table": (conv.choices["table"], [str(d / "table.csv")],
                          ["--kind", "impressions", "--out", "{out}.avro", "--map",
                           "event_id=eid,request_id=rid,query_id=q,system_id=sys,item_id=doc,position=rank,timestamp=ts"]),
        "convert interleave": (conv.choices["interleave"], [], ["--run-a", str(d / "a.run"), "--run-b",
                                                                str(d / "b.run"), "--qrels", str(d / "qrels"),
                                                                "--output", "{out}.avro"]),
    }


#: commands whose exit status 1 is documented as a failed run or check
FAILED_CHECK_IS_1 = {"reconcile"}


def _cases(d):
    for name, (parser, pos, opts) in _commands(d).items():
        yield name, None, pos, opts  # the valid call
        for i in range(len(pos)):
            for v in HOSTILE:
                yield name, [f"positional {i} = {v!r}"], pos[:i] + [v] + pos[i + 1:], opts
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = max(action.option_strings, key=len)
            if action.nargs == 0:
                yield name, [flag], pos, [*opts, flag]
                continue
            for v in _values(action):
                yield name, [f"{flag} {v!r}"], pos, [*opts, flag, v]


def _fill(args, d, out):
    """Placeholders: ``{out}`` a fresh output path; ``{file}`` an existing text file of the case (a
    command may overwrite it); ``{dir}``, ``{missing}``, ``{garbage}`` shared ones."""
    existing = f"{out}.existing"
    with open(existing, "w") as f:
        f.write("q1 0 d1 1\n")
    return [a.replace("{out}", str(out)).replace("{missing}", str(d / "no" / "such" / "file"))
             .replace("{dir}", str(d / "dir")).replace("{file}", existing).replace("{garbage}", str(d / "garbage"))
            for a in args]


def _call(argv):
    """(exit status or "would run", stderr text, escaped exception or None) of ``streameval argv``."""
    err, std = io.StringIO(), io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(std):
            return cli.main(argv), err.getvalue(), None
    except SystemExit as e:  # argparse: usage and one "error:" line, exit 2
        return (e.code if isinstance(e.code, int) else 2), err.getvalue(), None
    except _WouldRun:
        return "would run", err.getvalue(), None
    except BaseException as e:  # noqa: BLE001 (the test reports every escape)
        return None, err.getvalue(), e


def test_every_option_of_every_command_fails_in_one_line(inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(beam.Pipeline, "apply", _would_run)
    monkeypatch.chdir(tmp_path)
    problems, n = [], 0
    for k, (name, what, pos, opts) in enumerate(_cases(inputs)):
        out = tmp_path / f"out{k}"
        n += 1
        rc, text, escaped = _call([*name.split(), *_fill(pos, inputs, out), *_fill(opts, inputs, out)])
        if what is None:  # the valid call: the cases around it test what they say
            assert rc in (0, "would run"), (name, rc, text)
            continue
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("WARNING:", "INFO:"))]
        if escaped is not None:
            problems.append(f"{name} {what}: {type(escaped).__name__}: {escaped}".splitlines()[0][:300])
        elif "Traceback" in text:
            problems.append(f"{name} {what}: traceback on stderr: {text.strip().splitlines()[-1][:200]}")
        elif rc == "would run" or rc == 0:
            continue
        elif rc not in (2, 3) and not (rc == 1 and name in FAILED_CHECK_IS_1):
            problems.append(f"{name} {what}: exit {rc}: {' | '.join(lines)[:200]}")
        elif "error:" in text and text.lstrip().startswith("usage:"):
            continue  # argparse: its usage, then one error line
        elif len(lines) != 1 and not (rc == 3 and lines):
            problems.append(f"{name} {what}: exit {rc} without exactly one error line: {lines[:4]}")
    assert n > 1000
    assert not problems, f"{len(problems)} of {n} cases:\n" + "\n".join(problems)
