"""Converting any Story to native JSONL, losslessly, and writing files atomically."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FIXTURES, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otaku_ctx.errors import StoryError
from otaku_ctx.files import write_atomic
from otaku_ctx.story.cards import add_cards, read_card
from otaku_ctx.story.convert import to_native_lines, to_native_text
from otaku_ctx.story.detect import read_story
from otaku_ctx.story.model import Card, Message, Scene, Story, StoryInfo

NATIVE_STORY = [
    {
        "type": "story",
        "title": "The Lamp",
        "user": "Ines",
        "scenario": "A lighthouse.",
        "cast": [{"name": "Alder", "description": "The missing keeper.", "tags": ["keeper"]}],
    },
    {"role": "system", "content": "Narrate."},
    {"role": "system", "content": "Never speak for Ines."},
    {
        "type": "card",
        "name": "Gull",
        "description": "A talking gull.",
        "personality": "rude",
        "first_message": "Skraa.",
        "tags": ["bird", "comic"],
    },
    {"role": "user", "name": "Ines", "content": "I knock."},
    {"type": "scene", "id": 2, "start": 4, "end": 5, "title": "Inside", "history": "All of it."},
    {"role": "assistant", "content": "The door opens.\n\nLight spills out — ünïcödé."},
    {"role": "user", "name": "Ines", "content": "I step in."},
    {
        "type": "scene",
        "id": 1,
        "start": 1,
        "end": 3,
        "title": "Outside",
        "summary": "Ines knocks.",
        "history": "Ines knocks.",
    },
    {"role": "system", "content": "(Later a system note.)"},
]


def comparable(story: Story) -> tuple[object, ...]:
    """What the native format holds: all but path, line fields, hidden and source_format. A
    card's lorebook is written as lore lines bound to its character, so lore is compared as
    one list: the story's World Info entries, then each card's."""
    books = [e for m in story.messages if m.card for e in m.card.book]
    return (
        tuple(replace(m, line=None, card=replace(m.card, book=()) if m.card else None) for m in story.messages),
        tuple(replace(s, line=None) for s in story.scenes),
        story.system,
        story.info,
        tuple(replace(e, line=None) for e in story.lore),
        tuple(replace(e, line=None) for e in [*story.world, *books]),
    )


def round_trip(story: Story, tmp_path: Path) -> Story:
    path = tmp_path / "converted.jsonl"
    write_atomic(path, to_native_text(story))
    back = read_story(path)
    assert back.source_format == "native"
    return back


def native_story(tmp_path: Path) -> Path:
    path = tmp_path / "native.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in NATIVE_STORY), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "source",
    [
        FIXTURES / "openai-messages.jsonl",
        FIXTURES / "sillytavern" / "seraphina-chat.jsonl",
        FIXTURES / "otaku" / "river.md",
    ],
    ids=["openai", "sillytavern", "otaku"],
)
def test_fixture_round_trip(source: Path, tmp_path: Path) -> None:
    story = read_story(source)
    assert comparable(round_trip(story, tmp_path)) == comparable(story)


def test_native_round_trip_with_cards_and_scenes(tmp_path: Path) -> None:
    story = read_story(native_story(tmp_path))
    assert len(story.cards) == 1 and len(story.scenes) == 2 and len(story.info.cast) == 1
    assert comparable(round_trip(story, tmp_path)) == comparable(story)


def test_round_trip_after_adding_a_card(tmp_path: Path) -> None:
    seraphina = read_card(FIXTURES / "sillytavern" / "seraphina-card.png")
    story = add_cards(read_story(FIXTURES / "otaku" / "river.md"), [seraphina])
    back = round_trip(story, tmp_path)
    assert comparable(back) == comparable(story)
    assert back.message(1).card is not None and back.scenes[0].start == 2


def test_native_lines_shape(tmp_path: Path) -> None:
    records = [json.loads(line) for line in to_native_lines(read_story(native_story(tmp_path)))]
    assert records[0] == {
        "type": "story",
        "title": "The Lamp",
        "user": "Ines",
        "scenario": "A lighthouse.",
        "cast": [{"name": "Alder", "description": "The missing keeper.", "tags": ["keeper"]}],
    }
    assert records[1] == {"role": "system", "content": "Narrate.\n\nNever speak for Ines."}
    assert records[2] == {
        "type": "card",
        "name": "Gull",
        "description": "A talking gull.",
        "personality": "rude",
        "first_message": "Skraa.",
        "tags": ["bird", "comic"],
    }
    assert records[3] == {"role": "user", "name": "Ines", "content": "I knock."}
    assert records[-2] == {
        "type": "scene",
        "id": 1,
        "start": 1,
        "end": 3,
        "title": "Outside",
        "summary": "Ines knocks.",
        "history": "Ines knocks.",
    }
    assert records[-1] == {"type": "scene", "id": 2, "start": 4, "end": 5, "title": "Inside", "history": "All of it."}


def test_story_without_info_or_system_starts_with_a_message() -> None:
    story = Story(path=Path("s"), messages=(Message(1, "user", "Hi"),))
    assert to_native_lines(story) == ['{"role": "user", "content": "Hi"}']


def test_leading_system_message_is_refused() -> None:
    story = Story(path=Path("s.md"), messages=(Message(1, "system", "Note.", line=7), Message(2, "user", "Hi")))
    with pytest.raises(StoryError) as caught:
        to_native_lines(story)
    assert caught.value.line == 7 and "message 1 is a system message" in caught.value.message


# -- property: any story the native format can hold survives the trip ----------------------

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
names = st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=8))
cards = st.builds(
    Card,
    name=st.text(st.characters(whitelist_categories=("L",)), min_size=1, max_size=8),
    description=texts,
    personality=texts,
    first_message=texts,
    tags=st.lists(texts, max_size=2).map(tuple),
)


@st.composite
def stories(draw: st.DrawFn) -> Story:
    count = draw(st.integers(1, 12))
    messages = []
    for number in range(1, count + 1):
        card = draw(st.one_of(st.none(), cards))
        if card is not None:
            messages.append(Message(number, "system", "", card.name, card=card))
        else:
            roles = ("user", "assistant") if number == 1 else ("user", "assistant", "system")
            messages.append(Message(number, draw(st.sampled_from(roles)), draw(texts), draw(names)))
    cuts = sorted(draw(st.sets(st.integers(1, count), max_size=4)))
    scenes, start = [], 1
    for order, end in enumerate(cuts, start=1):
        scenes.append(
            Scene(
                order,
                start,
                end,
                id=draw(st.one_of(st.none(), st.just(order * 10))),
                title=draw(texts),
                summary=draw(texts),
                history=draw(texts),
            )
        )
        start = end + 1
    info = StoryInfo(title=draw(texts), user=draw(texts), cast=tuple(draw(st.lists(cards, max_size=2))))
    return Story(Path("random"), tuple(messages), tuple(scenes), system=draw(texts), info=info)


@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(story=stories())
def test_any_native_story_round_trips(story: Story, tmp_path: Path) -> None:
    assert comparable(round_trip(story, tmp_path)) == comparable(story)


# -- atomic writes -------------------------------------------------------------------------


def test_write_atomic_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_atomic(path, "first\n")
    assert path.read_text(encoding="utf-8") == "first\n"
    write_atomic(path, "second — ü\n")
    assert path.read_bytes() == "second — ü\n".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old\n", encoding="utf-8")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half \ud800 written")  # a lone surrogate cannot be encoded
    assert path.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


def test_write_atomic_keeps_the_mode_of_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("old\n", encoding="utf-8")
    os.chmod(path, 0o640)
    write_atomic(path, "new\n")
    assert path.stat().st_mode & 0o777 == 0o640
