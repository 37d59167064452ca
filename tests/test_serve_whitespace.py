"""Issue 48: ctx changes a request only where it assembles the prompt; no message text is trimmed
or re-spaced. Through `ctx serve` and a stand-in model server, each message's text arrives as it
was sent — trailing blank lines, leading spaces, CRLF — in a chat that fits whole and in one cut
to fit (the messages kept, each exact). The cause was the template engine's block edges
(tests/test_hbs.py: a value's own newlines are data, only the template's are layout)."""

from __future__ import annotations

import http.client
import json
from typing import Any

import test_serve
from test_serve import StandIn

from otaku_ctx.serve.listen import Running

stand_in, serving = test_serve.stand_in, test_serve.serving  # the fixtures, by their names

FRAME = {"role": "system", "content": "You keep the lighthouse.\n\n"}
#: the shapes a frontend's text comes in: a trailing blank line, leading spaces, CRLF, a leading
#: line break and a trailing space, one newline
SHAPES = ("{}\n\n", "  {}", "{}\r\n", "\n{} \n", "{}\n", "  {} \r\n\r\n")


def spaced_chat(n: int, words: int = 12) -> list[dict[str, Any]]:
    """The frame and `n` messages, by turns, each text in one of `SHAPES` (no names: the text is
    the whole content, so what arrives is compared whole)."""
    messages = [dict(FRAME)]
    for i in range(1, n + 1):
        text = f"Turn {i}: " + " ".join(f"w{i}x{j}" for j in range(words)) + "."
        role = "assistant" if i % 2 else "user"
        messages.append({"role": role, "content": SHAPES[i % len(SHAPES)].format(text)})
    return messages


def send(running: Running, messages: list[dict[str, Any]]) -> None:
    """One chat request, its body the bytes of `messages` as JSON; answered 200."""
    host, port = running.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"model": "m", "messages": messages}).encode()
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        answer.read()
    finally:
        connection.close()


def test_a_chat_that_fits_whole_arrives_as_sent_turn_after_turn(serving: Running, stand_in: StandIn) -> None:
    first = spaced_chat(6)
    send(serving, first)
    # The next turn continues the chat: assembled as a chat's turn is, whatever became of the first.
    second = [*spaced_chat(8), {"role": "system", "content": "[Summarize the above]\n"}]
    send(serving, second)
    assert [body["messages"] for body in stand_in.bodies] == [first, second]


def test_a_long_chat_cut_to_fit_keeps_each_message_it_sends_exact(serving: Running, stand_in: StandIn) -> None:
    sent = spaced_chat(400)
    send(serving, sent)
    got = stand_in.bodies[-1]["messages"]
    assert got[0] == FRAME
    kept = [m for m in got if m["role"] != "system"]
    chat = sent[1:]
    assert 0 < len(kept) < len(chat), "the chat was to be cut"
    assert kept[-1] == chat[-1]
    # the head (maybe none), then the newest messages: each message kept is the one sent, byte for byte
    assert any(kept == chat[:head] + chat[len(chat) - (len(kept) - head) :] for head in range(len(kept))), kept
