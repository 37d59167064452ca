"""What reaches `ctx serve`'s log (issue 35's #13-#15): what a backend says, made visible; a
flood of malformed requests, a few lines and no traceback (the hush); a backend's error that
quotes the prompt, cut from it."""

from __future__ import annotations

import json
import logging
import socket
from http.server import BaseHTTPRequestHandler

import openai
import pytest
import raw_backend
from raw_backend import RawBackend, address, event, reply, stream_head, streamed
from test_serve import chat

from otaku_ctx.serve.listen import Running
from otaku_ctx.serve.logs import Hush, Visible

raw, serving = raw_backend.raw, raw_backend.serving  # the stand-in's fixtures, by their names


# -- #13, #15: what reaches the log -------------------------------------------------------------


def logged(records: list[logging.LogRecord], debug: bool = False) -> str:
    formatter, hush = Visible(debug), Hush()
    return "\n".join(formatter.format(r) for r in records if hush.filter(r))


def test_what_a_backend_says_reaches_the_log_visible(
    raw: RawBackend, serving: Running, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(handler: BaseHTTPRequestHandler) -> None:
        said = {"error": {"message": "model crashed \x1b]0;owned\x07\x1b[2J"}}
        reply(handler, 500, said, reason="Internal \x1b[31mError")

    raw.scenario = failing
    caplog.set_level(logging.INFO)
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="m", messages=chat(3))
    text = logged(caplog.records)
    assert "the backend failed" in text and "\\x1b" in text
    assert "\x1b" not in text and "\x07" not in text


def test_malformed_requests_leave_a_few_lines_and_no_traceback(
    serving: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    host, port = address(serving)
    for n in range(200):
        with socket.create_connection((host, port), timeout=5) as raw_socket:
            raw_socket.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: nope%d\r\n\r\n" % n)
            raw_socket.recv(1000)
    faults = [r for r in caplog.records if r.exc_info]
    assert len(faults) >= 200  # aiohttp logs each, with its traceback
    text = logged(caplog.records)
    assert "Traceback" not in text and len(text.splitlines()) <= 2 * 5 + 2  # hushed past five of a kind


def test_the_log_hushes_a_flood_and_says_how_many_it_left_out() -> None:
    now = [0.0]
    hush = Hush(most=3, window=60, clock=lambda: now[0])
    record = logging.LogRecord("otaku_ctx.serve", logging.WARNING, "", 0, "bad request from %s", ("x",), None)
    passed = [hush.filter(record) for _ in range(100)]
    assert passed.count(True) == 3
    now[0] = 61.0
    again = logging.LogRecord("otaku_ctx.serve", logging.WARNING, "", 0, "bad request from %s", ("y",), None)
    assert hush.filter(again) and "97 more like it left out" in again.getMessage()
    try:
        raise ValueError("line one\nline two \x1b[2J")
    except ValueError:
        import sys

        failed = logging.LogRecord("aiohttp.server", logging.ERROR, "", 0, "Error handling request", (), sys.exc_info())
    assert Visible().format(failed) == "ctx serve: Error handling request (ValueError: line one)"
    assert "Traceback" in Visible(debug=True).format(failed) and "\x1b" not in Visible(debug=True).format(failed)


def test_each_turns_line_is_written_however_many_turns_come() -> None:
    """The one line a turn is its record, not a fault: a hundred turns in a minute, a hundred lines
    (before, the sixth on was left out, a cancelled turn's line among them)."""
    from otaku_ctx.serve.record import EVERY

    hush = Hush(most=3, window=60, clock=lambda: 0.0)
    turns = [
        logging.LogRecord("otaku_ctx.serve", logging.INFO, "", 0, "chat %s · turn %d", ("c", n), None)
        for n in range(100)
    ]
    for record in turns:
        record.__dict__.update(EVERY)
    assert all(hush.filter(record) for record in turns)


def test_thirty_turns_played_in_seconds_each_leave_their_line(
    raw: RawBackend, serving: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 44: 30 turns of one chat played as fast as they come (a minute's worth and more)
    through serve, its log hushed as `ctx serve`'s is: 30 lines, each with the chat's length and
    the messages sent, in order — none left out."""
    raw.scenario = lambda handler: reply(handler, 200, {"choices": [{"message": {"role": "assistant",
                                                                               "content": "Yes."}}]})  # fmt: skip
    caplog.set_level(logging.INFO)
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    for n in range(30):
        client.chat.completions.create(model="m", messages=chat(20 + 2 * n))
    lines = [line for line in logged(caplog.records).splitlines() if " · turn " in line]
    turns = [int(line.split(" · turn ")[1].split(" ")[0]) for line in lines]
    assert turns == list(range(1, 31)), lines[:3]
    assert all(f"{20 + 2 * n} messages, " in line for n, line in enumerate(lines))


# -- #14: a backend's error that quotes the prompt -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_backend_error_quoting_the_prompt_is_cut_from_the_log(
    raw: RawBackend, serving: Running, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    messages = chat(3, frame="The secret of the lighthouse is the blue lamp in the cellar.")
    quoted = "failed to process the prompt: " + json.dumps(messages)[:400]

    def failing(handler: BaseHTTPRequestHandler) -> None:
        if stream:  # a stream that starts, then fails with the server's words cut off mid-event
            stream_head(handler, ("Connection", "close"))
            handler.wfile.write(event("Hi") + b"data: " + quoted.encode())
            return
        reply(handler, 500, {"error": {"message": quoted}})

    raw.scenario = failing
    caplog.set_level(logging.INFO)
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    with pytest.raises(openai.APIError):
        if stream:
            streamed(serving)
        else:
            client.chat.completions.create(model="m", messages=messages)
    text = logged(caplog.records)
    assert "the backend failed" in text
    assert "blue lamp" not in text and "Turn 1" not in text  # the chat's own words are not in the log
