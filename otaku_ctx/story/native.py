"""The native story format: JSONL, one object per line (see docs/architecture.md).

    {"role": "user"|"assistant"|"system", "name": "Mara", "content": "..."}   a message
      (and "sent": "2025-03-04T19:05:00Z", when it was sent, as SillyTavern's send_date says)
    {"type": "card", "name": "Ilya", "description": "...", ...}              a card (numbered)
    {"type": "scene", "id": 4, "start": 65, "end": 95, "summary": "...", "history": "..."}
    {"type": "story", "title": "...", "user": "...", "scenario": "...", ...} facts about the story
    {"type": "lore", "name": "Ilya", "scene": 4, "state": "...", "history": "...", "entry": "..."}
    {"type": "lore", "uid": 3, "key": ["forest"], "content": "...", ...}   (World Info, docs/lore.md)
                                                 what a character knows at the end of a scene

Leading system messages (before any other message) form the story's system message. A
system message later on is an ordinary numbered message. Reading streams line by line and
collects every problem, so `ctx validate` can report them all at once.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import reading
from ..jsonload import MAX_ITEMS, JSONProblem, QuickError, loads, quick_loads
from .dates import sent_at
from .model import ROLES, Card, Lore, LoreEntry, Message, Scene, Story, StoryInfo
from .worldinfo import entry_from_world_info

CARD_FIELDS = {f.name for f in fields(Card)} - {"tags", "aliases", "book"}
LORE_TEXTS = ("state", "history", "entry")
_ROLE = {role: role for role in ROLES}  # one shared str per role, whatever the decoder made
BOM = b"\xef\xbb\xbf"
INFO_FIELDS = {f.name for f in fields(StoryInfo)}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a story file. Errors stop a build; warnings do not."""

    line: int | None
    message: str
    severity: str = "error"  # "error" | "warning"


@dataclass
class StoryBuilder:
    path: Path
    messages: list[Message] = field(default_factory=list)
    scenes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    system: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    lore: list[Lore] = field(default_factory=list)
    world: list[LoreEntry] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # one shared str per speaker name

    def error(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(line, message))


def read_lines(path: Path, problems: list[Problem] | None = None) -> Iterator[tuple[int, str]]:
    """Yield (line number, text) of a UTF-8 file, streaming. A line of bytes that are not
    UTF-8 is a StoryError, or, given `problems`, reported there and skipped."""
    with reading(path):
        handle = path.open("rb")
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                message = f"bytes that are not UTF-8 at column {exc.start + 1}; save the file as UTF-8"
                if problems is None:
                    raise StoryError(path, number, message) from None
                problems.append(Problem(number, message))
                continue
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _add_message(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    role = obj.get("role")
    role = _ROLE.get(role) if isinstance(role, str) else None  # a list or an object is no role either
    content = obj.get("content")
    name = obj.get("name")
    if role is None or type(content) is not str or (name is not None and type(name) is not str):
        content = _checked_message(b, number, obj)
        if content is None:
            return
    if role == "system" and not b.messages:
        b.system.append(content)
        return
    if name:
        name = b.names.setdefault(name, name)
    sent = obj.get("sent")
    sent = sent_at(sent) if sent is not None else None
    b.messages.append(Message(len(b.messages) + 1, role, content, name or None, line=number, sent=sent))  # type: ignore[arg-type]


def _checked_message(b: StoryBuilder, number: int, obj: dict[str, Any]) -> str | None:
    """The text of a message that is not plain (content parts), or None after reporting what is wrong."""
    role = obj.get("role")
    if role is None:
        b.error(number, 'a message needs "role" ("user", "assistant" or "system")')
        return None
    if not isinstance(role, str) or role not in _ROLE:
        b.error(number, f'unknown role {role!r}; expected "user", "assistant" or "system"')
        return None
    if "content" not in obj:
        b.error(number, 'a message needs "content" (its text)')
        return None
    content = obj["content"]
    if isinstance(content, list):
        content = _parts_text(b, number, content)
        if content is None:
            return None
    if not isinstance(content, str):
        b.error(number, f'"content" must be text, not {type(content).__name__}')
        return None
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        b.error(number, f'"name" must be text, not {type(name).__name__}')
        return None
    return content


def _parts_text(b: StoryBuilder, number: int, parts: list[Any]) -> str | None:
    """OpenAI content parts: the text parts joined; other parts (images, audio) are left out.
    A part that is not an object, or whose "text" is not text, is an error, never a silent gap."""
    texts = []
    for index, part in enumerate(parts, start=1):
        if not isinstance(part, dict):
            b.error(
                number,
                f'content part {index} must be an object like {{"type": "text", "text": "..."}}, '
                f"not {type(part).__name__}",
            )
            return None
        if "text" in part:
            if not isinstance(part["text"], str):
                b.error(number, f'content part {index} has a "text" that is {type(part["text"]).__name__}, not text')
                return None
            texts.append(part["text"])
    if parts and not texts:
        b.error(number, '"content" has no text part (only images or other media); a message needs text')
        return None
    return "".join(texts)


def _card(b: StoryBuilder, number: int, obj: dict[str, Any]) -> Card | None:
    """A Card from a card record (or a cast entry), or None after reporting what is wrong."""
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        b.error(number, 'a card needs "name" (the character joining the story)')
        return None
    values: dict[str, Any] = {}
    for key in CARD_FIELDS - {"name"}:
        if key in obj:
            if not isinstance(obj[key], str):
                b.error(number, f'card field "{key}" must be text')
                return None
            values[key] = obj[key]
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("tags", "aliases"):
        items = obj.get(key, [])
        if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
            b.error(number, f'card field "{key}" must be a list of text')
            return None
        lists[key] = tuple(items)
    return Card(name=name, tags=lists["tags"], aliases=lists["aliases"], **values)


def _add_card(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    card = _card(b, number, obj)
    if card is None:
        return
    name = card.name
    b.messages.append(Message(len(b.messages) + 1, "system", "", name, card=card, line=number))


def _add_scene(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    problems = []
    for key in ("start", "end"):
        value = obj.get(key)
        if value is None:
            problems.append(f'a scene needs "{key}" (a message number)')
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f'scene "{key}" must be a message number ≥ 1, not {value!r}')
    for key in ("summary", "history", "title"):
        if key in obj and obj[key] is not None and not isinstance(obj[key], str):
            problems.append(f'scene "{key}" must be text')
    scene_id = obj.get("id")
    if scene_id is not None and (isinstance(scene_id, bool) or not isinstance(scene_id, (int, str))):
        problems.append('scene "id" must be a number or text')
    if problems:
        for p in problems:
            b.error(number, p)
        return
    b.scenes.append((number, obj))


def _add_info(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    for key, value in obj.items():
        if key == "type":
            continue
        if key == "cast":
            if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
                b.error(number, 'story field "cast" must be a list of card objects')
                continue
            cast = [_card(b, number, c) for c in value]
            b.info["cast"] = tuple(c for c in cast if c is not None)
        elif key not in INFO_FIELDS:
            b.problems.append(Problem(number, f'unknown story field "{key}" (ignored)', "warning"))
        elif not isinstance(value, str):
            b.error(number, f'story field "{key}" must be text')
        else:
            b.info[key] = value


# A lore line with any of these is a World Info entry; without, otaku's per-scene lore.
WORLD_INFO_MARKS = ("uid", "key", "keysecondary", "content", "constant")


def _add_world_info(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    fields = {k: v for k, v in obj.items() if k not in ("type", "source", "character")}
    source, character = obj.get("source", b.path.name), obj.get("character", "")
    if not isinstance(source, str) or not isinstance(character, str):
        b.error(number, 'lore "source" and "character" must be text')
        return
    uid = fields.get("uid", len(b.world))
    try:
        entry = entry_from_world_info(b.path, uid, fields, source, number, character)
    except StoryError as exc:
        b.error(number, exc.message)
        return
    b.world.append(entry)
    for kind, what in entry.problems:  # what validate names, though the build reads on
        b.problems.append(Problem(number, f"lore entry {uid}: {READ_ITS_OWN_WAY[kind](what, fields)}", "warning"))


# What a World Info reader notes (`LoreEntry.problems`), as `validate` says it: each kind by the
# field or key it is about (`what`) and the entry's fields.
READ_ITS_OWN_WAY: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "regex": lambda key, _: (
        f"key {key!r} is not a valid regular expression; it is matched as plain text, as SillyTavern does"
    ),
    "text_keys": lambda field, fields: (
        f'"{field}" is one text ({str(fields.get(field))[:40]!r}), not a list: SillyTavern reads no keys from'
        f' it, and neither does ctx; write it as a list, ["…"]'
    ),
    "position": lambda position, _: (
        f"position {position} is none SillyTavern 1.12 places (it places 0-6): the entry fires and counts"
        " in the budget, and is placed nowhere"
    ),
}


def _add_lore(b: StoryBuilder, number: int, obj: dict[str, Any]) -> None:
    if any(mark in obj for mark in WORLD_INFO_MARKS):
        _add_world_info(b, number, obj)
        return
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        b.error(number, 'a lore record needs "name" (the character it is about)')
        return
    scene = obj.get("scene")
    if scene is not None and (isinstance(scene, bool) or not isinstance(scene, (int, str))):
        b.error(number, 'lore "scene" must be a scene id (a number or text)')
        return
    texts = {key: obj.get(key) or "" for key in LORE_TEXTS}
    wrong = next((key for key, value in texts.items() if not isinstance(value, str)), None)
    if wrong is not None:
        b.error(number, f'lore "{wrong}" must be text')
        return
    b.lore.append(Lore(name=name, scene=scene, line=number, **texts))


HANDLERS = {"message": _add_message, "card": _add_card, "scene": _add_scene, "story": _add_info, "lore": _add_lore}


def check_scenes(b: StoryBuilder) -> list[Scene]:
    """Number the scenes by start and report overlaps, inversions, overruns and gaps."""
    n = len(b.messages)
    ordered = sorted(b.scenes, key=lambda item: (item[1]["start"], item[1]["end"]))
    scenes: list[Scene] = []
    for order, (line, obj) in enumerate(ordered, start=1):
        scene = Scene(
            order=order,
            start=obj["start"],
            end=obj["end"],
            id=obj.get("id"),
            title=obj.get("title") or "",
            summary=obj.get("summary") or "",
            history=obj.get("history") or "",
            line=line,
            source="story",
        )
        label = f"scene {scene.ref}"
        if scene.start > scene.end:
            b.error(line, f"{label} is inverted: start {scene.start} is after end {scene.end}")
        if scene.end > n:
            b.error(line, f"{label} runs to message {scene.end:,} but the story has {n:,} messages")
        if scenes:
            prev = scenes[-1]
            if scene.start <= prev.end:
                b.error(
                    line, f"{label} ({scene.start}–{scene.end}) overlaps scene {prev.ref} ({prev.start}–{prev.end})"
                )
            elif scene.start > prev.end + 1:
                b.problems.append(
                    Problem(
                        line,
                        f"gap: messages {prev.end + 1}–{scene.start - 1} between scene {prev.ref} and {label} "
                        "belong to no scene (the summary chain stops there)",
                        "warning",
                    )
                )
        scenes.append(scene)
    seen: dict[str, int] = {}  # 4 and "4" read the same in every message, so they clash
    for scene in scenes:
        if scene.id is not None:
            key = str(scene.id)
            if key in seen:
                b.error(scene.line, f"scene id {scene.id!r} is used twice (also on line {seen[key]})")
            seen[key] = scene.line or 0
    return scenes


def read_records(path: Path, problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """Yield (line number, decoded JSON) of each non-blank line of the file, streaming (see
    `_decoded`); a byte-order mark before the first line is dropped."""
    with reading(path):
        handle = path.open("rb")
    with handle:
        first = handle.readline().removeprefix(BOM)
        yield from _decoded(enumerate(itertools.chain((first,), handle), start=1), problems)


def _decoded(lines: Iterable[tuple[int, str | bytes]], problems: list[Problem]) -> Iterator[tuple[int, Any]]:
    """Yield (line number, decoded JSON) of each non-blank line; a line that does not decode
    is reported in `problems` (with its line and column) and skipped. Each line goes to the
    quick decoder first: no line it accepts is blank, and what it refuses (a blank line, a
    broken one, or one only the careful decoder reads) is looked at again. A line long enough
    to hold more items than `loads` decodes (`MAX_ITEMS`, one character each) goes to `loads`
    alone, which counts them first."""
    for number, text in lines:
        if len(text) < MAX_ITEMS:
            try:
                obj = quick_loads(text)
            except QuickError:
                pass
            else:
                yield number, obj
                continue
        if text.isspace() or not text:
            continue
        try:
            obj = loads(text)
        except JSONProblem as exc:
            problems.append(Problem(number, exc.message))
            continue
        yield number, obj


def parse_lines(path: Path, lines: Iterable[tuple[int, str]]) -> tuple[Story, list[Problem]]:
    """Read native JSONL lines (already text) into a Story and the list of every problem found."""
    problems: list[Problem] = []
    return parse_records(path, _decoded(lines, problems), problems)


def parse_records(
    path: Path, records: Iterable[tuple[int, Any]], problems: list[Problem] | None = None
) -> tuple[Story, list[Problem]]:
    """Decoded native records, with their line numbers, into a Story and every problem found.
    `problems` (the decoder's, filled as `records` is consumed) are merged in line order."""
    b = StoryBuilder(path)
    decoding = problems if problems is not None else []
    with uncollected():
        any_record = _add_records(b, records)
        if decoding:
            b.problems = sorted([*decoding, *b.problems], key=lambda p: p.line or 0)
        if not any_record and not decoding:
            b.error(None, "the file is empty; a story needs at least one message")
        elif not b.messages and not any(p.severity == "error" for p in b.problems):
            b.error(None, "the story has no messages (only system lines, scenes or cards are not enough)")
        scenes = check_scenes(b)
        story = Story(
            path=path,
            messages=tuple(b.messages),
            scenes=tuple(scenes),
            system="\n\n".join(b.system),
            info=StoryInfo(**b.info),
            lore=tuple(b.lore),
            world=tuple(b.world),
        )
    return story, b.problems


def _add_records(b: StoryBuilder, records: Iterable[tuple[int, Any]]) -> bool:
    """Add each record to the story being built; whether there was any."""
    number = None
    messages, names, role_of = b.messages, b.names, _ROLE
    for number, obj in records:
        if type(obj) is dict and "type" not in obj:  # the common case, inline: a plain message
            role = obj.get("role")
            role = role_of.get(role) if type(role) is str else None
            content = obj.get("content")
            name = obj.get("name")
            if role is not None and type(content) is str and messages and (name is None or type(name) is str):
                if name:
                    name = names.setdefault(name, name)
                sent = obj.get("sent")
                sent = sent_at(sent) if sent is not None else None
                messages.append(Message(len(messages) + 1, role, content, name or None, None, number, sent))  # type: ignore[arg-type]
                continue
            _add_message(b, number, obj)
            continue
        if type(obj) is not dict:
            b.error(number, f"expected a JSON object, found {type(obj).__name__}")
            continue
        kind = obj.get("type", "message")
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            b.error(number, f'unknown record type {kind!r}; expected "message", "card", "scene", "story" or "lore"')
            continue
        handler(b, number, obj)
    return number is not None


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """The cyclic garbage collector kept off a story while it is made: a story is a great many
    small acyclic objects, nothing for the collector to find. Made, they go to its oldest
    generation unexamined (`freeze`, then `unfreeze`, which thaws into the oldest), there to
    wait for the next full collection; left young, each of them would be examined by the next
    two collections, to find nothing (tens of milliseconds for 100k messages). Objects someone
    else froze (a server before it forks) are never thawed: then the story stays young."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def check_native(path: Path) -> tuple[Story | None, list[Problem]]:
    """Every problem of a native story file, in line order (for `ctx validate`)."""
    problems: list[Problem] = []
    try:
        story, found = parse_records(path, read_records(path, problems), problems)
    except StoryError as exc:  # the file cannot be opened at all
        return None, [Problem(exc.line, exc.message)]
    return story, sorted(found, key=lambda p: p.line or 0)


def read_native(path: Path) -> Story:
    """Read a native story, raising StoryError on its first error (by line)."""
    story, problems = check_native(path)
    for problem in problems:
        if problem.severity == "error":
            raise StoryError(path, problem.line, problem.message)
    assert story is not None
    return story
