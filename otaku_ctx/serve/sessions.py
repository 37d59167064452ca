"""The one registry of chats (`Sessions`): which chat a request continues, and the one-shots —
requests that continue none — held apart until one is continued. The bounds (`MOST_SESSIONS`
chats, `MOST_ONE_SHOTS` one-shots, each least recently used evicted whole) and the one lock.
No other module of serve keeps a map keyed by chat.

A request continues a chat it is, by its dialogue (its user and assistant messages), that chat
gone on, or that chat with one message edited, deleted or put in, or cut short by one or two at
its end (a swipe, a deleted reply) — `continues`. Going on and an edit the rest of the chat
follows need nothing more; the same dialogue sent again, a cut or the newest two edited also
need the frame the chat last sent, so a new chat that opens as another did ("Hi" to the same
card) with a persona of its own is not that chat regenerated. Of the chats a request continues,
the one it shares the most dialogue with is taken, then one whose frame it sends. A reply the
frontend asked to be continued (a trailing assistant prefill, Agnai's "Mira:", SillyTavern's
Continue) is continued by the whole reply in its place. Anything else — a new chat with the
same card and first line as another, a branch, a frontend's side request (its memory, a title)
— continues no chat: it is a one-shot, served with a session of its own that holds nothing of
any chat's (no walk, no frame, no stats; its summaries only what another chat's file says of
the same text, `store.Store`), kept among the one-shots, never summarised. It becomes a chat
when a later request continues it. So a flood of side requests never evicts a chat, and two
chats that open alike never share a turn.

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
from .chats import Chat, FramePart, digest
from .session import Session

#: the chats kept (each holds its story, some hundred bytes a message); the least recently used
#: goes first, whole
MOST_SESSIONS = 256
#: the chats of one opening kept (its branches; the least recently used goes first)
MOST_BRANCHES = 8
#: the one-shots kept, apart from the chats: a request continuing one of these makes it a chat
MOST_ONE_SHOTS = 64
#: how much shorter than a chat a request may be and still be that chat: a swipe (the newest
#: reply not sent) or a deleted exchange
MOST_CUT = 2

Dialogue = Sequence[tuple[Any, Any, Any]]


@dataclass(frozen=True)
class Match:
    """What a request is, of the chats known: the session it continues (`found`; None: none, a
    one-shot), whether that was a one-shot it now makes a chat (`promoted`), and the unnamed
    chat a named request takes over (`renamed`)."""

    chat: Chat
    found: Session | None
    promoted: bool = False
    renamed: tuple[Session, ...] = ()


def shared(new: Dialogue, old: Dialogue) -> int:
    """The dialogue messages `new` and `old` begin with alike; `old`'s last, an assistant's reply
    begun (a prefill), counts as alike when `new` holds it continued."""
    same = common_length(new, old)
    if same == len(old) - 1 and same < len(new) and old[-1][0] == "assistant" == new[same][0]:
        if isinstance(new[same][2], str) and isinstance(old[-1][2], str) and new[same][2].startswith(old[-1][2]):
            return same + 1
    return same


def continues(new: Dialogue, old: Dialogue, same: int, frame_kept: bool = True) -> bool:
    """Whether a request of dialogue `new` is the chat last sent as `old`, the two beginning with
    `same` messages alike (`shared`): gone on, or with one message edited, deleted or put in
    (after it, the two go on alike, as far as both go); or, with the frame it last sent
    (`frame_kept`), sent again, cut short by at most `MOST_CUT` at its end, or its newest two
    edited or gone — what a new chat that opens as another did could be too."""
    if same == len(old) < len(new):
        return True
    for a, b in ((same + 1, same + 1), (same, same + 1), (same + 1, same)):
        rest = min(len(new) - a, len(old) - b)
        if rest > 0 and new[a : a + rest] == old[b : b + rest]:
            return True
    if not frame_kept:
        return False
    if same == len(old) or (same == len(new) and len(old) - same <= MOST_CUT):
        return True
    return same < len(new) and len(old) - same <= MOST_CUT  # its newest message edited (the reply to it gone)


class Sessions:
    """Every chat's session, found by what it continues (`match`), evicted least recently used
    past `most`; and the one-shots, apart, past `most_one_shots`. A named chat's first request
    takes over the unnamed chat it continues (naming a chat in SillyTavern keeps its turns and
    walk). Lock: `lock`, guarding the registry and each session's identity."""

    def __init__(self, most: int = MOST_SESSIONS, most_one_shots: int = MOST_ONE_SHOTS) -> None:
        self.most, self.most_one_shots = most, most_one_shots
        self.lock = threading.RLock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._one_shots: OrderedDict[str, Session] = OrderedDict()
        self.one_shots_served = 0  # the requests served as one-shots (each never a chat, or not yet)

    def match(self, chat: Chat, dialogue: Dialogue = (), frame: Sequence[FramePart] = ()) -> Match:
        """The chat (or one-shot) a request of `chat`, this `dialogue` (its user and assistant
        messages as (role, name, content)) and this `frame` continues, of those it shares the most
        with, then of those whose frame it sends; None when it continues none. Changes nothing."""
        with self.lock:
            family = [s for s in self._sessions.values() if s.chat.key == chat.key]
            held = [s for s in self._one_shots.values() if s.chat.key == chat.key]
            renamed: list[Session] = []
            if not family and not held and chat.named:  # naming a chat keeps the unnamed one's turns and walk
                unnamed = [*self._one_shots.values(), *self._sessions.values()]
                renamed = [s for s in unnamed if s.chat.key == chat.pool and not s.chat.named]
            # the one it shares the most with; a tie goes to a chat over a one-shot, then to the most recent
            known = [(shared(dialogue, s.dialogue), s.frame == frame, s) for s in reversed([*held, *renamed, *family])]
            for same, kept, session in sorted(known, key=lambda found: found[:2], reverse=True):
                if continues(dialogue, session.dialogue, same, kept):
                    taken = (session,) if session in renamed else ()
                    one_shot = self._one_shots.get(session.key) is session
                    return Match(chat, session, promoted=one_shot, renamed=taken)
            return Match(chat, None)

    def take(
        self, chat: Chat, dialogue: Dialogue = (), numbers: Sequence[int] = (), frame: Sequence[FramePart] = ()
    ) -> Session:
        """The session `match` finds, renamed or made a chat as it says, now the most recently
        used; else a one-shot's of its own. `numbers`: each dialogue message's number in the story."""
        with self.lock:
            found = self.match(chat, dialogue, frame)
            for session in found.renamed:
                (self._one_shots if found.promoted else self._sessions).pop(session.key)
                session.named(chat)
            if found.found is None:
                session = Session(chat, self._branch(chat, dialogue))
                session.saw(dialogue, numbers, frame)
                self.one_shots_served += 1
                self._one_shots[session.key] = session
                while len(self._one_shots) > self.most_one_shots:
                    self._one_shots.popitem(last=False)
                return session
            session = found.found
            if found.promoted:
                self._one_shots.pop(session.key, None)  # (a renamed one is gone already)
                family = [s for s in self._sessions.values() if s.chat.key == chat.key]
                if len(family) >= MOST_BRANCHES:
                    del self._sessions[min(family, key=self._age).key]
            session.saw(dialogue, numbers, frame)
            self._sessions[session.key] = session
            self._sessions.move_to_end(session.key)
            while len(self._sessions) > self.most:
                self._sessions.popitem(last=False)
            return session

    def one_shot(self, session: Session) -> bool:
        """Whether `session` is a one-shot's (served, held apart, no chat yet)."""
        with self.lock:
            return self._one_shots.get(session.key) is session

    def _branch(self, chat: Chat, dialogue: Dialogue) -> str:
        """A new session's branch name: "" for the first of its chat, else one its dialogue makes."""
        taken = any(s.chat.key == chat.key for s in (*self._sessions.values(), *self._one_shots.values()))
        return digest([chat.key, list(dialogue)])[:10] if taken else ""

    def _age(self, session: Session) -> int:
        return list(self._sessions).index(session.key)

    def __iter__(self) -> Iterator[Session]:
        """The chats (not the one-shots)."""
        with self.lock:
            return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def held(self) -> int:
        """The one-shots held now."""
        return len(self._one_shots)
