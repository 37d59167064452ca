"""Writing files so that a failure never leaves half of one behind."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import StoryError


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
