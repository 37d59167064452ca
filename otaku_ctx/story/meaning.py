"""What an embedding model says of a story's texts at one turn (seed 000's RAG Infill Engine):
each text's vector, found by the text itself, and the vectors of the turn's two queries — the
newest user message and the recent window. Data, as a story's scenes are: read from the
vectors file beside its summaries (`vectors.py`), and asked of the server for the queries, by
the caller (`build`, `serve`); the assembler only reads it (`assemble/meaning.py`).

A vector is kept as the model gave it, scaled so its largest number is 127 and rounded to
8-bit integers (`quantized`): 1 byte a number, and an exact integer dot product, so the
similarity of two texts is the same on every machine and in every order it is summed."""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import mul
from typing import TypeAlias

Vector: TypeAlias = "array[int]"  # array("b"): the quantized numbers

#: the bytes of a text's key (`key_of`): a 128-bit BLAKE2b of its UTF-8
KEY_BYTES = 16


def key_of(text: str) -> bytes:
    """The key a text's vector is found by: its content, hashed (an edit changes it)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).digest()


def quantized(vector: Sequence[float]) -> Vector:
    """`vector` scaled so its largest number is ±127, rounded (all zeros stay zeros)."""
    top = max((abs(x) for x in vector), default=0.0)
    scale = 127.0 / top if top > 0 else 0.0
    return array("b", (max(-127, min(127, round(x * scale))) for x in vector))


def square(a: Vector) -> int:
    """A quantized vector's squared length."""
    return sum(map(mul, a, a))


def similarity(a: Vector, b: Vector, squares: tuple[int, int] | None = None) -> float:
    """The cosine of two quantized vectors (0 when either is all zeros); `squares`, their
    squared lengths when known (`square`)."""
    dot = sum(map(mul, a, b))
    na, nb = squares or (square(a), square(b))
    return dot / math.sqrt(na * nb) if na and nb else 0.0


@dataclass(frozen=True)
class Meaning:
    """The embeddings at one turn: `vector_of(text)` (None for a text not embedded yet), and the
    two queries' vectors — the newest user message's and the recent window's (None when there
    is no such text). `model` names the embedding model, for what is said of it; `failed`, why
    the meaning could not be had this turn (the keyword engine recalls alone, and says why)."""

    model: str
    vector_of: Callable[[str], Vector | None] = lambda text: None
    question: Vector | None = None
    recent: Vector | None = None
    failed: str = ""

    @property
    def asks(self) -> bool:
        return not self.failed and (self.question is not None or self.recent is not None)
