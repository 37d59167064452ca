"""The facts of the search: each decision recorded as a plain record (the report writes the sentences)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from .parts import Refusal, SceneRef

# ── The facts of the search ──────────────────────────────────────────────────────────────
# The steps are NamedTuples: immutable records like the rest, but every run defines a dozen
# kinds, and on Python 3.11 a frozen dataclass takes four times as long to define (0.9 ms).


@dataclass(frozen=True)
class ChainStop:
    """Why a covered chain ends where it does.

    `head_full`: the head holds every message; `no_start`: no scene holds message H+1;
    `gap`: messages `first`..`last` belong to no scene; `reaches_tail`: `scene` ends at
    message `last`, not before `boundary` (N − `target`); `no_summary`: `scene` has none;
    `no_more`: the story has no more scenes."""

    kind: Literal["head_full", "no_start", "gap", "reaches_tail", "no_summary", "no_more"]
    scene: SceneRef | None = None
    first: int = 0
    last: int = 0
    boundary: int = 0
    messages: int = 0
    target: int = 0


class HeadPriced(NamedTuple):
    """The head and the fixed frame every candidate pays."""

    messages: tuple[int, ...]  # (first, last) or ()
    tokens: int
    fixed: int
    limit: int


class ChainFound(NamedTuple):
    """The covered chain for a tail target (no scenes: everything is verbatim)."""

    target: int
    scenes: tuple[SceneRef, ...]
    messages: tuple[int, ...]  # the covered messages (first, last) or ()
    stop: ChainStop


class SameChain(NamedTuple):
    """A lower rung covers the same scenes as the one before: nothing new to try."""

    target: int
    scenes: tuple[SceneRef, ...]


class TailOverflow(NamedTuple):
    """At this tail target the head and tail alone exceed the limit."""

    target: int
    tail: tuple[int, ...]  # (first, last) or ()
    limit: int


class Tried(NamedTuple):
    """A candidate tested for fit: everything verbatim (`level` None), or a level of the chain.

    `tokens` is the parts' sum when `rendered` is false, else the count of the rendered prompt."""

    target: int
    level: int | None
    scenes: tuple[SceneRef, ...]  # the covered chain
    tokens: int
    limit: int
    rendered: bool

    @property
    def fits(self) -> bool:
        return self.tokens <= self.limit


class SummariesOverflow(NamedTuple):
    """Level 0 cannot fit: `over` are the summaries that, with nothing else, already take
    `tokens` of the `room` left (room ≤ 0: head, tail and cards leave none)."""

    scenes: tuple[SceneRef, ...]
    over: tuple[SceneRef, ...]
    tokens: int
    room: int


class LevelsOverflow(NamedTuple):
    """Levels `first`..`last` cannot fit: the summaries they keep alone exceed the room."""

    first: int
    last: int


class NoHistory(NamedTuple):
    """Levels that do not exist: their scenes have no history."""

    levels: tuple[int, ...]
    scenes: tuple[SceneRef, ...]


class FitsRendered(NamedTuple):
    """At the floor the parts' sum was over, but the rendered prompt fits (sums are conservative)."""

    target: int
    level: int
    priced: int
    tokens: int
    limit: int


class Held(NamedTuple):
    """The stable policy's choice: the shape (covered scenes, level) held since message
    `since`, the `changes` of shape the story went through up to now, the `slack` in tokens
    it kept at each change, and the `room` (tokens) and `turns` (messages of the size of the
    recent ones) left before the shape must change again."""

    since: int
    target: int
    level: int
    scenes: tuple[SceneRef, ...]
    changes: int
    slack: int
    room: int
    turns: int


class Recalled(NamedTuple):
    """What the newest messages at turn `at` recalled (`recall.py`): of `candidates` left out,
    each taken one as (its kind: "message" or "scene", its number or scene ref, its speaker,
    its score, the rare words it shares with them), within `budget` tokens, `tokens` spent.
    `engine`: "keywords" or "meaning" (`meaning.py`: then `near` holds each taken one's
    similarity to the nearer query, and the score is the fused one); `why`: why the keyword
    engine ran where `[recall]` names an embedding model."""

    at: int
    candidates: int
    budget: int
    tokens: int
    taken: tuple[tuple[str, SceneRef, str, float, tuple[str, ...]], ...]
    engine: str = "keywords"
    why: str = ""
    near: tuple[float, ...] = ()


class Refused(NamedTuple):
    """Case 6."""

    refusal: Refusal


Step = (
    HeadPriced
    | ChainFound
    | SameChain
    | TailOverflow
    | Tried
    | SummariesOverflow
    | LevelsOverflow
    | NoHistory
    | FitsRendered
    | Held
    | Recalled
    | Refused
)
