"""How `ctx summarize` commits its scenes to the sidecar while someone else may edit it.

- **Checked first** (`check_writable`): a sidecar path no run could write (a folder, a FIFO,
  a device, a folder that is not there or not writable) is refused before the first request.
- **One run at a time** (`Commits`, a context manager): an exclusive `flock` on
  `<sidecar>.lock` beside it; a second `ctx summarize` of the same sidecar is refused at once.
- **Merged, never written back over** (`Commits.commit`): each commit is merged into the file
  as it is on disk now. A scene whose line changed on disk since the run last saw it (a
  summary edited by hand, a line deleted) is theirs for the rest of the run: it stays as it is
  on disk; the run's own new and changed scenes are added.
- **A commit costs what it adds**: when the file is as the run left it, the new and changed
  lines are appended (one write, then fsync; a later line of a scene stands for the earlier,
  `read_sidecar`), and the file is rewritten (atomically) only when a scene is gone, when the
  superseded lines would outnumber the scenes, when someone else changed it, and once at
  the end of the run, so the file ends with one line a scene.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ..errors import OutputError
from ..files import what_it_is, write_atomic
from ..story.sidecar import Record, read_sidecar, sidecar_text

LOCK = ".lock"
Stamp = tuple[int, int, int, int]  # (device, inode, size, mtime_ns): the file as the run left it


def lock_for(sidecar: Path) -> Path:
    return sidecar.with_name(sidecar.name + LOCK)


def check_writable(sidecar: Path) -> None:
    """Raise OutputError when `ctx summarize` could never write `sidecar`: it is not a regular
    file (a folder, a FIFO, a device: `/dev/null`), or its folder is missing or not writable."""
    target = sidecar.resolve() if sidecar.is_symlink() else sidecar
    try:
        mode: int | None = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(sidecar, f"cannot be written: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISREG(mode):
        what = what_it_is(mode) or "a FIFO"
        raise OutputError(sidecar, f"is {what}, not a file summaries can be written to; name a file with --summaries")
    folder = target.parent
    if not folder.is_dir():
        raise OutputError(folder, "no such folder to write the summaries into")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(sidecar, f"cannot be written: the folder {folder} is not writable")


class Locked(OutputError):
    """Another `ctx summarize` holds the sidecar's lock."""


#: seconds after which a writer's temporary file beside the sidecar is a crash's leftover
STALE_TEMP = 60.0


def holder(lock: Path) -> str:
    """Who holds `lock`, as its writer wrote it ("ctx serve (pid 4242)"); "another ctx
    summarize" when it says nothing readable (a writer of an older ctx)."""
    try:
        with open(lock, "rb") as held:
            said = held.read(200).decode("utf-8", "replace").strip()
    except OSError:
        said = ""
    return said if said.isprintable() and said.startswith("ctx ") else "another ctx summarize"


class Commits:
    """The commits of one run to `path`, whose records the run read as `read`."""

    def __init__(self, path: Path, read: Sequence[Record], writer: str = "ctx summarize") -> None:
        self.path = path
        self.writer = writer  # who writes it, as the lock says to a run it turns away
        self.seen: dict[int, Record] = {r.start: r for r in read}  # the file as the run last saw it
        self.theirs: set[int] = set()  # scenes someone else changed: theirs for the rest of the run
        self.stamp: Stamp | None = None  # None: not yet written by this run (read it before writing)
        self.superseded = 0  # lines in the file that a later line of the same scene stands for
        self.mine: dict[int, Record] = {}
        self.appends = self.rewrites = self.written = 0  # what the commits did (`written`: bytes)
        self._lock: int | None = None

    # -- the lock ---------------------------------------------------------------------------

    def __enter__(self) -> Commits:
        lock = lock_for(self.path)
        for _ in range(5):  # the file locked may have been removed by the run that held it
            try:
                descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as exc:
                raise OutputError(lock, f"cannot be written: {exc.strerror or exc}") from None
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(descriptor)
                raise Locked(self.path, f"{holder(lock)} is writing it (it holds {lock}); let it end first") from None
            with contextlib.suppress(OSError):
                if os.stat(lock).st_ino == os.fstat(descriptor).st_ino:
                    self._lock = descriptor
                    with contextlib.suppress(OSError):  # who holds it, for a run it turns away
                        os.ftruncate(descriptor, 0)  # a killed writer's words are not left after ours
                        os.write(descriptor, f"{self.writer} (pid {os.getpid()})\n".encode())
                    self._sweep()
                    return self
            os.close(descriptor)
        raise Locked(self.path, f"its lock {lock} keeps changing; run again")

    def _sweep(self) -> None:
        """Remove what a writer of this file killed mid-write left (`write_atomic`'s temporary
        `.NAME.*.tmp` beside it), once the lock is ours and the file a minute old: a run that
        holds no lock (`scenes --redo`) writes its own in well under that."""
        now = time.time()
        for left in self.path.parent.glob(f".{glob.escape(self.path.name)}.*.tmp"):
            with contextlib.suppress(OSError):
                if left.is_file() and not left.is_symlink() and now - left.stat().st_mtime > STALE_TEMP:
                    left.unlink()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            if self.superseded and kind is None:
                self._merge()  # one line a scene again
        finally:
            if self._lock is not None:
                with contextlib.suppress(OSError):
                    os.unlink(lock_for(self.path))  # still held: no other run holds this file
                os.close(self._lock)
                self._lock = None

    # -- a commit ---------------------------------------------------------------------------

    def commit(self, records: Sequence[Record]) -> None:
        """The run's scenes as they are now, merged into the file as it is on disk."""
        self.mine = {r.start: r for r in records}
        if self.stamp is None or self._stamp() != self.stamp:
            self._merge()
            return
        seen = self.seen
        changed = [
            r for s, r in self.mine.items() if seen.get(s) is not r and s not in self.theirs and seen.get(s) != r
        ]
        gone = any(start not in self.mine and start not in self.theirs for start in self.seen)
        replacing = sum(r.start in self.seen for r in changed)
        if gone or self.superseded + replacing > max(16, len(self.seen)):
            self._merge()
        elif changed:
            self._append(changed, replacing)

    def _stamp(self) -> Stamp | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def _merge(self) -> None:
        """Read the file, keep each scene changed on disk since the run saw it as it is there,
        take the run's own for the others, and write it whole."""
        disk = {r.start: r for r in read_sidecar(self.path)} if self.path.is_file() else {}
        merged: dict[int, Record] = {}
        for start in {*disk, *self.seen, *self.mine}:
            if start in self.theirs or disk.get(start) != self.seen.get(start):
                self.theirs.add(start)
                if start in disk:
                    merged[start] = disk[start]
            elif start in self.mine:
                merged[start] = self.mine[start]
        text = sidecar_text(merged.values())
        write_atomic(self.path, text)
        self.written += len(text.encode("utf-8"))
        self.seen, self.superseded, self.stamp = merged, 0, self._stamp()
        self.rewrites += 1

    def _append(self, changed: list[Record], replacing: int) -> None:
        data = sidecar_text(changed).encode("utf-8")
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]
                os.fsync(descriptor)
                info = os.fstat(descriptor)
            finally:
                os.close(descriptor)
        except OSError as exc:
            raise OutputError(self.path, f"cannot be written: {exc.strerror or exc}") from None
        self.stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        self.seen.update((r.start, r) for r in changed)
        self.superseded += replacing
        self.appends += 1
        self.written += len(data)
