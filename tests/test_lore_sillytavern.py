"""World Info against SillyTavern's own code: every case of the goldens made by running
SillyTavern 1.12.6's `world-info.js` (commit ba6f7b7a) on them, run through ctx's lore engine.

The goldens and what each stub does are described in
tests/fixtures/sillytavern/worldinfo/README.md. Each case's lorebooks are read by ctx's own
World Info reader, its settings become `LoreRules`, each turn's chat (hidden rows dropped)
becomes `ChatLine`s, and the token counter is the goldens' `Math.ceil(text.length / 4)`.
SillyTavern's `Math.random` returned the case's listed values in order; ctx's seeded roll is
replaced by the same list for the cases that roll (and must ask for exactly as many).

What ctx stands in for SillyTavern's character: the case's card file name (`avatar`) and its
tag ids are a `Character` whose name is that file name without its extension and whose tags
are those ids (docs/lore.md: characterFilter). A "chat" book is the story's own lore lines.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES

from otaku_ctx.lore import Character, ChatLine, LoreChoice, LoreRules, choose
from otaku_ctx.lore import scan as scan_module
from otaku_ctx.render.names import Names
from otaku_ctx.story.model import LoreEntry, LorePosition
from otaku_ctx.story.worldinfo import parse_decorators, regex_key, world_info_entries

GOLDENS = FIXTURES / "sillytavern" / "worldinfo"
CASES: list[dict[str, Any]] = json.loads((GOLDENS / "cases.json").read_text())["cases"]
EXPECTED = json.loads((GOLDENS / "expected.json").read_text())
BY_NAME = {c["name"]: c for c in EXPECTED["cases"]}
STRATEGIES = {0: "evenly", 1: "character_first", 2: "global_first"}

# Cases ctx cannot run, with the reason. None today; a case added here is counted and shown.
UNMAPPED: dict[str, str] = {}


def count(text: str) -> int:
    return math.ceil(len(text) / 4)  # the goldens' getTokenCountAsync


def rules_of(settings: dict[str, Any]) -> LoreRules:
    return LoreRules(
        engine="sillytavern",
        scan_depth=settings["world_info_depth"],
        budget=settings["world_info_budget"],
        budget_cap=settings["world_info_budget_cap"],
        include_names=settings["world_info_include_names"],
        recursive=settings["world_info_recursive"],
        max_recursion_steps=settings["world_info_max_recursion_steps"],
        case_sensitive=settings["world_info_case_sensitive"],
        match_whole_words=settings["world_info_match_whole_words"],
        group_scoring=settings["world_info_use_group_scoring"],
        min_activations=settings["world_info_min_activations"],
        min_activations_depth_max=settings["world_info_min_activations_depth_max"],
        strategy=STRATEGIES[settings["world_info_character_strategy"]],  # type: ignore[arg-type]
    )


def entries_of(case: dict[str, Any]) -> list[LoreEntry]:
    """The case's books read by ctx's reader: global books as World Info files, a character
    book as the character's card lorebook, a chat book as the story's own lore lines."""
    character = case["character"]
    entries: list[LoreEntry] = []
    for book in case["books"]:
        read = world_info_entries(Path(book["name"]), {"entries": book["entries"]}, book["name"])
        if book["scope"] == "character":
            if character is None:  # SillyTavern reads no character lore without a character
                continue
            read = tuple(replace(e, character=character["name"]) for e in read)
        elif book["scope"] == "chat":
            read = tuple(replace(e, chat=True) for e in read)
        entries += read
    return entries


def character_of(case: dict[str, Any]) -> Character | None:
    c = case["character"]
    if c is None:
        return None
    return Character(re.sub(r"\.[^/.]+$", "", c["avatar"]), tuple(c["tags"]))  # getCharaFilename


def chat_of(case: dict[str, Any], rows: int) -> list[ChatLine]:
    visible = [r for r in case["chat"][:rows] if not r.get("is_system")]
    return [ChatLine(n, r["name"], r["mes"]) for n, r in enumerate(visible, start=1)]


def outcome(choice: LoreChoice, fill: Any) -> dict[str, Any]:
    """What SillyTavern's expected.json records of a turn, from ctx's choice."""
    activated = [d for d in choice.decisions if d.fired and d.reason not in ("budget", "cap", "frame")]

    def text(d: Any) -> str:
        return str(fill(d.entry.content))

    at = choice.by_position
    joined = {p: "\n".join(text(d) for d in at.get(p, [])) for p in LorePosition}
    depth: list[dict[str, Any]] = []
    for d in reversed(at.get(LorePosition.DEPTH, [])):  # SillyTavern walks order highest first
        group = next((g for g in depth if (g["depth"], g["role"]) == (d.entry.depth, d.entry.role)), None)
        if group is None:
            depth.append({"depth": d.entry.depth, "entries": [text(d)], "role": d.entry.role})
        else:
            group["entries"].insert(0, text(d))
    examples = [
        {"position": 0 if d.entry.position == LorePosition.EXAMPLES_TOP else 1, "content": text(d)}
        for d in choice.placed
        if d.entry.position in (LorePosition.EXAMPLES_TOP, LorePosition.EXAMPLES_BOTTOM)
    ]
    return {
        "budget": choice.budget,
        "budget_overflowed": any(d.reason == "budget" for d in choice.decisions),
        "activated": sorted(
            (
                d.entry.source,
                str(d.entry.uid),
                d.entry.order,
                d.entry.position,
                d.entry.depth,
                d.entry.role,
                list(d.entry.decorators),
                text(d),
            )
            for d in activated
        ),  # fmt: skip
        "worldInfoBefore": joined[LorePosition.BEFORE],
        "worldInfoAfter": joined[LorePosition.AFTER],
        "EMEntries": examples,
        "WIDepthEntries": depth,
        "ANTop": joined[LorePosition.NOTE_TOP],
        "ANBottom": joined[LorePosition.NOTE_BOTTOM],
    }


def expected_outcome(turn: dict[str, Any]) -> dict[str, Any]:
    return {
        "budget": turn["budget"],
        "budget_overflowed": turn["budget_overflowed"],
        "activated": sorted(
            (a["world"], str(a["uid"]), a["order"], a["position"], a["depth"], a["role"], a["decorators"], a["content"])
            for a in turn["activated"]
        ),
        **{
            k: turn[k]
            for k in ("worldInfoBefore", "worldInfoAfter", "EMEntries", "WIDepthEntries", "ANTop", "ANBottom")
        },
    }


def turns(
    case: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(chat rows, ctx's outcome, SillyTavern's) for each turn of the case."""
    rolls = list(case["random"])
    asked: list[tuple[object, ...]] = []

    def roll(seed: str, *parts: object) -> float:
        asked.append(parts)
        assert rolls, f"ctx rolled more often than SillyTavern did: {asked}"
        return float(rolls.pop(0))

    if case["random"]:
        monkeypatch.setattr(scan_module, "dice", roll)
    character = case["character"]
    names = Names(character["name"] if character else "", case["user"])
    entries, rules = entries_of(case), rules_of(case["settings"])
    for rows, expected in zip(case["turns"], BY_NAME[case["name"]]["turns"], strict=True):
        chat = chat_of(case, rows)
        choice = choose(
            entries, chat, rules, fill=names.fill, count=count, limit=case["max_context"], seed="golden",
            character=character_of(case),
        )  # fmt: skip
        yield rows, outcome(choice, names.fill), expected_outcome(expected)
    assert not rolls, f"SillyTavern rolled {len(case['random'])} times, ctx {len(asked)}"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_world_info_matches_sillytavern(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    if case["name"] in UNMAPPED:
        pytest.skip(UNMAPPED[case["name"]])
    for rows, got, expected in turns(case, monkeypatch):
        assert got == expected, f"{case['name']}, turn at {rows} rows"


def test_every_case_runs() -> None:
    """The goldens are all there and all run: none is left out unless listed with a reason."""
    assert len(CASES) == len(EXPECTED["cases"]) == 43
    assert [c["name"] for c in CASES] == [c["name"] for c in EXPECTED["cases"]]
    ran = [c for c in CASES if c["name"] not in UNMAPPED]
    assert len(ran) > 0 and len(ran) + len(UNMAPPED) == len(CASES)
    assert set(UNMAPPED) <= {c["name"] for c in CASES}


@pytest.mark.parametrize("case", EXPECTED["parse_decorators"], ids=lambda c: repr(c["input"])[:40])
def test_decorators_parse_as_in_sillytavern(case: dict[str, Any]) -> None:
    assert parse_decorators(case["input"]) == (tuple(case["decorators"]), case["content"])


@pytest.mark.parametrize("case", EXPECTED["parse_regex"], ids=lambda c: c["input"])
def test_regex_keys_parse_as_in_sillytavern(case: dict[str, Any]) -> None:
    """A key is a regex exactly when SillyTavern's parseRegexFromString gives one."""
    assert (regex_key(case["input"]) is not None) == (case["regex"] is not None)
