"""Who `{{char}}` and `{{user}}` are, and how story data's macros are filled in."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model import Card, Message, Story

MACRO = re.compile(r"\{\{(char|user)\}\}", re.IGNORECASE)


@dataclass(frozen=True)
class Names:
    """Who `{{char}}` and `{{user}}` are, and how unnamed speakers are called."""

    char: str = ""
    user: str = ""

    @classmethod
    def of(cls, story: Story, user: str | None = None) -> Names:
        cards = story.cards
        char = story.info.char or (cards[0].card.name if cards and cards[0].card else "")
        return cls(char=char, user=user or story.info.user)

    def fill(self, text: str) -> str:
        """Replace `{{char}}`/`{{user}}` in story data by the names, SillyTavern-style. This is
        substitution in data, never template compilation; a macro whose name is unknown stays."""
        if "{{" not in text:
            return text

        def swap(match: re.Match[str]) -> str:
            name = self.char if match.group(1).lower() == "char" else self.user
            return name or match.group(0)

        return MACRO.sub(swap, text)

    def within(self, card: Card | None) -> Names:
        """The names as a card's own text sees them: there `{{char}}` is that card."""
        return Names(card.name, self.user) if card else self

    def speaker(self, message: Message) -> str:
        if message.name:
            return message.name
        if message.role == "assistant":
            return self.char or "Assistant"
        if message.role == "user":
            return self.user or "User"
        return "System"


# ── Finding templates and formats ────────────────────────────────────────────────────────
