"""Memory in the play loop (issue 43), against the real llama-server (SmolLM2-135M-Instruct) at
a 4,096-token window a request, `ctx serve` in front with its defaults (summaries on, recall
on): a 300-message chat of the test's own, its speakers named in the content as Agnai writes
them ("Keeper: …", no `name`), behind a frame of about 1,500 tokens (a large card), played on
for 10 turns, the reply appended each turn.

The chat outgrew the window before its first turn, so from that turn on every prompt holds a
story so far — ctx's own extract, since SmolLM2's summaries are turned down or still being
written in the other slot — and it names the speakers as the chat does, never "Character:" or
"User:". Every request is answered, and ≥ 90 % of each prompt is cached by the server's own
count on ≥ 80 % of the turns after the first."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
from conftest import frontend_session  # tests/realserver/conftest.py

N = 300
TURNS = 10
REPLY = 32
WINDOW = 4096
PLACES = ("the lamp room", "the lower stair", "the harbour wall", "the boat shed", "the chart table", "the cliff path")
THINGS = ("a brass key", "the old log book", "a tin of oil", "a torn sail", "the fog bell", "a sealed letter")
SAID = (
    "{who} found {thing} by {place} this morning.",
    "The storm broke the glass near {place}, so {who} carried {thing} up there.",
    "Nobody had opened {thing} since the winter the ferry sank.",
    "{who} wants to read {thing} by candlelight tonight.",
    "The gulls circle {place} whenever the tide turns.",
)


def card() -> str:
    """A frame of about 1,500 tokens: a long character card, as many players run at 4k."""
    lines = [
        "You are Keeper, the old lighthouse keeper of Gullrock. Reply as Keeper in one or two sentences.",
        "Keeper: gruff, kind, remembers every storm since 1962, talks to the lamp as to an old friend.",
    ]
    for n in range(31):
        place, thing = PLACES[n % len(PLACES)], THINGS[(n * 5) % len(THINGS)]
        lines.append(
            f"Lore {n + 1}: Keeper once kept {thing} at {place}, and tells of it when the wind rises; "
            f"he never lets a visitor touch it, and he counts the steps to {place} under his breath."
        )
    return "\n".join(lines)


def opening() -> list[dict[str, Any]]:
    """The frame and N messages, Keeper and Mara by turns, each named in its content."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": card()}]
    for i in range(1, N + 1):
        keeper = i % 2 == 1
        who = "Keeper" if keeper else "Mara"
        place, thing = PLACES[(i * 7) % len(PLACES)], THINGS[(i * 3 + i // 6) % len(THINGS)]
        text = SAID[i % len(SAID)].format(who=who, thing=thing, place=place)
        messages.append({"role": "assistant" if keeper else "user", "content": f"{who}: {text}"})
    return messages


def test_a_long_chat_at_4096_keeps_its_story_so_far_every_turn(tmp_path: Path) -> None:
    with frontend_session(tmp_path, WINDOW) as (running, sent):
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=600)
        chat = opening()
        for turn in range(TURNS):
            question = f"Mara: Keeper, what did you find by {PLACES[turn % len(PLACES)]}, turn {turn + 1}?"
            chat.append({"role": "user", "content": question})
            reply = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=REPLY, temperature=0)  # type: ignore[arg-type]
            text = reply.choices[0].message.content or "(silence)"
            chat.append({"role": "assistant", "content": f"Keeper: {text.strip()}"})
        stats = json.loads(stats_of(running))
    assert len(sent) == TURNS
    own = {m["content"] for m in chat}
    for n, body in enumerate(sent, 1):
        written = [m["content"] for m in body["messages"] if m["content"] not in own]  # ctx's own text
        told = [w for w in written if "[Story so far" in w]
        assert told, f"turn {n}: no story so far in {[w[:80] for w in written]}"
        assert "Keeper: " in told[0] and "Mara: " in told[0], told[0][:300]
        assert not [w for w in written if "Character:" in w or "User:" in w], f"turn {n}"
    [mine] = [c for c in stats["chats"] if len(c["turns"]) >= TURNS - 1]
    turns = mine["turns"][-(TURNS - 1) :]  # after the first
    table = [(t["case"], t["sent"], t["prompt_tokens"], t["cached"]) for t in turns]
    print(f"(case, sent, prompt, cached) a turn: {table}; summaries: {mine['summaries']}")
    for t in turns:
        assert t["sent"] == t["prompt_tokens"] <= t["limit"], t  # the server's own count
    held = [t for t in turns if t["cached"] is not None and t["cached"] >= 0.9 * t["prompt_tokens"]]
    assert len(held) >= 0.8 * len(turns), table


def stats_of(running: Any) -> bytes:
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(running.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        connection.request("GET", "/ctx/stats")
        return connection.getresponse().read()
    finally:
        connection.close()


SILLYTAVERN = Path(__file__).resolve().parents[1] / "fixtures" / "sillytavern-requests" / "seraphina-long-chat.jsonl"
SUMMARIES_DEADLINE = 900.0


def test_a_model_whose_summaries_are_all_turned_down_is_said(tmp_path: Path, caplog: Any) -> None:
    """SmolLM2 summarising the opening of SillyTavern's captured Seraphina chat (its frame and
    first 45 messages, at temperature 0): most replies are turned down and the scenes are ctx's
    extracts; when every reply is, serve says so — once in its log, with the reason and the
    remedy, and in `/ctx/stats` — and when one is kept, it says nothing of the kind. (Every reply
    was turned down until the extracts SmolLM2's history prompts read changed with issue 45's
    sentence split; then it kept one history: the stand-in test in tests/test_serve.py keeps the
    "all turned down" path exercised.)"""
    import logging

    from otaku_ctx.config import SummarizeSettings

    body = json.loads(SILLYTAVERN.read_text(encoding="utf-8").splitlines()[0])["body"]
    frame = [m for m in body["messages"] if m["role"] == "system"][:3]
    said = [m for m in body["messages"] if m["role"] != "system"][:45]
    if said[-1]["role"] != "user":
        said = said[:-1]
    scenes = SummarizeSettings(temperature=0.0, settle=8, min_chars=1500, min_messages=16)  # what 45 hold
    with caplog.at_level(logging.INFO, logger="otaku_ctx.serve"):
        with frontend_session(tmp_path, WINDOW, scenes) as (running, _):
            client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=600)
            for _ in range(2):  # a Regenerate: the chat's second request makes it a chat, and its summaries start
                client.chat.completions.create(model="smollm2", messages=[*frame, *said], max_tokens=8)  # type: ignore[arg-type]
            deadline = time.monotonic() + SUMMARIES_DEADLINE
            while True:
                [chat] = json.loads(stats_of(running))["chats"]
                written = chat["summaries"]
                if not chat["summaries_writing"] and written["by_model"] + written["extracts"]:
                    break
                assert time.monotonic() < deadline, f"the summaries took too long: {chat}"
                time.sleep(2)
    print(f"summaries: {written}, failed: {chat['summaries_failed']!r}")
    lines = [r.getMessage() for r in caplog.records if "summaries were all turned down" in r.getMessage()]
    assert written["extracts"] >= 1 and written["turned_down"] >= 3, written
    if written["by_model"] == 0:  # every reply turned down: said once, with the remedy
        assert "all turned down" in chat["summaries_failed"]
        assert len(lines) == 1 and "A larger model summarizes" in lines[0] and "[summarize]" in lines[0], lines
    else:  # one reply kept (SmolLM2 did keep one history here once the extracts it reads changed): not said
        assert chat["summaries_failed"] == "" and lines == [], (chat["summaries_failed"], lines)
