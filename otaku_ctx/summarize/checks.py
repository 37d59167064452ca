"""Whether a reply is about its scene, before a word of it is written to the sidecar.

A small model sometimes echoes the prompt (its instructions, a placeholder), loops (one line or
phrase over and over), or writes about something else entirely. Any of those, written as a
summary, would stand in every later prompt as "what happened". Each part of a reply — the
summary, the title, the history — is checked against the scene and the prompt it answers:

- not empty;
- not a loop: no line makes up half of the lines (of three or more), no phrase of four words
  covers more than a third of the text, and no more than a fifth of a longer text's four-word
  phrases repeat one said before in it (a sentence said over and over);
- not the prompt's own words: at most a third of its five-word phrases occur in the prompt's
  instructions (a title: not mostly the instructions' words);
- an account, not a heading (a summary or a history): at least `LEAST_WORDS` words, and not
  written like a title, its content words nearly all capitalised; at least one word for
  every `SCENE_WORDS_PER_WORD` of what it tells (a summary: its scene; a history: the summary and
  the story so far it is rolled from), up to `BRIEF_FLOOR` ("A scene set by the 3rd of Frost,
  the VERMILION PLAYERS" does not tell a scene of a thousand words), and at most `OVERLONG`
  times the words its prompt asks for (a reply that does not stop rambles);
- about the scene (a summary or a history): it names one of the scene's speakers or named
  characters, when the scene has any, and at least `SCENE_WORD_SHARE` of its content words
  occur in the scene (for a history: in the scene or the story so far it was rolled from). A
  name is named as a name is written, capitalised: "the palace" does not name the Palace. A
  named character is a capitalised word that is no sentence's first and never written
  lower-case in the scene (so a word capitalised in a heading is not one), nor a day, a month,
  a title such as Herr or Mrs, or the pronoun I. It gives no year the scene does not (a
  four-digit number from 1000 to 2999 found in neither: a small model's invented "In 1923, a
  young man…"), and is not a string of numbers the scene does not hold (more than
  `NUMBER_SHARE` of its words: "1:35: 7:35: 2:47:"; "5,000" or "10:30" is one number). Where
  the scene reads as English (at least `ENGLISH_SHARE` of its words are English function
  words), whose capitals and names these rules know, a
  summary also names the scene's people once at least in every `WORDS_PER_NAME` of its words,
  and a reply does not name mostly what the scene never does: of the names it writes
  (capitalised, no sentence's first), at most `INVENTED_SHARE` may be words the scene never has
  ("German Jews that Hitler slaughtered in the Holocaust", of a dialogue about a ship's
  ledger). In German every noun is capitalised, and in Russian a name changes with its case
  (Мара, Марой): there a new noun or a name's other form is no invented name.

`rejected` says why a text fails, or None. The rule is docs/summarize.md's ("The checks every
reply must pass").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..story.words import NUMBER, STOPWORDS, WORD

NAME = re.compile(r"\b[A-Z][\w'’-]+", re.UNICODE)
# Capitalised words that name no one: the pronoun I, the days and months, titles before a name.
NOT_NAMES = frozenset(
    """i i'm i'd i'll i've monday tuesday wednesday thursday friday saturday sunday january february
    march april may june july august september october november december mr mrs ms miss dr sir
    madam lady lord herr frau fräulein monsieur madame mademoiselle señor señora""".split()
)
LOOP_LINE_SHARE = 0.5  # one line this share of the lines (of 3 or more) is a loop
LOOP_PHRASE = 4  # words in a phrase whose repeats are counted
LOOP_PHRASE_SHARE = 1 / 3  # repeats of one phrase covering this share of the words is a loop
ECHO_PHRASE = 5  # words in a phrase looked for in the prompt
ECHO_SHARE = 1 / 3  # this share of a text's phrases found in the prompt is an echo
# What the scene's own summaries in otaku's sample stories (tests/fixtures/otaku, by a large
# model) hold: at least 64 % of their content words occur in the scene, and a name of its
# people comes at least once every 35 words; what SmolLM2-135M wrote that passed before: 25 to
# 36 %, one name in 175 to 295 words.
SCENE_WORD_SHARE = 0.4  # at least this share of the content words must occur in the scene
WORDS_PER_NAME = 80  # a name of the scene's people at least once in every this many words
SHORT = 12  # a text of fewer words than this is judged by its words, not its phrases
LEAST_WORDS = 8  # a summary or a history of fewer words than this is a heading, not an account
# otaku's sample summaries hold a word for every 17 or fewer of their scene's; SmolLM2-135M's
# junk, one for every 50 ("The Bell Harrow: The Bank First, as asked, Second, and Third, …").
SCENE_WORDS_PER_WORD = 25  # a summary has at least one word for each this many of its scene's
BRIEF_FLOOR = 30  # ... but need not have more words than this
OVERLONG = 1.5  # a summary or a history of more than this times the words asked does not stop
TITLE_SHARE = 0.75  # a summary or a history this share of whose content words are capitalised is a title
REPEATS_FROM = 30  # a text of this many words or more is looked at for its phrases repeated
# otaku's sample summaries repeat none of their four-word phrases; SmolLM2-135M's looping
# histories ("Vane is a liar, and the story ends with a man named Ilse Bacher. Ilse Bacher is a
# liar, and …"), 27 % of them.
REPEAT_SHARE = 0.2  # more than this share of its four-word phrases repeating earlier ones is a loop
# otaku's sample summaries hold at most one number their scene does not; SmolLM2-135M's strings
# of times, 29 to 40 % of their words; a faithful summary may write as digits what its scene
# spells out ("5,000" for "five thousand crowns"), one number in 12 of its words.
NUMBER_SHARE = 0.1  # numbers the scene does not hold, more than this share of the words (and 3)
# otaku's sample summaries write at most 2 names in 25 that their scene never has;
# SmolLM2-135M's invented history, 7 in 11.
INVENTED_SHARE = 1 / 3  # names the scene never has, more than this share of the names (and 2)
# English function words (STOPWORDS) are 45 to 50 % of the words of otaku's sample scenes, none
# of a German or Russian scene's.
ENGLISH_SHARE = 0.25  # a scene at least this share of whose words are English function words reads as English
POSSESSIVE = re.compile(r"['’]s$")
SENTENCE_STARTS = frozenset(".!?:;]\"“'‘(*-–—")  # a capitalised word after one of these may start a sentence
NAME_STARTS = frozenset(".!?:]\"“'‘")  # ... for finding a scene's named characters (Scene.of), fewer
YEAR = re.compile(r"(?<![\w.,])[12]\d{3}(?!\d|[.,]\d)")
# Scripts written without spaces between words: kana, CJK ideographs, Thai, Lao, Khmer, Myanmar.
UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff]")


@dataclass(frozen=True)
class Scene:
    """What a reply is checked against: the scene's text, its speakers' and named characters'
    names, and the prompt's instructions (the prompt less the scene it shows)."""

    text: str
    names: frozenset[str]
    instructions: str
    words: int = 0  # the most words the prompt asks for (0: it does not say)
    english: bool = True  # it reads as English: its capitals and names are English's

    @classmethod
    def of(cls, text: str, speakers: Iterable[str], instructions: str, words: int = 0) -> Scene:
        """A scene's speakers, and the capitalised words of its text that are no sentence's first
        and never written lower-case in it (a named character, a place), by their lower-case
        form; a day, a month, a title or the pronoun I is none."""
        names = {s.lower() for s in speakers if s}
        told = WORD.findall(text)
        lower = {w for w in told if w[0].islower()}
        for match in NAME.finditer(text):
            if not starts_sentence(text, match.start(), NAME_STARTS) and match[0].lower() not in lower:
                names.add(match[0].lower())
        english = sum(w.lower() in STOPWORDS for w in told) >= ENGLISH_SHARE * len(told)
        return cls(text, frozenset(names - STOPWORDS - NOT_NAMES), instructions, words, english)


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


def starts_sentence(text: str, at: int, starts: frozenset[str] = SENTENCE_STARTS) -> bool:
    """Whether a word at `at` may start a sentence: nothing but blanks before it, or one of
    `starts` last before them."""
    while at > 0 and text[at - 1].isspace():
        at -= 1
    return at == 0 or text[at - 1] in starts


def written_names(text: str) -> set[str]:
    """The capitalised words of `text` that are no sentence's first, nor a day, a month, a title
    or the pronoun I, by their lower-case form and without a possessive 's."""
    found = {
        POSSESSIVE.sub("", m[0].lower())
        for m in WORD.finditer(text)
        if m[0][0].isupper() and not starts_sentence(text, m.start())
    }
    return found - STOPWORDS - NOT_NAMES


def phrases(items: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]


def looping(text: str) -> str | None:
    """Why `text` is a degenerate loop, or None."""
    lines = [" ".join(line.split()).lower() for line in text.splitlines() if line.strip()]
    if len(lines) >= 3:
        line, times = Counter(lines).most_common(1)[0]
        if times >= 3 and times / len(lines) >= LOOP_LINE_SHARE:
            return f"one line repeated {times} times ({line[:40]!r})"
    found = words(text)
    grams = phrases(found, LOOP_PHRASE)
    if len(grams) >= 8:
        gram, times = Counter(grams).most_common(1)[0]
        if times >= 3 and times * LOOP_PHRASE / len(found) > LOOP_PHRASE_SHARE:
            return f"the phrase {' '.join(gram)!r} repeated {times} times"
    if len(found) >= REPEATS_FROM:
        repeats = len(grams) - len(set(grams))
        if repeats / len(grams) > REPEAT_SHARE:
            return f"{repeats} of its {len(grams)} four-word phrases repeat earlier ones"
    return None


def heading(text: str) -> str | None:
    """Why `text` is a heading rather than an account of what happened (too short, or written
    like a title), or None."""
    letters = sum(c.isalpha() for c in text)
    if letters and len(UNSPACED.findall(text)) > letters / 3:  # words cannot be counted: characters are
        return f"it is too short to tell what happened ({letters} letters)" if letters < 2 * LEAST_WORDS else None
    found = WORD.findall(text)
    if len(found) < LEAST_WORDS:
        return f"it is too short to tell what happened ({len(found)} words)"
    content = [w for w in found if w.lower() not in STOPWORDS and len(w) > 2 and not w.isdigit()]
    capitalised = sum(w[0].isupper() for w in content)
    if len(content) >= 3 and capitalised / len(content) >= TITLE_SHARE:
        return "it is written like a title, not an account"
    return None


def brief(text: str, scene: Scene, also: str = "") -> str | None:
    """Why `text` is too brief to tell its scene and `also` (the story so far a history is rolled
    from): one word for every `SCENE_WORDS_PER_WORD` of theirs, up to `BRIEF_FLOOR` or half the
    words asked; or None. A text whose words cannot be counted passes."""
    if UNSPACED.search(text) or UNSPACED.search(scene.text) or UNSPACED.search(also):
        return None
    found, told = len(WORD.findall(text)), len(WORD.findall(scene.text)) + len(WORD.findall(also))
    least = min(BRIEF_FLOOR, told // SCENE_WORDS_PER_WORD, scene.words // 2 or BRIEF_FLOOR)
    if found < least:
        return f"it is too brief for its scene ({found} words for {told:,}; at least {least})"
    return None


def overlong(text: str, scene: Scene) -> str | None:
    """Why `text` runs far past the words its prompt asks for (more than `OVERLONG` times them),
    or None: a reply that does not stop where it was asked to rambles on ("This story is only
    about your experience in the 18th century…") until `max_tokens` cuts it. A text whose words
    cannot be counted passes."""
    if not scene.words or UNSPACED.search(text):
        return None
    found = len(WORD.findall(text))
    if found > scene.words * OVERLONG:
        return f"it runs on past the words asked ({found:,} words; at most {scene.words:,} asked)"
    return None


def echoing(text: str, instructions: str) -> str | None:
    """Why `text` is mostly the prompt's own words, or None."""
    found, said = words(text), words(instructions)
    if not found or not said:
        return None
    if len(found) < SHORT:  # a title, a placeholder: judged by its content words
        content = [w for w in found if w not in STOPWORDS]
        own = set(said)
        if not content or all(w in own for w in content):
            return "it is the prompt's own words"
        return None
    grams = phrases(found, ECHO_PHRASE)
    known = set(phrases(said, ECHO_PHRASE))
    copied = sum(g in known for g in grams)
    if grams and copied / len(grams) > ECHO_SHARE:
        return f"{copied} of its {len(grams)} phrases are the prompt's instructions"
    return None


def off_scene(text: str, scene: Scene, also: str = "", *, summary: bool = False) -> str | None:
    """Why `text` is not about the scene (`also`: other text it may draw on; `summary`: it tells
    this scene alone, so it names the scene's people as often as a summary does), or None."""
    found = words(text)
    # a language written without spaces (Japanese, Chinese): words cannot be told apart, so a
    # name is looked for in the text, and the share of the scene's words is not counted
    letters = sum(c.isalpha() for c in scene.text)
    unspaced = letters > 0 and len(UNSPACED.findall(scene.text)) > letters / 3
    lower = text.lower()
    # a name as a name is written, capitalised (a speaker's two words as a pair)
    written = [w.lower() for w in WORD.findall(text) if not w[0].islower()]
    pairs = {" ".join(pair) for pair in zip(written, written[1:], strict=False)}
    named = any(n in lower for n in scene.names) if unspaced else any(w in scene.names for w in (*written, *pairs))
    if scene.names and not named:
        return "it names no one of the scene"
    if unspaced:
        return None
    mentions = sum(w in scene.names for w in (*written, *pairs))
    if summary and scene.english and scene.names and mentions < len(found) // WORDS_PER_NAME:
        return f"it names the scene's people {mentions} times in {len(found)} words"
    content = [w for w in found if w not in STOPWORDS and not w.isdigit() and len(w) > 2]
    if not content:
        return "it holds no word of the scene"
    known = set(words(scene.text)) | set(words(also))
    invented = sorted(set(YEAR.findall(text)) - known)
    if invented:
        return f"it gives a year the scene does not ({', '.join(invented[:3])})"
    held = set(NUMBER.findall(scene.text)) | set(NUMBER.findall(also))
    numbers = [n for n in NUMBER.findall(text) if n not in held]
    if len(numbers) >= 3 and len(numbers) > NUMBER_SHARE * len(found):
        return f"{len(numbers)} numbers the scene does not hold in {len(found)} words"
    names = written_names(text) if scene.english else set()
    strange = sorted(names - known)
    if len(strange) >= 2 and len(strange) > INVENTED_SHARE * len(names):
        return f"it names what the scene never does ({', '.join(strange[:4])})"
    share = sum(w in known for w in content) / len(content)
    if share < SCENE_WORD_SHARE:
        return f"only {share:.0%} of its words occur in the scene"
    return None


def rejected(kind: str, text: str, scene: Scene, also: str = "") -> str | None:
    """Why the `kind` part ("summary", "history" or "title") of a reply cannot be written, or
    None when it can."""
    if not text.strip():
        return "it is empty"
    reason = looping(text) or echoing(text, scene.instructions)
    if reason is None and kind != "title":
        summary = kind == "summary"
        told = brief(text, scene, also)
        reason = heading(text) or told or overlong(text, scene) or off_scene(text, scene, also, summary=summary)
    return reason
