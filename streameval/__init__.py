"""streameval: ranking and online metrics as mergeable accumulators and Apache Beam combiners.

``streameval.evaluate(qrels, run, ["ndcg@10", "map"])`` scores a run in memory; the Beam transforms
live in ``streameval.beam`` (imported only when used, so the library and ``streameval trec-eval``
start without Beam). ``streameval.read_metrics(path)`` reads a finished batch or streaming job's
output directory as one table of metric rows (:func:`streameval.io.tables.read_metrics`; imported
when first used).
"""

from .api import Evaluation, evaluate
from .metrics.kernel import MetricOptions
from .metrics.names import MetricNameError, MetricSpec, parse_metrics

__version__ = "0.1.0"
__all__ = ["evaluate", "Evaluation", "MetricOptions", "MetricSpec", "MetricNameError", "parse_metrics", "read_metrics"]


def __getattr__(name):
    # read_metrics lives in the I/O layer (fastavro): imported on first use, so ``import streameval``
    # (and ``streameval trec-eval``) stays as light as before
    if name == "read_metrics":
        from .io.tables import read_metrics

        globals()["read_metrics"] = read_metrics
        return read_metrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
