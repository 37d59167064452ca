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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import mul
from typing import Self, cast

#: the bytes of a text's key (`key_of`): a 128-bit BLAKE2b of its UTF-8
KEY_BYTES = 16


class Vector(array):  # array("b"); `array[int]` is not subscriptable before Python 3.12
    """A quantized vector (8-bit integers) and its squared length, worked out once."""

    square: int

    def __new__(cls, numbers: Iterable[int] | bytes) -> Self:
        made = cast(Self, super().__new__(cls, "b", numbers))
        made.square = sum(map(mul, made, made))
        return made


def key_of(text: str) -> bytes:
    """The key a text's vector is found by: its content, hashed (an edit changes it)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).digest()


def quantized(vector: Sequence[float]) -> Vector:
    """`vector` scaled so its largest number is ±127, rounded (all zeros stay zeros)."""
    top = max((abs(x) for x in vector), default=0.0)
    scale = 127.0 / top if top > 0 else 0.0
    return Vector(max(-127, min(127, round(x * scale))) for x in vector)


def similarity(a: Vector, b: Vector) -> float:
    """The cosine of two quantized vectors (0 when either is all zeros)."""
    return cosine(sum(map(mul, a, b)), a, b)


def cosine(dot: int, a: Vector, b: Vector) -> float:
    return dot / math.sqrt(a.square * b.square) if a.square and b.square else 0.0


#: two queries asked in one pass (`Queries`): the second's products are this many times the
#: first's, past any dot product of two vectors of `MOST_NUMBERS` (each |product| ≤ 127²)
MOST_NUMBERS = 16_384
APART = 1 << 40


class Queries:
    """Two query vectors scored against a vector in one pass of products: the numbers of the
    first plus `APART` times the second's, so one integer dot product holds both (exact: each is
    smaller than `APART` / 2)."""

    def __init__(self, first: Vector | None, second: Vector | None) -> None:
        self.first, self.second = first, second
        size = len(first if first is not None else second if second is not None else ())
        a = first if first is not None else [0] * size
        b = second if second is not None else [0] * size
        self.both = [x + APART * y for x, y in zip(a, b, strict=True)]

    def similarities(self, vector: Vector) -> tuple[float, float]:
        total = sum(map(mul, self.both, vector))
        second = (total + APART // 2) // APART
        first = total - second * APART
        return (
            cosine(first, self.first, vector) if self.first is not None else 0.0,
            cosine(second, self.second, vector) if self.second is not None else 0.0,
        )


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
    # each text's vector and its similarities to the two queries, worked out once a turn (a turn
    # assembles several shapes, each recalling from much the same candidates)
    scored: dict[str, tuple[Vector, float, float] | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def asks(self) -> bool:
        return not self.failed and (self.question is not None or self.recent is not None)
