"""`--format` with SmolLM2's GGUF file: its own `tokenizer.chat_template`, with the BOS and
EOS texts of its vocabulary, rendered as transformers renders it (the goldens of
tests/fixtures/jinja/, made by transformers from the same template extracted from this file),
but for the story's spellings of the model's control tokens, which ctx breaks up. Here because
the GGUF is 98 MB, kept out of the repository (setup.sh caches it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server import ServerProblem, built

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.model.gguf import read_gguf
from otaku_ctx.model.vocab import gguf_controls
from otaku_ctx.render.lookup import find_format
from otaku_ctx.render.specials import JOINER

FIXTURES = Path(__file__).parents[1] / "fixtures"
JINJA = FIXTURES / "jinja"


@pytest.fixture(scope="module")
def gguf() -> Path:
    try:
        return Path(built()[1])
    except ServerProblem as exc:
        pytest.fail(str(exc))


def test_the_gguf_template_is_the_extracted_one(gguf: Path) -> None:
    fmt = find_format(str(gguf))
    assert fmt.chat_template == (JINJA / "templates" / "smollm2.jinja").read_text(encoding="utf-8")
    assert (fmt.bos_token, fmt.eos_token) == (read_gguf(gguf).bos_text, read_gguf(gguf).eos_text)
    entry = json.loads((JINJA / "templates.json").read_text(encoding="utf-8"))["smollm2"]
    assert (fmt.bos_token, fmt.eos_token) == (entry["bos"], entry["eos"])
    assert fmt.stop == ("<|im_end|>",)


@pytest.mark.parametrize("chat", sorted((JINJA / "chats").glob("*.json")), ids=lambda p: p.stem)
def test_build_with_the_gguf_is_transformers_render(gguf: Path, chat: Path) -> None:
    story_name = json.loads(chat.read_text(encoding="utf-8"))["story"]
    story = next(p / story_name for p in (FIXTURES / "chat-templates", JINJA / "stories") if (p / story_name).exists())
    settings = load_settings(overrides={"prompt.format": (str(gguf), "test"), "context.reply_reserve": (64, "test")})
    prompt = build(open_story(story), settings).prompt
    expected = (JINJA / "expected" / f"{chat.stem}.smollm2.build.txt").read_bytes().decode("utf-8")
    # transformers' render, but for the model's control tokens the story's text spells: the
    # GGUF's format names them, so each is broken up after its first character (issue 26)
    assert prompt is not None and prompt.replace(JOINER, "") == expected
    controls = gguf_controls(read_gguf(gguf))
    for at in (i for i, c in enumerate(prompt) if c == JOINER):
        assert any((prompt[at - 1] + prompt[at + 1 :]).startswith(t) for t in controls), prompt[at - 20 : at + 20]
