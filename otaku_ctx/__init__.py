"""otaku-ctx: build the prompt for a long roleplay story that fits the model's window."""

from __future__ import annotations

__version__ = "0.1.0"

from .assembler import Assembly, Part, Pricer, Refusal, Shape, assemble  # noqa: E402
from .build import Budget, Built, build  # noqa: E402
from .config import Settings, load_settings  # noqa: E402
from .errors import ConfigError, ContextOverflow, OtakuError, StoryError, TemplateError  # noqa: E402
from .model import Card, Message, Scene, Story, StoryInfo  # noqa: E402
from .readers import read_story  # noqa: E402
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
    "TemplateError",
    "TokenCounter",
    "assemble",
    "build",
    "load_settings",
    "make_counter",
    "read_story",
]
