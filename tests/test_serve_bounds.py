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


def _hostile(case: str) -> list[dict[str, Any]]:
    """Issue 45's hostile chats at their campaign's sizes, each ending with the player's message."""
    line = "the boat drifts on past the harbour wall and Tom waves to Mira from the pier"
    if case == "no full stop":
        short = [f"Line {i}: {line}." for i in range(100)]
        texts = [*short, " ".join(f"{w}{k}" for k, w in enumerate(line.split() * 250)), *short]
    elif case == "Japanese":
        texts = [("雨が降っていたので彼は港に来なかった。" * 80)[:1500] for _ in range(200)]
    elif case == "100,000 messages":
        texts = [(f"{i} " + line * 4)[:300] for i in range(100_000)]
    else:  # a 50 MB message
        texts = [line + " " + "and the tide rose " * 2_800_000, "Go on"]
    messages = [{"role": "system", "content": "You are Mira."}]
    messages += [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)]
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "What did Tom say at last?"})
    return messages


@pytest.mark.deep
@pytest.mark.parametrize("case", ["no full stop", "Japanese", "100,000 messages", "a 50 MB message"])
def test_each_hostile_text_is_answered_and_another_chat_meanwhile(case: str) -> None:
    """The campaign's texts, replayed at their sizes through serve with summaries on (every
    reply turned down: every scene ctx's extract): the chat's first two requests are answered,
    the newest message sent on, and another chat's turns are answered while they are assembled
    (how long each takes is benchmarks/hostile_text.py's: no test asserts a time)."""
    import threading

    from test_serve import StandIn

    stand_in_server = StandIn().start()
    stand_in_server.useless, stand_in_server.window = True, 4096
    running = Running(Service(settings_for(stand_in_server.url, summarize=True, max_body=128 << 20)))
    client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=600)
    messages = _hostile(case)
    other = chat(6, frame="Another.")
    answered: list[str] = []
    try:
        client.chat.completions.create(model="m", messages=other)
        done = threading.Event()

        def beside() -> None:
            while not done.is_set():
                reply = client.chat.completions.create(model="m", messages=other)
                answered.append(reply.choices[0].message.content or "")
                done.wait(0.2)

        thread = threading.Thread(target=beside)
        thread.start()
        try:
            client.chat.completions.create(model="m", messages=messages)
            on = [*messages, {"role": "assistant", "content": "Aye."}, {"role": "user", "content": "And then?"}]
            reply = client.chat.completions.create(model="m", messages=on)
        finally:
            done.set()
            thread.join(60)
    finally:
        running.stop()
        stand_in_server.stop()
    assert reply.choices[0].message.content
    assert any(any(m["content"] == "And then?" for m in b["messages"]) for b in stand_in_server.bodies)
    assert answered and all(answered)  # the other chat played on meanwhile
