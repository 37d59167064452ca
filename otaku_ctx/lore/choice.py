"""What a lore choice is: the chat lines scanned, a decision per entry, the entries placed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..story.model import LoreEntry, LorePosition


@dataclass(frozen=True)
class ChatLine:
    """One visible chat message as the scan sees it."""

    number: int
    speaker: str
    text: str


@dataclass(frozen=True)
class Character:
    """The character the prompt is for, as `characterFilter` sees it: `name` stands for
    SillyTavern's avatar file name without its extension (docs/lore.md), `tags` for its tags."""

    name: str
    tags: tuple[str, ...] = ()


Reason = Literal[
    "key", "recursion", "constant", "sticky", "decorator",  # fired
    "disabled", "character", "no_keys", "no_match", "secondary", "delay", "cooldown", "delay_until_recursion",
    "exclude_recursion", "dont_activate", "group", "probability", "budget", "cap", "empty", "position", "frame",
]  # fmt: skip
NOT_PLACED = ("budget", "cap", "frame", "empty", "position")  # fired, but not in the prompt


@dataclass(frozen=True)
class LoreDecision:
    """What became of one entry, with the facts that explain it."""

    entry: LoreEntry
    fired: bool
    reason: Reason
    key: str | None = None  # the key that matched
    message: int | None = None  # the message it matched in
    speaker: str | None = None
    by: int | str | None = None  # recursion: the entry whose content matched; group: the winner
    tokens: int = 0
    score: float | None = None
    detail: str = ""  # secondary logic, a roll, a timeout

    @property
    def placed(self) -> bool:
        return self.fired and self.reason not in NOT_PLACED


@dataclass(frozen=True)
class LoreChoice:
    """The entries placed (insertion order) and every decision, placed entries first."""

    engine: str
    budget: int
    used: int
    decisions: tuple[LoreDecision, ...]
    scanned: tuple[int, ...] = ()  # message numbers of the scan window, newest first
    notes: tuple[str, ...] = ()

    @property
    def placed(self) -> tuple[LoreDecision, ...]:
        return tuple(d for d in self.decisions if d.placed)

    @property
    def by_position(self) -> dict[LorePosition, list[LoreDecision]]:
        """The placed entries by position, each list in SillyTavern's insertion order (`order`
        lowest first; the engine's own order is kept for equal orders)."""
        at: dict[LorePosition, list[LoreDecision]] = {}
        for d in sorted(self.placed, key=lambda d: d.entry.order):
            at.setdefault(LorePosition(d.entry.position), []).append(d)  # placed: a known position
        return at

    @property
    def ranked(self) -> tuple[LoreDecision, ...]:
        """The placed entries as a template's lore lists hold them: the keyword engine's by
        relevance, SillyTavern's highest `order` first."""
        if self.engine == "keyword":
            return self.placed
        return tuple(sorted(self.placed, key=lambda d: -d.entry.order))

    def without(self, keep: int) -> LoreChoice:
        """The choice keeping only the first `keep` placed entries by priority; the rest are
        dropped as "frame" (the window could not hold the prompt with them)."""
        ranked = sorted(self.placed, key=lambda d: priority(d.entry))
        dropped = {id(d) for d in ranked[keep:]}
        decisions = tuple(replace(d, reason="frame") if id(d) in dropped else d for d in self.decisions)
        kept = tuple(d for d in decisions if d.placed) + tuple(d for d in decisions if not d.placed)
        note = (
            f"dropped {len(dropped)} of {len(ranked)} lore entries (lowest order first): "
            "the prompt had no room for them with the story"
        )
        notes = self.notes + ((note,) if dropped else ())
        return replace(self, decisions=kept, used=sum(d.tokens for d in kept if d.placed), notes=notes)

    @staticmethod
    def empty(engine: str = "keyword") -> LoreChoice:
        return LoreChoice(engine, 0, 0, ())


def priority(entry: LoreEntry) -> tuple[int, int, int]:
    """Drop order when the frame is too big: constants last, then by `order` (higher kept)."""
    return (0 if entry.constant else 1, -entry.order, 0)
