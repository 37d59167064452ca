"""Live requests first: the gate between a frontend's turns and the summary requests serve
sends to the same backend. A summary request starts only once no live request has been in
flight for `PAUSE` seconds (the player reading the reply and typing the next message); a live
request that arrives while one is on the backend stops it at once (its connection closed,
which stops the server generating). `GatedBackend` is the backend as the summarizer sees it:
a stopped request is asked again in the next pause, and a pass whose requests come to nothing
more than they are kept is given up (`GaveUp`), its scenes left to ctx's extracts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ..backend import Backend, Cancel, Cancelled, Reply
from ..summarize import Progress, SummarizeError

log = logging.getLogger("otaku_ctx.serve")


class Stopped(Exception):
    """The server is stopping: no further summary request is sent."""


#: seconds with no live request in flight before a summary request may start: a player's pause
PAUSE = 1.0
#: summary requests of a pass that came to nothing (stopped, or turned down), more than were kept,
#: before the pass gives up on the model
STOPS = 3


class GaveUp(SummarizeError):
    """A pass's summary requests came to nothing `STOPS` times and more often than they gave a
    kept reply (`GatedBackend.fruitless`): the scene is written as ctx's extract
    (`summarize.run`'s fallback), with no request."""


class Gate:
    """Live requests first. `live()` holds the gate for a frontend's request from its arrival
    to its reply's end, and stops the summary request on the backend, if one is; `summary()`
    holds it for one summary request, sent only in a pause (no live request held for `pause`
    seconds), one at a time, and stoppable (`Cancel`). `preempted` counts the summary requests
    a live request stopped. Lock: `_changed`."""

    def __init__(self, pause: float | None = None) -> None:
        self._changed = threading.Condition()
        self.pause = PAUSE if pause is None else pause
        self.live_now = 0
        self.quiet_since = time.monotonic()  # when the last live request ended
        self.cancel: Cancel | None = None  # the summary request on the backend, while one is
        self.preempted = 0
        self.stopping = False

    @contextmanager
    def live(self) -> Iterator[None]:
        with self._changed:
            self.live_now += 1
            if self.cancel is not None and not self.cancel.stopped:
                self.cancel.stop()
                self.preempted += 1
        try:
            yield
        finally:
            with self._changed:
                self.live_now -= 1
                if not self.live_now:
                    self.quiet_since = time.monotonic()
                self._changed.notify_all()

    @contextmanager
    def summary(self) -> Iterator[Cancel]:
        """Wait for a pause, then send one summary request, stopped (`Cancel`) when a live
        request comes."""
        with self._changed:
            while True:
                if self.stopping:
                    raise Stopped()
                if self.cancel is None and not self.live_now:
                    left = self.quiet_since + self.pause - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                else:
                    self._changed.wait()
            cancel = self.cancel = Cancel()
        try:
            yield cancel
        finally:
            with self._changed:
                self.cancel = None
                self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopping = True
            if self.cancel is not None:
                self.cancel.stop()
            self._changed.notify_all()


class GatedBackend:
    """The backend as the summarizer sees it: each chat request waits at the gate. What
    `summarize.run` uses of a `Backend` (`summarize.SummaryBackend`), and nothing else.
    `stopped` counts this pass's requests that live ones stopped, `ended` those whose reply came
    whole (a pass starts both at 0: `fresh`), and the pass's `Progress` how many of those a
    check turned down; `gave_up`, the requests answered `GaveUp`."""

    def __init__(self, backend: Backend, gate: Gate) -> None:
        self.backend, self.gate = backend, gate
        self.url, self.model = backend.url, backend.model
        self.stopped = self.ended = 0
        self.progress = Progress()
        self.gave_up = 0

    def fresh(self, progress: Progress) -> None:
        """A new pass, counting its turned-down replies in `progress`: the model is given its
        chance again."""
        self.stopped = self.ended = 0
        self.progress = progress

    @property
    def turned_down(self) -> int:
        return self.progress.turned_down

    @property
    def fruitless(self) -> bool:
        """Whether this pass's requests come to nothing more often than they give a reply that
        is kept: `STOPS` at least, stopped by a turn or turned down, and more than kept. A reply
        kept now and then does not let a model that mostly cannot finish in a pause, or mostly
        writes what a check turns down, go on being asked (with "three stops in a row", stopped,
        ended, stopped, ended… never gave up, and a model whose every reply is turned down was
        asked three times a scene)."""
        failed = self.stopped + self.turned_down
        return failed >= STOPS and failed > self.ended - self.turned_down

    @property
    def too_slow(self) -> bool:
        """Whether the pass gave up more for the player's turns than for turned-down replies."""
        return self.stopped >= self.turned_down

    def window(self) -> int | None:
        return self.backend.window()

    def chat(self, messages: Sequence[Mapping[str, str]], **asked: Any) -> Reply:
        """The reply, asked in a pause; asked again in the next one when a live request stopped
        it (so a scene's reply is whole, or not taken); `GaveUp`, with no request, once the
        pass's requests come to nothing more than they are kept (`fruitless`)."""
        while not self.fruitless:
            with self.gate.summary() as cancel:
                try:
                    reply = self.backend.chat(messages, cancel=cancel, **asked)
                except Cancelled:
                    if self.gate.stopping:
                        raise Stopped() from None
                    self.stopped += 1
                    log.debug("a summary request stopped for a live one: asked again in the next pause")
                    continue
            self.ended += 1
            return reply
        self.gave_up += 1
        raise GaveUp(
            f"of this pass's summary requests {self.stopped} were stopped by the player's turns and"
            f" {self.turned_down} of the {self.ended} replies turned down: not asked"
        )

    def loop_penalty(self) -> dict[str, float]:
        return self.backend.loop_penalty()
