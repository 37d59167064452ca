"""What serve counts and assembles with, made once, and the worker threads that do it.

The first chat request works out the settings for the backend (`counted`: the model's parts, and
the server's own tokenizer where it has one and the user named none) and serve's small-window
ladder (`assemble.ladder`). ctx's own work runs beside the event loop on a worker thread (`Lane`):
one for the chats of fewer than `LONG_CHAT` messages and `LONG_CHAT_CHARACTERS` characters, one
for the longer, so that a long chat's first turn (seconds, at 100,000 messages) holds up no other
chat's. A counter is one thread's, so each lane has its own; one that asks the server falls back
for a turn the server fails to count (`serve_counter`)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..backend import Backend, NoTokenizer
from ..build import counter_for, with_model
from ..config import SERVE_DEFAULTS, ModelSettings, Settings
from ..model.server import MARGIN, ServerCounter
from ..tokens import TokenCounter, make_counter
from .assemble import ladder
from .chats import text_of

log = logging.getLogger("otaku_ctx.serve")
T = TypeVar("T")

#: a chat of this many messages or more is long: its turns run on the long chats' worker
LONG_CHAT = 5000
#: ... and one of this many characters or more, however few its messages (a pasted book): its
#: first turn's text work (its sentences, extracts and counts) takes a good part of a second
LONG_CHAT_CHARACTERS = 200_000


def characters(messages: Sequence[Any]) -> int:
    """The characters of a request's messages' text (a string content, or its text parts), up to
    `LONG_CHAT_CHARACTERS`: what tells a long chat of few messages."""
    total = 0
    for at, message in enumerate(messages):  # checked already (`chats.check_messages`): text only
        total += len(text_of(message.get("content"), f"messages[{at}]"))
        if total >= LONG_CHAT_CHARACTERS:
            break
    return total


def serving(settings: Settings) -> Settings:
    """serve's own defaults (`config.SERVE_DEFAULTS`) where the user set nothing: the stable cache
    policy (a server's chat is what it is for), recall on (seed 000: an infill engine is always
    active; docs/lore.md) and messages labelled only with the names the frontend sent
    (`[prompt] speakers = "as_given"`). A value the user set, in the config or on
    the command line, is theirs: `cache = "exact"` is honoured, and said once."""
    unset = {k: v for k, v in SERVE_DEFAULTS.items() if settings.sources.get(k, "default") == "default"}
    context, prompt = settings.context, settings.prompt
    if "context.cache" in unset:
        context = replace(context, cache=unset["context.cache"])
    elif context.cache == "exact":
        log.info(
            'cache = "exact" (from %s): each turn takes the first shape that fits, which moves the prompt\'s'
            " start as the chat grows; unset it for serve's \"stable\", which keeps the backend's cache",
            settings.sources["context.cache"],
        )
    if "context.recall" in unset:
        context = replace(context, recall=unset["context.recall"])
    if "prompt.speakers" in unset:
        prompt = replace(prompt, speakers=unset["prompt.speakers"])
    return replace(settings, context=context, prompt=prompt)


def user_set(settings: Settings, key: str) -> bool:
    """Whether the user chose `[model] key` themselves: given on the command line, or set to
    other than its default (`config init` writes every default, which must not count as a choice)."""
    return f"model.{key}" in settings.given or getattr(settings.model, key) != getattr(ModelSettings(), key)


def counted(settings: Settings, backend: Backend) -> tuple[Settings, TokenCounter]:
    """The settings for this backend and their counter: the user's own tokenizer when they chose
    one (`[model] use`, or a tokenizer set); else the server's, where it counts; else the
    configured one, said in the log."""
    model = settings.model
    chose = bool(model.use) or user_set(settings, "tokenizer")
    server = backend.server()  # a server that is down says so here, at once
    if not chose:
        if server.counts:
            served = replace(settings, model=replace(model, tokenizer="server", server=model.server or backend.url))
            try:
                return served, serve_counter(served)
            except NoTokenizer as why:
                log.warning("counting with %s: %s", model.tokenizer, why)
        else:
            log.warning(
                "counting with %s: the backend has no tokenize endpoint (for exact counts set [model] use)",
                model.tokenizer,
            )
    settings = with_model(settings)
    return settings, serve_counter(settings)


def serve_counter(settings: Settings) -> TokenCounter:
    """A fresh counter for `settings` (`build.counter_for`); one that asks the server falls back
    to cl100k_base with a margin for a turn whose count the server fails (`ServerCounter.fall_back`),
    said in the log once for each reason, so a tokenize endpoint that answers 500, junk or
    nothing in time costs one call a turn and answers the turn."""
    count = counter_for(settings)
    if isinstance(count, ServerCounter):
        said: set[str] = set()

        def told(why: str) -> None:
            if why not in said:
                said.add(why)
                log.warning(
                    "counting with cl100k_base and a margin of %d %% this turn: the server did not count (%s);"
                    " it is asked again each turn", round(MARGIN * 100), why,
                )  # fmt: skip

        count.fall_back(make_counter("cl100k_base"), told)
    return count


@dataclass(frozen=True)
class Setup:
    """A lane's settings, its counter, and the settings of each rung of the small-window ladder."""

    settings: Settings
    count: TokenCounter
    rungs: tuple[Settings, ...]


class Lane:
    """A worker thread and its setup (its own counter: a counter, and so a pipeline, is one
    thread's). Lock: `Lanes._lock` guards `setup`."""

    def __init__(self, name: str) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.setup: Setup | None = None

    def set_up(self, setup: Setup) -> None:
        self.setup = setup

    async def run(self, work: Callable[[], T]) -> T:
        """`work` on this lane's thread, from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    def wait(self, work: Callable[[], T]) -> T:
        """`work` on this lane's thread, from another thread (the summarizer's)."""
        return self.pool.submit(work).result()


class Lanes:
    """The two lanes and the backend they count for. The first request's "model" names the model
    the backend is asked about (and the summaries asked of) when `--model` names none; `made` is
    told of the backend and settings once they are known (the summarizer's `use`)."""

    def __init__(
        self, settings: Settings, backend_for: Callable[[str], Backend], made: Callable[[Backend, Settings], None]
    ) -> None:
        s = settings.serve
        self.settings, self.backend_for, self.made = settings, backend_for, made
        self.backend = backend_for(s.model or settings.summarize.model or "")
        self.lanes = (Lane("ctx-serve"), Lane("ctx-serve-long"))  # the chats of fewer than LONG_CHAT, the longer
        self._lock = threading.Lock()

    def lane(self, messages: Sequence[Any]) -> Lane:
        """The lane of a chat whose request holds these `messages` (as decoded)."""
        return self.lanes[len(messages) >= LONG_CHAT or characters(messages) >= LONG_CHAT_CHARACTERS]

    def setup(self, lane: Lane, model_name: str = "") -> Setup:
        """`lane`'s setup, made once: the first lane's first, and the other's a copy with a counter
        of its own. On the lane's own thread."""
        with self._lock:
            first = self.lanes[0]
            if first.setup is None:
                if not self.backend.model and model_name:
                    self.backend = self.backend_for(model_name)
                settings, count = counted(serving(self.settings), self.backend)
                first.set_up(Setup(settings, count, ladder(settings)))
                self.made(self.backend, settings)
            assert first.setup is not None
            if lane.setup is None:
                lane.set_up(replace(first.setup, count=serve_counter(first.setup.settings)))
            assert lane.setup is not None
            return lane.setup

    def window(self, settings: Settings) -> int:
        """`[model] window` when the user set it, and then the backend is asked nothing; else the
        backend's window (llama.cpp's /props, vLLM's /v1/models, Ollama's /api/show; asked once
        and remembered, its having none too: `Backend.window`), else `[model] window` as
        `settings` has it (the model file's, with `[model] use`). Asked each turn."""
        if user_set(self.settings, "window"):
            return self.settings.model.window
        return self.backend.window() or settings.model.window

    def counting(self, messages: Sequence[Any], work: Callable[[TokenCounter], T]) -> T:
        """`work` with the counter of a chat whose request held these `messages`, on its lane's
        thread, from another (the summarizer's)."""
        lane = self.lane(messages)
        return lane.wait(lambda: work(self.setup(lane).count))

    def close(self) -> None:
        for lane in self.lanes:
            lane.pool.shutdown(wait=False, cancel_futures=True)
