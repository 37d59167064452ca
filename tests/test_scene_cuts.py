"""Scenes are cut where the story cuts them (summarize/spans.py): a narrator row between
sessions, a scene-break line, a time skip — within the size bounds; by size only where the
story marks nothing."""

from __future__ import annotations

import random

import pytest

from otaku_ctx.story.model import Message
from otaku_ctx.summarize import Cutting, pack
from otaku_ctx.summarize.spans import marked

ROW = "the lamp turns and the tide comes in over the rocks below the tower, and the keeper listens. "


def dialogue(sessions: list[int], opener: str = "narrator") -> tuple[list[Message], set[int]]:
    """A two-person dialogue in dated sessions of the given lengths: each session after the
    first opens with a narrator row naming the day (or, with `opener`, a message that opens
    with a time skip). Returns the messages and the first message number of each session."""
    messages: list[Message] = []
    starts: set[int] = set()
    for day, length in enumerate(sessions, start=1):
        if day > 1:
            starts.add(len(messages) + 1)
            if opener == "narrator":
                messages.append(Message(len(messages) + 1, "system", f"Day {day}. The fog lifts over the harbour."))
        for i in range(length):
            first = opener == "time skip" and day > 1 and i == 0
            text = ("The next morning, " if first else "") + f"Row {len(messages) + 1}: {ROW}"
            role = "user" if len(messages) % 2 else "assistant"
            messages.append(Message(len(messages) + 1, role, text, "Mara" if role == "user" else "Keeper"))
    return messages, starts


@pytest.mark.parametrize("opener", ["narrator", "time skip"])
def test_a_dated_dialogues_cuts_fall_on_its_sessions_where_the_size_bounds_allow(opener: str) -> None:
    random.seed(7)
    sessions = [random.randint(22, 34) for _ in range(12)]  # each within MOST times the minimum
    messages, starts = dialogue(sessions, opener)
    cutting = Cutting(settle=0, min_chars=20 * len(ROW), min_messages=20)
    spans = pack(messages, cutting)
    # every scene but the last ends just before a session starts (each session holds the minimum)
    assert [end + 1 for _, end in spans[:-1]] == sorted(starts)[: len(spans) - 1]
    assert all(end - start + 1 >= cutting.min_messages for start, end in spans)
    assert spans[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_a_session_shorter_than_the_minimum_joins_the_next_and_a_long_one_is_cut_by_size() -> None:
    messages, starts = dialogue([10, 20, 90])
    cutting = Cutting(settle=0, min_chars=20 * len(ROW), min_messages=20)
    spans = pack(messages, cutting)
    day2, day3 = sorted(starts)
    assert spans[0] == (1, day3 - 1)  # day 1 (10) is too short alone: it runs on to day 3's start
    # day 3 (90 rows, more than MOST times the minimum, nothing marked inside): cut by size
    assert spans[1][0] == day3 and spans[1][1] - day3 + 1 == cutting.min_messages


def test_the_story_marks_these_breaks_and_not_others() -> None:
    before = Message(1, "user", "Row 1.", "Mara")
    cutting = Cutting()

    def why(text: str, role: str = "assistant") -> str | None:
        return marked(Message(2, role, text, "Keeper"), before, cutting)  # type: ignore[arg-type]

    assert why("***") == why("* * *") == why("---") == why("⁂") == "a scene-break line"
    assert why("Later that night, the bell rang.") == "a time skip ('Later that night')"
    assert why("*Hours later*, Mara wakes.") == "a time skip ('Hours later')"
    assert why("Day 3.", "system") == "a narrator row"
    assert why("She said it was later that night.") is None and why("Row 2: the lamp turns.") is None
    assert marked(Message(2, "assistant", "Más tarde esa noche."), before, Cutting(breaks=(r"más tarde",))) is not None


def test_a_story_that_marks_nothing_is_cut_by_size_as_before() -> None:
    messages = [Message(i, "user" if i % 2 else "assistant", "x" * 50) for i in range(1, 46)]
    assert pack(messages, Cutting(0, 1000, 20)) == [(1, 20), (21, 45)]
