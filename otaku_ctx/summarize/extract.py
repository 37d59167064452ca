"""The last resort when no reply of the model would do (`[summarize] fallback = "extract"`): a
scene's record made of the scene's own lines, and a history made of the history before it and
that record. Never a word the story does not hold; marked as an extract (its `model` is
`EXTRACT`), so `ctx scenes` lists it and `--redo` asks the model again, a better one perhaps.

A summary extract: the scene's sentences that carry its facts — names, places, numbers, dates,
words it says once — chosen by what they tell for their length, written "Name: sentence" in
story order, until `words` words (a scene of greetings and facts keeps the facts). A history
extract: the story so far before it, then this scene's summary; past
`words`, the story so far keeps the first half of the words and this scene the rest, so the
story's beginning and its newest scene both stand."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ..story.model import Message
from ..story.speakers import UNNAMED, Speakers
from .checks import NUMBER, STOPWORDS, WORD, written_names

EXTRACT = "ctx extract"  # the `model` of a record ctx wrote from the scene's own lines
#: a run of sentence ends, with the quotes and brackets that close after them: a sentence ends
#: there when a blank or the text's end follows, or at once after a full-width end (。！？, in
#: scripts written without spaces). Each run is matched once and its start never rescanned, so
#: splitting is linear in the text whatever it holds (no full stop, one huge message).
ENDS = re.compile(r"[.!?…。！？]+[\"'”’)\]」』）]*")
FULL_WIDTH_ENDS = frozenset("。！？")
MOST_SENTENCE_WORDS = 30
#: ... and at most this many characters: a sentence in a script written without spaces is one "word"
MOST_SENTENCE_CHARS = 240
#: a sentence this short that names no one but the scene's speakers and holds no number tells no fact
GREETING_WORDS = 3
MONTHS = re.compile(
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December|Monday|Tuesday"
    r"|Wednesday|Thursday|Friday|Saturday|Sunday|yesterday|tomorrow|tonight|today)\b",
    re.IGNORECASE,
)


def summary_extract(messages: Sequence[Message], words: int, speakers: Speakers = UNNAMED) -> str:
    """The scene told by its own lines: the sentences that carry its facts, with their speakers
    by name (`story.speakers`), in story order, within `words` (`informative`); a card that
    joins, always."""
    said: list[tuple[int, str, str]] = []  # (order, speaker, sentence)
    for m in messages:
        if m.card is not None:
            said.append((len(said), "", f"{m.card.name} joins the story."))
            continue
        speaker, text = speakers.said(m)
        for sentence in sentences(text):
            said.append((len(said), speaker, sentence))
    rare = rare_words(" ".join(s for _, _, s in said))
    who = frozenset(speaker.lower() for _, speaker, _ in said)
    chosen = informative(said, rare, who, words)
    return "\n".join(f"{speaker}: {sentence}" if speaker else sentence for _, speaker, sentence in chosen)


def sentences(text: str) -> list[str]:
    """A message's sentences (its last one unended, too), each cut at `MOST_SENTENCE_WORDS`
    words and `MOST_SENTENCE_CHARS` characters. Linear in the text (`ENDS`)."""
    flat = " ".join(text.split())
    found, start = [], 0
    for end in ENDS.finditer(flat):
        stop = end.end()
        if stop == len(flat) or flat[stop] == " " or not FULL_WIDTH_ENDS.isdisjoint(end[0]):
            found.append(flat[start:stop].strip())
            start = stop
    found.append(flat[start:].strip())
    return [cut for cut in map(shortened, found) if cut]


def shortened(sentence: str) -> str:
    """`sentence` within `MOST_SENTENCE_WORDS` words and `MOST_SENTENCE_CHARS` characters, "…"
    where it was cut."""
    parts = sentence.split(" ", MOST_SENTENCE_WORDS)
    cut = " ".join(parts[:MOST_SENTENCE_WORDS])
    if len(cut) > MOST_SENTENCE_CHARS:
        cut = cut[:MOST_SENTENCE_CHARS]
        cut = cut.rsplit(" ", 1)[0] if " " in cut[MOST_SENTENCE_CHARS // 2 :] else cut
    return cut + ("…" if len(cut) < len(sentence) else "")


def rare_words(text: str) -> frozenset[str]:
    """The scene's content words said once in it: what it tells that nothing else in it repeats."""
    counted = Counter(w.lower() for w in WORD.findall(text))
    return frozenset(w for w, n in counted.items() if n == 1 and w not in STOPWORDS and len(w) > 3)


def facts(sentence: str, rare: frozenset[str], speakers: frozenset[str]) -> int:
    """How much a sentence tells: its names (a capitalised word that starts no sentence, but
    the scene's own speakers), its numbers and dates, and its rare words. A greeting ("Hey
    Gina!") tells nothing."""
    names = len(written_names(sentence) - speakers) + len(MONTHS.findall(sentence))
    numbers = len(NUMBER.findall(sentence))
    found = WORD.findall(sentence)
    if len(found) <= GREETING_WORDS and not names and not numbers:  # "Thanks, Gina!", "Woah, Jon!"
        return 0
    return names + 2 * numbers + sum(w.lower() in rare for w in found)


def informative(
    said: Sequence[tuple[int, str, str]], rare: frozenset[str], speakers: frozenset[str], words: int
) -> list[tuple[int, str, str]]:
    """The sentences that tell the most for their length, chosen until `words` (the first one
    always), back in story order. Deterministic: ties go to the earlier sentence."""
    if not said:
        return []
    sizes = {order: len(f"{speaker}: {sentence}".split()) for order, speaker, sentence in said}
    scores = {order: facts(sentence, rare, speakers) for order, _, sentence in said}
    ranked = sorted(said, key=lambda s: (-scores[s[0]] / (sizes[s[0]] + 2), s[0]))
    chosen: list[tuple[int, str, str]] = []
    count = 0
    for item in ranked:
        if chosen and (count + sizes[item[0]] > words or scores[item[0]] == 0):
            continue
        chosen.append(item)
        count += sizes[item[0]]
    return sorted(chosen)


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
