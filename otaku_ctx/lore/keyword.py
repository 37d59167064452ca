"""Seed 000's keyword engine: activated entries ranked by relevance to the recent chat."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from ..story.worldinfo import regex_key
from .choice import ChatLine, LoreDecision
from .keys import Haystack
from .rules import IDF_MESSAGES

# Past this many (key, message) pairs, keys are found through an index of the messages' n-grams
# instead of testing every key on every message (the same counts, a bounded cost).
DIRECT_PAIRS = 200_000

# ── The keyword engine's ranking (seed 000) ────────────────────────────────────────────────


def keyword_rank(
    decisions: list[LoreDecision], chat: Sequence[ChatLine], window: int, fill: Callable[[str], str]
) -> list[LoreDecision]:
    """Score each activated entry: keyword hits in the window, its own name mentioned, the
    characters present co-occurring with it, a TF-IDF term score over the latest messages,
    recency of its last matching message, plus `order` / 100 as a flat bonus. Constant and
    sticky entries come first.

    Each distinct key is looked up in the window once, whatever number of entries hold it, and
    its document frequency is counted once (through an index when there are many): the cost
    grows with the window and the keys, not with entries × window."""
    recent = list(reversed(chat))[:window]
    texts = [m.text.lower() for m in recent]
    speakers = {m.speaker.lower() for m in recent if m.speaker}
    corpus = [m.text.lower() for m in list(reversed(chat))[:IDF_MESSAGES]]
    window_stats: dict[str, tuple[int, int | None]] = {}  # key -> (term frequency, newest message holding it)
    mentioned: dict[str, bool] = {}

    # Many keys: find them in the window's texts joined (by a character no key holds) and
    # indexed by trigram, each key where its rarest trigram stands.
    indexed = len(decisions) * len(texts) > DIRECT_PAIRS // 100
    joined = Haystack("\x00".join(texts))
    bounds = list(itertools.accumulate(len(t) + 1 for t in texts))  # where each text ends (+1)

    def stat(k: str) -> tuple[int, int | None]:
        if k not in window_stats:
            if indexed and k and "\x00" not in k:
                counts = [0] * len(texts)
                end = -1
                for start in joined.starts(k):  # str.count per text: occurrences that do not overlap
                    if start >= end:
                        counts[bisect.bisect_right(bounds, start)] += 1
                        end = start + len(k)
                newest = next((i for i, c in enumerate(counts) if c), None)
                window_stats[k] = (sum(counts), newest)
            else:
                newest = next((i for i, t in enumerate(texts) if k in t), None)
                window_stats[k] = (sum(t.count(k) for t in texts) if newest is not None else 0, newest)
        return window_stats[k]

    keys_of: list[list[str]] = []
    for d in decisions:
        e = d.entry
        keys_of.append(
            [fill(k).strip().lower() for k in (*e.key, *e.keysecondary) if k.strip() and regex_key(k) is None]
        )
    frequency = document_frequency({k for keys in keys_of for k in keys if stat(k)[0]}, corpus)
    scored: list[LoreDecision] = []
    for d, keys in zip(decisions, keys_of, strict=True):
        e = d.entry
        hits = sum(1 for k in keys if stat(k)[1] is not None)
        if e.comment and e.comment.lower() not in mentioned:
            mentioned[e.comment.lower()] = any(e.comment.lower() in t for t in texts)
        name = 1.0 if e.comment and mentioned[e.comment.lower()] else 0.0
        content = fill(e.content).lower()
        together = 0.5 * sum(1 for s in speakers if s in content) + (1.0 if e.character.lower() in speakers else 0.0)
        tfidf = 0.0
        for k in keys:
            tf = stat(k)[0]
            if tf:
                tfidf += math.log1p(tf) * (math.log((1 + len(corpus)) / (1 + frequency[k])) + 1)
        ages = [age for k in keys if (age := stat(k)[1]) is not None]
        recency = 1 / (1 + min(ages)) if ages else 0.0
        score = hits + name + together + tfidf / 4 + recency + e.order / 100
        if d.reason in ("constant", "sticky", "decorator"):
            score = math.inf
        scored.append(replace(d, score=round(score, 3) if math.isfinite(score) else None))
    return sorted(scored, key=lambda d: -(d.score if d.score is not None else math.inf))


def document_frequency(keys: Iterable[str], corpus: Sequence[str]) -> dict[str, int]:
    """How many messages of `corpus` hold each key (as a substring). Many keys are found in the
    messages joined (by a character no key holds) and indexed by n-gram, each key only where
    its rarest n-gram stands."""
    keys = set(keys)
    if len(keys) * len(corpus) <= DIRECT_PAIRS:
        return {k: sum(1 for t in corpus if k in t) for k in keys}
    joined = Haystack("\x00".join(corpus))
    bounds = list(itertools.accumulate(len(t) + 1 for t in corpus))
    counts: dict[str, int] = {}
    for k in keys:
        if not k or "\x00" in k:
            counts[k] = sum(1 for t in corpus if k in t)
        else:
            counts[k] = len({bisect.bisect_right(bounds, start) for start in joined.starts(k)})
    return counts
