"""`ctx serve` relaying a backend that misbehaves on cue (tests/raw_backend.py): every stream
ends, with an `error` event the OpenAI client reads as an APIError; what serve holds of a stream
is bounded, and its events are cut at their ends; a window past any model's is not believed; the
small points of llama.cpp's server's surface (charset, X-Accel-Buffering, error `param` and
`code`) are kept."""

from __future__ import annotations

import gzip
import http.client
import io
import json
import time
from http.server import BaseHTTPRequestHandler

import openai
import pytest
import raw_backend
from raw_backend import HI, RawBackend, address, event, reply, stream_head, streamed
from test_serve import chat

from otaku_ctx.serve import upstream
from otaku_ctx.serve.listen import Running

raw, serving = raw_backend.raw, raw_backend.serving  # the stand-in's fixtures, by their names


# -- #5, #6: every stream ends, with an error the client reads as one ----------------------------


def test_a_backend_that_breaks_its_chunked_encoding_ends_the_client_s_stream(raw: RawBackend, serving: Running) -> None:
    def broken(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler, ("Transfer-Encoding", "chunked"))
        first = event("Hello")
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(first), first))
        handler.wfile.flush()
        time.sleep(0.3)  # the good chunk read first, then the broken one
        handler.wfile.write(b"zz; not a chunk size\r\n")  # and the connection stays open
        handler.wfile.flush()
        time.sleep(8)

    raw.scenario = broken
    # the stream ends with serve's error event, not the client's timeout ("Request timed out")
    with pytest.raises(openai.APIError, match="the backend failed"):
        streamed(serving)


def test_a_backend_that_stops_mid_line_is_an_api_error_not_a_decode_error(raw: RawBackend, serving: Running) -> None:
    def cut(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler, ("Connection", "close"))
        handler.wfile.write(event("Hello") + b'data: {"choices": [{"index": 0, "del')
        handler.wfile.flush()
        handler.close_connection = True

    raw.scenario = cut
    with pytest.raises(openai.APIError, match="the backend failed"):
        streamed(serving)


# -- #9: what serve holds of a stream is bounded -------------------------------------------------


def test_an_event_with_no_end_is_an_error_past_its_bound(raw: RawBackend, serving: Running) -> None:
    def endless(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler, ("Connection", "close"))
        handler.wfile.write(b"data: ")
        for _ in range(40):  # 40 MiB of one line
            handler.wfile.write(b"x" * (1 << 20))

    raw.scenario = endless
    with pytest.raises(openai.APIError, match="server-sent event of over 1,048,576 bytes with no end"):
        streamed(serving)  # refused at the bound, not read to the line's 40 MiB


def test_a_compressed_stream_is_bounded_as_a_body_is(
    raw: RawBackend, serving: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream, "LIMIT", 1 << 20)
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb") as bomb:
        for _ in range(2000):  # 32 MiB of small events, some 100 KiB packed
            bomb.write(event("0" * 16) * 400)

    def gzipped(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler, ("Content-Encoding", "gzip"), ("Content-Length", str(len(packed.getvalue()))))
        handler.wfile.write(packed.getvalue())

    raw.scenario = gzipped
    host, port = address(serving)
    connection = http.client.HTTPConnection(host, port, timeout=20)
    connection.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": chat(3), "stream": True}),
                       {"Content-Type": "application/json"})  # fmt: skip
    answer = connection.getresponse()
    passed = answer.read()
    connection.close()
    assert len(passed) < 2 << 20 and b"a reply of over" in passed[-1000:]  # cut at the bound, said


# -- #16: a window past any model's ---------------------------------------------------------------


@pytest.mark.parametrize("window", [10**12, 2**63])
def test_a_window_past_any_model_s_is_the_server_s_error(raw: RawBackend, serving: Running, window: int) -> None:
    raw.window = window
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="m", messages=chat(3))
    assert refused.value.status_code == 502 and "past any model's" in refused.value.body["message"]  # type: ignore[index]


# -- the small points of llama.cpp's server's surface -------------------------------------------


def test_replies_keep_the_backend_s_charset_and_streams_are_not_buffered(raw: RawBackend, serving: Running) -> None:
    def whole(handler: BaseHTTPRequestHandler) -> None:
        reply(handler, 200, HI, "application/json; charset=utf-8")

    raw.scenario = whole
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    answer = client.chat.completions.with_raw_response.create(model="m", messages=chat(3))
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"

    def streaming(handler: BaseHTTPRequestHandler) -> None:
        stream_head(handler, ("Connection", "close"))
        handler.wfile.write(event("Hi") + b"data: [DONE]\n\n")

    raw.scenario = streaming
    streams = client.chat.completions.with_raw_response.create(model="m", messages=chat(3), stream=True)
    assert streams.headers["X-Accel-Buffering"] == "no"


def test_an_error_object_has_a_param_and_a_code(serving: Running) -> None:
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="m", messages=[])
    said = bad.value.body
    assert isinstance(said, dict) and "param" in said and said["code"] == "invalid_request"


def test_events_are_cut_at_their_ends_whatever_the_chunks() -> None:
    stream = event("Hel") + event("lo") + b"data: [DONE]\r\n\r\n"
    for size in (1, 2, 3, 7, len(stream)):  # every way the bytes may arrive
        events = upstream.Events("http://backend/v1")
        passed = b"".join(events.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        events.end()
        assert passed == stream
    half = upstream.Events("http://backend/v1")
    assert half.feed(b'data: {"choi') == b""
    with pytest.raises(upstream.BadReply, match="middle of a server-sent event"):
        half.end()
