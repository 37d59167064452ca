"""A model's control tokens: which of its tokens story text must not spell (`controls`, one
rule for a tokenizer.json's added tokens, a tokenizer config's and a GGUF's), and one pattern
that finds any of them in a text, the longest where two start alike. Mistral's counter cuts a
prompt at them; the renderer breaks them up in story text (render/specials.py)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

_MARKUP = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]")  # <think>, <|start|>, [TOOL_CALLS]: a token's own markup


def is_control(text: str, special: bool) -> bool:
    """Whether story text must not spell a token of `text`: a special one, or one that looks
    like markup (`<think>`, `<tool_call>`, gpt-oss's `<|channel|>`), which llama.cpp and
    `tokenizers` match in any text just the same. A token of plain text (a run of spaces, a
    word) is left alone."""
    return bool(text) and (special or _MARKUP.fullmatch(text) is not None)


def controls(added: Iterable[Any]) -> tuple[str, ...]:
    """The texts story text must not spell, of added tokens (each with a `content` and a
    `special`, as `tokenizers` and a tokenizer config's `added_tokens_decoder` give them), in
    their order, each once (`is_control`)."""
    return tuple(dict.fromkeys(t.content for t in added if is_control(t.content, t.special)))


@lru_cache(maxsize=16)
def control_pattern(controls: tuple[str, ...]) -> re.Pattern[str]:
    """One capturing group matching any of `controls`, the longest where two start alike.
    The alternatives are a trie (`<SPECIAL_` written once for its thousand endings): a plain
    alternation of 1,000 tokens is tried branch by branch."""
    return re.compile(f"({_trie(controls)})" if controls else "(?!)")


def _trie(words: tuple[str, ...]) -> str:
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for character in word:
            node = node.setdefault(character, {})
        node[""] = {}  # a word ends here

    def pattern(node: dict[str, Any]) -> str:
        branches = [re.escape(character) + pattern(child) for character, child in sorted(node.items()) if character]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        return f"(?:{body})?" if "" in node else body  # the longer words first, then this one

    return pattern(root)
