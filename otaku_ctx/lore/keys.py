"""Keys as matchers: what one World Info key tests, found in a text without trying every key.

A plain key is tested on each piece of the scan text on its own (a message, or the content of
an activated entry): SillyTavern joins the pieces with "\\n\\x01", so a key without a newline
or a \\x01 matches the joined text exactly when it matches one of its pieces, and a piece's
matches can be kept for every turn and pass that scans it. Which keys a piece holds is found
through an index of short substrings (each key is filed under one of its trigrams, a shorter
key under itself), so a piece costs its length and the keys it holds, not the number of keys.

A `/regex/` key, and a plain key with a newline or \\x01 in it, is tested on the joined text,
as SillyTavern tests it. Regex time is bounded per build, not per scan (`Clock`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..story.worldinfo import regex_parts
from .rules import REGEX_SECONDS, REGEX_TOTAL_SECONDS

if TYPE_CHECKING:
    import regex

WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")  # JavaScript's \w
MACRO = re.compile(r"\{\{(char|user)\}\}|<(USER|BOT)>", re.IGNORECASE)  # what `fill` replaces
GRAM = 4  # keys are filed under a substring this long (shorter keys under themselves)


def whole_word_at(text: str, needle: str) -> int:
    """Where `needle` stands between non-word characters (JavaScript's ASCII \\W) or the ends
    of `text`, or -1: SillyTavern's `(?:^|\\W)key(?:$|\\W)`."""
    start, n = 0, len(needle)
    while (i := text.find(needle, start)) >= 0:
        if (i == 0 or text[i - 1] not in WORD) and (i + n == len(text) or text[i + n] not in WORD):
            return i
        start = i + 1
    return -1


def plain_at(text: str, needle: str, whole: bool) -> int:
    """Where a plain key matches in `text` (already lower-cased when the key ignores case)."""
    return whole_word_at(text, needle) if whole else text.find(needle)


@dataclass(frozen=True)
class Plain:
    """A plain key: `needle` lower-cased unless `sensitive`; `whole` = SillyTavern's one-word
    whole-word rule (a key with whitespace inside is a substring test even with whole words)."""

    needle: str
    sensitive: bool
    whole: bool

    @property
    def piecewise(self) -> bool:
        return "\n" not in self.needle and "\x01" not in self.needle


@dataclass(frozen=True)
class Pattern:
    """A `/regex/flags` key, compiled; `anchored` is JavaScript's `y` flag (only at index 0)."""

    key: str
    compiled: regex.Pattern[str]
    anchored: bool


Matcher = Plain | Pattern


def plain(key: str, sensitive: bool, whole_words: bool) -> Plain:
    needle = key if sensitive else key.lower()
    return Plain(needle, sensitive, whole_words and not any(c.isspace() for c in needle))


def pattern(key: str, fill: Callable[[str], str]) -> Pattern | None:
    """The key as a regular expression, or None when it is not one (SillyTavern then reads it
    as plain text). `{{char}}`/`{{user}}` in the pattern are filled with the names escaped:
    a name is data, never part of a pattern."""
    parts = regex_parts(key)
    if parts is None:
        return None
    import regex  # only a lorebook with regex keys needs it

    source, letters = parts
    if "{{" in source or "<" in source:
        source = MACRO.sub(lambda m: regex.escape(fill(m.group(0))), source)
    flags = regex.V0
    flags |= regex.IGNORECASE if "i" in letters else 0
    flags |= regex.MULTILINE if "m" in letters else 0
    flags |= regex.DOTALL if "s" in letters else 0
    try:
        return Pattern(key, regex.compile(source, flags), "y" in letters)
    except regex.error:
        return None  # the raw key compiled (the reader checked); a filled name cannot break it


@dataclass
class Clock:
    """Regex time for one build: each key gets `REGEX_SECONDS` in all and every key together
    `REGEX_TOTAL_SECONDS`; past either, a key counts as no match (and `timeouts` says which)."""

    per_key: float = REGEX_SECONDS
    total: float = REGEX_TOTAL_SECONDS
    spent: dict[str, float] = field(default_factory=dict)
    used: float = 0.0
    timeouts: set[str] = field(default_factory=set)
    runs: dict[str, int] = field(default_factory=dict)  # each key's searches: one out of time runs no more

    def search(self, p: Pattern, text: str) -> int | None:
        """Where `p` first matches `text`, or None (no match, or out of time)."""
        if p.key in self.timeouts:
            return None
        left = min(self.per_key - self.spent.get(p.key, 0.0), self.total - self.used)
        if left <= 0:
            self.timeouts.add(p.key)
            return None
        self.runs[p.key] = self.runs.get(p.key, 0) + 1
        start = time.perf_counter()
        try:
            found = p.compiled.match(text, timeout=left) if p.anchored else p.compiled.search(text, timeout=left)
        except TimeoutError:
            found = None
            self.timeouts.add(p.key)
        took = time.perf_counter() - start
        self.spent[p.key] = self.spent.get(p.key, 0.0) + took
        self.used += took
        return found.start() if found else None


class Haystack:
    """A text and where each of its trigrams starts: a key is then looked for only where its
    rarest trigram stands, so finding many keys costs the text once and the keys' hits, not
    every key times the text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._at: dict[str, list[int]] | None = None

    @property
    def at(self) -> dict[str, list[int]]:
        if self._at is None:
            at: dict[str, list[int]] = {}
            text = self.text
            for i in range(len(text) - GRAM + 1):
                gram = text[i : i + GRAM]
                seen = at.get(gram)
                if seen is None:
                    at[gram] = [i]
                else:
                    seen.append(i)
            self._at = at
        return self._at

    def starts(self, needle: str) -> list[int]:
        """Every place `needle` starts in the text (overlapping), in order."""
        text = self.text
        if len(needle) < GRAM:
            found, i = [], text.find(needle)
            while i >= 0 and needle:
                found.append(i)
                i = text.find(needle, i + 1)
            return found
        at = self.at
        offset = min(range(len(needle) - GRAM + 1), key=lambda i: len(at.get(needle[i : i + GRAM], ())))
        return [
            p - offset
            for p in at.get(needle[offset : offset + GRAM], ())
            if p >= offset and text.startswith(needle, p - offset)
        ]

    def count(self, needle: str) -> int:
        """`str.count`: the occurrences that do not overlap, from the left."""
        if not needle:
            return self.text.count(needle)
        n, end = 0, -1
        for start in self.starts(needle):
            if start >= end:
                n, end = n + 1, start + len(needle)
        return n

    def holds(self, key: Plain, starts: list[int] | None = None) -> bool:
        """Whether the plain key matches in the text (lower-cased already when it ignores case);
        `starts` are its starts when the caller has them."""
        if starts is None:
            starts = self.starts(key.needle) if key.needle else [0]
        if not key.whole:
            return bool(starts)
        text, n = self.text, len(key.needle)
        return any(
            (i == 0 or text[i - 1] not in WORD) and (i + n == len(text) or text[i + n] not in WORD) for i in starts
        )

    def starts_at(self, needle: str, gram: str, offset: int) -> list[int]:
        """Where `needle` starts, given that it holds `gram` at `offset`."""
        text = self.text
        return [p - offset for p in self.at.get(gram, ()) if p >= offset and text.startswith(needle, p - offset)]


class Keys:
    """Every key of a build as a numbered matcher, with the index that finds which plain keys
    a piece of text holds: each key is filed under its least crowded trigram (a shorter key
    under itself), and a piece is read once for the trigrams it has."""

    def __init__(self) -> None:
        self.matchers: list[Matcher] = []
        self._ids: dict[object, int] = {}
        # sensitive? -> gram length -> gram -> (id, where the gram stands in it) of the keys filed under it
        self._index: dict[bool, dict[int, dict[str, list[tuple[int, int]]]]] = {False: {}, True: {}}

    def add(self, matcher: Matcher) -> int:
        mid = self._ids.get(matcher)
        if mid is not None:
            return mid
        mid = self._ids[matcher] = len(self.matchers)
        self.matchers.append(matcher)
        if isinstance(matcher, Plain) and matcher.piecewise and matcher.needle:
            self._file(mid, matcher)
        return mid

    def _file(self, mid: int, key: Plain) -> None:
        size = min(GRAM, len(key.needle))
        buckets = self._index[key.sensitive].setdefault(size, {})
        grams = sorted({key.needle[i : i + size] for i in range(len(key.needle) - size + 1)})
        gram = min(grams, key=lambda g: len(buckets.get(g, ())))  # the least crowded
        buckets.setdefault(gram, []).append((mid, key.needle.index(gram)))

    def held(self, text: str) -> frozenset[int]:
        """The piecewise plain keys that match somewhere in `text` (one piece)."""
        found: set[int] = set()
        for sensitive, by_size in self._index.items():
            if not by_size:
                continue
            haystack = Haystack(text if sensitive else text.lower())
            for size, buckets in by_size.items():
                if size == GRAM:
                    grams: set[str] | object = haystack.at.keys() & buckets.keys()
                else:
                    t = haystack.text
                    grams = {t[i : i + size] for i in range(len(t) - size + 1)} & buckets.keys()
                assert isinstance(grams, set)
                for gram in grams:
                    for mid, offset in buckets[gram]:
                        key = self.matchers[mid]
                        assert isinstance(key, Plain)
                        if mid in found:
                            continue
                        if size == GRAM:
                            starts = haystack.starts_at(key.needle, gram, offset)
                        else:
                            starts = haystack.starts(key.needle)
                        if haystack.holds(key, starts):
                            found.add(mid)
        return frozenset(found)
