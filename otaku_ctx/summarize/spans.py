"""Where the scenes are cut: otaku's rule (by size only, the newest `settle` messages left
alone), then cut smaller until each scene's request fits the summarizer's window."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..story.model import Message

Span = tuple[int, int]  # message numbers, inclusive


@dataclass(frozen=True)
class Cutting:
    """The `[summarize]` numbers that cut scenes."""

    settle: int = 20
    min_chars: int = 6000
    min_messages: int = 20


def size(message: Message) -> int:
    """A message's weight in a scene: its text; a card counts nothing (it is never summarized)."""
    return 0 if message.is_card else len(message.content)


def pack(messages: Sequence[Message], cutting: Cutting, *, leftover_alone: bool = False) -> list[Span]:
    """otaku's packing: a span grows until it holds `min_chars` characters AND `min_messages`
    messages, then is cut; a short leftover joins the span before it. With none before, a
    short run is one span when `leftover_alone` (a gap between scenes that must be filled),
    else no span (too little has happened yet to make a scene)."""
    spans: list[Span] = []
    if not messages:
        return spans
    first = start = messages[0].number
    chars = 0
    for message in messages:
        chars += size(message)
        if chars >= cutting.min_chars and message.number - start + 1 >= cutting.min_messages:
            spans.append((start, message.number))
            start, chars = message.number + 1, 0
    last = messages[-1].number
    if start <= last:
        if spans:
            spans[-1] = (spans[-1][0], last)
        elif leftover_alone:
            spans.append((first, last))
    return spans


def fitted(span: Span, fits: Callable[[Span], bool]) -> list[Span]:
    """`span`, or its halves (and theirs) until each one's request fits; a single message that
    does not fit stays whole (the caller reports it: it is never truncated)."""
    if fits(span) or span[0] == span[1]:
        return [span]
    middle = (span[0] + span[1]) // 2
    return fitted((span[0], middle), fits) + fitted((middle + 1, span[1]), fits)
