"""otaku story exports: Markdown with `format-version: 3` in an HTML comment at the top.

    # The River That Forgot Its Name              -> StoryInfo.title
    <!-- otaku export … format-version: 3 … -->    (any other version is refused)
    ## Story
    ### Story so far                              -> StoryInfo.story_so_far
    ### System                                    -> Story.system
    ### Cast                                      -> StoryInfo.cast
    - **Tallis** (aka the ferryman) — ferryman…      Card("Tallis", "ferryman… (aka the ferryman)")
    ## Scenes
    ### 1 · The Dry Bed                           -> Scene(id=1, title="The Dry Bed")
    - **Messages:** 1-6                              start, end
    (paragraphs)                                     summary: this scene only
    **History:** (paragraphs)                        history: the story so far through it
    #### Maren                                     character state: not part of the scene's texts
    ## Messages
    ### 3 · user · Maren · "((OOC: …))\\n{body}"  -> message 3, role user, name Maren, and the
    (body)                                           template (a JSON string) wraps the body
    ### 5 · card · Ilya                           -> a card message; the body is its description

Decisions:
- Message headings must number the messages 1..N in order; anything else is an error.
- An assistant (or user) heading without a speaker gives a message without a name.
- When every named user message has the same speaker, that name is `{{user}}`.
- A fenced block that ends a message (```otk-question … ```, the choices the user was
  offered) stays part of the message's text: it is what the user saw and answered. Headings
  inside fenced blocks are text, never structure.
- The whole file is read at once; exports are Markdown, not a stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..model import Card, Message, Scene, Story, StoryInfo
from .native import _Builder, _check_scenes, _lines

SUPPORTED_VERSION = "3"
SECTIONS = ("story", "scenes", "messages")

VERSION = re.compile(r"format-version:\s*([^\s>]+)")
MESSAGE_HEADING = re.compile(r"^###\s+(\d+)\s*·\s*(.*?)\s*$")
TEMPLATE_TAIL = re.compile(r'\s*·\s*("(?:[^"\\]|\\.)*")\s*$')
SCENE_HEADING = re.compile(r"^###\s+(?:(\d+)\s*·\s*)?(.*?)\s*$")
FIELD = re.compile(r"^\s*[-*+]\s+\*\*([^*:]+):\*\*\s*(.*?)\s*$")
RANGE = re.compile(r"^(\d+)(?:\s*(?:-|–|—|to)\s*(\d+))?$")
CAST_ENTRY = re.compile(
    r"^\s*[-*+]\s+\*\*(?P<name>[^*]+?)\*\*\s*(?:\((?:aka|a\.k\.a\.)\s+(?P<alias>[^)]*?)\)\s*)?(?:[—–:-]\s*(?P<text>.*))?$"
)
BULLET = re.compile(r"^\s*[-*+]\s")
HISTORY_MARK = "**History:**"

Line = tuple[int, str]


@dataclass(frozen=True)
class _Part:
    """A heading (its line and text) and the lines under it, down to the next such heading."""

    line: int
    heading: str
    body: list[Line]


def read_otaku(path: Path) -> Story:
    """Read an otaku Markdown story export (format-version 3) into a Story."""
    lines = [(n, text.rstrip("\r\n")) for n, text in _lines(path)]
    _check_version(path, lines)
    sections = _sections(path, lines)
    if "messages" not in sections:
        raise StoryError(path, None, 'no "## Messages" section; an otaku export lists its messages there')
    messages = _messages(path, sections["messages"])
    story_parts = {p.heading[4:].strip().lower(): p for p in _split(sections.get("story", []), _is_h3)}
    scenes = _scenes(path, sections.get("scenes", []), messages)
    info = StoryInfo(
        title=_title(lines),
        user=_user_name(messages),
        story_so_far=_text(story_parts["story so far"].body) if "story so far" in story_parts else "",
        cast=_cast(path, story_parts["cast"].body) if "cast" in story_parts else (),
    )
    system = _text(story_parts["system"].body) if "system" in story_parts else ""
    return Story(
        path=path,
        messages=tuple(messages),
        scenes=tuple(scenes),
        system=system,
        info=info,
        source_format="otaku",
    )


# -- the frame: header comment, title, sections -------------------------------------------


def _check_version(path: Path, lines: list[Line]) -> None:
    """The export header must say format-version 3."""
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
                if version != SUPPORTED_VERSION:
                    raise StoryError(
                        path,
                        number,
                        f"otaku export format-version {version} is not supported; "
                        f"this ctx reads format-version {SUPPORTED_VERSION}",
                    )
                return
            if "-->" in text:
                break
    raise StoryError(
        path,
        opened,
        f"no format-version in the export's header comment; expected format-version: {SUPPORTED_VERSION}",
    )


def _title(lines: list[Line]) -> str:
    for _, text in lines:
        if text.startswith("## "):
            break
        if text.startswith("# "):
            return text[2:].strip()
    return ""


def _outside_fences(lines: list[Line]) -> list[tuple[int, str, bool]]:
    """Each line with whether it may be a heading: not inside a ``` or ~~~ fenced block."""
    marked = []
    fence: str | None = None
    for number, text in lines:
        stripped = text.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            marked.append((number, text, False))
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            marked.append((number, text, False))
        else:
            marked.append((number, text, True))
    return marked


def _split(lines: list[Line], is_heading: Callable[[str], bool]) -> list[_Part]:
    """Cut lines at each heading outside fenced blocks; lines before the first are dropped."""
    parts: list[_Part] = []
    for number, text, may_head in _outside_fences(lines):
        if may_head and is_heading(text):
            parts.append(_Part(number, text, []))
        elif parts:
            parts[-1].body.append((number, text))
    return parts


def _lead(lines: list[Line], is_heading: Callable[[str], bool]) -> list[Line]:
    """The lines before the first heading (outside fenced blocks)."""
    lead = []
    for number, text, may_head in _outside_fences(lines):
        if may_head and is_heading(text):
            break
        lead.append((number, text))
    return lead


def _is_h3(text: str) -> bool:
    return text.startswith("### ")


def _sections(path: Path, lines: list[Line]) -> dict[str, list[Line]]:
    """The lines under `## Story`, `## Scenes` and `## Messages` (other `## ` lines are text)."""
    sections: dict[str, list[Line]] = {}
    for part in _split(lines, lambda text: text.startswith("## ") and text[3:].strip().lower() in SECTIONS):
        name = part.heading[3:].strip().lower()
        if name in sections:
            raise StoryError(path, part.line, f'a second "## {part.heading[3:].strip()}" section')
        sections[name] = part.body
    return sections


def _text(lines: list[Line]) -> str:
    """The lines as one text, without the blank lines around it."""
    texts = [text for _, text in lines]
    while texts and not texts[0].strip():
        texts.pop(0)
    while texts and not texts[-1].strip():
        texts.pop()
    return "\n".join(texts)


# -- ## Story ------------------------------------------------------------------------------


def _cast(path: Path, lines: list[Line]) -> tuple[Card, ...]:
    """`- **Name** (aka alias) — description` bullets; unindented text after a bullet continues it."""
    entries: list[dict[str, Any]] = []
    for number, text in lines:
        if not text.strip():
            continue
        if BULLET.match(text):
            match = CAST_ENTRY.match(text)
            if match is None:
                raise StoryError(path, number, 'a cast entry should read "- **Name** — description"')
            entries.append({"name": match["name"].strip(), "text": [match["text"] or ""], "alias": match["alias"]})
        elif entries:
            entries[-1]["text"].append(text.strip())
    cards = []
    for entry in entries:
        description = " ".join(t for t in entry["text"] if t).strip()
        if entry["alias"]:
            description = f"{description} (aka {entry['alias'].strip()})".strip()
        cards.append(Card(name=entry["name"], description=description))
    return tuple(cards)


# -- ## Scenes -----------------------------------------------------------------------------


def _scenes(path: Path, lines: list[Line], messages: list[Message]) -> list[Scene]:
    """Each `### N · Title` scene: its range, summary and history; checked like native scenes."""
    records: list[tuple[int, dict[str, Any]]] = []
    for part in _split(lines, _is_h3):
        heading = SCENE_HEADING.match(part.heading)
        assert heading is not None  # any "### " line matches
        lead = _lead(part.body, lambda text: text.startswith(("#### ", "### ")))
        fields, narrative = _fields(lead)
        span = fields.get("messages")
        if span is None:
            raise StoryError(path, part.line, 'a scene needs a "- **Messages:** start-end" line under its heading')
        bounds = RANGE.match(span[1])
        if bounds is None:
            raise StoryError(path, span[0], f'scene messages must read "start-end" (e.g. 1-6), not {span[1]!r}')
        start = int(bounds[1])
        end = int(bounds[2] or bounds[1])
        summary, history = _summary_and_history(narrative)
        scene_id = int(heading[1]) if heading[1] else None
        scene = {
            "id": scene_id,
            "start": start,
            "end": end,
            "title": heading[2],
            "summary": summary,
            "history": history,
        }
        records.append((part.line, scene))
    builder = _Builder(path, messages=list(messages), scenes=records)
    scenes = _check_scenes(builder)
    for problem in builder.problems:
        if problem.severity == "error":
            raise StoryError(path, problem.line, problem.message)
    return scenes


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
        if text.lstrip().startswith(HISTORY_MARK):
            rest = text.lstrip()[len(HISTORY_MARK) :].strip()
            return _text(lines[:index]), _text([(number, rest), *lines[index + 1 :]])
    return _text(lines), ""


# -- ## Messages ---------------------------------------------------------------------------


def _messages(path: Path, lines: list[Line]) -> list[Message]:
    """`### N · role · Speaker · "template"` headings, numbered 1..N, each with its body."""
    stray = next(((n, t) for n, t in _lead(lines, _is_message_heading) if t.strip()), None)
    if stray is not None:
        raise StoryError(path, stray[0], 'text before the first message heading ("### 1 · user · Name")')
    messages: list[Message] = []
    for part in _split(lines, _is_message_heading):
        messages.append(_message(path, part, len(messages) + 1))
    if not messages:
        raise StoryError(path, None, 'the "## Messages" section holds no messages')
    return messages


def _is_message_heading(text: str) -> bool:
    return MESSAGE_HEADING.match(text) is not None


def _message(path: Path, part: _Part, expected: int) -> Message:
    match = MESSAGE_HEADING.match(part.heading)
    assert match is not None
    number, rest = int(match[1]), match[2]
    if number != expected:
        order = "messages are numbered 1..N in order"
        raise StoryError(path, part.line, f"message {number} where message {expected} was expected; {order}")
    template = "{body}"
    tail = TEMPLATE_TAIL.search(rest)
    if tail:
        template = _template(path, part.line, tail[1])
        rest = rest[: tail.start()]
    kind, _, speaker = (p.strip() for p in rest.partition("·"))
    kind = kind.lower()
    body = _text(part.body)
    if kind == "card":
        if not speaker:
            raise StoryError(path, part.line, 'a card heading needs the character\'s name: "### N · card · Name"')
        card = Card(name=speaker, description=body)
        return Message(number, "system", "", speaker, card=card, line=part.line)
    if kind not in ("user", "assistant", "system"):
        raise StoryError(path, part.line, f'unknown role {kind!r}; expected "user", "assistant", "system" or "card"')
    return Message(number, kind, template.replace("{body}", body), speaker or None, line=part.line)


def _template(path: Path, line: int, quoted: str) -> str:
    try:
        template = json.loads(quoted)
    except json.JSONDecodeError as exc:
        raise StoryError(path, line, f"the message template is not a valid quoted string: {exc.msg}") from None
    if "{body}" not in template:
        raise StoryError(path, line, "the message template has no {body} for the message's text")
    return template


def _user_name(messages: list[Message]) -> str:
    names = {m.name for m in messages if m.role == "user" and m.name and m.card is None}
    return names.pop() if len(names) == 1 else ""
