"""The story as plain, frozen data: what every reader produces and the assembler consumes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import IntEnum
from functools import cached_property
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Literal

from .meaning import Meaning

Role = Literal["user", "assistant", "system"]
ROLES: tuple[str, ...] = ("user", "assistant", "system")


@dataclass(frozen=True)
class Card:
    """A character joining the story (Tavern card fields, all optional but the name)."""

    name: str
    description: str = ""
    personality: str = ""
    scenario: str = ""
    example_dialogue: str = ""
    first_message: str = ""
    system_prompt: str = ""
    post_history_instructions: str = ""
    creator_notes: str = ""
    tags: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other names the story calls the character by (lore keys)
    book: tuple[LoreEntry, ...] = ()  # the card's lorebook (`character_book`), its entries bound to it
    avatar: str = ""  # the card's file name, when read from one: SillyTavern's avatar (characterFilter)


@dataclass(frozen=True, slots=True)
class Message:
    """One numbered message of the story (1..N). A card is a message too: `card` is set.
    `sent` is when it was sent, when the file says (`story/dates.py`): when it was said is not
    what was said, so two messages alike but for it are equal (a chat converted to a format
    that keeps no dates reads back equal)."""

    number: int
    role: Role
    content: str
    name: str | None = None
    card: Card | None = None
    line: int | None = None  # where it stood in the source file, for errors
    sent: datetime | None = field(default=None, compare=False)

    def __init__(
        self,
        number: int,
        role: Role,
        content: str,
        name: str | None = None,
        card: Card | None = None,
        line: int | None = None,
        sent: datetime | None = None,
    ) -> None:
        # The __init__ dataclass would write, by hand: a long story makes 100k Messages, and
        # setting the frozen slots through their descriptors costs half what its calls to
        # object.__setattr__ do. Keep it in step with the fields (their order, their defaults):
        # the setters below are taken from `fields(Message)`, so one added or removed fails the import.
        _set_number(self, number)
        _set_role(self, role)
        _set_content(self, content)
        _set_name(self, name)
        _set_card(self, card)
        _set_line(self, line)
        _set_sent(self, sent)

    @property
    def is_card(self) -> bool:
        return self.card is not None


_set_number, _set_role, _set_content, _set_name, _set_card, _set_line, _set_sent = (
    Message.__dict__[f.name].__set__ for f in fields(Message)
)


@dataclass(frozen=True)
class Scene:
    """Messages `start`..`end` (inclusive). `summary` tells this scene only;
    `history` is the story so far *through* this scene. `source` says where they came from:
    "story" (the file's own scene lines, an otaku export's scenes), "sillytavern memory" (the
    Summarize extension's `extra.memory`), "sidecar" (`ctx summarize`'s file); provenance, not
    content, so two scenes alike but for it are equal (a converted story reads back equal)."""

    order: int  # 1-based position among the scenes, by start
    start: int
    end: int
    id: int | str | None = None
    title: str = ""
    summary: str = ""
    history: str = ""
    line: int | None = None
    source: str = field(default="", compare=False)

    @property
    def ref(self) -> int | str:
        """The scene's id as users see it: its `id`, or its 1-based order when it has none."""
        return self.id if self.id is not None else self.order

    def holds(self, number: int) -> bool:
        return self.start <= number <= self.end


@dataclass(frozen=True)
class Lore:
    """What one character knows or is at the end of one scene (otaku's per-scene journals):
    `state` where they stand, `history` their story so far, `entry` the scene as they tell it."""

    name: str
    scene: int | str | None = None  # the scene's ref (its id, else its order)
    state: str = ""
    history: str = ""
    entry: str = ""
    line: int | None = None


class LorePosition(IntEnum):
    """Where an entry stands in the prompt: World Info's `position` 0..6, by SillyTavern's numbers."""

    BEFORE = 0  # before the character's description (wiBefore)
    AFTER = 1  # after it (wiAfter)
    NOTE_TOP = 2  # the author's note's top
    NOTE_BOTTOM = 3  # its bottom
    DEPTH = 4  # in the chat, `depth` messages from the end, in its `role`
    EXAMPLES_TOP = 5  # before the example dialogue
    EXAMPLES_BOTTOM = 6  # after it

    @property
    def label(self) -> str:
        return self.name.lower()


LORE_POSITIONS = {p.value: p.label for p in LorePosition}
LORE_ROLES: tuple[Role, ...] = ("system", "user", "assistant")  # World Info's `role` 0, 1, 2
SELECTIVE_LOGICS = ("AND_ANY", "NOT_ALL", "NOT_ANY", "AND_ALL")  # World Info's `selectiveLogic` 0..3


@dataclass(frozen=True)
class LoreEntry:
    """One World Info entry with SillyTavern's fields (docs/lore.md). `None` in an optional
    field means "the `[lore]` setting decides", as a missing field does in SillyTavern."""

    uid: int | str
    content: str
    key: tuple[str, ...] = ()
    keysecondary: tuple[str, ...] = ()
    comment: str = ""
    constant: bool = False
    disable: bool = False
    selective: bool = True
    selective_logic: int = 0  # index into SELECTIVE_LOGICS
    order: int = 100
    position: int = LorePosition.BEFORE  # a LorePosition; another number is read and placed nowhere
    depth: int = 4
    role: int = 0  # index into LORE_ROLES
    scan_depth: int | None = None
    case_sensitive: bool | None = None
    match_whole_words: bool | None = None
    exclude_recursion: bool = False
    prevent_recursion: bool = False
    delay_until_recursion: int = 0
    probability: float = 100
    use_probability: bool = True
    group: str = ""
    group_override: bool = False
    group_weight: float = 100
    use_group_scoring: bool | None = None
    sticky: int = 0
    cooldown: int = 0
    delay: int = 0
    decorators: tuple[str, ...] = ()  # the `@@` lines its content started with (`@@activate`, …)
    # characterFilter: for which characters the entry may fire (their card file's stem), and tags
    character_names: tuple[str, ...] = ()
    character_tags: tuple[str, ...] = ()
    character_exclude: bool = False  # the lists name who it must not fire for
    source: str = ""  # the lorebook's file name, or the story's own
    character: str = ""  # the character whose card holds it (character lore); "" = world lore
    chat: bool = False  # the story's own lore (SillyTavern's chat lore): scanned before the rest
    line: int | None = None  # the story line it came from, for native lore lines
    # What the reader met that SillyTavern reads its own way, as (kind, what): ("regex", key) a
    # `/regex/` that does not compile (a plain-text key), ("text_keys", field) keys given as one
    # text (no keys), ("position", n) a position 1.12 does not place. `ctx` says so once.
    problems: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        """What users call the entry: its comment (title), else its first key, else its uid."""
        return self.comment or next((k for k in self.key if k.strip()), str(self.uid))

    @property
    def character_filter(self) -> dict[str, object] | None:
        """`characterFilter` as World Info writes it, or None when the entry has none."""
        if not (self.character_names or self.character_tags or self.character_exclude):
            return None
        names, tags = list(self.character_names), list(self.character_tags)
        return {"isExclude": self.character_exclude, "names": names, "tags": tags}


# What a story's every-turn scans read of each message, taken in C.
_CONTENT = attrgetter("content")
_SPEAKER = attrgetter("role", "name")
_CARD = attrgetter("card")  # a Card is always true, None false


@dataclass(frozen=True)
class StoryInfo:
    """What a story says about itself, beyond messages: fills template variables."""

    title: str = ""
    user: str = ""  # the user's persona name ({{user}})
    char: str = ""  # the main character's name ({{char}}); else the first card's name
    persona: str = ""  # the persona's description
    scenario: str = ""
    instructions: str = ""
    current_date: str = ""
    story_so_far: str = ""
    cast: tuple[Card, ...] = ()  # characters the story knows of that never joined as a card message


@dataclass(frozen=True)
class Story:
    """A whole story. `system` is the leading system message (not numbered)."""

    path: Path
    messages: tuple[Message, ...]
    scenes: tuple[Scene, ...] = ()
    system: str = ""
    info: StoryInfo = field(default_factory=StoryInfo)
    lore: tuple[Lore, ...] = ()
    world: tuple[LoreEntry, ...] = ()  # World Info entries: the story's own lore lines and --lore books
    notes: tuple[str, ...] = ()  # what the reader chose that the user should hear of (stderr)
    hidden: int = 0  # source rows that never reach the prompt (e.g. SillyTavern hidden messages)
    source_format: str = "native"
    # what an embedding model says of its texts at its newest turn (recall by meaning), when
    # `[recall]` names one: the caller's, like `scenes` (`vectors.py`); never part of its identity
    meaning: Meaning | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.messages)

    def message(self, number: int) -> Message:
        return self.messages[number - 1]

    @cached_property
    def cards(self) -> tuple[Message, ...]:
        """The card messages, in story order (found once per story)."""
        return tuple(compress(self.messages, map(_CARD, self.messages)))

    @cached_property
    def known_cards(self) -> tuple[Card, ...]:
        """Every character the story has a card for: its card messages' cards, then its cast."""
        return tuple(m.card for m in self.cards if m.card) + self.info.cast

    @cached_property
    def longest_text(self) -> int:
        """The characters of the story's longest single text (a message, a summary or history,
        the system message): what one render may have to hold whatever the window."""
        longest = max(map(len, map(_CONTENT, self.messages)), default=0)  # in C: a chat's every turn asks
        scenes = (max(len(s.summary or ""), len(s.history or "")) for s in self.scenes)
        return max(len(self.system), longest, *scenes)

    @cached_property
    def speakers(self) -> dict[tuple[Role, str], int]:
        """Who speaks the story's messages (cards aside): how many messages each (role, name)
        has — name "" for an unnamed row — in the order each first speaks. Counted once per
        story, for everything that asks who speaks (names, personas, stop strings)."""
        counts: dict[tuple[Role, str], int] = {}
        if not self.cards:  # counted in C (a chat's every turn asks), in the order each first speaks
            for (role, name), n in Counter(map(_SPEAKER, self.messages)).items():
                key = (role, name or "")
                counts[key] = counts.get(key, 0) + n
            return counts
        for m in self.messages:
            if m.card is None:
                key = (m.role, m.name or "")
                counts[key] = counts.get(key, 0) + 1
        return counts
