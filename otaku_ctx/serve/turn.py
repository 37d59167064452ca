"""The assembling stage of a chat turn, on its lane's thread: the chat's session taken, its story
read against the last one, its scenes (the summaries, else provisional ones), its frame placed,
and the turn assembled (`assemble.assemble_chat`); then its summaries wished for.

A one-shot (a request that continues no chat: `sessions`) is assembled as a chat's first turn
is, and is never summarised. So is a chat's request whose start the frontend left out (it trims
a chat longer than its own context setting): ctx cannot keep what it is not sent, and says so,
once a chat; the turn counts as the chat's."""

from __future__ import annotations

from collections.abc import Sequence

from ..config import ServeSettings
from ..model.server import ServerCounter
from ..story.model import Story
from .assemble import Assembled, assemble_chat, forget_pipelines
from .chats import FramePart, chat_story, framed
from .recalling import meant
from .record import say_shape, say_trimmed
from .request import Request
from .session import Session, TurnState
from .sessions import Sessions
from .setup import Setup
from .store import Store
from .summaries import Summarizer

#: the depth that places the frame's moving parts at the tail's first message, whatever the chat's length
TAIL = 1 << 30


def assemble_turn(
    request: Request, setup: Setup, window: int, sessions: Sessions, store: Store, summarizer: Summarizer | None
) -> tuple[Session | None, Assembled]:
    """The turn as sent on, and its chat's session (None for a probe, which is answered as it is
    and remembered nowhere)."""
    setup.count.afresh()  # a counter that fell back last turn asks its server again
    if request.chat.probe:
        probe = chat_story(request.body)
        assembled = assemble_chat(probe, setup.rungs, setup.count, window=window, max_tokens=request.max_tokens)
        return None, assembled
    chat = sessions.take(request.chat, request.dialogue, request.frame)
    one_shot = sessions.one_shot(chat)
    session = chat
    if chat.trimmed:  # only the chat's end: served as a first turn, its own state and summaries untouched
        say_trimmed(chat, request.dialogue)
        session, one_shot = Session(request.chat), True
    with session.lock:  # its turn on another lane (the one that made it long) is done first
        state = session.turn
        story = chat_story(request.body, state.story, sent_before=state.sent)
        state.read(request.body["messages"], story)
        told = store.story(session, story, hold=session.summaries.writing, window=window)
        told = meant(session, told, setup.settings.recall, store)
        serve = setup.settings.serve
        for keep in (serve.frame_sticky, 0) if serve.frame_sticky else (0,):  # what stopped being sent goes first
            placed = placed_frame(state, told, request.frame, serve, keep, store.cutting.settle)
            if state.walk is None and keep == (serve.frame_sticky or 0):
                counted_ahead(placed, setup, window, request.max_tokens)
            assembled = assemble_chat(
                placed, setup.rungs, setup.count, window=window, max_tokens=request.max_tokens, state=state,
                played=bool(session.stats),
            )  # fmt: skip
            if assembled.messages is not None:
                break
        say_shape(session, assembled, setup)
    if summarizer is not None and not one_shot:
        summarizer.want(session, story)
    return chat, assembled


def counted_ahead(story: Story, setup: Setup, window: int, max_tokens: int | None) -> None:
    """A chat's first turn, counted by the server (`ServerCounter`): the turn assembled once as a
    dry run, each text the count cache lacks estimated and gathered, then all of them counted in
    a batch or a few (`ServerCounter.count_many`), so the turn itself finds them counted. Without
    it, a 160-message chat's first turn asked the server some 350 times, one text at a time."""
    if not isinstance(setup.count, ServerCounter) or setup.count.knows(m.content for m in story.messages):
        return  # every message counted before (a chat played before serve started): nothing to gather
    dry, wanted = setup.count.gathering()
    try:
        assemble_chat(story, setup.rungs, dry, window=window, max_tokens=max_tokens)
    finally:
        forget_pipelines(dry)
    if wanted:
        setup.count.count_many(dict.fromkeys(wanted))


def placed_frame(
    state: TurnState, story: Story, sent: Sequence[FramePart], serve: ServeSettings, sticky: int, settle: int
) -> Story:
    """The story with the frame this turn sends on (`frame.FrameMemory`: parts as first sent, those
    that stopped `sticky` messages), the parts that stay first and the moving ones at
    `frame_depth`, and the system messages inside the chat held where they were (`depth_hold`);
    with `stable_frame` off, all as the frontend sent it."""
    if not serve.stable_frame:
        return story
    story = state.frame.held(story, serve.depth_hold, settle)
    frame = state.frame.frame(sent, len(story.messages), sticky)
    depth = TAIL if serve.frame_depth == "tail" else serve.frame_depth
    return framed(story, frame, state.frame.moving(frame), depth)
