"""`ctx`: parse arguments, make one core call, show the result. Errors are translated once, in `main`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from . import __version__
from .build import Built, build
from .config import SCHEMA, Settings, default_config_path, default_toml, load_settings
from .errors import ConfigError, ContextOverflow, OtakuError
from .files import write_atomic
from .readers import read_story
from .readers.native import check_native
from .report import facts

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    help="Build the prompt for a long roleplay story that fits the model's window.",
)
config_app = typer.Typer(no_args_is_help=True, help="Write or show the settings.")
app.add_typer(config_app, name="config")

Story = Annotated[Path, typer.Argument(help="The story file.", show_default=False, metavar="STORY")]
ConfigPath = Annotated[
    Path | None, typer.Option("--config", help="Read this config file instead of ~/.otaku/configs/config.toml.")
]
Window = Annotated[int | None, typer.Option("--window", help="The model's window in tokens.")]
MaxContext = Annotated[int | None, typer.Option("--max-context", help="Use at most this many tokens (0 = the window).")]
Head = Annotated[int | None, typer.Option("--head", help="Opening messages kept verbatim.")]
Tail = Annotated[int | None, typer.Option("--tail", help="At least this many recent messages kept verbatim.")]
Reserve = Annotated[str | None, typer.Option("--reserve", help='Tokens kept free for the reply, or "auto".')]
Tokenizer = Annotated[str | None, typer.Option("--tokenizer", help="cl100k_base (exact) or estimate (len/4).")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]

FLAGS = {
    "--window": "model.window",
    "--max-context": "context.max_context",
    "--head": "context.head_messages",
    "--tail": "context.min_tail_messages",
    "--reserve": "context.reply_reserve",
    "--tokenizer": "model.tokenizer",
}


def settings_from(config: Path | None, **flags: Any) -> Settings:
    """The file's settings with every given flag on top (flags win)."""
    overrides: dict[str, tuple[Any, str]] = {}
    for flag, dotted in FLAGS.items():
        value = flags.get(flag.lstrip("-").replace("-", "_"))
        if value is None:
            continue
        if flag == "--reserve" and value != "auto":
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(flag, None, f'expected a number of tokens ≥ 0 or "auto", got {value!r}') from None
        overrides[dotted] = (value, flag)
    return load_settings(config.expanduser() if config else None, overrides, explicit=config is not None)


def _build(story_path: Path, settings: Settings, emit: str = "text") -> tuple[Built, int]:
    story = read_story(story_path)
    return build(story, settings, emit=emit), story.hidden


@app.command("build")
def build_cmd(
    story: Story,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the prompt to this file (atomically).")
    ] = None,
    emit: Annotated[
        str, typer.Option("--emit", help="text (a transcript) or messages (a JSON list of role messages).")
    ] = "text",
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
    if emit not in ("text", "messages"):
        raise typer.BadParameter(f"{emit!r}; expected text or messages", param_hint="--emit")
    settings = settings_from(
        config, window=window, max_context=max_context, head=head, tail=tail, reserve=reserve, tokenizer=tokenizer
    )
    built, _ = _build(story, settings, emit)
    a = built.assembly
    if a.refusal:
        raise ContextOverflow(a, f"{story}: {a.refusal.explain()}")
    assert built.prompt is not None
    if output:
        write_atomic(output, built.prompt)
    else:
        sys.stdout.write(built.prompt + ("\n" if sys.stdout.isatty() and not built.prompt.endswith("\n") else ""))
    if sys.stderr.isatty():
        typer.echo(f"case {a.case} · {a.tokens:,} of {a.limit:,} tokens ({built.tokenizer})", err=True)


@app.command("inspect")
def inspect_cmd(
    story: Story,
    explain: Annotated[
        bool, typer.Option("--explain", help="Draw the case, the sections, the budget and every step.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the same facts as JSON.")] = False,
    emit: Annotated[str, typer.Option("--emit", help="Count the prompt as this emit form would print it.")] = "text",
    config: ConfigPath = None,
    window: Window = None,
    max_context: MaxContext = None,
    head: Head = None,
    tail: Tail = None,
    reserve: Reserve = None,
    tokenizer: Tokenizer = None,
    debug: Debug = False,
) -> None:
    """Show why the prompt for STORY looks the way it does."""
    settings = settings_from(
        config, window=window, max_context=max_context, head=head, tail=tail, reserve=reserve, tokenizer=tokenizer
    )
    built, hidden = _build(story, settings, emit)
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
def validate_cmd(story: Story, debug: Debug = False) -> None:
    """Report every problem of STORY at once; exit 1 when any is an error."""
    _, problems = check_native(story)
    errors = 0
    for p in problems:
        where = f"{story}:{p.line}" if p.line else str(story)
        typer.echo(f"{where}: {p.severity}: {p.message}", err=True)
        errors += p.severity == "error"
    if errors:
        raise typer.Exit(1)
    typer.echo(f"{story}: ok" + (f" ({len(problems)} warnings)" if problems else ""), err=True)


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
    settings = load_settings(config.expanduser() if config else None, explicit=config is not None)
    rows = [
        (f"{section}.{key}", json.dumps(settings.values[section][key]), settings.sources[f"{section}.{key}"])
        for section, keys in SCHEMA.items()
        for key in keys
    ]
    if as_json:
        out = {name: {"value": json.loads(value), "from": source} for name, value, source in rows}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    from .views import console, settings_table

    console().print(settings_table(rows))


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
        # Typer handles usage errors itself (exit 2) and ends with SystemExit.
        app(args=argv, prog_name="ctx")
    except OtakuError as exc:
        if debug:
            raise
        typer.echo(f"ctx: {exc}", err=True)
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error of ours
        return 0
    return 0


def entry() -> None:  # console script
    sys.exit(main())
