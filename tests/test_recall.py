"""Recall (issue 36): seed 000's older-message and history pools — the caps, the newest-10
rule, where recalled text goes, what the stable policy keeps, and that it never refuses."""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import test_serve

from otaku_ctx.assemble import Assembly, Part
from otaku_ctx.assemble.recall import NEWEST, Recall, candidates, fill, rank
from otaku_ctx.build import Built, Pipeline
from otaku_ctx.config import ContextSettings, ModelSettings, PromptSettings, Settings
from otaku_ctx.report import describe
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running
from otaku_ctx.story.model import Message, Scene, Story

FILLER = ["We talked about the weather and the week, nothing much.", "The week was long and the weather was grey."]
FACT = "My sister Odile moved to Tallinn last week."
QUESTION = "Remind me, which sister moved to Tallinn?"


def story(n: int = 200, fact_at: int = 30, facts: dict[int, str] | None = None, scene: int = 10) -> Story:
    """`n` messages of small talk by turns (Mara, Tobias), the fact at `fact_at` and more at
    `facts`, the question last; a scene every `scene` messages with a plain summary and history."""
    said = {fact_at: FACT, n: QUESTION, **(facts or {})}
    messages = tuple(
        Message(i, "user" if i % 2 else "assistant", said.get(i, FILLER[i % 2]), "Mara" if i % 2 else "Tobias")
        for i in range(1, n + 1)
    )
    summary, history = "Mara and Tobias talked about the week.", "Mara and Tobias talked, week after week."
    starts = [start for start in range(1, n + 1, scene) if start + scene - 1 < n]
    scenes = tuple(Scene(k + 1, a, a + scene - 1, k + 1, "", summary, history) for k, a in enumerate(starts))
    return Story(path=Path("t.jsonl"), messages=messages, scenes=scenes, system="Talk.", source_format="native")


def settings(window: int = 900, recall: float = 0.2, cache: str = "exact", template: str = "default") -> Settings:
    context = ContextSettings(
        head_messages=4, min_tail_messages=20, tail_step=10, tail_floor=10, reply_reserve=0, recall=recall, cache=cache
    )
    model = ModelSettings(window=window, tokenizer="estimate")
    return Settings(context=context, model=model, prompt=PromptSettings(template=template))


def test_a_late_question_recalls_the_early_message_that_answers_it() -> None:
    told = story()
    without = Pipeline(settings(recall=0)).build(told)
    built = Pipeline(settings()).build(told)
    assert without.prompt is not None and FACT not in without.prompt  # the cases alone leave it out
    assert built.prompt is not None and FACT in built.prompt
    a = built.assembly
    assert a.recap and [p.message.number for p in a.recall if p.message] == [30]
    assert a.tokens <= a.limit == without.assembly.limit
    # just before the newest user message (199: Tobias asks at 200), headed with what it is
    texts = [b.text for b in built.blocks]
    at = next(i for i, t in enumerate(texts) if t.startswith("[Earlier, message 30 · Tobias]\n" + FACT))
    assert texts[at - 1].endswith(told.messages[197].content) and texts[at + 1].endswith(told.messages[198].content)
    said = describe(a.steps[-1])
    assert said.startswith("recall: 1 of") and "message 30 (Tobias): moved, sister, tallinn" in said


def test_the_caps_bound_each_pool() -> None:
    """60 older messages and 14 left-out summaries share a rare word with the question: 50 and
    10 are taken, whatever the budget."""
    codes = [f"code{i:03}" for i in range(6, 126, 2)]  # each said once, early, and all asked at the end
    weeks = [f"week{s:03}" for s in range(1, 41)]
    asked = {400: "Remind me: " + " ".join([*codes, *weeks])}
    told = story(400, facts={i: f"I saw {code}." for i, code in zip(range(6, 126, 2), codes, strict=True)} | asked)
    scenes = tuple(replace(s, summary=f"Mara spoke of {weeks[s.order - 1]}.") for s in told.scenes)
    told = replace(told, scenes=scenes)
    head, tail = told.messages[:4], told.messages[-20:]
    recap = tuple(Part("summary", scene=s) for s in scenes[-5:-2])
    a = Assembly(len(told), 100_000, 0, head=head, recap=recap, tail=tail)
    ranked = rank(candidates(told, a, len(told)), told.messages[-NEWEST:])
    assert sum(r.part.message is not None for r in ranked) > 50 and sum(r.part.scene is not None for r in ranked) > 10

    class Free:  # every part a token
        def recap_part(self, part: Part) -> int:
            return 1

    chosen = fill(ranked, 10_000, Free(), Recall(0.5))  # type: ignore[arg-type]
    assert sum(r.part.message is not None for r in chosen) == 50
    assert sum(r.part.scene is not None for r in chosen) == 10


def test_the_newest_ten_are_never_recalled_and_the_prompt_s_own_never_again() -> None:
    told = story(100)
    head, tail = told.messages[:4], told.messages[-3:]  # a tail shorter than ten
    shown = told.scenes[2]
    a = Assembly(len(told), 10_000, 0, head=head, recap=(Part("summary", scene=shown),), tail=tail)
    numbers = {p.message.number for p in candidates(told, a, len(told)).parts() if p.message}
    assert max(numbers) == len(told) - NEWEST and min(numbers) == 5  # not the head, not the newest ten
    scenes = [p.scene for p in candidates(told, a, len(told)).parts() if p.scene]
    assert shown not in scenes and scenes  # a summary the recap shows is not recalled again


def test_recall_never_makes_a_story_refused_nor_touches_one_that_fits() -> None:
    told = story(40)
    whole = Pipeline(settings(window=4000, recall=0.5)).build(told)
    assert not whole.assembly.recall  # every message would fit: nothing is kept back for recall
    assert whole.prompt == Pipeline(settings(window=4000, recall=0)).build(told).prompt
    tight = Pipeline(settings(window=380, recall=0)).build(story())
    assert tight.assembly.refusal is None  # fits only with the whole limit...
    assert Pipeline(settings(window=380, recall=0.5)).build(story()).prompt == tight.prompt  # ...and gets it


def test_each_turn_s_question_is_answered_and_the_prompt_before_it_holds() -> None:
    """Under either policy each turn's own newest messages ask: a question asked at 197 recalls
    what answers it at 197. What is recalled stands just before the newest user message, so
    under the stable policy the prompt up to it is the turn before's, whatever was recalled."""
    ferry = {190: QUESTION, 40: "I took the Bergen ferry on Sunday.", 197: "And which ferry did you take?"}
    told = story(200, facts=ferry)

    def turns(cache: str) -> list[Built]:
        pipeline = Pipeline(settings(cache=cache))
        built = [pipeline.build(replace(told, messages=told.messages[:n])) for n in (195, 197, 199)]
        assert len({(len(b.assembly.recap), b.assembly.level) for b in built}) == 1  # one shape throughout
        return built

    for cache in ("stable", "exact"):
        built = turns(cache)
        recalled = [{p.message.number for p in b.assembly.recall if p.message} for b in built]
        assert 30 in recalled[0] and 40 not in recalled[0] and 40 in recalled[1], cache
    stable = [[b.text for b in built.blocks] for built in turns("stable")]
    for before, after in itertools.pairwise(stable):
        kept = [t for t in before if not t.startswith("[Earlier")][:-2]  # less its question and open turn
        assert after[: len(kept)] == kept


@pytest.mark.parametrize("template", ["serene", "default"])
def test_serene_s_history_holds_what_was_recalled(template: str) -> None:
    built = Pipeline(settings(template=template, window=1100)).build(story())
    assert built.prompt is not None and "Odile" in built.prompt
    if template == "serene":  # its chat shows no system entry: the recalled message is in `history`
        start = built.prompt.index("Story history:")
        history = json.loads(built.prompt[built.prompt.index("[", start) : built.prompt.index("```", start + 20)])
        assert {"message": 30, "name": "Tobias", "text": FACT} in history


@pytest.mark.deep  # the whole tour replayed: two seconds
def test_the_tour_replayed_at_40k_keeps_its_prefix_with_recall_on() -> None:
    """Issue 36's check, as issue 43 placed the pools: `ctx replay` on otaku's tour (40k,
    stable, every 2 turns from where the window fills, serve's 0.03) reuses at least 90 % of the
    prompt before it in at least 85 % of turns (what is recalled, each turn's own, stands before
    the newest user message: the prompt up to it holds) — and recalls something on its way."""
    from test_cache_bound import configured, tour

    from otaku_ctx.assemble import Shape
    from otaku_ctx.replay import replay

    s = configured(Shape(), 40_000, "stable")
    s = replace(s, context=replace(s.context, recall=0.03))
    result = replay(tour(), s, first=143, every=2)
    kept = [t.reused >= 0.9 * t.tokens for t in result.compared if t.tokens]
    assert sum(kept) >= 0.85 * len(kept), (sum(kept), len(kept))
    recalled = Pipeline(s).build(tour()).assembly.recall
    assert recalled and all(p.kind == "recall" for p in recalled)


def test_the_word_index_follows_the_story_it_is_asked_of() -> None:
    """Kept from build to build while the messages are the same objects; a branch that shares
    its first messages' objects (a served chat's fork) and goes on otherwise is indexed as it
    is, and the first story again after it — each as a scan of its own messages finds."""
    from otaku_ctx.assemble.recall import WordIndex, words_of

    first = story(60)
    branch = replace(
        first,
        messages=first.messages[:25]
        + tuple(replace(m, content=f"I took the Bergen ferry, trip {m.number}.") for m in first.messages[25:]),
    )
    index = WordIndex(first.messages[0])
    for told in (first, branch, first, replace(first, messages=first.messages[:40])):
        index.cover(told.messages)
        for word in ("tallinn", "sister", "ferry", "bergen", "weather", "trip"):
            found = [m.number for m in told.messages if word in words_of(m.content)]
            assert list(index.holding(word, 1, len(told.messages))) == found, (word, len(told.messages))


stand_in = test_serve.stand_in  # the stand-in backend, as test_serve's tests have it


def test_serve_recalls_by_default_what_the_question_just_asked_needs(
    stand_in: test_serve.StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Through `ctx serve` with its defaults (recall 0.03): a fact said at message 30 and asked
    at the last user message, 170 messages on, is in the prompt forwarded at that very turn,
    just before the question; the log line and `/ctx/stats` name it by number, not by its words."""
    stand_in.window = 2048
    messages = test_serve.chat(200)
    messages[30]["content"] = "I took the Bergen ferry on Sunday, the one with the red funnel."
    running = Running(Service(test_serve.settings_for(stand_in.url)))
    try:
        with caplog.at_level(logging.INFO, logger="otaku_ctx.serve"):
            for n in (180, 190, 200):  # a chat played on; the question comes at its last turn
                asked = [*messages[: n + 1]]
                if n == 200:
                    asked[-1] = {"role": "user", "name": "Mara", "content": "Which ferry did you take, again?"}
                test_serve.client(running).chat.completions.create(model="m", messages=asked, max_tokens=100)
        sent = stand_in.bodies[-1]["messages"]
        at = next(i for i, m in enumerate(sent) if "Bergen ferry" in m["content"])
        assert sent[at]["content"].startswith("[Earlier, message 30 · Mara]") and sent[at + 1] == {
            "role": "user", "content": "Mara: Which ferry did you take, again?"}  # fmt: skip
        turns = json.loads(test_serve._get(running, "/ctx/stats"))["chats"][0]["turns"]
        assert "message 30" in turns[-1]["recalled"] and "message 30" not in turns[0]["recalled"]
        line = [r.getMessage() for r in caplog.records if "turn 3 ·" in r.getMessage()]
        assert line and "recalled message 30" in line[0] and "ferry" not in line[0]
        # the chat's length, and how many of its messages the prompt holds as written
        sent_as_written = turns[-1]["messages_sent"]
        assert 0 < sent_as_written < 200 and f"200 messages, {sent_as_written} sent" in line[0]
    finally:
        running.stop()
