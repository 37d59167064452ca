"""otaku-ctx: build the prompt for a long roleplay story that fits the model's window.

The public API is listed in `__all__`. Each name is imported from its module when first used,
so `import otaku_ctx` (and so `ctx --help` and `ctx --version`) costs nothing but this file.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name → the module (within otaku_ctx) that defines it
_HOMES = {
    "add_cards": "story.cards",
    "assemble": "assemble",
    "Assembly": "assemble",
    "Budget": "build",
    "build": "build",
    "Built": "build",
    "Card": "story.model",
    "compile_template": "hbs",
    "ConfigError": "errors",
    "ContextOverflow": "errors",
    "detect_format": "story.detect",
    "Format": "render.formats",
    "load_format": "render.formats",
    "load_settings": "config",
    "make_counter": "tokens",
    "Message": "story.model",
    "open_story": "build",
    "OtakuError": "errors",
    "Part": "assemble",
    "Pricer": "assemble",
    "read_card": "story.cards",
    "read_story": "story.detect",
    "Refusal": "assemble",
    "Scene": "story.model",
    "Settings": "config",
    "Shape": "assemble",
    "Story": "story.model",
    "StoryError": "errors",
    "StoryInfo": "story.model",
    "Template": "hbs",
    "TemplateError": "errors",
    "to_native_lines": "story.convert",
    "TokenCounter": "tokens",
}

__all__ = [
    "Assembly",
    "Budget",
    "Built",
    "Card",
    "ConfigError",
    "ContextOverflow",
    "Format",
    "Message",
    "OtakuError",
    "Part",
    "Pricer",
    "Refusal",
    "Scene",
    "Settings",
    "Shape",
    "Story",
    "StoryError",
    "StoryInfo",
    "Template",
    "TemplateError",
    "TokenCounter",
    "add_cards",
    "assemble",
    "build",
    "compile_template",
    "detect_format",
    "load_format",
    "load_settings",
    "make_counter",
    "open_story",
    "read_card",
    "read_story",
    "to_native_lines",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # what type checkers and editors see
    from .assemble import Assembly, Part, Pricer, Refusal, Shape, assemble
    from .build import Budget, Built, build, open_story
    from .config import Settings, load_settings
    from .errors import ConfigError, ContextOverflow, OtakuError, StoryError, TemplateError
    from .hbs import Template, compile_template
    from .render.formats import Format, load_format
    from .story.cards import add_cards, read_card
    from .story.convert import to_native_lines
    from .story.detect import detect_format, read_story
    from .story.model import Card, Message, Scene, Story, StoryInfo
    from .tokens import TokenCounter, make_counter
