"""The reader of a `.jinja` file: a model's own chat template, as a Format."""

from __future__ import annotations

from pathlib import Path

from .model import Format, jinja_format
from .reading import read_text
from .tokenizer_config import config_controls, json_object, token_text


def read_jinja(path: Path) -> Format:
    """A `.jinja` chat template file. It carries no BOS or EOS text of its own, so the
    template gets empty ones (a template that adds `eos_token` to a text still renders) —
    unless it is a model folder's `chat_template.jinja` with a `tokenizer_config.json`
    beside it, which has them."""
    template = read_text(path, "template")
    config = path.parent / "tokenizer_config.json"
    if path.name == "chat_template.jinja" and config.is_file():
        data = json_object(config, "instruct preset")
        bos, eos = token_text(str(config), data, "bos_token"), token_text(str(config), data, "eos_token")
        return jinja_format(template, bos=bos, eos=eos, name=str(path), controls=config_controls(data))
    return jinja_format(template, bos="", eos="", name=str(path))
