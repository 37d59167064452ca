"""Role blocks: what a rendered template is made of, before a prompt format wraps it."""

from __future__ import annotations

from dataclasses import dataclass

from .model import Role


@dataclass(frozen=True)
class Block:
    """A run of prompt text spoken in one role (`{{#systemBlock}}`, `{{#userBlock}}`, ...).

    `open` marks the final turn the model is to continue ("Name: "): a text format leaves
    it unterminated, a chat format drops it or sends it as a prefill.
    `kind` is "story" for a SillyTavern story string at its default place (a format may wrap
    it with its story-string sequences instead of its system ones); otherwise empty.
    """

    role: Role
    text: str
    open: bool = False
    kind: str = ""
