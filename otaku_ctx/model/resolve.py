"""Which model, and which counter: `[model] use` (`--use`) resolved to the model's files,
and the counter a `[model] tokenizer` names.

`use` is a GGUF file, a Hugging Face model folder (tokenizer.json, tokenizer_config.json,
config.json) or an Ollama model name, resolved through Ollama's manifests to the GGUF blob
it serves. From it come the tokenizer, the chat template (with its BOS and EOS texts) and
the window; `build.with_model` decides which of them the user's own settings override.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..files import read_input, record_input
from ..tokens import TOKENIZERS, TokenCounter, make_counter
from .gguf import looks_like_gguf, read_gguf
from .vocab import gguf_controls

if TYPE_CHECKING:
    from ..backend import Backend

# Mistral's own tokenizer files, as mistral-common and Mistral's model folders ship them.
_MISTRAL = re.compile(r"(\.model\.v\d+m?\d*$)|(^tekken.*\.json$)", re.IGNORECASE)
_CONFIG_BOUND = 1 << 20  # a model folder's config.json: a few kilobytes


@dataclass(frozen=True)
class ModelFiles:
    """What `use` names, found: a GGUF file, or a Hugging Face model folder."""

    given: str
    gguf: Path | None = None
    folder: Path | None = None

    @property
    def tokenizer(self) -> str:
        """The `[model] tokenizer` that counts as this model does: its own file."""
        if self.gguf is not None:
            return str(self.gguf)
        assert self.folder is not None
        return str(self.folder)

    @property
    def template(self) -> str | None:
        """The `[prompt] format` of this model's own chat template, if it has one."""
        if self.gguf is not None:
            return str(self.gguf) if read_gguf(self.gguf).chat_template else None
        assert self.folder is not None
        config = self.folder / "tokenizer_config.json"
        if config.is_file() and "chat_template" in _json_object(config, "tokenizer config"):
            return str(config)
        jinja = self.folder / "chat_template.jinja"
        return str(config if config.is_file() else jinja) if jinja.is_file() else None

    @property
    def window(self) -> int | None:
        """The window the model was trained for: the GGUF's `<arch>.context_length`, or a
        folder's config.json `max_position_embeddings`."""
        if self.gguf is not None:
            return read_gguf(self.gguf).context_length
        assert self.folder is not None
        config = self.folder / "config.json"
        if not config.is_file():
            return None
        value = _json_object(config, "model config").get("max_position_embeddings")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _json_object(path: Path, kind: str) -> dict[str, object]:
    """A model folder's small JSON file (config.json, tokenizer_config.json), read bounded."""
    try:
        data = json.loads(read_input(path, kind, _CONFIG_BOUND))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ConfigError(str(path), None, "not valid JSON; fix the file, or name the part yourself") from None
    except ValueError:  # a number past Python's int-conversion limit (4,300 digits)
        digits = f"{sys.get_int_max_str_digits():,}"
        message = f"holds a number of more than {digits} digits; fix the file, or name the part yourself"
        raise ConfigError(str(path), None, message) from None
    return data if isinstance(data, dict) else {}


def locate(use: str) -> ModelFiles:
    """The model `use` names: a folder, a file (a GGUF), or else an Ollama model name."""
    path = Path(use).expanduser()
    if path.is_dir():
        record_input(path)
        return ModelFiles(use, folder=path)
    if path.exists() or path.suffix.lower() == ".gguf" or use.startswith((".", "/", "~")):
        if not path.exists():
            raise ConfigError(use, None, "no such model file; give a GGUF file, a model folder or an Ollama name")
        record_input(path)
        return ModelFiles(use, gguf=path)
    from .ollama import ollama_model

    blob = ollama_model(use)
    record_input(blob)
    return ModelFiles(use, gguf=blob)


def counter(spec: str, server: str = "", model: str = "", *, use: str = "") -> TokenCounter:
    """A fresh counter for `[model] tokenizer`, made whole: a name of `tokens`' (cl100k_base,
    estimate), "server" (the tokenize endpoint of the model server at `server`, for `model`), or
    a tokenizer file or folder: a GGUF, a Hugging Face tokenizer.json (or a folder holding one),
    Mistral's SentencePiece `*.model.v*` or Tekken `tekken*.json`.

    With "server", `use` (`[model] use`, the model the server runs) adds the control tokens
    the model's own file names: a server names few (llama.cpp its BOS and EOS, the others
    none), and the text prompt must break up them all. A file's own counter knows its own."""
    if spec in TOKENIZERS:
        return make_counter(spec)
    if spec == "server":
        return server_counter(server, model, use=use)
    return _file_counter(Path(spec).expanduser())


def model_controls(use: str) -> tuple[str, ...]:
    """The control tokens of the model `use` names (see `locate`), as its own tokenizer file's
    counter names them (its `specials`). A GGUF's are read from its tokens and their types
    alone (`vocab.gguf_controls`): nothing converted, no merges read, any kind of tokenizer."""
    path = Path(locate(use).tokenizer).expanduser()
    if tokenizer_kind(path) == "gguf":
        record_input(path)
        return gguf_controls(read_gguf(path))
    return _file_counter(path).specials


def _file_counter(path: Path) -> TokenCounter:
    kind = tokenizer_kind(path)
    record_input(path)
    if kind == "gguf":
        from .hf import gguf_counter

        return gguf_counter(path)
    if kind == "mistral":
        from .mistral import mistral_counter

        return mistral_counter(path)
    from .hf import tokenizer_json_counter

    return tokenizer_json_counter(path)


def tokenizer_kind(path: Path) -> str:
    """What kind of tokenizer `path` holds ("gguf", "mistral" or "hf"), by its name (or, for a
    file with no telling name such as an Ollama blob, its first bytes)."""
    names = (*TOKENIZERS, "server")
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return "hf"
        if _holds_mistral(path):
            return "mistral"
        raise ConfigError(str(path), None, "no tokenizer.json (or Mistral tokenizer file) in this folder")
    if not path.exists():
        known = ", ".join(f'"{n}"' for n in names)
        raise ConfigError(str(path), None, f"no such tokenizer file; expected {known}, or a tokenizer file")
    if path.suffix.lower() == ".gguf":
        return "gguf"
    if _MISTRAL.search(path.name):
        return "mistral"
    if path.suffix.lower() == ".json":
        return "hf"
    if looks_like_gguf(path):
        return "gguf"
    raise ConfigError(
        str(path), None, "not a tokenizer file ctx reads: a .gguf, a tokenizer.json, a *.model.v* or tekken*.json"
    )


def _holds_mistral(folder: Path) -> bool:
    try:
        return any(_MISTRAL.search(p.name) for p in folder.iterdir())
    except OSError:
        return False


def server_counter(server: str, model: str = "", *, use: str = "") -> TokenCounter:
    """The counter of the model server at `server` (asked for `model`, where it serves many):
    its own tokenize endpoint, its counts kept in the user's cache so a rebuild asks only
    for what is new. `use`, the model it runs, adds its file's control tokens (`counter`)."""
    if not server:
        raise ConfigError(
            "model.tokenizer", None, 'tokenizer "server" needs the server: give --server URL or set [model] server'
        )
    from ..locations import count_cache
    from .server import server_counter as of_server

    return of_server(backend(server, model), count_cache(), model_controls(use) if use else ())


def server_counts(server: str, model: str = "") -> bool:
    """Whether the model server at `server` counts text through a tokenize endpoint ctx asks
    (llama.cpp, vLLM, KoboldCpp, TabbyAPI; not Ollama or OpenAI's API). A server that is down
    is an `Unreachable` that says ctx asked it to count, and how to count without it."""
    from ..backend import Unreachable

    try:
        return backend(server, model).server().counts
    except Unreachable as exc:
        raise Unreachable(
            exc.url,
            f"{exc.problem} (ctx counts with the model server you named)",
            "start it, or give --tokenizer cl100k_base to count with OpenAI's tokenizer instead",
        ) from None


def server_window(server: str, model: str = "") -> int | None:
    """The window the model server at `server` enforces (llama.cpp: its `n_ctx` a slot)."""
    return backend(server, model).window()


#: seconds a count (a tokenize request) may take before the server is taken not to answer: a
#: 50 MB text takes llama-server some seconds; a server that hangs must not hold a turn for the
#: five minutes a reply may take
COUNT_TIMEOUT = 60.0


@lru_cache(maxsize=4)
def backend(server: str, model: str) -> Backend:
    """One `Backend` a server and model in a run: the window and the counter ask the same one,
    so the server is found out once. One retry after a short wait, as serve's: a build that
    counts with a server that is down says so at once (the default's three took 7 s). Each
    request waits `COUNT_TIMEOUT` at most."""
    from ..backend import Backend, BadURL, Retry
    from ..errors import UsageError

    try:
        return Backend(server, model, retry=Retry(attempts=1, backoff=0.25), timeout=COUNT_TIMEOUT)
    except BadURL as exc:  # a URL no request can be sent to is a usage error, named by the setting
        raise UsageError("--server", "model.server", str(exc)) from None
