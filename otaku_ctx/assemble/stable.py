"""The stable cache policy (docs/caching.md): the seed's candidates, chosen so the prompt's prefix
holds from turn to turn."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate

from ..story.model import Message, Role, Scene
from .parts import Assembly, Part, Walked
from .search import Rung, Search
from .sections import covered_chain, covered_ends, ends, head, near_miss, rungs, tail
from .steps import ChainFound, HeadPriced, Held

# ── The stable policy: a prompt whose prefix holds from turn to turn ────────────────────


Candidate = tuple[int, int]  # (covered scenes m, level k): scenes 1..m of the run, level k of them


@dataclass(frozen=True)
class Prices:
    """What a walk priced — each message after the one before it (in prefix sums), each
    scene's summary, cards and history — kept with its walk (`Walked.prices`) so the next
    turn of a chat prices only what is new: the messages and scenes that are the very objects
    priced then (`ctx serve` keeps them from turn to turn), by a pricer of the same frame (what
    its stand-in renders read, `TemplatePricer.frame`) and counter, keep their prices. Pricing
    every message of a 10,000-message chat again was most of serve's own time a turn."""

    frame: tuple[object, ...]  # the pricer's frame, its counter, the head
    messages: tuple[Message, ...]
    prefix: list[int]
    framing: dict[tuple[Role, str | None, Role | None], int]
    run: tuple[Scene, ...]
    summaries: list[int]
    card_costs: list[int]
    histories: dict[int, int]

    def same_messages(self, messages: tuple[Message, ...]) -> int:
        """How many of `messages`, from the first, are the objects priced here."""
        return _same(messages, self.messages)

    def same_scenes(self, run: tuple[Scene, ...]) -> int:
        """How many of the scenes in `run`, from the first, are the objects priced here."""
        return _same(run, self.run)


def _same(now: tuple[object, ...], before: tuple[object, ...]) -> int:
    """The length of the longest common start of two tuples, by identity."""
    n = 0
    for a, b in zip(now, before, strict=False):
        if a is not b:
            break
        n += 1
    return n


@dataclass
class Stable:
    """`cache = "stable"`: the same candidates as the seed's search, chosen so the prompt's
    prefix survives from one turn to the next.

    A backend reuses its work only for an unchanged prefix, and the exact search changes the
    shape whenever another candidate fits first (the tail target flips 100 → 50 → 100, the
    level climbs a step a turn), rewriting all after the head. This policy walks the story's
    turns from the first message to the last — turn n is the story's first n messages, with
    the scenes that end by then — holding a shape (covered scenes, level) while it is still
    one of the seed's candidates at that turn and its parts still fit the limit.

    A shape taken by choice must leave a margin free (`margin`): room for the next
    `lookahead` messages — the mean length of the scenes closed so far, the distance between
    the changes the seed's chains make anyway — of the recent size, and never less than
    `slack` of the limit; so a shape it takes lasts about a scene (issue 19: with the slack
    alone, a story of long messages flipped 50 → 100 → 50 at every scene).

    - When the shape must change, it moves to the first candidate (in the seed's order) that
      does not step back (no fewer covered scenes, no lower level) and leaves the margin
      free: the shape that will last, keeping the recap's start when it can. Else to the
      first that leaves the margin free; else to the first that fits without stepping back;
      only when none fits at all, to the first that fits.
    - While the shape holds, it takes a less degraded one (before it in the seed's order:
      fewer covered scenes, a lower level) only at a checkpoint — a turn where the seed's
      candidates change, because a scene joins the chain of some tail target — and only one
      that leaves the margin free. Without this, a shape taken under pressure would stay more
      degraded than the window needs until the story's end.

    The walk reads nothing but the story: a build of turn N is the N-th turn of a replay,
    with no state kept between builds. The cost: each message is priced once (every message
    is in some turn's tail), which the exact search never pays for the covered middle."""

    search: Search
    slack: float
    resume: Walked | None = None
    hold: bool = False  # `Policy.hold`

    def __post_init__(self) -> None:
        story, shape = self.search.story, self.search.shape
        self.run = covered_chain(story, shape, -len(story) - 1).scenes  # every scene a chain may hold
        self.ends = [s.end for s in self.run]
        self.lengths = [0, *accumulate(s.end - s.start + 1 for s in self.run)]  # of the first j scenes
        pricer, cards = self.search.pricer, self.search.cards
        known = self.resume.prices if self.resume is not None else None
        frame = (getattr(pricer, "frame", None), getattr(pricer, "count", None), shape.head)
        known = known if isinstance(known, Prices) and None not in frame and known.frame == frame else None
        same = known.same_scenes(self.run) if known is not None else 0
        self.summaries = known.summaries[: same + 1] if known is not None else [0]
        self.card_costs = known.card_costs[: same + 1] if known is not None else [0]
        for scene in self.run[same:]:
            self.summaries.append(self.summaries[-1] + pricer.recap_part(Part("summary", scene=scene)))
            self.card_costs.append(
                self.card_costs[-1] + sum(pricer.recap_part(Part("card", message=m)) for m in cards(scene))
            )
        self.histories = {k: v for k, v in known.histories.items() if k <= same} if known is not None else {}
        for k, scene in enumerate(self.run[same:], start=same + 1):
            if scene.history.strip():
                self.histories[k] = pricer.recap_part(Part("history", scene=scene))
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
        self.framing: dict[tuple[Role, str | None, Role | None], int] = known.framing if known is not None else {}
        priced = known.same_messages(messages) if known is not None else 0
        self.prefix = known.prefix[: priced + 1] if known is not None else [0]
        for j in range(priced, len(messages)):
            self.prefix.append(self.prefix[-1] + self.quick(messages[j], messages[j - 1].role if j else None))
        self.prices = Prices(frame, messages, self.prefix, self.framing, self.run, self.summaries, self.card_costs,
                             self.histories)  # fmt: skip
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
        """The first candidate of turn n, in the seed's order, that leaves the margin free,
        looking no further than `stop`."""
        return self.first_fit(n, self.search.limit - self.margin(n), stop=stop)

    def margin(self, n: int) -> int:
        """What a shape must leave free at turn n to be taken by choice (a step back, or a
        move that does not step back): room for the next `lookahead(n)` messages of the
        recent size, and never less than the slack."""
        return max(self.slack_tokens, math.ceil(self.lookahead(n) * self.recent(n)))

    def lookahead(self, n: int) -> float:
        """How many messages a shape taken by choice should last: the mean length of the
        scenes closed by turn n, the distance between the changes the seed's chains make
        anyway (a scene joining them). Read from turn n's story alone, so the walk's choice at
        turn n is the same in every later build."""
        closed = bisect_right(self.ends, n)
        return self.lengths[closed] / closed if closed else 0.0

    def recent(self, n: int) -> float:
        """The mean price of the story's last ten messages before turn n's end (after the head)."""
        h = min(self.search.shape.head, n)
        back = max(h, n - 10)
        return (self.prefix[n] - self.prefix[back]) / (n - back) if n > back else 0.0

    def choose(self, n: int, floor: Candidate | None) -> Candidate | None:
        """Where the shape moves when it must: the first candidate that does not step back and
        leaves the margin free (the shape that will last); else the first that leaves the
        margin free; else, in the first chain that fits without stepping back, its roomiest
        level; else, as a last resort, the first that fits at all."""
        limit, margin = self.search.limit, self.margin(n)
        kept = self.first_fit(n, limit - margin, floor=floor) if floor is not None else None
        return kept or self.roomy(n) or self.roomiest(n, floor) or self.first_fit(n, limit)

    def roomiest(self, n: int, floor: Candidate | None) -> Candidate | None:
        """When no shape leaves the margin free (the chain cannot grow: the scenes after it have
        no summaries yet): the first chain, from the longest tail, that fits at some level
        without stepping back, at the level of it that leaves the most room (the lowest of
        equals). The pressure goes into the story-so-far, not the recent messages, and as far
        as it can in one move: the first level that fits would be outgrown by the next turn's
        messages, one level a turn, each move rewriting all after the head."""
        low = floor[1] if floor is not None else 0
        for m in self.chains(n):
            if floor is not None and m < floor[0]:
                continue
            plain = self.estimate((m, 0), n)
            best = self.cheapest_level(max(low, 1), m)
            if low == 0 and (best is None or self.level_cost[best] >= 0):
                best = 0
            if best is not None and plain + (self.level_cost[best] if best else 0) <= self.search.limit:
                return (m, best)
        return None

    def cheapest_level(self, low: int, high: int) -> int | None:
        """The level in low..high that adds the least (`level_cost`; the lowest of equals), None
        when none there has a history: two lookups in `least_levels`, however many levels."""
        if high < low:
            return None
        row = (high - low + 1).bit_length() - 1
        table = self.least_levels[row]
        best = min(table[low], table[high - (1 << row) + 1], key=self._by_cost)
        return best if self.level_cost[best] < math.inf else None

    def _by_cost(self, level: int) -> tuple[float, int]:
        """A level's order for `cheapest_level`: what it adds, then the lowest of equals."""
        return self.level_cost[level], level

    @cached_property
    def least_levels(self) -> list[list[int]]:
        """A sparse table of the levels: row r's entry at k is the level in k..k+2^r−1 that adds
        the least (the lowest of equals), so the walk's every move under pressure (`roomiest`)
        reads a chain's cheapest level in two lookups, not by pricing each level."""
        rows = [list(range(len(self.level_cost)))]
        width = 1
        while 2 * width <= len(self.level_cost):
            last = rows[-1]
            rows.append([min(last[k], last[k + width], key=self._by_cost) for k in range(len(last) - width)])
            width *= 2
        return rows

    @property
    def slack_tokens(self) -> int:
        return int(self.search.limit * self.slack)

    def walk(self) -> Walked:
        """The shape held at the last turn, the last one taken, the turn it was chosen, and how
        many changes of shape the story went through — from the first message, or on from
        `resume` when it stands at an earlier turn of this story."""
        limit, state, floor, since, changes = self.search.limit, None, None, 0, 0
        chains: tuple[int, ...] = ()
        start, n_all = 1, len(self.search.story)
        r = self.resume
        if r is not None and self.goes_on(r):
            state, floor, since, changes, start = r.state, r.floor, r.since, r.changes, r.turn + 1
            chains = self.chains(r.turn)
        for n in range(start, n_all + 1):
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
        known = tuple(self.ends[: bisect_right(self.ends, n_all)])
        return Walked(n_all, state, floor, since, changes, self.fingerprint(n_all), known, self.prices)

    def goes_on(self, r: Walked) -> bool:
        """Whether the walk goes on from `r`: a walk of an earlier turn of this story that read
        what this one reads (its fingerprint); or, holding (`Policy.hold`), a walk of this turn
        or an earlier one whose scenes are still where they were, whatever was written since."""
        n = len(self.search.story)
        if 1 <= r.turn < n and r.fingerprint == self.fingerprint(r.turn):
            return True
        return self.hold and 1 <= r.turn <= n and bool(r.ends) and tuple(self.ends[: len(r.ends)]) == r.ends

    def fingerprint(self, turn: int) -> int:
        """Everything the walk up to `turn` reads — the limit, the slack, the frame's prices, each
        message's price, and the scenes closed by then with their prices — hashed: a walk kept
        from an earlier build is gone on from only while it is the same, so going on from it
        is walking from the first message (an edit, a summary written since, another reply
        reserve or lore: walked again)."""
        k = bisect_right(self.ends, turn)
        histories = tuple((j, self.histories[j]) for j in range(1, k + 1) if j in self.histories)
        return hash((
            self.search.limit, self.slack, self.fixed, self.opening, self.head_role, self.search.shape,
            tuple(self.prefix[: turn + 1]), tuple(self.ends[:k]), tuple(self.summaries[: k + 1]),
            tuple(self.card_costs[: k + 1]), tuple(self.lengths[: k + 1]), histories,
        ))  # fmt: skip

    # ── The last turn: the shape confirmed by the emitted count ──

    def rung(self, target: int, base: int) -> Rung:
        search, story, shape = self.search, self.search.story, self.search.shape
        chain = covered_chain(story, shape, target)
        opening = head(story, shape)
        ending = tail(story, shape, chain)
        after = search.tail_after(opening, bool(chain.scenes))
        tail_cost = sum(search.verbatim_costs(ending, after))
        recap = search.recap_cost(chain.scenes, opening) if chain.scenes else 0
        return Rung(target, chain, opening, ending, base, tail_cost, recap)

    def recap_price(self, m: int, k: int) -> int:
        """What level k of the chain of the run's first m scenes (a chain is always the run's
        start: `covered_chain`) prices beyond its rung: scene k's history and the summaries after
        it, from the walk's prices of the same parts (a level with no history is priced as is)."""
        if k and k not in self.histories:
            history = self.search.pricer.recap_part(Part("history", scene=self.run[k - 1]))
        else:
            history = self.histories[k] if k else 0
        return history + self.summaries[m] - self.summaries[k]

    def fitting(self) -> Iterator[tuple[Candidate, Assembly]]:
        """Every candidate of the last turn that fits the limit, in the seed's order, each
        confirmed by its emitted count as the search confirms the one it picks: what any
        policy restricted to the seed's candidates may choose from (`ctx replay --bound`)."""
        search, n = self.search, len(self.search.story)
        opening = head(search.story, search.shape)
        base = self.fixed + self.prefix[len(opening)]
        within = search.limit + 2 * near_miss(search.limit)  # the walk's prices are close, not exact
        for m in self.chains(n):
            levels = [k for k in range(m + 1) if (k == 0 or k in self.histories) and self.estimate((m, k), n) <= within]
            if not levels:
                continue
            rung = self.rung(self.target(m, n), base)
            if len(rung.chain.scenes) != m:
                continue
            for k in levels:
                found = search.confirm(rung, k if m else None, rung.fixed_cost + self.recap_price(m, k))
                if found is not None:
                    yield (m, k), found

    def assemble(self) -> Assembly:
        search, n = self.search, len(self.search.story)
        walked = self.walk()
        held, since, changes = walked.state, walked.since, walked.changes
        opening = head(search.story, search.shape)
        base = self.fixed + self.prefix[len(opening)]
        search.record(HeadPriced(ends(opening), base - self.fixed, self.fixed, search.limit))
        tried = [held] if held is not None else []
        at: dict[int, Rung] = {}  # each tail target's rung, built once: its candidates differ by level alone
        for candidate in dict.fromkeys([*tried, *self.ordered(n, held)]):
            m, k = candidate
            target = self.target(m, n)
            if target not in at:
                at[target] = self.rung(target, base)
            rung = at[target]
            if len(rung.chain.scenes) != m:  # not a candidate at this turn after all
                continue
            if candidate != held:
                since, changes = n, changes + (held is not None)
                held = candidate
            found = search.confirm(rung, k if m else None, rung.fixed_cost + self.recap_price(m, k))
            if found is not None:
                room = search.limit - found.tokens
                recent = self.prefix[n] - self.prefix[max(len(opening), n - 10)]
                per_turn = max(1, recent // max(1, min(10, n - len(opening)))) if n > len(opening) else 0
                note = Held(
                    since, target, k, rung.scenes, changes, self.margin(n), room,
                    room // per_turn if per_turn else 0,
                )  # fmt: skip
                chosen = ChainFound(target, rung.scenes, covered_ends(rung.chain), rung.chain.stop)
                # the walk as it stands (not the shape confirmed): going on from it walks as from the start
                return replace(search.result(found, decided=(chosen, note)), walked=walked)
        search.restart()
        return search.ladder()
