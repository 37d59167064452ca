"""The reader of ctx's own format file: a TOML file, `<dir>/<name>.toml`.

The built-in formats live in `configs/formats/`. The fields mirror SillyTavern's instruct
preset, so a preset carries over key by key:

    name = "ChatML"                      # shown to people; defaults to the file's stem
    chat = false                         # true: send role messages to a chat API, no wrapping
    bos = ""                             # the model's BOS text: its server adds it (one BOS)
    write_bos = false                    # true: a text prompt starts with `bos` itself
    system_sequence = "<|im_start|>system\\n"   # prefix of a system block
    system_suffix = "<|im_end|>\\n"             # suffix of a system block
    input_sequence = "<|im_start|>user\\n"      # prefix of a user block
    input_suffix = "<|im_end|>\\n"
    output_sequence = "<|im_start|>assistant\\n" # prefix of an assistant block
    output_suffix = "<|im_end|>\\n"
    first_output_sequence = ""           # prefix of the oldest message, if it is an assistant's
    last_output_sequence = ""            # prefix of the open assistant block, if set
    first_input_sequence = ""            # prefix of the oldest message, if it is the user's
    last_input_sequence = ""             # prefix of the last user message
    last_system_sequence = ""            # SillyTavern's quiet-prompt prefix: a stop string only
    system_sequence_prefix = ""          # wraps the system prompt (SillyTavern 1.12.6)
    system_sequence_suffix = ""
    story_string_prefix = ""             # wraps a context preset's story string (newer SillyTavern)
    story_string_suffix = ""
    skip_examples = false                # SillyTavern: example dialogue is not wrapped in sequences
    macro = true                         # {{user}}, {{char}}, {{name}} in sequences are filled
    system_same_as_user = false          # true: system blocks are user blocks (formats/text.py)
    wrap = false                         # true: a newline after each prefix (formats/text.py)
    user_alignment_message = ""          # a user turn put before an assistant-first chat
    names_behavior = "always"            # "none" | "force" | "always" (formats/text.py)
    alternate = true                     # true: the model demands alternating turns (merge)
    system_placement = "in_place"        # "last_user": the system prompt before the last user turn
    system_preamble = ""                 # text the prompt's opening system turn starts with
    stop_sequence = ""                   # one stop string, as in SillyTavern
    stop = ["<|im_end|>"]                # more stop strings

Every field is optional; an unknown key or a wrong type is a `ConfigError` naming the file and
the key. How the fields make a prompt is formats/text.py's to say.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

from ...errors import ConfigError
from .model import BOOL_FIELDS, STR_FIELDS, Format
from .reading import make_format, read_text

_TOML_KEYS = (*STR_FIELDS, *BOOL_FIELDS, "write_bos", "stop")


def read_format(path: Path) -> Format:
    """Load a format TOML file; unknown keys and wrong types are errors."""
    source = str(path)
    try:
        data = tomllib.loads(read_text(path, "format file"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, f"not valid TOML: {exc}") from None
    for key in data:
        if key not in _TOML_KEYS:
            raise ConfigError(source, key, f"unknown key (expected one of: {', '.join(_TOML_KEYS)})")
    values = {key: value for key, value in data.items() if key not in ("stop", "write_bos")}
    write_bos = data.get("write_bos", False)
    if not isinstance(write_bos, bool):
        raise ConfigError(source, "write_bos", f"expected true or false, got {write_bos!r}")
    stop = data.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
        raise ConfigError(source, "stop", f"expected a list of strings, got {stop!r}")
    if values.get("name") == "":
        raise ConfigError(source, "name", "expected a non-empty string")
    fmt = make_format(source, values, default_name=path.stem, extra_stop=stop)
    # One BOS, always: every server ctx sends a text prompt to (llama.cpp, KoboldCpp, vLLM,
    # TabbyAPI, Ollama) adds the BOS of the models these formats are for itself, so the prompt
    # leaves it to the server unless the file says to write it (docs/templates.md).
    return fmt if write_bos else replace(fmt, server_bos=fmt.bos)
