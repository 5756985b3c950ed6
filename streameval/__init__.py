"""streameval: ranking and online metrics as mergeable accumulators and Apache Beam combiners.

``streameval.evaluate(qrels, run, ["ndcg@10", "map"])`` scores a run in memory; the Beam transforms
live in ``streameval.beam`` (imported only when used, so the library and ``streameval trec-eval``
start without Beam). ``streameval.compare(qrels, {"a": run_a, "b": run_b}, ["ndcg@10"])`` runs paired
significance tests of several runs (:mod:`streameval.api_compare`). ``streameval.read_metrics(path)`` reads a finished batch or streaming job's
output directory as one table of metric rows (:func:`streameval.io.tables.read_metrics`; imported
when first used). ``streameval.fuse(runs, method="rrf")`` fuses runs as ranx's ``fuse``
(:mod:`streameval.fusion`). ``streameval.evaluate_log(impressions_df, ["ctr", "auc", "gauc[user]"], by="campaign",
window="1d")`` computes the batch job's online metric rows in memory, without Beam (:mod:`streameval.api_log`).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["evaluate", "Evaluation", "compare", "Comparison", "MetricOptions", "MetricSpec", "MetricNameError",
           "parse_metrics", "read_metrics", "fuse", "FusedRun", "evaluate_log", "MetricsWithoutRowsError"]

# every public name is imported on first use (PEP 562): ``import streameval`` alone imports nothing
# else, so the ``streameval`` command can set process-wide settings (BLAS threads) before numpy's
# import, and read_metrics (the I/O layer: fastavro) costs nothing to those who do not use it
_LAZY = {"evaluate": ".api", "Evaluation": ".api", "compare": ".api_compare", "Comparison": ".api_compare", "MetricOptions": ".metrics.kernel",
         "MetricSpec": ".metrics.names", "MetricNameError": ".metrics.names", "parse_metrics": ".metrics.names",
         "read_metrics": ".io.tables", "fuse": ".fusion", "FusedRun": ".fusion",
         "evaluate_log": ".api_log", "MetricsWithoutRowsError": ".api_log"}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
