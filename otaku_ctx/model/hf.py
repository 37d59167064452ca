"""Counters built on Hugging Face's `tokenizers`: a model's own `tokenizer.json`, and a GGUF
file's vocabulary converted to one, counting as llama.cpp counts.

llama.cpp tokenizes a text in three steps (src/llama-vocab.cpp, `tokenize` with
`parse_special=true`): it cuts out every control, user-defined and unknown token spelled in
the text (longest first), splits the rest with the pre-tokenizer its `tokenizer.ggml.pre`
names (regexes of its own, applied one after the other), and merges each piece's bytes by
the GGUF's merge ranks. The converted tokenizer does the same three steps: those tokens as
added tokens (matched on the raw text, not normalized, not stripped), the same regexes as
`Split` pre-tokenizers then GPT-2's byte mapping, and a BPE model of the same vocabulary and
merges. Only the pre-tokenizers whose llama.cpp regexes are listed in `PRE_TOKENIZERS` are
converted (Gemma 4's SentencePiece-style BPE among them); any other, or a tokenizer that is
neither BPE nor SentencePiece (`spm.py`, ctx's own code), is refused in one line.

The conversion is cached as JSON under `locations.model_cache()`, keyed by the GGUF's
identity, and loaded on the first count: a build that takes only the GGUF's template or
window never reads the vocabulary. `tokenizers` is imported only then too.
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, OtakuError
from ..tokens import TokenCounter, without_surrogates
from . import INSTALL
from .gguf import CONTROL, NORMAL, TOKENS, UNKNOWN, USER_DEFINED, Gguf, read_gguf

CONVERTER = 3  # the conversion's own version, part of the cache's key: bump it when the output changes
TOKENIZER_JSON_BOUND = 64 << 20  # bytes; Gemma's 256k vocabulary is ~35 MB
# items of a tokenizer.json's lists and objects (counted by their commas): its vocabulary, its
# merges. Llama 3's ~700,000, Gemma 3's ~1,300,000; `tokenizers` takes ~300 bytes of memory each.
TOKENIZER_JSON_ITEMS = 2_000_000
BATCH = 64  # texts encoded in one call of `encode_batch_fast`

# -- llama.cpp's pre-tokenizers (llama-vocab.cpp: llm_tokenizer_bpe, and its table of names) ---

# The regexes as llama.cpp applies them: its GPT-2 pattern is run by a hand-written splitter
# that also splits any other run of spaces (the regex's own `|\s+`, written out here); its
# Llama 3 and Qwen 2 patterns spell the contractions' case-insensitivity out ('[sS]), as
# llama.cpp's adapted patterns do (a case-folding `(?i:...)` would also take "'ſ").
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DIGIT = r"\p{N}"
# Tekken's (Mistral Nemo): llama.cpp runs its pattern through std::regex on text where each
# non-ASCII character stands for its class, so a non-ASCII letter is both an upper- and a
# lower-case one there, as `[^a-z]` and `[^A-Z]` after a letter lookahead say on the real text.
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 3.5's: Qwen 2's, with marks (\p{M}) among the letters.
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's (Llama 4), the same letters with contractions, and digits three at a time.
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """One of llama.cpp's BPE pre-tokenizers: its regexes in order, and whether a piece that is
    itself a token skips the merges (llama.cpp's `ignore_merges`)."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    context: bool = True  # whether `context_of`'s argument holds for it
    # SentencePiece-style BPE (Gemma 4): spaces written "▁", the merges on raw UTF-8, and a
    # character the vocabulary lacks spelled in its bytes' tokens `<0xXX>`
    spaces: bool = False


_SMOLLM = PreTokenizer((DIGIT, GPT2))
_GPT2 = PreTokenizer((GPT2,))
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True)
_LLAMA3_MERGED = PreTokenizer((LLAMA3,))
_QWEN2 = PreTokenizer((QWEN2,))
_TEKKEN = PreTokenizer((TEKKEN,), ignore_merges=True)
_GPT4O = PreTokenizer((GPT4O,))
_QWEN35 = PreTokenizer((QWEN35,))
# Falcon's: runs of punctuation and ASCII symbols apart, GPT-2's splitter, then three ASCII digits
# apart; DeepSeek Coder's: newlines, letters, punctuation, CJK and Hangul runs, digits one by one
# (each a `std::regex` in llama.cpp on its classes of the characters, which these say on the text;
# it runs the CJK one on text where a non-ASCII space is a vertical tab: U+1680 and U+3000 lie in its
# range U+0800-U+4E00 and are no CJK there)
_FALCON = PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"), context=False)
_CJK = "(?:(?!\\s)[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff])+"
_DEEPSEEK_CODER = PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, DIGIT), context=False)
# DeepSeek LLM's: newlines; cased letters (the class its tokenizer.json names); ASCII and
# fullwidth punctuation and quotes; trailing spaces; CJK and Hangul runs; digit runs
_CASED = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM = PreTokenizer(
    (
        r"[\r\n]",
        rf"\s?[{_CASED}]+",
        "\\s?(?:(?!\\s)[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002])+",
        r"\s+\z",
        _CJK,
        r"\p{N}+",
    ),
    context=False,
)
# Gemma 4's: lines and runs of newlines, each merged whole (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4)
GEMMA4 = PreTokenizer((r"[^\n]+|[\n]+",), spaces=True, context=False)

# `tokenizer.ggml.pre` -> the pre-tokenizer llama.cpp uses for it. Those llama.cpp splits with
# its hand-written splitters (GPT-2, Llama 3, Qwen 2) or with a regex whose meaning, under its
# std::regex emulation of Unicode classes, the regex here says on the real text (each proved
# against llama-server: tests/realserver/test_model_hf_real.py, test_llama_vocab_real.py).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"), _SMOLLM
    ),
    **dict.fromkeys(
        ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum"), _GPT2
    ),
    **dict.fromkeys(("modern-bert", "mpt", "olmo", "jais", "exaone4", "trillion", "granite-docling"), _GPT2),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    **dict.fromkeys(("glm4", "glm5"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), _LLAMA3_MERGED),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), _QWEN2
    ),
    "tekken": _TEKKEN,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m"), GEMMA4),
    "qwen35": _QWEN35,
    "falcon": _FALCON,
    "deepseek-coder": _DEEPSEEK_CODER,
    "deepseek-llm": _DEEPSEEK_LLM,
}


# -- the counters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """A loaded tokenizer and what the counter says of its model: its control tokens' texts,
    its BOS text, the tokens its server adds to a prompt, and (for a vocabulary whose special
    tokens overlap, where `tokenizers`' leftmost-longest matching and llama.cpp's longest-first
    partition differ) llama.cpp's partition of a text into (plain texts, special tokens)."""

    tokenizer: Any
    specials: tuple[str, ...]
    bos: str
    added: int
    split: Callable[[str], tuple[list[str], int]] | None = None
    matched: tuple[str, ...] = ()  # every token matched in the text before pre-tokenizing
    unknown: int | None = None  # the id standing for a byte the vocabulary lacks, counted as nothing
    # a tokenizer of ctx's own (SentencePiece, `spm.py`) in place of `tokenizer`: a text's ids,
    # and the end of a text that decides how what follows it is counted
    encode: Callable[[str], list[int]] | None = None
    context: Callable[[str], str] | None = None
    source: str = "tokenizer"  # the file an error while counting names


class ModelCounter(TokenCounter):
    """A `TokenCounter` over a `tokenizers.Tokenizer` loaded on first use (a count, or asking
    for `specials`, `bos` or `added`), which also counts many texts in batches (`count_many`).
    It parses a text's special tokens, as the model's server does."""

    def __init__(self, name: str, load: Callable[[], Loaded], *, context: bool = False) -> None:
        super().__init__(name, self._one, context=self._end if context else None, parses_specials=True)
        self._load = load
        self._loaded: Loaded | None = None
        self._counted: dict[str, int] = {}  # counted by `count_many`, not yet asked for one by one

    def loaded(self) -> Loaded:
        """The tokenizer and its facts, loaded now if they were not yet."""
        if self._loaded is None:
            self._loaded = self._load()
        return self._loaded

    # TokenCounter's facts of the model, read from the tokenizer when first asked for
    @property
    def specials(self) -> tuple[str, ...]:
        return self.loaded().specials

    @property
    def bos(self) -> str:
        return self.loaded().bos

    @property
    def added(self) -> int:
        return self.loaded().added

    def _end(self, text: str) -> str:
        loaded = self.loaded()
        if loaded.context is not None:
            return loaded.context(text)
        return context_of(text, loaded.matched)

    def _one(self, text: str) -> int:
        known = self._counted.pop(text, None)
        if known is not None:
            return known
        return self._encoded([text])[0]

    def _encoded(self, texts: list[str]) -> list[int]:
        loaded = self.loaded()
        if loaded.encode is not None:
            return [len(loaded.encode(text)) for text in texts]
        unknown = loaded.unknown

        def length(ids: list[int]) -> int:
            return len(ids) - (ids.count(unknown) if unknown is not None else 0)

        if loaded.split is None:
            return [length(ids) for ids in _batch(loaded.tokenizer, texts, loaded.source)]
        counts = []
        for text in texts:
            plain, specials = loaded.split(text)
            counts.append(specials + sum(length(ids) for ids in _batch(loaded.tokenizer, plain, loaded.source)))
        return counts

    def ids(self, text: str) -> list[int]:
        """The model's token ids for `text` (what `ctx replay` compares prompt by prompt). Where
        special tokens overlap, `tokenizers`' own partition stands in for llama.cpp's: the ids
        may differ there, never the count."""
        loaded = self.loaded()
        if loaded.encode is not None:
            return loaded.encode(text)
        ids = _batch(loaded.tokenizer, [text], loaded.source)[0]
        return [i for i in ids if i != loaded.unknown] if loaded.unknown is not None else list(ids)

    def count_many(self, texts: Iterable[str]) -> list[int]:
        """The counts of `texts`, those not counted before encoded together in batches."""
        texts = list(texts)
        fresh = list(dict.fromkeys(t for t in texts if t not in self._counted and not self.known(t)))
        for start in range(0, len(fresh), BATCH):
            chunk = fresh[start : start + BATCH]
            self._counted.update(zip(chunk, self._encoded(chunk), strict=True))
        return [self(text) for text in texts]

    def known(self, text: str) -> bool:
        """Whether `text` was counted already (its count is cached)."""
        return self._cache.get(text) is not None


_MARKUP = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]")  # <think>, <|start|>, [TOOL_CALLS]: a token's own markup
_ADDED = (CONTROL, USER_DEFINED, UNKNOWN)  # the types llama.cpp cuts out of a text before pre-tokenizing


def controls(added: Iterable[Any]) -> tuple[str, ...]:
    """The texts story text must not spell: the special added tokens, and the user-defined
    (non-special) ones that look like markup (`<think>`, `<tool_call>`, gpt-oss's
    `<|channel|>`), which llama.cpp and `tokenizers` match in any text just the same. A
    user-defined token of plain text (a run of spaces, a word) is left alone."""
    return tuple(dict.fromkeys(t.content for t in added if t.content and (t.special or _MARKUP.fullmatch(t.content))))


def _batch(tokenizer: Any, texts: list[str], where: str = "tokenizer") -> list[Any]:
    if not texts:
        return []
    try:
        if len(texts) == 1:
            return [tokenizer.encode(texts[0], add_special_tokens=False).ids]
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    except TypeError:  # a lone surrogate, which no UTF-8 text holds: counted as U+FFFD, as cl100k_base does
        return _batch(tokenizer, [without_surrogates(text) for text in texts], where)
    except BaseException as exc:  # a panic in the Rust tokenizer (pyo3's PanicException is no Exception)
        if type(exc).__name__ != "PanicException":
            raise
        raise ConfigError(where, None, f"its tokenizer broke down on a text: {_first_line(exc)}") from None


def gguf_counter(path: Path, model: Gguf | None = None) -> ModelCounter:
    """A counter that counts a text as llama.cpp does with this GGUF's vocabulary
    (`parse_special=true`, nothing added): checked now, loaded on first use."""
    model = read_gguf(path) if model is None else model
    added = int(model.add_bos) + int(model.add_eos)
    if model.tokenizer_model == "llama":
        return _sentencepiece_counter(model, added)
    pre = _supported(model)
    label = f"gguf {model.path.name} (BPE, {model.vocab_size:,} tokens)"

    def load() -> Loaded:
        tokenizer = _cached_tokenizer(model, pre)
        decoder = tokenizer.get_added_tokens_decoder()
        matched = [t.content for _, t in sorted(decoder.items())]
        specials = controls(t for _, t in sorted(decoder.items()))
        split = _partition(matched) if _overlapping(matched) else None
        unknown = tokenizer.token_to_id(UNKNOWN_BYTE)
        bos = model.bos_text if model.add_bos else ""  # only a BOS the server adds is left to it
        return Loaded(tokenizer, specials, bos, added, split, tuple(matched), unknown)

    return ModelCounter(label, load, context=pre.context)


def _newlines_merge_whole(model: Gguf, tokenizer: Any) -> None:
    """Gemma 4's piece of newlines that is itself a token is that token in llama.cpp, merges or
    not (llama-vocab.cpp: "fix for gemma 4"); the converted tokenizer merges it. Where the
    merges do not make it whole the two differ (and which llama.cpp a user runs, before or after
    that fix, decides): refused. Gemma 4's own merges make every one whole."""
    for i, text in enumerate(model.typed_tokens()[0]):
        if text and not text.strip("\n") and tokenizer.encode(text, add_special_tokens=False).ids != [i]:
            message = f"its merges do not make the token {text!r} whole, as llama.cpp takes it; use --tokenizer server"
            raise ConfigError(str(model.path), "tokenizer.ggml.merges", message)


def _sentencepiece_counter(model: Gguf, added: int) -> ModelCounter:
    """A SentencePiece GGUF's counter: llama.cpp's algorithm in ctx's own code (`spm.py`)."""
    label = f"gguf {model.path.name} (SentencePiece, {model.vocab_size:,} tokens)"
    if TOKENS not in model.metadata:
        raise ConfigError(str(model.path), TOKENS, "is missing: the file has no vocabulary")

    def load() -> Loaded:
        from .spm import sentencepiece

        tokenizer = sentencepiece(model)
        bos = model.bos_text if model.add_bos else ""
        return Loaded(None, gguf_controls(model), bos, added, encode=tokenizer.encode, context=tokenizer.context)

    return ModelCounter(label, load, context=True)


def gguf_controls(model: Gguf) -> tuple[str, ...]:
    """The control tokens `gguf_counter` names (its `specials`), from the GGUF's tokens and
    their types alone: nothing converted, no merges read, no `tokenizers`, and of any kind of
    tokenizer (a SentencePiece GGUF too), for the model a server counts. A fill-in-the-middle
    text llama.cpp would pick by its hash order is taken, whichever it picks; a file with no
    tokens names none."""
    if TOKENS not in model.metadata:
        return ()
    tokens, vocab, types = llama_cpp_vocabulary(model, *model.typed_tokens(), strict=False)
    # the added tokens as `tokenizers` keeps those of `gguf_tokenizer_json`: one for each text,
    # at the id the vocabulary gives it, special as its last entry says
    special = {text: kind != USER_DEFINED for text, kind in zip(tokens, types, strict=False) if kind in _ADDED}
    return tuple(text for text in sorted(special, key=vocab.__getitem__) if special[text] or _MARKUP.fullmatch(text))


def llama_cpp_vocabulary(
    model: Gguf, tokens: tuple[str, ...], types: tuple[int, ...], *, strict: bool = True
) -> tuple[list[str], dict[str, int], list[int]]:
    """The GGUF's tokens (an empty one by llama.cpp's name for it), each text's id (a text twice:
    the last id, as llama.cpp's map keeps) and the types llama.cpp works with."""
    named = [text or f"[EMPTY_{i}]" for i, text in enumerate(tokens)]  # llama.cpp's name for ""
    vocab = {text: i for i, text in enumerate(named)}
    return named, vocab, llama_cpp_types(model, vocab, list(types or (NORMAL,) * len(named)), strict=strict)


UNKNOWN_BYTE = "\x00ctx: a byte with no token\x00"  # never a token's text: its NULs are no GGUF token's


def _byte_chars() -> tuple[str, ...]:
    """GPT-2's characters for the 256 bytes, as ByteLevel maps them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return tuple(chars)


_BYTE_CHARS = _byte_chars()

LOOK_BEHIND = 64  # characters of a text kept before what follows it (`context_of`)


def context_of(text: str, matched: tuple[str, ...]) -> str:
    r"""The end of `text` that decides how a text right after it is counted (see
    `TokenCounter.context`): from a space before a letter at or before the last LOOK_BEHIND
    characters (more, if a special token is longer), where no special token spelled in the
    text crosses; `text` itself when there is none near.

    Why that is exact, for every pre-tokenizer in PRE_TOKENIZERS: llama.cpp first cuts out the
    special tokens; none crosses the cut, and every one that could cross into what follows
    lies after it, so the cut parts are cut out the same in `text`, in `text + after` and in
    the end alone. Then each of these patterns finds its pieces left to right, none looking
    behind, and a piece that ends before the end of `text` is decided by `text` alone; a piece
    starts at a space before a letter (the piece before it ends there: a letter, digit or
    symbol run stops at the space, a run of spaces gives its last one back to `\s+(?!\S)`,
    and digits are cut apart on their own), so the pieces before the cut are the same in
    `text` and `text + after`, and merges never cross pieces. Those pieces cancel in the
    difference of the two counts, as in `tokens.cl100k_context`."""
    reach = max([LOOK_BEHIND, *map(len, matched)])
    if len(text) <= 2 * reach:
        return text
    target = len(text) - reach
    lowest = max(1, target - 4 * reach)
    at = text.rfind(" ", lowest, target + 1)
    while at > 0:
        following = text[at + 1]
        if following.isalpha() and not following.isnumeric() and not _crossed(text, at, matched):
            return text[at:]
        at = text.rfind(" ", lowest, at)
    return text


def _crossed(text: str, cut: int, matched: tuple[str, ...]) -> bool:
    """Whether a special token spelled in `text` begins before `cut` and ends after it."""
    for special in matched:
        n = len(special)
        window = text[max(0, cut - n + 1) : cut + n - 1]
        start = window.find(special)
        while start >= 0:
            begins = max(0, cut - n + 1) + start
            if begins < cut < begins + n:
                return True
            start = window.find(special, start + 1)
    return False


def _supported(model: Gguf) -> PreTokenizer:
    where = str(model.path)
    if model.tokenizer_model not in ("gpt2", "gemma4"):
        kind = model.tokenizer_model or "none"
        message = f"ctx does not count the {kind!r} tokenizer itself; use --tokenizer server"
        raise ConfigError(where, "tokenizer.ggml.model", message)
    name = "gemma4" if model.tokenizer_model == "gemma4" else model.pre or "default"  # as llama.cpp sets it
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        message = f"ctx does not count the {name!r} pre-tokenizer itself; use --tokenizer server"
        raise ConfigError(where, "tokenizer.ggml.pre", message)
    if _strips_spaces(model):
        message = (
            "llama.cpp strips the spaces beside this model's special tokens, which ctx does not; use --tokenizer server"
        )
        raise ConfigError(where, "general.name", message)
    _require_tokenizers()
    return pre


def _strips_spaces(model: Gguf) -> bool:
    """Whether llama.cpp gives this model's special tokens its strip attributes by name
    (llama-vocab.cpp, "set attributes by model/tokenizer/architecture name"): Phi-3's strip
    the spaces after them, a `<mask>` or `[MASK]` the spaces before it."""
    name = (model.name or "").lower()
    pre = model.pre or ""
    return (
        any(part in name for part in ("phi-3", "phi3", "modern-bert"))
        or any(part in pre for part in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
        or any(part in model.architecture for part in ("nomic-bert-moe", "jina-bert-v3"))
    )


def _overlapping(texts: list[str]) -> bool:
    """Whether two of the texts could overlap in a text (an end of one begins another), where
    matching them leftmost-longest and llama.cpp's longest-first would differ. Only the ends
    that begin with some text's first character are looked up, in the sorted texts."""
    ordered = sorted(set(texts))
    firsts = {t[0] for t in ordered if t}
    for text in ordered:
        for k in range(1, len(text)):
            if text[k] not in firsts:
                continue
            end = text[k:]
            at = bisect_left(ordered, end)
            if at < len(ordered) and ordered[at].startswith(end) and ordered[at] != end:
                return True
    return False


def _partition(texts: list[str]) -> Callable[[str], tuple[list[str], int]]:
    """llama.cpp's partition (tokenizer_st_partition): for each special token, longest first,
    every occurrence in every plain fragment is cut out, left to right."""
    ordered = sorted(texts, key=len, reverse=True)

    def split(text: str) -> tuple[list[str], int]:
        fragments, found = [text], 0
        for special in ordered:
            cut: list[str] = []
            for fragment in fragments:
                pieces = fragment.split(special)
                found += len(pieces) - 1
                cut += [p for p in pieces if p]
            fragments = cut
        return fragments, found

    return split


# -- the conversion ---------------------------------------------------------------------------


def gguf_tokenizer_json(model: Gguf, pre: PreTokenizer | None = None) -> dict[str, Any]:
    """The GGUF's vocabulary as a `tokenizer.json` (a dict) that tokenizes as llama.cpp does."""
    pre = _supported(model) if pre is None else pre
    vocabulary = model.vocabulary()
    where = str(model.path)
    tokens, vocab, types = llama_cpp_vocabulary(model, vocabulary.tokens, vocabulary.token_types)
    # A byte the vocabulary has no token for stays between its neighbours in llama.cpp (they
    # never merge across it) and then counts as nothing; `tokenizers` would drop it before
    # merging, joining them. It is kept as an unknown token of an id past the vocabulary's,
    # which the counter does not count.
    unknown = None
    if pre.spaces:
        # llama.cpp spells a character the vocabulary lacks in its bytes' tokens, and leaves
        # out a byte that has none; `tokenizers` would take the whole character as unknown
        if missing := [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab]:
            message = f"has no byte token {missing[0]}, which llama.cpp leaves out; use --tokenizer server"
            raise ConfigError(where, TOKENS, message)
    elif any(char not in vocab for char in _BYTE_CHARS):
        unknown = UNKNOWN_BYTE
        vocab[UNKNOWN_BYTE] = len(tokens)
    if not vocabulary.merges:  # llama.cpp refuses such a file too ("cannot find tokenizer merges")
        raise ConfigError(where, "tokenizer.ggml.merges", "is missing: a BPE vocabulary needs its merges")
    merges = _merges(where, vocabulary.merges, vocab)
    added = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind != USER_DEFINED,
        }
        for i, (text, kind) in enumerate(zip(tokens, types, strict=False))
        if kind in _ADDED
    ]
    splits = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False} for regex in pre.regexes
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": spaces if pre.spaces else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits if pre.spaces else [*splits, byte_level]},
        "post_processor": None,
        "decoder": None if pre.spaces else byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unknown,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": pre.spaces,
            "ignore_merges": pre.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }


# llama.cpp changes some tokens' types by their text when it loads a vocabulary
# (llama-vocab.cpp, load, "special tokens"): which of them it then cuts out of a text changes.
_EOG = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)  # fmt: skip
# A fill-in-the-middle token the file names no id for: the first of these texts llama.cpp finds.
_FIM: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("fim_pre_token_id", "prefix_token_id"), (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
        "<|code_prefix|>", "<|prefix|>")),
    (("fim_suf_token_id", "suffix_token_id"), (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
        "<|code_suffix|>", "<|suffix|>")),
    (("fim_mid_token_id", "middle_token_id"), (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
        "<|code_middle|>", "<|middle|>")),
    (("fim_pad_token_id",), ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    (("fim_rep_token_id",), ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    (("fim_sep_token_id",), ("<|file_sep|>",)),
)  # fmt: skip
_ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined


def llama_cpp_types(model: Gguf, vocab: dict[str, int], types: list[int], *, strict: bool = True) -> list[int]:
    """The token types llama.cpp works with: the file's, with the changes llama.cpp makes by a
    token's text (an end-of-generation or fill-in-the-middle text becomes a control token;
    gpt-oss's channel tokens and, beside `<|return|>` and `<|call|>`, `<|end|>` user-defined;
    `</s>` ordinary beside `<|tool_response>`). Where llama.cpp's choice depends on the order
    of its hash map (two candidates for one fill-in-the-middle token, not both control), refused
    when `strict`; else both are taken as control tokens."""
    types = list(types)

    def control(text: str) -> None:
        if text in vocab and types[vocab[text]] != CONTROL:
            types[vocab[text]] = CONTROL

    for keys, texts in _FIM:
        said = [model.metadata.get(f"tokenizer.ggml.{key}") for key in keys]
        if any(isinstance(i, int) and 0 <= i < len(types) for i in said):
            continue
        found = [text for text in texts if text in vocab]
        if strict and len(found) > 1 and any(types[vocab[text]] != CONTROL for text in found):
            message = f"llama.cpp picks one of {', '.join(found)} by its hash order; use --tokenizer server"
            raise ConfigError(str(model.path), "tokenizer.ggml.token_type", message)
        for text in found:
            control(text)
    for text in _EOG:
        control(text)
    for text in _ALWAYS_SHOWN:
        if text in vocab:
            types[vocab[text]] = USER_DEFINED
    has = set(vocab)
    if "<|end|>" in has and (
        ("<|return|>" in has and ("<|call|>" in has or "<|calls|>" in has))
        or (("<|call|>" in has or "<|calls|>" in has) and "<|flush|>" in has)
    ):
        types[vocab["<|end|>"]] = USER_DEFINED
    if "</s>" in has and ("<|tool_response>" in has or model.eos_text == "<|plamo:eos|>"):
        types[vocab["</s>"]] = NORMAL
    return types


def _merges(where: str, merges: tuple[str, ...], vocab: dict[str, int]) -> list[str] | list[list[str]]:
    """The merges as `tokenizers` reads them, split as llama.cpp splits them (at the first space
    after the first byte), a merge given twice kept at its first rank. A merge of tokens the
    vocabulary lacks, or whose result it lacks, is one llama.cpp would make and then spell out
    in bytes, which a `tokenizers` BPE cannot express: refused.

    When every merge holds one space, as a byte-level vocabulary's do (its space is `Ġ`), they
    are the GGUF's own strings, which `tokenizers` splits at that space as llama.cpp does: no
    pair is made of each (a million merges are 170 MB of pairs). Else, pairs."""
    unique = dict.fromkeys(merges)  # in order, each once
    one_space = True
    for merge in unique:
        cut = merge.find(" ", 1)
        first, second = (merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", "")
        if first not in vocab or second not in vocab or first + second not in vocab:
            raise ConfigError(
                where,
                "tokenizer.ggml.merges",
                f"merge {merges.index(merge)} ({merge!r}) joins tokens the vocabulary lacks; use --tokenizer server",
            )
        one_space = one_space and merge.count(" ") == 1
    if one_space:
        return list(unique)
    return [[merge[: (cut := merge.find(" ", 1))], merge[cut + 1 :]] for merge in unique]


def _cached_tokenizer(model: Gguf, pre: PreTokenizer) -> Any:
    """The converted tokenizer: from the cache when it is there and loads, else converted now
    and cached (written atomically; a cache that cannot be written only costs the next run)."""
    from tokenizers import Tokenizer

    from ..files import write_atomic

    cached = _cache_file(model)
    if cached.is_file():
        try:
            return Tokenizer.from_file(str(cached))
        except Exception:  # a damaged cache file: converted again below, and replaced
            pass
    data = _dumps(gguf_tokenizer_json(model, pre))  # the dict is gone once its JSON is made
    try:
        tokenizer = Tokenizer.from_buffer(data)  # the bytes as they are: no str of them
    except Exception as exc:
        raise ConfigError(str(model.path), None, f"its vocabulary does not convert: {_first_line(exc)}") from None
    if pre.spaces:
        _newlines_merge_whole(model, tokenizer)  # checked once, before the conversion is cached
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cached, data)
    except (OSError, OtakuError):  # a cache that cannot be written costs only the next run's time
        pass
    return tokenizer


def _cache_file(model: Gguf) -> Path:
    from ..locations import model_cache

    return model_cache() / f"gguf-{CONVERTER}-{model.identity}.tokenizer.json"


def _dumps(value: object) -> bytes:
    try:
        import orjson

        return orjson.dumps(value)
    except ImportError:  # pragma: no cover - orjson is a dependency
        import json

        return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _require_tokenizers() -> None:
    """Fail now, in one line, if `tokenizers` is not installed (without importing it)."""
    import importlib.util

    if importlib.util.find_spec("tokenizers") is None:
        raise ConfigError("tokenizer", None, f"counting with a model's own tokenizer needs `tokenizers`: {INSTALL}")


# -- a Hugging Face tokenizer.json ------------------------------------------------------------


def tokenizer_json_counter(path: Path) -> ModelCounter:
    """A counter of a Hugging Face `tokenizer.json` (or a model folder holding one) that counts
    a text as transformers encodes it without adding special tokens (its special tokens spelled
    in the text are the tokens they are); `added` is what its post-processor adds to a prompt,
    `bos` the folder's tokenizer_config.json `bos_token`. Checked now, loaded on first use."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        what = "no tokenizer.json in this folder" if path.is_dir() else "no such tokenizer file"
        raise ConfigError(str(path), None, what if not file.exists() else "is not a regular file")
    _require_tokenizers()
    shown = file.parent.name if file.name == "tokenizer.json" and file.parent.name else file.name

    def load() -> Loaded:
        from tokenizers import Tokenizer

        text = _text(file)
        if (items := text.count(",") + 1) > TOKENIZER_JSON_ITEMS:
            message = f"holds over {TOKENIZER_JSON_ITEMS:,} items ({items:,}); no model's vocabulary is that large"
            raise ConfigError(str(file), None, message)
        _check_regexes(file, text)
        try:  # parsed once, by `tokenizers`: json's dict of a large vocabulary would double the memory
            tokenizer = Tokenizer.from_str(text)
        except Exception as exc:
            why = _first_line(exc)
        else:
            decoder = tokenizer.get_added_tokens_decoder()
            specials = controls(t for _, t in sorted(decoder.items()))
            added = len(tokenizer.encode("", add_special_tokens=True).ids)
            return Loaded(tokenizer, specials, _bos_text(file.parent, tokenizer), added, source=str(file))
        raise ConfigError(str(file), None, _not_loaded(text, why))

    return ModelCounter(f"tokenizer.json {shown}", load)


def _not_loaded(text: str, why: str) -> str:
    """Why a tokenizer.json `tokenizers` refused does not load, said as JSON sees it first."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON (line {exc.lineno}); is it a tokenizer.json?"
    except ValueError:  # a number past Python's int-conversion limit
        return f"holds a number of more than {sys.get_int_max_str_digits():,} digits; is it a tokenizer.json?"
    except RecursionError:
        return "nests too deep to be a tokenizer.json"
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return "is not a Hugging Face tokenizer.json (it has no model)"
    return f"does not load as a tokenizer: {why}"


# A regex of a tokenizer.json (a `Split` pre-tokenizer's, a `Replace` normalizer's), as JSON spells it
_REGEX = re.compile(r'"Regex"\s*:\s*("(?:[^"\\]|\\.)*")')


def _check_regexes(file: Path, text: str) -> None:
    """Refuse a regex that repeats a group holding a repetition (`(a+)+`): Oniguruma, the
    engine `tokenizers` runs it in, backtracks on it until its retry limit, and the Rust
    tokenizer then panics on the text."""
    import json

    for found in _REGEX.finditer(text):
        try:
            regex = json.loads(found[1])
        except ValueError:
            continue
        if isinstance(regex, str) and nested_repetition(regex):
            message = f"its regex {regex[:80]!r} repeats a repetition, which the tokenizer cannot run on a long text"
            raise ConfigError(str(file), None, message)


def nested_repetition(regex: str) -> bool:
    """Whether the regex repeats without bound a group that holds an unbounded repetition:
    `(a+)+`, `(?:a*b)*`, `((a+)+)+c` — the shape that backtracks exponentially."""
    inner: list[bool] = []  # for each open group: whether it holds an unbounded repetition
    i, n = 0, len(regex)

    def unbounded(at: int) -> bool:
        if at < n and regex[at] in "+*":
            return True
        shape = re.match(r"\{\d*,\}", regex[at:])
        return shape is not None

    while i < n:
        char = regex[i]
        if char == "\\":
            i += 2
            if i <= n and unbounded(i) and inner:
                inner[-1] = True
            continue
        if char == "[":  # a class: skipped whole (`]` first, escapes and POSIX `[:...:]` inside)
            i += 1
            if i < n and regex[i] == "^":
                i += 1
            if i < n and regex[i] == "]":
                i += 1
            while i < n and regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
            i += 1
            if unbounded(i) and inner:
                inner[-1] = True
            continue
        if char == "(":
            inner.append(False)
            i += 1
            continue
        if char == ")":
            held = inner.pop() if inner else False
            i += 1
            if unbounded(i):
                if held:
                    return True
                if inner:
                    inner[-1] = True
            elif held and inner:
                inner[-1] = True
            continue
        i += 1
        if char not in "|^$" and unbounded(i) and inner:
            inner[-1] = True
    return False


def _text(file: Path) -> str:
    from ..files import read_input, utf8_text

    return utf8_text(read_input(file, "tokenizer file", TOKENIZER_JSON_BOUND), file)


def _bos_text(folder: Path, tokenizer: Any) -> str:
    """The BOS text of a Hugging Face model: tokenizer_config.json's `bos_token`, when the
    folder has one, else the first token the post-processor adds (a Llama 3 `<|begin_of_text|>`)."""
    from ..jsonload import loads

    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            bos = loads(_text(config)).get("bos_token")
        except (OtakuError, ValueError, AttributeError):  # ValueError: jsonload's JSONProblem
            bos = None
        if isinstance(bos, dict):
            bos = bos.get("content")
        if isinstance(bos, str):
            return bos
    ids = tokenizer.encode("", add_special_tokens=True).ids
    return str(tokenizer.id_to_token(ids[0])) if ids else ""
