"""Beam's portable runner on this machine, for tests that must pass off the single process.

The session fixture :func:`portable_runner` starts Beam's local job service and an EXTERNAL SDK
worker pool as two processes of their own (each its own process group), their working directory a
fresh temporary directory that is not the test's, their output in log files, and yields a
:class:`PortableRunner` whose ``.args`` run a job there::

    batch.main([..., *portable_runner.args])
    # --runner PortableRunner --job_endpoint 127.0.0.1:P --environment_type EXTERNAL
    # --environment_config 127.0.0.1:Q

What this machine taught (see the checks below):

* the pool starts each SDK worker with the command ``python`` from its PATH: the pool gets the
  test interpreter's directory first on PATH, else the workers die with "No module named apache_beam"
  and the job hangs;
* gRPC servers here bind with SO_REUSEPORT, so a second server on a port already in use starts
  "fine". Each service binds port 0 (the kernel gives it a port no socket is bound to, and there is
  no window between choosing the port and binding it); the port is read from the service (the job
  service's ``--port_file``, the pool's log line), and the fixture checks that the service's process
  is alive, answers gRPC, and is the only process listening on that port;
* the processes are stopped by PID: SIGTERM to the process group (the pool's SDK workers are in it),
  wait, SIGKILL if they linger.

:func:`worker_pool` starts another pool (e.g. one whose workers import the project from an installed
wheel: ``pythonpath``); :meth:`PortableRunner.args_with` gives the job arguments that use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streameval.commands.processes import listening_inodes

__all__ = ["Service", "PortableRunner", "start_job_service", "start_worker_pool", "stop_service", "worker_pool",
           "portable_runner"]

#: seconds a service gets to start and answer (imports of Beam take a few seconds on a busy machine)
START_TIMEOUT = 90
#: seconds between SIGTERM and SIGKILL at teardown
STOP_TIMEOUT = 15
_POOL_PORT = re.compile(r"Started worker pool servicer at port: \S+:(\d+)")
_WORKER_STARTED = "Starting worker with command"


@dataclass
class Service:
    """A started service: its process (leader of its own process group), port and log file."""

    name: str
    proc: subprocess.Popen
    log: Path
    cwd: Path
    port: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def workers_started(self) -> int:
        """SDK worker processes a pool has started so far (its log lines)."""
        try:
            return self.log.read_text(errors="replace").count(_WORKER_STARTED)
        except OSError:
            return 0


@dataclass
class PortableRunner:
    """What the :func:`portable_runner` fixture yields."""

    job_service: Service
    pool: Service
    log_dir: Path

    @property
    def args(self) -> list[str]:
        """Beam arguments that run a job on the job service with the pool's workers."""
        return self.args_with(self.pool)

    def args_with(self, pool: Service) -> list[str]:
        """The Beam arguments of a job on this job service whose workers come from ``pool``."""
        return ["--runner", "PortableRunner", "--job_endpoint", self.job_service.endpoint,
                "--environment_type", "EXTERNAL", "--environment_config", pool.endpoint]

    @property
    def workers_cwd(self) -> Path:
        return self.pool.cwd


def _env(pythonpath=None) -> dict:
    env = dict(os.environ)
    # the pool runs `python`: the test interpreter's one (its virtualenv) comes first on PATH
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in ([pythonpath] if isinstance(pythonpath, (str, Path))
                                                             else pythonpath))
    return env


def _socket_inodes(pid: int) -> set[int]:
    found = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.is_dir() else ():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                found.add(int(target[8:-1]))
    return found


def _start(name: str, argv: list[str], cwd: Path, log_dir: Path, env: dict) -> Service:
    cwd.mkdir(parents=True, exist_ok=True)
    log = Path(log_dir) / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Service(name, proc, log, cwd)


def _fail(service: Service, why: str):
    stop_service(service)
    pytest.fail(f"{service.name} did not start: {why}\n--- last lines of {service.log}:\n{service.log_tail()}",
                pytrace=False)


def _wait_ready(service: Service, find_port, timeout: float = START_TIMEOUT) -> Service:
    """Wait until the service's port is known, it answers gRPC, and only its process listens there."""
    import grpc

    deadline = time.monotonic() + timeout
    while True:
        if service.proc.poll() is not None:
            _fail(service, f"the process exited with code {service.proc.returncode}")
        port = find_port()
        if port:
            service.port = port
            break
        if time.monotonic() > deadline:
            _fail(service, f"no port reported in {timeout} s")
        time.sleep(0.1)
    channel = grpc.insecure_channel(service.endpoint)
    try:
        grpc.channel_ready_future(channel).result(timeout=max(1.0, deadline - time.monotonic()))
    except grpc.FutureTimeoutError:
        _fail(service, f"{service.endpoint} does not accept connections")
    finally:
        channel.close()
    if service.proc.poll() is not None:
        _fail(service, f"the process exited with code {service.proc.returncode}")
    listeners = listening_inodes(service.port)
    ours = _socket_inodes(service.proc.pid)
    if listeners and not listeners & ours:
        _fail(service, f"port {service.port} is answered by another process")
    if listeners - ours:
        _fail(service, f"another process listens on port {service.port} too (SO_REUSEPORT)")
    return service


def start_job_service(log_dir: Path, cwd: Path) -> Service:
    """Beam's local job service (``local_job_service_main``) on a port of its choosing."""
    port_file = Path(log_dir) / "job_service.port"
    with contextlib.suppress(FileNotFoundError):
        port_file.unlink()
    argv = [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main", "--port", "0",
            "--port_file", str(port_file), "--staging_dir", str(Path(cwd) / "staging")]
    service = _start("job_service", argv, Path(cwd), log_dir, _env())

    def port():
        with contextlib.suppress(OSError, ValueError):
            return int(port_file.read_text())
        return 0

    return _wait_ready(service, port)


def start_worker_pool(log_dir: Path, cwd: Path, name: str = "worker_pool", pythonpath=None) -> Service:
    """An EXTERNAL SDK worker pool (``worker_pool_main``) whose workers run in ``cwd``; with
    ``pythonpath``, their PYTHONPATH is exactly that (e.g. an installed wheel)."""
    # logging configured first: Beam 2.62's worker_pool_main adds no handler, so its port line
    # would not reach the log
    argv = [sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); "
            "from apache_beam.runners.worker import worker_pool_main; worker_pool_main.main()", "--service_port", "0"]
    service = _start(name, argv, Path(cwd), log_dir, _env(pythonpath))
    service.extra["pythonpath"] = pythonpath

    def port():
        found = _POOL_PORT.search(service.log.read_text(errors="replace")) if service.log.exists() else None
        return int(found.group(1)) if found else 0

    return _wait_ready(service, port)


def stop_service(service: Service) -> None:
    """SIGTERM to the service's process group, wait; SIGKILL to the group if it is still there."""
    pgid = service.proc.pid  # start_new_session: the process leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        service.proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # the leader is gone; its children (SDK workers) too
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        service.proc.wait(timeout=STOP_TIMEOUT)


@contextlib.contextmanager
def worker_pool(log_dir: Path, cwd: Path, name: str = "worker_pool", pythonpath=None):
    """:func:`start_worker_pool`, stopped on exit."""
    pool = start_worker_pool(log_dir, cwd, name, pythonpath)
    try:
        yield pool
    finally:
        stop_service(pool)


@pytest.fixture(scope="session")
def portable_runner(tmp_path_factory):
    """The job service and an EXTERNAL worker pool on 127.0.0.1 (see the module docstring)."""
    log_dir = tmp_path_factory.mktemp("portable-logs")
    job_service = start_job_service(log_dir, tmp_path_factory.mktemp("portable-job-service"))
    try:
        pool = start_worker_pool(log_dir, tmp_path_factory.mktemp("portable-workers"))
    except BaseException:
        stop_service(job_service)
        raise
    try:
        yield PortableRunner(job_service, pool, log_dir)
    finally:
        stop_service(pool)
        stop_service(job_service)
