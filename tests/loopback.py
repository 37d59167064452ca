"""What the tests' loopback stand-in servers share (the benchmarks' too): a request handler
that answers JSON and logs nothing (each one's handler adds the endpoints it stands in for),
and a server on a free loopback port, started in a thread and stopped in one call each, that
says nothing when a client goes away mid-answer (as the tests' clients do on purpose)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    """A threading server on 127.0.0.1 whose handler errors for a client gone (a broken pipe,
    a reset) are not printed: socketserver prints them on stderr, from its own thread, into
    whichever test is capturing stderr then."""

    daemon_threads = True
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Its OpenAI-compatible base."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def start(self, poll: float = 0.005) -> Self:
        """Serve from a thread of its own, checking for `stop` every `poll` seconds."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": poll}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the socket, and wait (a little) for the thread to end."""
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class JSONHandler(BaseHTTPRequestHandler):
    # Headers and body are two writes: with Nagle on, the body waits for the client's delayed
    # ACK, 40 ms a reply.
    disable_nagle_algorithm = True

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
