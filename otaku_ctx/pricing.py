"""What each part of a prompt costs once it is rendered: the `Pricer` the assembler asks.

The assembler prices each part by what it adds to the rendered blocks, so the fit test
counts the template's preamble, wrappers and per-message overhead, and the final count is
taken on what is actually emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .assembler import Assembly, Part
from .blocks import Block
from .emit import PromptRenderer
from .formats import text_pieces
from .model import Message, Role, Scene
from .tokens import TokenCounter

# A chat message costs its content plus the role and the message's own framing; OpenAI's
# published rule for cl100k chat models is 3 tokens a message + the role, and 3 to prime
# the reply. That is what `--emit messages` and `--emit openai-chat` are counted by.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3


class TemplatePricer:
    """Prices parts by what they add to the emitted prompt, piece by piece.

    The emitted prompt is a list of pieces: for a text format, the BOS and each merged turn
    with its sequences; for chat output, each merged message. A part is priced by rendering
    the template twice, without and with it, and counting only the pieces that differ, so
    the template's framing, the format's sequences and merging are all in the price without
    ever counting the whole prompt:

    - a message or card of the head or tail is measured after a message of the other role
      (they alternate in a chat, so its turn stands alone);
    - a recap part (card, summary, history) is measured after another recap part, as it
      stands in a run of them: its run price. What a recap costs once, whatever it holds
      (its turn's sequences, a template's "Story history:" header), is `recap_opening()`.

    The prices add up to the prompt's count whenever the template renders the parts that
    way; the assembler still takes the exact count of the prompt it chooses.
    """

    def __init__(self, renderer: PromptRenderer, counter: TokenCounter) -> None:
        self.renderer = renderer
        self.count = counter
        self._fixed: int | None = None
        self._opening: int | None = None
        self._cache: dict[tuple[str, Part], int] = {}
        self._rendered: tuple[tuple[Any, ...], list[Block]] | None = None

    def pieces(self, blocks: Sequence[Block]) -> list[str]:
        if self.renderer.chat_counted:
            return [m["content"] for m in self.renderer.messages(blocks)]
        return text_pieces(self.renderer.format, blocks)

    def piece_cost(self, piece: str) -> int:
        overhead = MESSAGE_OVERHEAD if self.renderer.chat_counted else 0
        return self.count.bound(piece) + overhead

    def cost(self, blocks: Sequence[Block]) -> int:
        """Tokens of the emitted prompt for these blocks, as the sum of its pieces."""
        priming = REPLY_PRIMING if self.renderer.chat_counted else 0
        return sum(self.piece_cost(p) for p in self.pieces(blocks)) + priming

    def delta(self, before: Sequence[Block], after: Sequence[Block]) -> int:
        """What `after` adds to `before`, counting only the pieces that differ."""
        old, new = self.pieces(before), self.pieces(after)
        start, end_old, end_new = _difference(old, new)
        return self.region(new, start, end_new) - self.region(old, start, end_old)

    def region(self, pieces: list[str], start: int, end: int) -> int:
        """Tokens of pieces[start:end] where they stand. In a text prompt, a piece is counted
        after the piece before it, since sequences meeting at a boundary ("<|eot_id|>" then
        "<|start_header_id|>") can tokenize together."""
        if start == end:
            return 0
        if self.renderer.chat_counted:
            return sum(map(self.piece_cost, pieces[start:end]))
        before = pieces[start - 1] if start else ""
        return self.count.bound(before + "".join(pieces[start:end])) - self.count.bound(before)

    def fixed(self) -> int:
        if self._fixed is None:
            self._fixed = self.cost(self.renderer.render([], [], []))
        return self._fixed

    def part(self, part: Part, after: Role | None = None) -> int:
        """A head or tail message (or card), measured after a turn of role `after`, so that
        merging with a turn of the same role is priced as it will render."""
        key = (f"verbatim after {after}", part)
        cached = self._cache.get(key)
        if cached is None:
            before = [_PROBES[after]] if after else []
            render = self.renderer.render
            cached = self._cache[key] = self.delta(render(before, [], []), render([*before, part], [], []))
        return cached

    def recap_part(self, part: Part) -> int:
        """A recap part's run price: measured after another recap part, as it will stand."""
        key = ("recap", part)
        cached = self._cache.get(key)
        if cached is None:
            render = self.renderer.render
            before = render([_PROBE_USER], [_PROBE_RECAP], [])
            cached = self._cache[key] = self.delta(before, render([_PROBE_USER], [_PROBE_RECAP, part], []))
        return cached

    def recap_opening(self, after: Role | None = None) -> int:
        """What a non-empty recap costs beyond its parts' run prices, after a turn of role `after`."""
        key = (f"opening after {after}", _PROBE_RECAP)
        cached = self._cache.get(key)
        if cached is None:
            before = [_PROBES[after]] if after else []
            render = self.renderer.render
            first = self.delta(render(before, [], []), render(before, [_PROBE_RECAP], []))
            cached = self._cache[key] = first - self.recap_part(_PROBE_RECAP_2)
        return cached

    def exact(self, assembly: Assembly) -> int:
        return self.tokens(self.blocks(assembly))

    def text(self, text: str) -> int:
        return self.count.bound(text)

    def blocks(self, assembly: Assembly) -> list[Block]:
        """The assembly's blocks; the last one rendered for `exact` is kept, since the
        candidate that was counted is the one that is emitted."""
        key = (assembly.head, assembly.recap, assembly.tail)
        if self._rendered is None or self._rendered[0] != key:
            self._rendered = (key, self.renderer.blocks(assembly))
        return self._rendered[1]

    def tokens(self, blocks: Sequence[Block]) -> int:
        """The count of the emitted prompt: the flat text, or chat messages by OpenAI's rule."""
        if self.renderer.chat_counted:
            contents = [m["content"] for m in self.renderer.messages(blocks)]
            return sum(self.count(c) + MESSAGE_OVERHEAD for c in contents) + REPLY_PRIMING
        return self.count(self.renderer.text(blocks))


# Stand-ins the pricer renders beside a part, so the part is measured where it will stand.
_PROBE_USER = Part("message", message=Message(0, "user", "…", "User"))
_PROBES: dict[Role, Part] = {
    "user": _PROBE_USER,
    "assistant": Part("message", message=Message(0, "assistant", "…", "Assistant")),
    "system": Part("message", message=Message(0, "system", "…", "System")),
}
_PROBE_RECAP = Part("summary", scene=Scene(order=0, start=0, end=0, id="·", summary="…"))
_PROBE_RECAP_2 = Part("summary", scene=Scene(order=0, start=0, end=0, id="··", summary="…"))


def _difference(before: list[str], after: list[str]) -> tuple[int, int, int]:
    """Where two piece lists differ, around their common prefix and suffix: (start, end in
    `before`, end in `after`). A part adds pieces in one place, or changes the one holding it."""
    start = 0
    while start < len(before) and start < len(after) and before[start] == after[start]:
        start += 1
    end_b, end_a = len(before), len(after)
    while end_b > start and end_a > start and before[end_b - 1] == after[end_a - 1]:
        end_b -= 1
        end_a -= 1
    return start, end_b, end_a
