"""Extract every name the old hand-kept tables accepted and what it parses to: run BEFORE the registry
refactor (commit ba7d541), `PYTHONPATH=. python tests/data/registry_names_extract.py > tests/data/registry_names.json`."""
import json
import re
from streameval.metrics import names, trec_names, irm_names
from streameval.metrics.names import parse_metric, MetricNameError

cands = []
for a in sorted(names._ALIASES):
    for form in ("{a}", "{a}@10", "{a}_10", "{a}.5,10", "{a}@0", "{a}@x", "{A}@3"):
        cands.append(form.format(a=a, A=a.upper()))
for f in sorted(trec_names.FAMILIES):
    for form in ("{f}", "{f}.0.1,0.5", "{f}_0.10", "{f}.5,10", "{f}_5", "{f}.p=0.95", "{f}_p=0.5", "{f}.2,-1,0,0",
                 "{f}.0.5", "{f}.", "{F}"):
        cands.append(form.format(f=f, F=f.upper()))
for low, (canon, fam, allowed, cut) in sorted(irm_names._MEASURES.items()):
    for form in ("{c}", "{c}@10", "{c}(rel=2)", "{c}(rel=2)@10", "{c}()", "{c}(beta=0.5)", "{c}(recall=0.2)",
                 "{c}(p=0.5)", "{c}(dcg='exp-log2')@10", "{c}(relative=True)", "{c}(cutoff=5)"):
        cands.append(form.format(c=canon))
cands += ["all_trec", "official", "ALL_TREC", "ndcg.1=3,2=9,4=4.5", "ndcg.1=x", "", "  ", "foo", "P@", "P@5.7",
          "ndcg_cut.23.4", "hits", "err", "Rprec@5", "num_q", "NumQ@5", "relstring", "mrr@10",
          "R-prec", "r-precision", "hit_rate@5", "Judged", "RBP(rel=1)", "nDCG(gains={0:1})", "unknown(rel=1)"]
out = {}
for c in dict.fromkeys(cands):
    try:
        specs = parse_metric(c)
        out[c] = [[s.family, s.k, s.param, s.opts, s.label, s.name, s.trec_name, s.average] for s in specs]
    except MetricNameError as e:
        out[c] = {"error": re.split(r"\.? (?:Accepted:|ir_measures: )", str(e))[0]}
print("{\n" + ",\n".join(json.dumps(k) + ": " + json.dumps(v, separators=(",", ":")) for k, v in sorted(out.items())) + "\n}")
