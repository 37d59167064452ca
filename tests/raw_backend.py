"""What the tests of `ctx serve`'s own surface share (issue 35; tests/test_serve_relay.py, _log,
_connections, _bounds, _sidecar and _branches): a loopback backend that misbehaves on cue,
writing raw bytes (a real server will not break its chunked encoding when asked) — `RawBackend`,
the helpers its scenarios write with, and the `raw` and `serving` fixtures, which a test file
takes by name (`raw, serving = raw_backend.raw, raw_backend.serving`); and serve's address, a
streamed reply's text, and the summaries serve has left to write."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import openai
import pytest
from loopback import JSONHandler, QuietServer
from test_serve import chat, settings_for

from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

Scenario = Callable[[BaseHTTPRequestHandler], None]


class RawBackend(QuietServer):
    """llama.cpp's `/props` (its `window`), and a chat completion answered by `scenario`, which
    writes what it likes on the socket."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Raw)
        self.window = 8192
        self.scenario: Scenario = lambda handler: None
        self.asked = 0  # the chat completions it was asked for


class _Raw(JSONHandler):
    server: RawBackend
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/props":
            reply(self, 200, {"default_generation_settings": {"n_ctx": self.server.window}})
        else:
            reply(self, 404, {"error": {"message": "no such endpoint"}})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.asked += 1
        self.server.scenario(self)


def reply(
    handler: BaseHTTPRequestHandler, status: int, data: object, content_type: str = "application/json",
    reason: str | None = None,
) -> None:  # fmt: skip
    """A whole JSON reply: `status` (with `reason`, when the scenario gives one of its own)."""
    body = json.dumps(data).encode()
    handler.send_response(status, reason)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


#: a chat completion's whole reply
HI = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}


def address(running: Running) -> tuple[str, int]:
    """The host and port serve listens on."""
    host, port = running.url.split("//")[1].split("/")[0].split(":")
    return host, int(port)


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def stream_head(handler: BaseHTTPRequestHandler, *extra: tuple[str, str]) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    for name, value in extra:
        handler.send_header(name, value)
    handler.end_headers()


@pytest.fixture
def raw() -> Iterator[RawBackend]:
    backend = RawBackend().start()
    yield backend
    backend.stop()


@pytest.fixture
def serving(raw: RawBackend) -> Iterator[Running]:
    running = Running(Service(settings_for(raw.url, timeout=30.0)))
    yield running
    running.stop()


def streamed(running: Running) -> str:
    client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=20)
    pieces = client.chat.completions.create(model="m", messages=chat(3), stream=True)
    return "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)


def summaries_writing(running: Running) -> int:
    """How many chats have summaries wanted or being written (`/ctx/stats`)."""
    host, port = address(running)
    connection = http.client.HTTPConnection(host, port, timeout=5)
    connection.request("GET", "/ctx/stats")
    return sum(c["summaries_writing"] for c in json.loads(connection.getresponse().read())["chats"])
