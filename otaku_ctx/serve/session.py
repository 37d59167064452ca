"""Each chat's state, in one object (`Session`), and the one registry of them (`Sessions`).

A chat's story as last read, its stable-policy walk, its frame as remembered, the shape
a small window made it take, its turns, and where its summaries stand all live on its session;
the registry holds the one bound (`MOST_SESSIONS`, least recently used evicted whole) and the
one lock. No other module of serve keeps a map keyed by chat.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..assemble import Walked
from ..story.model import Message, Scene, Story
from ..story.sidecar import Judged, Record
from .chats import Chat
from .frame import FrameMemory
from .stats import Turn

#: the chats kept (each holds its story, some hundred bytes a message); the least recently used
#: goes first, whole
MOST_SESSIONS = 256
#: the turns a chat's stats keep
MOST_TURNS = 1000


@dataclass(eq=False)
class Session:
    """One chat, as serve knows it across its turns."""

    chat: Chat
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while a turn of it is assembled
    # its last request: the messages as sent, and the story read from them (the next request is
    # read against it, so the messages sent alike are the same objects)
    sent: Any = ()
    story: Story | None = None
    frame: FrameMemory = field(default_factory=FrameMemory)  # its frame across turns
    walk: Walked | None = None  # the stable policy's walk at its last turn
    rung: int = (
        0  # how far down serve's small-window ladder it went (0: the settings as given; past its last: truncating)
    )
    cut: int = 0  # past the ladder: the number of the first message its last turn kept (0: none)
    said: str = ""  # what serve said, once, of the shape it chose for a small window
    turns: deque[Turn] = field(default_factory=lambda: deque(maxlen=MOST_TURNS))
    # its summaries: the records last judged (and the messages, and the verdict), the records a
    # turn assembles with while the summarizer is still writing (one swap when it is done)
    judged: tuple[Sequence[Record], tuple[Message, ...], Judged] | None = None
    held: Sequence[Record] | None = None
    # the scenes a turn last used: the messages and the verdict they were made for, and the scenes
    scenes: tuple[tuple[Message, ...], Judged, tuple[Scene, ...]] | None = None
    # the summarizer's view of it
    wanted: Story | None = None  # the story to summarize, when there is time
    working: Any = None  # the `summaries.Work` under way
    failed_at: int = -1  # the length of the story that failed (not retried until it grows)
    why: str = ""  # why its summaries could not be written, the last time
    complete_at: int = -1  # the length of the story last found with nothing to do

    @property
    def key(self) -> str:
        return self.chat.key


class Sessions:
    """Every chat's session: found by its key, made on its first turn, evicted least recently
    used past `most`. A named chat's first turn takes over the unnamed session of the same
    opening (naming a chat in SillyTavern keeps its turns and walk, and its summaries are the
    opening's anyway)."""

    def __init__(self, most: int = MOST_SESSIONS) -> None:
        self.most = most
        self.lock = threading.RLock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def find(self, chat: Chat) -> Session:
        with self.lock:
            session = self._sessions.get(chat.key)
            if session is None and chat.named:
                unnamed = self._sessions.get(chat.pool)
                if unnamed is not None and not unnamed.chat.named:
                    session = self._sessions.pop(chat.pool)
                    session.chat = chat
            if session is None:
                session = Session(chat)
            self._sessions[chat.key] = session
            self._sessions.move_to_end(chat.key)
            while len(self._sessions) > self.most:
                self._sessions.popitem(last=False)
            return session

    def __iter__(self) -> Iterator[Session]:
        with self.lock:
            return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)
