"""The latest metric values in Prometheus' exposition format (the ``prometheus-client`` library):
an HTTP endpoint for the streaming job (``stream --prometheus-port``), a textfile for the batch job
(``batch --prometheus-textfile``, for node_exporter's textfile collector).

Gauges, one series per (metric, slice, system, pane): ``pane="final"`` holds the latest final pane
(the latest window whose value will not change), ``pane="latest"`` the latest pane of any kind (an
early pane of the open window, as it fires):

* ``streameval_value``: the row's value;
* ``streameval_num_queries``: its count (queries, or impressions for CTR);
* ``streameval_ci_low`` / ``streameval_ci_high``: its interval (absent when the row has none);
* ``streameval_window_end_seconds``: the end of the row's window (Unix seconds).

A row updates its series only when its window is at least as late as the one the series holds, so
a late pane of an old window never hides a newer window's value. Rows with a NaN value (a slice
emptied by a late update) are left out. The store lives in the process that runs the panes' last
step: on the local runner the launcher itself.
"""

from __future__ import annotations

import math
import threading

__all__ = ["LatestValues", "Exporter", "STORE", "serve", "write_textfile", "GAUGES"]

#: (metric name suffix, row field) of each gauge
GAUGES = (("value", "value"), ("num_queries", "num_queries"), ("ci_low", "ci_low"), ("ci_high", "ci_high"))
LABELS = ("metric", "slice", "system", "pane")


class LatestValues:
    """Thread-safe store of the latest row per (metric, slice, system, pane) and a
    prometheus-client collector of it (``collect``: the gauges above)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict = {}

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()

    def update(self, row: dict) -> None:
        """Take a metric_result row (a stream pane's, or a batch row: then it counts as final)."""
        value = row.get("value")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        final = row.get("is_final")
        kinds = ["latest"] + (["final"] if final or final is None else [])
        end = row.get("window_end")
        end = -math.inf if end is None else end
        with self._lock:
            for pane in kinds:
                key = (row["metric"], row["slice"], row["system"], pane)
                old = self._rows.get(key)
                if old is None or end >= old[0]:
                    self._rows[key] = (end, row)

    def rows(self) -> dict:
        """{(metric, slice, system, pane): row} of the rows held now."""
        with self._lock:
            return {k: r for k, (_, r) in self._rows.items()}

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        rows = self.rows()
        docs = {"value": "latest value of a streameval metric row", "num_queries": "its number of queries "
                "(impressions for CTR)", "ci_low": "low end of its interval", "ci_high": "high end of its interval"}
        for name, field in GAUGES:
            g = GaugeMetricFamily(f"streameval_{name}", docs[name], labels=LABELS)
            for key, row in sorted(rows.items()):
                v = row.get(field)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    g.add_metric(list(key), float(v))
            yield g
        g = GaugeMetricFamily("streameval_window_end_seconds", "end of the row's window (Unix seconds)",
                              labels=LABELS)
        for key, row in sorted(rows.items()):
            if row.get("window_end") is not None:
                g.add_metric(list(key), row["window_end"] / 1e6)
        yield g


#: the store the streaming job's export step fills and its HTTP endpoint serves
STORE = LatestValues()


def _client():
    try:
        import prometheus_client
    except ImportError:
        raise ImportError("the Prometheus export needs prometheus-client (pip install 'streameval[monitoring]')") from None
    return prometheus_client


def _registry(store: LatestValues):
    CollectorRegistry = _client().CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(store)
    return reg


class Exporter:
    """The HTTP endpoint of a store (``http://addr:port/metrics``, any path but /favicon.ico) that
    counts its scrapes, so that a job can wait until a scraper stored its final values.

    Every request gets a sequence number as it arrives, before its values are collected; a request
    counts as *sent* once its whole 200 response was written to the socket. Prometheus scrapes a
    target one request at a time and stores (commits) a scrape before it starts the next one, so a
    request that arrives after a sent one proves the sent one was processed (stored, unless
    Prometheus gave up on it for its scrape_timeout).

    Raises ``OSError`` when the port cannot be bound, ``ImportError`` without prometheus-client.
    ``port``: the bound port (the one the OS chose for 0). Stop with ``close()``.
    """

    def __init__(self, store: LatestValues, port: int, addr: str = "127.0.0.1"):
        from socketserver import ThreadingMixIn
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        inner = _client().make_wsgi_app(_registry(store))
        self._cond = threading.Condition()
        self.started = 0  # requests arrived
        self._sent: list[int] = []  # sequence numbers of the requests whose response was written

        class Server(ThreadingMixIn, WSGIServer):
            daemon_threads = True

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args):  # no access log on the job's console
                pass

        self._server = make_server(addr, int(port), self._app(inner), server_class=Server, handler_class=Quiet)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="prometheus-endpoint",
                                        daemon=True)
        self._thread.start()

    def _app(self, inner):
        exporter = self

        def app(environ, start_response):
            with exporter._cond:
                exporter.started += 1
                seq = exporter.started
                exporter._cond.notify_all()
            status = []

            def start(code, headers, exc_info=None):
                status.append(code)
                return start_response(code, headers, exc_info)

            body = inner(environ, start)  # collects the values now
            scrape = environ.get("PATH_INFO") != "/favicon.ico"
            return _Body(body, lambda: scrape and status and status[0].startswith("200") and exporter._done(seq))

        return app

    def _done(self, seq: int) -> None:
        with self._cond:
            self._sent.append(seq)
            self._cond.notify_all()

    def mark(self) -> int:
        """The number of requests arrived so far: the ones after it collect the values held from now."""
        with self._cond:
            return self.started

    def wait_for_scrape(self, after: int, timeout: float) -> str:
        """Wait, at most ``timeout`` seconds, until a request arrived after the first ``after`` ones
        was sent and another request arrived after it. Returns ``"stored"`` when that happened
        (the scraper processed the sent one), ``"sent"`` when only the first part did, ``"none"``
        when no request after ``after`` was sent."""

        def sent():
            return [k for k in self._sent if k > after]

        with self._cond:
            self._cond.wait_for(lambda: any(k < self.started for k in sent()), timeout)
            mine = sent()
            if not mine:
                return "none"
            return "stored" if min(mine) < self.started else "sent"

    def close(self) -> None:
        """Stop serving and release the port (requests in progress finish on their threads)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _Body:
    """A WSGI response that calls ``on_sent`` when the server closes it after writing all of it."""

    def __init__(self, body, on_sent):
        self._body, self._on_sent, self._complete = body, on_sent, False

    def __iter__(self):
        yield from self._body
        self._complete = True  # the server asked for more after writing the last chunk

    def close(self):
        if hasattr(self._body, "close"):
            self._body.close()
        if self._complete:
            self._on_sent()


def serve(port: int, store: LatestValues = STORE, addr: str = "127.0.0.1") -> Exporter:
    """Serve ``store`` on ``http://addr:port/metrics`` (an :class:`Exporter`; ``close()`` stops it).
    Raises ``OSError`` when the port cannot be bound, ``ImportError`` without prometheus-client."""
    return Exporter(store, port, addr)


def write_textfile(path: str, rows, store: LatestValues | None = None) -> None:
    """Write the latest values of ``rows`` (metric_result dicts) to ``path`` in the exposition
    format, atomically (prometheus-client's ``write_to_textfile``)."""
    store = store or LatestValues()
    for r in rows:
        store.update(r)
    _client().write_to_textfile(str(path), _registry(store))
