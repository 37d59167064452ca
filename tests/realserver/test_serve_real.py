"""`ctx serve` end to end: the real llama-server (SmolLM2-135M-Instruct, 4,096 tokens over two
slots: a 2,048-token window a request) behind it, the real `openai` client in front, and a
400-message chat played for 30 turns as SillyTavern plays it — each turn the whole chat and a
new user message, the reply appended. The first turn is answered at once, on ctx's provisional
scenes, while the summaries are written in the background; once they are, every turn is
checked: the backend's own count of the prompt and the reply fit its window
(`usage.prompt_tokens + max_tokens <= window`), and its prompt cache holds ≥ 90 % of the prompt
on ≥ 80 % of the turns. Last, streamed and non-streamed replies are what the backend gives for
the same prompt at temperature 0, each prompt evaluated afresh on both sides (`cache_prompt:
false`: a prompt continued from a cache is not bit-exact with one evaluated whole). Bounded in
time (`SUMMARIES_DEADLINE`): 15 minutes on two cores shared with other test runs, most of it
the 23 summary and history requests."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import Served, forwarded  # tests/realserver/conftest.py
from server import built

from otaku_ctx.config import ContextSettings, ModelSettings, ServeSettings, Settings, SummarizeSettings
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

N = 400
TURNS = 30
REPLY = 24  # max_tokens: short replies keep the test's time down
WINDOW = 2048  # a slot's: -c 4096 -np 2
SUMMARIES_DEADLINE = 1500.0  # seconds for the summaries and the turns, on a busy CI machine

LINES = (
    "The lamp needs oil before the storm reaches the rocks.",
    "I saw the ferry turn back at the harbour mouth.",
    "The gulls went quiet an hour ago, and that is never a good sign.",
    "Bring the rope from the lower stair, the wind is rising.",
    "A letter came for you with the morning boat.",
    "The glass in the lantern room cracked again last night.",
    "Tell me about the keeper who lived here before you.",
    "The tide will be high at midnight, higher than last winter.",
    "I found a lantern washed up on the beach, still warm.",
    "Listen, a bell is ringing somewhere out in the fog.",
    "We should write the storm into the log before we forget it.",
)


def opening() -> list[dict[str, Any]]:
    """A frame and N messages, Keeper and Mara by turns, each a plain sentence of the lighthouse (a
    small model summarizes them so that the summaries pass the summarizer's checks)."""
    frame = "You are Keeper, the old lighthouse keeper. Reply in one or two short sentences."
    messages: list[dict[str, Any]] = [{"role": "system", "content": frame}]
    for i in range(1, N + 1):
        keeper = i % 2 == 1
        who = "Keeper" if keeper else "Mara"
        text = f"{who} says: {LINES[(i * 3 + i // 11) % len(LINES)]}"
        messages.append({"role": "assistant" if keeper else "user", "name": who, "content": text})
    return messages


def settings(url: str) -> Settings:
    _, gguf = built()
    return Settings(
        # the model file the server runs: its tokenizer counts, its chat template is the format
        model=ModelSettings(use=gguf),
        context=ContextSettings(head_messages=4, min_tail_messages=24, tail_step=8, tail_floor=8, cache="stable"),
        summarize=SummarizeSettings(
            settle=8,
            min_chars=2000,
            min_messages=16,
            summary_words=20,
            history_words=20,
            temperature=0.0,
            repeat_penalty=1.1,
            attempts=5,
            timeout=120,
        ),  # fmt: skip
        serve=ServeSettings(backend=url, port=0, timeout=120, summarize=True),
    )


@pytest.fixture
def serving(own_server: Served, tmp_path: Path) -> Iterator[tuple[Running, list[dict[str, Any]]]]:
    """serve in front of a server of the test's own (its summaries store in the test's otaku home,
    tests/conftest.py); the bodies it forwarded, recorded, and written with the stats to the
    test's folder at the end (`--basetemp` keeps them, to study a run offline)."""
    service = Service(settings(own_server.url))
    sent = forwarded(service)
    running = Running(service)
    try:
        yield running, sent
    finally:
        try:
            (tmp_path / "stats.json").write_bytes(_get(running.url.removesuffix("/v1") + "/ctx/stats"))
        finally:
            running.stop()
            (tmp_path / "sent.json").write_text(json.dumps(sent))


def direct(url: str, body: dict[str, Any]) -> str:
    """The backend's own reply to a body, not streamed."""
    plain = {**body, "stream": False}
    data = json.loads(_post(url + "/chat/completions", plain))
    return str(data["choices"][0]["message"]["content"] or "")


def test_a_long_chat_played_through_serve(serving: tuple[Running, list[dict[str, Any]]], own_server: Served) -> None:
    running, sent = serving
    client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)
    chat = opening()
    ask = {"model": "smollm2", "max_tokens": REPLY, "temperature": 0}

    # the first turn is played at once, before any summary is written (ctx's provisional scenes)
    first = [*chat, {"role": "user", "name": "Mara", "content": "Mara, 401: is the lamp lit tonight?"}]
    deadline = time.monotonic() + SUMMARIES_DEADLINE
    # sent twice (a Regenerate): a chat's first request is a one-shot, a chat from the request
    # that continues it (serve/sessions.py), and its summaries start then
    for _ in range(2):
        client.chat.completions.create(messages=first, **ask)  # type: ignore[call-overload]
    assert "(provisional)" in json.dumps(sent[-1]["messages"]) or "Story so far" in json.dumps(sent[-1]["messages"])
    time.sleep(2)
    while summaries_writing(running):  # the rest of them (histories), before the turns are measured
        assert time.monotonic() < deadline, "the summaries took too long"
        time.sleep(2)

    for turn in range(TURNS):
        line = f"Mara says: {LINES[turn % len(LINES)]} {LINES[(turn * 5 + 2) % len(LINES)]}"
        chat.append({"role": "user", "name": "Mara", "content": line})
        text = say(client, chat, ask, stream=turn % 2 == 1)  # never refused
        body = sent[-1]
        assert body["max_tokens"] == REPLY and body["temperature"] == 0 and bool(body.get("stream")) == (turn % 2 == 1)
        chat.append({"role": "assistant", "name": "Keeper", "content": text or "(silence)"})

    stats = json.loads(_get(running.url.removesuffix("/v1") + "/ctx/stats"))
    [mine] = [c for c in stats["chats"] if len(c["turns"]) > TURNS]
    turns = mine["turns"][-TURNS:]
    for t in mine["turns"]:
        assert t["prompt_tokens"] + REPLY <= WINDOW, t  # the backend's own count
        assert t["sent"] == t["prompt_tokens"], t  # ctx's count is the server's, its chat template included
        assert t["sent"] <= t["limit"] == WINDOW - REPLY
        assert t["case"] in (3, 4, 5)
    shares = [t["cached"] / t["prompt_tokens"] for t in turns]
    held = sum(s >= 0.9 for s in shares) / len(shares)
    table = [(t["case"], t["sent"], t["prompt_tokens"], t["cached"]) for t in turns]
    assert held >= 0.8, f"(case, sent, prompt, cached) a turn: {table}"

    # streamed and not, the reply is the backend's own for the same prompt: each prompt
    # evaluated afresh (`cache_prompt` off: a prompt continued from a cache is not bit-exact
    # with one evaluated whole, and SmolLM2 at temperature 0 can tip either way)
    fresh = {**ask, "extra_body": {"cache_prompt": False}}
    for stream in (False, True):
        chat.append({"role": "user", "name": "Mara", "content": f"Mara: and now, {len(chat)}?"})
        text = say(client, chat, fresh, stream=stream)
        assert sent[-1]["cache_prompt"] is False
        assert text == direct(own_server.url, sent[-1]), f"stream={stream}"
        chat.append({"role": "assistant", "name": "Keeper", "content": text or "(silence)"})


def summaries_writing(running: Running) -> int:
    stats = json.loads(_get(running.url.removesuffix("/v1") + "/ctx/stats"))
    return sum(chat["summaries_writing"] for chat in stats["chats"])


def say(client: openai.OpenAI, chat: list[dict[str, Any]], ask: dict[str, Any], *, stream: bool) -> str:
    """One turn through serve: the reply's text, streamed or not."""
    if stream:
        pieces = client.chat.completions.create(messages=chat, stream=True, **ask)
        return "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    reply = client.chat.completions.create(messages=chat, **ask)
    return reply.choices[0].message.content or ""


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return bytes(answer.read())


def _post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return bytes(answer.read())
