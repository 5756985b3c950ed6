"""Progress bars for long jobs: tqdm when it is installed and stderr is a terminal, silent otherwise.

* :func:`bar` - a tqdm bar over an iterable or a total (or a silent stand-in with the same API).
* :class:`Ticker` - a picklable ``element -> element`` function for ``beam.Map`` that counts the
  elements passing through into a per-process bar (shown by runners that execute in the driver's
  process, such as FnApiRunner, the job's default; on remote workers stderr is no terminal, so it
  stays silent). Call :func:`close_all` when the pipeline has finished.
* :func:`count_avro_records` - the number of records of Avro files from their block headers (the
  bar's total), without decoding the records.
* :class:`ProgressLine` - a plain line on stderr every few seconds while a job runs and once at its
  end (records read, rows written, rate), whatever stderr is: a terminal, a log file or a pipe. The
  jobs show it unless ``--quiet``. :func:`add` counts into the same per-process tallies as
  :class:`Ticker` (e.g. the metric rows written).

``STREAMEVAL_PROGRESS=1`` forces the bars on, ``STREAMEVAL_PROGRESS=0`` off. Imports neither Beam
nor tqdm until a bar is shown.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["enabled", "bar", "Ticker", "close_all", "counts", "add", "count_avro_records", "ProgressLine"]


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


def add(name: str, n: int = 1) -> None:
    """Count ``n`` more under ``name`` in this process's tallies (:func:`counts`), without a bar."""
    with _LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + int(n)


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
    from .avro import AvroInputError, count_records

    try:
        return count_records(paths)
    except (AvroInputError, OSError):  # damaged or unreadable file: reported by the reader, not here
        return None


class ProgressLine:
    """``line = ProgressLine("streameval batch", read=f, written=g); line.start(); ...; line.stop()``:
    a thread that writes ``streameval batch: 61,536 records read, 42 rows written, 5,120 records/s,
    12 s`` to ``file`` (default stderr) every ``interval`` seconds while the counts change, and
    :meth:`stop` the last such line (``done in``). ``read`` and ``written`` are functions giving the
    counts so far (this process's: the local runners'); ``enable=False`` writes nothing."""

    def __init__(self, job: str, read, written, interval: float = 5.0, file=None, enable: bool = True):
        self.job = job
        self.read = read
        self.written = written
        self.interval = float(interval)
        self.file = file
        self.enable = bool(enable)
        self._stop = threading.Event()
        self._thread = None
        self._start = None
        self._last = None

    def _counts(self) -> tuple[int, int]:
        try:
            return int(self.read() or 0), int(self.written() or 0)
        except Exception:  # noqa: BLE001 (a count not available yet)
            return 0, 0

    def line(self, final: bool = False) -> str:
        """The text of one line as of now."""
        import time

        read, written = self._counts()
        secs = max(time.monotonic() - (self._start or time.monotonic()), 1e-9)
        rate = f"{read / secs:,.0f} records/s" if read else "- records/s"
        when = f"done in {secs:.1f} s" if final else f"{secs:.0f} s"
        return f"{self.job}: {read:,} records read, {written:,} rows written, {rate}, {when}"

    def _write(self, text: str) -> None:
        f = self.file or sys.stderr
        try:
            f.write(text + "\n")
            f.flush()
        except (OSError, ValueError):  # a closed stderr: nothing to report to
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = self._counts()
            if now != self._last:
                self._last = now
                self._write(self.line())

    def start(self) -> "ProgressLine":
        import time

        self._start = time.monotonic()
        if self.enable and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="streameval-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and write the final line (once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)
            self._thread = None
        if self.enable and self._start is not None:
            self._write(self.line(final=True))
            self._start = None

