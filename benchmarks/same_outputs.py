"""Both jobs' outputs from two checkouts of streameval, side by side: byte-identical or not (issue 39:
a refactoring must not change one byte of what a job writes).

    git worktree add /tmp/base <commit>       # or: git archive <commit> | tar -x -C /tmp/base
    python benchmarks/same_outputs.py --base /tmp/base [--impressions 1000000] [--only sample,messy]

Each case runs ``streameval batch`` or ``streameval stream`` once with this checkout's code and once
with ``--base``'s (each in its own process, ``PYTHONPATH`` set to its tree), on the same inputs and
options, then compares every output file:

* JSON-lines and text files (``metrics.jsonl``, ``dead_letters.jsonl``, the stream's pane files,
  ``unjudged.jsonl``, ...): byte for byte (the stream's ``running_totals.jsonl``: but the time each
  line was written, ``at``);
* Avro files: their records (an Avro file's sync marker is random, so its bytes differ from run to run);
* ``summary.json``: every field but the run's own (wall time, dates, the run id, versions; the run
  folder's path in the paths it names).

Cases (``--only``): ``sample`` (the bundled sample: ranking metrics, CTR, slices, as ``make demo``),
``bootstrap`` (the sample's LETOR rankers: bootstrap intervals and paired comparisons), ``messy``
(the tests' messy logs, tests/test_columnar.py: dead letters of every kind, online metrics, GAUC),
``stream`` (the stream job's ``--replay`` of the sample: its pane files), ``generated`` (a
generated log of ``--impressions`` impressions, benchmarks/bench_beam.py's: ranking, CTR, online
metrics). Prints one line per case and file; exit status 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
SAMPLE = ROOT / "data" / "sample"
#: fields of JSON-lines outputs that tell when a line was written (the stream's running_totals.jsonl)
WALL_CLOCK = {"at"}
#: summary.json's fields that belong to the run, not to its result
VOLATILE = {"wall_seconds", "started", "finished", "output", "run_id", "streameval_version", "beam_version",
            "command", "argv", "python", "host", "runner_seconds", "write_dir", "resumed_from", "previous_run"}


def _cases(work: Path, n: int) -> dict[str, tuple[str, list[str]]]:
    """``{case: (job, argv without --output)}``, their inputs written under ``work``."""
    imps, judg = str(SAMPLE / "impressions" / "*.avro"), str(SAMPLE / "judgments" / "*.avro")
    cases = {
        "sample": ("batch", ["--impressions", imps, "--judgments", judg, "--metrics",
                             "ndcg@10,map,mrr@10,P@10,err@10", "--slices", "campaign", "--slice-missing", "skip"]),
        "bootstrap": ("batch", ["--impressions", str(SAMPLE / "impressions" / "letor_*.avro"), "--judgments", judg,
                                "--metrics", "ndcg@10,map,P@5", "--ci", "bootstrap", "--replicates", "50",
                                "--compare-baseline", "feature206"]),
        "stream": ("stream", ["--replay", "--impressions", imps, "--judgments", judg, "--metrics", "ndcg@10,map",
                              "--window", "1d", "--slices", "campaign", "--replay-pace", "0"]),
    }
    messy = work / "messy"
    if not messy.exists():
        sys.path.insert(0, str(ROOT))
        from streameval.io import avro
        from tests.test_columnar import _messy_logs

        imp_files, judgments = _messy_logs(11)
        messy.mkdir(parents=True)
        for i, recs in enumerate(imp_files):
            avro.write_records(messy / f"imps-{i}.avro", "impression", recs)
        avro.write_records(messy / "judg.avro", "judgment", judgments)
    cases["messy"] = ("batch", ["--impressions", str(messy / "imps-*.avro"), "--judgments", str(messy / "judg.avro"),
                                "--window", "1h", "--slices", "device,campaign", "--grades", "0:3", "--labels",
                                "clicks", "--metrics", "ndcg@5,map,P@3,bpref,recip_rank,auc,gauc[user,impressions],"
                                "clicks@10,rr_first_click"])
    gen = work / f"generated-{n}"
    marker = gen / "paths.json"
    if not marker.exists():
        sys.path.insert(0, str(HERE))
        import bench_beam

        gen.mkdir(parents=True, exist_ok=True)
        paths, jpath = bench_beam.write_logs(n, str(gen))
        marker.write_text(json.dumps([paths, jpath]))
    paths, jpath = json.loads(marker.read_text())
    cases["generated"] = ("batch", [*(a for p in paths for a in ("--impressions", p)), "--judgments", jpath,
                                    "--slices", "device", "--labels", "clicks", "--metrics",
                                    "all_trec,auc,gauc[user,impressions],clicks@10,rr_first_click"])
    return cases


def _run(tree: Path, job: str, argv: list[str], out: Path) -> int:
    env = dict(os.environ, PYTHONPATH=str(tree), STREAMEVAL_PROGRESS="0")
    done = subprocess.run([sys.executable, "-m", "streameval.cli", job, *argv, "--output", str(out), "--quiet"],
                          cwd=tree, env=env, capture_output=True, text=True)
    (out.parent / f"{out.name}.stderr").write_text(done.stderr)
    return done.returncode


def _lines(path: Path) -> list:
    """The JSON lines of ``path`` without their wall-clock fields (:data:`WALL_CLOCK`)."""
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK}
            for line in path.read_text().splitlines()]


def _avro_records(path: Path) -> list:
    import fastavro

    with open(path, "rb") as f:
        return list(fastavro.reader(f))


def _summary(path: Path) -> dict:
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in VOLATILE}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    # the run's own folder appears in paths (outputs): the same placeholder for both runs
    return strip(json.loads(path.read_text().replace(str(path.parent), "OUT")))


def compare(a: Path, b: Path) -> list[tuple[str, str]]:
    """``(file, verdict)`` for every output file of either run folder."""
    names = sorted({p.name for p in a.iterdir() if p.is_file()} | {p.name for p in b.iterdir() if p.is_file()})
    out = []
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            out.append((name, f"only in {'base' if pb.exists() else 'new'}"))
        elif name == "summary.json":
            out.append((name, "same (but the run's own fields)" if _summary(pa) == _summary(pb) else "DIFFERS"))
        elif name.endswith(".avro"):  # (repr: a NaN equals a NaN)
            out.append((name, "same records" if repr(_avro_records(pa)) == repr(_avro_records(pb)) else "DIFFERS"))
        elif name == "manifest.json":
            ma, mb = json.loads(pa.read_text()), json.loads(pb.read_text())
            same = sorted(ma.get("files", {})) == sorted(mb.get("files", {}))
            out.append((name, "same files listed" if same else "DIFFERS"))
        elif pa.read_bytes() == pb.read_bytes():
            out.append((name, "byte-identical"))
        elif name.endswith(".jsonl") and _lines(pa) == _lines(pb):
            out.append((name, f"same but the wall-clock fields ({', '.join(sorted(WALL_CLOCK))})"))
        else:
            out.append((name, "DIFFERS"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (its streameval/ runs the same cases)")
    ap.add_argument("--impressions", type=int, default=1_000_000, help="the generated case's size (default 1 M)")
    ap.add_argument("--only", default="sample,bootstrap,messy,stream,generated", help="comma-separated cases")
    ap.add_argument("--dir", default=None, help="inputs and outputs here (default: a temporary directory)")
    args = ap.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="streameval-same-"))
    base = Path(args.base).resolve()
    if not (base / "streameval" / "cli.py").exists():
        ap.error(f"--base {base}: no streameval/cli.py there")
    wanted = [c for c in args.only.split(",") if c]
    cases = _cases(work, args.impressions)
    unknown = set(wanted) - set(cases)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(cases)}")
    differs = 0
    for case in wanted:
        job, argv = cases[case]
        outs = {}
        for label, tree in (("new", ROOT), ("base", base)):
            out = work / "out" / f"{case}-{label}"
            code = _run(tree, job, argv, out)
            outs[label] = out
            if code != 0:
                print(f"{case:<10} {label}: exit {code} ({(out.parent / f'{out.name}.stderr').read_text()[-300:]!r})")
        if not all(o.is_dir() for o in outs.values()):
            differs += 1
            continue
        for name, verdict in compare(outs["new"], outs["base"]):
            print(f"{case:<10} {name:<40} {verdict}")
            differs += verdict == "DIFFERS" or verdict.startswith("only in")
    print(f"{'all outputs the same' if not differs else f'{differs} differ'} (work: {work})")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
