"""The SDK worker pool that ``streameval cluster up`` starts: Beam's EXTERNAL environment service
(``BeamFnExternalWorkerPool``, the gRPC API of Beam's portability protos), shared by every TaskManager.

    python -m streameval.commands.worker_pool --service_port 0 [--container_executable EXE]

It starts each SDK worker as a process of its own, as Beam's ``worker_pool_main`` does (the same
command: an ``SdkHarness`` on the runner's control endpoint, or ``--container_executable`` with the
container contract's flags), and differs in one thing: which worker a stop request stops. A runner
names the worker to stop by its id alone, and every Flink TaskManager numbers its workers itself
(``<environment>-<n>``, from 1), so two TaskManagers running the same stage ask one shared pool for
two workers with the same id. Beam's pool keeps one process per id: the second start replaced the
first in its table, and the first TaskManager's stop request killed the second TaskManager's worker,
whose task then failed (``CANCELLED: client cancelled``) or waited for ever ("Still waiting for startup
of environment ... for worker id 8-1": the batch job at 10 M impressions with ``--parallelism 2`` on two
TaskManagers, 2026-12-05). Here every worker is kept with its control endpoint (one per TaskManager);
a stop request stops the one worker of that id, and when several have it, none: each worker ends by
itself when its runner closes its control stream (``SdkHarness.run`` returns), and the pool reaps the
workers that ended. It logs ``Started worker pool servicer at port: HOST:PORT`` once it listens.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import NamedTuple

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc

__all__ = ["WorkerPool", "main"]

_LOG = logging.getLogger("streameval.worker_pool")
#: seconds between SIGTERM and SIGKILL when a worker is stopped
STOP_GRACE = 5.0


class _Worker(NamedTuple):
    worker_id: str
    control: str
    process: subprocess.Popen


def worker_command(request, container_executable: str | None = None) -> list[str]:
    """The command that starts the worker ``request`` asks for (a ``StartWorkerRequest``), as Beam's
    pool builds it."""
    if container_executable:
        return [container_executable, f"--id={request.worker_id}",
                f"--logging_endpoint={request.logging_endpoint.url}",
                f"--artifact_endpoint={request.artifact_endpoint.url}",
                f"--provision_endpoint={request.provision_endpoint.url}",
                f"--control_endpoint={request.control_endpoint.url}"]
    program = ("from apache_beam.runners.worker.sdk_worker import SdkHarness; "
               f"SdkHarness({request.control_endpoint.url!r}, worker_id={request.worker_id!r}, "
               "state_cache_size=0, data_buffer_time_limit_ms=-1).run()")
    return [sys.executable, "-c", program]


class WorkerPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    """The pool's service (see the module). ``workers()``: the live workers ``(id, control endpoint,
    process)``."""

    def __init__(self, container_executable: str | None = None):
        self.container_executable = container_executable
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def workers(self) -> list[_Worker]:
        with self._lock:
            self._workers = [w for w in self._workers if w.process.poll() is None]  # reaps the ended
            return list(self._workers)

    def StartWorker(self, request, context):  # noqa: N802 (the gRPC method's name)
        try:
            cmd = worker_command(request, self.container_executable)
            _LOG.warning("Starting worker with command %s (worker %s of %s)", cmd, request.worker_id,
                         request.control_endpoint.url)
            proc = subprocess.Popen(cmd, close_fds=True)
            with self._lock:
                self._workers.append(_Worker(request.worker_id, request.control_endpoint.url, proc))
            return beam_fn_api_pb2.StartWorkerResponse()
        except Exception as e:  # noqa: BLE001 - the runner gets the reason
            return beam_fn_api_pb2.StartWorkerResponse(error=f"{type(e).__name__}: {e}")

    def StopWorker(self, request, context):  # noqa: N802
        same = [w for w in self.workers() if w.worker_id == request.worker_id]
        if len(same) == 1:
            _LOG.info("Stopping worker %s of %s", request.worker_id, same[0].control)
            with self._lock:
                self._workers.remove(same[0])
            threading.Thread(target=_stop, args=(same[0].process,), daemon=True).start()
        elif same:
            _LOG.info("Not stopping worker %s: %d workers of TaskManagers %s have that id; each ends when its "
                      "runner closes its control stream", request.worker_id, len(same),
                      ", ".join(w.control for w in same))
        return beam_fn_api_pb2.StopWorkerResponse()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve(port: int = 0, container_executable: str | None = None, host: str = "localhost"):
    """Start the pool's gRPC server: (server, pool, bound port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pool = WorkerPool(container_executable)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, pool, bound


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the SDK worker pool of `streameval cluster up`")
    ap.add_argument("--service_port", type=int, default=0)
    ap.add_argument("--container_executable", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    server, pool, port = serve(args.service_port, args.container_executable)
    _LOG.info("Started worker pool servicer at port: localhost:%d", port)
    try:
        while True:
            time.sleep(5)
            pool.workers()  # reap the workers that ended
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
