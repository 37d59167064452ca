"""Story readers: every supported file becomes the same `Story`.

The reader is chosen by what the file holds, not by its name: `detect_format` looks at
the first bytes (and, for JSON lines, the first record). `source_format` overrides it.

    native       JSONL records (a plain OpenAI messages JSONL file is one too)
    openai       one JSON array of {role, content, name?} (or, when asked for, a JSONL
                 file of messages only)
    sillytavern  a SillyTavern chat JSONL: a header line, then one row per message
    otaku        an otaku Markdown story export (format-version 3)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import reading
from ..model import Story
from .native import Problem, check_native, read_native
from .openai import read_openai
from .otaku import read_otaku
from .sillytavern import read_sillytavern

READERS: dict[str, Callable[[Path], Story]] = {
    "native": read_native,
    "openai": read_openai,
    "sillytavern": read_sillytavern,
    "otaku": read_otaku,
}

EXPECTED = (
    "expected native story JSONL, an OpenAI messages file (JSONL or one JSON array), "
    "a SillyTavern chat JSONL, or an otaku Markdown export (format-version 3)"
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SNIFF_BYTES = 64 * 1024


def read_story(path: Path | str, source_format: str | None = None) -> Story:
    """Read a story file; `source_format` overrides detection by content."""
    path = Path(path)
    name = source_format or detect_format(path)
    reader = READERS.get(name)
    if reader is None:
        raise StoryError(path, None, f"unknown story format {name!r}; expected one of {', '.join(READERS)}")
    return reader(path)


def check_story(path: Path | str, source_format: str | None = None) -> tuple[str, list[Problem]]:
    """The story's format and its problems: every one for a native file (its reader collects
    them), the first for the others (their readers stop there)."""
    path = Path(path)
    kind = source_format or detect_format(path)
    if kind == "native":
        return kind, check_native(path)[1]
    try:
        read_story(path, kind)
    except StoryError as exc:
        return kind, [Problem(exc.line, exc.message)]
    return kind, []


def detect_format(path: Path | str) -> str:
    """The name of the reader for this file, judged by its content; StoryError if none fits."""
    path = Path(path)
    head = _head(path)
    if head.startswith(PNG_SIGNATURE):
        raise StoryError(path, None, f"is a PNG image (a character card is read as a card, not a story); {EXPECTED}")
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    start = text.lstrip()
    if not start:
        return "native"  # the native reader says what an empty story lacks
    if start.startswith("["):
        return "openai"
    if start.startswith("{"):
        return _json_lines_format(path, text)
    if _is_otaku_export(text):
        return "otaku"
    raise StoryError(path, None, f"does not look like a story file; {EXPECTED}")


def _head(path: Path) -> bytes:
    with reading(path), path.open("rb") as handle:
        return handle.read(SNIFF_BYTES)


def _json_lines_format(path: Path, head: str) -> str:
    """Native or SillyTavern, by the first non-blank line; a card or other JSON is refused."""
    first = _first_line(path)
    try:
        obj: Any = json.loads(first)
    except json.JSONDecodeError:
        whole = _whole_json(head) if len(head.encode("utf-8")) < SNIFF_BYTES else None
        if isinstance(whole, dict):
            what = "a character card" if _looks_like_card(whole) else "one JSON object spanning lines"
            raise StoryError(path, None, f"is {what}, not a story; {EXPECTED}") from None
        return "native"  # the native reader names the line that is broken
    if not isinstance(obj, dict):
        return "native"
    if {"user_name", "character_name", "chat_metadata"} & obj.keys():
        return "sillytavern"
    if "mes" in obj and {"is_user", "is_system"} & obj.keys():
        return "sillytavern"  # a chat row first: the SillyTavern reader reports the missing header
    if "role" not in obj and "type" not in obj and _looks_like_card(obj):
        raise StoryError(path, None, f"is a character card, not a story; {EXPECTED}")
    return "native"


def _first_line(path: Path) -> str:
    with path.open("rb") as handle:
        for raw in handle:
            line = raw.decode("utf-8", errors="replace").removeprefix("\ufeff")
            if line.strip():
                return line
    return ""


def _whole_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _looks_like_card(obj: dict[str, Any]) -> bool:
    spec = obj.get("spec")
    return (isinstance(spec, str) and spec.startswith("chara_card")) or "first_mes" in obj


def _is_otaku_export(text: str) -> bool:
    """An HTML comment before the first "## " section that says otaku or names a format-version."""
    opening = text.find("<!--")
    closing = text.find("-->", opening)
    if opening < 0 or closing < 0 or "\n## " in "\n" + text[:opening]:
        return False
    body = text[opening + 4 : closing]
    return body.lstrip().lower().startswith("otaku") or "format-version:" in body


__all__ = [
    "check_story",
    "EXPECTED",
    "Problem",
    "READERS",
    "check_native",
    "detect_format",
    "read_native",
    "read_story",
]
