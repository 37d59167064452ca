"""Character cards: Tavern cards V1, V2 and V3, from a JSON file or embedded in a PNG.

- V1 is a flat object (`name`, `description`, `personality`, `scenario`, `first_mes`,
  `mes_example`); V2 (`"spec": "chara_card_v2"`) and V3 (`"spec": "chara_card_v3"`) hold
  their fields under `data`. Any other `spec` is refused rather than half read.
- A PNG card carries the card as base64 JSON in a text chunk: keyword `chara` (V1/V2) or
  `ccv3` (V3). When both are there, `ccv3` wins, as in SillyTavern. `tEXt`, `zTXt` and
  `iTXt` chunks are read; the PNG is walked chunk by chunk with its lengths and CRCs checked,
  so a truncated or damaged file is an error, never a partial card.
- Windows line ends (CRLF) in card texts become plain newlines.
- Only the fields `Card` holds are kept, and the lorebook (`character_book`), converted the
  way SillyTavern converts it (story/worldinfo.py); alternate greetings, assets and
  extensions are not read.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import BOUNDS, read_input
from ..jsonload import JSONProblem, loads
from .model import Card, Message, Story
from .worldinfo import card_book_entries

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CARD_KEYWORDS = ("ccv3", "chara")  # in order of preference
TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
SPECS = ("chara_card_v2", "chara_card_v3")
# A card's JSON is kilobytes; a few megabytes with a lorebook. Past this it is damaged or
# hostile (a 1 MB zTXt chunk can inflate to gigabytes), and reading stops with an error.
CARD_LIMIT = BOUNDS["card"]

# Tavern card key -> Card field.
FIELDS = {
    "name": "name",
    "description": "description",
    "personality": "personality",
    "scenario": "scenario",
    "mes_example": "example_dialogue",
    "first_mes": "first_message",
    "system_prompt": "system_prompt",
    "post_history_instructions": "post_history_instructions",
    "creator_notes": "creator_notes",
}


def read_card(path: Path | str) -> Card:
    """Read a character card from a JSON file or a PNG; StoryError says what is wrong."""
    path = Path(path)
    data = _read_bytes(path)
    if data.startswith(PNG_SIGNATURE):
        keyword, text = _png_card_text(path, data)
        obj = _decode_chunk(path, keyword, text)
    else:
        obj = _json_file(path, data)
    return replace(card_from_json(path, obj), avatar=path.name)  # SillyTavern's avatar: the card's file


def card_from_json(path: Path | str, obj: Any) -> Card:
    """A Card from a decoded Tavern card (V1 flat, V2 or V3 under `data`)."""
    if not isinstance(obj, dict):
        raise StoryError(path, None, f"a character card is a JSON object, not {type(obj).__name__}")
    spec = obj.get("spec")
    if isinstance(obj.get("entries"), (dict, list)) and "name" not in obj and spec is None:
        raise StoryError(
            path, None, "is a World Info lorebook, not a character card; --lore takes it (--card takes a Tavern card)"
        )
    fields: Any
    if spec is None:
        fields = dict(obj)
        if not fields.get("creator_notes"):
            fields["creator_notes"] = obj.get("creatorcomment")  # SillyTavern's V1 name for it
    elif spec in SPECS:
        fields = obj.get("data")
        if not isinstance(fields, dict):
            raise StoryError(path, None, f'a {spec} card holds its fields in a "data" object, which is missing')
    else:
        raise StoryError(
            path, None, f'unknown card spec {spec!r}; expected {" or ".join(SPECS)}, or a V1 card without "spec"'
        )
    values: dict[str, Any] = {}
    for key, field in FIELDS.items():
        value = fields.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise StoryError(path, None, f'card field "{key}" must be text, not {type(value).__name__}')
        values[field] = value.replace("\r\n", "\n")
    if not values.get("name", "").strip():
        raise StoryError(path, None, 'the card has no "name"')
    book = card_book_entries(path, fields.get("character_book"), values["name"])
    return Card(tags=_tags(path, fields.get("tags")), book=book, **values)


def add_cards(story: Story, cards: Sequence[Card]) -> Story:
    """The story with each card joining as a card message at the start, before message 1.

    Messages are renumbered and scene ranges shifted by the number of cards, so every scene
    still holds the same messages.
    """
    shift = len(cards)
    if not shift:
        return story
    joined = tuple(Message(n, "system", "", card.name, card=card) for n, card in enumerate(cards, start=1))
    messages = tuple(replace(m, number=m.number + shift) for m in story.messages)
    scenes = tuple(replace(s, start=s.start + shift, end=s.end + shift) for s in story.scenes)
    return replace(story, messages=joined + messages, scenes=scenes)


def _tags(path: Path | str, tags: Any) -> tuple[str, ...]:
    if tags is None:
        return ()
    if isinstance(tags, str):  # some editors write "a, b, c"
        return tuple(t.strip() for t in tags.split(",") if t.strip())
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise StoryError(path, None, 'card field "tags" must be a list of text')
    return tuple(tags)


def _read_bytes(path: Path) -> bytes:
    return read_input(path, "card")


def _json_file(path: Path, data: bytes) -> Any:
    if len(data) > CARD_LIMIT:
        raise StoryError(path, None, f"is {len(data):,} bytes, more than any character card ({CARD_LIMIT // 2**20} MB)")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise StoryError(path, None, "is neither a PNG nor UTF-8 JSON; expected a character card") from None
    try:
        return loads(text)
    except JSONProblem as exc:
        raise StoryError(path, exc.line, exc.message) from None


# -- PNG -----------------------------------------------------------------------------------


def _png_card_text(path: Path, data: bytes) -> tuple[str, str]:
    """The text of the card chunk (`ccv3` before `chara`) and its keyword."""
    found = _png_text_chunks(path, data)
    for keyword in CARD_KEYWORDS:
        if keyword in found:
            return keyword, found[keyword]
    raise StoryError(path, None, "the PNG holds no character card (no text chunk named 'chara' or 'ccv3')")


def _png_text_chunks(path: Path, data: bytes) -> dict[str, str]:
    """Walk the chunks up to IEND; return the card text chunks by keyword (the first of each)."""
    found: dict[str, str] = {}
    pos = len(PNG_SIGNATURE)
    while True:
        if pos + 8 > len(data):
            raise StoryError(path, None, f"is a truncated PNG: it ends at byte {len(data):,} before its IEND chunk")
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 8 + length + 4
        if end > len(data):
            name = kind.decode("latin-1")
            raise StoryError(
                path,
                None,
                f"is a truncated PNG: chunk {name} at byte {pos:,} needs {length + 12:,} bytes "
                f"but only {len(data) - pos:,} remain",
            )
        if kind in TEXT_CHUNKS:
            body = data[pos + 8 : pos + 8 + length]
            (crc,) = struct.unpack(">I", data[end - 4 : end])
            if zlib.crc32(kind + body) != crc:
                what = f"the {kind.decode()} chunk at byte {pos:,}"
                raise StoryError(path, None, f"is a damaged PNG: {what} fails its CRC check")
            keyword = body.partition(b"\0")[0].decode("latin-1").lower()
            if keyword in CARD_KEYWORDS and keyword not in found:  # other text is never inflated
                found[keyword] = _text_chunk(path, kind, body)[1]
        if kind == b"IEND":
            return found
        pos = end


def _text_chunk(path: Path, kind: bytes, body: bytes) -> tuple[str, str]:
    """(keyword, text) of a tEXt, zTXt or iTXt chunk."""
    keyword, _, rest = body.partition(b"\0")
    name = keyword.decode("latin-1")
    try:
        if kind == b"tEXt":
            return name, rest.decode("latin-1")
        if kind == b"zTXt":
            return name, _inflate(path, kind, name, rest[1:]).decode("latin-1")
        compressed, rest = rest[:1] == b"\x01", rest[2:]
        _language, _, rest = rest.partition(b"\0")
        _translated, _, text = rest.partition(b"\0")
        return name, (_inflate(path, kind, name, text) if compressed else text).decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise StoryError(path, None, f"the PNG's {kind.decode()} chunk {name!r} cannot be read: {exc}") from None


def _inflate(path: Path, kind: bytes, name: str, data: bytes) -> bytes:
    """zlib-inflate at most CARD_LIMIT bytes: a compressed chunk cannot make memory explode."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, CARD_LIMIT)
    if inflater.unconsumed_tail:
        raise StoryError(
            path,
            None,
            f"the PNG's {kind.decode()} chunk {name!r} inflates to more than {CARD_LIMIT // 2**20} MB, "
            "far more than any character card; the file is damaged or not a card",
        )
    if not inflater.eof:
        raise StoryError(
            path, None, f"the PNG's {kind.decode()} chunk {name!r} is truncated (its zlib stream ends early)"
        )
    return out


def _decode_chunk(path: Path, keyword: str, text: str) -> Any:
    """The JSON a card chunk carries: base64 as the cards' writers store it (plain JSON is accepted)."""
    where = f"the PNG's {keyword!r} chunk"
    if len(text) > CARD_LIMIT * 4 // 3 + 4:  # checked before any decoding: bounded time
        raise StoryError(
            path, None, f"{where} holds {len(text):,} characters, more than any character card; the file is damaged"
        )
    if text.lstrip().startswith("{"):
        raw = text
    else:
        try:
            decoded = base64.b64decode("".join(text.split()), validate=True)
        except binascii.Error:
            raise StoryError(path, None, f"{where} is not valid base64 (the card data is damaged)") from None
        try:
            raw = decoded.decode("utf-8")
        except UnicodeDecodeError:
            raise StoryError(path, None, f"{where} does not decode to UTF-8 text (the card data is damaged)") from None
    try:
        return loads(raw)
    except JSONProblem as exc:
        raise StoryError(path, None, f"{where} holds bad JSON (line {exc.line}: {exc.message})") from None
