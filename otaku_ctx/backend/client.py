"""`Backend`: the user's model server, spoken to in the OpenAI-compatible dialect (llama.cpp's
server, KoboldCpp, Ollama, vLLM, TabbyAPI, LM Studio, OpenRouter, OpenAI). Every request ctx
makes of a model server is made here; the summarizer and a server-backed token counter call
these methods and never build a request themselves."""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar
from urllib.parse import urlsplit

from .failures import BackendError, BadReply, KeyMissing, NoTokenizer, classify
from .servers import (
    KOBOLD_LIMIT,
    KOBOLDCPP,
    LLAMA_CPP,
    OLLAMA,
    TABBYAPI,
    VLLM,
    Server,
    tokenize_request,
    tokens_counted,
)
from .transport import Answer, Retry, Transport


@dataclass(frozen=True)
class Reply:
    """A chat completion: the text, why it stopped (`"stop"`, `"length"`, …), and the tokens the
    server counted, when it says (`usage`)."""

    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None = None

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


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class Backend:
    """One model on one server. `url` is the OpenAI-compatible base (`http://127.0.0.1:8080/v1`);
    `api_key_env` is the NAME of the environment variable holding the key (none: no key sent).
    `timeout` bounds the wait for each reply, `connect_timeout` the wait for a connection.
    Safe to share between threads: each request has its own connection."""

    #: the requests every Backend of this process sent, by kind: what a test of a whole
    #: command run in-process reads (the Backend it made is not in reach)
    asked_in_process: ClassVar[Counter[str]] = Counter()

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
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise BackendError(url, "not a server's base URL", "give one like http://127.0.0.1:8080/v1")
        self.base = parts.path.rstrip("/")
        # llama.cpp's /props and /tokenize and Ollama's /api/show sit beside /v1, not under it
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        self.url = f"{parts.scheme}://{parts.netloc}{self.base}"
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
        self._tokenizes: bool | None = None
        self._server: Server | None = None
        # the requests sent, by kind ("chat", "tokenize", "probe"): a test or a benchmark reads
        # how many of each a run made (a rebuild from the count cache makes no "tokenize")
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
    ) -> Reply:
        """One chat completion (`POST {url}/chat/completions`, not streamed). `extra` adds the
        server's own fields (`repeat_penalty`, `top_k`, …). When the server refuses
        `response_format` this raises `FormatRefused`, so the caller can ask again without it."""
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
        path = f"{self.base}/chat/completions"
        answer = self._send("chat", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"))
        data = self._json(answer, path, asked_format=response_format is not None)
        return self._reply(data, path, asked_format=response_format is not None)

    def window(self) -> int | None:
        """The model's context in tokens, as the server says it (asked once, then remembered):
        vLLM's `GET /v1/models` `max_model_len`, llama.cpp's `GET /props`
        `default_generation_settings.n_ctx` (per slot: `-c` / `-np`; TabbyAPI answers the same
        with its `max_seq_len`), Ollama's `POST /api/show` (`num_ctx` of its parameters, else
        the model's `*.context_length`), KoboldCpp's `GET /api/extra/true_max_context_length`.
        When `server()` has asked already, its window. None when no server of those kinds
        answers."""
        if self._window is None and self._server is not None and self._server.window:
            self._window = self._server.window
        if self._window is None:
            for probe in (self._vllm_window, self._llama_window, self._ollama_window, self._kobold_window):
                found = probe()
                if found:
                    self._window = found
                    break
        return self._window

    def server(self) -> Server:
        """What the server is (asked once, then remembered; see `servers.Server`): a few GETs,
        each answered or not by one kind of server, in this order — llama.cpp's `/props` (with
        its `model_path`; TabbyAPI answers a `/props` without one), KoboldCpp's
        `/api/extra/version`, TabbyAPI's `/v1/model`, vLLM's `/v1/models` (`max_model_len`),
        Ollama's `/api/version`. A server that is down raises `Unreachable` here."""
        if self._server is None:
            for probe in (self._llama_server, self._kobold_server, self._tabby_server, self._vllm_server):
                found = probe()
                if found is not None:
                    self._server = found
                    break
            else:
                self._server = self._ollama_server() or Server("", self.model, f"?|{self.url}|{self.model}")
        return self._server

    def count(self, text: str, *, add_special: bool = False) -> int:
        """The number of tokens the server makes of `text` through its own tokenize endpoint,
        the special tokens spelled in it parsed as the server parses a prompt; BOS (and what
        else the server adds to a whole prompt) only when `add_special`. Raises `NoTokenizer`
        when the server has no such endpoint, and the transport's errors when it does not
        answer: never a guess."""
        server = self.server()
        where = f"{self.transport.url(self.root)}"
        if not server.counts:
            named = (
                f"{server.kind} ({server.model})"
                if server.kind
                else "this server (not llama.cpp, vLLM, KoboldCpp or TabbyAPI)"
            )
            raise NoTokenizer(where, f"{named} has no tokenize endpoint ctx can ask")
        path, request = tokenize_request(server.kind, self.root, server.model, text, add_special=add_special)
        answer = self._send("tokenize", "POST", path, json.dumps(request, ensure_ascii=False).encode("utf-8"))
        url = self.transport.url(path)
        if answer.status in (404, 405, 501):
            raise NoTokenizer(url, f"{server.kind} answers {answer.status} to its tokenize endpoint")
        data = self._json(answer, path, asked_format=False)
        counted = tokens_counted(server.kind, data)
        if counted is None:
            raise BadReply(url, f"no token count in {server.kind}'s tokenize reply")
        if counted == 0 and text and server.kind == KOBOLDCPP:
            raise BadReply(
                url,
                f"KoboldCpp counted 0 tokens of {len(text):,} characters (it counts no text of"
                f" {KOBOLD_LIMIT:,} tokens or more)",
                "count with the model's own file instead (--tokenizer a GGUF file)",
            )
        return counted

    def tokenize(self, text: str) -> list[int] | None:
        """The model's own tokens for `text` (llama.cpp's `POST /tokenize`, special tokens read as
        plain text, no BOS added); None when the server has no such endpoint (asked once)."""
        if self._tokenizes is False:
            return None
        body = json.dumps({"content": text, "add_special": False, "parse_special": False}, ensure_ascii=False)
        data = self._probe("POST", f"{self.root}/tokenize", body.encode("utf-8"), kind="tokenize")
        tokens = data.get("tokens") if data is not None else None
        if not isinstance(tokens, list) or not all(_integer(t) is not None for t in tokens):
            if self._tokenizes:  # it tokenized before: this answer is broken, not missing
                raise BadReply(self.transport.url(f"{self.root}/tokenize"), "no list of token ids in the reply")
            self._tokenizes = False
            return None
        self._tokenizes = True
        return tokens

    # the window probes --------------------------------------------------------------------------

    def _vllm_window(self) -> int | None:
        found = self._vllm_server()
        return found.window if found is not None else None

    def _llama_window(self) -> int | None:
        data = self._probe("GET", f"{self.root}/props")
        settings = data.get("default_generation_settings") if data is not None else None
        return _integer(settings.get("n_ctx")) if isinstance(settings, dict) else None

    def _ollama_window(self) -> int | None:
        data = self._probe("POST", f"{self.root}/api/show", json.dumps({"model": self.model}).encode("utf-8"))
        if data is None:
            return None
        parameters = data.get("parameters")
        if isinstance(parameters, str) and (found := re.search(r"^\s*num_ctx\s+(\d+)", parameters, re.MULTILINE)):
            return int(found.group(1))
        info = data.get("model_info")
        if not isinstance(info, dict):
            return None
        sizes = [_integer(v) for k, v in info.items() if isinstance(k, str) and k.endswith(".context_length")]
        return next((size for size in sizes if size), None)

    def _kobold_window(self) -> int | None:
        data = self._probe("GET", f"{self.root}/api/extra/true_max_context_length")
        return _integer(data.get("value")) or None if data is not None else None

    # the server probes --------------------------------------------------------------------------

    def _llama_server(self) -> Server | None:
        props = self._probe("GET", f"{self.root}/props")
        settings = props.get("default_generation_settings") if props is not None else None
        path = props.get("model_path") if props is not None else None
        if props is None or not isinstance(settings, dict) or not isinstance(path, str) or not path:
            return None
        models = self._probe("GET", f"{self.base}/models")
        listed = models.get("data") if models is not None else None
        meta = (
            listed[0].get("meta")
            if isinstance(listed, list) and len(listed) == 1 and isinstance(listed[0], dict)
            else None
        )
        if isinstance(meta, dict):  # what the file is, not how the server runs it
            meta = {key: value for key, value in meta.items() if key != "n_ctx"}
        build = props.get("build_info")
        identity = json.dumps(
            [LLAMA_CPP, path, meta if isinstance(meta, dict) else None, build if isinstance(build, str) else None],
            sort_keys=True,
        )
        bos, eos = props.get("bos_token"), props.get("eos_token")
        return Server(
            LLAMA_CPP,
            path.replace("\\", "/").rsplit("/", 1)[-1],
            identity,
            window=_integer(settings.get("n_ctx")) or None,
            bos=bos if isinstance(bos, str) else "",
            eos=eos if isinstance(eos, str) else "",
        )

    def _kobold_server(self) -> Server | None:
        version = self._probe("GET", f"{self.root}/api/extra/version")
        if version is None or version.get("result") != "KoboldCpp":
            return None
        named = self._probe("GET", f"{self.root}/api/v1/model")
        model = named.get("result") if named is not None else None
        model = model.removeprefix("koboldcpp/") if isinstance(model, str) else ""
        identity = json.dumps([KOBOLDCPP, str(version.get("version")), model])
        return Server(KOBOLDCPP, model, identity, window=self._kobold_window())

    def _tabby_server(self) -> Server | None:
        card = self._probe("GET", f"{self.root}/v1/model")
        parameters = card.get("parameters") if card is not None else None
        if card is None or not isinstance(parameters, dict) or "max_seq_len" not in parameters:
            return None
        model = str(card.get("id") or "")
        return Server(
            TABBYAPI, model, json.dumps([TABBYAPI, model]), window=_integer(parameters["max_seq_len"]) or None
        )

    def _vllm_server(self) -> Server | None:
        data = self._probe("GET", f"{self.base}/models")
        models = data.get("data") if data is not None else None
        if not isinstance(models, list):
            return None
        sized = [m for m in models if isinstance(m, dict) and _integer(m.get("max_model_len"))]
        mine = [m for m in sized if m.get("id") == self.model] or (sized if len(sized) == 1 else [])
        if not mine:
            return None
        model = str(mine[0].get("id") or "")
        identity = json.dumps([VLLM, model, str(mine[0].get("root") or "")])
        return Server(VLLM, model, identity, window=_integer(mine[0]["max_model_len"]))

    def _ollama_server(self) -> Server | None:
        data = self._probe("GET", f"{self.root}/api/version")
        if data is None or not isinstance(data.get("version"), str):
            return None
        return Server(OLLAMA, self.model, json.dumps([OLLAMA, self.model]))

    def _send(self, kind: str, method: str, path: str, body: bytes | None = None) -> Answer:
        with self._asking:
            self.asked[kind] += 1
            Backend.asked_in_process[kind] += 1
        return self.transport.send(method, path, body)

    def _probe(
        self, method: str, path: str, body: bytes | None = None, *, kind: str = "probe"
    ) -> dict[str, Any] | None:
        """A request whose answer may rightly be "no such thing here" (this server is of another
        kind): None for a 4xx other than 401/403/429, a 5xx other than 503, or a reply that is
        not a JSON object. Unreachable, timed out, refused and busy still raise."""
        answer = self._send(kind, method, path, body)
        if answer.status in (401, 403, 429, 503):
            raise self._error(answer, path)
        if not 200 <= answer.status < 300:
            return None
        try:
            data = json.loads(answer.body)
        except ValueError:
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
        kind = answer.content_type
        if kind and kind != "application/json" and not kind.endswith("+json"):
            raise BadReply(url, f"a reply of type {kind}, not JSON")
        try:
            data = json.loads(answer.body)
        except ValueError as error:
            raise BadReply(url, f"a reply that is not JSON ({error})") from None
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
            text=content or "",
            finish_reason=reason if isinstance(reason, str) else None,
            prompt_tokens=_integer(usage.get("prompt_tokens")),
            completion_tokens=_integer(usage.get("completion_tokens")),
            model=model if isinstance(model, str) else None,
        )
