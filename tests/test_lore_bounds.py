"""Lore's bounds (issue 20): the shortcuts that bound a build's cost decide what SillyTavern's
plain loop decides, names never become patterns, a bad regex is plain text with one note.

The cost itself is measured by benchmarks/lore_bench.py --worst, not here: these tests count
work (entries tested), never seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, examples, run
from hypothesis import given, settings
from hypothesis import strategies as st

from otaku_ctx.build import build
from otaku_ctx.config import load_settings
from otaku_ctx.lore import Character, ChatLine, LoreRules, choose
from otaku_ctx.lore.scan import Book, Item, Kind, Scan, Timed, Where
from otaku_ctx.render.names import Names
from otaku_ctx.story.convert import to_native_text
from otaku_ctx.story.detect import read_story
from otaku_ctx.story.model import Card, LoreEntry, Message, Story
from otaku_ctx.story.worldinfo import world_info_entries

WORDS = ["boat", "oar", "tar", "sea", "lamp", "Ilya", "ab", "the sea", "o"]


class Naive(Scan):
    """SillyTavern's loop as it is written: every entry tested in every pass, every key on the
    whole joined text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = False

    def candidates(self, kind: Kind, depth: int, level: int, last: Any, window: int) -> list[Item]:
        skip = self._activated | self._failed
        return [it for it in self.book.items if id(it) not in skip]

    def where(self, mid: int, depth: int, recursion: bool) -> Where | None:
        return self.in_text(self.book.keys.matchers[mid], depth, recursion)


def entries_strategy() -> st.SearchStrategy[list[LoreEntry]]:
    key = st.sampled_from([*WORDS, "/bo+at/i", "/(sea|lamp)\\n/", " ", ""])
    entry = st.builds(
        lambda uid, keys, second, logic, order, constant, group, override, probability, scan_depth, prevent, exclude,
        delay, sticky, whole, content: LoreEntry(
            uid=uid, key=tuple(keys), keysecondary=tuple(second), selective_logic=logic, order=order,
            constant=constant, group=group, group_override=override, probability=probability, scan_depth=scan_depth,
            prevent_recursion=prevent, exclude_recursion=exclude, delay_until_recursion=delay, sticky=sticky,
            match_whole_words=whole, content=" ".join(content),
        ),
        st.integers(0, 10**6), st.lists(key, max_size=3), st.lists(key, max_size=2), st.integers(0, 3),
        st.integers(0, 5), st.booleans(), st.sampled_from(["", "", "g", "g, h", "h"]), st.booleans(),
        st.sampled_from([100, 100, 50]), st.sampled_from([None, None, 0, 1, 4]), st.booleans(), st.booleans(),
        st.sampled_from([0, 0, 0, 1, 2]), st.sampled_from([0, 0, 2]), st.sampled_from([None, True, False]),
        st.lists(st.sampled_from(WORDS), max_size=6),
    )  # fmt: skip
    return st.lists(entry, min_size=1, max_size=14, unique_by=lambda e: e.uid)


RULES = st.builds(
    lambda recursive, depth, whole, budget, steps, minimum, scoring, engine: LoreRules(
        engine=engine, scan_depth=depth, match_whole_words=whole, recursive=recursive, budget=budget,
        max_recursion_steps=steps, min_activations=minimum, group_scoring=scoring,
    ),
    st.booleans(), st.integers(0, 4), st.booleans(), st.sampled_from([1, 5, 30, 100]), st.sampled_from([0, 0, 2]),
    st.sampled_from([0, 0, 3]), st.booleans(), st.sampled_from(["sillytavern", "sillytavern", "keyword"]),
)  # fmt: skip
CHAT = st.lists(st.lists(st.sampled_from([*WORDS, "x", "\n"]), max_size=8).map(" ".join), min_size=1, max_size=8)


def decided(scan: Scan) -> dict[int | str, tuple[Any, ...]]:
    return {d.entry.uid: (d.fired, d.reason, d.key, d.message, d.by, d.tokens) for d in scan.decisions.values()}


@pytest.mark.deep
@settings(max_examples=examples(300), deadline=None)
@given(entries=entries_strategy(), rules=RULES, texts=CHAT, sticky=st.booleans())
def test_the_indexed_scan_decides_what_the_plain_loop_decides(
    entries: list[LoreEntry], rules: LoreRules, texts: list[str], sticky: bool
) -> None:
    chat = [ChatLine(n, "Mara" if n % 2 else "Ilya", t) for n, t in enumerate(texts, start=1)]
    book = Book(entries, rules, lambda t: t, lambda e: len(e.content.split()) + 1, None)
    timed = Timed()
    if sticky:  # an entry sticky from an earlier turn
        timed.record(0, replace(entries[0], sticky=5))
    fast = Scan(book, chat, "s", len(chat), timed, budget=20)
    fast.run()
    plain = Naive(book, chat, "s", len(chat), timed, budget=20)
    plain.run()
    assert [it.entry.uid for it in fast.admitted] == [it.entry.uid for it in plain.admitted]
    assert {k: v for k, v in decided(fast).items() if v[0]} == {k: v for k, v in decided(plain).items() if v[0]}
    for uid, why in decided(plain).items():  # an entry the fast scan never tested did not fire
        assert decided(fast).get(uid, (False, "no_match"))[0] == why[0]
    replay = Scan(book, chat, "s", len(chat), timed, budget=20, record=False)  # lazy with the SillyTavern engine
    replay.run()
    assert [it.entry.uid for it in replay.admitted] == [it.entry.uid for it in plain.admitted]


def test_a_recursion_chain_costs_linear_work() -> None:
    n = 400
    book = [LoreEntry(uid=i, key=(f"link{i}",), content=f"Link {i} leads to link{i + 1}.") for i in range(n)]
    rules = LoreRules(engine="sillytavern", scan_depth=2, recursive=True, match_whole_words=True, budget=100)
    scan = Scan(Book(book, rules, lambda t: t, lambda e: 1, None), [ChatLine(1, "Mara", "see link0")], "s", 1,
                Timed(), budget=10**6)  # fmt: skip
    scan.run()
    assert len(scan.admitted) == n
    assert scan.tests <= 3 * n  # SillyTavern's loop tests n entries in each of n passes


def test_a_replayed_turn_stops_at_the_budget() -> None:
    book = [LoreEntry(uid=i, key=("boat",), content="word " * 10) for i in range(2000)]
    rules = LoreRules(engine="sillytavern", scan_depth=2, match_whole_words=True, recursive=True)
    chat = [ChatLine(1, "Mara", "a boat")]
    replay = Scan(Book(book, rules, lambda t: t, lambda e: 11, None), chat, "s", 1, Timed(), 100, record=False)
    replay.run()
    assert len(replay.admitted) == 9 and replay.tests < 20


# ── Names are data ─────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["Il(ya", "(a+)+$", "a|b", "\\", "[x", "a/b", ".*"])
def test_a_name_in_a_regex_key_is_matched_as_text(name: str) -> None:
    names = Names(name, "Mara")
    chat = [ChatLine(1, "Mara", f"{'a' * 40}! I see {name} here.")]
    rules = LoreRules(engine="sillytavern", scan_depth=2, match_whole_words=True)
    book = [
        LoreEntry(uid=1, key=("/see {{char}} here/",), content="found"),
        LoreEntry(uid=2, key=("/{{char}}x/",), content="no"),
    ]
    choice = choose(book, chat, rules, fill=names.fill, count=len, limit=10_000, seed="s")
    assert [d.entry.uid for d in choice.placed] == [1] and not choice.notes


def test_a_name_that_is_a_pattern_through_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    story = tmp_path / "story.jsonl"
    rows = [{"type": "story", "char": "Il(ya"}, {"role": "user", "name": "Mara", "content": "Where is Il(ya?"}]
    story.write_text("".join(json.dumps(r) + "\n" for r in rows))
    book = tmp_path / "book.json"
    book.write_text(json.dumps({"entries": {"0": {"uid": 0, "key": ["/{{char}}\\?/"], "content": "FOUND-IT"}}}))
    code, out, err = run(capsys, "build", story, "--lore", book)
    assert code == 0 and "FOUND-IT" in out and "Traceback" not in err


# ── What SillyTavern reads its own way, said once ──────────────────────────────────────────


def test_a_malformed_regex_key_is_plain_text_with_one_note(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    story = tmp_path / "story.jsonl"
    story.write_text(json.dumps({"role": "user", "name": "Mara", "content": "the sign says /(bad/ and a lamp"}) + "\n")
    book = tmp_path / "book.json"
    entries = {
        "0": {"uid": 0, "key": ["/(bad/"], "content": "LITERAL"},
        "1": {"uid": 1, "key": ["/(worse/", "lamp"], "content": "LAMP"},
        "2": {"uid": 2, "key": ["/(absent/"], "content": "ABSENT"},
    }
    book.write_text(json.dumps({"entries": entries}))
    code, out, err = run(capsys, "build", story, "--lore", book)
    assert code == 0 and "LITERAL" in out and "LAMP" in out and "ABSENT" not in out
    notes = [line for line in err.splitlines() if "regular expression" in line]
    assert len(notes) == 1 and "3 regex keys" in notes[0] and "'/(bad/' (book.json entry 0)" in notes[0]
    code, out, _ = run(capsys, "inspect", story, "--lore", book, "--json")
    assert any("matched as plain text" in n for n in json.loads(out)["lore"]["notes"])


def test_keys_given_as_one_text_are_no_keys_with_a_note(tmp_path: Path) -> None:
    entries = world_info_entries(tmp_path / "b.json", {"entries": {"0": {"uid": 0, "key": "boat, oar"}}}, "b.json")
    assert entries[0].key == () and entries[0].problems == (("text_keys", "key"),)
    choice = choose(entries, [ChatLine(1, "Mara", "a boat")], LoreRules(), fill=str, count=len, limit=100, seed="s")
    assert not choice.placed and "give keys as one text" in choice.notes[0]


def test_an_unknown_position_fires_and_is_placed_nowhere(tmp_path: Path) -> None:
    entries = world_info_entries(tmp_path / "b.json", {"entries": {"0": {"uid": 0, "constant": True, "position": 7,
                                                                         "content": "outlet"}}}, "b.json")  # fmt: skip
    choice = choose(entries, [ChatLine(1, "Mara", "x")], LoreRules(), fill=str, count=len, limit=100, seed="s")
    assert not choice.placed and choice.decisions[0].fired and choice.decisions[0].reason == "position"
    assert "does not place" in choice.notes[0]


# ── characterFilter and decorators through a build ─────────────────────────────────────────


def filtered_story(card: Card) -> Story:
    book = (
        LoreEntry(uid=0, content="FOR-SERA", constant=True, character_names=("sera.v2",)),
        LoreEntry(uid=1, content="NOT-FOR-SERA", constant=True, character_names=("sera.v2",), character_exclude=True),
        LoreEntry(uid=2, content="FANTASY", constant=True, character_tags=("Fantasy",)),
        LoreEntry(uid=3, content="@@activate here", decorators=("@@activate",), key=("nowhere",)),
    )
    messages = (Message(1, "system", "", card.name, card=card), Message(2, "user", "hello", "Mara"))
    return Story(Path("s.jsonl"), messages, world=book)


def test_character_filter_compares_the_card_file_stem_and_tags() -> None:
    s = load_settings(Path("/nonexistent"), {"lore.engine": ("sillytavern", "t")})
    card = Card("Seraphina", avatar="sera.v2.png", tags=("fantasy",))
    built = build(filtered_story(card), s)
    assert built.prompt is not None
    assert "FOR-SERA" in built.prompt and "NOT-FOR-SERA" not in built.prompt and "FANTASY" in built.prompt
    assert "@@activate here" in built.prompt
    other = build(filtered_story(Card("Seraphina")), s)  # no file: the card's name stands for it
    assert other.prompt is not None and "FOR-SERA" not in other.prompt.replace("NOT-FOR-SERA", "")


def test_decorators_and_filters_survive_a_conversion(tmp_path: Path) -> None:
    book = {"entries": {"0": {"uid": 0, "key": ["x"], "content": "@@activate\r\n@@foo\nText",
                              "characterFilter": {"isExclude": True, "names": ["Ilya"], "tags": ["7"]}}}}  # fmt: skip
    entry = world_info_entries(tmp_path / "b.json", book, "b.json")[0]
    assert entry.decorators == ("@@activate\r",) and entry.content == "Text"
    story = Story(Path("s.jsonl"), (Message(1, "user", "hi", "Mara"),), world=(entry,))
    path = tmp_path / "native.jsonl"
    path.write_text(to_native_text(story))
    back = read_story(path).world[0]
    assert replace(back, line=None) == entry


def test_a_lorebook_that_works_in_sillytavern_works_here() -> None:
    """The goldens' lorebooks all read (none is refused): the reader refuses only what
    SillyTavern could not use either."""
    cases = json.loads((FIXTURES / "sillytavern" / "worldinfo" / "cases.json").read_text())["cases"]
    for case in cases:
        for book in case["books"]:
            assert world_info_entries(Path(book["name"]), {"entries": book["entries"]}, book["name"])


def test_no_character_fails_name_filters_and_skips_tag_filters() -> None:
    book = [
        LoreEntry(uid=0, content="a", constant=True, character_names=("X",)),
        LoreEntry(uid=1, content="b", constant=True, character_tags=("t",)),
    ]
    for character, fired in ((None, [1]), (Character("X", ("t",)), [0, 1]), (Character("Y"), [])):
        choice = choose(book, [ChatLine(1, "M", "x")], LoreRules(), fill=str, count=len, limit=99, seed="s",
                        character=character)  # fmt: skip
        assert sorted(d.entry.uid for d in choice.placed) == fired


def test_validate_names_a_lore_key_that_is_no_regex(tmp_path: Path) -> None:
    """A key written `/(z/` does not compile: ctx matches it as plain text, as SillyTavern does,
    and `validate`, whose job is to name every problem, names it (issue 28)."""
    from io import BytesIO, StringIO

    from otaku_ctx.cli.app import main
    from otaku_ctx.cli.terminal import Terminal

    story = tmp_path / "story.jsonl"
    story.write_text('{"role":"user","content":"hi"}\n{"type":"lore","uid":7,"key":["/(z/"],"content":"x"}\n')
    err = StringIO()
    code = main(["validate", str(story)], Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
    assert (
        code == 0
        and f"{story}:2: warning: lore entry 7: key '/(z/' is not a valid regular expression" in err.getvalue()
    )


@pytest.mark.parametrize(
    ("lore", "said"),
    [
        ('"key":"/(z/"', "\"key\" is one text ('/(z/'), not a list: SillyTavern reads no keys from it"),
        ('"key":["x"],"position":9', "position 9 is none SillyTavern 1.12 places"),
    ],
)
def test_validate_names_every_lore_field_read_its_own_way(tmp_path: Path, lore: str, said: str) -> None:
    """Not the list form alone: keys given as one text (here the invalid `/(z/`), read as no keys,
    and a position nothing places are named too (issue 45: validate was silent about them)."""
    from io import BytesIO, StringIO

    from otaku_ctx.cli.app import main
    from otaku_ctx.cli.terminal import Terminal

    story = tmp_path / "story.jsonl"
    story.write_text('{"role":"user","content":"hi"}\n{"type":"lore","uid":7,' + lore + ',"content":"x"}\n')
    err = StringIO()
    code = main(["validate", str(story)], Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
    assert code == 0 and f"{story}:2: warning: lore entry 7: {said}" in err.getvalue(), err.getvalue()
