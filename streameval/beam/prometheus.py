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

__all__ = ["LatestValues", "STORE", "serve", "write_textfile", "GAUGES"]

#: (metric name suffix, row field) of each gauge
GAUGES = (("value", "value"), ("num_queries", "num_queries"), ("ci_low", "ci_low"), ("ci_high", "ci_high"))
LABELS = ("metric", "slice", "system", "pane")


class LatestValues:
    """Thread-safe store of the latest row per (metric, slice, system, pane) and a
    prometheus-client collector of it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict = {}
        self._scraped = threading.Condition()
        self.scrapes = 0  # collections started (each scrape of the endpoint is one)
        self._done = 0  # collections finished

    def wait_for_scrape(self, after: int, timeout: float) -> bool:
        """Wait until a collection that started after the first ``after`` ones finished (more than
        ``after`` finished), at most ``timeout`` seconds."""
        with self._scraped:
            return self._scraped.wait_for(lambda: self._done > after, timeout)

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
        with self._lock:
            return {k: r for k, (_, r) in self._rows.items()}

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self._scraped:  # counted before the rows are read: one started after the job ended saw its end
            self.scrapes += 1
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
        with self._scraped:
            self._done += 1
            self._scraped.notify_all()


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


def serve(port: int, store: LatestValues = STORE, addr: str = "127.0.0.1"):
    """Serve ``store`` on ``http://addr:port/metrics``; returns (server, thread) (stop with
    ``server.shutdown()``). Raises ``OSError`` when the port cannot be bound."""
    return _client().start_http_server(int(port), addr=addr, registry=_registry(store))


def write_textfile(path: str, rows, store: LatestValues | None = None) -> None:
    """Write the latest values of ``rows`` (metric_result dicts) to ``path`` in the exposition
    format, atomically (prometheus-client's ``write_to_textfile``)."""
    store = store or LatestValues()
    for r in rows:
        store.update(r)
    _client().write_to_textfile(str(path), _registry(store))
