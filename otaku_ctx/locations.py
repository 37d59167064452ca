"""Every directory `ctx` reads or writes, decided here and nowhere else.

The user's files live under the otaku home (`$OTAKU_HOME`, else `~/.otaku`): the config,
their own templates and formats, and the cache of compiled templates. The shipped data
(`configs/`) is found through the package itself: in an installed wheel it is
`otaku_ctx/configs/`, and in a checkout `otaku_ctx/configs` is a link to the top-level
`configs/`, so both are found the same way. It is the folder `importlib.resources.files`
names for the package (a test says so); importing `importlib.resources` would cost every
run 13 ms, so the path is taken from this file's own place.
"""

from __future__ import annotations

import os
from pathlib import Path


def otaku_home() -> Path:
    """The otaku directory: `$OTAKU_HOME`, else `~/.otaku`."""
    env = os.environ.get("OTAKU_HOME")
    return Path(env).expanduser() if env else Path.home() / ".otaku"


def config_path() -> Path:
    """The config file read when no `--config` is given."""
    return otaku_home() / "configs" / "config.toml"


def shipped(kind: str = "") -> Path:
    """The shipped `configs/<kind>` folder (`formats`, `templates`, `templates/compiled`)."""
    root = Path(__file__).parent / "configs"
    return root / kind if kind else root


def user_dir(kind: str) -> Path:
    """The user's own `~/.otaku/configs/<kind>` folder, looked in before the shipped one."""
    return otaku_home() / "configs" / kind


def search_dirs(kind: str) -> list[Path]:
    """Where `--template NAME` / `--format NAME` are looked up: the user's folder, then the shipped one."""
    return [user_dir(kind), shipped(kind)]


def model_cache() -> Path:
    """Where tokenizers converted from a model file are kept, keyed by the file's identity."""
    return otaku_home() / "cache" / "models"


def count_cache() -> Path:
    """Where a server-backed tokenizer keeps the counts its server gave, per server model."""
    return otaku_home() / "cache" / "counts"


def ollama_models() -> Path:
    """Ollama's models folder (its manifests and blobs): `$OLLAMA_MODELS`, trimmed of spaces
    and quotes as Ollama trims it, else `~/.ollama/models` (ollama's envconfig.Models)."""
    env = os.environ.get("OLLAMA_MODELS", "").strip().strip("\"'")
    return Path(env) if env else Path.home() / ".ollama" / "models"


def template_cache() -> Path:
    """Where templates compiled on this machine are kept (`hbs.store`)."""
    return otaku_home() / "cache" / "templates"
