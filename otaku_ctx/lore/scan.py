"""One scan: SillyTavern's activation of World Info entries for one turn (`checkWorldInfo`'s
loop, world-info.js L3791-4124 at ba6f7b7a), with timed effects replayed from the turns before.

The rules are SillyTavern's to the letter (docs/lore.md); the cost is not. SillyTavern tests
every entry's keys against the whole scan text in every pass. Here a pass tests only the
entries that can have changed: a key can newly match only in text the pass added (a deeper
message, the content of the entries the last pass activated), so each pass looks up which keys
that new text holds (`Keys.held`, through an index) and tests their entries, plus the few that
must always be tested (regex keys, entries that lost a group or the budget last pass, entries a
new recursion level lets in). A recursion chain of n entries then costs n small passes, not n
passes over n entries, and a turn costs the messages it reads and the keys they hold.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ..story.model import SELECTIVE_LOGICS, LoreEntry
from .choice import Character, ChatLine, LoreDecision, Reason
from .keys import Clock, Keys, Matcher, Pattern, Plain, pattern, plain, plain_at
from .rules import JOIN, MOST_SCAN_DEPTH, LoreRules

Kind = Literal["initial", "recursion", "min_activations"]
Where = tuple[str, object]  # ("message", ChatLine) | ("entry", uid) | ("text", None)

# ── Timed effects and rolls ────────────────────────────────────────────────────────────────


@dataclass
class Timed:
    """Timed effects at one turn: entry identity -> (start, end)."""

    sticky: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)
    cooldown: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)

    def advance(self, turn: int, entries: dict[tuple[str, int | str], LoreEntry]) -> None:
        """Drop effects whose time is up; a sticky that ends starts its entry's cooldown."""
        for ident, (_, end) in list(self.sticky.items()):
            if turn >= end:
                del self.sticky[ident]
                entry = entries.get(ident)
                if entry is not None and entry.cooldown:
                    self.cooldown[ident] = (turn, turn + entry.cooldown)
        for ident, (_, end) in list(self.cooldown.items()):
            if turn >= end:
                del self.cooldown[ident]

    def record(self, turn: int, entry: LoreEntry) -> None:
        ident = identity(entry)
        if entry.sticky and ident not in self.sticky:
            self.sticky[ident] = (turn, turn + entry.sticky)
        if entry.cooldown and ident not in self.cooldown:
            self.cooldown[ident] = (turn, turn + entry.cooldown)


def identity(entry: LoreEntry) -> tuple[str, int | str]:
    return (entry.source, entry.uid)


def dice(seed: str, *parts: object) -> float:
    """A number in [0, 1) from the story's seed and the parts: the same story gives the same
    prompt; a new turn (or another entry) gets a new roll."""
    import hashlib  # only an entry with a probability rolls: a build without one skips both
    import random

    digest = hashlib.sha256("\x1f".join([seed, *map(str, parts)]).encode()).digest()
    return random.Random(digest).random()


def in_scan_order(entries: Sequence[LoreEntry], strategy: str = "character_first") -> list[LoreEntry]:
    """SillyTavern's sorted entries (`getSortedEntries`): chat lore by `order` (highest first),
    then character and world lore by the strategy — together (`evenly`), or one kind first."""

    def by_order(kind: Sequence[LoreEntry]) -> list[LoreEntry]:
        return sorted(kind, key=lambda e: -e.order)

    chat = [e for e in entries if e.chat and not e.character]
    character = [e for e in entries if e.character]
    world = [e for e in entries if not e.chat and not e.character]
    if strategy == "evenly":
        rest = by_order([e for e in entries if e.character or not e.chat])
    elif strategy == "global_first":
        rest = by_order(world) + by_order(character)
    else:
        rest = by_order(character) + by_order(world)
    return by_order(chat) + rest


# ── What every scan of a build shares ──────────────────────────────────────────────────────


@dataclass(eq=False)
class Item:
    """One entry as the scans see it, worked out once per build."""

    entry: LoreEntry
    rank: int  # its place in the sorted entries
    primary: tuple[tuple[str, int] | None, ...]  # (filled key, matcher); None: empty once filled
    secondary: tuple[tuple[str, int] | None, ...]
    allowed: bool  # its characterFilter lets it fire for this character
    joined: bool  # a key is tested on the joined text (a regex, a newline in it, blank)
    groups: tuple[str, ...]
    ident: tuple[str, int | str]  # (source, uid): what timed effects are kept by


def allowed_for(entry: LoreEntry, character: Character | None) -> bool:
    """SillyTavern's characterFilter (L3801-3827): the names list, then the tags list, each
    tested only when it is not empty. With no character, a name filter sees no name (include
    fails, exclude passes) and a tag filter is skipped."""
    if entry.character_names:
        listed = character is not None and character.name in entry.character_names
        if listed == entry.character_exclude:
            return False
    if entry.character_tags and character is not None:
        wanted = {t.casefold() for t in entry.character_tags}
        tagged = any(t.casefold() in wanted for t in character.tags)
        if tagged == entry.character_exclude:
            return False
    return True


class Book:
    """The entries of a build in scan order, their keys as matchers, and what the scans of its
    turns share: each message's and each content's keys, costs, the regex clock."""

    def __init__(
        self,
        entries: Sequence[LoreEntry],
        rules: LoreRules,
        fill: Callable[[str], str],
        cost: Callable[[LoreEntry], int],
        character: Character | None,
    ) -> None:
        self.rules, self.fill, self.cost = rules, fill, cost
        self.keys = Keys()
        self.clock = Clock()
        self.items: list[Item] = []
        self.by_ident: dict[tuple[str, int | str], list[Item]] = {}
        self.owners: dict[int, list[Item]] = {}  # matcher -> items with it as a primary key
        self.second_owners: dict[int, list[Item]] = {}  # matcher -> items with it as a secondary key
        for rank, e in enumerate(in_scan_order(entries, rules.strategy)):
            sensitive = e.case_sensitive if e.case_sensitive is not None else rules.case_sensitive
            whole = e.match_whole_words if e.match_whole_words is not None else rules.match_whole_words
            primary = tuple(self._key(k, sensitive, whole) for k in e.key)
            secondary = tuple(self._key(k, sensitive, whole) for k in e.keysecondary)
            joined = any(k is not None and not self._piecewise(k[1]) for k in (*primary, *secondary))
            groups = tuple(g for g in (name.strip() for name in _split_groups(e.group)) if g)
            item = Item(e, rank, primary, secondary, allowed_for(e, character), joined, groups, identity(e))
            self.items.append(item)
            self.by_ident.setdefault(item.ident, []).append(item)
            for k in primary:
                if k is not None:
                    self.owners.setdefault(k[1], []).append(item)
            for k in secondary:
                if k is not None:
                    self.second_owners.setdefault(k[1], []).append(item)
        self.by_entry = {ident: items[0].entry for ident, items in self.by_ident.items()}
        self.live = [it for it in self.items if it.entry.constant or "@@activate" in it.entry.decorators]
        self.joined = [it for it in self.items if it.joined]
        self.own_depth = [it for it in self.items if it.entry.scan_depth is not None and it.entry.key]
        self.delayed = sorted((it for it in self.items if it.entry.delay_until_recursion), key=lambda it: it.rank)
        self.levels = sorted({it.entry.delay_until_recursion for it in self.delayed})
        self.members: dict[str, list[Item]] = {}  # group name -> its entries
        for it in self.items:
            for name in it.groups:
                self.members.setdefault(name, []).append(it)
        self._message_keys: dict[tuple[int, str], frozenset[int]] = {}
        self._content_keys: dict[int, frozenset[int]] = {}
        self._contents: dict[int, str] = {}
        self._raw: dict[tuple[str, bool, bool], Matcher] = {}

    def _key(self, key: str, sensitive: bool, whole: bool) -> tuple[str, int] | None:
        """A key as SillyTavern tests it: macros filled, skipped when that leaves it empty,
        trimmed; a `/regex/` is decided on the key as written (names never make a pattern)."""
        filled = self.fill(key)
        if not filled:
            return None
        found = pattern(key.strip(), self.fill)
        matcher: Matcher = found if found is not None else plain(filled.strip(), sensitive, whole)
        return filled.strip(), self.keys.add(matcher)

    def _piecewise(self, mid: int) -> bool:
        m = self.keys.matchers[mid]
        return isinstance(m, Plain) and m.piecewise and bool(m.needle)

    def text_of(self, line: ChatLine) -> str:
        """A message as the scan reads it: `Name: text` (with include_names), trimmed."""
        return (f"{line.speaker}: {line.text}" if self.rules.include_names and line.speaker else line.text).strip()

    def message_keys(self, line: ChatLine) -> frozenset[int]:
        cache = (line.number, line.text)
        found = self._message_keys.get(cache)
        if found is None:
            found = self._message_keys[cache] = self.keys.held(self.text_of(line))
        return found

    def content(self, item: Item) -> str:
        text = self._contents.get(id(item))
        if text is None:
            text = self._contents[id(item)] = self.fill(item.entry.content)
        return text

    def content_keys(self, item: Item) -> frozenset[int]:
        found = self._content_keys.get(id(item))
        if found is None:
            found = self._content_keys[id(item)] = self.keys.held(self.content(item))
        return found

    def raw(self, key: str, entry: LoreEntry) -> Matcher:
        """A key as SillyTavern's group score tests it: as written, neither filled nor trimmed."""
        sensitive = entry.case_sensitive if entry.case_sensitive is not None else self.rules.case_sensitive
        whole = entry.match_whole_words if entry.match_whole_words is not None else self.rules.match_whole_words
        cache = (key, sensitive, whole)
        if cache not in self._raw:
            found = pattern(key, lambda macro: macro)
            self._raw[cache] = found if found is not None else plain(key, sensitive, whole)
        return self._raw[cache]


def _split_groups(group: str) -> list[str]:
    import re  # SillyTavern splits on /,\s*/

    return re.split(r",\s*", group) if group else []


# ── One scan (one turn) ────────────────────────────────────────────────────────────────────


# What a replayed turn's test of an entry gives when it fires: a replay keeps no decisions.
FIRED = LoreDecision(LoreEntry(uid="", content=""), True, "key")


@dataclass(eq=False)
class Fired:
    """An entry a pass activated, and what is decided about it."""

    item: Item
    decision: LoreDecision


class Scan:
    """One run of SillyTavern's scan loop for one turn. `record` keeps a decision for every
    entry tested (the turn being built); a replayed turn only needs what was admitted."""

    def __init__(
        self,
        book: Book,
        chat: Sequence[ChatLine],
        seed: str,
        turn: int,
        timed: Timed,
        budget: int,
        *,
        record: bool = True,
        only: set[int] | None = None,
    ) -> None:
        self.book, self.rules, self.seed, self.turn, self.timed, self.budget = (
            book, book.rules, seed, turn, timed, budget,
        )  # fmt: skip
        self.newest = list(reversed(chat[-MOST_SCAN_DEPTH:]))
        self.record, self.only = record, only
        self.decisions: dict[int, LoreDecision] = {}
        self.admitted: list[Item] = []
        self.used = 0
        self.overflowed = False
        self.tests = 0  # entries tested: what a replayed turn costs
        self._activated: set[int] = set()
        self._failed: set[int] = set()
        self._retry: dict[int, Item] = {}  # fired, but lost its group or the budget: fires again later
        self._admitted_groups: set[str] = set()  # the `group` texts of the admitted entries
        self.lazy = not record and self.rules.engine == "sillytavern" and not book.levels
        self._opened = 0  # messages whose keys are in _first
        self._first: dict[int, int] = {}  # matcher -> the newest message (0 = newest) holding it
        self.recursion: list[str] = []  # SillyTavern's recursion buffer: one text per pass
        self._recursion_items: list[list[Item]] = []
        self._recursion_first: dict[int, int | str] = {}  # matcher -> the entry whose content holds it
        self._joined: dict[tuple[int, int], tuple[str, str, list[int], list[object]]] = {}

    # ── The loop ──

    def run(self) -> None:
        rules = self.rules
        levels = list(self.book.levels)
        level = levels.pop(0) if levels else 0
        kind: Kind | None = "initial"
        count, skew, carried = 0, 0, 0
        last: tuple[Kind, int, int, int] | None = None  # the pass before: kind, depth, recursion texts, level
        window = 0  # the depth of the last pass without recursion text
        while kind:
            if rules.max_recursion_steps and rules.max_recursion_steps <= count:
                break
            count += 1
            depth = rules.scan_depth + skew
            candidates = self.candidates(kind, depth, level, last, window)
            last = (kind, depth, len(self.recursion), level)
            if kind != "recursion":
                window = depth
            if self.lazy:
                found = self.until_full(candidates, kind, level, skew, carried)
            else:
                found = [Fired(it, d) for it in candidates if (d := self.check(it, kind, level, skew)) is not None]
                found.sort(key=lambda f: (0 if f.item.ident in self.timed.sticky else 1, f.item.rank))
                found = self.groups(found, kind, skew)
                self.take(found, carried)
            # Every entry of the pass that did not fail its roll, admitted or not (SillyTavern's
            # successfulNewEntries): its content is the next pass's recursion text.
            for_recursion = [
                f.item for f in found if id(f.item) not in self._failed and not f.item.entry.prevent_recursion
            ]
            following: Kind | None = None
            if rules.recursive and not self.overflowed and for_recursion:
                following = "recursion"
            if rules.recursive and not self.overflowed and kind == "min_activations" and self.recursion:
                following = "recursion"
            short = rules.min_activations > 0 and len(self.admitted) < rules.min_activations
            if not following and not self.overflowed and short:
                reach = rules.scan_depth + skew
                over = 0 < rules.min_activations_depth_max < reach or reach > self.turn
                if not over:
                    following, skew = "min_activations", skew + 1
            if not following and levels:
                following, level = "recursion", levels.pop(0)
            kind = following
            if kind:
                self.add_recursion(for_recursion)
                carried += sum(self.book.cost(it.entry) for it in for_recursion)

    def take(self, found: list[Fired], carried: int, new: int = 0) -> int | None:
        """Roll for and admit the pass's entries in order; with the SillyTavern engine, the
        entry whose content reaches the budget is refused and ends the pass (L3995-4044).
        The tokens the pass has added so far (`new` before these), or None at the budget."""
        for i, f in enumerate(found):
            if not self.probable(f):
                self._failed.add(id(f.item))
                self._retry.pop(id(f.item), None)
                continue
            if self.rules.engine == "sillytavern":
                new += self.book.cost(f.item.entry)
                if carried + new >= self.budget:
                    self.overflowed = True
                    for late in found[i:]:
                        if id(late.item) not in self._failed:
                            self.keep(late.item, late.decision, reason="budget", tokens=self.book.cost(late.item.entry))
                            self._retry[id(late.item)] = late.item
                    return None
            self.admit(f)
        return new

    def until_full(self, candidates: list[Item], kind: Kind, level: int, skew: int, carried: int) -> list[Fired]:
        """A replayed turn's pass with the SillyTavern engine: the same admissions as testing
        every candidate, but the candidates are tested in admission order (sticky first, then
        scan order) only until the budget is reached, which ends the pass and, with no recursion
        level left, the scan. An entry in a group is decided with all of its groups' candidates."""
        sticky = self.timed.sticky
        order = [it for it in candidates if it.ident in sticky] + [it for it in candidates if it.ident not in sticky]
        chosen = {id(it) for it in candidates}
        tested: dict[int, Fired | None] = {}
        alive: dict[int, bool] = {}

        def test(it: Item) -> Fired | None:
            if id(it) not in tested:
                d = self.check(it, kind, level, skew)
                tested[id(it)] = Fired(it, d) if d is not None else None
            return tested[id(it)]

        found: list[Fired] = []
        new: int | None = 0
        for it in order:
            f = test(it)
            if f is None:
                continue
            if it.groups and id(it) not in alive:
                names, members, grown = set(it.groups), {id(it): it}, True
                while grown:  # the entries tied to it through shared groups
                    more = {
                        id(m): m
                        for n in names
                        for m in self.book.members[n]
                        if id(m) in chosen and id(m) not in members
                    }
                    members.update(more)
                    names |= {n for m in more.values() for n in m.groups}
                    grown = bool(more)
                tied = [g for m in members.values() if (g := test(m)) is not None]
                tied.sort(key=lambda g: (0 if g.item.ident in sticky else 1, g.item.rank))
                kept = {id(g) for g in self.groups(tied, kind, skew)}
                alive.update((id(g.item), id(g) in kept) for g in tied)
            if it.groups and not alive[id(it)]:
                continue
            found.append(f)
            new = self.take([f], carried, new or 0)
            if new is None:
                break
        return found

    def candidates(
        self, kind: Kind, depth: int, level: int, last: tuple[Kind, int, int, int] | None, window: int
    ) -> list[Item]:
        """The entries this pass must test, in scan order: those holding a key the text new to
        this pass holds, and those that must always be tested."""
        book = self.book
        chosen: dict[int, Item] = {}

        def take(items: Sequence[Item]) -> None:
            for it in items:
                chosen[id(it)] = it

        take(book.joined)
        take(list(self._retry.values()))
        if last is None:  # the first pass: the window's keys, and what fires without keys
            self.open(depth)
            for mid, at in self._first.items():
                if at < depth:
                    take(book.owners.get(mid, ()))
            take(book.live)
            take(book.own_depth)
            for ident in self.timed.sticky:
                take(book.by_ident.get(ident, ()))
        elif kind == "min_activations":  # one message deeper, without the recursion text
            self.open(depth)
            for at in range(window, min(depth, len(self.newest))):
                for mid in book.message_keys(self.newest[at]):
                    take(book.owners.get(mid, ()))
                    take(book.second_owners.get(mid, ()))
        else:
            start = 0 if last[0] == "min_activations" else last[2]
            for piece in self._recursion_items[start:]:
                for it in piece:
                    for mid in book.content_keys(it):
                        take(book.owners.get(mid, ()))
                        take(book.second_owners.get(mid, ()))
            for it in book.delayed:  # a recursion level lets these in
                delay = it.entry.delay_until_recursion
                if delay <= level and (last[0] != "recursion" or delay > last[3]):
                    chosen[id(it)] = it
        skip = self._activated | self._failed
        picked = [it for key, it in chosen.items() if key not in skip]
        if self.only is not None:
            picked = [it for it in picked if id(it) in self.only]
        return sorted(picked, key=lambda it: it.rank)

    # ── One entry ──

    def check(self, it: Item, kind: Kind, level: int, skew: int) -> LoreDecision | None:
        """Whether the entry activates in this pass (a decision with fired=True) or not (None;
        the reason is kept when recording). SillyTavern's order of checks."""
        self.tests += 1
        e = it.entry
        sticky = it.ident in self.timed.sticky
        if e.disable:
            return self.no(it, "disabled")
        if not it.allowed:
            return self.no(it, "character")
        if e.delay and self.turn < e.delay:
            return self.no(it, "delay", f"until message {e.delay}")
        if it.ident in self.timed.cooldown and not sticky:
            return self.no(it, "cooldown", f"until turn {self.timed.cooldown[it.ident][1]}")
        if kind != "recursion" and e.delay_until_recursion and not sticky:
            return self.no(it, "delay_until_recursion")
        if kind == "recursion" and e.delay_until_recursion > level and not sticky:
            return self.no(it, "delay_until_recursion", f"level {e.delay_until_recursion}")
        if kind == "recursion" and self.rules.recursive and e.exclude_recursion and not sticky:
            return None  # keeps the reason of the passes before
        if "@@activate" in e.decorators:
            return LoreDecision(e, True, "decorator", detail="@@activate") if self.record else FIRED
        if "@@dont_activate" in e.decorators:
            return self.no(it, "dont_activate")
        if e.constant:
            return LoreDecision(e, True, "constant") if self.record else FIRED
        if sticky:
            return LoreDecision(e, True, "sticky") if self.record else FIRED
        if not e.key:
            return self.no(it, "no_keys")
        depth = self.depth(it, skew)
        recursion = kind != "min_activations"
        primary = None
        for k in it.primary:
            if k is not None and (where := self.where(k[1], depth, recursion)) is not None:
                primary = (k[0], where)
                break
        if primary is None:
            return self.no(it, "no_match")
        if not (e.selective and e.keysecondary):
            return self.fired_by(e, *primary) if self.record else FIRED
        logic = SELECTIVE_LOGICS[e.selective_logic]
        if self.secondary(it, logic, depth, recursion):
            return replace(self.fired_by(e, *primary), detail=logic) if self.record else FIRED
        return self.no(it, "secondary", logic)

    def secondary(self, it: Item, logic: str, depth: int, recursion: bool) -> bool:
        """SillyTavern's `matchSecondaryKeys`: AND_ANY stops at the first key found, NOT_ALL at
        the first missing; NOT_ANY and AND_ALL look at every key."""
        any_hit, all_hit = False, True
        for k in it.secondary:
            hit = k is not None and self.where(k[1], depth, recursion) is not None
            any_hit, all_hit = any_hit or hit, all_hit and hit
            if (logic == "AND_ANY" and hit) or (logic == "NOT_ALL" and not hit):
                return True
        return (logic == "NOT_ANY" and not any_hit) or (logic == "AND_ALL" and all_hit)

    def depth(self, it: Item, skew: int) -> int:
        own = it.entry.scan_depth
        return min(own if own is not None else self.rules.scan_depth + skew, MOST_SCAN_DEPTH)

    def no(self, it: Item, reason: Reason, detail: str = "") -> LoreDecision | None:
        """Record why the entry does not fire (when recording); the pass gets None."""
        if self.record:
            self.decisions[id(it)] = LoreDecision(it.entry, False, reason, detail=detail)
        return None

    def fired_by(self, e: LoreEntry, key: str, where: Where) -> LoreDecision:
        kind, origin = where
        if kind == "message" and isinstance(origin, ChatLine):
            return LoreDecision(e, True, "key", key=key, message=origin.number, speaker=origin.speaker or None)
        if kind == "entry" and isinstance(origin, int | str):
            return LoreDecision(e, True, "recursion", key=key, by=origin)
        return LoreDecision(e, True, "key", key=key)

    # ── Matching ──

    def open(self, depth: int) -> None:
        """Note the keys of the newest `depth` messages (the newest message holding each)."""
        book, first = self.book, self._first
        while self._opened < min(depth, len(self.newest)):
            for mid in book.message_keys(self.newest[self._opened]):
                first.setdefault(mid, self._opened)
            self._opened += 1

    def where(self, mid: int, depth: int, recursion: bool) -> Where | None:
        """Where key `mid` first matches the text of an entry scanning `depth` messages (with
        the recursion text unless it is a min-activations pass), or None. Depth 0 scans an
        empty text, recursion text included (SillyTavern's `WorldInfoBuffer.get`)."""
        m = self.book.keys.matchers[mid]
        if isinstance(m, Plain) and m.piecewise and m.needle:
            if depth <= 0:
                return None
            self.open(depth)
            at = self._first.get(mid)
            if at is not None and at < depth:
                return ("message", self.newest[at])
            if recursion and mid in self._recursion_first:
                return ("entry", self._recursion_first[mid])
            return None
        if isinstance(m, Pattern) and m.key in self.book.clock.timeouts:
            return None  # out of time for this build: no match, without building the text
        return self.in_text(m, depth, recursion)

    def in_text(self, m: Matcher, depth: int, recursion: bool) -> Where | None:
        """Where matcher `m` first matches the whole joined scan text (`joined`), or None."""
        text, lowered, starts, origins = self.joined(depth, recursion)
        if isinstance(m, Plain):
            found = plain_at(text if m.sensitive else lowered, m.needle, m.whole)
            at = found if found >= 0 else None
        else:
            at = self.book.clock.search(m, text)
        return None if at is None else self.origin(at, starts, origins)

    def joined(self, depth: int, recursion: bool) -> tuple[str, str, list[int], list[object]]:
        """The scan text as SillyTavern builds it: "\\x01" + the newest `depth` messages joined
        by "\\n\\x01", then the recursion texts; with where each piece starts and what it is."""
        depth = min(depth, MOST_SCAN_DEPTH)
        cache = (depth, len(self.recursion) if recursion else -1)
        if cache not in self._joined:
            if depth <= 0:
                self._joined[cache] = ("", "", [], [])
                return self._joined[cache]
            lines = self.newest[:depth]
            pieces: list[str] = [self.book.text_of(m) for m in lines]
            starts: list[int] = []
            origins: list[object] = list(lines)
            pos = 1
            for text in pieces:
                starts.append(pos)
                pos += len(text) + len(JOIN)
            if recursion:
                for items, text in zip(self._recursion_items, self.recursion, strict=True):
                    at = pos
                    for it in items:  # one text per pass: its contents joined by newlines
                        starts.append(at)
                        origins.append(it.entry.uid)
                        at += len(self.book.content(it)) + 1
                    pieces.append(text)
                    pos += len(text) + len(JOIN)
            text = "\x01" + JOIN.join(pieces)
            self._joined[cache] = (text, text.lower(), starts, origins)
        return self._joined[cache]

    @staticmethod
    def origin(at: int, starts: list[int], origins: list[object]) -> Where:
        index = bisect_right(starts, at) - 1
        origin = origins[max(index, 0)] if origins else None
        if isinstance(origin, ChatLine):
            return ("message", origin)
        return ("entry", origin) if isinstance(origin, int | str) else ("text", None)

    def add_recursion(self, items: list[Item]) -> None:
        """SillyTavern's `addRecurse`: one text per pass, the contents joined by newlines."""
        self.recursion.append("\n".join(self.book.content(it) for it in items))
        self._recursion_items.append(items)
        for it in items:
            for mid in self.book.content_keys(it):
                self._recursion_first.setdefault(mid, it.entry.uid)

    # ── What the pass activated ──

    def keep(self, it: Item, d: LoreDecision, **changes: object) -> None:
        """Keep what became of an entry, with `changes` (when recording)."""
        if self.record:
            self.decisions[id(it)] = replace(d, **changes) if changes else d  # type: ignore[arg-type]

    def admit(self, f: Fired) -> None:
        self._activated.add(id(f.item))
        self._retry.pop(id(f.item), None)
        self.admitted.append(f.item)
        self._admitted_groups.add(f.item.entry.group)
        if self.rules.engine == "sillytavern":
            tokens = self.book.cost(f.item.entry)
            self.used += tokens
            self.keep(f.item, f.decision, tokens=tokens)
        else:
            self.keep(f.item, f.decision)

    def probable(self, f: Fired) -> bool:
        e = f.item.entry
        if not e.use_probability or e.probability == 100 or f.item.ident in self.timed.sticky:
            return True
        roll = dice(self.seed, "probability", e.source, e.uid, self.turn) * 100
        if roll <= e.probability:
            return True
        self.keep(
            f.item, f.decision, fired=False, reason="probability", detail=f"rolled {roll:.0f} > {e.probability:g}"
        )
        return False

    def groups(self, found: list[Fired], kind: Kind, skew: int) -> list[Fired]:
        """SillyTavern's `filterByInclusionGroups`: of each group's members this pass activated,
        a sticky member wins (members on cooldown or delay are dropped), group scoring drops the
        members with fewer key hits, a group with an admitted member keeps none, then the
        `groupOverride` member with the highest order wins, else a weighted roll. Each group's
        member list is the one it started with (scoring aside), as in SillyTavern."""
        grouped: dict[str, list[Fired]] = {}
        for f in found:
            for name in f.item.groups:
                grouped.setdefault(name, []).append(f)
        if not grouped:
            return found
        alive = {id(f) for f in found}
        sticky = self.timed.sticky

        def lose(f: Fired, winner: Fired | None) -> None:
            if id(f) in alive:
                alive.discard(id(f))
                self._retry[id(f.item)] = f.item
                by = winner.item.entry.uid if winner else None
                self.keep(f.item, f.decision, fired=False, reason="group", by=by, detail=f.item.entry.group)

        has_sticky: dict[str, bool] = {}
        for name, group in grouped.items():
            stuck = [f for f in group if f.item.ident in sticky]
            has_sticky[name] = bool(stuck)
            for f in group:
                if stuck and f.item.ident not in sticky:
                    lose(f, stuck[0])
            for f in group:
                e = f.item.entry
                if f.item.ident in self.timed.cooldown or (e.delay and self.turn < e.delay):
                    lose(f, None)
        for name, group in grouped.items():
            if has_sticky[name] or not (self.rules.group_scoring or any(f.item.entry.use_group_scoring for f in group)):
                continue
            scores = [self.score(f.item.entry, kind, skew) for f in group]
            best = max(scores)
            for f, s in list(zip(group, scores, strict=True)):
                own = f.item.entry.use_group_scoring
                if (own if own is not None else self.rules.group_scoring) and s < best:
                    lose(f, None)
                    group.remove(f)
        for name, group in grouped.items():
            if has_sticky[name]:
                continue
            if name in self._admitted_groups:  # SillyTavern compares an admitted entry's whole group text
                for f in group:
                    lose(f, None)
                continue
            if len(group) <= 1:
                continue
            prios = sorted((f for f in group if f.item.entry.group_override), key=lambda f: -f.item.entry.order)
            winner: Fired | None = prios[0] if prios else None
            if winner is None:
                total = sum(f.item.entry.group_weight for f in group)
                roll, acc = dice(self.seed, "group", name, self.turn) * total, 0.0
                for f in group:
                    acc += f.item.entry.group_weight
                    if roll <= acc:
                        winner = f
                        break
                if winner is None:
                    continue
            for f in group:
                if f is not winner:
                    lose(f, winner)
        return [f for f in found if id(f) in alive]

    def score(self, e: LoreEntry, kind: Kind, skew: int) -> int:
        """SillyTavern's group score (`getScore`): the keys found, as written (not filled or
        trimmed), the secondary ones counted by the positive logics only."""
        own = e.scan_depth
        depth = min(own if own is not None else self.rules.scan_depth + skew, MOST_SCAN_DEPTH)
        text, lowered, _, _ = self.joined(depth, kind != "min_activations")

        def hit(key: str) -> bool:
            m = self.book.raw(key, e)
            if isinstance(m, Pattern):
                return self.book.clock.search(m, text) is not None
            return plain_at(text if m.sensitive else lowered, m.needle, m.whole) >= 0

        if not e.key:
            return 0
        primary = sum(hit(k) for k in e.key)
        secondary = sum(hit(k) for k in e.keysecondary)
        logic = SELECTIVE_LOGICS[e.selective_logic]
        if e.keysecondary and logic == "AND_ANY":
            return primary + secondary
        if e.keysecondary and logic == "AND_ALL":
            return primary + secondary if secondary == len(e.keysecondary) else primary
        return primary
