"""Summaries in the background: when a chat's settled part has no summaries, the same backend
is asked for them, one request at a time, through the gate (`gate.py`): in the player's pauses,
stopped by a live turn and asked again in the next pause, so the turn goes first and waits for
nothing of ctx's, and a scene is written whole or not at all. When a pass's requests come to
nothing more often than they give a summary that is kept (stopped by turns: the model takes
longer than the player's pauses; or turned down: it cannot summarise), the rest of the pass's
scenes are written as ctx's extracts at once, so every scene has its record while the player
plays, and the chat's next scenes ask the model again.

The planning and the commits are `ctx summarize`'s own (`summarize.plan_for`, `summarize.run`):
resumable (each finished scene is written to the chat's sidecar before the next request) and
edit-aware (a stale scene is redone, a fresh one kept)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..backend import Backend, BackendError
from ..config import RecallSettings, Settings, SummarizeSettings
from ..errors import OtakuError
from ..story.model import Story
from ..story.sidecar import Record
from ..summarize import Plan, Progress, Prompts, plan_for, prompts_of, run
from ..summarize.commits import Commits
from ..tokens import TokenCounter
from .gate import Gate, GatedBackend, Stopped
from .recalling import write_vectors_of
from .session import Session
from .store import Store

log = logging.getLogger("otaku_ctx.serve")


#: a chat's `summaries_failed` while every summary written for it is ctx's extract
ALL_TURNED_DOWN = "the model's summaries were all turned down: extracts stand in"
#: a chat's `summaries_failed` after a pass whose requests the player's turns kept stopping
TOO_SLOW = "the model's summary requests take longer than the player's pauses: extracts stand in"
#: a chat's `summaries_failed` after a pass given up as its replies were mostly turned down
MOSTLY_TURNED_DOWN = "the model's summaries were mostly turned down: extracts stand in"


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
        self.recall = RecallSettings()  # recall by meaning's: its vectors are written after the summaries
        self.queue: list[Session] = []  # the sessions that want summaries; the newest wish is served first
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="ctx-serve-summaries", daemon=True)

    def use(self, backend: Backend, settings: Settings) -> None:
        """Ask `backend` (the server serve forwards to, whose window is the summaries'), with
        `settings` as serve's first chat request made them."""
        with self._lock:
            self.settings = replace(settings.summarize, url=backend.url, model=backend.model, jobs=1)
            self.backend = GatedBackend(backend, self.gate)
            self.recall = settings.recall

    def start(self) -> None:
        self._thread.start()

    def stop(self, seconds: float) -> None:
        """No further summary request, and the one on the backend stopped (its finished scenes
        are on disk; its scene is asked again next time); the thread joined within `seconds`."""
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
                if self.recall.on:
                    records = self.store.records_of(session, work.story)[0]
                    summaries = [r.summary for r in records]
                    write_vectors_of(session, work.story, summaries, self.recall, self.store, self.gate)
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
        if not chosen.requests:  # nothing to do: what stands of the model's summaries is said still
            standing = session.summaries.why if session.summaries.why == TOO_SLOW else ""
            session.summaries.end(
                complete_at=len(story), why=ALL_TURNED_DOWN if session.summaries.none_kept else standing
            )
            return
        session.summaries.end(why="")
        progress = Progress()
        session.summaries.planned(chosen, progress)
        self.backend.fresh(progress)
        gave_up = self.backend.gave_up
        log.info("chat %s: writing summaries: %d scenes, %d requests", key, len(chosen.spans), len(chosen.requests))
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # the lock ctx summarize takes too, saying who holds it; merged into its own file
            with Commits(path, own, writer="ctx serve") as commits:
                report = run(chosen, self.backend, prompts, commits.commit, progress)
        except BackendError as error:
            raise OtakuError(str(error)) from None
        missing = f", {len(report.missing)} that no reply would do for" if report.missing else ""
        log.info(
            "chat %s: summaries written: %d scenes, %d histories, %d scenes in all%s",
            key, report.summaries, report.histories, report.scenes, missing,
        )  # fmt: skip
        why = f"no reply of the model would do for {len(report.missing)} scenes" if report.missing else None
        by_model = report.summaries + report.histories - report.extracts
        not_asked = self.backend.gave_up - gave_up
        too_slow = not_asked if self.backend.too_slow else 0
        if too_slow:
            log.warning(
                "chat %s: %d scenes and histories written as ctx's extracts: %d summary requests were stopped by"
                " the player's turns and %d ended (the model takes longer to summarise a scene than the pauses"
                " between turns). The chat's next scenes ask it again; `ctx summarize --redo` replaces the"
                " extracts while the chat rests, or point [summarize] url and model at a faster server",
                key, too_slow, self.backend.stopped, self.backend.ended,
            )  # fmt: skip
            why = why or TOO_SLOW
        elif not_asked and by_model:  # some kept: all turned down is said below, once a chat
            log.warning(
                "chat %s: %d scenes and histories written as ctx's extracts, not asked of the model: %d of its"
                " %d replies were turned down (the last: %s). The chat's next scenes ask it again; a larger"
                " model summarizes, or point [summarize] url and model at another server",
                key, not_asked, report.turned_down, self.backend.ended, progress.why_turned_down or "none usable",
            )  # fmt: skip
            why = why or MOSTLY_TURNED_DOWN
        if session.summaries.tally(by_model, report.extracts, report.turned_down, too_slow):
            reason = progress.why_turned_down
            log.warning(
                "chat %s: the model's summaries were all turned down (%d replies; the last: %s): ctx writes"
                " extracts of each scene's own lines instead. A larger model summarizes; or point [summarize]"
                " url and model at another server",
                key, report.turned_down, reason or "none usable",
            )  # fmt: skip
        if session.summaries.none_kept:
            why = why or ALL_TURNED_DOWN
        session.summaries.end(complete_at=len(story), why=why)
