"""One call from settings and a story to the finished prompt: the core behind `ctx build`.

No Typer, no Rich, no printing: the CLI shows what this returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .assemble import Assembly, Policy, Shape, assemble
from .config import Settings
from .errors import ConfigError, UsageError
from .hbs import bound_for_window
from .hbs.blocks import Block
from .lore import IDF_MESSAGES, MOST_REPLAY, MOST_SCAN_DEPTH, ChatLine, LoreChoice, choose, rules_of
from .render.emit import EMITS, PromptRenderer
from .render.emit import _sections as sections_of
from .render.lookup import find_format, load_template
from .render.names import ResolvedNames, resolve_names
from .render.presets import for_format as bind_preset
from .render.pricing import TemplatePricer
from .render.variables import OPEN_MARK, Variables
from .story.detect import read_story
from .story.model import LoreEntry, Message, Story
from .tokens import TokenCounter, make_counter

# The most chat messages lore ever reads: TF-IDF's window, the turns replayed, the deepest scan.
LORE_READS = IDF_MESSAGES + MOST_REPLAY + MOST_SCAN_DEPTH


@dataclass(frozen=True)
class Budget:
    """The window arithmetic: limit = min(window, max_context when > 0) − reserve."""

    window: int
    max_context: int
    reserve: int
    reserve_source: str

    @property
    def context(self) -> int:
        return min(self.window, self.max_context) if self.max_context > 0 else self.window

    @property
    def limit(self) -> int:
        return self.context - self.reserve


@dataclass(frozen=True)
class Built:
    """An assembly and, unless it is a refusal, the prompt exactly as emitted."""

    assembly: Assembly
    budget: Budget
    tokenizer: str
    prompt: str | None
    blocks: tuple[Block, ...] = ()  # the prompt's role blocks (empty on refusal)
    lore: LoreChoice = LoreChoice.empty()


def shape_of(settings: Settings) -> Shape:
    c = settings.context
    return Shape(head=c.head_messages, min_tail=c.min_tail_messages, tail_step=c.tail_step, tail_floor=c.tail_floor)


def policy_of(settings: Settings) -> Policy:
    c = settings.context
    return Policy("stable" if c.cache == "stable" else "exact", c.cache_slack)


def reply_reserve(story: Story, settings: Settings, count: TokenCounter) -> tuple[int, str]:
    """The reply reserve: a number from the settings, or "auto" — the longest of the last few
    assistant replies × the factor (1.2), or the default (1024) before any reply exists."""
    c = settings.context
    if c.reply_reserve != "auto":
        return c.reply_reserve, "set"
    replies: list[str] = []
    for message in reversed(story.messages):
        if len(replies) == c.reserve_replies:
            break
        if message.role == "assistant" and not message.is_card:
            replies.append(message.content)
    if not replies:
        return c.reserve_default, "auto: no assistant reply yet"
    reserve = math.ceil(max(count(text) for text in replies) * c.reserve_factor)
    return reserve, f"auto: longest of the last {len(replies)} replies × {c.reserve_factor:g}"


def budget_of(story: Story, settings: Settings, count: TokenCounter) -> Budget:
    reserve, why = reply_reserve(story, settings, count)
    return Budget(settings.model.window, settings.context.max_context, reserve, why)


def open_story(
    path: Path, source_format: str | None = None, cards: Sequence[Path] = (), conversation: int | None = None
) -> Story:
    """Read a story (any supported format; `conversation` picks one of many) and add each card
    file as a card message at the start."""
    story = read_story(path, source_format, conversation)
    if cards:
        from .story.cards import add_cards, read_card

        story = add_cards(story, [read_card(card) for card in cards])
    return story


def renderer_for(
    story: Story, settings: Settings, *, emit: str = "text", reserve: int = 0, lore: LoreChoice | None = None
) -> PromptRenderer:
    """The configured template, format and emit form, ready to render this story (with the
    chosen lore in its variables)."""
    if emit not in EMITS:
        raise ValueError(f"unknown emit form {emit!r}; expected one of {', '.join(EMITS)}")  # the CLI offers only these
    p = settings.prompt
    variables = Variables(story, names_for(story, settings).names, p, lore or LoreChoice.empty())
    with _usage_if_unknown(settings, "prompt.template", p.template):
        template = load_template(p.template)
    with _usage_if_unknown(settings, "prompt.format", p.format):
        format = find_format(p.format)
    template = bind_preset(template, format)  # a context preset renders for its format
    m = settings.model
    bound = bound_for_window(m.window)
    return PromptRenderer(variables, template, format, emit, reserve, bound, m.name, m.max_stop_strings)


def names_for(story: Story, settings: Settings) -> ResolvedNames:
    """`{{char}}` and `{{user}}`, SillyTavern's way, each with where it came from."""
    p = settings.prompt
    user = {"user": p.user} if "prompt.user" in settings.given else {"config_user": p.user}
    return resolve_names(story, char=p.char or None, **user)


@contextmanager
def _usage_if_unknown(settings: Settings, key: str, name: str) -> Iterator[None]:
    """A template or format that names nothing, given on the command line, is a usage error
    (exit 2); a file that is there but wrong stays bad input (exit 1)."""
    try:
        yield
    except ConfigError as exc:
        if key in settings.given and not Path(name).expanduser().exists():
            raise UsageError(exc.source, exc.key, exc.message) from None
        raise


def lore_entries(story: Story, settings: Settings) -> tuple[LoreEntry, ...]:
    """Every World Info entry in play: the story's own lore lines, the `[lore] files` (or
    `--lore`), and the lorebooks of the story's cards (bound to their characters)."""
    from .story.worldinfo import read_world_info

    books = tuple(e for f in settings.lore.files for e in read_world_info(Path(f)))
    cards = [m.card for m in story.cards if m.card] + list(story.info.cast)
    return story.world + books + tuple(e for card in cards for e in card.book)


def chat_lines(story: Story, settings: Settings) -> tuple[list[ChatLine], list[ChatLine], int]:
    """(the latest visible chat messages, the ones this turn's scan may read, how many
    visible chat messages the story has — the turn).

    A scan reads only messages every prompt sends — the head, and the last `tail_floor` + 1
    messages, which stay in the tail at every rung — so what lore fires never depends on
    what the lore leaves room for. Only the latest `LORE_READS` messages are ever read
    (scan windows, replayed turns, TF-IDF), so only those are prepared: lore costs what the
    window costs, not what the story does."""
    names = names_for(story, settings).names
    c, n = settings.context, len(story)
    surely = n - min(c.tail_floor, c.min_tail_messages)

    def line(m: Message) -> ChatLine:
        return ChatLine(m.number, names.speaker(m), names.fill(m.content))

    latest: list[ChatLine] = []
    for m in reversed(story.messages):
        if len(latest) == LORE_READS:
            break
        if not m.is_card:
            latest.append(line(m))
    latest.reverse()
    first = latest[0].number if latest else n + 1
    head = [line(m) for m in story.messages[: min(c.head_messages, first - 1)] if not m.is_card]
    turns = sum(1 for m in story.messages if not m.is_card)
    scannable = head + [x for x in latest if x.number >= surely or x.number <= c.head_messages]
    return latest, scannable, turns


def choose_lore(story: Story, settings: Settings, count: TokenCounter, limit: int) -> LoreChoice:
    """The lore for this story's next turn, within `[lore] budget` of the limit (docs/lore.md)."""
    rules = rules_of(settings.lore)
    entries = lore_entries(story, settings)
    if not entries:
        return LoreChoice(rules.engine, rules.budget_for(limit), 0, ())
    chat, scannable, turns = chat_lines(story, settings)
    names = names_for(story, settings).names
    first = next((m.content for m in story.messages if not m.is_card), "")
    seed = f"{story.info.title}\x1f{first}"
    return choose(
        entries, chat, rules, fill=names.fill, count=count, limit=limit, seed=seed, scannable=scannable, turns=turns
    )


def build(story: Story, settings: Settings, *, emit: str = "text", count: TokenCounter | None = None) -> Built:
    """Assemble the story for the configured window and render the prompt (cases 1–6).
    `count` lends a counter whose cache outlives one build (a replay's turns)."""
    return _build(story, settings, emit, count)[0]


def template_variables(story: Story, settings: Settings) -> tuple[Built, dict[str, Any] | None]:
    """What `build` chose, and the variables its template saw for that assembly (None for a
    refusal): what `ctx template vars` shows template authors."""
    built, renderer = _build(story, settings, "text")
    if built.assembly.refusal:
        return built, None
    return built, _unmarked(renderer.variables.for_assembly(*sections_of(built.assembly)))


def _unmarked(value: Any) -> Any:
    """The variables as a template author sees them: the open turn's `message` is empty text
    (its internal marker only tells the renderer where the open turn is)."""
    if value == OPEN_MARK:
        return ""
    if isinstance(value, dict):
        return {key: _unmarked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unmarked(item) for item in value]
    return value


def _build(
    story: Story, settings: Settings, emit: str, count: TokenCounter | None = None
) -> tuple[Built, PromptRenderer]:
    """Choose the lore, then assemble the story around it for the configured window and
    render the prompt (cases 1–6). The lore is part of the fixed frame; when the frame with
    it leaves no room, entries are dropped by priority (`order`) before the build refuses."""
    count = count or make_counter(settings.model.tokenizer)
    budget = budget_of(story, settings, count)
    lore = choose_lore(story, settings, count, budget.limit)
    shape, policy = shape_of(settings), policy_of(settings)

    def attempt(choice: LoreChoice) -> tuple[PromptRenderer, TemplatePricer, Assembly]:
        renderer = renderer_for(story, settings, emit=emit, reserve=budget.reserve, lore=choice)
        pricer = TemplatePricer(renderer, count)
        return renderer, pricer, assemble(story, shape, budget.limit, pricer, reserve=budget.reserve, policy=policy)

    renderer, pricer, assembly = attempt(lore)
    placed = len(lore.placed)
    if assembly.refusal and placed:
        # Keep the most entries, by priority, that leave the story room: a binary search.
        tried: dict[int, tuple[PromptRenderer, TemplatePricer, Assembly]] = {}

        def fits(keep: int) -> bool:
            tried[keep] = attempt(lore.without(keep))
            return tried[keep][2].refusal is None

        low = 0
        if fits(0):
            high = placed - 1
            while low < high:
                middle = (low + high + 1) // 2
                if fits(middle):
                    low = middle
                else:
                    high = middle - 1
        renderer, pricer, assembly = tried[low]
        lore = lore.without(low)
    if assembly.refusal:
        return Built(assembly, budget, count.name, None, lore=lore), renderer
    blocks = pricer.blocks(assembly)
    return Built(assembly, budget, count.name, renderer.emitted(blocks), tuple(blocks), lore), renderer
