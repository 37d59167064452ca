"""What a prompt is planned from: the shape settings, the cache policy, the parts, the pricer's
protocol, and the plan itself (`Assembly`) with its refusal (case 6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..story.model import Message, Role, Scene
from .steps import ChainStop, Step

PartKind = Literal["message", "card", "summary", "history", "recall"]
SceneRef = int | str
Cache = Literal["exact", "stable"]
CACHES: tuple[str, ...] = ("exact", "stable")


@dataclass(frozen=True)
class Shape:
    """The numbers of the seed that shape a prompt (the `[context]` settings)."""

    head: int = 20
    min_tail: int = 150
    tail_step: int = 50
    tail_floor: int = 50

    @property
    def threshold(self) -> int:
        """The verbatim threshold: head_messages + min_tail_messages (170 by default)."""
        return self.head + self.min_tail


@dataclass(frozen=True)
class Policy:
    """How a shape is chosen among the candidates that fit (the `[context] cache` settings).

    `exact`: the first candidate that fits, turn by turn (the seed's search as written).
    `stable`: keep the shape of the previous turns while it is still a candidate and fits, so the
    prompt's prefix stays byte-stable for a backend's prompt cache; when it must change, move
    to the first candidate that leaves `slack` (a share of the limit) free for the coming turns;
    take a less degraded one only when it leaves that slack free (`Stable`)."""

    cache: Cache = "exact"
    slack: float = 0.03
    # the stable policy's walk as it stood at an earlier turn of this story (`Walked`): it goes on
    # from there instead of from the first message (a server's chat, turn after turn)
    resume: Walked | None = None
    # go on from `resume` even when what it read has changed since (summaries written, a message
    # edited), as long as the scenes it knew are still where they were: the chat goes on from
    # the shape it was really sent, not from the one a walk with today's summaries would have
    # reached (`ctx serve`; docs/caching.md). Off, a changed walk is walked again.
    hold: bool = False


@dataclass(frozen=True)
class Walked:
    """Where the stable policy's walk stood after `turn` messages: the shape it held (covered
    scenes, level; None for none), the last shape it took (what a move may not step back
    from), the turn it took the held one, and how many changes it went through. The walk at
    turn n depends on the prices of the story's first n messages and of its scenes closed by
    then, and on this alone: going on from it (while its `fingerprint` says those are the
    same) gives what walking from the first message gives."""

    turn: int
    state: tuple[int, int] | None
    floor: tuple[int, int] | None
    since: int
    changes: int
    fingerprint: int = 0  # what the walk read up to `turn`, hashed (`Stable.fingerprint`)
    ends: tuple[int, ...] = ()  # where the scenes the walk knew end (those a shape counts)
    # the prices the walk worked out, to be known again for the same objects (`Stable.Prices`)
    prices: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Part:
    """One piece of the prompt after the system message: a message or card verbatim, a scene's
    summary, or a scene's history (the story so far through that scene); or, recalled
    (`recall.py`), an older message or a scene's summary that the recap leaves out."""

    kind: PartKind
    message: Message | None = None
    scene: Scene | None = None

    @classmethod
    def verbatim(cls, message: Message) -> Part:
        """A message or card that stands as it is (head, tail)."""
        return cls("card" if message.is_card else "message", message=message)


class Pricer(Protocol):
    """What the assembler needs to know about rendering, in tokens."""

    def fixed(self) -> int:
        """Tokens every prompt has whatever its parts: system message, template preamble, open turn."""
        ...

    def part(self, part: Part, after: Role | None) -> int:
        """Tokens a verbatim message or card of the head or tail adds to the prompt, standing
        after a turn of role `after` (None: right after the fixed frame)."""
        ...

    def recap_part(self, part: Part) -> int:
        """Tokens a recap part (a card, summary or history) adds, standing among other recap parts."""
        ...

    def recap_opening(self, after: Role | None) -> int:
        """Tokens a non-empty recap costs once, beyond its parts (its turn's framing, a header),
        standing after a turn of role `after`."""
        ...

    def exact(self, assembly: Assembly) -> int:
        """Tokens of the prompt actually emitted for this assembly."""
        ...

    def text(self, text: str) -> int:
        """Tokens of a bare text, without any framing (a quick price for a message's content)."""
        ...


@dataclass(frozen=True)
class Refusal:
    """Case 6: why nothing fits, and what would."""

    smallest: int  # tokens of the smallest prompt reached
    limit: int
    reserve: int
    missing_summaries: tuple[SceneRef, ...] = ()
    missing_histories: tuple[SceneRef, ...] = ()
    chain_stop: ChainStop | None = None  # why the summaries stop where they do, when the story could fix it

    @property
    def context(self) -> int:
        """The context the limit came from (window or max_context)."""
        return self.limit + self.reserve

    @property
    def needed_context(self) -> int:
        """The context (window or max_context) that would fit the smallest prompt and the reserve."""
        return self.smallest + self.reserve


@dataclass(frozen=True)
class Assembly:
    """The plan of one prompt and the trace of how it was chosen."""

    messages: int  # N
    limit: int
    reserve: int
    head: tuple[Message, ...] = ()
    recap: tuple[Part, ...] = ()  # floated cards, history, then cards + summaries, in order
    recall: tuple[Part, ...] = ()  # recalled history entries (by relevance), then messages (`recall.py`)
    tail: tuple[Message, ...] = ()
    tail_target: int = 0
    level: int = 0  # 0 = all summaries; k = scene k's history stands in for summaries 1..k
    tokens: int = 0  # the emitted prompt's count (exact), or the smallest reached on refusal
    steps: tuple[Step, ...] = ()
    refusal: Refusal | None = None
    costs: dict[str, int] = field(default_factory=dict, compare=False)  # tokens by section
    case: int = 0  # 1–6, named by `classify` once the search is over
    walked: Walked | None = field(default=None, compare=False)  # the stable policy's walk, to go on from

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every part in prompt order (the system message is the pricer's fixed cost)."""
        return tuple(map(Part.verbatim, self.head)) + self.recap + self.recall + tuple(map(Part.verbatim, self.tail))

    @property
    def history(self) -> Scene | None:
        return next((p.scene for p in self.recap if p.kind == "history"), None)

    @property
    def summaries(self) -> tuple[Scene, ...]:
        return tuple(p.scene for p in self.recap if p.kind == "summary" and p.scene)

    @property
    def floated_cards(self) -> tuple[Message, ...]:
        """Cards that float before the history (case 4): those before the history part."""
        floated: list[Message] = []
        for p in self.recap:
            if p.kind == "history":
                return tuple(floated)
            if p.message:
                floated.append(p.message)
        return ()
