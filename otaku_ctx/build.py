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

from .assembler import Assembly, Policy, Shape, assemble
from .blocks import Block
from .cards import add_cards, read_card
from .config import Settings, otaku_home
from .emit import EMITS, PromptRenderer
from .emit import _sections as sections_of
from .errors import ConfigError, UsageError
from .hbs import bound_for_window
from .lookup import find_format, load_template
from .model import Story
from .names import ResolvedNames, resolve_names
from .presets import for_format as bind_preset
from .pricing import TemplatePricer
from .readers import read_story
from .tokens import TokenCounter, make_counter
from .variables import OPEN_MARK, Variables


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
        story = add_cards(story, [read_card(card) for card in cards])
    return story


def renderer_for(story: Story, settings: Settings, *, emit: str = "text", reserve: int = 0) -> PromptRenderer:
    """The configured template, format and emit form, ready to render this story."""
    if emit not in EMITS:
        raise ValueError(f"unknown emit form {emit!r}; expected one of {', '.join(EMITS)}")  # the CLI offers only these
    p = settings.prompt
    home = otaku_home()
    variables = Variables(story, names_for(story, settings).names, p)
    with _usage_if_unknown(settings, "prompt.template", p.template):
        template = load_template(p.template, home)
    with _usage_if_unknown(settings, "prompt.format", p.format):
        format = find_format(p.format, home)
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
    count = count or make_counter(settings.model.tokenizer)
    budget = budget_of(story, settings, count)
    renderer = renderer_for(story, settings, emit=emit, reserve=budget.reserve)
    pricer = TemplatePricer(renderer, count)
    shape, policy = shape_of(settings), policy_of(settings)
    assembly = assemble(story, shape, budget.limit, pricer, reserve=budget.reserve, policy=policy)
    if assembly.refusal:
        return Built(assembly, budget, count.name, None), renderer
    blocks = pricer.blocks(assembly)
    return Built(assembly, budget, count.name, renderer.emitted(blocks), tuple(blocks)), renderer
