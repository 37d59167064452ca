"""ctx's Mistral counter against mistral-common itself (issue 18's Done-when): for every
`mistral*` format counted with its own Mistral tokenizer, ctx's count of the prompt for a story
ending on a user turn equals `len(encode_chat_completion(...).tokens)` for the same messages.

No model server is needed; this is the step where CI may fetch things. setup.sh puts the pinned
mistral-common wheel in a venv of its own in the cache and unzips the tokenizer files it ships;
mistral-common runs there (tests/realserver/mistral_reference.py), ctx here. The chats are the
fixture stories and random ones (tests/mistral_chats.py: emoji, CJK, leading spaces, newlines,
control-token look-alikes broken up as ctx breaks them up), and one long story: otaku's sample
"The River That Forgot Its Name", paragraph by paragraph.
"""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path

import mistral_chats as mc
import pytest
from server import SETUP

from otaku_ctx.model.mistral import mistral_counter

RANDOM_CHATS = 150
RIVER = Path(__file__).parents[1] / "fixtures" / "otaku" / "river.md"
PAIRS = [(fmt, name) for fmt, names in mc.PAIRS.items() for name in names]


@pytest.fixture(scope="module")
def mistral_common() -> tuple[str, Path]:
    """(the Python of mistral-common's venv, the folder of its tokenizer files)."""
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
    if found.returncode or "MISTRAL_COMMON_PYTHON" not in paths:
        pytest.fail(f"{found.stderr.strip()} (tests/realserver/setup.sh fetches mistral-common)")
    return paths["MISTRAL_COMMON_PYTHON"], Path(paths["MISTRAL_COMMON_DATA"])


def long_chat() -> list[dict[str, str]]:
    """The river story's paragraphs as turns, the user's and the assistant's in turn."""
    paragraphs = [p.strip() for p in RIVER.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    chat = [{"role": "system", "content": paragraphs[0]}]
    for number, text in enumerate(paragraphs[1:]):
        chat.append({"role": "user" if number % 2 == 0 else "assistant", "content": text})
    return chat if chat[-1]["role"] == "user" else chat[:-1]


@pytest.mark.parametrize(("fmt", "name"), PAIRS, ids=[f"{f}+{n}" for f, n in PAIRS])
def test_ctx_counts_the_tokens_mistral_common_encodes(
    mistral_common: tuple[str, Path], fmt: str, name: str, tmp_path: Path
) -> None:
    python, data = mistral_common
    path = mc.as_v7(data / "tekken_240911.json", tmp_path / name) if name == "tekken_v7.json" else data / name
    counter = mistral_counter(path)
    v7 = fmt.startswith("mistral-v7")
    stories = [*mc.chats(zlib.crc32(name.encode()), RANDOM_CHATS, v7=v7), long_chat()]
    chats = [mc.sent(c, counter.specials) for c in stories]
    answer = mc.reference(python, path, chats, [])
    assert answer["version"] == ("v7" if v7 else "v3" if "tekken" in name else name[-2:])
    prompts = [mc.prompt(fmt, chat) for chat in chats]
    wrong = [
        (i, counter(p), n) for i, (p, n) in enumerate(zip(prompts, answer["chats"], strict=True)) if counter(p) != n
    ]
    assert not wrong, f"(chat, ctx, mistral-common) differ: {wrong[:5]}; the first: {chats[wrong[0][0]]!r}"
    assert sum(answer["chats"]) > 10_000  # the long story is in it
    if name.endswith(".json"):  # Tekken decodes to the very text it encoded
        assert prompts == answer["shown"]


@pytest.mark.parametrize("name", sorted({n for _, n in PAIRS if n != "tekken_v7.json"}))
def test_plain_text_counts_as_mistral_common_encodes_it(mistral_common: tuple[str, Path], name: str) -> None:
    """Random story text without control tokens: SentencePiece's dummy prefix is the space ctx
    counts before it."""
    python, data = mistral_common
    counter = mistral_counter(data / name)
    texts = [text for chat in mc.chats(99, 60, v7=True) for text in (m["content"] for m in chat)]
    texts = [mc.sent([{"role": "user", "content": t}], counter.specials)[0]["content"] for t in texts]
    answer = mc.reference(python, data / name, [], texts)
    space = "" if name.endswith(".json") else " "
    assert [counter(space + t) for t in texts] == answer["texts"]
