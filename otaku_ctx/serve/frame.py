"""The frame a chat's turn sends on: the frontend's leading system messages, remembered across
turns so that what is sent again is the same text in the same place (the backend's prompt
cache keeps it).

SillyTavern sends its main prompt, the card, the persona and the World Info entries that fired
this turn as leading system messages. Two of these change the frame from turn to turn without
changing what it says, and each would cost the cache the whole prompt after it; an edit changes
what it says, and must be sent as made. A part is matched to a kept one (`FrameMemory.matching`)
by these rules, in this order:

- **Entries reordered.** The entries that fired are joined in one message in the order they
  fired, so the same entries come in another order. A part of the same lines as a part sent
  before is that part, sent as it was first sent.
- **An edit.** A part sent alike in every turn since it first came (`Kept.steady`: the card,
  the persona, the main prompt) that now comes with fewer lines was edited (the user deleted
  their PIN from the persona): it is taken as sent, and the lines taken out are never sent
  again.
- **Fewer entries.** A part whose lines are some of those of a part that has come and gone or
  changed before (a World Info block) is that part, sent as first sent, while it is held
  (below).
- **Entries that stop firing.** A part the frontend stops sending is kept while the frame brings
  nothing new, as SillyTavern's own "sticky" entries stay after they fire. A part is held
  (`FrameMemory.holds`) only while 0 <= length − seen <= `sticky`: the chat has at most that
  many messages more than when it was last sent whole, and never across a cut — a chat shorter
  than at the last turn (cut back, messages deleted) ends every hold at once.
- **Something new.** A frame that brings a part never sent before (another entry, an edit, a
  group member's own card) is taken as sent: what it does not send again is forgotten.

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
    """A part of the frame as first sent, its lines, the chat's length when it was last sent
    whole, and whether it was sent alike (its lines, whole) in every turn since it first came."""

    part: FramePart
    lines: frozenset[str]
    seen: int
    steady: bool = True


@dataclass
class FrameMemory:
    """A chat's frame across its turns: the parts it sent, in the order it first sent them, the
    parts that stayed in every turn (None before the first), and the chat's length at the last
    turn (a shorter one is a cut)."""

    kept: list[Kept] = field(default_factory=list)
    stable: frozenset[FramePart] | None = None
    length: int = 0
    # where each system message inside the chat was placed last turn: after this many of the
    # chat's other messages (`held`)
    anchors: dict[str, int] = field(default_factory=dict)

    def holds(self, k: Kept, length: int, sticky: int) -> bool:
        """Whether `k`, not sent whole this turn, is still sent: for at most `sticky` messages of
        the chat since it was last sent whole, and never across a cut."""
        return length >= self.length and 0 <= length - k.seen <= sticky

    def matching(self, part: FramePart, lines: frozenset[str], length: int, sticky: int) -> Kept | None:
        """The kept part this one (of these `lines`) is: one of the same lines; else one it has
        some of the lines of, while that is held — unless one of those was sent alike every turn,
        when this is an edit of it (None: taken as sent)."""
        fuller = [k for k in self.kept if k.part.name == part.name and lines and lines <= k.lines]
        same = next((k for k in fuller if k.lines == lines), None)
        if same is not None or any(k.steady for k in fuller):
            return same
        return next((k for k in fuller if self.holds(k, length, sticky)), None)

    def frame(self, sent: Sequence[FramePart], length: int, sticky: int) -> tuple[FramePart, ...]:
        """The frame this turn sends on, for the frame the frontend `sent` with a chat of `length`
        messages: each part as first sent; with nothing new, the parts not sent again that are
        still held (`holds`; `sticky` 0: none)."""
        now: list[Kept] = []
        whole: list[Kept] = []
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
            if k.lines == lines:
                whole.append(k)
        for k in self.kept:
            k.steady = k.steady and any(k is w for w in whole)
        if new:  # something new: the frame as sent, the rest forgotten
            self.kept = now
        else:
            self.kept = [k for k in self.kept if any(k is n for n in now) or self.holds(k, length, sticky)]
        self.length = length
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
