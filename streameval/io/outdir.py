"""The safety of a job's ``--output`` folder: refused when it overlaps an input, locked while a job writes it.

* :func:`check_overlap`: an ``--output`` that holds an input file, or that an input glob could read
  (a rerun would read the job's own outputs, which the rerun removes), is refused before anything is
  touched, naming the option, the pattern and the output (:class:`OutputOverlapError`, a
  ``ValueError``: the jobs exit 2). Local paths are compared as real paths (symbolic links
  resolved), remote ones (``s3://``, ``gs://``) as scheme and path.
* :class:`OutputLock`: an advisory lock of a local output folder, the file ``.streameval.lock`` in
  it held with ``fcntl.flock`` while a job runs; it holds JSON with the holder's PID, host, start
  time and command. A second job on the folder gets :class:`OutputInUseError` ("output folder in
  use by PID N on HOST since T"); the kernel releases the lock of a process that died, so a lock
  file left by a killed job is taken over, with a one-line notice. On a file system without
  ``flock`` the file's content is the lock: a holder on this host whose PID is no longer running is
  taken over, any other holder refuses. Remote file systems have no locks: the jobs give each run
  its own folder there and publish it with one manifest write (:mod:`streameval.beam.sinks`).

Layer 3 (I/O): the standard library only.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

__all__ = ["LOCK_FILE", "RUNNING_TOTALS", "OutputOverlapError", "OutputInUseError", "LockHolder", "OutputLock",
           "check_overlap",
           "is_remote", "normal_path", "pattern_reaches"]

#: the lock file in a local output folder
LOCK_FILE = ".streameval.lock"
#: the stream job's accounting as of each pane in a local --output (the job writes it, the dashboard reads it)
RUNNING_TOTALS = "running_totals.jsonl"

_MAGIC = ("*", "?", "[")


class OutputOverlapError(ValueError):
    """``--output`` holds an input file or an input glob could read it: one line naming both."""


class OutputInUseError(RuntimeError):
    """Another job holds the output folder's lock: one line naming its PID, host and start time."""


def is_remote(path: str) -> bool:
    return "://" in str(path)


def _has_magic(part: str) -> bool:
    return any(c in part for c in _MAGIC)


def normal_path(path: str) -> str:
    """``path`` as compared: a local one absolute with symbolic links resolved (the parts that
    exist), a remote one as ``scheme://`` and its path without empty parts or a trailing slash."""
    path = os.fspath(path)
    if is_remote(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme.lower()}://" + "/".join(p for p in rest.split("/") if p)
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def _parts(path: str) -> tuple[str, list[str]]:
    """(root, parts) of a normalised path: ``("s3://", ["bucket", "a"])`` or ``("/", ["tmp", "a"])``."""
    if is_remote(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://", [p for p in rest.split("/") if p]
    return os.sep, [p for p in path.split(os.sep) if p]


def _inside(path: str, folder: str) -> bool:
    """Whether the normalised ``path`` is ``folder`` or below it."""
    (ra, a), (rb, b) = _parts(path), _parts(folder)
    return ra == rb and a[:len(b)] == b


def _split_pattern(pattern: str) -> tuple[str, list[str]]:
    """(normalised folder before the first part with a glob character, the parts from there on)."""
    pattern = os.fspath(pattern)
    if is_remote(pattern):
        scheme, rest = pattern.split("://", 1)
        parts = [p for p in rest.split("/") if p]
        k = next((i for i, p in enumerate(parts) if _has_magic(p)), len(parts))
        return normal_path(f"{scheme}://" + "/".join(parts[:k])), parts[k:]
    parts = os.path.abspath(os.path.expanduser(pattern)).split(os.sep)
    k = next((i for i, p in enumerate(parts) if _has_magic(p)), len(parts))
    return normal_path(os.sep.join(parts[:k]) or os.sep), [p for p in parts[k:] if p]


def pattern_reaches(pattern: str, folder: str) -> bool:
    """Whether the input glob ``pattern`` could match a file in the folder ``folder`` or below it
    (both local, or both remote): the folder is the glob's own folder, below a ``**``, or matched
    by the glob's folder parts (``logs/*/x.avro`` reaches ``logs/out``). A pattern without glob
    characters is a file and reaches no folder (:func:`check_overlap` compares the files)."""
    if not _has_magic(os.fspath(pattern)):
        return False
    if is_remote(pattern) != is_remote(folder):
        return False
    base, rest = _split_pattern(pattern)
    target = normal_path(folder)
    if not _inside(target, base):
        return False
    below = _parts(target)[1][len(_parts(base)[1]):]  # the folder's parts under the glob's base
    dirs = rest[:-1]  # the glob's folder parts; the last part names the files
    for i, name in enumerate(below):
        if i < len(rest) and "**" in rest[i]:
            return True  # matches across folders (Beam's remote globs: also as the last part)
        if i >= len(dirs):
            return False  # the glob reads only folders above this one
        if not fnmatch.fnmatchcase(name, dirs[i]):
            return False
    return True  # the glob reads the folder itself (or folders below it)


def check_overlap(output: str, inputs) -> None:
    """Refuse an ``output`` folder that overlaps an input: ``inputs`` is an iterable of
    ``(option, patterns, files)`` (``"--impressions"``, the patterns as given, the files they
    matched). Raises :class:`OutputOverlapError` (one line naming the option, pattern or file and
    the output) when a file is the output folder or inside it, or when a glob could read a file in
    the output folder (its own folder, or one its folder parts or ``**`` reach)."""
    out = normal_path(output)
    for option, patterns, files in inputs:
        patterns = [os.fspath(p) for p in ([patterns] if isinstance(patterns, (str, os.PathLike)) else patterns)]
        shown = " ".join(f"{option} {p!r}" for p in patterns)
        for f in files:
            if is_remote(f) == is_remote(out) and _inside(normal_path(f), out):
                raise OutputOverlapError(
                    f"--output {output} holds the input file {f} ({shown}): a run would read its own outputs "
                    "and replace them; write the output to a folder outside the inputs")
        for p in patterns:
            if pattern_reaches(p, out):
                raise OutputOverlapError(
                    f"--output {output} is inside the folder the input glob {option} {p!r} reads: a rerun would read "
                    "the job's own outputs as input; write the output to a folder the inputs' globs do not reach")


# --------------------------------------------------------------------------------------------
# the lock

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class LockHolder:
    """The job that holds (or held) a lock: the content of the lock file."""

    pid: int
    host: str
    since: str  # ISO 8601, UTC
    command: str = ""

    @classmethod
    def me(cls, command: str = "") -> "LockHolder":
        return cls(os.getpid(), socket.gethostname(), _now(), command or " ".join(os.path.basename(a) for a in sys.argv[:2]))

    @classmethod
    def parse(cls, data: bytes) -> "LockHolder | None":
        """The holder written in a lock file, or None for an empty or unreadable file."""
        try:
            d = json.loads(data.decode("utf-8"))
            return cls(int(d["pid"]), str(d["host"]), str(d["since"]), str(d.get("command", "")))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
            return None

    def describe(self) -> str:
        what = f" ({self.command})" if self.command else ""
        return f"PID {self.pid} on {self.host} since {self.since}{what}"

    def here(self) -> bool:
        return self.host == socket.gethostname()


# errors of flock that mean the file system has no such locks (some network and FUSE file systems)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class OutputLock:
    """The advisory lock of the local output folder ``folder`` (which must exist):
    :meth:`acquire` takes it or raises :class:`OutputInUseError`; :meth:`release` (idempotent)
    removes the lock file and lets it go. ``notice`` is the one line to print when the lock of a
    job that died was taken over (None otherwise)."""

    def __init__(self, folder: str, command: str = ""):
        self.folder = folder
        self.path = os.path.join(folder, LOCK_FILE)
        self.command = command
        self.notice: str | None = None
        self._fd: int | None = None

    def _in_use(self, holder: "LockHolder | None") -> OutputInUseError:
        who = holder.describe() if holder else "another process (the lock file names no holder yet)"
        return OutputInUseError(f"output folder {self.folder} in use by {who}: wait for that job to end or "
                                f"choose another --output (lock file {self.path})")

    def acquire(self) -> "OutputLock":
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = LockHolder.parse(_read_fd(fd))
                os.close(fd)
                raise self._in_use(holder) from None
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    os.close(fd)
                    raise
                return self._acquire_without_flock(fd)
            # the holder before us may have removed the file between our open and flock: lock the file
            # that is at the path now
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = LockHolder.parse(_read_fd(fd))
        if previous is not None:
            gone = "no longer running" if previous.here() and not _alive(previous.pid) else "no longer holding it"
            self.notice = (f"note: took over the stale lock of {self.folder}: {previous.describe()} ended without "
                           f"releasing it ({gone})")
        self._fd = fd
        self._write(fd)
        return self

    def _acquire_without_flock(self, fd: int) -> "OutputLock":
        """The file system has no ``flock``: the lock file's content is the lock (best effort)."""
        previous = LockHolder.parse(_read_fd(fd))
        if previous is not None and previous.pid != os.getpid():
            if not previous.here() or _alive(previous.pid):
                os.close(fd)
                raise self._in_use(previous)
            self.notice = (f"note: took over the stale lock of {self.folder}: {previous.describe()} ended without "
                           "releasing it (no longer running)")
        self._fd = fd
        self._write(fd)
        return self

    def _write(self, fd: int) -> None:
        data = json.dumps(asdict(LockHolder.me(self.command))).encode("utf-8") + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and let the lock go (nothing when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read_fd(fd: int) -> bytes:
    try:
        return os.pread(fd, 1 << 16, 0)
    except OSError:
        return b""
