"""OpenAI-style messages: `[{"role": ..., "content": ..., "name": ...}, ...]`.

Two shapes are read. One JSON array for the whole file (what most API logs and exports
hold), or JSONL with one message a line. A plain JSONL messages file is also a valid native
story, so detection reads it as native; asked for as "openai" it is read the same way but
holds messages only: a card, scene or story record is an error, not silently taken in.

Leading system messages become the story's system message, as in the native format;
content given as a list of parts keeps its text parts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..jsonload import JSONProblem, raw_decode
from .model import Story
from .native import Problem, parse_records, read_lines, read_records


def read_openai(path: Path) -> Story:
    """Read an OpenAI messages file (a JSON array, or JSONL of messages only)."""
    problems: list[Problem] = []  # records that are not messages
    decoding: list[Problem] = []
    if _starts_with_bracket(path):
        records = _array_elements(path, _text(path), problems)
    else:
        records = _messages_only(read_records(path, decoding), problems)
    story, found = parse_records(path, records, decoding)
    errors = [p for p in [*problems, *found] if p.severity == "error"]
    if errors:
        first = min(errors, key=lambda p: (p.line is None, p.line or 0))
        raise StoryError(path, first.line, first.message)
    return replace(story, source_format="openai")


def _starts_with_bracket(path: Path) -> bool:
    for _, text in read_lines(path):
        if text.strip():
            return text.lstrip().startswith("[")
    return False


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise StoryError(path, line, "bytes that are not UTF-8; save the file as UTF-8") from None


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def _array_elements(path: Path, text: str, problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """Yield (line, value) of each element of the top-level array, with the line it starts on."""
    index = _skip_space(text, text.index("[") + 1)
    if index < len(text) and text[index] == "]":
        raise StoryError(path, _line_at(text, index), "the messages array is empty; a story needs at least one message")
    while True:
        line = _line_at(text, index)
        try:
            obj, end = raw_decode(text, index)
        except JSONProblem as exc:
            raise StoryError(path, exc.line, exc.message) from None
        if _is_message(obj, line, problems):
            yield line, obj
        index = _skip_space(text, end)
        if index < len(text) and text[index] == ",":
            index = _skip_space(text, index + 1)
            continue
        if index < len(text) and text[index] == "]":
            rest = _skip_space(text, index + 1)
            if rest < len(text):
                raise StoryError(path, _line_at(text, rest), "text after the end of the messages array")
            return
        where = _line_at(text, min(index, len(text)))
        raise StoryError(path, where, 'expected "," or "]" after a message in the array')


def _messages_only(records: Iterator[tuple[int, Any]], problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """The records of a JSONL messages file, less (and reporting) any record that is not a message."""
    for number, obj in records:
        if _is_message(obj, number, problems):
            yield number, obj


def _is_message(obj: object, line: int, problems: list[Problem]) -> bool:
    kind = obj.get("type", "message") if isinstance(obj, dict) else "message"
    if kind != "message":
        problems.append(
            Problem(line, f"a {kind!r} record in an OpenAI messages file, which holds messages only; read it as native")
        )
        return False
    return True
