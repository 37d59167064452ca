"""The counters of a model's own tokenizer, loaded on their first count: `ModelCounter`, and the
two ways to make one — a GGUF (`gguf_counter`) and a Hugging Face `tokenizer.json`
(`tokenizer_json_counter`).

A GGUF's counter is made on one path: the reader's fields (gguf.py), the vocabulary llama.cpp
makes of them (vocab.py), and the tokenizer built from that vocabulary — ctx's own
SentencePiece (spm.py), or for a BPE vocabulary a tokenizer.json (bpe.py) run by Hugging
Face's `tokenizers`. A BPE vocabulary is converted only when its pre-tokenizer is one ctx
knows (`llamacpp.PRE_TOKENIZERS`, Gemma 4's among them); any other, or a tokenizer that is
neither BPE nor SentencePiece, is refused in one line.

The conversion is cached as JSON under `locations.model_cache()`, keyed by the GGUF's
identity, and loaded on the first count: a build that takes only the GGUF's template or
window never reads the vocabulary. `tokenizers` is imported only then too.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, OtakuError
from ..tokens import TokenCounter, without_surrogates
from . import INSTALL
from .bpe import UNKNOWN_BYTE, tokenizer_json
from .controls import controls
from .gguf import TOKENS, Gguf, read_gguf
from .llamacpp import PreTokenizer
from .spm import from_vocab
from .tokenizer_json import check_regexes, config_bos, not_loaded, read_text
from .vocab import gguf_controls, llama_vocab, look_behind, pre_tokenizer, prompt_added, prompt_bos

__all__ = [
    "Loaded",
    "ModelCounter",
    "gguf_controls",  # the vocabulary layer's, named here too: a GGUF counter's `specials`, without the counter
    "gguf_counter",
    "gguf_tokenizer_json",
    "tokenizer_json_counter",
]

CONVERTER = 3  # the conversion's own version, part of the cache's key: bump it when the output changes
TOKENIZER_JSON_BOUND = 64 << 20  # bytes; Gemma's 256k vocabulary is ~35 MB
# items of a tokenizer.json's lists and objects (counted by their commas): its vocabulary, its
# merges. Llama 3's ~700,000, Gemma 3's ~1,300,000; `tokenizers` takes ~300 bytes of memory each.
TOKENIZER_JSON_ITEMS = 2_000_000
BATCH = 64  # texts encoded in one call of `encode_batch_fast`

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
    (`parse_special=true`, nothing added): checked now, loaded on first use.

    The one path from the file to its counter: the reader's fields (gguf.py), the vocabulary
    llama.cpp makes of them (vocab.py), and the counter built from that — spm.py's
    SentencePiece, or bpe.py's tokenizer.json run by `tokenizers` (its conversion cached)."""
    model = read_gguf(path) if model is None else model
    bos, added = prompt_bos(model), prompt_added(model)
    if model.tokenizer_model == "llama":
        return _sentencepiece_counter(model, bos, added)
    pre = pre_tokenizer(model)
    _require_tokenizers()
    label = f"gguf {model.path.name} (BPE, {model.vocab_size:,} tokens)"

    def load() -> Loaded:
        tokenizer = _cached_tokenizer(model, pre)
        decoder = tokenizer.get_added_tokens_decoder()
        matched = [t.content for _, t in sorted(decoder.items())]
        specials = controls(t for _, t in sorted(decoder.items()))
        split = _partition(matched) if _overlapping(matched) else None
        unknown = tokenizer.token_to_id(UNKNOWN_BYTE)
        return Loaded(tokenizer, specials, bos, added, split, tuple(matched), unknown)

    return ModelCounter(label, load, context=pre.context)


def _sentencepiece_counter(model: Gguf, bos: str, added: int) -> ModelCounter:
    """A SentencePiece GGUF's counter: llama.cpp's algorithm in ctx's own code (`spm.py`)."""
    label = f"gguf {model.path.name} (SentencePiece, {model.vocab_size:,} tokens)"
    if TOKENS not in model.metadata:
        raise ConfigError(str(model.path), TOKENS, "is missing: the file has no vocabulary")

    def load() -> Loaded:
        vocab = llama_vocab(model)
        tokenizer = from_vocab(vocab)
        return Loaded(None, vocab.controls(), bos, added, encode=tokenizer.encode, context=tokenizer.context)

    return ModelCounter(label, load, context=True)


def context_of(text: str, matched: tuple[str, ...]) -> str:
    r"""The end of `text` that decides how a text right after it is counted (see
    `TokenCounter.context`): from a space before a letter at or before the last LOOK_BEHIND
    characters (more, if a special token is longer), where no special token spelled in the
    text crosses; `text` itself when there is none near.

    Why that is exact, for every pre-tokenizer whose `context` holds: llama.cpp first cuts out
    the special tokens; none crosses the cut, and every one that could cross into what follows
    lies after it, so the cut parts are cut out the same in `text`, in `text + after` and in
    the end alone. Then each of these patterns finds its pieces left to right, none looking
    behind, and a piece that ends before the end of `text` is decided by `text` alone; a piece
    starts at a space before a letter (the piece before it ends there: a letter, digit or
    symbol run stops at the space, a run of spaces gives its last one back to `\s+(?!\S)`,
    and digits are cut apart on their own), so the pieces before the cut are the same in
    `text` and `text + after`, and merges never cross pieces. Those pieces cancel in the
    difference of the two counts, as in `tokens.cl100k_context`."""
    window = look_behind(text, max(map(len, matched), default=0))
    if window is None:
        return text
    lowest, target = window
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


# -- the conversion, cached ------------------------------------------------------------------


def gguf_tokenizer_json(model: Gguf, pre: PreTokenizer | None = None) -> dict[str, Any]:
    """The GGUF's vocabulary as a `tokenizer.json` (a dict) that tokenizes as llama.cpp does."""
    return tokenizer_json(llama_vocab(model), pre_tokenizer(model) if pre is None else pre)


def _newlines_merge_whole(model: Gguf, tokenizer: Any) -> None:
    """Gemma 4's piece of newlines that is itself a token is that token in llama.cpp, merges or
    not (llama-vocab.cpp: "fix for gemma 4"); the converted tokenizer merges it. Where the
    merges do not make it whole the two differ (and which llama.cpp a user runs, before or after
    that fix, decides): refused. Gemma 4's own merges make every one whole."""
    for i, text in enumerate(model.typed_tokens()[0]):
        if text and not text.strip("\n") and tokenizer.encode(text, add_special_tokens=False).ids != [i]:
            message = f"its merges do not make the token {text!r} whole, as llama.cpp takes it; use --tokenizer server"
            raise ConfigError(str(model.path), "tokenizer.ggml.merges", message)


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

        text = read_text(file, TOKENIZER_JSON_BOUND)
        if (items := text.count(",") + 1) > TOKENIZER_JSON_ITEMS:
            message = f"holds over {TOKENIZER_JSON_ITEMS:,} items ({items:,}); no model's vocabulary is that large"
            raise ConfigError(str(file), None, message)
        check_regexes(file, text)
        try:  # parsed once, by `tokenizers`: json's dict of a large vocabulary would double the memory
            tokenizer = Tokenizer.from_str(text)
        except Exception as exc:
            why = _first_line(exc)
        else:
            decoder = tokenizer.get_added_tokens_decoder()
            specials = controls(t for _, t in sorted(decoder.items()))
            added = len(tokenizer.encode("", add_special_tokens=True).ids)
            return Loaded(tokenizer, specials, _bos_text(file.parent, tokenizer), added, source=str(file))
        raise ConfigError(str(file), None, not_loaded(text, why))

    return ModelCounter(f"tokenizer.json {shown}", load)


def _bos_text(folder: Path, tokenizer: Any) -> str:
    """The BOS text of a Hugging Face model: tokenizer_config.json's `bos_token`, when the
    folder has one, else the first token the post-processor adds (a Llama 3 `<|begin_of_text|>`)."""
    bos = config_bos(folder, TOKENIZER_JSON_BOUND)
    if bos is not None:
        return bos
    ids = tokenizer.encode("", add_special_tokens=True).ids
    return str(tokenizer.id_to_token(ids[0])) if ids else ""
