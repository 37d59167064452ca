"""otaku-ctx: build the prompt for a long roleplay story that fits the model's window."""

from __future__ import annotations

__version__ = "0.1.0"

from .assembler import Assembly, Part, Pricer, Refusal, Shape, assemble  # noqa: E402
from .build import Budget, Built, build, open_story  # noqa: E402
from .cards import add_cards, read_card  # noqa: E402
from .config import Settings, load_settings  # noqa: E402
from .convert import to_native_lines  # noqa: E402
from .errors import ConfigError, ContextOverflow, OtakuError, StoryError, TemplateError  # noqa: E402
from .formats import Format, load_format  # noqa: E402
from .hbs import Template, compile_template  # noqa: E402
from .model import Card, Message, Scene, Story, StoryInfo  # noqa: E402
from .readers import detect_format, read_story  # noqa: E402
from .tokens import TokenCounter, make_counter  # noqa: E402

__all__ = [
    "Assembly",
    "Budget",
    "Built",
    "Card",
    "ConfigError",
    "ContextOverflow",
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
    "Format",
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
