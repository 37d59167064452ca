"""Seed 000's other pools: the older messages and the history entries a prompt leaves out,
recalled when the newest messages speak of them (issue 36).

"Every candidate — world lore, character lore, and history entries, plus older chat messages —
is scored this way, merged into one ranked pool, and filled greedily until either a
per-content-type count cap (... 10 history entries, and 50 messages) or the available token
budget is reached", and "the most recent 10 messages in a chat are always included". ctx's
lore has its own ranking and caps (`lore/keyword.py`); this is the rest of the pool:

- **older messages**: those the prompt left out — after the head, before the tail, never the
  newest `NEWEST` (a card is never one: cards are placed by the cases);
- **history entries**: the scenes' summaries the prompt left out — those a story-so-far
  stands in for (case 4), and those of scenes outside the covered chain.

Each is scored against the newest `NEWEST` messages (the query) by the keyword engine's
signals: the words it shares with them that are rare among the candidates (its hits), their
TF-IDF weight, the names among them, the query's speakers it shares, and how recently the
query used them. A candidate that shares no rare word is not recalled. They are filled in rank
order within the caps and `Recall.share` of the limit, which the cases leave free for them.

Where they go: just before the newest user message (after the recap when the tail holds
none) — history entries in relevance order, then messages in story order, each with who spoke
and when (`render/variables.py`). Each turn's own newest messages ask, so the question just
asked is answered; and since what is recalled stands after everything the turn before sent, the
prompt's prefix (system, head, recap, the tail up to the question) holds from turn to turn, and
a change of what is recalled costs only itself (SillyTavern's Vector Storage puts its "past
events" at depth 2 for the same reason).

A pure function of the story and the assembly: no I/O, no clock.
"""

from __future__ import annotations

import math
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from ..story.meaning import Meaning
from ..story.model import Message, Scene, Story
from ..story.words import STOPWORDS, WORD
from .meaning import WEIGHTS, by_meaning, diverse, fused, identity, led, meant, position, text_of, within_budgets
from .parts import Assembly, Part, Pricer, SceneRef
from .steps import Recalled

#: the newest messages: always in the prompt (never recalled), and what a candidate is scored against
NEWEST = 10
#: what a word of the newest user message weighs beyond its recency: the question the reply answers
QUESTION = 2.0
#: the ranked candidates too long for the budget left that `fill` passes over before it stops
MOST_PASSED = 16
#: seed 000's caps of the pools here (its lore's, 20 and 15, are `lore/`'s)
MOST_HISTORY = 10
MOST_MESSAGES = 50
#: a word is rare among the candidates when at most this share of them hold it (2 at least,
#: `MOST_RARE` at most: in a story of 100,000 messages a word said 5,000 times is not rare)
RARE_SHARE = 0.05
MOST_RARE = 50


@dataclass(frozen=True)
class Recall:
    """`[context] recall`: the share of the limit the cases leave for recalled text (0: none),
    and the seed's caps."""

    share: float = 0.0
    history: int = MOST_HISTORY
    messages: int = MOST_MESSAGES

    def reserve(self, limit: int) -> int:
        """The tokens kept for recall out of `limit`."""
        return max(0, int(limit * self.share))


@dataclass(frozen=True)
class Ranked:
    """One candidate as ranked: its part (`Part("recall", message=…)` or `scene=…`), its score,
    and the words it shares with the query that are rare among the candidates, rarest first."""

    part: Part
    score: float
    words: tuple[str, ...]

    @property
    def at(self) -> int:
        """Where it stands in the story: the message's number, the scene's first message."""
        return position(self.part)


@lru_cache(maxsize=1 << 16)
def words_of(text: str) -> frozenset[str]:
    """A text's content words, lower-cased: no function word, none shorter than 3 letters."""
    return frozenset(w for w in map(str.lower, WORD.findall(text)) if len(w) > 2 and w not in STOPWORDS)


@lru_cache(maxsize=1 << 16)
def names_of(text: str) -> frozenset[str]:
    """A text's capitalised content words, lower-cased: its names, loosely (a sentence's first
    word too)."""
    return frozenset(w.lower() for w in WORD.findall(text) if w[0].isupper() and w.lower() not in STOPWORDS)


class WordIndex:
    """Where each content word is said: the numbers of the messages that hold it, in story
    order, over a story's first messages — kept from build to build while they are the same
    objects (a replay's turns, a served chat's), and extended as the story grows. Cards are
    not in it (they are never recalled)."""

    def __init__(self, first: Message) -> None:
        self.first = first
        self.messages: list[Message] = []
        self.postings: dict[str, array[int]] = {}
        self.lock = threading.Lock()

    def cover(self, messages: Sequence[Message]) -> None:
        """Index `messages` (a story's first ones), at least: what was indexed and is still the
        same objects stands (more of it too: a query reads by numbers), the rest is indexed
        again (an edit, a branch of a served chat, which shares its first messages' objects)."""
        kept = next(
            (i for i, (a, b) in enumerate(zip(messages, self.messages, strict=False)) if a is not b), len(self.messages)
        )
        if kept < len(self.messages):  # the messages from number kept + 1 on are another story's
            for found in self.postings.values():
                del found[bisect_left(found, kept + 1) :]
            del self.messages[kept:]
        for m in messages[kept:]:
            if m.card is None:
                for w in words_of(m.content):
                    self.postings.setdefault(w, array("i")).append(m.number)
            self.messages.append(m)

    def holding(self, word: str, first: int, last: int) -> array[int]:
        """The numbers of the messages `first`..`last` that say `word`."""
        found = self.postings.get(word)
        if not found:
            return array("i")
        return found[bisect_left(found, first) : bisect_right(found, last)]


_INDEXES: OrderedDict[int, WordIndex] = OrderedDict()
_INDEXES_LOCK = threading.Lock()
MOST_INDEXES = 8  # stories whose index is kept (a server's chats, each its own)


def index_of(messages: Sequence[Message]) -> WordIndex:
    """The word index of a story whose first message is `messages[0]`, covering `messages`."""
    with _INDEXES_LOCK:
        found = _INDEXES.get(id(messages[0]))
        if found is None or found.first is not messages[0]:
            found = _INDEXES[id(messages[0])] = WordIndex(messages[0])
            while len(_INDEXES) > MOST_INDEXES:
                _INDEXES.popitem(last=False)
        _INDEXES.move_to_end(id(messages[0]))
    return found


@dataclass(frozen=True)
class Pool:
    """The candidates at one turn: the story's messages `first`..`last` but its cards (found
    through the story's word index), and the summaries left out."""

    story: Story
    first: int
    last: int
    scenes: tuple[Scene, ...]
    cards: int  # the cards among messages first..last

    @property
    def size(self) -> int:
        return max(0, self.last - self.first + 1) - self.cards + len(self.scenes)

    def parts(self) -> list[Part]:
        """Every candidate, the summaries first."""
        messages = self.story.messages[self.first - 1 : self.last] if self.last >= self.first else ()
        return [*(Part("recall", scene=s) for s in self.scenes), *(Part("recall", message=m) for m in messages
                                                                    if m.card is None)]  # fmt: skip


def candidates(story: Story, assembly: Assembly, at: int) -> Pool:
    """What the prompt left out that may be recalled at turn `at` (the query's last message):
    the messages after the head and before the tail, but the newest `NEWEST` and the cards;
    the summaries no recap part shows, of scenes after the head and before the tail."""
    first = len(assembly.head) + 1
    before = assembly.tail[0].number if assembly.tail else assembly.messages + 1
    last = min(before, at - NEWEST + 1) - 1
    shown = {id(p.scene) for p in assembly.recap if p.kind == "summary"}
    scenes = tuple(
        s for s in story.scenes if s.summary.strip() and id(s) not in shown and s.start >= first and s.end < before
    )
    cards = sum(1 for m in story.messages[first - 1 : last] if m.card is not None) if last >= first else 0
    return Pool(story, first, last, scenes, cards)


def rank(pool: Pool, query: Sequence[Message]) -> list[Ranked]:
    """The candidates that share a rare word with the query, best first (ties: the earlier).

    A query word weighs by how recently it was said: 1 in the newest message, 1/2 in the one
    before, and so on, added over the messages that say it, and `QUESTION` more in the newest
    user message (what the reply answers: the player's question). A candidate scores the
    weights of its rare words (its hits) and of its names among them, their TF-IDF (the weight
    times the word's rarity among the candidates),
    the query's speakers it shares, and the recency of the newest query message it answers.
    Only the candidates holding a rare word are read: through the story's word index, the
    cost is the query's rare words' messages, not the story's."""
    asked: dict[str, float] = {}
    age: dict[str, int] = {}  # each query word's newest message, 0 the newest
    named: set[str] = set()
    speakers = {m.name.lower() for m in query if m.name}
    question = next((m for m in reversed(query) if m.role == "user"), None)
    for n, m in enumerate(reversed(query)):
        for w in words_of(m.content):
            asked[w] = asked.get(w, 0.0) + 1 / (1 + n) + (QUESTION if m is question else 0.0)
            age.setdefault(w, n)
        named |= names_of(m.content)
    if pool.size <= 0 or not asked:
        return []
    index = index_of(pool.story.messages)
    with index.lock:
        if pool.last >= pool.first:
            index.cover(pool.story.messages[: pool.last])
        holding = {w: index.holding(w, pool.first, pool.last) for w in asked}
    frequency: Counter[str] = Counter({w: len(found) for w, found in holding.items()})
    for scene in pool.scenes:
        frequency.update(words_of(scene.summary) & asked.keys())
    rare_at = min(MOST_RARE, max(2, int(pool.size * RARE_SHARE)))
    rare_words = {w for w in asked if 0 < frequency[w] <= rare_at}
    numbers = sorted({n for w in rare_words for n in holding[w]})
    parts = [Part("recall", scene=s) for s in pool.scenes if words_of(s.summary) & rare_words]
    parts += [Part("recall", message=pool.story.messages[n - 1]) for n in numbers]
    ranked: list[Ranked] = []
    for part in parts:
        text = text_of(part)
        found = words_of(text) & asked.keys()
        rare = sorted(found & rare_words, key=lambda w: (frequency[w], w))
        hits = sum(asked[w] for w in rare)
        names = sum(asked[w] for w in found & named & names_of(text))
        tfidf = sum(asked[w] * (math.log((1 + pool.size) / (1 + frequency[w])) + 1) for w in found)
        if part.message is not None:  # its speaker is in the scene
            together = 0.5 if (part.message.name or "").lower() in speakers else 0.0
        else:  # the scene's people are named in it
            together = 0.5 * sum(s in text.lower() for s in speakers)
        recency = 1 / (1 + min(age[w] for w in rare))
        score = hits + names + together + tfidf / 4 + recency
        ranked.append(Ranked(part, round(score, 3), tuple(rare)))
    ranked.sort(key=lambda r: (-r.score, r.at))
    return ranked


def fill(ranked: Sequence[Ranked], budget: int, pricer: Pricer, recall: Recall) -> list[Ranked]:
    """The ranked candidates taken in order until the budget is reached (seed 000: "until ...
    the available token budget is reached"): one whose kind's cap is reached, or too long for
    what is left of `budget` (a scene's summary where a message would fit), is passed over —
    `MOST_PASSED` of those at most, so a long ranking is not priced to its end."""
    caps = {"history": recall.history, "message": recall.messages}
    taken: Counter[str] = Counter()
    chosen: list[Ranked] = []
    spent = passed = 0
    for item in ranked:
        kind = "message" if item.part.message else "history"
        if taken[kind] >= caps[kind]:
            continue
        cost = pricer.recap_part(item.part)
        if spent + cost > budget:
            passed += 1
            if passed >= MOST_PASSED:
                break
            continue
        chosen.append(item)
        spent += cost
        taken[kind] += 1
    return chosen


def in_order(chosen: Sequence[Ranked]) -> tuple[Part, ...]:
    """As the prompt holds them: history entries by relevance, then messages in story order."""
    history = [r.part for r in chosen if r.part.scene is not None]
    messages = sorted((r for r in chosen if r.part.message is not None), key=lambda r: r.at)
    return (*history, *(r.part for r in messages))


def recalled(
    story: Story, assembly: Assembly, pricer: Pricer, recall: Recall, *, limit: int, at: int, budget: int
) -> Assembly:
    """`assembly` with what the newest messages at turn `at` recall, within `budget` tokens and
    the whole prompt within `limit` (counted exactly; the lowest-ranked goes while it is over),
    and a `Recalled` step saying what and why."""
    if assembly.refusal is not None or not assembly.recap:
        return assembly
    pool = candidates(story, assembly, at)
    query = story.messages[max(0, at - NEWEST) : at]
    ranked = rank(pool, query) if budget > 0 else []
    engine, why, near = "keywords", "", {}
    if story.meaning is not None and budget > 0:
        by_meaning, why = _by_meaning(pool, ranked, story.meaning, budget, pricer)
        if by_meaning is not None:
            chosen, engine, near = [r for r, _ in by_meaning], "meaning", {id(r.part): n for r, n in by_meaning}
    if engine == "keywords":
        chosen = fill(ranked, budget, pricer, recall) if budget > 0 else []
    found, tokens = assembly, assembly.tokens
    while chosen:
        found = replace(assembly, recall=in_order(chosen))
        tokens = pricer.exact(found)
        if tokens <= limit:
            break
        chosen.pop()
    if not chosen:
        found, tokens = assembly, assembly.tokens
    taken = tuple(_taken(r) for r in chosen)
    nearness = tuple(near.get(id(r.part), 0.0) for r in chosen) if engine == "meaning" else ()
    step = Recalled(at, pool.size, budget, tokens - assembly.tokens, taken, engine, why, nearness)
    costs = {**assembly.costs, "recall": tokens - assembly.tokens}
    return replace(found, tokens=tokens, costs=costs, steps=(*assembly.steps, step))


def _by_meaning(
    pool: Pool, ranked: Sequence[Ranked], meaning: Meaning, budget: int, pricer: Pricer
) -> tuple[list[tuple[Ranked, float]] | None, str]:
    """Seed 000's RAG Infill Engine (`meaning.py`): the candidates by meaning, both queries'
    rankings fused with the keyword engine's, re-ranked for variety, filled by kind within
    their budgets — each taken one with its fused score and its similarity to the nearer
    query. (None, why) when it cannot run, and the keyword engine recalls alone."""
    if meaning.failed:
        return None, meaning.failed
    if not meaning.asks:
        return None, "no question to embed"
    messages = pool.story.messages[pool.first - 1 : pool.last] if pool.last >= pool.first else ()
    found = meant(pool.scenes, messages, meaning)
    if not found:
        return None, f"none of the {pool.size:,} left out has its vector yet"
    vectors = {identity(m.part): m.vector for m in found}
    nearest = {identity(m.part): max(m.question, m.recent) for m in found}
    passes = [[m.part for m in by_meaning(found, q)] for q in ("question", "recent")]
    keyword = {identity(r.part): r for r in ranked}
    rankings = [*passes, [r.part for r in ranked]]
    # the question's nearest (when there is a question) and the keyword engine's best lead
    leaders = passes[0][:1] if meaning.question is not None else []
    leaders += rankings[-1][:1]
    order = within_budgets(led(diverse(fused(rankings, WEIGHTS), vectors), leaders), budget, pricer)
    chosen = []
    for part, score in order:
        words = keyword[identity(part)].words if identity(part) in keyword else ()
        chosen.append((Ranked(part, round(score, 5), words), round(nearest.get(identity(part), 0.0), 3)))
    return chosen, ""


def _taken(r: Ranked) -> tuple[str, SceneRef, str, float, tuple[str, ...]]:
    m, scene = r.part.message, r.part.scene
    if m is not None:
        return ("message", m.number, m.name or m.role, r.score, r.words)
    assert scene is not None
    return ("scene", scene.ref, "", r.score, r.words)
