"""A reply is checked against its scene before it is written (summarize/checks.py): the junk a
small model really sent (issue 27, SmolLM2-135M behind llama-server) is rejected, a plain
summary of the scene is not."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from otaku_ctx.config import SummarizeSettings
from otaku_ctx.story.model import Message, Story
from otaku_ctx.summarize import prompts_of
from otaku_ctx.summarize.checks import Scene, looping, rejected
from otaku_ctx.summarize.replies import field_of
from otaku_ctx.tokens import make_counter

FIXTURES = Path(__file__).parent / "fixtures"

LINES = [
    ("user", "Mara", "I climb the last of the stairs. Is the lamp still lit, Keeper?"),
    ("assistant", "Keeper", "Keeper Alder wipes the glass. 'Lit since your father's day. Sit, the logbook waits.'"),
    ("user", "Mara", "I open the logbook at the page with the torn corner and read the name Ilya aloud."),
    ("assistant", "Keeper", "The old man goes still. 'Ilya rowed out the night the bell rang. He never came back.'"),
]
STORY = Story(
    path=Path("scene.jsonl"),
    messages=tuple(Message(i, role, text, name) for i, (role, name, text) in enumerate(LINES, start=1)),
)  # fmt: skip
PROMPTS = prompts_of(SummarizeSettings(), make_counter("estimate"))
SCENE = PROMPTS.summary_check(STORY, (1, 4))
GOOD = (
    "Mara climbs to the lamp room, where Keeper Alder keeps the lamp lit. In the logbook she finds the name "
    "Ilya, and the Keeper tells her Ilya rowed out the night the bell rang and never came back."
)


def verdict(reply: str, kind: str = "summary") -> str | None:
    """Why the `kind` field of `reply` is not written, as the summarizer judges it (None: written)."""
    text = field_of(reply, kind)
    if not text:
        return "no usable text"
    if kind == "history":
        return rejected(kind, text, PROMPTS.history_check(STORY, (1, 4), GOOD, "The logbook"), also="")
    return rejected(kind, text, SCENE)


def test_a_summary_of_the_scene_is_written() -> None:
    assert verdict(json.dumps({"title": "The logbook", "summary": GOOD})) is None
    assert rejected("title", "The logbook", SCENE) is None


@pytest.mark.parametrize(
    "reply",
    [
        # issue 27's scene 1: the old prompt's instructions, returned as the summary
        "The recap of this scene only, in the order things happened, at most 400 words. Once the scene scrolls "
        "out of the model's view, this summary is all that is left of it: someone who never read the scene must "
        "be able to continue the story from it.",
        # issue 27's scene 2: words about the format, naming no one
        "A few words about the recap: 1) The story ends with a summary of the whole scene; 2) You can read the "
        "entire story in one JSON object. 3) Nothing else is needed.",
        # the bundled example's answer with no repeat penalty: one line, about 100 times
        "The Last of the Redcaps:\n" * 100,
        "The Last of the Redcaps: " * 100,
        # and the film it then wrote about
        "The Last of the Redcaps is a 2019 science fiction film written and directed by Michael Cera.",
    ],
)
def test_the_junk_a_small_model_sent_is_rejected(reply: str) -> None:
    assert verdict(json.dumps({"title": "T", "summary": reply})) is not None


def test_the_copied_placeholder_object_is_rejected() -> None:
    copied = '{ "title": "A few words naming the scene", "summary": "The recap" }'
    assert verdict(copied) is not None
    assert rejected("title", "The recap", SCENE) is not None


def test_the_history_placeholder_is_rejected() -> None:
    assert verdict('{"history": "the new story so far"}', "history") is not None
    good = f"{GOOD} Mara stays the night in the tower."
    assert verdict(json.dumps({"history": good}), "history") is None


def test_a_loop_is_named_and_prose_is_not_a_loop() -> None:
    assert "repeated" in (looping("The Last of the Redcaps:\n" * 100) or "")
    assert looping(GOOD) is None
    assert looping("She waits.\nHe waits.\nThe tide comes in.") is None


def test_the_eta_halfway_is_within_30_percent_of_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose time is proportional to the prompt (as a real one's prefill is): a scene's
    request takes many times a history's. Once half the planned prompt tokens are done, the ETA
    is within ±30 % of the time the rest then really takes (a clock of the test's own)."""
    from otaku_ctx.backend import Reply
    from otaku_ctx.summarize import Cutting, Options, Progress, Prompts, plan, run

    lines = [("user" if i % 2 else "assistant", "Mara" if i % 2 else "Keeper", LINES[i % 4][2]) for i in range(240)]
    story = Story(Path("s.jsonl"), tuple(Message(i, r, t, n) for i, (r, n, t) in enumerate(lines, start=1)))
    options = Options(cutting=Cutting(settle=10, min_chars=1500, min_messages=10))
    prompts = Prompts(PROMPTS.summary, PROMPTS.history, options, make_counter("estimate"))
    chosen = plan(story, [], prompts, 8192, "test")
    assert {r.kind for r in chosen.requests} == {"summary", "history"}
    now = [0.0]
    clock = importlib.import_module("otaku_ctx.summarize.run")
    monkeypatch.setattr(clock, "time", SimpleNamespace(monotonic=lambda: now[0]))
    seen: list[tuple[float, float | None, int, int]] = []

    class Server:
        url, model = "http://stand-in/v1", "stand-in"

        def chat(self, messages: list[dict[str, str]], **_: object) -> Reply:
            now[0] += sum(len(m["content"]) for m in messages) / 1000  # a second per 1,000 characters
            if "Until now:" in messages[-1]["content"]:
                return Reply(json.dumps({"history": GOOD}), "stop", 1, 1)
            return Reply(json.dumps({"title": "The logbook", "summary": GOOD}), "stop", 1, 1)

    progress = Progress(started=0.0)  # on the test's clock

    def watch(p: Progress) -> None:
        seen.append((now[0], p.eta, p.worked, p.work))

    run(chosen, Server(), prompts, lambda records: None, progress, watch)  # type: ignore[arg-type]
    halfway = next(s for s in seen if s[2] * 2 >= s[3] and s[1] is not None)
    left = now[0] - halfway[0]
    assert halfway[1] is not None and abs(halfway[1] - left) <= 0.3 * left, (halfway, left)


def test_a_scene_written_without_spaces_is_judged_by_its_names_alone() -> None:
    """Japanese has no spaces between words: the share of the scene's words cannot be counted,
    so a summary naming the scene's people is written; one naming no one is still turned down."""
    from otaku_ctx.summarize.checks import Scene

    scene = Scene.of(
        "[1] 真理: 灯台の階段を上って、日誌を開いた。\n[2] 守人: イリヤはあの夜、船を出した。", ["真理", "守人"], ""
    )
    assert rejected("summary", "真理は灯台で日誌を読み、守人はイリヤの話をした。", scene) is None
    assert rejected("summary", "美しい物語が始まる。", scene) is not None


# What SmolLM2-135M at ctx's defaults wrote for otaku's tour (tests/realserver) that the checks
# let through before; each is set in this file's scene (its names for the tour's), beside the
# same reply without its fault, which is written.
@pytest.mark.parametrize(
    ("junk", "fixed", "why"),
    [
        (  # a title for a summary: "The Redemption of Odalric: A Tale of Two Lives"
            "The Lamp of Keeper Alder: A Tale of Two Lives",
            "Mara reads the name Ilya in the logbook, and Keeper Alder tells her of the night the bell rang.",
            "written like a title",
        ),
        (  # "The 3rd of Frost, the VERMILION PLAYERS"
            "The Logbook, the TORN CORNER",
            "Mara finds the logbook with the torn corner and reads the name Ilya aloud to Keeper Alder.",
            "too short",
        ),
        (  # "In 1923, a young man named Vessendal, who was a part of the company's payroll, …"
            "In 1923, Keeper Alder tells Mara that Ilya rowed out the night the bell rang and never came back.",
            "Keeper Alder tells Mara that Ilya rowed out the night the bell rang and never came back.",
            "a year the scene does not",
        ),
        (  # "The story of a man who was sent to the palace by his father to tell him of his own destiny, …"
            "The story of Ilya who rowed out the night the bell rang and never came back to the lamp, and " * 12,
            "The story of Ilya, who rowed out the night the bell rang and never came back to the lamp.",
            "four-word phrases repeat",
        ),
    ],
)
def test_the_junk_the_checks_let_through_before_is_rejected(junk: str, fixed: str, why: str) -> None:
    assert why in (verdict(json.dumps({"title": "T", "summary": junk})) or "")
    assert verdict(json.dumps({"title": "T", "summary": fixed})) is None


def test_a_name_is_named_as_it_is_written_and_only_a_name_is_one() -> None:
    """A scene's named characters are its capitalised words that are no sentence's first and
    never written lower-case in it, and a reply names one only as a name is written: "the
    palace" does not name the Palace, nor "I'm" anyone ("This is a very good find, and I'm glad
    to see you're taking care of it," was written for a scene of the dated dialogue)."""
    from otaku_ctx.summarize.checks import Scene

    text = (
        "[1] Mara: I'm at the gate of the Palace on Friday, and the Rules of the guard say nothing.\n"
        "[2] Keeper: I'd wait. The rules are old, and the guard at the gate sleeps."
    )
    scene = Scene.of(text, ["Mara", "Keeper"], "")
    assert scene.names == {"mara", "keeper", "palace"}  # not I'm, I'd, Friday, nor Rules (also "rules")
    lower = "a man waits at the gate of the palace while the guard sleeps, and the rules of the guard are old."
    assert rejected("summary", lower, scene) == "it names no one of the scene"
    assert rejected("summary", lower.replace("the palace", "the Palace"), scene) is None
    glad = "This is a very good find, and I'm glad to see you're taking care of the gate, I'd say, at the guard."
    assert rejected("summary", glad, scene) == "it names no one of the scene"


def test_a_new_noun_or_a_names_other_case_is_no_invented_name_outside_english() -> None:
    """A German summary words its nouns its own way (Leuchtturm, Seekarte, Erbe: capitalised, as
    every German noun is, and not in the scene), a Russian one writes a name in another case
    (Марой for Мара): read as English, those are names the scene never has; a scene that does
    not read as English is not held to the names rule, and each summary passes."""
    from otaku_ctx.summarize.checks import Scene

    german = Scene.of(
        "[1] Mara: Ich steige die letzte Treppe hinauf. Brennt die Lampe noch, Wärter?\n"
        "[2] Keeper: Der Wärter wischt die Linse ab und sagt, dass die Flut heute Nacht früher kommt.\n"
        "[3] Mara: Ich frage ihn nach dem Brief meines Vaters, und er holt eine Kiste aus dem Schrank.\n"
        "[4] Keeper: In der Kiste liegen drei Briefe, ein Schlüssel und eine Karte der Küste.",
        ["Mara", "Keeper"],
        "Summarize the scene.",
    )
    told = (
        "Mara steigt zum Leuchtturm hinauf und fragt den Wärter nach dem Nachlass ihres Vaters. Der Alte warnt "
        "vor der Springflut, holt eine Kiste mit drei Briefen, einem Schlüssel und einer Seekarte und gibt Mara "
        "das Erbe."
    )
    russian = Scene.of(
        "[1] Мара: Корабль пришёл поздно ночью. Я видела его в порту, у старого причала.\n"
        "[2] Илья: Значит, капитан не соврал. Мы пойдём к причалу ночью, пока стража спит.\n"
        "[3] Мара: Возьми фонарь и верёвку. Я пойду с тобой до самого конца причала.",
        ["Мара", "Илья"],
        "Summarize the scene.",
    )
    said = "Мара говорит Илье, что корабль пришёл ночью в порт. Вместе с Марой Илья решает пойти ночью к причалу."
    for scene, summary in ((german, told), (russian, said)):
        assert not scene.english and rejected("summary", summary, scene) is None
        as_english = Scene(scene.text, scene.names, scene.instructions)
        assert "names what the scene never does" in (rejected("summary", summary, as_english) or "")


def test_a_summary_writing_as_digits_what_its_scene_spells_out_passes() -> None:
    """ "5,000 crowns" for "five thousand crowns", "10:30" for "half past ten": four numbers the
    scene does not hold, each one number, in 49 words, a faithful summary; the same words with
    a string of times in them are not."""
    from otaku_ctx.summarize.checks import Scene

    scene = Scene.of(
        "[1] Mara: The fence wants five thousand crowns for the ledger, half now and half at the docks.\n"
        "[2] Ilya: Five thousand? We have two and a half at most. And the ship sails at half past ten.\n"
        "[3] Mara: Then we sell the necklace. It fetched twelve hundred last winter.\n"
        "[4] Ilya: Fine. Meet me at the docks before ten, and bring the ledger's copy.",
        ["Mara", "Ilya"],
        "Summarize the scene.",
        400,
    )
    told = (
        "Mara tells Ilya the fence wants 5,000 crowns for the ledger, half now and half at the docks. They have "
        "only 2,500, so Mara plans to sell the necklace, which fetched 1,200 last winter; Ilya agrees and they "
        "will meet at the docks before the ship sails at 10:30."
    )
    assert rejected("summary", told, scene) is None
    timed = told.replace("last winter", "last winter 1:35: 7:35: 2:47: 3:38:")
    assert "numbers the scene does not hold" in (rejected("summary", timed, scene) or "")


def test_a_summary_as_short_as_asked_is_not_too_brief() -> None:
    """`summary_words = 20` for a scene of a thousand words: a summary of 20 words is what was
    asked (the floor is half the words asked, not 30), one of 8 is too brief."""
    import dataclasses

    from otaku_ctx.story.detect import read_story

    tour = read_story(Path(__file__).parent / "fixtures" / "otaku" / "tour.md")
    scene = PROMPTS.summary_check(Story(path=tour.path, messages=tour.messages[:20]), (1, 20))
    asked = dataclasses.replace(scene, words=20)
    told = "Bell Harrow joins Odalric Vane's touring company at the Corona, and Vane sets her on the prompt book."
    assert len(told.split()) <= 20 and rejected("summary", told, asked) is None
    assert "too brief" in (rejected("summary", "Bell Harrow joins Vane's company at the Corona.", asked) or "")


def test_a_summary_too_brief_for_its_scene_is_rejected() -> None:
    """What SmolLM2-135M wrote for the tour's twenty-message scene at `repeat_penalty` 1.1, and
    the checks let through before: eleven words for a scene of a thousand (checks.brief). The
    same words stand for a scene of four lines, and any summary of `BRIEF_FLOOR` words does."""
    from otaku_ctx.story.detect import read_story
    from otaku_ctx.summarize.checks import BRIEF_FLOOR

    tour = read_story(Path(__file__).parent / "fixtures" / "otaku" / "tour.md")
    story = Story(path=tour.path, messages=tour.messages[:20])
    scene = PROMPTS.summary_check(story, (1, 20))
    vacuous = "A scene set by the 3rd of Frost, the VERMILION PLAYERS, Bell Harrow"
    assert "too brief for its scene" in (rejected("summary", vacuous, scene) or "")
    fifth = Message(5, "user", "Bell Harrow: the 3rd of Frost, the Vermilion Players.", "Mara")
    short = PROMPTS.summary_check(Story(path=STORY.path, messages=(*STORY.messages, fifth)), (1, 5))
    assert rejected("summary", vacuous, short) is None
    told = (
        "Bell Harrow comes in out of the rain to the Corona with the notice for a stage manager; Emeran Falk, "
        "awake over his brandy, takes her on, and she asks for the prompt book and the plot tables tonight."
    )
    assert len(told.split()) >= BRIEF_FLOOR and rejected("summary", told, scene) is None


def test_the_scene_summaries_of_otakus_sample_stories_pass_every_check() -> None:
    """What a good summary is, for the thresholds: the scenes otaku's sample stories carry
    (tests/fixtures/otaku, written by a large model) are each written, summary and title, against
    their own messages. A check made stricter than its docs/summarize.md rule (a larger SCENE_WORD_SHARE,
    a smaller WORDS_PER_NAME) turns one of them down and fails here."""
    from otaku_ctx.story.detect import read_story

    checked = 0
    for name in ("tour.md", "river.md"):
        story = read_story(Path(__file__).parent / "fixtures" / "otaku" / name)
        for s in story.scenes:
            scene = PROMPTS.summary_check(story, (s.start, s.end))
            assert rejected("summary", s.summary, scene) is None, (name, s.id)
            assert rejected("title", s.title, scene) is None, (name, s.id)
            checked += 1
    assert checked == 17


# The thresholds of each ctx that wrote a reply of accepted-replies.json to the sidecar, where
# they differ from today's (math.inf: the rule was not there).
AT_3E5403C = {"SCENE_WORDS_PER_WORD": 50, "REPEAT_SHARE": 0.5, "NUMBER_SHARE": math.inf, "INVENTED_SHARE": math.inf}
THEN = {"ctx 3e5403c": AT_3E5403C, "ctx before checks.overlong": {**AT_3E5403C, "OVERLONG": math.inf}}


def test_what_smollm2_wrote_that_an_earlier_ctx_let_through_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies the real model sent for issue 27's tour chat and dated dialogue
    (tests/fixtures/smollm2/accepted-replies.json, verbatim) that the checks of their day wrote
    to the sidecar, each set against what it answered as the summarizer sets it (a history: the
    scene's summary and title, and the history before it): each is turned down now, and each
    passes again at the thresholds of the ctx that wrote it."""
    from otaku_ctx.story.detect import read_story
    from otaku_ctx.summarize import checks

    otaku = str(FIXTURES / "otaku")
    sys.path.insert(0, otaku)
    try:
        import make_tour_chat
    finally:
        sys.path.remove(otaku)
    chat = tmp_path / "tour.jsonl"
    chat.write_text(make_tour_chat.chat(), encoding="utf-8")
    stories = {"tour": read_story(chat), "dialogue": read_story(FIXTURES / "sillytavern" / "dated-dialogue.jsonl")}
    replies = json.loads((FIXTURES / "smollm2" / "accepted-replies.json").read_text(encoding="utf-8"))["replies"]
    assert len(replies) == 9

    def why(reply: dict[str, Any]) -> str | None:
        story, span = stories[reply["story"]], tuple(reply["scene"])
        if reply["part"] == "history":
            scene = PROMPTS.history_check(story, span, reply["summary"], reply["title"])
            return rejected("history", reply["text"], scene, reply["before"])
        return rejected(reply["part"], reply["text"], PROMPTS.summary_check(story, span))

    for reply in replies:
        assert why(reply) is not None, (reply["run"], reply["scene"], reply["part"])
        with monkeypatch.context() as then:
            for name, value in THEN[reply["accepted_by"]].items():
                then.setattr(checks, name, value)
            assert why(reply) is None, (reply["run"], reply["scene"], reply["part"])


# -- issue 36: extracts that keep the facts, and junk that does not roll on ----------------------


def test_the_extract_of_a_scene_of_greetings_and_facts_keeps_the_facts() -> None:
    from otaku_ctx.summarize.extract import summary_extract

    said = [
        ("Jon", "Hey Gina! How are you?"),
        ("Gina", "Hey Jon! Good to see you."),
        (
            "Jon",
            "Thanks, Gina! Lost my job as a banker yesterday, so I'm gonna take a shot at starting my own business.",
        ),
        ("Gina", "Woah, Jon! Unfortunately, I also lost my job at Door Dash this month."),
        ("Jon", "Yeah, Gina! We will be fine."),
        ("Gina", "Wow!"),
    ]
    messages = [Message(n, "user" if n % 2 else "assistant", text, name) for n, (name, text) in enumerate(said, 1)]
    extract = summary_extract(messages, 40)
    assert (
        "Jon: Lost my job as a banker yesterday" in extract
        and "Gina: Unfortunately, I also lost my job at Door Dash" in extract
    )
    assert "Hey" not in extract and "Woah" not in extract and "Wow" not in extract  # greetings tell nothing
    lines = extract.splitlines()
    assert lines.index(next(x for x in lines if "banker" in x)) < lines.index(
        next(x for x in lines if "Door Dash" in x)
    )
    assert summary_extract(messages, 40) == extract  # deterministic
    assert len(summary_extract(messages, 12).split()) <= 12 + 20  # within the words, the first sentence always


@pytest.mark.parametrize(
    ("text", "told"),
    [
        (
            'Hello there. "Who are you?" she asked... Then (quietly!) left',
            ["Hello there.", '"Who are you?"', "she asked...", "Then (quietly!)", "left"],
        ),
        ("雨が降った。彼は来なかった！「本当？」はい", ["雨が降った。", "彼は来なかった！", "「本当？」", "はい"]),
        ("v1.2 is out. e.g. this", ["v1.2 is out.", "e.g.", "this"]),  # a stop inside a word ends nothing
        ("...", ["..."]),
        ("", []),
    ],
)
def test_a_message_is_cut_into_its_sentences_at_its_ends_and_at_full_width_ends(text: str, told: list[str]) -> None:
    from otaku_ctx.summarize.extract import sentences

    assert sentences(text) == told


def test_a_text_with_no_sentence_end_is_one_sentence_within_the_words_and_characters() -> None:
    """Pasted text with no full stop, and Japanese with none (one "word" to a split): each is one
    sentence, cut at 30 words or 240 characters; and the text past the cut is never scanned
    again from each of its positions (issue 45: 4,000 words took 10 s, 100,000 messages never
    ended)."""
    from otaku_ctx.summarize.extract import MOST_SENTENCE_CHARS, MOST_SENTENCE_WORDS, sentences

    [english] = sentences(" ".join(f"word{k} and" for k in range(2000)))
    assert english.endswith("…") and len(english[:-1].split()) == MOST_SENTENCE_WORDS
    [japanese] = sentences("雨が降っていたので彼は港に来なかった" * 500)
    assert japanese.endswith("…") and len(japanese) == MOST_SENTENCE_CHARS + 1
    long_words = sentences(" ".join(["antidisestablishmentarianism"] * 29))
    assert len(long_words[0]) <= MOST_SENTENCE_CHARS + 1 and long_words[0].endswith("m…")  # cut at a space
    dots = sentences("." * 100_000 + "a")  # a run of stops before a letter: matched once, not from each dot
    assert dots == ["." * MOST_SENTENCE_CHARS + "…"]


def test_the_hey_ben_history_is_turned_down() -> None:
    """The history SmolLM2 wrote for a dialogue of Jon and Gina (issue 36), as it was."""
    ben = (
        "In a small town with no internet, people have to keep their phones connected all day long. In this"
        " strange and wonderful world of yours… Gina: How can that be? Gina: No idea. Ben: Ben! Ben: Hey Ben!"
        " Ben: Hey Ben! Ben: Hey Ben! Ben: Hey Ben! Ben: Hey Ben!!!"
    )
    scene = Scene.of(
        "Jon: Lost my job as a banker yesterday, so I'm gonna take a shot at starting my own business.\n"
        "Gina: Unfortunately, I also lost my job at Door Dash this month.\n" * 3,
        ["Jon", "Gina"],
        "Write the story so far.",
        120,
    )
    assert rejected("history", ben, scene, "Jon and Gina talked about losing their jobs.")
    invented = (
        "Jon and Gina lost their jobs. Then Ben, Jill, Nancy and Mia came to the office, and Ben told Jill"
        " that Nancy and Mia would start the business with Jon and Gina."
    )
    reason = rejected("history", invented, scene, "Jon and Gina talked about losing their jobs.")
    assert reason is not None and "names what the scene never does" in reason
