"""What SillyTavern 1.12.6 really sent to `ctx serve` (tests/fixtures/sillytavern-requests/,
captured on the wire), sent again through serve to the stand-in backend of test_serve: every
request answered (the first contact, before any summary, included), one chat whatever its
frame does, the Test Message a probe, no label of ctx's own in the chat, a group's members under
their own names, the example dialogue's speakers kept, the frame's entries as first sent; and
the rules each of those rests on, called without a server."""

from __future__ import annotations

import http.client
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import test_serve
from conftest import deep_but
from test_serve import StandIn, _get, chat, settings_for

from otaku_ctx.config import ContextSettings, Settings
from otaku_ctx.serve.assemble import Assembled, assemble_chat, ladder, trimmed
from otaku_ctx.serve.chats import FRAME_ENTRY, FramePart, chat_story, frame_of, framed, identify
from otaku_ctx.serve.frame import FrameMemory
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running
from otaku_ctx.serve.session import Session
from otaku_ctx.serve.sessions import Sessions
from otaku_ctx.serve.setup import serving
from otaku_ctx.story.model import Scene, Story
from otaku_ctx.tokens import make_counter

stand_in = test_serve.stand_in  # the stand-in backend, as test_serve's tests have it

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sillytavern-requests"


def captured(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def live(stand_in: StandIn) -> list[dict[str, Any]]:
    """The turns serve forwarded (SillyTavern's own `logit_bias` rides along), not its summaries."""
    return [b for b in stand_in.bodies if "logit_bias" in b]


def ours(requests: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> list[str]:
    """What serve wrote itself into each forwarded prompt: its text less every message any request
    so far sent (a frame part is sent as first sent for a while)."""
    seen: set[str] = set()
    written = []
    for each, sent in zip(requests, forwarded, strict=True):
        seen |= {m["content"] for m in each["body"]["messages"]}
        text = "\n".join(m["content"] for m in sent["messages"])
        for content in sorted(seen, key=len, reverse=True):
            text = text.replace(content, "") if content else text
        written.append(text)
    return written


def played(stand_in: StandIn, name: str, window: int) -> tuple[Running, list[dict[str, Any]]]:
    """Each captured request of `name` sent through serve as SillyTavern sent it: its body's JSON
    and its headers, on the wire as they came (no client library re-shapes them); the replies'
    texts."""
    stand_in.window = window
    running = Running(Service(Settings(serve=settings_for(stand_in.url, summarize=True).serve)))
    host, port = running.url.split("//")[1].split("/")[0].split(":")
    replies = []
    for each in captured(name):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {"Content-Type": "application/json", "Authorization": "Bearer none", **each["headers"]}
        connection.request("POST", each["path"], json.dumps(each["body"]).encode(), headers)
        answer = connection.getresponse()
        assert answer.status == 200, (each["turn"], answer.read())
        if each["body"]["stream"]:
            events = [line[6:] for line in answer.read().decode().splitlines() if line.startswith("data: ")]
            chunks = [json.loads(e) for e in events if e != "[DONE]"]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        else:
            text = json.loads(answer.read())["choices"][0]["message"]["content"]
        connection.close()
        replies.append({"text": text})
    return running, replies


@pytest.mark.parametrize("window", deep_but([4096, 2048], 4096))  # 2048: the deep step
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
        # every turn holds the story so far, at 2,048 too, where the frame leaves ~300 tokens (issue 43):
        # the newest messages with the story so far trimmed before them, never the newest alone
        told = [b for i, b in enumerate(live(stand_in)) if i != 15]
        assert all(any("[Story so far" in m["content"] for m in b["messages"]) for b in told)
        # what ctx wrote itself (the story so far) names Seraphina as the frame does, never "Character"
        # (the persona is SillyTavern's default, named "User": "a fictional chat between Seraphina and User")
        written = ours(requests, live(stand_in))
        assert not [t for t in written if "Character:" in t]
        assert all("Seraphina: " in t for i, t in enumerate(written) if i != 15)
    finally:
        running.stop()


def test_the_lorebook_entries_are_sent_as_first_sent_and_the_frame_start_holds(stand_in: StandIn) -> None:
    running, _ = played(stand_in, "seraphina-long-chat.jsonl", 8192)
    try:
        requests = captured("seraphina-long-chat.jsonl")
        lore = requests[0]["body"]["messages"][1]["content"]  # five entries, in the order they fired
        assert requests[8]["body"]["messages"][1]["content"] != lore  # request 9: the same five, reordered
        assert len(frame_of(requests[3]["body"])) == 3  # request 4: none fired
        played_turns = [b for i, b in enumerate(live(stand_in)) if i != 15]  # the probe aside
        firsts = {json.dumps(b["messages"][0]) for b in played_turns}
        assert len(firsts) == 1  # the system message every turn starts with is the same, whatever fired
        assert all(lore in b["messages"][0]["content"] for b in played_turns)  # as first sent, and stayed
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
    memory = FrameMemory()
    assert memory.moving((main, lore_a, card)) == frozenset()  # the first turn: all of it stays
    assert memory.moving((main, card)) == frozenset()
    assert memory.moving((main, lore_a, card)) == {lore_a}  # it came and went: it moves
    assert memory.moving((main, lore_b, card)) == {lore_b}
    other = FramePart("another card " * 30)
    assert memory.moving((main, other)) == frozenset()  # most of what stayed is gone: a new base
    story = framed(chat_story({"messages": chat(4)}), (main, lore_a, card), {lore_a}, 4)
    assert story.system == "main\n\n" + card.text and [e.uid for e in story.world] == [FRAME_ENTRY]
    assert framed(story, (main, lore_a, card), {lore_a}, None).system.count("lore a") == 1


def test_entries_reordered_or_stopped_are_sent_as_first_sent_for_a_while() -> None:
    main, card = FramePart("Write the next reply."), FramePart("The card.\nShe heals.")
    lore = FramePart("Entry one.\nEntry two.\nEntry three.")
    memory = FrameMemory()
    assert memory.frame((main, lore, card), 300, 16) == (main, lore, card)
    reordered = FramePart("Entry three.\nEntry one.\nEntry two.")  # the same entries, fired in another order
    assert memory.frame((main, reordered, card), 302, 16) == (main, lore, card)
    assert memory.frame((main, card), 303, 16) == (main, lore, card)  # none fired: kept
    fewer = FramePart("Entry two.")  # some of them, once it came and went: the whole, as first sent
    assert memory.frame((main, fewer, card), 304, 16) == (main, lore, card)
    assert memory.frame((main, card), 310, 16) == (main, lore, card)  # stopped firing: kept...
    assert memory.frame((main, card), 318, 16) == (main, lore, card)  # 16 messages after it was last sent whole
    assert memory.frame((main, card), 319, 16) == (main, card)  # ...and no longer
    assert memory.frame((main, fewer, card), 320, 16) == (main, fewer, card)  # new again: as sent


def test_a_frame_that_brings_something_new_is_taken_as_sent() -> None:
    aqua = (FramePart("Write Aqua's next reply."), FramePart("Aqua's card."))
    seraphina = (FramePart("Write Seraphina's next reply."), FramePart("Seraphina's card."))
    memory = FrameMemory()
    assert memory.frame(aqua, 10, 16) == aqua
    assert memory.frame(seraphina, 11, 16) == seraphina  # a group member's turn: not both cards
    assert memory.frame(aqua, 12, 16) == aqua
    edited = FramePart("Write Aqua's next reply, briefly.")
    assert memory.frame((edited, aqua[1]), 13, 16) == (edited, aqua[1])  # an edit: the old prompt forgotten
    assert FrameMemory().frame(aqua[:1], 14, 0) == aqua[:1]
    memory = FrameMemory()
    memory.frame(aqua, 10, 0)
    assert memory.frame(aqua[:1], 12, 0) == aqua[:1]  # sticky 0: what is not sent is gone


def noted(n: int, depth: int) -> dict[str, Any]:
    """A chat of `n` messages with an Author's Note `depth` messages from the end, as SillyTavern
    injects it."""
    messages = chat(n)
    messages.insert(len(messages) - depth, {"role": "system", "content": "[Style: brief.]"})
    return {"messages": messages}


def note_at(story: Story) -> int:
    """How many of the chat's other messages come after the note."""
    at = next(i for i, m in enumerate(story.messages) if m.role == "system")
    return sum(m.role != "system" for m in story.messages[at:])


def test_an_author_s_note_stays_where_it_was_until_twice_its_depth() -> None:
    memory = FrameMemory()
    depths = [note_at(memory.held(chat_story(noted(n, 4)), 2, 20)) for n in range(40, 52, 2)]
    assert depths == [4, 6, 8, 4, 6, 8]  # held for two turns, then where SillyTavern put it
    again = memory.held(chat_story(noted(50, 4)), 2, 20)
    assert [m.number for m in again.messages] == list(range(1, len(again.messages) + 1))
    assert [m.content for m in again.messages if m.role != "system"] == [
        m["content"] for m in noted(50, 4)["messages"] if m["role"] != "system"
    ]  # the chat's own messages in their order: only the note moved
    assert note_at(FrameMemory().held(chat_story(noted(40, 4)), 1, 20)) == 4  # depth_hold 1: as sent
    memory = FrameMemory()
    memory.held(chat_story(noted(40, 4)), 3, 8)
    assert note_at(memory.held(chat_story(noted(46, 4)), 3, 8)) == 4  # not past `settle`: 10 > 7
    last = FrameMemory()  # post-history instructions, at the very end: never held back
    for n in (40, 42):
        ending = {"messages": [*chat(n), {"role": "system", "content": "[Reply briefly.]"}]}
        assert last.held(chat_story(ending), 2, 20).messages[-1].content == "[Reply briefly.]"


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
    unnamed = sessions.take(identify(story, {}, {}, 2))  # a one-shot: named on its second request
    named = sessions.take(identify(story, {}, {"X-Ctx-Chat": "lamp"}, 2))
    assert named is unnamed and named.chat.named and len(sessions) == 1
    for n in range(3):  # the bound: the least recently used goes, whole (each a one-shot, then a chat)
        for _ in range(2):
            sessions.take(identify(chat_story({"messages": chat(6, words=20 + n)}), {}, {}, 2))
    assert len(sessions) == 2 and named not in list(sessions)


def assembled(n: int, window: int, session: Session | None, frame: str = "Be brief.") -> Assembled:
    settings = serving(Settings(context=ContextSettings(reserve_default=100)))
    story = chat_story({"messages": chat(n, frame=frame, words=30)})
    return assemble_chat(story, ladder(settings), make_counter("cl100k_base"), window=window, max_tokens=100,
                         state=session.turn if session else None, played=bool(session and session.stats))  # fmt: skip


def test_a_small_window_takes_a_smaller_head_and_tail_and_keeps_it() -> None:
    session = Session(identify(chat_story({"messages": chat(4)}), {}, {}, 2))
    big = assembled(300, 60000, None)
    assert big.rung == 0 and big.messages is not None
    small = assembled(300, 1500, session)  # no provisional scenes here: the rungs alone, then the newest
    assert small.messages is not None and small.tokens <= 1400
    assert small.truncated is not None and 0 < small.truncated < 300
    assert small.held == big.held == 300  # the turn is counted by the chat's messages, not those sent
    assert small.messages[-1]["content"].startswith("Mara: Turn 300")
    refused = assembled(300, 300, None, frame=" ".join(f"rule{i}" for i in range(400)))
    assert refused.messages is None and refused.built.assembly.refusal is not None and refused.held == 300


def test_past_the_ladder_the_newest_messages_keep_their_start_while_they_fit() -> None:
    session = Session(identify(chat_story({"messages": chat(4)}), {}, {}, 2))
    starts, moves = [], 0
    for n in range(300, 324, 2):  # twelve turns, each two messages more
        turn = assembled(n, 4000, session)
        assert turn.truncated is not None and turn.messages is not None
        starts.append(n - turn.truncated)  # the messages before the first one kept
        if len(starts) == 1 or starts[-1] != starts[-2]:  # it moved: room left for the turns after
            moves += 1
            assert turn.tokens <= 0.75 * turn.built.assembly.limit
        assert turn.messages[-1]["content"].startswith(f"Mara: Turn {n}")
    assert starts == sorted(starts) and moves <= 4  # the same start for three turns or more, most of the time
    # without the session's memory, the newest that fit: a start that moves every turn
    assert len({n - assembled(n, 4000, None).truncated for n in range(300, 306, 2)}) == 3  # type: ignore[operator]


def test_past_the_ladder_the_story_so_far_stands_before_the_newest_messages() -> None:
    # scenes to message 280 (a history each), twenty unsettled messages after: more than the window
    # holds beside the frame, so no rung fits; the story so far and the newest messages do
    settings = serving(Settings(context=ContextSettings(reserve_default=100)))
    counter = make_counter("cl100k_base")
    story = chat_story({"messages": chat(300, frame="Be brief.", words=30)})
    histories = {k: " ".join(f"Chapter{j} happened." for j in range(1, k + 1)) * 20 for k in range(1, 15)}
    scenes = tuple(Scene(k, 20 * k - 19, 20 * k, title=f"Part {k}", summary=f"Scene {k} of the walk.",
                         history=histories[k]) for k in range(1, 15))  # fmt: skip
    told = replace(story, scenes=scenes)
    session = Session(identify(chat_story({"messages": chat(4)}), {}, {}, 2))
    turn = assemble_chat(told, ladder(settings), counter, window=2000, max_tokens=100, state=session.turn)
    assert turn.messages is not None and turn.truncated is not None and turn.sofar
    first = 300 - turn.truncated + 1  # the first message kept
    history = [m["content"] for m in turn.messages if m["content"].startswith("[Story so far")]
    assert len(history) == 1 and turn.built.assembly.case == 4
    through = max(s.order for s in scenes if s.end < first)  # the last scene before the messages kept
    assert f"Chapter{through} happened." in history[0] and "Chapter1 happened." in history[0]
    assert counter(history[0]) <= 0.25 * turn.built.assembly.limit + 16  # trimmed to its share
    assert turn.messages[-1]["content"].startswith("Mara: Turn 300")
    # a frame that leaves no room for the story so far beside the newest message: the newest alone
    rules = [f"rule{i}" for i in range(2000)]
    while counter(" ".join(rules)) > turn.built.assembly.limit - 200:  # ~200 left: the newest takes 125
        rules = rules[:-10]
    crowded = replace(told, system=" ".join(rules))
    alone = assemble_chat(crowded, ladder(settings), counter, window=2000, max_tokens=100)
    assert alone.messages is not None and not alone.sofar and alone.truncated is not None
    assert not [m for m in alone.messages if m["content"].startswith("[Story so far")]


def test_the_story_so_far_is_trimmed_keeping_its_start_and_its_end() -> None:
    counter = make_counter("cl100k_base")
    scene = Scene(1, 1, 9, history=" ".join(f"w{i}" for i in range(600)))
    cut = trimmed(scene, 100, counter)
    assert counter(cut.history) <= 100 and "…" in cut.history
    words = cut.history.split()
    assert words[0] == "w0" and words[-1] == "w599" and words.index("…") < len(words) // 2
    assert trimmed(scene, 10_000, counter) == scene  # within its tokens: as it is
    for n in range(6):  # a few words into fewer tokens: it ends, within them or empty
        for tokens in (0, 1, 2, 4):
            cut = trimmed(Scene(1, 1, 9, history=" ".join(f"w{i}" for i in range(n))), tokens, counter)
            assert counter(cut.history) <= tokens or not cut.history


def test_the_settings_rungs_halve_the_head_and_tail() -> None:
    rungs = ladder(Settings())
    heads = [r.context.head_messages for r in rungs]
    floors = [r.context.tail_floor for r in rungs]
    assert heads == [20, 10, 5, 2, 1, 0] and floors == [50, 25, 12, 6, 3, 1]
