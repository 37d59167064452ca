"""What each turn sent and what the backend says it reused: the one log line a turn, and
`GET /ctx/stats` (the turns are kept on each chat's session). Counts only, never a chat's text."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..jsonload import JSONProblem, loads


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass
class Usage:
    """What the backend reports of a reply: the prompt's tokens, and how many of them it had
    cached — OpenAI's `usage.prompt_tokens_details.cached_tokens`, llama.cpp's `timings.cache_n`
    (and `prompt_n`, the tokens it processed) or its older `tokens_cached`."""

    prompt_tokens: int | None = None
    cached: int | None = None

    def read(self, data: object) -> None:
        if not isinstance(data, dict):
            return
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _count(usage.get("prompt_tokens")) or self.prompt_tokens
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
                self.cached = _count(details.get("cached_tokens"))
        timings = data.get("timings")
        if isinstance(timings, dict):
            cache_n, prompt_n = _count(timings.get("cache_n")), _count(timings.get("prompt_n"))
            if cache_n is not None:
                self.cached = cache_n
                if prompt_n is not None and self.prompt_tokens is None:
                    self.prompt_tokens = cache_n + prompt_n
        if self.cached is None and _count(data.get("tokens_cached")) is not None:
            self.cached = _count(data.get("tokens_cached"))


class StreamUsage(Usage):
    """`Usage` read from a stream of server-sent events as its bytes pass through."""

    def __init__(self) -> None:
        super().__init__()
        self._pending = b""
        self.finished = False  # the stream's `data: [DONE]` has passed

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            if line[5:].strip() == b"[DONE]":
                self.finished = True
                continue
            try:
                self.read(loads(line[5:], surrogates=True))
            except JSONProblem:
                continue


@dataclass(frozen=True)
class Turn:
    """One chat request: the messages it held, the case, the tokens sent by ctx's count (within
    `limit`), what the backend counted and had cached, ctx's own seconds, and what was recalled
    (by number: never a chat's text)."""

    messages: int
    case: int
    sent: int
    limit: int
    prompt_tokens: int | None
    cached: int | None
    seconds: float
    cancelled: bool = False  # the client went away (SillyTavern's Stop) before the reply ended
    recalled: tuple[str, ...] = ()  # what the newest messages recalled: "message 38", "scene 9"
    messages_sent: int = 0  # of `messages`, those the prompt holds as written (head and tail)
    recall_engine: str = ""  # which recalled: "keywords" or "meaning" ("" none: nothing left out, or off)
    recall_why: str = ""  # why keywords, where [recall] names an embedding model

    @property
    def reprocessed(self) -> int | None:
        if self.cached is None:
            return None
        return max(0, (self.prompt_tokens if self.prompt_tokens is not None else self.sent) - self.cached)

    def facts(self) -> dict[str, Any]:
        return {**asdict(self), "reprocessed": self.reprocessed}
