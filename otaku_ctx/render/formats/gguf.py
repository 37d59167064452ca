"""The reader of a GGUF model file: its `tokenizer.chat_template`, as a Format."""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from .model import Format, jinja_format


def is_gguf(name_or_path: str) -> bool:
    """A path (not a bare name) of a file that starts as a GGUF file does."""
    from ...model.gguf import looks_like_gguf

    return ("/" in name_or_path or "\\" in name_or_path) and looks_like_gguf(name_or_path)


def read_gguf_template(path: Path, template: str | None = None, name: str | None = None) -> Format:
    """A GGUF model file's `tokenizer.chat_template` — or `template`, a `.jinja` beside the file,
    named `name` — with the BOS and EOS token texts and the control tokens of its vocabulary."""
    from ...files import record_input
    from ...model.gguf import read_gguf
    from ...model.vocab import gguf_controls

    record_input(path)
    model = read_gguf(path)
    if template is None and not model.chat_template:
        raise ConfigError(
            str(path), "tokenizer.chat_template", "missing: the file has no chat template; give a --format"
        )
    name = name or f"{path} (tokenizer.chat_template)"
    chat = template if template is not None else (model.chat_template or "")
    return jinja_format(
        chat, bos=model.bos_text, eos=model.eos_text, name=name, controls=gguf_controls(model),
        server_bos=model.bos_text if model.add_bos else "",
    )  # fmt: skip
