"""`--emit messages` and `openai-chat` conform to the model's own template (issue 26): a recap
(a system turn) in the middle of a chat is folded as the text prompt folds it, so the messages
a server would give that template render with no error — Mistral Nemo's and Command-R's demand
alternating user and assistant turns, Gemma 2's refuses a system role. The text prompt's path
is not touched (its golden files, tests/test_jinja_fidelity.py, hold it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.render.jinja import render_chat

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "tests" / "fixtures" / "chat-templates" / "templates"
STORY = REPO / "examples" / "lighthouse-case3.jsonl"  # a head, then scene summaries (a system recap), then the tail


@pytest.mark.parametrize("name", ["mistral-tekken", "gemma-2", "command-r", "nemotron-nano-v2"])
@pytest.mark.parametrize("emit", ["messages", "openai-chat"])
def test_the_messages_render_through_the_models_template(name: str, emit: str) -> None:
    template = TEMPLATES / f"{name}.jinja"
    settings = load_settings(overrides={"prompt.format": (str(template), "test"), "model.window": (4096, "test")})
    story = open_story(STORY)
    built = build(story, settings, emit=emit)
    assert built.assembly.case in (3, 4, 5) and built.prompt is not None  # the recap stands between head and tail
    body = json.loads(built.prompt)
    messages = body if emit == "messages" else body["messages"]
    roles = [m["role"] for m in messages]
    assert "system" not in roles[1:]  # no system turn after the first
    if name == "gemma-2":
        assert "system" not in roles
    rendered = render_chat(template.read_text(encoding="utf-8"), messages, name=name, bos="<s>", eos="</s>")
    # (Mistral's templates place the system message in the last user turn only when the chat
    # ends on one; every turn of the chat itself stands in the render)
    said = [m["content"].strip()[:40] for m in messages if m["role"] != "system" and m["content"].strip()]
    assert said and all(text in rendered for text in said)


@pytest.mark.parametrize("name", ["mistral-tekken", "gemma-2", "command-r", "nemotron-nano-v2"])
def test_the_text_prompt_through_the_same_template_renders_too(name: str) -> None:
    """The text path folds the same chat for the same template, with no error: the recap and
    every message of the tail stand in the prompt."""
    template = TEMPLATES / f"{name}.jinja"
    settings = load_settings(overrides={"prompt.format": (str(template), "test"), "model.window": (4096, "test")})
    built = build(open_story(STORY), settings)
    assert built.prompt is not None and built.assembly.case in (3, 4, 5)
    assert all(m.content.strip()[:40] in built.prompt for m in built.assembly.tail if m.content.strip())


@pytest.mark.parametrize("emit", ["messages", "text"])
def test_pricing_renders_only_chats_the_template_takes(emit: str, tmp_path: Path) -> None:
    """Nemotron Nano v2's template fails on a chat of a system message alone, which pricing's
    stand-in for the frame is when the open turn is not sent: the frame is priced with a blank
    user turn after it (a little more), and the build stands, with the model's counter too."""
    from gguf_files import tiny_bpe, write_gguf

    template = TEMPLATES / "nemotron-nano-v2.jinja"
    counter = write_gguf(tmp_path / "tiny.gguf", tiny_bpe())
    for tokenizer in ("cl100k_base", str(counter)):
        overrides = {
            "prompt.format": (str(template), "test"),
            "model.window": (4096 if tokenizer == "cl100k_base" else 16384, "test"),  # the tiny vocabulary: ~4x
            "model.tokenizer": (tokenizer, "test"),
        }
        built = build(open_story(STORY), load_settings(overrides=overrides), emit=emit)
        assert built.prompt is not None and built.assembly.case in (3, 4, 5), tokenizer
