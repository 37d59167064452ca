"""`ctx`: parse arguments, make one core call, show the result. Errors are translated once, in `main`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__
from .build import Built, build, open_story
from .config import SCHEMA, Settings, default_config_path, default_toml, load_settings
from .convert import to_native_text
from .errors import ConfigError, ContextOverflow, OtakuError
from .files import write_atomic
from .prompt import EMITS
from .readers import READERS, check_story
from .report import facts, refusal_message

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Build the prompt for a long roleplay story that fits the model's window.",
)
config_app = typer.Typer(no_args_is_help=True, help="Write or show the settings.")
app.add_typer(config_app, name="config")

StoryArg = Annotated[Path, typer.Argument(help="The story file.", show_default=False, metavar="STORY")]
ConfigPath = Annotated[
    Path | None, typer.Option("--config", help="Read this config file instead of ~/.otaku/configs/config.toml.")
]
From = Annotated[
    str | None, typer.Option("--from", help=f"Read the story as {'|'.join(READERS)} (default: by content).")
]
Cards = Annotated[
    list[Path] | None, typer.Option("--card", metavar="FILE", help="Add a character card (JSON or PNG); repeatable.")
]
Window = Annotated[int | None, typer.Option("--window", help="The model's window in tokens.")]
MaxContext = Annotated[int | None, typer.Option("--max-context", help="Use at most this many tokens (0 = the window).")]
Head = Annotated[int | None, typer.Option("--head", help="Opening messages kept verbatim.")]
Tail = Annotated[int | None, typer.Option("--tail", help="At least this many recent messages kept verbatim.")]
Reserve = Annotated[str | None, typer.Option("--reserve", help='Tokens kept free for the reply, or "auto".')]
Tokenizer = Annotated[str | None, typer.Option("--tokenizer", help="cl100k_base (exact) or estimate (len/4).")]
Template = Annotated[str | None, typer.Option("--template", help="Context template: a name or a .hbs path.")]
Format = Annotated[
    str | None, typer.Option("--format", help="Prompt format: a name, a .toml, or a SillyTavern preset .json.")
]
User = Annotated[str | None, typer.Option("--user", help="The user's persona name ({{user}}).")]
Emit = Annotated[str, typer.Option("--emit", help=f"What to print: {', '.join(EMITS)}.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]

FLAGS = {
    "window": ("--window", "model.window"),
    "max_context": ("--max-context", "context.max_context"),
    "head": ("--head", "context.head_messages"),
    "tail": ("--tail", "context.min_tail_messages"),
    "reserve": ("--reserve", "context.reply_reserve"),
    "tokenizer": ("--tokenizer", "model.tokenizer"),
    "template": ("--template", "prompt.template"),
    "format": ("--format", "prompt.format"),
    "user": ("--user", "prompt.user"),
}


@dataclass(frozen=True)
class Request:
    """What `build` and `inspect` share: where the story is, and the settings to build it with."""

    story: Path
    source_format: str | None
    cards: list[Path]
    settings: Settings

    def run(self, emit: str) -> tuple[Built, int]:
        story = open_story(self.story, self.source_format, self.cards)
        return build(story, self.settings, emit=emit), story.hidden


def settings_from(config: Path | None, overrides: dict[str, tuple[Any, str]] | None = None) -> Settings:
    """The settings of `--config PATH` (which must exist) or of the default file (which may not)."""
    return load_settings(config.expanduser() if config else None, overrides, explicit=config is not None)


def checked_format(source_format: str | None) -> str | None:
    if source_format is not None and source_format not in READERS:
        raise typer.BadParameter(f"{source_format!r}; expected one of {', '.join(READERS)}", param_hint="--from")
    return source_format


def request(
    story: Path, source_format: str | None, cards: list[Path] | None, config: Path | None, emit: str, **flags: Any
) -> Request:
    """The story and the file's settings with every given flag on top (flags win)."""
    if emit not in EMITS:
        raise typer.BadParameter(f"{emit!r}; expected one of {', '.join(EMITS)}", param_hint="--emit")
    overrides = {dotted: (flags[name], flag) for name, (flag, dotted) in FLAGS.items() if flags.get(name) is not None}
    settings = settings_from(config, overrides)
    return Request(story, checked_format(source_format), list(cards or []), settings)


@app.command("build")
def build_cmd(
    story: StoryArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the prompt to this file (atomically).")
    ] = None,
    emit: Emit = "text",
    source_format: From = None,
    card: Cards = None,
    template: Template = None,
    format: Format = None,
    user: User = None,
    config: ConfigPath = None,
    window: Window = None,
    max_context: MaxContext = None,
    head: Head = None,
    tail: Tail = None,
    reserve: Reserve = None,
    tokenizer: Tokenizer = None,
    debug: Debug = False,
) -> None:
    """Print the prompt for STORY on stdout (only the prompt; diagnostics go to stderr)."""
    flags = dict(window=window, max_context=max_context, head=head, tail=tail, reserve=reserve, tokenizer=tokenizer)
    req = request(story, source_format, card, config, emit, template=template, format=format, user=user, **flags)
    built, _ = req.run(emit)
    a = built.assembly
    if a.refusal:
        raise ContextOverflow(a, f"{story}: {refusal_message(a.refusal, built.budget)}")
    assert built.prompt is not None
    if output:
        write_atomic(output, built.prompt)
    else:
        newline = "\n" if sys.stdout.isatty() and not built.prompt.endswith("\n") else ""
        sys.stdout.write(built.prompt + newline)
        sys.stdout.flush()
    if sys.stderr.isatty():
        typer.echo(f"case {a.case} · {a.tokens:,} of {a.limit:,} tokens ({built.tokenizer})", err=True)


@app.command("inspect")
def inspect_cmd(
    story: StoryArg,
    explain: Annotated[bool, typer.Option("--explain", help="Draw the case, sections, budget and every step.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the same facts as JSON.")] = False,
    emit: Emit = "text",
    source_format: From = None,
    card: Cards = None,
    template: Template = None,
    format: Format = None,
    user: User = None,
    config: ConfigPath = None,
    window: Window = None,
    max_context: MaxContext = None,
    head: Head = None,
    tail: Tail = None,
    reserve: Reserve = None,
    tokenizer: Tokenizer = None,
    debug: Debug = False,
) -> None:
    """Show why the prompt for STORY looks the way it does (the explanation is the default)."""
    flags = dict(window=window, max_context=max_context, head=head, tail=tail, reserve=reserve, tokenizer=tokenizer)
    req = request(story, source_format, card, config, emit, template=template, format=format, user=user, **flags)
    built, hidden = req.run(emit)
    data = facts(built, hidden)
    if as_json:
        sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    else:
        from .views import console
        from .views import explain as draw

        console().print(draw(data))
    if built.assembly.refusal:
        raise typer.Exit(3)


@app.command("validate")
def validate_cmd(story: StoryArg, source_format: From = None, debug: Debug = False) -> None:
    """Report every problem of STORY at once; exit 1 when any is an error."""
    kind, problems = check_story(story, checked_format(source_format))
    for p in problems:
        where = f"{story}:{p.line}" if p.line else str(story)
        typer.echo(f"{where}: {p.severity}: {p.message}", err=True)
    if any(p.severity == "error" for p in problems):
        raise typer.Exit(1)
    warnings = f" ({len(problems)} warning{'s' * (len(problems) != 1)})" if problems else ""
    typer.echo(f"{story}: ok, {kind}{warnings}", err=True)


@app.command("convert")
def convert_cmd(
    story: StoryArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="The native JSONL file to write (atomically).")],
    source_format: From = None,
    card: Cards = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    debug: Debug = False,
) -> None:
    """Write STORY (any readable format) as native JSONL."""
    if output.exists() and not force:
        raise ConfigError(str(output), None, "already exists; pass --force to overwrite it")
    if output.resolve() == story.resolve():
        raise ConfigError(str(output), None, "is the story itself; a story file is never modified")
    converted = open_story(story, source_format, card or [])
    write_atomic(output, to_native_text(converted))
    typer.echo(f"wrote {output}: {len(converted)} messages, {len(converted.scenes)} scenes", err=True)


@config_app.command("init")
def config_init(
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    config: ConfigPath = None,
    debug: Debug = False,
) -> None:
    """Write the default config file (~/.otaku/configs/config.toml, or --config PATH)."""
    path = config.expanduser() if config else default_config_path()
    if path.exists() and not force:
        raise ConfigError(str(path), None, "already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, default_toml())
    typer.echo(f"wrote {path}", err=True)


@config_app.command("show")
def config_show(
    config: ConfigPath = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    debug: Debug = False,
) -> None:
    """Print the effective settings and where each came from."""
    settings = settings_from(config)
    rows = [
        (f"{section}.{key}", settings.values[section][key], settings.sources[f"{section}.{key}"])
        for section, keys in SCHEMA.items()
        for key in keys
    ]
    if as_json:
        out = {name: {"value": value, "from": source} for name, value, source in rows}
        sys.stdout.write(json.dumps(out, ensure_ascii=False, indent=2) + "\n")
        return
    from .views import console, settings_table

    console().print(settings_table([(name, json.dumps(value, ensure_ascii=False), src) for name, value, src in rows]))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ctx {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    """Run `ctx`; every core error becomes one line on stderr and its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        # Typer reports usage errors itself (exit 2) and ends with SystemExit.
        app(args=argv, prog_name="ctx")
    except OtakuError as exc:
        if debug:
            raise
        typer.echo(f"ctx: {exc}", err=True)
        # A bad flag value is a usage error; a bad config file or story is bad input.
        return 2 if isinstance(exc, ConfigError) and exc.source.startswith("--") else exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error of ours
        return 0
    except OSError as exc:  # writing -o into a missing folder, a full disk, ...
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"ctx: {where}{exc.strerror or exc}", err=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def entry() -> None:  # console script
    sys.exit(main())
