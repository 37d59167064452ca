"""The native story format: JSONL, one object per line (see ARCHITECTURE.md).

    {"role": "user"|"assistant"|"system", "name": "Mara", "content": "..."}   a message
    {"type": "card", "name": "Ilya", "description": "...", ...}              a card (numbered)
    {"type": "scene", "id": 4, "start": 65, "end": 95, "summary": "...", "history": "..."}
    {"type": "story", "title": "...", "user": "...", "scenario": "...", ...} facts about the story
    {"type": "lore", "name": "Ilya", "scene": 4, "state": "...", "history": "...", "entry": "..."}
                                                 what a character knows at the end of a scene

Leading system messages (before any other message) form the story's system message. A
system message later on is an ordinary numbered message. Reading streams line by line and
collects every problem, so `ctx validate` can report them all at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import reading
from ..model import ROLES, Card, Lore, Message, Scene, Story, StoryInfo

CARD_FIELDS = {f.name for f in fields(Card)} - {"tags", "aliases"}
LORE_TEXTS = ("state", "history", "entry")
INFO_FIELDS = {f.name for f in fields(StoryInfo)}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a story file. Errors stop a build; warnings do not."""

    line: int | None
    message: str
    severity: str = "error"  # "error" | "warning"


@dataclass
class _Builder:
    path: Path
    messages: list[Message] = field(default_factory=list)
    scenes: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    system: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    lore: list[Lore] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def error(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(line, message))


def _lines(path: Path, problems: list[Problem] | None = None) -> Iterator[tuple[int, str]]:
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


def _add_message(b: _Builder, number: int, obj: dict[str, Any]) -> None:
    role = obj.get("role")
    if role is None:
        b.error(number, 'a message needs "role" ("user", "assistant" or "system")')
        return
    if role not in ROLES:
        b.error(number, f'unknown role {role!r}; expected "user", "assistant" or "system"')
        return
    if "content" not in obj:
        b.error(number, 'a message needs "content" (its text)')
        return
    content = obj["content"]
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        b.error(number, f'"content" must be text, not {type(content).__name__}')
        return
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        b.error(number, f'"name" must be text, not {type(name).__name__}')
        return
    if role == "system" and not b.messages:
        b.system.append(content)
        return
    b.messages.append(Message(len(b.messages) + 1, role, content, name or None, line=number))


def _card(b: _Builder, number: int, obj: dict[str, Any]) -> Card | None:
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
    return Card(name=name, **lists, **values)


def _add_card(b: _Builder, number: int, obj: dict[str, Any]) -> None:
    card = _card(b, number, obj)
    if card is None:
        return
    name = card.name
    b.messages.append(Message(len(b.messages) + 1, "system", "", name, card=card, line=number))


def _add_scene(b: _Builder, number: int, obj: dict[str, Any]) -> None:
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


def _add_info(b: _Builder, number: int, obj: dict[str, Any]) -> None:
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


def _add_lore(b: _Builder, number: int, obj: dict[str, Any]) -> None:
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


def _check_scenes(b: _Builder) -> list[Scene]:
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


def parse_lines(path: Path, lines: Iterable[tuple[int, str]]) -> tuple[Story, list[Problem]]:
    """Read native JSONL lines into a Story and the list of every problem found."""
    b = _Builder(path)
    nonblank = 0
    for number, text in lines:
        if not text.strip():
            continue
        nonblank += 1
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            b.error(number, f"malformed JSON at column {exc.pos + 1}: {exc.msg}")
            continue
        if not isinstance(obj, dict):
            b.error(number, f"expected a JSON object, found {type(obj).__name__}")
            continue
        kind = obj.get("type", "message")
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            b.error(number, f'unknown record type {kind!r}; expected "message", "card", "scene", "story" or "lore"')
            continue
        handler(b, number, obj)
    if nonblank == 0:
        b.error(None, "the file is empty; a story needs at least one message")
    elif not b.messages and not any(p.severity == "error" for p in b.problems):
        b.error(None, "the story has no messages (only system lines, scenes or cards are not enough)")
    scenes = _check_scenes(b)
    story = Story(
        path=path,
        messages=tuple(b.messages),
        scenes=tuple(scenes),
        system="\n\n".join(b.system),
        info=StoryInfo(**b.info),
        lore=tuple(b.lore),
    )
    return story, b.problems


def check_native(path: Path) -> tuple[Story | None, list[Problem]]:
    """Every problem of a native story file, in line order (for `ctx validate`)."""
    undecodable: list[Problem] = []
    try:
        story, problems = parse_lines(path, _lines(path, undecodable))
    except StoryError as exc:  # the file cannot be opened at all
        return None, [Problem(exc.line, exc.message)]
    return story, sorted([*undecodable, *problems], key=lambda p: p.line or 0)


def read_native(path: Path) -> Story:
    """Read a native story, raising StoryError on its first error (by line)."""
    story, problems = check_native(path)
    for problem in problems:
        if problem.severity == "error":
            raise StoryError(path, problem.line, problem.message)
    assert story is not None
    return story
