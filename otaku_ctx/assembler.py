"""The context assembler: otaku's six cases (seed 001), as ARCHITECTURE.md states them.

Read it beside the design: `head` (case 1's verbatim opening), `covered_chain` (case 3's
summarised middle), `tail`, `cards_in` (cards before their scene's summary, the message-47
example), `recap_at_level` (case 4: a scene's history stands in for the summaries up to it,
cards float), `rungs` (case 5: the tail target drops 150 → 100 → 50), and `_Search.refuse`
(case 6). `_Search` tries them in that order.

`assemble()` is pure: no I/O, no printing. What a part costs in the prompt is asked of a
`Pricer`, which knows the template and format; the assembler adds those costs up (never
re-rendering the prompt per candidate) and asks the pricer for the exact count only of the
candidate that fits, so the emitted prompt is ≤ the limit to the token.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal, Protocol

from .model import Message, Role, Scene, Story

PartKind = Literal["message", "card", "summary", "history"]


@dataclass(frozen=True)
class Shape:
    """The numbers of the seed that shape a prompt (the `[context]` settings)."""

    head: int = 20
    min_tail: int = 150
    tail_step: int = 50
    tail_floor: int = 50


@dataclass(frozen=True)
class Part:
    """One piece of the prompt after the system message: a message or card verbatim, a scene's
    summary, or a scene's history (the story so far through that scene)."""

    kind: PartKind
    message: Message | None = None
    scene: Scene | None = None

    @classmethod
    def verbatim(cls, message: Message) -> Part:
        """A message or card that stands as it is (head, tail)."""
        return cls("card" if message.is_card else "message", message=message)


class Pricer(Protocol):
    """What the assembler needs to know about rendering, in tokens."""

    def fixed(self) -> int:
        """Tokens every prompt has whatever its parts: system message, template preamble, open turn."""
        ...

    def part(self, part: Part, after: Role | None) -> int:
        """Tokens a verbatim message or card of the head or tail adds to the prompt, standing
        after a turn of role `after` (None: right after the fixed frame)."""
        ...

    def recap_part(self, part: Part) -> int:
        """Tokens a recap part (a card, summary or history) adds, standing among other recap parts."""
        ...

    def recap_opening(self, after: Role | None) -> int:
        """Tokens a non-empty recap costs once, beyond its parts (its turn's framing, a header),
        standing after a turn of role `after`."""
        ...

    def exact(self, assembly: Assembly) -> int:
        """Tokens of the prompt actually emitted for this assembly."""
        ...


@dataclass(frozen=True)
class Refusal:
    """Case 6: why nothing fits, and what would."""

    smallest: int  # tokens of the smallest prompt reached
    limit: int
    reserve: int
    missing_summaries: tuple[int | str, ...] = ()
    missing_histories: tuple[int | str, ...] = ()
    chain_stop: str = ""  # why the summaries stop where they do, at the floor

    @property
    def context(self) -> int:
        """The context the limit came from (window or max_context)."""
        return self.limit + self.reserve

    @property
    def needed_context(self) -> int:
        """The context (window or max_context) that would fit the smallest prompt and the reserve."""
        return self.smallest + self.reserve

    def explain(self, raise_what: str = "the context") -> str:
        """What happened and what would help; `raise_what` names the setting to raise."""
        if self.limit <= 0:
            return (
                f"nothing fits: the {self.reserve:,}-token reply reserve leaves no room in a context of "
                f"{self.context:,} tokens; lower --reserve or raise {raise_what}."
            )
        text = (
            f"nothing fits: the smallest prompt reached is {self.smallest:,} tokens, but the limit is "
            f"{self.limit:,} ({self.context:,} minus a {self.reserve:,}-token reply reserve). "
            f"A context of at least {self.needed_context:,} tokens would fit it: raise {raise_what}"
        )
        missing = []
        if self.missing_summaries:
            missing.append("scenes without a summary: " + ", ".join(map(str, self.missing_summaries)))
        if self.missing_histories:
            missing.append("scenes without a history: " + ", ".join(map(str, self.missing_histories)))
        if missing:
            text += "; or fill in what stands in the way (" + "; ".join(missing) + ")"
        elif self.chain_stop:
            text += f" (the summaries stop early: {self.chain_stop})"
        return text + "."


@dataclass(frozen=True)
class Assembly:
    """The plan of one prompt and the trace of how it was chosen."""

    case: int  # 1–6
    messages: int  # N
    limit: int
    reserve: int
    head: tuple[Message, ...] = ()
    recap: tuple[Part, ...] = ()  # floated cards, history, then cards + summaries, in order
    tail: tuple[Message, ...] = ()
    tail_target: int = 0
    level: int = 0  # 0 = all summaries; k = scene k's history stands in for summaries 1..k
    tokens: int = 0  # the emitted prompt's count (exact), or the smallest reached on refusal
    steps: tuple[str, ...] = ()
    refusal: Refusal | None = None
    costs: dict[str, int] = field(default_factory=dict, compare=False)  # tokens by section

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every part in prompt order (the system message is the pricer's fixed cost)."""
        return tuple(map(Part.verbatim, self.head)) + self.recap + tuple(map(Part.verbatim, self.tail))

    @property
    def history(self) -> Scene | None:
        return next((p.scene for p in self.recap if p.kind == "history"), None)

    @property
    def summaries(self) -> tuple[Scene, ...]:
        return tuple(p.scene for p in self.recap if p.kind == "summary" and p.scene)

    @property
    def floated_cards(self) -> tuple[Message, ...]:
        """Cards that float before the history (case 4): those before the history part."""
        floated: list[Message] = []
        for p in self.recap:
            if p.kind == "history":
                return tuple(floated)
            if p.message:
                floated.append(p.message)
        return ()


# ── Case 1: the head ─────────────────────────────────────────────────────────────────────


def head(story: Story, shape: Shape) -> tuple[Message, ...]:
    """Case 1's opening: messages 1..min(H, N), verbatim. (The system message precedes it.)"""
    return story.messages[: min(shape.head, len(story))]


# ── Case 3: the covered chain ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Chain:
    """The scenes whose summaries replace the middle, for one tail target."""

    scenes: tuple[Scene, ...]
    stop: str  # why the chain ends where it does
    missing_summary: Scene | None = None  # the scene whose missing summary ended it
    blocked: bool = False  # it ends before the tail for a reason the story could fix


def covered_chain(story: Story, shape: Shape, tail_target: int) -> Chain:
    """Case 3: the scenes, in order, from the one holding message H+1, each starting right
    after the previous one, each summarised, each ending before message N−T (which always
    stays in the tail). The first scene that breaks a condition ends the chain."""
    n, first = len(story), shape.head + 1
    boundary = n - tail_target
    if first > n:
        return Chain((), f"the head holds all {n:,} messages")
    scenes = story.scenes
    at = bisect_right([s.start for s in scenes], first) - 1
    if at < 0 or not scenes[at].holds(first):
        return Chain((), f"no scene holds message {first:,} (the first after the head)", blocked=first < boundary)
    chain: list[Scene] = []
    for scene in scenes[at:]:
        if chain and scene.start != chain[-1].end + 1:
            gap = f"messages {chain[-1].end + 1:,}–{scene.start - 1:,} belong to no scene"
            return Chain(tuple(chain), gap, blocked=chain[-1].end + 1 < boundary)
        if scene.end >= boundary:
            why = f"scene {scene.ref} ends at message {scene.end:,}"
            return Chain(tuple(chain), f"{why}, not before message {boundary:,} ({n:,} − {tail_target})")
        if not scene.summary.strip():
            return Chain(tuple(chain), f"scene {scene.ref} has no summary", missing_summary=scene, blocked=True)
        chain.append(scene)
    last = chain[-1].end if chain else first - 1
    return Chain(tuple(chain), "no more scenes", blocked=last + 1 < boundary)


def tail(story: Story, shape: Shape, chain: Chain) -> tuple[Message, ...]:
    """Every message after the last covered scene (after the head when nothing is covered)."""
    after = chain.scenes[-1].end if chain.scenes else min(shape.head, len(story))
    return story.messages[after:]


def cards_in(
    scene: Scene, story: Story, shape: Shape, card_numbers: Sequence[int] | None = None
) -> tuple[Message, ...]:
    """The message-47 rule: cards in a covered scene are never summarised. Those already in
    the head are there verbatim and are not repeated. `card_numbers` (sorted) saves a scan."""
    first = max(scene.start, shape.head + 1)
    if card_numbers is None:
        return tuple(m for m in story.messages[first - 1 : scene.end] if m.is_card)
    lo, hi = bisect_left(card_numbers, first), bisect_right(card_numbers, scene.end)
    return tuple(story.messages[number - 1] for number in card_numbers[lo:hi])


# ── Case 4: levels ───────────────────────────────────────────────────────────────────────


def recap_at_level(
    chain: Sequence[Scene], level: int, cards: Callable[[Scene], tuple[Message, ...]]
) -> tuple[Part, ...]:
    """Level 0 is every covered summary, each after its scene's cards. Level k puts scene k's
    history in place of summaries 1..k; the cards of scenes 1..k float before it."""
    parts: list[Part] = []
    if level:
        parts += [Part("card", message=m) for s in chain[:level] for m in cards(s)]
        parts.append(Part("history", scene=chain[level - 1]))
    for scene in chain[level:]:
        parts += [Part("card", message=m) for m in cards(scene)]
        parts.append(Part("summary", scene=scene))
    return tuple(parts)


# ── Case 5: rungs ────────────────────────────────────────────────────────────────────────


def rungs(shape: Shape) -> list[int]:
    """The tail targets to try: min_tail, then down by tail_step to tail_floor (150, 100, 50)."""
    targets = [shape.min_tail]
    while targets[-1] - shape.tail_step >= shape.tail_floor:
        targets.append(targets[-1] - shape.tail_step)
    if targets[-1] > shape.tail_floor:
        targets.append(shape.tail_floor)
    return targets


# ── The search ───────────────────────────────────────────────────────────────────────────


def _span(items: Sequence[Scene]) -> str:
    if not items:
        return "none"
    a, b = items[0].ref, items[-1].ref
    return f"{a}" if a == b else f"{a}–{b}"


def _msgs(items: Sequence[Message]) -> str:
    if not items:
        return "none"
    return f"{items[0].number:,}–{items[-1].number:,}" if len(items) > 1 else f"{items[0].number:,}"


def near_miss(limit: int) -> int:
    """How far over the limit a candidate priced by its parts is still rendered and counted."""
    return max(16, limit // 200)


def _capped_sum(costs: Iterable[int], cap: int) -> tuple[int, bool]:
    """Sum costs until the total passes `cap` (then the rest cannot matter): (total, complete)."""
    total = 0
    for cost in costs:
        total += cost
        if total > cap:
            return total, False
    return total, True


@dataclass
class _Search:
    story: Story
    shape: Shape
    limit: int
    reserve: int
    pricer: Pricer
    steps: list[str] = field(default_factory=list)
    smallest: int | None = None

    def verbatim_costs(
        self, messages: Sequence[Message], after: Role | None, *, newest_first: bool = False
    ) -> Iterator[int]:
        """Each message's price where it stands: after the one before it (the first after
        `after`), since turns of one role merge and turns of two alternate. Lazily, so a
        capped sum stops pricing once it is over."""
        pairs = list(zip(messages, [after, *(m.role for m in messages[:-1])], strict=False))
        if newest_first:
            pairs.reverse()
        return (self.pricer.part(Part.verbatim(m), role) for m, role in pairs)

    def tail_after(self, opening: Sequence[Message], recap: bool) -> Role | None:
        """What the tail's first message follows: the recap (a system turn), or the head."""
        return "system" if recap else (opening[-1].role if opening else None)

    def recap_price(self, part: Part) -> int:
        return self.pricer.recap_part(part)

    def recap_cost(self, scenes: Sequence[Scene], opening: Sequence[Message]) -> int:
        """What every level of this chain pays alike: the recap's opening and its cards."""
        cards = sum(self.recap_price(Part("card", message=m)) for s in scenes for m in self.cards(s))
        return self.pricer.recap_opening(opening[-1].role if opening else None) + cards

    @cached_property
    def card_numbers(self) -> list[int]:
        return [m.number for m in self.story.cards]

    def cards(self, scene: Scene) -> tuple[Message, ...]:
        return cards_in(scene, self.story, self.shape, self.card_numbers)

    def note_size(self, tokens: int) -> None:
        if self.smallest is None or tokens < self.smallest:
            self.smallest = tokens

    def run(self) -> Assembly:
        story, shape = self.story, self.shape
        n = len(story)
        opening = head(story, shape)
        fixed = self.pricer.fixed()
        head_cost = sum(self.verbatim_costs(opening, None))
        base = fixed + head_cost
        self.steps.append(
            f"head: messages {_msgs(opening)} verbatim ({head_cost:,} tokens); "
            f"system and framing {fixed:,} tokens; limit {self.limit:,}"
        )
        threshold = shape.head + shape.min_tail
        previous: tuple[Scene, ...] | None = None
        targets = rungs(shape)
        for rung, target in enumerate(targets):
            chain = covered_chain(story, shape, target)
            label = f"tail target {target}"
            if previous is not None and chain.scenes == previous:
                self.steps.append(
                    f"{label}: covers the same scenes as before ({_span(chain.scenes)}) — nothing new to try"
                )
                continue
            previous = chain.scenes
            if chain.scenes:
                self.steps.append(
                    f"{label}: summaries cover scenes {_span(chain.scenes)} "
                    f"(messages {chain.scenes[0].start:,}–{chain.scenes[-1].end:,}); the chain stops: {chain.stop}"
                )
            else:
                self.steps.append(f"{label}: no scene is covered ({chain.stop}); every message is verbatim")
            found = self.try_rung(target, chain, opening, base)
            if found is not None:
                case = found.case
                if rung > 0:
                    case = 5
                elif not chain.scenes:
                    case = 1 if n < threshold else 2
                return replace(found, case=case, steps=tuple(self.steps))
        return self.refuse(opening, base, targets)

    def try_rung(self, target: int, chain: Chain, opening: Sequence[Message], base: int) -> Assembly | None:
        """Cases 3 and 4 at one tail target: the levels of this chain, in order; the first
        that fits wins."""
        story = self.story
        ending = tail(story, self.shape, chain)
        room = self.limit - base
        # Prices are within a hair of the rendered count: keep what is within `near_miss` of
        # the limit in play, so `confirm` can count it exactly.
        room += near_miss(self.limit)
        after = self.tail_after(opening, bool(chain.scenes))
        tail_cost, whole = _capped_sum(self.verbatim_costs(ending, after, newest_first=True), room)
        if not whole:
            self.steps.append(
                f"tail target {target}: head and tail (messages {_msgs(ending)}) alone exceed {self.limit:,} tokens"
            )
            return None
        room -= tail_cost
        scenes = chain.scenes

        def make(level: int, tokens: int) -> Assembly:
            return Assembly(
                case=4 if level else 3,
                messages=len(story),
                limit=self.limit,
                reserve=self.reserve,
                head=opening,
                recap=recap_at_level(scenes, level, self.cards),
                tail=ending,
                tail_target=target,
                level=level,
                tokens=tokens,
            )

        if not scenes:
            total = base + tail_cost
            return self.confirm(make(0, total), "everything verbatim", total)
        card_cost = self.recap_cost(scenes, opening)
        room -= card_cost
        # suffix[j] = tokens of the summaries of scenes j+1..m (0-based j); counted from the
        # newest back, and only as far as could ever fit.
        m = len(scenes)
        suffix = [0] * (m + 1)
        lowest = m  # smallest j with suffix[j] ≤ room
        for j in range(m - 1, -1, -1):
            suffix[j] = suffix[j + 1] + self.recap_price(Part("summary", scene=scenes[j]))
            if suffix[j] > room:
                break
            lowest = j
        fixed_part = base + tail_cost + card_cost
        if lowest > 0:
            over = scenes[lowest - 1 :]  # the summaries that, with nothing else, already overflow
            if room <= 0:
                why = "head, tail and cards leave no room for summaries"
            else:
                why = f"summaries {_span(over)} alone take {suffix[lowest - 1]:,} of the {room:,} tokens left"
            self.steps.append(f"level 0 (summaries {_span(scenes)}) cannot fit: {why}")
        else:
            total = fixed_part + suffix[0]
            found = self.confirm(make(0, total), f"level 0: summaries {_span(scenes)}", total)
            if found:
                return found
        first_level = max(1, lowest)
        if first_level > 1:
            skipped = "level 1" if first_level == 2 else f"levels 1–{first_level - 1}"
            self.steps.append(f"{skipped} cannot fit: the summaries they keep alone exceed the room")
        missing: list[int] = []  # levels skipped in a row, reported as one step
        for level in range(first_level, m + 1):
            scene = scenes[level - 1]
            if not scene.history.strip():
                missing.append(level)
                continue
            self.note_missing(missing, scenes)
            history_cost = self.recap_price(Part("history", scene=scene))
            total = fixed_part + history_cost + suffix[level]
            kept = f", summaries {_span(scenes[level:])} kept" if level < m else ""
            what = f"level {level}: summaries {_span(scenes[:level])} replaced by scene {scene.ref}'s history{kept}"
            found = self.confirm(make(level, total), what, total)
            if found:
                return found
        self.note_missing(missing, scenes)
        return None

    def note_missing(self, levels: list[int], scenes: Sequence[Scene]) -> None:
        """One step for a run of levels that do not exist (their scenes have no history)."""
        if not levels:
            return
        if len(levels) == 1:
            self.steps.append(f"level {levels[0]}: scene {scenes[levels[0] - 1].ref} has no history — skipped")
        else:
            refs = _span([scenes[k - 1] for k in levels])
            self.steps.append(f"levels {levels[0]}–{levels[-1]}: scenes {refs} have no history — skipped")
        levels.clear()

    def confirm(self, candidate: Assembly, what: str, estimate: int) -> Assembly | None:
        """Test a candidate for fit: by its parts' prices, then by what would really be
        emitted. Prices are exact but for tokens that join across a boundary, so a candidate
        within a hair of the limit is rendered and counted before it is given up."""
        if estimate > self.limit + near_miss(self.limit):
            self.steps.append(f"{what} — {estimate:,} > {self.limit:,} tokens")
            return None
        exact = self.pricer.exact(candidate)
        self.note_size(exact)
        if exact > self.limit:
            self.steps.append(f"{what} — {exact:,} > {self.limit:,} tokens (rendered)")
            return None
        self.steps.append(f"{what} — {exact:,} ≤ {self.limit:,} tokens")
        return replace(candidate, tokens=exact, costs=self.section_costs(candidate))

    def section_costs(self, a: Assembly) -> dict[str, int]:
        opening = self.pricer.recap_opening(a.head[-1].role if a.head else None) if a.recap else 0
        return {
            "fixed": self.pricer.fixed(),
            "head": sum(self.verbatim_costs(a.head, None)),
            "recap": opening + sum(self.recap_price(p) for p in a.recap),
            "tail": sum(self.verbatim_costs(a.tail, self.tail_after(a.head, bool(a.recap)))),
        }

    # ── Case 6: refusal ──────────────────────────────────────────────────────────────────

    def refuse(self, opening: Sequence[Message], base: int, targets: list[int]) -> Assembly:
        """Nothing fits at the floor: say the smallest size reached, the context that would
        fit it, and which scenes' missing summaries or histories stand in the way."""
        story, shape = self.story, self.shape
        floor = targets[-1]
        chain = covered_chain(story, shape, floor)
        ending = tail(story, shape, chain)
        rest = base + sum(self.verbatim_costs(ending, self.tail_after(opening, bool(chain.scenes))))
        rest += self.recap_cost(chain.scenes, opening) if chain.scenes else 0
        summaries = [self.recap_price(Part("summary", scene=s)) for s in chain.scenes]
        sizes = {0: rest + sum(summaries)}
        for level, scene in enumerate(chain.scenes, start=1):
            if scene.history.strip():
                sizes[level] = rest + self.recap_price(Part("history", scene=scene)) + sum(summaries[level:])
        # The parts' sum is an upper bound; the smallest size reached is what the smallest
        # candidate really renders to (one render, on this error path only).
        level = min(sizes, key=sizes.__getitem__)
        candidate = Assembly(
            case=6,
            messages=len(story),
            limit=self.limit,
            reserve=self.reserve,
            head=opening,
            recap=recap_at_level(chain.scenes, level, self.cards),
            tail=ending,
            tail_target=floor,
            level=level,
        )
        exact = self.pricer.exact(candidate)
        if exact <= self.limit:  # the parts' sum was conservative; the prompt itself fits
            self.steps.append(
                f"tail target {floor}, level {level}: its parts add up to {sizes[level]:,}, "
                f"but the rendered prompt is {exact:,} ≤ {self.limit:,} tokens"
            )
            case = 5 if len(targets) > 1 else (4 if level else 3 if chain.scenes else 2)
            return replace(
                candidate, case=case, tokens=exact, steps=tuple(self.steps), costs=self.section_costs(candidate)
            )
        self.note_size(exact)
        smallest = self.smallest if self.smallest is not None else exact
        boundary = len(story) - floor
        no_summary = tuple(
            s.ref
            for s in story.scenes
            if s.start > (chain.scenes[-1].end if chain.scenes else shape.head)
            and s.end < boundary
            and not s.summary.strip()
        )
        no_history = tuple(s.ref for s in chain.scenes if not s.history.strip())
        stop = chain.stop if chain.blocked else ""
        refusal = Refusal(smallest, self.limit, self.reserve, no_summary, no_history, stop)
        self.steps.append("case 6: " + refusal.explain())
        return Assembly(
            case=6,
            messages=len(story),
            limit=self.limit,
            reserve=self.reserve,
            head=opening,
            tail=ending,
            tail_target=floor,
            tokens=smallest,
            steps=tuple(self.steps),
            refusal=refusal,
        )


def assemble(story: Story, shape: Shape, limit: int, pricer: Pricer, *, reserve: int = 0) -> Assembly:
    """Build the plan of the prompt for `story` within `limit` tokens (cases 1–6).

    Case 6 does not raise: the returned Assembly has `case == 6` and a `refusal`.
    """
    return _Search(story, shape, limit, reserve, pricer).run()
