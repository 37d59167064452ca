"""`[context] cache = "stable"`: every prompt is one of the seed's candidates, ≤ the limit to
the token, loses nothing; the shape holds between turns and never steps back; `exact` is the
search as it was."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import chained_stories, check_invariants, shapes

from otaku_ctx.assembler import Assembly, Policy, Shape, assemble, covered_chain, head, recap_at_level, rungs, tail
from otaku_ctx.build import renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.model import Story
from otaku_ctx.pricing import TemplatePricer
from otaku_ctx.replay import story_at
from otaku_ctx.tokens import make_counter

STABLE = Policy("stable", 0.15)
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


@settings(max_examples=15)
@given(chained_stories(), shapes, st.floats(0.05, 1.2), st.sampled_from(["text", "messages"]))
def test_stable_prompts_are_candidates_within_the_limit(s: Story, shape: Shape, fraction: float, emit: str) -> None:
    whole = sum(len(m.content) // 3 + 8 for m in s.messages) + 50
    a, counted = assemble_at(s, shape, max(1, int(whole * fraction)), STABLE, emit)
    check_invariants(s, a)
    if a.refusal is None:
        assert counted == a.tokens <= a.limit
        assert_candidate(s, shape, a)


@settings(max_examples=10)
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


def test_the_stable_shape_never_steps_back_and_changes_rarely(long_story: Story) -> None:
    """On a story under window pressure, turn by turn: covered scenes and level never move
    backward, and the shape changes at most once a scene (the chain must follow the ladder)."""
    shape, window = Shape(), 40_000
    seen: list[tuple[int, int]] = []
    for n in range(240, 319, 13):
        a, counted = assemble_at(story_at(long_story, n), shape, window, STABLE)
        assert a.refusal is None and counted <= window
        covered = len(a.summaries) + (a.level if a.history else 0)
        seen.append((covered, a.level))
    assert seen == sorted(seen)
    assert len(set(seen)) <= 1 + (318 - 240) // 15


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
