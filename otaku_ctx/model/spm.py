"""A SentencePiece GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral 7B, Phi-3, Gemma
1-3, Baichuan) counted as llama.cpp counts it, by ctx's own code: `tokenizers` has no model that
merges by llama.cpp's rule. Built from the vocabulary llama.cpp makes of the file (vocab.py).

llama.cpp tokenizes such a text in three steps (src/llama-vocab.cpp, `tokenize`, the SPM case):

1. **The partition** (`tokenizer_st_partition`): every control, user-defined and unknown token
   spelled in the text is cut out of it, the longest first, each left to right (`partition`);
   with `parse_special` off only the user-defined ones. A token llama.cpp gives a strip
   attribute by the model's name (Phi-3's) takes the spaces after (or before) it with it.
2. **The space prefix**: the first piece of text, and each piece after a special token, gets a
   space before it when `add_space_prefix` (the default for these vocabularies; Gemma's files
   turn it off); then every space is written `▁` (U+2581).
3. **The merges** (`llm_tokenizer_spm_session`): the piece's characters are merged, two
   neighbours at a time, always the pair whose joined text is the token of the highest score
   (the leftmost of equals), while any pair joins into a token; a character the vocabulary
   lacks is spelled in its bytes' tokens `<0xXX>` (byte fallback).

Merging never makes a text that is not a token, so it never joins two characters that no token
holds side by side. Cut where that is so (before a `▁` after a character no token holds before
a `▁`), a piece's tokens are its words' tokens, one after the other: each word is merged once
and remembered (`_word`), which is what makes pure Python fast enough here.
"""

from __future__ import annotations

import heapq
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError
from ..tokens import without_surrogates
from .gguf import Gguf
from .llamacpp import CONTROL, UNKNOWN, USER_DEFINED
from .vocab import LlamaVocab, llama_vocab, look_behind

SPACE = "\u2581"  # SentencePiece's "▁", which stands for a space in its tokens
WHITESPACE = " \t\n\v\f\r"  # what C's isspace strips beside a token with a strip attribute
WORDS_KEPT = 1 << 17  # words remembered with their tokens; the memory is emptied past it
LONGEST_KEPT = 64  # characters of the longest word remembered (a text of no spaces is one word)


@dataclass(frozen=True)
class Special:
    """A token llama.cpp cuts out of a text before merging: its text and id, whether it is cut
    only when special tokens are parsed (control and unknown ones; user-defined ones always),
    and the spaces it takes with it (llama.cpp's LSTRIP and RSTRIP attributes)."""

    text: str
    id: int
    parsed_only: bool
    lstrip: bool = False
    rstrip: bool = False


class SentencePiece:
    """llama.cpp's SentencePiece tokenizer over one vocabulary (see the module's docstring)."""

    def __init__(
        self,
        tokens: list[str],
        scores: tuple[float, ...],
        specials: Iterable[Special],
        *,
        add_space_prefix: bool,
    ) -> None:
        self.ids = {text: i for i, text in enumerate(tokens)}  # a text twice: its last id, as llama.cpp's map
        self.scores = scores
        self.add_space_prefix = add_space_prefix
        # llama.cpp's cache_special_tokens: the longest first (equals by id)
        self.specials = tuple(sorted(specials, key=lambda s: (-len(s.text), s.id)))
        self.longest = max((len(s.text) for s in self.specials), default=0)
        self._find = _finder([s.text for s in self.specials])
        self._prefixes = _prefixes([s.text for s in self.specials])
        self._bytes = [self._byte_token(b) for b in range(256)]
        # the characters some token holds right before a "▁": a "▁" after any other is a cut
        before = {text[at - 1] for text in tokens for at in _places(text, SPACE) if at}
        self._joins = before
        cut = f"(?<![{''.join(map(re.escape, sorted(before)))}])(?={SPACE})" if before else f"(?={SPACE})"
        self._cuts = re.compile(cut)
        self._words: dict[str, tuple[int, ...]] = {}

    def _byte_token(self, byte: int) -> int | None:
        """llama.cpp's byte_to_token: `<0xXX>`, else the byte as a text (an ASCII character)."""
        found = self.ids.get(f"<0x{byte:02X}>")
        if found is None and byte < 0x80:
            found = self.ids.get(chr(byte))
        return found

    # -- the three steps ----------------------------------------------------------------------

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """The token ids llama.cpp gives `text` (nothing added: `add_special` off)."""
        ids: list[int] = []
        after_special = True  # llama.cpp: "prefix with space if first token"
        for piece in self.partition(without_surrogates(text), parse_special):
            if isinstance(piece, int):
                ids.append(piece)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                piece = " " + piece
            ids += self._piece(piece.replace(" ", SPACE))
            after_special = False
        return ids

    def partition(self, text: str, parse_special: bool = True) -> list[str | int]:
        """Step 1: `text` as pieces of text and the ids of the special tokens cut out of it."""
        if not text:
            return []
        found = self._present(text)
        pieces: list[str | int] = [text]
        for special in self.specials:
            if special.text not in found or (special.parsed_only and not parse_special):
                continue
            cut: list[str | int] = []
            for piece in pieces:
                if isinstance(piece, int) or special.text not in piece:
                    cut.append(piece)
                else:
                    _cut(piece, special, cut)
            pieces = cut
        return pieces

    def _present(self, text: str) -> set[str]:
        """The special tokens spelled somewhere in `text`: the longest at each place, and those
        that begin it (shorter ones at the same place)."""
        if self._find is None:
            return set()
        found = {m.group(1) for m in self._find.finditer(text)}
        for text_ in list(found):
            found.update(self._prefixes.get(text_, ()))
        return found

    def _piece(self, piece: str) -> list[int]:
        """Steps 2-3 for one piece of text, its spaces already `▁`: word by word."""
        ids: list[int] = []
        for word in self._cuts.split(piece):
            if word:
                ids += self._word(word)
        return ids

    def _word(self, word: str) -> tuple[int, ...] | list[int]:
        known = self._words.get(word)
        if known is None:
            if len(word) > LONGEST_KEPT:
                return self._merged(word)
            if len(self._words) >= WORDS_KEPT:
                self._words.clear()
            known = self._words[word] = tuple(self._merged(word))
        return known

    def _merged(self, word: str) -> list[int]:
        """Step 3 (llm_tokenizer_spm_session): the highest-scoring pair that makes a token is
        merged first, the leftmost of equals, until no pair makes one; what is left and is no
        token is spelled in bytes."""
        ids, scores = self.ids, self.scores
        texts = list(word)  # each symbol's text; "" once merged into its left neighbour
        n = len(texts)
        after = [*range(1, n), -1]
        before = list(range(-1, n - 1))
        queue: list[tuple[float, int, int, int]] = []

        def pair(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                joined = texts[left] + texts[right]
                token = ids.get(joined)
                if token is not None:
                    heapq.heappush(queue, (-scores[token], left, right, len(joined)))

        for i in range(n - 1):
            pair(i, i + 1)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not texts[left] or not texts[right] or len(texts[left]) + len(texts[right]) != size:
                continue  # one of them was merged since
            texts[left] += texts[right]
            texts[right] = ""
            after[left] = after[right]
            if after[right] >= 0:
                before[after[right]] = left
            pair(before[left], left)
            pair(left, after[left])
        out: list[int] = []
        i = 0
        while i != -1:
            token = ids.get(texts[i])
            if token is not None:
                out.append(token)
            else:
                out += self._spelled(texts[i])
            i = after[i]
        return out

    def _spelled(self, char: str) -> list[int]:
        spelled = []
        for byte in char.encode("utf-8"):
            token = self._bytes[byte]
            if token is None:  # llama.cpp fails here too (token_to_id.at)
                raise ConfigError("tokenizer", None, f"the vocabulary has no token for the byte 0x{byte:02X}")
            spelled.append(token)
        return spelled

    # -- the pricer's context -----------------------------------------------------------------

    def context(self, text: str) -> str:
        """The end of `text` that decides how a text right after it is counted (see
        `TokenCounter.context`): from a space at or before the last LOOK_BEHIND characters
        (more, if a special token is longer) that is a cut, with another cut after it; `text`
        itself when there is none near.

        A cut is a space after a character that is no space and that no token holds before a
        `▁`, where no special token spelled in the text ends or crosses. No special token
        crosses it, and those that could cross into what follows lie after it (as in
        `hf.context_of`), so the pieces after it are the same in `text + after` and in the end
        alone; their words too, for no merge crosses a cut. The end alone begins a piece, so it
        gets the space prefix, and its first word differs: but that word ends at the second
        cut, which no special token crossing into what follows can reach (it lies before the
        last `longest` characters), and cancels in the difference of the two counts."""
        window = look_behind(text, self.longest)
        if window is None:
            return text
        lowest, target = window
        spans = self._spans(text, lowest)
        limit = len(text) - self.longest  # a special token that crosses into what follows begins after it
        at = text.rfind(" ", lowest, target + 1)
        while at > 0:
            if self._is_cut(text, at, spans):
                second = text.find(" ", at + 1, limit)
                while second != -1 and not self._is_cut(text, second, spans):
                    second = text.find(" ", second + 1, limit)
                return text[at:] if second != -1 else text
            at = text.rfind(" ", lowest, at)
        return text

    def _is_cut(self, text: str, at: int, spans: list[tuple[int, int]]) -> bool:
        previous = text[at - 1]
        if previous in WHITESPACE or previous in self._joins or previous == SPACE:
            return False
        return not any(start < at <= end for start, end in spans)

    def _spans(self, text: str, lowest: int) -> list[tuple[int, int]]:
        """Where any special token is spelled in `text` from `lowest - longest` on."""
        spans = []
        for special in self._present(text):
            start = text.find(special, max(0, lowest - len(special)))
            while start != -1:
                spans.append((start, start + len(special)))
                start = text.find(special, start + 1)
        return spans


def _cut(piece: str, special: Special, into: list[str | int]) -> None:
    """Every occurrence of `special` in `piece`, left to right, cut out as its id, with the
    spaces its strip attributes take."""
    token, start, end = special.text, 0, len(piece)
    while True:
        at = piece.find(token, start)
        if at < 0:
            break
        left = piece[start:at]
        if special.lstrip:
            left = left.rstrip(WHITESPACE)
        if left:
            into.append(left)
        into.append(special.id)
        start = at + len(token)
        if special.rstrip:
            while start < end and piece[start] in WHITESPACE:
                start += 1
    if start < end:
        into.append(piece[start:])


def _places(text: str, char: str) -> Iterable[int]:
    at = text.find(char)
    while at != -1:
        yield at
        at = text.find(char, at + 1)


def _finder(texts: list[str]) -> re.Pattern[str] | None:
    """A pattern that finds, at every place of a text, the longest of `texts` that begins there
    (a lookahead, so overlapping ones are all found), written as a trie: Python's regex engine
    tries an alternation's branches one by one, and Gemma has thousands of special tokens."""
    if not texts:
        return None
    trie: dict[str, dict] = {}
    for text in texts:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        inner = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a token ends here: a longer one is tried first
            return f"(?:{inner})?"
        return inner

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * max(map(len, texts)) + 100))
    try:
        return re.compile(f"(?=({pattern(trie)}))")
    finally:
        sys.setrecursionlimit(limit)


def _prefixes(texts: list[str]) -> dict[str, tuple[str, ...]]:
    """For each text, the others that begin it."""
    known = set(texts)
    begins = {text: tuple(text[:k] for k in range(1, len(text)) if text[:k] in known) for text in texts}
    return {text: found for text, found in begins.items() if found}


# -- from the vocabulary ---------------------------------------------------------------------


def sentencepiece(model: Gguf) -> SentencePiece:
    """The SentencePiece tokenizer of a GGUF whose `tokenizer.ggml.model` is "llama": its
    vocabulary read (vocab.py), then `from_vocab`."""
    return from_vocab(llama_vocab(model))


def from_vocab(vocab: LlamaVocab) -> SentencePiece:
    """The SentencePiece tokenizer of a vocabulary, with the token types and strip attributes
    llama.cpp gives its tokens when it loads them."""
    scores = vocab.scores or (0.0,) * len(vocab.tokens)
    parsed_only = {CONTROL: True, UNKNOWN: True, USER_DEFINED: False}
    cut_out = vocab.cut_out()
    lstrip, rstrip = vocab.strips([i for i, _, _ in cut_out])
    specials = [
        Special(text, i, parsed_only[kind], i in lstrip, i in rstrip)
        for i, text, kind in cut_out
        if vocab.ids[text] == i
    ]
    tokenizer = SentencePiece(list(vocab.tokens), scores, specials, add_space_prefix=vocab.space_prefix())
    if missing := [f"<0x{b:02X}>" for b in range(256) if tokenizer._bytes[b] is None]:
        message = f"has no byte token {missing[0]}, which llama.cpp fails on; use --tokenizer server"
        raise ConfigError(vocab.where, "tokenizer.ggml.tokens", message)
    return tokenizer
