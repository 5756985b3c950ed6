"""A local S3 server for the tests of remote file systems: moto's server (``moto[server]``, the test
extra) on 127.0.0.1, one per test session, with one bucket.

    def test_x(s3_server):
        url = s3_server.upload(local_path, "in/imps.avro")        # "s3://BUCKET/in/imps.avro"
        batch.main([..., "--output", s3_server.url("out/run1"), *s3_server.beam_args])
        s3_server.keys("out/run1/")                                # keys under a prefix
        s3_server.read("out/run1/manifest.json")                   # bytes of a key

``beam_args`` are the S3 options of Beam's ``PipelineOptions`` (endpoint, credentials, region) that
point Beam's S3 file system at the server. The server runs as a subprocess (its log in a temporary
file, named in the failure when it does not come up) and is stopped by its PID at the end of the
session. Tests share the bucket: each one writes under its own prefix (:meth:`S3Server.prefix`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import pytest

HOST = "127.0.0.1"
ACCESS_KEY = SECRET_KEY = "testing"
REGION = "us-east-1"
BUCKET = "streameval-test"
START_TIMEOUT = 60  # seconds for the server to answer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (it may be taken again before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def beam_s3_args(endpoint: str) -> list[str]:
    """Beam's S3 options (apache_beam.options.pipeline_options.S3Options) for a server at ``endpoint``."""
    return ["--s3_endpoint_url", endpoint, "--s3_access_key_id", ACCESS_KEY, "--s3_secret_access_key", SECRET_KEY,
            "--s3_region_name", REGION]


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        region_name=REGION)


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, errors="replace") as fo:
            return "".join(fo.readlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


@dataclass
class S3Server:
    """A running moto S3 server and its bucket (see the module docstring)."""

    endpoint: str
    bucket: str
    pid: int
    log: str
    client: object = field(repr=False)

    @property
    def beam_args(self) -> list[str]:
        return beam_s3_args(self.endpoint)

    def url(self, key: str = "") -> str:
        """``s3://BUCKET/key``."""
        return f"s3://{self.bucket}/{key.lstrip('/')}"

    def prefix(self, name: str = "t") -> str:
        """A fresh key prefix (``name-<hex>/``) for one test's objects."""
        return f"{name}-{uuid.uuid4().hex[:8]}/"

    def upload(self, local_path, key: str) -> str:
        """Upload a local file as ``key``; returns its ``s3://`` URL."""
        self.client.upload_file(str(local_path), self.bucket, key)
        return self.url(key)

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.url(key)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under ``prefix``, sorted."""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def exists(self, key: str) -> bool:
        return key in self.keys(key)


@contextlib.contextmanager
def moto_server(bucket: str = BUCKET, log_dir: str | None = None):
    """Start moto's S3 server on 127.0.0.1 on a free port, create ``bucket``, yield an
    :class:`S3Server`; stop the server (by its PID) on exit. Raises ``RuntimeError`` with the tail of
    the server's log when it does not come up. The log is removed at the end unless it is in
    ``log_dir``."""
    port = free_port()
    endpoint = f"http://{HOST}:{port}"
    fd, log = tempfile.mkstemp(prefix="moto-server-", suffix=".log", dir=log_dir)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION)
    with os.fdopen(fd, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    try:
        client = s3_client(endpoint)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode} before answering on {endpoint}; "
                                   f"log {log}:\n{_tail(log)}")
            try:
                with socket.create_connection((HOST, port), timeout=1):
                    pass
                client.list_buckets()
                break
            except Exception as e:  # noqa: BLE001 (not up yet: refused, reset, HTTP errors)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer on {endpoint} in {START_TIMEOUT} s "
                                       f"({type(e).__name__}: {e}); log {log}:\n{_tail(log)}") from e
                time.sleep(0.1)
        client.create_bucket(Bucket=bucket)
        yield S3Server(endpoint=endpoint, bucket=bucket, pid=proc.pid, log=log, client=client)
    finally:
        _stop(proc)
        if log_dir is None:
            with contextlib.suppress(OSError):
                os.unlink(log)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server by its PID: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with one bucket, for the whole session (see the module docstring).
    Skipped when moto or boto3 is not installed (``pip install -e '.[test]'``)."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    try:
        server = moto_server(log_dir=str(tmp_path_factory.mktemp("moto")))
        s3 = server.__enter__()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield s3
    finally:
        server.__exit__(None, None, None)
