"""The last resort when no reply of the model would do (`[summarize] fallback = "extract"`): a
scene's record made of the scene's own lines, and a history made of the history before it and
that record. Never a word the story does not hold; marked as an extract (its `model` is
`EXTRACT`), so `ctx scenes` lists it and `--redo` asks the model again, a better one perhaps.

A summary extract: each message's first sentence, as "Name: sentence", in order, until
`words` words. A history extract: the story so far before it, then this scene's summary; past
`words`, the story so far keeps the first half of the words and this scene the rest, so the
story's beginning and its newest scene both stand."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..story.model import Message

EXTRACT = "ctx extract"  # the `model` of a record ctx wrote from the scene's own lines
SENTENCE = re.compile(r"(.+?[.!?…]+[\"'”’)\]]*)(?:\s|$)", re.DOTALL)
MOST_SENTENCE_WORDS = 30


def first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    found = SENTENCE.match(flat)
    sentence = found[1] if found else flat
    words = sentence.split()
    return " ".join(words[:MOST_SENTENCE_WORDS]) + ("…" if len(words) > MOST_SENTENCE_WORDS else "")


def summary_extract(messages: Sequence[Message], words: int) -> str:
    """The scene told by its own lines: each message's first sentence, with its speaker."""
    lines: list[str] = []
    count = 0
    for m in messages:
        if m.card is not None:
            line = f"{m.card.name} joins the story."
        else:
            speaker = m.name or {"user": "User", "assistant": "Character", "system": "Narration"}[m.role]
            sentence = first_sentence(m.content)
            if not sentence:
                continue
            line = f"{speaker}: {sentence}"
        size = len(line.split())
        if lines and count + size > words:
            break
        lines.append(line)
        count += size
    return "\n".join(lines)


def history_extract(earlier: str, summary: str, words: int) -> str:
    """The story so far through this scene, from the story so far before it and its summary."""
    before, after = earlier.split(), summary.split()
    if len(before) + len(after) <= words:
        return "\n\n".join(t for t in (" ".join(before), " ".join(after)) if t)
    keep_before = min(len(before), max(words // 2, words - len(after)))
    keep_after = max(0, words - keep_before)
    told = " ".join(before[:keep_before]) + (" …" if keep_before < len(before) else "")
    then = " ".join(after[:keep_after]) + (" …" if keep_after < len(after) else "")
    return "\n\n".join(t for t in (told.strip(), then.strip()) if t)
