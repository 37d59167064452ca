"""Finding a format by name or path, and handing it to the reader of its source."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ...errors import ConfigError, did_you_mean
from .gguf import is_gguf, read_gguf_template
from .jinja_file import read_jinja
from .model import Format
from .sillytavern import read_preset
from .toml import read_format


def format_names(search_dirs: Sequence[Path]) -> list[str]:
    """Every format name the search dirs offer, sorted, each once."""
    return sorted({path.stem for folder in search_dirs for path in Path(folder).glob("*.toml")})


def load_format(name_or_path: str, search_dirs: Sequence[Path]) -> Format:
    """A bare name is looked up as `<dir>/<name>.toml` (first dir that has it); a path
    ending `.toml` is read as a format file, a path ending `.json` as a SillyTavern preset
    or a Hugging Face `tokenizer_config.json` (by what it holds); a `.jinja` file or a `.gguf`
    file is a model's own chat template (`read_jinja`, `read_gguf_template`)."""
    suffix = Path(name_or_path).suffix.lower()
    if suffix == ".toml":
        return read_format(Path(name_or_path))
    if suffix == ".json":
        return read_preset(Path(name_or_path))
    if suffix == ".jinja":
        return read_jinja(Path(name_or_path))
    if suffix == ".gguf" or is_gguf(name_or_path):  # an Ollama blob is a GGUF with no suffix
        return read_gguf_template(Path(name_or_path))
    if not name_or_path or "/" in name_or_path or "\\" in name_or_path:
        raise ConfigError(name_or_path, None, "expected a format name or a .toml/.json/.jinja/.gguf file")
    for folder in search_dirs:
        path = Path(folder) / f"{name_or_path}.toml"
        if os.path.lexists(path):  # a device or a dangling link there is named, not passed over
            return read_format(path)
    names = format_names(search_dirs)
    raise ConfigError(
        name_or_path, None, f"no such format{did_you_mean(name_or_path, names)} (known: {', '.join(names) or 'none'})"
    )
