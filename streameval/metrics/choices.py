"""The allowed values and defaults of the metric options every entry point names (the library,
``trec-eval``, both jobs), kept apart from numpy: the jobs' command lines are parsed (``--help``
answered) with these before numpy, pyarrow or Beam is imported. :mod:`streameval.metrics.kernel`
(``MetricOptions``) and :mod:`streameval.metrics.prepare` take them from here."""

from __future__ import annotations

__all__ = ["GAINS", "IDEALS", "SCORE_PRECISIONS", "DEFAULT_SCORE_PRECISION", "DEFAULT_RELEVANCE_LEVEL",
           "DEFAULT_GAIN", "DEFAULT_IDEAL"]

GAINS = ("linear", "exponential")
IDEALS = ("judgments", "served")
SCORE_PRECISIONS = ("float64", "float32")
#: how every entry point compares scores unless told otherwise (the library, ``trec-eval``, both
#: jobs): as doubles, as trec_eval 10 does (trec_format.h ``double sim``, parsed with ``atof``).
#: ``"float32"`` is trec_eval 9's (and pytrec_eval's) C ``float``: scores equal in single precision tie.
DEFAULT_SCORE_PRECISION = "float64"
#: MetricOptions' defaults: trec_eval's -l 1, linear gain, the ideal from every judgment
DEFAULT_RELEVANCE_LEVEL = 1
DEFAULT_GAIN = "linear"
DEFAULT_IDEAL = "judgments"
