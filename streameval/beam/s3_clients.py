"""One boto3 client per process and per set of S3 options for Beam's S3 file system.

Why: Beam 2.77's ``S3FileSystem`` builds ``S3IO(options=...)`` for every ``match``, ``exists``, ``open``,
``create``, ``delete`` and ``rename`` (``apache_beam/io/aws/s3filesystem.py``), and each ``S3IO`` makes
``boto3.session.Session().client("s3", ...)`` (``apache_beam/io/aws/clients/s3/boto3_client.py``,
``Client.__init__``): a new session parses botocore's S3 service model again, 0.15-0.5 s per call on this
machine. The batch job on the bundled sample made 49 clients; on 2 M impressions in 4 files on a local S3
server the job took 3.4 x its local time (``benchmarks/bench_remote.py``, 2026-11-25). Beam has no option
or client factory for this (``S3IO(client=...)`` exists, but ``S3FileSystem`` never passes one), so
:func:`install` replaces the ``boto3`` name inside Beam's ``boto3_client`` module by a proxy whose
``session.Session().client(...)`` returns a client made once per set of arguments (region, endpoint,
credentials, SSL, API version) and shared. Everything else of Beam's client (its per-object download
state, retries, error mapping) is unchanged: each ``S3IO`` still gets its own ``Client`` wrapper.

Thread safety: botocore clients are thread-safe and are shared across threads; boto3 sessions are not,
so a session is made only under a lock, to create a client. After ``fork`` the child starts with no
client (a client's connection pool is not carried across a fork).

Where it runs: importing this module installs it (:func:`install`). The launchers and the modules of our
DoFns import it (``streameval.beam.sources`` / ``sinks``), and the jobs add this module to Beam's
``--beam_plugins`` (:func:`add_to_options`), which a worker's ``sdk_worker_main`` imports at start-up,
before any bundle: Beam's own file sinks then run with it too, in every worker process. On Dataflow,
:class:`SharedS3Clients` (a ``BeamPlugin``) is added to the plugins by the runner itself.

Guarded: a Beam without ``apache_beam.io.aws.clients.s3.boto3_client`` or its module-level ``boto3``
(or without boto3) is left as it is and :func:`install` returns False; ``tests/test_s3_clients.py``
fails when that happens with the Beam this project pins, so an upgrade is noticed. Credentials: a
shared client keeps the credentials it resolved when it was made (refreshable ones, e.g. an instance
role's, refresh themselves). ``STREAMEVAL_S3_FRESH_CLIENTS=1`` in the environment leaves Beam as it is.

Layer 3 (Beam): imports nothing from streameval.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

from apache_beam.utils.plugin import BeamPlugin

__all__ = ["install", "uninstall", "installed", "add_to_options", "clients_made", "export_to_environment",
           "SharedS3Clients", "PLUGIN"]

#: the import path given to Beam's --beam_plugins (workers import it at start-up)
PLUGIN = __name__
#: set to "1" to keep Beam's one client per call
FRESH_CLIENTS_ENV = "STREAMEVAL_S3_FRESH_CLIENTS"

_clients: dict = {}
_lock = threading.Lock()
_made = 0  # clients made by this module in this process (for tests and diagnostics)


def _reset_after_fork() -> None:
    global _clients, _lock, _made
    _clients, _lock, _made = {}, threading.Lock(), 0


os.register_at_fork(after_in_child=_reset_after_fork)


def _key(args, kwargs) -> tuple:
    return (tuple(repr(a) for a in args), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


class _SharedSession:
    """Stands in for ``boto3.session.Session()`` in Beam's ``boto3_client``: ``client(...)`` gives the
    process's client for those arguments; anything else goes to a real session."""

    def __init__(self, real_boto3, *args, **kwargs):
        self._boto3, self._args, self._kwargs = real_boto3, args, kwargs

    def client(self, *args, **kwargs):
        global _made
        key = (_key(self._args, self._kwargs), _key(args, kwargs))
        client = _clients.get(key)
        if client is None:
            with _lock:
                client = _clients.get(key)
                if client is None:
                    client = self._boto3.session.Session(*self._args, **self._kwargs).client(*args, **kwargs)
                    _clients[key] = client
                    _made += 1
        return client

    def __getattr__(self, name):
        return getattr(self._boto3.session.Session(*self._args, **self._kwargs), name)


class _Boto3Proxy:
    """The ``boto3`` name inside Beam's ``boto3_client`` after :func:`install`: ``session.Session`` is a
    :class:`_SharedSession`; every other attribute is boto3's."""

    def __init__(self, real_boto3):
        self._boto3 = real_boto3
        self.session = SimpleNamespace(Session=lambda *a, **kw: _SharedSession(real_boto3, *a, **kw))

    def __getattr__(self, name):
        return getattr(self._boto3, name)


def _beam_module():
    try:
        from apache_beam.io.aws.clients.s3 import boto3_client
    except ImportError:
        return None
    return boto3_client


def install() -> bool:
    """Make Beam's S3 file system share its boto3 clients in this process (idempotent). Returns whether
    the sharing is in place: False when this Beam has no ``boto3_client.boto3`` to replace, when boto3
    is not installed, or when ``STREAMEVAL_S3_FRESH_CLIENTS=1``."""
    if os.environ.get(FRESH_CLIENTS_ENV) == "1":
        return False
    mod = _beam_module()
    current = getattr(mod, "boto3", None)
    if isinstance(current, _Boto3Proxy):
        return True
    if current is None or not hasattr(getattr(current, "session", None), "Session") or \
            not isinstance(getattr(mod, "Client", None), type):
        return False  # no Beam S3 module, no boto3, or Beam makes its clients some other way now
    mod.boto3 = _Boto3Proxy(current)
    return True


def uninstall() -> None:
    """Give Beam back its boto3 module and drop this process's shared clients (and their count)."""
    global _made
    mod = _beam_module()
    current = getattr(mod, "boto3", None)
    if isinstance(current, _Boto3Proxy):
        mod.boto3 = current._boto3
    with _lock:
        _clients.clear()
        _made = 0


def installed() -> bool:
    """Whether Beam's S3 file system shares its clients in this process."""
    return isinstance(getattr(_beam_module(), "boto3", None), _Boto3Proxy)


def clients_made() -> int:
    """How many boto3 clients the sharing made in this process since it was installed (one per set of
    S3 options)."""
    return _made


def add_to_options(options):
    """Add this module to ``options``' ``--beam_plugins`` (Beam's ``SetupOptions``), so that every worker
    process imports it, and so installs the sharing, when it starts (``sdk_worker_main``). Returns
    ``options``."""
    from apache_beam.options.pipeline_options import SetupOptions

    setup = options.view_as(SetupOptions)
    plugins = list(setup.beam_plugins or [])
    if PLUGIN not in plugins:
        setup.beam_plugins = [*plugins, PLUGIN]
    return options


#: an S3 option of Beam -> the environment variable boto3 reads when a client is made without it
ENV_OF_OPTION = {"s3_endpoint_url": "AWS_ENDPOINT_URL_S3", "s3_access_key_id": "AWS_ACCESS_KEY_ID",
                 "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY", "s3_session_token": "AWS_SESSION_TOKEN",
                 "s3_region_name": "AWS_DEFAULT_REGION"}


def export_to_environment(options, environ=None) -> list[str]:
    """Put ``options``' S3 settings (endpoint, credentials, region) in the environment ``environ``
    (default ``os.environ``) as boto3's variables (:data:`ENV_OF_OPTION`), for worker processes that
    start without the pipeline options and inherit the launcher's environment: Beam 2.77's local
    runner in ``multi_processing`` mode (``--workers N``) makes their clients with no endpoint or
    credentials, and boto3 then reads these variables. Returns the names set (none when no S3
    option is given)."""
    from apache_beam.options.pipeline_options import S3Options

    env = os.environ if environ is None else environ
    s3 = options.view_as(S3Options)
    done = []
    for option, name in ENV_OF_OPTION.items():
        value = getattr(s3, option, None)
        if value:
            env[name] = str(value)
            done.append(name)
    return done


class SharedS3Clients(BeamPlugin):
    """A ``BeamPlugin``: runners that send every plugin's import path to their workers (Dataflow) make
    the workers import this module, and so install the sharing, at start-up."""


install()
