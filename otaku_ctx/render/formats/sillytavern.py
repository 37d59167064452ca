"""The reader of a SillyTavern instruct preset: a `.json` file, read as SillyTavern 1.12.6 reads it.

A `.json` file that is a Hugging Face `tokenizer_config.json` instead is handed to that reader
(formats/tokenizer_config.py): which one a file is, is known only by what it holds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...jsonload import JSONProblem, loads
from .model import BOOL_FIELDS, NAME_MACRO, STR_FIELDS, Format
from .reading import expect_str, make_format, read_text
from .tokenizer_config import is_tokenizer_config, tokenizer_config_format


def read_preset(path: Path) -> Format:
    """Load a SillyTavern instruct preset (JSON), as SillyTavern 1.12.6 loads one.

    Keys ctx does not use (UI fields, `activation_regex`, ...) are ignored; a key it
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
        data = loads(read_text(path, "instruct preset"))
    except JSONProblem as exc:
        raise ConfigError(source, None, f"not valid JSON (line {exc.line}): {exc.message}") from None
    if not isinstance(data, dict):
        raise ConfigError(source, None, "expected a JSON object (a SillyTavern instruct preset)")
    data = {key: value for key, value in data.items() if value is not None}
    if "input_sequence" not in data and "output_sequence" not in data and is_tokenizer_config(data, path):
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
    wanted = [key for key in (*STR_FIELDS, *BOOL_FIELDS) if key not in own]
    values: dict[str, Any] = {key: data[key] for key in wanted if key in data}
    values["alternate"] = False
    values.setdefault("names_behavior", "force")
    if values.get("name") == "":
        del values["name"]
    stop_sequence = data.get("stop_sequence", "")
    expect_str(source, "stop_sequence", stop_sequence)
    fmt = make_format(source, values, default_name=path.stem, extra_stop=[])
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
    joined = "\n".join(NAME_MACRO.sub(name, seq) if name else seq for seq, name in named)  # names have no backslashes
    lines = [line for line in dict.fromkeys(joined.split("\n")) if line.strip()]
    return tuple(dict.fromkeys(("\n" if fmt.wrap else "") + line for line in lines))
