"""Seed 000's RAG Infill Engine: the pools `recall.py` ranks by keyword, ranked by meaning too —
"by embedding similarity against the current conversation ... two-pass queries, Reciprocal Rank
Fusion, Maximal Marginal Relevance re-ranking, per-content-type token budgets". Each a step:

- `meant`: the candidates that have a vector, `MOST_MEANT` at most a turn (past it, the
  messages of the scenes nearest in meaning, then the newest: the work is bounded in steps);
- `by_meaning`: one pass, the candidates by their similarity to one query — the newest user
  message (what the reply answers), then the recent window (what the scene is about);
- `fused`: Reciprocal Rank Fusion of the two passes with the keyword engine's ranking, the
  best `PASS_TOP` of each: a candidate near in meaning *and* sharing a rare word comes first,
  and an exact fact the embedding misses still comes (the hybrid RisuAI's maintainers were
  offered for that reason); `led`: each engine's surest (the question's nearest, the keyword
  engine's best) first, since a consensus of middling ranks otherwise outranks both;
- `diverse`: Maximal Marginal Relevance, so three near-copies of one scene do not fill the
  block;
- `within_budgets`: filled by kind, each within its share of the recall budget (`SHARES`), what
  one kind leaves going to the other.

Pure: the vectors are the story's (`story.meaning`), read and asked by the caller."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..story.meaning import Meaning, Queries, Vector, similarity
from ..story.model import Message, Scene
from .parts import Part, Pricer

#: candidates scored by meaning a turn (each one integer dot product of the model's numbers:
#: some 50 µs at 384 in plain Python; benchmarks/meaning_cost.py)
MOST_MEANT = 2048
#: past `MOST_MEANT`, the scenes nearest the queries whose messages are scored first
NEAREST_SCENES = 16
#: each ranking's best that go into the fusion
PASS_TOP = 50
#: Reciprocal Rank Fusion's constant (its paper's 60: a rank's weight falls slowly), and the
#: weights of the rankings fused: the question's pass 1, the recent window's ½ (it speaks of the
#: scene, not of what is asked: at 1 it pulled the small talk of the recall benchmark's newest
#: messages ahead of the answers, 1 paraphrased question of 6 found against 3 at ½), the keyword
#: engine's 1 (docs/decisions.md, "Recall by meaning")
RRF_K = 60
WEIGHTS = (1.0, 0.5, 1.0)
#: Maximal Marginal Relevance: relevance's weight against likeness to what is chosen already,
#: over the fused ranking's best `MMR_TOP` (the block holds a few; the rest follow in order)
MMR_LAMBDA = 0.7
MMR_TOP = 24
#: a candidate this like one taken already is a near-copy of it, and is left out
NEAR_COPY = 0.95
#: RAG mode's budgets by kind, shares of the recall budget (the keyword engine's counts' place)
SHARES = {"history": 0.4, "message": 0.6}


@dataclass(frozen=True)
class Meant:
    """A candidate with its vector, and its similarity to the newest user message and to the
    recent window (0 where there is no such query)."""

    part: Part
    vector: Vector
    question: float = 0.0
    recent: float = 0.0


def text_of(part: Part) -> str:
    """The text of a candidate that was embedded: a message's content, a scene's summary."""
    return part.message.content if part.message else part.scene.summary if part.scene else ""


def position(part: Part) -> int:
    """Where a candidate stands in the story: the message's number, the scene's first message."""
    return part.message.number if part.message else part.scene.start if part.scene else 0


def meant(scenes: Sequence[Scene], messages: Sequence[Message], meaning: Meaning) -> list[Meant]:
    """The candidates that have a vector, scored against both queries: every scene (the history
    entries), then the messages (cards are never candidates) — all of them while they are
    `MOST_MEANT` with the scenes; past it, those of the `NEAREST_SCENES` nearest the queries,
    then the newest, to `MOST_MEANT`."""
    queries = Queries(meaning.question, meaning.recent)
    memo = meaning.scored

    def scored(part: Part) -> Meant | None:
        text = text_of(part)
        if text not in memo:
            vector = meaning.vector_of(text)
            fits = vector is not None and len(vector) == len(queries.both)
            memo[text] = (vector, *queries.similarities(vector)) if vector is not None and fits else None
        found = memo[text]
        return Meant(part, *found) if found is not None else None

    found = [m for m in (scored(Part("recall", scene=s)) for s in scenes[:MOST_MEANT]) if m is not None]
    room = max(0, MOST_MEANT - len(found))
    if len(messages) <= room:
        chosen: Sequence[Message] = messages
    else:  # the messages of the nearest scenes first, then the newest
        first = messages[0].number
        order: list[Message] = []
        nearest = sorted(found, key=lambda m: (-max(m.question, m.recent), position(m.part)))[:NEAREST_SCENES]
        for scene in nearest:
            assert scene.part.scene is not None
            start, end = max(first, scene.part.scene.start), min(messages[-1].number, scene.part.scene.end)
            order += messages[start - first : end - first + 1]
        seen = {m.number for m in order}
        order += [m for m in itertools.islice(reversed(messages), room) if m.number not in seen]
        chosen = order[:room]
    parts = (Part("recall", message=m) for m in chosen if m.card is None)
    return found + [m for m in map(scored, parts) if m is not None]


def by_meaning(candidates: Sequence[Meant], query: str) -> list[Meant]:
    """One pass: the candidates by their similarity to `query` ("question" or "recent"), best
    first (ties: the earlier in the story)."""
    return sorted(candidates, key=lambda m: (-getattr(m, query), position(m.part)))


def fused(
    rankings: Sequence[Sequence[Part]], weights: Sequence[float] | None = None, k: int = RRF_K
) -> list[tuple[Part, float]]:
    """Reciprocal Rank Fusion: each part scores weight / (k + its rank) in every ranking it is
    among the `PASS_TOP` best of, summed; best first (ties: the earlier in the story)."""
    scores: dict[int, float] = {}
    parts: dict[int, Part] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, part in enumerate(ranking[:PASS_TOP], 1):
            key = identity(part)
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
            parts[key] = part
    return sorted(((parts[key], score) for key, score in scores.items()), key=lambda p: (-p[1], position(p[0])))


def led(ranked: Sequence[tuple[Part, float]], leaders: Sequence[Part]) -> list[tuple[Part, float]]:
    """`ranked` with `leaders` first, in their order (each engine's own best: a consensus of the
    rankings never pushes out the one candidate an engine is surest of), the rest as ranked."""
    firsts = list(dict.fromkeys(identity(p) for p in leaders))
    by_key = {identity(p): (p, score) for p, score in ranked}
    head = [by_key[key] for key in firsts if key in by_key]
    return head + [(p, score) for p, score in ranked if identity(p) not in firsts]


def identity(part: Part) -> int:
    """One candidate's identity across the rankings: a message by its number, a scene by its
    first message's, negated."""
    return part.message.number if part.message else -(part.scene.start if part.scene else 0)


def diverse(
    ranked: Sequence[tuple[Part, float]], vectors: dict[int, Vector], lam: float = MMR_LAMBDA
) -> list[tuple[Part, float]]:
    """Maximal Marginal Relevance over the best `MMR_TOP`: taken one by one, each time the
    candidate whose relevance (its fused score, as a share of the best) less its likeness to
    the nearest taken already is the greatest; a candidate with no vector is like none. A
    near-copy of one taken (`NEAR_COPY`) is left out, there and among the rest."""
    if not ranked:
        return []
    top = ranked[0][1] or 1.0
    left, rest = list(ranked[:MMR_TOP]), [r for r in ranked[MMR_TOP:] if not _copied(r[0], ranked[:MMR_TOP], vectors)]
    taken: list[tuple[Part, float]] = []
    nearest = [0.0] * len(left)  # each left one's likeness to the nearest taken
    while left:
        best = max(range(len(left)), key=lambda i: (lam * left[i][1] / top - (1 - lam) * nearest[i], -i))
        part, score = left.pop(best)
        if nearest.pop(best) >= NEAR_COPY:
            continue  # a near-copy of one taken: it adds nothing
        taken.append((part, score))
        chosen = vectors.get(identity(part))
        if chosen is not None:
            for i, (other, _) in enumerate(left):
                vector = vectors.get(identity(other))
                if vector is not None:
                    nearest[i] = max(nearest[i], similarity(chosen, vector))
    return taken + rest


def _copied(part: Part, among: Sequence[tuple[Part, float]], vectors: dict[int, Vector]) -> bool:
    own = vectors.get(identity(part))
    return own is not None and any(
        (other := vectors.get(identity(p))) is not None and similarity(own, other) >= NEAR_COPY for p, _ in among
    )


def within_budgets(
    ranked: Sequence[tuple[Part, float]], budget: int, pricer: Pricer, shares: dict[str, float] = SHARES
) -> list[tuple[Part, float]]:
    """The ranked candidates taken in order, each kind within its share of `budget`; then what a
    kind left unspent is the other's, in a second pass over those passed over."""
    spent = {kind: 0 for kind in shares}
    chosen: list[tuple[Part, float]] = []
    passed: list[tuple[Part, float]] = []
    for item in ranked:
        kind = "message" if item[0].message else "history"
        cost = pricer.recap_part(item[0])
        if spent[kind] + cost <= int(budget * shares[kind]):
            chosen.append(item)
            spent[kind] += cost
        else:
            passed.append(item)
    left = budget - sum(spent.values())
    for item in passed:
        cost = pricer.recap_part(item[0])
        if cost <= left:
            chosen.append(item)
            left -= cost
    order = {id(item[0]): n for n, item in enumerate(ranked)}
    return sorted(chosen, key=lambda item: order[id(item[0])])
