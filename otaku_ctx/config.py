"""Config in one place: find the file, load it, validate it, layer flags on top.

`~/.otaku/configs/config.toml` (`OTAKU_HOME` replaces `~/.otaku`; `--config PATH` names
another file). A missing file means the built-in defaults. Each effective value remembers
where it came from, so `ctx config show` can say.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .tokens import TOKENIZERS

DEFAULT_CARD_TEMPLATE = (
    "{{name}} joins the story.\n"
    "{{#if description}}{{description}}\n{{/if}}"
    "{{#if personality}}{{name}}'s personality: {{personality}}\n{{/if}}"
    "{{#if scenario}}Scenario: {{scenario}}\n{{/if}}"
    "{{#if exampleDialogue}}Example dialogue:\n{{exampleDialogue}}\n{{/if}}"
)


@dataclass(frozen=True)
class Key:
    """One setting: its default, what it accepts, and what it means."""

    default: Any
    kind: str  # "int", "float", "str", "reserve", "tokenizer"
    help: str


SCHEMA: dict[str, dict[str, Key]] = {
    "context": {
        "head_messages": Key(20, "int", "opening messages kept verbatim"),
        "min_tail_messages": Key(150, "int", "at least this many recent messages kept verbatim"),
        "max_context": Key(0, "int", "the prompt may use at most this many tokens; 0 = the model's window"),
        "tail_step": Key(50, "int", "case 5: the tail target drops by this many messages per rung"),
        "tail_floor": Key(50, "int", "case 5: the tail target never drops below this"),
        "reply_reserve": Key("auto", "reserve", 'tokens kept free for the reply, or "auto"'),
        "reserve_replies": Key(5, "int", "auto reserve: look at this many of the last assistant replies"),
        "reserve_factor": Key(1.2, "float", "auto reserve: the longest of them times this"),
        "reserve_default": Key(1024, "int", "auto reserve before any assistant reply exists"),
    },
    "prompt": {
        "template": Key("default", "str", "context template: default, serene, sillytavern, or a .hbs path"),
        "format": Key(
            "chat", "str", "prompt format: chat, chatml, llama3, mistral, alpaca, vicuna, gemma, raw, or a path"
        ),
        "post_history_depth": Key(0, "int", "post-history reminder: 0 = just before the reply, N = N messages earlier"),
        "instructions": Key("", "str", "instructions for {{instructions}} when the story has none"),
        "post_history_instructions": Key("", "str", "the reminder's instructions (postHistory.instructions)"),
        "card_template": Key(DEFAULT_CARD_TEMPLATE, "str", "how a card message reads (Handlebars)"),
        "user": Key("", "str", "the user's persona name when the story does not say"),
    },
    "model": {
        "window": Key(8192, "int", "the model's context window in tokens"),
        "tokenizer": Key("cl100k_base", "tokenizer", 'token counter: "cl100k_base" (exact) or "estimate" (len/4)'),
    },
}


def otaku_home() -> Path:
    """The otaku directory: `$OTAKU_HOME`, else `~/.otaku`."""
    env = os.environ.get("OTAKU_HOME")
    return Path(env).expanduser() if env else Path.home() / ".otaku"


def default_config_path() -> Path:
    return otaku_home() / "configs" / "config.toml"


@dataclass(frozen=True)
class Settings:
    """The effective settings; `sources` maps "section.key" to where its value came from."""

    values: dict[str, dict[str, Any]]
    sources: dict[str, str] = field(default_factory=dict)
    path: Path | None = None  # the file that was read, if any

    def __getitem__(self, dotted: str) -> Any:
        section, key = dotted.split(".", 1)
        return self.values[section][key]


def _check(source: str, dotted: str, key: Key, value: Any) -> Any:
    """Validate one value against its key; return it normalised."""

    def bad(expected: str) -> ConfigError:
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, (str, int, float, bool)) else repr(value)
        return ConfigError(source, dotted, f"expected {expected}, got {shown}")

    if key.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("a whole number")
        if value < 0:
            raise bad("a number ≥ 0")
        return value
    if key.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad("a number ≥ 0")
        return float(value)
    if key.kind == "reserve":
        if value == "auto":
            return value
        if isinstance(value, str) and value.isdigit():  # from a flag: --reserve 800
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad('a number of tokens ≥ 0 or "auto"')
        return value
    if key.kind == "tokenizer":
        if value not in TOKENIZERS:
            raise bad(" or ".join(f'"{t}"' for t in TOKENIZERS))
        return value
    if not isinstance(value, str):
        raise bad("text")
    return value


def _consistency(settings: dict[str, dict[str, Any]], sources: dict[str, str]) -> None:
    """Rules between values, named by where the offending value came from."""
    if settings["context"]["tail_step"] == 0:
        raise ConfigError(
            sources["context.tail_step"], "context.tail_step", "expected a number ≥ 1 (the tail must be able to shrink)"
        )
    if settings["model"]["window"] == 0:
        raise ConfigError(sources["model.window"], "model.window", "expected the model's window in tokens, ≥ 1")


def load_settings(
    path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    explicit: bool = False,
) -> Settings:
    """Defaults, then the config file (if it exists), then `overrides` ({"section.key": (value, source)}).

    `explicit` means the user named the file (`--config`): then a missing file is an error.
    """
    values = {s: {k: key.default for k, key in keys.items()} for s, keys in SCHEMA.items()}
    sources = {f"{s}.{k}": "default" for s, keys in SCHEMA.items() for k in keys}
    path = path or default_config_path()
    read: Path | None = None
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(str(path), None, "is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(path), None, f"is not valid TOML: {exc}") from None
        _apply_file(path, data, values, sources)
        read = path
    elif explicit:
        raise ConfigError(str(path), None, "no such config file (run `ctx config init` to write one)")
    for dotted, (value, source) in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        values[section][key] = _check(source, dotted, SCHEMA[section][key], value)
        sources[dotted] = source
    _consistency(values, sources)
    return Settings(values, sources, read)


def _apply_file(path: Path, data: dict[str, Any], values: dict, sources: dict) -> None:
    for section, table in data.items():
        if section not in SCHEMA:
            raise ConfigError(
                str(path), section, f"unknown section; expected one of {', '.join(f'[{s}]' for s in SCHEMA)}"
            )
        if not isinstance(table, dict):
            raise ConfigError(str(path), section, "expected a [section] table")
        for key, value in table.items():
            dotted = f"{section}.{key}"
            if key not in SCHEMA[section]:
                known = ", ".join(SCHEMA[section])
                raise ConfigError(str(path), dotted, f"unknown key; [{section}] takes {known}")
            values[section][key] = _check(str(path), dotted, SCHEMA[section][key], value)
            sources[dotted] = str(path)


def default_toml() -> str:
    """The documented default config file (what `ctx config init` writes), via tomli-w."""
    import tomli_w

    lines = [
        "# otaku-ctx settings (~/.otaku/configs/config.toml). Every value here is the built-in",
        "# default; delete a line to keep the default, change it to override.",
        "",
    ]
    for section, keys in SCHEMA.items():
        lines.append(f"[{section}]")
        for name, key in keys.items():
            lines.append(f"# {key.help}")
            lines.append(tomli_w.dumps({name: key.default}, multiline_strings=True).strip())
        lines.append("")
    return "\n".join(lines)
