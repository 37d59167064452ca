"""A chat request as a Story, and which chat it is.

The frontend sends the whole chat every turn. Its leading system messages are the frame (the
story's system message, `frame_of`); the rest are the story's messages, in order, `name` kept.
A chat is recognised by its opening messages alone (`[serve] chat_messages`, 2: a character's
greeting and the user's first reply), hashed: never by its frame, which SillyTavern changes
from turn to turn (the World Info entries that fired, a group member's own card, an edited
Author's Note); and never by the speakers' names, which a renamed persona rewrites in every
past message (`said`). An `X-Ctx-Chat` header, else the request's `user` field, names one
explicitly instead; its summaries are still the opening's (`Chat.pool`), so naming a chat loses
none.
Either way the key is a hash, so a chat's text never becomes a file name. A request of one
message (SillyTavern's Test Message, "Hi") is a probe: it is answered, and is no chat.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..story.model import LoreEntry, LorePosition, Message, Role, Story
from ..story.speakers import label
from ..tokens import common_length
from .errors import BadRequest

#: the roles a chat's messages may have; `developer` is OpenAI's newer name for `system`
ROLES: dict[str, Role] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: the roles of a frame's messages (the leading ones)
FRAME_ROLES = ("system", "developer")
#: the header that names a chat
HEADER = "X-Ctx-Chat"


class ChatError(BadRequest):
    """A request whose messages are not a chat ctx can assemble."""


@dataclass(frozen=True)
class Chat:
    """Which chat a request continues: `key` (a hash: its session's), how it was recognised
    (`named`: by the header or `user`; else by its opening), and `pool`, the hash of its opening
    that names its summaries file, named or not."""

    key: str
    named: bool
    pool: str = ""

    @property
    def probe(self) -> bool:
        """A one-message request (a connection test): answered, never a chat of its own."""
        return not self.key


@dataclass(frozen=True)
class FramePart:
    """One leading system message: its text and the name it was sent with (`example_user`)."""

    text: str
    name: str = ""

    @property
    def shown(self) -> str:
        """As the frame holds it: a named part keeps who speaks ("example_user: Who are you?")."""
        return f"{self.name}: {self.text}" if self.name and not self.text.startswith(f"{self.name}:") else self.text


def frame_of(body: Mapping[str, Any]) -> tuple[FramePart, ...]:
    """The request's frame: its leading system (or developer) messages, each as it came."""
    parts = []
    for index, raw in enumerate(body.get("messages") or ()):
        if not isinstance(raw, dict) or raw.get("role") not in FRAME_ROLES:
            break
        parts.append(FramePart(_content(raw, index), _name(raw, index) or ""))
    return tuple(parts)


def _content(raw: Mapping[str, Any], index: int) -> str:
    content = raw.get("content")
    return content if isinstance(content, str) else text_of(content, f"messages[{index}]")


def _name(raw: Mapping[str, Any], index: int) -> str | None:
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise ChatError(f"messages[{index}]: name must be text")
    return name or None


def read_message(raw: Any, index: int) -> tuple[Role, str, str | None]:
    """One message of the chat (`messages[index]`) as its role, text and name; a `ChatError`
    saying what is wrong when it is not one ctx can assemble."""
    if not isinstance(raw, dict):
        raise ChatError(f"messages[{index}]: expected an object with role and content")
    role = ROLES.get(str(raw.get("role")))
    if role is None:
        raise ChatError(
            f"messages[{index}]: role {raw.get('role')!r} cannot be assembled;"
            " ctx serve takes system, user and assistant"
        )
    return role, _content(raw, index), _name(raw, index)


def check_messages(body: Mapping[str, Any]) -> None:
    """Every message of the request is one `chat_story` can read (the common shape checked at
    once, the rest read), and there is at least one after the frame: so that once a request is
    taken for a chat's, nothing in it can refuse it."""
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ChatError("messages: expected a non-empty list of chat messages")
    for index, raw in enumerate(given):
        if type(raw) is dict:
            role, content, name = raw.get("role"), raw.get("content"), raw.get("name")
            if type(role) is str and role in ROLES and type(content) is str and (name is None or type(name) is str):
                continue
        read_message(raw, index)
    if len(frame_of(body)) == len(given):
        raise ChatError("messages: only system messages; send the chat's messages too")


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI's content parts (their text parts)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatError(f"{where}: only text content parts can be assembled (an image or audio part cannot)")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatError(f"{where}: content must be text or a list of text parts")


def chat_story(
    body: Mapping[str, Any],
    before: Story | None = None,
    *,
    most: int | None = None,
    sent_before: Sequence[Any] = (),
) -> Story:
    """The request's chat as a Story: the leading system messages its frame, the rest its messages.

    `before`: the chat's story at its previous request. Its messages that this request holds
    again, in order from the first, are taken as they are (the same Message objects), so what
    was worked out from them last turn is known again by identity (`Store.story`); with
    `sent_before`, the messages that request sent (as decoded), those this one sends again
    alike are known so without reading them again. `most`: read only the frame and the first
    `most` messages (enough to recognise the chat)."""
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise ChatError("messages: expected a non-empty list of chat messages")
    frame = frame_of(body)
    messages: list[Message] = []
    kept = before.messages if before is not None else ()
    alike = common_length(given, sent_before) if before is not None else 0
    same = True  # the messages so far are `before`'s
    for index, raw in enumerate(given[len(frame) :], len(frame)):
        if most is not None and len(messages) >= most:
            break
        if index < alike:  # sent as before: read before
            messages.append(kept[len(messages)])
            continue
        role, content, name = read_message(raw, index)
        n = len(messages)
        if same and n < len(kept):
            old = kept[n]
            if old.content == content and old.role == role and old.name == name:
                messages.append(old)
                continue
        same = False
        messages.append(Message(n + 1, role, content, name))
    if not messages:
        raise ChatError("messages: only system messages; send the chat's messages too")
    system = "\n\n".join(part.shown for part in frame)
    return Story(path=Path("chat"), messages=tuple(messages), system=system, source_format="openai")


#: the roles of a chat's dialogue (`dialogue_of`)
SPEAKING = ("user", "assistant")

#: one message of a dialogue as a chat is recognised by: its role and its text, names left out
Said = tuple[str, str]


def said(role: str, content: Any) -> Said:
    """A message as a chat is recognised by: its role and its text without a speaker's name
    written at its start (`story.speakers.label`), so that a persona renamed in every past
    message ("You: Hi" → "Tomas: Hi") and Agnai's prefill, the bare "Mira:", read the same
    whoever speaks."""
    text = content if isinstance(content, str) else text_of(content, "a message")
    written = label(text)
    return role, text if written is None else written[1]


def dialogue_of(body: Mapping[str, Any]) -> list[Said]:
    """The request's dialogue as a chat is recognised by: each user and assistant message after
    the frame, `said`. System messages are left out: SillyTavern moves its Author's Note and
    World Info entries "@depth" from turn to turn, which is no new branch."""
    given = body.get("messages") or ()
    return [
        said(raw["role"], raw.get("content"))
        for raw in given[len(frame_of(body)) :]
        if isinstance(raw, dict) and raw.get("role") in SPEAKING
    ]


#: the uid of the lore entry that carries a frame's moving parts
FRAME_ENTRY = "ctx-serve-frame"


def framed(story: Story, frame: Sequence[FramePart], moving: Collection[FramePart], depth: int | None) -> Story:
    """The story with its frame placed: the parts that stay from turn to turn first, as its
    system message; those that come and go (`moving`: the World Info entries that fired this
    turn) as one system message `depth` messages before the end of the chat, as SillyTavern's
    "@depth" places an entry, where a change costs the backend's cache only the turns after it.
    `depth` None keeps every part first, as it came."""
    moves = [p.shown for p in frame if depth is not None and p in moving]
    stays = [p.shown for p in frame if depth is None or p not in moving]
    world: tuple[LoreEntry, ...] = ()
    if moves:
        entry = LoreEntry(
            FRAME_ENTRY, "\n\n".join(moves), constant=True, position=LorePosition.DEPTH, depth=depth or 0,
            source="the request's frame", comment="the frame's moving parts",
        )  # fmt: skip
        world = (entry,)
    return replace(story, system="\n\n".join(stays), world=world)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()[:24]


def identify(story: Story, body: Mapping[str, Any], headers: Mapping[str, str], opening: int) -> Chat:
    """Which chat this is: named by the `X-Ctx-Chat` header, else by `user`; else its first
    `opening` messages (fewer while the chat is shorter), `said`, whatever its frame. A chat of
    one message is a probe (`Chat.probe`), named or not."""
    if len(story.messages) < 2:
        return Chat("", False)
    # [role, "", text]: the shape names had in the key, so a chat with none keeps its summaries' file
    first = [[m.role, "", said(m.role, m.content)[1]] for m in story.messages[:opening]]
    pool = "o" + digest(first)
    named = headers.get(HEADER, "").strip() or (body.get("user") if isinstance(body.get("user"), str) else "")
    if named:
        return Chat("n" + digest(["named", named]), True, pool)
    return Chat(pool, False, pool)
