"""The kinds of model server ctx can ask for a token count, and how each one is asked.

Each server offers its tokenizer its own way; what ctx needs of each is the same: the number
of tokens the server makes of a text when it parses the special tokens spelled in it (as it
does a prompt) and adds no BOS, and what it adds to a whole prompt. The request and the
answer of each kind are here; `Backend` detects the kind and sends them.

- llama.cpp: `POST /tokenize` `{"content", "add_special", "parse_special": true}` → `tokens`.
- vLLM: `POST /tokenize` `{"model", "prompt", "add_special_tokens"}` → `count` (and `tokens`);
  a Hugging Face tokenizer matches its added tokens in the text, so specials are parsed.
- KoboldCpp: `POST /api/extra/tokencount` `{"prompt", "special"}` → `value`; its `special` is
  whether to add BOS, and it always parses special tokens. It answers `value` 0 for a text of
  50,000 tokens or more (its guard), which is refused here, never taken for a count.
- TabbyAPI: `POST /v1/token/encode` `{"text", "add_bos_token", "encode_special_tokens": true}`
  → `length`.

All four sit at the server's root, beside `/v1` (TabbyAPI's under `/v1` of that root).
Ollama has no tokenize endpoint (ctx reads the GGUF blob it serves instead: `model/ollama`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLAMA_CPP = "llama.cpp"
VLLM = "vLLM"
KOBOLDCPP = "KoboldCpp"
TABBYAPI = "TabbyAPI"
OLLAMA = "Ollama"
#: the kinds of server that count tokens
KINDS = (LLAMA_CPP, VLLM, KOBOLDCPP, TABBYAPI)

#: KoboldCpp counts no text of this many tokens or more: it answers 0 (koboldcpp.py's guard)
KOBOLD_LIMIT = 50_000


@dataclass(frozen=True)
class Server:
    """What a model server is, as it says: its `kind` (one of `KINDS`, `OLLAMA`, or "" when it
    is none of those), its `model` as it names it (llama.cpp: the model file's name), the
    `identity` of the model and tokenizer it serves (what the count cache is keyed by: a
    changed model file, a changed server build, changes it), its `window` (the context one
    request gets, when it says), and its BOS and EOS texts (llama.cpp's `/props`)."""

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


def tokenize_request(kind: str, root: str, model: str, text: str, *, add_special: bool) -> tuple[str, dict[str, Any]]:
    """The path and JSON body that ask a server of `kind` for the tokens of `text`, its special
    tokens parsed, BOS added only when `add_special` (to learn what the server adds). A lone
    surrogate, which is no UTF-8, goes as U+FFFD, as the prompt's UTF-8 would carry it."""
    text = _utf8(text)
    if kind == LLAMA_CPP:
        return f"{root}/tokenize", {"content": text, "add_special": add_special, "parse_special": True}
    if kind == VLLM:
        return f"{root}/tokenize", {"model": model, "prompt": text, "add_special_tokens": add_special}
    if kind == KOBOLDCPP:
        return f"{root}/api/extra/tokencount", {"prompt": text, "special": add_special}
    if kind == TABBYAPI:
        return f"{root}/v1/token/encode", {"text": text, "add_bos_token": add_special, "encode_special_tokens": True}
    raise ValueError(f"no tokenize endpoint for {kind!r}")


def _utf8(text: str) -> str:
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


def tokens_counted(kind: str, data: dict[str, Any]) -> int | None:
    """The count in a tokenize answer of `kind`, or None when the answer holds none."""
    if kind == LLAMA_CPP:
        return _ids(data.get("tokens"))
    if kind == VLLM:
        return _count(data.get("count")) if "count" in data else _ids(data.get("tokens"))
    if kind == KOBOLDCPP:
        return _count(data.get("value"))
    if kind == TABBYAPI:
        return _count(data.get("length")) if "length" in data else _ids(data.get("tokens"))
    return None


__all__ = [
    "KINDS",
    "KOBOLDCPP",
    "LLAMA_CPP",
    "OLLAMA",
    "TABBYAPI",
    "VLLM",
    "Server",
    "tokenize_request",
    "tokens_counted",
]
