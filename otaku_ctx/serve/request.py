"""A chat request, parsed and checked whole before any state changes (`parse`).

Every message is checked here — its role, its content, its name — and the fields passed on as
they came, the reply's reserve, which chat it is and its dialogue: what can refuse a request
refuses it here, so that the stages after (the session taken, the summaries file chosen) only
ever see a request they will serve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ServeSettings
from .chats import (
    Chat,
    ChatError,
    FramePart,
    Said,
    chat_story,
    check_messages,
    dialogue_of,
    frame_of,
    identify,
)
from .errors import TooLarge

#: the messages one request may hold: twice the longest story ctx is built for (100,000), so that
#: one request's assembly (some seconds, the first time) cannot hold the other chats' turns for long
MOST_MESSAGES = 200_000
#: how deep a field serve passes on may nest (a JSON schema of tools is some ten levels deep)
MOST_NESTING = 100


@dataclass(frozen=True)
class Request:
    """A chat request, parsed and checked: which chat, its frame, its dialogue (user and assistant
    messages, `chats.said`), the reply's reserve, and the body as it came."""

    body: dict[str, Any]
    chat: Chat
    frame: tuple[FramePart, ...]
    max_tokens: int | None
    dialogue: Sequence[Said] = ()

    @property
    def messages(self) -> int:
        return len(self.body["messages"])


def parse(body: dict[str, Any], headers: Mapping[str, str], serve: ServeSettings) -> Request:
    """Every check of a chat request, before any state changes: its size, the fields passed on,
    each of its messages, its reply's reserve; then which chat it is (`chats.identify`)."""
    given = body.get("messages")
    if isinstance(given, list) and len(given) > MOST_MESSAGES:
        raise TooLarge(f"a chat of {len(given):,} messages; serve takes at most {MOST_MESSAGES:,} a request")
    for key, value in body.items():  # what is passed on as it came is encoded again: bounded first
        if key != "messages" and nested_past(value, MOST_NESTING):
            raise ChatError(f"{key}: nested more than {MOST_NESTING} levels deep; no chat request is")
    check_messages(body)
    reserve = max_tokens(body)
    opening = max(2, serve.chat_messages)  # two at least: one is a probe
    chat = identify(chat_story(body, most=opening), body, headers, serve.chat_messages)
    return Request(body, chat, frame_of(body), reserve, dialogue_of(body))


def max_tokens(body: Mapping[str, Any]) -> int | None:
    """The reply's reserve the request asks for (`max_tokens`, or OpenAI's newer name)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ChatError(f"{key}: expected a whole number of tokens ≥ 0")
        return value
    return None


def nested_past(value: Any, most: int) -> bool:
    """Whether `value` nests lists and objects more than `most` levels deep (walked without
    recursion: a decoder lets some thousand levels through, the encoder of the request sent on
    does not)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > most:
                    return True
                stack.append((child, depth + 1))
    return False
