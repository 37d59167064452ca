"""SillyTavern chat files (`chats/<character>/<chat>.jsonl`).

Line 1 is a header: `{"user_name": ..., "character_name": ..., "chat_metadata": {...}}`.
Every later line is one row: `{"name", "is_user", "is_system", "mes", "swipes",
"swipe_id", "extra", ...}`.

- The text of a row is its selected swipe, `swipes[swipe_id]` (what SillyTavern shows and
  sends); a row without swipes (or without a swipe_id) uses `mes`. A swipe_id outside the
  swipes is an error, not a guess.
- Rows with `is_system: true` are hidden from the AI in SillyTavern: they never become
  messages, and are counted in `Story.hidden`.
- The role is "user" when `is_user`, else "assistant"; the speaker's name is the row's.
- The header's `user_name` and `character_name` fill `{{user}}` and `{{char}}`; a chat's
  scenario override (`chat_metadata.scenario`), when set, fills the scenario.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..model import Message, Story, StoryInfo
from .jsonload import JSONProblem, loads
from .native import _lines

HEADER_HINT = (
    "expected a SillyTavern header line with user_name and character_name "
    '(e.g. {"user_name": "You", "character_name": "Seraphina", "chat_metadata": {}})'
)


def read_sillytavern(path: Path) -> Story:
    """Read a SillyTavern chat JSONL file into a Story; StoryError names the line of any problem."""
    header: dict[str, Any] | None = None
    messages: list[Message] = []
    hidden = 0
    for number, text in _lines(path):
        if not text.strip():
            continue
        row = _object(path, number, text)
        if header is None:
            header = _header(path, number, row)
            continue
        if row.get("is_system") is True:
            hidden += 1
            continue
        messages.append(_message(path, number, row, len(messages) + 1))
    if header is None:
        raise StoryError(path, 1, f"the file is empty; {HEADER_HINT}")
    if not messages:
        raise StoryError(path, None, "the chat has no messages the AI can see (only the header or hidden rows)")
    return Story(
        path=path,
        messages=tuple(messages),
        info=_info(header),
        hidden=hidden,
        source_format="sillytavern",
    )


def _object(path: Path, number: int, text: str) -> dict[str, Any]:
    try:
        obj = loads(text)
    except JSONProblem as exc:
        raise StoryError(path, number, exc.message) from None
    if not isinstance(obj, dict):
        raise StoryError(path, number, f"expected a JSON object, found {type(obj).__name__}")
    return obj


def _header(path: Path, number: int, obj: dict[str, Any]) -> dict[str, Any]:
    if "user_name" not in obj or "character_name" not in obj:
        found = "a chat row" if "mes" in obj else "another object"
        raise StoryError(path, number, f"{HEADER_HINT}; the first line is {found}")
    for key in ("user_name", "character_name"):
        if not isinstance(obj[key], str):
            raise StoryError(path, number, f'header field "{key}" must be text')
    return obj


def _info(header: dict[str, Any]) -> StoryInfo:
    metadata = header.get("chat_metadata")
    scenario = metadata.get("scenario") if isinstance(metadata, dict) else None
    return StoryInfo(
        user=header["user_name"],
        char=header["character_name"],
        scenario=scenario if isinstance(scenario, str) else "",
    )


def _message(path: Path, number: int, row: dict[str, Any], position: int) -> Message:
    name = row.get("name")
    if name is not None and not isinstance(name, str):
        raise StoryError(path, number, f'"name" must be text, not {type(name).__name__}')
    return Message(
        number=position,
        role="user" if row.get("is_user") is True else "assistant",
        content=_selected_text(path, number, row),
        name=name or None,
        line=number,
    )


def _selected_text(path: Path, number: int, row: dict[str, Any]) -> str:
    """The selected swipe when the row has swipes and a swipe_id, else `mes`."""
    swipes = row.get("swipes")
    if swipes and "swipe_id" in row:
        if not isinstance(swipes, list) or not all(isinstance(s, str) for s in swipes):
            raise StoryError(path, number, '"swipes" must be a list of text')
        swipe_id = row["swipe_id"]
        if not isinstance(swipe_id, int) or isinstance(swipe_id, bool):
            raise StoryError(path, number, f'"swipe_id" must be a whole number, not {swipe_id!r}')
        if not 0 <= swipe_id < len(swipes):
            count = f"{len(swipes)} swipe" + ("s" if len(swipes) > 1 else "")
            raise StoryError(
                path, number, f"swipe_id {swipe_id} is out of range: the row has {count} (0–{len(swipes) - 1})"
            )
        return swipes[swipe_id]
    mes = row.get("mes")
    if not isinstance(mes, str):
        what = "missing" if mes is None else f"{type(mes).__name__}, not text"
        raise StoryError(path, number, f'a chat row needs "mes" (its text); it is {what}')
    return mes
