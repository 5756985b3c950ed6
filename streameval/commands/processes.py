"""The processes of a local cluster (:mod:`streameval.commands.cluster`): each started as the leader
of a process group of its own with its output in a log, waited for until it answers, and stopped by
the PID recorded when it started, only while that PID is still the same process (its start time in
/proc); never by name."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClusterError", "Proc", "START_TIMEOUT", "STOP_GRACE", "HOST", "start_ticks", "alive", "free_port",
           "listening_inodes", "listens", "spawn", "log_tail", "wait_ready", "ours", "stop", "child_env", "http_json",
           "accepts"]

#: seconds a process gets to answer (a JVM or Beam's imports on a busy 2-core machine)
START_TIMEOUT = 120.0
#: seconds between SIGTERM and SIGKILL at ``down``
STOP_GRACE = 20.0
HOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """A cluster that could not be started, read or stopped (one line for the user)."""


@dataclass
class Proc:
    """A process we started: its PID, its start time (clock ticks after boot, /proc/PID/stat
    field 22: a PID the kernel reused for another process has another), command and log."""

    pid: int
    start_ticks: int
    argv: list
    log: str



def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after its last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has exited
        return None
    return int(fields[19])


def alive(proc: Proc) -> bool:
    """The process ``up`` started is still running (same PID and start time, not a zombie)."""
    return start_ticks(proc.pid) == proc.start_ticks


def free_port() -> int:
    """A TCP port no socket is bound to now (the kernel's choice for port 0). A process started on
    it is checked to be the one listening there (:func:`listens`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def listening_inodes(port: int) -> set[int]:
    """Socket inodes listening on TCP ``port`` (any address, IPv4 and IPv6), from /proc/net."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(cols[9]))
    return found


def _group_socket_inodes(pgid: int) -> set[int]:
    """Socket inodes held by the processes of process group ``pgid``."""
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            fds = list((d / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    found.add(int(target[8:-1]))
    return found


def listens(proc: Proc, port: int) -> bool:
    """Only the process (group) ``proc`` listens on ``port``."""
    listeners = listening_inodes(port)
    return bool(listeners) and listeners <= _group_socket_inodes(proc.pid)


def spawn(name: str, argv: list, logs: Path, env: dict, cwd: Path) -> Proc:
    cwd.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with open(log, "ab") as out:
        p = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    ticks = start_ticks(p.pid)
    return Proc(p.pid, ticks if ticks is not None else -1, [str(a) for a in argv], str(log))


def log_tail(proc: Proc, lines: int = 5) -> str:
    try:
        text = Path(proc.log).read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def wait_ready(name: str, proc: Proc, ready, timeout: float = START_TIMEOUT):
    """Poll ``ready()`` until it returns a true value (returned), the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive(proc):
            raise ClusterError(f"{name} exited while starting (log {proc.log}: {log_tail(proc)[-400:]})")
        with contextlib.suppress(OSError, ValueError):
            got = ready()
            if got:
                return got
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} did not answer within {timeout:.0f} s (log {proc.log})")
        time.sleep(0.25)


def ours(proc: Proc) -> bool:
    """The process group ``proc`` leads still holds a process we started: the leader itself (same
    PID and start time), or, the leader gone, members of its group (its SDK workers). Linux does not
    give a PID that is still some group's ID to a new process, so such a group is still ours."""
    ticks = start_ticks(proc.pid)
    if ticks is not None:
        return ticks == proc.start_ticks
    return _group_alive(proc.pid)


def stop(proc: Proc, grace: float = STOP_GRACE) -> None:
    """SIGTERM to the process group the PID leads, SIGKILL to what is left of it after ``grace``;
    nothing when neither the PID nor its group is still what we started (:func:`ours`)."""
    if not ours(proc):
        return
    _signal_until(proc, signal.SIGTERM, lambda: alive(proc), grace, 0.2)
    # the leader lingering, or its children (SDK workers) left behind by a leader that exited
    if ours(proc):
        _signal_until(proc, signal.SIGKILL, lambda: ours(proc), grace, 0.1)


def _signal_until(proc: Proc, sig: int, running, grace: float, step: float) -> None:
    """``sig`` to the process group ``proc`` leads, then wait while ``running()``, at most ``grace`` s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    deadline = time.monotonic() + grace
    while running() and time.monotonic() < deadline:
        _reap(proc.pid)
        time.sleep(step)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group whose members are all zombies counts as gone
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(d.name)) == pgid and start_ticks(int(d.name)) is not None:
                    return True
    return False


def child_env() -> dict:
    env = dict(os.environ)
    # the worker pool starts each SDK worker with `python` from PATH: this interpreter's comes first
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def http_json(url: str):
    with urllib.request.urlopen(url, timeout=3) as r:
        return json.loads(r.read().decode())


def accepts(endpoint: str) -> bool:
    """Something accepts TCP connections at ``endpoint`` (HOST:PORT)."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2):
        return True
