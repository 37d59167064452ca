"""The reader of a `.jinja` file: a model's own chat template, as a Format."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .gguf import read_gguf_template
from .model import Format, jinja_format
from .reading import read_text
from .tokenizer_config import config_format, json_object


def read_jinja(path: Path) -> Format:
    """A `.jinja` chat template file. It carries no BOS or EOS text of its own: they come,
    with the model's control tokens, from a `tokenizer_config.json` beside it (a model
    folder's), else from the one GGUF beside it; with neither, they are empty (a template
    that adds `eos_token` to a text still renders), and the format's `note` says so."""
    template = read_text(path, "template")
    config = path.parent / "tokenizer_config.json"
    if config.is_file():
        return config_format(template, str(config), json_object(config, "instruct preset"), str(path))
    ggufs = [p for p in sorted(path.parent.glob("*.gguf")) if p.is_file()]
    if len(ggufs) == 1:
        return read_gguf_template(ggufs[0], template, name=str(path))
    empty = jinja_format(template, bos="", eos="", name=str(path))
    said = (
        f"{path}: no tokenizer_config.json or GGUF beside it, so its bos_token and eos_token are empty"
        " and no control token of the model is known (--use MODEL gives them)"
    )
    return replace(empty, note=said)
