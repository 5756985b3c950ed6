"""The named fields of the online metrics' states (:mod:`streameval.accumulators.online`). No Beam.

A state is the *list* of its named tuple's fields (``list(GaucState(...))``): what Beam's
FastPrimitivesCoder encodes without pickling. The ops read a state through its named tuple
(``GaucState._make(state)``) and write a changed field back by building the list again or, in the
paths run once a record, update it in place at the field's position taken from the named tuple
(``GaucState._fields.index("used")``): the wire format is a plain list, and no code gives a field's
position as a number.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "LabelCounts",
    "CountArraysState",
    "GaucSums",
    "GaucState",
    "ClickRequestState",
    "OpeSums",
    "OpeState",
    "CalibrationBin",
    "CalibrationState",
]


class LabelCounts(NamedTuple):
    """The counts of a score (or bin) of an :class:`~.online.AucOps` or :class:`~.online.HistAucOps`
    state: ``positives``, ``negatives``. In a state: their list."""

    positives: int
    negatives: int


class CountArraysState(NamedTuple):
    """A :class:`~.online.CountArrays` state's fields: ``values`` (float64, ascending and distinct),
    ``positives`` and ``negatives`` (int64), each as an array's bytes, or, in a state kept in one
    process, as the arrays. The state: their tuple."""

    values: Any  # bytes, or an array
    positives: Any
    negatives: Any


class GaucSums(NamedTuple):
    """A :class:`GaucState`'s sums of one weighting, each a list of Shewchuk partials: ``w`` sum w,
    ``y`` sum y, ``ww`` sum w^2, ``wy`` sum w y, ``yy`` sum y^2 (y = w a, a a group's AUC). In a state:
    their list."""

    w: list
    y: list
    ww: list
    wy: list
    yy: list


class GaucState(NamedTuple):
    """A :class:`~.online.GaucOps` state's fields: ``used`` groups, ``excluded`` groups (a single
    class or no AUC), ``sums`` per weighting a :class:`GaucSums` list. The state: their list."""

    used: int
    excluded: int
    sums: list


class ClickRequestState(NamedTuple):
    """A :class:`~.online.ClickRequestOps` state's fields: ``min_timestamp`` (None: no impression had
    one), ``attributes``, ``clicked`` ``{clicked item_id: position}`` (or what the ops keep of a
    clicked item: a team, ``[position, dwell_ms]``), ``logged``. The state: their list."""

    min_timestamp: int | None
    attributes: dict
    clicked: dict
    logged: bool


class OpeSums(NamedTuple):
    """An :class:`OpeState`'s sums, each a list of Shewchuk partials: ``w`` sum w, ``ww`` sum w^2,
    ``y`` sum y, ``wy`` sum w y, ``yy`` sum y^2 (w the importance weight, y = w r). In a state: their
    list."""

    w: list
    ww: list
    y: list
    wy: list
    yy: list


class OpeState(NamedTuple):
    """An :class:`~.online.OpeOps` state's fields: ``n`` impressions, ``sums`` an :class:`OpeSums`
    list. The state: their list."""

    n: int
    sums: list


class CalibrationBin(NamedTuple):
    """One ECE bin of a :class:`CalibrationState`: ``examples``, ``clicks`` and ``p`` the partials of
    the sum of their probabilities. In a state: their list."""

    examples: int
    clicks: int
    p: list


class CalibrationState(NamedTuple):
    """A :class:`~.online.CalibrationOps` state's fields: ``moments`` the MeanMoments(3) state
    (:class:`~.moments.MomentsState`) of (log loss term, Brier term, p), ``clicks``, ``clicked_p``
    the partials of the sum of p over the clicks, ``bins`` per ECE bin count ``{bin:
    CalibrationBin list}``. The state: their list."""

    moments: list
    clicks: int
    clicked_p: list
    bins: list
