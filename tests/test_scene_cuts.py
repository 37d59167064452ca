"""Scenes are cut where the story cuts them (summarize/spans.py): a narrator row between
sessions, a scene-break line, a time skip, a gap in the messages' send dates — within the size
bounds; by size only where the story marks nothing."""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.story.model import Message
from otaku_ctx.summarize import Cutting, pack
from otaku_ctx.summarize.spans import marked, why_cut

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


def dated(sessions: list[int], gap: timedelta) -> tuple[list[Message], set[int]]:
    """Sessions of Mara and the Keeper, with no narrator row and no marked line: only each
    session's first `send_date`, `gap` after the last one before it, marks where it starts."""
    messages: list[Message] = []
    starts: set[int] = set()
    when = datetime(2025, 3, 4, 19, 0, tzinfo=UTC)
    for day, length in enumerate(sessions, start=1):
        if day > 1:
            starts.add(len(messages) + 1)
            when += gap
        for _ in range(length):
            n = len(messages) + 1
            role = "user" if n % 2 else "assistant"
            messages.append(Message(n, role, f"Row {n}: {ROW}", "Mara" if n % 2 else "Keeper", sent=when))
            when += timedelta(minutes=2)
    return messages, starts


def test_a_send_date_gap_cuts_where_nothing_else_marks_the_session() -> None:
    messages, starts = dated([26, 31, 24, 29], timedelta(days=3))
    cutting = Cutting(settle=0, min_chars=20 * len(ROW), min_messages=20)
    spans = pack(messages, cutting)
    assert [end + 1 for _, end in spans[:-1]] == sorted(starts)
    assert {why_cut(messages, end, cutting) for _, end in spans[:-1]} == {"a gap of 3 days in send_date"}
    # the same rows without their dates, or with the rule off, are cut by size
    undated = [Message(m.number, m.role, m.content, m.name) for m in messages]
    assert pack(undated, cutting) == pack(messages, replace(cutting, date_gap=0)) != spans
    assert pack(undated, cutting)[0] == (1, 20)


@pytest.mark.parametrize(
    ("gap", "why"),
    [
        (timedelta(hours=5), None),  # within the 6 hours: the same evening's session goes on
        (timedelta(hours=6), None),  # a gap must be more than date_gap
        (timedelta(hours=7), "a gap of 7 hours in send_date"),
        (timedelta(hours=50), "a gap of 2 days in send_date"),
        (-timedelta(days=2), None),  # a clock set back is no gap
    ],
)
def test_only_a_gap_over_date_gap_marks_a_break(gap: timedelta, why: str | None) -> None:
    before = Message(1, "user", "Row 1.", "Mara", sent=datetime(2025, 3, 4, 19, 0))
    after = Message(2, "assistant", "Row 2.", "Keeper", sent=before.sent + gap)  # type: ignore[operator]
    assert marked(after, before, Cutting()) == why
    assert marked(after, before, Cutting(date_gap=0)) is None


def test_a_narrator_row_days_later_names_both_reasons() -> None:
    before = Message(1, "user", "Good night.", "Mara", sent=datetime(2025, 3, 4, 22, 0))
    narrator = Message(2, "system", "Friday, 7 March.", sent=datetime(2025, 3, 7, 18, 0))
    assert marked(narrator, before, Cutting()) == "a narrator row and a gap of 2 days in send_date"
    # a local date then a UTC one: the zone between them is unknown, so no gap is read
    utc = Message(2, "assistant", "Row 2.", "Keeper", sent=datetime(2025, 3, 7, 18, 0, tzinfo=UTC))
    assert marked(utc, before, Cutting()) is None


def test_dry_run_names_the_send_date_gap(tmp_path: Path) -> None:
    messages, starts = dated([26, 31, 44], timedelta(days=3))
    header = {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-03-04", "chat_metadata": {}}
    rows = [header] + [
        {"name": m.name, "is_user": m.role == "user", "send_date": f"{m.sent:%B %d, %Y %I:%M%p}", "mes": m.content}
        for m in messages
    ]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    out = io.BytesIO()
    config = tmp_path / "config.toml"
    config.write_text(f"[summarize]\nmin_chars = {20 * len(ROW)}\n", encoding="utf-8")
    argv = ["summarize", str(chat), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run"]
    code = main([*argv, "--config", str(config)], Terminal(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO()))
    assert code == 0
    lines = [line for line in out.getvalue().decode().splitlines() if line.lstrip().startswith("summary")]
    first, second = sorted(starts)
    why = "cut before a gap of 3 days in send_date"
    assert f"messages 1–{first - 1}: " in lines[0] and lines[0].endswith(why)
    assert f"messages {first}–{second - 1}: " in lines[1] and lines[1].endswith(why)
    assert lines[2].endswith("the newest 20 messages settle first")
