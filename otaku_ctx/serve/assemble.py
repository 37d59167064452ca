"""The one call from a chat request to the prompt sent on: `assemble_chat`.

Everything else in serve goes through this function; it keeps one `build.Pipeline` per window
and reply reserve, so a chat's every turn reuses the template, the lorebooks, the counts and
the parts' prices of the turns before."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from ..assemble import Walked
from ..build import Built, Pipeline
from ..config import Settings
from ..story.model import Story
from ..tokens import TokenCounter


@dataclass(frozen=True)
class Assembled:
    """What a turn sends: the chat messages (None on a refusal), and how they were chosen."""

    built: Built
    messages: list[dict[str, Any]] | None

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


# Each chat's stable-policy walk at its last turn, so the next turn goes on from it (the real
# history of the shapes it was sent, summaries written since or not: `Policy.hold`) instead of
# walking the chat from its first message.
_WALKS: OrderedDict[str, Walked] = OrderedDict()
MOST_CHATS = 1024


def assemble_chat(
    story: Story,
    settings: Settings,
    count: TokenCounter,
    *,
    window: int,
    max_tokens: int | None,
    chat: str | None = None,
) -> Assembled:
    """The chat assembled for the backend's `window` less the reply (cases 1-6), as chat messages;
    `chat` names it, for its walk to go on from turn to turn."""
    with _LOCK:
        resume = _WALKS.get(chat) if chat is not None else None
    built = pipeline_for(settings, count, window, max_tokens).build(story, resume)
    walked = built.assembly.walked
    if chat is not None and walked is not None:
        with _LOCK:
            _WALKS[chat] = walked
            _WALKS.move_to_end(chat)
            while len(_WALKS) > MOST_CHATS:
                _WALKS.popitem(last=False)
    messages = json.loads(built.prompt) if built.prompt is not None else None
    return Assembled(built, messages)
