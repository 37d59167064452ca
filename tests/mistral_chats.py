"""Chats for comparing ctx's Mistral counter with mistral-common (tests/test_model_mistral.py
against the golden counts, tests/realserver/test_mistral_real.py against mistral-common itself).

A chat is a list of {"role", "content"} messages ending on a user turn (no open turn), the
messages ctx means by a story: the system prompt first, then each message "Name: text". Its
content has the tokenizer's control tokens broken up, as ctx's renderer breaks them up in story
text, so ctx and mistral-common are given the same text. `prompt` is ctx's own text prompt for
it, in a `mistral*` format, without the open assistant turn ctx would append: the part that
mistral-common's `encode_chat_completion` encodes.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

from otaku_ctx.hbs.blocks import Block
from otaku_ctx.locations import shipped
from otaku_ctx.model.mistral import TEKKEN_SPECIALS
from otaku_ctx.render.formats import load_format, text_pieces
from otaku_ctx.render.specials import broken_up

HERE = Path(__file__).parent
STORIES = sorted((HERE / "fixtures" / "chat-templates").glob("*.jsonl"))
REFERENCE = HERE / "realserver" / "mistral_reference.py"

# ctx's format -> the tokenizers it is counted with (by their file names in mistral-common's
# data/; "tekken_v7" is tekken_240911's vocabulary as a version-7 file, see `as_v7`).
PAIRS = {
    "mistral": ("tokenizer.model.v1",),
    "mistral-v3": ("mistral_instruct_tokenizer_240216.model.v2", "mistral_instruct_tokenizer_240323.model.v3"),
    "mistral-v7": ("mistral_instruct_tokenizer_241114.model.v7",),
    "mistral-tekken": ("tekken_240718.json", "tekken_240911.json"),
    "mistral-v7-tekken": ("tekken_v7.json",),
}

# Story text that tokenizers cut in unusual places.
WORDS = (
    "the", "river", "Ilya", "Anna's", "mill,", "fog.", "don't", "1984", "3.14", "—", "…", "«quoi»",
    "naïve", "Straße", "東京の夜", "你好世界", "한국어", "🙂", "👍🏽", "🧑‍🚀", "\t", "~~~", "*waves*",
    "(OOC: brb)", "“quoted”", "▁", "<b>", "[INST]", "[/INST]", "</s>", "<s>", "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[control_9]", "<SPECIAL_42>", "<unk>", "[INST ]", "[IMG]",
)  # fmt: skip
SEPARATORS = (" ", " ", " ", "  ", "\n", "\n\n", " \n", "")
NAMES = ("Anna", "Ilya", "Mara")


def story_chat(path: Path) -> list[dict[str, str]]:
    """A fixture story's messages, cut after its last user message."""
    messages = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = json.loads(line)
        content = m["content"] if m["role"] == "system" else f"{m['name']}: {m['content']}"
        messages.append({"role": m["role"], "content": content})
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[: last_user + 1]


def random_chat(rng: random.Random, *, v7: bool) -> list[dict[str, str]]:
    """A story of a system prompt and 1-12 turns, consecutive turns of one role allowed, ending
    on the user's. For v7 (a system role of its own) the chat may open with the assistant, and
    now and then a system message follows a user one (mistral-common refuses one after an
    assistant's). Before v7, where the system prompt goes into a user turn, two shapes are
    left out, since ctx's text differs there from mistral-common's (issue 18's report): a chat
    that opens with the assistant (mistral-common opens it with an empty user turn and puts the
    system prompt on the last one; ctx makes the system prompt the opening user turn), and a
    last user turn of several messages (mistral-common puts the system prompt before the
    whole turn, ctx before its last message). So the user speaks first and the assistant
    right before the last user message."""
    messages = [{"role": "system", "content": _text(rng)}]
    for _ in range(rng.randint(0, 11)):
        after_user = messages[-1]["role"] == "user"
        role = "system" if v7 and after_user and rng.random() < 0.2 else rng.choice(("user", "assistant"))
        if len(messages) == 1 and not v7:
            role = "user"
        messages.append({"role": role, "content": _named(rng, role)})
    if not v7 and messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": _named(rng, "assistant")})
    messages.append({"role": "user", "content": _named(rng, "user")})
    return messages


def _named(rng: random.Random, role: str) -> str:
    return _text(rng) if role == "system" else f"{rng.choice(NAMES)}: {_text(rng)}"


def _text(rng: random.Random) -> str:
    """Random words; it may start with spaces or a newline, never ends with a space (ctx's
    story readers keep a message's text as written; mistral-common drops an assistant
    message's trailing spaces, a difference this comparison leaves out)."""
    lead = rng.choice(("", "", "", " ", "  ", "\n"))
    words = [rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(1, 40))]
    text = (lead + "".join(words)).rstrip(" ")
    return text if text.strip() else "word"


def chats(seed: int, count: int, *, v7: bool) -> list[list[dict[str, str]]]:
    """The fixture stories, then `count` random ones."""
    rng = random.Random(seed)
    return [*(story_chat(p) for p in STORIES), *(random_chat(rng, v7=v7) for _ in range(count))]


def sent(chat: list[dict[str, str]], specials: tuple[str, ...]) -> list[dict[str, str]]:
    """The chat as ctx sends it: the model's control tokens broken up in its text."""
    return [{"role": m["role"], "content": broken_up(m["content"], specials)} for m in chat]


def prompt(fmt_name: str, chat: list[dict[str, str]]) -> str:
    """ctx's text prompt for the chat in a built-in format, up to the open turn."""
    fmt = load_format(fmt_name, [shipped("formats")])
    pieces = text_pieces(fmt, [Block(m["role"], m["content"]) for m in chat])  # type: ignore[arg-type]
    return "".join(pieces[:-1])  # the last piece is the open assistant turn ctx appends


def as_v7(tekken: Path, out: Path) -> Path:
    """A Tekken file with `tekken`'s vocabulary as a version-7 file (Mistral Small 3.x's kind:
    mistral-common ships none), its special tokens listed as such files list them."""
    data = json.loads(tekken.read_text(encoding="utf-8"))
    data["config"]["version"] = "v7"
    total = data["config"]["default_num_special_tokens"]
    # listed as mistral-common's default specials are, in rank order (ctx's own copy of them)
    named = list(TEKKEN_SPECIALS) + [f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), total)]
    data["special_tokens"] = [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(named)]
    out.write_text(json.dumps(data), encoding="utf-8")
    return out


def reference(python: str, tokenizer: Path, chats: list[list[dict[str, str]]], texts: list[str]) -> dict[str, Any]:
    """mistral-common's counts (tests/realserver/mistral_reference.py, run by `python`)."""
    asked = json.dumps({"tokenizer": str(tokenizer), "chats": chats, "texts": texts})
    done = subprocess.run([python, str(REFERENCE)], input=asked, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"mistral-common failed: {done.stderr.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
