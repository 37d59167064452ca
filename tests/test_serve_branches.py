"""A chat's branches in `ctx serve` (issue 35's #17, #18): two chats that share their common
summaries, each scene asked for once; an edit, a swipe or a deletion keeps the chat, a branch
forks it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from raw_backend import summaries_writing
from test_serve import chat, settings_for

from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

# -- #17, #18: a chat's branches are two chats that share their common summaries -----------------


def branched(n: int, at: int) -> list[dict[str, Any]]:
    """`chat(n)` with every message after the `at`-th its own: a SillyTavern branch made there."""
    messages = chat(n)
    for message in messages[at + 1 :]:
        message["content"] = message["content"].replace("Turn", "Branch")
    return messages


@pytest.mark.deep  # six passes of summaries and a restart: in .ci/run's second step
def test_two_branches_played_in_turn_ask_each_scene_once_and_keep_their_own() -> None:
    """A chat and a branch of it made at message 40, played in turn as they grow (and the frame
    changing each turn, as World Info does): the branch asks only for its own scenes, each switch
    for what the turn added, never again for the other's; after a restart each finds its own
    file and asks for nothing."""
    from test_serve import StandIn

    stand_in = StandIn().start()
    stand_in.window, stand_in.summary_delay = 1200, 0.02
    asked: list[int] = []

    def play(running: Running, messages: list[dict[str, Any]], turn: int) -> None:
        before = len(stand_in.summaries)
        messages[0]["content"] = f"You are the keeper of the lighthouse. Entry fired on turn {turn}."
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=30)
        client.chat.completions.create(model="m", messages=messages, max_tokens=100)
        deadline = time.monotonic() + 30
        time.sleep(0.3)
        while summaries_writing(running):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.3)
        asked.append(len(stand_in.summaries) - before)

    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        # each first request of a chat is a one-shot (no summaries); the one after it makes it a chat
        played = [chat(58), chat(60), branched(58, 40), branched(60, 40), chat(68), branched(68, 40), chat(68)]
        for turn, messages in enumerate(played):
            play(running, messages, turn)
    finally:
        running.stop()
    assert asked[0] == asked[2] == 0  # the one-shots: nothing asked
    first, branch, *switches = asked[1], *asked[3:]
    assert first > branch > 0  # the branch asks for its own scenes only, after message 40
    assert switches[0] == switches[1] > 0 and switches[2] == 0  # the eight new messages' scene; none again
    again = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        for turn, messages in enumerate([branched(68, 40), branched(68, 40), chat(68), chat(68)], 7):
            play(again, messages, turn)
    finally:
        again.stop()
        stand_in.stop()
    assert asked[-4:] == [0, 0, 0, 0]
    main, fork = sorted((p.name for p in (Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries")), key=len)
    assert fork.startswith(main.removesuffix(".ctx-summaries") + "-")  # the opening's file, and the branch's


def test_an_edit_swipe_or_deletion_keeps_the_chat_a_branch_forks_it() -> None:
    from otaku_ctx.serve.chats import Chat
    from otaku_ctx.serve.sessions import Sessions

    def said(*texts: str) -> list[tuple[str, str]]:
        return [("user" if ord(text) % 2 else "assistant", text) for text in texts]

    sessions, chat_ = Sessions(), Chat("o1", False, "o1")
    first = sessions.take(chat_, said(*"abcdefgh"))  # a one-shot, a chat from its next request
    kept = {
        "continued": said(*"abcdefghij"),
        "swiped (the last reply not sent)": said(*"abcdefg"),
        "an old message edited": said(*"abcXefgh"),
        "one deleted": said(*"abdefgh"),
        "one put in": said(*"abcXdefgh"),
        "the newest edited": said(*"abcdefgX"),
        "the newest but one edited, its reply gone": said(*"abcdefX"),
    }
    for how, dialogue in kept.items():
        assert sessions.take(chat_, dialogue) is first, how
        sessions.take(chat_, said(*"abcdefgh"))
    branch = sessions.take(chat_, said(*"abcXY"))  # branched at the fourth, and went on
    assert branch is not first and branch.key != first.key
    assert sessions.take(chat_, said(*"abcdefghij")) is first
    assert sessions.take(chat_, said(*"abcXYZ")) is branch
    assert len(sessions) == 2
