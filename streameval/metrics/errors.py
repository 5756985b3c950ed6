"""The metrics layer's error types, in a module of their own so that every name parser
(:mod:`~streameval.metrics.names`, :mod:`~streameval.metrics.diversity`, the trec_eval and
ir_measures spellings) imports them without importing the others."""

from __future__ import annotations

__all__ = ["MetricNameError", "id_text", "ranked_twice", "judged_twice"]


class MetricNameError(ValueError):
    """An unknown or malformed metric name. ``unknown`` is True when the name is no accepted name
    at all (the message then names the closest accepted ones), False for a known measure written
    with a bad cutoff or parameter."""

    unknown = False


def id_text(value) -> str:
    """A query or document id as its text for an error message: ``bytes`` ids (ASCII, as the fast
    readers and DataFrames' Arrow strings give them) decoded, any other id as ``str()``."""
    return value.decode("ascii", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def ranked_twice(docno, qid) -> ValueError:
    """The error for a run that ranks ``docno`` twice for query ``qid`` (trec_eval refuses it)."""
    return ValueError(f"run ranks docno {id_text(docno)!r} twice for query {id_text(qid)!r}")


def judged_twice(docno, qid) -> ValueError:
    """The error for qrels that judge ``docno`` twice for query ``qid`` (trec_eval refuses it; the
    library's ``judgment_conflicts`` resolves it)."""
    return ValueError(
        f"qrels judge docno {id_text(docno)!r} twice for query {id_text(qid)!r} "
        "(evaluate(..., judgment_conflicts='latest' or 'max') to resolve)"
    )
