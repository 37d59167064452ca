"""The rules a lore choice follows: the engines, their defaults for "auto", and the bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Engine = Literal["keyword", "sillytavern"]
ENGINES: tuple[str, ...] = ("keyword", "sillytavern")
Strategy = Literal["evenly", "character_first", "global_first"]
STRATEGIES: tuple[str, ...] = ("evenly", "character_first", "global_first")  # world_info_character_strategy 0, 1, 2
# Regex time is bounded per build, not per scan (docs/lore.md): a key that has run this long in
# all its scans counts as no match from then on, and so does every key once all of them
# together have run REGEX_TOTAL_SECONDS. A pattern that backtracks catastrophically on a long
# message costs a build a fraction of a second, however many turns and passes scan it.
REGEX_SECONDS = 0.25
REGEX_TOTAL_SECONDS = 1.0
# Timed effects replay at most this many turns back, and at most as many as REPLAY_TESTS entry
# tests allow: a lorebook where thousands of entries fire on every turn replays fewer turns (the
# count of one replayed turn's tests decides how many, so the same story gives the same prompt).
MOST_REPLAY = 200
REPLAY_TESTS = 100_000
# The keyword engine's TF-IDF looks at this many of the latest messages (the work grows with
# the window, not with the story).
IDF_MESSAGES = 2000
MOST_SCAN_DEPTH = 1000  # SillyTavern's MAX_SCAN_DEPTH
JOIN = "\n\x01"  # what SillyTavern joins scanned messages with


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
    strategy: Strategy = "character_first"  # the order of character and world lore
    world_cap: int = 20
    character_cap: int = 15

    def budget_for(self, limit: int) -> int:
        """SillyTavern's World Info budget: `Math.round(budget% × limit / 100) || 1`, capped."""
        budget = math.floor(self.budget * max(limit, 0) / 100 + 0.5) or 1  # JavaScript rounds halves up
        return min(budget, self.budget_cap) if self.budget_cap > 0 else budget


# What each engine takes for a setting left at "auto": SillyTavern's shipped defaults, and
# seed 000's keyword engine (the last 10 messages, substring matching, the per-kind caps).
ENGINE_DEFAULTS: dict[str, dict[str, int | bool]] = {
    "keyword": {"scan_depth": 10, "recursive": False, "match_whole_words": False},
    "sillytavern": {"scan_depth": 2, "recursive": True, "match_whole_words": True},
}
