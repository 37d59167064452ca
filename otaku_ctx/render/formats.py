"""Prompt formats (instruct templates) as data: how role blocks become one prompt.

A format is a TOML file, `<dir>/<name>.toml`; the built-in ones live in `configs/formats/`.
The fields mirror SillyTavern's instruct preset, so a preset carries over key by key:

    name = "ChatML"                      # shown to people; defaults to the file's stem
    chat = false                         # true: send role messages to a chat API, no wrapping
    bos = ""                             # written once at the very start of a text prompt
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
    system_same_as_user = false          # true: system blocks are user blocks (see below)
    wrap = false                         # true: a newline after each prefix (see below)
    user_alignment_message = ""          # a user turn put before an assistant-first chat
    names_behavior = "always"            # "none" | "force" | "always" (see below)
    alternate = true                     # true: the model demands alternating turns (merge)
    system_placement = "in_place"        # "last_user": the system prompt before the last user turn
    system_preamble = ""                 # text the prompt's opening system turn starts with
    stop_sequence = ""                   # one stop string, as in SillyTavern
    stop = ["<|im_end|>"]                # more stop strings

Every field is optional; an unknown key or a wrong type is a `ConfigError` naming the file and
the key. A `.json` file is read as a SillyTavern instruct preset instead (see `read_preset`).

How a text prompt is built (`render_text`), and the decisions a user should know:

- Only the last block may be open. Without one, an empty open assistant turn is appended,
  so a text prompt always ends ready for the model's reply.
- `user_alignment_message`: if the first non-system block is an assistant's, a user block
  with this text goes before it (SillyTavern does the same), for templates that demand the
  user speak first.
- `system_same_as_user`: system blocks become user blocks *before* consecutive blocks merge,
  so a system prompt folds into the user turn beside it, joined by a blank line. This is
  how Mistral's and Gemma's own templates treat a system message.
- `alternate`: consecutive blocks of one role merge (`merge_blocks`), in text and in chat
  messages, so templates that demand alternating turns (Mistral, Gemma, Alpaca) get them; a
  named open turn ("Ilya:") after an assistant turn continues that turn. With
  `alternate = false` (ChatML, Llama 3, Vicuna, every SillyTavern preset) each block is a
  turn of its own, so the speakers of a group chat keep their own turns.
- For formats with `system_same_as_user`, chat messages (`render_messages`) fold system
  blocks into user turns too, as the model's template would: a server running Mistral's or
  Gemma's template refuses a system message that is not first (or any, Gemma 2).
- `system_placement = "last_user"` (Mistral v3, Tekken): the leading system blocks go before
  the last user turn's text, as Mistral's template and mistral-common put them — unless the
  chat opens with an assistant turn; then they stay the opening user turn.
- `system_preamble` (Llama 3.1's "Cutting Knowledge Date" lines): the prompt always opens with
  a system turn that starts with this text, made empty when the story has no system prompt.
- `wrap` is SillyTavern's: a newline between a prefix and its text, and a newline after the
  text when the role has no suffix. It does not put a newline before a non-empty suffix
  (SillyTavern does not either, and ChatML's `<|im_end|>` follows the text directly).
- The open block gets `last_output_sequence` (else `output_sequence`) and no suffix; its
  text is written without trailing spaces ("Ilya:"), as the models' templates and SillyTavern
  end it. When
  `last_output_sequence` drops the trailing space `output_sequence` has (Mistral's
  "[/INST]" vs "[/INST] "), that space goes back before a non-empty open text, as
  SillyTavern does.
- `bos` is the literal start-of-text the model's own chat template writes (Llama 3's
  `<|begin_of_text|>`, Mistral's `<s>`, Gemma's `<bos>`). A backend that adds BOS itself
  will then see two; copy the format and set `bos = ""` for such a backend.
- Macros: with `macro` (the default), `{{user}}` and `{{char}}` in every sequence and stop
  string are the story's names (`bind`), and `{{name}}` is the speaker of the block (the user
  for an input sequence, the character for an output one, "System" for a system block).
- `names_behavior` applies to blocks that carry their speaker (`Block.name`: a SillyTavern
  context preset's messages; a ctx template writes names into its text itself): "always"
  writes "Name: text", "none" the text alone, "force" the name only in a group chat (more than
  one character speaks) and never the user's. The open turn then ends "Name:" or the bare
  sequence, as SillyTavern's `formatInstructModePrompt` does.
- The oldest message (the first user or assistant block) takes `first_input_sequence` or
  `first_output_sequence` by its role; the last user block takes `last_input_sequence` (that
  wins when they are one block), as SillyTavern's `Generate` forces them.
- The system prompt (the system blocks before the first user or assistant block, from a ctx
  template) is wrapped with, in this order: `story_string_prefix/suffix` when the preset has
  them; `system_sequence_prefix/suffix` (SillyTavern 1.12.6); the system sequences when the
  system sequence names the system role (ChatML, Llama 3, Gemma 2: it has a turn of its own
  even with `system_same_as_user`); a user turn with `system_same_as_user` (Mistral); else
  as it is (Alpaca's `### Input:` marks system messages in the chat, not the prompt).
  A context preset's story string (`kind == "story"`) takes only `story_string_prefix/suffix`:
  SillyTavern 1.12.6 writes it as it is, its context presets carry the model's markup.

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

import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import read_input, utf8_text
from ..hbs.blocks import Block
from ..story.jsonload import JSONProblem, loads

NAMES_BEHAVIORS = ("none", "force", "always")
SYSTEM_PLACEMENTS = ("in_place", "last_user")

# Fields read from a SillyTavern preset that are written as themselves in a Format.
_SEQUENCE_FIELDS = (
    "system_sequence",
    "system_suffix",
    "input_sequence",
    "input_suffix",
    "output_sequence",
    "output_suffix",
    "first_output_sequence",
    "last_output_sequence",
    "first_input_sequence",
    "last_input_sequence",
    "last_system_sequence",
    "system_sequence_prefix",
    "system_sequence_suffix",
    "story_string_prefix",
    "story_string_suffix",
    "user_alignment_message",
)
_STR_FIELDS = (
    *_SEQUENCE_FIELDS,
    "name",
    "bos",
    "names_behavior",
    "stop_sequence",
    "system_placement",
    "system_preamble",
)
_BOOL_FIELDS = ("chat", "system_same_as_user", "wrap", "alternate", "skip_examples", "macro")
_TOML_KEYS = (*_STR_FIELDS, *_BOOL_FIELDS, "stop")

_NAME = re.compile(r"\{\{name\}\}", re.IGNORECASE)
_NAMES = re.compile(r"\{\{(?:(user)|char)\}\}|<(?:(USER)|BOT)>", re.IGNORECASE)
# A `{{name}}` inside a user's or character's name is text, not the macro: `bind` writes this
# mark in place of its `{{`, and the braces come back as the prompt leaves this module
# (`text_pieces`, `render_messages`), after every `{{name}}` macro is filled. Its nonce is new
# every run, so no story text can hold it.
_BRACES = f"\ue000braces-{os.urandom(6).hex()}\ue001"


@dataclass(frozen=True)
class Format:
    """One prompt format: the sequences that wrap each role's blocks, and the stop strings."""

    name: str
    chat: bool = False
    bos: str = ""
    system_sequence: str = ""
    system_suffix: str = ""
    input_sequence: str = ""
    input_suffix: str = ""
    output_sequence: str = ""
    output_suffix: str = ""
    first_output_sequence: str = ""
    last_output_sequence: str = ""
    first_input_sequence: str = ""
    last_input_sequence: str = ""
    last_system_sequence: str = ""
    system_sequence_prefix: str = ""
    system_sequence_suffix: str = ""
    story_string_prefix: str = ""
    story_string_suffix: str = ""
    skip_examples: bool = False
    macro: bool = True
    system_same_as_user: bool = False
    wrap: bool = False
    user_alignment_message: str = ""
    names_behavior: str = "always"
    alternate: bool = True
    system_placement: str = "in_place"
    system_preamble: str = ""
    stop: tuple[str, ...] = ()
    # A model's own Jinja chat template (`jinja_format`): when set, a text prompt is the
    # template's rendering of the format's turns, and the sequences above are unused. Its BOS
    # and EOS texts are the template's `bos_token` and `eos_token`.
    chat_template: str = field(default="", repr=False)
    bos_token: str | None = None  # None: undefined in the template, as a tokenizer without one leaves it
    eos_token: str | None = None
    # The story's names (`bind`), not read from a file: `{{user}}`, `{{char}}`, and whether
    # more than one character speaks (a group chat, for names_behavior = "force").
    user: str = ""
    char: str = ""
    group: bool = False


def bind(fmt: Format, user: str, char: str, group: bool = False) -> Format:
    """The format for one story: `{{user}}`/`{{char}}` filled in its sequences and stop
    strings (when `macro`), the names kept for `{{name}}` and `names_behavior`."""
    fmt = replace(fmt, user=user, char=char, group=group)
    if not fmt.macro:
        return fmt

    # One pass: a name is data, so a user named "{{char}}" stays "{{char}}".
    guarded = {
        True: _NAME.sub(lambda m: _BRACES + m[0][2:], user),
        False: _NAME.sub(lambda m: _BRACES + m[0][2:], char),
    }

    def fill(text: str) -> str:
        return _NAMES.sub(lambda m: guarded[bool(m.group(1) or m.group(2))], text)

    filled: dict[str, Any] = {key: fill(getattr(fmt, key)) for key in (*_SEQUENCE_FIELDS, "system_preamble", "bos")}
    return replace(fmt, stop=_unique([_shown(fill(s)) for s in fmt.stop]), **filled)


def _shown(text: str) -> str:
    """Text as it leaves the format: a name's own `{{name}}` given back (see `_BRACES`)."""
    return text.replace(_BRACES, "{{") if _BRACES in text else text


# --- finding and loading ------------------------------------------------------------------


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
    if suffix == ".gguf" or _is_gguf(name_or_path):  # an Ollama blob is a GGUF with no suffix
        return read_gguf_template(Path(name_or_path))
    if not name_or_path or "/" in name_or_path or "\\" in name_or_path:
        raise ConfigError(name_or_path, None, "expected a format name or a .toml/.json/.jinja/.gguf file")
    for folder in search_dirs:
        path = Path(folder) / f"{name_or_path}.toml"
        if os.path.lexists(path):  # a device or a dangling link there is named, not passed over
            return read_format(path)
    known = ", ".join(format_names(search_dirs)) or "none"
    raise ConfigError(name_or_path, None, f"no such format (known: {known})")


def read_format(path: Path) -> Format:
    """Load a format TOML file; unknown keys and wrong types are errors."""
    source = str(path)
    try:
        data = tomllib.loads(_read(path, "format file"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, f"not valid TOML: {exc}") from None
    for key in data:
        if key not in _TOML_KEYS:
            raise ConfigError(source, key, f"unknown key (expected one of: {', '.join(_TOML_KEYS)})")
    values = {key: value for key, value in data.items() if key != "stop"}
    stop = data.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
        raise ConfigError(source, "stop", f"expected a list of strings, got {stop!r}")
    if values.get("name") == "":
        raise ConfigError(source, "name", "expected a non-empty string")
    return _build(source, values, default_name=path.stem, extra_stop=stop)


def read_preset(path: Path) -> Format:
    """Load a SillyTavern instruct preset (JSON), as SillyTavern 1.12.6 loads one.

    Keys this module does not use (UI fields, `activation_regex`, ...) are ignored; a key it
    uses with a wrong type is an error, a `null` one counts as unset. Older keys migrate as
    SillyTavern migrates them (`separator_sequence` is `output_suffix`; `names` and
    `names_force_groups` become `names_behavior`, "force" when neither is given). The stop
    strings are SillyTavern's `getInstructStoppingSequences`: the lines of `stop_sequence` and of
    every prefix, each once, whitespace-only lines left out, spaces kept, behind a newline when
    the preset wraps; `{{name}}` is `{{user}}` in the input sequence, `{{char}}` in the output
    ones and "System" in the system ones (`bind` fills the names).
    """
    source = str(path)
    try:
        data = loads(_read(path, "instruct preset"))
    except JSONProblem as exc:
        raise ConfigError(source, None, f"not valid JSON (line {exc.line}): {exc.message}") from None
    if not isinstance(data, dict):
        raise ConfigError(source, None, "expected a JSON object (a SillyTavern instruct preset)")
    data = {key: value for key, value in data.items() if value is not None}
    if "input_sequence" not in data and "output_sequence" not in data and _is_tokenizer_config(data, path):
        return tokenizer_config_format(path, data)
    if "input_sequence" not in data and "output_sequence" not in data:
        kind = "a SillyTavern context preset (story_string)" if "story_string" in data else "not an instruct preset"
        raise ConfigError(
            source, None, f"is {kind}: a format needs input_sequence and output_sequence (an instruct preset)"
        )
    if "separator_sequence" in data:
        data.setdefault("output_suffix", data["separator_sequence"])
    if "names" in data and "names_behavior" not in data:
        data["names_behavior"] = "always" if data["names"] else ("force" if data.get("names_force_groups") else "none")

    # A preset is always a text format with no BOS of its own, and SillyTavern gives every
    # message its own turn.
    own = ("bos", "chat", "alternate", "system_placement", "system_preamble", "stop_sequence")
    wanted = [key for key in (*_STR_FIELDS, *_BOOL_FIELDS) if key not in own]
    values: dict[str, Any] = {key: data[key] for key in wanted if key in data}
    values["alternate"] = False
    values.setdefault("names_behavior", "force")
    if values.get("name") == "":
        del values["name"]
    stop_sequence = data.get("stop_sequence", "")
    _expect_str(source, "stop_sequence", stop_sequence)
    fmt = _build(source, values, default_name=path.stem, extra_stop=[])
    return replace(fmt, stop=_instruct_stops(fmt, stop_sequence))


def _instruct_stops(fmt: Format, stop_sequence: str) -> tuple[str, ...]:
    """SillyTavern's instruct stop strings (see `read_preset`)."""
    named: list[tuple[str, str]] = [
        (stop_sequence, ""),
        (fmt.input_sequence, "{{user}}"),
        (fmt.output_sequence, "{{char}}"),
        (fmt.first_output_sequence, "{{char}}"),
        (fmt.last_output_sequence, "{{char}}"),
        (fmt.system_sequence, "System"),
        (fmt.last_system_sequence, "System"),
    ]
    joined = "\n".join(_NAME.sub(name, seq) if name else seq for seq, name in named)  # names have no backslashes
    lines = [line for line in dict.fromkeys(joined.split("\n")) if line.strip()]
    return tuple(dict.fromkeys(("\n" if fmt.wrap else "") + line for line in lines))


# --- a model's own chat template (Jinja) ---------------------------------------------------


def jinja_format(template: str, *, bos: str | None, eos: str | None, name: str) -> Format:
    """A format whose text prompts are a model's own Jinja chat template rendered over the
    format's turns (`render.jinja`), with `bos` and `eos` as its `bos_token` and
    `eos_token` (None: undefined, as transformers leaves a token the tokenizer has not);
    `name` names it in errors ("model.gguf (tokenizer.chat_template)"). The
    template is compiled now, so one that is not valid Jinja is an error naming its line.

    Its stop strings are the EOS text and what the template writes right after an
    assistant's message (its end of turn: "<|im_end|>", "<|eot_id|>", "<end_of_turn>").
    Consecutive turns of one role are merged (`alternate`), so a template that demands
    alternating turns accepts the chat; system turns are sent as they are, for the template
    to place (or refuse: a template's own refusal is an error naming it)."""
    from .jinja import check_template, turn_end

    check_template(template, name)
    stop = _unique([eos or "", turn_end(template, name, bos=bos, eos=eos)])
    return Format(name=name, chat_template=template, bos_token=bos, eos_token=eos, macro=False, stop=stop)


def read_jinja(path: Path) -> Format:
    """A `.jinja` chat template file. It carries no BOS or EOS text of its own, so the
    template gets empty ones (a template that adds `eos_token` to a text still renders) —
    unless it is a model folder's `chat_template.jinja` with a `tokenizer_config.json`
    beside it, which has them."""
    template = _read(path, "template")
    config = path.parent / "tokenizer_config.json"
    if path.name == "chat_template.jinja" and config.is_file():
        data = _json_object(config, "instruct preset")
        bos, eos = _token_text(str(config), data, "bos_token"), _token_text(str(config), data, "eos_token")
        return jinja_format(template, bos=bos, eos=eos, name=str(path))
    return jinja_format(template, bos="", eos="", name=str(path))


def tokenizer_config_format(path: Path, data: dict[str, Any]) -> Format:
    """A Hugging Face `tokenizer_config.json`: its `chat_template` (a string, or a list of
    named templates, of which "default" is the chat one; a `chat_template.jinja` beside the
    file when it has none, as newer models keep it) and its `bos_token`/`eos_token` (strings,
    or `{"content": ...}` objects)."""
    source = str(path)
    template = data.get("chat_template")
    beside = path.parent / "chat_template.jinja"
    if template is None and beside.is_file():
        template = _read(beside, "template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            known = ", ".join(str(n) for n in named) or "none"
            raise ConfigError(source, "chat_template", f"has no template named 'default' (it has: {known})")
        template = named["default"]
    if template is None:
        raise ConfigError(source, "chat_template", "missing: this model has no chat template; give another --format")
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(source, "chat_template", f"expected a Jinja template (a string), got {template!r:.60}")
    bos, eos = _token_text(source, data, "bos_token"), _token_text(source, data, "eos_token")
    return jinja_format(template, bos=bos, eos=eos, name=f"{source} (chat_template)")


def _is_gguf(name_or_path: str) -> bool:
    """A path (not a bare name) of a file that starts as a GGUF file does."""
    from ..model.gguf import looks_like_gguf

    return ("/" in name_or_path or "\\" in name_or_path) and looks_like_gguf(name_or_path)


def read_gguf_template(path: Path) -> Format:
    """A GGUF model file's `tokenizer.chat_template`, with its BOS and EOS token texts."""
    from ..files import record_input
    from ..model.gguf import read_gguf

    record_input(path)
    model = read_gguf(path)
    if not model.chat_template:
        raise ConfigError(
            str(path), "tokenizer.chat_template", "missing: the file has no chat template; give a --format"
        )
    name = f"{path} (tokenizer.chat_template)"
    return jinja_format(model.chat_template, bos=model.bos_text, eos=model.eos_text, name=name)


def _is_tokenizer_config(data: dict[str, Any], path: Path) -> bool:
    return "chat_template" in data or path.name == "tokenizer_config.json"


def _token_text(source: str, data: dict[str, Any], key: str) -> str | None:
    """A special token as a tokenizer config writes it: a string, or an object with its
    "content" (transformers' AddedToken); None when it has none."""
    value = data.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(source, key, f'expected a string or an object with a "content" string, got {value!r:.60}')
    return value


def _json_object(path: Path, kind: str) -> dict[str, Any]:
    try:
        data = loads(_read(path, kind))
    except JSONProblem as exc:
        raise ConfigError(str(path), None, f"not valid JSON (line {exc.line}): {exc.message}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, "expected a JSON object")
    return data


def _read(path: Path, kind: str) -> str:
    """A format file's text (`kind`: "format file" or "instruct preset"), bounded and recorded
    as an input of the run (files.read_input)."""
    return utf8_text(read_input(path, kind), path)


def _expect_str(source: str, key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a string, got {value!r}")


def _build(source: str, values: dict[str, Any], default_name: str, extra_stop: list[str]) -> Format:
    """Type-check the scalar fields and make the Format; `stop_sequence` leads the stop list."""
    for key, value in values.items():
        if key in _BOOL_FIELDS and not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {value!r}")
        if key in _STR_FIELDS:
            _expect_str(source, key, value)
    behavior = values.get("names_behavior", "always")
    if behavior not in NAMES_BEHAVIORS:
        raise ConfigError(source, "names_behavior", f"expected one of {', '.join(NAMES_BEHAVIORS)}, got {behavior!r}")
    placement = values.get("system_placement", "in_place")
    if placement not in SYSTEM_PLACEMENTS:
        expected = ", ".join(SYSTEM_PLACEMENTS)
        raise ConfigError(source, "system_placement", f"expected one of {expected}, got {placement!r}")
    stop_sequence = values.pop("stop_sequence", "")
    known = {f.name for f in fields(Format)}
    return Format(
        name=values.pop("name", default_name),
        stop=_unique([*stop_sequence.splitlines(), *extra_stop]),
        **{key: value for key, value in values.items() if key in known},
    )


def _unique(strings: Sequence[str]) -> tuple[str, ...]:
    """Non-empty strings, each once, first occurrence kept."""
    return tuple(dict.fromkeys(s for s in strings if s))


# --- rendering ----------------------------------------------------------------------------


def merge_blocks(blocks: Sequence[Block]) -> list[Block]:
    """Merge consecutive blocks of one role (texts joined by a blank line) so roles
    alternate. An open block that has text ("Ilya:") merges into the closed turn of its role
    before it, so the model continues that turn; a blank one (no template open turn) stays a
    turn of its own."""
    merged: list[Block] = []
    for block in blocks:
        previous = merged[-1] if merged else None
        if previous and previous.role == block.role and (not block.open or block.text.strip()):
            merged[-1] = Block(block.role, f"{previous.text}\n\n{block.text}", block.open)
        else:
            merged.append(block)
    return merged


def turns(fmt: Format, blocks: Sequence[Block]) -> list[Block]:
    """The blocks as the format's turns: the alignment message in, system blocks folded into
    user turns where the model has no system role (the leading ones into the last user turn
    when `system_placement = "last_user"`), and consecutive turns of one role merged where
    the model demands alternating turns (`alternate`). A story string or preformatted text
    (`Block.kind`) is never folded or merged."""
    out = _aligned(fmt, _checked(blocks))
    if fmt.system_same_as_user:
        out = _folded(fmt, out)
    return merge_blocks(out) if fmt.alternate else out


def render_text(fmt: Format, blocks: Sequence[Block]) -> str:
    """A flat text-completion prompt, ending in the open turn the model continues."""
    return "".join(text_pieces(fmt, blocks))


def text_pieces(fmt: Format, blocks: Sequence[Block]) -> list[str]:
    """The text prompt in pieces: the BOS, then each turn with its sequences, the open turn
    last. Joined, they are `render_text`; apart, they can be priced one by one. A format
    with a chat template renders it whole (`_template_pieces`)."""
    if fmt.chat_template:
        return _template_pieces(fmt, blocks)
    blocks = list(blocks)
    if not blocks or not blocks[-1].open:
        blocks.append(Block("assistant", "", open=True))
    parts = [fmt.bos]
    all_turns = turns(fmt, blocks)
    if fmt.system_preamble:
        all_turns = _with_preamble(fmt, all_turns)
    chat = [i for i, b in enumerate(all_turns) if b.role != "system" and not b.kind and not b.open]
    first = chat[0] if chat else -1
    last_user = max((i for i in chat if all_turns[i].role == "user"), default=-1)
    for index, block in enumerate(all_turns):
        if block.open:
            if fmt.wrap and parts[-1].endswith("\n"):
                parts[-1] = parts[-1][:-1]  # the open turn starts on a line of its own
            parts.append(_open_turn(fmt, block))
            continue
        position = "last" if index == last_user else "first" if index == first else ""
        parts.append(_closed_turn(fmt, block, position, before_chat=first < 0 or index < first))
    return [_shown(part) for part in parts]


def render_messages(fmt: Format, blocks: Sequence[Block]) -> list[dict[str, str]]:
    """Chat messages `{"role", "content"}`, as the format's turns (see `turns`): a server
    applying the model's own chat template accepts them. A blank open block is dropped;
    otherwise it is sent last as a prefill, with trailing whitespace removed (some APIs
    refuse a prefill that ends in whitespace, and the model writes the space itself)."""
    return _messages(fmt, turns(fmt, blocks))


def _template_pieces(fmt: Format, blocks: Sequence[Block]) -> list[str]:
    """The prompt a model's chat template makes of the format's turns, sent as chat
    messages are (`render_messages`): an open turn with text ("Ilya:") is the final message,
    continued as transformers' `continue_final_message` continues it; a blank one, or none,
    asks for a new assistant turn (`add_generation_prompt`).

    A template that refuses the chat (its `raise_exception`: Mistral's and Gemma's demand
    that user and assistant alternate after one leading system message, Gemma 2's refuses a
    system message) is given it again as ctx's own formats for those models fold it
    (`_folded_for_template`): first with the system turns after the first user or assistant
    turn made user turns and a blank user turn before a chat that opens with the assistant,
    then with every system turn a user turn. Only when it refuses those too is the refusal
    an error (the first one, naming the template's own message).

    The prompt is one piece. Pieces a message (split at marks put after each message's text,
    checked against the plain render) priced the same to a token and built no faster:
    examples/lighthouse-case4.jsonl at windows of 4,096 and 16,384 with ChatML's and Llama
    3.1's templates, the head and tail priced 2,629 and 5,967 tokens (ChatML) in one piece, a token
    more in pieces, against 2,590 and 5,876 counted, in 14-25 ms a build either way."""
    from .jinja import TemplateRefusal, render_chat

    template, name, bos, eos = fmt.chat_template, fmt.name, fmt.bos_token, fmt.eos_token
    refusal: TemplateRefusal | None = None
    for messages, continued in template_chats(fmt, blocks):
        try:
            return [render_chat(template, messages, name=name, bos=bos, eos=eos, continue_final=continued)]
        except TemplateRefusal as exc:
            refusal = refusal or exc
    assert refusal is not None
    raise refusal


def template_chats(fmt: Format, blocks: Sequence[Block]) -> list[tuple[list[dict[str, str]], bool]]:
    """The chats a Jinja format gives its template, in the order it tries them (see
    `_template_pieces`), each with whether its last message is the open turn to continue."""
    all_turns = turns(fmt, blocks)
    continued = bool(all_turns) and all_turns[-1].open and bool(_said(fmt, all_turns[-1]).strip())
    attempts = (all_turns, _folded_for_template(all_turns, False), _folded_for_template(all_turns, True))
    return [(_messages(fmt, attempt), continued) for attempt in attempts]


def _folded_for_template(all_turns: Sequence[Block], every_system: bool) -> list[Block]:
    """The turns for a template that demands alternating user and assistant turns: system
    turns made user turns (all of them, or those after the leading ones), a blank user turn
    before an opening assistant turn, and turns of one role merged."""
    out: list[Block] = []
    leading = True
    for block in all_turns:
        leading = leading and block.role == "system"
        if block.role == "system" and (every_system or not leading):
            block = replace(block, role="user")
        if block.role == "assistant" and all(b.role == "system" for b in out):
            out.append(Block("user", ""))
        out.append(block)
    return merge_blocks(out)


def _messages(fmt: Format, all_turns: Sequence[Block]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for block in all_turns:
        text = _said(fmt, block)
        text = text.rstrip() if block.open else text
        if block.open and not text:
            continue
        messages.append({"role": block.role, "content": _shown(text)})
    return messages


def stop_sequences(fmt: Format, names: Sequence[str]) -> list[str]:
    """The format's stop strings, then "\\n{name}:" for each participant, each once."""
    return list(_unique([*fmt.stop, *(f"\n{name}:" for name in names if name.strip())]))


def includes_name(fmt: Format, name: str, role: str) -> bool:
    """SillyTavern's `names_behavior` for a speaker: "always" names everyone, "force" the
    characters of a group chat (and example dialogue's user), "none" no one."""
    if not name or role == "system":
        return False
    if fmt.names_behavior == "always":
        return True
    return fmt.names_behavior == "force" and fmt.group and name != fmt.user


def example_text(fmt: Format, role: str, text: str) -> str:
    """One line of example dialogue as SillyTavern's `formatInstructModeExamples` writes it:
    the speaker named as `names_behavior` says (the user's always with "force"), the role's
    sequences around it, `{{name}}` the speaker."""
    name = fmt.user if role == "user" else fmt.char
    named = includes_name(fmt, name, "assistant") or (fmt.names_behavior == "force" and role == "user")
    return _wrapped(fmt, role, f"{name}: {text}" if named else text, name, "")


def _said(fmt: Format, block: Block) -> str:
    """A block's text with its speaker's name, when it carries one and the format names it."""
    if block.name and includes_name(fmt, block.name, block.role):
        return f"{block.name}: {block.text}" if not block.open else f"{block.name}:{block.text}"
    return block.text


def _checked(blocks: Sequence[Block]) -> list[Block]:
    """The blocks as a list; only the last one may be open."""
    if any(block.open for block in blocks[:-1]):
        raise ValueError("only the last block may be open")
    return list(blocks)


def _aligned(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Put the user alignment message before the oldest message (the first user or assistant
    block), if that is an assistant's; it takes the first input sequence, as SillyTavern's."""
    if not fmt.user_alignment_message:
        return blocks
    for index, block in enumerate(blocks):
        if block.role == "system" or block.kind:
            continue
        if block.role == "assistant":
            align = Block("user", fmt.user_alignment_message, name=fmt.user)
            return [*blocks[:index], align, *blocks[index:]]
        break
    return blocks


def _folded(fmt: Format, blocks: list[Block]) -> list[Block]:
    """System blocks as user blocks. With `system_placement = "last_user"` the leading system
    blocks go before the text of the last user turn instead (Mistral v3 and Tekken; the first
    of the user blocks that merge into that turn) — unless
    the chat opens with an assistant turn: then they stay its opening user turn, so that
    turns still alternate. A system prompt with sequences of its own (`_prompt_sequences`),
    a story string and preformatted text stay as they are."""
    lead = 0
    while lead < len(blocks) and blocks[lead].role == "system":
        lead += 1
    keep = set(range(lead)) if _prompt_sequences(fmt) is not None else set()
    keep |= {i for i, b in enumerate(blocks) if b.kind}
    users = [i for i, b in enumerate(blocks) if b.role == "user" and i >= lead]
    if fmt.system_placement == "last_user" and lead and not keep and users and users[0] == lead:
        last = users[-1]
        while fmt.alternate and last - 1 > lead and blocks[last - 1].role == "user" and not blocks[last - 1].kind:
            last -= 1  # the last user *turn*: the run of user blocks that merges into it
        system = "\n\n".join(b.text for b in blocks[:lead])
        target = blocks[last]
        merged = Block("user", f"{system}\n\n{target.text}", target.open, name=target.name)
        blocks = [*blocks[lead:last], merged, *blocks[last + 1 :]]
        keep = set()
    return [replace(b, role="user") if b.role == "system" and i not in keep else b for i, b in enumerate(blocks)]


def _with_preamble(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Llama 3.1's knowledge-date lines: the prompt always opens with a system turn that
    starts with `system_preamble`."""
    if blocks and blocks[0].role == "system" and not blocks[0].open:
        return [Block("system", fmt.system_preamble + blocks[0].text), *blocks[1:]]
    return [Block("system", fmt.system_preamble), *blocks]


def _prompt_sequences(fmt: Format) -> tuple[str, str] | None:
    """The sequences around the system prompt of a ctx template; None: a user turn (see the
    module's notes)."""
    if fmt.story_string_prefix or fmt.story_string_suffix:
        return fmt.story_string_prefix, fmt.story_string_suffix
    if fmt.system_sequence_prefix or fmt.system_sequence_suffix:
        return fmt.system_sequence_prefix, fmt.system_sequence_suffix
    if "system" in fmt.system_sequence.lower():
        return fmt.system_sequence, fmt.system_suffix
    if fmt.system_same_as_user:
        return None
    return "", fmt.system_suffix


def _sequences(fmt: Format, role: str, position: str) -> tuple[str, str]:
    """The prefix and suffix of a closed block; `position` is "first" for the oldest message,
    "last" for the last user message."""
    if role == "system":
        return fmt.system_sequence, fmt.system_suffix
    if role == "user":
        forced = {"first": fmt.first_input_sequence, "last": fmt.last_input_sequence}.get(position, "")
        return forced or fmt.input_sequence, fmt.input_suffix
    forced = fmt.first_output_sequence if position == "first" else ""
    return forced or fmt.output_sequence, fmt.output_suffix


def _name_filled(fmt: Format, text: str, name: str) -> str:
    return _NAME.sub(lambda _: name or "System", text) if fmt.macro else text


def _wrapped(fmt: Format, role: str, text: str, name: str, position: str) -> str:
    """SillyTavern's `formatInstructModeChat`: prefix, text, suffix (a newline when the preset
    wraps and the role has none), joined by a newline when it wraps."""
    prefix, suffix = (_name_filled(fmt, s, name) for s in _sequences(fmt, role, position))
    return _join(fmt, prefix, text, suffix)


def _join(fmt: Format, prefix: str, text: str, suffix: str) -> str:
    separator = "\n" if fmt.wrap else ""
    suffix = suffix or separator
    return prefix + (separator if prefix else "") + text + suffix


def _closed_turn(fmt: Format, block: Block, position: str, before_chat: bool) -> str:
    """One closed block with its sequences (see the module's notes for the system prompt and
    the story string)."""
    if block.kind == "raw":
        return block.text
    if block.kind == "story":
        if not (fmt.story_string_prefix or fmt.story_string_suffix):
            return block.text
        separator = "\n" if fmt.wrap else ""
        prefix = fmt.story_string_prefix + (separator if fmt.story_string_prefix else "")
        return prefix + block.text + fmt.story_string_suffix
    if block.role == "system" and before_chat:
        sequences = _prompt_sequences(fmt)
        if sequences is not None:
            prefix, suffix = (_name_filled(fmt, s, "System") for s in sequences)
            return _join(fmt, prefix, block.text, suffix)
    return _wrapped(fmt, block.role, _said(fmt, block), block.name, position)


def _open_turn(fmt: Format, block: Block) -> str:
    """The open block, as SillyTavern's `formatInstructModePrompt`: its role's prefix (an
    assistant's last one), then "Name:" when the format names the speaker — no trailing
    space (a token of its own to a BPE tokenizer, and the model writes it anyway) — and no
    suffix. With `wrap` it stands on a line of its own. When `last_output_sequence` drops the
    trailing space `output_sequence` has (Mistral's "[/INST]" vs "[/INST] "), that space goes
    back before the name, as SillyTavern does."""
    if block.role != "assistant":
        prefix = _sequences(fmt, block.role, "")[0]
    else:
        prefix = fmt.last_output_sequence or fmt.output_sequence
    prefix = _name_filled(fmt, prefix, block.name or fmt.char)
    text = _said(fmt, block).rstrip(" ")
    separator = "\n" if fmt.wrap else ""
    if not text.strip():
        opening = separator + prefix
        return (opening.rstrip() if fmt.wrap else opening) + separator + text.strip(" ")
    filler = ""
    if (
        block.role == "assistant"
        and fmt.last_output_sequence
        and fmt.output_sequence[-1:].isspace()
        and not fmt.last_output_sequence[-1:].isspace()
    ):
        filler = fmt.output_sequence[-1]
    opening = separator + prefix + (separator if prefix else "") + filler + text
    return opening.rstrip() if fmt.wrap else opening
