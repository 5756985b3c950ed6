"""A JSON REST API for tests, on 127.0.0.1: the Flink REST API's answers the launcher reads
(tests/test_flink_rest.py, tests/test_stall_watchdog.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_json(get, patch=None) -> ThreadingHTTPServer:
    """A server (in a daemon thread; ``shutdown()`` and ``server_close()`` it) answering GET with
    ``get(path)`` as JSON (404 when it gives None) and PATCH with ``patch(path)`` (202 when None)."""

    class Rest(BaseHTTPRequestHandler):
        def _send(self, body, status=200):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's name)
            body = get(self.path)
            if body is None:
                self.send_error(404)
            else:
                self._send(body)

        def do_PATCH(self):  # noqa: N802
            body = patch(self.path) if patch is not None else None
            self._send(body, 200 if body is not None else 202)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Rest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
