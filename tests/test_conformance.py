"""Every measure everywhere (issue 17, item 5): a conformance test generated from the measure registry.

For every ranking measure family of :data:`streameval.metrics.registry.REGISTRY` that the Beam jobs
aggregate (parsed, arithmetic mean or total: all but gm_map and gm_bpref, which the jobs refuse in one
line, and relstring, which ``streameval trec-eval`` alone prints), names are built from the record:
its default cutoffs (trec_eval's, those up to :data:`MAX_K`), the plain name where the cutoff is
optional, and one name per declared parameter with a value other than the default (:data:`PARAM_NAMES`,
``rel=2`` through the family's ir_measures spelling). All names of one option set are scored in ONE job
per engine, on the same random log (:func:`_log`), by four engines:

* the library, :func:`streameval.evaluate` on qrels / run dicts made from the same records;
* the batch job, ``streameval/jobs/batch.py`` ``--engine records`` (FnApiRunner, one global window);
* the batch job, ``--engine columnar`` (FnApiRunner, one global window);
* the streaming job's final panes, ``streameval/jobs/stream.py --replay --replay-pace 0 --engine columnar``
  with one window covering the whole log.

The three jobs must agree bit for bit (value and number of requests). The library's mean over
queries must equal the jobs' mean over requests (one request per query and system here, so the same
terms): checked EXACTLY too (bit for bit; the totals num_ret, ... as well): on this log the library's
sum of 8 per-query values and the jobs' merged accumulators give the same double for all 234 rows of
every option set. Should a change of summation order ever cost a last bit, relax the library check
(only) to ``math.isclose(rel_tol=1e-12)``, never the engines'.

The ``--metrics`` text of the jobs used to split ``utility.2,-1,0,0`` and ``ndcg.1=3,2=9`` at their
commas (``-1`` and ``2=9`` were read as metric names, the job stopped with "unknown metric '2=9'"):
found by this test, fixed in :func:`streameval.beam.arguments.join_parameter_lists`.
"""

from __future__ import annotations

import json
import random
import struct

import pytest

import streameval
from streameval.jobs import batch as batch_cli
from streameval.jobs import stream as stream_cli
from streameval.io import avro
from streameval.metrics import irm_names, registry
from streameval.metrics.names import MetricNameError, parse_metric, parse_metrics

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]

#: the largest cutoff used: trec_eval's default cutoffs up to 30 (5, 10, 15, 20, 30); the requests
#: are longer than 2 x MAX_K so that every cutoff cuts (100-1000 would need 2000-item requests)
MAX_K = 30
HOUR = 3_600_000_000
T0 = 1_700_000_000_000_000 // HOUR * HOUR
SYSTEMS = ("A", "B")

#: one name per declared parameter (other than ``rel``, which every family with an ir_measures
#: spelling taking it gets as ``Name(rel=2)``) at a value other than its default; None: the parameter
#: is a job option there (the option sets below vary it), not part of the name
PARAM_NAMES = {
    ("dcg", "dcg"): None,  # --gain exponential
    ("ndcg", "dcg"): "nDCG(dcg='exp-log2')@10",
    ("ndcg", "gains"): "ndcg.1=3,2=9",
    ("err", "err_max_grade"): None,  # --err-max-grade 5
    ("iprec_at_recall", "recall"): "iprec_at_recall.0.25",
    ("11pt_avg", "levels"): "11pt_avg.0.2,0.5,0.8",
    ("Rprec_mult", "mult"): "Rprec_mult.0.5",
    ("set_F", "beta"): "set_F.0.5",
    ("utility", "coefficients"): "utility.2,-1,0,0",
    ("rbp", "p"): "rbp.p=0.5",
    ("rbp_resid", "p"): "rbp_resid.p=0.5",
    # ir_measures' C/W/L measures (cwl_eval) and Compat: max_rel is required, 3 in the spelling (_spelling)
    **{(f, "T"): f"{f}(T=2,max_rel=3)" + ("@5" if f == "BPM" else "") for f in ("INST", "INSQ", "BPM", "NERR11")},
    **{(f, "min_rel"): f"{f}(min_rel=1,max_rel=3)" + ("@5" if f in ("BPM", "SDCG", "NERR8", "NERR9") else "")
       for f in ("INST", "INSQ", "BPM", "SDCG", "NERR8", "NERR9", "NERR10", "NERR11")},
    **{(f, "max_rel"): f"{f}(max_rel=2)" + ("@5" if f in ("BPM", "SDCG", "NERR8", "NERR9") else "")
       for f in ("INST", "INSQ", "BPM", "SDCG", "NERR8", "NERR9", "NERR10", "NERR11")},
    ("SDCG", "dcg"): None,  # log2 only
    ("NERR10", "p"): "NERR10(p=0.5,max_rel=3)",
    ("Compat", "p"): "Compat(p=0.5)",
    ("Compat", "normalize"): "Compat(normalize=False)",
}


def job_families():
    """The registry families the Beam jobs aggregate."""
    return [f for f in registry.REGISTRY if f.parsed and f.average != registry.GEOMETRIC]


def _spelling(f) -> str:
    probe = f"{f.name}@1" if f.cutoff == registry.REQUIRED else f.name
    try:
        parse_metric(probe)
        return f.name
    except MetricNameError:
        if any(p.name == "max_rel" for p in f.params):  # the C/W/L measures: max_rel required
            return f"{f.irm[0]}(max_rel=3)"
        return f.irm[0]  # judged: ir_measures' Judged only


def _cutoffs(f) -> list:
    ks = [k for k in f.trec_defaults if isinstance(k, int) and k <= MAX_K]
    return ks or sorted({3, 10, *([f.default_k] if f.default_k else [])})


def names_of(f) -> list[str]:
    """The measure names of family ``f`` (see the module docstring)."""
    b = _spelling(f)
    ks = _cutoffs(f)
    if f.cutoff == registry.REQUIRED:
        names = [f"{b}@{k}" for k in ks]
    elif f.cutoff == registry.OPTIONAL:
        names = [b] + [f"{b}@{k}" for k in ks]
    elif f.cutoff == registry.LIST and all(isinstance(k, int) for k in f.trec_defaults):
        names = [f"{b}." + ",".join(map(str, ks)), f"{b}.7"]  # relative_P, unj; 7: not a default
    else:  # a list of float parameters (plain: trec_eval's defaults) or no cutoff
        names = [b]
    for p in f.params:
        if p.name == "rel":
            irm = [c for c in f.irm if "rel" in irm_names._MEASURES[c.lower()][2]]
            if irm:
                cut = f"@{ks[0]}" if f.cutoff in (registry.REQUIRED, registry.OPTIONAL) else ""
                names.append(f"{irm[0]}(rel=2){cut}")
        elif PARAM_NAMES[(f.name, p.name)]:
            names.append(PARAM_NAMES[(f.name, p.name)])
    return names


NAMES = [n for f in job_families() for n in names_of(f)]

#: the option sets: (job arguments, evaluate() keywords, names whose value the option must change
#: against the default set: the option reached the engines). --depth 25 is below MAX_K: P@30 counts
#: 25 ranked items of 30
#: the jobs' default --err-max-grade is auto: the largest judged grade, 3 in this log (docs/metrics.md,
#: "ERR's g_max"); the library's default is gdeval's 4, so the library is given the jobs' value
AUTO_ERR = {"err_max_grade": 3}
OPTIONS = {
    "default": ([], {**AUTO_ERR}, []),
    "rel2": (["--relevance-level", "2"], {"relevance_level": 2, **AUTO_ERR}, ["P@5", "map", "bpref", "infAP", "set_F"]),
    "exponential": (["--gain", "exponential", "--err-max-grade", "5"], {"gain": "exponential", "err_max_grade": 5},
                    ["ndcg@10", "dcg", "err"]),  # err: the row of "err" as written (err@20)
    "served": (["--ideal", "served"], {"ideal": "served", **AUTO_ERR}, ["ndcg@10", "ndcg"]),
    "rel2-exp-served": (["--relevance-level", "2", "--gain", "exponential", "--ideal", "served"],
                        {"relevance_level": 2, "gain": "exponential", "ideal": "served", **AUTO_ERR}, ["P@5", "ndcg@10"]),
    "depth": (["--depth", "25"], {"depth": 25, **AUTO_ERR}, ["num_ret", "P@30", "map", "rbp_resid"]),
}


def _log(seed=17):
    """(impressions, judgments): 9 queries x 2 systems, one request each of 61-80 items (more than
    2 x MAX_K) out of 110 items; scores in half steps of 0-10 (many ties, broken by docno as
    trec_eval); 45 judged items per query, grades 0-3 (the rest unjudged); q6 judged all 0 (no
    relevant item), q7 judged 0-1 (none relevant at level 2), q8 not judged (left out everywhere)."""
    rnd = random.Random(seed)
    imps, judg = [], []
    for qi in range(9):
        q = f"q{qi}"
        if qi < 8:
            top = {6: 0, 7: 1}.get(qi, 3)
            judg += [{"query_id": q, "item_id": f"d{d}", "grade": rnd.randint(0, top), "timestamp": 0, "source": "t"}
                     for d in rnd.sample(range(110), 45)]
        for system in SYSTEMS:
            req = f"{system}-{q}"
            for pos, d in enumerate(rnd.sample(range(110), rnd.randint(2 * MAX_K + 1, 80)), 1):
                imps.append({"event_id": f"{req}/{pos}", "request_id": req, "query_id": q, "user_id": None,
                             "system_id": system, "item_id": f"d{d}", "position": pos,
                             "score": rnd.randrange(21) / 2, "clicked": None, "timestamp": T0 + pos,
                             "propensity": None, "attributes": {}})
    return imps, judg


def _bits(x):
    return struct.pack("<d", x)


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    d = tmp_path_factory.mktemp("conformance")
    imps, judg = _log()
    avro.write_records(str(d / "imps.avro"), "impression", imps)
    avro.write_records(str(d / "judg.avro"), "judgment", judg)
    return d, imps, judg


def _library(imps, judg, kw):
    qrels = {}
    for j in judg:
        qrels.setdefault(j["query_id"], {})[j["item_id"]] = j["grade"]
    out = {}
    for system in SYSTEMS:
        run = {}
        for r in imps:
            if r["system_id"] == system:
                run.setdefault(r["query_id"], {})[r["item_id"]] = r["score"]
        ev = streameval.evaluate(qrels, run, NAMES, **kw)
        for name, value in ev.means.items():
            out[(system, name)] = (value, ev.num_queries)
    return out


def _rows(paths):
    out = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r["is_final"] is False:  # the stream's earlier panes (the batch job: null)
                continue
            k = (r["system"], r["metric"])
            assert k not in out, k
            out[k] = (r["value"], r["num_queries"])
    return out


def _jobs(d, extra, tag):
    common = ["--impressions", str(d / "imps.avro"), "--judgments", str(d / "judg.avro"), "--metrics",
              ",".join(NAMES), "--no-ctr", "--quiet", *extra]
    got = {}
    for engine in ("records", "columnar"):
        o = d / f"{tag}-{engine}"
        assert batch_cli.main([*common, "--engine", engine, "--runner", "FnApiRunner", "--output", str(o)]) == 0
        got[engine] = _rows([o / "metrics.jsonl"])
    o = d / f"{tag}-stream"
    assert stream_cli.main(["--replay", "--replay-pace", "0", "--engine", "columnar", "--window", "1d",
                            "--output", str(o), *common]) == 0
    got["stream"] = _rows(sorted(o.glob("metrics-*.jsonl")))
    return got


def test_the_log_has_what_it_claims():
    imps, judg = _log()
    graded = {(j["query_id"], j["item_id"]): j["grade"] for j in judg}
    requests = {}
    for r in imps:
        requests.setdefault(r["request_id"], []).append(r)
    assert len(requests) == 18 and all(len(rs) > 2 * MAX_K for rs in requests.values())
    assert all(len({r["score"] for r in rs}) < len(rs) for rs in requests.values())  # ties in every request
    assert sum((r["query_id"], r["item_id"]) not in graded for r in imps) > 100  # unjudged items
    assert {g for g in graded.values()} == {0, 1, 2, 3}
    best = {}
    for (q, _), g in graded.items():
        best[q] = max(best.get(q, 0), g)
    assert best["q6"] == 0 and best["q7"] == 1 and "q8" not in best  # no relevant item (at level 1, 2), no judgment


def test_names_cover_the_registry():
    """Every family the jobs aggregate gives names of its own (under its cutoff rule), every declared
    parameter is varied (PARAM_NAMES, or rel=2), and every name is one the jobs accept."""
    specs = parse_metrics(NAMES, arithmetic="the Beam jobs")
    fams = {s.family for s in specs}
    assert fams == {f.name for f in job_families()}
    declared = {(f.name, p.name) for f in job_families() for p in f.params if p.name != "rel"}
    assert declared == set(PARAM_NAMES)
    for f in job_families():
        mine = [s for n in names_of(f) for s in parse_metric(n)]
        if f.cutoff in (registry.REQUIRED, registry.OPTIONAL):
            assert {s.k for s in mine} >= set(_cutoffs(f)), f.name
        if any(p.name == "rel" for p in f.params) and any("rel" in irm_names._MEASURES[c.lower()][2] for c in f.irm):
            assert any("rel=2" in s.opts for s in mine), f.name
    # rows per system of every option set (117 before f1, f1@k and f1(rel=2): issue 42; 156 with the C/W/L
    # measures and Compat: issue 42 item 1; 160 with Accuracy)
    assert len(specs) == 160


def test_jobs_refuse_the_geometric_means_in_one_line(tmp_path, capsys):
    for main, extra in ((batch_cli.main, []), (stream_cli.main, ["--replay", "--window", "1d"])):
        for name in ("gm_map", "gm_bpref"):
            code = main(["--impressions", str(tmp_path / "none.avro"), "--judgments", str(tmp_path / "none.avro"),
                         "--metrics", f"map,{name}", "--output", str(tmp_path / "out"), *extra])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and len(err) == 1 and f"{name}: a geometric mean over queries" in err[0], (name, err)


def test_parameter_lists_reach_the_jobs_whole():
    """trec_eval parameter lists in a --metrics text keep their commas: negative numbers (utility's
    coefficients) and LEVEL=GAIN pairs (ndcg's gains) included; the next name starts a new one."""
    from streameval.beam.arguments import split_metrics
    from streameval.beam.online import split_metric_names

    text = "utility.2,-1,0,0,ndcg.1=3,2=9,11pt_avg.0.2,0.5,0.8,11pt_avg,P.5,10,rbp.p=0.5,SetF(rel=2, beta=0.5),auc"
    want = ["utility.2,-1,0,0", "ndcg.1=3,2=9", "11pt_avg.0.2,0.5,0.8", "11pt_avg", "P.5,10", "rbp.p=0.5",
            "SetF(rel=2, beta=0.5)", "auc"]
    assert split_metrics(text) == want
    assert split_metric_names(text) == (want[:-1], ["auc"])
    assert split_metrics(",".join(NAMES)) == NAMES


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_measure_on_every_engine(log, option):
    d, imps, judg = log
    extra, kw, changed = OPTIONS[option]
    lib = _library(imps, judg, kw)
    default = _library(imps, judg, {})
    for name in changed:
        assert all(lib[(s, name)] != default[(s, name)] for s in SYSTEMS), (option, name)
    got = _jobs(d, extra, option)
    specs = parse_metrics(NAMES)
    want_keys = {(s, spec.name) for s in SYSTEMS for spec in specs}
    assert set(lib) == want_keys
    problems = []
    for engine, rows in got.items():
        assert set(rows) == want_keys, (engine, sorted(set(rows) ^ want_keys)[:6])
        for k, (value, n) in rows.items():
            ref, ref_n = got["records"][k]
            if (_bits(value), n) != (_bits(ref), ref_n):
                problems.append((k, option, engine, value, "records", ref))
    # the library's mean over queries against the jobs' mean over requests: exactly (module docstring)
    for k, (value, n) in got["records"].items():
        lv, ln = lib[k]
        if (_bits(lv), ln) != (_bits(value), n):
            problems.append((k, option, "library", (lv, ln), "records", (value, n)))
    assert not problems, problems
