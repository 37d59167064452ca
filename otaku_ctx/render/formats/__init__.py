"""Prompt formats (instruct templates) as data: how role blocks become one prompt.

The package is split by what it holds:

- `model`: the `Format` type, and `bind`, the format for one story's names;
- the readers, one per source, each making a Format of a file (`load_format`, in `loading`,
  finds a format by name or path and picks the reader): `toml`, ctx's own format file (its
  keys are listed there); `sillytavern`, a SillyTavern instruct preset (`.json`);
  `tokenizer_config`, a Hugging Face `tokenizer_config.json`; `jinja_file`, a `.jinja` chat
  template; `gguf`, a GGUF model file's `tokenizer.chat_template`; `reading` holds what they
  share;
- `text`: the renderer, a text prompt or chat messages from role blocks, and the decisions
  a user should know about how it builds them.

A model's own Jinja chat template is a format too (`jinja_format`; `load_format` reads it from
a `.jinja` file, a Hugging Face `tokenizer_config.json` or a GGUF file's
`tokenizer.chat_template`). Its text prompt is the template rendered (`render.jinja`, as
transformers renders it) over the chat messages `render_messages` gives: consecutive turns of
one role merged, names written "Name: text", system turns sent as they are; the open turn
continued as `continue_final_message` continues a final message, or a blank one asked for
with `add_generation_prompt`. A template that refuses the chat gets it folded
(`template_chats`). Its stop strings are the model's EOS text and the first marker the
template writes after a reply (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`): what ends a turn
when the server does not stop at the token itself. The BOS is the template's to write (its
`bos_token`); `Format.bos` stays empty.
"""

from __future__ import annotations

from .gguf import read_gguf_template
from .jinja_file import read_jinja
from .loading import format_names, load_format
from .model import NAMES_BEHAVIORS, SYSTEM_PLACEMENTS, Format, bind, jinja_format
from .sillytavern import read_preset
from .text import (
    example_text,
    includes_name,
    merge_blocks,
    render_messages,
    render_text,
    stop_sequences,
    template_chats,
    text_pieces,
    turns,
)
from .tokenizer_config import tokenizer_config_format
from .toml import read_format

__all__ = [
    "NAMES_BEHAVIORS",
    "SYSTEM_PLACEMENTS",
    "Format",
    "bind",
    "example_text",
    "format_names",
    "includes_name",
    "jinja_format",
    "load_format",
    "merge_blocks",
    "read_format",
    "read_gguf_template",
    "read_jinja",
    "read_preset",
    "render_messages",
    "render_text",
    "stop_sequences",
    "template_chats",
    "text_pieces",
    "tokenizer_config_format",
    "turns",
]
