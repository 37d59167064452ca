"""A model's control tokens in story text: found, and broken up so a server never reads them.

A text-completion server (llama.cpp's `/completion`, KoboldCpp, vLLM's `/v1/completions`)
tokenizes the whole prompt with its special tokens parsed, so a message that spells
`<|im_end|>` or `[INST]` would end a turn or open one. In a text prompt, every such spelling
in what the template rendered (story text, names, lore, the template's own text) gets a
WORD JOINER (U+2060, invisible, no break) after its first character: the model reads the
same letters, as text. The format's own sequences are added after, so they stay the
control tokens they are. docs/decisions.md says why this character.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from ..model.controls import control_pattern

JOINER = "\u2060"


@lru_cache(maxsize=8)
def _finder(specials: tuple[str, ...]) -> re.Pattern[str] | None:
    """The control tokens a split can break: two characters or more, none holding the joiner."""
    usable = tuple(s for s in specials if len(s) > 1 and JOINER not in s)
    return control_pattern(usable) if usable else None


def spelled(text: str, specials: Sequence[str]) -> list[str]:
    """The control tokens `text` spells, each once, in the order first met."""
    finder = _finder(tuple(specials))
    return list(dict.fromkeys(finder.findall(text))) if finder else []


def broken_up(text: str, specials: Sequence[str]) -> str:
    """`text` with no control token spelled in it: each spelling split after its first
    character. A split can only make a new spelling out of what follows it, so the text is
    searched again until none is left (each pass splits at least one, so it ends)."""
    finder = _finder(tuple(specials))
    if finder is None:
        return text
    while finder.search(text):
        text = finder.sub(lambda m: m[0][0] + JOINER + m[0][1:], text)
    return text
