"""Character cards: Tavern V1/V2/V3 from JSON or PNG, and cards joining a story."""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES
from stories import chunk, png

from otaku_ctx.errors import StoryError
from otaku_ctx.story.cards import add_cards, read_card
from otaku_ctx.story.model import Card, Message, Scene, Story

CARD_PNG = FIXTURES / "sillytavern" / "seraphina-card.png"

V2_DATA = {
    "name": "Ilya",
    "description": "A ferryman's apprentice.",
    "personality": "wry, patient",
    "scenario": "The river has gone.",
    "first_mes": "You're late.",
    "mes_example": "<START>\n{{char}}: Late again.",
    "creator_notes": "Made for tests.",
    "system_prompt": "Write as {{char}}.",
    "post_history_instructions": "Stay in character.",
    "tags": ["fantasy", "mystery"],
    "creator": "someone",
    "character_version": "1",
    "alternate_greetings": [],
    "extensions": {},
}


def read(path: Path) -> Card:
    """The card as read, less its avatar, which is the card's file name (SillyTavern's avatar)."""
    card = read_card(path)
    assert card.avatar == path.name
    return replace(card, avatar="")


ILYA = Card(
    name="Ilya",
    description="A ferryman's apprentice.",
    personality="wry, patient",
    scenario="The river has gone.",
    example_dialogue="<START>\n{{char}}: Late again.",
    first_message="You're late.",
    system_prompt="Write as {{char}}.",
    post_history_instructions="Stay in character.",
    creator_notes="Made for tests.",
    tags=("fantasy", "mystery"),
)


def text_chunk(keyword: str, card: dict[str, Any]) -> bytes:
    return chunk(b"tEXt", keyword.encode() + b"\0" + base64.b64encode(json.dumps(card).encode()))


def v2(**data: Any) -> dict[str, Any]:
    return {"spec": "chara_card_v2", "spec_version": "2.0", "data": {**V2_DATA, **data}}


def v3(**data: Any) -> dict[str, Any]:
    return {"spec": "chara_card_v3", "spec_version": "3.0", "data": {**V2_DATA, "assets": [], **data}}


def card_error(path: Path) -> StoryError:
    """Read a card expecting a StoryError that names the file and no line."""
    with pytest.raises(StoryError) as caught:
        read_card(path)
    assert str(path) in str(caught.value)
    assert caught.value.line is None
    return caught.value


# -- reading cards -------------------------------------------------------------------------


def test_seraphina_png() -> None:
    card = read_card(CARD_PNG)
    assert card.name == "Seraphina"
    assert card.description.startswith("[Seraphina's Personality=")
    assert "\r" not in card.description
    assert card.first_message.startswith("*You wake with a start")
    assert card.creator_notes == "ST Default Bot contest winner: roleplay bots category"
    assert card.tags == ()


def test_v1_json(tmp_path: Path) -> None:
    flat = {
        "name": "Ilya",
        "description": "A ferryman's apprentice.",
        "personality": "wry, patient",
        "scenario": "The river has gone.",
        "first_mes": "You're late.",
        "mes_example": "<START>\n{{char}}: Late again.",
        "creatorcomment": "Made for tests.",
    }
    path = tmp_path / "ilya.json"
    path.write_text(json.dumps(flat), encoding="utf-8")
    assert read(path) == Card(
        name="Ilya",
        description="A ferryman's apprentice.",
        personality="wry, patient",
        scenario="The river has gone.",
        example_dialogue="<START>\n{{char}}: Late again.",
        first_message="You're late.",
        creator_notes="Made for tests.",
    )


@pytest.mark.parametrize("card", [v2(), v3()], ids=["v2", "v3"])
def test_v2_and_v3_json(tmp_path: Path, card: dict[str, Any]) -> None:
    path = tmp_path / "ilya.json"
    path.write_text(json.dumps(card), encoding="utf-8")
    assert read(path) == ILYA


def test_png_prefers_ccv3_over_chara(tmp_path: Path) -> None:
    path = tmp_path / "ilya.png"
    path.write_bytes(png(text_chunk("chara", v2(name="Old Ilya")), text_chunk("ccv3", v3())))
    assert read(path) == ILYA


def test_png_itxt_and_ztxt_chunks(tmp_path: Path) -> None:
    encoded = base64.b64encode(json.dumps(v2()).encode())
    itxt = chunk(b"iTXt", b"chara\0\x01\x00\0\0" + zlib.compress(encoded))
    path = tmp_path / "itxt.png"
    path.write_bytes(png(itxt))
    assert read(path) == ILYA
    ztxt = chunk(b"zTXt", b"chara\0\x00" + zlib.compress(encoded))
    path.write_bytes(png(ztxt))
    assert read(path) == ILYA


# -- bad cards -----------------------------------------------------------------------------


def test_png_without_card_chunk(tmp_path: Path) -> None:
    path = tmp_path / "plain.png"
    path.write_bytes(png(chunk(b"tEXt", b"Comment\0just a picture")))
    assert "no character card" in card_error(path).message


def test_png_corrupt_base64(tmp_path: Path) -> None:
    path = tmp_path / "broken.png"
    path.write_bytes(png(chunk(b"tEXt", b"chara\0eyJuYW1lIjog*not base64*")))
    assert "not valid base64" in card_error(path).message


def test_png_bad_json_inside(tmp_path: Path) -> None:
    path = tmp_path / "badjson.png"
    path.write_bytes(png(chunk(b"tEXt", b"chara\0" + base64.b64encode(b'{"name": "Ilya",'))))
    assert "malformed JSON" in card_error(path).message


def test_png_truncated(tmp_path: Path) -> None:
    path = tmp_path / "half.png"
    path.write_bytes(CARD_PNG.read_bytes()[: CARD_PNG.stat().st_size // 2])
    assert "truncated PNG" in card_error(path).message


def test_png_damaged_chunk(tmp_path: Path) -> None:
    data = bytearray(png(text_chunk("chara", v2())))
    data[data.index(b"chara") + 10] ^= 0x01  # one flipped bit in the card text
    path = tmp_path / "damaged.png"
    path.write_bytes(bytes(data))
    assert "CRC" in card_error(path).message


def test_unknown_spec(tmp_path: Path) -> None:
    path = tmp_path / "v9.json"
    path.write_text(json.dumps({"spec": "chara_card_v9", "data": V2_DATA}), encoding="utf-8")
    error = card_error(path)
    assert "chara_card_v9" in error.message and "chara_card_v2" in error.message


def test_card_without_name(tmp_path: Path) -> None:
    path = tmp_path / "noname.json"
    path.write_text(json.dumps(v2(name="")), encoding="utf-8")
    assert "name" in card_error(path).message


# -- cards joining a story -----------------------------------------------------------------


def test_add_cards_renumbers_and_shifts_scenes() -> None:
    story = Story(
        path=Path("story.jsonl"),
        messages=(Message(1, "user", "Hi", "Ines"), Message(2, "assistant", "Hello"), Message(3, "user", "Bye")),
        scenes=(Scene(1, 1, 2, id=1, summary="Greetings."), Scene(2, 3, 3, id=2)),
        system="Narrate.",
    )
    seraphina = Card(name="Seraphina")
    joined = add_cards(story, [ILYA, seraphina])
    assert [m.number for m in joined.messages] == [1, 2, 3, 4, 5]
    assert [m.card for m in joined.messages[:2]] == [ILYA, seraphina]
    assert [(m.role, m.name, m.content) for m in joined.messages[:2]] == [
        ("system", "Ilya", ""),
        ("system", "Seraphina", ""),
    ]
    assert [m.content for m in joined.messages[2:]] == ["Hi", "Hello", "Bye"]
    assert [(s.start, s.end) for s in joined.scenes] == [(3, 4), (5, 5)]
    assert joined.system == "Narrate."
    assert add_cards(story, []) is story
    assert len(story) == 3  # the original is untouched


@pytest.mark.parametrize(
    ("names", "exclude", "fires"),
    [(["seraphina-card"], False, True), (["seraphina-card"], True, False), (["Seraphina"], False, False)],
)
def test_character_filter_names_the_card_by_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str], exclude: bool, fires: bool
) -> None:
    """SillyTavern's characterFilter names a character by its avatar file, less the extension:
    `--card seraphina-card.png` is "seraphina-card", whatever the card calls itself."""
    from conftest import run

    lore = tmp_path / "lore.json"
    entry = {"uid": 1, "key": [], "constant": True, "content": "THE-FILTERED-ENTRY"}
    entry["characterFilter"] = {"isExclude": exclude, "names": names, "tags": []}
    lore.write_text(json.dumps({"entries": {"1": entry}}), encoding="utf-8")
    chat = FIXTURES / "sillytavern" / "seraphina-chat.jsonl"
    code, out, _ = run(capsys, "build", chat, "--card", FIXTURES / "sillytavern" / "seraphina-card.png", "--lore", lore)
    assert code == 0 and ("THE-FILTERED-ENTRY" in out) == fires
