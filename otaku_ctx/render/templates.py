"""What a context template is to the renderer: one `PromptTemplate` protocol, whichever kind.

Two kinds implement it: a Handlebars `.hbs` template (`HandlebarsTemplate`, here) and a
SillyTavern context preset (`presets.PresetTemplate`). The renderer binds a template to its
format once (`for_format`) and then only renders it and asks it for its stop strings; no
code outside the module that makes a kind asks which kind it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..hbs import Template
from ..hbs.blocks import Block
from .formats import Format, stop_sequences


class PromptTemplate(Protocol):
    @property
    def name(self) -> str: ...

    def for_format(self, fmt: Format) -> PromptTemplate:
        """The template as it renders for `fmt` (the format already bound to the story's names)."""
        ...

    def render(self, variables: Mapping[str, Any], bound: int | None = None) -> list[Block]:
        """Role blocks for the template variables, within `bound` characters."""
        ...

    def render_raw(self, variables: Mapping[str, Any], bound: int | None = None) -> str:
        """Every character the template prints, role blocks shown inline (`ctx template render`)."""
        ...

    def stop(self, fmt: Format, people: Sequence[str], fill: Callable[[str], str]) -> list[str]:
        """The stop strings, most important first, for the `people` who are not the one speaking."""
        ...


@dataclass(frozen=True)
class HandlebarsTemplate:
    """A `.hbs` context template: its role blocks are the prompt's, and the format decides the stops."""

    program: Template

    @property
    def name(self) -> str:
        return self.program.name

    def for_format(self, fmt: Format) -> HandlebarsTemplate:
        return self

    def render(self, variables: Mapping[str, Any], bound: int | None = None) -> list[Block]:
        return self.program.render(variables, bound)

    def render_raw(self, variables: Mapping[str, Any], bound: int | None = None) -> str:
        return self.program.render_raw(variables, bound)

    def stop(self, fmt: Format, people: Sequence[str], fill: Callable[[str], str]) -> list[str]:
        """The format's end of turn, the user's name (the model must not speak for them), the
        format's other stops, then the other speakers."""
        first, rest = list(fmt.stop[:1]), list(fmt.stop[1:])
        bare = replace(fmt, stop=())
        ordered = stop_sequences(bare, people[:1]) if people else []
        return list(dict.fromkeys([*first, *ordered, *rest, *stop_sequences(bare, people[1:])]))
