"""Lore: which World Info entries a story calls for, and which fit the lore budget (docs/lore.md).

Pure: no I/O. The caller gives the entries, the visible chat (oldest first), the macro filler
for `{{char}}`/`{{user}}`, the rules (the `[lore]` settings with the engine's defaults filled
in), a token counter and the limit; `choose()` returns a `LoreChoice`: the entries placed, in
insertion order, and a `LoreDecision` for every entry considered.

The scan follows SillyTavern 1.12's World Info (public/scripts/world-info.js at ba6f7b7a):

- the scan text is the last `scan_depth` chat messages, newest first, as `Name: text`; an
  entry's own `scanDepth` wins; recursion appends the content of activated entries;
- `disable` never fires, then delay / cooldown (unless sticky) / delay-until-recursion /
  exclude-recursion suppress, then `constant` and sticky entries fire, then keys: a primary
  key must match, then the secondary keys by `selectiveLogic`;
- of the entries a pass activates: inclusion groups pick one member (sticky, group scoring,
  override by order, else a weighted roll), then probability rolls, then the budget;
- another pass runs for recursion, for min activations (one message deeper each time) and
  for each delay-until-recursion level, as SillyTavern's loop does.

Rolls are deterministic: seeded by the story's `seed`, the turn and the entry (see `_roll`).
Timed effects (sticky, cooldown, delay) are derived by replaying the scan over the turns
before this one that can still matter; no state is kept between runs.

Two engines choose among the activated entries: `sillytavern` admits by `order` and stops at
the first entry over the budget; `keyword` (seed 000's keyword infill engine) scores every
activated entry and fills greedily by score, skipping what does not fit, within per-kind caps.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from ..config import LoreSettings
from ..story.model import LORE_POSITIONS, LORE_ROLES, SELECTIVE_LOGICS, LoreEntry

if TYPE_CHECKING:
    import regex

Engine = Literal["keyword", "sillytavern"]
ENGINES: tuple[str, ...] = ("keyword", "sillytavern")
# A regex key gets this long per scan before it counts as no match: a pattern that
# backtracks catastrophically on a long message cannot hang the build (docs/lore.md).
REGEX_SECONDS = 0.25
# Timed effects replay at most this many turns back.
MOST_REPLAY = 200
# The keyword engine's TF-IDF looks at this many of the latest messages (the work grows with
# the window, not with the story).
IDF_MESSAGES = 2000
MOST_SCAN_DEPTH = 1000  # SillyTavern's MAX_SCAN_DEPTH
_JOIN = "\n\x01"  # what SillyTavern joins scanned messages with
_REGEX_KEY = re.compile(r"^/([\w\W]+?)/([gimsuy]*)$")


@dataclass(frozen=True)
class LoreRules:
    """The `[lore]` settings with the engine's defaults in place of "auto"."""

    engine: Engine = "keyword"
    scan_depth: int = 10
    budget: float = 25.0  # percent of the limit
    budget_cap: int = 0  # tokens, 0 = none
    recursive: bool = False
    max_recursion_steps: int = 0
    case_sensitive: bool = False
    match_whole_words: bool = False
    include_names: bool = True
    min_activations: int = 0
    min_activations_depth_max: int = 0
    group_scoring: bool = False
    world_cap: int = 20
    character_cap: int = 15

    def budget_for(self, limit: int) -> int:
        """SillyTavern's World Info budget: a share of the limit (at least 1), capped."""
        budget = max(1, round(self.budget * max(limit, 0) / 100))
        return min(budget, self.budget_cap) if self.budget_cap > 0 else budget


# What each engine takes for a setting left at "auto": SillyTavern's shipped defaults, and
# seed 000's keyword engine (the last 10 messages, substring matching, the per-kind caps).
ENGINE_DEFAULTS: dict[str, dict[str, int | bool]] = {
    "keyword": {"scan_depth": 10, "recursive": False, "match_whole_words": False},
    "sillytavern": {"scan_depth": 2, "recursive": True, "match_whole_words": True},
}


def rules_of(settings: LoreSettings) -> LoreRules:
    """The rules of the `[lore]` settings: "auto" becomes the engine's default."""
    engine: Engine = "sillytavern" if settings.engine == "sillytavern" else "keyword"
    auto = ENGINE_DEFAULTS[engine]
    return LoreRules(
        engine=engine,
        scan_depth=int(auto["scan_depth"]) if settings.scan_depth == "auto" else settings.scan_depth,
        budget=settings.budget,
        budget_cap=settings.budget_cap,
        recursive=bool(auto["recursive"]) if settings.recursive == "auto" else settings.recursive,
        max_recursion_steps=settings.max_recursion_steps,
        case_sensitive=settings.case_sensitive,
        match_whole_words=bool(auto["match_whole_words"])
        if settings.match_whole_words == "auto"
        else settings.match_whole_words,
        include_names=settings.include_names,
        min_activations=settings.min_activations,
        min_activations_depth_max=settings.min_activations_depth_max,
        group_scoring=settings.group_scoring,
        world_cap=settings.world_cap,
        character_cap=settings.character_cap,
    )


@dataclass(frozen=True)
class ChatLine:
    """One visible chat message as the scan sees it."""

    number: int
    speaker: str
    text: str


Reason = Literal[
    "key", "recursion", "constant", "sticky",  # fired
    "disabled", "no_keys", "no_match", "secondary", "delay", "cooldown", "delay_until_recursion",
    "exclude_recursion", "group", "probability", "budget", "cap", "empty", "frame",
]  # fmt: skip


@dataclass(frozen=True)
class LoreDecision:
    """What became of one entry, with the facts that explain it."""

    entry: LoreEntry
    fired: bool
    reason: Reason
    key: str | None = None  # the key that matched
    message: int | None = None  # the message it matched in
    speaker: str | None = None
    by: int | str | None = None  # recursion: the entry whose content matched; group: the winner
    tokens: int = 0
    score: float | None = None
    detail: str = ""  # secondary logic, a roll, a timeout

    @property
    def placed(self) -> bool:
        return self.fired and self.reason not in ("budget", "cap", "frame", "empty")


@dataclass(frozen=True)
class LoreChoice:
    """The entries placed (insertion order) and every decision, placed entries first."""

    engine: str
    budget: int
    used: int
    decisions: tuple[LoreDecision, ...]
    scanned: tuple[int, ...] = ()  # message numbers of the scan window, newest first
    notes: tuple[str, ...] = ()

    @property
    def placed(self) -> tuple[LoreDecision, ...]:
        return tuple(d for d in self.decisions if d.placed)

    def without(self, keep: int) -> LoreChoice:
        """The choice keeping only the first `keep` placed entries by priority; the rest are
        dropped as "frame" (the window could not hold the prompt with them)."""
        ranked = sorted(self.placed, key=lambda d: _priority(d.entry))
        dropped = {id(d) for d in ranked[keep:]}
        decisions = tuple(replace(d, reason="frame") if id(d) in dropped else d for d in self.decisions)
        kept = tuple(d for d in decisions if d.placed) + tuple(d for d in decisions if not d.placed)
        note = (
            f"dropped {len(dropped)} of {len(ranked)} lore entries (lowest order first): "
            "the prompt had no room for them with the story"
        )
        notes = self.notes + ((note,) if dropped else ())
        return replace(self, decisions=kept, used=sum(d.tokens for d in kept if d.placed), notes=notes)

    @staticmethod
    def empty(engine: str = "keyword") -> LoreChoice:
        return LoreChoice(engine, 0, 0, ())


def _priority(entry: LoreEntry) -> tuple[int, int, int]:
    """Drop order when the frame is too big: constants last, then by `order` (higher kept)."""
    return (0 if entry.constant else 1, -entry.order, 0)


# ── Matching ───────────────────────────────────────────────────────────────────────────────


def regex_key(key: str) -> regex.Pattern[str] | None:
    """A `/pattern/flags` key as a pattern (JavaScript's flags i, m, s; g and y mean nothing
    here), or None for a plain key. Raises `regex.error` for a bad pattern."""
    match = _REGEX_KEY.match(key)
    if not match or re.search(r"(^|[^\\])/", match.group(1)):
        return None
    import regex  # only a lorebook with regex keys needs it

    pattern, letters = match.group(1).replace("\\/", "/", 1), match.group(2)
    flags = regex.V0
    flags |= regex.IGNORECASE if "i" in letters else 0
    flags |= regex.MULTILINE if "m" in letters else 0
    flags |= regex.DOTALL if "s" in letters else 0
    return regex.compile(pattern, flags)


class _Buffer:
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
                pos += len(t) + len(_JOIN)
            text = "\x01" + _JOIN.join(texts)
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
class _Timed:
    """Timed effects at one turn: entry uid-key -> (start, end, protected)."""

    sticky: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)
    cooldown: dict[tuple[str, int | str], tuple[int, int]] = field(default_factory=dict)

    def advance(self, turn: int, entries: Sequence[LoreEntry]) -> None:
        """Drop effects whose time is up; a sticky that ends starts its entry's cooldown."""
        by_key = {_ident(e): e for e in entries}
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
        ident = _ident(entry)
        if entry.sticky and ident not in self.sticky:
            self.sticky[ident] = (turn, turn + entry.sticky)
        if entry.cooldown and ident not in self.cooldown:
            self.cooldown[ident] = (turn, turn + entry.cooldown)


def _ident(entry: LoreEntry) -> tuple[str, int | str]:
    return (entry.source, entry.uid)


def _roll(seed: str, *parts: object) -> float:
    """A number in [0, 1) from the story's seed and the parts: the same story gives the same
    prompt; a new turn (or another entry) gets a new roll."""
    import hashlib  # only an entry with a probability rolls: a build without one skips both
    import random

    digest = hashlib.sha256("\x1f".join([seed, *map(str, parts)]).encode()).digest()
    return random.Random(digest).random()


def _sorted(entries: Sequence[LoreEntry]) -> list[LoreEntry]:
    """SillyTavern's "character first" order: character lore by `order` (highest first),
    then world lore by `order`."""
    return sorted((e for e in entries if e.character), key=lambda e: -e.order) + sorted(
        (e for e in entries if not e.character), key=lambda e: -e.order
    )


@dataclass
class _Scan:
    """One run of SillyTavern's scan loop for one turn."""

    entries: list[LoreEntry]
    chat: Sequence[ChatLine]
    rules: LoreRules
    fill: Callable[[str], str]
    cost: Callable[[LoreEntry], int]
    seed: str
    turn: int
    timed: _Timed
    budget: int
    decisions: dict[int, LoreDecision] = field(default_factory=dict)
    buffer: _Buffer = field(init=False)
    admitted: list[LoreEntry] = field(default_factory=list)
    used: int = 0

    def run(self) -> None:
        rules = self.rules
        buffer = self.buffer = _Buffer(self.chat, self.rules)
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
        return _ident(entry) in self.timed.sticky

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
        if _ident(e) in self.timed.cooldown and not sticky:
            return no("cooldown", f"until turn {self.timed.cooldown[_ident(e)][1]}")
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
        roll = _roll(self.seed, "probability", e.source, e.uid, self.turn) * 100
        if roll <= e.probability:
            return True
        self.decisions[id(e)] = replace(
            d, fired=False, reason="probability", detail=f"rolled {roll:.0f} > {e.probability:g}"
        )
        return False

    def groups(self, found: list[LoreDecision], buffer: _Buffer, state: str, skew: int) -> list[LoreDecision]:
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
                roll, acc, winner = _roll(self.seed, "group", name, self.turn) * total, 0.0, live[-1]
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


# ── The keyword engine's ranking (seed 000) ────────────────────────────────────────────────


def _keyword_rank(
    decisions: list[LoreDecision], chat: Sequence[ChatLine], window: int, fill: Callable[[str], str]
) -> list[LoreDecision]:
    """Score each activated entry: keyword hits in the window, its own name mentioned, the
    characters present co-occurring with it, a TF-IDF term score over the latest messages,
    recency of its last matching message, plus `order` / 100 as a flat bonus. Constant and
    sticky entries come first."""
    recent = list(reversed(chat))[:window]
    texts = [m.text.lower() for m in recent]
    speakers = {m.speaker.lower() for m in recent if m.speaker}
    corpus = [m.text.lower() for m in list(reversed(chat))[:IDF_MESSAGES]]
    frequency: dict[str, int] = {}  # document frequency, once per key
    scored: list[LoreDecision] = []
    for d in decisions:
        e = d.entry
        keys = [fill(k).strip().lower() for k in (*e.key, *e.keysecondary) if regex_key(k) is None and k.strip()]
        hits = sum(1 for k in keys if any(k in t for t in texts))
        name = 1.0 if e.comment and any(e.comment.lower() in t for t in texts) else 0.0
        content = fill(e.content).lower()
        together = 0.5 * sum(1 for s in speakers if s in content) + (1.0 if e.character.lower() in speakers else 0.0)
        tfidf = 0.0
        for k in keys:
            tf = sum(t.count(k) for t in texts)
            if tf:
                if k not in frequency:
                    frequency[k] = sum(1 for t in corpus if k in t)
                df = frequency[k]
                tfidf += math.log1p(tf) * (math.log((1 + len(corpus)) / (1 + df)) + 1)
        ages = [i for i, t in enumerate(texts) if any(k in t for k in keys)]
        recency = 1 / (1 + ages[0]) if ages else 0.0
        score = hits + name + together + tfidf / 4 + recency + e.order / 100
        if d.reason in ("constant", "sticky"):
            score = math.inf
        scored.append(replace(d, score=round(score, 3) if math.isfinite(score) else None))
    return sorted(scored, key=lambda d: -(d.score if d.score is not None else math.inf))


# ── The choice ─────────────────────────────────────────────────────────────────────────────


def choose(
    entries: Sequence[LoreEntry],
    chat: Sequence[ChatLine],
    rules: LoreRules,
    *,
    fill: Callable[[str], str],
    count: Callable[[str], int],
    limit: int,
    seed: str,
    scannable: Sequence[ChatLine] | None = None,
    turns: int | None = None,
) -> LoreChoice:
    """Activate and select the lore for the last turn of `chat` (docs/lore.md). This turn's
    scan reads `scannable` (the messages surely sent; default: the whole chat); turns
    replayed for timed effects read the chat as it stood then. `turns` is how many chat
    messages the story has, when `chat` holds only the latest of them."""
    budget = rules.budget_for(limit)
    if not entries:
        return LoreChoice(rules.engine, budget, 0, ())
    ordered = _sorted(entries)
    costs: dict[int, int] = {}

    def cost(entry: LoreEntry) -> int:
        if id(entry) not in costs:
            costs[id(entry)] = count(fill(entry.content) + "\n")
        return costs[id(entry)]

    timed = _Timed()
    turn = len(chat) if turns is None else turns
    reach = max((e.sticky + e.cooldown for e in ordered), default=0)
    if reach:
        for past in range(max(1, turn - min(reach, MOST_REPLAY)), turn):
            timed.advance(past, ordered)
            seen = chat[: max(0, len(chat) - (turn - past))]
            scan = _Scan(ordered, seen, rules, fill, cost, seed, past, timed, budget)
            scan.run()
            for e in scan.admitted:
                timed.record(past, e)
    timed.advance(turn, ordered)
    now = chat if scannable is None else scannable
    scan = _Scan(ordered, now, rules, fill, cost, seed, turn, timed, budget)
    scan.run()
    notes = [
        f"regex key {k} ran out of time ({REGEX_SECONDS} s) and counts as no match"
        for k in sorted(scan.buffer.timeouts)
    ]
    decisions = scan.decisions
    for e in ordered:
        decisions.setdefault(id(e), LoreDecision(e, False, "no_match"))
    used = scan.used
    if rules.engine == "keyword":
        used = 0
        ranked = _keyword_rank([d for d in decisions.values() if d.fired], chat, rules.scan_depth, fill)
        taken = {"world": 0, "character": 0}
        caps = {"world": rules.world_cap, "character": rules.character_cap}
        for d in ranked:
            kind = "character" if d.entry.character else "world"
            tokens = cost(d.entry)
            if taken[kind] >= caps[kind]:
                decisions[id(d.entry)] = replace(d, reason="cap", tokens=tokens, detail=f"{kind}_cap = {caps[kind]}")
            elif used + tokens > budget:
                decisions[id(d.entry)] = replace(d, reason="budget", tokens=tokens)
            else:
                used += tokens
                taken[kind] += 1
                decisions[id(d.entry)] = replace(d, tokens=tokens)
    for key, d in decisions.items():
        if d.placed and not d.entry.content.strip():
            decisions[key] = replace(d, reason="empty")
    placed = [d for d in decisions.values() if d.placed]
    if rules.engine == "keyword":
        placed.sort(key=lambda d: -(d.score if d.score is not None else math.inf))
    else:
        # SillyTavern's insertion order: by `order`, lowest first (highest nearest the chat).
        placed = list(reversed(sorted(reversed(placed), key=lambda d: -d.entry.order)))
    rest = [decisions[id(e)] for e in ordered if not decisions[id(e)].placed]
    window = tuple(m.number for m in reversed(now))[: rules.scan_depth]
    return LoreChoice(rules.engine, budget, used, tuple(placed + rest), window, tuple(notes))


def position_name(entry: LoreEntry) -> str:
    return LORE_POSITIONS[entry.position]


def role_name(entry: LoreEntry) -> str:
    return LORE_ROLES[entry.role]
