"""Readers through to the prompt: names as SillyTavern decides them, narrator rows, otaku
exports built and converted, neighbour formats — at the core (reader → Story → build)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import FIXTURES

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.errors import StoryError
from otaku_ctx.render.names import resolve_names
from otaku_ctx.story.convert import to_native_text
from otaku_ctx.story.detect import read_story

ST115 = FIXTURES / "sillytavern" / "variants" / "st115-unused.jsonl"
CARD = FIXTURES / "sillytavern" / "seraphina-card.png"
NEIGHBOURS = FIXTURES / "neighbours"


def settings(**prompt):
    return load_settings(overrides={f"prompt.{k}": (v, "test") for k, v in prompt.items()})


def test_115_chat_builds_with_the_cards_and_personas_names():
    story = open_story(ST115, cards=[CARD])
    prompt = build(story, settings(user="Wren")).prompt
    assert prompt is not None
    assert "unused" not in prompt
    assert '"Easy, Wren. I am Seraphina, and this is my glade."' in prompt
    assert "Where am I? Seraphina, was it?" in prompt  # <BOT>
    assert "Eldoria's edge, Wren." in prompt  # <USER>
    assert prompt.rstrip().endswith("Seraphina:")


def test_names_come_from_where_sillytavern_takes_them():
    story = read_story(ST115)
    resolved = resolve_names(story)
    assert (resolved.char.name, resolved.char.source) == ("Seraphina", "most frequent speaker")
    assert (resolved.user.name, resolved.user.source) == ("Wren", "user rows")
    resolved = resolve_names(open_story(ST115, cards=[CARD]), user="Ines", char=None, config_user="Mara")
    assert (resolved.char.source, resolved.user.name, resolved.user.source) == ("card", "Ines", "--user")
    resolved = resolve_names(story, char="Alder", config_user="Mara")
    assert (resolved.char.name, resolved.char.source, resolved.user.name, resolved.user.source) == (
        "Alder",
        "--char",
        "Mara",
        "config [prompt] user",
    )


def test_header_names_count_when_real():
    story = read_story(FIXTURES / "sillytavern" / "seraphina-chat.jsonl")
    resolved = resolve_names(story)
    assert (resolved.char.source, resolved.user.source) == ("chat header", "chat header")
    carded = resolve_names(open_story(FIXTURES / "sillytavern" / "seraphina-chat.jsonl", cards=[CARD]))
    assert carded.char.source == "card"


def test_narrator_row_is_a_system_message():
    built = build(read_story(ST115), settings(), emit="messages")
    messages = json.loads(built.prompt)
    narrator = [m for m in messages if "The wind rises over the glade." in m["content"]]
    assert narrator and narrator[0]["role"] == "system"


@pytest.mark.parametrize("name", ["tour.md", "river.md"])
def test_otaku_samples_build_and_convert_losslessly(tmp_path: Path, name: str):
    story = read_story(FIXTURES / "otaku" / name)
    native = tmp_path / "story.jsonl"
    native.write_text(to_native_text(story), encoding="utf-8")
    again = read_story(native)
    assert again.lore == tuple(replace(entry, line=again.lore[i].line) for i, entry in enumerate(story.lore))
    for window in (8192, 32768):
        st = load_settings(overrides={"model.window": (window, "test")})
        assert build(story, st).prompt == build(again, st).prompt


def test_sharegpt_one_conversation_of_many():
    path = NEIGHBOURS / "sharegpt.json"
    with pytest.raises(StoryError, match="--conversation N"):
        read_story(path)
    story = read_story(path, conversation=1)
    assert story.source_format == "sharegpt" and story.system == "Narrate gently."
    assert [(m.role, m.content) for m in story.messages] == [("user", "Hello?"), ("assistant", "The lamp answers.")]
    assert build(story, settings()).prompt


def test_sharegpt_unknown_from(tmp_path: Path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"conversations": [{"from": "robot", "value": "hi"}]}), encoding="utf-8")
    with pytest.raises(StoryError, match="unknown \"from\" 'robot'"):
        read_story(path)


def test_finetune_defaults_to_the_last_with_a_note():
    path = NEIGHBOURS / "finetune.jsonl"
    story = read_story(path)
    assert story.source_format == "finetune" and story.messages[0].content == "Question 3"
    assert story.notes and "--conversation N" in story.notes[0]
    assert read_story(path, conversation=2).messages[1].content == "Answer 2"
    with pytest.raises(StoryError, match="no conversation 4"):
        read_story(path, conversation=4)


def test_finetune_truncated(tmp_path: Path):
    text = (NEIGHBOURS / "finetune.jsonl").read_text(encoding="utf-8")
    path = tmp_path / "f.jsonl"
    path.write_text(text[:-30], encoding="utf-8")
    with pytest.raises(StoryError) as caught:
        read_story(path)
    assert caught.value.line == 3 and "cut short" in caught.value.message


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ({"data_visible": [["a", "b"]], "data": [["a", "b"]]}, "oobabooga"),
        ({"histories": {"histories": []}}, "Character.AI"),
    ],
)
def test_other_tools_chats_are_named(tmp_path: Path, content, what):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(content), encoding="utf-8")
    with pytest.raises(StoryError, match=what):
        read_story(path)


def test_lorebook_as_story_or_card_is_named():
    lorebook = FIXTURES / "sillytavern" / "eldoria-worldinfo.json"
    with pytest.raises(StoryError, match="World Info lorebook"):
        read_story(lorebook)
    with pytest.raises(StoryError, match="World Info lorebook, not a character card"):
        open_story(FIXTURES / "openai-messages.jsonl", cards=[lorebook])
