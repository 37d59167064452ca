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
from ..config import Settings, SummarizeSettings
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
    """A chat's summaries being written: the requests of its plan, and how many are done. Lock:
    its session's `SummaryState.lock` (the summarizer writes it, `/ctx/stats` reads it)."""

    story: Story
    plan: Plan | None = None
    progress: Progress | None = None

    def begun(self, plan: Plan, progress: Progress) -> None:
        self.plan, self.progress = plan, progress

    @property
    def requests_left(self) -> int:
        if self.plan is None:
            return 0
        if self.progress is None:
            return len(self.plan.requests)
        return max(0, self.progress.total - self.progress.done)


class Summarizer:
    """One thread that writes the summaries chats lack, a chat at a time, newest wish first.
    Where a chat's summaries stand is on its session (`session.SummaryState`); `counting` runs a
    function with the counter of the chat's turns, on their thread (a counter is one thread's).
    Its thread starts with the server and is joined when it stops (`http.Service`); it has
    nothing to do until `use` gives it the backend and settings of serve's first chat request.
    Lock: `_lock`, guarding the queue."""

    def __init__(
        self,
        store: Store,
        gate: Gate,
        counting: Callable[[Session, Callable[[TokenCounter], tuple[Plan, Prompts]]], tuple[Plan, Prompts]],
    ) -> None:
        self.store, self.gate, self.counting = store, gate, counting
        self.backend: GatedBackend | None = None
        self.settings: SummarizeSettings | None = None
        self.queue: list[Session] = []  # the sessions that want summaries; the newest wish is served first
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="ctx-serve-summaries", daemon=True)

    def use(self, backend: Backend, settings: Settings) -> None:
        """Ask `backend` (the server serve forwards to, whose window is the summaries'), with
        `settings` as serve's first chat request made them."""
        with self._lock:
            self.settings = replace(settings.summarize, url=backend.url, model=backend.model, jobs=1)
            self.backend = GatedBackend(backend, self.gate)

    def start(self) -> None:
        self._thread.start()

    def stop(self, seconds: float) -> None:
        """No further summary request; the thread joined within `seconds` (a request already on
        the backend is left to its own timeout: its finished scenes are on disk)."""
        self.gate.stop()
        with self._lock:
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(seconds)

    def want(self, session: Session, story: Story) -> None:
        """The chat as its latest request has it: summarize what it lacks, when there is time.
        A chat found complete is planned again once `min_messages` more have come (a scene's
        worth); one that failed, once it has grown."""
        with self._lock:
            if self.settings is None or not session.summaries.wish(story, self.settings.min_messages):
                return
            if session not in self.queue:
                self.queue.append(session)
            self._lock.notify_all()

    def writing(self, session: Session) -> bool:
        """Whether this chat's summaries are planned or being written now."""
        with self._lock:
            return session in self.queue or session.summaries.busy

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self.queue) or self.gate.stopping)
                if self.gate.stopping:
                    return
                session = self.queue.pop()
            work = session.summaries.begin(Work)
            if work is None:
                continue
            try:
                self._summarize(session, work)
            except Stopped:
                return
            except Exception as error:  # noqa: BLE001 - a bug here must not end the server
                if self.gate.stopping:  # the request in flight when the server stopped: resumed next time
                    return
                self._failed(session, work.story, error)
            finally:
                session.summaries.done()

    @staticmethod
    def _failed(session: Session, story: Story, error: Exception) -> None:
        key = session.key[:12]
        if isinstance(error, OtakuError | OSError):
            log.warning("chat %s: summaries not written: %s", key, error)
            why = str(error)
        else:
            log.exception("chat %s: summaries not written", key)
            why = "an error in ctx serve itself (its log has the traceback)"
        session.summaries.end(failed_at=len(story), why=why)

    def _plan(self, story: Story, records: list[Record], count: TokenCounter) -> tuple[Plan, Prompts]:
        assert self.settings is not None and self.backend is not None
        prompts = prompts_of(self.settings, count)
        return plan_for(story, records, prompts, self.settings, self.backend), prompts

    def _summarize(self, session: Session, work: Work) -> None:
        assert self.backend is not None
        story, key, path = work.story, session.key[:12], self.store.path(session.pool)
        records, own = self.store.records_of(session, story)
        chosen, prompts = self.counting(session, lambda count: self._plan(story, records, count))
        session.summaries.end(why="")
        if not chosen.requests:
            session.summaries.end(complete_at=len(story))
            return
        session.summaries.planned(chosen, Progress())
        log.info("chat %s: writing summaries: %d scenes, %d requests", key, len(chosen.spans), len(chosen.requests))
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with Commits(path, own) as commits:  # the lock ctx summarize takes too; merged into its own file
                report = run(chosen, self.backend, prompts, commits.commit, work.progress)
        except BackendError as error:
            raise OtakuError(str(error)) from None
        missing = f", {len(report.missing)} that no reply would do for" if report.missing else ""
        log.info(
            "chat %s: summaries written: %d scenes, %d histories, %d scenes in all%s",
            key, report.summaries, report.histories, report.scenes, missing,
        )  # fmt: skip
        why = f"no reply of the model would do for {len(report.missing)} scenes" if report.missing else None
        by_model = report.summaries + report.histories - report.extracts
        if session.summaries.tally(by_model, report.extracts, report.turned_down):
            reason = work.progress.why_turned_down if work.progress is not None else ""
            log.warning(
                "chat %s: the model's summaries were all turned down (%d replies; the last: %s): ctx writes"
                " extracts of each scene's own lines instead. A larger model summarizes; or point [summarize]"
                " url and model at another server",
                key, report.turned_down, reason or "none usable",
            )  # fmt: skip
        if session.summaries.none_kept:
            why = why or "the model's summaries were all turned down: extracts stand in"
        session.summaries.end(complete_at=len(story), why=why)
