"""``streameval trec-eval`` against pytrec_eval from TREC files, whole processes (issue 17's speed item).

The issue's case: 30,000 queries x 100 documents (3 M run lines, 1.2 M qrels lines, 144 MB, made by
``_data.write_trec(dir, _data.ranking(30000))``), trec_eval's default measures. Each command is a
whole process, start-up included, as a user runs it; the commands alternate run by run and the best
of ``--repeat`` is kept, both by wall time and by CPU time (user + sys of the process, from
``os.wait4``): on a shared machine the CPU time is the steadier measure, while the wall time is what
the user waits (``streameval trec-eval`` reads and scores on two threads, pytrec_eval on one).

Commands timed:

* ``streameval trec-eval QRELS RUN`` (trec_eval's default output: 30 lines) and with the five
  measures of ``benchmarks/run.py`` (``-m ndcg_cut.10 -m map -m recip_rank -m P.10 -m recall.100``);
* pytrec_eval, as users write it (``parse_qrel``, ``parse_run``, ``RelevanceEvaluator(...).evaluate``)
  with the same measure sets: trec_eval's default set (``map gm_map Rprec bpref recip_rank
  iprec_at_recall P num_ret num_rel num_rel_ret``), and the five;
* with ``--base DIR``: ``streameval trec-eval`` of another checkout (``git archive REV | tar -x -C DIR``)
  on the same files, for a side-by-side of two versions.

    python benchmarks/bench_trec_files.py                  # 30,000 queries, best of 5
    python benchmarks/bench_trec_files.py --queries 100000 --repeat 3 --base /tmp/old

Target (issue 17): the default measures in at most 0.25 x pytrec_eval's time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

FIVE = ["ndcg_cut.10", "map", "recip_rank", "P.10", "recall.100"]
DEFAULT_SET = ["map", "gm_map", "Rprec", "bpref", "recip_rank", "iprec_at_recall", "P", "num_ret", "num_rel",
               "num_rel_ret"]

PYTREC = """
import sys, pytrec_eval
with open(sys.argv[1]) as f:
    qrels = pytrec_eval.parse_qrel(f)
with open(sys.argv[2]) as f:
    run = pytrec_eval.parse_run(f)
res = pytrec_eval.RelevanceEvaluator(qrels, set(sys.argv[3].split(","))).evaluate(run)
print(len(res))
"""


def timed(cmd: list[str], env: dict) -> tuple[float, float, int]:
    """(wall s, CPU s (user + sys), peak RSS kB) of one process; fails on a non-zero exit."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=30000, help="queries of the collection (100 documents each)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each command (best kept)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "streameval-bench"))
    ap.add_argument("--base", default=None, help="another checkout's root, timed beside this one")
    args = ap.parse_args()
    import _data

    d = os.path.join(args.workdir, f"trec-files-{args.queries}")
    if os.path.exists(os.path.join(d, ".trec_done")):
        qrels, run = os.path.join(d, "qrels.txt"), os.path.join(d, "run.txt")
    else:
        print(f"writing {d} ...", file=sys.stderr)
        os.makedirs(d, exist_ok=True)
        qrels, run = _data.write_trec(d, _data.ranking(args.queries))
    py = sys.executable
    five = [a for m in FIVE for a in ("-m", m)]
    checkouts = {"streameval": ROOT, **({"base": os.path.abspath(args.base)} if args.base else {})}
    cmds: dict[str, tuple[list[str], dict]] = {}
    for name, root in checkouts.items():
        env = dict(os.environ, PYTHONPATH=root)
        # compiled once, as an installed package is (this environment may set PYTHONDONTWRITEBYTECODE)
        subprocess.run([py, "-m", "compileall", "-q", os.path.join(root, "streameval")], check=True,
                       stdout=subprocess.DEVNULL)
        cmds[f"{name} trec-eval (default measures)"] = ([py, "-m", "streameval.cli", "trec-eval", qrels, run], env)
        cmds[f"{name} trec-eval (five measures)"] = ([py, "-m", "streameval.cli", "trec-eval", *five, qrels, run], env)
    cmds["pytrec_eval (default measure set)"] = ([py, "-c", PYTREC, qrels, run, ",".join(DEFAULT_SET)], dict(os.environ))
    cmds["pytrec_eval (five measures)"] = ([py, "-c", PYTREC, qrels, run, ",".join(FIVE)], dict(os.environ))
    best: dict[str, list] = {k: [float("inf"), float("inf"), 0] for k in cmds}
    for r in range(args.repeat):
        for k, (cmd, env) in cmds.items():
            wall, cpu, peak = timed(cmd, env)
            b = best[k]
            b[0], b[1], b[2] = min(b[0], wall), min(b[1], cpu), max(b[2], peak)
        print(f"run {r + 1}/{args.repeat} done (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
    print(f"{args.queries:,} queries x 100 documents ({os.path.getsize(run) / 1e6:.0f} MB run, "
          f"{os.path.getsize(qrels) / 1e6:.0f} MB qrels), best of {args.repeat}; load average now "
          f"{os.getloadavg()[0]:.2f}")
    print("| command | wall s | CPU s | peak MB | wall / pytrec_eval | CPU / pytrec_eval |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, (wall, cpu, peak) in best.items():
        ref = best["pytrec_eval (five measures)" if "five" in k else "pytrec_eval (default measure set)"]
        print(f"| {k} | {wall:.2f} | {cpu:.2f} | {peak / 1024:,.0f} | {wall / ref[0]:.3f} | {cpu / ref[1]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
