"""Lore: which World Info entries a story calls for, and which fit the lore budget (docs/lore.md).

Pure: no I/O. The caller gives the entries, the visible chat (oldest first), the macro filler
for `{{char}}`/`{{user}}`, the rules (the `[lore]` settings with the engine's defaults filled
in), a token counter, the limit and the character the prompt is for; `choose()` returns a
`LoreChoice`: the entries placed, in insertion order, and a `LoreDecision` for every entry.

The scan follows SillyTavern 1.12's World Info (public/scripts/world-info.js at ba6f7b7a), and
tests/test_lore_sillytavern.py holds it to the results of that code:

- the scan text is the last `scan_depth` chat messages, newest first, as `Name: text`; an
  entry's own `scanDepth` wins; recursion appends the content of activated entries;
- `disable` never fires, then the characterFilter, delay / cooldown (unless sticky) /
  delay-until-recursion / exclude-recursion suppress, `@@activate` fires, `@@dont_activate`
  suppresses, then `constant` and sticky entries fire, then keys: a primary key must match,
  then the secondary keys by `selectiveLogic`;
- of the entries a pass activates: inclusion groups pick one member (sticky, group scoring,
  override by order, else a weighted roll), then probability rolls, then the budget;
- another pass runs for recursion, for min activations (one message deeper each time) and
  for each delay-until-recursion level, as SillyTavern's loop does.

Rolls are deterministic: seeded by the story's `seed`, the turn and the entry (see `dice`).
Timed effects (sticky, cooldown, delay) are derived by replaying the scan over the turns
before this one; no state is kept between runs. What a build costs is bounded per build,
not per scan (keys.py, scan.py): regex time, the entries a pass tests, the replay.

Two engines choose among the activated entries: `sillytavern` admits by `order` and stops at
the first entry that reaches the budget; `keyword` (seed 000's keyword infill engine) scores
every activated entry and fills greedily by score, skipping what does not fit, within per-kind
caps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..story.model import LORE_POSITIONS, LORE_ROLES, LoreEntry
from .choice import Character, ChatLine, LoreChoice, LoreDecision, Reason
from .keyword import keyword_rank
from .rules import (
    ENGINES,
    IDF_MESSAGES,
    MOST_REPLAY,
    MOST_SCAN_DEPTH,
    REGEX_SECONDS,
    REGEX_TOTAL_SECONDS,
    REPLAY_TESTS,
    STRATEGIES,
    LoreRules,
)
from .scan import Book, Item, Scan, Timed

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
    character: Character | None = None,
) -> LoreChoice:
    """Activate and select the lore for the last turn of `chat` (docs/lore.md). This turn's
    scan reads `scannable` (the messages surely sent; default: the whole chat); turns
    replayed for timed effects read the chat as it stood then. `turns` is how many chat
    messages the story has, when `chat` holds only the latest of them. `character` is who
    the prompt is for (characterFilter); None: no character."""
    budget = rules.budget_for(limit)
    if not entries:
        return LoreChoice(rules.engine, budget, 0, ())
    costs: dict[int, int] = {}

    def cost(entry: LoreEntry) -> int:
        if id(entry) not in costs:
            costs[id(entry)] = count(fill(entry.content) + "\n")
        return costs[id(entry)]

    book = Book(entries, rules, fill, cost, character)
    timed = Timed()
    turn = len(chat) if turns is None else turns
    if any(e.sticky or e.cooldown for e in entries):
        # Whether an entry is sticky or cooling down now depends on when it fired before, and
        # that on the turns before those: the replay starts at the first turn (or 200 back).
        only = replayed(book)
        for past in range(max(1, turn - replay_length(book, chat, seed, turn, budget, only)), turn):
            timed.advance(past, book.by_entry)
            seen = chat[: max(0, len(chat) - (turn - past))]
            scan = Scan(book, seen, seed, past, timed, budget, record=False, only=only)
            scan.run()
            for it in scan.admitted:
                timed.record(past, it.entry)
    timed.advance(turn, book.by_entry)
    now = chat if scannable is None else scannable
    scan = Scan(book, now, seed, turn, timed, budget)
    scan.run()
    decisions = scan.decisions
    for it in book.items:
        if id(it) not in decisions:
            decisions[id(it)] = LoreDecision(it.entry, False, unfired(it, timed, turn))
    used = scan.used
    if rules.engine == "keyword":
        used = 0
        fired = [it for it in book.items if decisions[id(it)].fired]
        ranked = keyword_rank([decisions[id(it)] for it in fired], chat, rules.scan_depth, fill)
        by_entry = {id(it.entry): it for it in fired}
        taken = {"world": 0, "character": 0}
        caps = {"world": rules.world_cap, "character": rules.character_cap}
        for d in ranked:
            key = id(by_entry[id(d.entry)])
            kind = "character" if d.entry.character else "world"
            tokens = cost(d.entry)
            if taken[kind] >= caps[kind]:
                decisions[key] = replace(d, reason="cap", tokens=tokens, detail=f"{kind}_cap = {caps[kind]}")
            elif used + tokens > budget:
                decisions[key] = replace(d, reason="budget", tokens=tokens)
            else:
                used += tokens
                taken[kind] += 1
                decisions[key] = replace(d, tokens=tokens)
        order = [by_entry[id(d.entry)] for d in ranked]
    else:
        # SillyTavern's insertion order (L4126-4177): by `order`, lowest first (the highest
        # stands nearest the chat), equal orders in the reverse of their activation.
        order = sorted(reversed(scan.admitted), key=lambda it: it.entry.order)
    for it in book.items:
        d = decisions[id(it)]
        if d.placed and not fill(it.entry.content):
            decisions[id(it)] = replace(d, reason="empty")
        elif d.placed and it.entry.position not in LORE_POSITIONS:
            decisions[id(it)] = replace(d, reason="position", detail=str(it.entry.position))
    placed = [decisions[id(it)] for it in order if decisions[id(it)].placed]
    rest = [decisions[id(it)] for it in book.items if not decisions[id(it)].placed]
    window = tuple(m.number for m in reversed(now))[: rules.scan_depth]
    notes = regex_notes(book) + problem_notes(entries)
    return LoreChoice(rules.engine, budget, used, tuple(placed + rest), window, notes)


def replay_length(
    book: Book, chat: Sequence[ChatLine], seed: str, turn: int, budget: int, only: set[int] | None
) -> int:
    """How many turns back the replay starts: MOST_REPLAY, or fewer when one replayed turn
    (the last, scanned on its own) tests so many entries that MOST_REPLAY of them would pass
    REPLAY_TESTS."""
    if turn <= 1:
        return 0
    probe = Scan(book, chat[: max(0, len(chat) - 1)], seed, turn - 1, Timed(), budget, record=False, only=only)
    probe.run()
    return max(1, min(MOST_REPLAY, REPLAY_TESTS // max(1, probe.tests)))


def replayed(book: Book) -> set[int] | None:
    """The entries a replayed turn must scan: only what decides whether an entry with a timed
    effect was admitted. With the keyword engine and no recursion, no min activations and no
    recursion levels, that is those entries and their groups' members (nothing else touches
    them); otherwise the budget, the recursion text or the pass count ties every entry in."""
    rules = book.rules
    if rules.engine != "keyword" or rules.recursive or rules.min_activations or book.levels:
        return None
    chosen: list[Item] = [it for it in book.items if it.entry.sticky or it.entry.cooldown]
    names = {name for it in chosen for name in it.groups}
    grown = True
    while grown:
        more = [it for it in book.items if it not in chosen and set(it.groups) & names]
        chosen += more
        names |= {name for it in more for name in it.groups}
        grown = bool(more)
    return {id(it) for it in chosen}


def unfired(it: Item, timed: Timed, turn: int) -> Reason:
    """Why an entry the turn's scan never tested did not fire: the first check it fails."""
    e = it.entry
    sticky = it.ident in timed.sticky
    if e.disable:
        return "disabled"
    if not it.allowed:
        return "character"
    if e.delay and turn < e.delay:
        return "delay"
    if it.ident in timed.cooldown and not sticky:
        return "cooldown"
    if e.delay_until_recursion and not sticky:
        return "delay_until_recursion"
    if "@@dont_activate" in e.decorators:
        return "dont_activate"
    return "no_match" if e.key else "no_keys"


def regex_notes(book: Book) -> tuple[str, ...]:
    clock = book.clock
    if not clock.timeouts:
        return ()
    keys = ", ".join(sorted(clock.timeouts))
    if clock.used >= clock.total:
        return (
            f"regex keys ran out of their time ({REGEX_TOTAL_SECONDS:g} s in all for a build) "
            f"and count as no match from then on: {keys}",
        )
    return (f"regex key {keys} ran out of its time ({REGEX_SECONDS:g} s in a build) and counts as no match",)


PROBLEMS = {
    "regex": (
        "{n} regex {keys} not a valid regular expression and {are} matched as plain text, as SillyTavern does: {what}"
    ),
    "text_keys": (
        "{n} {entries} give keys as one text, not a list; SillyTavern reads no keys from that, "
        "and neither does ctx: {what}"
    ),
    "position": (
        "{n} {entries} have a position SillyTavern 1.12 does not place (it places 0-6): they fire "
        "and count in the budget, and are placed nowhere: {what}"
    ),
}


def problem_notes(entries: Sequence[LoreEntry]) -> tuple[str, ...]:
    """What the readers met that SillyTavern reads its own way, one note a kind."""
    found: dict[str, list[str]] = {}
    for e in entries:
        for kind, what in e.problems:
            shown = f"{what!r} ({e.source} entry {e.uid})" if kind == "regex" else f"{e.source} entry {e.uid}"
            if kind == "position":
                shown += f" (position {what})"
            found.setdefault(kind, []).append(shown)
    notes = []
    for kind, items in found.items():
        listed = ", ".join(items[:5]) + (f" and {len(items) - 5} more" if len(items) > 5 else "")
        one = len(items) == 1
        notes.append(PROBLEMS[kind].format(
            n=len(items), what=listed, keys="key is" if one else "keys are", are="is" if one else "are",
            entries="entry" if one else "entries",
        ))  # fmt: skip
    return tuple(notes)


def position_name(entry: LoreEntry) -> str:
    return LORE_POSITIONS.get(entry.position, f"position {entry.position}")


def role_name(entry: LoreEntry) -> str:
    return LORE_ROLES[entry.role]


__all__ = [
    "ENGINES",
    "IDF_MESSAGES",
    "MOST_REPLAY",
    "MOST_SCAN_DEPTH",
    "STRATEGIES",
    "ChatLine",
    "Character",
    "LoreChoice",
    "LoreDecision",
    "LoreRules",
    "choose",
    "position_name",
    "role_name",
]
