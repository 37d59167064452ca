"""The lore of a story's next turn: the entries in play, the chat lines a scan may read, and
who the prompt is for — worked out from the story, then handed to `choose`."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..story.model import LoreEntry, Message, Story
from . import choose
from .choice import Character, ChatLine, LoreChoice
from .rules import IDF_MESSAGES, MOST_REPLAY, MOST_SCAN_DEPTH, LoreRules

# The most chat messages lore ever reads: TF-IDF's window, the turns replayed, the deepest scan.
LORE_READS = IDF_MESSAGES + MOST_REPLAY + MOST_SCAN_DEPTH


@dataclass(frozen=True)
class Reader:
    """How the turn's chat is read: each message's speaker and its text with the names filled
    in (the renderer's names), and the messages every prompt sends — the first `head`, and
    the last `sure_tail` + 1, which stay in the tail at every rung."""

    speaker: Callable[[Message], str]
    fill: Callable[[str], str]
    char: str  # `{{char}}`: whose card's tags characterFilter reads ("" for no one)
    head: int
    sure_tail: int


def entries_in_play(story: Story, books: Sequence[LoreEntry]) -> tuple[LoreEntry, ...]:
    """Every World Info entry in play: the story's own lore lines (SillyTavern's chat lore,
    scanned first, unless bound to a character), the lorebooks read for every story
    (`books`), and the lorebooks of the story's cards (bound to their characters)."""
    own = tuple(e if e.character else replace(e, chat=True) for e in story.world)
    return own + tuple(books) + tuple(e for card in story.known_cards for e in card.book)


def character_of(story: Story, char: str) -> Character | None:
    """Who the prompt is for, as characterFilter sees it: `{{char}}`'s card, named by its
    file's name without the last extension (SillyTavern's avatar name), else by the card's
    name, with the card's tags; `{{char}}` with no card has no tags; no `{{char}}`, no one."""
    if not char:
        return None
    card = next((c for c in story.known_cards if c.name == char), None)
    if card is None:
        return Character(char)
    stem = re.sub(r"\.[^/.]+$", "", card.avatar)  # SillyTavern's getCharaFilename
    return Character(stem or card.name, card.tags)


def chat_lines(story: Story, reader: Reader) -> tuple[list[ChatLine], list[ChatLine], int]:
    """(the latest visible chat messages, the ones this turn's scan may read, how many
    visible chat messages the story has — the turn).

    A scan reads only messages every prompt sends, so what lore fires never depends on what
    the lore leaves room for. Only the latest `LORE_READS` messages are ever read (scan
    windows, replayed turns, TF-IDF), so only those are prepared: lore costs what the window
    costs, not what the story does."""
    n = len(story)
    surely = n - reader.sure_tail

    def line(m: Message) -> ChatLine:
        return ChatLine(m.number, reader.speaker(m), reader.fill(m.content))

    latest: list[ChatLine] = []
    for m in reversed(story.messages):
        if len(latest) == LORE_READS:
            break
        if not m.is_card:
            latest.append(line(m))
    latest.reverse()
    first = latest[0].number if latest else n + 1
    head = [line(m) for m in story.messages[: min(reader.head, first - 1)] if not m.is_card]
    turns = sum(1 for m in story.messages if not m.is_card)
    scannable = head + [x for x in latest if x.number >= surely or x.number <= reader.head]
    return latest, scannable, turns


def lore_for_turn(
    story: Story,
    books: Sequence[LoreEntry],
    rules: LoreRules,
    reader: Reader,
    *,
    count: Callable[[str], int],
    limit: int,
) -> LoreChoice:
    """The lore for this story's next turn, within `rules`' budget of `limit` (docs/lore.md)."""
    entries = entries_in_play(story, books)
    if not entries:
        return LoreChoice(rules.engine, rules.budget_for(limit), 0, ())
    chat, scannable, turns = chat_lines(story, reader)
    first = next((m.content for m in story.messages if not m.is_card), "")
    seed = f"{story.info.title}\x1f{first}"
    return choose(
        entries, chat, rules, fill=reader.fill, count=count, limit=limit, seed=seed, scannable=scannable, turns=turns,
        character=character_of(story, reader.char),
    )  # fmt: skip
