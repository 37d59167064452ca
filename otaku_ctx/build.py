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
from .lore import IDF_MESSAGES, MOST_REPLAY, MOST_SCAN_DEPTH, Character, ChatLine, LoreChoice, choose
from .render.emit import EMITS, PromptRenderer, sections
from .render.formats import Format, bind
from .render.lookup import find_format, load_template
from .render.names import Names, ResolvedNames, resolve_names
from .render.pricing import TemplatePricer
from .render.specials import broken_up
from .render.templates import PromptTemplate
from .render.variables import OPEN_MARK, Variables
from .story.detect import read_story
from .story.model import LoreEntry, Message, Story
from .tokens import TokenCounter

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
    names: ResolvedNames | None = None  # `{{char}}` and `{{user}}`, each with where it came from
    controls: tuple[str, ...] = ()  # the model's control tokens the prompt's text spells (see `notes`)
    text_form: bool = True  # the prompt is one text (its spelled control tokens were broken up)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the user should know of this prompt: control tokens its text spells."""
        if not self.controls:
            return ()
        shown = ", ".join(self.controls[:5]) + (f" and {len(self.controls) - 5} more" if len(self.controls) > 5 else "")
        if self.text_form:
            return (f"the story spells the model's control tokens {shown}: broken up, so they stay text",)
        return (
            f"warning: the story spells the model's control tokens {shown}; a server that applies the"
            " model's template may read them as control tokens (a text --emit breaks them up)",
        )


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
    path: Path,
    source_format: str | None = None,
    cards: Sequence[Path] = (),
    conversation: int | None = None,
    summaries: Path | None = None,
    shown: str | None = None,
) -> Story:
    """Read a story (any supported format; `conversation` picks one of many), add the fresh
    scenes of a summaries file (`ctx summarize`'s sidecar; its stale ones left out, with a
    note), and add each card file as a card message at the start."""
    story = read_story(path, source_format, conversation)
    if summaries is not None:
        from .story.sidecar import read_sidecar, with_sidecar

        story = with_sidecar(story, read_sidecar(summaries), shown or str(summaries))
    if cards:
        from .story.cards import add_cards, read_card

        story = add_cards(story, [read_card(card) for card in cards])
    return story


@dataclass(frozen=True)
class Prepared:
    """What every attempt of one build shares, worked out once: the story's names, and the
    template bound to the format bound to those names."""

    story: Story
    settings: Settings
    names: ResolvedNames
    template: PromptTemplate
    format: Format
    emit: str
    # the template and format as read, before `bind` (bound again for a model, its names broken up)
    unbound: tuple[PromptTemplate, Format] | None = None

    def renderer(
        self, lore: LoreChoice | None = None, reserve: int = 0, count: TokenCounter | None = None
    ) -> PromptRenderer:
        """The renderer of this story with `lore` in its variables, for a reply reserve of
        `reserve` tokens (a request body's `max_tokens`), for the model `count` counts for:
        its control tokens broken up in a text prompt's story text, its BOS left to the
        server that adds it, a chat counted as the format renders it (docs/model.md)."""
        p, m = self.settings.prompt, self.settings.model
        variables = Variables(self.story, self.names.names, p, lore or LoreChoice.empty())
        bound = bound_for_window(m.window, self.story.longest_text)
        template, fmt = self.template, self.format
        if count is not None and count.parses_specials:
            template, fmt = self._for_model(count.specials)
        renderer = PromptRenderer(variables, template, fmt, self.emit, reserve, bound, m.name, m.max_stop_strings)
        return renderer.for_model(count) if count is not None and count.parses_specials else renderer

    def _for_model(self, specials: tuple[str, ...]) -> tuple[PromptTemplate, Format]:
        """The template and format bound to names that spell none of the model's control tokens
        (a text prompt's format writes the names into its own sequences)."""
        if not specials or self.unbound is None or self.emit not in ("text", "openai-completion"):
            return self.template, self.format
        n, (read, found) = self.names.names, self.unbound
        user, char = (broken_up(name, specials) for name in (n.user, n.char))
        if (user, char) == (n.user, n.char):
            return self.template, self.format
        fmt = bind(found, user, char, self.format.group)
        return read.for_format(fmt), fmt


def prepare(story: Story, settings: Settings, *, emit: str = "text") -> Prepared:
    """Read the configured template and format once and bind them to the story: the format
    to `{{user}}`, `{{char}}` and whether more than one character speaks (a group chat), the
    template to that format."""
    if emit not in EMITS:
        raise ValueError(f"unknown emit form {emit!r}; expected one of {', '.join(EMITS)}")  # the CLI offers only these
    p = settings.prompt
    with _usage_if_unknown(settings, "prompt.template", p.template):
        template = load_template(p.template)
    with _usage_if_unknown(settings, "prompt.format", p.format):
        found = find_format(p.format)
    names = names_for(story, settings)
    n = names.names
    characters = {n.speaker_as(role, name) for role, name in story.speakers if role == "assistant"}
    format = bind(found, n.user, n.char, group=len(characters) > 1)
    return Prepared(story, settings, names, template.for_format(format), format, emit, (template, found))


def native_text(story: Story) -> str:
    """The story as a native JSONL file that builds the same prompts (`ctx convert`).

    `{{char}}` is written as this story resolves it. A SillyTavern header's character name
    only counts when no card stands before the chat (SillyTavern never reads its header
    back), while a native story's own `char` always counts: written as it was, a header
    name that differs from the card's would become the character."""
    from dataclasses import replace

    from .story.convert import to_native_text

    char = resolve_names(story).char.name
    return to_native_text(replace(story, info=replace(story.info, char=char)))


def renderer_for(
    story: Story, settings: Settings, *, emit: str = "text", reserve: int = 0, lore: LoreChoice | None = None
) -> PromptRenderer:
    """The configured template, format and emit form, ready to render this story (with the
    chosen lore in its variables), for a reply reserve of `reserve` tokens."""
    return prepare(story, settings, emit=emit).renderer(lore, reserve)


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
    """Every World Info entry in play: the story's own lore lines (SillyTavern's chat lore,
    scanned first, unless bound to a character), the `[lore] files` (or `--lore`), and the
    lorebooks of the story's cards (bound to their characters)."""
    from dataclasses import replace

    from .story.worldinfo import read_world_info

    own = tuple(e if e.character else replace(e, chat=True) for e in story.world)
    books = tuple(e for f in settings.lore.files for e in read_world_info(Path(f)))
    return own + books + tuple(e for card in story.known_cards for e in card.book)


def lore_character(story: Story, names: Names) -> Character | None:
    """Who the prompt is for, as characterFilter sees it: `{{char}}`'s card, named by its
    file's name without the last extension (SillyTavern's avatar name), else by the card's
    name, with the card's tags; `{{char}}` with no card has no tags; no `{{char}}`, no one."""
    if not names.char:
        return None
    card = next((c for c in story.known_cards if c.name == names.char), None)
    if card is None:
        return Character(names.char)
    import re

    stem = re.sub(r"\.[^/.]+$", "", card.avatar)  # SillyTavern's getCharaFilename
    return Character(stem or card.name, card.tags)


def chat_lines(story: Story, settings: Settings, names: Names) -> tuple[list[ChatLine], list[ChatLine], int]:
    """(the latest visible chat messages, the ones this turn's scan may read, how many
    visible chat messages the story has — the turn).

    A scan reads only messages every prompt sends — the head, and the last `tail_floor` + 1
    messages, which stay in the tail at every rung — so what lore fires never depends on
    what the lore leaves room for. Only the latest `LORE_READS` messages are ever read
    (scan windows, replayed turns, TF-IDF), so only those are prepared: lore costs what the
    window costs, not what the story does."""
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


def choose_lore(prepared: Prepared, count: TokenCounter, limit: int) -> LoreChoice:
    """The lore for this story's next turn, within `[lore] budget` of the limit (docs/lore.md)."""
    story, settings = prepared.story, prepared.settings
    rules = settings.lore.rules()
    entries = lore_entries(story, settings)
    if not entries:
        return LoreChoice(rules.engine, rules.budget_for(limit), 0, ())
    names = prepared.names.names
    chat, scannable, turns = chat_lines(story, settings, names)
    first = next((m.content for m in story.messages if not m.is_card), "")
    seed = f"{story.info.title}\x1f{first}"
    character = lore_character(story, names)
    return choose(
        entries, chat, rules, fill=names.fill, count=count, limit=limit, seed=seed, scannable=scannable, turns=turns,
        character=character,
    )  # fmt: skip


def build(story: Story, settings: Settings, *, emit: str = "text", count: TokenCounter | None = None) -> Built:
    """Assemble the story for the configured window and render the prompt (cases 1–6).
    `count` lends a counter whose cache outlives one build (a replay's turns)."""
    return _build(prepare(story, settings, emit=emit), count)[0]


def template_variables(story: Story, settings: Settings) -> tuple[Built, dict[str, Any] | None]:
    """What `build` chose, and the variables its template saw for that assembly (None for a
    refusal): what `ctx template vars` shows template authors."""
    built, renderer = _build(prepare(story, settings))
    if built.assembly.refusal:
        return built, None
    return built, _unmarked(renderer.variables.for_assembly(*sections(built.assembly)))


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


@dataclass(frozen=True)
class Attempt:
    """One assembly of the story around a choice of lore."""

    lore: LoreChoice
    renderer: PromptRenderer
    pricer: TemplatePricer
    assembly: Assembly


def attempt(prepared: Prepared, lore: LoreChoice, count: TokenCounter, budget: Budget) -> Attempt:
    renderer = prepared.renderer(lore, budget.reserve, count)
    pricer = TemplatePricer(renderer, count)
    shape, policy = shape_of(prepared.settings), policy_of(prepared.settings)
    assembly = assemble(prepared.story, shape, budget.limit, pricer, reserve=budget.reserve, policy=policy)
    return Attempt(lore, renderer, pricer, assembly)


def fit_lore(prepared: Prepared, lore: LoreChoice, count: TokenCounter, budget: Budget) -> Attempt:
    """The story assembled with `lore` as part of its fixed frame; when the frame with it
    leaves the story no room, the most entries by priority (`order`) that do: a binary
    search over how many are kept. The refusal with all of them when none leaves room."""
    first = attempt(prepared, lore, count, budget)
    placed = len(lore.placed)
    if first.assembly.refusal is None or not placed:
        return first
    tried: dict[int, Attempt] = {}

    def fits(keep: int) -> bool:
        tried[keep] = attempt(prepared, lore.without(keep), count, budget)
        return tried[keep].assembly.refusal is None

    low = 0
    if fits(0):
        high = placed - 1
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
    return tried[low]


def _build(prepared: Prepared, count: TokenCounter | None = None) -> tuple[Built, PromptRenderer]:
    """Choose the lore, then assemble the story around it for the configured window and
    render the prompt (cases 1–6)."""
    count = count or counter_for(prepared.settings)
    budget = budget_of(prepared.story, prepared.settings, count)
    fitted = fit_lore(prepared, choose_lore(prepared, count, budget.limit), count, budget)
    a, lore, names = fitted.assembly, fitted.lore, prepared.names
    if a.refusal:
        return Built(a, budget, count.name, None, lore=lore, names=names), fitted.renderer
    blocks = fitted.pricer.blocks(a)
    prompt = fitted.renderer.emitted(blocks)
    controls = _controls(fitted.renderer, a, count)
    built = Built(a, budget, count.name, prompt, tuple(blocks), lore, names, controls, fitted.renderer.text_form)
    return built, fitted.renderer


def _controls(renderer: PromptRenderer, assembly: Assembly, count: TokenCounter) -> tuple[str, ...]:
    """The model's control tokens the chosen prompt's blocks spell (before any is broken up)."""
    if not count.specials:
        return ()
    from dataclasses import replace

    from .render.specials import spelled

    blocks = replace(renderer, specials=()).blocks(assembly)
    names = renderer.variables.names  # the format writes them into its own sequences too
    texts = [*(b.text for b in blocks), *(b.name for b in blocks), names.user, names.char]
    return tuple(spelled("\n".join(texts), count.specials))


# --- the model ------------------------------------------------------------------------------


def counter_for(settings: Settings) -> TokenCounter:
    """A fresh counter for `[model] tokenizer` (after `with_model`): a name, "server", or a
    tokenizer file. Every command that counts makes its counter here."""
    from .model.resolve import counter

    m = settings.model
    made = counter(m.tokenizer, m.server or settings.summarize.url, m.name or settings.summarize.model)
    if m.tokenizer == "server" and m.use:
        # a server names few control tokens (llama.cpp its BOS and EOS, the others none): the
        # model's own file names them all, for the text prompt to break up
        from .model.resolve import locate

        own = counter(locate(m.use).tokenizer).specials
        made.specials = tuple(dict.fromkeys((*made.specials, *own)))
    return made


def with_model(settings: Settings) -> Settings:
    """The settings with what `[model] use` (`--use`) gives, where the user set nothing of
    their own: the model's tokenizer, its chat template as the format, and its window — with
    `tokenizer = "server"`, the window the server enforces. A part the user set wins: given
    on the command line, or in the config file as something other than its default."""
    from dataclasses import replace

    m = settings.model
    model: dict[str, Any] = {}
    prompt: dict[str, Any] = {}
    label = f"the model ({m.use})"
    if m.use:
        from .model.resolve import locate

        files = locate(m.use)
        if not _user_set(settings, "model.tokenizer"):
            model["tokenizer"] = files.tokenizer
        if not _user_set(settings, "prompt.format") and (template := files.template):
            prompt["format"] = template
        if not _user_set(settings, "model.window") and (window := files.window):
            model["window"] = window
    if model.get("tokenizer", m.tokenizer) == "server" and not _user_set(settings, "model.window"):
        from .model.resolve import server_window

        server = m.server or settings.summarize.url
        if server and (window := server_window(server, m.name or settings.summarize.model)):
            model["window"], label = window, f"the server ({server})"
    if not model and not prompt:
        return settings
    sources = dict(settings.sources)
    sources.update({f"model.{key}": label for key in model})
    sources.update({f"prompt.{key}": label for key in prompt})
    return replace(
        settings,
        model=replace(settings.model, **model),
        prompt=replace(settings.prompt, **prompt),
        sources=sources,
    )


def _user_set(settings: Settings, dotted: str) -> bool:
    """Whether the user chose `dotted` themselves: on the command line, or in the config file
    as a value other than the default (a file `ctx config init` wrote holds every default)."""
    source = settings.sources.get(dotted, "default")
    if source == "default":
        return False
    if dotted in settings.given:
        return True
    section, key = dotted.split(".")
    values = getattr(settings, section)
    return bool(getattr(values, key) != getattr(type(values)(), key))
