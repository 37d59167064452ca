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

Rolls are deterministic: seeded by the story's `seed`, the turn and the entry (see `roll`).
Timed effects (sticky, cooldown, delay) are derived by replaying the scan over the turns
before this one that can still matter; no state is kept between runs.

Two engines choose among the activated entries: `sillytavern` admits by `order` and stops at
the first entry over the budget; `keyword` (seed 000's keyword infill engine) scores every
activated entry and fills greedily by score, skipping what does not fit, within per-kind caps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..story.model import LORE_POSITIONS, LORE_ROLES, LoreEntry
from .choice import ChatLine, LoreChoice, LoreDecision
from .keyword import keyword_rank
from .rules import ENGINES, IDF_MESSAGES, MOST_REPLAY, MOST_SCAN_DEPTH, REGEX_SECONDS, LoreRules
from .scan import Scan, Timed, in_scan_order

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
    ordered = in_scan_order(entries)
    costs: dict[int, int] = {}

    def cost(entry: LoreEntry) -> int:
        if id(entry) not in costs:
            costs[id(entry)] = count(fill(entry.content) + "\n")
        return costs[id(entry)]

    timed = Timed()
    turn = len(chat) if turns is None else turns
    reach = max((e.sticky + e.cooldown for e in ordered), default=0)
    if reach:
        for past in range(max(1, turn - min(reach, MOST_REPLAY)), turn):
            timed.advance(past, ordered)
            seen = chat[: max(0, len(chat) - (turn - past))]
            scan = Scan(ordered, seen, rules, fill, cost, seed, past, timed, budget)
            scan.run()
            for e in scan.admitted:
                timed.record(past, e)
    timed.advance(turn, ordered)
    now = chat if scannable is None else scannable
    scan = Scan(ordered, now, rules, fill, cost, seed, turn, timed, budget)
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
        ranked = keyword_rank([d for d in decisions.values() if d.fired], chat, rules.scan_depth, fill)
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


__all__ = [
    "ENGINES",
    "IDF_MESSAGES",
    "MOST_REPLAY",
    "MOST_SCAN_DEPTH",
    "ChatLine",
    "LoreChoice",
    "LoreDecision",
    "LoreRules",
    "choose",
    "position_name",
    "role_name",
]
