"""What the format readers share: a format file's text, and a checked Format from its values."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...files import read_input, utf8_text
from .model import BOOL_FIELDS, NAMES_BEHAVIORS, STR_FIELDS, SYSTEM_PLACEMENTS, Format, unique


def read_text(path: Path, kind: str) -> str:
    """A format file's text (`kind`: "format file", "instruct preset" or "template"), bounded
    and recorded as an input of the run (files.read_input)."""
    return utf8_text(read_input(path, kind), path)


def expect_str(source: str, key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(source, key, f"expected a string, got {value!r}")


def make_format(source: str, values: dict[str, Any], default_name: str, extra_stop: list[str]) -> Format:
    """Type-check the scalar fields and make the Format; `stop_sequence` leads the stop list."""
    for key, value in values.items():
        if key in BOOL_FIELDS and not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {value!r}")
        if key in STR_FIELDS:
            expect_str(source, key, value)
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
        stop=unique([*stop_sequence.splitlines(), *extra_stop]),
        **{key: value for key, value in values.items() if key in known},
    )
