"""The one registry of chats (`Sessions`): which chat a request continues, and the one-shots —
requests that continue none — held apart until one is continued. The bounds (`MOST_SESSIONS`
chats, `MOST_ONE_SHOTS` one-shots, each least recently used evicted whole) and the one lock.
No other module of serve keeps a map keyed by chat.

A request continues a chat it is, by its dialogue (its user and assistant messages, a speaker's
name written at their start left out: `chats.said`), that chat gone on, or that chat with one
message edited, deleted or put in, or cut short by one or two at its end (a swipe, a deleted
reply) — `continues`. Going on and an edit the rest of the chat follows need nothing more; the
same dialogue sent again, a cut or the newest two edited also need the frame the chat last sent,
so a new chat that opens as another did ("Hi" to the same card) with a persona of its own is not
that chat regenerated. Of the chats a request continues, the one it shares the most dialogue
with is taken, then one whose frame it sends. A reply the frontend asked to be continued (a
trailing assistant prefill, Agnai's "Mira:", SillyTavern's Continue) is continued by the whole
reply in its place, and is never by itself a sign of the same chat. A request that continues no
chat of its opening may still continue one of the chats played last (`begins_in`): with a
message of the opening edited, or with the chat's start left out by the frontend
(`Match.trimmed`: the turn is the chat's, assembled from what was sent). Anything else — a new
chat with the same card and first line as another, a branch, a frontend's side request (its
memory, a title) — continues no chat: it is a one-shot, served with a session of its own that
holds nothing of any chat's (no walk, no frame, no stats; its summaries only what another
chat's file says of the same text, `store.Store`), kept among the one-shots, never summarised.
It becomes a chat when a later request continues it. So a flood of side requests never evicts a
chat, and two chats that open alike never share a turn.

Finding a chat is two steps: `match`, a pure function of the request and the registry (what
would be taken), and `take`, which applies it. A request is matched only once every check of it
has passed (`request.parse`), so a refused one leaves the registry as it was.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..tokens import common_length
from .chats import Chat, FramePart, Said, digest
from .session import Session

#: the chats kept (each holds its story, some hundred bytes a message); the least recently used
#: goes first, whole
MOST_SESSIONS = 256
#: the chats of one opening kept (its branches, and other players' chats that open alike: a
#: greeting and "Hi"); the least recently used goes first
MOST_BRANCHES = 16
#: the one-shots kept, apart from the chats: a request continuing one of these makes it a chat
MOST_ONE_SHOTS = 64
#: a chat's opening, by its dialogue: the greeting and the player's first line
OPENING = 2
#: how much shorter than a chat a request may be and still be that chat: a swipe (the newest
#: reply not sent) or a deleted exchange
MOST_CUT = 2
#: the chats, most recently played first, where a request that continues none of its own opening
#: is looked for as one that edits their opening or whose start the frontend left out
#: (`begins_in`); and the places in each where its first message is tried
MOST_ELSEWHERE = 8
MOST_TRIES = 16

Dialogue = Sequence[Said]


@dataclass(frozen=True)
class Match:
    """What a request is, of the chats known: the session it continues (`found`; None: none, a
    one-shot), whether that was a one-shot it now makes a chat (`promoted`), the unnamed chat a
    named request takes over (`renamed`), and how many of the chat's first messages the frontend
    left out (`trimmed`: the request is the end of the chat, from there)."""

    chat: Chat
    found: Session | None
    promoted: bool = False
    renamed: tuple[Session, ...] = ()
    trimmed: int = 0


def shared(new: Dialogue, old: Dialogue) -> int:
    """The dialogue messages `new` and `old` begin with alike; `old`'s last, an assistant's reply
    begun (a prefill), counts as alike when `new` holds it continued."""
    same = common_length(new, old)
    if same == len(old) - 1 and same < len(new) and _continued(new[same], old[-1]):
        return same + 1
    return same


def _continued(new: Said, old: Said) -> bool:
    """Whether `new` is the assistant's reply `old` begun (a prefill, a reply to go on with)."""
    return new[0] == old[0] == "assistant" and new[1].startswith(old[1])


def _goes_on_alike(new: Dialogue, a: int, old: Dialogue, b: int) -> bool:
    """Whether `new` from `a` and `old` from `b` go on alike, as far as both go, for at least one
    message besides `old`'s last reply — which, a prefill, `new` may hold continued, and which,
    Agnai's bare "Mira:", any chat's would."""
    n = min(len(new) - a, len(old) - b)
    last = n > 0 and b + n == len(old) and old[-1][0] == "assistant"
    if n - last <= 0 or new[a : a + n - last] != old[b : b + n - last]:
        return False
    return not last or _continued(new[a + n - 1], old[-1])


def continues(new: Dialogue, old: Dialogue, same: int, frame_kept: bool = True, frame_grew: bool = True) -> bool:
    """Whether a request of dialogue `new` is the chat last sent as `old`, the two beginning with
    `same` messages alike (`shared`): gone on — from no more than its opening, only with every
    part of the frame it last sent (`frame_grew`: World Info may have fired, but another
    player's first line and persona are no chat of theirs gone on) — or with one message edited,
    deleted or put in (after it, the two go on alike); or, with the frame it last sent
    (`frame_kept`), sent again, cut short by at most `MOST_CUT` at its end, or its newest two
    edited or gone — what a new chat that opens as another did could be too."""
    if same == len(old) < len(new):
        return len(old) > OPENING or frame_grew
    for a, b in ((same + 1, same + 1), (same, same + 1), (same + 1, same)):
        if _goes_on_alike(new, a, old, b):
            return True
    if not frame_kept:
        return False
    if same == len(old) or (same == len(new) and len(old) - same <= MOST_CUT):
        return True
    return same < len(new) and len(old) - same <= MOST_CUT  # its newest message edited (the reply to it gone)


def begins_in(new: Dialogue, old: Dialogue, frame_kept: bool) -> int | None:
    """Where in the chat last sent as `old` a request `new` of another opening begins: at 0 when
    it goes on from `old` with a message of the opening edited, deleted or put in (`continues`,
    the frame aside); later when the frontend left out the chat's first messages (it trims a chat
    longer than its own context setting) and `new` continues `old` from there, sharing two
    messages at least (of the places `new`'s first message is in `old`, the first `MOST_TRIES`);
    else None."""
    if continues(new, old, shared(new, old), frame_kept=False):
        return 0
    if len(new) < 3:
        return None
    start = 0
    for _ in range(MOST_TRIES):
        try:
            start = old.index(new[0], start + 1)
        except ValueError:
            return None
        rest = old[start:]
        same = shared(new, rest)
        if same >= 2 and continues(new, rest, same, frame_kept):
            return start
    return None


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
        messages, `chats.said`) and this `frame` continues, of those it shares the most with, then
        of those whose frame it sends; None when it continues none. Changes nothing."""
        with self.lock:
            family = [s for s in self._sessions.values() if s.chat.key == chat.key]
            held = [s for s in self._one_shots.values() if s.chat.key == chat.key]
            renamed: list[Session] = []
            if not family and not held and chat.named:  # naming a chat keeps the unnamed one's turns and walk
                unnamed = [*self._one_shots.values(), *self._sessions.values()]
                renamed = [s for s in unnamed if s.chat.key == chat.pool and not s.chat.named]
            # the one it shares the most with; a tie goes to a chat over a one-shot, then to the most recent
            parts = set(frame)
            known = [(shared(dialogue, s.dialogue), s.frame == frame, s) for s in reversed([*held, *renamed, *family])]
            for same, kept, session in sorted(known, key=lambda found: found[:2], reverse=True):
                if continues(dialogue, session.dialogue, same, kept, parts.issuperset(session.frame)):
                    taken = (session,) if session in renamed else ()
                    one_shot = self._one_shots.get(session.key) is session
                    return Match(chat, session, promoted=one_shot, renamed=taken)
            # else, of the chats played last, one whose opening the request edits or leaves out
            recent = list(reversed(self._sessions.values()))[:MOST_ELSEWHERE]
            for session in dict.fromkeys([*family, *recent]):
                start = begins_in(dialogue, session.dialogue, session.frame == frame)
                if start is not None:
                    return Match(chat, session, trimmed=start)
            return Match(chat, None)

    def take(self, chat: Chat, dialogue: Dialogue = (), frame: Sequence[FramePart] = ()) -> Session:
        """The session `match` finds, renamed or made a chat as it says, now the most recently
        used; else a one-shot's of its own. A chat the frontend trimmed keeps its whole dialogue,
        its start as last known and the request's after it."""
        with self.lock:
            found = self.match(chat, dialogue, frame)
            for session in found.renamed:
                (self._one_shots if found.promoted else self._sessions).pop(session.key)
                session.named(chat)
            if found.found is None:
                session = Session(chat, self._branch(chat, dialogue))
                session.saw(dialogue, frame)
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
            if found.trimmed:
                dialogue = [*session.dialogue[: found.trimmed], *dialogue]
            session.saw(dialogue, frame, found.trimmed)
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
