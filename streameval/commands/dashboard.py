"""``streameval dashboard OUTPUT``: a live page of a job's panes, alerts and record accounting.

    streameval dashboard OUTPUT [--port PORT] [--host 127.0.0.1] [--poll S]

``OUTPUT`` is the ``--output`` of a ``streameval stream`` (or ``batch``) job: a local folder or any
Beam file system's URL (``s3://bucket/out``), read while the job writes it
(:class:`streameval.commands.dashboard_feed.OutputFeed`); it may not exist yet. The command serves,
on ``http://HOST:PORT/`` (127.0.0.1 by default; ``--port 0`` takes a free port), a page that asks
for what changed every ``--poll`` seconds and draws:

* each metric's time series, one chart per metric, a line per system for the chosen slice, with the
  interval band (``ci_low`` to ``ci_high``); points of final panes filled on a solid line, points of
  early and not yet final panes hollow on a dashed line, replaced when their window's later pane
  comes;
* the latest alerts (``alerts-*.jsonl``);
* the record accounting: the running totals as of the latest pane, late data and dead letters
  written so far, and once the job ended its summary line and accounting problems.

The charts are uPlot (MIT, from the npm registry, fetched once into the cache by ``streameval
cluster fetch dashboard``, served by this command: the page loads nothing from elsewhere). The first
line on stdout is ``dashboard: URL``. The page's data is at ``/api/feed?since=SEQ&run=RUN`` (JSON,
:meth:`OutputFeed.snapshot`). Exit status: 130 / 143 on Ctrl-C / SIGTERM (the way to stop it),
1 when uPlot is not in the cache, 2 for a usage error (a port in use, a bad ``--poll``).
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from ..exits import EXIT_FAILED, EXIT_USAGE
from . import engines
from .dashboard_feed import OutputFeed

__all__ = ["main", "serve", "PAGE_FILES"]

#: the page's own files (package data beside this module), served under ``/static/``
PAGE_FILES = ("index.html", "dashboard.js", "dashboard.css")


def _page_file(name: str) -> bytes:
    return resources.files("streameval.commands").joinpath("dashboard_page", name).read_bytes()


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _handler(feed: OutputFeed, vendor: Path):
    class Handler(BaseHTTPRequestHandler):
        server_version = "streameval-dashboard"

        def log_message(self, format, *args):  # noqa: A002 (the base class's name): no line per request
            pass

        def _send(self, body: bytes, kind: str, status: int = HTTPStatus.OK) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (the base class's name)
            url = urlsplit(self.path)
            path = url.path
            if path in ("/", "/index.html"):
                return self._send(_page_file("index.html"), "text/html; charset=utf-8")
            if path == "/api/feed":
                q = parse_qs(url.query)
                snap = feed.snapshot(_int(q.get("since", ["0"])[0], 0), _int(q.get("run", [None])[0]))
                return self._send(json.dumps(snap, allow_nan=False).encode("utf-8"), "application/json")
            if path == "/favicon.ico":  # none: said at once, not a 404 in the page's console
                return self._send(b"", "image/x-icon", HTTPStatus.NO_CONTENT)
            name = path.rsplit("/", 1)[-1]
            if path.startswith("/static/") and name in PAGE_FILES:
                body = _page_file(name)
            elif path.startswith("/vendor/") and name in {Path(f).name for f in engines.UPLOT_FILES}:
                body = (vendor / name).read_bytes()
            else:
                return self._send(b"not found\n", "text/plain; charset=utf-8", HTTPStatus.NOT_FOUND)
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            text = kind.startswith("text/") or kind.endswith("javascript")
            return self._send(body, kind + ("; charset=utf-8" if text else ""))

    return Handler


def serve(output: str, host: str = "127.0.0.1", port: int = 0, poll: float = 1.0) -> ThreadingHTTPServer:
    """The dashboard's HTTP server for ``output``, bound but not yet serving (call
    ``serve_forever``; ``server_address`` holds the port taken). Raises ``OSError`` when the address
    cannot be bound and ``FileNotFoundError`` when uPlot is not in the cache."""
    vendor = engines.uplot_dir()
    lines = engines.missing(["uplot"])
    if lines:
        raise FileNotFoundError(lines[0].replace("`streameval cluster fetch`", "`streameval cluster fetch dashboard`"))
    feed = OutputFeed(output, min_interval=poll)
    server = ThreadingHTTPServer((host, port), _handler(feed, vendor))
    server.daemon_threads = True
    return server


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streameval dashboard", description=__doc__.split("\n\n")[0],
                                epilog="The page polls the output folder; nothing is loaded from outside this server.")
    p.add_argument("output", metavar="OUTPUT", help="a job's --output: a local folder or a URL (s3://bucket/out)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050; 0 takes a free one)")
    p.add_argument("--poll", type=float, default=1.0, metavar="S",
                   help="seconds between the page's polls, and at least between two listings of OUTPUT (default 1)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not 0.05 <= args.poll <= 3600:  # also NaN
        print(f"streameval dashboard: --poll must be in [0.05, 3600] seconds, got {args.poll}", file=sys.stderr)
        return EXIT_USAGE
    if not 0 <= args.port <= 65535:
        print(f"streameval dashboard: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return EXIT_USAGE
    try:
        server = serve(args.output, args.host, args.port, args.poll)
    except FileNotFoundError as e:
        print(f"streameval dashboard: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"streameval dashboard: cannot listen on {args.host}:{args.port}: {e.strerror or e}"
              " (choose another --port, or 0 for a free one)", file=sys.stderr)
        return EXIT_USAGE
    port = server.server_address[1]
    print(f"dashboard: http://{args.host}:{port}/ ({args.output})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0
