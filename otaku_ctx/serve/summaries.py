"""Summaries in the background: when a chat's settled part has no summaries, the same backend
is asked for them, one request at a time and while no live request is waiting — or, under
steady play, one after every `SHARE` live requests that went first — so a live request never
waits behind more than the one summary request already on the server.

The planning and the commits are `ctx summarize`'s own (`summarize.plan_for`, `summarize.run`):
resumable (each finished scene is written to the chat's sidecar before the next request) and
edit-aware (a stale scene is redone, a fresh one kept)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ..backend import Backend, BackendError, Reply
from ..config import Settings
from ..errors import OtakuError
from ..story.model import Story
from ..story.sidecar import Record
from ..summarize import Plan, Progress, Prompts, plan_for, prompts_of, run
from ..summarize.commits import Commits
from ..tokens import TokenCounter
from .session import Session
from .store import Store

log = logging.getLogger("otaku_ctx.serve")


class Stopped(Exception):
    """The server is stopping: no further summary request is sent."""


#: under steady play, a summary request goes after this many live requests went before it
SHARE = 3


class Gate:
    """Live requests first. `live()` holds the gate for a frontend's request from its arrival
    to its reply's end; a summary request is sent only when no live request is held, one at a
    time (`summary()`)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.live_now = 0
        self.lived = 0  # live requests that have come, in all
        self.summary_now = False
        self.stopping = False

    @contextmanager
    def live(self) -> Iterator[None]:
        with self._changed:
            self.live_now += 1
            self.lived += 1
        try:
            yield
        finally:
            with self._changed:
                self.live_now -= 1
                self._changed.notify_all()

    @contextmanager
    def summary(self) -> Iterator[None]:
        """Wait until no live request is held, then send one summary request: a live request
        arriving meanwhile goes to the server at once and waits for this one at most."""
        with self._changed:
            since = self.lived
            self._changed.wait_for(
                lambda: (not self.summary_now and (self.live_now == 0 or self.lived - since >= SHARE)) or self.stopping
            )
            if self.stopping:
                raise Stopped()
            self.summary_now = True
        try:
            yield
        finally:
            with self._changed:
                self.summary_now = False
                self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopping = True
            self._changed.notify_all()


class GatedBackend:
    """The backend as the summarizer sees it: each chat request waits at the gate. What
    `summarize.run` uses of a `Backend` (`summarize.SummaryBackend`), and nothing else."""

    def __init__(self, backend: Backend, gate: Gate) -> None:
        self.backend, self.gate = backend, gate
        self.url, self.model = backend.url, backend.model

    def window(self) -> int | None:
        return self.backend.window()

    def chat(self, messages: Sequence[Mapping[str, str]], **asked: Any) -> Reply:
        with self.gate.summary():
            return self.backend.chat(messages, **asked)

    def loop_penalty(self) -> dict[str, float]:
        return self.backend.loop_penalty()


@dataclass
class Work:
    """A chat's summaries being written: the requests of its plan, and how many are done."""

    story: Story
    plan: Plan | None = None
    progress: Progress | None = None

    @property
    def requests_left(self) -> int:
        if self.plan is None:
            return 0
        if self.progress is None:
            return len(self.plan.requests)
        return max(0, self.progress.total - self.progress.done)


class Summarizer:
    """One thread that writes the summaries chats lack, a chat at a time, newest wish first.
    What it knows of a chat is on the chat's session (`session.Session`); `counting` runs a
    function with the counter of the chat's turns, on their thread (a counter is one thread's)."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        store: Store,
        gate: Gate,
        counting: Callable[[Session, Callable[[TokenCounter], tuple[Plan, Prompts]]], tuple[Plan, Prompts]],
    ) -> None:
        s = settings.summarize
        # the summarizer asks the same server serve forwards to; its window is the server's
        self.settings = replace(s, url=backend.url, model=backend.model, jobs=1)
        self.backend = GatedBackend(backend, gate)
        self.store, self.gate, self.counting = store, gate, counting
        self.queue: list[Session] = []  # the sessions that want summaries; the newest wish is served first
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="ctx-serve-summaries", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def want(self, session: Session, story: Story) -> None:
        """The chat as its latest request has it: summarize what it lacks, when there is time.
        A chat found complete is planned again once `min_messages` more have come (a scene's
        worth); one that failed, once it has grown."""
        with self._lock:
            if session.failed_at >= len(story):
                return
            if len(story) < session.complete_at + self.settings.min_messages:
                return
            session.wanted = story
            if session not in self.queue:
                self.queue.append(session)
            self._lock.notify_all()

    def writing(self, session: Session) -> bool:
        """Whether this chat's summaries are planned or being written now."""
        with self._lock:
            return session.working is not None or session in self.queue

    def stop(self) -> None:
        self.gate.stop()
        with self._lock:
            self._lock.notify_all()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self.queue) or self.gate.stopping)
                if self.gate.stopping:
                    return
                session = self.queue.pop()
                story, session.wanted = session.wanted, None
                if story is None:
                    continue
                work = session.working = Work(story)
            key = session.key[:12]
            try:
                self._summarize(session, work)
            except Stopped:
                return
            except (OtakuError, OSError) as error:
                if self.gate.stopping:  # the request in flight when the server stopped: resumed next time
                    return
                log.warning("chat %s: summaries not written: %s", key, error)
                with self._lock:
                    session.failed_at, session.why = len(story), str(error)
            except Exception:  # noqa: BLE001 - a bug here must not end the server
                if self.gate.stopping:  # the worker thread is gone: the server is stopping
                    return
                log.exception("chat %s: summaries not written", key)
                with self._lock:
                    session.failed_at = len(story)
                    session.why = "an error in ctx serve itself (its log has the traceback)"
            finally:
                with self._lock:
                    session.working = None

    def _plan(self, story: Story, records: list[Record], count: TokenCounter) -> tuple[Plan, Prompts]:
        prompts = prompts_of(self.settings, count)
        return plan_for(story, records, prompts, self.settings, self.backend), prompts

    def _summarize(self, session: Session, work: Work) -> None:
        story, key, path = work.story, session.key[:12], self.store.path(session.pool)
        records, own = self.store.records_of(session, story)
        chosen, prompts = self.counting(session, lambda count: self._plan(story, records, count))
        with self._lock:
            session.why = ""
        if not chosen.requests:
            with self._lock:
                session.complete_at = len(story)
            return
        progress = Progress()
        with self._lock:
            work.plan, work.progress = chosen, progress
        log.info("chat %s: writing summaries: %d scenes, %d requests", key, len(chosen.spans), len(chosen.requests))
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with Commits(path, records if own else []) as commits:  # the lock ctx summarize takes too; merged, appended
                report = run(chosen, self.backend, prompts, commits.commit, progress)
        except BackendError as error:
            raise OtakuError(str(error)) from None
        missing = f", {len(report.missing)} that no reply would do for" if report.missing else ""
        log.info(
            "chat %s: summaries written: %d scenes, %d histories, %d scenes in all%s",
            key, report.summaries, report.histories, report.scenes, missing,
        )  # fmt: skip
        with self._lock:
            session.complete_at = len(story)
            if report.missing:
                session.why = f"no reply of the model would do for {len(report.missing)} scenes"
