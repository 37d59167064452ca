"""The one registry of chats (`Sessions`): which session a request continues, made or forked
when none is; the one bound (`MOST_SESSIONS`, least recently used evicted whole) and the one lock.
No other module of serve keeps a map keyed by chat.

A chat is one branch of an opening: a request whose dialogue (its user and assistant messages)
parts from every branch of its opening that serve knows — not a continuation of one, nor one cut
short (a swipe, a deleted reply), nor one with a message edited, deleted or put in (`edited`) —
forks the branch it shares the most with (`Session.fork`): the fork starts with its state, and
has its own from then on, its summaries file included, which reads the parent's scenes that still
tell it until it has its own. So a SillyTavern branch and the chat it came from are two chats
that share their common summaries.

Finding a chat is two steps: `match`, a pure function of the request and the registry (what
would be taken), and `take`, which applies it. A request is matched only once every check of it
has passed (`request.parse`), so a refused one leaves the registry as it was.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..tokens import common_length
from .chats import Chat
from .session import Session

#: the chats kept (each holds its story, some hundred bytes a message); the least recently used
#: goes first, whole
MOST_SESSIONS = 256
#: the branches of one opening kept (the least recently used goes first)
MOST_BRANCHES = 8

Dialogue = Sequence[tuple[Any, Any, Any]]


@dataclass(frozen=True)
class Match:
    """What a request is, of the chats known: `found` (None: a new chat), forked at `common`
    dialogue messages when `fork`, and the unnamed sessions a named chat takes over."""

    chat: Chat
    found: Session | None
    fork: bool = False
    common: int = 0
    renamed: tuple[Session, ...] = ()


def edited(new: Dialogue, old: Dialogue, shared: int) -> bool:
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
    opening's anyway). Lock: `lock`, guarding the registry and each session's identity."""

    def __init__(self, most: int = MOST_SESSIONS) -> None:
        self.most = most
        self.lock = threading.RLock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def match(self, chat: Chat, dialogue: Dialogue = ()) -> Match:
        """The branch of `chat` a request of this `dialogue` (its user and assistant messages as
        (role, name, content)) continues or cuts short; a fork of the one it shares the most with
        when it parts from each; a new chat when none is known. Changes nothing."""
        with self.lock:
            family = [s for s in self._sessions.values() if s.chat.key == chat.key]
            renamed: tuple[Session, ...] = ()
            if not family and chat.named:  # naming a chat keeps the unnamed one's turns and walk
                renamed = tuple(s for s in self._sessions.values() if s.chat.key == chat.pool and not s.chat.named)
                family = list(renamed)
            if not family:
                return Match(chat, None)
            # the one it shares the most with; a tie goes to the most recent
            shared, session = max(
                ((common_length(dialogue, s.dialogue), s) for s in reversed(family)), key=lambda found: found[0]
            )
            fork = shared < len(dialogue) and shared < len(session.dialogue)
            fork = fork and not edited(dialogue, session.dialogue, shared)
            return Match(chat, session, fork, shared, renamed)

    def take(self, chat: Chat, dialogue: Dialogue = (), numbers: Sequence[int] = ()) -> Session:
        """The session `match` finds, made, forked or renamed as it says, now the most recently
        used; `numbers`: each dialogue message's number in the story."""
        with self.lock:
            found = self.match(chat, dialogue)
            for session in found.renamed:
                del self._sessions[session.key]
                session.named(chat)
            if found.found is None:
                session = Session(chat)
            elif found.fork:
                session = found.found.fork(found.common, dialogue, numbers)
                family = [s for s in self._sessions.values() if s.chat.key == chat.key]
                if len(family) >= MOST_BRANCHES:
                    del self._sessions[min(family, key=self._age).key]
            else:
                session = found.found
            session.saw(dialogue, numbers)
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
