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
    first_output_sequence = ""           # prefix of the first closed assistant block, if set
    last_output_sequence = ""            # prefix of the open assistant block, if set
    system_same_as_user = false          # true: system blocks are user blocks (see below)
    wrap = false                         # true: a newline after each prefix (see below)
    user_alignment_message = ""          # a user turn put before an assistant-first chat
    names_behavior = "always"            # "none" | "force" | "always"; accepted, no effect
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
- Macros (`{{char}}`, `{{name}}`) in sequences are not expanded: names are already in the
  block text.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .blocks import Block
from .errors import ConfigError

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
_BOOL_FIELDS = ("chat", "system_same_as_user", "wrap", "alternate")
_TOML_KEYS = (*_STR_FIELDS, *_BOOL_FIELDS, "stop")

# Older presets wrapped the system prompt with these (newer SillyTavern: story_string_*).
_LEGACY_SYSTEM = (
    ("system_sequence_prefix", "system_sequence_suffix"),
    ("story_string_prefix", "story_string_suffix"),
)


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
    system_same_as_user: bool = False
    wrap: bool = False
    user_alignment_message: str = ""
    names_behavior: str = "always"
    alternate: bool = True
    system_placement: str = "in_place"
    system_preamble: str = ""
    stop: tuple[str, ...] = ()


# --- finding and loading ------------------------------------------------------------------


def builtin_dirs() -> list[Path]:
    """Where the shipped formats are: inside an installed package, or in a source checkout."""
    here = Path(__file__).parent
    candidates = [here / "configs" / "formats", here.parent / "configs" / "formats"]
    return [path for path in candidates if path.is_dir()]


def format_names(search_dirs: Sequence[Path]) -> list[str]:
    """Every format name the search dirs offer, sorted, each once."""
    return sorted({path.stem for folder in search_dirs for path in Path(folder).glob("*.toml")})


def load_format(name_or_path: str, search_dirs: Sequence[Path]) -> Format:
    """A bare name is looked up as `<dir>/<name>.toml` (first dir that has it); a path
    ending `.toml` is read as a format file, a path ending `.json` as a SillyTavern preset."""
    suffix = Path(name_or_path).suffix.lower()
    if suffix == ".toml":
        return read_format(Path(name_or_path))
    if suffix == ".json":
        return read_preset(Path(name_or_path))
    if not name_or_path or "/" in name_or_path or "\\" in name_or_path:
        raise ConfigError(name_or_path, None, "expected a format name or a .toml/.json file")
    for folder in search_dirs:
        path = Path(folder) / f"{name_or_path}.toml"
        if path.is_file():
            return read_format(path)
    known = ", ".join(format_names(search_dirs)) or "none"
    raise ConfigError(name_or_path, None, f"no such format (known: {known})")


def read_format(path: Path) -> Format:
    """Load a format TOML file; unknown keys and wrong types are errors."""
    source = str(path)
    try:
        data = tomllib.loads(_read(path))
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
    """Load a SillyTavern instruct preset (JSON).

    Keys this module does not use (UI fields, `macro`, `activation_regex`, ...) are ignored;
    a key it uses with a wrong type is an error, a `null` one counts as unset. When
    `system_sequence` is empty, the older `system_sequence_prefix`/`_suffix` (or the newer
    `story_string_prefix`/`_suffix`) wrap system blocks instead, and then win over
    `system_same_as_user`: the preset said how to mark the system prompt. Stop strings are
    `stop_sequence` plus every sequence line, as SillyTavern's "sequences as stop strings".
    """
    source = str(path)
    try:
        data = json.loads(_read(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(source, None, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(source, None, "expected a JSON object (a SillyTavern instruct preset)")
    data = {key: value for key, value in data.items() if value is not None}
    if "input_sequence" not in data and "output_sequence" not in data:
        kind = "a SillyTavern context preset (story_string)" if "story_string" in data else "not an instruct preset"
        raise ConfigError(
            source, None, f"is {kind}: a format needs input_sequence and output_sequence (an instruct preset)"
        )

    # A preset is always a text format with no BOS of its own, and SillyTavern gives every
    # message its own turn.
    own = ("bos", "chat", "alternate", "system_placement", "system_preamble")
    wanted = [key for key in (*_STR_FIELDS, *_BOOL_FIELDS) if key not in own]
    values: dict[str, Any] = {key: data[key] for key in wanted if key in data}
    values["alternate"] = False
    if not data.get("system_sequence"):
        for prefix_key, suffix_key in _LEGACY_SYSTEM:
            prefix, suffix = data.get(prefix_key, ""), data.get(suffix_key, "")
            _expect_str(source, prefix_key, prefix)
            _expect_str(source, suffix_key, suffix)
            if prefix or suffix:
                values.update(system_sequence=prefix, system_suffix=suffix, system_same_as_user=False)
                break
    if values.get("name") == "":
        del values["name"]
    fmt = _build(source, values, default_name=path.stem, extra_stop=[])
    sequences = [
        fmt.input_sequence,
        fmt.output_sequence,
        fmt.first_output_sequence,
        fmt.last_output_sequence,
        "" if fmt.system_same_as_user else fmt.system_sequence,
    ]
    lines = [line.strip() for sequence in sequences for line in sequence.splitlines()]
    return replace(fmt, stop=_unique([*fmt.stop, *lines]))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(str(path), None, "is a directory, not a format file") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), None, "not UTF-8 text") from None


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
    the model demands alternating turns (`alternate`)."""
    out = _aligned(fmt, _checked(blocks))
    if fmt.system_same_as_user:
        out = _folded(fmt, out)
    return merge_blocks(out) if fmt.alternate else out


def render_text(fmt: Format, blocks: Sequence[Block]) -> str:
    """A flat text-completion prompt, ending in the open turn the model continues."""
    return "".join(text_pieces(fmt, blocks))


def text_pieces(fmt: Format, blocks: Sequence[Block]) -> list[str]:
    """The text prompt in pieces: the BOS, then each turn with its sequences, the open turn
    last. Joined, they are `render_text`; apart, they can be priced one by one."""
    blocks = list(blocks)
    if not blocks or not blocks[-1].open:
        blocks.append(Block("assistant", "", open=True))
    separator = "\n" if fmt.wrap else ""
    parts = [fmt.bos]
    first_output = True
    all_turns = turns(fmt, blocks)
    if fmt.system_preamble:
        all_turns = _with_preamble(fmt, all_turns)
    for block in all_turns:
        if block.open:
            parts.append(_open_turn(fmt, block, separator))
            continue
        prefix, suffix = _sequences(fmt, block.role, first_output)
        first_output = first_output and block.role != "assistant"
        parts.append(prefix + (separator if prefix else "") + block.text + (suffix or separator))
    return parts


def render_messages(fmt: Format, blocks: Sequence[Block]) -> list[dict[str, str]]:
    """Chat messages `{"role", "content"}`, as the format's turns (see `turns`): a server
    applying the model's own chat template accepts them. A blank open block is dropped;
    otherwise it is sent last as a prefill, with trailing whitespace removed (some APIs
    refuse a prefill that ends in whitespace, and the model writes the space itself)."""
    messages: list[dict[str, str]] = []
    for block in turns(fmt, blocks):
        text = block.text.rstrip() if block.open else block.text
        if block.open and not text:
            continue
        messages.append({"role": block.role, "content": text})
    return messages


def stop_sequences(fmt: Format, names: Sequence[str]) -> list[str]:
    """The format's stop strings, then "\\n{name}:" for each participant, each once."""
    return list(_unique([*fmt.stop, *(f"\n{name}:" for name in names if name.strip())]))


def _checked(blocks: Sequence[Block]) -> list[Block]:
    """The blocks as a list; only the last one may be open."""
    if any(block.open for block in blocks[:-1]):
        raise ValueError("only the last block may be open")
    return list(blocks)


def _aligned(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Put the user alignment message before the first non-system block, if that is an
    assistant's."""
    if not fmt.user_alignment_message:
        return blocks
    for index, block in enumerate(blocks):
        if block.role == "system":
            continue
        if block.role == "assistant":
            return [*blocks[:index], Block("user", fmt.user_alignment_message), *blocks[index:]]
        break
    return blocks


def _folded(fmt: Format, blocks: list[Block]) -> list[Block]:
    """System blocks as user blocks. With `system_placement = "last_user"` the leading system
    blocks go before the text of the last user block instead (Mistral v3 and Tekken) — unless
    the chat opens with an assistant turn: then they stay its opening user turn, so that
    turns still alternate."""
    lead = 0
    while lead < len(blocks) and blocks[lead].role == "system":
        lead += 1
    users = [i for i, b in enumerate(blocks) if b.role == "user" and i >= lead]
    if fmt.system_placement == "last_user" and lead and users and users[0] == lead:
        last = users[-1]
        system = "\n\n".join(b.text for b in blocks[:lead])
        target = blocks[last]
        blocks = [*blocks[lead:last], Block("user", f"{system}\n\n{target.text}", target.open), *blocks[last + 1 :]]
    return [Block("user", b.text, b.open) if b.role == "system" else b for b in blocks]


def _with_preamble(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Llama 3.1's knowledge-date lines: the prompt always opens with a system turn that
    starts with `system_preamble`."""
    if blocks and blocks[0].role == "system" and not blocks[0].open:
        return [Block("system", fmt.system_preamble + blocks[0].text), *blocks[1:]]
    return [Block("system", fmt.system_preamble), *blocks]


def _sequences(fmt: Format, role: str, first_output: bool) -> tuple[str, str]:
    """The prefix and suffix of a closed block."""
    if role == "system":
        return fmt.system_sequence, fmt.system_suffix
    if role == "user":
        return fmt.input_sequence, fmt.input_suffix
    prefix = (first_output and fmt.first_output_sequence) or fmt.output_sequence
    return prefix, fmt.output_suffix


def _open_turn(fmt: Format, block: Block, separator: str) -> str:
    """The open block: its role's prefix (an assistant's last one), its text without trailing
    spaces, no suffix: the models' templates and SillyTavern end on "Name:" (a trailing space
    would be a token of its own to a BPE tokenizer, and the model writes it anyway). The
    prefix is kept as it is, as SillyTavern keeps it."""
    if block.role != "assistant":
        prefix = _sequences(fmt, block.role, first_output=False)[0]
        return prefix + (separator if prefix else "") + block.text.rstrip(" ")
    prefix = fmt.last_output_sequence or fmt.output_sequence
    filler = ""
    if (
        block.text.strip()
        and fmt.last_output_sequence
        and fmt.output_sequence[-1:].isspace()
        and not fmt.last_output_sequence[-1:].isspace()
    ):
        filler = fmt.output_sequence[-1]
    return prefix + (separator if prefix else "") + filler + block.text.rstrip(" ")
