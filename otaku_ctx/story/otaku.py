"""otaku story exports: Markdown with `format-version: 3` in an HTML comment at the top, as
otaku 0.8 writes them (`otaku/backend/domain/_formats/exports.py` describes the layout).

    # The Vermilion Tour                          -> StoryInfo.title
    <!-- otaku export … format-version: 3 … -->    (a newer version is refused)
    ## Story
    ### Story so far                              -> StoryInfo.story_so_far
    ### System                                    -> Story.system
    ### Cast                                      -> StoryInfo.cast (less those joining as cards)
    - **Bell Harrow** (aka Harrow, Bell) — …         Card("Bell Harrow", aliases=("Harrow", "Bell"))
    #### Odalric Vane                                that character's card profile (TOML)
    ## Scenes
    ### 1 · The Dry Bed                           -> Scene(id=1, title="The Dry Bed")
    - **Messages:** 1-6                              start, end
    (paragraphs)                                     summary: this scene only
    **History:** (paragraphs)                        history: the story so far through it
    #### Maren                                    -> Lore("Maren", scene=1, state, history, entry)
    **State:** / **History:** / **Entry:**
    ## Messages
    ### 3 · user (ooc) · Maren · "((OOC: …))\\n{body}"  message 3: role, kind, speaker, template
    ### 1 · user (card) · Odalric Vane            -> a card message; its body `/card vane.json`
    /card vane.json                                  names the Cast profile (by file_name or name)

Decisions:
- Structure is what otaku reads as structure: a line starting with `#`..`####` and a space.
  otaku's writer escapes such a line inside any text with one backslash (`\\### …`); the reader
  takes exactly one back off. A fence (``` or ~~~) is text — but a heading inside a fence that
  is still open is refused with the fence's line (a hand-written file forgot to close it or to
  escape the line), never read as a heading that swallows or splits messages.
- Message headings must number the messages 1..N in order. `(ooc)` and `(narration)` messages
  are sent as their role; the older hand-written roles `system` and `card` are read too.
- A card message's card is its Cast profile (TOML: `description`, `personality`, `scenario`,
  `greeting`, `examples`, `system_prompt`, …); without one, the message's body describes it.
  A `/card FILE` naming no profile in the Cast is an error.
- `{{user}}`: the profiles' `user` (the persona the story bound), else the one name every
  named user message has.
- The newest scene without a history takes the story so far as its history (as otaku does).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import StoryError
from .model import Card, Lore, Message, Scene, Story, StoryInfo
from .native import StoryBuilder, check_scenes, read_lines

SUPPORTED_VERSION = 3
SECTIONS = ("story", "scenes", "messages")
MAX_DIGITS = 9  # a message number longer than this is not one (and int() of 4,300 digits raises)

VERSION = re.compile(r"format-version:\s*([^\s>]+)")
MESSAGE_HEADING = re.compile(r"^###\s+(\d+)\s*·\s*(.*?)\s*$")
KIND = re.compile(r"^(?P<role>\w+)(?:\s*\((?P<kind>[^)]*)\))?$")
TEMPLATE_TAIL = re.compile(r'\s*·\s*("(?:[^"\\]|\\.)*")\s*$')
SCENE_HEADING = re.compile(r"^###\s+(?:(\d+)\s*(?:·\s*|$))?(.*?)\s*$")
FIELD = re.compile(r"^\s*[-*+]\s+\*\*([^*:]+):\*\*\s*(.*?)\s*$")
RANGE = re.compile(r"^(\d+)(?:\s*(?:-|–|—|to)\s*(\d+))?$")
CAST_ENTRY = re.compile(
    r"^\s*[-*+]\s+\*\*(?P<name>[^*]+?)\*\*\s*(?:\((?:aka|a\.k\.a\.)\s+(?P<alias>.*?)\)\s*)?(?:[—–:-]\s*(?P<text>.*))?$"
)
BULLET = re.compile(r"^\s*[-*+]\s")
LABEL = re.compile(r"^\*\*(State|History|Entry):\*\*\s?(.*)$")
STRUCTURE = re.compile(r"^(\\*)(#{1,4} )")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CARD_COMMAND = re.compile(r"^/card\s+(.+?)\s*$")
TOML_WHERE = re.compile(r"\(at line (\d+), column (\d+)\)")
HISTORY_MARK = "**History:**"
KINDS = ("dialogue", "ooc", "narration", "card")

# otaku profile key -> Card field (lists are joined with blank lines, as otaku sends them).
PROFILE_FIELDS = {
    "description": "description",
    "personality": "personality",
    "scenario": "scenario",
    "greeting": "first_message",
    "examples": "example_dialogue",
    "system_prompt": "system_prompt",
    "post_history_instructions": "post_history_instructions",
    "creator_notes": "creator_notes",
}

Line = tuple[int, str]


@dataclass(frozen=True)
class _Part:
    """A heading (its line and text) and the lines under it, down to the next such heading."""

    line: int
    heading: str
    body: list[Line]


@dataclass(frozen=True)
class _Profile:
    card: Card
    user: str
    file_name: str


def read_otaku(path: Path) -> Story:
    """Read an otaku Markdown story export (format-version 3) into a Story."""
    lines = [(n, text.rstrip("\r\n")) for n, text in read_lines(path)]
    _check_version(path, lines)
    _check_fences(path, lines)
    sections = _sections(path, lines)
    if "messages" not in sections:
        raise StoryError(path, None, 'no "## Messages" section; an otaku export lists its messages there')
    story_parts = {p.heading[4:].strip().lower(): p for p in _split(sections.get("story", []), 3)}
    roster, profiles = _cast(path, story_parts["cast"].body) if "cast" in story_parts else ([], {})
    messages = _messages(path, sections["messages"], roster, profiles)
    scenes, lore = _scenes(path, sections.get("scenes", []), messages)
    story_so_far = _text(story_parts["story so far"].body) if "story so far" in story_parts else ""
    if scenes and story_so_far and not scenes[-1].history:
        scenes[-1] = replace(scenes[-1], history=story_so_far)
    joined = {m.card.name for m in messages if m.card is not None}
    info = StoryInfo(
        title=_title(lines),
        user=_user_name(messages, profiles),
        story_so_far=story_so_far,
        cast=tuple(card for card in roster if card.name not in joined),
    )
    system = _text(story_parts["system"].body) if "system" in story_parts else ""
    return Story(
        path=path,
        messages=tuple(messages),
        scenes=tuple(scenes),
        system=system,
        info=info,
        lore=tuple(lore),
        source_format="otaku",
    )


# -- the frame: header comment, title, sections, escapes ------------------------------------


def _check_version(path: Path, lines: list[Line]) -> None:
    """The export header must declare format-version 3 or older."""
    opened: int | None = None
    for number, text in lines:
        if text.startswith("## "):
            break
        if opened is None and "<!--" in text:
            opened = number
        if opened is not None:
            match = VERSION.search(text)
            if match:
                version = match.group(1)
                if not (version.isdigit() and len(version) <= MAX_DIGITS and int(version) <= SUPPORTED_VERSION):
                    raise StoryError(
                        path,
                        number,
                        f"otaku export format-version {version[:20]} is not supported; this ctx reads "
                        f"format-version {SUPPORTED_VERSION} (export the story again with otaku 0.8)",
                    )
                return
            if "-->" in text:
                break
    raise StoryError(
        path,
        opened,
        f"no format-version in the export's header comment; expected format-version: {SUPPORTED_VERSION}",
    )


def _is_heading(text: str, level: int) -> bool:
    return text.startswith("#" * level + " ")


def _check_fences(path: Path, lines: list[Line]) -> None:
    """A heading while a ``` or ~~~ fence is open: the file forgot to close the fence (or to
    escape the line), and reading on would move every message after it."""
    fence: tuple[int, str] | None = None
    for number, text in lines:
        opening = FENCE.match(text)
        if fence is None and opening:
            fence = (number, opening[1])
        elif fence is not None and text.lstrip().startswith(fence[1]):
            fence = None
        elif fence is not None and STRUCTURE.match(text) and not text.startswith("\\"):
            raise StoryError(
                path,
                fence[0],
                f"this {fence[1]} fence is still open at the heading on line {number}; close the fence "
                f"before the heading, or, if the heading is text, write it with a backslash (\\{text[:12]}…)",
            )


def _unescape(text: str) -> str:
    """otaku's structure escape undone: one backslash off a heading-shaped line."""
    return STRUCTURE.sub(lambda m: m.group(1)[1:] + m.group(2), text)


def _title(lines: list[Line]) -> str:
    for _, text in lines:
        if text.startswith("## "):
            break
        if text.startswith("# "):
            return text[2:].strip()
    return ""


def _split(lines: list[Line], level: int) -> list[_Part]:
    """Cut lines at each heading of exactly `level`; lines before the first are dropped."""
    parts: list[_Part] = []
    for number, text in lines:
        if _is_heading(text, level):
            parts.append(_Part(number, text, []))
        elif parts:
            parts[-1].body.append((number, text))
    return parts


def _lead(lines: list[Line], level: int) -> list[Line]:
    """The lines before the first heading of `level`."""
    lead = []
    for number, text in lines:
        if _is_heading(text, level):
            break
        lead.append((number, text))
    return lead


def _sections(path: Path, lines: list[Line]) -> dict[str, list[Line]]:
    """The lines under `## Story`, `## Scenes` and `## Messages`."""
    sections: dict[str, list[Line]] = {}
    for part in _split(lines, 2):
        name = part.heading[3:].strip().lower()
        if name not in SECTIONS:
            raise StoryError(
                path, part.line, f'unknown section "{part.heading}"; expected ## Story, ## Scenes or ## Messages'
            )
        if name in sections:
            raise StoryError(path, part.line, f'a second "## {part.heading[3:].strip()}" section')
        sections[name] = part.body
    return sections


def _text(lines: list[Line]) -> str:
    """The lines as one text, unescaped, without the blank lines around it."""
    texts = [_unescape(text) for _, text in lines]
    while texts and not texts[0].strip():
        texts.pop(0)
    while texts and not texts[-1].strip():
        texts.pop()
    return "\n".join(texts)


# -- ## Story: the cast and its card profiles -----------------------------------------------


def _cast(path: Path, lines: list[Line]) -> tuple[list[Card], dict[str, _Profile]]:
    """`- **Name** (aka a, b) — description` bullets, then a `#### Name` TOML profile per card."""
    entries: list[dict[str, Any]] = []
    for number, text in _lead(lines, 4):
        if not text.strip():
            continue
        if BULLET.match(text):
            match = CAST_ENTRY.match(text)
            if match is None:
                raise StoryError(path, number, 'a cast entry should read "- **Name** — description"')
            aliases = tuple(a.strip() for a in (match["alias"] or "").split(",") if a.strip())
            entries.append({"name": match["name"].strip(), "text": [match["text"] or ""], "aliases": aliases})
        elif entries:
            entries[-1]["text"].append(text.strip())
    profiles = {p.card.name: p for p in (_profile(path, part) for part in _split(lines, 4))}
    cards = []
    for entry in entries:
        description = " ".join(t for t in entry["text"] if t).strip()
        profile = profiles.get(entry["name"])
        card = profile.card if profile else Card(name=entry["name"])
        cards.append(replace(card, description=card.description or description, aliases=entry["aliases"]))
    known = {card.name for card in cards}
    for name, profile in profiles.items():  # a profile whose roster line is missing still counts
        if name not in known:
            cards.append(profile.card)
    return cards, profiles


def _profile(path: Path, part: _Part) -> _Profile:
    """A `#### Name` card profile: TOML, as otaku keeps a card it imported."""
    name = part.heading[5:].strip()
    first = part.body[0][0] if part.body else part.line
    try:
        data = tomllib.loads("\n".join(_unescape(text) for _, text in part.body))
    except tomllib.TOMLDecodeError as exc:
        where = TOML_WHERE.search(str(exc))
        line = first + int(where[1]) - 1 if where else part.line
        reason = TOML_WHERE.sub("", str(exc)).strip()
        raise StoryError(
            path, line, f"the card profile of {name!r} is not valid TOML ({reason}); fix it or remove the block"
        ) from None
    except RecursionError:
        raise StoryError(path, part.line, f"the card profile of {name!r} is nested too deeply") from None
    values: dict[str, Any] = {}
    for key, field in PROFILE_FIELDS.items():
        value = data.get(key)
        if isinstance(value, list):
            value = "\n\n".join(str(item) for item in value)
        if isinstance(value, str) and value.strip():
            values[field] = value.strip("\n")
        elif value is not None and not isinstance(value, str):
            raise StoryError(path, part.line, f'card profile field "{key}" of {name!r} must be text')
    user = data.get("user")
    file_name = data.get("file_name")
    return _Profile(
        Card(name=name, **values),
        user if isinstance(user, str) else "",
        file_name if isinstance(file_name, str) else "",
    )


# -- ## Scenes -----------------------------------------------------------------------------


def _scenes(path: Path, lines: list[Line], messages: list[Message]) -> tuple[list[Scene], list[Lore]]:
    """Each `### N · Title` scene: its range, summary and history, and its characters' lore."""
    records: list[tuple[int, dict[str, Any]]] = []
    lore: list[Lore] = []
    for order, part in enumerate(_split(lines, 3), start=1):
        heading = SCENE_HEADING.match(part.heading)
        assert heading is not None  # any "### " line matches
        fields, narrative = _fields(_lead(part.body, 4))
        span = fields.get("messages")
        if span is None:
            raise StoryError(path, part.line, 'a scene needs a "- **Messages:** start-end" line under its heading')
        start, end = _range(path, span)
        summary, history = _summary_and_history(narrative)
        scene_id = int(heading[1]) if heading[1] and len(heading[1]) <= MAX_DIGITS else None
        records.append(
            (
                part.line,
                {
                    "id": scene_id,
                    "start": start,
                    "end": end,
                    "title": heading[2],
                    "summary": summary,
                    "history": history,
                },
            )
        )
        ref = scene_id if scene_id is not None else order
        lore.extend(_lore(journal, ref) for journal in _split(part.body, 4))
    builder = StoryBuilder(path, messages=list(messages), scenes=records)
    scenes = check_scenes(builder)
    for problem in builder.problems:
        if problem.severity == "error":
            raise StoryError(path, problem.line, problem.message)
    return scenes, lore


def _range(path: Path, span: Line) -> tuple[int, int]:
    number, text = span
    bounds = RANGE.match(text)
    if bounds is None or any(b and len(b) > MAX_DIGITS for b in (bounds[1], bounds[2])):
        raise StoryError(path, number, f'scene messages must read "start-end" (e.g. 1-6), not {text[:40]!r}')
    start, end = int(bounds[1]), int(bounds[2] or bounds[1])
    if start < 1:
        raise StoryError(path, number, f"scene messages start at message {start}; messages are numbered from 1")
    return start, end


def _fields(lead: list[Line]) -> tuple[dict[str, Line], list[Line]]:
    """The `- **Key:** value` lines opening a scene (keys in lower case), and what follows them."""
    fields: dict[str, Line] = {}
    index = 0
    while index < len(lead):
        number, text = lead[index]
        match = FIELD.match(text)
        if match:
            fields[match[1].strip().lower()] = (number, match[2])
        elif text.strip():
            break
        index += 1
    return fields, lead[index:]


def _summary_and_history(lines: list[Line]) -> tuple[str, str]:
    """The paragraphs before `**History:**` and the text after it."""
    for index, (number, text) in enumerate(lines):
        if text.startswith(HISTORY_MARK):
            rest = text[len(HISTORY_MARK) :].strip()
            return _text(lines[:index]), _text([(number, rest), *lines[index + 1 :]])
    return _text(lines), ""


def _lore(part: _Part, scene: int | str) -> Lore:
    """A `#### Name` journal: `**State:**`, `**History:**`, `**Entry:**`, each running to the next."""
    texts: dict[str, list[Line]] = {}
    current: list[Line] | None = None
    for number, text in part.body:
        label = LABEL.match(text)
        if label:
            current = texts.setdefault(label[1].lower(), [])
            current.append((number, label[2]))
        elif current is not None:
            current.append((number, text))
    values = {key: _text(value) for key, value in texts.items()}
    return Lore(name=part.heading[5:].strip(), scene=scene, line=part.line, **values)


# -- ## Messages ---------------------------------------------------------------------------


def _messages(path: Path, lines: list[Line], roster: list[Card], profiles: dict[str, _Profile]) -> list[Message]:
    """`### N · role (kind) · Speaker · "template"` headings, numbered 1..N, each with its body."""
    stray = next(((n, t) for n, t in _lead(lines, 3) if t.strip()), None)
    if stray is not None:
        raise StoryError(path, stray[0], 'text before the first message heading ("### 1 · user · Name")')
    cast = {card.name: card for card in roster}
    messages: list[Message] = []
    for part in _split(lines, 3):
        messages.append(_message(path, part, len(messages) + 1, cast, profiles))
    if not messages:
        raise StoryError(path, None, 'the "## Messages" section holds no messages')
    return messages


def _message(path: Path, part: _Part, expected: int, cast: dict[str, Card], profiles: dict[str, _Profile]) -> Message:
    match = MESSAGE_HEADING.match(part.heading)
    if match is None:
        raise StoryError(
            path, part.line, 'expected a message heading "### N · role · Speaker" (a heading in text is written \\###)'
        )
    if len(match[1]) > MAX_DIGITS or int(match[1]) != expected:
        order = "messages are numbered 1..N in order"
        raise StoryError(path, part.line, f"message {match[1][:20]} where message {expected} was expected; {order}")
    rest = match[2]
    template = "{body}"
    tail = TEMPLATE_TAIL.search(rest)
    if tail:
        template = _template(path, part.line, tail[1])
        rest = rest[: tail.start()]
    head, _, speaker = (p.strip() for p in rest.partition("·"))
    kinded = KIND.match(head)
    role, kind = (kinded["role"].lower(), (kinded["kind"] or "dialogue").strip().lower()) if kinded else (head, "")
    if role == "card":  # the older hand-written form "### N · card · Name"
        role, kind = "user", "card"
    if role not in ("user", "assistant", "system") or kind not in KINDS:
        raise StoryError(
            path,
            part.line,
            f"unknown role {head!r}; expected user or assistant, with (ooc), (narration) or (card) after it",
        )
    body = _text(part.body)
    if kind == "card":
        card = _card(path, part, speaker, body, cast, profiles)
        return Message(expected, "system", "", card.name, card=card, line=part.line)
    return Message(expected, role, template.replace("{body}", body), speaker or None, line=part.line)  # type: ignore[arg-type]


def _card(
    path: Path, part: _Part, speaker: str, body: str, cast: dict[str, Card], profiles: dict[str, _Profile]
) -> Card:
    """The card a card message brings: the Cast profile its `/card FILE` (or its speaker) names."""
    command = CARD_COMMAND.match(body)
    if command:
        wanted = command[1]
        named = next((p.card.name for p in profiles.values() if p.file_name == wanted), None)
        name = named or (speaker if speaker in profiles else None)
        if name is None:
            raise StoryError(
                path,
                part.line + 1,
                f"/card {wanted[:60]} names no card profile in the Cast (no #### block with file_name = "
                f"{wanted[:60]!r}{f' or named {speaker!r}' if speaker else ''}); add it under ### Cast",
            )
        return cast.get(name) or profiles[name].card
    if not speaker:
        raise StoryError(path, part.line, 'a card heading needs the character\'s name: "### N · user (card) · Name"')
    if speaker in cast and not body:
        return cast[speaker]
    return Card(name=speaker, description=body)


def _template(path: Path, line: int, quoted: str) -> str:
    try:
        template = json.loads(quoted)
    except json.JSONDecodeError as exc:
        raise StoryError(path, line, f"the message template is not a valid quoted string: {exc.msg}") from None
    if "{body}" not in template:
        raise StoryError(path, line, "the message template has no {body} for the message's text")
    return template


def _user_name(messages: list[Message], profiles: dict[str, _Profile]) -> str:
    bound = {p.user for p in profiles.values() if p.user}
    if len(bound) == 1:
        return bound.pop()
    names = {m.name for m in messages if m.role == "user" and m.name and m.card is None}
    return names.pop() if len(names) == 1 else ""
