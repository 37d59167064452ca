"""Recall by meaning in serve (`[recall]`, docs/lore.md): each turn's story given its meaning —
the chat's vectors file (beside its summaries) and its two queries embedded, on the turn's own
thread, `[recall] timeout` at most — and, in the player's pauses, the vectors the chat's texts
lack written through the summarizer's gate (`Summarizer`). A failure is said once a chat and
kind in the log; the keyword engine recalls meanwhile (each turn's stats say which ran)."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from ..backend import Backend, BackendError, Cancelled
from ..config import RecallSettings
from ..embed import WRITE_TIMEOUT, Held, embedder, meaning_for, texts_of, write_vectors
from ..errors import OtakuError
from ..story.model import Story
from ..story.vectors import vectors_for
from .gate import Gate, Stopped
from .session import Session
from .store import Store

log = logging.getLogger("otaku_ctx.serve")


@functools.lru_cache(maxsize=4)
def query_backend(settings: RecallSettings) -> Backend:
    """The embeddings server a turn asks, made once (what kind of server it is, asked once)."""
    return embedder(settings)


def meant(session: Session, story: Story, settings: RecallSettings, store: Store) -> Story:
    """The turn's story with its meaning, when `[recall]` names an embedding model."""
    if not settings.on:
        return story
    path = vectors_for(store.path(session.pool), settings.model)
    held = session.meaning.holding(lambda p: Held(p, settings.model), path)
    meaning = meaning_for(story, settings, held, query_backend(settings))
    if meaning.failed and session.meaning.say(meaning.failed.split(":")[0].split("(")[0].strip()):
        log.warning("chat %s: recall by keywords alone: %s", session.key[:12], meaning.failed)
    return replace(story, meaning=meaning)


def write_vectors_of(session: Session, story: Story, summaries: list[str], settings: RecallSettings, store: Store,
                     gate: Gate) -> None:  # fmt: skip
    """The vectors the chat's messages and summaries lack, written `batch` a request in the
    player's pauses (`gate`: a live turn stops the request, which is asked again in the next
    pause; what was written stays). A failure is said once a chat and kind; the next pass asks
    again."""
    path = vectors_for(store.path(session.pool), settings.model)
    texts = list(dict.fromkeys([*texts_of(story), *(s for s in summaries if s.strip())]))
    backend = embedder(settings, WRITE_TIMEOUT)
    while True:
        try:
            written = write_vectors(texts, path, backend, settings.batch, asking=gate.summary)
        except Cancelled:
            if gate.stopping:
                raise Stopped() from None
            continue  # stopped by a live turn: what is missing now is asked in the next pause
        except (BackendError, OtakuError, OSError) as error:
            if session.meaning.say("writing"):
                log.warning("chat %s: vectors not written for recall by meaning: %s", session.key[:12], error)
            return
        if written.embedded:
            log.info("chat %s: %d texts embedded for recall by meaning in %d requests", session.key[:12],
                     written.embedded, written.requests)  # fmt: skip
        return
