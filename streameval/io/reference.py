"""The reference distribution of the drift metrics ``psi[score]`` and ``ks[score]`` (the batch job's
``--drift-reference PATH``, :func:`streameval.evaluate_log`'s ``reference=``).

A reference is a file of scores: an impression Avro file (``.avro``: the scores of its impressions
that have a score and a logged click flag, the examples ``auc`` counts with labels from clicks), or
a text file with one score per line (blank lines and lines starting with ``#`` skipped). No Beam.
"""

from __future__ import annotations

import math
import os

from ..metrics.threshold import DriftReference

__all__ = ["read_drift_reference", "drift_reference"]


def read_drift_reference(path) -> DriftReference:
    """The :class:`~streameval.metrics.threshold.DriftReference` of a file (see the module). Raises
    FileNotFoundError (a missing file) or ValueError (a line that is no finite number, no score at
    all, a damaged Avro file), each one line naming the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"drift reference {path}: no such file")
    if path.lower().endswith(".avro"):
        from .avro import AvroInputError, read_records

        try:
            scores = [float(r["score"]) for r in read_records(path, "impression")
                      if r.get("score") is not None and r.get("clicked") is not None]
        except (AvroInputError, OSError) as e:
            raise ValueError(f"drift reference {path}: {' '.join(str(e).split())}") from None
    else:
        scores = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                text = line.strip()
                if not text or text.startswith("#"):
                    continue
                try:
                    x = float(text)
                except ValueError:
                    x = math.nan
                if not math.isfinite(x):
                    raise ValueError(f"drift reference {path} line {i}: expected one finite score per line, "
                                     f"got {text[:40]!r}")
                scores.append(x)
    if not scores:
        raise ValueError(f"drift reference {path}: no scores (a text file of one score per line, or impression "
                         f"Avro records with a score and a logged click)")
    return DriftReference(scores, source=path)


def drift_reference(reference) -> DriftReference | None:
    """A reference given as None, a :class:`~streameval.metrics.threshold.DriftReference`, a path
    (:func:`read_drift_reference`) or an array / list of scores."""
    if reference is None or isinstance(reference, DriftReference):
        return reference
    if isinstance(reference, (str, os.PathLike)):
        return read_drift_reference(reference)
    return DriftReference(reference, source="given scores")
