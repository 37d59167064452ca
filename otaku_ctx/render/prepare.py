"""The configured template and format, bound to one story: its names, whether it is a group
chat, and the model the prompt is for. What every attempt of one build renders with."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import Settings
from ..errors import ConfigError, UsageError
from ..hbs import bound_for_window
from ..lore import LoreChoice
from ..story.model import Story
from ..tokens import TokenCounter
from .emit import EMITS, PromptRenderer
from .formats import Format, bind
from .lookup import find_format, load_template
from .names import ResolvedNames, resolve_names
from .specials import broken_up
from .templates import PromptTemplate
from .variables import Variables


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
        model = count is not None and count.parses_specials
        # the model's control tokens: its counter's, and those the format's own model file names
        counted = count.specials if count is not None and model else ()
        specials = tuple(dict.fromkeys((*counted, *fmt.controls)))
        if specials:
            template, fmt = self._for_model(specials)
        renderer = PromptRenderer(variables, template, fmt, self.emit, reserve, bound, m.name, m.max_stop_strings)
        if count is not None and model:
            renderer = renderer.for_model(count)
        elif fmt.server_bos:  # the format's model file says its server adds the BOS
            renderer = replace(renderer, server_bos=fmt.server_bos)
        return replace(renderer, specials=specials) if specials else renderer

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


class Binder:
    """The configured template and format, read once, bound to each story they render: the
    format to `{{user}}`, `{{char}}` and whether more than one character speaks (a group chat),
    the template to that format. A binding is kept for the next story with the same names (a
    chat's next turn)."""

    def __init__(self, settings: Settings, emit: str = "text") -> None:
        if emit not in EMITS:  # the CLI offers only these
            raise ValueError(f"unknown emit form {emit!r}; expected one of {', '.join(EMITS)}")
        p = settings.prompt
        with _usage_if_unknown(settings, "prompt.template", p.template):
            self.template = load_template(p.template)
        with _usage_if_unknown(settings, "prompt.format", p.format):
            self.format = find_format(p.format)
        if p.speakers == "as_given" and self.format.chat and not self.format.chat_template:
            # chat messages as the frontend sent them: two characters' turns in a row stay two (a
            # model's own template that demands alternating turns still merges them)
            self.format = replace(self.format, alternate=False)
        self.settings, self.emit = settings, emit
        self._bound: dict[tuple[str, str, bool], tuple[PromptTemplate, Format]] = {}

    def prepare(self, story: Story) -> Prepared:
        names = names_for(story, self.settings)
        n = names.names
        characters = {n.speaker_as(role, name) for role, name in story.speakers if role == "assistant"}
        key = (n.user, n.char, len(characters) > 1)
        bound = self._bound.get(key)
        if bound is None:
            fmt = bind(self.format, n.user, n.char, group=key[2])
            bound = self._bound[key] = (self.template.for_format(fmt), fmt)
        template, fmt = bound
        return Prepared(story, self.settings, names, template, fmt, self.emit, (self.template, self.format))


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
