"""Where the scenes are cut: otaku's rule (a scene holds at least `min_chars` characters and
`min_messages` messages, the newest `settle` messages left alone), at a break the story marks
itself when one comes soon enough; then cut smaller until each scene's request fits the
summarizer's window.

A break the story marks (before a message): a gap of more than `[summarize] date_gap` hours
between its `send_date` and the one before (a new session; `story/dates.py`), a narrator or
system row after the turns, a scene-break line (`***`, `---`, `* * *`, `###`, `⁂`), or a time
skip at the start of a message ("Later that night", "The next morning", …; `[summarize]
scene_breaks` holds the patterns, in the story's language). Once a scene holds its minimum, it
is cut before the first marked break within `MOST` times the minimum's characters; only when
none comes is it cut where the minimum was reached, by size, as otaku cuts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..story.dates import apart
from ..story.model import Message

Span = tuple[int, int]  # message numbers, inclusive


@dataclass(frozen=True)
class Cutting:
    """The `[summarize]` numbers that cut scenes."""

    settle: int = 20
    min_chars: int = 6000
    min_messages: int = 20
    breaks: tuple[str, ...] = ()  # time-skip patterns of the story's language; () = TIME_SKIPS
    date_gap: float = 6.0  # hours between two messages' send dates that mark a break; 0 = none

    @property
    def time_skip(self) -> re.Pattern[str]:
        return _compiled(self.breaks or TIME_SKIPS)


MOST = 2.0  # a scene waits for a marked break until it holds this many times min_chars
TIME_SKIPS = (
    r"(later|earlier) (that|this) (morning|day|afternoon|evening|night)",
    r"(the )?(next|following) (morning|day|afternoon|evening|night|week|month|year)",
    r"(some|much|a little) (time|while) later",
    r"(hours|days|weeks|months|years|an hour|a day|a week|a month|a year) (later|pass|passed|went by)",
    r"meanwhile",
)
MARKER = re.compile(r"\s*(?:(?:\*\s*){3,}|(?:-\s*){3,}|(?:~\s*){3,}|#{3,}|⁂|<\s*scene\s*break\s*>)\s*", re.IGNORECASE)


def _compiled(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"[\s*_(\[]*(?:" + "|".join(f"(?:{p})" for p in patterns) + r")\b", re.IGNORECASE)


def marked(message: Message, before: Message | None, cutting: Cutting) -> str | None:
    """Why the story itself marks a break before `message`, or None: its row or its first line
    (`_row`), and its send date's gap since the message before (`_gap`), both when both say so."""
    if before is None or message.is_card:
        return None
    reasons = [why for why in (_row(message, before, cutting), _gap(message, before, cutting)) if why]
    return " and ".join(reasons) or None


def _row(message: Message, before: Message, cutting: Cutting) -> str | None:
    """A narrator row after the turns, a scene-break line, or a time skip opening the message."""
    if message.role == "system" and before.role != "system":
        return "a narrator row"
    first = message.content.lstrip().split("\n", 1)[0]
    if MARKER.fullmatch(first):
        return "a scene-break line"
    found = cutting.time_skip.match(first)
    if found:
        return f"a time skip ({found[0].strip(' *_([').capitalize()!r})"
    return None


def _gap(message: Message, before: Message, cutting: Cutting) -> str | None:
    """More than `date_gap` hours between the two messages' send dates (a clock set back, or
    a message with no date, is no gap)."""
    seconds = apart(before.sent, message.sent) if cutting.date_gap > 0 else None
    if seconds is None or seconds <= cutting.date_gap * 3600:
        return None
    return f"a gap of {spoken(seconds)} in send_date"


def spoken(seconds: float) -> str:
    """A gap as a person says it: minutes, hours below two days, else days."""
    if seconds < 3600:
        n, unit = round(seconds / 60), "minute"
    elif seconds < 48 * 3600:
        n, unit = int(seconds // 3600), "hour"
    else:
        n, unit = int(seconds // 86400), "day"
    return f"{n} {unit}{'' if n == 1 else 's'}"


def size(message: Message) -> int:
    """A message's weight in a scene: its text; a card counts nothing (it is never summarized)."""
    return 0 if message.is_card else len(message.content)


def pack(messages: Sequence[Message], cutting: Cutting, *, leftover_alone: bool = False) -> list[Span]:
    """otaku's packing: a span grows until it holds `min_chars` characters AND `min_messages`
    messages, then is cut — before the first break the story marks within `MOST` times the
    minimum, else there; a short leftover joins the span before it. With none before, a short
    run is one span when `leftover_alone` (a gap between scenes that must be filled), else no
    span (too little has happened yet to make a scene)."""
    spans: list[Span] = []
    if not messages:
        return spans
    first = start = messages[0].number
    chars = 0
    i = 0
    while i < len(messages):
        message = messages[i]
        chars += size(message)
        if chars >= cutting.min_chars and message.number - start + 1 >= cutting.min_messages:
            end = _marked_end(messages, i, chars, cutting)
            spans.append((start, messages[end].number))
            i = end + 1
            start, chars = (messages[i].number if i < len(messages) else messages[-1].number + 1), 0
            continue
        i += 1
    last = messages[-1].number
    if start <= last:
        if spans:
            spans[-1] = (spans[-1][0], last)
        elif leftover_alone:
            spans.append((first, last))
    return spans


def _marked_end(messages: Sequence[Message], reached: int, chars: int, cutting: Cutting) -> int:
    """Where a span that holds its minimum at `messages[reached]` ends: just before the first
    marked break within `MOST` times the minimum's characters, else at `reached`."""
    most = MOST * cutting.min_chars
    for j in range(reached + 1, len(messages)):
        if marked(messages[j], messages[j - 1], cutting):
            return j - 1
        chars += size(messages[j])
        if chars > most:
            break
    return reached


def why_cut(story_messages: Sequence[Message], end: int, cutting: Cutting) -> str:
    """Why a scene ends at message `end`: the break the story marks after it, or its size."""
    after = end  # the next message's index (numbers are 1-based)
    if after >= len(story_messages):
        return "the end of the story"
    return marked(story_messages[after], story_messages[after - 1], cutting) or "size"


def fitted(span: Span, fits: Callable[[Span], bool]) -> list[Span]:
    """`span`, or its halves (and theirs) until each one's request fits; a single message that
    does not fit stays whole (the caller reports it: it is never truncated)."""
    if fits(span) or span[0] == span[1]:
        return [span]
    middle = (span[0] + span[1]) // 2
    return fitted((span[0], middle), fits) + fitted((middle + 1, span[1]), fits)
