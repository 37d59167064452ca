"""`Backend`: the user's model server, spoken to in the OpenAI-compatible dialect (llama.cpp's
server, KoboldCpp, Ollama, vLLM, TabbyAPI, LM Studio, OpenRouter, OpenAI). Every request ctx
makes of a model server is made here; the summarizer and a server-backed token counter call
these methods and never build a request themselves."""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import quote

from ..jsonload import JSONProblem, TooDeep, TooMany, loads
from .failures import TOO_DEEP, TOO_MANY, BackendError, BadReply, BadURL, KeyMissing, NoTokenizer, classify
from .servers import LLAMA_CPP, MOST_WINDOW, OLLAMA, OPENAI, SERVERS, WINDOWS, LlamaCpp, Server, ServerKind
from .transport import Answer, Cancel, Retry, Transport, split_url, without_credentials


@dataclass(frozen=True)
class Reply:
    """A chat completion: the text, why it stopped (`"stop"`, `"length"`, …), and the tokens the
    server counted, when it says (`usage`)."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None = None
    url: str = ""  # the endpoint that answered, as a message may name it

    @property
    def cut_off(self) -> bool:
        """The reply stopped at `max_tokens`, not where the model meant to end it."""
        return self.finish_reason == "length"


def user_agent() -> str:
    try:
        version = metadata.version("otaku-ctx")
    except metadata.PackageNotFoundError:
        version = "dev"
    return f"otaku-ctx/{version} (ctx; Python http.client)"


_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(text: str) -> str:
    """`text` with each lone surrogate (JSON's `\\ud800` with no pair: not Unicode, and no
    UTF-8 file can hold it) replaced by U+FFFD, so a broken reply never reaches a file."""
    return _SURROGATE.sub("\ufffd", text)


def decoded(body: bytes, url: str) -> Any:
    """A reply's JSON, by the one guarded reader: JSON past what any reply holds (nested past
    reading, more items than `jsonload.MAX_ITEMS`) is a `BadReply` naming `url`, refused
    before it is decoded; JSON that is only broken is the caller's `JSONProblem`. A lone
    surrogate escape is kept, for `unicode_text` to replace."""
    try:
        return loads(body, surrogates=True)
    except TooDeep:
        raise BadReply(url, TOO_DEEP) from None
    except TooMany:
        raise BadReply(url, TOO_MANY) from None


#: the most numbers an embedding may have (the largest models' are 4,096 to 8,192)
MOST_DIMENSIONS = 16_384


def vectors_of(data: dict[str, Any], listed: str, wanted: int, url: str) -> list[list[float]]:
    """The vectors of an embeddings reply: OpenAI's `data` (each `{"embedding": […], "index": i}`,
    put in `index` order) or Ollama's `embeddings` (a list of lists); `BadReply` unless there
    are `wanted` of them, each a list of the same number of finite numbers."""
    found = data.get(listed)
    if not isinstance(found, list) or len(found) != wanted:
        count = len(found) if isinstance(found, list) else "no"
        raise BadReply(url, f"an embeddings reply with {count} vectors for {wanted} texts")
    if listed == "data":
        if not all(isinstance(item, dict) for item in found):
            raise BadReply(url, "an embeddings reply whose data are not objects")
        order = [item.get("index", n) for n, item in enumerate(found)]
        if sorted(o for o in order if isinstance(o, int)) != list(range(wanted)):
            raise BadReply(url, "an embeddings reply whose indexes are not 0 to n - 1")
        found = [item.get("embedding") for _, item in sorted(zip(order, found, strict=True), key=lambda p: p[0])]
    vectors: list[list[float]] = []
    for vector in found:
        if not isinstance(vector, list) or not 0 < len(vector) <= MOST_DIMENSIONS:
            raise BadReply(url, "an embedding that is not a list of 1 to 16,384 numbers")
        if vectors and len(vector) != len(vectors[0]):
            raise BadReply(url, f"embeddings of {len(vectors[0])} and {len(vector)} numbers in one reply")
        if not all(type(x) in (int, float) and math.isfinite(x) for x in vector):
            raise BadReply(url, "an embedding holding something other than a finite number (NaN, text)")
        vectors.append([float(x) for x in vector])
    return vectors


def _names(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class Backend:
    """One model on one server. `url` is the OpenAI-compatible base (`http://127.0.0.1:8080/v1`);
    `api_key_env` is the NAME of the environment variable holding the key (none: no key sent).
    `timeout` bounds the wait for each reply, `connect_timeout` the wait for a connection.
    Safe to share between threads: each request has its own connection. What kind of server it
    is (`servers.SERVERS`) is asked once, when a window, a count or the server is wanted."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout: float = 300.0,
        connect_timeout: float = 10.0,
        retry: Retry | None = None,
    ) -> None:
        try:
            parts = split_url(url.strip())
            if parts.query or parts.fragment:
                raise ValueError("a ?query or #fragment in it")
        except ValueError as problem:
            shown = without_credentials(url.strip())
            shown = shown if len(shown) <= 200 else shown[:199] + "…"
            raise BadURL(shown, f"not a server's base URL ({problem})") from None
        self.base = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=~")
        # llama.cpp's /props and /tokenize and Ollama's /api/show sit beside /v1, not under it
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        # the URL as every message shows it: a `user:password@` in it is never printed
        self.url = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{self.base}"
        self.model = model
        self.api_key_env = api_key_env
        headers = {"User-Agent": user_agent(), "Accept": "application/json", "Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env, "").strip()
            if not key:
                raise KeyMissing(self.url, f"${api_key_env} is not set", f"export the API key in ${api_key_env}")
            headers["Authorization"] = f"Bearer {key}"
        self.transport = Transport(
            parts, timeout=timeout, connect_timeout=connect_timeout, headers=headers, retry=retry or Retry()
        )
        self._window: int | None = None
        self._windowless = False  # every kind of `WINDOWS` was asked and none said: not asked again
        self._window_said: ServerKind | None = None  # the kind whose endpoint said it
        self._tokenizes: bool | None = None
        self._templates: bool | None = None  # whether the server applies its chat template on request
        self._separators: dict[str, list[int]] = {}  # a separator's ids (`count_each`), asked once
        self._server: tuple[ServerKind, Server] | None = None
        self._models: tuple[str, ...] | None = None
        # the requests sent, by what they ask ("chat", "tokenize", "probe"): a test or a benchmark
        # reads how many of each a run made (a rebuild from the count cache makes no "tokenize")
        self.asked: Counter[str] = Counter()
        self._asking = threading.Lock()

    # the requests -------------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        response_format: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        cancel: Cancel | None = None,
    ) -> Reply:
        """One chat completion (`POST {url}/chat/completions`, not streamed). `extra` adds the
        server's own fields (`repeat_penalty`, `top_k`, …). When the server refuses
        `response_format` this raises `FormatRefused`, so the caller can ask again without it.
        `cancel`: stopped from another thread, the request ends at once in `Cancelled`."""
        request: dict[str, Any] = dict(extra or {})
        request.update(
            model=self.model,
            messages=[dict(message) for message in messages],
            max_tokens=max_tokens,
            temperature=temperature,
            stream=False,
        )
        if response_format is not None:
            request["response_format"] = dict(response_format)
        # a chat detects nothing: a server not yet asked what it is is spoken to as OpenAI's API
        kind = self._server[0] if self._server is not None else SERVERS[OPENAI]
        path = kind.chat_path(self.base)
        answer = self._send("chat", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"), cancel)
        data = self._json(answer, path, asked_format=response_format is not None)
        return self._reply(data, path, asked_format=response_format is not None)

    def embed(self, texts: Sequence[str], *, cancel: Cancel | None = None) -> list[list[float]]:
        """The model's embedding of each text, in order: `POST {url}/embeddings` (OpenAI's, and
        llama.cpp's `--embeddings`, vLLM's, TabbyAPI's), or Ollama's `/api/embed` when the URL
        is not a `/v1` base and the server is Ollama. Raises `BadReply` unless every vector is
        there, of one length, every number finite."""
        request = {"model": self.model, "input": list(texts)}
        if not self.base.endswith("/v1") and self._detected()[0].name == OLLAMA:
            path, listed = f"{self.root}/api/embed", "embeddings"
        else:
            path, listed = f"{self.base}/embeddings", "data"
            request["encoding_format"] = "float"
        answer = self._send("embed", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"), cancel)
        return vectors_of(self._json(answer, path, asked_format=False), listed, len(texts), self.transport.url(path))

    def window(self) -> int | None:
        """The model's context in tokens, as the server says it (asked once, then remembered;
        Ollama's each time, as it loads a model again at another window whenever a request's
        `num_ctx` differs: a reload is seen by the next turn):
        when `server()` has asked already, its window; else each kind of `servers.WINDOWS`
        asked in turn (vLLM's `/v1/models`, llama.cpp's `/props`, Ollama's `/api/show` and
        `/api/ps`, KoboldCpp's `/api/extra/true_max_context_length`). None when none of them
        answers, and that is remembered too: a server that says no window is not asked four
        times again on every call (serve calls once a turn). A server that was unreachable is
        asked again."""
        if self._window is None and self._server is not None and self._server[1].window:
            self._window = self._server[1].window
        said = self._window_said
        if said is not None and said.reloads:  # asked each time: its model may have been loaded again
            self._window = said.window(self) or self._window
        if self._window is None and not self._windowless:
            for kind in WINDOWS:
                found = kind.window(self)
                if found:
                    self._window, self._window_said = found, kind
                    break
            self._windowless = self._window is None
        if self._window is not None and self._window > MOST_WINDOW:
            raise BadReply(
                self.transport.url(self.root),
                f"it says its window is {self._window:,} tokens, past any model's ({MOST_WINDOW:,})",
                "check the server's context setting, or set [model] window and count with a tokenizer of your own",
            )
        return self._window

    def models(self) -> tuple[str, ...] | None:
        """The names of the models the server lists (`GET {url}/models`: each one's `id`, and its
        `aliases` where llama.cpp gives them), asked once: None when it lists none — no such
        endpoint, an answer that is no list, an empty list — since then a chat is the only way
        to learn whether it has the model."""
        if self._models is None:
            data = self.probe("GET", f"{self.base}/models", what="models")
            listed = data.get("data") if data is not None else None
            entries = [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
            # each model's id, and the other names llama.cpp lists it by (`aliases`)
            ids = [name for m in entries for name in (m.get("id"), *_names(m.get("aliases")))]
            self._models = tuple(dict.fromkeys(unicode_text(i) for i in ids if isinstance(i, str) and i.strip()))
        return self._models or None

    def loop_penalty(self) -> dict[str, float]:
        """The request fields that keep this server's model from repeating itself
        (`ServerKind.loop_penalty`): what a reply that looped is asked again with."""
        return dict(self._detected()[0].loop_penalty)

    def server(self) -> Server:
        """What the server is (asked once, then remembered; see `servers.Server`): each kind of
        `servers.SERVERS` asked in turn whether the server is one, a few GETs each answered by
        one kind only. A server that is down raises `Unreachable` here."""
        return self._detected()[1]

    def count(self, text: str, *, add_special: bool = False) -> int:
        """The number of tokens the server makes of `text` through its own tokenize endpoint,
        the special tokens spelled in it parsed as the server parses a prompt; BOS (and what
        else the server adds to a whole prompt) only when `add_special`. Raises `NoTokenizer`
        when the server has no such endpoint, and the transport's errors when it does not
        answer: never a guess."""
        kind, server = self._detected()
        if not kind.counts:
            raise NoTokenizer(
                self.transport.url(self.root), f"{kind.described(server)} has no tokenize endpoint ctx can ask"
            )
        path, request = kind.tokenize_request(self.root, server.model, text, add_special=add_special)
        answer = self._send("tokenize", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"))
        url = self.transport.url(path)
        if answer.status in (404, 405, 501):
            raise NoTokenizer(url, f"{kind.name} answers {answer.status} to its tokenize endpoint")
        return kind.counted(self._json(answer, path, asked_format=False), text, url)

    def count_each(self, texts: Sequence[str], separator: str) -> list[int] | None:
        """Each of `texts`' counts (as `count` gives them) from one tokenize request: the texts
        joined by `separator`, a control token of the model (its EOS). llama.cpp cuts a text at
        its control tokens before it tokenizes the pieces between them, each as a text of its
        own (`tokenizer_st_partition`), so each piece between two separators counts as its text
        alone. None where that cannot be read so: a server other than llama.cpp, a separator
        that is not one token, a text that holds it, an answer not one piece a text. Whether the
        server strips the blanks beside the separator (a control token's `lstrip`) is for the
        caller to try once (`model.server.ServerCounter`)."""
        kind, server = self._detected()
        if kind.name != LLAMA_CPP or not separator or any(separator in text for text in texts):
            return None
        marks = self._separators.get(separator)
        if marks is None:
            marks = self._separators[separator] = self._tokens(kind, server, separator) or []
        if len(marks) != 1:
            return None
        tokens = self._tokens(kind, server, separator.join(texts))
        if tokens is None:
            return None
        counts, run = [], 0
        for token in tokens:
            if token == marks[0]:
                counts.append(run)
                run = 0
            else:
                run += 1
        counts.append(run)
        return counts if len(counts) == len(texts) else None

    def _tokens(self, kind: ServerKind, server: Server, text: str) -> list[int] | None:
        """The ids llama.cpp's `/tokenize` gives `text`, its control tokens parsed, nothing added."""
        path, request = kind.tokenize_request(self.root, server.model, text, add_special=False)
        answer = self._send("tokenize", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"))
        tokens = self._json(answer, path, asked_format=False).get("tokens")
        if not isinstance(tokens, list) or not all(_integer(t) is not None for t in tokens):
            return None
        return tokens

    def chat_count(self, messages: list[dict[str, Any]]) -> int | None:
        """The tokens a chat completion of `messages` gives the model: the prompt the server's
        chat template makes of them, counted with what the server adds to a whole prompt.
        None when the server has no template endpoint (asked once; llama.cpp has one), so the
        caller counts by a rule instead."""
        kind, server = self._detected()
        asked = kind.template_request(self.root, messages) if self._templates is not False else None
        if asked is None:
            return None
        path, request = asked
        answer = self._send("apply-template", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"))
        if answer.status in (404, 405, 501):
            self._templates = False
            return None
        prompt = kind.templated(self._json(answer, path, asked_format=False))
        if prompt is None:
            raise BadReply(self.transport.url(path), f"no prompt in {kind.name}'s template reply")
        self._templates = True
        return self.count(prompt, add_special=True)

    def tokenize(self, text: str) -> list[int] | None:
        """The model's own tokens for `text` (llama.cpp's `POST /tokenize`, special tokens read as
        plain text, no BOS added); None when the server has no such endpoint (asked once)."""
        if self._tokenizes is False:
            return None
        path, request = LlamaCpp().tokenize_request(self.root, self.model, text, add_special=False, parse_special=False)
        body = json.dumps(request, ensure_ascii=False).encode("utf-8")
        data = self.probe("POST", path, body, what="tokenize")
        tokens = data.get("tokens") if data is not None else None
        if not isinstance(tokens, list) or not all(_integer(t) is not None for t in tokens):
            if self._tokenizes:  # it tokenized before: this answer is broken, not missing
                raise BadReply(self.transport.url(path), "no list of token ids in the reply")
            self._tokenizes = False
            return None
        self._tokenizes = True
        return tokens

    # asking ---------------------------------------------------------------------------------------

    def _detected(self) -> tuple[ServerKind, Server]:
        """The server's kind and what it says it is: the first kind in `SERVERS` whose probe
        answers (OpenAI, the last, answers for any server)."""
        if self._server is None:
            self._server = next((kind, found) for kind in SERVERS.values() if (found := kind.probe(self)) is not None)
        return self._server

    def _send(
        self, what: str, method: str, path: str, body: bytes | None = None, cancel: Cancel | None = None
    ) -> Answer:
        with self._asking:
            self.asked[what] += 1
        return self.transport.send(method, path, body, cancel)

    def probe(self, method: str, path: str, body: bytes | None = None, *, what: str = "probe") -> dict[str, Any] | None:
        """A request whose answer may rightly be "no such thing here" (this server is of another
        kind): None for a 4xx other than 401/403/429, a 5xx other than 503, or a reply that is
        not a JSON object. Unreachable, timed out, refused and busy still raise."""
        answer = self._send(what, method, path, body)
        if answer.status in (401, 403, 429, 503):
            raise self._error(answer, path)
        if not 200 <= answer.status < 300:
            return None
        try:
            data = decoded(answer.body, self.transport.url(path))
        except JSONProblem:
            return None
        return data if isinstance(data, dict) else None

    # reading the answers ------------------------------------------------------------------------

    def _error(self, answer: Answer, path: str, *, asked_format: bool = False) -> BackendError:
        if self.api_key_env:
            remedy = f"check the API key in ${self.api_key_env}"
        else:
            remedy = "the server wants an API key: name the environment variable that holds it"
        return classify(
            self.transport.url(path),
            answer.status,
            answer.reason,
            answer.body,
            model=self.model,
            refused_remedy=remedy,
            asked_format=asked_format,
            retries=answer.retries,
            location=answer.headers.get("location", ""),
        )

    def _json(self, answer: Answer, path: str, *, asked_format: bool) -> dict[str, Any]:
        url = self.transport.url(path)
        if not 200 <= answer.status < 300:
            raise self._error(answer, path, asked_format=asked_format)
        typed = answer.content_type
        if typed and typed != "application/json" and not typed.endswith("+json"):
            raise BadReply(url, f"a reply of type {typed}, not JSON")
        try:
            data = decoded(answer.body, url)
        except JSONProblem as error:
            raise BadReply(url, f"a reply that is not JSON ({error.message})") from None
        if not isinstance(data, dict):
            raise BadReply(url, "a reply that is not a JSON object")
        return data

    def _reply(self, data: dict[str, Any], path: str, *, asked_format: bool) -> Reply:
        url = self.transport.url(path)
        choices = data.get("choices")
        if not choices and "error" in data:  # some gateways say "error" with a 200
            said = data["error"]
            code = said.get("code") if isinstance(said, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else 500
            body = json.dumps(data).encode("utf-8")
            raise self._error(Answer(status, "", {}, body, 0), path, asked_format=asked_format)
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BadReply(url, "a reply with no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise BadReply(url, "a reply whose choice has no message")
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        if content is not None and not isinstance(content, str):
            raise BadReply(url, "a reply whose message content is not text")
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        reason = choice.get("finish_reason")
        model = data.get("model")
        return Reply(
            text=unicode_text(content or ""),
            finish_reason=reason if isinstance(reason, str) else None,
            prompt_tokens=_integer(usage.get("prompt_tokens")),
            completion_tokens=_integer(usage.get("completion_tokens")),
            model=unicode_text(model) if isinstance(model, str) else None,
            url=url,
        )
