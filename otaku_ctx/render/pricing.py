"""What each part of a prompt costs once it is rendered: the `Pricer` the assembler asks.

The assembler prices each part by what it adds to the rendered blocks, so the fit test
counts the template's preamble, wrappers and per-message overhead, and the final count is
taken on what is actually emitted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from ..assemble import Assembly, Part
from ..hbs.blocks import Block
from ..story.model import Message, Role, Scene
from ..tokens import TokenCounter
from .emit import PromptRenderer

# A chat message costs its content plus the role and the message's own framing; OpenAI's
# published rule for cl100k chat models is 3 tokens a message + the role, and 3 to prime
# the reply. That is what `--emit messages` and `--emit openai-chat` are counted by.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3


class Prices:
    """Derived prices kept from one build to the next (a pipeline's every turn): a derived price
    is a function of the stand-in render's pieces, the part's texts and the counter alone, so it
    is keyed by exactly those — a changed frame renders other pieces, and so other keys. At most
    `MOST` shapes, and `MOST_CHARACTERS` characters in the pieces and texts it holds, are kept;
    past either the memo starts again (a server's chats each with a frame of its own: 5,000 of
    them held 260 MB before the second bound). A shape's id is never given twice, so a pricer
    that kept an id from before a new start never reads another shape's price."""

    MOST = 200_000
    #: about 8 MB held as one byte a character, 32 MB at worst (a text of emoji)
    MOST_CHARACTERS = 8_000_000

    def __init__(self) -> None:
        self.shapes: dict[tuple[bool, tuple[str, ...], tuple[str, ...]], int] = {}
        self.prices: dict[tuple[int, str, str, str], int] = {}
        # stand-in renders, keyed by everything a render reads (`TemplatePricer.frame`) and the parts
        self.renders: dict[tuple[Any, ...], list[str]] = {}
        self.characters = 0  # in the pieces and texts held (`hold`)
        self._next_id = 0

    def shape_id(self, chat: bool, old: list[str], new: list[str]) -> int:
        key = (chat, tuple(old), tuple(new))
        found = self.shapes.get(key)
        if found is None:
            if len(self.shapes) >= self.MOST:
                self.clear()
            self.hold(sum(map(len, old)) + sum(map(len, new)))
            found = self.shapes[key] = self._next_id
            self._next_id += 1
        return found

    def hold(self, characters: int) -> None:
        """Count what an entry about to be kept holds; past `MOST_CHARACTERS`, start again."""
        if self.characters + characters > self.MOST_CHARACTERS:
            self.clear()
        self.characters += characters

    def clear(self) -> None:
        self.shapes.clear()
        self.prices.clear()
        self.renders.clear()
        self.characters = 0


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

    # Each part's price is exact but for the tokens that join across its boundaries (the
    # assembler may then take a sum far over the limit as over it, unrendered).
    exact_but_joins = True

    def __init__(
        self, renderer: PromptRenderer, counter: TokenCounter, *, derive: bool = True, prices: Prices | None = None
    ) -> None:
        self.renderer = renderer
        self.count = counter
        self.derive = derive  # False: render every part (what the derived prices are tested against)
        self.prices = prices or Prices()  # derived prices; a pipeline lends one that outlives a build
        self._shape_ids: dict[tuple[Any, ...], int] = {}
        self._fixed: int | None = None
        self._opening: int | None = None
        self._cache: dict[tuple[str, Part], int] = {}
        self._rendered: tuple[tuple[Any, ...], list[Block]] | None = None
        self._renders: dict[tuple[tuple[Part, ...], ...], list[str]] = {}
        self._shapes: dict[tuple[Any, ...], tuple[list[str], list[str]] | None] = {}

    def rendered_pieces(self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part]) -> list[str]:
        """The pieces of a stand-in render, kept: a price renders the same stand-ins again and
        again. Without what stands at a depth from the end (lore at a depth, the reminder),
        which a short stand-in chat would move next to the part: their cost is `fixed()`'s."""
        key = (tuple(head), tuple(recap), tuple(tail))
        found = self._renders.get(key)
        if found is None:
            frame = self.frame
            kept = None if frame is None else (frame, key)
            found = self.prices.renders.get(kept) if kept is not None else None
            if found is None:
                found = self.pieces(self.renderer.render(head, recap, tail, anchored=False))
                if kept is not None and len(self.prices.renders) < Prices.MOST:
                    self.prices.hold(sum(map(len, found)))
                    self.prices.renders[kept] = found
            self._renders[key] = found
        return found

    @cached_property
    def frame(self) -> tuple[Any, ...] | None:
        """Everything a stand-in render reads besides its parts: the template, the format, how the
        renderer emits, and the variables that hold for every assembly of the story (an
        unanchored render has nothing at a depth from the end). Two pricers with equal frames
        render equal stand-ins; None when some part of it cannot be compared."""
        r, v = self.renderer, self.renderer.variables
        frame = (
            r.template, r.format, r.emit, r.bound, r.specials, r.server_bos, r.chat_as_text, v.names, v.settings,
            tuple(v.fixed.items()), tuple(v.open_turn.items()),
        )  # fmt: skip
        try:
            hash(frame)
        except TypeError:
            return None
        return frame

    def pieces(self, blocks: Sequence[Block]) -> list[str]:
        if self.renderer.chat_counted:
            return [m["content"] for m in self.renderer.messages(blocks)]
        return self.renderer.pieces(blocks)

    def piece_cost(self, piece: str) -> int:
        overhead = self.chat_overhead[0] if self.renderer.chat_counted else 0
        return self.count.bound(piece) + overhead

    def cost(self, blocks: Sequence[Block]) -> int:
        """Tokens of the emitted prompt for these blocks, as the sum of its pieces."""
        priming = self.chat_overhead[1] if self.renderer.chat_counted else self.count.added
        return sum(self.piece_cost(p) for p in self.pieces(blocks)) + priming

    @property
    def chat_overhead(self) -> tuple[int, int]:
        """A chat message's tokens beyond its content, and a chat prompt's beyond its messages:
        the model's template's where the counter knows it, else OpenAI's rule."""
        return self.count.chat_overhead or (MESSAGE_OVERHEAD, REPLY_PRIMING)

    def region(self, pieces: list[str], start: int, end: int) -> int:
        """Tokens of pieces[start:end] where they stand. In a text prompt, a piece is counted
        after the piece before it, since sequences meeting at a boundary ("<|eot_id|>" then
        "<|start_header_id|>") can tokenize together."""
        if start == end:
            return 0
        if self.renderer.chat_counted:
            return sum(map(self.piece_cost, pieces[start:end]))
        before = self.count.context(pieces[start - 1]) if start else ""
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
            cached = self._derived(part, before, [])
            if cached is None:
                old, new = self.rendered_pieces(before, [], []), self.rendered_pieces([*before, part], [], [])
                cached = self._price(old, new)
            self._cache[key] = cached
        return cached

    def recap_part(self, part: Part) -> int:
        """A recap part's run price: measured after another recap part, as it will stand."""
        key = ("recap", part)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._derived(part, [_PROBE_USER], [_PROBE_RECAP])
            if cached is None:
                old = self.rendered_pieces([_PROBE_USER], [_PROBE_RECAP], [])
                cached = self._price(old, self.rendered_pieces([_PROBE_USER], [_PROBE_RECAP, part], []))
            self._cache[key] = cached
        return cached

    def _price(self, old: list[str], new: list[str]) -> int:
        start, end_old, end_new = _difference(old, new)
        return self.region(new, start, end_new) - self.region(old, start, end_old)

    # A part's price without rendering it: most templates print a message's text (or a
    # summary's) and nothing that depends on it, so the part rendered once with a stand-in
    # text, then the real text put in its place, is the part rendered. Whether a template
    # does that is tested once per shape, by rendering two stand-ins whose texts differ in
    # every way a template could treat text differently (quotes, backslashes, newlines,
    # markup) and whose numbers differ; only when the two renders differ by the text alone
    # is a price derived. The fit is still confirmed on the real render of the prompt.

    def _derived(self, part: Part, head: list[Part], recap: list[Part]) -> int | None:
        entry = self.renderer.variables.entry(part)
        values = {"text": entry["message"], "scene": str(entry["scene"]), "title": entry["title"]}
        if not self.derive or part.kind == "card" or not values["text"]:
            return None
        key = (part.kind, entry["role"], entry["name"], bool(entry["title"]), tuple(head), tuple(recap))
        if key not in self._shapes:
            self._shapes[key] = self._shape(part, head, recap)
        shape = self._shapes[key]
        if shape is None:
            return None
        old, new = shape
        shape_id = self._shape_ids.get(key)
        if shape_id is None:
            shape_id = self._shape_ids[key] = self.prices.shape_id(self.renderer.chat_counted, old, new)
        memo = (shape_id, values["text"], values["scene"], values["title"])
        price = self.prices.prices.get(memo)
        if price is None:  # a kept price was derived from these texts, so they hold no stand-in mark
            if any(mark in value for value in values.values() for mark in _ALL_MARKS):
                return None
            price = self._price(old, [_put(piece, 0, values) for piece in new])
            self.prices.hold(sum(map(len, values.values())))
            self.prices.prices[memo] = price
        return price

    def _shape(self, part: Part, head: list[Part], recap: list[Part]) -> tuple[list[str], list[str]] | None:
        """The render before the part and with a stand-in for it, when the stand-ins show
        that only the text changes with the text."""
        first, second = _stand_in(part, 0), _stand_in(part, 1)
        if first is None or second is None:
            return None
        if recap:
            old = self.rendered_pieces(head, recap, [])
            a, b = (self.rendered_pieces(head, [*recap, p], []) for p in (first, second))
        else:
            old = self.rendered_pieces(head, [], [])
            a, b = (self.rendered_pieces([*head, p], [], []) for p in (first, second))
        other = {name: marks[1] for name, marks in _MARKS.items()}
        if [_put(piece, 0, other) for piece in a] != b:
            return None
        return old, a

    def recap_opening(self, after: Role | None = None) -> int:
        """What a non-empty recap costs beyond its parts' run prices, after a turn of role `after`."""
        key = (f"opening after {after}", _PROBE_RECAP)
        cached = self._cache.get(key)
        if cached is None:
            before = [_PROBES[after]] if after else []
            first = self._price(self.rendered_pieces(before, [], []), self.rendered_pieces(before, [_PROBE_RECAP], []))
            cached = self._cache[key] = first - self.recap_part(_PROBE_RECAP_2)
        return cached

    def exact(self, assembly: Assembly) -> int:
        return self.tokens(self.blocks(assembly))

    def text(self, text: str) -> int:
        return self.count.bound(text)

    def blocks(self, assembly: Assembly) -> list[Block]:
        """The assembly's blocks; the last one rendered for `exact` is kept, since the
        candidate that was counted is the one that is emitted."""
        key = (assembly.head, assembly.recap, assembly.recall, assembly.tail)
        if self._rendered is None or self._rendered[0] != key:
            self._rendered = (key, self.renderer.blocks(assembly))
        return self._rendered[1]

    def tokens(self, blocks: Sequence[Block]) -> int:
        """The count of the emitted prompt: chat messages as the model's server templates them
        (where it says), else by OpenAI's rule (no model known) or as the format's text; a text
        prompt, as it is."""
        if not self.renderer.text_form:
            messages = self.renderer.messages(blocks)
            exact = self.count.chat(messages)  # the model's own template, where the server applies it
            if exact is not None:
                return exact
            if self.renderer.chat_counted:
                return sum(self.count(m["content"]) + MESSAGE_OVERHEAD for m in messages) + REPLY_PRIMING
        return self.count(self.renderer.text(blocks)) + self.count.added


# The stand-in texts of `_derived`: private-use characters around a per-run nonce (story text
# cannot predict them); the second holds what escaping or JSON would change.
_NONCE = os.urandom(6).hex()
_MARKS = {
    name: (f"\ue000{name}-{_NONCE}\ue001", f'\ue000<{name}>&"q"\\\n\r\t-{_NONCE}\ue001')
    for name in ("text", "scene", "title")
}
_ALL_MARKS = [mark for pair in _MARKS.values() for mark in pair]


def _put(piece: str, which: int, values: dict[str, str]) -> str:
    """`piece` with the stand-in marks `which` (0 or 1) replaced by `values`."""
    for name, value in values.items():
        piece = piece.replace(_MARKS[name][which], value)
    return piece


def _stand_in(part: Part, which: int) -> Part | None:
    """`part` with stand-in marks in place of its text (and scene id and title), and another
    number; None for a part that has no text of its own to stand in for."""
    m, scene = part.message, part.scene
    text = _MARKS["text"][which]
    if part.kind == "message" and m is not None:
        return Part("message", message=replace(m, number=which + 1, content=text))
    if scene is not None and part.kind in ("summary", "history"):
        title = _MARKS["title"][which] if scene.title else ""
        stand_in = replace(scene, order=which + 1, id=_MARKS["scene"][which], title=title)
        stand_in = replace(stand_in, summary=text) if part.kind == "summary" else replace(stand_in, history=text)
        return Part(part.kind, scene=stand_in)
    return None


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
