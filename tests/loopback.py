"""What the tests' loopback stand-in servers share: a request handler that answers JSON and
logs nothing (each test file's handler adds the endpoints it stands in for), and a server
that says nothing when a client goes away mid-answer (as the tests' clients do on purpose)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    """A threading server whose handler errors for a client gone (a broken pipe, a reset) are
    not printed: socketserver prints them on stderr, from its own thread, into whichever test
    is capturing stderr then."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _props(self, window: int) -> None:
        """llama.cpp's `/props`, the window it serves; any other GET is a 404."""
        if self.path == "/props":
            self._send(200, {"default_generation_settings": {"n_ctx": window}})
        else:
            self._send(404, {"error": {"message": "no such endpoint"}})
