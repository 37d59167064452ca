"""Recall (issue 36): is what a late message asks about, planted early, in the prompt?

A long dated two-person story of this script's making (`story()`: Mara and Tobias, 40 weekly
sessions of 20 messages, small talk drawn from a few hundred sentences), with 24 facts planted
in its first 30 sessions — each one message that holds it ("My sister Odile moved to Tallinn
last week, she starts at the port office.") — and asked in its last three sessions, one
question a user message, each answered by a reply that does not give the answer away. For
each question, the story up to it (its scenes those that have closed) is built at 8k and at
16k, the reply reserve 512, cl100k_base, the seed's numbers (head 20, tail 150 → 50):

- **ctx**: recall off (`--recall 0`), then on (`--recall 0.15`);
- **drop-oldest**: the newest messages that fit the same token count as ctx's prompt with
  recall on (a frontend's own truncation), the same system message first.

with the scenes' summaries two ways: **extracts** (ctx's own, `summarize.extract`: no model),
and **reference** summaries this script writes as a person would (what was said, with the
facts), each with a history rolled from them (`history_extract`). It counts, per question,
*answer present* (the answer's words are in the prompt) and *evidence verbatim* (the message
that holds the fact is in the prompt as it was written).

    python benchmarks/recall_bench.py          # the table (about 25 s)
    python benchmarks/recall_bench.py --smoke  # one window, 6 questions
    python benchmarks/recall_bench.py --serve  # the questions asked through ctx serve (about 10 s)

`--serve` (issue 43) asks them as a player does: the chat sent through `ctx serve` with its
defaults to a stand-in backend (serve_bench's, one prompt-cache slot), every user turn from
message 600 on, the whole chat each time, no summaries but serve's own extracts; it counts
the answers in the prompt forwarded at the turn each question is asked, against the newest
messages that fit the same tokens, and for every turn whether the prompt holds a story so far
and had ≥ 90 % of it cached. At 8k with a short frame and at 4k behind a 1,500-token frame
(2026-12-06): 19 and 13 of 24 (drop-oldest 1 and 0), a story so far in 100 of 100 turns at
both, ≥ 90 % cached on 96 % and 92 % of turns. With recall off it was 7 of 24 at 8k.

`--serve --meaning` (issue 46) asks them at 8k twice through serve: the keyword engine alone,
and recall by meaning fused with it — the real embedding model (tests/realserver/setup.sh's
all-MiniLM-L6-v2 on `llama-server --embeddings`), the chat's messages embedded once its first
turn named its vectors file (`ctx embed`'s work; with summaries off serve writes none). It
counts by kind: the *paraphrased* questions (sharing no content word with the message that
holds the answer: 6 of 24) and the others. Figures (2026-12-07): keywords alone 1/6 paraphrased
(17 %), 18/18 others; by meaning 3/6 (50 %), 18/18 others; 19 and 21 of 24 in all (drop-oldest
1); ≥ 90 % cached on 96 % of turns both. About 80 s.

Half the questions use the fact's own words ("Which sister of yours moved to Tallinn?"), half
other words ("Who was it in your family that went off to Estonia?"), and the small talk says the
facts' words of other things ("I should call my sister this week."). Figures (2026-12-06,
`--recall 0.1`; the story is fixed by its seed), answer present of 24 (of the 8 planted in the
first 12 weeks) · evidence verbatim of 24:

    | summaries | window | ctx           | ctx + pools    | drop-oldest   |
    | extract   | 8k     | 10 (1) · 1    | 19 (6) · 19    | 3 (0) · 3     |
    | extract   | 16k    | 22 (8) · 1    | 24 (8) · 20    | 8 (0) · 8     |
    | reference | 8k     | 24 (8) · 1    | 24 (8) · 19    | 3 (0) · 3     |
    | reference | 16k    | 24 (8) · 1    | 24 (8) · 20    | 6 (0) · 6     |

At 8k with extracts alone (no model) ctx's prompt holds the answer 3.3× as often as drop-oldest
without the pools and 6.3× with them; the pools add 37.5 points (10 → 19 of 24). With
summaries that keep every fact (reference) the answers were there already; the pools add the
messages themselves (1 → 18 verbatim). `--recall 0.05`: 21 and 24 at 8k; 0.25: 23 and 24.

Deterministic: the same table every run, whatever the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_bench's stand-in backend

from serve_bench import ENCODING, Slot, _post, prompt_tokens
from serve_bench import drop_oldest as newest_messages

from otaku_ctx.build import Pipeline
from otaku_ctx.config import ContextSettings, ModelSettings, RecallSettings, Settings
from otaku_ctx.replay import story_at
from otaku_ctx.story.model import Message, Scene, Story
from otaku_ctx.summarize.extract import history_extract, summary_extract

SEED = 36
SESSIONS, PER_SESSION = 40, 20
PLANTED_IN = 30  # the facts go into the first this many sessions (early: the first 12)
EARLY = 12
RESERVE = 512
RECALL = 0.1
SUMMARY_WORDS, HISTORY_WORDS = 60, 200
WINDOWS = (8192, 16384)
PEOPLE = ("Mara", "Tobias")

# (the fact as said, the question, the answer); {x} is the slot each fact fills from its list
FACTS = [
    # (the fact as said, asked with its own words, asked in other words, the answers it may have)
    (
        "My sister {x} moved to Tallinn last week, she starts at the port office.",
        "Which sister of yours moved to Tallinn?",
        "Who was it in your family that went off to Estonia?",
        ["Odile", "Renata", "Ines", "Solveig"],
    ),
    (
        "I finally adopted a dog, a grey whippet we named {x}.",
        "What did you name the whippet you adopted?",
        "What's the new pup called again?",
        ["Biscuit", "Pilot", "Juniper", "Marlow"],
    ),
    (
        "I paid {x} euros for the old racing bike from the flea market.",
        "How many euros did the racing bike cost you?",
        "What did that second-hand bicycle set you back?",
        ["340", "275", "415", "190"],
    ),
    (
        "My cousin got married in {x}, a tiny ceremony by the lake.",
        "Where did your cousin get married?",
        "Where was that small lakeside wedding?",
        ["Bled", "Hallstatt", "Annecy", "Ohrid"],
    ),
    (
        "I lost my job at {x} on Monday, they closed the whole branch.",
        "Where did you lose your job?",
        "Which place let you go when they shut down?",
        ["Harbor Bakery", "Lumen Books", "Castell Print", "Vireo Labs"],
    ),
    (
        "The doctor said my knee needs {x} weeks of rest before I can run again.",
        "How many weeks of rest does your knee need?",
        "How long until you can go running again?",
        ["six", "eight", "five", "nine"],
    ),
    (
        "We booked the cabin at {x} for the first weekend of March.",
        "Which cabin did we book for March?",
        "Where are we staying that first weekend of spring?",
        ["Ravensgill", "Eldermoor", "Sallow Point", "Wrenfield"],
    ),
    (
        "My grandmother's recipe for {x} finally came out right.",
        "Which of your grandmother's recipes came out right?",
        "What did you finally manage to cook like your gran?",
        ["quince jam", "plum dumplings", "rye bread", "beet soup"],
    ),
    (
        "I started learning the {x} on Thursdays with a teacher from the conservatory.",
        "Which instrument are you learning on Thursdays?",
        "What are you practising with that music teacher?",
        ["cello", "oboe", "harp", "bassoon"],
    ),
    (
        "Our landlord raised the rent to {x} a month, starting in April.",
        "What did the landlord raise the rent to?",
        "How much is the flat costing you now?",
        ["1,180", "1,040", "960", "1,320"],
    ),
    (
        "I found my father's old watch, a {x}, in a box in the attic.",
        "What make was your father's old watch?",
        "What brand was the timepiece you found upstairs?",
        ["Zenith", "Longines", "Certina", "Doxa"],
    ),
    (
        "My brother is training for the marathon in {x} in October.",
        "Where is your brother's marathon in October?",
        "Which city is your brother running in this autumn?",
        ["Valencia", "Lisbon", "Ljubljana", "Turin"],
    ),
    (
        "The plumber finally came and it turned out a {x} was blocking the drain.",
        "What was blocking the drain?",
        "What did they pull out of the pipes in the end?",
        ["tennis ball", "sock", "toy car", "spoon"],
    ),
    (
        "I signed up for a pottery course with a teacher called {x}.",
        "What is your pottery teacher called?",
        "Who teaches that clay class of yours?",
        ["Hedda", "Casimir", "Liesel", "Anselm"],
    ),
    (
        "Our team lost the quiz final by {x} points, all on the geography round.",
        "By how many points did your team lose the quiz final?",
        "How close was it at the pub trivia final?",
        ["three", "seven", "four", "eleven"],
    ),
    (
        "I planted {x} along the back fence this weekend.",
        "What did you plant along the back fence?",
        "What's growing out in the garden now?",
        ["sunflowers", "lavender", "raspberries", "hollyhocks"],
    ),
    (
        "My old schoolfriend {x} called out of nowhere, she lives in Montreal now.",
        "Which schoolfriend called you from Montreal?",
        "Who was the old friend who rang from Canada?",
        ["Petra", "Yvonne", "Clara", "Dagny"],
    ),
    (
        "The car failed its inspection because of the {x}.",
        "Why did the car fail its inspection?",
        "What was wrong with the car at the check-up?",
        ["brake pads", "exhaust", "headlights", "tyres"],
    ),
    (
        "I am reading a novel called {x}, about a lighthouse keeper.",
        "What is the novel about the lighthouse keeper called?",
        "What's that book you're reading?",
        ["Salt Hours", "The Far Lamp", "Tidewater", "Grey Signal"],
    ),
    (
        "We adopted a cat from the shelter, a tabby called {x}.",
        "What is the shelter tabby called?",
        "What's the kitten's name?",
        ["Mochi", "Pickle", "Saffron", "Otto"],
    ),
    (
        "My boss announced I am being sent to {x} for two weeks in May.",
        "Where is your boss sending you in May?",
        "Where's that work trip this spring?",
        ["Rotterdam", "Gdansk", "Bergen", "Antwerp"],
    ),
    (
        "I broke my wrist falling off the {x} at the climbing gym.",
        "What did you fall off at the climbing gym?",
        "How did you hurt your arm, remind me?",
        ["overhang", "traverse wall", "top rope", "bouldering cave"],
    ),
    (
        "My niece turned {x} on Sunday and wanted a dinosaur cake.",
        "How old did your niece turn on Sunday?",
        "How old is the little one now, after the party?",
        ["seven", "nine", "six", "eight"],
    ),
    (
        "The band we saw on Friday was called {x}, they played until two.",
        "What was the band called that you saw on Friday?",
        "Who were those musicians we heard that night?",
        ["Velvet Compass", "North Hollow", "The Tinmen", "Paper Lanterns"],
    ),
]


@dataclass(frozen=True)
class Fact:
    said: str
    question: str
    answer: str
    session: int
    number: int = 0  # the message that holds it


def _small_talk(rng: random.Random) -> str:
    subjects = [
        "the weather",
        "the new café on the corner",
        "work",
        "the weekend",
        "the bus",
        "dinner",
        "the garden",
        "the news",
        "that series we watched",
        "the neighbours",
        "the market",
        "the rain",
        "my week",
    ]
    verbs = ["was", "felt", "seemed", "turned out", "kept being", "looked"]
    ends = [
        "fine",
        "strange",
        "better than last time",
        "a bit much",
        "quiet",
        "lovely",
        "tiring",
        "busy again",
        "nothing special",
        "good, honestly",
        "worse than I thought",
    ]
    openers = ["Honestly,", "Well,", "So,", "Anyway,", "You know,", "I think", "Funny thing,", ""]
    extras = [
        "How about you?",
        "What do you think?",
        "Same as always.",
        "I could use a holiday.",
        "Ha, typical.",
        "Let's see how it goes.",
        "I'll tell you more later.",
        "Not much else to say.",
        "",
    ]
    names = ["Greta", "Paulo", "Mrs Hale", "Jonas", "Aunt Bea", "Felix", "Noor", "Dmitri", "Lotte", "Sam"]
    asides = [
        f"I ran into {rng.choice(names)} at the {rng.choice(['station', 'bakery', 'gym', 'library'])}.",
        f"The bus was {rng.randint(5, 40)} minutes late again.",
        f"{rng.choice(names)} says hello, by the way.",
        f"We ate at that place on {rng.choice(['Mill Street', 'the square', 'Dock Road'])}.",
        "I slept badly, the radiator kept clicking all night.",
        "The kettle is making that noise again.",
        "I keep forgetting to water the plants.",
        "It rained all of Saturday, so I stayed in and read.",
        # the facts' own words, said of other things
        "My knee is a bit sore after all those stairs.",
        "The dog next door barked half the night.",
        "The job is the job, nothing new there.",
        "The rent is due on Friday again.",
        "I keep meaning to fix the bike.",
        "My brother says hi.",
        "The car made a funny noise on the hill.",
        "I should call my sister this week.",
        "Friday night we just stayed in.",
        "The cat from upstairs got out.",
    ]
    said = []
    for _ in range(rng.randint(1, 3)):
        first = f"{rng.choice(openers)} {rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(ends)}.".strip()
        said.append(first[0].upper() + first[1:])
        if rng.random() < 0.4:
            said.append(rng.choice(asides))
    said.append(rng.choice(extras))
    return " ".join(p for p in said if p)


def story() -> tuple[Story, list[Fact], list[int]]:
    """The story, its facts (with the message that holds each), and the questions' numbers."""
    rng = random.Random(SEED)
    planted: list[Fact] = []
    for i, (template, own_words, other_words, answers) in enumerate(FACTS):
        x = rng.choice(answers)
        planted.append(Fact(template.format(x=x), own_words if i % 2 else other_words, x, 0))
    rng.shuffle(planted)
    slots = sorted(rng.sample(range(PLANTED_IN * PER_SESSION), len(planted)))
    messages: list[Message] = []
    scenes: list[Scene] = []
    facts: list[Fact] = []
    questions: list[int] = []
    start = datetime(2026, 1, 5, 19, 0)
    asked = list(planted)
    for session in range(SESSIONS):
        day = start + timedelta(days=7 * session)
        first = len(messages) + 1
        for i in range(PER_SESSION):
            n = len(messages) + 1
            speaker = PEOPLE[i % 2]
            role = "user" if speaker == "Mara" else "assistant"
            at = session * PER_SESSION + i
            text = _small_talk(rng)
            if slots and at == slots[0] and session < PLANTED_IN:
                slots.pop(0)
                fact = planted[len(facts)]
                facts.append(replace(fact, session=session, number=n))
                text = f"{fact.said} {text}"
            elif session >= SESSIONS - 3 and role == "user" and asked:
                # the last session asks; the reply does not give the answer away
                question = asked.pop(0).question
                text = f"Wait, remind me. {question}"
                questions.append(n)
            elif role == "assistant" and questions and questions[-1] == n - 1:
                text = "Hm, I would have to think about that one. " + _small_talk(rng)
            messages.append(Message(n, role, text, speaker, sent=day + timedelta(minutes=3 * i)))
        scenes.append(Scene(session + 1, first, len(messages), session + 1, f"Week {session + 1}"))
    told = Story(path=Path("recall-bench.jsonl"), messages=tuple(messages), scenes=tuple(scenes),
                 system="Mara and Tobias talk every week. Reply as Tobias.", source_format="native")  # fmt: skip
    return told, facts, questions


def with_summaries(story: Story, facts: list[Fact], kind: str) -> Story:
    """The story's scenes summarised: ctx's extracts, or the reference (a person's: what was
    talked about, and every fact said in it), each with a history rolled from them."""
    scenes, history = [], ""
    by_session: dict[int, list[Fact]] = {}
    for f in facts:
        by_session.setdefault(f.session, []).append(f)
    for scene in story.scenes:
        told = story.messages[scene.start - 1 : scene.end]
        if kind == "extract":
            summary = summary_extract(told, SUMMARY_WORDS)
        else:
            said = [f"{story.messages[f.number - 1].name} said: {f.said}" for f in by_session.get(scene.order - 1, [])]
            summary = " ".join(["Mara and Tobias caught up on their week.", *said])
        history = history_extract(history, summary, HISTORY_WORDS)
        scenes.append(replace(scene, summary=summary, history=history))
    return replace(story, scenes=tuple(scenes))


def settings(window: int, recall: float) -> Settings:
    context = ContextSettings(reply_reserve=RESERVE, recall=recall)
    return Settings(context=context, model=ModelSettings(window=window, tokenizer="cl100k_base"))


def present(answer: str, prompt: str) -> bool:
    words = re.findall(r"\w+", answer.lower())
    low = prompt.lower()
    return all(re.search(rf"\b{re.escape(w)}\b", low) for w in words)


def drop_oldest(story: Story, pipeline: Pipeline, tokens: int) -> str:
    """The newest messages whose rendered prompt fits `tokens` (a frontend's truncation), found
    by halving; the system message first, as ctx's."""
    low, high = 1, len(story.messages)
    best = ""
    while low <= high:
        keep = (low + high) // 2
        cut = replace(story, messages=story.messages[-keep:], scenes=())
        built = pipeline.build(cut)
        if built.prompt is not None and built.assembly.tokens <= tokens and not built.assembly.recap:
            best, low = built.prompt, keep + 1
        else:
            high = keep - 1
    return best


def measure(windows: tuple[int, ...], every: int, share: float = RECALL) -> list[str]:
    base, facts, questions = story()
    by_question = {f.question: f for f in facts}
    rows = []
    for kind in ("extract", "reference"):
        told = with_summaries(base, facts, kind)
        for window in windows:
            off, on = Pipeline(settings(window, 0.0)), Pipeline(settings(window, share))
            plain = Pipeline(settings(window * 4, 0.0))  # drop-oldest: cut by hand, never by the cases
            counts = {"ctx": [0, 0, 0], "ctx+pools": [0, 0, 0], "drop-oldest": [0, 0, 0]}
            asked = early = 0
            for n in questions[::every]:
                question = base.messages[n - 1].content.removeprefix("Wait, remind me. ")
                fact = by_question[question]
                at = story_at(told, n)
                prompts = {"ctx": off.build(at).prompt or "", "ctx+pools": on.build(at)}
                pooled = prompts["ctx+pools"]
                assert not isinstance(pooled, str)
                prompts["ctx+pools"] = pooled.prompt or ""
                prompts["drop-oldest"] = drop_oldest(at, plain, pooled.assembly.tokens)
                for name, prompt in prompts.items():
                    found = present(fact.answer, prompt)
                    counts[name][0] += found
                    counts[name][1] += found and fact.session < EARLY
                    counts[name][2] += base.messages[fact.number - 1].content in prompt
                asked += 1
                early += fact.session < EARLY
            cells = " | ".join(f"{a}/{asked} ({e}/{early}) · {v}/{asked}" for a, e, v in counts.values())
            rows.append(f"| {kind} | {window // 1024}k | {cells} |")
    return rows


# ── Through `ctx serve`, played turn by turn ─────────────────────────────────────────────

#: the chat's length at serve's first request (its first turn), then every user turn to the end
SERVED_FROM = 600
FRAME_WORDS = "The harbour town keeps its own hours, and Tobias knows every one of them by heart."


def frame(tokens: int) -> str:
    """The system message, padded to about `tokens` tokens (a character card's size)."""
    text = "Mara and Tobias talk every week. Reply as Tobias."
    while tokens and len(ENCODING.encode(text)) < tokens:
        text += " " + FRAME_WORDS
    return text


def paraphrased(fact: Fact) -> bool:
    """Whether the question shares no content word with the message that holds the fact (what
    keywords cannot find: `assemble.recall.words_of`)."""
    from otaku_ctx.assemble.recall import words_of

    return not (words_of(fact.question) & words_of(fact.said))


def served(
    window: int, frame_tokens: int = 0, share: float | None = None, meaning: tuple[str, str] | None = None
) -> dict[str, Any]:
    """The story's chat sent through `ctx serve` (its defaults; `share`: `[context] recall` set)
    to a stand-in backend of `window` tokens, as a frontend sends it: every user turn from
    message `SERVED_FROM`, the whole chat each time, no summaries but serve's own extracts. For
    each question, whether its answer is in the prompt forwarded at the turn it is asked, and in
    the newest messages that fit the same tokens (drop-oldest); for every turn, whether it holds
    a story so far. `meaning`: (the embeddings server's URL, its model) for `[recall]`, the chat's
    messages embedded after its first turn into the vectors file serve reads (as `ctx embed`
    writes one ahead of time; with summaries off, serve writes none itself)."""
    home = tempfile.mkdtemp(prefix="recall-bench-")
    os.environ["OTAKU_HOME"] = home
    from otaku_ctx.config import ContextSettings, ServeSettings
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running

    base, facts, questions = story()
    by_question = {f.question: f for f in facts}
    system = {"role": "system", "content": frame(frame_tokens)}
    messages = [{"role": m.role, "name": m.name, "content": m.content} for m in base.messages]
    backend = Recording()
    backend.window = window
    backend.start()
    context = ContextSettings() if share is None else ContextSettings(recall=share)
    sources = {} if share is None else {"context.recall": "config"}
    settings = Settings(context=context, serve=ServeSettings(backend=backend.url, port=0, summarize=False))
    if meaning is not None:
        settings = replace(settings, recall=RecallSettings(url=meaning[0], model=meaning[1], timeout=30.0))
    service = Service(replace(settings, sources=sources))
    running = Running(service)
    found = {"ctx serve": 0, "drop-oldest": 0, "paraphrased": 0, "others": 0}
    told = turns = by_meaning = 0
    each: dict[str, bool] = {}  # each question: its answer in the prompt at the turn asked
    try:
        for n in range(SERVED_FROM + 1, len(messages) + 1):
            if messages[n - 1]["role"] != "user":
                continue
            _post(running.url + "/chat/completions", {"model": "bench", "messages": [system, *messages[:n]],
                                                       "max_tokens": RESERVE})  # fmt: skip
            if meaning is not None and turns == 1:  # the second: the chat is a chat (its first, a one-shot)
                embedded(service, base, settings.recall)
            sent = backend.sent
            turns += 1
            told += any(m["content"].startswith("[Story so far") for m in sent)
            if n not in questions:
                continue
            question = base.messages[n - 1].content.removeprefix("Wait, remind me. ")
            fact = by_question[question]
            dropped = newest_messages([system, *messages[:n]], len(prompt_tokens(sent)))
            there = present(fact.answer, "\n".join(m["content"] for m in sent))
            found["ctx serve"] += there
            found["paraphrased" if paraphrased(fact) else "others"] += there
            each[question] = there
            found["drop-oldest"] += present(fact.answer, "\n".join(m["content"] for m in dropped))
        stats = json.loads(urllib.request.urlopen(running.url.removesuffix("/v1") + "/ctx/stats").read())
        by_meaning = sum(t["recall_engine"] == "meaning" for c in stats["chats"] for t in c["turns"])
    finally:
        running.stop()
        backend.stop()
    cached = sum(share >= 0.9 for share in backend.shares[1:]) / max(1, len(backend.shares) - 1)
    kinds = {"paraphrased": sum(paraphrased(f) for f in facts if f.number and f.question in questions_asked(base))}
    kinds["others"] = len(questions) - kinds["paraphrased"]
    return {"found": found, "questions": len(questions), "turns": turns, "told": told, "cached": cached,
            "kinds": kinds, "by_meaning": by_meaning, "each": each}  # fmt: skip


def questions_asked(told: Story) -> set[str]:
    return {m.content.removeprefix("Wait, remind me. ") for m in told.messages if m.content.startswith("Wait, remind")}


def embedded(service: Any, told: Story, recall: RecallSettings) -> None:
    """The chat's messages embedded into the vectors file serve reads for it (`ctx embed`'s work,
    done once its first turn named the chat's file)."""
    from otaku_ctx.embed import WRITE_TIMEOUT, embedder, texts_of, write_vectors
    from otaku_ctx.story.vectors import vectors_for

    [session] = list(service.sessions)
    path = vectors_for(service.store.path(session.pool), recall.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_vectors(texts_of(told), path, embedder(recall, WRITE_TIMEOUT), recall.batch)


class Recording(Slot):
    """The stand-in backend of serve_bench, keeping the last prompt it was sent."""

    sent: list[dict[str, Any]] = []
    shares: list[float] = []  # each prompt's share its slot had cached

    def reuse(self, messages: list[dict[str, Any]]) -> tuple[int, int]:
        self.sent = messages
        cached, processed = super().reuse(messages)
        self.shares = [*self.shares, cached / (cached + processed)]
        return cached, processed


def by_meaning() -> None:
    """The questions through serve at 8k, the keyword engine alone against recall by meaning with
    the real embedding model (tests/realserver/setup.sh's all-MiniLM-L6-v2 on llama-server
    `--embeddings`), by kind: the paraphrased questions (no content word shared with the answer's
    message) and the others."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realserver"))
    from server import EMBED_MODEL, free_port, launch, stop

    log = Path(tempfile.mkdtemp(prefix="recall-bench-embed-")) / "llama-server.log"
    process = launch(log, port := free_port(), context=2048, slots=4, extra=("--embeddings",), gguf="EMBED_GGUF")
    try:
        keywords = served(8192)
        meant = served(8192, meaning=(f"http://127.0.0.1:{port}/v1", EMBED_MODEL))
    finally:
        stop(process)
    kinds = keywords["kinds"]
    for name, got in (("keywords alone", keywords), ("by meaning and keywords", meant)):
        f = got["found"]
        print(
            f"8,192 window, {name}: paraphrased {f['paraphrased']}/{kinds['paraphrased']}"
            f" ({f['paraphrased'] / max(1, kinds['paraphrased']):.0%}), others {f['others']}/{kinds['others']},"
            f" all {f['ctx serve']}/{got['questions']} (drop-oldest {f['drop-oldest']}); turns by meaning"
            f" {got['by_meaning']}/{got['turns']}; ≥ 90 % cached on {got['cached']:.0%} of turns after the first"
        )
    for question, there in meant["each"].items():
        if there != keywords["each"][question]:
            print(f"  {'found' if there else 'lost'} by meaning: {question!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one window (with --serve too), every fourth question")
    parser.add_argument("--recall", type=float, default=RECALL, help=f"the share of the limit (default {RECALL})")
    parser.add_argument("--serve", action="store_true", help="through ctx serve with its defaults, turn by turn")
    parser.add_argument(
        "--meaning", action="store_true", help="with --serve: keywords against recall by meaning (the real MiniLM)"
    )
    args = parser.parse_args()
    if args.serve and args.meaning:
        by_meaning()
        return
    if args.serve:
        for window, frame_tokens in ((8192, 0), (4096, 1500))[: 1 if args.smoke else 2]:
            got = served(window, frame_tokens)
            ctx, dropped, asked = got["found"]["ctx serve"], got["found"]["drop-oldest"], got["questions"]
            print(
                f"{window:,} window, {frame_tokens:,}-token frame: answer in the prompt at the turn asked "
                f"{ctx}/{asked} through ctx serve, {dropped}/{asked} drop-oldest; a story so far in "
                f"{got['told']}/{got['turns']} turns; ≥ 90 % cached on {got['cached']:.0%} of turns after the first"
            )
        return
    rows = measure(WINDOWS[:1], 4, args.recall) if args.smoke else measure(WINDOWS, 1, args.recall)
    print("answer present (of the facts planted in the first 12 weeks) · evidence verbatim, of the questions asked")
    print("| summaries | window | ctx | ctx + pools | drop-oldest (ctx + pools' tokens) |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
