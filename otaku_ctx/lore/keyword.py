"""Seed 000's keyword engine: activated entries ranked by relevance to the recent chat."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..story.worldinfo import regex_key
from .choice import ChatLine, LoreDecision
from .rules import IDF_MESSAGES

# ── The keyword engine's ranking (seed 000) ────────────────────────────────────────────────


def keyword_rank(
    decisions: list[LoreDecision], chat: Sequence[ChatLine], window: int, fill: Callable[[str], str]
) -> list[LoreDecision]:
    """Score each activated entry: keyword hits in the window, its own name mentioned, the
    characters present co-occurring with it, a TF-IDF term score over the latest messages,
    recency of its last matching message, plus `order` / 100 as a flat bonus. Constant and
    sticky entries come first."""
    recent = list(reversed(chat))[:window]
    texts = [m.text.lower() for m in recent]
    speakers = {m.speaker.lower() for m in recent if m.speaker}
    corpus = [m.text.lower() for m in list(reversed(chat))[:IDF_MESSAGES]]
    frequency: dict[str, int] = {}  # document frequency, once per key
    scored: list[LoreDecision] = []
    for d in decisions:
        e = d.entry
        keys = [fill(k).strip().lower() for k in (*e.key, *e.keysecondary) if regex_key(k) is None and k.strip()]
        hits = sum(1 for k in keys if any(k in t for t in texts))
        name = 1.0 if e.comment and any(e.comment.lower() in t for t in texts) else 0.0
        content = fill(e.content).lower()
        together = 0.5 * sum(1 for s in speakers if s in content) + (1.0 if e.character.lower() in speakers else 0.0)
        tfidf = 0.0
        for k in keys:
            tf = sum(t.count(k) for t in texts)
            if tf:
                if k not in frequency:
                    frequency[k] = sum(1 for t in corpus if k in t)
                df = frequency[k]
                tfidf += math.log1p(tf) * (math.log((1 + len(corpus)) / (1 + df)) + 1)
        ages = [i for i, t in enumerate(texts) if any(k in t for k in keys)]
        recency = 1 / (1 + ages[0]) if ages else 0.0
        score = hits + name + together + tfidf / 4 + recency + e.order / 100
        if d.reason in ("constant", "sticky"):
            score = math.inf
        scored.append(replace(d, score=round(score, 3) if math.isfinite(score) else None))
    return sorted(scored, key=lambda d: -(d.score if d.score is not None else math.inf))
