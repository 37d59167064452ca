"""`ctx serve`'s connections (issue 35's #8), bounded before any key is checked: idle and
trickling ones are closed, past the bound the oldest go, SIGTERM does not wait for a stalled
stream, and a flood of idle connections at 1,024 files shuts out no client."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import raw_backend
from raw_backend import RawBackend, address, event, stream_head
from test_serve import chat, settings_for

from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

raw = raw_backend.raw  # the stand-in's fixture, by its name


# -- #8: connections are bounded before any key is checked --------------------------------------


def closed_within(connection: socket.socket, seconds: float) -> bool:
    """Whether the server closes `connection` within `seconds` (it reads the end)."""
    connection.settimeout(seconds)
    try:
        while connection.recv(1000):
            pass
        return True
    except TimeoutError:
        return False


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    from otaku_ctx.serve import body, listen

    monkeypatch.setattr(listen, "KEEPALIVE", 0.5)
    monkeypatch.setattr(body, "BODY_SECONDS", 0.5)
    monkeypatch.setattr(listen, "MOST_CONNECTIONS", 10)


@pytest.mark.usefixtures("quick")
def test_idle_and_trickling_connections_are_closed(raw: RawBackend) -> None:
    running = Running(Service(settings_for(raw.url, shutdown=1.0)))
    try:
        idle = socket.create_connection(address(running))
        trickling = socket.create_connection(address(running))
        trickling.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # its headers never end
        assert closed_within(idle, 3) and closed_within(trickling, 3)
        slow = socket.create_connection(address(running))
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        slow.settimeout(3)
        said = slow.recv(4000)
        assert said.startswith(b"HTTP/1.1 408") and b"did not arrive within" in said  # its body never ends
    finally:
        running.stop()


@pytest.mark.usefixtures("quick")
def test_past_the_bound_the_oldest_connections_go_and_a_client_is_answered(raw: RawBackend) -> None:
    running = Running(Service(settings_for(raw.url)))
    try:
        held = [socket.create_connection(address(running)) for _ in range(10)]
        time.sleep(0.1)
        host, port = address(running)
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200  # the eleventh: answered
        assert closed_within(held[0], 0.3)  # the oldest made room
    finally:
        running.stop()


def test_sigterm_with_a_stalled_stream_stops_without_waiting_for_it(raw: RawBackend) -> None:
    """A backend that sends an event, then stalls (for 20 s, or until the test has its answer):
    serve stopped as SIGTERM stops it (`shutdown` 0.4) ends without waiting for the stall — its
    thread is gone while the backend still stalls — and the client's response ends with it."""
    release, stall_ended = threading.Event(), threading.Event()

    def stalled(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler)
        handler.wfile.write(event("Hello"))
        handler.wfile.flush()
        release.wait(20)  # the stall: fifty times the shutdown, or until the test has its answer
        stall_ended.set()

    raw.scenario = stalled
    running = Running(Service(settings_for(raw.url, shutdown=0.4, timeout=60.0)))
    host, port = address(running)
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": chat(3), "stream": True}),
                       {"Content-Type": "application/json"})  # fmt: skip
    try:
        answer = connection.getresponse()
        assert answer.status == 200 and b"Hello" in answer.readline()  # the stream under way
        running.stop()
        assert not running._thread.is_alive() and not stall_ended.is_set()  # serve gone, the stall not over
        try:
            answer.read()  # the rest, to its end (a hang would be the client's timeout)
        except http.client.IncompleteRead:
            pass  # cut mid-stream: an end too
    finally:
        release.set()
        connection.close()


@pytest.mark.deep  # six seconds: in .ci/run's second step
def test_a_flood_of_idle_connections_at_1024_files_shuts_out_no_client(raw: RawBackend, tmp_path: Path) -> None:
    """The issue's figure: `ctx serve` under `ulimit -n 1024`, 1,100 idle connections opened at
    it; a well-behaved client is still answered, and its log holds no traceback."""
    import os
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2400:
        pytest.skip(f"this process may open {hard} files; the flood needs 1,100 beside the server's")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2400), hard))
    (tmp_path / "config.toml").write_text(f'[serve]\nbackend = "{raw.url}"\nport = 0\nsummarize = false\n')

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    env = {**os.environ, "OTAKU_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "otaku_ctx", "serve", "--config", str(tmp_path / "config.toml")],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=limited,
    )  # fmt: skip
    flood: list[socket.socket] = []
    try:
        line = server.stderr.readline() if server.stderr else ""  # "listening on http://127.0.0.1:PORT/v1"
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        for _ in range(1100):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        answered = False
        deadline = time.monotonic() + 15
        while not answered and time.monotonic() < deadline:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
                connection.request("GET", "/health")
                answered = connection.getresponse().status == 200
            except OSError:
                time.sleep(0.2)
        assert answered and len(flood) >= 1000
    finally:
        for each in flood:
            each.close()
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert "Traceback" not in err, err[-2000:]


def test_a_cancelled_request_ends_at_once_and_is_not_retried(raw: raw_backend.RawBackend) -> None:
    """What serve's summarizer does when a live turn comes (issue 44): the request on the
    backend, which would stall 10 s, is stopped from another thread; it ends in `Cancelled`
    within a fraction of that, asked once (a stop is never retried), the server's socket closed."""
    from otaku_ctx.backend import Backend, Cancel, Cancelled

    closed = threading.Event()

    def stall(handler: BaseHTTPRequestHandler) -> None:
        handler.connection.settimeout(10)
        try:
            if handler.connection.recv(1) == b"":  # the client shut its side: generation stops
                closed.set()
        except OSError:
            closed.set()

    raw.scenario = stall
    backend = Backend(raw.url + "/v1", "m", timeout=30)
    cancel = Cancel()
    threading.Timer(0.3, cancel.stop).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        backend.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0, cancel=cancel)
    assert time.monotonic() - started < 3 and raw.asked == 1
    assert closed.wait(3)
    with pytest.raises(Cancelled):  # stopped before it is sent: not sent at all
        backend.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0, cancel=cancel)
    assert raw.asked == 1
