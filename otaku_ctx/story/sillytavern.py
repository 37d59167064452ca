"""SillyTavern chat files (`chats/<character>/<chat>.jsonl`, `group chats/<id>.jsonl`), of
every version in the wild, and TavernAI chats (the format SillyTavern inherited).

Line 1 is usually a header, `{"user_name", "character_name", "create_date", "chat_metadata"}`;
every later line is one row: `{"name", "is_user", "is_system", "mes", "swipes", "swipe_id",
"extra", ...}`.

- No header: group chats saved by SillyTavern 1.14 and earlier are rows only. A header with
  only `chat_metadata` (group chats since) is a header too.
- Header names: SillyTavern never reads them back (`{{user}}` is the persona, `{{char}}` the
  card), and 1.15 writes "unused" in both. A real name fills in when nothing better is given
  (see `otaku_ctx.names`); "unused" is dropped.
- The text of a row is its selected swipe, `swipes[swipe_id]`, as SillyTavern sends it; a row
  without swipes, or whose swipe_id points past them (a swipe still generating), sends `mes`.
  `extra.display_text` (what the screen shows instead) and `extra.reasoning` are never sent.
- Rows with `is_system: true` are hidden from the AI, and so are tool-invocation rows
  (`extra.tool_invocations`): neither becomes a message; both are counted in `Story.hidden`.
- Narrator rows (`extra.type: "narrator"`, from /sys) are sent as system messages with no name.
- A row's `send_date`, in any of the forms SillyTavern has written, is the message's `sent`
  (`story/dates.py`); one that cannot be read is no date, never an error.
- The role is "user" when `is_user`, else "assistant"; the speaker's name is the row's.
  `is_user` and `is_system` must be JSON booleans: the text "true" is an error, never read as
  false (a hand-edited or converted file says what it means, or is refused).
- The Summarize extension's rolling "story so far" (`public/scripts/extensions/memory/`) is
  kept in `extra.memory` of the last message it covers; SillyTavern uses the newest one on any
  row but the chat's last (`getLatestMemoryFromChat`), hidden rows included, and so does this
  reader. It becomes scene 1, messages 1 to that row (a hidden row: the last message before
  it), with the memory as both its summary and its history (source "sillytavern memory"):
  from message 1 on, the scene's own recap and the story so far through it are one text.
  Older memories are stale snapshots and are not read. A row's `extra` is its selected
  swipe's (SillyTavern copies `swipe_info[swipe_id].extra` there on a swipe).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import StoryError
from ..jsonload import JSONProblem, loads
from .dates import sent_at
from .model import Message, Scene, Story, StoryInfo
from .native import read_lines, uncollected

HEADER_KEYS = ("user_name", "character_name", "chat_metadata")
UNUSED = "unused"  # what SillyTavern 1.15+ writes for both names in a header
NARRATOR = "narrator"
MEMORY = "sillytavern memory"  # the source of a scene read from the Summarize extension's memory


class Memory(NamedTuple):
    """An `extra.memory` as found: on chat row `row` (1-based, the header not counted), file
    line `line`, after `messages` messages the AI sees."""

    row: int
    line: int
    messages: int
    text: object


def read_sillytavern(path: Path) -> Story:
    """Read a SillyTavern chat JSONL file into a Story; StoryError names the line of any problem."""
    with uncollected():  # a long chat is a great many small objects, as a native story is
        return _read_chat(path)


def _read_chat(path: Path) -> Story:
    header: dict[str, Any] | None = None
    messages: list[Message] = []
    hidden = 0
    rows = 0
    newest: Memory | None = None  # the newest memory so far, and the one before it
    before: Memory | None = None
    for number, text in read_lines(path):
        if not text.strip():
            continue
        row = _object(path, number, text)
        if rows == 0 and header is None and "mes" not in row and _is_header(row):
            header = _header(path, number, row)
            continue
        rows += 1
        if _flag(path, number, row, "is_system") or _is_tool_row(row):
            hidden += 1
        else:
            messages.append(_message(path, number, row, len(messages) + 1))
        memory = _memory(row)
        if memory is not None:
            newest, before = Memory(rows, number, len(messages), memory), newest
    if header is None and rows == 0:
        raise StoryError(path, 1, "the file is empty; a SillyTavern chat has a header line and one line a message")
    if not messages:
        raise StoryError(path, None, "the chat has no messages the AI can see (only the header or hidden rows)")
    # SillyTavern never reads the memory of the chat's last row (it may be regenerated).
    used = before if newest is not None and newest.row == rows else newest
    return Story(
        path=path,
        messages=tuple(messages),
        scenes=_memory_scene(path, used),
        info=_info(header or {}),
        hidden=hidden,
        source_format="sillytavern",
    )


def _memory(row: dict[str, Any]) -> object | None:
    """The row's `extra.memory` when SillyTavern would take it (a JavaScript truthy value)."""
    extra = row.get("extra")
    value = extra.get("memory") if isinstance(extra, dict) else None
    return None if value is None or value is False or value == 0 or value == "" else value


def _memory_scene(path: Path, memory: Memory | None) -> tuple[Scene, ...]:
    """The memory as scene 1: messages 1 to its row, summary and history alike (none when
    blank, or on a row before any message the AI sees)."""
    if memory is None:
        return ()
    if not isinstance(memory.text, str):
        shown = json.dumps(memory.text, ensure_ascii=False)[:40]
        raise StoryError(path, memory.line, f'"extra.memory" (the Summarize extension\'s) must be text, not {shown}')
    if not memory.text.strip() or memory.messages == 0:
        return ()
    text = memory.text
    return (Scene(order=1, start=1, end=memory.messages, summary=text, history=text, line=memory.line, source=MEMORY),)


def _is_header(row: dict[str, Any]) -> bool:
    return any(key in row for key in HEADER_KEYS)


def _object(path: Path, number: int, text: str) -> dict[str, Any]:
    try:
        obj = loads(text)
    except JSONProblem as exc:
        raise StoryError(path, number, exc.message) from None
    if not isinstance(obj, dict):
        raise StoryError(path, number, f"expected a JSON object, found {type(obj).__name__}")
    return obj


def _header(path: Path, number: int, obj: dict[str, Any]) -> dict[str, Any]:
    for key in ("user_name", "character_name"):
        if key in obj and not isinstance(obj[key], str):
            raise StoryError(path, number, f'header field "{key}" must be text')
    return obj


def _info(header: dict[str, Any]) -> StoryInfo:
    metadata = header.get("chat_metadata")
    scenario = metadata.get("scenario") if isinstance(metadata, dict) else None
    return StoryInfo(
        user=_real_name(header.get("user_name")),
        char=_real_name(header.get("character_name")),
        scenario=scenario if isinstance(scenario, str) else "",
    )


def _real_name(value: Any) -> str:
    return value if isinstance(value, str) and value.strip().lower() != UNUSED else ""


def _flag(path: Path, number: int, row: dict[str, Any], key: str) -> bool:
    value = row.get(key, False)
    if value is None or isinstance(value, bool):
        return bool(value)
    shown = json.dumps(value, ensure_ascii=False)[:40]
    raise StoryError(
        path, number, f'"{key}" must be true or false (a JSON boolean), not {shown}; write it without quotes'
    )


def _is_tool_row(row: dict[str, Any]) -> bool:
    extra = row.get("extra")
    return isinstance(extra, dict) and bool(extra.get("tool_invocations"))


def _message(path: Path, number: int, row: dict[str, Any], position: int) -> Message:
    name = row.get("name")
    if name is not None and not isinstance(name, str):
        raise StoryError(path, number, f'"name" must be text, not {type(name).__name__}')
    content = _selected_text(path, number, row)
    sent = sent_at(row.get("send_date"))
    extra = row.get("extra")
    if isinstance(extra, dict) and extra.get("type") == NARRATOR:
        return Message(number=position, role="system", content=content, line=number, sent=sent)
    return Message(
        number=position,
        role="user" if _flag(path, number, row, "is_user") else "assistant",
        content=content,
        name=name or None,
        line=number,
        sent=sent,
    )


def _selected_text(path: Path, number: int, row: dict[str, Any]) -> str:
    """The selected swipe when the row has it, else `mes` (a swipe still generating)."""
    swipes = row.get("swipes")
    if swipes and "swipe_id" in row:
        if not isinstance(swipes, list) or not all(isinstance(s, str) for s in swipes):
            raise StoryError(path, number, '"swipes" must be a list of text')
        swipe_id = row["swipe_id"]
        if not isinstance(swipe_id, int) or isinstance(swipe_id, bool):
            raise StoryError(path, number, f'"swipe_id" must be a whole number, not {swipe_id!r}')
        if 0 <= swipe_id < len(swipes):
            return swipes[swipe_id]
    mes = row.get("mes")
    if not isinstance(mes, str):
        what = "missing" if mes is None else f"{type(mes).__name__}, not text"
        raise StoryError(path, number, f'a chat row needs "mes" (its text); it is {what}')
    return mes
