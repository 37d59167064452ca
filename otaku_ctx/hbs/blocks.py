"""Role blocks: what a rendered template is made of, before a prompt format wraps it."""

from __future__ import annotations

from dataclasses import dataclass

from ..story.model import Role


@dataclass(frozen=True)
class Block:
    """A run of prompt text spoken in one role (`{{#systemBlock}}`, `{{#userBlock}}`, ...).

    `open` marks the final turn the model is to continue ("Name: "): a text format leaves
    it unterminated, a chat format drops it or sends it as a prefill.
    `kind` is "story" for a SillyTavern story string at its default place (a format wraps it
    with its story-string sequences, never its system ones), "raw" for text already formatted
    for the format (SillyTavern's instruct-formatted examples, its chat start); otherwise empty.
    `name` is the speaker of a chat message whose text is the message alone: the format writes
    "Name: text" as its `names_behavior` says, and fills `{{name}}` in its sequences with it.
    Empty when the template wrote the name into the text itself (or there is none).
    """

    role: Role
    text: str
    open: bool = False
    kind: str = ""
    name: str = ""
