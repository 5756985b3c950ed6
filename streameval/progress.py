"""Progress bars for long jobs: tqdm when it is installed and stderr is a terminal, silent otherwise.

* :func:`bar` - a tqdm bar over an iterable or a total (or a silent stand-in with the same API).
* :class:`Ticker` - a picklable ``element -> element`` function for ``beam.Map`` that counts the
  elements passing through into a per-process bar (shown by runners that execute in the driver's
  process, such as FnApiRunner, the job's default; on remote workers stderr is no terminal, so it
  stays silent). Call :func:`close_all` when the pipeline has finished.
* :func:`count_avro_records` - the number of records of Avro files from their block headers (the
  bar's total), without decoding the records.

``STREAMEVAL_PROGRESS=1`` forces the bars on, ``STREAMEVAL_PROGRESS=0`` off. Imports neither Beam
nor tqdm until a bar is shown.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["enabled", "bar", "Ticker", "close_all", "counts", "count_avro_records"]


def enabled(enable: bool | None = None) -> bool:
    """Whether bars are shown: ``enable`` if given, else ``STREAMEVAL_PROGRESS`` if set, else
    whether stderr is a terminal."""
    if enable is not None:
        return bool(enable)
    env = os.environ.get("STREAMEVAL_PROGRESS")
    if env is not None:
        return env.strip().lower() not in ("", "0", "false", "no", "off")
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Silent:
    """What :func:`bar` returns when bars are off: counts, shows nothing."""

    def __init__(self, iterable=None, total=None):
        self.iterable = iterable
        self.total = total
        self.n = 0

    def __iter__(self):
        for x in self.iterable if self.iterable is not None else ():
            self.n += 1
            yield x

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def bar(iterable=None, *, total=None, desc=None, unit: str = "it", enable: bool | None = None, **kwargs):
    """A progress bar (``tqdm.tqdm``: iterate it, or ``update(n)`` and ``close()``); a silent stand-in
    with the same methods when bars are off (:func:`enabled`) or tqdm is not installed."""
    if enabled(enable):
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            kwargs.setdefault("file", sys.stderr)
            kwargs.setdefault("dynamic_ncols", True)
            return tqdm(iterable, total=total, desc=desc, unit=unit, **kwargs)
    return _Silent(iterable, total)


_LOCK = threading.Lock()
_BARS: dict = {}  # name -> [bar, count not yet shown]
_COUNTS: dict = {}  # name -> elements counted in this process


class Ticker:
    """``pcoll | beam.Map(Ticker("impressions", total=n))``: returns each element unchanged and
    advances this process's bar ``name`` (updates the display every ``every`` elements). ``size``:
    a function giving how many records an element stands for (a block of records), default 1."""

    def __init__(self, name: str, total: int | None = None, desc: str | None = None, unit: str = "rec",
                 every: int = 1000, enable: bool | None = None, size=None):
        self.name = name
        self.size = size
        self.total = total
        self.desc = desc or name
        self.unit = unit
        self.every = max(1, int(every))
        self.enable = enable

    def __call__(self, element):
        with _LOCK:
            entry = _BARS.get(self.name)
            if entry is None:
                entry = _BARS[self.name] = [bar(total=self.total, desc=self.desc, unit=self.unit,
                                                enable=self.enable, unit_scale=True), 0]
            n = 1 if self.size is None else int(self.size(element))
            entry[1] += n
            _COUNTS[self.name] = _COUNTS.get(self.name, 0) + n
            if entry[1] >= self.every:
                entry[0].update(entry[1])
                entry[1] = 0
        return element


def counts() -> dict:
    """{bar name: elements counted in this process} since the last :func:`close_all`."""
    with _LOCK:
        return dict(_COUNTS)


def close_all() -> None:
    """Show the last counts and close every :class:`Ticker` bar of this process."""
    with _LOCK:
        for b, pending in _BARS.values():
            if pending:
                b.update(pending)
            b.close()
        _BARS.clear()
        _COUNTS.clear()


def count_avro_records(paths) -> int | None:
    """Records in the given Avro files (paths or globs), from their block headers
    (:func:`streameval.io.avro.count_records`); None when a file cannot be read to its end (the job's
    reader reports that file; the progress bar has no total)."""
    from .io.avro import AvroInputError, count_records

    try:
        return count_records(paths)
    except (AvroInputError, OSError):  # damaged or unreadable file: reported by the reader, not here
        return None
