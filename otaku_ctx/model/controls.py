"""A model's control tokens found in a text: one pattern for any of them, the longest where
two start alike. Mistral's counter cuts a prompt at them; the renderer breaks them up in
story text (render/specials.py)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any


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
