"""Who `{{char}}` and `{{user}}` are, decided the way SillyTavern decides them, with where
each name came from (for `inspect`).

    {{char}}  --char, else the story's own `char` (a native or otaku story saying who it is),
              else the first card (a --card card joins first), else a SillyTavern chat header's
              character (the reader leaves out 1.15's "unused"), else the chat's most frequent
              non-user speaker
    {{user}}  --user, else the config's [prompt] user (the persona), else the chat header's
              user, else the user rows' most frequent name

SillyTavern never reads the names in a chat's header back: `{{char}}` is the card's name and
`{{user}}` the persona's. The header and the rows are what a chat holds when neither is given.
`<USER>` and `<BOT>`, SillyTavern's (and TavernAI's) aliases, fill like `{{user}}`/`{{char}}`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..story.model import Card, Message, Role, Story

MACRO = re.compile(r"\{\{(char|user)\}\}|<(USER|BOT)>", re.IGNORECASE)

# Where a name came from, as `inspect` says it.
FROM_CHAR_FLAG = "--char"  # labels for `inspect`: where a name was given, as the user gave it
FROM_USER_FLAG = "--user"
FROM_CONFIG = "config [prompt] user"
FROM_CARD = "card"
FROM_HEADER = "chat header"
FROM_STORY = "story"
FROM_SPEAKERS = "most frequent speaker"
FROM_USER_ROWS = "user rows"
UNSET = "unset"


@dataclass(frozen=True)
class Names:
    """Who `{{char}}` and `{{user}}` are, and how unnamed speakers are called."""

    char: str = ""
    user: str = ""

    @classmethod
    def of(cls, story: Story, user: str | None = None) -> Names:
        """The names by the rules above, with `user` as --user (kept for older callers)."""
        return resolve_names(story, user=user).names

    def fill(self, text: str) -> str:
        """Replace `{{char}}`/`{{user}}` (and `<BOT>`/`<USER>`) in story data by the names,
        SillyTavern-style. This is substitution in data, never template compilation; a macro
        whose name is unknown stays."""
        if "{{" not in text and "<" not in text:
            return text

        def swap(match: re.Match[str]) -> str:
            which = (match.group(1) or match.group(2)).lower()
            name = self.char if which in ("char", "bot") else self.user
            return name or match.group(0)

        return MACRO.sub(swap, text)

    def within(self, card: Card | None) -> Names:
        """The names as a card's own text sees them: there `{{char}}` is that card."""
        return Names(card.name, self.user) if card else self

    def speaker(self, message: Message) -> str:
        return self.speaker_as(message.role, message.name)

    def speaker_as(self, role: Role, name: str | None) -> str:
        """How a row of `role` named `name` (or unnamed) is called."""
        if name:
            return name
        if role == "assistant":
            return self.char or "Assistant"
        if role == "user":
            return self.user or "User"
        return ""  # a system row without a name (SillyTavern's narrator) is sent without one

    def speakers(self, story: Story) -> list[str]:
        """Everyone who speaks the story's messages, each once, in the order they first speak."""
        return list(dict.fromkeys(self.speaker_as(role, name) for role, name in story.speakers))


@dataclass(frozen=True)
class Chosen:
    """A name and where it came from (one of the FROM_ constants, or UNSET)."""

    name: str
    source: str


@dataclass(frozen=True)
class ResolvedNames:
    char: Chosen
    user: Chosen

    @property
    def names(self) -> Names:
        return Names(char=self.char.name, user=self.user.name)


def resolve_names(
    story: Story, *, char: str | None = None, user: str | None = None, config_user: str | None = None
) -> ResolvedNames:
    """`{{char}}` and `{{user}}` for this story: `char` is --char, `user` is --user,
    `config_user` the config's `[prompt] user`; empty values count as not given."""
    return ResolvedNames(char=_char(story, char), user=_user(story, user, config_user))


def _char(story: Story, flag: str | None) -> Chosen:
    if flag:
        return Chosen(flag, FROM_CHAR_FLAG)
    weak = story.source_format == "sillytavern"  # SillyTavern never reads its header back
    if story.info.char and not weak:
        return Chosen(story.info.char, FROM_STORY)
    # The card the chat is with stands before any message (`--card` puts it there); a card
    # that joins later is a character who joins the story, not the one the chat is with.
    opening = next((m for m in story.messages if not (m.card is None and m.role == "system")), None)
    if opening is not None and opening.card is not None:
        return Chosen(opening.card.name, FROM_CARD)
    if story.info.char:
        return Chosen(story.info.char, FROM_HEADER)
    speaker = _most_frequent(story, lambda role: role != "user")
    if speaker:
        return Chosen(speaker, FROM_SPEAKERS)
    card = next((m.card for m in story.messages if m.card is not None), None)
    return Chosen(card.name, FROM_CARD) if card is not None else Chosen("", UNSET)


def _user(story: Story, flag: str | None, config: str | None) -> Chosen:
    if flag:
        return Chosen(flag, FROM_USER_FLAG)
    if config:
        return Chosen(config, FROM_CONFIG)
    if story.info.user:
        return Chosen(story.info.user, FROM_HEADER if story.source_format == "sillytavern" else FROM_STORY)
    name = _most_frequent(story, lambda role: role == "user")
    return Chosen(name, FROM_USER_ROWS) if name else Chosen("", UNSET)


def _most_frequent(story: Story, of: Callable[[Role], bool]) -> str:
    """The name that speaks most of the messages of the roles `of` admits (the first met
    among equals); "" when none is named."""
    counts: Counter[str] = Counter()
    for (role, name), count in story.speakers.items():
        if name and of(role):
            counts[name] += count
    return max(counts, key=counts.__getitem__) if counts else ""
