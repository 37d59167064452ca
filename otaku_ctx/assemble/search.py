"""The exact search: cases 1 to 6 in the seed's order (the module docstring of `assemble` maps
each case to its method)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..story.model import Message, Role, Scene, Story
from .parts import Assembly, Part, Pricer, Refusal, SceneRef, Shape
from .sections import (
    Chain,
    capped_sum,
    cards_in,
    covered_chain,
    ends,
    head,
    near_miss,
    recap_at_level,
    refs,
    rungs,
    tail,
)
from .steps import (
    ChainFound,
    FitsRendered,
    HeadPriced,
    LevelsOverflow,
    NoHistory,
    Refused,
    SameChain,
    Step,
    SummariesOverflow,
    TailOverflow,
    Tried,
)

# A pricer whose `exact_but_joins` is true prices each part exactly but for the tokens that join
# across its boundaries: at most this many a boundary (render/pricing.TemplatePricer).
JOIN_SLACK = 2
FAR_OVER = 8  # a refused prompt priced at this many times the limit is not rendered to be counted

# ── The search: cases 1 to 6, in the seed's order ──────────────────────────────────────


@dataclass(frozen=True)
class Rung:
    """What one tail target fixes for every candidate tried at it."""

    target: int
    chain: Chain
    opening: tuple[Message, ...]
    ending: tuple[Message, ...]
    base: int  # the fixed frame and the head
    tail_cost: int
    recap_cost: int = 0  # the recap's opening and its cards: what every level pays alike

    @cached_property
    def scenes(self) -> tuple[SceneRef, ...]:
        """Its chain's scenes by reference, as each candidate tried at it records them: once a rung."""
        return refs(self.chain.scenes)

    @property
    def fixed_cost(self) -> int:
        """What every candidate at this rung pays whatever its level."""
        return self.base + self.tail_cost + self.recap_cost

    def candidate(self, search: Search, level: int, tokens: int) -> Assembly:
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
class Search:
    story: Story
    shape: Shape
    limit: int
    reserve: int
    pricer: Pricer
    steps: list[Step] = field(default_factory=list)
    smallest: int | None = None

    # ── The trace ──

    def record(self, step: Step) -> None:
        self.steps.append(step)

    def result(self, found: Assembly, *, decided: Sequence[Step] = ()) -> Assembly:
        """`found` with the trace so far. `decided`, what a policy chose before trying its
        candidates (the stable policy's chain and why it holds), stands after the head's price."""
        return replace(found, steps=(*self.steps[:1], *decided, *self.steps[1:]))

    def restart(self) -> None:
        """Forget the trace: a policy that found nothing hands over to the exact search."""
        self.steps.clear()

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

    def confirm(self, rung: Rung, level: int | None, estimate: int) -> Assembly | None:
        """Test a candidate for fit: by its parts' prices, then by what would really be
        emitted. Prices are exact but for tokens that join across a boundary, so a candidate
        within a hair of the limit is rendered and counted before it is given up."""
        scenes = rung.scenes
        if estimate > self.limit + near_miss(self.limit):
            self.record(Tried(rung.target, level, scenes, estimate, self.limit, rendered=False))
            return None
        candidate = rung.candidate(self, level or 0, estimate)
        exact = self.pricer.exact(candidate)
        if self.smallest is None or exact < self.smallest:
            self.smallest = exact
        self.record(Tried(rung.target, level, scenes, exact, self.limit, rendered=True))
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

    def fit_verbatim(self, rung: Rung) -> Assembly | None:
        """Case 1 (fewer messages than the verbatim threshold) and case 2 (at least that many,
        but no scene summary to cover the middle with): every message verbatim."""
        return self.confirm(rung, None, rung.fixed_cost)

    # ── Case 3: summaries of the covered scenes ──

    def fit_summaries(self, rung: Rung, suffix: list[int], lowest: int, room: int) -> Assembly | None:
        """Case 3: head, every covered scene's summary (its cards before it), tail — level 0.
        `suffix[j]` prices summaries j+1..m; `lowest` is the first j whose suffix fits."""
        scenes = rung.chain.scenes
        if lowest > 0:
            over = refs(scenes[lowest - 1 :])  # the summaries that, with nothing else, already overflow
            self.record(SummariesOverflow(refs(scenes), over, suffix[lowest - 1], room))
            return None
        return self.confirm(rung, 0, rung.fixed_cost + suffix[0])

    # ── Case 4: the story so far ──

    def fit_levels(self, rung: Rung, suffix: list[int], lowest: int) -> Assembly | None:
        """Case 4: level k puts scene k's history in place of summaries 1..k (the cards of
        those scenes float before it), for k = 1.. in order; the first that fits wins. A
        level whose scene has no history does not exist."""
        scenes = rung.chain.scenes
        first_level = max(1, lowest)
        if first_level > 1:
            self.record(LevelsOverflow(1, first_level - 1))
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
            self.record(NoHistory(tuple(levels), tuple(scenes[k - 1].ref for k in levels)))
            levels.clear()

    def fit_rung(self, target: int, chain: Chain, opening: tuple[Message, ...], base: int) -> Assembly | None:
        """Cases 1–4 at one tail target: verbatim when nothing is covered, else level 0, then
        the levels of this chain in order."""
        ending = tail(self.story, self.shape, chain)
        # Prices are within a hair of the rendered count: keep what is within `near_miss` of
        # the limit in play, so `confirm` can count it exactly.
        room = self.limit - base + near_miss(self.limit)
        after = self.tail_after(opening, bool(chain.scenes))
        tail_cost, whole = capped_sum(self.verbatim_costs(ending, after, newest_first=True), room)
        if not whole:
            self.record(TailOverflow(target, ends(ending), self.limit))
            return None
        if not chain.scenes:
            return self.fit_verbatim(Rung(target, chain, opening, ending, base, tail_cost))
        rung = Rung(target, chain, opening, ending, base, tail_cost, self.recap_cost(chain.scenes, opening))
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
        self.record(HeadPriced(ends(opening), head_cost, fixed, self.limit))
        base = fixed + head_cost
        previous: tuple[Scene, ...] | None = None
        targets = rungs(self.shape, len(self.story))
        for target in targets:
            chain = covered_chain(self.story, self.shape, target)
            if previous is not None and chain.scenes == previous:
                self.record(SameChain(target, refs(chain.scenes)))
                continue
            previous = chain.scenes
            covered = (chain.scenes[0].start, chain.scenes[-1].end) if chain.scenes else ()
            self.record(ChainFound(target, refs(chain.scenes), covered, chain.stop))
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
        # candidate really renders to (one render, on this error path only) — unless the pricer's
        # prices are exact but for tokens joining across a part's boundary (JOIN_SLACK a part at
        # most) and the sum is FAR_OVER times the limit: then the sum is the size (a few tokens
        # off at most, of a context no window has), since rendering 100,000 verbatim messages
        # to count them costs what the story does and passes any render bound.
        level = min(sizes, key=sizes.__getitem__)
        rung = Rung(floor, chain, opening, ending, base, 0)
        candidate = rung.candidate(self, level, 0)
        slack = JOIN_SLACK * (len(candidate.parts) + 1)
        over = sizes[level] - slack > FAR_OVER * max(self.limit, 1)
        far = getattr(self.pricer, "exact_but_joins", False) and over
        exact = sizes[level] if far else self.pricer.exact(candidate)
        if exact <= self.limit:  # the parts' sum was conservative; the prompt itself fits
            self.record(FitsRendered(floor, level, sizes[level], exact, self.limit))
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
        self.record(Refused(refusal))
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
