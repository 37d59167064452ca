"""Reading a model's reply: the JSON object in it, however chatty the reply (code fences,
prose around it, typographic quotes typed as JSON's, a reply cut off at `max_tokens`), and
whether what it holds is a usable text."""

from __future__ import annotations

import json
import re
from itertools import islice
from typing import Any

from ..jsonload import items_past

_CURLY = str.maketrans({"“": '"', "”": '"'})
# a usable text: at least this many words with letters in them, among its first LOOKED words
LEAST_WORDS = 3
LOOKED = 1_000
# Items (values, keys, containers: `jsonload.items_past`) of the JSON in a reply's text: what
# is asked for holds a handful (a title and a summary); more than this is a server that ignored
# `max_tokens` and the schema, and decoding it could take as long and as much as the 64 MiB
# reply allows (60 MB of `[{},{},…]`: 20 million dicts, 1.6 GB)
REPLY_ITEMS = 10_000
# a JSON object cut off mid-way is closed up to this many characters (a reply cut at
# `max_tokens` is a few thousand tokens); the closing walks it a character at a time
REPAIRED = 1 << 20
_WORD = re.compile(r"\S+")


class Unreadable(ValueError):
    """A reply whose JSON is past reading: nested past what Python's `json` recurses into, or
    holding more than `REPLY_ITEMS` items. Its message is what the reply is, for `BadReply`."""


def json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text`, repaired when it can be (curly quotes, a missing end);
    None when there is none. Raises `Unreadable` for JSON nested past reading or of more than
    `REPLY_ITEMS` items, counted before anything is decoded."""
    start = text.find("{")
    if start < 0:
        return None
    rest = text[start:]
    if items_past(rest, REPLY_ITEMS):
        raise Unreadable(f"a reply whose text holds JSON of more than {REPLY_ITEMS:,} items; the JSON asked holds five")
    decoder = json.JSONDecoder()
    try:
        for candidate in (rest, rest.translate(_CURLY)):
            try:
                found, _ = decoder.raw_decode(candidate)
            except ValueError:
                found = _closed(candidate) if len(candidate) <= REPAIRED else None
            if isinstance(found, dict):
                return found
    except RecursionError:
        from ..backend.failures import TOO_DEEP

        raise Unreadable(TOO_DEEP) from None
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
    of letters among its first `LOOKED`, not a JSON fragment or a placeholder echoed back. None
    otherwise. Only those words are looked at: a reply may be 64 MiB of them."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if text.startswith(("{", "[")) or "{summary" in text or "the recap" == text:
        return None
    words = (found[0] for found in islice(_WORD.finditer(text), LOOKED))
    lettered = (w for w in words if re.search(r"\w", w) and not w.isdigit())
    return text if len(list(islice(lettered, LEAST_WORDS))) == LEAST_WORDS else None


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
    return field_in(reply, json_object(reply), name)


def field_in(reply: str, found: dict[str, Any] | None, name: str) -> str | None:
    """`field_of` the reply whose JSON object (`json_object(reply)`) is `found`."""
    if found is not None:
        return usable(found.get(name))
    if "{" in reply or '"' + name + '"' in reply:
        return None
    prose = re.sub(r"^\s*(title|summary|history)\s*:\s*", "", reply.strip(), flags=re.IGNORECASE)
    return usable(prose)
