"""streameval.beam.s3_clients: Beam's S3 file system shares one boto3 client per process and per set of
S3 options. No S3 server is needed (a client is made without a request); the jobs on a moto server are
in tests/test_s3.py, section (f).

The first test is the upgrade alarm: it fails when Beam no longer makes its clients through the
``boto3`` name of ``apache_beam.io.aws.clients.s3.boto3_client`` (install() then skips the sharing and
every S3 call pays a new client again, 0.15-0.5 s each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("boto3")

from apache_beam.io.aws.clients.s3 import boto3_client  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions  # noqa: E402

from streameval.beam import s3_clients  # noqa: E402


def _options(endpoint: str = "http://127.0.0.1:9", key: str = "testing") -> PipelineOptions:
    return PipelineOptions(["--s3_endpoint_url", endpoint, "--s3_access_key_id", key,
                            "--s3_secret_access_key", "testing", "--s3_region_name", "us-east-1"])


@pytest.fixture
def made(monkeypatch):
    """A fresh installation and a count of the S3 clients botocore makes (a list, one entry each)."""
    import botocore.session

    created = []
    create = botocore.session.Session.create_client

    def create_client(self, service_name, *args, **kwargs):
        client = create(self, service_name, *args, **kwargs)
        if service_name == "s3":
            created.append(client)
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    monkeypatch.delenv(s3_clients.FRESH_CLIENTS_ENV, raising=False)
    s3_clients.uninstall()
    assert s3_clients.install()
    yield created
    s3_clients.install()  # as the jobs leave it


def test_beam_makes_its_clients_where_the_sharing_is_installed(made):
    """Beam 2.77: each ``boto3_client.Client(options)`` (one per S3IO, i.e. per file-system call) gets
    the process's client for its options; other options get their own."""
    import apache_beam

    assert s3_clients.installed(), f"Beam {apache_beam.__version__}: boto3_client.boto3 is no longer there"
    first, second = boto3_client.Client(_options()), boto3_client.Client(_options())
    assert first is not second and first.client is second.client  # one wrapper per call, one client
    other = boto3_client.Client(_options(endpoint="http://127.0.0.1:10"))
    also_other = boto3_client.Client(_options(key="another"))
    assert len({id(first.client), id(other.client), id(also_other.client)}) == 3
    assert len(made) == 3 and s3_clients.clients_made() == 3
    assert first.client.meta.endpoint_url == "http://127.0.0.1:9"
    assert other.client.meta.endpoint_url == "http://127.0.0.1:10"
    boto3_client.Client({"s3_endpoint_url": "http://127.0.0.1:9", "s3_access_key_id": "testing",
                         "s3_secret_access_key": "testing", "s3_region_name": "us-east-1"})
    assert len(made) == 3  # the options as a dict (a worker's runtime options): the same client


def test_threads_share_one_client(made):
    """Eight threads building Beam's client at once make one boto3 client (sessions only under a lock)."""
    start, got = threading.Barrier(8), []

    def build():
        start.wait()
        got.append(boto3_client.Client(_options()).client)

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({id(c) for c in got}) == 1 and len(made) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_makes_its_own_client(made):
    parent = boto3_client.Client(_options()).client
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no client inherited, a new one made once
        try:
            a, b = boto3_client.Client(_options()).client, boto3_client.Client(_options()).client
            os.write(w, json.dumps([a is not parent, a is b, s3_clients.clients_made()]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fo:
        out = fo.read()
    os.waitpid(pid, 0)
    assert json.loads(out) == [True, True, 1]


def test_fresh_clients_leaves_beam_as_it_is(made, monkeypatch):
    s3_clients.uninstall()
    monkeypatch.setenv(s3_clients.FRESH_CLIENTS_ENV, "1")
    assert not s3_clients.install() and not s3_clients.installed()
    a, b = boto3_client.Client(_options()), boto3_client.Client(_options())
    assert a.client is not b.client and len(made) == 2
    monkeypatch.delenv(s3_clients.FRESH_CLIENTS_ENV)


def test_the_jobs_send_it_to_their_workers():
    """The jobs' pipelines (``make_pipeline``) list the module in ``--beam_plugins`` once; a worker
    process that starts as ``sdk_worker_main`` does (``_import_beam_plugins`` of the job's options) has
    the sharing installed before it runs anything."""
    from streameval.beam.arguments import make_pipeline

    options = PipelineOptions(["--runner", "FnApiRunner", "--beam_plugins", "some.other.plugin", *_args()])
    make_pipeline(options)
    make_pipeline(options)
    plugins = options.view_as(SetupOptions).beam_plugins
    assert plugins == ["some.other.plugin", s3_clients.PLUGIN]
    code = ("import json, sys\n"
            "from apache_beam.runners.worker import sdk_worker_main\n"
            "from apache_beam.io.aws.clients.s3 import boto3_client\n"
            "before = 'streameval' in sys.modules\n"
            "sdk_worker_main._import_beam_plugins(json.loads(sys.argv[1]))\n"
            "print(json.dumps([before, type(boto3_client.boto3).__name__]))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps([s3_clients.PLUGIN])], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, "_Boto3Proxy"]


def _args():
    return ["--s3_endpoint_url", "http://127.0.0.1:9", "--s3_region_name", "us-east-1"]


def test_dataflow_finds_it_as_a_beam_plugin():
    """Dataflow sends every ``BeamPlugin`` subclass's import path to its workers (dataflow_runner.py)."""
    from apache_beam.utils.plugin import BeamPlugin

    assert f"{s3_clients.PLUGIN}.SharedS3Clients" in BeamPlugin.get_all_plugin_paths()
