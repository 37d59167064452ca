"""Every file a run reads, opened one way; every file it writes, written so that a failure
never leaves half of one behind and never lands on an input.

Reading (`read_input` for a file read whole, `as_regular_file` for the story, which the
readers open by path): what the user named is opened without ever blocking on it (a FIFO no
program writes to is refused after a moment, not waited on for ever); a directory, a device
or a socket is refused at once; at most the kind's bound (`BOUNDS`) is read; and the file's
device and inode are recorded for the run (`one_run`). Writing (`write_output`): never onto
one of those files, whatever the target is called (a symlink, a hard link, the same path);
never over a file the user could not write with `>`; never `name/` as if it were `name`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .errors import ConfigError, InputError, OtakuError, OutputError, StoryError, UsageError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# The most bytes each kind of input may hold (docs/files.md, "Inputs, outputs and bounds"). Each is
# far past any real file of its kind; all but the story are read whole into memory. The
# story's is the default of `--max-story-size`.
BOUNDS: dict[str, int] = {
    "story": 1 * GiB,
    "card": 64 * MiB,
    "lorebook": 64 * MiB,
    "config file": 1 * MiB,
    "template": 16 * MiB,
    "context preset": 16 * MiB,
    "format file": 1 * MiB,
    "instruct preset": 16 * MiB,
    "variables file": 64 * MiB,
    "summaries": 256 * MiB,  # the sidecar `ctx summarize` writes beside a story
    "prompt file": 1 * MiB,  # a `ctx summarize` prompt
}
STORY_KINDS = ("story", "card", "lorebook")  # a missing one is a StoryError; the others' a ConfigError
CHUNK = 1 << 20
FIFO_GRACE = 0.25  # seconds a FIFO's writer may take to open it after ctx does
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # and so UTF-32's, which begin the same way
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- the inputs of one run --------------------------------------------------------------------


@dataclass
class Run:
    """What one run of a command has read: each input's (device, inode), with the name it
    was given by, so that no output of the run lands on one."""

    inputs: dict[tuple[int, int], str] = field(default_factory=dict)

    def add(self, info: os.stat_result, shown: str) -> None:
        self.inputs.setdefault((info.st_dev, info.st_ino), shown)

    def holds(self, info: os.stat_result) -> str | None:
        return self.inputs.get((info.st_dev, info.st_ino))


_run: ContextVar[Run | None] = ContextVar("otaku_ctx_run", default=None)


@contextlib.contextmanager
def one_run() -> Iterator[Run]:
    """Record every input read inside this block (the CLI opens one per command)."""
    run = Run()
    token = _run.set(run)
    try:
        yield run
    finally:
        _run.reset(token)


def record_input(path: Path | str) -> None:
    """Record a file read another way than `read_input` (a model file, mapped or read in
    parts) as an input of this run, so no output may be written onto it."""
    try:
        _record(os.stat(path), str(path))
    except OSError:
        pass  # its reader reports what is wrong with it


def _record(info: os.stat_result, shown: str) -> None:
    run = _run.get()
    if run is not None:
        run.add(info, shown)


# -- reading ----------------------------------------------------------------------------------


def _missing(kind: str, path: Path | str, message: str) -> StoryError | ConfigError:
    """A path that names nothing: the error its reader has always raised for one."""
    return StoryError(path, None, message) if kind in STORY_KINDS else ConfigError(str(path), None, message)


def size_text(n: int) -> str:
    """1 GiB, 64 MiB, 512 KiB, or 1,500 bytes."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit:,} {name}"
    return f"{n:,} bytes"


def parse_size(text: str) -> int:
    """`2G`, `512M`, `64KiB`, `1500000`: a number of bytes (binary units); ValueError if not one."""
    match = re.fullmatch(r"\s*([0-9]{1,15})\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match or int(match.group(1)) == 0:
        raise ValueError(text)
    return int(match.group(1)) << (10 * "_kmgt".index(match.group(2).lower() or "_"))


def _too_big(kind: str, path: Path | str, bound: int) -> InputError:
    hint = "pass --max-story-size to read a bigger one" if kind == "story" else "is it the right file?"
    return InputError(path, f"is larger than the {size_text(bound)} a {kind} may be; {hint}")


def what_it_is(mode: int) -> str | None:
    """What a file that is neither a regular file nor a FIFO is, in words; None for those two."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    return "not a regular file"


def _refuse(kind: str, path: Path | str, info: os.stat_result, bound: int) -> None:
    what = what_it_is(info.st_mode)
    if what is not None:
        also = ", or - for stdin" if kind == "story" else ""
        raise InputError(path, f"is {what}, not a {kind}; name a regular file{also}")
    if stat.S_ISREG(info.st_mode) and info.st_size > bound:
        raise _too_big(kind, path, bound)


def _cannot(kind: str, path: Path | str, exc: OSError) -> OtakuError:
    if isinstance(exc, FileNotFoundError):
        dangling = os.path.islink(path)
        return _missing(kind, path, "is a symlink to nothing" if dangling else "no such file")
    if isinstance(exc, NotADirectoryError):
        return _missing(kind, path, "no such file (a part of its path is not a folder)")
    if isinstance(exc, PermissionError):
        return InputError(path, f"cannot be read (permission denied); check the permissions of the {kind}")
    return InputError(path, f"cannot be read: {exc.strerror or exc}")


@contextlib.contextmanager
def _opened(path: Path, kind: str, bound: int) -> Iterator[tuple[int, os.stat_result]]:
    """An input opened to read, never blocking, recorded for the run: (descriptor, its stat).
    A directory, device or socket is refused before it is opened, a regular file past the
    bound before a byte is read."""
    try:
        _refuse(kind, path, os.stat(path), bound)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot(kind, path, exc) from None
    try:
        info = os.fstat(descriptor)
        _refuse(kind, path, info, bound)  # what was opened, should the path have changed since
        _record(info, str(path))
        yield descriptor, info
    finally:
        os.close(descriptor)


def _fifo_start(descriptor: int, path: Path, kind: str) -> bytes:
    """The first bytes of a FIFO, read without blocking. With no writer, a read would wait for
    one for ever: wait a moment (a writer started just before ctx may still be opening it),
    then refuse."""
    import select

    try:
        data = os.read(descriptor, CHUNK)
    except BlockingIOError:
        return b""  # a writer holds it open; what it writes is read next
    if data:
        return data
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    came = poller.poll(FIFO_GRACE * 1000)
    try:
        data = os.read(descriptor, CHUNK)
    except BlockingIOError:
        return b""  # a writer came and has not written yet
    if data or came:  # bytes; or a writer came and went without writing: an empty file
        return data
    raise InputError(path, "is a FIFO no program is writing to; start its writer first, or name a regular file")


def _chunks(descriptor: int, info: os.stat_result, path: Path, kind: str, bound: int) -> Iterator[bytes]:
    """The input's bytes in chunks; past `bound` of them, an error naming the bound."""
    chunk = _fifo_start(descriptor, path, kind) if stat.S_ISFIFO(info.st_mode) else b""
    os.set_blocking(descriptor, True)
    total = 0
    try:
        while True:
            if chunk:
                total += len(chunk)
                if total > bound:
                    raise _too_big(kind, path, bound)
                yield chunk
            chunk = os.read(descriptor, min(CHUNK, bound + 1 - total))
            if not chunk:
                return
    except OSError as exc:
        raise _cannot(kind, path, exc) from None


def read_input(path: Path | str, kind: str, bound: int | None = None) -> bytes:
    """The whole of an input file of `kind` (a key of `BOUNDS`), recorded as an input of the
    run. Refused, naming the file and what to do: a directory, a device, a socket, a FIFO no
    program writes to, more bytes than the kind's bound, and UTF-16 text."""
    path = Path(path)
    bound = BOUNDS[kind] if bound is None else bound
    with _opened(path, kind, bound) as (descriptor, info):
        data = b"".join(_chunks(descriptor, info, path, kind, bound))
    refuse_utf16(path, data)
    return data


def refuse_utf16(path: Path | str, head: bytes) -> None:
    """Text is UTF-8: a file that opens with a UTF-16 (or UTF-32) byte-order mark is refused."""
    if head.startswith(_UTF16_BOMS):
        raise InputError(path, "is UTF-16 text; save it as UTF-8")


def utf8_text(data: bytes, path: Path | str, *, drop_bom: bool = True) -> str:
    """Bytes read by `read_input` as text, a UTF-8 byte-order mark dropped (as every JSON
    reader drops it) unless told; bytes that are not UTF-8 are an error naming the first."""
    try:
        text = data.decode("utf-8")
        return text.removeprefix("\ufeff") if drop_bom else text
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        where = f"line {line}, column {column}"
        raise InputError(path, f"holds bytes that are not UTF-8 at {where}; save it as UTF-8") from None


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


@contextlib.contextmanager
def as_regular_file(given: str | Path, stdin: BinaryIO, bound: int | None = None) -> Iterator[Path]:
    """The story as a regular file the readers can sniff and then read, at most `bound` bytes
    (`BOUNDS["story"]` by default). The string "-" is stdin; anything else, `Path("-")` too,
    is a file. Stdin, a FIFO or a process substitution (`<(...)`) can be read only once, so it
    is copied once into a private temp folder, removed however the run ends; errors still name
    what the user gave."""
    bound = BOUNDS["story"] if bound is None else bound
    if isinstance(given, str) and given == "-":
        with _copied(Path("<stdin>"), _stdin_chunks(stdin, bound)) as copy:
            yield copy
        return
    path = Path(given)
    with _opened(path, "story", bound) as (descriptor, info):
        if not stat.S_ISREG(info.st_mode):  # a FIFO: read it once, now
            with _copied(path, _chunks(descriptor, info, path, "story", bound)) as copy:
                yield copy
            return
    yield path


@contextlib.contextmanager
def _copied(shown: Path, chunks: Iterator[bytes]) -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ctx-") as folder:
        copy = Path(folder) / "story"
        with copy.open("wb") as sink:
            for number, chunk in enumerate(chunks):
                if number == 0:
                    _refuse_binary(shown, chunk)
                sink.write(chunk)
        try:
            yield copy
        except StoryError as exc:
            raise StoryError(shown, exc.line, exc.message.replace(str(copy), str(shown))) from None


def _refuse_binary(shown: Path, head: bytes) -> None:
    """A story is text: a stream that opens with UTF-16 or NUL bytes is refused before it is
    copied (a PNG goes on, for the reader's own words about it)."""
    refuse_utf16(shown, head)
    if b"\0" in head[: 64 * KiB] and not head.startswith(PNG_SIGNATURE):
        raise InputError(shown, "holds NUL bytes: it is binary data, not a story")


def _stdin_chunks(stdin: BinaryIO, bound: int) -> Iterator[bytes]:
    """Stdin's bytes, at most `bound`. A regular file (`< story.jsonl`) is an input of the run
    like any other; a device that is not a terminal (`< /dev/zero`) is refused."""
    try:
        info: os.stat_result | None = os.fstat(stdin.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's BytesIO)
        info = None
    if info is not None:
        _record(info, "<stdin>")
        if (stat.S_ISCHR(info.st_mode) and not stdin.isatty()) or stat.S_ISBLK(info.st_mode):
            what = what_it_is(info.st_mode)
            raise InputError("<stdin>", f"is {what}, not a story; pipe the story in, or name its file")
        if stat.S_ISREG(info.st_mode) and info.st_size - _offset(stdin) > bound:
            raise _too_big("story", "<stdin>", bound)
    total = 0
    while chunk := stdin.read(min(CHUNK, bound + 1 - total)):
        total += len(chunk)
        if total > bound:
            raise _too_big("story", "<stdin>", bound)
        yield chunk


def _offset(stream: BinaryIO) -> int:
    try:
        return stream.tell()
    except OSError:
        return 0


# -- writing ----------------------------------------------------------------------------------


def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write UTF-8 text (or bytes) to `path` through a temp file in the same directory and a rename.

    Readers see the old file or the new one, never half of it; on any failure, a signal
    turned into an exception included, the temp file is removed and the old file stays as
    it was. A new file gets the usual permissions (0666 less the umask), an existing one
    keeps its own. Only a regular file (or a new one) is replaced.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if not path.parent.is_dir():  # else the error would name the temp file
        raise OutputError(path.parent, "no such folder to write into")
    with contextlib.suppress(FileNotFoundError):
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise OutputError(path, f"is {what_it_is(mode) or 'a FIFO'}; it is never replaced by a file")
    import tempfile  # only a run that writes a file needs it (it imports random, 4 ms)

    mode = _mode_for(path)
    try:
        descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(path, exc, folder=True) from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(text if isinstance(text, bytes) else text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise _unwritable(path, exc) from None
        raise


def _unwritable(path: Path, exc: OSError, folder: bool = False) -> OutputError:
    """The error of a write that failed, naming the file the user gave, never the temp file."""
    if exc.errno == errno.ENOSPC:
        return OutputError(path, "cannot be written: no space left on the device; free some space or write elsewhere")
    if exc.errno == errno.EDQUOT:
        return OutputError(path, "cannot be written: the disk quota is used up; free some space or write elsewhere")
    if folder and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "read-only" if exc.errno == errno.EROFS else "not writable (permission denied)"
        return OutputError(path, f"cannot be written: the folder {path.parent} is {why}")
    return OutputError(path, f"cannot be written: {exc.strerror or exc}")


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_output(target: str | Path | None, text: str, stdout: BinaryIO) -> None:
    """Write `text` where `-o` says. The string "-" is stdout (a `Path("-")` is a file named
    -); a special file (a FIFO, /dev/null, a terminal) is written as it is; a regular file or
    a new path is written atomically. Refused: any input of the run, whatever the target is
    called (the same path, a symlink, a hard link); a file the user could not write with `>`
    (write-protected); `name/` when name is not a folder."""
    if target is None or target == "":
        raise UsageError("-o", None, "an empty path; name a file, or - for stdout")
    data = text.encode("utf-8")
    if isinstance(target, str) and target == "-":
        stdout.write(data)
        stdout.flush()
        return
    path = Path(target)
    try:
        info: os.stat_result | None = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise _unwritable(path, exc) from None
    slash = str(target).endswith(("/", os.sep))
    if info is not None and (source := _inputs_holding(info)) is not None:
        also = "" if source == str(target) else f" ({source})"
        raise OutputError(target, f"is an input of this command{also}; it is never overwritten, name another file")
    if info is not None and stat.S_ISREG(info.st_mode) and (folder := _input_folder_holding(path)) is not None:
        raise OutputError(
            target, f"is a file of {folder}, a folder this command reads; it is never overwritten, name another file"
        )
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputError(target, "is a directory; name a file inside it")
    if slash:
        why = "is not a directory" if info is not None else "names a folder that does not exist"
        raise OutputError(target, f"{why}, yet ends in /; name a file (without the /)")
    if info is not None and not stat.S_ISREG(info.st_mode):  # a device or a FIFO: nothing to replace
        try:
            with open(path, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            raise _unwritable(path, exc) from None
        return
    if info is not None and not _writable(path):
        raise OutputError(target, "is write-protected (permission denied); make it writable or name another file")
    write_atomic(path, text)


def _inputs_holding(info: os.stat_result) -> str | None:
    run = _run.get()
    return run.holds(info) if run is not None else None


def _input_folder_holding(path: Path) -> str | None:
    """The input folder of the run (a model folder, a tokenizer's) that holds the file at
    `path`, as named or where its symlinks lead: every file of a model folder is the model,
    the parts the run did not read because a flag replaced them too."""
    for folder in {path.absolute().parent, path.resolve().parent}:
        try:
            info = os.stat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and (source := _inputs_holding(info)) is not None:
            return source
    return None


def _writable(path: Path) -> bool:
    """Whether `>` could open the file: its permissions for the effective user (root may)."""
    if os.access in os.supports_effective_ids:
        return os.access(path, os.W_OK, effective_ids=True)
    return os.access(path, os.W_OK)
