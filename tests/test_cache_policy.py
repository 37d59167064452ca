"""`[context] cache = "stable"`: every prompt is one of the seed's candidates, ≤ the limit to
the token, loses nothing; the shape holds between turns and takes a less degraded one only
with the slack free; `exact` is the search as it was."""

from __future__ import annotations

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import chained_stories, check_invariants, shapes

from otaku_ctx.assemble import Assembly, Policy, Shape, assemble, covered_chain, head, recap_at_level, rungs, tail
from otaku_ctx.build import renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.render.pricing import TemplatePricer
from otaku_ctx.replay import story_at
from otaku_ctx.story.model import Story
from otaku_ctx.tokens import make_counter

STABLE = Policy("stable")
COUNTER = make_counter("cl100k_base")  # one cache for every prompt of these tests


def assemble_at(s: Story, shape: Shape, window: int, policy: Policy, emit: str = "text") -> tuple[Assembly, int]:
    """Assemble `s` as `ctx build` would (the default template and format); (assembly, exact count)."""
    counter = COUNTER
    renderer = renderer_for(s, load_settings(), emit=emit)
    pricer = TemplatePricer(renderer, counter)
    a = assemble(s, shape, window, pricer, policy=policy)
    counted = 0 if a.refusal else TemplatePricer(renderer, make_counter("cl100k_base")).exact(a)
    return a, counted


def assert_candidate(s: Story, shape: Shape, a: Assembly) -> None:
    """The assembly is what the seed's search would build for some tail target of the ladder
    and some existing level of that target's chain."""
    assert a.tail_target in rungs(shape, len(s))
    chain = covered_chain(s, shape, a.tail_target)
    assert a.head == head(s, shape)
    assert a.tail == tail(s, shape, chain)
    if not chain.scenes:
        assert a.recap == () and a.level == 0
        return
    assert a.level == 0 or chain.scenes[a.level - 1].history.strip()
    first = shape.head + 1
    cards = lambda scene: tuple(m for m in s.messages[max(scene.start, first) - 1 : scene.end] if m.is_card)  # noqa: E731
    assert a.recap == recap_at_level(chain.scenes, a.level, cards)


@pytest.mark.deep
@settings(max_examples=examples(15))
@given(chained_stories(), shapes, st.floats(0.05, 1.2), st.sampled_from(["text", "messages"]))
def test_stable_prompts_are_candidates_within_the_limit(s: Story, shape: Shape, fraction: float, emit: str) -> None:
    whole = sum(len(m.content) // 3 + 8 for m in s.messages) + 50
    a, counted = assemble_at(s, shape, max(1, int(whole * fraction)), STABLE, emit)
    check_invariants(s, a)
    if a.refusal is None:
        assert counted == a.tokens <= a.limit
        assert_candidate(s, shape, a)


@pytest.mark.deep
@settings(max_examples=examples(10))
@given(chained_stories(), shapes, st.floats(0.1, 1.0), st.integers(1, 40))
def test_stable_turns_never_exceed_the_limit_and_lose_nothing(
    s: Story, shape: Shape, fraction: float, every: int
) -> None:
    """A random sequence of turns of one story: each turn's prompt holds."""
    whole = sum(len(m.content) // 3 + 8 for m in s.messages) + 50
    window = max(1, int(whole * fraction))
    for n in range(max(1, len(s) - 2 * every), len(s) + 1, every):
        at = story_at(s, n)
        a, counted = assemble_at(at, shape, window, STABLE)
        check_invariants(at, a)
        if a.refusal is None:
            assert counted == a.tokens <= a.limit
            assert_candidate(at, shape, a)


def test_exact_is_the_default_policy() -> None:
    assert Policy().cache == "exact"
    assert load_settings().context.cache == "exact"
    assert load_settings().context.cache_slack == Policy().slack == 0.03


def test_the_stable_shape_steps_back_only_with_the_margin_free(long_story: Story) -> None:
    """On a story under window pressure whose messages turn short (room opens up), turn by
    turn: a move to fewer covered scenes or a lower level leaves the margin free — the slack,
    or room for the next scene's length of messages of the recent size, whichever is more
    (issue 19) — the window is used again, and the shape changes far less often than the turns."""
    from dataclasses import replace

    from otaku_ctx.assemble.search import Search
    from otaku_ctx.assemble.stable import Stable

    short = tuple(
        replace(m, content=m.content.split(". ")[0] + ".") if m.number > 230 and not m.is_card else m
        for m in long_story.messages
    )
    story = replace(long_story, messages=short)
    shape, window = Shape(), 40_000
    shapes: list[tuple[int, int, int]] = []
    backs = 0
    for n in range(226, 262, 2):
        at = story_at(story, n)
        a, counted = assemble_at(at, shape, window, STABLE)
        assert a.refusal is None and counted <= window
        now = (len(a.summaries) + (a.level if a.history else 0), a.level, a.tail_target)
        if shapes and (now[0] < shapes[-1][0] or now[1] < shapes[-1][1]):
            backs += 1
            pricer = TemplatePricer(renderer_for(at, load_settings()), COUNTER)
            margin = Stable(Search(at, shape, window, 0, pricer), STABLE.slack).margin(n)
            assert margin >= int(window * STABLE.slack)
            assert window - counted >= margin, (n, shapes[-1], now)
        shapes.append(now)
    changes = sum(a != b for a, b in zip(shapes, shapes[1:], strict=False))
    assert backs >= 1  # the window is used again once the seed offers a roomier shape that lasts
    assert changes <= len(shapes) // 5


def test_a_chain_that_cannot_grow_takes_its_roomiest_level_in_one_move(long_story: Story) -> None:
    """The summarizer behind (scenes 10 on have no summaries yet, as while `ctx serve` writes
    them): the covered chain cannot grow, so the pressure of each turn's messages goes into
    the level. It moves once, to the chain's roomiest level, and holds — not one level a turn
    (nine moves in these turns before), each rewriting the prompt from the head on."""
    from dataclasses import replace

    lagging = tuple(s if s.order <= 9 else replace(s, summary="", history="") for s in long_story.scenes)
    story = replace(long_story, scenes=lagging)
    shape, window = Shape(), 25_000
    levels = []
    for n in range(275, 291):
        a, counted = assemble_at(story_at(story, n), shape, window, STABLE)
        assert a.refusal is None and counted <= window, n
        levels.append(a.level)
    assert levels[0] == 0 and levels[-1] > 0  # the turns move from summaries to the story so far
    assert sum(a != b for a, b in zip(levels, levels[1:], strict=False)) == 1, levels


@pytest.mark.deep
def test_stable_meets_the_cache_targets_under_pressure(long_story: Story) -> None:
    """Issue 11's targets, on the turns of the long fixture spent in cases 3 to 5: the previous
    prompt a prefix of the next in ≥ 90% of turns, ≥ 80% of tokens reused; and issue 19's, no
    worse than before its hysteresis (91.7% of turns, 92.2% reused, 2,495 tokens reprocessed a
    turn). Issue 11's ≤ 20% of the limit unused gave way to issue 19 (docs/decisions.md): the
    steps back to the longer tail that held it there lasted five to seven turns each, and
    were the flips issue 19 removes; 22.1% is what holding the shorter tail leaves."""
    from otaku_ctx.replay import replay

    settings = load_settings(overrides={"model.window": (40_000, "test"), "context.cache": ("stable", "test")})
    result = replay(long_story, settings, first=173)
    assert {t.case for t in result.turns} <= {3, 4, 5}
    assert result.share_prefix() >= 0.917  # issue 11: 0.90
    assert result.share_reused() >= 0.922  # issue 11: 0.80
    assert result.reprocessed() / len(result.compared) <= 2_495
    assert result.share_unused() <= 0.23


def test_stable_and_exact_differ_where_exact_flips(long_story: Story) -> None:
    """Where the exact search drops to a shorter tail and climbs back, the stable one holds."""
    shape, window = Shape(), 40_000
    turns = (194, 195, 198)  # the exact search: 100, then 150 when scene 4 joins, then 100 again
    exact = [assemble_at(story_at(long_story, n), shape, window, Policy())[0].tail_target for n in turns]
    stable = [assemble_at(story_at(long_story, n), shape, window, STABLE)[0].tail_target for n in turns]
    assert exact == [100, 150, 100]
    assert len(set(stable)) == 1


def test_a_bad_cache_setting_is_a_config_error(tmp_path) -> None:
    import pytest

    from otaku_ctx.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text('[context]\ncache = "sometimes"\n')
    with pytest.raises(ConfigError, match='expected "exact" or "stable"'):
        load_settings(path)
    path.write_text("[context]\ncache_slack = 1.5\n")
    with pytest.raises(ConfigError, match="share of the limit"):
        load_settings(path)


def test_inspect_explain_names_the_stable_policy_and_its_room(capsys) -> None:
    from conftest import FIXTURES, run

    code, out, _ = run(
        capsys, "inspect", FIXTURES / "replay-long.jsonl", "--window", "40000", "--cache", "stable", "--json"
    )
    assert code == 0
    data = __import__("json").loads(out)
    held = [t for t in data["trace"] if t["step"] == "Held"]
    assert len(held) == 1 and held[0]["room"] == data["limit"] - data["tokens"] and held[0]["turns"] > 0
    assert any(s.startswith("cache policy stable: tail target") for s in data["steps"])


def _brute_first_fit(walk, n: int, bound: int, floor, stop):  # noqa: ANN001, ANN202 - the walk is private
    """`first_fit` as its docstring says it, candidate by candidate."""
    for c in walk.candidates(n):
        if c == stop:
            return None
        if floor is not None and (c[0] < floor[0] or c[1] < floor[1]):
            continue
        if walk.estimate(c, n) <= bound:
            return c
    return None


@settings(max_examples=examples(10))
@given(chained_stories(), shapes, st.data())
def test_the_walks_first_fit_is_the_first_candidate_that_fits(s: Story, shape: Shape, data: st.DataObject) -> None:
    """Pricing a chain once and finding its level by bisection picks what pricing every
    candidate in the seed's order would pick."""
    from otaku_ctx.assemble.search import Search
    from otaku_ctx.assemble.stable import Stable

    renderer = renderer_for(s, load_settings())
    walk = Stable(Search(s, shape, 10**9, 0, TemplatePricer(renderer, COUNTER)), 0.03)
    for _ in range(15):
        n = data.draw(st.integers(1, len(s)))
        every = walk.candidates(n)
        prices = [walk.estimate(c, n) for c in every]
        bound = data.draw(st.sampled_from([*prices, min(prices) - 1, max(prices) + 1]))
        floor = data.draw(st.none() | st.sampled_from(every))
        stop = data.draw(st.none() | st.sampled_from(every))
        assert walk.first_fit(n, bound, floor=floor, stop=stop) == _brute_first_fit(walk, n, bound, floor, stop)


@pytest.mark.deep
def test_going_on_from_the_last_turns_walk_gives_what_walking_from_the_start_gives(long_story: Story) -> None:
    """A server builds a chat's every turn: the stable policy goes on from the walk of the
    turn before (`Policy.resume`, the `walked` of its assembly) instead of walking every turn
    again, and chooses exactly what the whole walk chooses, at every turn of the long fixture
    (the frame and the limit unchanged between turns, as in a chat without lore)."""
    from otaku_ctx.build import Pipeline

    settings = load_settings(overrides={"model.window": (40_000, "test"), "context.cache": ("stable", "test")})
    pipeline = Pipeline(settings, count=COUNTER)
    walked = None
    for n in range(150, len(long_story) + 1, 3):
        at = story_at(long_story, n)
        whole, resumed = pipeline.build(at), pipeline.build(at, resume=walked)
        assert (resumed.prompt, resumed.assembly.case) == (whole.prompt, whole.assembly.case), n
        assert resumed.assembly.walked == whole.assembly.walked and whole.assembly.walked is not None
        walked = resumed.assembly.walked


def test_going_on_from_a_walk_prices_only_what_is_new(long_story: Story, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk kept from the turn before holds its prices: the next turn, whose messages and
    scenes are the very objects priced then (as `ctx serve` keeps them), prices only its new
    messages, and builds what a walk from the first message builds; a message edited (a new
    object) is priced again from it on."""
    from dataclasses import replace

    from otaku_ctx.assemble.stable import Stable
    from otaku_ctx.build import Pipeline

    settings = load_settings(overrides={"model.window": (40_000, "test"), "context.cache": ("stable", "test")})
    pipeline = Pipeline(settings, count=COUNTER)
    walked = pipeline.build(story_at(long_story, 240)).assembly.walked
    priced: list[int] = []
    quick = Stable.quick
    monkeypatch.setattr(Stable, "quick", lambda self, m, after: priced.append(m.number) or quick(self, m, after))
    at = story_at(long_story, 243)
    resumed = pipeline.build(at, resume=walked)
    assert {241, 242, 243} <= set(priced) and len(priced) < 20  # and the estimates' first messages
    priced.clear()
    assert resumed.prompt == pipeline.build(at).prompt and len(priced) >= 243  # the whole walk prices each
    messages = list(at.messages)
    messages[99] = replace(messages[99], content=messages[99].content + " Then the fog lifted.")
    edited = replace(at, messages=tuple(messages))
    priced.clear()
    again = pipeline.build(edited, resume=resumed.assembly.walked)
    assert 100 in priced and 99 not in priced and again.prompt == pipeline.build(edited).prompt


def test_a_held_chat_goes_on_from_the_shape_it_was_sent_when_summaries_arrive(long_story: Story) -> None:
    """`ctx serve`'s chats hold (`Policy.hold`): the summaries of scenes 10 and 11 arrive while
    the chat is under pressure at level 9 (the story so far through scene 9). Walked again, as
    if they had always been there, it drops to level 0, the prompt rewritten from the head;
    held, it goes on from the shape it was sent: the history stays, and the new summaries join
    the chain after it (the messages they cover leave the tail, as the seed's chains have it)."""
    from dataclasses import replace

    from otaku_ctx.build import Pipeline

    lagging = tuple(s if s.order <= 9 else replace(s, summary="", history="") for s in long_story.scenes)
    behind = replace(long_story, scenes=lagging)
    settings = load_settings(overrides={"model.window": (25_000, "test"), "context.cache": ("stable", "test")})
    held, walked_again = Pipeline(settings, count=COUNTER, hold=True), Pipeline(settings, count=COUNTER)
    last = held.build(story_at(behind, 285))
    assert last.assembly.level > 0
    arrived = story_at(long_story, 286)
    kept = held.build(arrived, resume=last.assembly.walked)
    fresh = walked_again.build(arrived, resume=last.assembly.walked)
    assert fresh.prompt == walked_again.build(arrived).prompt  # not holding: walked from the first message
    assert kept.prompt is not None and fresh.prompt is not None and last.prompt is not None
    assert kept.assembly.tokens <= 25_000
    # held: the story so far through scene 9 stays, the new scenes' summaries join after it
    assert kept.assembly.level == last.assembly.level == 9 and fresh.assembly.level == 0
    assert _common(kept.prompt, last.prompt) > _common(fresh.prompt, last.prompt)
    assert last.assembly.history is not None and last.assembly.history.history in kept.prompt


def _common(a: str, b: str) -> int:
    """The length of the longest common start of two texts."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_a_walk_of_a_later_turn_is_not_gone_on_from(long_story: Story) -> None:
    """A resume that stands at this turn or after it (the chat was edited back, a regenerate)
    is not used: the walk starts from the first message."""
    from otaku_ctx.assemble import Walked
    from otaku_ctx.build import Pipeline

    settings = load_settings(overrides={"model.window": (40_000, "test"), "context.cache": ("stable", "test")})
    pipeline = Pipeline(settings, count=COUNTER)
    s = story_at(long_story, 250)
    whole = pipeline.build(s)
    bogus = Walked(len(s) + 5, (99, 0), (99, 0), 1, 0)
    assert pipeline.build(s, resume=bogus).prompt == whole.prompt


def test_a_walk_kept_from_before_a_summary_changed_is_walked_again(long_story: Story) -> None:
    """A chat whose summaries changed since its last turn (the background summarizer wrote or
    redid one): the walk kept from that turn read other prices, so the policy walks again from
    the first message, and chooses what it would have chosen with no walk kept."""
    from dataclasses import replace

    from otaku_ctx.build import Pipeline

    settings = load_settings(overrides={"model.window": (40_000, "test"), "context.cache": ("stable", "test")})
    pipeline = Pipeline(settings, count=COUNTER)
    before = story_at(long_story, 240)
    walked = pipeline.build(before).assembly.walked
    scenes = list(long_story.scenes)
    scenes[1] = replace(scenes[1], summary=scenes[1].summary + " And then a great deal more happened. " * 40)
    changed = story_at(replace(long_story, scenes=tuple(scenes)), 243)
    whole, resumed = pipeline.build(changed), pipeline.build(changed, resume=walked)
    assert walked is not None and resumed.prompt == whole.prompt
    assert resumed.assembly.walked == whole.assembly.walked


@settings(max_examples=examples(10))
@given(chained_stories(), shapes, st.data())
def test_the_walks_cheapest_level_is_the_least_of_the_levels_priced_one_by_one(
    s: Story, shape: Shape, data: st.DataObject
) -> None:
    """Under pressure the walk takes a chain's cheapest level (`roomiest`), read from a table
    in two lookups: the level each range's levels, priced one by one, would give (the lowest
    of equals; none where no level has a history)."""
    from otaku_ctx.assemble.search import Search
    from otaku_ctx.assemble.stable import Stable

    walk = Stable(Search(s, shape, 10**9, 0, TemplatePricer(renderer_for(s, load_settings()), COUNTER)), 0.03)
    top = len(walk.run)
    for _ in range(15):
        low, high = data.draw(st.integers(1, top + 1)), data.draw(st.integers(0, top))
        levels = [k for k in range(low, high + 1) if k in walk.histories]
        want = min(levels, key=lambda k: (walk.level_cost[k], k), default=None)
        assert walk.cheapest_level(low, high) == want


def test_a_turn_builds_each_tail_targets_rung_once_however_many_candidates_it_tries(
    long_story: Story, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window nothing fits: the last turn tries every candidate of every chain (each level of
    each), yet builds each tail target's rung (its chain, its tail's price) once, and prices a
    level from the walk's prices: a turn's work grows with the scenes, not with their square
    (a 24,000-message chat's first turn took 62 s, now 12 s)."""
    from otaku_ctx.assemble.stable import Stable

    built: list[int] = []
    tried: list[tuple[int, int]] = []
    rung, ordered = Stable.rung, Stable.ordered
    monkeypatch.setattr(Stable, "rung", lambda self, target, base: built.append(target) or rung(self, target, base))
    monkeypatch.setattr(
        Stable, "ordered", lambda self, n, floor: (tried.append(c) or c for c in ordered(self, n, floor))
    )
    shape = Shape()
    a, _ = assemble_at(long_story, shape, 2_000, STABLE)
    assert a.refusal is not None and len(set(tried)) > 3 * len(rungs(shape, len(long_story)))
    assert len(built) == len(set(built)) <= len(rungs(shape, len(long_story)))


def test_a_levels_price_from_the_walk_is_its_parts_priced_one_by_one(long_story: Story) -> None:
    """What a candidate's level adds to its rung, read from the walk's prefix sums, is its
    history and the summaries after it priced part by part, as the search prices them."""
    from otaku_ctx.assemble.parts import Part
    from otaku_ctx.assemble.search import Search
    from otaku_ctx.assemble.stable import Stable

    pricer = TemplatePricer(renderer_for(long_story, load_settings()), COUNTER)
    walk = Stable(Search(long_story, Shape(), 10**9, 0, pricer), 0.03)
    for m in range(len(walk.run) + 1):
        for k in [0, *(k for k in range(1, m + 1) if k in walk.histories)]:
            history = pricer.recap_part(Part("history", scene=walk.run[k - 1])) if k else 0
            summaries = sum(pricer.recap_part(Part("summary", scene=s)) for s in walk.run[k:m])
            assert walk.recap_price(m, k) == history + summaries, (m, k)
