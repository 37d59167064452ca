"""Reading a model's reply: the JSON object in it, however chatty the reply (code fences,
prose around it, typographic quotes typed as JSON's, a reply cut off at `max_tokens`), and
whether what it holds is a usable text."""

from __future__ import annotations

import json
import re
from typing import Any

_CURLY = str.maketrans({"“": '"', "”": '"'})
# a usable text: at least this many words with letters in them
LEAST_WORDS = 3


class TooDeep(ValueError):
    """A reply whose JSON nests past what Python's `json` can read (it raises RecursionError)."""


def json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`, repaired when it can be (curly quotes, a missing end);
    None when there is none. Raises `TooDeep` for JSON nested past reading."""
    start = text.find("{")
    if start < 0:
        return None
    decoder = json.JSONDecoder()
    try:
        for candidate in (text[start:], text[start:].translate(_CURLY)):
            try:
                found, _ = decoder.raw_decode(candidate)
            except ValueError:
                found = _closed(candidate)
            if isinstance(found, dict):
                return found
    except RecursionError:
        raise TooDeep("JSON nested too deep") from None
    return None


def _closed(text: str) -> Any:
    """A JSON object cut off mid-way, closed: the open string ended, the open brackets shut."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack:
            stack.pop()
    tail = ("\\" if escaped else "") + ('"' if in_string else "") + "".join(reversed(stack))
    try:
        return json.loads(text.rstrip().rstrip(",") + tail if not in_string else text + tail)
    except ValueError:
        return None


def usable(text: object) -> str | None:
    """`text` stripped when it is prose worth keeping: text, with at least `LEAST_WORDS` words
    of letters, not a JSON fragment or a placeholder echoed back. None otherwise."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    words = [w for w in text.split() if re.search(r"\w", w) and not w.isdigit()]
    if len(words) < LEAST_WORDS or text.startswith(("{", "[")) or "{summary" in text or "the recap" == text:
        return None
    return text


def bounded(text: str, limit: int) -> str:
    """`text` at most `limit` characters: a longer one cut at the last word boundary before the
    limit (mid-word only when one word is longer), ended with "…"."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = max(head.rfind(" "), head.rfind("\n"))
    if space > limit // 2:
        head = head[:space]
    return head.rstrip() + "…"


def field_of(reply: str, name: str) -> str | None:
    """The usable text of field `name` of the reply's JSON object; for a reply with no JSON in
    it at all (a server that took no format), the reply's prose itself."""
    found = json_object(reply)
    if found is not None:
        return usable(found.get(name))
    if "{" in reply or '"' + name + '"' in reply:
        return None
    prose = re.sub(r"^\s*(title|summary|history)\s*:\s*", "", reply.strip(), flags=re.IGNORECASE)
    return usable(prose)
