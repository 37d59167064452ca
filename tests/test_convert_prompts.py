"""`ctx convert` decides nothing of the prompt: the converted story builds byte-identical
prompts to the original, for every shipped template and format, with cards and personas.

A chat a user brings is converted once and built many times, so a difference here is a
story changed silently. The cases are the chats where the two could part: a SillyTavern
chat whose header names the character differently from the card given with `--card`
(SillyTavern never reads its header back), group chats, ShareGPT and legacy TavernAI files,
otaku's own export with its cast, each built with and without a persona (`--user`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from conftest import deep, sweep

from otaku_ctx.build import build, native_text, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.locations import shipped
from otaku_ctx.story.model import Story

FIXTURES = Path(__file__).parent / "fixtures"
CARD = FIXTURES / "sillytavern" / "seraphina-card.png"
TEMPLATES = ["default", "serene", "sillytavern", str(FIXTURES / "sillytavern" / "context" / "chatml.json")]
FORMATS = sorted(p.stem for p in shipped("formats").glob("*.toml")) + [
    str(FIXTURES / "sillytavern" / "instruct" / "alpaca.json")
]


def renamed_header(tmp_path: Path) -> Path:
    """Seraphina's chat with a header that calls her "Sera" (the card says "Seraphina")."""
    lines = (FIXTURES / "sillytavern" / "seraphina-chat.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0]) | {"character_name": "Sera"}
    path = tmp_path / "sera.jsonl"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    return path


CHATS = {
    "renamed header + card": (renamed_header, [CARD]),
    "sillytavern + card": (lambda _: FIXTURES / "sillytavern" / "seraphina-chat.jsonl", [CARD]),
    "group": (lambda _: FIXTURES / "sillytavern" / "variants" / "group-metadata-header.jsonl", [CARD]),
    "sharegpt": (lambda _: FIXTURES / "neighbours" / "sharegpt.json", []),  # its second conversation
    "tavernai": (lambda _: FIXTURES / "neighbours" / "tavernai-legacy.jsonl", [CARD]),
    "otaku": (lambda _: FIXTURES / "otaku" / "tour.md", []),
}


def converted(story: Story, tmp_path: Path) -> Story:
    path = tmp_path / "converted.jsonl"
    path.write_text(native_text(story), encoding="utf-8")
    return open_story(path)


# a diagonal of the chats and personas in the quick suite; otaku's tour (20 s) in the deep one only
QUICK = [c for c in CHATS if c != "otaku"]
OTAKU = [pytest.param("otaku", p, marks=deep, id=f"otaku-{p}") for p in (None, "Ash")]


@pytest.mark.parametrize(("chat", "persona"), [*sweep(QUICK, [None, "Ash"]), *OTAKU])
def test_a_converted_chat_builds_the_same_prompts(chat: str, persona: str | None, tmp_path: Path) -> None:
    make, cards = CHATS[chat]
    story = open_story(make(tmp_path), None, cards, 2 if chat == "sharegpt" else None)
    back = converted(story, tmp_path)
    differ = []
    for template, format in itertools.product(TEMPLATES, FORMATS):
        given = {"prompt.template": (template, "--template"), "prompt.format": (format, "--format")}
        given |= {"model.window": (40_000 if chat == "otaku" else 16_384, "--window")}
        given |= {"model.tokenizer": ("estimate", "--tokenizer")}  # the prompts are compared as text
        if persona:
            given["prompt.user"] = (persona, "--user")
        settings = load_settings(None, given)
        prompt = build(story, settings).prompt
        assert prompt is not None, f"{chat} is refused at this window: nothing would be compared"
        if prompt != build(back, settings).prompt:
            differ.append(f"{Path(template).name} × {Path(format).name}")
    assert not differ, f"{chat}: the converted story builds other prompts with {differ}"


def test_the_renamed_header_case_is_one_where_the_names_part(tmp_path: Path) -> None:
    """The header's name and the card's differ, so the test above can fail: written as it
    was read, the header's "Sera" would become {{char}} in the converted story."""
    from otaku_ctx.story.convert import to_native_text

    story = open_story(renamed_header(tmp_path), None, [CARD])
    assert story.info.char == "Sera" and '"char": "Sera"' in to_native_text(story)
    assert '"char": "Seraphina"' in native_text(story)
