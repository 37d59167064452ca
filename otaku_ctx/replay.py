"""Replay a story turn by turn and measure how much of each prompt a backend's cache reuses.

Backends (llama.cpp `cache_prompt`, KoboldCpp ContextShift, vLLM prefix caching, OpenAI and
Anthropic prompt caching) reuse their work only for an unchanged token prefix. A replay builds
the prompt of every turn — turn n is the story's first n messages — and compares each prompt,
in the emitted form and the configured tokenizer's tokens, with the one before it.

What a turn holds: messages 1..n, and the scenes whose last message is among them (a scene
counts from the turn its end message exists; its summary and history are taken as written
when it closes). Cards are messages, so they join at their turn. The story's other facts
(title, persona, lore) are the same at every turn.

Reuse is measured the way a backend sees it: the previous prompt less its open turn (the
part the model's reply continues) against the next prompt, token by token. For the chat
forms, the messages are tokenized one by one, each behind a marker of its role, since a chat
API applies its own template around them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .build import build
from .config import Settings
from .errors import UsageError
from .hbs.blocks import Block
from .render.formats import Format, render_messages, text_pieces
from .story.model import Story
from .tokens import common_length, make_counter

Tokens = list[int] | list[str]


@dataclass(frozen=True)
class Turn:
    """One turn of a replay: the shape of its prompt and what the backend could reuse of it."""

    messages: int  # n: the turn holds messages 1..n
    case: int
    tail_target: int
    level: int
    covered: int  # scenes covered by summaries or the history
    tokens: int  # the prompt, in the tokenizer's tokens (0 on refusal)
    limit: int
    reused: int  # tokens of this prompt that the previous prompt's prefix already holds
    prefix: bool  # the previous prompt, less its open turn, is a token prefix of this one

    @property
    def reprocessed(self) -> int:
        return self.tokens - self.reused

    @property
    def unused(self) -> int:
        """Window left unused under the limit while story content is left out of the prompt
        (cases 3–5): what the stable policy's slack costs. A prompt that holds everything
        (cases 1, 2) or none (6) loses nothing to it."""
        return max(0, self.limit - self.tokens) if self.case in (3, 4, 5) else 0


@dataclass(frozen=True)
class Transition:
    """A change between two turns: of case, tail target, level or covered scenes."""

    messages: int
    what: str
    before: int
    after: int


@dataclass(frozen=True)
class Replay:
    """Every measured turn (the first has nothing before it to reuse) and every transition."""

    turns: tuple[Turn, ...]
    transitions: tuple[Transition, ...]
    policy: str
    tokenizer: str

    @property
    def compared(self) -> tuple[Turn, ...]:
        """The turns measured against the turn before them."""
        return self.turns[1:]

    def share_prefix(self) -> float:
        turns = self.compared
        return sum(t.prefix for t in turns) / len(turns) if turns else 1.0

    def share_reused(self) -> float:
        """Mean over turns of reused / tokens."""
        turns = [t for t in self.compared if t.tokens]
        return sum(t.reused / t.tokens for t in turns) / len(turns) if turns else 1.0

    def share_unused(self) -> float:
        """Mean over the turns that leave story content out (cases 3–5) of unused / limit."""
        return _mean([t.unused / t.limit for t in self.turns if t.case in (3, 4, 5) and t.limit > 0])

    def facts(self) -> dict[str, Any]:
        """Everything a replay says, JSON-ready (`ctx replay --json`)."""
        turns = self.compared
        return {
            "policy": self.policy,
            "tokenizer": self.tokenizer,
            "turns": len(self.turns),
            "first": self.turns[0].messages if self.turns else 0,
            "last": self.turns[-1].messages if self.turns else 0,
            "prefix_share": round(self.share_prefix(), 4),
            "reused_share": round(self.share_reused(), 4),
            "reused": _spread([t.reused for t in turns]),
            "reprocessed": _spread([t.reprocessed for t in turns]),
            "unused_share": round(self.share_unused(), 4),
            "refused": sum(t.case == 6 for t in self.turns),
            "transitions": [vars(t) for t in self.transitions],
            "per_turn": [{**vars(t), "reprocessed": t.reprocessed, "unused": t.unused} for t in self.turns],
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _p95(values: Sequence[int]) -> int:
    """The 95th percentile (nearest rank)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _spread(values: Sequence[int]) -> dict[str, float]:
    return {"mean": round(_mean(values), 1), "p95": _p95(values)}


def story_at(story: Story, n: int) -> Story:
    """The story as it stood at turn n: messages 1..n and the scenes that have closed by then."""
    return replace(story, messages=story.messages[:n], scenes=tuple(s for s in story.scenes if s.end <= n))


def turn_numbers(total: int, first: int | None, last: int | None, every: int) -> list[int]:
    """The turns to replay: from `first` (default 1) to `last` (default the story's end), one
    every `every` messages; the last message is always a turn."""
    if every < 1:
        raise UsageError("--every", None, f"expected a number of messages ≥ 1, got {every}")
    if total == 0:
        return []
    start = 1 if first is None else first
    end = total if last is None else last
    if not 1 <= start <= total:
        raise UsageError("--first", None, f"expected a message number from 1 to {total}, got {start}")
    if not start <= end <= total:
        raise UsageError("--last", None, f"expected a message number from {start} to {total}, got {end}")
    numbers = list(range(start, end + 1, every))
    if numbers[-1] != end:
        numbers.append(end)
    return numbers


def _tokenizer(name: str) -> tuple[Callable[[str], Tokens], int]:
    """Text to tokens, and how many of them make one token of the count: cl100k_base's ids (1),
    or for the estimate (4 characters a token) the text's characters (4), so that a prefix
    is a prefix wherever it ends."""
    if name == "cl100k_base":
        from .tokens import PrefixEncoder

        return PrefixEncoder(), 1
    return list, 4


@dataclass
class _Measure:
    """The emitted form as the backend tokenizes it: (the whole prompt, the prompt less its
    open turn)."""

    encode: Callable[[str], Tokens]
    unit: int
    format: Format
    chat_form: bool

    def forms(self, blocks: Sequence[Block]) -> tuple[Tokens, Tokens]:
        if self.chat_form:
            tokens = self.chat(blocks)
            return tokens, tokens  # the open turn is the API's own reply: it is never sent
        pieces = text_pieces(self.format, blocks)
        return self.encode("".join(pieces)), self.encode("".join(pieces[:-1]))

    def chat(self, blocks: Sequence[Block]) -> Tokens:
        out: list[Any] = []
        for message in render_messages(self.format, [b for b in blocks if not b.open]):
            out.append(f"<{message['role']}>")
            out += self.encode(message["content"])
            out.append("</>")
        return out


def replay(
    story: Story,
    settings: Settings,
    *,
    emit: str = "text",
    first: int | None = None,
    last: int | None = None,
    every: int = 1,
) -> Replay:
    """Build every turn of `story` with `settings` and measure each prompt against the one
    before. A turn's prompt is exactly `build(story_at(story, n), settings)`."""
    from .build import renderer_for

    count = make_counter(settings.model.tokenizer)
    renderer = renderer_for(story, settings, emit=emit)  # its format and emit form; no turn changes them
    measure = _Measure(*_tokenizer(count.name), renderer.format, renderer.chat_counted)
    turns: list[Turn] = []
    transitions: list[Transition] = []
    before: Tokens | None = None  # the previous prompt less its open turn
    for n in turn_numbers(len(story), first, last, every):
        at = story_at(story, n)
        built = build(at, settings, emit=emit, count=count)
        a = built.assembly
        if a.refusal:
            whole: Tokens = []
            before_next: Tokens | None = None
        else:
            whole, before_next = measure.forms(built.blocks)
        reused = common_length(before, whole) if before is not None else 0
        prefix = before is not None and reused == len(before) and bool(whole)
        covered = len(a.summaries) + (a.level if a.history else 0)
        unit = measure.unit
        turn = Turn(n, a.case, a.tail_target, a.level, covered, len(whole) // unit, a.limit, reused // unit, prefix)
        if turns:
            transitions += _changes(turns[-1], turn)
        turns.append(turn)
        before = before_next
    policy = settings.context.cache
    return Replay(tuple(turns), tuple(transitions), policy, count.name)


def _changes(old: Turn, new: Turn) -> list[Transition]:
    return [
        Transition(new.messages, what, getattr(old, what), getattr(new, what))
        for what in ("case", "tail_target", "level", "covered")
        if getattr(old, what) != getattr(new, what)
    ]


def report(result: Replay) -> str:
    """The replay in a few plain lines, for a person."""
    f = result.facts()
    if not result.turns:
        return "no turns to replay\n"
    lines = [
        f"turns {f['first']}–{f['last']} ({f['turns']}), cache policy {f['policy']}, tokens of {f['tokenizer']}",
        f"previous prompt is a prefix of the next: {f['prefix_share']:.1%} of turns",
        f"tokens reused: {f['reused_share']:.1%} of each prompt on average "
        f"(mean {f['reused']['mean']:,.0f}, p95 {f['reused']['p95']:,})",
        f"tokens reprocessed: mean {f['reprocessed']['mean']:,.0f}, p95 {f['reprocessed']['p95']:,}",
        f"window unused while content is left out: {f['unused_share']:.1%} of the limit on average",
    ]
    if f["refused"]:
        lines.append(f"refused (case 6): {f['refused']} turns")
    lines.append(f"transitions: {len(result.transitions)}")
    names = {"case": "case", "tail_target": "tail target", "level": "level", "covered": "covered scenes"}
    lines += [f"  turn {t.messages}: {names[t.what]} {t.before} → {t.after}" for t in result.transitions]
    return "\n".join(lines) + "\n"
