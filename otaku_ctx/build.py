"""From settings and a story to the finished prompt: the core behind `ctx build`, `inspect`,
`replay` and `serve`.

`Pipeline` is made once for the settings and the counter, and holds what every build needs
(the counter and its counts, the template and format as read, the lorebooks, the seed's
numbers); each build hands a story down the stages once: lore, assemble, render. No Typer,
no Rich, no printing: the CLI shows what this returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from .assemble import Assembly, Walked, assemble
from .assemble.search import Search
from .assemble.stable import Stable
from .config import Settings
from .hbs.blocks import Block
from .lore import LoreChoice
from .lore.turn import Reader, lore_for_turn
from .render.emit import PromptRenderer, sections
from .render.names import ResolvedNames, resolve_names
from .render.prepare import Binder, Prepared
from .render.pricing import Prices, TemplatePricer
from .render.variables import OPEN_MARK
from .story.detect import read_story
from .story.model import LoreEntry, Story
from .tokens import TokenCounter

# The pipeline's door, all the CLI may import from here (tests/test_cli_door.py): the settings
# made ready for the model (`with_model`), a story read (`open_story`) and written back as native
# JSONL (`native_text`, which resolves `{{char}}` as a build does), and the prompt built.
__all__ = ["Budget", "Built", "Pipeline", "build", "native_text", "open_story", "with_model"]


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
    # markup the story spells (`<|eot_id|>`) where nothing names the model's control tokens
    unknown: tuple[str, ...] = ()
    format_note: str = ""  # what the format says of itself (a bare .jinja's empty BOS and EOS)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the user should know of this prompt: control tokens its text spells, or
        markup it spells that ctx cannot tell from one (no model named, a plain format); and
        what the format says of itself (a bare .jinja's empty BOS and EOS)."""
        said = (self.format_note,) if self.format_note else ()
        return said + self._control_notes()

    def _control_notes(self) -> tuple[str, ...]:
        if self.unknown:
            return (
                f"warning: the story spells {_listed(self.unknown)}, left as it is: nothing here names the"
                " model's control tokens (a format of plain text, no model's tokenizer); give --use MODEL or"
                " --tokenizer FILE and ctx breaks up those the model has",
            )
        if not self.controls:
            return ()
        shown = _listed(self.controls)
        if self.text_form:
            return (f"the story spells the model's control tokens {shown}: broken up, so they stay text",)
        return (
            f"warning: the story spells the model's control tokens {shown}; a server that applies the"
            " model's template may read them as control tokens (a text --emit breaks them up)",
        )


@dataclass(frozen=True)
class Attempt:
    """One assembly of the prepared story, within `budget`, around a choice of lore."""

    prepared: Prepared
    budget: Budget
    lore: LoreChoice
    renderer: PromptRenderer
    pricer: TemplatePricer
    assembly: Assembly


class Pipeline:
    """The prompt of any story for one set of settings and one counter, cheap to call again:
    made once (the counter, the template and format as read, the lorebooks, the seed's numbers,
    the lore rules), then `build(story)` for each story — a chat's every turn. Its methods are
    the stages' entry points, in the order a build calls them: `prepare` (the template bound to
    the story's names), `budget`, `lore`, `attempt` (assemble), `render`; `candidates` are the
    shapes the stable policy chooses among (the replay's bound)."""

    def __init__(
        self,
        settings: Settings,
        *,
        emit: str = "text",
        count: TokenCounter | None = None,
        prices: Prices | None = None,
        hold: bool = False,
    ) -> None:
        """`hold`: a server's pipeline, whose chats go on from the shape they were last sent even
        when summaries were written since (`Policy.hold`)."""
        c = settings.context
        self.settings, self.emit = settings, emit
        self.count = count or counter_for(settings)
        self.shape, self.rules = c.shape(), settings.lore.rules()
        self.policy, self.recall = replace(c.policy(), hold=hold), c.recalling()
        # the parts' derived prices, kept from one build to the next (keyed by all they depend on
        # but the counter, so a pipeline of other settings and the same counter may share them)
        self.prices = prices or Prices()

    @cached_property
    def binder(self) -> Binder:
        """The template and format, read when a story is first prepared (a summarize plan needs
        only the counter)."""
        return Binder(self.settings, self.emit)

    @cached_property
    def books(self) -> tuple[LoreEntry, ...]:
        """The `[lore] files` (or `--lore`), read once for every story the pipeline builds."""
        return _lorebooks(self.settings.lore.files)

    def build(self, story: Story, resume: Walked | None = None) -> Built:
        """Assemble the story for the configured window and render the prompt (cases 1–6).
        `resume`: the stable policy's walk at an earlier turn of this chat (the `walked` of that
        turn's assembly), to go on from rather than walk the chat from its first message."""
        return self.render(self.fit(self.prepare(story), resume))

    def prepare(self, story: Story) -> Prepared:
        return self.binder.prepare(story)

    def budget(self, story: Story) -> Budget:
        reserve, why = reply_reserve(story, self.settings, self.count)
        return Budget(self.settings.model.window, self.settings.context.max_context, reserve, why)

    def lore(self, prepared: Prepared, budget: Budget) -> LoreChoice:
        """The lore for this story's next turn, within `[lore] budget` of the limit (docs/lore.md)."""
        names = prepared.names.names
        sure_tail = min(self.shape.tail_floor, self.shape.min_tail)
        reader = Reader(names.speaker, names.fill, names.char, self.shape.head, sure_tail)
        return lore_for_turn(prepared.story, self.books, self.rules, reader, count=self.count, limit=budget.limit)

    def attempt(self, prepared: Prepared, lore: LoreChoice, budget: Budget, resume: Walked | None = None) -> Attempt:
        """The story assembled around `lore` (cases 1–6)."""
        renderer = prepared.renderer(lore, budget.reserve, self.count)
        pricer = TemplatePricer(renderer, self.count, prices=self.prices)
        policy = self.policy if resume is None else replace(self.policy, resume=resume)
        a = assemble(
            prepared.story, self.shape, budget.limit, pricer, reserve=budget.reserve, policy=policy, recall=self.recall
        )
        return Attempt(prepared, budget, lore, renderer, pricer, a)

    def fit(self, prepared: Prepared, resume: Walked | None = None) -> Attempt:
        """The story assembled with its lore as part of its fixed frame; when the frame with it
        leaves the story no room, the most entries by priority (`order`) that do: a binary
        search over how many are kept. The refusal with all of them when none leaves room."""
        budget = self.budget(prepared.story)
        lore = self.lore(prepared, budget)
        first = self.attempt(prepared, lore, budget, resume)
        placed = len(lore.placed)
        if first.assembly.refusal is None or not placed:
            return first
        tried: dict[int, Attempt] = {}

        def fits(keep: int) -> bool:
            tried[keep] = self.attempt(prepared, lore.without(keep), budget, resume)
            return tried[keep].assembly.refusal is None

        return tried[most_that_fits(fits, placed - 1) or 0]

    def render(self, fitted: Attempt) -> Built:
        """The prompt of the chosen assembly, exactly as emitted (nothing for a refusal)."""
        a, lore, budget, names = fitted.assembly, fitted.lore, fitted.budget, fitted.prepared.names
        if a.refusal:
            return Built(a, budget, self.count.name, None, lore=lore, names=names)
        blocks = fitted.pricer.blocks(a)
        prompt = fitted.renderer.emitted(blocks)
        controls, text_form = _controls(fitted.renderer, a, self.count), fitted.renderer.text_form
        unknown = _unknown_markup(fitted.renderer, a, self.count) if text_form else ()
        note = fitted.renderer.format.note
        return Built(a, budget, self.count.name, prompt, tuple(blocks), lore, names, controls, text_form, unknown, note)

    def candidates(self, story: Story) -> Iterator[tuple[tuple[int, int], Assembly, TemplatePricer]]:
        """Every shape of the story's prompt that fits — the candidates the stable policy chooses
        among — each with the pricer that renders it, keyed by (covered scenes, level). The lore
        is the build's first choice (a build that must drop entries to fit is not followed)."""
        prepared = self.prepare(story)
        budget = self.budget(story)
        lore = self.lore(prepared, budget)
        pricer = TemplatePricer(prepared.renderer(lore, budget.reserve, self.count), self.count, prices=self.prices)
        search = Search(story, self.shape, budget.limit, budget.reserve, pricer)
        for key, a in Stable(search, self.policy.slack).fitting():
            yield key, a, pricer

    def alternatives(self, story: Story) -> tuple[str, ...]:
        """For a story refused at these settings, the other settings that would make it fit, each
        with the value found by building the story at it (a binary search, a few builds each):
        the most opening messages that fit (`--head`), and the highest tail floor that fits
        (`[context] tail_floor`). Empty when neither would help."""
        c = self.settings.context
        found: list[str] = []
        head = self._most_that_fits(story, "head_messages", c.head_messages)
        if head is not None:
            found.append(f"keep {head:,} opening messages, not {c.head_messages:,} (--head {head})")
        floor = self._most_that_fits(story, "tail_floor", min(c.tail_floor, c.min_tail_messages))
        if floor is not None:
            found.append(
                f"keep at least {floor:,} recent messages, not {c.tail_floor:,} ([context] tail_floor = {floor})"
            )
        return tuple(found)

    def _most_that_fits(self, story: Story, key: str, now: int) -> int | None:
        """The largest value below `now` of `[context] key` at which the story fits, or None."""

        def fits(value: int) -> bool:
            values: dict[str, Any] = {key: value}
            context = replace(self.settings.context, **values)
            other = Pipeline(
                replace(self.settings, context=context), emit=self.emit, count=self.count, prices=self.prices
            )
            return other.build(story).assembly.refusal is None

        return most_that_fits(fits, now - 1) if now > 0 else None

    def variables(self, story: Story) -> tuple[Built, dict[str, Any] | None]:
        """What `build` chose, and the variables its template saw for that assembly (None for a
        refusal): what `ctx template vars` shows template authors."""
        fitted = self.fit(self.prepare(story))
        built = self.render(fitted)
        if built.assembly.refusal:
            return built, None
        return built, _unmarked(fitted.renderer.variables.for_assembly(*sections(built.assembly)))


def most_that_fits(fits: Callable[[int], bool], high: int) -> int | None:
    """The largest value in 0..`high` for which `fits` holds, where it holds for every value up
    to some point and for none after (a binary search); None when it holds for none."""
    if not fits(0):
        return None
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def build(story: Story, settings: Settings, *, emit: str = "text", count: TokenCounter | None = None) -> Built:
    """One story's prompt (`Pipeline(settings).build(story)`). `count` lends a counter whose
    cache outlives one build."""
    return Pipeline(settings, emit=emit, count=count).build(story)


def renderer_for(
    story: Story, settings: Settings, *, emit: str = "text", reserve: int = 0, lore: LoreChoice | None = None
) -> PromptRenderer:
    """The configured template, format and emit form, ready to render this story (with the
    chosen lore in its variables), for a reply reserve of `reserve` tokens."""
    return Binder(settings, emit).prepare(story).renderer(lore, reserve)


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


def native_text(story: Story) -> str:
    """The story as a native JSONL file that builds the same prompts (`ctx convert`).

    `{{char}}` is written as this story resolves it. A SillyTavern header's character name
    only counts when no card stands before the chat (SillyTavern never reads its header
    back), while a native story's own `char` always counts: written as it was, a header
    name that differs from the card's would become the character."""
    from .story.convert import to_native_text

    char = resolve_names(story).char.name
    return to_native_text(replace(story, info=replace(story.info, char=char)))


def _lorebooks(files: Sequence[str]) -> tuple[LoreEntry, ...]:
    if not files:
        return ()
    from .story.worldinfo import read_world_info

    return tuple(e for f in files for e in read_world_info(Path(f)))


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


def _controls(renderer: PromptRenderer, assembly: Assembly, count: TokenCounter) -> tuple[str, ...]:
    """The model's control tokens the chosen prompt's blocks spell (before any is broken up):
    the counter's, and those the format's own model file names."""
    specials = tuple(dict.fromkeys((*count.specials, *renderer.specials)))
    if not specials:
        return ()
    from .render.specials import spelled

    blocks = replace(renderer, specials=()).blocks(assembly)
    names = renderer.variables.names  # the format writes them into its own sequences too
    texts = [*(b.text for b in blocks), *(b.name for b in blocks), names.user, names.char]
    return tuple(spelled("\n".join(texts), specials))


def _listed(texts: tuple[str, ...]) -> str:
    return ", ".join(texts[:5]) + (f" and {len(texts) - 5} more" if len(texts) > 5 else "")


def _unknown_markup(renderer: PromptRenderer, assembly: Assembly, count: TokenCounter) -> tuple[str, ...]:
    """The markup the story's text in a text prompt spells (`<|eot_id|>`, `[INST]`: its
    messages, names, summaries and histories, not the template's or the format's own text)
    when nothing names the model's control tokens — neither the counter nor the format's
    model file — so that none was broken up."""
    if count.specials or renderer.specials:
        return ()
    from .render.formats.model import WRITTEN_MARKUP

    texts = [m.content for m in (*assembly.head, *assembly.tail)]
    texts += [m.name or "" for m in (*assembly.head, *assembly.tail)]
    for part in assembly.recap:
        if part.scene is not None:
            texts += [part.scene.summary if part.kind == "summary" else part.scene.history]
        if part.message is not None:
            texts.append(part.message.content)
    return tuple(dict.fromkeys(m for text in texts for m in WRITTEN_MARKUP.findall(text)))


# --- the model ------------------------------------------------------------------------------


def counter_for(settings: Settings) -> TokenCounter:
    """A fresh counter for `[model] tokenizer` (after `with_model`): a name, "server", or a
    tokenizer file. Every command that counts makes its counter here."""
    from .model.resolve import counter

    m = settings.model
    return counter(m.tokenizer, m.server or settings.summarize.url, m.name or settings.summarize.model, use=m.use)


def with_model(settings: Settings, *, ask_server: bool = True) -> Settings:
    """The settings with what `[model] use` (`--use`) gives, where the user set nothing of
    their own: the model's tokenizer, its chat template as the format, and its window — with
    `tokenizer = "server"`, the window the server enforces. A part the user set wins: given
    on the command line, or in the config file as something other than its default.

    Exact by default: with no `use` and no tokenizer of the user's, a model server the user
    named (`--server`, `[model] server` or `[summarize] url`) counts, when it has a tokenize
    endpoint, and gives its window; OpenAI's cl100k_base counts only where no model is named
    (or the server cannot count), and `inspect` says so. `ask_server=False` asks no server
    for that (summarize's plan: a dry run contacts nobody, and a real run is checked against
    the server's own answers)."""
    m = settings.model
    model: dict[str, Any] = {}
    prompt: dict[str, Any] = {}
    label = f"the model ({m.use})"
    server = m.server or settings.summarize.url
    name = m.name or settings.summarize.model
    if m.use:
        from .model.resolve import locate

        files = locate(m.use)
        if not _user_set(settings, "model.tokenizer"):
            model["tokenizer"] = files.tokenizer
        if not _user_set(settings, "prompt.format") and (template := files.template):
            prompt["format"] = template
        if not _user_set(settings, "model.window") and (window := files.window):
            model["window"] = window
    elif server and ask_server and not _user_set(settings, "model.tokenizer"):
        from .model.resolve import server_counts

        if server_counts(server, name):
            model["tokenizer"], label = "server", f"the server ({server})"
    if model.get("tokenizer", m.tokenizer) == "server" and not _user_set(settings, "model.window"):
        from .model.resolve import server_window

        if server and (window := server_window(server, name)):
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
