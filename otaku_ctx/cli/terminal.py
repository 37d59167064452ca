"""The process's streams, as one `Terminal` that tests replace, and what is printed on them:
data on stdout (`write_stdout`, `show`), words on stderr (`Terminal.say`), a progress bar
for a person at a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from io import TextIOWrapper
from typing import IO, Any, BinaryIO

from ..errors import visible


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
        """One line for a person, on stderr (dropped when stderr is closed). What it quotes from
        outside (a server's error, a file's name) is shown `visible`: one line, steering nothing."""
        if self.stderr is None:
            return
        try:
            self.stderr.write(visible(line) + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass


_terminal: ContextVar[Terminal] = ContextVar("terminal")


def terminal() -> Terminal:
    return _terminal.get()


@contextmanager
def serving(io: Terminal) -> Iterator[None]:
    """Make `io` the terminal every command reads and writes while the block runs."""
    token = _terminal.set(io)
    try:
        yield
    finally:
        _terminal.reset(token)


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

    from rich.markup import escape

    state: dict[str, Any] = {"phase": "", "bar": None}
    lock = threading.Lock()

    def appear() -> None:
        from .views import progress_bar

        with lock:
            if state["bar"] is None:
                bar = state["bar"] = progress_bar(stream, color=io.color)
                bar.start(state["phase"])

    def phase(text: str) -> None:
        shown = escape(visible(text))  # a phase names a file: its `[/b]` is no markup, its ESC no escape
        with lock:
            state["phase"] = shown
            if state["bar"] is not None:
                state["bar"].update(shown)

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


class _Visible:
    """A Rich view whose text is shown `visible`, its line breaks kept: what it quotes from
    outside (a lore entry's name, a config value) steers no terminal; Rich's own styles, which
    it writes as escapes of its own, are not text and stay as they are."""

    def __init__(self, view: Any) -> None:
        self.view = view

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.segment import Segment

        for segment in console.render(self.view, options):
            if segment.control:
                yield segment
            else:
                lines = segment.text.split("\n")
                yield Segment("\n".join(visible(line) for line in lines), segment.style, segment.control)


def show(renderable: Any) -> None:
    """A Rich view for a person, on stdout (plain when stdout is a pipe or NO_COLOR is set)."""
    from .views import console

    io = terminal()
    text = TextIOWrapper(stdout_of(io), encoding="utf-8", write_through=True)
    try:
        view = _Visible(renderable)
        console(text, color=io.color and io.stdout_tty, width=None if io.stdout_tty else io.width).print(view)
    except BrokenPipeError:
        raise PipeClosed from None
    finally:
        text.detach()  # stdout stays open for whoever writes next
