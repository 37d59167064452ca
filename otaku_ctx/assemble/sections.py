"""The window's sections, which every case is made of: head, covered chain, tail, cards, the
recap at a level, and the tail targets (docs/architecture.md's arithmetic)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..story.model import Message, Scene, Story
from .parts import Part, SceneRef, Shape
from .steps import ChainStop

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


def ends(messages: Sequence[Message]) -> tuple[int, ...]:
    return (messages[0].number, messages[-1].number) if messages else ()


def refs(scenes: Iterable[Scene]) -> tuple[SceneRef, ...]:
    return tuple(s.ref for s in scenes)


def near_miss(limit: int) -> int:
    """How far over the limit a candidate priced by its parts is still rendered and counted."""
    return max(16, limit // 200)


def capped_sum(costs: Iterable[int], cap: int) -> tuple[int, bool]:
    """Sum costs until the total passes `cap` (then the rest cannot matter): (total, complete)."""
    total = 0
    for cost in costs:
        total += cost
        if total > cap:
            return total, False
    return total, True


def covered_ends(chain: Chain) -> tuple[int, ...]:
    return (chain.scenes[0].start, chain.scenes[-1].end) if chain.scenes else ()
