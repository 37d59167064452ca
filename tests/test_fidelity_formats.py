"""The built-in model formats against the models' own chat templates, byte for byte.

The expected prompts in tests/fixtures/chat-templates/expected/ were rendered once, offline,
from each model's Jinja chat template (`generate.py` there; sources in tests/fixtures/README.md)
for the same small stories ctx builds here: a plain chat, one ending on an assistant message,
and a group chat with two assistant speakers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.locations import shipped
from otaku_ctx.render.formats import load_format

CHAT_TEMPLATES = FIXTURES / "chat-templates"
STORIES = sorted(CHAT_TEMPLATES.glob("*.jsonl"))
# ctx format -> the reference renders it must equal (Gemma 2 and 3 write the same prompt).
REFERENCES = {
    "chatml": ["chatml"],
    "llama3": ["llama3"],
    "llama3.1": ["llama3.1"],
    "mistral": ["mistral"],
    "mistral-v3": ["mistral-v3"],
    "mistral-tekken": ["mistral-tekken"],
    "mistral-v7": ["mistral-v7"],
    "mistral-v7-tekken": ["mistral-v7-tekken"],
    "gemma": ["gemma", "gemma-2"],
    "vicuna": ["vicuna"],
    "alpaca": ["alpaca"],
}


def built(story: Path, fmt: str, emit: str = "text") -> str:
    settings = load_settings(overrides={"prompt.format": (fmt, "test"), "context.reply_reserve": (64, "test")})
    prompt = build(open_story(story), settings, emit=emit).prompt
    assert prompt is not None
    return prompt


@pytest.mark.parametrize("story", STORIES, ids=lambda p: p.stem)
@pytest.mark.parametrize("fmt", sorted(REFERENCES))
def test_text_prompt_matches_the_models_chat_template(story: Path, fmt: str) -> None:
    """Byte for byte but for the BOS the template writes first: every server adds it itself,
    so the prompt leaves it out (one BOS, always); the server's BOS and the prompt are the render."""
    prompt = built(story, fmt)
    bos = load_format(fmt, [shipped("formats")]).server_bos
    for reference in REFERENCES[fmt]:
        expected = (CHAT_TEMPLATES / "expected" / f"{story.stem}.{reference}.txt").read_text(encoding="utf-8")
        assert not prompt.startswith(bos) or not bos, f"{fmt} spells the BOS the server adds"
        assert bos + prompt == expected, f"{fmt} differs from the {reference} template"


def test_every_reference_is_compared() -> None:
    compared = {f"{s.stem}.{r}.txt" for s in STORIES for refs in REFERENCES.values() for r in refs}
    assert {p.name for p in (CHAT_TEMPLATES / "expected").glob("*.txt")} == compared


@pytest.mark.parametrize("fmt", ["mistral", "mistral-v3", "mistral-tekken", "gemma"])
@pytest.mark.parametrize("story", STORIES, ids=lambda p: p.stem)
def test_chat_messages_have_no_system_role_where_the_model_has_none(story: Path, fmt: str) -> None:
    """A server running these models' templates refuses a system message (Gemma 2) or one
    that is not first (Mistral, Gemma 3), and demands alternating turns."""
    body = json.loads(built(story, fmt, "openai-chat"))
    roles = [m["role"] for m in body["messages"]]
    assert "system" not in roles
    assert roles[0] == "user"
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


def test_chat_messages_fold_the_system_prompt_as_the_template_does() -> None:
    story = CHAT_TEMPLATES / "basic.jsonl"
    first = json.loads(built(story, "gemma", "messages"))[0]["content"]
    assert first == "You are Ilya, a ferryman on the Vey.\n\nAnna: Where are we going?"
    last_user = json.loads(built(story, "mistral-v3", "messages"))[-1]
    assert last_user == {
        "role": "user",
        "content": "You are Ilya, a ferryman on the Vey.\n\nAnna: How long will it take?",
    }


def test_formats_with_a_system_role_keep_it_in_chat_messages() -> None:
    story = CHAT_TEMPLATES / "group.jsonl"
    for fmt in ("chatml", "llama3.1", "mistral-v7", "mistral-v7-tekken"):
        roles = [m["role"] for m in json.loads(built(story, fmt, "messages"))]
        assert roles[0] == "system", fmt
    # ChatML and Llama 3 give each speaker of a group chat a turn of their own.
    assert [m["role"] for m in json.loads(built(story, "chatml", "messages"))] == [
        "system", "user", "assistant", "assistant", "user",
    ]  # fmt: skip


# --- request bodies -----------------------------------------------------------------------


def body(fmt: str, emit: str, **settings: object) -> dict[str, object]:
    overrides = {"prompt.format": (fmt, "test"), **{k: (v, "test") for k, v in settings.items()}}
    prompt = build(open_story(CHAT_TEMPLATES / "group.jsonl"), load_settings(overrides=overrides), emit=emit).prompt
    assert prompt is not None
    return dict(json.loads(prompt))


@pytest.mark.parametrize("emit", ["openai-chat", "openai-completion"])
def test_a_request_body_names_its_model_only_when_one_is_set(emit: str) -> None:
    assert body("chatml", emit, **{"model.name": "qwen2.5-7b-instruct"})["model"] == "qwen2.5-7b-instruct"
    assert "model" not in body("chatml", emit)


def test_max_tokens_is_left_out_when_the_reserve_is_zero() -> None:
    assert "max_tokens" not in body("chatml", "openai-chat", **{"context.reply_reserve": 0})
    assert body("chatml", "openai-chat", **{"context.reply_reserve": 64})["max_tokens"] == 64


def test_stop_strings_keep_the_most_important_within_the_limit() -> None:
    """End of turn first, then the user's name; never the name of the one speaking (Ilya)."""
    assert body("llama3.1", "openai-chat")["stop"] == ["<|eot_id|>", "\nAnna:", "<|eom_id|>", "<|start_header_id|>"]
    every = body("llama3.1", "openai-chat", **{"model.max_stop_strings": 0})["stop"]
    assert every == ["<|eot_id|>", "\nAnna:", "<|eom_id|>", "<|start_header_id|>", "\nMara:"]
    assert body("chatml", "openai-completion", **{"model.max_stop_strings": 2})["stop"] == ["<|im_end|>", "\nAnna:"]
