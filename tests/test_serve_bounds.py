"""What one request may make `ctx serve` do or hold (issue 35's #10, #11): JSON nested deep in a
field passed through, the sessions of many chats, more messages than any story, a long chat's
turn that holds up no other chat's."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any

import openai
import pytest
import raw_backend
from raw_backend import HI, RawBackend, address, reply
from test_serve import chat, settings_for

from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

raw, serving = raw_backend.raw, raw_backend.serving  # the stand-in's fixtures, by their names


@pytest.mark.parametrize("depth", [900, 1000, 5000])
def test_json_nested_deep_in_a_passed_through_field_is_a_400(serving: Running, depth: int) -> None:
    deep = "[" * depth + "1" + "]" * depth  # past what any frontend sends, short of what a decoder refuses
    body = f'{{"model": "m", "messages": {json.dumps(chat(3))}, "logit_bias": {deep}}}'
    host, port = address(serving)
    connection = http.client.HTTPConnection(host, port, timeout=20)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    said = json.loads(answer.read())
    connection.close()
    assert answer.status == 400 and "nested" in said["error"]["message"], said


# -- #11: per-chat memory is bounded -------------------------------------------------------------


def test_many_chats_keep_a_bounded_number_of_sessions(raw: RawBackend) -> None:
    raw.scenario = lambda handler: reply(handler, 200, HI)
    service = Service(settings_for(raw.url))
    service.sessions.most = 10
    running = Running(service)
    try:
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=20)
        for n in range(30):  # thirty chats, each its own opening and its own system prompt, each two turns
            for turn in (5, 6):
                client.chat.completions.create(model="m", messages=chat(turn, frame=f"System {n}.", words=8 + n))
        assert len(service.sessions) == 10  # the least recently used went, whole
        host, port = address(running)
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request("GET", "/ctx/stats")
        assert len(json.loads(connection.getresponse().read())["chats"]) == 10
    finally:
        running.stop()


# -- #10: the work of one request is bounded -----------------------------------------------------


def test_a_request_of_more_messages_than_any_story_is_a_413_at_once(
    raw: RawBackend, serving: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    from otaku_ctx.serve import request

    monkeypatch.setattr(request, "MOST_MESSAGES", 1000)
    client = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=20)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="m", messages=chat(1001))
    assert refused.value.status_code == 413 and "at most 1,000 a request" in refused.value.body["message"]  # type: ignore[index]
    assert raw.asked == 0  # refused before any assembly: the backend never asked


def pasted_book(n: int) -> list[dict[str, Any]]:
    """A chat of `n` messages whose first user message is 250,000 characters with no full stop."""
    messages = chat(n)
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[first] = {**messages[first], "content": "and the boat drifts on " * 11_000}
    return messages


@pytest.mark.parametrize(
    ("long_chat", "is_long"),
    [
        (lambda: chat(60), lambda messages: len(messages) > 40),  # LONG_CHAT made 40 below
        (lambda: pasted_book(8), lambda messages: any(len(m["content"]) > 100_000 for m in messages)),
    ],
    ids=["many messages", "few messages, 250,000 characters"],
)
def test_a_long_chat_s_turn_holds_up_no_other_chat_s(
    raw: RawBackend,
    monkeypatch: pytest.MonkeyPatch,
    long_chat: Callable[[], list[dict[str, Any]]],
    is_long: Callable[[list[dict[str, Any]]], bool],
) -> None:
    """A long chat's first turn (here held until released, as a 150,000-message chat's takes 7 s)
    runs on the long chats' worker: another chat's turn is answered meanwhile. A chat is long by
    its messages (`LONG_CHAT`) or by its characters (`LONG_CHAT_CHARACTERS`: a pasted book in a
    chat of eight messages)."""
    import threading

    from otaku_ctx.serve import http, setup
    from otaku_ctx.serve.turn import assemble_turn

    monkeypatch.setattr(setup, "LONG_CHAT", 40)
    raw.scenario = lambda handler: reply(handler, 200, HI)
    service = Service(settings_for(raw.url))
    held, release = threading.Event(), threading.Event()

    def heavy(turn: Any, *rest: Any) -> Any:
        if is_long(turn.body["messages"]):
            held.set()
            release.wait(30)
        return assemble_turn(turn, *rest)

    monkeypatch.setattr(http, "assemble_turn", heavy)
    running = Running(service)
    client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=30)
    long = threading.Thread(target=lambda: client.chat.completions.create(model="m", messages=long_chat()))
    try:
        long.start()
        assert held.wait(10)
        other = client.with_options(timeout=5).chat.completions.create(model="m", messages=chat(6, frame="Another."))
        assert other.choices[0].message.content == "Hi" and long.is_alive()
    finally:
        release.set()
        long.join(30)
        running.stop()
    assert raw.asked == 2  # and the long chat's turn was answered too
