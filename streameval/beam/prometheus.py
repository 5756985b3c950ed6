"""The latest metric values in Prometheus' exposition format (the ``prometheus-client`` library):
an HTTP endpoint for the streaming job (``stream --prometheus-port``), a textfile for the batch job
(``batch --prometheus-textfile``, for node_exporter's textfile collector).

Gauges, one series per (metric, slice, system, pane): ``pane="final"`` holds the latest final pane
(the latest window whose value will not change), ``pane="latest"`` the latest pane of any kind (an
early pane of the open window, as it fires):

* ``streameval_value``: the row's value;
* ``streameval_num_queries``: its count (queries, or impressions for CTR);
* ``streameval_stderr``: its standard error (absent when the row has none);
* ``streameval_ci_low`` / ``streameval_ci_high``: its interval (absent when the row has none);
* ``streameval_window_end_seconds``: the end of the row's window (Unix seconds; ``+Inf`` for the
  global window of a batch job without ``--window``, so that ``baseline = "system:NAME"`` rules,
  which pair the two systems' series on it, hold there too).

With ``test = "msprt"`` alert rules, each rule's latest look (:func:`streameval.plan.alerts.change_look`),
one series per (rule, metric, slice, system), the latest window's:

* ``streameval_msprt_p_value``: the always-valid p-value (the running minimum over the window's
  panes), valid however often it is scraped and whenever one acts on it;
* ``streameval_msprt_diff``, ``streameval_msprt_diff_low`` / ``streameval_msprt_diff_high``: the
  difference value - baseline and its always-valid interval at the rule's level;
* ``streameval_msprt_window_end_seconds``: the end of the look's window.

A row updates its series only when its window is at least as late as the one the series holds, so
a late pane of an old window never hides a newer window's value. Rows with a NaN value (a slice
emptied by a late update) are left out. The store lives in the process that runs the panes' last
step: on the local runner the launcher itself.

:func:`alerting_rules` writes alert rules (``streameval.plan.alerts``) as Prometheus alerting rules over
these gauges.
"""

from __future__ import annotations

import math
import threading

__all__ = ["LatestValues", "Exporter", "STORE", "serve", "write_textfile", "GAUGES", "alerting_rules"]

#: (metric name suffix, row field) of each gauge
GAUGES = (("value", "value"), ("num_queries", "num_queries"), ("stderr", "stderr"), ("ci_low", "ci_low"),
          ("ci_high", "ci_high"))
LABELS = ("metric", "slice", "system", "pane")
#: (metric name suffix, look field) of each gauge of an mSPRT rule's looks, and their labels
LOOK_GAUGES = (("msprt_p_value", "p_value"), ("msprt_diff", "diff"), ("msprt_diff_low", "diff_low"),
               ("msprt_diff_high", "diff_high"))
LOOK_LABELS = ("rule", "metric", "slice", "system")


class LatestValues:
    """Thread-safe store of the latest row per (metric, slice, system, pane) and a
    prometheus-client collector of it (``collect``: the gauges above)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict = {}
        self._looks: dict = {}

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._looks.clear()

    def _keep(self, held: dict, keys, record: dict) -> None:
        """Hold ``record`` under each of ``keys`` of ``held`` unless a later window's is held there."""
        end = record.get("window_end")
        end = -math.inf if end is None else end
        with self._lock:
            for key in keys:
                old = held.get(key)
                if old is None or end >= old[0]:
                    held[key] = (end, record)

    def update_look(self, look: dict) -> None:
        """Take an mSPRT rule's look (:func:`streameval.plan.alerts.change_look`): kept when its window is
        at least as late as the one its (rule, metric, slice, system) series holds."""
        self._keep(self._looks, [tuple(look[k] for k in LOOK_LABELS)], look)

    def looks(self) -> dict:
        """{(rule, metric, slice, system): look} of the looks held now."""
        with self._lock:
            return {k: r for k, (_, r) in self._looks.items()}

    def update(self, row: dict) -> None:
        """Take a metric_result row (a stream pane's, or a batch row: then it counts as final)."""
        value = row.get("value")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        final = row.get("is_final")
        kinds = ["latest"] + (["final"] if final or final is None else [])
        self._keep(self._rows, [(row["metric"], row["slice"], row["system"], pane) for pane in kinds], row)

    def rows(self) -> dict:
        """{(metric, slice, system, pane): row} of the rows held now."""
        with self._lock:
            return {k: r for k, (_, r) in self._rows.items()}

    def collect(self):
        docs = {"value": "latest value of a streameval metric row", "num_queries": "its number of queries "
                "(impressions for CTR)", "stderr": "its standard error", "ci_low": "low end of its interval",
                "ci_high": "high end of its interval", "window_end_seconds": "end of the row's window (Unix seconds)"}
        # the global window (a batch job without --window) ends at +Inf: a system baseline rule joins
        # the two systems' series on window_end_seconds, and a row without it never fired (issue 41)
        yield from _families("streameval_", GAUGES, LABELS, self.rows(), docs)
        looks = self.looks()
        if looks:
            docs = {"msprt_p_value": "always-valid mSPRT p-value of an alert rule's change (running minimum over "
                    "the panes)", "msprt_diff": "value - baseline of the rule's look", "msprt_diff_low": "low end "
                    "of the difference's always-valid interval", "msprt_diff_high": "high end of the difference's "
                    "always-valid interval", "msprt_window_end_seconds": "end of the look's window (Unix seconds)"}
            yield from _families("streameval_msprt_", [(n[len("msprt_"):], f) for n, f in LOOK_GAUGES], LOOK_LABELS,
                                 looks, {k[len("msprt_"):]: v for k, v in docs.items()})


def _families(prefix: str, gauges, labels, held: dict, docs: dict):
    """The gauge families ``prefix + name`` of ``gauges`` ((name, field) pairs: a record's values,
    NaN left out) and ``prefix + "window_end_seconds"`` (+Inf for the global window) over ``held``
    ({label values: record})."""
    from prometheus_client.core import GaugeMetricFamily

    for name, field in gauges:
        g = GaugeMetricFamily(prefix + name, docs[name], labels=labels)
        for key, rec in sorted(held.items()):
            v = rec.get(field)
            if v is not None and not math.isnan(v):
                g.add_metric(list(key), float(v))
        yield g
    g = GaugeMetricFamily(prefix + "window_end_seconds", docs["window_end_seconds"], labels=labels)
    for key, rec in sorted(held.items()):
        end = rec.get("window_end")
        g.add_metric(list(key), math.inf if end is None else end / 1e6)
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


def _selector(name: str, labels: dict) -> str:
    inner = ", ".join(f'{k}{op}{_promql_string(v)}' for k, (op, v) in labels.items())
    return f"streameval_{name}{{{inner}}}"


def _promql_string(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _num(x: float) -> str:
    return repr(float(x))


_DURATION = __import__("re").compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def rule_expressions(rule, pane: str = "latest") -> list[tuple[str, str, str]]:
    """The PromQL expressions of one ``streameval.plan.alerts.Rule`` over the gauges of ``pane``
    ("latest": every pane, as the streaming job evaluates rules; "final": final panes only):
    [(condition, expression, summary)], one per condition (``below`` and ``above`` are two).

    Threshold rules compare the interval gauges (``ci_high < below``, ``ci_low > above``);
    ``baseline = "system:NAME"`` rules take the normal interval of ``value - baseline`` from the two
    ``streameval_stderr`` gauges, the baseline's series of the same metric, slice and window end.
    ``test = "msprt"`` rules read the stream's look gauges (:func:`_msprt_expression`; the batch
    job's textfile has none). Raises ValueError (one line, naming the rule) for what the gauges
    cannot express: a ``trailing:N`` or ``offset:`` baseline (they hold the latest window only) and
    ``for_panes`` > 1 (Prometheus' ``for`` counts time, not panes)."""
    if pane not in ("latest", "final"):
        raise ValueError(f"pane must be 'latest' or 'final', got {pane!r}")
    if rule.for_panes > 1:
        raise ValueError(f"rule {rule.name!r}: for_panes = {rule.for_panes} counts panes, which the gauges do not "
                         "(drop it and give a time with --for)")
    labels = {"metric": ("=", rule.metric), "pane": ("=", pane)}
    if rule.slice is not None:
        labels["slice"] = ("=", rule.slice)
    out = []
    if rule.test == "srm":  # the srm row's value is a p-value
        mine = labels | _system(rule)
        return [("srm", f"{_selector('value', mine)} < {_num(rule.p_below)} and "
                        f"{_selector('num_queries', mine)} >= {rule.min_n}",
                 f"sample-ratio mismatch: p-value below {rule.p_below:g}")]
    if rule.baseline is None:
        mine = labels | _system(rule)
        enough = f"{_selector('num_queries', mine)} >= {rule.min_n}"
        if rule.below is not None:
            out.append(("below", f"{_selector('ci_high', mine)} < {_num(rule.below)} and {enough}",
                        f"interval entirely below {rule.below:g}"))
        if rule.above is not None:
            out.append(("above", f"{_selector('ci_low', mine)} > {_num(rule.above)} and {enough}",
                        f"interval entirely above {rule.above:g}"))
        return out
    kind, arg = rule.baseline[:2]
    if kind != "system":
        what = f"offset:{rule.baseline[2]}' needs an earlier window" if kind == "offset" else \
            f"trailing:{arg}' needs the preceding windows"
        raise ValueError(f"rule {rule.name!r}: baseline '{what}, which the gauges do not hold (they hold the "
                         "latest window)")
    if rule.system == arg:
        raise ValueError(f"rule {rule.name!r}: system {arg!r} is its own baseline (the rule never fires)")
    if rule.test == "msprt":
        return [_msprt_expression(rule, arg)]
    from scipy import special

    z = float(special.ndtri((1.0 + rule.level) / 2.0))
    mine = labels | _system(rule, arg)
    base = labels | {"system": ("=", arg)}

    diff = f"({_selector('value', mine)} - ignoring(system) group_left {_selector('value', base)})"
    half = (f"{_num(z)} * sqrt({_selector('stderr', mine)} ^ 2 + ignoring(system) group_left "
            f"{_selector('stderr', base)} ^ 2)")
    same = (f"({_selector('window_end_seconds', mine)} == ignoring(system) group_left "
            f"{_selector('window_end_seconds', base)})")
    enough = f"{_selector('num_queries', mine)} >= {rule.min_n}"
    guard = (f" and {enough} and ignoring(system) {_selector('num_queries', base)} >= {rule.min_n}"
             f" and {same}")
    if rule.change_below is not None:
        out.append(("change_below", f"{diff} + {half} < {_num(rule.change_below)}{guard}",
                    f"value - baseline (system {arg}) entirely below {rule.change_below:g}"))
    if rule.change_above is not None:
        out.append(("change_above", f"{diff} - {half} > {_num(rule.change_above)}{guard}",
                    f"value - baseline (system {arg}) entirely above {rule.change_above:g}"))
    return out


def _msprt_expression(rule, baseline: str) -> tuple[str, str, str]:
    """A ``test = "msprt"`` rule over the stream's look gauges (``streameval_msprt_*``, labelled with
    the rule's name): the always-valid p-value at most ``1 - level`` and the difference on the rule's
    side of its null, as the job's own evaluation (:mod:`streameval.plan.alerts`); a look exists only for
    rows the rule applies to (``min_n`` included). The looks are every pane's: ``pane`` does not
    apply."""
    look = {"rule": ("=", rule.name), "metric": ("=", rule.metric)}
    if rule.slice is not None:
        look["slice"] = ("=", rule.slice)
    look |= _system(rule, baseline)
    below = rule.change_below is not None
    theta0 = rule.change_below if below else rule.change_above
    alpha = 1.0 - rule.level
    side = "change_below" if below else "change_above"
    expr = (f"{_selector('msprt_p_value', look)} <= {_num(alpha)} and "
            f"{_selector('msprt_diff', look)} {'<' if below else '>'} {_num(theta0)}")
    return side, expr, (f"value - {baseline} {'below' if below else 'above'} {theta0:g}, always-valid p-value "
                        f"<= {alpha:g} (mSPRT)")


def _system(rule, baseline: str | None = None) -> dict:
    if rule.system is not None:
        return {"system": ("=", rule.system)}
    return {} if baseline is None else {"system": ("!=", baseline)}


def alerting_rules(rules, pane: str = "latest", for_: str | None = None, group: str = "streameval") -> str:
    """A Prometheus alerting rules file (YAML text, one group) of ``rules`` (``streameval.plan.alerts.Rule``):
    one alerting rule per condition (:func:`rule_expressions`), the alert named after the rule, labels
    ``rule`` and ``condition``, ``for: for_`` (a Prometheus duration such as "5m") when given.
    Raises ValueError (one line) for a rule the gauges cannot express or a bad ``for_``."""
    import json

    if for_ is not None and not _DURATION.match(for_):
        raise ValueError(f"--for must be a Prometheus duration (30s, 5m, 1h30m), got {for_!r}")
    q = json.dumps  # a JSON string is a YAML double-quoted scalar
    lines = ["# Prometheus alerting rules written by 'streameval alerts-to-prometheus' over the gauges",
             "# of stream --prometheus-port / batch --prometheus-textfile (docs/metrics.md)",
             "groups:", f"  - name: {q(group)}", "    rules:"]
    for rule in rules:
        for condition, expr, summary in rule_expressions(rule, pane):
            lines += [f"      - alert: {q(rule.name)}", f"        expr: {q(expr)}"]
            if for_:
                lines.append(f"        for: {for_}")
            lines += ["        labels:", f"          rule: {q(rule.name)}", f"          condition: {q(condition)}",
                      "        annotations:",
                      "          summary: " + q(f"{{{{ $labels.metric }}}} {{{{ $labels.slice }}}} "
                                                f"{{{{ $labels.system }}}} ({pane} pane): {summary} "
                                                f"(streameval rule {rule.name})")]
    return "\n".join(lines) + "\n"
