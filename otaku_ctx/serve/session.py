"""One chat's state (`Session`), in parts that each own their fields and name their lock.

A session is made of:
- its identity (which chat, which branch, its dialogue as last sent): `Session` itself, written
  by the registry (`sessions.Sessions`) under the registry's lock;
- `TurnState`, what one turn hands the next (the story as read, the frame, the walk, the shape a
  small window made it take): written by the turn being assembled, under `Session.lock`;
- `SidecarState`, which summaries file it reads and what was last worked out from it: its own
  lock (a turn writes it; the summarizer reads the chat's records through it);
- `SummaryState`, where its summaries stand: its own lock (the summarizer and the turns);
- `MeaningState`, its vectors file for recall by meaning: its own lock;
- `Turns`, what each turn sent and the backend reused: its own lock (the event loop appends,
  `/ctx/stats` reads).

Every field is assigned only by its part's own methods (tests/test_serve_state.py checks it).
What is worked out from a sidecar's records and a story's messages is kept as `Known`, whose key
says what it depends on.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..assemble import Walked
from ..story.model import Message, Scene, Story
from ..story.sidecar import Judged, Record
from ..tokens import common_length
from .chats import Chat, FramePart, Said
from .frame import FrameMemory
from .stats import Turn

T = TypeVar("T")
#: the turns a chat's stats keep
MOST_TURNS = 1000


@dataclass(frozen=True)
class Known(Generic[T]):
    """A value worked out from a sidecar's `records` (or several files' lists of them) and a
    story's `messages`. It stands while the records are the same object (a file read again is a
    new one) and the story holds those messages first, as they were (it only grew)."""

    records: Sequence[Any]
    messages: tuple[Message, ...]
    value: T

    def holds(self, records: Sequence[Any], messages: Sequence[Message]) -> bool:
        return self.records is records and common_length(messages, self.messages) == len(self.messages)


class TurnState:
    """What a chat's turn hands the next. Lock: `Session.lock`, held by the turn being assembled."""

    def __init__(self) -> None:
        self.sent: Any = ()  # the messages its last request sent, as decoded
        self.story: Story | None = None  # the story read from them (the next request is read against it)
        self.frame = FrameMemory()  # its frame across turns
        self.walk: Walked | None = None  # the stable policy's walk at its last turn
        self.rung = 0  # how far down serve's small-window ladder it went (past its last: truncating)
        self.cut = 0  # when truncating: the number of the first message its last turn kept (0: none)
        self.said = ""  # what serve said, once, of the shape it chose for a small window

    def read(self, sent: Any, story: Story) -> None:
        self.sent, self.story = sent, story

    def shaped(self, rung: int, walk: Walked | None, cut: int | None = None) -> None:
        """On `rung` of the ladder, with this walk (and, when given, a truncation's `cut`)."""
        self.rung, self.walk = rung, walk
        if cut is not None:
            self.cut = cut

    def truncated_at(self, cut: int) -> None:
        self.cut = cut

    def say(self, said: str) -> bool:
        """Whether `said` is news (then it is remembered)."""
        news, self.said = said != self.said, said
        return news


class SidecarState:
    """Which summaries file a chat writes and what a turn last made of the records it reads.
    Lock: `lock`, its own (a turn writes it; the summarizer asks it for the chat's records)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.own_pool = ""  # its file's name, "" for its opening's (`Chat.pool`)
        self.placed = False  # its file chosen among its opening's, on its first turn (`Store.place`)
        # the records of its opening's other files that tell its messages word for word
        self.borrowed: Known[list[Record]] | None = None
        self.judged: Known[Judged] | None = None  # the verdict on its records
        self.held: Sequence[Record] | None = None  # the records a turn uses while the summarizer writes
        # the scenes a turn last used: the messages and the verdict they were made for, and the scenes
        self.scenes: tuple[tuple[Message, ...], Judged, tuple[Scene, ...]] | None = None

    def place(self, own_pool: str) -> None:
        with self.lock:
            self.own_pool, self.placed = own_pool, True

    def keep_borrowed(self, known: Known[list[Record]]) -> None:
        with self.lock:
            self.borrowed = known

    def keep_judged(self, known: Known[Judged]) -> None:
        with self.lock:
            self.judged = known

    def hold(self, records: Sequence[Record]) -> None:
        with self.lock:
            self.held = records

    def keep_scenes(self, messages: tuple[Message, ...], judged: Judged, scenes: tuple[Scene, ...]) -> None:
        with self.lock:
            self.scenes = (messages, judged, scenes)


class SummaryState:
    """Where a chat's summaries stand. Lock: `lock`, its own (the summarizer's thread and the turns)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wanted: Story | None = None  # the story to summarize, when there is time
        self.working: Any = None  # the `summaries.Work` under way
        self.failed_at = -1  # the length of the story that failed (not retried until it grows)
        self.why = ""  # why its summaries could not be written, the last time
        self.complete_at = -1  # the length of the story last found with nothing to do
        # what its summarizer wrote, in all: summaries and histories by the model, ctx's extracts
        # in their place (`too_slow` of them not asked of the model, as the player's turns kept
        # stopping its requests), and the model's replies a check turned down
        self.by_model, self.extracts, self.turned_down, self.too_slow = 0, 0, 0, 0

    def wish(self, story: Story, scene: int) -> bool:
        """Want `story` summarized, unless it failed at this length or was found complete less
        than a `scene`'s worth of messages ago; whether it is wanted."""
        with self.lock:
            if self.failed_at >= len(story) or len(story) < self.complete_at + scene:
                return False
            self.wanted = story
            return True

    def begin(self, make: Any) -> Any:
        """The work for the story wanted (`make(story)`), now under way; None when none is wanted."""
        with self.lock:
            story, self.wanted = self.wanted, None
            self.working = make(story) if story is not None else None
            return self.working

    def end(self, *, complete_at: int | None = None, failed_at: int | None = None, why: str | None = None) -> None:
        with self.lock:
            if complete_at is not None:
                self.complete_at = complete_at
            if failed_at is not None:
                self.failed_at = failed_at
            if why is not None:
                self.why = why

    def tally(self, by_model: int, extracts: int, turned_down: int, too_slow: int = 0) -> bool:
        """A pass's count added; whether the model's replies were all turned down now and were
        not before (then it is said, once a chat)."""
        with self.lock:
            before = self._none_kept()
            self.by_model += by_model
            self.extracts += extracts
            self.turned_down += turned_down
            self.too_slow += too_slow
            return not before and self._none_kept()

    @property
    def none_kept(self) -> bool:
        """Whether the model's replies were turned down and none of it was kept: every summary
        and history written for the chat so far is ctx's extract."""
        with self.lock:
            return self._none_kept()

    def _none_kept(self) -> bool:
        return self.turned_down > 0 and self.by_model == 0 and self.extracts > self.too_slow

    def planned(self, plan: Any, progress: Any) -> None:
        """The work under way has its plan, and counts its requests in `progress`."""
        with self.lock:
            self.working.begun(plan, progress)

    def done(self) -> None:
        with self.lock:
            self.working = None

    @property
    def busy(self) -> bool:
        with self.lock:
            return self.working is not None

    @property
    def writing(self) -> bool:
        """Whether summaries are wanted (waiting for the summarizer's thread) or being written: from
        the turn that asks for them until the pass ends, with or without a plan yet."""
        with self.lock:
            return self.wanted is not None or self.working is not None

    @property
    def left(self) -> int:
        """The summary requests still to send for the work under way."""
        with self.lock:
            return self.working.requests_left if self.working is not None else 0


class Turns:
    """What each turn of a chat sent and the backend reused, the newest `MOST_TURNS`. Lock: `lock`,
    its own (the event loop adds, `/ctx/stats` reads)."""

    def __init__(self, turns: Sequence[Turn] = ()) -> None:
        self.lock = threading.Lock()
        self._turns: deque[Turn] = deque(turns, maxlen=MOST_TURNS)

    def add(self, turn: Turn) -> int:
        """Add `turn`; its number among the chat's turns."""
        with self.lock:
            self._turns.append(turn)
            return len(self._turns)

    def all(self) -> list[Turn]:
        with self.lock:
            return list(self._turns)

    def __bool__(self) -> bool:
        return bool(self._turns)


class MeaningState:
    """What recall by meaning holds of a chat: its vectors file, held open and read again when it
    grows (`embed.Held`), and the kinds of reason the keyword engine ran in its place that were
    said already (each once a chat). Lock: its own (the turns hold `Session.lock` too)."""

    def __init__(self) -> None:
        self.held: Any = None  # the `embed.Held` of its vectors file
        self.said: set[str] = set()
        self.lock = threading.Lock()

    def holding(self, make: Any, path: Any) -> Any:
        """Its vectors file held (`make(path)` the first time, and when the file is another)."""
        with self.lock:
            if self.held is None or self.held.path != path:
                self.held = make(path)
            return self.held

    def say(self, kind: str) -> bool:
        """Whether a reason of this kind is new for the chat (then it is said)."""
        with self.lock:
            new = kind not in self.said
            self.said.add(kind)
            return new


@dataclass(eq=False)
class Session:
    """One chat (or one-shot: `sessions`), as serve knows it across its turns. Lock: `Sessions.lock`,
    the registry's, under which the registry alone writes its identity (`chat`, `branch`,
    `dialogue`, `frame`, `trimmed`); its own `lock` is the turn's, held while a turn of it is assembled (it
    guards `turn`)."""

    chat: Chat
    branch: str = ""  # which of the chats of its key it is: "" the first
    dialogue: Sequence[Said] = ()  # its dialogue as last sent (each user and assistant message, `said`)
    frame: Sequence[FramePart] = ()  # its frame (leading system parts) as last sent
    trimmed: int = 0  # how many of its first messages the frontend left out of its last request
    trims: int = 0  # how many of its requests came so
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: TurnState = field(default_factory=TurnState)
    sidecar: SidecarState = field(default_factory=SidecarState)
    summaries: SummaryState = field(default_factory=SummaryState)
    meaning: MeaningState = field(default_factory=MeaningState)
    stats: Turns = field(default_factory=Turns)

    @property
    def key(self) -> str:
        return f"{self.chat.key}~{self.branch}" if self.branch else self.chat.key

    @property
    def pool(self) -> str:
        """The name of its summaries file."""
        return self.sidecar.own_pool or self.chat.pool

    def saw(self, dialogue: Sequence[Said], frame: Sequence[FramePart] = (), trimmed: int = 0) -> None:
        self.dialogue, self.frame, self.trimmed = dialogue, frame, trimmed
        self.trims += trimmed > 0

    def named(self, chat: Chat) -> None:
        """The chat is now named (its first request with a name): it keeps its turns and walk."""
        self.chat = chat
