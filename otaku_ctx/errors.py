"""The core's own exceptions, each with its exit status; the CLI turns each into one line on stderr."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .status import ExitStatus


class OtakuError(Exception):
    """Base of every error the core raises on purpose (bad input, bad config, refusal)."""

    exit_code = ExitStatus.ERROR


class StoryError(OtakuError):
    """A story (or card) file that cannot be read: names the file, the line, and what is wrong."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else f"{self.path}"
        return f"{where}: {self.message}"


class ConfigError(OtakuError):
    """A config file or setting that is wrong: names the file (or flag), the key, what was expected."""

    def __init__(self, source: str, key: str | None, message: str) -> None:
        self.source = source
        self.key = key
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.source}: {self.key}" if self.key else self.source
        return f"{where}: {self.message}"


class UsageError(ConfigError):
    """A bad value given on the command line: a usage error (exit 2), named by its flag."""

    exit_code = ExitStatus.USAGE


class TemplateError(OtakuError):
    """A context template that does not compile or render: names the template, line and column."""

    def __init__(self, name: str, line: int | None, column: int | None, message: str) -> None:
        self.name = name
        self.line = line
        self.column = column
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.name
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.message}"


class ContextOverflow(OtakuError):
    """Case 6: nothing fits the window. Carries the assembler's refusal (an `Assembly`)."""

    exit_code = ExitStatus.REFUSED

    def __init__(self, assembly: object, message: str) -> None:
        self.assembly = assembly
        self.message = message
        super().__init__(message)


class FileError(OtakuError):
    """A file the run reads or writes, named as the user gave it, and what is wrong with it."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = str(path)
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InputError(FileError):
    """An input that is there but cannot be read as what it was given as: a directory, a
    device, a FIFO no program writes to, a file past its kind's bound, UTF-16, unreadable.
    (A path that names nothing is the reader's own StoryError or ConfigError.)"""


class OutputError(FileError):
    """A file `-o` must not or cannot write: an input of the run, write-protected, ..."""


def did_you_mean(given: str, known: Sequence[str]) -> str:
    """ ", did you mean 'chatml'?" for a name one typo away from a known one (as Click says of a
    flag or a command), else ""."""
    from difflib import get_close_matches

    close = get_close_matches(given, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# Every character that can steer a terminal rather than be read on it: the C0 controls (ESC
# starts the sequences that set a window's title or clear the screen), DEL, the C1 controls
# (U+009B is a one-character ESC [), the line and paragraph separators and the bidirectional
# marks, embeddings, overrides and isolates (which reorder what is shown).
_STEERING = [*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x2028, 0x202F), *range(0x2066, 0x206A)]
_SHOWN = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _STEERING}


def visible(text: str) -> str:
    """`text` from outside ctx (a server's words, a file's name, a story's) as it may be printed
    on a terminal: each character that steers one instead of being read is shown as its escape
    (`\\x1b`, `\\x0a` for a line break, `\\u202e`), so that it is seen and does nothing."""
    return text.translate(_SHOWN)
