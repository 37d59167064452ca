"""The options every command shares, and the `Request` a prompt-building command receives."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.main
from typer.core import TyperArgument

from .terminal import progress, terminal

if TYPE_CHECKING:
    from ..build import Built
    from ..config import Settings
    from ..story.model import Story


class _Argument(TyperArgument):
    """Arguments shown the usual Unix way, `ctx build [OPTIONS] STORY`, not Typer's `{story}`."""

    def make_metavar(self, ctx: Any, *, usage: bool = False) -> str:
        name = (self.metavar or self.name or "").upper()
        return name if self.required or not usage else f"[{name}]"


setattr(typer.main, "TyperArgument", _Argument)  # noqa: B010 - the class Typer builds arguments with


class Emit(StrEnum):
    text = "text"
    messages = "messages"
    openai_chat = "openai-chat"
    openai_completion = "openai-completion"


class SourceFormat(StrEnum):
    native = "native"
    openai = "openai"
    sillytavern = "sillytavern"
    otaku = "otaku"
    sharegpt = "sharegpt"
    finetune = "finetune"
    tavernai = "tavernai"


class TokenizerName(StrEnum):
    cl100k_base = "cl100k_base"
    estimate = "estimate"


StoryArg = Annotated[Path, typer.Argument(help="The story file, or - to read it from stdin.", show_default=False)]
ConfigPath = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="Read this config file instead of ~/.otaku/configs/config.toml."),
]
From = Annotated[
    SourceFormat | None, typer.Option("--from", help="Read the story as this format (default: by its content).")
]
Cards = Annotated[
    list[Path] | None, typer.Option("--card", metavar="FILE", help="Add a character card (JSON or PNG); repeatable.")
]
Force = Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the same facts as JSON.")]

# The options that shape a prompt, shared by every command that builds one: the parameter
# name, its type, and the setting it overrides (None: not a setting).
PROMPT_OPTIONS: list[tuple[str, Any, str | None]] = []


def _shared(name: str, kind: Any, setting: str | None = None, **option: Any) -> None:
    typed = kind if option.get("help") is None else Annotated[kind, typer.Option(**option)]
    PROMPT_OPTIONS.append((name, typed, setting))


Conversation = Annotated[
    int | None,
    typer.Option(min=1, metavar="N", help="Which conversation of a ShareGPT or fine-tuning file (1 = the first)."),
]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]

_shared("emit", Emit, help="What to print.")
_shared("source_format", From)
_shared("card", Cards)
_shared("conversation", Conversation)
_shared("template", str | None, "prompt.template", metavar="NAME|FILE", help="Context template: a name or a .hbs file.")
_shared(
    "format",
    str | None,
    "prompt.format",
    metavar="NAME|FILE",
    help="Prompt format: a name, a .toml, or a preset .json.",
)
_shared("user", str | None, "prompt.user", metavar="NAME", help="The user's persona name ({{user}}).")
_shared("char", str | None, "prompt.char", metavar="NAME", help="The character's name ({{char}}).")
_shared("config", ConfigPath)
_shared("window", int | None, "model.window", metavar="TOKENS", help="The model's window in tokens.")
_shared("model", str | None, "model.name", metavar="NAME", help='The "model" of a request body (--emit openai-*).')
_shared("max_context", int | None, "context.max_context", metavar="TOKENS", help="Use at most this many tokens.")
_shared("head", int | None, "context.head_messages", metavar="N", help="Opening messages kept verbatim.")
_shared("tail", int | None, "context.min_tail_messages", metavar="N", help="Recent messages kept verbatim, at least.")
_shared("reserve", str | None, "context.reply_reserve", metavar="TOKENS|auto", help="Tokens kept free for the reply.")
_shared("cache", str | None, "context.cache", metavar="exact|stable", help="How the shape is chosen (docs/caching.md).")
_shared("tokenizer", TokenizerName | None, "model.tokenizer", help="cl100k_base (exact) or estimate (len/4).")
_shared("lore", list[Path] | None, "lore.files", metavar="FILE", help="Read a World Info lorebook; repeatable.")
_shared("debug", Debug)
_DEFAULTS: dict[str, Any] = {"emit": Emit.text, "debug": False}


@dataclass(frozen=True)
class Request:
    """What a command that builds a prompt was asked: the story and the settings to build it with."""

    story: Path
    source_format: str | None
    cards: tuple[Path, ...]
    conversation: int | None
    emit: str
    config: Path | None
    overrides: dict[str, tuple[Any, str]]

    def settings(self) -> Settings:
        return settings_from(self.config, self.overrides)

    def inputs(self) -> list[Path]:
        """Every file this command reads: what an output must never replace."""
        lore = [Path(p) for p in self.overrides.get("lore.files", ((), ""))[0]]
        return [self.story, *self.cards, *lore, *([self.config] if self.config else [])]

    def run(self) -> tuple[Built, Story]:
        """Read the story and build it: (the `Built` result, the `Story`). What the reader
        chose for the user (which conversation of many) is said on stderr."""
        from ..build import build, open_story
        from ..files import as_regular_file
        from ..tokens import make_counter

        settings = self.settings()
        with progress(terminal()) as phase:
            # The tokenizer first: its load-time peak is then over before the story takes memory.
            phase("loading the tokenizer")
            count = make_counter(settings.model.tokenizer)
            phase(f"reading {self.story}")
            with as_regular_file(self.story, terminal().stdin) as path:
                story = open_story(path, self.source_format, self.cards, self.conversation)
            phase(f"building the prompt from {len(story):,} messages")
            built = build(story, settings, emit=self.emit, count=count)
        for note in story.notes:
            terminal().say(f"ctx: {note}")
        for note in built.lore.notes:
            terminal().say(f"ctx: lore: {note}")
        return built, story


F = TypeVar("F", bound=Callable[..., Any])


def prompt_options(command: F) -> F:
    """Give a command the options that choose the story and shape its prompt (one list for
    `build` and `inspect`, the way sqlite-utils shares its output options); the command
    receives them as one `Request` argument named `request`."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "request"]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind, default=_DEFAULTS.get(name))
        for name, kind, _ in PROMPT_OPTIONS
    ]

    @functools.wraps(command)
    def wrapper(**given: Any) -> Any:
        options = {name: given.pop(name) for name, _, _ in PROMPT_OPTIONS}
        overrides = {
            dotted: (value.value if isinstance(value, Enum) else value, "--" + name.replace("_", "-"))
            for name, _, dotted in PROMPT_OPTIONS
            if dotted and (value := options[name]) is not None
        }
        source = options["source_format"]
        request = Request(
            story=given["story"],
            source_format=source.value if source else None,
            cards=tuple(options["card"] or ()),
            conversation=options["conversation"],
            emit=options["emit"].value,
            config=options["config"].expanduser() if options["config"] else None,
            overrides=overrides,
        )
        return command(request=request, **given)

    wrapper.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *shared]}
    return wrapper  # type: ignore[return-value]


def settings_from(config: Path | None, overrides: dict[str, tuple[Any, str]] | None = None) -> Settings:
    """The settings of `--config FILE` (which must exist) or of the default file (which may not)."""
    from ..config import load_settings

    return load_settings(config.expanduser() if config else None, overrides, explicit=config is not None)
