"""What SillyTavern 1.12.6 really sent to `ctx serve` (tests/fixtures/sillytavern-requests/,
captured on the wire), sent again through serve to the stand-in backend of test_serve: every
request answered (the first contact, before any summary, included), one chat whatever its
frame does, the Test Message a probe, no label of ctx's own in the chat, a group's members under
their own names, the example dialogue's speakers kept, the frame's moving parts at a depth; and
the rules each of those rests on, called without a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
import test_serve
from test_serve import StandIn, _get, chat, settings_for

from otaku_ctx.config import ContextSettings, Settings
from otaku_ctx.serve.assemble import Assembled, assemble_chat, ladder
from otaku_ctx.serve.chats import FRAME_ENTRY, FramePart, chat_story, frame_of, framed, identify
from otaku_ctx.serve.http import Running, Service, moving, serving
from otaku_ctx.serve.session import Session, Sessions
from otaku_ctx.tokens import make_counter

stand_in = test_serve.stand_in  # the stand-in backend, as test_serve's tests have it

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sillytavern-requests"


def captured(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def live(stand_in: StandIn) -> list[dict[str, Any]]:
    """The turns serve forwarded (SillyTavern's own `logit_bias` rides along), not its summaries."""
    return [b for b in stand_in.bodies if "logit_bias" in b]


def played(stand_in: StandIn, name: str, window: int) -> tuple[Running, list[dict[str, Any]]]:
    """Each captured request of `name` sent through serve as SillyTavern sent it (its headers
    too); the replies' texts."""
    stand_in.window = window
    running = Running(Service(Settings(serve=settings_for(stand_in.url, summarize=True).serve)))
    replies = []
    for each in captured(name):
        talk = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=60,
                             default_headers=each["headers"])  # fmt: skip
        body = dict(each["body"])
        messages, model, stream = body.pop("messages"), body.pop("model"), body.pop("stream")
        if stream:
            pieces = talk.chat.completions.create(model=model, messages=messages, stream=True, extra_body=body)
            replies.append({"text": "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)})
        else:
            reply = talk.chat.completions.create(model=model, messages=messages, extra_body=body)
            replies.append({"text": reply.choices[0].message.content})
    return running, replies


@pytest.mark.parametrize("window", [4096, 2048])
def test_the_long_chat_is_played_from_its_first_request_as_one_chat(stand_in: StandIn, window: int) -> None:
    running, replies = played(stand_in, "seraphina-long-chat.jsonl", window)
    try:
        assert len(replies) == 17 and all(r["text"] for r in replies)  # none refused
        chats = json.loads(_get(running, "/ctx/stats"))["chats"]
        assert len(chats) == 1 and len(chats[0]["turns"]) == 16  # named from request 5 on; the probe none
        requests = captured("seraphina-long-chat.jsonl")
        assert len(live(stand_in)) == 17
        for each, sent in zip(requests, live(stand_in), strict=True):
            own = {m["content"] for m in each["body"]["messages"]}
            chat_turns = [m for m in sent["messages"] if m["role"] in ("user", "assistant")]
            assert all(m["content"] in own for m in chat_turns), each["turn"]  # no "Assistant: " of ctx's
        # the probe went on as it came, one message
        assert live(stand_in)[15]["messages"] == [{"role": "user", "content": "Hi"}]
    finally:
        running.stop()


def test_the_lorebook_entries_that_fire_go_at_a_depth_and_the_frame_start_holds(stand_in: StandIn) -> None:
    running, _ = played(stand_in, "seraphina-long-chat.jsonl", 8192)
    try:
        firsts = {json.dumps(b["messages"][0]) for b in live(stand_in)[3:15]}  # from request 4, the probe aside
        assert len(firsts) == 1  # the system message every turn starts with is the same
        seventh = live(stand_in)[6]["messages"]  # request 7: an entry ("What are your powers?") fired
        lore = [i for i, m in enumerate(seventh) if m["role"] == "system" and "What are your powers?" in m["content"]]
        assert lore and lore[0] > 1  # not in the frame: before the tail's first message
        chat_start = next(i for i, m in enumerate(seventh) if m["role"] != "system")
        assert lore[0] > chat_start  # after the head
    finally:
        running.stop()


def test_a_group_chat_is_one_chat_and_the_examples_keep_who_speaks(stand_in: StandIn) -> None:
    running, replies = played(stand_in, "examples-and-group.jsonl", 8192)
    try:
        assert all(r["text"] for r in replies)
        chats = json.loads(_get(running, "/ctx/stats"))["chats"]
        # requests 1-3: Seraphina's chat (names by field, then in the content: three openings);
        # 4-6: the group, each member's turn with its own card: one chat
        group = [c for c in chats if len(c["turns"]) == 3]
        assert group, [(c["chat"], len(c["turns"])) for c in chats]
        first = live(stand_in)[0]["messages"][0]["content"]
        assert "example_user: Who are you?" in first and "example_assistant: *She bows.*" in first
        members = [m for m in live(stand_in)[5]["messages"] if m["role"] == "assistant"]
        # Aqua and Seraphina speak in a row, each her own message, each under her own name, once
        starts = [m["content"].split(":")[0] for m in members]
        assert starts[:2] == ["Aqua", "Seraphina"] and not any(m["content"].startswith("Aqua: Aqua:") for m in members)
        named = live(stand_in)[1]["messages"]  # names sent in the `name` field are written once
        assert any(m["content"].startswith("Seraphina: *You wake") for m in named)
    finally:
        running.stop()


# ── the rules, without a server ───────────────────────────────────────────────────────────


def test_the_parts_that_stay_are_those_every_turn_sent() -> None:
    main, lore_a, card, lore_b = (FramePart(t) for t in ("main", "lore a", "the card " * 20, "lore b"))
    session = Session(identify(chat_story({"messages": chat(4)}), {}, {}, 2))
    assert moving(session, (main, lore_a, card)) == frozenset()  # the first turn: all of it stays
    assert moving(session, (main, card)) == frozenset()
    assert moving(session, (main, lore_a, card)) == {lore_a}  # it came and went: it moves
    assert moving(session, (main, lore_b, card)) == {lore_b}
    other = FramePart("another card " * 30)
    assert moving(session, (main, other)) == frozenset()  # most of what stayed is gone: a new base
    story = framed(chat_story({"messages": chat(4)}), (main, lore_a, card), {lore_a}, 4)
    assert story.system == "main\n\n" + card.text and [e.uid for e in story.world] == [FRAME_ENTRY]
    assert framed(story, (main, lore_a, card), {lore_a}, None).system.count("lore a") == 1


def test_a_named_part_of_the_frame_keeps_its_name() -> None:
    body = {"messages": [{"role": "system", "content": "Main."},
                         {"role": "system", "name": "example_user", "content": "Who are you?"},
                         {"role": "system", "name": "example_user", "content": "example_user: Hi"},
                         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi."}]}  # fmt: skip
    assert [p.shown for p in frame_of(body)] == ["Main.", "example_user: Who are you?", "example_user: Hi"]
    assert chat_story(body).system == "Main.\n\nexample_user: Who are you?\n\nexample_user: Hi"


def test_naming_a_chat_takes_over_its_unnamed_session() -> None:
    story = chat_story({"messages": chat(6)})
    sessions = Sessions(most=2)
    unnamed = sessions.find(identify(story, {}, {}, 2))
    named = sessions.find(identify(story, {}, {"X-Ctx-Chat": "lamp"}, 2))
    assert named is unnamed and named.chat.named and len(sessions) == 1
    for n in range(3):  # the bound: the least recently used goes, whole
        sessions.find(identify(chat_story({"messages": chat(6, words=20 + n)}), {}, {}, 2))
    assert len(sessions) == 2 and named not in list(sessions)


def assembled(n: int, window: int, session: Session | None, frame: str = "Be brief.") -> Assembled:
    settings = serving(Settings(context=ContextSettings(reserve_default=100)))
    story = chat_story({"messages": chat(n, frame=frame, words=30)})
    return assemble_chat(story, ladder(settings), make_counter("cl100k_base"), window=window, max_tokens=100,
                         session=session)  # fmt: skip


def test_a_small_window_takes_a_smaller_head_and_tail_and_keeps_it() -> None:
    session = Session(identify(chat_story({"messages": chat(4)}), {}, {}, 2))
    big = assembled(300, 60000, None)
    assert big.rung == 0 and big.messages is not None
    small = assembled(300, 1500, session)  # no provisional scenes here: the rungs alone, then the newest
    assert small.messages is not None and small.tokens <= 1400
    assert small.truncated is not None and 0 < small.truncated < 300
    assert small.messages[-1]["content"].startswith("Mara: Turn 300")
    refused = assembled(300, 300, None, frame=" ".join(f"rule{i}" for i in range(400)))
    assert refused.messages is None and refused.built.assembly.refusal is not None


def test_the_settings_rungs_halve_the_head_and_tail() -> None:
    rungs = ladder(Settings())
    heads = [r.context.head_messages for r in rungs]
    floors = [r.context.tail_floor for r in rungs]
    assert heads == [20, 10, 5, 2, 1, 0] and floors == [50, 25, 12, 6, 3, 1]
