"""`ctx replay`: turns, the build at each turn, the prefix measure, the CLI."""

from __future__ import annotations

import json

import pytest
from conftest import CASE3, CASE4, FIXTURES, run

from otaku_ctx.build import build
from otaku_ctx.config import load_settings
from otaku_ctx.errors import UsageError
from otaku_ctx.render.formats import text_pieces
from otaku_ctx.replay import replay, story_at, turn_numbers
from otaku_ctx.story.detect import read_story
from otaku_ctx.tokens import common_length


def settings(**given: object):
    return load_settings(overrides={k: (v, "test") for k, v in given.items()})


def test_a_turn_holds_the_first_messages_and_the_scenes_closed_by_then() -> None:
    story = read_story(CASE3)  # scenes of 30 messages: 1–30, 31–60, ...
    at = story_at(story, 60)
    assert len(at) == 60 and at.messages[-1] == story.messages[59]
    assert [(s.start, s.end) for s in at.scenes] == [(1, 30), (31, 60)]
    assert [(s.start, s.end) for s in story_at(story, 59).scenes] == [(1, 30)]


@pytest.mark.parametrize(
    ("first", "last", "every", "turns"),
    [(None, None, 1, list(range(1, 11))), (3, 9, 3, [3, 6, 9]), (1, 10, 4, [1, 5, 9, 10]), (10, 10, 5, [10])],
)
def test_turn_numbers(first: int | None, last: int | None, every: int, turns: list[int]) -> None:
    assert turn_numbers(10, first, last, every) == turns


@pytest.mark.parametrize(("first", "last", "every"), [(11, None, 1), (5, 4, 1), (1, 11, 1), (1, 5, 0)])
def test_turns_outside_the_story_are_usage_errors(first: int, last: int | None, every: int) -> None:
    with pytest.raises(UsageError):
        turn_numbers(10, first, last, every)


def test_common_prefix() -> None:
    assert common_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_length([1, 2, 3], [1, 9, 3]) == 1
    assert common_length([], [1]) == 0
    assert common_length(list(range(1000)), [*range(700), -1]) == 700
    assert common_length("the keeper", "the keel") == 7


def test_each_turn_is_the_build_of_that_turn() -> None:
    """The replay's prompt at turn N is `ctx build` of the story's first N messages, and its
    count in the emitted form is the build's."""
    story = read_story(CASE4)
    s = settings(**{"model.window": 3000, "context.cache": "stable"})
    result = replay(story, s, first=300, last=330, every=15)
    assert [t.messages for t in result.turns] == [300, 315, 330]
    for turn in result.turns:
        built = build(story_at(story, turn.messages), s)
        assert (turn.case, turn.tail_target, turn.level) == (
            built.assembly.case,
            built.assembly.tail_target,
            built.assembly.level,
        )
        assert turn.tokens == built.assembly.tokens <= built.assembly.limit


def test_prefix_means_the_previous_prompt_less_its_open_turn_starts_the_next() -> None:
    story = read_story(CASE3)
    s = settings(**{"model.window": 4000, "model.tokenizer": "estimate", "prompt.format": "chatml"})
    result = replay(story, s, first=200, last=206)
    assert any(t.prefix for t in result.turns)
    for before, after in zip(result.turns, result.turns[1:], strict=False):
        old, new = build(story_at(story, before.messages), s), build(story_at(story, after.messages), s)
        fmt_open = text_pieces(_format(s), list(old.blocks))[-1]
        assert old.prompt is not None and new.prompt is not None
        kept = old.prompt.removesuffix(fmt_open)
        assert kept != old.prompt  # the open turn was there to take off
        assert after.prefix == new.prompt.startswith(kept)
        if after.prefix:
            assert after.reused == len(kept) // 4  # the estimate: 4 characters a token


def _format(s):
    from otaku_ctx.render.lookup import find_format

    return find_format(s.prompt.format)


def test_stable_reuses_more_than_exact_under_pressure() -> None:
    """The long fixture under a 40k window, a stretch where the exact search flips tail targets."""
    story = read_story(FIXTURES / "replay-long.jsonl")
    figures = {}
    for cache in ("exact", "stable"):
        result = replay(
            story, settings(**{"model.window": 40_000, "context.cache": cache}), first=190, last=200, every=2
        )
        figures[cache] = (result.share_prefix(), result.share_reused(), len(result.transitions))
    assert figures["stable"][0] == 1.0 and figures["stable"][2] == 0
    assert figures["exact"][0] < 1.0 and figures["exact"][2] > 0
    assert figures["stable"][1] > figures["exact"][1]


def test_cli_replay_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", CASE3, "--first", "230", "--every", "5", "--window", "4000", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["turns"] == len(data["per_turn"]) == 3 and data["last"] == 240
    assert data["policy"] == "exact" and data["tokenizer"] == "cl100k_base"
    assert 0 <= data["prefix_share"] <= 1 and {"mean", "p95"} <= set(data["reused"])


def test_cli_replay_text_and_cache_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "replay", CASE3, "--first", "235", "--window", "4000", "--cache", "stable")
    assert code == 0
    assert out.startswith("turns 235–240 (6), cache policy stable") and "prefix of the next" in out


def test_cli_replay_bad_range(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", CASE3, "--first", "999")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "--from" not in err and "999" in err
