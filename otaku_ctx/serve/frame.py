"""The frame a chat's turn sends on: the frontend's leading system messages, remembered across
turns so that what is sent again is the same text in the same place (the backend's prompt
cache keeps it).

SillyTavern sends its main prompt, the card, the persona and the World Info entries that fired
this turn as leading system messages. Two of these change the frame from turn to turn without
changing what it says, and each would cost the cache the whole prompt after it:

- **Entries reordered.** The entries that fired are joined in one message in the order they
  fired, so the same entries come in another order. A part whose lines are all lines of a part
  sent before (the same entries, or fewer of them) is that part (`FrameMemory.matching`), sent
  as it was first sent.
- **Entries that stop firing.** A part the frontend stops sending is kept while the frame brings
  nothing new (`sticky`: for at most that many messages of the chat since it was last sent
  whole), as SillyTavern's own "sticky" entries stay after they fire. A frame that brings a part
  never sent before (another entry, an edited prompt, a group member's own card) is taken as
  sent: what it does not send again is forgotten.

Of what is left, the parts sent every turn stay first; the others move (`FrameMemory.moving`) to
where a change costs little (`chats.framed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..story.model import Story
from .chats import FramePart


def lines_of(part: FramePart) -> frozenset[str]:
    """The part's lines that say something (a part's unit of meaning: SillyTavern joins the
    entries that fired with a newline)."""
    return frozenset(line for line in part.text.split("\n") if line.strip())


@dataclass
class Kept:
    """A part of the frame as first sent, its lines, and the chat's length when it was last sent
    whole."""

    part: FramePart
    lines: frozenset[str]
    seen: int


@dataclass
class FrameMemory:
    """A chat's frame across its turns: the parts it sent, in the order it first sent them, and
    the parts that stayed in every turn (None before the first)."""

    kept: list[Kept] = field(default_factory=list)
    stable: frozenset[FramePart] | None = None
    # where each system message inside the chat was placed last turn: after this many of the
    # chat's other messages (`held`)
    anchors: dict[str, int] = field(default_factory=dict)

    def matching(self, part: FramePart, lines: frozenset[str], length: int, sticky: int) -> Kept | None:
        """The kept part this one (of these `lines`) is: the same lines, or some of them while the
        whole was sent within the last `sticky` messages."""
        for k in self.kept:
            if k.part.name == part.name and lines and lines <= k.lines:
                if lines == k.lines or length - k.seen <= sticky:
                    return k
        return None

    def frame(self, sent: Sequence[FramePart], length: int, sticky: int) -> tuple[FramePart, ...]:
        """The frame this turn sends on, for the frame the frontend `sent` with a chat of `length`
        messages: each part as first sent; with nothing new, the parts not sent again that were
        sent whole within the last `sticky` messages too (0: none)."""
        now: list[Kept] = []
        new = False
        for part in sent:
            lines = lines_of(part)
            k = self.matching(part, lines, length, sticky)
            if k is None:
                k, new = Kept(part, lines, length), True
            elif k.lines == lines:
                k.seen = length
            if all(k is not other for other in now):
                now.append(k)
        if new:  # something new: the frame as sent, the rest forgotten
            self.kept = now
        else:
            self.kept = [k for k in self.kept if any(k is n for n in now) or length - k.seen <= sticky]
        return tuple(k.part for k in self.kept)

    def moving(self, frame: Sequence[FramePart]) -> frozenset[FramePart]:
        """The frame's parts that come and go: those not among the parts that stayed in every
        turn since the chat's first (or since its frame last changed wholesale: when most of what
        stayed is gone, a card switched or a group member's turn, this turn's frame is the new
        base)."""
        parts = frozenset(frame)
        stable = self.stable
        if stable is None or sum(len(p.text) for p in stable - parts) * 2 > sum(len(p.text) for p in stable):
            stable = parts
        self.stable = stable & parts
        return parts - self.stable

    def held(self, story: Story, hold: int, settle: int) -> Story:
        """The story with each system message inside its chat (an Author's Note or an entry
        SillyTavern injects N messages from the end) where it was placed last turn, while that
        is no more than `hold` × N messages from the end (and within the newest `settle`, which
        no scene holds): it then moves every `hold` turns or so, not every turn, and each move
        costs the backend's cache the messages after it. `hold` 1: each where it was sent."""
        messages = story.messages
        if hold <= 1 or not any(m.role == "system" for m in messages):
            self.anchors = {}
            return story
        talk = sum(m.role != "system" for m in messages)
        # each message's place: (the chat's other messages up to it, 0 or 1, its order as sent)
        keys: list[tuple[int, int, int]] = []
        anchors: dict[str, int] = {}
        before = 0
        for order, message in enumerate(messages):
            if message.role != "system":
                before += 1
                keys.append((before, 0, order))  # the chat's k-th message
                continue
            depth, at = talk - before, self.anchors.get(message.content)
            held = at is not None and depth >= 1 and at <= before and talk - at <= min(hold * depth, settle - 1)
            anchors[message.content] = after = at if held and at is not None else before
            keys.append((after, 1, order))  # right after the chat's `after`-th message
        self.anchors = anchors
        ordered = [messages[order] for *_, order in sorted(keys)]
        if all(a is b for a, b in zip(ordered, messages, strict=True)):
            return story
        renumbered = tuple(m if m.number == n else replace(m, number=n) for n, m in enumerate(ordered, 1))
        return replace(story, messages=renumbered)
