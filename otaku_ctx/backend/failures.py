"""What can go wrong talking to the model server: one exception a failure, each one line that
names the URL asked, what happened and what to do, and `classify`, which reads an error reply
(its status and the server's own words) into the right one."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from ..errors import OtakuError
from ..jsonload import MAX_ITEMS, JSONProblem, loads

#: the longest piece of the server's own message quoted in ours
QUOTE = 240
#: what a reply nested past Python's recursion limit is (`json` raises RecursionError on one)
TOO_DEEP = "a reply whose JSON nests too deep to read (thousands of brackets inside each other)"
#: what a reply holding more JSON items than any answer is (`[{},{},…]` to the 64 MiB cap)
TOO_MANY = (
    f"a reply whose JSON holds more than {MAX_ITEMS:,} items (values, keys and containers); no answer holds so many"
)


class BackendError(OtakuError):
    """The model server did not do what was asked. `url` is the endpoint asked (never a key)."""

    remedy = "see the server's log"

    def __init__(self, url: str, problem: str, remedy: str | None = None, *, status: int | None = None) -> None:
        self.url = url
        self.problem = problem
        self.status = status
        if remedy is not None:
            self.remedy = remedy
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.url}: {self.problem}: {self.remedy}"


class BadURL(BackendError):
    """A URL no request can be sent to: not http(s), no host, a port out of range or not a
    number, a broken IPv6 host, a host label over 63 characters. Shown without its credentials."""

    remedy = "give one like http://127.0.0.1:8080/v1"


class Unreachable(BackendError):
    """No connection: refused, no such host, a reset, or no answer to the connect."""

    remedy = "start the server, or check the URL"


class TimedOut(BackendError):
    """Connected, but the reply did not come within the timeout (not retried: the server may
    still be working on it, and asking again doubles its load)."""

    remedy = "raise the timeout, or ask for less (a shorter prompt, fewer tokens)"


class Cancelled(BackendError):
    """The request was stopped on purpose, from another thread (`transport.Cancel`): its
    connection closed, which stops the server generating. Never retried."""

    remedy = "it is asked again when there is time"


class KeyMissing(BackendError):
    """The environment variable named for the API key is not set."""


class Refused(BackendError):
    """401 or 403: the server wants a key, or another one."""


class ModelNotFound(BackendError):
    """The server has no model of the name asked for."""


class ContextTooLong(BackendError):
    """The prompt does not fit the model's context, as the server counted it."""

    remedy = "send a shorter prompt, or start the server with a larger context"

    def __init__(
        self, url: str, problem: str, *, status: int | None, prompt_tokens: int | None, window: int | None
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.window = window
        super().__init__(url, problem, status=status)


class FormatRefused(BackendError):
    """The server does not take the `response_format` asked for: the caller asks again without it."""

    remedy = "ask without response_format"


class ServerBusy(BackendError):
    """429 or 503 still, after every retry."""

    remedy = "wait and run again, or send fewer requests at once"


class ServerError(BackendError):
    """Any other error reply: a 500, a 400 the server explains, a redirect, a missing endpoint."""


class NoTokenizer(BackendError):
    """The server has no tokenize endpoint ctx can ask (Ollama, an OpenAI-compatible gateway),
    or the one it had is gone."""

    remedy = "count with the model's own file instead (--tokenizer a GGUF file or a tokenizer.json)"


class BadReply(BackendError):
    """A reply that is not what the API sends: not JSON, a web page, cut short, no choices."""

    remedy = "check that the URL is the server's OpenAI-compatible API (it usually ends in /v1)"


class ServerSays(NamedTuple):
    """What an error body says, in the shapes servers use: OpenAI's and llama.cpp's
    `{"error": {"message", "type", "code", …}}`, Ollama's `{"error": "…"}`, FastAPI's
    `{"detail": …}` (llama-cpp-python, TabbyAPI), vLLM's older `{"object": "error", "message"}`."""

    message: str
    type: str
    code: str
    fields: dict[str, Any]


def what_the_server_said(body: bytes) -> ServerSays:
    text = body.decode("utf-8", "replace")
    try:
        data = loads(text, surrogates=True)
    except JSONProblem:  # not JSON, or JSON past reading (too deep, too many items): its words as they are
        return ServerSays(one_line(text), "", "", {})
    if not isinstance(data, dict):
        return ServerSays(one_line(text), "", "", {})
    error = data.get("error", data)
    if isinstance(error, dict):
        message = error.get("message", error.get("detail", ""))
        return ServerSays(
            one_line(message if isinstance(message, str) else json.dumps(message)),
            str(error.get("type") or ""),
            str(error.get("code") or ""),
            error,
        )
    return ServerSays(one_line(error if isinstance(error, str) else json.dumps(error)), "", "", data)


_WORD = re.compile(r"\S+")


def one_line(text: str) -> str:
    """The server's words on one line, cut at `QUOTE` characters. Only the words shown are
    looked at: an error body may be 64 MiB of them."""
    words, size = [], 0
    for found in _WORD.finditer(text):
        start = found.start()
        words.append(text[start : min(found.end(), start + QUOTE + 1)])
        size += len(words[-1]) + 1
        if size > QUOTE + 1:  # the words so far are past QUOTE: the rest is cut anyway
            break
    text = " ".join(words)
    return text if len(text) <= QUOTE else text[: QUOTE - 1] + "…"


_TOO_LONG = re.compile(
    r"context (length|size|window)|maximum context|too many tokens|(prompt|input) is too long|max_seq_len"
    r"|exceeds? the (available )?context",
    re.IGNORECASE,
)
_MAX_CONTEXT = re.compile(r"maximum context length is (\d+)", re.IGNORECASE)
_FORMAT = re.compile(r"response_format|json_schema|json_object|\bschema\b|grammar", re.IGNORECASE)
_NO_MODEL = re.compile(r"model\b.*\b(not found|does not exist|not exist|unknown|no such)", re.IGNORECASE)


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def classify(
    url: str,
    status: int,
    reason: str,
    body: bytes,
    *,
    model: str,
    refused_remedy: str,
    asked_format: bool = False,
    retries: int = 0,
    location: str = "",
) -> BackendError:
    """The error for an error reply: what its status and the server's words say."""
    said = what_the_server_said(body)
    problem = f"{status} {reason}".strip() + (f": {said.message}" if said.message else "")
    if 300 <= status < 400:
        return ServerError(
            url,
            f"{problem} (redirected to {location or 'nowhere said'})",
            "name that URL instead: ctx follows no redirects",
            status=status,
        )
    if status in (401, 403):
        return Refused(url, problem, refused_remedy, status=status)
    if status in (429, 503):
        return ServerBusy(url, f"{problem} (after {retries} retries)", status=status)
    if (
        said.type == "exceed_context_size_error"
        or said.code == "context_length_exceeded"
        or _TOO_LONG.search(said.message)
    ):
        window = _integer(said.fields.get("n_ctx"))
        if window is None and (found := _MAX_CONTEXT.search(said.message)):
            window = int(found.group(1))
        return ContextTooLong(
            url, problem, status=status, prompt_tokens=_integer(said.fields.get("n_prompt_tokens")), window=window
        )
    if asked_format and status in (400, 422, 500, 501) and _FORMAT.search(said.message):
        return FormatRefused(url, problem, status=status)
    names_model = said.code == "model_not_found" or bool(_NO_MODEL.search(said.message))
    if status == 404 and model and model.lower() in said.message.lower():
        names_model = (
            True  # Ollama's `model "x" not found, try pulling it first`, vLLM's "The model `x` does not exist."
        )
    if status in (400, 404) and names_model:
        return ModelNotFound(url, problem, f"check the model name ({model!r} was asked for)", status=status)
    if status in (404, 405):
        return ServerError(
            url,
            problem,
            "check the URL: it should be the server's OpenAI-compatible base, usually ending in /v1",
            status=status,
        )
    return ServerError(url, problem, status=status)
