"""`ctx`: parse arguments, make one core call, show the result.

Errors are translated once, in `main`, into one line on stderr and an `ExitStatus`. What a
command reads and writes (stdin, stdout, stderr, whether each is a terminal) comes from one
`Terminal`, which tests replace. The core is imported inside the commands, so `ctx --help`
and `ctx --version` do not pay for the tokenizer and the template engine.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum, IntEnum, StrEnum
from io import StringIO, TextIOWrapper
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, BinaryIO, TypeVar

import typer
import typer.main
from typer.core import TyperArgument

from . import __version__

if TYPE_CHECKING:
    from .build import Built
    from .config import Settings
    from .model import Story


class _Argument(TyperArgument):
    """Arguments shown the usual Unix way, `ctx build [OPTIONS] STORY`, not Typer's `{story}`."""

    def make_metavar(self, ctx: Any, *, usage: bool = False) -> str:
        name = (self.metavar or self.name or "").upper()
        return name if self.required or not usage else f"[{name}]"


setattr(typer.main, "TyperArgument", _Argument)  # noqa: B010 - the class Typer builds arguments with


class ExitStatus(IntEnum):
    """What `ctx` exits with (README: "Exit codes")."""

    OK = 0
    ERROR = 1  # bad input, a bad config file, an I/O error
    USAGE = 2  # a bad flag or flag value
    REFUSED = 3  # case 6: nothing fits
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE), as a tool killed by SIGPIPE reports


@dataclass
class Terminal:
    """The process's streams and whether a person is watching them."""

    stdin: BinaryIO
    stdout: BinaryIO | None  # None when the process was started with stdout closed
    stderr: IO[str] | None
    stdout_tty: bool = False
    stderr_tty: bool = False
    color: bool = False
    width: int = 100
    environ: dict[str, str] = field(default_factory=dict)
    progress_after: float = 0.5  # seconds of work before a progress bar appears (on a terminal)

    @classmethod
    def of_process(cls) -> Terminal:
        def tty(stream: IO[Any] | None) -> bool:
            try:
                return bool(stream and stream.isatty())
            except (ValueError, OSError):
                return False

        stderr_tty = tty(sys.stderr)
        return cls(
            stdin=sys.stdin.buffer if sys.stdin else open(os.devnull, "rb"),  # noqa: SIM115 - lives as long as the process
            stdout=sys.stdout.buffer if sys.stdout else None,
            stderr=sys.stderr,
            stdout_tty=tty(sys.stdout),
            stderr_tty=stderr_tty,
            color=stderr_tty and "NO_COLOR" not in os.environ,
            environ=dict(os.environ),
        )

    def say(self, line: str) -> None:
        """One line for a person, on stderr (dropped when stderr is closed)."""
        if self.stderr is None:
            return
        try:
            self.stderr.write(line + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass


_terminal: ContextVar[Terminal] = ContextVar("terminal")


def terminal() -> Terminal:
    return _terminal.get()


# ── Options ──────────────────────────────────────────────────────────────────────────────


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
        from .build import build, open_story
        from .files import as_regular_file
        from .tokens import make_counter

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
    from .config import load_settings

    return load_settings(config.expanduser() if config else None, overrides, explicit=config is not None)


# ── Commands ─────────────────────────────────────────────────────────────────────────────

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 80},
    help="Build the prompt for a long roleplay story that fits the model's window.",
)
config_app = typer.Typer(no_args_is_help=True, help="Write or show the settings.")
app.add_typer(config_app, name="config")


@app.command("build", short_help="Print the prompt for STORY.")
@prompt_options
def build_cmd(
    request: Request,
    story: StoryArg,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", metavar="FILE", help="Write the prompt here (atomically), or - for stdout."),
    ] = None,
) -> None:
    """Print the prompt for STORY on stdout (only the prompt; diagnostics go to stderr)."""
    from .errors import ContextOverflow
    from .files import write_output

    built, _ = request.run()
    a, io = built.assembly, terminal()
    if a.refusal or built.prompt is None:
        from .report import refusal_message

        assert a.refusal is not None
        raise ContextOverflow(a, f"{story}: {refusal_message(a.refusal, built.budget)}")
    if output is None:
        # A person at a terminal gets the cursor back on a new line; a pipe gets the prompt exactly.
        newline = "\n" if io.stdout_tty and not built.prompt.endswith("\n") else ""
        write_stdout(built.prompt + newline)
    else:
        try:
            write_output(Path(output) if output else None, built.prompt, request.inputs(), stdout_of(io))
        except BrokenPipeError:  # -o - or -o /dev/stdout into a closed pipe
            raise PipeClosed from None
    if io.stderr_tty:
        io.say(f"case {a.case} · {a.tokens:,} of {a.limit:,} tokens ({built.tokenizer})")


@app.command("inspect")
@prompt_options
def inspect_cmd(
    request: Request,
    story: StoryArg,
    explain: Annotated[bool, typer.Option("--explain", help="Also list every step of the search.")] = False,
    as_json: AsJson = False,
) -> None:
    """Show which case STORY's prompt is, its sections and its budget."""
    from .build import names_for
    from .report import facts

    built, told = request.run()
    data = facts(built, told.hidden, names_for(told, request.settings()))
    if as_json:
        write_stdout(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    else:
        from .views import explain as draw

        show(draw(data, steps=explain))
    if built.assembly.refusal:
        raise typer.Exit(ExitStatus.REFUSED)


@app.command("validate", short_help="Report every problem of STORY at once.")
def validate_cmd(
    story: StoryArg,
    source_format: From = None,
    conversation: Conversation = None,
    config: ConfigPath = None,
    debug: Debug = False,
) -> None:
    """Report every problem of STORY at once; exit 1 when any is an error."""
    from .files import as_regular_file
    from .readers import check_story

    settings_from(config)  # a bad --config is reported like everywhere else
    with as_regular_file(story, terminal().stdin) as path:
        kind, problems = check_story(path, source_format.value if source_format else None, conversation)
    shown = "<stdin>" if str(story) == "-" else str(story)
    for p in problems:
        terminal().say(
            f"{shown}:{p.line}: {p.severity}: {p.message}" if p.line else f"{shown}: {p.severity}: {p.message}"
        )
    if any(p.severity == "error" for p in problems):
        raise typer.Exit(ExitStatus.ERROR)
    warnings = f" ({len(problems)} warning{'s' * (len(problems) != 1)})" if problems else ""
    terminal().say(f"{shown}: ok, {kind}{warnings}")


@app.command("convert")
def convert_cmd(
    story: StoryArg,
    output: Annotated[str, typer.Option("-o", "--output", metavar="FILE", help="The native JSONL file to write.")],
    source_format: From = None,
    card: Cards = None,
    conversation: Conversation = None,
    force: Force = False,
    config: ConfigPath = None,
    debug: Debug = False,
) -> None:
    """Write STORY (any readable format) as native JSONL, atomically."""
    from .build import open_story
    from .convert import to_native_text
    from .errors import ConfigError
    from .files import as_regular_file, write_output

    settings_from(config)
    cards = list(card or [])
    target = Path(output) if output else None
    if target and output != "-" and target.is_file() and not force:
        raise ConfigError(output, None, "already exists; pass --force to overwrite it")
    with as_regular_file(story, terminal().stdin) as path:
        converted = open_story(path, source_format.value if source_format else None, cards, conversation)
    for note in converted.notes:
        terminal().say(f"ctx: {note}")
    write_output(target, to_native_text(converted), [story, *cards], stdout_of(terminal()))
    terminal().say(f"wrote {output}: {len(converted)} messages, {len(converted.scenes)} scenes")


@config_app.command("init")
def config_init(
    force: Force = False,
    config: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", help="Write here instead of ~/.otaku/configs/config.toml."),
    ] = None,
    debug: Debug = False,
) -> None:
    """Write the documented default config file."""
    from .config import default_config_path, default_toml
    from .errors import ConfigError
    from .files import write_atomic

    path = config.expanduser() if config else default_config_path()
    if path.exists() and not force:
        raise ConfigError(str(path), None, "already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, default_toml())
    terminal().say(f"wrote {path}")


@config_app.command("show")
def config_show(config: ConfigPath = None, as_json: AsJson = False, debug: Debug = False) -> None:
    """Print the effective settings and where each came from."""
    rows = list(settings_from(config).rows())
    if as_json:
        out = {name: {"value": value, "from": source} for name, value, source in rows}
        write_stdout(json.dumps(out, ensure_ascii=False, indent=2) + "\n")
        return
    shown = [(name, json.dumps(value, ensure_ascii=False), source) for name, value, source in rows]
    if terminal().stdout_tty:
        from .views import settings_table

        show(settings_table(shown))
    else:  # a pipe gets every row whole, one per line, tab-separated
        write_stdout("".join("\t".join(row) + "\n" for row in shown))


def _version(value: bool) -> None:
    if value:
        write_stdout(f"ctx {__version__}\n")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


# ── Output and the one error boundary ────────────────────────────────────────────────────


@contextmanager
def progress(io: Terminal) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr, for a person at a terminal, once the work has taken
    `io.progress_after` seconds; never on stdout, never into a pipe. Yields a function that
    names the current phase."""
    stream = io.stderr
    if not io.stderr_tty or stream is None:
        yield lambda phase: None
        return
    import threading

    state: dict[str, Any] = {"phase": "", "bar": None}
    lock = threading.Lock()

    def appear() -> None:
        from .views import progress_bar

        with lock:
            if state["bar"] is None:
                bar = state["bar"] = progress_bar(stream, color=io.color)
                bar.start(state["phase"])

    def phase(text: str) -> None:
        with lock:
            state["phase"] = text
            if state["bar"] is not None:
                state["bar"].update(text)

    timer = threading.Timer(io.progress_after, appear)
    timer.daemon = True
    timer.start()
    try:
        yield phase
    finally:
        timer.cancel()
        with lock:
            if state["bar"] is not None:
                state["bar"].stop()
            state["bar"] = False  # a timer that fires late shows nothing


class StdoutClosed(Exception):
    """The process was started with stdout closed (`>&-`): there is nowhere to print."""


class PipeClosed(Exception):
    """The reader of stdout went away (`| head`). Not an OSError, so that Typer's own handling
    (which would exit 1, the code for bad input) lets it through to `main`."""


def stdout_of(io: Terminal) -> BinaryIO:
    if io.stdout is None:
        raise StdoutClosed
    return io.stdout


def write_stdout(text: str) -> None:
    """Data on stdout, as UTF-8 whatever the locale says: a prompt is UTF-8 text."""
    out = stdout_of(terminal())
    try:
        out.write(text.encode("utf-8"))
        out.flush()
    except BrokenPipeError:
        raise PipeClosed from None


def show(renderable: Any) -> None:
    """A Rich view for a person, on stdout (plain when stdout is a pipe or NO_COLOR is set)."""
    from .views import console

    io = terminal()
    text = TextIOWrapper(stdout_of(io), encoding="utf-8", write_through=True)
    try:
        console(text, color=io.color and io.stdout_tty, width=None if io.stdout_tty else io.width).print(renderable)
    except BrokenPipeError:
        raise PipeClosed from None
    finally:
        text.detach()  # stdout stays open for whoever writes next


def main(argv: list[str] | None = None, io: Terminal | None = None) -> int:
    """Run `ctx`; every error becomes one line on stderr and its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    io = io or Terminal.of_process()
    token = _terminal.set(io)
    debug = "--debug" in argv
    try:
        return _run(argv, io, debug)
    finally:
        _terminal.reset(token)


def _run(argv: list[str], io: Terminal, debug: bool) -> int:
    from .errors import OtakuError

    try:
        # Typer reports usage errors and help itself, on sys.stdout/sys.stderr, and ends with SystemExit.
        with _typer_streams(io):
            app_for(argv, io.environ)(args=argv, prog_name="ctx", standalone_mode=True)
    except OtakuError as exc:
        if debug:
            raise
        io.say(f"ctx: {exc}")
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (ExitStatus.OK if exc.code is None else ExitStatus.ERROR)
    except (BrokenPipeError, PipeClosed):
        _silence_stdout()
        return ExitStatus.BROKEN_PIPE
    except StdoutClosed:
        io.say("ctx: stdout is closed, so there is nowhere to print; write to a file with -o FILE")
        return ExitStatus.ERROR
    except UnicodeEncodeError as exc:  # text that is not Unicode (a lone surrogate) slipped through
        if debug:
            raise
        io.say(f"ctx: the output holds text that cannot be written as UTF-8 ({exc.reason}); check the story's text")
        return ExitStatus.ERROR
    except OSError as exc:  # writing -o into a missing folder, a full disk, ...
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        io.say(f"ctx: {where}{exc.strerror or exc}")
        return ExitStatus.ERROR
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    return ExitStatus.OK


def app_for(argv: list[str], environ: dict[str, str]) -> typer.Typer:
    """The app to run. Typer turns every command into a Click command on each run (8 ms
    here), so a run that names a top-level command gets a copy of `app` holding only that
    one; its parsing, help and errors are that command's own. Anything else (no command, a
    group, a typo, shell completion) runs the whole app."""
    chosen = [c for c in app.registered_commands if argv and c.name == argv[0]]
    if not chosen or "_CTX_COMPLETE" in environ:
        return app
    narrow = copy.copy(app)
    narrow.registered_commands = chosen
    narrow.registered_groups = []
    return narrow


@contextmanager
def _typer_streams(io: Terminal) -> Iterator[None]:
    """Point sys.stdout and sys.stderr at the terminal's streams while Typer runs."""
    out = TextIOWrapper(io.stdout, encoding="utf-8", write_through=True) if io.stdout else None
    err = io.stderr if io.stderr is not None else StringIO()
    try:
        with redirect_stderr(err):
            if out is None:
                yield
            else:
                with redirect_stdout(out):
                    yield
    finally:
        if out is not None:
            with suppress(ValueError, OSError):
                out.flush()
            out.detach()


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# Commands kept in modules of their own. They use the options and helpers above, so they are
# imported last: `ctx template …` and `ctx replay`.
from . import cli_replay  # noqa: E402, F401 - its decorator adds `ctx replay` to `app`
from .cli_template import template_app  # noqa: E402

app.add_typer(template_app, name="template")
