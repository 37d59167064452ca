"""The reader of a Hugging Face `tokenizer_config.json`: the model's own chat template, as a Format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...jsonload import JSONProblem, loads
from .model import Format, jinja_format
from .reading import read_text


def tokenizer_config_format(path: Path, data: dict[str, Any]) -> Format:
    """A Hugging Face `tokenizer_config.json`: its `chat_template` (a string, or a list of
    named templates, of which "default" is the chat one; a `chat_template.jinja` beside the
    file when it has none, as newer models keep it) and its `bos_token`/`eos_token` (strings,
    or `{"content": ...}` objects)."""
    source = str(path)
    template = data.get("chat_template")
    beside = path.parent / "chat_template.jinja"
    if template is None and beside.is_file():
        template = read_text(beside, "template")
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
    return config_format(template, source, data, f"{source} (chat_template)")


def config_format(template: str, source: str, data: dict[str, Any], name: str) -> Format:
    """`template` as a format named `name`, with what the tokenizer config `data` (read from
    `source`) says of its model: the BOS and EOS texts, the control tokens, and the BOS its
    server adds itself (`add_bos_token`: true; a config that does not say leaves it spelled)."""
    bos, eos = token_text(source, data, "bos_token"), token_text(source, data, "eos_token")
    server_bos = (bos or "") if data.get("add_bos_token") is True else ""
    return jinja_format(template, bos=bos, eos=eos, name=name, controls=config_controls(data), server_bos=server_bos)


def config_controls(data: dict[str, Any]) -> tuple[str, ...]:
    """The control tokens a tokenizer config names: its special `added_tokens_decoder` entries,
    and the markup-like others (`model.controls`' rule, as a tokenizer.json's added tokens)."""
    from ...model.controls import controls

    added = data.get("added_tokens_decoder")
    if not isinstance(added, dict):
        return ()
    entries = [e for e in added.values() if isinstance(e, dict) and isinstance(e.get("content"), str)]
    return controls(_Added(e["content"], e.get("special") is True) for e in entries)


class _Added:
    """An added token as `model.controls.controls` reads one."""

    def __init__(self, content: str, special: bool) -> None:
        self.content, self.special = content, special


def is_tokenizer_config(data: dict[str, Any], path: Path) -> bool:
    """Whether a `.json` file's object is a tokenizer config (else a SillyTavern preset)."""
    return "chat_template" in data or path.name == "tokenizer_config.json"


def token_text(source: str, data: dict[str, Any], key: str) -> str | None:
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


def json_object(path: Path, kind: str) -> dict[str, Any]:
    try:
        data = loads(read_text(path, kind))
    except JSONProblem as exc:
        raise ConfigError(str(path), None, f"not valid JSON (line {exc.line}): {exc.message}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, "expected a JSON object")
    return data
