"""The kinds of model server ctx knows, one class each, and `SERVERS`, the table of them.

A kind says how ctx tells that a server is one of it (`probe`), how it asks it the model's
window, and how it asks it for a token count and a chat reply; `Backend` sends what the kind
says and reads the answer with it. Adding a kind is one class here and a line in `SERVERS`
(and in `WINDOWS` when its window can be asked before the kind is known).

What ctx needs of a tokenize endpoint is the same everywhere: the number of tokens the server
makes of a text when it parses the special tokens spelled in it (as it does a prompt) and adds
no BOS, and what it adds to a whole prompt. Each kind offers it its own way:

- llama.cpp: `POST /tokenize` `{"content", "add_special", "parse_special": true}` → `tokens`;
  and `POST /apply-template` `{"messages"}` → `prompt`, the chat as its template gives it to
  the model, so a chat's count is the prompt's own (`Backend.chat_count`).
- KoboldCpp: `POST /api/extra/tokencount` `{"prompt", "special"}` → `value`; its `special` is
  whether to add BOS, and it always parses special tokens. It answers `value` 0 for a text of
  50,000 tokens or more (its guard), which is refused here, never taken for a count.
- TabbyAPI: `POST /v1/token/encode` `{"text", "add_bos_token", "encode_special_tokens": true}`
  → `length`.
- vLLM: `POST /tokenize` `{"model", "prompt", "add_special_tokens"}` → `count` (and `tokens`);
  a Hugging Face tokenizer matches its added tokens in the text, so specials are parsed.

All four sit at the server's root, beside `/v1` (TabbyAPI's under `/v1` of that root). Ollama
has no tokenize endpoint (ctx reads the GGUF blob it serves instead: `model/ollama`), nor has a
plain OpenAI-compatible server (OpenAI, OpenRouter, LM Studio, a gateway). Every kind answers
a chat at `{base}/chat/completions`, Ollama's too (its OpenAI-compatible `/v1`).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from .failures import BadReply

LLAMA_CPP = "llama.cpp"
KOBOLDCPP = "KoboldCpp"
TABBYAPI = "TabbyAPI"
VLLM = "vLLM"
OLLAMA = "Ollama"
OPENAI = "OpenAI"

#: KoboldCpp counts no text of this many tokens or more: it answers 0 (koboldcpp.py's guard)
KOBOLD_LIMIT = 50_000
#: the window Ollama loads a model at when nothing sets one, below 24 GiB of VRAM (its
#: docs/context-length.mdx); `OLLAMA_CONTEXT_LENGTH` or more VRAM make it larger
OLLAMA_WINDOW = 4096


@dataclass(frozen=True)
class Server:
    """What a model server is, as it says: its `kind` (the name of its kind in `SERVERS`;
    `OpenAI` when it is none of the others), its `model` as it names it (llama.cpp: the model
    file's name), the `identity` of the model and tokenizer it serves (what the count cache is
    keyed by: a changed model file, a changed server build, changes it), its `window` (the
    context one request gets, when it says), and its BOS and EOS texts (llama.cpp's `/props`)."""

    kind: str
    model: str
    identity: str
    window: int | None = None
    bos: str = ""
    eos: str = ""

    @property
    def counts(self) -> bool:
        """Whether this server has a tokenize endpoint ctx can ask."""
        return self.kind in KINDS


class Asker(Protocol):
    """What a kind needs of `Backend` to ask the server: the OpenAI-compatible `base` path
    (`/v1`), the `root` path beside it, the `model` asked for, the base `url`, and a probe (see
    `Backend.probe`)."""

    base: str
    root: str
    model: str
    url: str

    def probe(self, method: str, path: str, body: bytes | None = None) -> dict[str, Any] | None: ...


class ServerKind(ABC):
    """One kind of model server: how ctx tells a server is one, and how it asks it for the
    model's window, a token count and a chat reply. A kind answers for itself only: its probes
    say None when the server is of another kind."""

    name: ClassVar[str]
    #: whether it has a tokenize endpoint ctx can ask
    counts: ClassVar[bool] = False
    #: the request fields that keep its model from repeating itself (a reply that looped is
    #: asked again with them): OpenAI's `frequency_penalty`, which every kind takes, unless the
    #: kind has a field of its own that does it better
    loop_penalty: ClassVar[dict[str, float]] = {"frequency_penalty": 0.5}

    #: whether the server may load the model again at another window while it runs (Ollama), so
    #: its window is asked again (`Backend.window`) rather than once
    reloads = False

    @abstractmethod
    def probe(self, backend: Asker) -> Server | None:
        """What the server is, when its answers say it is of this kind; else None."""

    def window(self, backend: Asker) -> int | None:
        """The model's context as this kind's own endpoint says it, asked before the kind is
        known (`WINDOWS`); None when it has no such endpoint."""
        return None

    def tokenize_request(self, root: str, model: str, text: str, *, add_special: bool) -> tuple[str, dict[str, Any]]:
        """The path and JSON body that ask for the tokens of `text`, its special tokens parsed,
        BOS added only when `add_special` (to learn what the server adds). Only a kind that
        `counts` has one."""
        raise NotImplementedError(f"{self.name} has no tokenize endpoint")

    def tokens_counted(self, data: dict[str, Any]) -> int | None:
        """The count in a tokenize answer, or None when the answer holds none."""
        return None

    def counted(self, data: dict[str, Any], text: str, url: str) -> int:
        """The count in the tokenize answer to `text`; `BadReply` when it holds none."""
        found = self.tokens_counted(data)
        if found is None:
            raise BadReply(url, f"no token count in {self.name}'s tokenize reply")
        return found

    def template_request(self, root: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        """The path and JSON body that ask for the prompt the server's chat template makes of
        `messages` (what a chat completion of them is given to the model as); None when this
        kind has no such endpoint."""
        return None

    def templated(self, data: dict[str, Any]) -> str | None:
        """The prompt in a template answer, or None when the answer holds none."""
        return None

    def chat_path(self, base: str) -> str:
        """Where a chat completion is asked (`POST`, the OpenAI API's body)."""
        return f"{base}/chat/completions"

    def described(self, server: Server) -> str:
        """How a message names the server."""
        return f"{self.name} ({server.model})"


class LlamaCpp(ServerKind):
    """llama.cpp's server: its `/props` says the model file and a slot's context."""

    name = LLAMA_CPP
    counts = True
    #: its own penalty on the last 64 tokens: on SmolLM2-135M it ended the loops that
    #: frequency_penalty 0.5 did not (1 scene of 9 run to max_tokens, against 7 of 18)
    loop_penalty: ClassVar[dict[str, float]] = {"repeat_penalty": 1.1}

    def probe(self, backend: Asker) -> Server | None:
        """`GET /props` with a `model_path` (TabbyAPI answers a `/props` without one)."""
        props = backend.probe("GET", f"{backend.root}/props")
        settings = props.get("default_generation_settings") if props is not None else None
        path = props.get("model_path") if props is not None else None
        if props is None or not isinstance(settings, dict) or not isinstance(path, str) or not path:
            return None
        models = backend.probe("GET", f"{backend.base}/models")
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
            window=_count(settings.get("n_ctx")) or None,
            bos=bos if isinstance(bos, str) else "",
            eos=eos if isinstance(eos, str) else "",
        )

    def window(self, backend: Asker) -> int | None:
        """`GET /props` `default_generation_settings.n_ctx`: a slot's (`-c` / `-np`); TabbyAPI
        answers the same with its `max_seq_len`."""
        data = backend.probe("GET", f"{backend.root}/props")
        settings = data.get("default_generation_settings") if data is not None else None
        return _count(settings.get("n_ctx")) if isinstance(settings, dict) else None

    def tokenize_request(
        self, root: str, model: str, text: str, *, add_special: bool, parse_special: bool = True
    ) -> tuple[str, dict[str, Any]]:
        """`parse_special=False` reads the special tokens as plain text (`Backend.tokenize`)."""
        return f"{root}/tokenize", {"content": _utf8(text), "add_special": add_special, "parse_special": parse_special}

    def tokens_counted(self, data: dict[str, Any]) -> int | None:
        return _ids(data.get("tokens"))

    def template_request(self, root: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
        """`POST /apply-template` `{"messages"}` → `prompt`: the model's chat template (or the
        server's `--chat-template`) applied as a chat completion applies it."""
        return f"{root}/apply-template", {"messages": messages}

    def templated(self, data: dict[str, Any]) -> str | None:
        prompt = data.get("prompt")
        return prompt if isinstance(prompt, str) else None


class KoboldCpp(ServerKind):
    """KoboldCpp: its `/api/extra/version` names it."""

    name = KOBOLDCPP
    counts = True

    def probe(self, backend: Asker) -> Server | None:
        """`GET /api/extra/version` `result: "KoboldCpp"`; the model from `/api/v1/model`."""
        version = backend.probe("GET", f"{backend.root}/api/extra/version")
        if version is None or version.get("result") != "KoboldCpp":
            return None
        named = backend.probe("GET", f"{backend.root}/api/v1/model")
        model = named.get("result") if named is not None else None
        model = model.removeprefix("koboldcpp/") if isinstance(model, str) else ""
        identity = json.dumps([KOBOLDCPP, str(version.get("version")), model])
        return Server(KOBOLDCPP, model, identity, window=self.window(backend))

    def window(self, backend: Asker) -> int | None:
        """`GET /api/extra/true_max_context_length`."""
        data = backend.probe("GET", f"{backend.root}/api/extra/true_max_context_length")
        return _count(data.get("value")) or None if data is not None else None

    def tokenize_request(self, root: str, model: str, text: str, *, add_special: bool) -> tuple[str, dict[str, Any]]:
        return f"{root}/api/extra/tokencount", {"prompt": _utf8(text), "special": add_special}

    def tokens_counted(self, data: dict[str, Any]) -> int | None:
        return _count(data.get("value"))

    def counted(self, data: dict[str, Any], text: str, url: str) -> int:
        """A count of 0 for a text is its guard speaking, not a count."""
        found = super().counted(data, text, url)
        if found == 0 and text:
            raise BadReply(
                url,
                f"KoboldCpp counted 0 tokens of {len(text):,} characters (it counts no text of"
                f" {KOBOLD_LIMIT:,} tokens or more)",
                "count with the model's own file instead (--tokenizer a GGUF file)",
            )
        return found


class TabbyAPI(ServerKind):
    """TabbyAPI: its `/v1/model` card has the `max_seq_len` it loaded the model with. Its window
    asked before the kind is known is llama.cpp's probe's: it answers a `/props` the same."""

    name = TABBYAPI
    counts = True

    def probe(self, backend: Asker) -> Server | None:
        """`GET /v1/model` with `parameters.max_seq_len`."""
        card = backend.probe("GET", f"{backend.root}/v1/model")
        parameters = card.get("parameters") if card is not None else None
        if card is None or not isinstance(parameters, dict) or "max_seq_len" not in parameters:
            return None
        model = str(card.get("id") or "")
        return Server(TABBYAPI, model, json.dumps([TABBYAPI, model]), window=_count(parameters["max_seq_len"]) or None)

    def tokenize_request(self, root: str, model: str, text: str, *, add_special: bool) -> tuple[str, dict[str, Any]]:
        body = {"text": _utf8(text), "add_bos_token": add_special, "encode_special_tokens": True}
        return f"{root}/v1/token/encode", body

    def tokens_counted(self, data: dict[str, Any]) -> int | None:
        return _count(data.get("length")) if "length" in data else _ids(data.get("tokens"))


class Vllm(ServerKind):
    """vLLM: its `/v1/models` says each model's `max_model_len`."""

    name = VLLM
    counts = True
    loop_penalty: ClassVar[dict[str, float]] = {"repetition_penalty": 1.1}

    def probe(self, backend: Asker) -> Server | None:
        """`GET /v1/models` with a `max_model_len`: the model asked for's, or the one model's."""
        data = backend.probe("GET", f"{backend.base}/models")
        models = data.get("data") if data is not None else None
        if not isinstance(models, list):
            return None
        sized = [m for m in models if isinstance(m, dict) and _count(m.get("max_model_len"))]
        mine = [m for m in sized if m.get("id") == backend.model] or (sized if len(sized) == 1 else [])
        if not mine:
            return None
        model = str(mine[0].get("id") or "")
        identity = json.dumps([VLLM, model, str(mine[0].get("root") or "")])
        return Server(VLLM, model, identity, window=_count(mine[0]["max_model_len"]))

    def window(self, backend: Asker) -> int | None:
        """`GET /v1/models` `max_model_len`."""
        found = self.probe(backend)
        return found.window if found is not None else None

    def tokenize_request(self, root: str, model: str, text: str, *, add_special: bool) -> tuple[str, dict[str, Any]]:
        return f"{root}/tokenize", {"model": model, "prompt": _utf8(text), "add_special_tokens": add_special}

    def tokens_counted(self, data: dict[str, Any]) -> int | None:
        return _count(data.get("count")) if "count" in data else _ids(data.get("tokens"))


class Ollama(ServerKind):
    """Ollama: its `/api/version` answers; no tokenize endpoint. It loads a model again at
    another window whenever a request's `num_ctx` differs (`reloads`)."""

    name = OLLAMA
    reloads = True

    def probe(self, backend: Asker) -> Server | None:
        """`GET /api/version` with a `version`."""
        data = backend.probe("GET", f"{backend.root}/api/version")
        if data is None or not isinstance(data.get("version"), str):
            return None
        return Server(OLLAMA, backend.model, json.dumps([OLLAMA, backend.model]))

    def window(self, backend: Asker) -> int | None:
        """The window Ollama runs the model at, which is seldom the one it was trained for:
        `num_ctx` of its parameters (`POST /api/show`) when set, else the loaded model's (`GET
        /api/ps`), else `OLLAMA_WINDOW`; never more than the trained `*.context_length` (Ollama
        caps it so). None when `/api/show` names neither (KoboldCpp answers one with neither)."""
        data = backend.probe("POST", f"{backend.root}/api/show", json.dumps({"model": backend.model}).encode("utf-8"))
        if data is None:
            return None
        parameters = data.get("parameters")
        said = re.search(r"^\s*num_ctx\s+(\d+)", parameters, re.MULTILINE) if isinstance(parameters, str) else None
        told = int(said.group(1)) if said else None
        info = data.get("model_info")
        info = info if isinstance(info, dict) else {}
        keys = [k for k in info if isinstance(k, str) and k.endswith(".context_length")]
        trained = next((size for k in keys if (size := _count(info[k]))), None)
        if not told and not keys:  # KoboldCpp's emulated /api/show: no model's, nothing said
            return None
        if not told:  # the trained length said, readable or not: what it is loaded with
            # Not loaded (or /api/ps says nothing): Ollama loads it at its default, which
            # OLLAMA_CONTEXT_LENGTH or a larger GPU raises and ctx cannot read. A window too small
            # only makes ctx summarise earlier; one too large and Ollama silently cuts the prompt's start.
            told = self.loaded(backend) or OLLAMA_WINDOW
        if told > MOST_WINDOW:  # past any model's: said as it is, and refused (`Backend.window`)
            return told
        return min(told, trained) if trained else told

    def loaded(self, backend: Asker) -> int | None:
        """`GET /api/ps`: the `context_length` the model is loaded with, found by its `name` or
        `model` as `listed_as` finds it (Ollama lists `NAME:latest`); None when it is not loaded
        or the answer is not one Ollama gives."""
        try:
            data = backend.probe("GET", f"{backend.root}/api/ps")
        except BadReply:  # JSON past what any reply holds: it says nothing
            return None
        running = data.get("models") if data is not None else None
        entries = [m for m in running if isinstance(m, dict)] if isinstance(running, list) else []
        names = [(m.get("name"), m.get("model")) for m in entries]
        named = listed_as(backend.model, tuple(n for pair in names for n in pair if isinstance(n, str)))
        mine = [m for m, pair in zip(entries, names, strict=True) if named is not None and named in pair]
        return next((size for m in mine if (size := _count(m.get("context_length")))), None)


class OpenAI(ServerKind):
    """A server that is none of the others: OpenAI's API and nothing more ctx can ask (OpenAI,
    OpenRouter, LM Studio, a gateway). Last in `SERVERS`: every server is at least this."""

    name = OPENAI

    def probe(self, backend: Asker) -> Server:
        """Asks nothing: what the server is, ctx knows only by its URL and the model named."""
        return Server(OPENAI, backend.model, f"?|{backend.url}|{backend.model}")

    def described(self, server: Server) -> str:
        return f"this server (not {', '.join(KINDS[:-1])} or {KINDS[-1]})"


#: every kind, in the order `Backend.server()` asks which one the server is: the first whose
#: probe says so is it (llama.cpp before TabbyAPI, whose `/props` mimics llama.cpp's; OpenAI last)
SERVERS: dict[str, ServerKind] = {
    kind.name: kind for kind in (LlamaCpp(), KoboldCpp(), TabbyAPI(), Vllm(), Ollama(), OpenAI())
}
#: the kinds whose window can be asked before the kind is known, in the order `Backend.window()`
#: asks: `/v1/models` first, which every OpenAI-compatible server answers (vLLM's with its window)
WINDOWS: tuple[ServerKind, ...] = tuple(SERVERS[name] for name in (VLLM, LLAMA_CPP, OLLAMA, KOBOLDCPP))
#: the kinds of server that count tokens
KINDS: tuple[str, ...] = tuple(name for name, kind in SERVERS.items() if kind.counts)


#: how a model file's path ends, as llama.cpp lists the `-m` it was started with
MODEL_FILES = (".gguf", ".ggml", ".bin", ".safetensors")


def listed_as(name: str, ids: tuple[str, ...]) -> str | None:
    """The listed model id that `name` names, or None: the id itself; a model file's path (how
    llama.cpp lists the `-m` it was started with, when it has no `--alias`) by its file name
    with or without its extension; KoboldCpp's `koboldcpp/NAME` by NAME; Ollama's `NAME:latest`
    by NAME. Nothing looser: a hosted API's `vendor/model` is named whole, as it must be asked."""
    if name in ids:
        return name
    for listed in ids:
        file = re.split(r"[/\\]", listed)[-1]
        if listed.lower().endswith(MODEL_FILES) and name in (file, file.rsplit(".", 1)[0]):
            return listed
        if listed.removeprefix(f"{KOBOLDCPP.lower()}/") == name != listed or listed == f"{name}:latest":
            return listed
    return None


#: a window past this many tokens is no model's: a server that says one is refused (`Backend.window`)
MOST_WINDOW = 10**8


def _utf8(text: str) -> str:
    """A lone surrogate, which is no UTF-8, goes as U+FFFD, as the prompt's UTF-8 would carry it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ids(value: object) -> int | None:
    if isinstance(value, list) and all(_count(t) is not None or isinstance(t, dict) for t in value):
        return len(value)
    return None


__all__ = [
    "KINDS",
    "KOBOLDCPP",
    "KOBOLD_LIMIT",
    "LLAMA_CPP",
    "MODEL_FILES",
    "OLLAMA",
    "OLLAMA_WINDOW",
    "OPENAI",
    "SERVERS",
    "TABBYAPI",
    "VLLM",
    "WINDOWS",
    "Asker",
    "KoboldCpp",
    "LlamaCpp",
    "Ollama",
    "OpenAI",
    "Server",
    "ServerKind",
    "TabbyAPI",
    "Vllm",
    "listed_as",
]
