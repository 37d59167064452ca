"""Story readers: every supported file becomes the same `Story`.

The reader is chosen by what the file holds, not by its name: `detect_format` looks at
the first bytes (and, for JSON lines, the first record). `source_format` overrides it.

    native       JSONL records (a plain OpenAI messages JSONL file is one too)
    openai       one JSON array of {role, content, name?} (or, when asked for, a JSONL
                 file of messages only)
    sillytavern  a SillyTavern chat JSONL: a header line, then one row per message
    otaku        an otaku Markdown story export (format-version 3)
    sharegpt     ShareGPT conversations ({"conversations": [{"from", "value"}]})
    finetune     OpenAI fine-tuning JSONL ({"messages": [...]} a line)
    tavernai     the oldest TavernAI chat: a JSON array of "Name: text" strings

Files that are something else get an error naming what they are: a character card, a World
Info lorebook, or a chat from another tool (oobabooga, Character.AI exports) that SillyTavern
converts on import.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import reading, refuse_utf16
from ..jsonload import JSONProblem, loads
from .model import Story
from .native import Problem, check_native, read_native

# name → (module, function); a reader's module is imported only when a file needs it.
READERS: dict[str, tuple[str, str]] = {
    "native": ("native", "read_native"),
    "openai": ("openai", "read_openai"),
    "sillytavern": ("sillytavern", "read_sillytavern"),
    "otaku": ("otaku", "read_otaku"),
    "sharegpt": ("neighbours", "read_sharegpt"),
    "finetune": ("neighbours", "read_finetune"),
    "tavernai": ("neighbours", "read_tavernai"),
}
MANY = ("sharegpt", "finetune")  # the formats holding many conversations (--conversation N)

EXPECTED = (
    "expected native story JSONL, an OpenAI messages file (JSONL or one JSON array), "
    "a SillyTavern chat JSONL, an otaku Markdown export (format-version 3), ShareGPT, "
    "or OpenAI fine-tuning JSONL"
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SNIFF_BYTES = 64 * 1024


def read_story(path: Path | str, source_format: str | None = None, conversation: int | None = None) -> Story:
    """Read a story file; `source_format` overrides detection by content; `conversation`
    (1-based) picks one conversation of a file that holds many."""
    path = Path(path)
    name = source_format or detect_format(path)
    home = READERS.get(name)
    if home is None:
        raise StoryError(path, None, f"unknown story format {name!r}; expected one of {', '.join(READERS)}")
    reader: Callable[..., Story] = getattr(import_module(f".{home[0]}", __package__), home[1])
    if name in MANY:
        return reader(path, conversation)
    if conversation is not None:
        raise StoryError(path, None, f"is a {name} story, which holds one conversation; leave out --conversation")
    return reader(path)


def check_story(
    path: Path | str, source_format: str | None = None, conversation: int | None = None
) -> tuple[str, list[Problem]]:
    """The story's format and its problems: every one for a native file (its reader collects
    them), the first for the others (their readers stop there)."""
    path = Path(path)
    kind = source_format or detect_format(path)
    if kind == "native":
        return kind, check_native(path)[1]
    try:
        read_story(path, kind, conversation)
    except StoryError as exc:
        return kind, [Problem(exc.line, exc.message)]
    return kind, []


def detect_format(path: Path | str) -> str:
    """The name of the reader for this file, judged by its content; StoryError if none fits."""
    path = Path(path)
    head = _head(path)
    refuse_utf16(path, head)
    if head.startswith(PNG_SIGNATURE):
        raise StoryError(path, None, f"is a PNG image (a character card is read as a card, not a story); {EXPECTED}")
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    start = text.lstrip()
    if not start:
        return "native"  # the native reader says what an empty story lacks
    if start.startswith("["):
        if start[1:].lstrip().startswith('"'):
            return "tavernai"  # an array of "Name: text" strings
        return "sharegpt" if '"conversations"' in start[:2000] else "openai"
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
        obj: Any = loads(first)
    except JSONProblem:
        whole = _whole_json(head) if len(head.encode("utf-8")) < SNIFF_BYTES else None
        if isinstance(whole, dict):
            if "conversations" in whole:
                return "sharegpt"
            what = _what_it_is(whole) or "one JSON object spanning lines"
            raise StoryError(path, None, f"is {what}, not a story; {EXPECTED}") from None
        return "native"  # the native reader names the line that is broken
    if not isinstance(obj, dict):
        return "native"
    if {"user_name", "character_name", "chat_metadata"} & obj.keys():
        return "sillytavern"
    if "mes" in obj and {"is_user", "is_system", "name"} & obj.keys():
        return "sillytavern"  # a chat row first: a group chat saved without a header
    if "role" not in obj and "type" not in obj:
        if isinstance(obj.get("messages"), list):
            return "finetune"
        if "conversations" in obj:
            return "sharegpt"
        what = _what_it_is(obj)
        if what:
            raise StoryError(path, None, f"is {what}, not a story; {EXPECTED}")
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
        return loads(text)
    except JSONProblem:
        return None


def _what_it_is(obj: dict[str, Any]) -> str:
    """What a JSON object that is no story is, in words with what to do; "" when unknown."""
    if _looks_like_card(obj):
        return "a character card (give it with --card)"
    if isinstance(obj.get("entries"), dict):
        return "a World Info lorebook (give it with --lore)"
    if "data_visible" in obj:
        return "an oobabooga chat (import it into SillyTavern and use the chat it saves)"
    if "histories" in obj:
        return "a Character.AI export (import it into SillyTavern and use the chat it saves)"
    return ""


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
