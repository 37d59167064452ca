"""Writing files so that a failure never leaves half of one behind."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError, StoryError


@contextlib.contextmanager
def reading(path: Path, what: str = "story file") -> Iterator[None]:
    """Turn the ways a file cannot be opened into one StoryError that names it."""
    try:
        yield
    except FileNotFoundError:
        raise StoryError(path, None, "no such file") from None
    except IsADirectoryError:
        raise StoryError(path, None, f"is a directory, not a {what}") from None
    except PermissionError:
        raise StoryError(path, None, "cannot be read (permission denied)") from None


def write_atomic(path: Path | str, text: str) -> None:
    """Write UTF-8 text to `path` through a temp file in the same directory and a rename.

    Readers see the old file or the new one, never half of it; on any failure the temp file
    is removed and the old file stays as it was. A new file gets the usual permissions
    (0666 less the umask), an existing one keeps its own.
    """
    path = Path(path)
    if not path.parent.is_dir():  # else the error would name the temp file
        raise FileNotFoundError(errno.ENOENT, "no such folder to write into", str(path.parent))
    if path.is_symlink():
        path = path.resolve()
    import tempfile  # only a run that writes a file needs it (it imports random, 4 ms)

    mode = _mode_for(path)
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through symlinks and hard links)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_output(path: Path | None, text: str, inputs: Iterable[Path], stdout: BinaryIO) -> None:
    """Write `text` where `-o` says: `-` is stdout; a special file (a FIFO, /dev/null, a
    terminal) is written as it is; a regular file or a new path is written atomically.
    Never onto an input of the build, whatever the path is called."""
    data = text.encode("utf-8")
    if path is None:
        raise ConfigError("-o", None, "an empty path; name a file, or - for stdout")
    if str(path) == "-":
        stdout.write(data)
        stdout.flush()
        return
    for source in inputs:
        if same_file(path, source):
            raise ConfigError(str(path), None, f"is an input of this command ({source}); it is never overwritten")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = 0
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot be written: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ConfigError(str(path), None, "is a directory; name a file inside it")
    if mode and not stat.S_ISREG(mode):  # a device or a FIFO: there is nothing to replace
        with open(path, "wb") as handle:
            handle.write(data)
        return
    write_atomic(path, text)


@contextlib.contextmanager
def as_regular_file(path: Path, stdin: BinaryIO) -> Iterator[Path]:
    """The story as a regular file the readers can sniff and then read. `-` (stdin), a pipe
    or a process substitution (`<(...)`) can be read only once, so it is copied once into a
    private temp folder; errors still name what the user gave."""
    if str(path) != "-":
        try:
            regular = not stat.S_ISFIFO(path.stat().st_mode) and not stat.S_ISCHR(path.stat().st_mode)
        except OSError:
            regular = True  # missing or unreadable: the reader says so, naming the path
        if regular:
            yield path
            return
    import tempfile

    shown = Path("<stdin>") if str(path) == "-" else path
    with tempfile.TemporaryDirectory(prefix="ctx-") as folder:
        copy = Path(folder) / "story"
        with reading(shown), copy.open("wb") as sink:
            if str(path) == "-":
                shutil.copyfileobj(stdin, sink, 1 << 20)
            else:
                with path.open("rb") as source:
                    shutil.copyfileobj(source, sink, 1 << 20)
        try:
            yield copy
        except StoryError as exc:
            raise StoryError(shown, exc.line, exc.message.replace(str(copy), str(shown))) from None
