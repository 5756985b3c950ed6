"""The SDK worker pool of ``streameval cluster up`` (streameval.commands.worker_pool): Beam's EXTERNAL
environment service, through its gRPC API, where two TaskManagers ask for workers with one id.

Beam's own pool keeps one process per id, so the first TaskManager's stop request killed the second
one's worker (the batch job on Flink with ``--parallelism 2`` then waited for ever). Here the workers
are stand-ins (``--container_executable``: a script that sleeps), started and stopped through the
service as a runner does; the whole pool under Flink is the engine tier's (tests/test_engines.py)."""

from __future__ import annotations

import stat
import sys
import time

import grpc
import pytest
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc, endpoints_pb2

from streameval.commands.worker_pool import serve, worker_command


@pytest.fixture
def pool(tmp_path):
    exe = tmp_path / "boot"
    exe.write_text("#!/bin/sh\nexec sleep 120\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    server, service, port = serve(0, str(exe), host="127.0.0.1")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)
    yield stub, service
    for w in service.workers():
        w.process.kill()
        w.process.wait()
    channel.close()
    server.stop(0)


def _start(stub, worker_id: str, control: str):
    req = beam_fn_api_pb2.StartWorkerRequest(worker_id=worker_id,
                                             control_endpoint=endpoints_pb2.ApiServiceDescriptor(url=control))
    assert stub.StartWorker(req).error == ""


def _alive(service, control: str) -> bool:
    return any(w.control == control for w in service.workers())


def _until(cond, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_two_taskmanagers_workers_with_one_id_are_both_kept_and_neither_is_stopped_by_the_id(pool):
    stub, service = pool
    _start(stub, "8-1", "localhost:1001")  # taskmanager-1's control service
    _start(stub, "8-1", "localhost:2002")  # taskmanager-2's, the same id
    assert sorted(w.control for w in service.workers()) == ["localhost:1001", "localhost:2002"]
    stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="8-1"))
    time.sleep(0.5)
    # Beam's pool would have killed the second one here (it replaced the first in its table)
    assert _alive(service, "localhost:1001") and _alive(service, "localhost:2002")
    # a worker that ends by itself (its runner hung up) is reaped; then the id is unique again
    first = next(w for w in service.workers() if w.control == "localhost:1001")
    first.process.terminate()
    assert _until(lambda: not _alive(service, "localhost:1001"))
    stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="8-1"))
    assert _until(lambda: not _alive(service, "localhost:2002"))


def test_a_unique_id_is_stopped_and_an_unknown_one_is_nothing(pool):
    stub, service = pool
    _start(stub, "3-1", "localhost:1001")
    _start(stub, "3-2", "localhost:1001")
    (w,) = [w for w in service.workers() if w.worker_id == "3-1"]
    stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="3-1"))
    assert w.process.wait(10) is not None
    assert [x.worker_id for x in service.workers()] == ["3-2"]
    stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="9-9"))
    assert [x.worker_id for x in service.workers()] == ["3-2"]


def test_the_worker_command_is_beams():
    req = beam_fn_api_pb2.StartWorkerRequest(
        worker_id="1-1", control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:5"),
        logging_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:6"),
        artifact_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:7"),
        provision_endpoint=endpoints_pb2.ApiServiceDescriptor(url="localhost:8"))
    assert worker_command(req, "/boot") == ["/boot", "--id=1-1", "--logging_endpoint=localhost:6",
                                            "--artifact_endpoint=localhost:7", "--provision_endpoint=localhost:8",
                                            "--control_endpoint=localhost:5"]
    cmd = worker_command(req)
    assert cmd[:2] == [sys.executable, "-c"]
    assert "SdkHarness('localhost:5', worker_id='1-1'" in cmd[2]
