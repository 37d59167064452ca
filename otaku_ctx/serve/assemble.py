"""The one call from a chat request to the prompt sent on: `assemble_chat`.

Everything else in serve goes through this function. It keeps one `build.Pipeline` per
settings, window and reply reserve, so a chat's every turn reuses the template, the lorebooks,
the counts and the parts' prices of the turns before.

A frontend's chat must be played whatever its window: where the seed's numbers (head 20, a
tail of at least 50) cannot fit the backend's window beside the chat's frame, serve goes down
its own ladder (`ladder`: the head and tail halved, up to four times) and stays on the rung
that fits, so the prompt keeps its shape from turn to turn; where even the last rung cannot
fit, it sends the frame and the newest messages that fit, as a frontend's own truncation
would. Only a chat whose frame and last message cannot fit is refused. `ctx build` keeps the
seed's numbers as given.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..build import Built, Pipeline
from ..config import Settings
from ..story.model import Story
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
    return Assembled(fitted, json.loads(fitted.prompt), len(shaped), kept, len(story.messages))


#: the share of the limit a shape serve moves to must leave free (a lower rung, the newest
#: messages from a later start), so that the turns after add to the same prefix instead of
#: moving it each turn
ROOM = 0.25


def roomy(built: Built) -> bool:
    """Whether the prompt leaves `ROOM` of its limit free."""
    return built.assembly.tokens <= (1 - ROOM) * built.assembly.limit


def truncated(
    story: Story, settings: Settings, count: TokenCounter, window: int, max_tokens: int | None, state: TurnState | None
) -> tuple[int, Built]:
    """The last resort, kept from turn to turn: the messages from where the session's last
    truncation started while they fit; else the newest that fit leaving `ROOM` of the
    limit (the newest that fit at all, when that is fewer: the newest message alone)."""
    pipeline = pipeline_for(settings, count, window, max_tokens)
    newest = len(story.messages)
    if state is not None and 0 < state.cut <= newest:
        kept = newest - state.cut + 1
        built = _newest(pipeline, story, kept)
        if built.prompt is not None:
            return kept, built
    kept, built = newest_that_fit(pipeline, story, roomy)
    if not kept:  # not even the newest message leaves the room: the most that fit at all
        kept, built = newest_that_fit(pipeline, story)
    if state is not None:
        state.truncated_at(newest - kept + 1 if built.prompt is not None else 0)
    return kept, built


def _newest(pipeline: Pipeline, story: Story, k: int) -> Built:
    """The build of the story's newest `k` messages alone (renumbered from 1, no scenes)."""
    renumbered = tuple(replace(m, number=i) for i, m in enumerate(story.messages[-k:], 1))
    return pipeline.build(replace(story, messages=renumbered, scenes=()))


def newest_that_fit(
    pipeline: Pipeline, story: Story, roomy: Callable[[Built], bool] = lambda built: True
) -> tuple[int, Built]:
    """The most of the chat's newest messages that fit beside its frame (and are `roomy`), found
    by halving: the newest k fit for every k below the most that do; (0, the build of the newest
    one alone) when not even it fits."""

    def fits(built: Built) -> bool:
        return built.prompt is not None and roomy(built)

    best = _newest(pipeline, story, 1)
    if not fits(best):
        return 0, best
    low, high = 1, len(story.messages) + 1  # the newest `low` fit; `high` do not (or are more than there are)
    while high - low > 1:
        mid = (low + high) // 2
        tried = _newest(pipeline, story, mid)
        if fits(tried):
            low, best = mid, tried
        else:
            high = mid
    return low, best
