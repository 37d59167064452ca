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
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .assemble import Assembly
from .build import Pipeline
from .config import Settings
from .errors import UsageError
from .hbs.blocks import Block
from .render.formats import Format, render_messages, text_pieces
from .story.model import Story
from .tokens import TokenCounter, common_length

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
    bound: Replay | None = None  # the hindsight optimum over the same turns (`--bound`)

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

    def reprocessed(self) -> int:
        """Tokens reprocessed over the compared turns: what a backend pays for the replay."""
        return sum(t.reprocessed for t in self.compared)

    def ratio(self) -> float | None:
        """The policy's reprocessed tokens ÷ the bound's (1.0 is the optimum); None without a
        bound, or when the bound reprocesses nothing."""
        if self.bound is None:
            return None
        best = self.bound.reprocessed()
        return self.reprocessed() / best if best else (1.0 if not self.reprocessed() else None)

    def share_unused(self) -> float:
        """Mean over the turns that leave story content out (cases 3–5) of unused / limit."""
        return _mean([t.unused / t.limit for t in self.turns if t.case in (3, 4, 5) and t.limit > 0])

    def facts(self) -> dict[str, Any]:
        """Everything a replay says, JSON-ready (`ctx replay --json`)."""
        facts = self.summary()
        facts["per_turn"] = [{**vars(t), "reprocessed": t.reprocessed, "unused": t.unused} for t in self.turns]
        if self.bound is not None:
            ratio = self.ratio()
            facts["bound"] = {**self.bound.summary(), "per_turn": [vars(t) for t in self.bound.turns]}
            facts["ratio"] = round(ratio, 4) if ratio is not None else None
        return facts

    def summary(self) -> dict[str, Any]:
        """The replay's figures, without its turns one by one."""
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
            "reprocessed_total": self.reprocessed(),
            "unused_share": round(self.share_unused(), 4),
            "refused": sum(t.case == 6 for t in self.turns),
            "transitions": [vars(t) for t in self.transitions],
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


def _tokenizer(count: TokenCounter) -> tuple[Callable[[str], Tokens], int]:
    """Text to tokens, and how many of them make one token of the count: cl100k_base's ids (1),
    a model's own ids (1: a counter of a GGUF or tokenizer.json gives them, `ids`), or for the
    estimate (4 characters a token) the text's characters (4), so that a prefix is a prefix
    wherever it ends. A counter that gives no ids (a server's, Mistral's) cannot be replayed:
    its prefix is not known token by token."""
    if count.name == "cl100k_base":
        from .tokens import PrefixEncoder

        return PrefixEncoder(), 1
    if count.name == "estimate":
        return list, 4
    ids = getattr(count, "ids", None)
    if callable(ids):
        return ids, 1
    raise UsageError(
        "--tokenizer",
        None,
        f"ctx replay compares prompts token by token, and {count.name} gives counts, not tokens;"
        " replay with the model's GGUF or tokenizer.json, or with cl100k_base",
    )


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
    bound: bool = False,
) -> Replay:
    """Build every turn of `story` with `settings` and measure each prompt against the one
    before. A turn's prompt is exactly `build(story_at(story, n), settings)`. With `bound`, the
    hindsight optimum over the same turns too (`Bound`)."""
    pipeline = Pipeline(settings, emit=emit)
    count = pipeline.count
    renderer = pipeline.prepare(story).renderer()  # its format and emit form; no turn changes them
    measure = _Measure(*_tokenizer(count), renderer.format, renderer.chat_counted)
    optimum = Bound(pipeline, measure) if bound else None
    turns: list[Turn] = []
    transitions: list[Transition] = []
    before: Tokens | None = None  # the previous prompt less its open turn
    for n in turn_numbers(len(story), first, last, every):
        at = story_at(story, n)
        built = pipeline.build(at)
        a = built.assembly
        if a.refusal:
            whole: Tokens = []
            before_next: Tokens | None = None
        else:
            whole, before_next = measure.forms(built.blocks)
        reused = common_length(before, whole) if before is not None else 0
        prefix = before is not None and reused == len(before) and bool(whole)
        unit = measure.unit
        turn = Turn(n, a.case, a.tail_target, a.level, _covered(a), len(whole) // unit, a.limit, reused // unit, prefix)
        if turns:
            transitions += _changes(turns[-1], turn)
        turns.append(turn)
        before = before_next
        if optimum is not None:
            rest = whole if before_next is None else before_next  # an empty rest is a rest
            optimum.add(at, a.limit, None if a.refusal else (turn, whole, rest))
    policy = settings.context.cache
    found = optimum.result() if optimum is not None else None
    return Replay(tuple(turns), tuple(transitions), policy, count.name, found)


def _covered(a: Assembly) -> int:
    return len(a.summaries) + (a.level if a.history else 0)


# ── The bound: the hindsight optimum over the seed's candidates ─────────────────────────

Packed = str | bytes  # a prompt's tokens as one string of fixed-width units, compared in C


@dataclass
class _Node:
    """One candidate prompt of one turn."""

    turn: Turn  # its shape and size (reused and prefix are set on the chosen path)
    whole: Packed
    before: Packed  # less its open turn: what the next turn may reuse
    cost: float = 0.0  # the fewest tokens reprocessed over the turns up to here, ending here
    back: int = -1  # the node of the turn before on that path
    reused: int = 0
    prefix: bool = False


class Bound:
    """The hindsight optimum (`ctx replay --bound`): at every replayed turn, each of the seed's
    candidate shapes that fits the limit — the candidates the stable policy chooses from —
    rendered and measured as the replay measures a prompt; then the sequence of choices that
    reprocesses the fewest tokens over the replay: a shortest path over turns × candidates,
    a step costing the tokens of the next prompt its previous one (less its open turn) does
    not begin. No policy that picks among the seed's candidates turn by turn reprocesses
    fewer. The configured policy's own prompt is a node too, so the bound is never worse
    than it whatever the candidates' pricing misses. A refused turn has no prompt: the turn
    after it reprocesses all of its own.

    The turn's prompts are compared all at once: sorted, a pair's common prefix is the least
    of the common prefixes of the neighbours between them, so a turn costs one comparison a
    prompt, not one a pair."""

    def __init__(self, pipeline: Pipeline, measure: _Measure) -> None:
        self.pipeline, self.count, self.measure = pipeline, pipeline.count, measure
        self.measures: dict[tuple[int, int], _Measure] = {}  # a tokenizer per shape: each mostly repeats itself
        self.layers: list[list[_Node]] = []  # a turn's nodes; none when the policy refused it
        self.numbers: list[tuple[int, int]] = []  # each turn's message count and limit
        self.codes: dict[Any, int] = {}

    def add(self, at: Story, limit: int, chosen: tuple[Turn, Tokens, Tokens] | None) -> None:
        """Turn `at`'s candidates, and the policy's own choice (None: it refused)."""
        nodes = [] if chosen is None else self.candidates(at)
        if chosen is not None:
            turn, whole, before = chosen
            packed = self.pack(whole)
            if not any(node.whole == packed for node in nodes):
                nodes.append(_Node(replace(turn, reused=0, prefix=False), packed, self.pack(before)))
        self.extend(nodes, len(at), limit)

    def extend(self, nodes: list[_Node], messages: int, limit: int) -> None:
        """The next turn's nodes (none: refused), each linked to its cheapest path."""
        self.link(nodes)
        self.layers.append(nodes)
        self.numbers.append((messages, limit))

    def candidates(self, at: Story) -> list[_Node]:
        from .assemble import classify

        nodes: list[_Node] = []
        for key, a, pricer in self.pipeline.candidates(at):
            measure = self.measures.get(key)
            if measure is None:
                m = self.measure
                measure = self.measures[key] = _Measure(*_tokenizer(self.count), m.format, m.chat_form)
            whole, before = measure.forms(pricer.blocks(a))
            case = classify(a, self.pipeline.shape)
            tokens = len(whole) // measure.unit
            turn = Turn(len(at), case, a.tail_target, a.level, _covered(a), tokens, a.limit, 0, False)
            nodes.append(_Node(turn, self.pack(whole), self.pack(before)))
        return nodes

    def pack(self, tokens: Tokens) -> Packed:
        """Tokens as one string of fixed-width units: the characters themselves for the
        estimate's text form, else 4-byte codes (a chat form's role markers coded apart)."""
        if self.measure.encode is list and not self.measure.chat_form:
            return "".join(tokens)  # type: ignore[arg-type]
        codes = self.codes
        return array("i", (t if isinstance(t, int) else codes.setdefault(t, -1 - len(codes)) for t in tokens)).tobytes()

    def width(self, packed: Packed) -> int:
        return 1 if isinstance(packed, str) else 4

    def link(self, nodes: list[_Node]) -> None:
        """Each node's cheapest path from the turns before, through the previous turn's nodes."""
        if not self.layers:
            return  # the first turn is measured against nothing: it costs nothing
        previous = self.layers[-1]
        if not previous:  # after a refusal, a turn reprocesses all of itself
            for node in nodes:
                node.cost = _best(self.layers) + node.turn.tokens
            return
        if not nodes:
            return
        common = self.commons([p.before for p in previous], [n.whole for n in nodes])
        unit = self.measure.unit
        for j, node in enumerate(nodes):
            width = self.width(node.whole)
            best_cost, best_i, best_kept = math.inf, -1, 0
            for i, before in enumerate(previous):
                kept = common[i][j] // width  # in the tokenizer's units
                cost = before.cost + node.turn.tokens - kept // unit
                if cost < best_cost:
                    best_cost, best_i, best_kept = cost, i, kept
            node.cost, node.back = best_cost, best_i
            node.reused = best_kept // unit
            node.prefix = best_kept * width == len(previous[best_i].before) and bool(node.whole)

    @staticmethod
    def commons(befores: list[Packed], wholes: list[Packed]) -> list[list[int]]:
        """common[i][j]: the common prefix of befores[i] and wholes[j], in packed units."""
        items, split = [*befores, *wholes], len(befores)
        order = sorted(range(len(items)), key=items.__getitem__)
        next_to = [common_length(items[x], items[y]) for x, y in zip(order, order[1:], strict=False)]
        common = [[0] * len(wholes) for _ in befores]
        for rank, i in enumerate(order):
            # Walking right from item i in sorted order, its common prefix with each item met is
            # the least of the neighbours' so far; each pair is met once, from its lower rank.
            least = len(items[i])
            for step, other in enumerate(order[rank + 1 :], start=rank):
                least = min(least, next_to[step])
                if i < split <= other:
                    common[i][other - split] = least
                elif other < split <= i:
                    common[other][i - split] = least
        return common

    def result(self) -> Replay:
        """The cheapest path, as a replay of its own (policy "bound")."""
        if not self.layers:
            return Replay((), (), "bound", self.count.name)
        turns: list[Turn] = []
        at = _end(self.layers[-1])
        for layer, (messages, limit) in zip(reversed(self.layers), reversed(self.numbers), strict=True):
            if not layer:
                turns.append(Turn(messages, 6, 0, 0, 0, 0, limit, 0, False))  # refused, as the policy's turn was
                at = -1
                continue
            node = layer[at if at >= 0 else _end(layer)]
            turns.append(replace(node.turn, reused=node.reused, prefix=node.prefix))
            at = node.back
        turns.reverse()
        transitions = [c for old, new in zip(turns, turns[1:], strict=False) for c in _changes(old, new)]
        return Replay(tuple(turns), tuple(transitions), "bound", self.count.name)


def _end(layer: list[_Node]) -> int:
    return min(range(len(layer)), key=lambda i: layer[i].cost) if layer else -1


def _best(layers: list[list[_Node]]) -> float:
    """The cost so far of the newest turn that had a prompt."""
    for layer in reversed(layers):
        if layer:
            return min(node.cost for node in layer)
    return 0.0


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
    if result.bound is not None:
        b, ratio = result.bound.summary(), result.ratio()
        lines += [
            f"bound (the fewest tokens any choice among the seed's candidates reprocesses): "
            f"mean {b['reprocessed']['mean']:,.0f}, p95 {b['reprocessed']['p95']:,}, "
            f"prefix kept in {b['prefix_share']:.1%} of turns, {len(result.bound.transitions)} transitions, "
            f"{b['unused_share']:.1%} of the limit unused",
            "reprocessed, this policy ÷ the bound: "
            + (f"{ratio:.2f}×" if ratio is not None else "— (the bound reprocesses nothing)")
            + f" ({f['reprocessed_total']:,} ÷ {b['reprocessed_total']:,} tokens)",
        ]
    lines.append(f"transitions: {len(result.transitions)}")
    names = {"case": "case", "tail_target": "tail target", "level": "level", "covered": "covered scenes"}
    lines += [f"  turn {t.messages}: {names[t.what]} {t.before} → {t.after}" for t in result.transitions]
    return "\n".join(lines) + "\n"
