"""The context assembler: otaku's six cases (seed 001), as ARCHITECTURE.md states them.

Read it beside the design. The window's sections, which every case is made of:

- `head` — the opening messages, kept verbatim;
- `covered_chain` — the scenes whose summaries replace the middle, for one tail target;
- `tail` — everything after the last covered scene;
- `cards_in` — cards are never summarised: each stands before its scene's summary (the
  message-47 example);
- `recap_at_level` — case 4: a scene's history stands in for the summaries up to it, and
  the cards of those scenes float in front of it;
- `rungs` — case 5: the tail targets, 150 → 100 → 50.

Then the cases, in the seed's order, as the search tries them:

- cases 1 and 2, "all messages are placed in the context verbatim": `_Search.fit_verbatim`;
- case 3, "limit context growth while maintaining the prose style": `_Search.fit_summaries`;
- case 4, "let the play continue by degrading the summaries": `_Search.fit_levels`;
- case 5, "let the play continue by degrading the tail": `_Search.ladder`;
- case 6, "the assembler refuses to compose the context": `_Search.refuse`;
- `classify` names the case of a result; it is the only place a case number is decided.

Each decision of the search is recorded as a `Step` — plain facts, no sentences; the report
layer (`report.py`) writes the sentences.

`assemble()` is pure: no I/O, no printing. What a part costs in the prompt is asked of a
`Pricer`, which knows the template and format; the assembler adds those costs up (never
re-rendering the prompt per candidate) and asks the pricer for the exact count only of the
candidate that fits, so the emitted prompt is ≤ the limit to the token.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import accumulate
from typing import Literal, NamedTuple, Protocol

from ..story.model import Message, Role, Scene, Story

PartKind = Literal["message", "card", "summary", "history"]
SceneRef = int | str
Cache = Literal["exact", "stable"]
CACHES: tuple[str, ...] = ("exact", "stable")


@dataclass(frozen=True)
class Shape:
    """The numbers of the seed that shape a prompt (the `[context]` settings)."""

    head: int = 20
    min_tail: int = 150
    tail_step: int = 50
    tail_floor: int = 50

    @property
    def threshold(self) -> int:
        """The verbatim threshold: head_messages + min_tail_messages (170 by default)."""
        return self.head + self.min_tail


@dataclass(frozen=True)
class Policy:
    """How a shape is chosen among the candidates that fit (the `[context] cache` settings).

    `exact`: the first candidate that fits, turn by turn (the seed's search as written).
    `stable`: keep the shape of the previous turns while it is still a candidate and fits, so the
    prompt's prefix stays byte-stable for a backend's prompt cache; when it must change, move
    to the first candidate that leaves `slack` (a share of the limit) free for the coming turns;
    take a less degraded one only when it leaves that slack free (`_Stable`)."""

    cache: Cache = "exact"
    slack: float = 0.03


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

    def text(self, text: str) -> int:
        """Tokens of a bare text, without any framing (a quick price for a message's content)."""
        ...


# ── The facts of the search ──────────────────────────────────────────────────────────────
# The steps are NamedTuples: immutable records like the rest, but every run defines a dozen
# kinds, and on Python 3.11 a frozen dataclass takes four times as long to define (0.9 ms).


@dataclass(frozen=True)
class ChainStop:
    """Why a covered chain ends where it does.

    `head_full`: the head holds every message; `no_start`: no scene holds message H+1;
    `gap`: messages `first`..`last` belong to no scene; `reaches_tail`: `scene` ends at
    message `last`, not before `boundary` (N − `target`); `no_summary`: `scene` has none;
    `no_more`: the story has no more scenes."""

    kind: Literal["head_full", "no_start", "gap", "reaches_tail", "no_summary", "no_more"]
    scene: SceneRef | None = None
    first: int = 0
    last: int = 0
    boundary: int = 0
    messages: int = 0
    target: int = 0


class HeadPriced(NamedTuple):
    """The head and the fixed frame every candidate pays."""

    messages: tuple[int, ...]  # (first, last) or ()
    tokens: int
    fixed: int
    limit: int


class ChainFound(NamedTuple):
    """The covered chain for a tail target (no scenes: everything is verbatim)."""

    target: int
    scenes: tuple[SceneRef, ...]
    messages: tuple[int, ...]  # the covered messages (first, last) or ()
    stop: ChainStop


class SameChain(NamedTuple):
    """A lower rung covers the same scenes as the one before: nothing new to try."""

    target: int
    scenes: tuple[SceneRef, ...]


class TailOverflow(NamedTuple):
    """At this tail target the head and tail alone exceed the limit."""

    target: int
    tail: tuple[int, ...]  # (first, last) or ()
    limit: int


class Tried(NamedTuple):
    """A candidate tested for fit: everything verbatim (`level` None), or a level of the chain.

    `tokens` is the parts' sum when `rendered` is false, else the count of the rendered prompt."""

    target: int
    level: int | None
    scenes: tuple[SceneRef, ...]  # the covered chain
    tokens: int
    limit: int
    rendered: bool

    @property
    def fits(self) -> bool:
        return self.tokens <= self.limit


class SummariesOverflow(NamedTuple):
    """Level 0 cannot fit: `over` are the summaries that, with nothing else, already take
    `tokens` of the `room` left (room ≤ 0: head, tail and cards leave none)."""

    scenes: tuple[SceneRef, ...]
    over: tuple[SceneRef, ...]
    tokens: int
    room: int


class LevelsOverflow(NamedTuple):
    """Levels `first`..`last` cannot fit: the summaries they keep alone exceed the room."""

    first: int
    last: int


class NoHistory(NamedTuple):
    """Levels that do not exist: their scenes have no history."""

    levels: tuple[int, ...]
    scenes: tuple[SceneRef, ...]


class FitsRendered(NamedTuple):
    """At the floor the parts' sum was over, but the rendered prompt fits (sums are conservative)."""

    target: int
    level: int
    priced: int
    tokens: int
    limit: int


class Held(NamedTuple):
    """The stable policy's choice: the shape (covered scenes, level) held since message
    `since`, the `changes` of shape the story went through up to now, the `slack` in tokens
    it kept at each change, and the `room` (tokens) and `turns` (messages of the size of the
    recent ones) left before the shape must change again."""

    since: int
    target: int
    level: int
    scenes: tuple[SceneRef, ...]
    changes: int
    slack: int
    room: int
    turns: int


class Refused(NamedTuple):
    """Case 6."""

    refusal: Refusal


Step = (
    HeadPriced
    | ChainFound
    | SameChain
    | TailOverflow
    | Tried
    | SummariesOverflow
    | LevelsOverflow
    | NoHistory
    | FitsRendered
    | Held
    | Refused
)


@dataclass(frozen=True)
class Refusal:
    """Case 6: why nothing fits, and what would."""

    smallest: int  # tokens of the smallest prompt reached
    limit: int
    reserve: int
    missing_summaries: tuple[SceneRef, ...] = ()
    missing_histories: tuple[SceneRef, ...] = ()
    chain_stop: ChainStop | None = None  # why the summaries stop where they do, when the story could fix it

    @property
    def context(self) -> int:
        """The context the limit came from (window or max_context)."""
        return self.limit + self.reserve

    @property
    def needed_context(self) -> int:
        """The context (window or max_context) that would fit the smallest prompt and the reserve."""
        return self.smallest + self.reserve


@dataclass(frozen=True)
class Assembly:
    """The plan of one prompt and the trace of how it was chosen."""

    messages: int  # N
    limit: int
    reserve: int
    head: tuple[Message, ...] = ()
    recap: tuple[Part, ...] = ()  # floated cards, history, then cards + summaries, in order
    tail: tuple[Message, ...] = ()
    tail_target: int = 0
    level: int = 0  # 0 = all summaries; k = scene k's history stands in for summaries 1..k
    tokens: int = 0  # the emitted prompt's count (exact), or the smallest reached on refusal
    steps: tuple[Step, ...] = ()
    refusal: Refusal | None = None
    costs: dict[str, int] = field(default_factory=dict, compare=False)  # tokens by section
    case: int = 0  # 1–6, named by `classify` once the search is over

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


# ── The window's sections, which every case is made of ──────────────────────────────────


def head(story: Story, shape: Shape) -> tuple[Message, ...]:
    """ "The first messages (the head_messages setting) are passed verbatim": messages
    1..min(H, N). The system message, when there is one, comes before it."""
    return story.messages[: min(shape.head, len(story))]


@dataclass(frozen=True)
class Chain:
    """The scenes whose summaries replace the middle, for one tail target."""

    scenes: tuple[Scene, ...]
    stop: ChainStop  # why the chain ends where it does
    missing_summary: Scene | None = None  # the scene whose missing summary ended it
    blocked: bool = False  # it ends before the tail for a reason the story could fix


def covered_chain(story: Story, shape: Shape, tail_target: int, messages: int | None = None) -> Chain:
    """The scenes, in order, from the one holding message H+1, each starting right after the
    previous one, each summarised, each ending before message N−T ("the scene that covers
    message 70" starts the tail). The first scene that breaks a condition ends the chain.
    `messages` takes N as smaller than the story (an earlier turn of it)."""
    n, first = len(story) if messages is None else messages, shape.head + 1
    boundary = n - tail_target
    if first > n:
        return Chain((), ChainStop("head_full", messages=n))
    scenes = story.scenes
    at = bisect_right([s.start for s in scenes], first) - 1
    if at < 0 or not scenes[at].holds(first):
        return Chain((), ChainStop("no_start", first=first), blocked=first < boundary)
    chain: list[Scene] = []
    for scene in scenes[at:]:
        if chain and scene.start != chain[-1].end + 1:
            gap = ChainStop("gap", first=chain[-1].end + 1, last=scene.start - 1)
            return Chain(tuple(chain), gap, blocked=chain[-1].end + 1 < boundary)
        if scene.end >= boundary:
            late = ChainStop(
                "reaches_tail", scene.ref, last=scene.end, boundary=boundary, messages=n, target=tail_target
            )
            return Chain(tuple(chain), late)
        if not scene.summary.strip():
            return Chain(tuple(chain), ChainStop("no_summary", scene.ref), missing_summary=scene, blocked=True)
        chain.append(scene)
    last = chain[-1].end if chain else first - 1
    return Chain(tuple(chain), ChainStop("no_more"), blocked=last + 1 < boundary)


def tail(story: Story, shape: Shape, chain: Chain) -> tuple[Message, ...]:
    """Every message after the last covered scene (after the head when nothing is covered)."""
    after = chain.scenes[-1].end if chain.scenes else min(shape.head, len(story))
    return story.messages[after:]


def cards_in(
    scene: Scene, story: Story, shape: Shape, card_numbers: Sequence[int] | None = None
) -> tuple[Message, ...]:
    """ "Cards never get into scene summaries": the cards of a covered scene. Those already in
    the head are there verbatim and are not repeated. `card_numbers` (sorted) saves a scan."""
    first = max(scene.start, shape.head + 1)
    if card_numbers is None:
        return tuple(m for m in story.messages[first - 1 : scene.end] if m.is_card)
    lo, hi = bisect_left(card_numbers, first), bisect_right(card_numbers, scene.end)
    return tuple(story.messages[number - 1] for number in card_numbers[lo:hi])


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


def rungs(shape: Shape, messages: int | None = None) -> list[int]:
    """ "Reduce the min_tail_messages setting in steps of 50 (150 → 100 → 50; 50 is the
    floor)": the tail targets to try, in order.

    Given the story's length, the targets that cannot cover a scene (the tail would reach
    back into the head) are one and the same prompt: after the first, they are passed over,
    so a huge min_tail_messages with a small tail_step costs nothing."""
    targets = [shape.min_tail]
    step, floor = shape.tail_step, shape.tail_floor
    first = 1
    if messages is not None:
        coverable = messages - shape.head - 2  # the largest target whose chain can hold a scene
        first = max(1, -(-(shape.min_tail - coverable) // step))
    target = shape.min_tail - first * step
    while target >= floor:
        targets.append(target)
        target -= step
    if targets[-1] > floor:
        targets.append(floor)
    return targets


def _ends(messages: Sequence[Message]) -> tuple[int, ...]:
    return (messages[0].number, messages[-1].number) if messages else ()


def _refs(scenes: Iterable[Scene]) -> tuple[SceneRef, ...]:
    return tuple(s.ref for s in scenes)


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


# ── The search: cases 1 to 6, in the seed's order ──────────────────────────────────────


@dataclass(frozen=True)
class _Rung:
    """What one tail target fixes for every candidate tried at it."""

    target: int
    chain: Chain
    opening: tuple[Message, ...]
    ending: tuple[Message, ...]
    base: int  # the fixed frame and the head
    tail_cost: int
    recap_cost: int = 0  # the recap's opening and its cards: what every level pays alike

    @property
    def fixed_cost(self) -> int:
        """What every candidate at this rung pays whatever its level."""
        return self.base + self.tail_cost + self.recap_cost

    def candidate(self, search: _Search, level: int, tokens: int) -> Assembly:
        return Assembly(
            messages=len(search.story),
            limit=search.limit,
            reserve=search.reserve,
            head=self.opening,
            recap=recap_at_level(self.chain.scenes, level, search.cards),
            tail=self.ending,
            tail_target=self.target,
            level=level,
            tokens=tokens,
        )


@dataclass
class _Search:
    story: Story
    shape: Shape
    limit: int
    reserve: int
    pricer: Pricer
    steps: list[Step] = field(default_factory=list)
    smallest: int | None = None

    # ── Pricing ──

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

    def recap_cost(self, scenes: Sequence[Scene], opening: Sequence[Message]) -> int:
        """What every level of this chain pays alike: the recap's opening and its cards."""
        cards = sum(self.pricer.recap_part(Part("card", message=m)) for s in scenes for m in self.cards(s))
        return self.pricer.recap_opening(opening[-1].role if opening else None) + cards

    @cached_property
    def card_numbers(self) -> list[int]:
        return [m.number for m in self.story.cards]

    def cards(self, scene: Scene) -> tuple[Message, ...]:
        return cards_in(scene, self.story, self.shape, self.card_numbers)

    def confirm(self, rung: _Rung, level: int | None, estimate: int) -> Assembly | None:
        """Test a candidate for fit: by its parts' prices, then by what would really be
        emitted. Prices are exact but for tokens that join across a boundary, so a candidate
        within a hair of the limit is rendered and counted before it is given up."""
        scenes = _refs(rung.chain.scenes)
        if estimate > self.limit + near_miss(self.limit):
            self.steps.append(Tried(rung.target, level, scenes, estimate, self.limit, rendered=False))
            return None
        candidate = rung.candidate(self, level or 0, estimate)
        exact = self.pricer.exact(candidate)
        if self.smallest is None or exact < self.smallest:
            self.smallest = exact
        self.steps.append(Tried(rung.target, level, scenes, exact, self.limit, rendered=True))
        if exact > self.limit:
            return None
        return replace(candidate, tokens=exact, costs=self.section_costs(candidate))

    def section_costs(self, a: Assembly) -> dict[str, int]:
        opening = self.pricer.recap_opening(a.head[-1].role if a.head else None) if a.recap else 0
        return {
            "fixed": self.pricer.fixed(),
            "head": sum(self.verbatim_costs(a.head, None)),
            "recap": opening + sum(self.pricer.recap_part(p) for p in a.recap),
            "tail": sum(self.verbatim_costs(a.tail, self.tail_after(a.head, bool(a.recap)))),
        }

    # ── Cases 1 and 2: everything verbatim ──

    def fit_verbatim(self, rung: _Rung) -> Assembly | None:
        """Case 1 (fewer messages than the verbatim threshold) and case 2 (at least that many,
        but no scene summary to cover the middle with): every message verbatim."""
        return self.confirm(rung, None, rung.fixed_cost)

    # ── Case 3: summaries of the covered scenes ──

    def fit_summaries(self, rung: _Rung, suffix: list[int], lowest: int, room: int) -> Assembly | None:
        """Case 3: head, every covered scene's summary (its cards before it), tail — level 0.
        `suffix[j]` prices summaries j+1..m; `lowest` is the first j whose suffix fits."""
        scenes = rung.chain.scenes
        if lowest > 0:
            over = _refs(scenes[lowest - 1 :])  # the summaries that, with nothing else, already overflow
            self.steps.append(SummariesOverflow(_refs(scenes), over, suffix[lowest - 1], room))
            return None
        return self.confirm(rung, 0, rung.fixed_cost + suffix[0])

    # ── Case 4: the story so far ──

    def fit_levels(self, rung: _Rung, suffix: list[int], lowest: int) -> Assembly | None:
        """Case 4: level k puts scene k's history in place of summaries 1..k (the cards of
        those scenes float before it), for k = 1.. in order; the first that fits wins. A
        level whose scene has no history does not exist."""
        scenes = rung.chain.scenes
        first_level = max(1, lowest)
        if first_level > 1:
            self.steps.append(LevelsOverflow(1, first_level - 1))
        missing: list[int] = []  # levels skipped in a row, reported as one step
        for level in range(first_level, len(scenes) + 1):
            scene = scenes[level - 1]
            if not scene.history.strip():
                missing.append(level)
                continue
            self.note_missing(missing, scenes)
            history_cost = self.pricer.recap_part(Part("history", scene=scene))
            found = self.confirm(rung, level, rung.fixed_cost + history_cost + suffix[level])
            if found:
                return found
        self.note_missing(missing, scenes)
        return None

    def note_missing(self, levels: list[int], scenes: Sequence[Scene]) -> None:
        """One step for a run of levels that do not exist (their scenes have no history)."""
        if levels:
            self.steps.append(NoHistory(tuple(levels), tuple(scenes[k - 1].ref for k in levels)))
            levels.clear()

    def fit_rung(self, target: int, chain: Chain, opening: tuple[Message, ...], base: int) -> Assembly | None:
        """Cases 1–4 at one tail target: verbatim when nothing is covered, else level 0, then
        the levels of this chain in order."""
        ending = tail(self.story, self.shape, chain)
        # Prices are within a hair of the rendered count: keep what is within `near_miss` of
        # the limit in play, so `confirm` can count it exactly.
        room = self.limit - base + near_miss(self.limit)
        after = self.tail_after(opening, bool(chain.scenes))
        tail_cost, whole = _capped_sum(self.verbatim_costs(ending, after, newest_first=True), room)
        if not whole:
            self.steps.append(TailOverflow(target, _ends(ending), self.limit))
            return None
        if not chain.scenes:
            return self.fit_verbatim(_Rung(target, chain, opening, ending, base, tail_cost))
        rung = _Rung(target, chain, opening, ending, base, tail_cost, self.recap_cost(chain.scenes, opening))
        room -= tail_cost + rung.recap_cost
        # suffix[j] = tokens of the summaries of scenes j+1..m (0-based j); counted from the
        # newest back, and only as far as could ever fit.
        scenes = chain.scenes
        suffix = [0] * (len(scenes) + 1)
        lowest = len(scenes)  # smallest j with suffix[j] ≤ room
        for j in range(len(scenes) - 1, -1, -1):
            suffix[j] = suffix[j + 1] + self.pricer.recap_part(Part("summary", scene=scenes[j]))
            if suffix[j] > room:
                break
            lowest = j
        return self.fit_summaries(rung, suffix, lowest, room) or self.fit_levels(rung, suffix, lowest)

    # ── Case 5: a shorter tail ──

    def ladder(self) -> Assembly:
        """Case 5: the tail target drops by tail_step down to tail_floor, and cases 1–4 run
        again at each rung until one fits; at the floor, case 6."""
        opening = head(self.story, self.shape)
        fixed = self.pricer.fixed()
        head_cost = sum(self.verbatim_costs(opening, None))
        self.steps.append(HeadPriced(_ends(opening), head_cost, fixed, self.limit))
        base = fixed + head_cost
        previous: tuple[Scene, ...] | None = None
        targets = rungs(self.shape, len(self.story))
        for target in targets:
            chain = covered_chain(self.story, self.shape, target)
            if previous is not None and chain.scenes == previous:
                self.steps.append(SameChain(target, _refs(chain.scenes)))
                continue
            previous = chain.scenes
            covered = (chain.scenes[0].start, chain.scenes[-1].end) if chain.scenes else ()
            self.steps.append(ChainFound(target, _refs(chain.scenes), covered, chain.stop))
            found = self.fit_rung(target, chain, opening, base)
            if found is not None:
                return replace(found, steps=tuple(self.steps))
        return self.refuse(opening, base, targets[-1])

    # ── Case 6: refusal ──

    def refuse(self, opening: tuple[Message, ...], base: int, floor: int) -> Assembly:
        """Nothing fits at the floor: say the smallest size reached, the context that would
        fit it, and which scenes' missing summaries or histories stand in the way."""
        story, shape = self.story, self.shape
        chain = covered_chain(story, shape, floor)
        ending = tail(story, shape, chain)
        rest = base + sum(self.verbatim_costs(ending, self.tail_after(opening, bool(chain.scenes))))
        rest += self.recap_cost(chain.scenes, opening) if chain.scenes else 0
        summaries = [self.pricer.recap_part(Part("summary", scene=s)) for s in chain.scenes]
        sizes = {0: rest + sum(summaries)}
        for level, scene in enumerate(chain.scenes, start=1):
            if scene.history.strip():
                sizes[level] = rest + self.pricer.recap_part(Part("history", scene=scene)) + sum(summaries[level:])
        # The parts' sum is an upper bound; the smallest size reached is what the smallest
        # candidate really renders to (one render, on this error path only).
        level = min(sizes, key=sizes.__getitem__)
        rung = _Rung(floor, chain, opening, ending, base, 0)
        candidate = rung.candidate(self, level, 0)
        exact = self.pricer.exact(candidate)
        if exact <= self.limit:  # the parts' sum was conservative; the prompt itself fits
            self.steps.append(FitsRendered(floor, level, sizes[level], exact, self.limit))
            return replace(candidate, tokens=exact, steps=tuple(self.steps), costs=self.section_costs(candidate))
        smallest = min(exact, self.smallest) if self.smallest is not None else exact
        boundary = len(story) - floor
        covered_to = chain.scenes[-1].end if chain.scenes else shape.head
        no_summary = tuple(
            s.ref for s in story.scenes if s.start > covered_to and s.end < boundary and not s.summary.strip()
        )
        no_history = tuple(s.ref for s in chain.scenes if not s.history.strip())
        refusal = Refusal(
            smallest, self.limit, self.reserve, no_summary, no_history, chain.stop if chain.blocked else None
        )
        self.steps.append(Refused(refusal))
        return Assembly(
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


# ── The stable policy: a prompt whose prefix holds from turn to turn ────────────────────


Candidate = tuple[int, int]  # (covered scenes m, level k): scenes 1..m of the run, level k of them


@dataclass
class _Stable:
    """`cache = "stable"`: the same candidates as the seed's search, chosen so the prompt's
    prefix survives from one turn to the next.

    A backend reuses its work only for an unchanged prefix, and the exact search changes the
    shape whenever another candidate fits first (the tail target flips 100 → 50 → 100, the
    level climbs a step a turn), rewriting all after the head. This policy walks the story's
    turns from the first message to the last — turn n is the story's first n messages, with
    the scenes that end by then — holding a shape (covered scenes, level) while it is still
    one of the seed's candidates at that turn and its parts still fit the limit.

    - It takes a less degraded shape (one before it in the seed's order: fewer covered scenes,
      a lower level) only when that shape leaves `slack` of the limit free.
    - When the shape must change, it moves to the first candidate (in the seed's order) that
      leaves the slack free; when none does, to the first that fits without stepping back;
      only when none fits at all, to the first that fits.
    - While the shape holds, it looks for a less degraded one that leaves the slack free only
      at a checkpoint: a turn where the seed's candidates change, because a scene joins the
      chain of some tail target. Without this, a shape taken under pressure would stay more
      degraded than the window needs until the story's end.

    The walk reads nothing but the story: a build of turn N is the N-th turn of a replay,
    with no state kept between builds. The cost: each message is priced once (every message
    is in some turn's tail), which the exact search never pays for the covered middle."""

    search: _Search
    slack: float

    def __post_init__(self) -> None:
        story, shape = self.search.story, self.search.shape
        self.run = covered_chain(story, shape, -len(story) - 1).scenes  # every scene a chain may hold
        self.ends = [s.end for s in self.run]
        pricer, cards = self.search.pricer, self.search.cards
        self.summaries = [0]
        self.card_costs = [0]
        for scene in self.run:
            self.summaries.append(self.summaries[-1] + pricer.recap_part(Part("summary", scene=scene)))
            self.card_costs.append(
                self.card_costs[-1] + sum(pricer.recap_part(Part("card", message=m)) for m in cards(scene))
            )
        self.histories = {
            k: pricer.recap_part(Part("history", scene=s)) for k, s in enumerate(self.run, start=1) if s.history.strip()
        }
        # What level k adds to a chain's price (its history in place of summaries 1..k; a level
        # without a history is never a candidate), and the least of that over levels 1..k: a
        # chain's first level that fits is then found by bisection, not by pricing each level.
        self.level_cost = [math.inf] + [
            self.histories[k] - self.summaries[k] if k in self.histories else math.inf
            for k in range(1, len(self.run) + 1)
        ]
        self.cheapest = list(accumulate(self.level_cost, min))
        # Each message after the one before it (the first after the frame), in prefix sums.
        messages = story.messages
        self.framing: dict[tuple[Role, str | None, Role | None], int] = {}
        self.prefix = [0]
        for j, message in enumerate(messages):
            self.prefix.append(self.prefix[-1] + self.quick(message, messages[j - 1].role if j else None))
        opening = head(story, shape)
        self.head_role: Role | None = opening[-1].role if opening else None
        self.opening = pricer.recap_opening(self.head_role) if self.run else 0
        self.fixed = pricer.fixed()

    def quick(self, message: Message, after: Role | None) -> int:
        """A message's price for the walk: its content's tokens and its turn's framing (measured
        once per role, name and role before), so the walk does not render every message. The
        prompt of the last turn is priced part by part and counted as emitted, as always."""
        pricer = self.search.pricer
        if message.is_card:
            return pricer.part(Part.verbatim(message), after)
        key = (message.role, message.name, after)
        framing = self.framing.get(key)
        if framing is None:
            probe = Message(0, message.role, "…", message.name)
            framing = self.framing[key] = pricer.part(Part.verbatim(probe), after) - pricer.text("…")
        return framing + pricer.text(message.content)

    # ── The candidates of one turn ──

    def covers(self, n: int, target: int) -> int:
        """How many scenes the covered chain holds at turn n for this tail target."""
        return bisect_left(self.ends, n - target)

    def chains(self, n: int) -> tuple[int, ...]:
        """The covered chains of turn n (as scene counts), one per tail target of the ladder
        from the longest, each once: a shape is a candidate while its chain is among them.
        They change only where a scene joins the chain of some target: the walk's checkpoints."""
        return tuple(dict.fromkeys(self.covers(n, target) for target in rungs(self.search.shape, n)))

    def candidates(self, n: int) -> list[Candidate]:
        """Turn n's candidates in the seed's order: tail targets from the longest, each chain's
        summaries (level 0) before its levels."""
        return [(m, k) for m in self.chains(n) for k in range(m + 1) if k == 0 or k in self.histories]

    def target(self, m: int, n: int) -> int:
        """The longest tail target whose chain holds `m` scenes at turn n."""
        targets = rungs(self.search.shape, n)
        return next((t for t in targets if self.covers(n, t) == m), targets[-1])

    def estimate(self, candidate: Candidate, n: int) -> int:
        """The candidate's parts at turn n, priced as the exact search prices them."""
        m, k = candidate
        h = min(self.search.shape.head, n)
        cost = self.fixed + self.prefix[h]
        first = self.ends[m - 1] + 1 if m else h + 1
        if m:
            recap = self.card_costs[m] + self.summaries[m] - self.summaries[k]
            cost += self.opening + recap + (self.histories[k] if k else 0)
        if first <= n:
            after: Role | None = "system" if m else self.head_role
            own = self.quick(self.search.story.messages[first - 1], after)
            cost += own + self.prefix[n] - self.prefix[first]
        return cost

    def ordered(self, n: int, floor: Candidate | None) -> Iterator[Candidate]:
        """Where to move at turn n: first the candidates that do not step back (no fewer
        covered scenes, no lower level), then, as a last resort, all of them."""
        every = self.candidates(n)
        if floor is not None:
            yield from (c for c in every if c[0] >= floor[0] and c[1] >= floor[1])
        yield from every

    def first_fit(
        self, n: int, bound: int, *, floor: Candidate | None = None, stop: Candidate | None = None
    ) -> Candidate | None:
        """The first candidate of turn n, in the seed's order, priced at most `bound`: none
        that steps back from `floor` (fewer covered scenes, a lower level), none from `stop` on.
        A chain's levels differ in price only by `level_cost`, so each chain is priced once."""
        for m in self.chains(n):
            last = stop is not None and m == stop[0]
            if floor is None or m >= floor[0]:
                low = floor[1] if floor is not None else 0
                high = stop[1] - 1 if last and stop is not None else m
                plain = self.estimate((m, 0), n)
                if low == 0 <= high and plain <= bound:
                    return (m, 0)
                level = self.first_level(bound - plain, max(low, 1), high)
                if level is not None:
                    return (m, level)
            if last:
                return None
        return None

    def first_level(self, room: int, low: int, high: int) -> int | None:
        """The lowest level in low..high whose `level_cost` is at most `room`."""
        if high < low:
            return None
        if low > 1:
            return next((k for k in range(low, high + 1) if self.level_cost[k] <= room), None)
        if self.cheapest[high] > room:
            return None
        levels = range(1, high + 1)  # the cheapest so far falls with the level: fits from one level on
        return levels[bisect_left(levels, True, key=lambda k: self.cheapest[k] <= room)]

    def roomy(self, n: int, stop: Candidate | None = None) -> Candidate | None:
        """The first candidate of turn n, in the seed's order, that leaves the slack free,
        looking no further than `stop`."""
        return self.first_fit(n, self.search.limit - self.slack_tokens, stop=stop)

    def choose(self, n: int, floor: Candidate | None) -> Candidate | None:
        """Where the shape moves when it must: the first candidate that leaves the slack free
        (the only way it steps back to a less degraded one); else the first that fits without
        stepping back; else, as a last resort, the first that fits at all."""
        limit = self.search.limit
        return self.roomy(n) or self.first_fit(n, limit, floor=floor) or self.first_fit(n, limit)

    @property
    def slack_tokens(self) -> int:
        return int(self.search.limit * self.slack)

    def walk(self) -> tuple[Candidate | None, int, int]:
        """The shape held at the last turn, the turn it was chosen, and how many changes of
        shape the story went through."""
        limit, state, floor, since, changes = self.search.limit, None, None, 0, 0
        chains: tuple[int, ...] = ()
        for n in range(1, len(self.search.story) + 1):
            chains, before = self.chains(n), chains
            if state is not None and state[0] in chains and self.estimate(state, n) <= limit:  # still held
                back = self.roomy(n, stop=state) if chains != before else None  # a checkpoint
                if back is None:
                    continue
                chosen: Candidate | None = back
            else:
                chosen = self.choose(n, floor)
            if chosen != state:
                changes += state is not None
                since = n
            state = chosen
            floor = chosen or floor
        return state, since, changes

    # ── The last turn: the shape confirmed by the emitted count ──

    def rung(self, target: int, base: int) -> _Rung:
        search, story, shape = self.search, self.search.story, self.search.shape
        chain = covered_chain(story, shape, target)
        opening = head(story, shape)
        ending = tail(story, shape, chain)
        after = search.tail_after(opening, bool(chain.scenes))
        tail_cost = sum(search.verbatim_costs(ending, after))
        recap = search.recap_cost(chain.scenes, opening) if chain.scenes else 0
        return _Rung(target, chain, opening, ending, base, tail_cost, recap)

    def assemble(self) -> Assembly:
        search, n = self.search, len(self.search.story)
        held, since, changes = self.walk()
        opening = head(search.story, search.shape)
        base = self.fixed + self.prefix[len(opening)]
        search.steps.append(HeadPriced(_ends(opening), base - self.fixed, self.fixed, search.limit))
        tried = [held] if held is not None else []
        for candidate in dict.fromkeys([*tried, *self.ordered(n, held)]):
            m, k = candidate
            target = self.target(m, n)
            rung = self.rung(target, base)
            if len(rung.chain.scenes) != m:  # not a candidate at this turn after all
                continue
            if candidate != held:
                since, changes = n, changes + (held is not None)
                held = candidate
            history = self.search.pricer.recap_part(Part("history", scene=self.run[k - 1])) if k else 0
            summaries = sum(self.search.pricer.recap_part(Part("summary", scene=s)) for s in rung.chain.scenes[k:])
            found = search.confirm(rung, k if m else None, rung.fixed_cost + history + summaries)
            if found is not None:
                room = search.limit - found.tokens
                recent = self.prefix[n] - self.prefix[max(len(opening), n - 10)]
                per_turn = max(1, recent // max(1, min(10, n - len(opening)))) if n > len(opening) else 0
                note = Held(
                    since, target, k, _refs(rung.chain.scenes), changes, self.slack_tokens, room,
                    room // per_turn if per_turn else 0,
                )  # fmt: skip
                steps = [*search.steps]
                steps.insert(1, ChainFound(target, _refs(rung.chain.scenes), _covered(rung.chain), rung.chain.stop))
                steps.insert(2, note)
                return replace(found, steps=tuple(steps))
        search.steps.clear()
        return search.ladder()


def _covered(chain: Chain) -> tuple[int, ...]:
    return (chain.scenes[0].start, chain.scenes[-1].end) if chain.scenes else ()


# ── Naming the case ──────────────────────────────────────────────────────────────────────


def classify(assembly: Assembly, shape: Shape) -> int:
    """The seed's case of a result — the only place a case number is decided.

    6: refused. Nothing covered: 1 when the story holds fewer messages than the verbatim
    threshold, else 2 (whatever the tail target, since a verbatim prompt does not depend on
    it). Otherwise 5 when the tail target dropped below min_tail_messages, 4 when a history
    stands in for summaries, else 3."""
    if assembly.refusal is not None:
        return 6
    if not assembly.recap:
        return 1 if assembly.messages < shape.threshold else 2
    if assembly.tail_target < shape.min_tail:
        return 5
    return 4 if assembly.level else 3


def assemble(
    story: Story, shape: Shape, limit: int, pricer: Pricer, *, reserve: int = 0, policy: Policy = Policy()
) -> Assembly:
    """Build the plan of the prompt for `story` within `limit` tokens (cases 1–6), choosing
    among the candidates that fit by `policy` (the exact search, or the stable one).

    Case 6 does not raise: the returned Assembly has `case == 6` and a `refusal`.
    """
    search = _Search(story, shape, limit, reserve, pricer)
    found = _Stable(search, policy.slack).assemble() if policy.cache == "stable" else search.ladder()
    return replace(found, case=classify(found, shape))
