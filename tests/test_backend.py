"""The model-server client against a stand-in server of the tests' own (a small `http.server` on
127.0.0.1, port 0, in a thread) that produces on cue what a real server will not: a stall, 429
with Retry-After, 503 then success, a 500, malformed JSON, a truncated body, a web page, 401,
a missing model, context-length errors in llama.cpp's and OpenAI's words, a closed port.
Every wait is bounded by tiny timeouts and a tiny retry cap, and what a test bounds it counts
(requests, retries, waits asked), never the time it took; the real server's tests are in
tests/realserver/."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from conftest import CASE3
from ctx_run import ctx, one_line
from loopback import JSONHandler, QuietServer

from otaku_ctx.backend import (
    Backend,
    BackendError,
    BadReply,
    BadURL,
    ContextTooLong,
    FormatRefused,
    KeyMissing,
    ModelNotFound,
    Refused,
    Retry,
    ServerBusy,
    ServerError,
    TimedOut,
    Unreachable,
)
from otaku_ctx.backend.servers import listed_as
from otaku_ctx.backend.transport import retry_after
from otaku_ctx.status import ExitStatus

Responder = Callable[[BaseHTTPRequestHandler], None]
MESSAGES = [{"role": "user", "content": "Say hello."}]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


class StandIn(QuietServer):
    """Answers each request with the next responder of its script (a 500 when it runs out)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: deque[Responder] = deque()
        self.seen: list[Seen] = []
        self.answered = 0  # the requests whose responder has returned (a stall's has not)
        self.released = threading.Event()  # ends every stall

    def answer(self, *responders: Responder) -> StandIn:
        self.script.extend(responders)
        return self


class _Handler(JSONHandler):
    server: StandIn

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.seen.append(Seen(self.command, self.path, headers, body))
        script = self.server.script
        (script.popleft() if script else reply(500, {"error": "unscripted request"}))(self)
        self.server.answered += 1

    do_GET = do_POST = _any


def reply(
    status: int, body: object, headers: dict[str, str] | None = None, kind: str = "application/json"
) -> Responder:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    return respond


def raw(data: bytes) -> Responder:
    """Bytes as they are, then the connection closes."""

    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(data)
        handler.wfile.flush()
        handler.close_connection = True

    return respond


def stall(handler: BaseHTTPRequestHandler) -> None:
    """Never answer (until the test ends, or for 60 s: a hang guard)."""
    handler.server.released.wait(60)  # type: ignore[attr-defined]


def hang_up(handler: BaseHTTPRequestHandler) -> None:
    """Close the connection without a word."""
    handler.close_connection = True
    handler.connection.shutdown(socket.SHUT_RDWR)


def completion(text: str = "Hello!", finish: str = "stop", usage: dict | None = None) -> Responder:
    body = {
        "object": "chat.completion",
        "model": "smol",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": usage if usage is not None else {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    return reply(200, body)


@pytest.fixture
def server() -> Iterator[StandIn]:
    # It checks for `stop` every 5 ms, not the default 50: each of this file's ~100 tests stops one.
    stand_in = StandIn().start(poll=0.005)
    yield stand_in
    stand_in.released.set()
    stand_in.stop()


@pytest.fixture
def waits() -> list[float]:
    return []


@pytest.fixture
def backend(server: StandIn, waits: list[float]) -> Backend:
    """A client with tiny timeouts; its retries record their waits instead of sleeping."""
    return Backend(server.url, "smol", timeout=0.5, connect_timeout=0.5, retry=Retry(cap=0.2, sleep=waits.append))


def chat(backend: Backend, **kwargs: object):
    return backend.chat(MESSAGES, max_tokens=16, temperature=0.2, **kwargs)  # type: ignore[arg-type]


# a reply ----------------------------------------------------------------------------------------


def test_a_chat_completion(server: StandIn, backend: Backend) -> None:
    server.answer(completion("Hello there.", "length"))
    answer = chat(backend, extra={"repeat_penalty": 1.1, "stream": True})
    assert (answer.text, answer.finish_reason, answer.cut_off) == ("Hello there.", "length", True)
    assert (answer.prompt_tokens, answer.completion_tokens, answer.model) == (12, 3, "smol")
    (request,) = server.seen
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    sent = request.json()
    assert sent == {
        "model": "smol",
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0.2,
        "stream": False,  # extra cannot turn streaming on: the client reads whole replies
        "repeat_penalty": 1.1,
    }
    assert request.headers["user-agent"].startswith("otaku-ctx/")
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers


def test_usage_is_optional(server: StandIn, backend: Backend) -> None:
    server.answer(completion(usage={}))
    answer = chat(backend)
    assert (answer.prompt_tokens, answer.completion_tokens) == (None, None)


def test_response_format_is_sent(server: StandIn, backend: Backend) -> None:
    server.answer(completion('{"title": "x"}'))
    schema = {"type": "json_schema", "json_schema": {"name": "scene", "schema": {"type": "object"}}}
    chat(backend, response_format=schema)
    assert server.seen[0].json()["response_format"] == schema


def test_the_key_comes_from_the_variable_named(server: StandIn, waits, monkeypatch) -> None:
    monkeypatch.setenv("OTAKU_TEST_KEY", "sk-secret")
    backend = Backend(server.url, "smol", api_key_env="OTAKU_TEST_KEY", retry=Retry(sleep=waits.append))
    server.answer(completion(), reply(401, {"error": {"message": "Invalid API Key", "type": "authentication_error"}}))
    chat(backend)
    assert server.seen[0].headers["authorization"] == "Bearer sk-secret"
    with pytest.raises(Refused) as refused:
        chat(backend)
    assert "check the API key in $OTAKU_TEST_KEY" in str(refused.value)
    assert "sk-secret" not in str(refused.value)


def test_a_variable_named_but_not_set(server: StandIn, monkeypatch) -> None:
    monkeypatch.delenv("OTAKU_TEST_KEY", raising=False)
    with pytest.raises(KeyMissing, match=r"\$OTAKU_TEST_KEY is not set"):
        Backend(server.url, "smol", api_key_env="OTAKU_TEST_KEY")
    assert not server.seen


@pytest.mark.parametrize("url", ["127.0.0.1:8080/v1", "ftp://host/v1", "http:///v1", "http://h/v1?x=1"])
def test_not_a_base_url(url: str) -> None:
    with pytest.raises(BackendError, match="not a server's base URL"):
        Backend(url, "smol")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999/v1", "the port 99999 is not from 1 to 65535"),
        ("http://127.0.0.1:0/v1", "the port 0 is not from 1 to 65535"),
        ("http://127.0.0.1:" + "9" * 5000 + "/v1", "the port 99999999999999999999… is not from 1 to 65535"),
        ("http://127.0.0.1:abc/v1", "the port 'abc' is not a number"),
        ("http://[::1/v1", "a host in [brackets] that is not an IPv6 address"),
        ("http://" + "a" * 64 + ".example/v1", "a host name with a label over 63 characters"),
        ("http://a..example/v1", "a host name with an empty label"),
        ("http://" + ".".join(["a" * 60] * 5) + "/v1", "a host name of over 253 characters"),
        ("http://127.0.0.1:8080/v 1", "a space or a control character in it"),
    ],
)
def test_a_url_no_request_can_be_sent_to(url: str, problem: str) -> None:
    """Refused when the client is made, with what is wrong: never a ValueError or UnicodeError
    from `urlsplit`, `.port` or the IDNA codec when the first request is sent."""
    with pytest.raises(BadURL) as error:
        Backend(url, "smol")
    assert f"not a server's base URL ({problem}" in str(error.value)
    assert "\n" not in str(error.value) and len(str(error.value)) < 400
    assert error.value.exit_code == ExitStatus.ERROR


def test_a_path_that_is_not_ascii_is_sent_percent_encoded(server: StandIn, waits) -> None:
    backend = Backend(server.url + "/café", "smol", retry=Retry(sleep=waits.append))
    server.answer(completion())
    chat(backend)
    assert server.seen[0].path == "/v1/caf%C3%A9/chat/completions"


def test_credentials_in_the_url_are_never_shown(server: StandIn, waits) -> None:
    """`user:password@` is no part of any message: the URL asked is shown without it."""
    with_password = server.url.replace("http://", "http://ilya:hunter2@")
    backend = Backend(with_password, "smol", retry=Retry(attempts=0, sleep=waits.append))
    assert backend.url == server.url
    server.answer(reply(500, {"error": "boom"}))
    with pytest.raises(ServerError) as error:
        chat(backend)
    assert str(error.value).startswith(f"{server.url}/chat/completions: 500 ")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: unreachable
    nobody = Backend(f"http://ilya:hunter2@127.0.0.1:{port}/v1", "smol", retry=Retry(attempts=0))
    with pytest.raises(Unreachable) as lost:
        chat(nobody)
    with pytest.raises(BadURL) as bad:
        Backend(with_password.replace("/v1", ":99999/v1"), "smol")
    for shown in (error.value, lost.value, bad.value):
        assert "hunter2" not in str(shown) and "ilya" not in str(shown)


# what is retried, and how long it waits ---------------------------------------------------------


def test_a_stall_times_out_and_is_not_retried(server: StandIn, backend: Backend, waits) -> None:
    server.answer(stall)
    with pytest.raises(TimedOut, match="no reply within 0.5 s") as error:
        chat(backend)
    assert server.answered == 0  # the client gave up while the server still held the request
    assert len(server.seen) == 1 and waits == []
    assert error.value.exit_code == ExitStatus.ERROR


def test_429_honours_retry_after_up_to_the_cap(server: StandIn, backend: Backend, waits) -> None:
    busy = {"error": {"message": "Too many requests", "type": "rate_limit_error"}}
    server.answer(reply(429, busy, {"Retry-After": "120"}), reply(429, busy, {"Retry-After": "0.05"}), completion())
    assert chat(backend).text == "Hello!"
    assert waits == [0.2, 0.05]  # 120 s asked, capped at 0.2; 0.05 s asked, given
    assert len(server.seen) == 3


def test_the_wait_is_real(server: StandIn) -> None:
    """The retry sleeps by default (`time.sleep`), between the two requests, for what
    Retry-After asks, capped: 3600 s asked, 0.2 s slept."""
    assert Retry().sleep is time.sleep
    slept: list[tuple[float, int]] = []  # each wait asked, and the requests the server had seen by then

    def sleep(seconds: float) -> None:
        slept.append((seconds, len(server.seen)))
        time.sleep(min(seconds, 60))  # a hang guard: a cap not applied fails below, a minute on

    backend = Backend(server.url, "smol", timeout=1, retry=Retry(cap=0.2, sleep=sleep))
    server.answer(reply(429, {"error": "slow down"}, {"Retry-After": "3600"}), completion())
    assert chat(backend).text == "Hello!"
    assert slept == [(0.2, 1)]
    assert len(server.seen) == 2


def test_retry_after_as_an_http_date(server: StandIn, backend: Backend, waits) -> None:
    server.answer(reply(503, {"error": "loading"}, {"Retry-After": formatdate(time.time() + 30, usegmt=True)}))
    server.answer(completion())
    chat(backend)
    assert waits == [0.2]


def test_retry_after_is_read_in_seconds_or_as_a_date() -> None:
    now = 1_800_000_000.0
    assert retry_after("7", now) == 7.0
    assert retry_after(" 1.5 ", now) == 1.5
    assert retry_after(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert retry_after(formatdate(now - 30, usegmt=True), now) == 0.0  # a date gone by: now
    assert retry_after("Wed, 21 Oct 2015 07:28:00", now) == 0.0  # no zone: GMT
    assert retry_after("-5", now) == 0.0
    assert retry_after("soon", now) is None and retry_after(None, now) is None and retry_after("", now) is None


def test_503_then_success(server: StandIn, backend: Backend, waits) -> None:
    loading = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    server.answer(reply(503, loading), completion("ready"))
    assert chat(backend).text == "ready"
    assert waits == [0.2]  # backoff 1 s, capped at 0.2
    assert len(server.seen) == 2


def test_backoff_doubles_without_retry_after(server: StandIn, waits) -> None:
    backend = Backend(server.url, "smol", retry=Retry(backoff=0.01, sleep=waits.append))
    server.answer(*[reply(503, {"error": "busy"})] * 4)
    with pytest.raises(ServerBusy, match=r"503 Service Unavailable: busy \(after 3 retries\)") as error:
        chat(backend)
    assert waits == [0.01, 0.02, 0.04]
    assert len(server.seen) == 4  # the first try and three retries
    assert "send fewer requests at once" in str(error.value)


def test_500_is_not_retried(server: StandIn, backend: Backend, waits) -> None:
    server.answer(reply(500, {"error": {"message": "CUDA out of memory", "type": "server_error"}}), completion())
    with pytest.raises(ServerError, match="500 Internal Server Error: CUDA out of memory: see the server's log"):
        chat(backend)
    assert len(server.seen) == 1 and waits == []


def test_a_dropped_connection_is_retried(server: StandIn, backend: Backend, waits) -> None:
    server.answer(hang_up, completion("after all"))
    assert chat(backend).text == "after all"
    assert len(server.seen) == 2 and waits == [0.2]


def test_connection_refused_is_unreachable(waits, monkeypatch) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    backend = Backend(f"http://127.0.0.1:{port}/v1", "smol", retry=Retry(backoff=0.01, sleep=waits.append))
    connects: list[tuple[str, int]] = []
    real = socket.create_connection

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        connects.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", connect)
    with pytest.raises(Unreachable) as error:
        chat(backend)
    assert str(error.value) == (
        f"http://127.0.0.1:{port}/v1/chat/completions: connection refused (after 3 retries): "
        "start the server, or check the URL"
    )
    assert connects == [("127.0.0.1", port)] * 4  # the first try and three retries, all refused
    assert waits == [0.01, 0.02, 0.04]  # the only waits: none on a connect timeout


def test_an_unknown_host_is_unreachable(waits, monkeypatch) -> None:
    def no_such_host(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)  # no resolver is asked: no wait on one
    backend = Backend("http://no-such-host.invalid/v1", "smol", retry=Retry(attempts=0, sleep=waits.append))
    with pytest.raises(Unreachable, match="cannot resolve the host 'no-such-host.invalid'"):
        chat(backend)


# replies that are not what the API sends --------------------------------------------------------


def test_malformed_json(server: StandIn, backend: Backend) -> None:
    server.answer(reply(200, b'{"choices": [{"message": '))
    with pytest.raises(BadReply, match="a reply that is not JSON"):
        chat(backend)


def test_a_truncated_body(server: StandIn, backend: Backend, waits) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    server.answer(raw(head + b'{"choices": [{"message": {"content": "Hel'))
    with pytest.raises(BadReply, match=r"the reply was cut short \(41 of 200 bytes\)"):
        chat(backend)
    assert waits == []


def test_a_truncated_chunked_body(server: StandIn, backend: Backend) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    server.answer(raw(head + b"40\r\n" + b'{"choices": ['))
    with pytest.raises(BadReply, match="cut short"):
        chat(backend)


def test_not_http_at_all(server: StandIn, backend: Backend) -> None:
    server.answer(raw(b"SSH-2.0-OpenSSH_9.2\r\n"))
    with pytest.raises(BadReply, match="not an HTTP reply"):
        chat(backend)


def test_a_web_page(server: StandIn, backend: Backend) -> None:
    server.answer(reply(200, b"<!doctype html><title>llama.cpp</title>", kind="text/html; charset=utf-8"))
    with pytest.raises(BadReply, match="a reply of type text/html, not JSON: check that the URL is the server's"):
        chat(backend)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"choices": []}, "no choices"),
        ({"id": "x"}, "no choices"),
        ([1, 2], "not a JSON object"),
        ({"choices": [{"finish_reason": "stop"}]}, "has no message"),
        ({"choices": [{"message": {"content": 7}}]}, "content is not text"),
    ],
)
def test_a_reply_without_a_message(server: StandIn, backend: Backend, body: object, problem: str) -> None:
    server.answer(reply(200, body))
    with pytest.raises(BadReply, match=problem):
        chat(backend)


def test_content_parts_and_null_content(server: StandIn, backend: Backend) -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    server.answer(reply(200, {"choices": [{"message": {"content": parts}}]}))
    server.answer(reply(200, {"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}))
    assert chat(backend).text == "Hello"
    assert chat(backend).text == ""


def test_an_error_in_a_200(server: StandIn, backend: Backend) -> None:
    """Some gateways (OpenRouter) say an upstream error with status 200."""
    server.answer(reply(200, {"error": {"code": 502, "message": "upstream provider error"}}))
    with pytest.raises(ServerError, match="502: upstream provider error"):
        chat(backend)


def test_a_redirect_is_not_followed(server: StandIn, backend: Backend) -> None:
    server.answer(reply(307, b"", {"Location": "http://elsewhere.invalid/v1/chat/completions"}))
    with pytest.raises(ServerError, match="redirected to http://elsewhere.invalid/.*ctx follows no redirects"):
        chat(backend)
    assert len(server.seen) == 1


# the errors a server explains -------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_refused_without_a_key(server: StandIn, backend: Backend, status: int) -> None:
    server.answer(reply(status, {"error": {"message": "Invalid API Key", "type": "authentication_error"}}))
    with pytest.raises(Refused, match="the server wants an API key: name the environment variable"):
        chat(backend)


@pytest.mark.parametrize(
    "body",
    [
        {"error": 'model "smol" not found, try pulling it first'},  # Ollama
        {"error": {"message": "The model `smol` does not exist.", "type": "NotFoundError", "code": 404}},  # vLLM
        {
            "error": {
                "message": "The model 'smol' does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
        },  # OpenAI
    ],
)
def test_a_model_not_found(server: StandIn, backend: Backend, body: dict) -> None:
    server.answer(reply(404, body))
    with pytest.raises(ModelNotFound, match=r"check the model name \('smol' was asked for\)"):
        chat(backend)


def test_a_404_that_names_no_model_is_the_wrong_url(server: StandIn, backend: Backend) -> None:
    server.answer(reply(404, b"File Not Found", kind="text/plain"))
    with pytest.raises(ServerError, match="404 Not Found: File Not Found: check the URL: .* usually ending in /v1"):
        chat(backend)


def test_context_too_long_in_llama_cpp_words(server: StandIn, backend: Backend) -> None:
    body = {
        "error": {
            "code": 400,
            "message": "request (3031 tokens) exceeds the available context size (2048 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 3031,
            "n_ctx": 2048,
        }
    }
    server.answer(reply(400, body))
    with pytest.raises(ContextTooLong) as error:
        chat(backend)
    assert (error.value.prompt_tokens, error.value.window, error.value.status) == (3031, 2048, 400)
    assert str(error.value).endswith("send a shorter prompt, or start the server with a larger context")


def test_context_too_long_in_openai_words(server: StandIn, backend: Backend) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in "
            "9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    server.answer(reply(400, body))
    with pytest.raises(ContextTooLong) as error:
        chat(backend)
    assert (error.value.prompt_tokens, error.value.window) == (None, 8192)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"error": {"message": 'response_format type must be one of "text" or "json_object", but got: x'}}),
        (500, {"detail": "Unknown response_format type: json_schema"}),  # llama-cpp-python's server
        (422, {"detail": [{"loc": ["body", "response_format", "type"], "msg": "unexpected value"}]}),
    ],
)
def test_a_refused_response_format(server: StandIn, backend: Backend, status: int, body: dict) -> None:
    server.answer(reply(status, body))
    with pytest.raises(FormatRefused):
        chat(backend, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {}}})


def test_a_500_naming_a_schema_without_one_asked_is_a_server_error(server: StandIn, backend: Backend) -> None:
    server.answer(reply(500, {"detail": "Unknown response_format type: json_schema"}))
    with pytest.raises(ServerError):
        chat(backend)


def test_every_message_is_one_line_with_the_url(server: StandIn, backend: Backend) -> None:
    server.answer(reply(500, {"error": {"message": "line one\nline two\n" + "x" * 1000}}))
    with pytest.raises(ServerError) as error:
        chat(backend)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{server.url}/chat/completions: 500 ")
    assert "line one line two" in message and len(message) < 400


# the window and the tokenizer -------------------------------------------------------------------

NOT_FOUND = reply(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})


def test_the_window_of_vllm(server: StandIn, backend: Backend) -> None:
    models = {
        "object": "list",
        "data": [{"id": "other", "max_model_len": 4096}, {"id": "smol", "max_model_len": 32768}],
    }
    server.answer(reply(200, models))
    assert backend.window() == 32768
    assert backend.window() == 32768  # asked once
    assert [(s.method, s.path) for s in server.seen] == [("GET", "/v1/models")]


def test_the_window_of_llama_cpp(server: StandIn, backend: Backend) -> None:
    models = {"object": "list", "data": [{"id": "m.gguf", "meta": {"n_ctx_train": 8192}}]}
    props = {"default_generation_settings": {"n_ctx": 2048, "params": {}}, "total_slots": 2}
    server.answer(reply(200, models), reply(200, props))
    assert backend.window() == 2048
    assert [(s.method, s.path) for s in server.seen] == [("GET", "/v1/models"), ("GET", "/props")]


# Ollama: what /api/show says of Llama 3.1 (trained for 131,072) with no num_ctx set, and the
# window /api/ps says it is loaded with (Ollama's default below 24 GiB of VRAM)
LLAMA31 = {
    "parameters": 'stop "<|eot_id|>"',
    "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
}


def running(name: str, window: object) -> dict[str, object]:
    """A model as Ollama's `/api/ps` lists it (`name` and `model` both `NAME:tag`)."""
    details = {"format": "gguf", "family": "llama", "parameter_size": "8.0B", "quantization_level": "Q4_K_M"}
    return {"name": name, "model": name, "size": 6654289920, "digest": "46e0c10c039e", "details": details,
            "expires_at": "2026-08-21T18:53:22Z", "size_vram": 6654289920, "context_length": window}  # fmt: skip


def ollama_window(server: StandIn, backend: Backend, show: dict, *after: Responder) -> int | None:
    """The window asked of a stand-in Ollama: its `/v1/models` has no `max_model_len`, it has no
    `/props`, its `/api/show` says `show`, then `after` answers (its `/api/ps`)."""
    server.answer(reply(200, {"object": "list", "data": [{"id": "smol:latest"}]}), NOT_FOUND, reply(200, show), *after)
    return backend.window()


@pytest.mark.parametrize(
    ("models", "window"),
    [
        ([running("smol:latest", 4096)], 4096),  # Ollama's default: what it loaded, not the 131,072 trained
        ([running("llama3.1:latest", 65536), running("smol:latest", 4096)], 4096),  # its own, by name
        ([running("smol:latest", 32768)], 32768),  # OLLAMA_CONTEXT_LENGTH, or a GPU of 24 GiB or more
        ([running("smol:latest", 262144)], 131072),  # never past what it was trained for
    ],
)
def test_the_window_of_ollama_is_the_one_it_loaded(
    server: StandIn, backend: Backend, models: list[dict], window: int
) -> None:
    assert ollama_window(server, backend, LLAMA31, reply(200, {"models": models})) == window
    show, ps = server.seen[-2:]
    assert (show.method, show.path, show.json()) == ("POST", "/api/show", {"model": "smol"})
    assert (ps.method, ps.path) == ("GET", "/api/ps")


@pytest.mark.parametrize(
    ("parameters", "window"),
    [
        ("stop <|im_end|>\nnum_ctx 16384", 16384),
        ("num_ctx 262144", 131072),  # Ollama loads it at no more than it was trained for
    ],
)
def test_num_ctx_in_the_model_s_parameters_wins(
    server: StandIn, backend: Backend, parameters: str, window: int
) -> None:
    """What every request loads the model with: whatever /api/ps says now, it is asked no more."""
    assert ollama_window(server, backend, {**LLAMA31, "parameters": parameters}) == window
    assert server.seen[-1].path == "/api/show"


@pytest.mark.parametrize(
    ("models", "trained", "window"),
    [
        ([], 131072, 4096),
        ([running("llama3.1:latest", 65536)], 131072, 4096),  # another model loaded, not this one
        ([running("smol:q8_0", 65536)], 131072, 4096),  # another tag: only `:latest` is Ollama's default
        ([], 2048, 2048),  # a model trained for less than Ollama's default
    ],
)
def test_a_model_not_loaded_is_taken_at_ollama_s_default(
    server: StandIn, backend: Backend, models: list[dict], trained: int, window: int
) -> None:
    """Ollama loads it at its default, 4,096 below 24 GiB of VRAM, unless OLLAMA_CONTEXT_LENGTH,
    which ctx cannot read, says more: too small a window only makes ctx summarise earlier."""
    show = {"parameters": "", "model_info": {"general.architecture": "qwen2", "qwen2.context_length": trained}}
    assert ollama_window(server, backend, show, reply(200, {"models": models})) == window


@pytest.mark.parametrize(
    "answer",
    [
        reply(200, b"not json"),
        reply(200, b"[" * 5000 + b"]" * 5000),  # nested past reading: no crash, no BadReply
        reply(200, b"<html>ps</html>", kind="text/html"),
        reply(200, [running("smol:latest", 65536)]),
        reply(200, {"models": "smol:latest"}),
        reply(200, {"models": [None, 3, "smol:latest", {"name": 7, "model": ["smol:latest"]}]}),
        reply(200, {"models": [running("smol:latest", "65536")]}),
        reply(200, {"models": [running("smol:latest", -1)]}),
        reply(200, {"models": [running("smol:latest", True)]}),
        reply(200, {"models": [running("smol:latest", 0)]}),
        reply(200, {"models": [{"name": "smol:latest"}]}),  # an Ollama before /api/ps said the window
        NOT_FOUND,
        reply(500, {"error": "ps exploded"}),
    ],
)
def test_a_garbled_ps_says_nothing(server: StandIn, backend: Backend, answer: Responder) -> None:
    assert ollama_window(server, backend, LLAMA31, answer) == 4096


@pytest.mark.parametrize(
    ("show", "ps"),
    [
        (LLAMA31, {"models": [running("smol:latest", 10**18)]}),  # loaded at a window past any model's
        ({**LLAMA31, "parameters": "num_ctx 1000000000000000000"}, None),  # num_ctx past any model's
    ],
)
def test_an_ollama_window_past_any_model_s_is_refused_not_clamped(
    server: StandIn, backend: Backend, show: dict, ps: dict | None
) -> None:
    """As llama.cpp's would be: 10^18 is no window, not the 131,072 it was trained for (issue 45)."""
    with pytest.raises(BadReply, match="past any model's"):
        ollama_window(server, backend, show, *([reply(200, ps)] if ps else []))


@pytest.mark.parametrize("trained", ["131072", None, 0, -1])
def test_an_unreadable_trained_length_still_asks_what_ollama_loaded(
    server: StandIn, backend: Backend, trained: object
) -> None:
    """A `*.context_length` that is no number is no reason to take the default: /api/ps says the
    window the model runs at."""
    show = {"parameters": "", "model_info": {"general.architecture": "llama", "llama.context_length": trained}}
    assert ollama_window(server, backend, show, reply(200, {"models": [running("smol:latest", 8192)]})) == 8192
    assert server.seen[-1].path == "/api/ps"


def test_ollama_s_window_is_asked_again_each_time_so_a_reload_is_seen(server: StandIn, backend: Backend) -> None:
    """Ollama loads a model again at another window whenever a request's num_ctx differs: a
    reload from 32,768 to 2,048 is the next turn's window, not the one asked first (issue 45)."""
    assert ollama_window(server, backend, LLAMA31, reply(200, {"models": [running("smol:latest", 32768)]})) == 32768
    server.answer(reply(200, LLAMA31), reply(200, {"models": [running("smol:latest", 2048)]}))
    assert backend.window() == 2048
    assert [s.path for s in server.seen[-2:]] == ["/api/show", "/api/ps"]


def test_an_api_show_that_names_no_window_is_not_ollama_s(server: StandIn, backend: Backend) -> None:
    """KoboldCpp answers an Ollama `/api/show` with nothing in it: its own endpoint says its window."""
    kobold_show = {
        "parameters": "temperature 1.0",
        "license": "Ollama Emulation. Running on KoboldCpp",
        "model_info": {},
    }
    assert ollama_window(server, backend, kobold_show, reply(200, {"value": 8192})) == 8192
    assert server.seen[-1].path == "/api/extra/true_max_context_length"


def test_no_window_said(server: StandIn, backend: Backend) -> None:
    """None, and remembered: a server that says no window is asked its four endpoints once."""
    server.answer(NOT_FOUND, reply(200, b"<html>", kind="text/html"), NOT_FOUND, NOT_FOUND)
    assert backend.window() is None
    assert backend.window() is None
    assert [s.path for s in server.seen] == ["/v1/models", "/props", "/api/show", "/api/extra/true_max_context_length"]


def test_a_window_not_said_for_a_refusal_is_asked_again(server: StandIn, backend: Backend) -> None:
    """Only "none of them says" is remembered: a probe that raised said nothing yet."""
    server.answer(reply(401, {"error": "unauthorized"}))
    with pytest.raises(Refused):
        backend.window()
    server.answer(NOT_FOUND, reply(200, {"default_generation_settings": {"n_ctx": 2048}}))
    assert backend.window() == 2048


def test_the_window_probe_still_needs_the_key(server: StandIn, backend: Backend) -> None:
    server.answer(reply(401, {"error": "unauthorized"}))
    with pytest.raises(Refused):
        backend.window()


def test_tokenize(server: StandIn, backend: Backend) -> None:
    server.answer(reply(200, {"tokens": [19556, 2067, 108]}))
    assert backend.tokenize("Hello <|im_start|>") == [19556, 2067, 108]
    (ask,) = server.seen
    assert (ask.path, ask.json()) == (
        "/tokenize",
        {"content": "Hello <|im_start|>", "add_special": False, "parse_special": False},
    )


def test_no_tokenizer_is_asked_for_once(server: StandIn, backend: Backend) -> None:
    server.answer(NOT_FOUND)
    assert backend.tokenize("a") is None
    assert backend.tokenize("b") is None
    assert len(server.seen) == 1


def test_requests_stay_on_the_url_named(server: StandIn, backend: Backend) -> None:
    """Every request goes to the host and port named, under its path (or beside /v1)."""
    base = Backend(server.url.replace("/v1", "/llm/v1"), "smol", retry=Retry(sleep=lambda _: None))
    server.answer(NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, NOT_FOUND, completion())
    base.window()
    base.tokenize("x")
    base.chat(MESSAGES, max_tokens=4, temperature=0)
    assert [s.path for s in server.seen] == [
        "/llm/v1/models",
        "/llm/props",
        "/llm/api/show",
        "/llm/api/extra/true_max_context_length",
        "/llm/tokenize",
        "/llm/v1/chat/completions",
    ]
    assert {s.headers["host"] for s in server.seen} == {f"127.0.0.1:{server.server_address[1]}"}


# the model list ---------------------------------------------------------------------------------


def test_the_models_the_server_lists_asked_once(server: StandIn, backend: Backend) -> None:
    listing = {
        "object": "list",
        "data": [{"id": "smol", "aliases": ["smol", "tiny", 3]}, {"id": "big", "object": "model"}, {"id": "smol"}, {}],
    }
    server.answer(reply(200, listing))
    assert backend.models() == ("smol", "tiny", "big") and backend.models() == ("smol", "tiny", "big")
    assert [(s.method, s.path) for s in server.seen] == [("GET", "/v1/models")]


@pytest.mark.parametrize(
    "answer",
    [
        reply(404, {"error": "no such endpoint"}),
        reply(200, {"object": "list", "data": []}),  # a server with nothing loaded: a chat will say
        reply(200, {"object": "list"}),
        reply(200, [1, 2]),
        reply(200, b"<html>models</html>", kind="text/html"),
    ],
)
def test_a_server_with_no_model_list_has_none(server: StandIn, backend: Backend, answer: Responder) -> None:
    server.answer(answer)
    assert backend.models() is None


def test_a_model_list_behind_a_key_is_refused_as_a_chat_would_be(server: StandIn, backend: Backend) -> None:
    server.answer(reply(401, {"error": {"message": "no key"}}))
    with pytest.raises(Refused):
        backend.models()


@pytest.mark.parametrize(
    ("name", "ids", "named"),
    [
        ("qwen2.5-7b", ("qwen2.5-7b", "llama"), "qwen2.5-7b"),
        # llama.cpp lists the -m it was started with: the file, with or without its extension
        ("model", ("model.gguf",), "model.gguf"),
        ("SmolLM2.Q4_1", ("/c/smollm2/SmolLM2.Q4_1.gguf",), "/c/smollm2/SmolLM2.Q4_1.gguf"),
        ("SmolLM2.Q4_1.gguf", ("C:\\models\\SmolLM2.Q4_1.gguf",), "C:\\models\\SmolLM2.Q4_1.gguf"),
        ("Mistral-7B", ("koboldcpp/Mistral-7B",), "koboldcpp/Mistral-7B"),  # KoboldCpp
        ("llama3.1", ("llama3.1:latest", "phi3:mini"), "llama3.1:latest"),  # Ollama's default tag
        ("smollm2", ("/c/smollm2/SmolLM2.Q4_1.gguf",), None),  # a folder is not the model
        ("smollm2-135m-instruct.q4_1", ("SmolLM2-135M-Instruct.Q4_1.gguf",), None),  # ids are case-sensitive
        ("llama-3.1-8b-instruct", ("meta-llama/llama-3.1-8b-instruct",), None),  # a hosted API's id is whole
        ("phi3", ("phi3:mini",), None),  # only :latest is Ollama's default
        ("local", ("model.gguf",), None),
    ],
)  # fmt: skip
def test_which_listed_model_a_name_names(name: str, ids: tuple[str, ...], named: str | None) -> None:
    assert listed_as(name, ids) == named


# -- #14: a server URL no request can be sent to ---------------------------------------------

BAD_URLS = {
    "a port out of range": ("http://127.0.0.1:99999/v1", "the port 99999 is not from 1 to 65535"),
    "a port that is not a number": ("http://127.0.0.1:abc/v1", "the port 'abc' is not a number"),
    "a port of 5,000 digits": ("http://127.0.0.1:" + "9" * 5000 + "/v1", "the port 99999999999999999999… is not"),
    "a broken IPv6 host": ("http://[::1/v1", "a host in [brackets] that is not an IPv6 address"),
    "an IPv6 host that is not one": ("http://[zz]/v1", "a host in [brackets] that is not an IPv6 address"),
    "a host label over 63 characters": (
        "http://" + "a" * 64 + ".example/v1",
        "a host name with a label over 63 characters",
    ),
    "an empty host label": ("http://a..example/v1", "a host name with an empty label"),
}


def _summarize_url(url: str, folder: Path) -> list[str]:
    return ["summarize", str(CASE3), "--url", url, "--model", "m"]


def _build_server(url: str, folder: Path) -> list[str]:
    return ["build", str(CASE3), "--tokenizer", "server", "--server", url]


def _config(section: str, key: str) -> Callable[[str, Path], list[str]]:
    def argv(url: str, folder: Path) -> list[str]:
        config = folder / "config.toml"
        config.write_text(f"[{section}]\n{key} = {json.dumps(url)}\n", encoding="utf-8")
        if section == "summarize":
            return ["summarize", str(CASE3), "--model", "m", "--config", str(config)]
        return ["build", str(CASE3), "--tokenizer", "server", "--config", str(config)]

    return argv


# where a server URL is given, as the command line gives it
URL_SOURCES: dict[str, Callable[[str, Path], list[str]]] = {
    "--url": _summarize_url,
    "--server": _build_server,
    "[summarize] url": _config("summarize", "url"),
    "[model] server": _config("model", "server"),
}


@pytest.mark.parametrize("source", URL_SOURCES)
@pytest.mark.parametrize("hostile", BAD_URLS)
def test_a_server_url_no_request_can_be_sent_to(source: str, hostile: str, tmp_path: Path) -> None:
    """One line naming the URL and what is wrong with it, before any request, a usage error
    (exit 2) named by its setting: never the ValueError or UnicodeError that `urlsplit`, its
    `port` and IDNA raise."""
    url, problem = BAD_URLS[hostile]
    code, out, err = ctx(*URL_SOURCES[source](url, tmp_path))
    assert (code, out) == (ExitStatus.USAGE, "")
    assert one_line(err).startswith(("ctx: --url: summarize.url: ", "ctx: --server: model.server: "))
    assert f": not a server's base URL ({problem}" in one_line(err)
    assert err.endswith("): give one like http://127.0.0.1:8080/v1\n") and len(err) < 400


@pytest.mark.parametrize("source", URL_SOURCES)
def test_a_password_in_a_server_url_is_never_shown(source: str, tmp_path: Path) -> None:
    """Neither in the URL's own error nor in a failure to reach it."""
    bad = "http://ilya:hunter2@127.0.0.1:99999/v1"
    code, _, err = ctx(*URL_SOURCES[source](bad, tmp_path))
    assert code == ExitStatus.USAGE and ": http://127.0.0.1:99999/v1: not a server's" in one_line(err)
    assert "hunter2" not in err and "ilya" not in err
