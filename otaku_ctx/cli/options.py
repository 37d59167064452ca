"""The options every command shares, and the `Request` a prompt-building command receives."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.main
from typer.core import TyperArgument

from .terminal import progress, terminal

if TYPE_CHECKING:
    from ..build import Built, Pipeline
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


# File arguments stay text as given: `-` is stdin but `./-` a file, and `--config ''` is not `.`.
StoryArg = Annotated[str, typer.Argument(help="The story file, or - to read it from stdin.", show_default=False)]
ConfigPath = Annotated[
    str | None,
    typer.Option("--config", metavar="FILE", help="Read this config file instead of ~/.otaku/configs/config.toml."),
]
From = Annotated[
    SourceFormat | None, typer.Option("--from", help="Read the story as this format (default: by its content).")
]
Cards = Annotated[
    list[str] | None, typer.Option("--card", metavar="FILE", help="Add a character card (JSON or PNG); repeatable.")
]
MaxStorySize = Annotated[
    str | None,
    typer.Option("--max-story-size", metavar="SIZE", help="Read a story of up to SIZE (default 1G), e.g. 4G."),
]
Summaries = Annotated[
    str | None,
    typer.Option(
        "--summaries",
        metavar="FILE|none",
        help="Read scene summaries from FILE (default: STORY.ctx-summaries beside it, when there), or none.",
    ),
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
_shared("max_story_size", MaxStorySize)
_shared("summaries", Summaries)


def _named(folder: str, suffix: str) -> Callable[[str], list[str]]:
    """Shell completion of a name the shipped or the user's `folder` holds (a format, a template)."""

    def complete(incomplete: str) -> list[str]:
        from ..locations import search_dirs

        names = {p.stem for d in search_dirs(folder) if d.is_dir() for p in d.glob(f"*{suffix}")}
        return sorted(n for n in names if n.startswith(incomplete))

    return complete


_shared(
    "template",
    str | None,
    "prompt.template",
    metavar="NAME|FILE",
    help="Context template: a name or a .hbs file.",
    autocompletion=_named("templates", ".hbs"),
)
_shared(
    "format",
    str | None,
    "prompt.format",
    metavar="NAME|FILE",
    help="Prompt format: a name, a .toml, a preset .json, or a model's template (.jinja, tokenizer_config.json, .gguf)",
    autocompletion=_named("formats", ".toml"),
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
_shared(
    "recall", float | None, "context.recall", metavar="SHARE",
    help="Share of the limit for older messages and summaries the newest recall (0 = off; docs/lore.md).",
)  # fmt: skip
_shared(
    "use",
    str | None,
    "model.use",
    metavar="GGUF|DIR|OLLAMA-NAME",
    help="The model you run: its tokenizer, chat template and window (docs/model.md).",
)
_shared(
    "tokenizer",
    str | None,
    "model.tokenizer",
    metavar="NAME|FILE",
    help="cl100k_base, estimate (len/4), server, or a tokenizer file (GGUF, tokenizer.json, Mistral's).",
)
_shared("server", str | None, "model.server", metavar="URL", help="The model server --tokenizer server asks.")
_shared("lore", list[str] | None, "lore.files", metavar="FILE", help="Read a World Info lorebook; repeatable.")
_shared("debug", Debug)
_DEFAULTS: dict[str, Any] = {"emit": Emit.text, "debug": False}


@dataclass(frozen=True)
class Request:
    """What a command that builds a prompt was asked: the story and the settings to build it with."""

    story: str  # as given: "-" is stdin
    source_format: str | None
    cards: tuple[Path, ...]
    conversation: int | None
    emit: str
    config: str | None
    overrides: dict[str, tuple[Any, str]]
    story_bound: int | None = None  # --max-story-size
    summaries: str | None = None  # --summaries FILE|none

    def settings(self) -> Settings:
        """The settings, with what the model `--use` names gives where the user set nothing;
        with an embedding model named (`[recall]`), recall on at serve's share where no share
        was set (recall by meaning is what the user asked for)."""
        from ..build import with_model
        from ..config import SERVE_DEFAULTS

        settings = with_model(settings_from(self.config, self.overrides))
        if settings.recall.on and settings.sources.get("context.recall", "default") == "default":
            context = replace(settings.context, recall=SERVE_DEFAULTS["context.recall"])
            settings = replace(settings, context=context)
        return settings

    def read_story(self) -> Story:
        """The story with its cards, read (see `read_story`)."""
        return read_story(
            self.story, self.source_format, self.cards, self.conversation, self.story_bound, self.summaries
        )

    def run(self) -> tuple[Built, Story, Pipeline]:
        """Read the story and build it: (the `Built` result, the `Story`, the pipeline that
        built it). What the reader chose for the user (which conversation of many) is said on
        stderr."""
        from ..build import Pipeline

        settings = self.settings()
        with progress(terminal()) as phase:
            # The tokenizer first: its load-time peak is then over before the story takes memory.
            phase("loading the tokenizer")
            pipeline = Pipeline(settings, emit=self.emit)
            phase(f"reading {self.story}")
            story = self.read_story()
            if settings.recall.on:  # the two queries embedded: one request, [recall] timeout at most
                from ..embed import Held, vectors_path, with_meaning

                phase(f"asking {settings.recall.model} what the newest messages mean")
                sidecar = summaries_path(self.story, self.summaries)
                held = Held(vectors_path(story, settings.recall, sidecar), settings.recall.model)
                story = with_meaning(story, settings.recall, held)
            # One command, one story: what is read now lives to the end, so no full collection
            # need scan it again (a 100k-row chat cost about a second of them).
            gc.freeze()
            phase(f"building the prompt from {len(story):,} messages")
            built = pipeline.build(story)
        for note in story.notes:
            terminal().say(f"ctx: {note}")
        if story.meaning is not None and story.meaning.failed:
            terminal().say(f"ctx: recall by keywords alone: {story.meaning.failed}")
        for note in built.lore.notes:
            terminal().say(f"ctx: lore: {note}")
        for note in built.notes:
            terminal().say(f"ctx: {note}")
        return built, story, pipeline


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
        for flag in ("template", "format", "use", "tokenizer"):
            named(options[flag], f"--{flag}", "an empty name; name one, or a file")
        named(options["server"], "--server", "an empty URL; name the model server")
        for lore in options["lore"] or ():
            named(lore, "--lore", "an empty path; name a lorebook file")
        source = options["source_format"]
        request = Request(
            story=named(given["story"], "STORY", "an empty path; name the story file, or - for stdin"),
            source_format=source.value if source else None,
            cards=card_paths(options["card"]),
            conversation=options["conversation"],
            emit=options["emit"].value,
            config=options["config"],
            overrides=overrides,
            story_bound=story_bound(options["max_story_size"]),
            summaries=named(options["summaries"], "--summaries", "an empty path; name a summaries file, or none"),
        )
        return command(request=request, **given)

    wrapper.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *shared]}
    return wrapper  # type: ignore[return-value]


def settings_from(config: str | None, overrides: dict[str, tuple[Any, str]] | None = None) -> Settings:
    """The settings of `--config FILE` (which must exist) or of the default file (which may
    not), read bounded and recorded as an input of the run (`files.read_input`)."""
    from ..config import load_settings
    from ..files import read_input

    given = named(config, "--config", "an empty path; name a config file")
    path = Path(given).expanduser() if config is not None else None

    def reader(path: Path) -> bytes:
        return read_input(path, "config file")

    return load_settings(path, overrides, explicit=config is not None, reader=reader)


def read_story(
    story: str,
    source_format: str | None,
    cards: Sequence[Path] = (),
    conversation: int | None = None,
    bound: int | None = None,
    summaries: str | None = None,
) -> Story:
    """Read STORY as given ("-" is stdin; a stream is copied once, at most `bound` bytes) with
    its summaries file (`summaries_path`) and its cards; errors and the story's `path` name
    what the user gave, never a temp copy."""
    from ..build import open_story
    from ..files import as_regular_file

    sidecar = summaries_path(story, summaries)
    with as_regular_file(story, terminal().stdin, bound) as path:
        told = open_story(path, source_format, cards, conversation, sidecar, str(sidecar))
    return replace(told, path=Path("<stdin>" if story == "-" else story))


def summaries_path(story: str, given: str | None) -> Path | None:
    """The summaries file a run reads: `--summaries FILE` (which must exist), none for
    `--summaries none`, else `STORY.ctx-summaries` beside the story when it is there."""
    from ..errors import StoryError
    from ..story.sidecar import sidecar_for

    if given == "none":
        return None
    if given:
        path = Path(given)
        if not path.exists():
            raise StoryError(path, None, "no such summaries file (ctx summarize writes one; or --summaries none)")
        return path
    if story == "-" or not story:
        return None
    beside = sidecar_for(story)
    return beside if beside.is_file() else None


def named(value: str | None, flag: str, empty: str) -> str:
    """A file or a name as given on the command line; an empty one is a usage error."""
    from ..errors import UsageError

    if value == "":
        raise UsageError(flag, None, empty)
    return value or ""


def card_paths(cards: Sequence[str] | None) -> tuple[Path, ...]:
    return tuple(Path(named(card, "--card", "an empty path; name a card file")) for card in cards or ())


def story_bound(size: str | None) -> int | None:
    """`--max-story-size`: 2G, 512M, 64K or a number of bytes (binary units)."""
    from ..errors import UsageError
    from ..files import parse_size

    if size is None:
        return None
    try:
        return parse_size(size)
    except ValueError:
        expected = f"expected a size such as 4G, 512M or 1000000 (bytes), got {size!r}"
        raise UsageError("--max-story-size", None, expected) from None
