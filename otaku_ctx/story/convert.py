"""Write any Story as a native JSONL story, and write files atomically.

The output holds, in this order: one `{"type": "story", ...}` line with the non-empty
StoryInfo fields (`cast` as a list of card objects), the system message as one leading
`{"role": "system"}` line, every message in order (a card message as a `{"type": "card"}`
line with its non-empty fields), then the scenes, then the lore (`{"type": "lore"}`, one per
character and scene). Reading it back gives the same Story but
for what the native format does not hold: source line numbers, `hidden` and
`source_format`.

One story cannot be written: one whose message 1 is a system message (not a card). The
native format reads leading system lines as the story's system message, so message 1 would
silently disappear into it and every scene range would shift; `to_native_lines` refuses it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from ..errors import StoryError
from .model import Card, Lore, LoreEntry, Message, Scene, Story, StoryInfo
from .worldinfo import WORLD_INFO_NAMES


def to_native_lines(story: Story) -> list[str]:
    """The story as native JSONL lines (without line ends)."""
    first = story.messages[0] if story.messages else None
    if first is not None and first.role == "system" and first.card is None:
        raise StoryError(
            story.path,
            first.line,
            "message 1 is a system message, which the native format would read as part of the story's "
            "system message; it cannot be converted as it is",
        )
    records: list[dict[str, Any]] = []
    info = _info_record(story.info)
    if info:
        records.append({"type": "story", **info})
    if story.system:
        records.append({"role": "system", "content": story.system})
    records.extend(_message_record(m) for m in story.messages)
    records.extend(_scene_record(s) for s in story.scenes)
    records.extend(_lore_record(entry) for entry in story.lore)
    world = [*story.world, *(e for card in story.known_cards for e in card.book)]
    records.extend(_world_info_record(entry) for entry in world)
    return [json.dumps(record, ensure_ascii=False) for record in records]


def to_native_text(story: Story) -> str:
    """The story as the text of a native JSONL file."""
    return "".join(f"{line}\n" for line in to_native_lines(story))


def _non_empty(obj: Any, skip: set[str]) -> dict[str, Any]:
    """The dataclass's fields that hold something (tuples as lists), less `skip`."""
    record: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if f.name in skip or value in ("", (), None):
            continue
        record[f.name] = list(value) if isinstance(value, tuple) else value
    return record


def _card_record(card: Card) -> dict[str, Any]:
    # A card's lorebook is written as lore lines bound to the card's character.
    return {"name": card.name, **_non_empty(card, {"name", "book"})}


def _info_record(info: StoryInfo) -> dict[str, Any]:
    record = _non_empty(info, {"cast"})
    if info.cast:
        record["cast"] = [_card_record(card) for card in info.cast]
    return record


def _message_record(message: Message) -> dict[str, Any]:
    if message.card is not None:
        return {"type": "card", **_card_record(message.card)}
    record: dict[str, Any] = {"role": message.role}
    if message.name:
        record["name"] = message.name
    record["content"] = message.content
    if message.sent is not None:  # a local date stays local: the zone it was written in is not known
        record["sent"] = message.sent.isoformat()
    return record


def _scene_record(scene: Scene) -> dict[str, Any]:
    record: dict[str, Any] = {"type": "scene"}
    if scene.id is not None:
        record["id"] = scene.id
    record["start"] = scene.start
    record["end"] = scene.end
    for key in ("title", "summary", "history"):
        if getattr(scene, key):
            record[key] = getattr(scene, key)
    return record


def _lore_record(lore: Lore) -> dict[str, Any]:
    return {"type": "lore", **_non_empty(lore, {"line"})}


_ENTRY_DEFAULTS = LoreEntry(uid=0, content="")


def _world_info_record(entry: LoreEntry) -> dict[str, Any]:
    """A World Info entry as a lore line in SillyTavern's field names; fields at their
    default are left out (a missing field reads as its default)."""
    record: dict[str, Any] = {"type": "lore", "uid": entry.uid}
    for name, key in WORLD_INFO_NAMES.items():
        value = getattr(entry, name)
        if name == "uid" or (name != "content" and value == getattr(_ENTRY_DEFAULTS, name)):
            continue
        record[key] = list(value) if isinstance(value, tuple) else value
    return record
