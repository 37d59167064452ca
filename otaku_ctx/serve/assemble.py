"""The one call from a chat request to the prompt sent on: `assemble_chat`.

Everything else in serve goes through this function. It keeps one `build.Pipeline` per
settings, window and reply reserve, so a chat's every turn reuses the template, the lorebooks,
the counts and the parts' prices of the turns before.

A frontend's chat must be played whatever its window: where the seed's numbers (head 20, a
tail of at least 50) cannot fit the backend's window beside the chat's frame, serve goes down
its own ladder (`ladder`: the head and tail halved, up to four times) and stays on the rung
that fits, so the prompt keeps its shape from turn to turn. Where even the last rung cannot
fit (the messages not yet settled into a scene are more than the window holds), it sends the
frame, the story so far (the history of the last scene before the messages kept, trimmed to
`SOFAR_SHARE` of the limit and half the room the frame leaves) and the newest messages that
fit; only when not even the story so far and the newest message fit, the frame and the newest
messages alone, as a frontend's own truncation would. Only a chat whose frame and last message
cannot fit is refused. `ctx build` keeps the seed's numbers as given.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..assemble import Part
from ..assemble.recall import recalled
from ..build import Built, Pipeline
from ..config import Settings
from ..story.model import Scene, Story
from ..tokens import TokenCounter
from .session import TurnState

#: serve's small-window ladder: the head and tail divided by each in turn
RUNGS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Assembled:
    """What a turn sends: the chat messages (None on a refusal), how they were chosen, and how
    serve shaped them: the ladder's `rung` (0: the settings as given), or `truncated`, the
    newest messages kept when no rung fits; and `held`, the messages of the chat the request
    held (what its turn is counted by, however few were sent)."""

    built: Built
    messages: list[dict[str, Any]] | None
    rung: int = 0
    truncated: int | None = None
    held: int = 0
    sofar: bool = False  # truncated, with the story so far before the newest messages

    @property
    def sent(self) -> int:
        """The chat's messages the prompt holds verbatim."""
        a = self.built.assembly
        return len(a.head) + len(a.tail)

    @property
    def case(self) -> int:
        return self.built.assembly.case

    @property
    def tokens(self) -> int:
        return self.built.assembly.tokens


def turn_settings(settings: Settings, window: int, max_tokens: int | None) -> Settings:
    """The settings of one request: the backend's real window, and the request's `max_tokens`
    as the reply reserve (else the configured reserve)."""
    settings = replace(settings, model=replace(settings.model, window=window))
    if max_tokens is not None:
        settings = replace(settings, context=replace(settings.context, reply_reserve=max_tokens))
    return settings


def ladder(settings: Settings) -> tuple[Settings, ...]:
    """The settings of each rung: as given, then the head, the tail target, its floor and step
    divided by 2, 4, 8 and 16 (a head of one message at least: the greeting; a floor of two);
    last, the settings of the last resort (`truncating`). Made once, so each rung's pipeline
    is made once."""
    c = settings.context
    rungs = [settings]
    for by in RUNGS[1:]:
        floor = max(2, c.tail_floor // by)
        smaller = replace(
            c,
            head_messages=min(c.head_messages, max(1, c.head_messages // by)),
            min_tail_messages=max(floor, c.min_tail_messages // by),
            tail_floor=floor,
            tail_step=max(1, c.tail_step // by),
        )
        rungs.append(replace(settings, context=smaller))
    return (*rungs, truncating(settings))


def truncating(settings: Settings) -> Settings:
    """The settings of the last resort: no head, every message of the (cut) story verbatim."""
    c = replace(settings.context, head_messages=0, min_tail_messages=1, tail_floor=1, tail_step=1)
    return replace(settings, context=c)


# The pipelines of the turns so far, by the settings, counter, window and reply reserve they were
# made for (the settings and counter kept, so an id is never another's): a chat's next turn is
# built by the pipeline of the turn before, with its template, lorebooks and prices.
_PIPELINES: OrderedDict[tuple[int, int, int, int | None], tuple[Settings, TokenCounter, Pipeline]] = OrderedDict()
MOST_PIPELINES = 16
_LOCK = threading.Lock()


def pipeline_for(settings: Settings, count: TokenCounter, window: int, max_tokens: int | None) -> Pipeline:
    """The pipeline for one request's window and reply reserve: made once, then reused."""
    key = (id(settings), id(count), window, max_tokens)
    with _LOCK:
        found = _PIPELINES.get(key)
        if found is not None and found[0] is settings and found[1] is count:
            _PIPELINES.move_to_end(key)
            return found[2]
        shared = next((p.prices for s, c, p in _PIPELINES.values() if s is settings and c is count), None)
        made = Pipeline(
            turn_settings(settings, window, max_tokens), emit="messages", count=count, prices=shared, hold=True
        )
        _PIPELINES[key] = (settings, count, made)
        while len(_PIPELINES) > MOST_PIPELINES:
            _PIPELINES.popitem(last=False)
        return made


def forget_pipelines(count: TokenCounter) -> None:
    """Drop the pipelines made for `count` (a dry run's counter: `turn.counted_ahead`), so they
    take no place of the turns' own."""
    with _LOCK:
        for key in [k for k, (_, c, _) in _PIPELINES.items() if c is count]:
            del _PIPELINES[key]


def assemble_chat(
    story: Story,
    rungs: tuple[Settings, ...],
    count: TokenCounter,
    *,
    window: int,
    max_tokens: int | None,
    state: TurnState | None = None,
    played: bool = False,
) -> Assembled:
    """The chat assembled for the backend's `window` less the reply (cases 1-6), as chat
    messages, on the session's rung of `rungs` (`ladder`) while it fits, its walk going on from
    turn to turn; when it does not, on the first rung below it that fits and leaves `ROOM` of
    the limit free, so the turns after keep its prefix (a rung that barely fits would be left
    again at the next turn, each move rewriting all after the frame; a chat's first turn, with
    no prefix to keep, takes the first that fits). With no such rung, the
    newest messages that fit (`truncated`), kept as the session's shape: a rung above is taken
    again only when it fits with that room. With none, the refusal of the newest message
    alone (case 6)."""
    *shaped, last_resort = rungs
    at = state.rung if state is not None else 0  # len(shaped): the last resort
    for rung in range(min(at, len(shaped) - 1), len(shaped)):
        resume = state.walk if state is not None and rung == at else None
        built = pipeline_for(rungs[rung], count, window, max_tokens).build(story, resume)
        if built.prompt is None or (played and rung != at and not roomy(built)):
            continue  # a move, once the chat was played on its rung: only to a shape with room
        if state is not None:
            state.shaped(rung, built.assembly.walked, cut=0)
        return Assembled(built, json.loads(built.prompt), rung, held=len(story.messages))
    kept, fitted = truncated(story, last_resort, count, window, max_tokens, state)
    if fitted.prompt is None:
        return Assembled(fitted, None, len(shaped) - 1, held=len(story.messages))
    if state is not None:
        state.shaped(len(shaped), None)
    told = fitted.assembly.history is not None
    return Assembled(fitted, json.loads(fitted.prompt), len(shaped), kept, len(story.messages), told)


#: the share of the limit a shape serve moves to must leave free (a lower rung, the newest
#: messages from a later start), so that the turns after add to the same prefix instead of
#: moving it each turn
ROOM = 0.25


def roomy(built: Built) -> bool:
    """Whether the prompt leaves `ROOM` of its limit free, what it recalls aside (that gives way
    to the messages as they come)."""
    a = built.assembly
    return a.tokens - a.costs.get("recall", 0) <= (1 - ROOM) * a.limit


def truncated(
    story: Story, settings: Settings, count: TokenCounter, window: int, max_tokens: int | None, state: TurnState | None
) -> tuple[int, Built]:
    """The last resort, kept from turn to turn: the messages from where the session's last
    truncation started while they fit (with the story so far, when the cut had it); else the
    newest that fit with the story so far before them, leaving `ROOM` of the limit; else the
    newest that fit beside it at all; else the same without the story so far (the newest
    message alone, when even that leaves no room)."""
    pipeline = pipeline_for(settings, count, window, max_tokens)
    newest = len(story.messages)
    if state is not None and 0 < state.cut <= newest:
        kept = newest - state.cut + 1
        built = _newest(pipeline, story, kept, told=True)
        if built.prompt is not None:
            return kept, built
    for told, room in ((True, roomy), (True, _any), (False, roomy), (False, _any)):
        kept, built = newest_that_fit(pipeline, story, room, told=told)
        if kept:
            break
    if state is not None:
        state.truncated_at(newest - kept + 1 if built.prompt is not None else 0)
    return kept, built


def _any(built: Built) -> bool:
    return True


#: the share of the limit the story so far may take on the last rung, trimmed to it when longer
SOFAR_SHARE = 0.25


def story_so_far(story: Story, before: int) -> Scene | None:
    """The story so far up to message `before`: the last scene ending before it, with its history
    (its summary, when it has none); None when no scene does."""
    told = [s for s in story.scenes if s.end < before and (s.history.strip() or s.summary.strip())]
    if not told:
        return None
    scene = told[-1]
    return replace(scene, history=scene.history if scene.history.strip() else scene.summary)


def trimmed(scene: Scene, tokens: int, count: TokenCounter) -> Scene:
    """The story so far within `tokens`: its first third and its last two thirds of the words
    that fit, an ellipsis between (the story's beginning and what led to now both stand)."""
    words = scene.history.split()
    size = count(scene.history)
    while size > tokens and words:
        keep = min(int(len(words) * tokens / size * 0.95), len(words) - 2)  # fewer each time, the "…" too
        first = keep // 3
        words = [*words[:first], "…", *words[len(words) - (keep - first) :]] if keep > 1 else []
        size = count(" ".join(words))
    return replace(scene, history=" ".join(words))


def _newest(pipeline: Pipeline, story: Story, k: int, *, told: bool = False) -> Built:
    """The build of the story's newest `k` messages alone (renumbered from 1, no scenes); `told`:
    after the story so far up to them (`story_so_far`, trimmed to `SOFAR_SHARE` of the limit and
    half the room the frame leaves), when there is one, and with what the newest messages recall
    of the story before them (`assemble.recall`, in the room left, when recall is on) — an
    unfitting build (no prompt) when the story so far and they do not fit."""
    renumbered = tuple(replace(m, number=i) for i, m in enumerate(story.messages[-k:], 1))
    short = replace(story, messages=renumbered, scenes=())
    sofar = story_so_far(story, len(story.messages) - k + 1) if told else None
    if sofar is None:
        return pipeline.build(short)
    fitted = pipeline.fit(pipeline.prepare(short))
    a = fitted.assembly
    if a.refusal is not None:
        return pipeline.render(fitted)
    room = a.limit - fitted.pricer.fixed()  # beside the frame: half of it at most, for the newest messages
    sofar = trimmed(sofar, min(int(a.limit * SOFAR_SHARE), room // 2), pipeline.count)
    if not sofar.history:
        return pipeline.render(fitted)
    # the chat's own numbers from here on: what is recalled is named by them ("message 1,234")
    history = (Part("history", scene=sofar),)
    plan = replace(a, messages=len(story.messages), recap=history, tail=story.messages[-k:], level=1, case=4)
    tokens = fitted.pricer.exact(plan)
    if tokens > a.limit:
        return Built(plan, fitted.budget, pipeline.count.name, None)
    plan = replace(plan, tokens=tokens, costs={**a.costs, "recap": tokens - a.tokens})
    if pipeline.recall.share:
        budget = min(pipeline.recall.reserve(a.limit), a.limit - tokens)
        at = len(story.messages)
        plan = recalled(story, plan, fitted.pricer, pipeline.recall, limit=a.limit, at=at, budget=budget)
    return pipeline.render(replace(fitted, assembly=plan))


def newest_that_fit(
    pipeline: Pipeline, story: Story, roomy: Callable[[Built], bool] = _any, *, told: bool = False
) -> tuple[int, Built]:
    """The most of the chat's newest messages that fit beside its frame (after the story so far,
    when `told`) and are `roomy`, found by halving: the newest k fit for every k below the most
    that do; (0, the build of the newest one alone) when not even it fits."""

    def fits(built: Built) -> bool:
        return built.prompt is not None and roomy(built)

    best = _newest(pipeline, story, 1, told=told)
    if not fits(best):
        return 0, best
    low, high = 1, len(story.messages) + 1  # the newest `low` fit; `high` do not (or are more than there are)
    while high - low > 1:
        mid = (low + high) // 2
        tried = _newest(pipeline, story, mid, told=told)
        if fits(tried):
            low, best = mid, tried
        else:
            high = mid
    return low, best
