"""`ctx replay --bound` and the stable policy's hysteresis (issue 19): the bound is the fewest
tokens any choice among the seed's candidates reprocesses, so it is never worse than either
policy; its shortest path is the brute force's; the stable policy comes within 1.5x of it on
otaku's own sample story."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from functools import cache

import pytest
from conftest import CASE3, FIXTURES, examples, run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cache_policy import COUNTER, assert_candidate
from test_properties import chained_stories, shapes

from otaku_ctx.assemble import Policy, Shape, assemble
from otaku_ctx.assemble.search import Search
from otaku_ctx.assemble.stable import Stable
from otaku_ctx.build import Pipeline, open_story, renderer_for
from otaku_ctx.config import Settings, load_settings
from otaku_ctx.render.pricing import TemplatePricer
from otaku_ctx.replay import Bound, Replay, Turn, _Node, replay
from otaku_ctx.story.model import Story
from otaku_ctx.tokens import common_length, make_counter


def configured(shape: Shape, window: int, cache: str, tokenizer: str = "estimate") -> Settings:
    given = {
        "model.window": window,
        "model.tokenizer": tokenizer,
        "context.reply_reserve": 0,
        "context.cache": cache,
        "context.head_messages": shape.head,
        "context.min_tail_messages": shape.min_tail,
        "context.tail_step": shape.tail_step,
        "context.tail_floor": shape.tail_floor,
    }
    return load_settings(overrides={k: (v, "test") for k, v in given.items()})


def tour() -> Story:
    """otaku's tour.md with its cast's cards, their example dialogue left out: the default
    template prints it after the chat, where it keeps every prompt from being a prefix of the
    next whatever the policy (docs/caching.md; benchmarks/cache_bound.py converts it so)."""
    story = open_story(FIXTURES / "otaku" / "tour.md")
    messages = tuple(
        replace(m, card=replace(m.card, example_dialogue="")) if m.card is not None else m for m in story.messages
    )
    return replace(story, messages=messages)


@cache
def tour_replays() -> dict[str, Replay]:
    """The issue's replay: the tour at a 40k limit, every 2 turns (the window first fills at
    turn 143 with the estimate), turns 163-199: two of the scenes where `stable` flipped 100
    -> 50 -> 100 on main. Under both policies; the stable one with the bound."""
    story, shape = tour(), Shape()
    return {
        cache: replay(story, configured(shape, 40_000, cache), first=163, last=199, every=2, bound=cache == "stable")
        for cache in ("exact", "stable")
    }


# ── The bound against the policies ──


@pytest.mark.deep
@settings(max_examples=examples(5))
@given(chained_stories(), shapes, st.floats(0.1, 0.9), st.integers(1, 3), st.sampled_from(["estimate", "cl100k_base"]))
def test_the_bound_is_never_worse_than_either_policy(
    s: Story, shape: Shape, fraction: float, every: int, tokenizer: str
) -> None:
    whole = sum(len(m.content) // 3 + 8 for m in s.messages) + 50
    window = max(1, int(whole * fraction))
    first = max(1, len(s) - 4 * every)
    stable = replay(s, configured(shape, window, "stable", tokenizer), first=first, every=every, bound=True)
    exact = replay(s, configured(shape, window, "exact", tokenizer), first=first, every=every)
    bound = stable.bound  # the same candidates whatever the policy: the bound is computed once
    assert bound is not None
    for result in (stable, exact):
        assert bound.reprocessed() <= result.reprocessed()
        assert [t.messages for t in bound.turns] == [t.messages for t in result.turns]
        assert [t.case == 6 for t in bound.turns] == [t.case == 6 for t in result.turns]
    assert all(t.tokens <= t.limit for t in bound.turns)
    ratio = stable.ratio()
    assert ratio is None or ratio >= 1.0


@pytest.mark.deep
@settings(max_examples=examples(8))
@given(chained_stories(), shapes, st.floats(0.05, 1.2), st.sampled_from([Policy(), Policy("stable")]))
def test_every_policys_prompt_is_among_the_candidates_the_bound_weighs(
    s: Story, shape: Shape, fraction: float, policy: Policy
) -> None:
    """What the bound chooses from holds what either policy chooses, and only the seed's
    candidates, each within the limit."""
    whole = sum(len(m.content) // 3 + 8 for m in s.messages) + 50
    window = max(1, int(whole * fraction))
    renderer = renderer_for(s, load_settings())
    a = assemble(s, shape, window, TemplatePricer(renderer, COUNTER), policy=policy)
    pricer = TemplatePricer(renderer, make_counter("cl100k_base"))
    fitting = [found for _, found in Stable(Search(s, shape, window, 0, pricer), 0.03).fitting()]
    for found in fitting:
        assert found.tokens == pricer.exact(found) <= window
        assert_candidate(s, shape, found)
    if a.refusal is None:
        assert (a.head, a.recap, a.tail) in {(f.head, f.recap, f.tail) for f in fitting}


# ── The shortest path ──


def _bound(layers: list[list[str]]) -> Bound:
    """A bound over given prompts (characters as tokens; each prompt's last character is its open turn)."""
    settings_ = load_settings(overrides={"model.tokenizer": ("estimate", "test")})
    measure = type("M", (), {"encode": list, "chat_form": False, "unit": 1})()
    bound = Bound(Pipeline(settings_), measure)  # type: ignore[arg-type]
    for n, prompts in enumerate(layers, start=1):
        nodes = [_Node(Turn(n, 3, 50, 0, 1, len(p), 99, 0, False), p, p[:-1]) for p in prompts]
        bound.extend(nodes, n, 99)
    return bound


def _brute(layers: list[list[str]]) -> int:
    best = None
    for path in itertools.product(*[range(len(layer)) for layer in layers]):
        cost = sum(
            len(layers[i][path[i]]) - common_length(layers[i - 1][path[i - 1]][:-1], layers[i][path[i]])
            for i in range(1, len(layers))
        )
        best = cost if best is None else min(best, cost)
    return best or 0


prompts = st.lists(st.text("ab", min_size=1, max_size=8), min_size=1, max_size=4)


@settings(max_examples=examples(60))
@given(st.lists(prompts, min_size=1, max_size=5))
def test_the_bound_is_the_shortest_path(layers: list[list[str]]) -> None:
    """Its choices reprocess what the cheapest of all sequences of choices does, and its
    turns say what that path reuses."""
    result = _bound(layers).result()
    assert result.reprocessed() == _brute(layers)
    chosen = [t.tokens for t in result.turns]
    assert all(any(len(p) == size for p in layer) for size, layer in zip(chosen, layers, strict=True))


def test_a_refused_turn_breaks_the_path() -> None:
    bound = _bound([["abc", "ab"]])
    bound.extend([], 2, 99)  # refused: nothing is sent, so nothing is kept
    bound.extend([_Node(Turn(3, 3, 50, 0, 1, 4, 99, 0, False), "abcd", "abc")], 3, 99)
    turns = bound.result().turns
    assert [t.case for t in turns] == [3, 6, 3]
    assert [t.reprocessed for t in turns[1:]] == [0, 4]


@settings(max_examples=examples(60))
@given(st.lists(st.text("xy", max_size=6), min_size=1, max_size=6), st.lists(st.text("xy", max_size=6), max_size=6))
def test_the_common_prefixes_of_a_turn_are_the_pairs(befores: list[str], wholes: list[str]) -> None:
    common = Bound.commons(befores, wholes)  # type: ignore[arg-type]
    assert common == [[common_length(b, w) for w in wholes] for b in befores]


# ── The targets, on otaku's own sample ──


@pytest.mark.deep
def test_stable_comes_within_1_5x_of_the_bound_on_the_tour() -> None:
    """Issue 19: on the tour at 40k, every 2 turns from where the window fills, `stable`
    reprocesses at most 1.5x the bound's tokens and keeps the prefix in ≥ 80% of turns. Over
    the whole story (benchmarks/cache_bound.py, docs/caching.md) it is 1.11x and 88.6%; on
    main before it, 3.95x and 69.3%, and the exact search 7.5x and 47.7%."""
    replays = tour_replays()
    stable, exact = replays["stable"], replays["exact"]
    assert {t.case for t in stable.turns} <= {3, 4, 5}
    ratio = stable.ratio()
    assert ratio is not None and ratio <= 1.5
    assert stable.share_prefix() >= 0.80
    assert stable.reprocessed() < exact.reprocessed()


@pytest.mark.deep
def test_the_stable_shape_no_longer_flips_tail_targets_on_the_tour() -> None:
    """The flapping the issue shows (tail target 50 -> 100, then 100 -> 50 a few turns later,
    at every scene): a step back is taken only when it lasts a scene, so no tail target
    comes back within a scene's length of leaving it."""
    turns = tour_replays()["stable"].turns
    left: dict[int, int] = {}
    for before, after in itertools.pairwise(turns):
        if before.tail_target != after.tail_target:
            left[before.tail_target] = after.messages
            assert after.messages - left.get(after.tail_target, -100) > 21, (after.messages, left)


def test_cli_replay_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", CASE3, "--first", "230", "--window", "3000", "--bound", "--json")
    assert code == 0, err
    data = json.loads(out)
    bound = data["bound"]
    assert bound["policy"] == "bound" and bound["turns"] == data["turns"] == len(bound["per_turn"]) == 11
    assert bound["reprocessed_total"] <= data["reprocessed_total"]
    assert data["ratio"] is None or data["ratio"] >= 1.0
    code, out, _ = run(capsys, "replay", CASE3, "--first", "230", "--window", "3000", "--bound")
    assert code == 0 and "bound (the fewest tokens" in out and "this policy ÷ the bound" in out
    code, out, _ = run(capsys, "replay", CASE3, "--first", "230", "--window", "3000", "--json")
    assert "bound" not in json.loads(out)
