"""World Info: SillyTavern lorebooks, the lorebooks inside Tavern cards, and native lore lines.

A World Info file is `{"entries": {"<uid>": {...}}}` (a list of entries is accepted too).
Every field SillyTavern writes is read with its meaning (docs/lore.md); a field that is
missing takes SillyTavern's default, or for the optional ones (`scanDepth`, `caseSensitive`,
`matchWholeWords`, `useGroupScoring`) the `[lore]` setting. A card's `character_book` is
converted the way SillyTavern converts it (`keys` → key, `insertion_order` → order,
`enabled` → not disable, `extensions.*` for the rest); its entries belong to the card's character.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StoryError
from ..files import read_input
from ..jsonload import JSONProblem, loads
from .model import LORE_POSITIONS, LORE_ROLES, SELECTIVE_LOGICS, LoreEntry, LorePosition

if TYPE_CHECKING:
    import regex

_REGEX_KEY = re.compile(r"^/([\w\W]+?)/([gimsuy]*)$")


def regex_parts(key: str) -> tuple[str, str] | None:
    """A `/pattern/flags` key as (the pattern for Python's `regex`, the flags), or None for a
    plain key — SillyTavern's `parseRegexFromString` before it compiles: the pattern may hold
    no unescaped `/`, and its first `\\/` is unescaped. Whether it compiles is `regex_key`'s
    question."""
    match = _REGEX_KEY.match(key)
    if not match or re.search(r"(^|[^\\])/", match.group(1)):
        return None
    return _python_pattern(match.group(1).replace("\\/", "/", 1), "u" in match.group(2)), match.group(2)


def _python_pattern(source: str, unicode: bool) -> str:
    """A JavaScript pattern in the `regex` package's syntax, for the constructs that differ
    and that lorebooks use: `\\k<name>`, `[^]` (any character), `[]` (nothing), and `\\p`
    outside `u` mode (a plain `p` there)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(source):
        c = source[i]
        if c == "\\" and i + 1 < len(source):
            after = source[i + 1]
            end = source.find(">", i + 3) if source.startswith("k<", i + 1) and not in_class else -1
            if end > 0:
                out.append(f"(?P={source[i + 3 : end]})")
                i = end + 1
                continue
            out.append(after if after in "pP" and not unicode else source[i : i + 2])
            i += 2
            continue
        if not in_class and source.startswith("[^]", i):
            out.append(r"[\s\S]")
            i += 3
            continue
        if not in_class and source.startswith("[]", i):
            out.append("(?!)")
            i += 2
            continue
        in_class = (in_class and c != "]") or (not in_class and c == "[")
        out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=4096)
def regex_key(key: str) -> regex.Pattern[str] | None:
    """A `/pattern/flags` key compiled (flags i, m, s; g means nothing to a test and y anchors
    the match at the start), or None: a plain key, or one that does not compile — SillyTavern
    reads that as plain text, and so does ctx (the reader notes it)."""
    parts = regex_parts(key)
    if parts is None:
        return None
    import regex  # only a lorebook with regex keys needs it

    pattern, letters = parts
    flags = regex.V0
    flags |= regex.IGNORECASE if "i" in letters else 0
    flags |= regex.MULTILINE if "m" in letters else 0
    flags |= regex.DOTALL if "s" in letters else 0
    try:
        return regex.compile(pattern, flags)
    except regex.error:
        return None


def malformed_regex(key: str) -> bool:
    """Whether `key` is written as a `/regex/` but does not compile (read as plain text)."""
    return _REGEX_KEY.match(key) is not None and regex_key(key) is None


KNOWN_DECORATORS = ("@@activate", "@@dont_activate")


def parse_decorators(content: str) -> tuple[tuple[str, ...], str]:
    """(decorators, content without them): SillyTavern's `parseDecorators`. Only content that
    starts with `@@` has any; its leading `@@` lines are read (a known decorator is kept whole,
    `@@@x` after an unknown one counts as `@@x`, other `@@` lines are dropped) and the content
    starts at the first other line. Content made only of `@@` lines is kept as it is."""
    if not content.startswith("@@"):
        return (), content
    decorators: list[str] = []
    fallback = False
    lines = content.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("@@"):
            return tuple(decorators), "\n".join(lines[i:])
        if line.startswith("@@@") and not fallback:
            continue
        bare = line[1:] if line.startswith("@@@") else line
        if bare.startswith(KNOWN_DECORATORS):
            decorators.append(bare)
            fallback = False
        else:
            fallback = True
    return tuple(decorators), content


# A lorebook is kilobytes to a few megabytes; past this it is not one.
LOREBOOK_LIMIT = 64 * 2**20
# The deepest an entry may scan or be placed (SillyTavern's MAX_SCAN_DEPTH).
MOST_DEPTH = 1000
MOST_STEPS = 10_000  # sticky, cooldown, delay: turns
# SillyTavern 1.12 places positions 0-6; a later one's positions (7, an outlet) are read, fire and
# count in the budget, and are placed nowhere, as 1.12 does with them.
MOST_POSITION = 99


class _Fields:
    """Reads one entry's fields, each error naming the file, the entry and the field."""

    def __init__(self, path: Path | str, uid: object, obj: dict[str, Any], line: int | None = None) -> None:
        self.path, self.uid, self.obj, self.line = path, uid, obj, line
        self.problems: list[tuple[str, str]] = []  # what SillyTavern reads its own way (LoreEntry.problems)

    def wrong(self, name: str, expected: str) -> StoryError:
        value = self.obj.get(name)
        shown = type(value).__name__ if not isinstance(value, int | float | bool | str) else repr(value)
        return StoryError(self.path, self.line, f'lore entry {self.uid}: "{name}" must be {expected}, not {shown}')

    def keys(self, name: str) -> tuple[str, ...]:
        """A list of text, as SillyTavern keeps it (blank items too: they never match). One text
        instead of a list is read as SillyTavern reads it — no keys — and noted; a `/regex/`
        that does not compile is a plain-text key, as in SillyTavern, and noted."""
        value = self.obj.get(name)
        if value is None:
            return ()
        if isinstance(value, str):
            self.problems.append(("text_keys", name))
            return ()
        if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
            raise self.wrong(name, "a list of text")
        self.problems.extend(("regex", key) for key in value if malformed_regex(key.strip()))
        return tuple(value)

    def character_filter(self) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
        """`characterFilter`: {"names": [...], "tags": [...], "isExclude": bool}, each part optional."""
        value = self.obj.get("characterFilter")
        if value is None:
            return (), (), False
        if not isinstance(value, dict):
            raise self.wrong("characterFilter", 'an object with "names", "tags" and "isExclude"')
        lists: list[tuple[str, ...]] = []
        for part in ("names", "tags"):
            items = value.get(part) or []
            if not isinstance(items, list) or not all(isinstance(x, str | int) and x is not True for x in items):
                raise StoryError(
                    self.path, self.line, f'lore entry {self.uid}: "characterFilter.{part}" must be a list of text'
                )
            lists.append(tuple(str(x) for x in items))
        exclude = value.get("isExclude", False)
        if not isinstance(exclude, bool):
            raise StoryError(
                self.path, self.line, f'lore entry {self.uid}: "characterFilter.isExclude" must be true or false'
            )
        return lists[0], lists[1], exclude

    def content(self) -> tuple[tuple[str, ...], str]:
        """(decorators, content): the decorators are read from the content as it is in the file
        (before its line ends are made plain), or from `decorators` in a lore line ctx wrote."""
        raw = self.obj.get("content")
        if raw is not None and not isinstance(raw, str):
            raise self.wrong("content", "text")
        given = self.obj.get("decorators")
        if given is not None:
            if not isinstance(given, list) or not all(isinstance(d, str) for d in given):
                raise self.wrong("decorators", "a list of text")
            return tuple(given), (raw or "").replace("\r\n", "\n")
        decorators, content = parse_decorators(raw or "")
        return decorators, content.replace("\r\n", "\n")

    def text(self, name: str) -> str:
        value = self.obj.get(name)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.wrong(name, "text")
        return value.replace("\r\n", "\n")

    def flag(self, name: str, default: bool) -> bool:
        value = self.obj.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.wrong(name, "true or false")
        return value

    def maybe_flag(self, name: str) -> bool | None:
        return None if self.obj.get(name) is None else self.flag(name, False)

    def number(self, name: str, default: float, least: float = 0, most: float = 1e9) -> float:
        value = self.obj.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not least <= value <= most:
            raise self.wrong(name, f"a number from {least:g} to {most:g}")
        return value

    def whole(self, name: str, default: int, least: int = 0, most: int = MOST_DEPTH) -> int:
        value = self.number(name, default, least, most)
        if value != int(value):
            raise self.wrong(name, f"a whole number from {least} to {most}")
        return int(value)

    def maybe_whole(self, name: str, most: int = MOST_DEPTH) -> int | None:
        return None if self.obj.get(name) is None else self.whole(name, 0, 0, most)

    def recursion_delay(self, name: str) -> int:
        """`delayUntilRecursion`: false/true (level 1) or a level number."""
        value = self.obj.get(name)
        if value is None or value is False:
            return 0
        if value is True:
            return 1
        return self.whole(name, 0, 0, MOST_DEPTH)


def entry_from_world_info(
    path: Path | str, uid: object, obj: Any, source: str, line: int | None = None, character: str = ""
) -> LoreEntry:
    """One entry of a World Info file (SillyTavern's field names) as a LoreEntry."""
    if not isinstance(obj, dict):
        raise StoryError(path, line, f"lore entry {uid}: an entry is a JSON object, not {type(obj).__name__}")
    f = _Fields(path, obj.get("uid", uid), obj, line)
    if isinstance(f.uid, bool) or not isinstance(f.uid, int | str):
        raise f.wrong("uid", "a number or text")
    position = f.whole("position", 0, 0, MOST_POSITION)
    if position not in LORE_POSITIONS:
        f.problems.append(("position", str(position)))
    names, tags, exclude = f.character_filter()
    decorators, content = f.content()
    return LoreEntry(
        uid=f.uid,
        content=content,
        key=f.keys("key"),
        keysecondary=f.keys("keysecondary"),
        comment=f.text("comment"),
        constant=f.flag("constant", False),
        disable=f.flag("disable", False),
        selective=f.flag("selective", True),
        selective_logic=f.whole("selectiveLogic", 0, 0, len(SELECTIVE_LOGICS) - 1),
        order=f.whole("order", 100, -MOST_STEPS * 100, MOST_STEPS * 100),
        position=LorePosition(position) if position in LORE_POSITIONS else position,
        depth=f.whole("depth", 4),
        role=f.whole("role", 0, 0, len(LORE_ROLES) - 1),
        scan_depth=f.maybe_whole("scanDepth"),
        case_sensitive=f.maybe_flag("caseSensitive"),
        match_whole_words=f.maybe_flag("matchWholeWords"),
        exclude_recursion=f.flag("excludeRecursion", False),
        prevent_recursion=f.flag("preventRecursion", False),
        delay_until_recursion=f.recursion_delay("delayUntilRecursion"),
        probability=f.number("probability", 100, 0, 100),
        use_probability=f.flag("useProbability", True),
        group=f.text("group"),
        group_override=f.flag("groupOverride", False),
        group_weight=f.number("groupWeight", 100, 0, 1e6),
        use_group_scoring=f.maybe_flag("useGroupScoring"),
        sticky=f.maybe_whole("sticky", MOST_STEPS) or 0,
        cooldown=f.maybe_whole("cooldown", MOST_STEPS) or 0,
        delay=f.maybe_whole("delay", MOST_STEPS) or 0,
        decorators=decorators,
        character_names=names,
        character_tags=tags,
        character_exclude=exclude,
        source=source,
        character=character,
        line=line,
        problems=tuple(f.problems),
    )


# LoreEntry field -> World Info key, for writing native lore lines (convert) in SillyTavern's names.
WORLD_INFO_NAMES = {
    "uid": "uid", "key": "key", "keysecondary": "keysecondary", "comment": "comment", "content": "content",
    "constant": "constant", "disable": "disable", "selective": "selective", "selective_logic": "selectiveLogic",
    "order": "order", "position": "position", "depth": "depth", "role": "role", "scan_depth": "scanDepth",
    "case_sensitive": "caseSensitive", "match_whole_words": "matchWholeWords",
    "exclude_recursion": "excludeRecursion", "prevent_recursion": "preventRecursion",
    "delay_until_recursion": "delayUntilRecursion", "probability": "probability", "use_probability": "useProbability",
    "group": "group", "group_override": "groupOverride", "group_weight": "groupWeight",
    "use_group_scoring": "useGroupScoring", "sticky": "sticky", "cooldown": "cooldown", "delay": "delay",
    "character_filter": "characterFilter", "decorators": "decorators", "source": "source", "character": "character",
}  # fmt: skip


def read_world_info(path: Path) -> tuple[LoreEntry, ...]:
    """Every entry of a SillyTavern World Info file, in the order SillyTavern walks them."""
    data = read_input(path, "lorebook")
    if len(data) > LOREBOOK_LIMIT:
        raise StoryError(path, None, f"is {len(data):,} bytes, more than any lorebook ({LOREBOOK_LIMIT // 2**20} MB)")
    if data.startswith(b"\x89PNG"):
        raise StoryError(path, None, "is a PNG character card, not a lorebook; --card takes it (its lorebook is read)")
    try:
        obj = loads(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError:
        raise StoryError(path, None, "is not UTF-8 JSON; expected a SillyTavern World Info file") from None
    except JSONProblem as exc:
        raise StoryError(path, exc.line, f"is not a World Info file: {exc.message}") from None
    return world_info_entries(path, obj, path.name)


def world_info_entries(path: Path | str, obj: Any, source: str) -> tuple[LoreEntry, ...]:
    if isinstance(obj, dict) and (obj.get("spec") in ("chara_card_v2", "chara_card_v3") or "first_mes" in obj):
        raise StoryError(path, None, "is a character card, not a lorebook; --card takes it (its lorebook is read)")
    entries = obj.get("entries") if isinstance(obj, dict) else None
    if isinstance(entries, dict):
        items: Iterable[tuple[object, Any]] = sorted(entries.items(), key=lambda kv: _javascript_key_order(kv[0]))
    elif isinstance(entries, list):
        items = enumerate(entries)
    else:
        raise StoryError(path, None, 'is not a World Info file: expected {"entries": {"<uid>": {...}}}')
    return tuple(entry_from_world_info(path, uid, e, source) for uid, e in items)


def _javascript_key_order(key: object) -> tuple[int, int]:
    """Where a key stands among an object's keys in JavaScript (which SillyTavern's scan walks
    its entries in): array-index keys ("0", "12", not "01") first, by number, then the rest."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and str(int(key)) == key and int(key) < 2**32 - 1:
        return (0, int(key))
    return (1, 0)


def card_book_entries(path: Path | str, book: Any, character: str) -> tuple[LoreEntry, ...]:
    """A Tavern card's `character_book` converted as SillyTavern converts it; every entry is
    bound to `character`."""
    if book is None:
        return ()
    if not isinstance(book, dict) or not isinstance(book.get("entries"), list):
        raise StoryError(path, None, 'the card\'s "character_book" must be an object with an "entries" list')
    source = f"{Path(path).name} (character_book)"
    return tuple(_card_entry(path, i, e, source, character) for i, e in enumerate(book["entries"]))


def _card_entry(path: Path | str, index: int, obj: Any, source: str, character: str) -> LoreEntry:
    if not isinstance(obj, dict):
        raise StoryError(path, None, f"character_book entry {index}: an entry is a JSON object")
    ext = obj.get("extensions") or {}
    if not isinstance(ext, dict):
        raise StoryError(path, None, f'character_book entry {index}: "extensions" must be an object')
    uid = obj.get("id", index)
    position = ext.get("position")
    if position is None:
        position = 0 if obj.get("position") == "before_char" else 1
    enabled = obj.get("enabled", True)
    if not isinstance(enabled, bool):
        raise StoryError(path, None, f'character_book entry {uid}: "enabled" must be true or false')
    renamed: dict[str, Callable[[], Any]] = {
        "key": lambda: obj.get("keys"),
        "keysecondary": lambda: obj.get("secondary_keys"),
        "order": lambda: obj.get("insertion_order"),
        "selectiveLogic": lambda: ext.get("selectiveLogic"),
        "excludeRecursion": lambda: ext.get("exclude_recursion"),
        "preventRecursion": lambda: ext.get("prevent_recursion"),
        "delayUntilRecursion": lambda: ext.get("delay_until_recursion"),
        "probability": lambda: ext.get("probability"),
        "useProbability": lambda: ext.get("useProbability"),
        "depth": lambda: ext.get("depth"),
        "group": lambda: ext.get("group"),
        "groupOverride": lambda: ext.get("group_override"),
        "groupWeight": lambda: ext.get("group_weight"),
        "scanDepth": lambda: ext.get("scan_depth"),
        "caseSensitive": lambda: ext.get("case_sensitive"),
        "matchWholeWords": lambda: ext.get("match_whole_words"),
        "useGroupScoring": lambda: ext.get("use_group_scoring"),
        "role": lambda: ext.get("role"),
        "sticky": lambda: ext.get("sticky"),
        "cooldown": lambda: ext.get("cooldown"),
        "delay": lambda: ext.get("delay"),
    }
    fields: dict[str, Any] = {name: get() for name, get in renamed.items()}
    fields.update(
        uid=uid,
        content=obj.get("content"),
        comment=obj.get("comment"),
        constant=obj.get("constant"),
        selective=obj.get("selective", False),
        disable=not enabled,
        position=position,
    )
    return entry_from_world_info(path, uid, fields, source, character=character)
