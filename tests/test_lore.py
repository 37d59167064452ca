"""Lore: World Info read, activated, chosen within its budget, placed and explained (docs/lore.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, run
from hypothesis import given
from hypothesis import strategies as st

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.errors import StoryError
from otaku_ctx.lore import ChatLine, LoreChoice, LoreRules, choose, scan
from otaku_ctx.lore.keys import Clock
from otaku_ctx.story.convert import to_native_text
from otaku_ctx.story.detect import read_story
from otaku_ctx.story.model import Card, LoreEntry, Message, Story
from otaku_ctx.story.worldinfo import read_world_info

ST = FIXTURES / "sillytavern"
ELDORIA = ST / "eldoria-worldinfo.json"
CHAT = ST / "seraphina-chat.jsonl"
CARD = ST / "seraphina-card.png"


def words(text: str) -> int:
    return len(text.split())


def lines(*texts: str, speaker: str = "Mara") -> list[ChatLine]:
    return [ChatLine(n, speaker, t) for n, t in enumerate(texts, start=1)]


def pick(entries: list[LoreEntry], chat: list[ChatLine], seed: str = "s", **rules: Any) -> LoreChoice:
    settings = {"engine": "sillytavern", "scan_depth": 2, "match_whole_words": True, "recursive": False, **rules}
    return choose(entries, chat, LoreRules(**settings), fill=lambda t: t, count=words, limit=10_000, seed=seed)


def fired(choice: LoreChoice) -> list[int | str]:
    return [d.entry.uid for d in choice.placed]


def reason(choice: LoreChoice, uid: int | str) -> str:
    return next(d.reason for d in choice.decisions if d.entry.uid == uid)


def entry(uid: int | str, *keys: str, **fields: Any) -> LoreEntry:
    return LoreEntry(uid=uid, content=fields.pop("content", f"lore {uid}"), key=keys, **fields)


def settings(**lore: Any) -> Any:
    return load_settings(Path("/nonexistent"), {f"lore.{k}": (v, "test") for k, v in lore.items()})


# ── The Done-when fixtures: Eldoria and the Seraphina chat ─────────────────────────────────


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        (2, {0: ("forest", 5)}),  # messages 6 and 5 are scanned: "forest" stands in message 5
        (4, {0: ("eldoria", 3)}),  # message 3 (depth 4) says "Eldoria's edge"; "eldoria" is the first key
    ],
)
def test_eldoria_fires_by_name_and_message_at_depth(depth: int, expected: dict[int, tuple[str, int]]) -> None:
    story = read_story(CHAT)
    built = build(story, settings(files=[str(ELDORIA)], engine="sillytavern", scan_depth=depth, recursive=False))
    got = {d.entry.uid: (d.key, d.message) for d in built.lore.placed}
    assert got == expected
    for key, number in got.values():
        assert key in story.message(number).content.lower()
    assert built.prompt is not None and story.message(number).content[:20] in built.prompt
    assert read_world_info(ELDORIA)[0].content.split("\n")[1][:30].replace("{{char}}", "Seraphina") in built.prompt


def test_eldoria_recursion_pulls_in_the_entries_its_content_names() -> None:
    built = build(read_story(CHAT), settings(files=[str(ELDORIA)], engine="sillytavern"))
    by = {d.entry.uid: d for d in built.lore.placed}
    assert by[0].reason == "key" and by[0].message == 5
    # Entry 0's content says "Shadowfangs", "beasts", "glade", "magic": recursion fires 1, 2, 3.
    assert {uid: by[uid].reason for uid in (1, 2, 3)} == {1: "recursion", 2: "recursion", 3: "recursion"}
    assert by[1].by == 0


def test_hidden_rows_never_fire(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in CHAT.read_text().splitlines()]
    rows.append({"name": "Wren", "is_user": True, "is_system": True, "send_date": "x", "mes": "A shadowfang!"})
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    on = build(read_story(path), settings(files=[str(ELDORIA)], engine="sillytavern", recursive=False))
    assert read_story(path).hidden == 2 and 1 not in fired(on.lore)
    rows[-1]["is_system"] = False
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    off = build(read_story(path), settings(files=[str(ELDORIA)], engine="sillytavern", recursive=False))
    assert 1 in fired(off.lore)


def test_a_card_lorebook_is_read_and_bound_to_its_character() -> None:
    story = open_story(CHAT, cards=[CARD])
    card = story.message(1).card
    assert card is not None and len(card.book) == 4 and {e.character for e in card.book} == {"Seraphina"}
    built = build(story, settings(engine="sillytavern", recursive=False))
    assert [(d.entry.character, d.key) for d in built.lore.placed] == [("Seraphina", "forest")]


# ── Matching ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("logic", "secondary", "expected"),
    [
        (0, ("lamp", "nowhere"), True),  # AND_ANY: one secondary key is there
        (0, ("nowhere",), False),
        (1, ("lamp", "nowhere"), True),  # NOT_ALL: not every secondary key is there
        (1, ("lamp", "river"), False),
        (2, ("nowhere",), True),  # NOT_ANY: none of them is there
        (2, ("lamp", "nowhere"), False),
        (3, ("lamp", "river"), True),  # AND_ALL: every one is there
        (3, ("lamp", "nowhere"), False),
    ],
)
def test_selective_logic(logic: int, secondary: tuple[str, ...], expected: bool) -> None:
    e = entry(1, "boat", keysecondary=secondary, selective_logic=logic)
    choice = pick([e], lines("the boat on the river", "a lamp"))
    assert (fired(choice) == [1]) is expected
    assert choice.placed[0].reason == "key" if expected else reason(choice, 1) == "secondary"


def test_secondary_keys_count_only_when_selective() -> None:
    e = entry(1, "boat", keysecondary=("nowhere",), selective=False)
    assert fired(pick([e], lines("a boat"))) == [1]


def test_regex_keys_with_flags() -> None:
    chat = lines("The Dragon sleeps")
    assert fired(pick([entry(1, "/drag(on|oon)/i")], chat)) == [1]
    assert fired(pick([entry(1, "/drag(on|oon)/")], chat)) == []  # no i: case counts
    assert fired(pick([entry(1, "/Mara: The/")], chat)) == [1]  # scanned as "Name: text"
    assert fired(pick([entry(1, "/Mara: The/")], chat, include_names=False)) == []


@pytest.mark.parametrize(("whole", "expected"), [(True, []), (False, [1])])
def test_whole_words(whole: bool, expected: list[int]) -> None:
    assert fired(pick([entry(1, "art")], lines("by the hearth"), match_whole_words=whole)) == expected
    assert fired(pick([entry(1, "art")], lines("the art, of it"), match_whole_words=whole)) == [1]


def test_whole_words_per_entry_wins() -> None:
    assert fired(pick([entry(1, "art", match_whole_words=False)], lines("by the hearth"))) == [1]


def test_case_sensitivity() -> None:
    chat = lines("Ilya smiles")
    assert fired(pick([entry(1, "ilya")], chat)) == [1]
    assert fired(pick([entry(1, "ilya")], chat, case_sensitive=True)) == []
    assert fired(pick([entry(1, "ilya", case_sensitive=True)], chat)) == []
    assert fired(pick([entry(1, "Ilya", case_sensitive=True)], chat)) == [1]


def test_macros_in_keys_and_content() -> None:
    e = entry(1, "{{char}}", content="{{char}} fears the sea")
    story_fill = {"{{char}}": "Ilya"}

    def fill(text: str) -> str:
        for k, v in story_fill.items():
            text = text.replace(k, v)
        return text

    choice = choose([e], lines("Ilya waves"), LoreRules(), fill=fill, count=words, limit=1000, seed="s")
    assert fired(choice) == [1] and choice.placed[0].key == "Ilya"


def test_scan_depth_and_the_entry_own_scan_depth() -> None:
    chat = lines("a dragon", "nothing", "nothing again")
    assert fired(pick([entry(1, "dragon")], chat)) == []
    assert fired(pick([entry(1, "dragon")], chat, scan_depth=3)) == [1]
    assert fired(pick([entry(1, "dragon", scan_depth=3)], chat)) == [1]


def test_constant_and_disable() -> None:
    choice = pick([entry(1, "x", constant=True), entry(2, "dragon", disable=True)], lines("a dragon"))
    assert fired(choice) == [1] and reason(choice, 1) == "constant" and reason(choice, 2) == "disabled"


def test_a_regex_that_backtracks_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key stops at its bound and counts as no match, and the bound is per build: the
    recursion pass scans the text again, yet the pattern is searched once. What is asserted is
    that work (searches), not how long they took."""
    clocks: list[Clock] = []

    class Watched(Clock):
        def __init__(self) -> None:
            super().__init__()
            clocks.append(self)

    monkeypatch.setattr(scan, "Clock", Watched)
    # Ways to split a run of a's: 2.6 times more for every two, tens of seconds of backtracking for
    # this run, far past any key's bound; yet it ends, so a bound that breaks fails the test, not hangs it.
    text = "a" * 34 + "!"
    book = [entry(1, "/(a|aa)+$/"), entry(2, "dragon", content="the dragon guards aaaa")]
    choice = pick(book, lines(text, "a dragon"), recursive=True)
    assert fired(choice) == [2] and reason(choice, 1) == "no_match"
    [clock] = clocks
    assert clock.runs == {"/(a|aa)+$/": 1} and clock.timeouts == {"/(a|aa)+$/"}
    assert any("ran out of" in note and "/(a|aa)+$/" in note for note in choice.notes)


# ── Recursion ──────────────────────────────────────────────────────────────────────────────


def recursion_book(**second: Any) -> list[LoreEntry]:
    return [entry(1, "boat", content="the boat smells of tar"), entry(2, "tar", content="tar is pitch", **second)]


def test_recursion_fires_entries_named_in_fired_content() -> None:
    chat = lines("a boat")
    assert fired(pick(recursion_book(), chat)) == [1]
    choice = pick(recursion_book(), chat, recursive=True)
    assert set(fired(choice)) == {1, 2} and reason(choice, 2) == "recursion"


def test_prevent_recursion_keeps_content_out_of_the_scan() -> None:
    book = [replace(recursion_book()[0], prevent_recursion=True), recursion_book()[1]]
    assert fired(pick(book, lines("a boat"), recursive=True)) == [1]


def test_exclude_recursion_fires_only_from_messages() -> None:
    assert fired(pick(recursion_book(exclude_recursion=True), lines("a boat"), recursive=True)) == [1]
    assert set(fired(pick(recursion_book(exclude_recursion=True), lines("a boat, tar"), recursive=True))) == {1, 2}


def test_delay_until_recursion() -> None:
    book = recursion_book(delay_until_recursion=1)
    assert reason(pick(book, lines("a boat, tar")), 2) == "delay_until_recursion"
    assert set(fired(pick(book, lines("a boat"), recursive=True))) == {1, 2}


def test_max_recursion_steps() -> None:
    assert fired(pick(recursion_book(), lines("a boat"), recursive=True, max_recursion_steps=1)) == [1]


# ── Budget, both engines ───────────────────────────────────────────────────────────────────


def test_sillytavern_engine_admits_by_order_and_stops_at_the_first_over_budget() -> None:
    book = [
        entry(1, "boat", order=300, content="one two three four five"),
        entry(2, "boat", order=200, content=" ".join(["w"] * 20)),
        entry(3, "boat", order=100, content="small"),
    ]
    rules = LoreRules(engine="sillytavern", scan_depth=2, budget=30, match_whole_words=True)
    choice = choose(book, lines("a boat"), rules, fill=lambda t: t, count=words, limit=60, seed="s")
    assert choice.budget == 18
    assert fired(choice) == [1] and reason(choice, 2) == "budget" and reason(choice, 3) == "budget"


def test_keyword_engine_skips_what_does_not_fit_and_keeps_filling() -> None:
    book = [
        entry(1, "boat", order=300, content="one two three four five"),
        entry(2, "boat", order=200, content=" ".join(["w"] * 20)),
        entry(3, "boat", order=100, content="small"),
    ]
    rules = LoreRules(engine="keyword", budget=30)
    choice = choose(book, lines("a boat"), rules, fill=lambda t: t, count=words, limit=60, seed="s")
    assert set(fired(choice)) == {1, 3} and reason(choice, 2) == "budget"
    assert choice.used <= choice.budget


def test_keyword_engine_ranks_by_relevance_and_caps_each_kind() -> None:
    book = [entry(1, "lamp"), entry(2, "boat"), entry(3, "river", character="Ilya")]
    chat = lines("boat boat boat", "a boat on the river, a lamp")
    choice = choose(book, chat, LoreRules(world_cap=1), fill=lambda t: t, count=words, limit=1000, seed="s")
    assert fired(choice)[0] == 2  # the boat is mentioned most
    assert reason(choice, 1) == "cap" and 3 in fired(choice)


def test_budget_cap() -> None:
    assert LoreRules(budget=25, budget_cap=100).budget_for(8000) == 100
    assert LoreRules(budget=25).budget_for(8000) == 2000


# ── Rolls, groups, timed effects ───────────────────────────────────────────────────────────


def test_probability_is_deterministic_and_new_turns_roll_anew() -> None:
    e = entry(1, "boat", probability=50)
    outcomes = []
    for turn in range(1, 30):
        chat = lines(*(["water"] * (turn - 1)), "a boat")
        first = fired(pick([e], chat))
        assert fired(pick([e], chat)) == first  # same story, same prompt
        outcomes.append(bool(first))
    assert True in outcomes and False in outcomes
    assert all(reason(pick([e], lines("a boat")), 1) in ("key", "probability") for _ in range(3))


def test_an_inclusion_group_keeps_one_member() -> None:
    book = [entry(1, "boat", group="ship"), entry(2, "boat", group="ship"), entry(3, "boat", group="ship")]
    winners = {tuple(fired(pick(book, lines(*(["x"] * t), "a boat")))) for t in range(20)}
    assert all(len(w) == 1 for w in winners) and len(winners) > 1
    override = [
        *book[:2],
        replace(book[2], group_override=True, order=50),
        replace(book[0], uid=4, group_override=True),
    ]
    choice = pick(override, lines("a boat"))
    assert fired(choice) == [4] and reason(choice, 1) == "group"


def test_group_scoring_keeps_the_best_matched() -> None:
    book = [entry(1, "boat", group="g"), entry(2, "boat", "oar", group="g")]
    assert fired(pick(book, lines("a boat and an oar"), group_scoring=True)) == [2]


def test_sticky_cooldown_and_delay_over_a_replayed_story() -> None:
    # "boat" is said at message 3 only. Sticky 3: the entry stays for the next turns.
    sticky = entry(1, "boat", sticky=3)
    texts = ["x", "x", "a boat", "x", "x", "x", "x"]
    states = [reason(pick([sticky], lines(*texts[:n])), 1) for n in range(3, 8)]
    assert states == ["key", "sticky", "sticky", "no_match", "no_match"]
    # Cooldown 2: fired at turn 3, it cannot fire again at turn 4, though "boat" is there.
    cool = entry(1, "boat", cooldown=2)
    texts = ["x", "x", "a boat", "a boat", "a boat"]
    assert [reason(pick([cool], lines(*texts[:n])), 1) for n in (3, 4, 5)] == ["key", "cooldown", "key"]
    # Delay 4: no firing before the chat has 4 messages.
    late = entry(1, "boat", delay=4)
    assert [reason(pick([late], lines(*(["a boat"] * n))), 1) for n in (3, 4)] == ["delay", "key"]


# ── Placement ──────────────────────────────────────────────────────────────────────────────


def depth_book(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "book.json"
    entries = {
        "0": {"uid": 0, "key": ["lighthouse"], "content": "LORE-BEFORE", "position": 0},
        "1": {"uid": 1, "key": ["lighthouse"], "content": "LORE-AFTER", "position": 1},
        "2": {"uid": 2, "key": ["lighthouse"], "content": "LORE-AT-DEPTH", "position": 4, "depth": 1, **fields},
    }
    path.write_text(json.dumps({"entries": entries}))
    return path


def small_story(tmp_path: Path) -> Path:
    path = tmp_path / "story.jsonl"
    rows = [{"role": "user" if i % 2 else "assistant", "name": "Mara" if i % 2 else "Ilya", "content": f"line {i}"}
            for i in range(1, 6)]  # fmt: skip
    rows[-1]["content"] = "the lighthouse"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_depth_placement_in_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "build", small_story(tmp_path), "--lore", depth_book(tmp_path))
    assert code == 0
    assert out.index("LORE-BEFORE") < out.index("LORE-AFTER") < out.index("line 1")
    # depth 1: one message from the end, between message 4 and message 5
    assert out.index("line 4") < out.index("LORE-AT-DEPTH") < out.index("the lighthouse")


def test_depth_placement_in_messages_with_its_role(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "build", small_story(tmp_path), "--lore", depth_book(tmp_path), "--emit", "messages")
    messages = json.loads(out)
    at = next(i for i, m in enumerate(messages) if "LORE-AT-DEPTH" in m["content"])
    assert code == 0 and messages[at] == {"role": "system", "content": "LORE-AT-DEPTH"}
    assert "line 4" in messages[at - 1]["content"] and "the lighthouse" in messages[at + 1]["content"]
    # A user-role entry joins the user's turn, before the message it stands above.
    code, out, _ = run(
        capsys, "build", small_story(tmp_path), "--lore", depth_book(tmp_path, role=1), "--emit", "messages"
    )
    turn = next(m for m in json.loads(out) if "LORE-AT-DEPTH" in m["content"])
    assert turn["role"] == "user" and turn["content"].index("LORE-AT-DEPTH") < turn["content"].index("the lighthouse")


@pytest.mark.parametrize("template", ["default", "sillytavern", "serene"])
def test_every_template_shows_the_lore(capsys: pytest.CaptureFixture[str], tmp_path: Path, template: str) -> None:
    code, out, _ = run(capsys, "build", small_story(tmp_path), "--lore", depth_book(tmp_path), "--template", template)
    assert code == 0 and "LORE-BEFORE" in out and "LORE-AFTER" in out


def test_when_the_frame_has_no_room_lore_is_dropped_by_priority(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "big.json"
    big = " ".join(["saltwater"] * 40)
    story = tmp_path / "long.jsonl"
    rows = [{"role": "user", "name": "Mara", "content": "the lighthouse " + "wave " * 50} for _ in range(5)]
    story.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entries = {str(i): {"uid": i, "key": ["lighthouse"], "content": f"E{i} {big}", "order": 100 + i} for i in range(4)}
    path.write_text(json.dumps({"entries": entries}))
    config = tmp_path / "config.toml"
    config.write_text("[lore]\nbudget = 100\n")
    args = ["build", story, "--lore", path, "--window", "700", "--reserve", "50", "--config", config]
    code, out, err = run(capsys, *args, "--tokenizer", "estimate")
    assert code == 0 and "dropped" in err and "lore" in err
    assert "E3 " in out and "E0 " not in out  # the highest order stays
    code, out, _ = run(capsys, "inspect", *args[1:], "--tokenizer", "estimate", "--json")
    facts = json.loads(out)
    assert facts["tokens"] <= facts["limit"]
    assert {e["uid"]: e["reason"] for e in facts["lore"]["entries"]}[0] == "frame"


# ── Explain ────────────────────────────────────────────────────────────────────────────────


def test_inspect_json_lists_every_entry_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", CHAT, "--lore", ELDORIA, "--json")
    assert code == 0
    lore = json.loads(out)["lore"]
    assert lore["engine"] == "keyword" and lore["used"] <= lore["budget"]
    first = lore["entries"][0]
    assert first["fired"] and first["uid"] == 0 and first["message"] == 3 and first["key"] == "eldoria"
    assert "message 3 by Seraphina" in first["why"]
    assert {e["uid"]: e["reason"] for e in lore["entries"]} == {0: "key", 1: "no_match", 2: "no_match", 3: "no_match"}


def test_inspect_explain_has_a_lore_section(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", CHAT, "--lore", ELDORIA, "--explain")
    assert code == 0 and "Lore (keyword" in out and "no key matched" in out


# ── Sources and bad input ──────────────────────────────────────────────────────────────────


def test_lore_files_in_the_config_are_relative_to_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "books").mkdir()
    book = depth_book(tmp_path / "books")
    config = tmp_path / "config.toml"
    config.write_text('[lore]\nfiles = ["books/book.json"]\n')
    assert book.exists()
    code, out, _ = run(capsys, "build", small_story(tmp_path), "--config", config)
    assert code == 0 and "LORE-BEFORE" in out


def test_native_lore_lines_convert_losslessly(tmp_path: Path) -> None:
    story = open_story(CHAT, cards=[CARD])
    world = read_world_info(ELDORIA)
    story = replace(story, world=(replace(world[0], probability=40, group="g", sticky=2, scan_depth=3),))
    path = tmp_path / "native.jsonl"
    path.write_text(to_native_text(story))
    back = read_story(path)
    expected = [*story.world, *story.message(1).card.book]  # type: ignore[union-attr]
    assert [replace(e, line=None) for e in back.world] == expected
    assert to_native_text(back) == to_native_text(story)
    same = settings(engine="sillytavern")
    assert build(back, same).prompt == build(story, same).prompt


def bad_book(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not a World Info file"),
        ('{"entries": {"1": 5}}', "lore entry 1: an entry is a JSON object"),
        ('{"entries": {"1": {"key": 5}}}', 'lore entry 1: "key" must be a list of text'),
        ('{"entries": {"1": {"key": ["x", 3]}}}', 'lore entry 1: "key" must be a list of text'),
        ('{"entries": {"7": {"position": -1}}}', 'lore entry 7: "position" must be a number from 0 to 99'),
        ('{"entries": {"3": {"characterFilter": ["Ilya"]}}}', 'lore entry 3: "characterFilter" must be an object'),
        ('{"entries": {"3": {"characterFilter": {"names": "Ilya"}}}}', '"characterFilter.names" must be a list'),
        ('{"entries": {"2": {"depth": -3}}}', 'lore entry 2: "depth" must be a number from 0'),
        ('{"something": 1}', 'expected {"entries"'),
    ],
)
def test_bad_lorebooks(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str) -> None:
    code, out, err = run(capsys, "build", small_story(tmp_path), "--lore", bad_book(tmp_path, text))
    assert code == 1 and out == "" and message in err and "bad.json" in err and len(err.strip().splitlines()) == 1


def test_a_malformed_character_book(tmp_path: Path) -> None:
    card = tmp_path / "card.json"
    book: dict[str, Any] = {"entries": [{"keys": ["x"], "content": "c", "insertion_order": "high"}]}
    card.write_text(json.dumps({"spec": "chara_card_v2", "data": {"name": "A", "character_book": book}}))
    with pytest.raises(StoryError, match='lore entry 0: "order" must be a number'):
        open_story(small_story(tmp_path), cards=[card])
    card.write_text(json.dumps({"spec": "chara_card_v2", "data": {"name": "A", "character_book": []}}))
    with pytest.raises(StoryError, match="character_book"):
        open_story(small_story(tmp_path), cards=[card])


def test_a_lorebook_as_card_and_a_card_as_lore(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "build", CHAT, "--card", ELDORIA)
    assert code == 1 and out == "" and "is a World Info lorebook" in err and "--lore takes it" in err
    code, out, err = run(capsys, "build", CHAT, "--lore", CARD)
    assert code == 1 and out == "" and "is a PNG character card" in err and "--card takes it" in err


# ── The invariants hold with lore ──────────────────────────────────────────────────────────


@given(
    n=st.integers(1, 60),
    window=st.integers(300, 3000),
    sizes=st.lists(st.integers(0, 120), min_size=1, max_size=6),
    engine=st.sampled_from(["keyword", "sillytavern"]),
    emit=st.sampled_from(["text", "messages"]),
)
def test_with_lore_the_prompt_fits_and_nothing_is_lost(
    n: int, window: int, sizes: list[int], engine: str, emit: str
) -> None:
    messages = tuple(
        Message(i, "user" if i % 2 else "assistant", f"message {i} by the lighthouse", "Mara" if i % 2 else "Ilya")
        for i in range(1, n + 1)
    )
    book = tuple(
        LoreEntry(uid=i, key=("lighthouse",), content=" ".join(["lamp"] * size), order=i, position=i % 5)
        for i, size in enumerate(sizes)
    )
    card = Card("Ilya", description="keeper")
    story = Story(Path("p.jsonl"), (Message(1, "system", "", "Ilya", card=card), *messages[1:]), world=book)
    s = load_settings(
        Path("/nonexistent"),
        {"model.window": (window, "t"), "model.tokenizer": ("estimate", "t"), "lore.engine": (engine, "t")},
    )
    built = build(story, s, emit=emit)
    a = built.assembly
    if a.refusal is None:
        assert built.prompt is not None and a.tokens <= a.limit
        kept = [m.number for m in a.head] + [m.number for m in a.tail]
        covered = [n for p in a.recap if p.scene for n in range(p.scene.start, p.scene.end + 1)]
        assert sorted(kept + covered) == list(range(1, len(story) + 1))  # no scenes: all verbatim
        assert built.lore.used <= built.lore.budget
    else:
        assert built.prompt is None
