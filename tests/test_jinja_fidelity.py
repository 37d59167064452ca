"""A model's own Jinja chat template, rendered by ctx, against transformers' rendering of it,
byte for byte.

tests/fixtures/jinja/expected/ holds what transformers 5.24.0's `render_jinja_template` made,
once, of the chats ctx sends for each story (tests/fixtures/jinja/chats/), through each
template of tests/fixtures/jinja/templates.json — the open turn continued
(`continue_final_message`) and, without it, a new turn asked for (`add_generation_prompt`).
A template that refused a chat left its own message (`*.error.txt`). See the README there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, sweep

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.errors import TemplateError
from otaku_ctx.render.formats import jinja_format, render_messages, template_chats
from otaku_ctx.render.jinja import render_chat

JINJA = FIXTURES / "jinja"
TEMPLATES: dict[str, dict[str, str]] = json.loads((JINJA / "templates.json").read_text(encoding="utf-8"))
CHATS = sorted((JINJA / "chats").glob("*.json"))
MODES = ("continue", "generate")


def template_source(name: str) -> str:
    return (JINJA / TEMPLATES[name]["path"]).read_text(encoding="utf-8")


def expected(chat: str, template: str, mode: str) -> tuple[str | None, str | None]:
    """(the prompt, None) or (None, the template's refusal)."""
    stem = f"{chat}.{template}.{mode}"
    refusal = JINJA / "expected" / f"{stem}.error.txt"
    if refusal.exists():
        return None, refusal.read_text(encoding="utf-8")
    return (JINJA / "expected" / f"{stem}.txt").read_bytes().decode("utf-8"), None


def config_file(tmp_path: Path, template: str) -> Path:
    """A tokenizer_config.json holding the template and its BOS/EOS, as a model folder has it."""
    entry = TEMPLATES[template]
    data = {
        "chat_template": template_source(template),
        "bos_token": entry["bos"] or None,
        "eos_token": entry["eos"] or None,
        # the model's server adds its BOS (Gemma's, Mistral's, and Llama 3's through its
        # tokenizer.json): the built-in formats leave it to the server too (one BOS)
        "add_bos_token": bool(entry["bos"]),
    }
    path = tmp_path / template / "tokenizer_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def built(story: Path, fmt: str) -> str:
    settings = load_settings(overrides={"prompt.format": (fmt, "test"), "context.reply_reserve": (64, "test")})
    prompt = build(open_story(story), settings).prompt
    assert prompt is not None
    return prompt


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("chat", CHATS, ids=lambda p: p.stem)
def test_render_matches_transformers(chat: Path, template: str, mode: str) -> None:
    messages = json.loads(chat.read_text(encoding="utf-8"))["messages"]
    entry = TEMPLATES[template]
    prompt, refusal = expected(chat.stem, template, mode)
    continued = mode == "continue"
    chat_messages = messages if continued else messages[:-1]

    def render() -> str:
        source = template_source(template)
        return render_chat(
            source,
            chat_messages,
            name=template,
            bos=entry["bos"] or None,
            eos=entry["eos"] or None,
            continue_final=continued,
        )

    if refusal is not None:
        with pytest.raises(TemplateError, match="refuses this chat") as caught:
            render()
        assert refusal in str(caught.value)
        assert "\n" not in str(caught.value)
    else:
        assert render() == prompt


def test_every_template_renders_most_chats() -> None:
    """The goldens are prompts, not a wall of refusals: each template but Gemma 2's (which
    refuses any system message) renders at least four of the five chats."""
    for template in TEMPLATES:
        rendered = sum(expected(c.stem, template, "continue")[0] is not None for c in CHATS)
        assert rendered >= (0 if template == "gemma-2" else 4), template


@pytest.mark.parametrize(("chat", "template"), sweep(CHATS, sorted(TEMPLATES)))
def test_ctx_build_with_the_template_is_transformers_render(tmp_path: Path, chat: Path, template: str) -> None:
    """`ctx build --format tokenizer_config.json` on the story the chat came from is the
    template's rendering of that chat with the open turn continued — or, where the template
    refuses it, of the first of ctx's folded chats it accepts (`formats.template_chats`): but
    for the BOS the template writes first, which the model's server adds itself (one BOS)."""
    data = json.loads(chat.read_text(encoding="utf-8"))
    story = next(
        p / data["story"] for p in (FIXTURES / "chat-templates", JINJA / "stories") if (p / data["story"]).exists()
    )
    golden = (JINJA / "expected" / f"{chat.stem}.{template}.build.txt").read_bytes().decode("utf-8")
    bos = TEMPLATES[template]["bos"]
    assert built(story, str(config_file(tmp_path, template))) == (golden.removeprefix(bos) if bos else golden)


def test_the_chats_are_what_ctx_sends() -> None:
    """The goldens' chats are ctx's own: each story's messages and folded attempts, as ctx
    makes them today."""
    fmt = jinja_format(template_source("chatml"), bos="", eos="", name="chatml")
    for chat in CHATS:
        data = json.loads(chat.read_text(encoding="utf-8"))
        story = next(
            p / data["story"] for p in (FIXTURES / "chat-templates", JINJA / "stories") if (p / data["story"]).exists()
        )
        settings = load_settings(overrides={"prompt.format": (str(JINJA / "templates" / "smollm2.jinja"), "test")})
        blocks = list(build(open_story(story), settings).blocks)
        assert render_messages(fmt, blocks) == data["messages"]
        assert [m for m, _ in template_chats(fmt, blocks)] == data["attempts"]


def test_a_refused_chat_is_folded_as_ctx_folds_it_for_the_model() -> None:
    """Gemma 2's template refuses a system message: the chat it is given has the system
    prompt folded into the first user turn, as ctx's own gemma format folds it."""
    data = json.loads((JINJA / "chats" / "basic.json").read_text(encoding="utf-8"))
    assert data["attempts"][2][0] == {
        "role": "user",
        "content": "You are Ilya, a ferryman on the Vey.\n\nAnna: Where are we going?",
    }
    golden = (JINJA / "expected" / "basic.gemma-2.build.txt").read_text(encoding="utf-8")
    assert golden.startswith("<bos><start_of_turn>user\nYou are Ilya, a ferryman on the Vey.\n\nAnna: Where")


# ctx's built-in format -> the model template it is written to, and the stories on which
# the two must build the same prompt. Where they differ, it is by a decision of the built-in
# format: ChatML, Llama 3 and Vicuna keep consecutive turns of one role apart (a group chat's
# speakers, an open turn after the character's own), which a Jinja format merges; Mistral
# v3 and Tekken put the system prompt on the last user message, which their templates drop
# when the chat ends on an open assistant turn, and refuse a system turn in mid-chat (which
# ctx's formats fold into the user's); Gemma 2's template refuses any system message. And
# the Llama 3 and Gemma 3 templates trim each message (`| trim`), which ctx's llama3,
# llama3.1 and gemma formats do not: the "unicode" story's user message ends in a space,
# kept by those formats and dropped by the templates.
AGREE = {
    "chatml": ("chatml", ["basic", "unicode"]),
    "llama3": ("llama3", ["basic"]),
    "llama3.1": ("llama3.1", ["basic"]),
    "mistral": ("mistral", ["basic", "ends-on-assistant", "group", "unicode"]),
    "mistral-v7": ("mistral-v7", ["basic", "ends-on-assistant", "group", "unicode"]),
    "mistral-v7-tekken": ("mistral-v7-tekken", ["basic", "ends-on-assistant", "group", "unicode"]),
    "gemma": ("gemma-3", ["basic", "ends-on-assistant", "group"]),
    "vicuna": ("vicuna", ["basic", "unicode"]),
}


@pytest.mark.parametrize("fmt", sorted(AGREE))
def test_built_in_format_and_the_models_template_agree(tmp_path: Path, fmt: str) -> None:
    template, stories = AGREE[fmt]
    config = str(config_file(tmp_path, template))
    for stem in stories:
        story = next(
            p / f"{stem}.jsonl"
            for p in (FIXTURES / "chat-templates", JINJA / "stories")
            if (p / f"{stem}.jsonl").exists()
        )
        assert built(story, fmt) == built(story, config), (fmt, stem)
