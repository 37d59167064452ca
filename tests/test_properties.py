"""The invariants of ARCHITECTURE.md over random stories (hypothesis).

- the emitted prompt, counted by the configured tokenizer in the emitted form, is ≤ the limit;
- every message is verbatim, inside a covered scene's summary, or inside the history;
  cards are verbatim or floated, never lost;
- the tail is contiguous and ends with the last message; order is story order.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from otaku_ctx.assemble import Assembly, Shape, assemble
from otaku_ctx.build import renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.render.pricing import TemplatePricer
from otaku_ctx.story.model import Card, Message, Scene, Story
from otaku_ctx.tokens import make_counter

WORDS = ["river", "lamp", "{{char}}", "<|endoftext|>", "}}", "Ilya", "the", "\n", "ü", "🙂", "{{#each x}}", "…"]


def texts(max_words: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(WORDS), min_size=0, max_size=max_words).map(" ".join)


@st.composite
def stories(draw: st.DrawFn) -> Story:
    n = draw(st.integers(1, 260))
    card_at = set(draw(st.lists(st.integers(1, n), max_size=6)))
    messages = []
    for number in range(1, n + 1):
        if number in card_at:
            card = Card(name=f"C{number}", description=draw(texts(12)))
            messages.append(Message(number, "system", "", card.name, card=card))
        else:
            role = draw(st.sampled_from(["user", "assistant", "assistant", "system"]))
            messages.append(Message(number, role, draw(texts(16)), draw(st.sampled_from([None, "Mara", "Ilya"]))))
    # Scenes: cut 1..n into pieces; drop some (gaps); give each a summary/history or not.
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=40))) | {n})
    scenes, start = [], 1
    for end in cuts:
        if end >= start and draw(st.integers(0, 9)) > 0:  # about 1 in 10 becomes a gap
            scenes.append((start, end))
        start = end + 1
    built = tuple(
        Scene(
            order=i,
            start=a,
            end=b,
            id=i,
            summary=draw(texts(60)) if draw(st.integers(0, 9)) else "",
            history=draw(texts(8)) if draw(st.integers(0, 3)) else "",
        )
        for i, (a, b) in enumerate(scenes, start=1)
    )
    system = draw(texts(20))
    return Story(path=Path("random.jsonl"), messages=tuple(messages), scenes=built, system=system)


@st.composite
def chained_stories(draw: st.DrawFn) -> Story:
    """Stories whose scenes tile the middle, all summarised, most with a history: these reach
    the levels of case 4 and the rungs of case 5 far more often than fully random ones."""
    base = draw(stories())
    n = len(base)
    size = draw(st.integers(2, 12))
    scenes = tuple(
        Scene(
            order=i,
            start=a,
            end=min(a + size - 1, n),
            id=i,
            summary=draw(texts(60)) + " summary",
            history=draw(texts(10)) + " history" if draw(st.integers(0, 4)) else "",
        )
        for i, a in enumerate(range(1, n + 1, size), start=1)
    )
    return Story(path=base.path, messages=base.messages, scenes=scenes, system=base.system)


shapes = st.builds(
    lambda head, tail, step, floor: Shape(head=head, min_tail=tail, tail_step=step, tail_floor=min(floor, tail)),
    st.integers(0, 30),
    st.integers(0, 120),
    st.integers(1, 60),
    st.integers(0, 60),
)


def check_invariants(s: Story, a: Assembly) -> None:
    n = len(s)
    if a.refusal:
        assert a.refusal.smallest > a.limit
        return
    head = [m.number for m in a.head]
    tail = [m.number for m in a.tail]
    assert head == list(range(1, len(head) + 1))
    # The tail is contiguous and ends with the last message.
    if tail:
        assert tail == list(range(tail[0], n + 1))
    # Story order: head, then recap (scenes ascending), then tail.
    scenes = [p.scene for p in a.recap if p.scene]
    assert [sc.start for sc in scenes] == sorted(sc.start for sc in scenes)
    covered: set[int] = set()
    history = a.history
    if history:
        covered |= set(range(1, history.end + 1))
    for sc in a.summaries:
        covered |= set(range(sc.start, sc.end + 1))
    if scenes and tail:
        assert scenes[-1].end < tail[0]
    verbatim = set(head) | set(tail)
    cards_in_recap = [p.message.number for p in a.recap if p.kind == "card"]
    # No message lost: each is verbatim or inside a covered summary or the history.
    for number in range(1, n + 1):
        assert number in verbatim or number in covered, f"message {number} lost"
    # Cards never lost: verbatim or in the recap (before their summary or floated).
    for m in s.cards:
        assert m.number in verbatim or m.number in cards_in_recap, f"card {m.number} lost"
    assert len(cards_in_recap) == len(set(cards_in_recap))
    assert not (set(cards_in_recap) & verbatim)


def run(
    s: Story,
    shape: Shape,
    fraction: float,
    reserve: int,
    emit: str,
    tokenizer: str,
    template: str = "default",
    fmt: str = "chat",
) -> None:
    """`fraction` sets the window against the whole story's size, so every case is reached."""
    counter = make_counter(tokenizer)
    whole = sum(counter(m.content) + 8 for m in s.messages) + counter(s.system)
    window = max(1, int(whole * fraction))
    settings = load_settings(overrides={"prompt.template": (template, "test"), "prompt.format": (fmt, "test")})
    renderer = renderer_for(s, settings, emit=emit, reserve=reserve)
    pricer = TemplatePricer(renderer, counter)
    limit = window - reserve
    a = assemble(s, shape, limit, pricer, reserve=reserve)
    check_invariants(s, a)
    if a.refusal is None:
        blocks = renderer.blocks(a)
        fresh = make_counter(tokenizer)
        if emit in ("messages", "openai-chat"):
            counted = TemplatePricer(renderer, fresh).tokens(blocks)
        else:
            counted = fresh(renderer.text(blocks))
        assert counted == a.tokens
        assert a.tokens <= limit
        assert renderer.emitted(blocks)  # renders without error


@given(stories(), shapes, st.floats(0.05, 1.2), st.integers(0, 40))
def test_invariants_cl100k_text(s: Story, shape: Shape, fraction: float, reserve: int) -> None:
    run(s, shape, fraction, reserve, "text", "cl100k_base")


@given(stories(), shapes, st.floats(0.05, 1.2), st.integers(0, 40))
def test_invariants_estimate_messages(s: Story, shape: Shape, fraction: float, reserve: int) -> None:
    run(s, shape, fraction, reserve, "messages", "estimate")


@given(
    chained_stories(),
    shapes,
    st.floats(0.05, 1.2),
    st.integers(0, 40),
    st.sampled_from(["text", "messages", "openai-chat", "openai-completion"]),
    st.sampled_from(["default", "serene", "sillytavern"]),
    st.sampled_from(["chat", "chatml", "llama3", "mistral", "alpaca", "vicuna", "gemma", "raw"]),
)
def test_invariants_any_template_and_format(
    s: Story, shape: Shape, fraction: float, reserve: int, emit: str, template: str, fmt: str
) -> None:
    run(s, shape, fraction, reserve, emit, "cl100k_base", template, fmt)
