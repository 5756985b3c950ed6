"""Avro inputs shared by the jobs: matching the inputs, reading a file on any file system, and the
line between damaged data (a dead letter) and an environment that cannot deliver the data (a failed
bundle).

* :func:`expand_inputs`: the files of ``--impressions`` / ``--judgments`` patterns. Local paths are made
  absolute in the launcher, so a worker that runs in another working directory reads the same file;
  remote patterns (``s3://``, ``gs://``, ...) are matched through Beam's ``FileSystems``, so the
  pipeline options (credentials, endpoint) must be set first (:func:`set_file_system_options`).
* :func:`local_copy`: a remote file is copied through ``FileSystems`` to a local temporary file, then
  read by the same readers as a local file: the fast decoder (Apache DataFusion to Arrow columns), the
  same damage checks and schema resolution as :func:`streameval.io.avro.read_blocks`.
* :class:`InputUnavailableError`: a file that cannot be opened or read because of its environment
  (missing, permission, network, credentials). The jobs let it fail the bundle, so the runner retries
  it and the job fails with the path and the error named. Only a file whose bytes are damaged
  (:class:`~streameval.io.avro.AvroInputError`) becomes a dead letter (:func:`unreadable_letter`).
* :class:`ReadAvro`: records of Avro files, one element per record (the per-record engine).
* :func:`read_parquet_blocks`: a Parquet file of impressions or judgments (local or remote, through
  the same copy) converted block by block with ``convert table``'s rules
  (:mod:`streameval.io.parquet_blocks`); damaged bytes raise ``ParquetInputError`` (a dead letter,
  reason ``unreadable Parquet file``), the environment :class:`InputUnavailableError`.

Layer 3 (Beam): imports :mod:`streameval.io`; nothing from ``streameval.jobs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from ..io import avro
from ..io import counters as cn
from ..io.counters import NAMESPACE  # noqa: F401 (re-exported: its former home)
from .flink_rest import no_taskmanager_hint
from .threads import counter
from ..io.dead_letters import dead_letter

__all__ = ["UNREADABLE", "InputUnavailableError", "failure_reason", "runner_thread_errors_reported_once", "expand_inputs", "input_bytes", "set_file_system_options", "is_remote",
           "local_copy", "unreadable_letter", "read_avro_blocks", "read_parquet_blocks", "is_unreadable_letter",
           "ReadAvro", "COPY_CHUNK", "UNREADABLE_PARQUET"]

#: the reason prefix of the dead letter of a file whose content could not be read to its end
UNREADABLE = "unreadable Avro file"
#: the same of a Parquet file (streameval.io.parquet_blocks.UNREADABLE_PARQUET)
UNREADABLE_PARQUET = "unreadable Parquet file"
#: bytes per read when a remote file is copied to a local temporary file
COPY_CHUNK = 16 << 20


class InputUnavailableError(OSError):
    """An input file that the environment did not deliver: it could not be found, opened or read
    (permission, network, credentials, a path that exists only on another machine). Not a dead
    letter: the bundle fails, so the runner retries it, and the job fails naming ``path`` and the
    underlying error. ``str(error)`` is ``"cannot read input file PATH: ERROR"``."""

    def __init__(self, path: str, error: BaseException | str):
        self.path = str(path)
        self.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        super().__init__(f"cannot read input file {self.path}: {self.error}")

    def __reduce__(self):  # picklable with its arguments (Beam sends errors between processes)
        return (type(self), (self.path, self.error))


_UNAVAILABLE = re.compile(r"cannot read input file .*?(?=\s*\[while running|\n|$)")


#: the first line of a Go program's goroutine stack ("goroutine 95 [running]:")
_GO_STACK = re.compile(r"goroutine \d+ \[[^\]]*\]:?$")


def failure_reason(error: BaseException, options=None) -> str:
    """One line saying why a job failed, from the exception its runner raised: the
    :class:`InputUnavailableError` text (path and error) when one is in it, else the exception's last
    meaningful line. Runners wrap a worker's exception in their own (the portable runner sends the
    worker's traceback as text), so the text is searched. With the job's ``options`` naming a Flink
    cluster left without TaskManagers, that is said too
    (:func:`streameval.beam.flink_rest.no_taskmanager_hint`)."""
    return _failure_reason(error) + (no_taskmanager_hint(options) if options is not None else "")


def _failure_reason(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    found = _UNAVAILABLE.search(text)
    if found:
        return found.group(0).strip()
    rpc = _rpc_status(error)
    if rpc:  # a gRPC call of the runner's services failed: its str is a multi-line repr ending in '>'
        return f"the runner's service stopped answering ({rpc}): a job server, Prism or its workers were lost"
    if type(error).__name__ == "FutureTimeoutError":  # grpc's, raised bare by the portable runner
        return ("the job service did not answer (FutureTimeoutError after Beam's --job_server_timeout, default "
                "300 s): is the job server or Prism at --job_endpoint running?")
    raw = str(error).splitlines()
    # a Go runner's panic (Prism 2.62 when a worker is lost: "panic in stage.Execute ...: send on
    # closed channel") comes with its goroutines' stacks: the line before them says what happened
    stack = next((i for i, l in enumerate(raw) if _GO_STACK.match(l)), None)
    if stack:
        raw = raw[:stack]
    lines = [l.strip() for l in raw if l.strip() and not l.startswith(" ")]
    last = lines[-1] if lines else type(error).__name__
    return last if len(last) <= 500 else last[:497] + "..."


#: Beam's portable runner reads the job's messages in a thread of this name; when the job service is
#: lost, that thread dies with the gRPC error, which ``wait_until_finish`` raises again in the caller
RUNNER_MESSAGE_THREAD = "wait_until_finish_read"


@contextlib.contextmanager
def runner_thread_errors_reported_once():
    """While the job runs: a gRPC error that kills Beam's message-reading thread
    (:data:`RUNNER_MESSAGE_THREAD`) is not printed as that thread's traceback, since the launcher
    reports the same failure in one line (:func:`failure_reason`). Python's ``threading.excepthook``
    (public API), restored after; every other thread's exception goes to the previous hook."""
    import threading

    previous = threading.excepthook

    def hook(args):
        if getattr(args.thread, "name", "") == RUNNER_MESSAGE_THREAD and _rpc_status(args.exc_value):
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        for t in threading.enumerate():  # a reader dying with the job's failure reports it through the hook
            if t.name == RUNNER_MESSAGE_THREAD and t is not threading.current_thread():
                t.join(timeout=5)
        if threading.excepthook is hook:
            threading.excepthook = previous


def _rpc_status(error: BaseException) -> str:
    """``CODE: details`` of a gRPC error (``grpc.RpcError`` and its call objects have ``code()`` and
    ``details()``), else ``""``."""
    code, details = getattr(error, "code", None), getattr(error, "details", None)
    if not (callable(code) and callable(details)):
        return ""
    try:
        c, d = code(), details()
    except Exception:  # noqa: BLE001 (an object that only looks like one)
        return ""
    if c is None:
        return ""
    return f"{getattr(c, 'name', c)}: {' '.join(str(d or '').split())}".rstrip(": ")


def is_remote(path: str) -> bool:
    """Whether ``path`` names a file on a remote file system (a ``scheme://`` path)."""
    return "://" in str(path)


def set_file_system_options(options) -> None:
    """Give Beam's ``FileSystems`` the pipeline options (S3 endpoint and credentials, GCS project)
    before any file is matched or opened in the launcher. Workers get them from the runner."""
    FileSystems.set_options(options)


def expand_inputs(patterns) -> list[str]:
    """The files of ``patterns`` (paths or globs; ``scheme://`` ones through Beam's FileSystems), in
    order, local ones as absolute paths. Raises ``FileNotFoundError`` for a pattern that matches
    nothing or a local file that does not exist."""
    paths: list[str] = []
    for pat in patterns:
        if is_remote(pat):
            metadata = FileSystems.match([pat])[0].metadata_list
            if not metadata:
                raise FileNotFoundError(f"no files match the pattern {pat!r}")
            _SIZES.update((m.path, m.size_in_bytes) for m in metadata)
            paths.extend(sorted(m.path for m in metadata))
        else:
            paths.extend(os.path.abspath(p) for p in avro.expand_paths(pat))
    for p in paths:
        if not is_remote(p) and not os.path.isfile(p):
            raise FileNotFoundError(f"input file not found: {p}")
    return paths


# sizes of the remote files that expand_inputs matched in this process: each call of Beam's S3 file
# system makes a new client (about 0.4 s with Beam 2.77), so the sizes are not asked for again
_SIZES: dict = {}


def input_bytes(paths) -> int:
    """The total size in bytes of the files ``paths`` (local or remote, through FileSystems; remote
    sizes seen by :func:`expand_inputs` are not matched again)."""
    paths = list(paths)
    known = sum(_SIZES[p] for p in paths if p in _SIZES)
    rest = [p for p in paths if p not in _SIZES]
    if not rest:
        return known
    return known + sum(m.size_in_bytes for r in FileSystems.match(rest) for m in r.metadata_list)


@contextlib.contextmanager
def local_copy(path: str, directory: str | None = None) -> Iterator[str]:
    """A local path holding the bytes of ``path``: ``path`` itself when it is local, else a temporary
    copy made through Beam's FileSystems (removed on exit). Raises :class:`InputUnavailableError` when
    the file cannot be opened or read."""
    if not is_remote(path):
        yield path
        return
    fd, tmp = tempfile.mkstemp(suffix=".avro", prefix="streameval-", dir=directory)
    try:
        try:
            with os.fdopen(fd, "wb") as out, FileSystems.open(path, mime_type="application/octet-stream",
                                                              compression_type="uncompressed") as src:
                shutil.copyfileobj(src, out, COPY_CHUNK)
        except Exception as e:  # noqa: BLE001 (any error of the file system: network, credentials, missing)
            raise InputUnavailableError(path, e) from e
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read_avro_blocks(path: str, name: str, decoder: str = "fastavro") -> Iterator:
    """The blocks of the Avro file ``path`` (local or remote) read against schema ``name``: lists of
    record dicts (:func:`streameval.io.avro.read_blocks`) or, with ``decoder="datafusion"``, also Arrow
    tables (:func:`streameval.io.arrow_avro.read_tables`). Raises
    :class:`~streameval.io.avro.AvroInputError` for damaged content after the blocks before the damage,
    :class:`InputUnavailableError` when the environment does not deliver the file."""
    try:
        with local_copy(path) as local:
            if decoder == "datafusion":
                from ..io import arrow_avro

                yield from arrow_avro.read_tables(local, name)
            else:
                yield from avro.read_blocks(local, name)
    except avro.AvroInputError as e:
        if e.path != path:  # a copy of a remote file: the error names the file the user gave
            raise avro.AvroInputError(path, e.reason, e.records_read) from None
        raise
    except InputUnavailableError:
        raise
    except OSError as e:
        raise InputUnavailableError(path, e) from e


def read_parquet_blocks(path: str, kind: str, options=None) -> Iterator:
    """The :class:`~streameval.io.parquet_blocks.Block` s of the Parquet file ``path`` (local or
    remote; ``kind`` ``"impressions"`` or ``"judgments"``; ``options`` a
    :class:`~streameval.io.parquet_blocks.TableOptions`). Raises
    :class:`~streameval.io.parquet_blocks.ParquetInputError` for damaged content (after the blocks
    before the damage), :class:`InputUnavailableError` when the environment does not deliver the
    file, :class:`~streameval.io.convert_table.TableConvertError` when its columns do not fit."""
    from ..io import parquet_blocks

    try:
        with local_copy(path) as local, open(local, "rb") as f:
            yield from parquet_blocks.read_blocks(f, path, kind, options)
    except (parquet_blocks.ParquetInputError, InputUnavailableError, ValueError):
        raise  # (TableConvertError is a ValueError)
    except OSError as e:
        raise InputUnavailableError(path, e) from e


def unreadable_letter(path: str, kind: str, error: avro.AvroInputError, records_read: int,
                      prefix: str = UNREADABLE) -> dict:
    """The dead letter of a file whose content could not be read to its end (``kind``:
    ``"impressions"``, ``"judgments"``, ``"clicks"``; ``prefix``: :data:`UNREADABLE` for Avro,
    :data:`UNREADABLE_PARQUET` for Parquet)."""
    reason = getattr(error, "reason", None) or f"{type(error).__name__}: {error}"
    return dead_letter(str(path), json.dumps({"file": str(path), "records_read": int(records_read)}),
                       f"{prefix} ({kind}): {reason}; {records_read} records before the damage were read")


def is_unreadable_letter(letter: dict) -> bool:
    """Whether a dead letter is that of a damaged input file (Avro or Parquet)."""
    return letter.get("reason", "").startswith((UNREADABLE, UNREADABLE_PARQUET))


class _ReadAvroFile(beam.DoFn):
    """Records of one Avro file. A file whose content cannot be read to its end (truncated, corrupt,
    an incompatible schema) gives the records before the damage and one dead letter naming the file
    and the reason (counter ``unreadable_files:<name>``); a file the environment does not deliver
    fails the bundle (:class:`InputUnavailableError`)."""

    def __init__(self, name: str, with_file: bool = False):
        self.name = name
        self.with_file = with_file

    def setup(self):
        self.count = counter(NAMESPACE, cn.read(self.name))
        self.unreadable = counter(NAMESPACE, cn.unreadable_files(self.name))

    def process(self, path):
        n = 0
        try:
            for block in read_avro_blocks(path, self.name):
                self.count.inc(len(block))
                n += len(block)
                if self.with_file:
                    yield from ((path, rec) for rec in block)
                else:
                    yield from block
        except avro.AvroInputError as e:
            self.unreadable.inc()
            yield beam.pvalue.TaggedOutput("unreadable", unreadable_letter(path, f"{self.name}s", e, n))


class ReadAvro(beam.PTransform):
    """Records of Avro files (local or on any Beam file system), read with :mod:`streameval.io.avro`
    so timestamps are int microseconds. Counter ``<name>s_read``; after application ``.unreadable``
    holds the dead letters of damaged files (:class:`_ReadAvroFile`). With ``with_file`` the elements
    are ``(path, record)`` pairs, so that a record check can name the file of a rejected record
    (:class:`~streameval.beam.transforms.ValidateImpressions` takes either form)."""

    def __init__(self, paths, name: str, label=None, with_file: bool = False):
        super().__init__(label)
        self.paths = list(paths)
        self.name = name
        self.with_file = with_file
        self.unreadable = None

    def expand(self, pbegin):
        read = (pbegin
                | "Paths" >> beam.Create(self.paths)
                | "Spread" >> beam.Reshuffle()
                | "ReadFiles" >> beam.ParDo(_ReadAvroFile(self.name, self.with_file)).with_outputs(
                    "unreadable", main="records"))
        #: dead letters of the files that could not be read to their end
        self.unreadable = read.unreadable
        return read.records
