"""streameval: ranking and online metrics as mergeable accumulators and Apache Beam combiners.

``streameval.evaluate(qrels, run, ["ndcg@10", "map"])`` scores a run in memory; the Beam transforms
live in ``streameval.beam`` (imported only when used, so the library and ``streameval trec-eval``
start without Beam).
"""

from .api import Evaluation, evaluate
from .metrics.kernel import MetricOptions
from .metrics.names import MetricNameError, MetricSpec, parse_metrics

__version__ = "0.1.0"
__all__ = ["evaluate", "Evaluation", "MetricOptions", "MetricSpec", "MetricNameError", "parse_metrics"]
