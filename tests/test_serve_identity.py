"""One chat is one chat (issues 42 and 48): two chats that open alike never share a prompt's text
or a summaries file, and a frontend's side requests (its memory, its title and tag tasks) are
served as sent, are no chat, and never evict one."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import deep
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


@pytest.mark.parametrize(
    "first, named",
    [
        pytest.param(first, named, marks=() if (first, named) == ("Alice", "none") else deep)
        for first in ("Alice", "Bob")
        for named in ("none", "Bob", "both")
    ],
)
def test_two_chats_that_open_alike_share_no_text(stand_in: StandIn, first: str, named: str) -> None:
    """Alice plays with her address and PIN in her persona; Bob starts his chat with the same
    card and the same "Hi", and both play on in turn, either first, named by `X-Ctx-Chat` or not:
    not one of Bob's prompts holds Alice's persona or a line of hers, nor the other way round,
    and each is its own chat."""
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    plays = sorted([("Alice", ALICE), ("Bob", BOB)], key=lambda play: play[0] != first)
    sent: dict[str, list[str]] = {"Alice": [], "Bob": []}
    for n in range(0, 24, 2):
        for who, persona in plays:
            length = n if who == "Bob" else n + 16  # Alice's chat is the longer
            header = {"X-Ctx-Chat": who} if named in (who, "both") else {}
            talk.chat.completions.create(model="m", messages=played(persona, length, who), extra_headers=header)
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
        any(c["summaries_writing"] for c in json.loads(_get(serving, "/ctx/stats"))["chats"])
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

    old = [("assistant", "G"), ("user", "Hi"), ("assistant", "A"), ("user", "B")]
    gone_on = [*old, ("assistant", "C")]
    edited = [old[0], ("user", "Hello"), *old[2:]]
    again, cut, newest = list(old), old[:3], [*old[:2], ("assistant", "X"), ("user", "Y")]
    for new in (gone_on, edited):
        assert continues(new, old, shared(new, old), frame_kept=False)
    for new in (again, cut, newest):
        assert continues(new, old, shared(new, old)) and not continues(new, old, shared(new, old), frame_kept=False)
    opening = old[:2]  # a chat of its greeting and first line alone goes on only with its frame's every part
    assert continues(gone_on, opening, 2, frame_kept=False) and not continues(gone_on, opening, 2, False, False)
    assert continues(gone_on, old, 4, False, False)


# ── what real frontends do to a chat: Agnai's labels and prefill, renames, edits, trimming ──


def agnai(n: int, persona: str = "Tom", *, drop: int = 0) -> list[dict[str, Any]]:
    """A chat as Agnai sends it: Mira's greeting and `n` lines (odd: the player's last), each
    message its speaker's name first ("Mira: …", "Tom: …"), and last the prefill, a bare "Mira:";
    `drop`: its first dialogue messages left out, as Agnai does past its Max Context."""
    lines = [GREETING["content"], *(f"line {i} " + " ".join(f"w{i}x{k}" for k in range(12)) for i in range(n))]
    dialogue = [
        {"role": "assistant" if i % 2 == 0 else "user", "content": f"{'Mira' if i % 2 == 0 else persona}: {text}"}
        for i, text in enumerate(lines)
    ]
    return [*card("You are Mira."), *dialogue[drop:], {"role": "assistant", "content": "Mira:"}]


def test_a_speakers_name_the_frontend_writes_into_a_message_is_not_its_text() -> None:
    from otaku_ctx.serve.chats import said

    names = {"Tom: Hi": "Hi", "Mira:": "", "Dr. Jane Smith: ok": "ok", "Séraphine: oui": "oui"}
    texts = ["Turn 3: a", "one two three four five: a", "http://a", "Note:a", "Hi"]  # the text's own
    assert {text: said("user", text)[1] for text in [*names, *texts]} == {**names, **{t: t for t in texts}}


def test_what_agnai_does_to_a_chat_keeps_it_that_chat() -> None:
    """A rename of the persona (every past message rewritten), an old message edited and the reply
    to the newest come at once, a message deleted in the opening (which is another opening), and
    Agnai trimming the chat's start: each the same chat, by its dialogue."""
    from otaku_ctx.serve.request import parse

    settings = settings_for("http://127.0.0.1:9").serve

    def take(sessions: Any, messages: list[dict[str, Any]]) -> Any:
        request = parse({"messages": messages}, {}, settings)
        return sessions.take(request.chat, request.dialogue, request.frame)

    from otaku_ctx.serve.sessions import Sessions

    sessions = Sessions()
    chat = [take(sessions, agnai(n)) for n in (41, 43)][-1]
    renamed = agnai(45, "Tomas")
    edited, opening_cut = agnai(47, "Tomas"), agnai(49, "Tomas")
    for messages in (edited, opening_cut):
        messages[20]["content"] += " An edit."
    del opening_cut[3]  # the player's first line
    for how, messages in {"renamed": renamed, "edited": edited, "opening edited": opening_cut}.items():
        assert take(sessions, messages) is chat, how
        assert not chat.trimmed
    trimmed = [m for i, m in enumerate(agnai(51, "Tomas", drop=24))]
    assert take(sessions, trimmed) is chat and chat.trimmed > 20
    assert take(sessions, agnai(53, "Tomas", drop=30)) is chat  # Agnai starts later each turn
    assert len(sessions) == 1 and sessions.held == 0


def test_two_agnai_chats_whose_first_lines_differ_are_two_chats() -> None:
    """Agnai's prefill, the same bare "Mira:" in every chat, is no sign of the same chat: a new
    chat that says "Hello" where another said "Hi" is not that chat with its newest edited."""
    from otaku_ctx.serve.chats import Chat, FramePart
    from otaku_ctx.serve.sessions import Sessions

    sessions, chat = Sessions(), Chat("o1", False, "o1")
    alice, bob = (FramePart("The user is Alice."),), (FramePart("The user is Bob."),)
    hi = [("assistant", "You came."), ("user", "Hi"), ("assistant", "")]
    first = sessions.take(chat, hi, alice)
    assert sessions.match(chat, [*hi[:1], ("user", "Hello"), ("assistant", "")], bob).found is None
    assert (
        sessions.match(chat, [*hi[:2], ("assistant", "A reply."), ("user", "On."), ("assistant", "")], bob).found
        is first
    )


def test_a_chat_the_frontend_trims_is_that_chat_said_once_and_keeps_its_summaries(
    serving: Running, stand_in: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """A long chat played, its summaries written; then the frontend sends only its end, starting
    later each turn (Agnai past its Max Context, SillyTavern's context size locked): the same
    chat in `/ctx/stats`, each prompt's dialogue the request's own, the frontend's trimming
    said once in the log, and the chat's summaries file untouched by the trimmed turns."""
    stand_in.window = 1200
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    for n in (61, 63):
        talk.chat.completions.create(model="m", messages=agnai(n), max_tokens=100)
    folder, deadline = Path(os.environ["OTAKU_HOME"]) / "chats", time.monotonic() + 60
    while any(c["summaries_writing"] for c in json.loads(_get(serving, "/ctx/stats"))["chats"]) or not any(
        folder.glob("*.ctx-summaries")
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    files = {p.name: p.read_bytes() for p in folder.glob("*.ctx-summaries")}
    for n, drop in ((65, 40), (67, 44), (69, 50)):
        messages = agnai(n, drop=drop)
        talk.chat.completions.create(model="m", messages=messages, max_tokens=100)
        own = {m["content"] for m in messages}
        forwarded = [m["content"] for m in stand_in.bodies[-1]["messages"] if m["role"] != "system"]
        assert [text[:40] for text in forwarded if text not in own] == []
    time.sleep(0.5)
    assert {p.name: p.read_bytes() for p in folder.glob("*.ctx-summaries")} == files
    [chat] = json.loads(_get(serving, "/ctx/stats"))["chats"]
    assert len(chat["turns"]) == 5
    said = [r.getMessage() for r in caplog.records if "leaving out its start" in r.getMessage()]
    assert len(said) == 1 and "Max Context" in said[0], said


def test_nine_branches_of_one_opening_played_in_turn_keep_their_own_turns_and_frames(stand_in: StandIn) -> None:
    """Nine branches of one greeting and "Hi", played in turn for three rounds, each with a note
    of its own in its frame on its first turn only: nine chats of three turns each, and no
    prompt holds another branch's note or line (before: 8 kept, and a returning branch started
    from a sibling's remembered frame)."""
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    try:
        for round_ in range(3):
            for k in range(9):
                frame = card(f"The user is player {k}.")
                if round_ == 0:
                    frame.append({"role": "system", "content": f"A note for branch {k} alone."})
                lines = [
                    f"branch {k} line {i}: " + " ".join(f"b{k}w{i}x{j}" for j in range(8))
                    for i in range(2 * round_ + 1)
                ]
                dialogue = [{"role": "assistant" if i % 2 else "user", "content": line} for i, line in enumerate(lines)]
                talk.chat.completions.create(
                    model="m", messages=[*frame, GREETING, {"role": "user", "content": "Hi"}, *dialogue]
                )
                sent = json.dumps(stand_in.bodies[-1]["messages"])
                others = [j for j in range(9) if j != k and (f"branch {j} " in sent or f"player {j}." in sent)]
                assert others == [], (round_, k, others)
        chats = json.loads(_get(serving, "/ctx/stats"))["chats"]
        assert sorted(len(c["turns"]) for c in chats) == [3] * 9
    finally:
        serving.stop()


@pytest.mark.deep  # two serves, each writing two chats' summaries: in .ci/run's second step
def test_two_chats_that_open_alike_keep_their_own_summaries_across_a_restart(stand_in: StandIn) -> None:
    """Alice's and Bob's chats (the same card and "Hi") write their summaries; serve restarts and
    they play on, Bob first: each finds its own file, no scene of either is lost or rewritten by
    the other, and neither's prompt holds the other's text."""
    from otaku_ctx.story.sidecar import read_sidecar

    stand_in.window = 1200
    folder = Path(os.environ["OTAKU_HOME"]) / "chats"
    players = {"Alice": ALICE, "Bob": BOB}

    def play(order: list[str], lengths: tuple[int, ...]) -> None:
        serving = Running(Service(settings_for(stand_in.url, summarize=True)))
        talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
        try:
            for n in lengths:
                for who in order:
                    talk.chat.completions.create(model="m", messages=played(players[who], n, who), max_tokens=100)
                    sent = json.dumps(stand_in.bodies[-1]["messages"])
                    other = "Bob" if who == "Alice" else "Alice"
                    assert f"{other} line" not in sent and players[other] not in sent, (who, n)
            deadline = time.monotonic() + 60
            while any(c["summaries_writing"] for c in json.loads(_get(serving, "/ctx/stats"))["chats"]):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            serving.stop()

    def scenes() -> dict[str, list[Any]]:
        """Each player's file's records: the file whose text is theirs."""
        found = {}
        for path in folder.glob("*.ctx-summaries"):
            text = path.read_text(encoding="utf-8")
            [who] = [w for w in players if f"{w}" in text and f"{'Bob' if w == 'Alice' else 'Alice'}" not in text]
            found[who] = read_sidecar(path)
        return found

    play(["Alice", "Bob"], (60, 62))
    before = scenes()
    assert sorted(before) == ["Alice", "Bob"] and all(len(r) >= 2 for r in before.values())
    play(["Bob", "Alice"], (64, 66))
    after = scenes()
    assert sorted(after) == ["Alice", "Bob"]
    for who, records in before.items():
        assert after[who][: len(records)] == records, who  # every scene kept, as written


def test_a_chat_named_in_the_url_is_the_chat_that_name_gives(stand_in: StandIn) -> None:
    """`/chat/NAME/v1` (Agnai's URL) and `/chat/NAME` (its Local Requests) name the chat as
    `X-Ctx-Chat: NAME` does: Alice's and Bob's chats, named apart by URL alone, are two chats,
    and a turn sent by header with the same name goes on Alice's."""
    serving = Running(Service(settings_for(stand_in.url)))
    root = serving.url.removesuffix("/v1")
    try:
        for n in (0, 2):
            for who, persona in (("Alice", ALICE), ("Bob", BOB)):
                base = f"{root}/chat/{who.lower()}" + ("/v1" if n else "")
                talk = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=30)
                talk.chat.completions.create(model="m", messages=played(persona, n, who))
        talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
        header = {"X-Ctx-Chat": "alice"}
        talk.chat.completions.create(model="m", messages=played(ALICE, 4, "Alice"), extra_headers=header)
        chats = json.loads(_get(serving, "/ctx/stats"))["chats"]
    finally:
        serving.stop()
    assert sorted((len(c["turns"]), c["named"]) for c in chats) == [(2, True), (3, True)]


def test_what_serve_writes_itself_names_each_speaker_as_the_chat_does_once(stand_in: StandIn) -> None:
    """A chat whose names are in its messages (Agnai's "Mira: …", "Tom: …"), too long for its
    window: the story so far serve writes from its own lines names Mira and Tom as the chat
    does, never "Character:" or "User:", and never twice ("Mira: Mira:")."""
    from test_serve_sillytavern import ours

    stand_in.window = 1200
    serving = Running(Service(settings_for(stand_in.url)))
    talk = openai.OpenAI(base_url=serving.url, api_key="none", max_retries=0, timeout=30)
    try:
        requests = [{"body": {"messages": agnai(n)}} for n in (61, 63)]
        for each in requests:
            talk.chat.completions.create(model="m", messages=each["body"]["messages"], max_tokens=100)
    finally:
        serving.stop()
    written = "".join(ours(requests, stand_in.bodies[-2:]))
    speakers = re.findall(r"(?m)^(\w+): ", written)
    assert speakers and set(speakers) <= {"Mira", "Tom"}, written[:300]
    assert not [w for w in ("Character:", "User:", "Mira: Mira:", "Tom: Tom:") if w in written]
