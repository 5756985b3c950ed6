"""The input formats and timestamp units the command lines name (``--input-format``,
``--timestamp-unit``), without pyarrow: the jobs' command lines are parsed (``--help`` answered) with
these before pyarrow or Beam is imported. :mod:`streameval.io.parquet_blocks` and
:mod:`streameval.io.convert_table` take them from here."""

from __future__ import annotations

__all__ = ["INPUT_FORMATS", "TIMESTAMP_UNITS"]

INPUT_FORMATS = ("auto", "avro", "parquet")
TIMESTAMP_UNITS = ("s", "ms", "us", "iso")
