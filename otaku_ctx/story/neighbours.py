"""Files people keep next to their chats: ShareGPT datasets, OpenAI fine-tuning JSONL, and
the oldest TavernAI chats.

    sharegpt   {"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}]}, one such
               object, a JSON array of them, or JSONL with one a line
    finetune   OpenAI fine-tuning JSONL: {"messages": [{"role", "content", "name"?}]} a line
    tavernai   a JSON array of "Name: text" strings, one a message: how TavernAI saved a chat
               before its JSONL rows (SillyTavern shipped `characters/Aqua/chats/1673181146000.json`
               so until January 2023). Such a chat opens with the character's greeting, so the
               first speaker is the character (assistant) and every other name is the user; a
               string with no "Name:" continues the one before it.

Both can hold many conversations; a story is one. `conversation` (1-based, `--conversation N`)
picks it. A ShareGPT file of one conversation needs none; a fine-tuning file defaults to its
last conversation (the newest), and says so in `Story.notes`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..jsonload import JSONProblem, loads
from .model import Story
from .native import parse_lines, read_lines

# ShareGPT `from` values as the datasets write them -> roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


def read_sharegpt(path: Path, conversation: int | None = None) -> Story:
    """One ShareGPT conversation as a story; several need `conversation`."""
    found = _conversations(path, "conversations")
    line, obj = _pick(path, found, conversation, default_last=False)
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise StoryError(path, line, 'a ShareGPT conversation needs "conversations": a list of turns')
    records = []
    for index, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise StoryError(path, line, f'turn {index} needs "from" and "value" (its text)')
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            known = ", ".join(sorted(SHAREGPT_ROLES))
            raise StoryError(
                path, line, f'turn {index} has an unknown "from" {turn.get("from")!r}; expected one of {known}'
            )
        records.append((line, json.dumps({"role": role, "content": turn["value"]})))
    return _story(path, records, "sharegpt")


def read_finetune(path: Path, conversation: int | None = None) -> Story:
    """One conversation of an OpenAI fine-tuning JSONL file (default: the last)."""
    found = _conversations(path, "messages")
    line, obj = _pick(path, found, conversation, default_last=True)
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise StoryError(path, line, 'a fine-tuning line needs "messages": a list of messages')
    records = []
    for message in messages:
        if isinstance(message, dict):
            message = {k: v for k, v in message.items() if k in ("role", "content", "name")}
        records.append((line, json.dumps(message)))
    story = _story(path, records, "finetune")
    if conversation is None and len(found) > 1:
        note = f"{path}: {len(found)} conversations; read the last (line {line}); pick one with --conversation N"
        story = replace(story, notes=(note,))
    return story


def read_tavernai(path: Path) -> Story:
    """A TavernAI chat saved as a JSON array of "Name: text" strings (see the module's notes)."""
    start, whole = _whole(path, list(read_lines(path)))
    if not isinstance(whole, list) or not all(isinstance(item, str) for item in whole):
        raise StoryError(path, start, 'a TavernAI chat is a JSON array of "Name: text" strings')
    messages: list[dict[str, str]] = []
    character = ""
    for item in whole:
        name, colon, text = item.partition(": ")
        if not colon or "\n" in name or not name.strip():
            if not messages:
                raise StoryError(path, start, f'the first message does not start with "Name: ": {item[:40]!r}')
            messages[-1]["content"] += "\n" + item.rstrip("\n")
            continue
        character = character or name
        role = "assistant" if name == character else "user"
        messages.append({"role": role, "name": name, "content": text.rstrip("\n")})
    if not messages:
        raise StoryError(path, start, "the chat holds no message")
    return _story(path, [(start, json.dumps(m, ensure_ascii=False)) for m in messages], "tavernai")


def _story(path: Path, records: list[tuple[int, str]], source_format: str) -> Story:
    story, problems = parse_lines(path, records)
    for problem in problems:
        if problem.severity == "error":
            raise StoryError(path, problem.line, problem.message)
    return replace(story, source_format=source_format)


def _conversations(path: Path, key: str) -> list[tuple[int, dict[str, Any]]]:
    """(line, object) of each conversation: JSONL, or one JSON value (an object or an array)."""
    lines = list(read_lines(path))
    first = next((t for _, t in lines if t.strip()), "")
    if first.lstrip().startswith("[") or not _jsonl(first):
        start, whole = _whole(path, lines)
        items = whole if isinstance(whole, list) else [whole]
        found = [(start, item) for item in items]
    else:
        found = []
        for number, line in lines:
            if not line.strip():
                continue
            try:
                found.append((number, loads(line)))
            except JSONProblem as exc:
                raise StoryError(path, number, _hinted(exc, "line")) from None
    for number, item in found:
        if not isinstance(item, dict) or key not in item:
            raise StoryError(path, number, f'expected a conversation object with "{key}"')
    if not found:
        raise StoryError(path, None, "the file holds no conversation")
    return found


def _whole(path: Path, lines: list[tuple[int, str]]) -> tuple[int, Any]:
    """(the first non-blank line's number, the file decoded as one JSON value)."""
    start = next((n for n, t in lines if t.strip()), 1)
    try:
        return start, loads("".join(t for _, t in lines))
    except JSONProblem as exc:
        raise StoryError(path, exc.line if exc.column else start, _hinted(exc, "file")) from None


def _hinted(problem: JSONProblem, what: str) -> str:
    """The decoder's words, with the likely cause of malformed JSON in a conversation file."""
    cut = problem.message.startswith("malformed JSON")
    return f"{problem.message} (is the {what} cut short?)" if cut else problem.message


def _jsonl(first: str) -> bool:
    """Whether the first non-blank line is a JSON value of its own (a JSONL file)."""
    try:
        loads(first)
    except JSONProblem:
        return False
    return True


def _pick(
    path: Path, found: list[tuple[int, dict[str, Any]]], conversation: int | None, *, default_last: bool
) -> tuple[int, dict[str, Any]]:
    count = len(found)
    if conversation is None:
        if count == 1 or default_last:
            return found[-1]
        raise StoryError(
            path, None, f"the file holds {count} conversations; pick one with --conversation N (1–{count})"
        )
    if not 1 <= conversation <= count:
        raise StoryError(
            path, None, f"there is no conversation {conversation}: the file holds {count} (--conversation 1–{count})"
        )
    return found[conversation - 1]
