"""The `ctx` app: every command registered on it, and `main`, the one error boundary.

Errors are translated once, in `main`, into one line on stderr and an `ExitStatus`. The core
is imported inside the commands, so `ctx --help` and `ctx --version` do not pay for the
tokenizer and the template engine."""

from __future__ import annotations

import copy
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout, suppress
from functools import cache
from io import StringIO, TextIOWrapper
from typing import Annotated, Any

import typer

from .. import __version__
from ..status import ExitStatus
from .config import config_app
from .embed import embed_cmd
from .examples import EXAMPLES
from .replay import replay_cmd
from .scenes import scenes_cmd
from .serve import serve_cmd
from .story import build_cmd, convert_cmd, inspect_cmd, validate_cmd
from .summarize import summarize_cmd
from .template import template_app
from .terminal import PipeClosed, StdoutClosed, Terminal, serving, write_stdout

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 80},
    help="Build the prompt for a long roleplay story that fits the model's window.",
)
for name, run_command, short_help in (
    ("build", build_cmd, "Print the prompt for STORY."),
    ("inspect", inspect_cmd, None),
    ("validate", validate_cmd, "Report every problem of STORY at once."),
    ("convert", convert_cmd, None),
    ("replay", replay_cmd, "Replay STORY turn by turn and measure prompt-cache reuse."),
    ("summarize", summarize_cmd, "Summarize STORY's scenes with your own model."),
    ("scenes", scenes_cmd, "List STORY's scenes; show one, or redo some."),
    ("embed", embed_cmd, "Embed STORY's texts for recall by meaning."),
    ("serve", serve_cmd, "Serve an OpenAI-compatible API that fits each chat to your model."),
):
    app.command(name, short_help=short_help, epilog=EXAMPLES[name])(run_command)
app.add_typer(config_app, name="config")
app.add_typer(template_app, name="template")


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


def main(argv: list[str] | None = None, io: Terminal | None = None) -> int:
    """Run `ctx`; every error becomes one line on stderr and its exit status. Every file the
    run reads is recorded (`files.one_run`), so that no output of it lands on one."""
    from ..files import one_run

    argv = sys.argv[1:] if argv is None else argv
    io = io or Terminal.of_process()
    with serving(io), one_run(), _signals_end_the_run():
        return _run(argv, io, "--debug" in argv)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the run is so that every `finally` runs: the copy of a
    stream and the temp file of `-o` are removed. A BaseException, as KeyboardInterrupt is, so
    that no handler of errors takes it for one."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _signals_end_the_run() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `Terminated` while the run lasts; a second one is ignored,
    so the cleanup is not cut short. Only the main thread can handle signals."""

    def stop(signum: int, frame: object) -> None:
        for each in ENDING_SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise Terminated(signum)

    try:
        before = {each: signal.signal(each, stop) for each in ENDING_SIGNALS}
    except ValueError:  # not the main thread (a test's): signals stay as they are
        yield
        return
    try:
        yield
    finally:
        for each, handler in before.items():
            signal.signal(each, signal.SIG_DFL if handler is None else handler)


def _run(argv: list[str], io: Terminal, debug: bool) -> int:
    from ..errors import OtakuError

    try:
        # Typer reports usage errors and help itself, on sys.stdout/sys.stderr, and ends with SystemExit.
        with _typer_streams(io):
            command_for(app_for(argv, io.environ))(args=argv, prog_name="ctx", standalone_mode=True)
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
    except Terminated as exc:  # killed: quiet, with the status of a process the signal ended
        return 128 + exc.signum
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


def command_for(chosen: typer.Typer) -> Callable[..., Any]:
    """The Click command of `app_for`'s choice: the whole app's, or one command's, made once a
    process (a test run calls `main` thousands of times) — a Click command keeps no state of a
    run, which lives in the context each call makes."""
    if chosen is app:
        return _command("")
    (command,) = chosen.registered_commands
    return _command(command.name or "")


@cache
def _command(name: str) -> Callable[..., Any]:
    """One command's Click command, or the whole app's (`name` "": a group, no command, a typo)."""
    return typer.main.get_command(app_for([name], {}) if name else app)


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
