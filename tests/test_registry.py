"""The measure registry (streameval.metrics.registry): its invariants and the tables derived from it.

tests/data/registry_names.json was extracted from the hand-kept tables BEFORE the registry replaced
them (names.py, trec_names.py, irm_names.py at commit ba7d541, by tests/data/registry_names_extract.py):
every name they accepted, with the specs it parsed to (family, k, param, opts, label, row name,
trec_eval name, average), and the first part of the error of every name they rejected. The refactor
must keep each of them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streameval.metrics import cwl_measures, irm_names, kernel, registry, trec_measures
from streameval.metrics.names import ALL_TREC, OFFICIAL_TREC, MetricNameError, MetricSpec, parse_metric, \
    parse_metrics

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
OLD = json.loads((DATA / "registry_names.json").read_text())


def _error_head(message: str) -> str:
    # the accepted-forms list after "Accepted:" (and ir_measures' list; since issue 42 the closest
    # accepted names, and the example of an empty name) is derived, not compared here
    head = re.split(r"\.? (?:Accepted:|ir_measures: )|; closest accepted names: |, e\.g\. ndcg@10 \(", message)[0]
    return re.sub(r" takes no cutoff \(write \w+\)$", " takes no cutoff", head)


#: names whose parse issue 42 changed on purpose: ir_measures' RBP(rel=r) (cwl_eval's binary RBP),
#: IPrec@x (its recall level) and nDCG(gains=...) are accepted; RBP takes rel
CHANGED = {
    "IPrec@10": {"error": "metric 'IPrec@10': IPrec's recall level 10.0 must be between 0 and 1"},
    "RBP(beta=0.5)": {"error": "metric 'RBP(beta=0.5)': RBP takes no parameter 'beta' (parameters: p, rel)"},
    "RBP(dcg='exp-log2')@10": {"error": "metric \"RBP(dcg='exp-log2')@10\": RBP takes no parameter 'dcg' "
                                        "(parameters: p, rel)"},
    "RBP(recall=0.2)": {"error": "metric 'RBP(recall=0.2)': RBP takes no parameter 'recall' (parameters: p, rel)"},
    "RBP(relative=True)": {"error": "metric 'RBP(relative=True)': RBP takes no parameter 'relative' "
                                    "(parameters: p, rel)"},
    "RBP(rel=1)": [["rbp", None, "p=0.8", "binary;rel=1", "RBP(rel=1)", "RBP(rel=1)", None, "mean"]],
    "RBP(rel=2)": [["rbp", None, "p=0.8", "binary;rel=2", "RBP(rel=2)", "RBP(rel=2)", None, "mean"]],
    "RBP(rel=2)@10": {"error": "metric 'RBP(rel=2)@10': RBP takes no cutoff"},
    "nDCG(gains={0:1})": [["ndcg", None, "", "gains=0.0:1.0", "nDCG(gains={0:1})", "nDCG(gains={0:1})", None, "mean"]],
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_every_old_name_parses_as_before(name):
    want = CHANGED.get(name, OLD[name])
    if isinstance(want, dict):
        with pytest.raises(MetricNameError) as e:
            parse_metric(name)
        assert _error_head(str(e.value)) == want["error"]
        assert "\n" not in str(e.value)
        return
    # the row name was the canonical name or the ir_measures label; since issue 42 it is the name as
    # written (MetricSpec.written, outside the spec's identity) and the canonical name is kept apart
    specs = parse_metric(name)
    got = [[s.family, s.k, s.param, s.opts, s.label, s.label or s.canonical, s.trec_name, s.average] for s in specs]
    assert got == want
    assert [s.name for s in specs] == ([name.strip()] if len(specs) == 1 else [s.canonical for s in specs])


def test_old_names_cover_every_family():
    seen = {spec[0] for v in OLD.values() if isinstance(v, list) for spec in v}
    parsed = {f.name for f in registry.REGISTRY if f.parsed}
    # f1: ranx's, added after the refactor (issue 42); the C/W/L measures and Compat: issue 42 item 1
    assert parsed - {"f1"} - set(cwl_measures.FUNCS) == seen


def test_docs_table_in_sync():
    """docs/metrics.md's measures table is the generated one (regenerate it with
    ``python -m streameval.metrics.registry --markdown``)."""
    lines = (ROOT / "docs" / "metrics.md").read_text().splitlines(keepends=True)
    start = lines.index(registry.markdown_table().splitlines(keepends=True)[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert "".join(lines[start:end]) == registry.markdown_table()


def test_markdown_command(capsys):
    assert registry.main(["--markdown"]) == 0
    assert capsys.readouterr().out == registry.markdown_table()


def _trec_measure_table():
    """te_trec_measures of trec_eval 10's measures.c: the measure names in print order."""
    src = (DATA / "trec_eval_src" / "measures.c").read_text()
    body = src[src.index("TREC_MEAS *te_trec_measures[] = {"):]
    body = body[: body.index("};")]
    return re.findall(r"&te_meas_(\w+)", body)


def test_print_order_is_trec_evals_measure_table():
    table = _trec_measure_table()
    assert table[:3] == ["runid", "num_q", "num_ret"]
    for f in registry.REGISTRY:
        if f.print_order == int(f.print_order):  # a trec_eval measure: its index in the table
            assert table[int(f.print_order)] == f.name, f.name
        else:  # our own: just after the trec_eval measure it follows
            assert table[int(f.print_order)] in registry.TREC_PRINT_ORDER
        if f.cut_print_order is not None:
            assert table[int(f.cut_print_order)] == f.trec_cut_name
    ours = [n for n in registry.TREC_PRINT_ORDER if n in table]
    assert ours == [n for n in table if n in ours]


def test_print_order_keeps_the_old_cli_order():
    # streameval/cli.py's _TREC_FAMILY_ORDER before the registry
    old = ("num_ret", "num_rel", "num_rel_ret", "map", "gm_map", "Rprec", "bpref", "recip_rank",
           "iprec_at_recall", "P", "relstring", "recall", "infAP", "gm_bpref", "Rprec_mult", "utility",
           "11pt_avg", "binG", "G", "dcg", "ndcg", "ndcg_rel", "Rndcg", "ndcg_cut", "map_cut", "err",
           "relative_P", "success", "set_P", "set_relative_P", "set_recall", "set_map", "set_F",
           "num_nonrel_judged_ret", "yaap", "rbp", "rbp_resid", "unj")
    assert tuple(n for n in registry.TREC_PRINT_ORDER if n in old) == old
    # every parsed family has a place (hits, judged and num_q had none: trec-eval failed on them)
    assert {f.name for f in registry.REGISTRY} <= set(registry.TREC_PRINT_ORDER)


@pytest.mark.parametrize("names, ideal, want", [
    (["P@5", "ndcg@10"], "judgments", 10),
    (["P@5", "ndcg@10", "map"], "judgments", None),  # map reads every served item
    (["P@5", "ndcg@10"], "served", None),  # the ideal DCG from every served item's grade
    (["ndcg@3"], "served", None),
    (["NumQ"], "judgments", 1),  # reads no item
    (["num_q", "P@3"], "judgments", 3),
    (["err"], "judgments", 20),  # plain err is err@20
    (["mrr@10", "Judged@5"], "judgments", 10),
    (["Judged"], "judgments", None),
    (["relative_P.5", "unj.20"], "judgments", 20),
    (["iprec_at_recall.0.5"], "judgments", None),
    (["P@3", "RBP(p=0.5)"], "judgments", None),
    (["P(rel=2)@10", "AP(rel=3)@100", "NumQ", "Judged@5"], "judgments", 100),
    (["set_P", "P@5"], "judgments", None),
    (["dcg@7", "hits@2", "success@4", "recall@6"], "judgments", 7),
])
def test_keep_for(names, ideal, want):
    from streameval.accumulators.ranking import keep_for

    specs = parse_metrics(names)
    assert keep_for(specs, ideal) == want
    assert registry.keep_for(specs, ideal) == want


def test_kernel_references_are_the_functions_the_kernel_uses():
    for f in registry.REGISTRY:
        fn = registry.kernel_function(f)
        if f.subtopics:  # the diversity measures: the per-request scores of the batch job
            from streameval.metrics import diversity

            assert fn is diversity.request_values, f.name
        elif not f.parsed:
            assert fn is trec_measures.relstrings
        elif f.trec_kind:
            assert trec_measures.FUNCS[f.name] is fn, f.name
        elif f.name in cwl_measures.FUNCS:  # scored on the spec (parameters in its opts), as trec_measures
            assert cwl_measures.FUNCS[f.name] is fn, f.name
        else:
            assert kernel._FUNCS[f.name] is fn, f.name


def test_averages_and_counts():
    for f in registry.REGISTRY:
        if f.parsed:
            spec = MetricSpec(f.name, f.default_k if f.cutoff != registry.REQUIRED else 5)
            assert spec.average == f.average, f.name
            assert spec.is_count == (f.average == registry.TOTAL), f.name


def test_irm_names_match_the_registry():
    declared = {canon: f.name for f in registry.REGISTRY for canon in f.irm}
    for low, (canon, family, _allowed, _cut) in irm_names._MEASURES.items():
        if family in registry.BY_NAME:
            assert declared.get(canon) == family or canon == "NumRet", (low, canon)  # NumRet(rel=r) -> num_rel_ret
    canon_names = {v[0] for v in irm_names._MEASURES.values()}
    assert set(declared) <= canon_names


def test_trec_sets_match_all_trec_and_official():
    def declared(which):
        out = set()
        for f in registry.REGISTRY:
            if not f.parsed:
                continue
            if which in f.trec_sets:
                out |= {(s.family, s.k, s.param) for s in parse_metric(f.name)} if f.trec_kind else {(f.name, None, "")}
            if which in f.cut_trec_sets:
                out |= {(f.name, k, "") for k in f.trec_defaults}
        return out

    assert declared("all_trec") == {(s.family, s.k, s.param) for s in ALL_TREC}
    assert declared("official") == {(s.family, s.k, s.param) for s in OFFICIAL_TREC}



def test_closest_names_reach_every_parsed_family():
    """Issue 42: an unknown name's error names the three closest accepted names (it listed every
    form, about 900 characters). A typo of each parsed family's name (two letters swapped, or the
    last doubled) offers that family among the three."""
    for f in registry.REGISTRY:
        if not f.parsed or f.subtopics:
            continue
        swapped = f.name[1:2] + f.name[0] + f.name[2:]
        typo = swapped if len(f.name) > 2 and swapped.lower() != f.name.lower() else f.name + f.name[-1]
        typo += "(max_rel=3)" if any(p.name == "max_rel" for p in f.params) else ""  # INST: INST(max_rel=3)
        typo += "@10" if f.cutoff == registry.REQUIRED else ""
        with pytest.raises(MetricNameError) as e:
            parse_metric(typo)
        message = str(e.value)
        assert "\n" not in message and len(message) < 200, message
        picks = message.split("; closest accepted names: ")[1].split(" (every name")[0].split(", ")
        assert len(picks) == 3, message
        assert f.name in {s.family for p in picks for s in parse_metric(p)}, message


def test_trec_eval_prints_our_own_families_in_registry_order(tmp_path):
    """hits, Judged and NumQ had no place in the old hand-kept print order (trec-eval failed with
    "tuple.index(x): x not in tuple"); now every family has one."""
    import io

    from streameval.cli import trec_eval_main

    (tmp_path / "qrels").write_text("q1 0 d1 1\nq1 0 d2 0\nq1 0 d3 2\n")
    (tmp_path / "run").write_text("q1 Q0 d1 1 3.0 t\nq1 Q0 d2 2 2.0 t\nq1 Q0 d3 3 1.0 t\nq1 Q0 d4 4 0.5 t\n")
    buf = io.StringIO()
    argv = ["-q", "-m", "Judged@5", "-m", "hits@2", "-m", "NumQ", "-m", "P@2", "-m", "success@1"]
    assert trec_eval_main([*argv, str(tmp_path / "qrels"), str(tmp_path / "run")], out=buf) == 0
    rows = [line.split("\t") for line in buf.getvalue().splitlines()]
    per_query = [(name.strip(), value) for name, q, value in rows if q == "q1"]
    # NumQ: 1 query; P_2: d1 relevant, d2 not -> 1/2; success_1: d1 relevant -> 1;
    # hits@2: 1 relevant item in the top 2; Judged@5: d1, d2, d3 judged of min(5, 4) ranked -> 3/4
    assert per_query == [("NumQ", "1"), ("P_2", "0.5000"), ("success_1", "1.0000"), ("hits@2", "1.0000"),
                         ("Judged@5", "0.7500")]


def test_keep_for_a_family_the_registry_lacks():
    # a family not declared (yet) keeps the old rule: its cutoff, or every item without one
    assert registry.keep_for([MetricSpec("not_declared", 7), MetricSpec("P", 3)]) == 7
    assert registry.keep_for([MetricSpec("not_declared"), MetricSpec("P", 3)]) is None


def test_metric_option_arguments_bind_metric_options():
    """One argparse binding of MetricOptions for the batch and streaming jobs: its defaults, its
    choices, and the values read back."""
    import argparse

    from streameval.beam.arguments import add_metric_option_arguments, metric_options
    from streameval.metrics.kernel import MetricOptions

    p = argparse.ArgumentParser()
    add_metric_option_arguments(p)
    # --err-max-grade is "auto" unless given: the job resolves it (arguments.auto_err_max_grade) first
    assert p.parse_args([]).err_max_grade == "auto"
    with pytest.raises(ValueError, match="resolved by the job"):
        metric_options(p.parse_args([]))
    assert metric_options(p.parse_args(["--err-max-grade", "4"])) == MetricOptions()
    got = metric_options(p.parse_args(["--relevance-level", "2", "--gain", "exponential", "--ideal", "served",
                                       "--err-max-grade", "3"]))
    assert got == MetricOptions(relevance_level=2, gain="exponential", ideal="served", err_max_grade=3)
    with pytest.raises(SystemExit):
        p.parse_args(["--ideal", "best"])
    with pytest.raises(ValueError, match="--err-max-grade wants a positive number or auto"):
        metric_options(p.parse_args(["--err-max-grade", "0"]))
