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
- The role is "user" when `is_user`, else "assistant"; the speaker's name is the row's.
  `is_user` and `is_system` must be JSON booleans: the text "true" is an error, never read as
  false (a hand-edited or converted file says what it means, or is refused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import StoryError
from .jsonload import JSONProblem, loads
from .model import Message, Story, StoryInfo
from .native import read_lines

HEADER_KEYS = ("user_name", "character_name", "chat_metadata")
UNUSED = "unused"  # what SillyTavern 1.15+ writes for both names in a header
NARRATOR = "narrator"


def read_sillytavern(path: Path) -> Story:
    """Read a SillyTavern chat JSONL file into a Story; StoryError names the line of any problem."""
    header: dict[str, Any] | None = None
    messages: list[Message] = []
    hidden = 0
    rows = 0
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
            continue
        messages.append(_message(path, number, row, len(messages) + 1))
    if header is None and rows == 0:
        raise StoryError(path, 1, "the file is empty; a SillyTavern chat has a header line and one line a message")
    if not messages:
        raise StoryError(path, None, "the chat has no messages the AI can see (only the header or hidden rows)")
    return Story(
        path=path,
        messages=tuple(messages),
        info=_info(header or {}),
        hidden=hidden,
        source_format="sillytavern",
    )


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
    extra = row.get("extra")
    if isinstance(extra, dict) and extra.get("type") == NARRATOR:
        return Message(number=position, role="system", content=content, line=number)
    return Message(
        number=position,
        role="user" if _flag(path, number, row, "is_user") else "assistant",
        content=content,
        name=name or None,
        line=number,
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
