"""One chat is one chat (issues 42 and 48): two chats that open alike never share a prompt's text
or a summaries file, and a frontend's side requests (its memory, its title and tag tasks) are
served as sent, are no chat, and never evict one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from test_serve import StandIn, _get, settings_for

from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

GREETING = {"role": "assistant", "content": 'Mira looks up from the map. "You came."'}


def card(persona: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are Mira, a cartographer."}, {"role": "system", "content": persona}]


def played(persona: str, n: int, who: str) -> list[dict[str, Any]]:
    """A chat of `n` dialogue messages after the greeting and "Hi", each its player's own."""
    messages = [*card(persona), GREETING, {"role": "user", "content": "Hi"}]
    for i in range(n):
        role = "assistant" if i % 2 else "user"
        messages.append({"role": role, "content": f"{who} line {i}: " + " ".join(f"{who}{i}w{k}" for k in range(12))})
    return messages


ALICE = "The user is Alice, of 12 Elm Street; her PIN is 4471."
BOB = "The user is Bob."


@pytest.fixture
def serving(stand_in: StandIn) -> Any:
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        yield running
    finally:
        running.stop()


stand_in = __import__("test_serve").stand_in


def test_two_chats_that_open_alike_share_no_text(stand_in: StandIn) -> None:
    """Alice plays with her address and PIN in her persona; Bob starts his chat with the same
    card and the same "Hi", and both play on in turn: not one of Bob's prompts holds Alice's
    persona or a line of hers, nor the other way round, and each is its own chat."""
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    plays = [("Alice", ALICE), ("Bob", BOB)]
    sent: dict[str, list[str]] = {"Alice": [], "Bob": []}
    for n in range(0, 24, 2):
        for who, persona in plays:
            length = n if who == "Bob" else n + 16  # Alice's chat is the longer
            talk.chat.completions.create(model="m", messages=played(persona, length, who))
            sent[who].append(json.dumps(stand_in.bodies[-1]["messages"]))
    assert not [p for p in sent["Bob"] if "4471" in p or "Elm Street" in p or "Alice line" in p]
    assert not [p for p in sent["Alice"] if "Bob line" in p or "The user is Bob" in p]
    chats = json.loads(_get(serving, "/ctx/stats"))["chats"]
    serving.stop()
    assert len(chats) == 2 and sorted(len(c["turns"]) for c in chats) == [12, 12]


def test_two_chats_that_open_alike_write_their_own_summaries(serving: Running, stand_in: StandIn) -> None:
    """Each chat's scenes are written to a file no other chat writes: neither loses a scene to
    the other (before, the second chat's scenes replaced the first's at the same places)."""
    stand_in.window = 1200
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    for n in (60, 62):
        for who, persona in (("Alice", ALICE), ("Bob", BOB)):
            talk.chat.completions.create(model="m", messages=played(persona, n, who), max_tokens=100)
    deadline = time.monotonic() + 60
    while (
        any(c["summaries_left"] for c in json.loads(_get(serving, "/ctx/stats"))["chats"])
        or len(list((Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries"))) < 2
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    files = sorted((Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries"))
    assert len(files) == 2
    texts = [f.read_text() for f in files]
    assert sum("Alice line" in t or "Alice" in t for t in texts) >= 1
    from otaku_ctx.story.sidecar import read_sidecar

    assert all(len(read_sidecar(f)) >= 2 for f in files)


RISU = [{"role": "user", "content": "Tom: a walk\n\nMira: a map\n\n"}, {"role": "system", "content": "[Summarize]\n"}]
TITLE = [{"role": "user", "content": "### Task:\nA title.\n<chat_history>\nUSER: hi\n</chat_history>\n"}]
TAGS = [{"role": "user", "content": "### Task:\nTags.\n<chat_history>\nUSER: hi\n</chat_history>"}]


def side(i: int) -> list[dict[str, Any]]:
    shape = (RISU, TITLE, TAGS)[i % 3]
    return [{**m, "content": m["content"].replace("a walk", f"walk {i}").replace("hi", f"hi {i}")} for m in shape]


@pytest.mark.deep  # 317 requests through serve, sixteen seconds: in .ci/run's second step
def test_side_requests_are_served_as_sent_and_are_no_chat(serving: Running, stand_in: StandIn) -> None:
    """A chat played with 17 side requests between its turns, then 300 more: one chat in
    `/ctx/stats`, its turns go on after the flood, and every side request reaches the backend
    exactly as sent."""
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    asked: list[Any] = []
    k = 0
    for n in range(0, 16, 2):
        talk.chat.completions.create(model="m", messages=played(BOB, n, "Bob"))
        for _ in range(2 if n < 14 else 3):
            asked.append(side(k))
            talk.chat.completions.create(model="m", messages=side(k))
            assert stand_in.bodies[-1]["messages"] == side(k)
            k += 1
    for _ in range(300):
        asked.append(side(k))
        talk.chat.completions.create(model="m", messages=side(k))
        assert stand_in.bodies[-1]["messages"] == side(k)
        k += 1
    talk.chat.completions.create(model="m", messages=played(BOB, 16, "Bob"))
    stats = json.loads(_get(serving, "/ctx/stats"))
    [one] = stats["chats"]
    assert len(one["turns"]) == 9  # its turns went on after the flood
    two_messages = sum(len(each) == 2 for each in asked)  # one message alone is a probe, no one-shot
    assert stats["one_shots"]["served"] == two_messages + 1 and stats["one_shots"]["held"] <= 64


@pytest.mark.parametrize("dialogue", [0, 300], ids=["brand-new", "imported-300"])
def test_a_chats_first_request_is_answered_as_a_first_turn_and_is_a_chat_from_its_second(
    stand_in: StandIn, dialogue: int
) -> None:
    """A chat's first request (greeting and "Hi", or a 300-message chat imported) is served as a
    first turn is, the opening and the newest messages; it is held apart as a one-shot, then
    the request that continues it makes it a chat whose summaries begin."""
    stand_in.window = 2048
    serving = Running(Service(settings_for(stand_in.url, summarize=True)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    try:
        first = played(BOB, dialogue, "Bob")
        talk.chat.completions.create(model="m", messages=first, max_tokens=100)
        sent = stand_in.bodies[-1]["messages"]
        said = [m for m in sent if m["role"] != "system"]
        assert "You are Mira" in sent[0]["content"] and "The user is Bob." in sent[0]["content"]
        assert said[0] == GREETING and said[-1] == first[-1]  # the opening and the newest
        if dialogue:
            assert len(said) < len(first) - 2  # fitted to the window, as a first turn always was
        else:
            assert said == first[2:]
        stats = json.loads(_get(serving, "/ctx/stats"))
        assert stats["chats"] == [] and stats["one_shots"]["held"] == 1
        assert stand_in.summaries == []  # nothing is summarised for a one-shot
        talk.chat.completions.create(model="m", messages=played(BOB, dialogue + 2, "Bob"), max_tokens=100)
        stats = json.loads(_get(serving, "/ctx/stats"))
        [chat] = stats["chats"]
        assert stats["one_shots"]["held"] == 0 and len(chat["turns"]) >= 1
        if dialogue:  # its summaries begin, in the background
            deadline = time.monotonic() + 20
            while not stand_in.summaries:
                assert time.monotonic() < deadline
                time.sleep(0.02)
    finally:
        serving.stop()


@pytest.mark.deep  # 1,000 side requests through serve: in .ci/run's second step
def test_a_second_players_chat_keeps_its_turns_while_the_first_sends_a_thousand_side_requests(
    stand_in: StandIn,
) -> None:
    """Alice's frontend sends 1,000 side requests between her turns (its memory, its titles and
    tags); Bob plays on meanwhile: his chat is never evicted nor begun again, and both stay
    the chats they are."""
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    try:
        for who, persona in (("Alice", ALICE), ("Bob", BOB)):
            talk.chat.completions.create(model="m", messages=played(persona, 0, who))
        k = 0
        for n in range(2, 22, 2):  # ten turns each
            talk.chat.completions.create(model="m", messages=played(ALICE, n, "Alice"))
            for _ in range(100):
                talk.chat.completions.create(model="m", messages=side(k))
                k += 1
            talk.chat.completions.create(model="m", messages=played(BOB, n, "Bob"))
            assert "Bob line" in json.dumps(stand_in.bodies[-1]["messages"])
        stats = json.loads(_get(serving, "/ctx/stats"))
        turns = {c["chat"]: len(c["turns"]) for c in stats["chats"]}
        assert k == 1000 and len(turns) == 2 and sorted(turns.values()) == [11, 11]  # neither began again
        assert stats["one_shots"]["held"] <= 64
    finally:
        serving.stop()


def test_two_chats_that_open_alike_played_in_turn_keep_their_own_turns(stand_in: StandIn) -> None:
    """Bob's first request is Alice's first, word for word, but for his persona: it is not her
    chat regenerated, so neither chat takes a turn of the other's (before: 7 turns and 3)."""
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    try:
        for n in range(0, 10, 2):
            for who, persona in (("Alice", ALICE), ("Bob", BOB)):
                talk.chat.completions.create(model="m", messages=played(persona, n, who))
        chats = json.loads(_get(serving, "/ctx/stats"))["chats"]
        assert sorted(len(c["turns"]) for c in chats) == [5, 5]
    finally:
        serving.stop()


def test_only_going_on_or_an_edit_the_chat_follows_continues_a_chat_whose_frame_changed() -> None:
    from otaku_ctx.serve.sessions import continues, shared

    old = [("assistant", None, "G"), ("user", None, "Hi"), ("assistant", None, "A"), ("user", None, "B")]
    gone_on = [*old, ("assistant", None, "C")]
    edited = [old[0], ("user", None, "Hello"), *old[2:]]
    again, cut, newest = list(old), old[:3], [*old[:2], ("assistant", None, "X"), ("user", None, "Y")]
    for new in (gone_on, edited):
        assert continues(new, old, shared(new, old), frame_kept=False)
    for new in (again, cut, newest):
        assert continues(new, old, shared(new, old)) and not continues(new, old, shared(new, old), frame_kept=False)
