"""Each chat's state, in one object (`Session`), and the one registry of them (`Sessions`).

A chat is one branch of an opening: a request whose dialogue (its user and assistant messages)
parts from every branch of its opening that serve knows — not a continuation of one, nor one cut
short (a swipe, a deleted reply), nor one with a message edited, deleted or put in (`edited`) —
forks the branch it shares the most with (`Session.fork`): the fork starts with its state, and
has its own from then on, its summaries file included (`pool`), which reads the parent's scenes
that still tell it until it has its own. So a SillyTavern branch and the chat it came from are
two chats that share their common summaries.

A chat's story as last read, its stable-policy walk, its frame as remembered, the shape
a small window made it take, its turns, and where its summaries stand all live on its session;
the registry holds the one bound (`MOST_SESSIONS`, least recently used evicted whole) and the
one lock. No other module of serve keeps a map keyed by chat.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..assemble import Walked
from ..story.model import Message, Scene, Story
from ..story.sidecar import Judged, Record
from ..tokens import common_length
from .chats import Chat, digest
from .frame import FrameMemory
from .stats import Turn

#: the chats kept (each holds its story, some hundred bytes a message); the least recently used
#: goes first, whole
MOST_SESSIONS = 256
#: the turns a chat's stats keep
MOST_TURNS = 1000
#: the branches of one opening kept (the least recently used goes first)
MOST_BRANCHES = 8


@dataclass(eq=False)
class Session:
    """One chat, as serve knows it across its turns."""

    chat: Chat
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while a turn of it is assembled
    # which branch of its opening it is: "" the first; its dialogue as last sent ((role, name,
    # content) of each user and assistant message) and each one's number in its story
    branch: str = ""
    dialogue: Sequence[tuple[Any, Any, Any]] = ()
    numbers: Sequence[int] = ()
    # its summaries file's name (`Store.path`), "" for its opening's (`Chat.pool`); the file whose
    # scenes that still tell it it reads until it has its own
    own_pool: str = ""
    inherits: str | None = None
    inherited: tuple[Sequence[Record], tuple[Message, ...], list[Record]] | None = None  # (`Store.records_of`)
    placed: bool = False  # its file chosen among its opening's (`Store.story`, on its first turn)
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
        return f"{self.chat.key}~{self.branch}" if self.branch else self.chat.key

    @property
    def pool(self) -> str:
        """The name of its summaries file."""
        return self.own_pool or self.chat.pool

    def fork(self, common: int, dialogue: Sequence[tuple[Any, Any, Any]], numbers: Sequence[int]) -> Session:
        """A branch that shares its first `common` dialogue messages with this one: this one's
        state, with a summaries file of its own that reads this one's scenes that still tell it,
        and summaries of its own to write."""
        name = digest([self.pool, numbers[common], dialogue[common]])[:10]
        return replace(
            self, lock=threading.Lock(), frame=copy.deepcopy(self.frame), turns=deque(self.turns, maxlen=MOST_TURNS),
            branch=name, own_pool=f"{self.chat.pool}-{name}", inherits=self.pool, inherited=None, placed=False,
            wanted=None, working=None, failed_at=-1, why="", complete_at=-1,
        )  # fmt: skip


def edited(new: Sequence[Any], old: Sequence[Any], shared: int) -> bool:
    """Whether `new` is `old` with one message edited, deleted or put in at `shared` (the first
    they differ at): after it, they go on alike, as far as both go."""
    for a, b in ((shared + 1, shared + 1), (shared, shared + 1), (shared + 1, shared)):
        rest = min(len(new) - a, len(old) - b)
        if rest > 0 and new[a : a + rest] == old[b : b + rest]:
            return True
    return len(old) - shared <= 2  # its newest message edited (and the reply to it gone): not a branch


class Sessions:
    """Every chat's session: found by its key, made on its first turn, evicted least recently
    used past `most`. A named chat's first turn takes over the unnamed session of the same
    opening (naming a chat in SillyTavern keeps its turns and walk, and its summaries are the
    opening's anyway)."""

    def __init__(self, most: int = MOST_SESSIONS) -> None:
        self.most = most
        self.lock = threading.RLock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def find(self, chat: Chat, dialogue: Sequence[tuple[Any, Any, Any]] = (), numbers: Sequence[int] = ()) -> Session:
        """The branch of `chat` this request continues (or cuts short), made when none is; a
        fork of the one it shares the most with when it parts from each. `dialogue`: the
        request's user and assistant messages as (role, name, content), `numbers` their
        numbers in its story."""
        with self.lock:
            family = [s for s in self._sessions.values() if s.chat.key == chat.key]
            if not family and chat.named:  # naming a chat keeps the unnamed one's turns and walk
                family = [s for s in self._sessions.values() if s.chat.key == chat.pool and not s.chat.named]
                for session in family:
                    del self._sessions[session.key]
                    session.chat = chat
            if not family:
                session = Session(chat)
            else:  # the one it shares the most with; a tie goes to the most recent
                shared, session = max(
                    ((common_length(dialogue, s.dialogue), s) for s in reversed(family)), key=lambda found: found[0]
                )
                if (
                    shared < len(dialogue)
                    and shared < len(session.dialogue)
                    and not edited(dialogue, session.dialogue, shared)
                ):
                    session = session.fork(shared, dialogue, numbers)
                    if len(family) >= MOST_BRANCHES:
                        del self._sessions[min(family, key=self._age).key]
            session.dialogue, session.numbers = dialogue, numbers
            self._sessions[session.key] = session
            self._sessions.move_to_end(session.key)
            while len(self._sessions) > self.most:
                self._sessions.popitem(last=False)
            return session

    def _age(self, session: Session) -> int:
        return list(self._sessions).index(session.key)

    def __iter__(self) -> Iterator[Session]:
        with self.lock:
            return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)
