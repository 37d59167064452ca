"""One scan: SillyTavern's activation of World Info entries over the chat for one turn, with
timed effects (sticky, cooldown, delay) replayed from the turns before it."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..story.model import SELECTIVE_LOGICS, LoreEntry
from ..story.worldinfo import regex_key
from .choice import ChatLine, LoreDecision, Reason
from .rules import JOIN, MOST_SCAN_DEPTH, REGEX_SECONDS, LoreRules

# ── Matching ───────────────────────────────────────────────────────────────────────────────


class Buffer:
    """The scan text: messages newest first, joined as SillyTavern joins them, plus the
    recursion text; a match is traced back to its message (or the entry it came from)."""

    def __init__(self, chat: Sequence[ChatLine], rules: LoreRules) -> None:
        newest = list(reversed(chat))[:MOST_SCAN_DEPTH]
        self.lines = newest
        self.texts = [
            (f"{m.speaker}: {m.text}" if rules.include_names and m.speaker else m.text).strip() for m in newest
        ]
        self.recursion: list[tuple[int | str, str]] = []
        self.rules = rules
        self._joined: dict[tuple[int, bool, bool], tuple[str, list[int], list[tuple[str, object]]]] = {}
        self.timeouts: set[str] = set()

    def add_recursion(self, uid: int | str, text: str) -> None:
        self.recursion.append((uid, text))
        self._joined.clear()

    def joined(self, depth: int, lower: bool, recursion: bool) -> tuple[str, list[int], list[tuple[str, object]]]:
        """(text, start offsets, origin of each piece) for the first `depth` messages."""
        cache_key = (depth, lower, recursion)
        if cache_key not in self._joined:
            pieces: list[tuple[str, object]] = [("message", m) for m in self.lines[:depth]]
            texts = self.texts[:depth]
            if recursion:
                pieces += [("entry", uid) for uid, _ in self.recursion]
                texts = texts + [t for _, t in self.recursion]
            starts, pos = [], 1
            for t in texts:
                starts.append(pos)
                pos += len(t) + len(JOIN)
            text = "\x01" + JOIN.join(texts)
            self._joined[cache_key] = (text.lower() if lower else text, starts, pieces)
        return self._joined[cache_key]

    def find(self, key: str, entry: LoreEntry, depth: int, recursion: bool) -> tuple[str, object] | None:
        """Where `key` first matches for `entry` (newest message first), or None."""
        pattern = regex_key(key)
        if pattern is not None:
            text, starts, pieces = self.joined(depth, False, recursion)
            try:
                found = pattern.search(text, timeout=REGEX_SECONDS)
            except TimeoutError:
                self.timeouts.add(key)
                return None
            return _origin(found.start(), starts, pieces) if found else None
        case = entry.case_sensitive if entry.case_sensitive is not None else self.rules.case_sensitive
        whole = entry.match_whole_words if entry.match_whole_words is not None else self.rules.match_whole_words
        text, starts, pieces = self.joined(depth, not case, recursion)
        needle = key if case else key.lower()
        if whole and len(needle.split()) == 1:
            # SillyTavern's custom word boundary: any non-word character (JavaScript's \W is ASCII).
            hit = re.search(rf"(?:^|\W)({re.escape(needle)})(?:$|\W)", text, re.ASCII)
            return _origin(hit.start(1), starts, pieces) if hit else None
        at = text.find(needle)
        return _origin(at, starts, pieces) if at >= 0 else None


def _origin(at: int, starts: list[int], pieces: list[tuple[str, object]]) -> tuple[str, object] | None:
    index = bisect_right(starts, at) - 1
    return pieces[max(index, 0)] if pieces else None


# ── One scan (one turn) ────────────────────────────────────────────────────────────────────


@dataclass
class Timed:
    """Timed effects at one turn: entry uid-key -> (start, end, protected)."""

    sticky: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)
    cooldown: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)

    def advance(self, turn: int, entries: Sequence[LoreEntry]) -> None:
        """Drop effects whose time is up; a sticky that ends starts its entry's cooldown."""
        by_key = {identity(e): e for e in entries}
        for ident, (_, end) in list(self.sticky.items()):
            if turn >= end:
                del self.sticky[ident]
                entry = by_key.get(ident)
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


def in_scan_order(entries: Sequence[LoreEntry]) -> list[LoreEntry]:
    """SillyTavern's "character first" order: character lore by `order` (highest first),
    then world lore by `order`."""
    return sorted((e for e in entries if e.character), key=lambda e: -e.order) + sorted(
        (e for e in entries if not e.character), key=lambda e: -e.order
    )


@dataclass
class Scan:
    """One run of SillyTavern's scan loop for one turn."""

    entries: list[LoreEntry]
    chat: Sequence[ChatLine]
    rules: LoreRules
    fill: Callable[[str], str]
    cost: Callable[[LoreEntry], int]
    seed: str
    turn: int
    timed: Timed
    budget: int
    decisions: dict[int, LoreDecision] = field(default_factory=dict)
    buffer: Buffer = field(init=False)
    admitted: list[LoreEntry] = field(default_factory=list)
    used: int = 0

    def run(self) -> None:
        rules = self.rules
        buffer = self.buffer = Buffer(self.chat, self.rules)
        levels = sorted({e.delay_until_recursion for e in self.entries if e.delay_until_recursion})
        level = levels.pop(0) if levels else 0
        state, count, skew, overflowed = "initial", 0, 0, False
        failed: set[int] = set()
        while state:
            if rules.max_recursion_steps and rules.max_recursion_steps <= count:
                break
            count += 1
            found = [d for e in self.entries if (d := self.check(e, state, level, skew, failed)) is not None]
            rank = self.rank
            found.sort(key=lambda d: (0 if self.is_sticky(d.entry) else 1, rank[id(d.entry)]))
            found = self.groups(found, buffer, state, skew)
            successful: list[LoreDecision] = []
            for d in found:
                if not self.probable(d):
                    failed.add(id(d.entry))
                    continue
                successful.append(d)
                if self.rules.engine == "sillytavern" and not overflowed:
                    tokens = self.cost(d.entry)
                    if self.used + tokens >= self.budget:
                        overflowed = True
                        self.decisions[id(d.entry)] = replace(d, reason="budget", tokens=tokens)
                        continue
                    self.used += tokens
                    self.admit(replace(d, tokens=tokens))
                elif self.rules.engine == "sillytavern":
                    self.decisions[id(d.entry)] = replace(d, reason="budget", tokens=self.cost(d.entry))
                else:
                    self.admit(d)
            for_recursion = [d for d in successful if not d.entry.prevent_recursion and d.placed]
            state = ""
            if rules.recursive and not overflowed and for_recursion:
                state = "recursion"
            minimum = rules.min_activations > 0 and len(self.admitted) < rules.min_activations
            if not state and not overflowed and minimum:
                depth = rules.scan_depth + skew
                over = (rules.min_activations_depth_max > 0 and depth > rules.min_activations_depth_max) or depth > len(
                    self.chat
                )
                if not over:
                    state, skew = "min_activations", skew + 1
            if not state and levels:
                state, level = "recursion", levels.pop(0)
            if state:
                for d in for_recursion:
                    buffer.add_recursion(d.entry.uid, self.fill(d.entry.content))

    @cached_property
    def rank(self) -> dict[int, int]:
        """Each entry's place in the sorted entries (compared by identity: entries are data)."""
        return {id(e): i for i, e in enumerate(self.entries)}

    def admit(self, d: LoreDecision) -> None:
        self.decisions[id(d.entry)] = d
        self.admitted.append(d.entry)

    def is_sticky(self, entry: LoreEntry) -> bool:
        return identity(entry) in self.timed.sticky

    def check(self, e: LoreEntry, state: str, level: int, skew: int, failed: set[int]) -> LoreDecision | None:
        """Whether `e` activates in this pass: a decision with fired=True, or None (and the
        reason it did not is kept)."""
        if id(e) in failed or (id(e) in self.decisions and self.decisions[id(e)].fired):
            return None

        def no(reason: Reason, detail: str = "") -> LoreDecision | None:
            """Record why `e` does not fire; the pass gets None."""
            self.decisions[id(e)] = LoreDecision(e, False, reason, detail=detail)
            return None

        sticky = self.is_sticky(e)
        if e.disable:
            return no("disabled")
        if e.delay and self.turn < e.delay:
            return no("delay", f"until message {e.delay}")
        if identity(e) in self.timed.cooldown and not sticky:
            return no("cooldown", f"until turn {self.timed.cooldown[identity(e)][1]}")
        if state != "recursion" and e.delay_until_recursion and not sticky:
            return no("delay_until_recursion")
        if state == "recursion" and e.delay_until_recursion > level and not sticky:
            return no("delay_until_recursion", f"level {e.delay_until_recursion}")
        if state == "recursion" and self.rules.recursive and e.exclude_recursion and not sticky:
            return None  # keeps the reason of the passes before
        if e.constant:
            return LoreDecision(e, True, "constant")
        if sticky:
            return LoreDecision(e, True, "sticky")
        if not e.key:
            return no("no_keys")
        depth = min(e.scan_depth if e.scan_depth is not None else self.rules.scan_depth + skew, MOST_SCAN_DEPTH)
        recursion = state != "min_activations"
        primary = None
        for key in e.key:
            key = self.fill(key).strip()
            where = self.buffer.find(key, e, depth, recursion) if key else None
            if where is not None:
                primary = (key, where)
                break
        if primary is None:
            return no("no_match")
        fired = self.fired_by(e, *primary)
        if not (e.selective and e.keysecondary):
            return fired
        logic = SELECTIVE_LOGICS[e.selective_logic]
        hits = [
            self.buffer.find(k, e, depth, recursion) is not None for k in map(str.strip, map(self.fill, e.keysecondary))
        ]
        ok = {
            "AND_ANY": any(hits),
            "NOT_ALL": not all(hits),
            "NOT_ANY": not any(hits),
            "AND_ALL": all(hits),
        }[logic]
        if not ok:
            return no("secondary", logic)
        return replace(fired, detail=logic)

    def fired_by(self, e: LoreEntry, key: str, where: tuple[str, object]) -> LoreDecision:
        kind, origin = where
        if kind == "message" and isinstance(origin, ChatLine):
            return LoreDecision(e, True, "key", key=key, message=origin.number, speaker=origin.speaker or None)
        return LoreDecision(e, True, "recursion", key=key, by=origin if isinstance(origin, int | str) else None)

    def probable(self, d: LoreDecision) -> bool:
        e = d.entry
        if not e.use_probability or e.probability >= 100 or self.is_sticky(e):
            return True
        roll = dice(self.seed, "probability", e.source, e.uid, self.turn) * 100
        if roll <= e.probability:
            return True
        self.decisions[id(e)] = replace(
            d, fired=False, reason="probability", detail=f"rolled {roll:.0f} > {e.probability:g}"
        )
        return False

    def groups(self, found: list[LoreDecision], buffer: Buffer, state: str, skew: int) -> list[LoreDecision]:
        """Inclusion groups: one member of each group stays (SillyTavern's rules, seeded rolls)."""
        grouped: dict[str, list[LoreDecision]] = {}
        for d in found:
            for name in (g.strip() for g in re.split(r",\s*", d.entry.group) if g.strip()):
                grouped.setdefault(name, []).append(d)
        if not grouped:
            return found
        alive = {id(d) for d in found}  # by identity: decisions are data, compared field by field

        def lose(d: LoreDecision, winner: LoreDecision | None) -> None:
            if id(d) in alive:
                alive.discard(id(d))
                by = winner.entry.uid if winner else None
                self.decisions[id(d.entry)] = replace(d, fired=False, reason="group", by=by, detail=d.entry.group)

        for name, group in grouped.items():
            live = [d for d in group if id(d) in alive]
            sticky = [d for d in live if self.is_sticky(d.entry)]
            if sticky:
                for d in live:
                    if not self.is_sticky(d.entry):
                        lose(d, sticky[0])
                continue
            if any(name in re.split(r",\s*", a.group) for a in self.admitted):
                for d in live:
                    lose(d, None)
                continue
            if self.rules.group_scoring or any(d.entry.use_group_scoring for d in live):
                scores = [self.score(d.entry, state, skew) for d in live]
                best = max(scores)
                leader = live[scores.index(best)]
                for d, s in zip(live, scores, strict=True):
                    scored = d.entry.use_group_scoring
                    if (scored if scored is not None else self.rules.group_scoring) and s < best:
                        lose(d, leader)
                live = [d for d in live if id(d) in alive]
            if len(live) <= 1:
                continue
            prio = sorted((d for d in live if d.entry.group_override), key=lambda d: -d.entry.order)
            if prio:
                winner = prio[0]
            else:
                total = sum(d.entry.group_weight for d in live)
                roll, acc, winner = dice(self.seed, "group", name, self.turn) * total, 0.0, live[-1]
                for d in live:
                    acc += d.entry.group_weight
                    if roll <= acc:
                        winner = d
                        break
            for d in live:
                if d is not winner:
                    lose(d, winner)
        return [d for d in found if id(d) in alive]

    def score(self, e: LoreEntry, state: str, skew: int) -> int:
        """SillyTavern's group score: keys found (secondary ones by the positive logics)."""
        depth = e.scan_depth if e.scan_depth is not None else self.rules.scan_depth + skew
        recursion = state != "min_activations"
        primary = sum(self.buffer.find(self.fill(k).strip(), e, depth, recursion) is not None for k in e.key)
        secondary = sum(self.buffer.find(self.fill(k).strip(), e, depth, recursion) is not None for k in e.keysecondary)
        if not e.key:
            return 0
        logic = SELECTIVE_LOGICS[e.selective_logic]
        if e.keysecondary and logic == "AND_ANY":
            return primary + secondary
        if e.keysecondary and logic == "AND_ALL":
            return primary + secondary if secondary == len(e.keysecondary) else primary
        return primary
