"""A chat's frame across turns (`serve/frame.py`): a line the user edits out of a part sent every
turn is never sent again, World Info entries that fire fewer or stop are sent as first sent for
a while, and a cut (a chat shorter than at the last turn) ends every hold at once (issue 42).
Each turn is played as serve's turn stage plays it: the frame, then what of it moves."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import test_serve
from hypothesis import given
from hypothesis import strategies as st
from test_serve import StandIn, chat, client

from otaku_ctx.serve.chats import FramePart
from otaku_ctx.serve.frame import FrameMemory, lines_of
from otaku_ctx.serve.listen import Running

stand_in = test_serve.stand_in
serving = test_serve.serving

MAIN = FramePart("Write Seraphina's next reply.\nNever speak for Mara.")
CARD = FramePart("Seraphina is a healer.\nShe guards the glade.")
PERSONA = FramePart("Mara is a courier.\nMara lives at 12 Elm Lane.\nMara's PIN is 4821.")
LORE = FramePart("The glade is warded.\nThe ward fails at dusk.\nThe wolves wait by the river.")
FEWER = FramePart("The ward fails at dusk.")  # one of the entries: the others did not fire


def turn(memory: FrameMemory, sent: Sequence[FramePart], length: int, sticky: int = 16) -> tuple[FramePart, ...]:
    """One turn as `turn.placed_frame` plays it: the frame sent on, then what of it moves."""
    frame = memory.frame(sent, length, sticky)
    memory.moving(frame)
    return frame


def without(part: FramePart, line: str) -> FramePart:
    return FramePart("\n".join(each for each in part.text.split("\n") if each != line), part.name)


def said(frame: Sequence[FramePart]) -> str:
    return "\n".join(part.text for part in frame)


# ── an edit: a part sent alike every turn that comes with fewer lines ─────────────────────────


@pytest.mark.parametrize(
    "index, line",
    [
        (0, "Never speak for Mara."),  # the main prompt
        (1, "She guards the glade."),  # the card
        (2, "Mara's PIN is 4821."),  # the persona
        (3, "The wolves wait by the river."),  # a World Info block that fired alike every turn
    ],
    ids=["main prompt", "card", "persona", "steady block"],
)
def test_a_line_edited_out_of_a_part_sent_every_turn_is_never_sent_again(index: int, line: str) -> None:
    memory = FrameMemory()
    sent = [MAIN, CARD, PERSONA, LORE]
    for length in (10, 12, 14):
        assert turn(memory, sent, length) == tuple(sent)
    sent[index] = without(sent[index], line)
    for length in (16, 18, 30, 60):  # the edit's turn, within the old hold, and long after
        frame = turn(memory, sent, length)
        assert frame == tuple(sent) and line not in said(frame)


def test_each_of_two_edits_of_the_persona_is_sent_as_made() -> None:
    memory = FrameMemory()
    for length in (10, 12):
        turn(memory, (MAIN, CARD, PERSONA), length)
    no_pin = without(PERSONA, "Mara's PIN is 4821.")
    assert turn(memory, (MAIN, CARD, no_pin), 14) == (MAIN, CARD, no_pin)
    nothing_private = without(no_pin, "Mara lives at 12 Elm Lane.")  # the edited persona edited again
    for length in (16, 18):
        assert turn(memory, (MAIN, CARD, nothing_private), length) == (MAIN, CARD, nothing_private)


def test_an_edit_forgets_a_part_held_after_it_stopped() -> None:
    memory = FrameMemory()
    turn(memory, (MAIN, PERSONA, LORE), 10)
    assert turn(memory, (MAIN, PERSONA), 12) == (MAIN, PERSONA, LORE)  # stopped firing: held
    no_pin = without(PERSONA, "Mara's PIN is 4821.")
    assert turn(memory, (MAIN, no_pin), 14) == (MAIN, no_pin)  # an edit: the frame as sent


def test_the_same_lines_in_another_order_are_the_part_as_first_sent() -> None:
    memory = FrameMemory()
    turn(memory, (MAIN, LORE), 10)
    reordered = FramePart("The wolves wait by the river.\nThe glade is warded.\nThe ward fails at dusk.")
    for length in (12, 14):
        assert turn(memory, (MAIN, reordered), length) == (MAIN, LORE)


# ── fewer entries of a block that came and went: the block as first sent, while held ─────────


def test_fewer_entries_of_a_block_that_came_and_went_are_the_block_as_first_sent() -> None:
    memory = FrameMemory()
    turn(memory, (MAIN, LORE), 10)
    assert turn(memory, (MAIN,), 12) == (MAIN, LORE)  # none fired: held
    assert turn(memory, (MAIN, LORE), 14) == (MAIN, LORE)  # all fired again: last sent whole at 14
    assert turn(memory, (MAIN, FEWER), 16) == (MAIN, LORE)  # some fired: the block as first sent...
    assert turn(memory, (MAIN, FEWER), 30) == (MAIN, LORE)  # ...16 messages after it was last sent whole
    assert turn(memory, (MAIN, FEWER), 31) == (MAIN, FEWER)  # ...and no longer: as sent


# ── a cut: a chat shorter than at the last turn ends every hold ─────────────────────────────


@pytest.mark.parametrize("cut", [10, 25], ids=["before it was last sent", "after it was last sent"])
def test_a_cut_ends_the_hold_of_a_part_that_stopped(cut: int) -> None:
    memory = FrameMemory()
    for length in (16, 18, 20):
        turn(memory, (MAIN, CARD, LORE), length)
    assert turn(memory, (MAIN, CARD), 22) == (MAIN, CARD, LORE)  # stopped firing: held...
    assert turn(memory, (MAIN, CARD), 30) == (MAIN, CARD, LORE)
    for length in (cut, cut + 2, 36):  # ...until the chat is cut back, and never again
        assert turn(memory, (MAIN, CARD), length) == (MAIN, CARD)


def test_a_cut_ends_the_hold_of_fewer_entries() -> None:
    memory = FrameMemory()
    turn(memory, (MAIN, LORE), 10)
    turn(memory, (MAIN,), 12)  # came and went
    assert turn(memory, (MAIN, FEWER), 14) == (MAIN, LORE)
    assert turn(memory, (MAIN, FEWER), 8) == (MAIN, FEWER)  # cut back: as sent


def test_what_is_sent_again_after_a_cut_and_a_swipe_are_no_cut() -> None:
    memory = FrameMemory()
    turn(memory, (MAIN, LORE), 20)
    assert turn(memory, (MAIN,), 22) == (MAIN, LORE)
    assert turn(memory, (MAIN,), 22) == (MAIN, LORE)  # a swipe: the same chat again, still held
    reordered = FramePart("The ward fails at dusk.\nThe wolves wait by the river.\nThe glade is warded.")
    assert turn(memory, (MAIN, reordered), 12) == (MAIN, LORE)  # cut, and sent again: as first sent


# ── the invariants, over any play ─────────────────────────────────────────────────────────


@st.composite
def plays(draw: st.DrawFn) -> list[tuple[list[FramePart], list[str], int]]:
    """Turns of a frontend that sends a few parts every turn (each may lose a line to an edit) and
    a World Info block of the entries that fired, in any order; the chat grows, is swiped or cut:
    each turn's frame as sent, the lines edited out so far, and the chat's length."""
    parts = [[f"part {p} line {i}" for i in range(draw(st.integers(1, 4)))] for p in range(draw(st.integers(1, 3)))]
    entries = [f"entry {e}" for e in range(5)]
    length, gone, turns = 10, [], []
    for _ in range(draw(st.integers(1, 12))):
        edited = draw(st.integers(-1, len(parts) - 1))
        if edited >= 0 and len(parts[edited]) > 1:
            gone.append(parts[edited].pop(draw(st.integers(0, len(parts[edited]) - 1))))
        fired = draw(st.permutations(entries).flatmap(lambda e: st.integers(0, 5).map(lambda n: e[:n])))
        sent = [FramePart("\n".join(lines)) for lines in parts] + ([FramePart("\n".join(fired))] if fired else [])
        length = max(1, length + draw(st.sampled_from([-12, -1, 0, 1, 2, 2, 2, 7])))
        turns.append((sent, list(gone), length))
    return turns


@given(plays())
def test_what_is_sent_is_in_the_frame_what_was_edited_out_or_cut_is_not(
    play: list[tuple[list[FramePart], list[str], int]],
) -> None:
    memory, last = FrameMemory(), 0
    for sent, gone, length in play:
        frame = turn(memory, sent, length)
        shown = set().union(*(lines_of(p) for p in frame))
        wanted = set().union(*(lines_of(p) for p in sent))
        assert wanted <= shown  # nothing the frontend sent is lost
        assert not shown & set(gone)  # no line edited out of a part comes back
        if length < last:
            assert shown == wanted  # a cut: only what was sent
        last = length


# ── on the wire: the PIN the user deleted is in no forwarded prompt ─────────────────────────


def test_a_pin_deleted_from_the_persona_is_not_forwarded(serving: Running, stand_in: StandIn) -> None:
    def ask(persona: FramePart, n: int) -> str:
        frame = [{"role": "system", "content": part.text} for part in (MAIN, CARD, persona)]
        client(serving).chat.completions.create(model="local", messages=[*frame, *chat(n)[1:]])
        return json.dumps(stand_in.bodies[-1]["messages"])

    assert all("4821" in ask(PERSONA, n) for n in (5, 7, 9))
    no_pin = without(PERSONA, "Mara's PIN is 4821.")
    assert not any("4821" in ask(no_pin, n) for n in (11, 13, 15))
