"""Each example of otaku's context design (seed 001) as a named test, with the seed's numbers.

A unit pricer gives each kind of part a round cost, so the fit tests read like the seed:
a message is 10 tokens, a card 3, a summary 100, a history 150.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from stories import story

from otaku_ctx.assemble import Assembly, Part, Shape, assemble, classify, covered_chain, rungs
from otaku_ctx.assemble.steps import ChainFound, FitsRendered, Tried
from otaku_ctx.report import describe, explain_refusal

COST = {"message": 10, "card": 3, "summary": 100, "history": 150}
SEED = Shape(head=20, min_tail=150, tail_step=50, tail_floor=50)
ROOMY = 10**9


@dataclass
class UnitPricer:
    fixed_cost: int = 0
    exact_calls: list[int] = field(default_factory=list)

    def fixed(self) -> int:
        return self.fixed_cost

    def part(self, part: Part, after=None) -> int:
        return COST[part.kind]

    def recap_part(self, part: Part) -> int:
        return COST[part.kind]

    def recap_opening(self, after=None) -> int:
        return 0

    def exact(self, assembly: Assembly) -> int:
        total = self.fixed_cost + sum(self.part(p) for p in assembly.parts)
        self.exact_calls.append(total)
        return total


def said(a: Assembly) -> list[str]:
    """The steps as the report writes them."""
    return [describe(step) for step in a.steps]


def numbers(messages) -> tuple[int, int]:
    return messages[0].number, messages[-1].number


def recap(a: Assembly) -> list[str]:
    out = []
    for p in a.recap:
        if p.kind == "card":
            out.append(f"card {p.message.number}")
        else:
            out.append(f"{p.kind} {p.scene.ref}")
    return out


SCENES_220 = [(1, 25), (26, 42), (43, 64), (65, 95)]


def test_case_1_short_story_is_all_verbatim():
    """Fewer messages than 20 + 150 = 170: everything verbatim, even with summaries."""
    s = story(160, [(1, 40), (41, 80)])
    a = assemble(s, SEED, ROOMY, UnitPricer())
    assert a.case == 1
    assert numbers(a.head) == (1, 20)
    assert numbers(a.tail) == (21, 160)
    assert a.recap == ()


def test_case_2_no_summary_yet_is_all_verbatim():
    s = story(220, SCENES_220, summarized=[])
    a = assemble(s, SEED, ROOMY, UnitPricer())
    assert a.case == 2
    assert numbers(a.head) == (1, 20) and numbers(a.tail) == (21, 220)
    assert a.recap == ()
    assert "scene 1 has no summary" in said(a)[1]


def test_case_3_option_a():
    """220 messages; 220 − 150 = 70, and scene 4 (65–95) holds it, so the tail starts at 65."""
    s = story(220, SCENES_220)
    a = assemble(s, SEED, ROOMY, UnitPricer())
    assert a.case == 3
    assert numbers(a.head) == (1, 20)
    assert recap(a) == ["summary 1", "summary 2", "summary 3"]
    assert numbers(a.tail) == (65, 220)
    assert "not before message 70 (220 − 150)" in said(a)[1]


def test_case_3_option_b_only_two_scenes_summarized():
    s = story(220, SCENES_220, summarized=[1, 2])
    a = assemble(s, SEED, ROOMY, UnitPricer())
    assert a.case == 3
    assert recap(a) == ["summary 1", "summary 2"]
    assert numbers(a.tail) == (43, 220)


def test_case_3_card_at_message_47_stands_before_its_scene_summary():
    s = story(220, SCENES_220, cards=[47])
    a = assemble(s, SEED, ROOMY, UnitPricer())
    assert a.case == 3
    assert recap(a) == ["summary 1", "summary 2", "card 47", "summary 3"]
    assert numbers(a.tail) == (65, 220)


def test_covered_chain_is_the_seed_chain():
    s = story(220, SCENES_220)
    assert [sc.ref for sc in covered_chain(s, SEED, 150).scenes] == [1, 2, 3]
    assert [sc.ref for sc in covered_chain(s, SEED, 100).scenes] == [1, 2, 3, 4]


# Case 4: 728 messages, 12 scenes of 48; cards at 60 (scene 2), 150 (scene 4), 300 (scene 7).
SCENES_728 = [(48 * (k - 1) + 1, 48 * k) for k in range(1, 13)]
CARDS_728 = [60, 150, 300]


def case4_story(**kw):
    return story(728, SCENES_728, cards=CARDS_728, **kw)


def test_case_4_history_of_scene_4_replaces_summaries_1_to_4():
    """Head 200 + tail 577–728 (152 × 10) + cards 9 = 1,729; level k adds 150 + 100 × (12 − k).
    Level 3 is 2,779 and level 4 is 2,679: with a limit of 2,700, level 4 wins."""
    s = case4_story()
    pricer = UnitPricer()
    a = assemble(s, SEED, 2700, pricer)
    assert a.case == 4
    assert a.level == 4
    assert numbers(a.head) == (1, 20)
    assert recap(a) == (
        ["card 60", "card 150", "history 4"]
        + [f"summary {k}" for k in (5, 6)]
        + ["card 300"]
        + [f"summary {k}" for k in range(7, 13)]
    )
    assert [m.number for m in a.floated_cards] == [60, 150]
    assert a.history.ref == 4
    assert numbers(a.tail) == (577, 728)
    assert a.tokens == 2679
    assert any(step.startswith("level 3:") and "2,779 > 2,700" in step for step in said(a))
    assert any(step.startswith("level 4:") and "2,679 ≤ 2,700" in step for step in said(a))
    assert pricer.exact_calls == [2679]  # only the winner is rendered and counted


def test_case_4_level_without_history_does_not_exist():
    s = case4_story(histories=[k for k in range(1, 13) if k != 4])
    a = assemble(s, SEED, 2700, UnitPricer())
    assert a.level == 5
    assert "level 4: scene 4 has no history — skipped" in said(a)
    assert [m.number for m in a.floated_cards] == [60, 150]


def test_case_4_cards_float_in_story_order_when_all_scenes_drop():
    s = case4_story()
    a = assemble(s, SEED, 1729 + 150, UnitPricer())
    assert a.level == 12
    assert recap(a) == ["card 60", "card 150", "card 300", "history 12"]


def test_case_5_tail_drops_150_to_100():
    """At target 150 (scenes 1–12 covered, tail 577–728) even level 12 is 200 + 1,520 + 150 =
    1,870 > 1,500. At 100, scene 13 (577–624) is covered too and the tail is 625–728: level 12
    (history 12, summary 13) is 200 + 1,040 + 150 + 100 = 1,490 ≤ 1,500."""
    scenes = [(48 * (k - 1) + 1, 48 * k) for k in range(1, 15)]  # 14 scenes to 672
    s = story(728, scenes)
    a = assemble(s, SEED, 1500, UnitPricer())
    assert a.case == 5
    assert a.tail_target == 100
    assert numbers(a.tail) == (625, 728)
    assert a.history.ref == 12
    assert [sc.ref for sc in a.summaries] == [13]
    assert a.tokens == 1490


def test_case_5_tail_drops_to_the_floor_of_50():
    scenes = [(48 * (k - 1) + 1, 48 * k) for k in range(1, 15)]
    s = story(728, scenes)
    a = assemble(s, SEED, 1000, UnitPricer())
    assert a.case == 5
    assert a.tail_target == 50
    assert numbers(a.tail) == (673, 728)
    assert any(step.startswith("tail target 100") for step in said(a))


def test_rungs_are_150_100_50():
    assert rungs(SEED) == [150, 100, 50]
    assert rungs(Shape(min_tail=120, tail_step=50, tail_floor=50)) == [120, 70, 50]
    assert rungs(Shape(min_tail=30, tail_floor=50)) == [30]


def test_case_6_refuses_and_says_why():
    s = case4_story(histories=[])
    a = assemble(s, SEED, 500, UnitPricer(), reserve=1000)
    assert a.case == 6
    r = a.refusal
    assert r is not None
    # At the floor (50): scenes up to 672 is not possible (12 scenes end at 576), so the
    # smallest is head 200 + tail 577–728 1,520 + cards 9 + 12 summaries 1,200 = 2,929.
    assert r.smallest == 2929
    assert r.needed_context == 3929
    assert r.missing_histories == tuple(range(1, 13))
    assert "2,929" in explain_refusal(r) and "3,929" in explain_refusal(r)


def test_case_6_names_the_scene_without_a_summary():
    s = story(728, SCENES_728, summarized=[1, 2, 3, 5, 6])
    a = assemble(s, SEED, 100, UnitPricer())
    assert a.case == 6
    assert a.refusal.missing_summaries[0] == 4
    assert "scenes without a summary: 4" in explain_refusal(a.refusal)


def test_the_exact_count_can_overrule_the_estimate():
    """A candidate that fits by its parts but renders larger is rejected, never emitted."""

    class Sneaky(UnitPricer):
        def exact(self, assembly: Assembly) -> int:
            return super().exact(assembly) + (1000 if assembly.level == 4 else 0)

    a = assemble(case4_story(), SEED, 2700, Sneaky())
    assert a.level == 5
    assert any(step.startswith("level 4:") and step.endswith("> 2,700 tokens (rendered)") for step in said(a))


@pytest.mark.parametrize("limit", [2700, 2000, 1500])
def test_fit_is_to_the_token(limit):
    a = assemble(case4_story(), SEED, limit, UnitPricer())
    if a.case != 6:
        assert a.tokens <= limit


def test_a_run_of_levels_without_history_is_one_step():
    a = assemble(case4_story(histories=[12]), SEED, 2700, UnitPricer())
    assert a.level == 12
    assert "levels 1–2 cannot fit: the summaries they keep alone exceed the room" in said(a)
    assert "levels 3–11: scenes 3–11 have no history — skipped" in said(a)


@dataclass
class GenerousPricer(UnitPricer):
    """Prices each part high, but the rendered prompt counts less: only the fallback at the
    floor (which renders the smallest candidate) finds that it fits."""

    def part(self, part: Part, after=None) -> int:
        return 100

    def exact(self, assembly: Assembly) -> int:
        return 10 * len(assembly.parts)


def test_a_short_story_is_case_1_however_it_fits():
    """30 messages, no scenes: case 1 with room to spare, and still case 1 when only the
    rendered count at the floor shows that it fits (it used to be called case 2 there)."""
    s = story(30, [])
    roomy = assemble(s, SEED, ROOMY, GenerousPricer())
    tight = assemble(s, SEED, 300, GenerousPricer())
    assert roomy.case == tight.case == 1
    assert any(isinstance(step, FitsRendered) for step in tight.steps)
    assert not any(isinstance(step, FitsRendered) for step in roomy.steps)
    assert tight.tokens == 300 and tight.refusal is None


@pytest.mark.parametrize(
    ("n", "recap", "target", "level", "refused", "case"),
    [
        (30, False, 150, 0, False, 1),
        (30, False, 50, 0, False, 1),
        (220, False, 150, 0, False, 2),
        (220, False, 50, 0, False, 2),
        (220, True, 150, 0, False, 3),
        (220, True, 150, 2, False, 4),
        (220, True, 100, 0, False, 5),
        (220, True, 50, 3, False, 5),
        (220, True, 150, 0, True, 6),
    ],
)
def test_classify_names_the_case_from_the_result(n, recap, target, level, refused, case):
    from otaku_ctx.assemble import Refusal

    parts = (Part("summary", scene=story(220, SCENES_220).scenes[0]),) if recap else ()
    a = Assembly(
        messages=n,
        limit=100,
        reserve=0,
        recap=parts,
        tail_target=target,
        level=level,
        refusal=Refusal(1, 0, 0) if refused else None,
    )
    assert classify(a, SEED) == case


def test_steps_are_facts():
    """The search records data; sentences are the report's."""
    s = story(220, SCENES_220)
    a = assemble(s, SEED, ROOMY, UnitPricer())
    chain = next(step for step in a.steps if isinstance(step, ChainFound))
    assert chain.scenes == (1, 2, 3) and chain.messages == (1, 64) and chain.stop.kind == "reaches_tail"
    tried = [step for step in a.steps if isinstance(step, Tried)]
    assert [(t.level, t.fits) for t in tried] == [(0, True)]


# ── Case 6's remedy: `ctx summarize`, with the messages it would summarize (issue 17) ────


def test_case_6_of_a_story_with_no_scenes_says_which_messages_need_summaries():
    """1,000 messages, no scene: at the floor (50) the head is 1–20 and the tail 21–1,000
    (9,800 + 200 = 10,000 tokens); summaries could cover 21–949 (message 950 stays)."""
    from otaku_ctx.report import Remedy, remedy

    s = story(1000)
    a = assemble(s, SEED, 500, UnitPricer(), reserve=100)
    assert a.case == 6 and a.refusal.smallest == 10_000
    found = remedy(a, s, "chat.jsonl")
    assert found == Remedy(21, 949, "chat.jsonl")
    assert explain_refusal(a.refusal, "--window (now 600)", found) == (
        "nothing fits: the smallest prompt reached is 10,000 tokens, but the limit is 500 (600 minus a "
        "100-token reply reserve). Messages 21–949 are not covered by scene summaries (the summaries stop "
        "early: no scene holds message 21 (the first after the head)): run `ctx summarize chat.jsonl`. Or a "
        "context of at least 10,100 tokens would fit it as it is: raise --window (now 600)."
    )
    assert "run `ctx summarize chat.jsonl`" in describe(a.steps[-1], found)
    assert "ctx summarize" not in describe(a.steps[-1])  # without the story, the refusal as before


def test_case_6_remedy_starts_after_the_covered_scenes():
    """Scene 1 (1–300) is covered, and nothing after it: `ctx summarize` cuts from 301."""
    from otaku_ctx.report import Remedy, remedy

    s = story(1000, [(1, 300)])
    a = assemble(s, SEED, 500, UnitPricer())
    assert a.case == 6 and a.refusal.chain_stop.kind == "no_more"
    assert remedy(a, s) == Remedy(301, 949)
    assert Remedy(301, 949).command == "`ctx summarize` on the story's file"
    assert Remedy(301, 949, "-").command == "`ctx summarize` on the story's file"
    assert Remedy(301, 949, "my chat.jsonl").command == "`ctx summarize 'my chat.jsonl'`"


def test_case_6_remedy_across_a_stale_sidecar_scene():
    """A stale sidecar scene is left out, so a gap opens after the story's own scenes:
    `ctx summarize` redoes it, so the remedy stands."""
    from dataclasses import replace

    from otaku_ctx.report import Remedy, remedy

    s = story(1000, [(1, 300), (401, 500)])
    s = replace(s, scenes=(s.scenes[0], replace(s.scenes[1], source="sidecar")))
    a = assemble(s, SEED, 500, UnitPricer())
    assert a.refusal.chain_stop.kind == "gap"
    assert remedy(a, s) == Remedy(301, 949)


@pytest.mark.parametrize(
    ("scenes", "summarized", "stop"),
    [
        ([(1, 100), (101, 200)], [1], "no_summary"),  # the story's scene 2 has no summary
        ([(1, 100), (151, 200)], None, "gap"),  # messages 101–150 belong to none of its scenes
        ([(40, 60)], None, "no_start"),  # no scene holds message 21, but one lies after it
    ],
)
def test_case_6_has_no_summarize_remedy_where_the_storys_own_scenes_stand_in_the_way(scenes, summarized, stop):
    from otaku_ctx.report import remedy

    s = story(1000, scenes, summarized=summarized)
    a = assemble(s, SEED, 500, UnitPricer())
    assert a.case == 6 and a.refusal.chain_stop.kind == stop
    assert remedy(a, s, "chat.jsonl") is None


def test_case_6_has_no_remedy_when_summaries_would_not_help():
    from otaku_ctx.report import remedy

    s = story(728, [(48 * (k - 1) + 1, 48 * k) for k in range(1, 16)])  # scenes up to the tail's edge
    a = assemble(s, SEED, 100, UnitPricer())
    assert a.case == 6 and a.refusal.chain_stop is None and remedy(a, s) is None
    s = story(1000)
    a = assemble(s, SEED, -100, UnitPricer(), reserve=200)  # the reserve leaves no room at all
    assert a.refusal.limit <= 0 and remedy(a, s) is None
