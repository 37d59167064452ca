"""The persistent count cache of a server's tokenizer: what the server counted, kept so that a
rebuild asks it only for texts it has not counted before (docs/model.md, "The count cache").

One file a server model, `<count_cache()>/<hash of the model's identity>.counts`, append-only:
an 8-byte header (magic and version), then batches, each a 12-byte head (a magic, the number
of records, the CRC-32 of the records) and its records, 20 bytes each: the first 16 bytes of
the BLAKE2b hash of the text (UTF-8) and the count (unsigned 32-bit). New counts are appended
as soon as the server gives them, a batch in one `write` to the file opened for appending,
under an exclusive `flock`. A reader takes no lock and keeps the batches up to the first that
is cut short or fails its CRC (a run killed mid-write), which the next writer cuts off before
it appends. A writer reads only what other runs appended since it last looked. When the file
holds more than `BOUND` records, the writer that finds it so rewrites it (a temp file and a
rename, under the lock) with the records this run used, then the most recently written
others, `BOUND // 2` in all: the story being built stays, old stories' counts go first. A
writer that finds the file replaced under it (another run compacted it) opens the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no flock; batches still carry their CRC
    fcntl = None  # type: ignore[assignment]

MAGIC = b"OTKCNT1\n"
BATCH = b"BT"
HEAD = struct.Struct("<2sHII")  # magic, reserved, records, CRC-32 of the records
RECORD = struct.Struct("<16sI")
#: the most records a file holds before it is compacted to half as many (about 4 MB)
BOUND = 200_000
#: the most bytes read of a cache file (BOUND records and slack for runs appending meanwhile)
MAX_BYTES = 2 * BOUND * RECORD.size + (1 << 20)


def text_key(text: str) -> bytes:
    """The key of a text: 16 bytes of its BLAKE2b hash (a lone surrogate kept as it is)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def meta_key(name: str) -> bytes:
    """The key of a fact about the server (what it adds to a prompt), apart from any text's."""
    return hashlib.blake2b(name.encode("utf-8"), digest_size=16, person=b"otaku-meta").digest()


def cache_file(folder: Path, identity: str) -> Path:
    return folder / f"{hashlib.blake2b(identity.encode('utf-8'), digest_size=16).hexdigest()}.counts"


def _batches(data: bytes, *, header: bool = True) -> tuple[dict[bytes, int], int, int]:
    """The records in a file's bytes (from its start, its header checked, or from where a
    batch starts), later ones winning; the end of the last whole batch; and how many records
    they hold."""
    counts: dict[bytes, int] = {}
    if header and not data.startswith(MAGIC):
        return counts, 0, 0
    at, records = len(MAGIC) if header else 0, 0
    while at + HEAD.size <= len(data):
        magic, _, n, crc = HEAD.unpack_from(data, at)
        end = at + HEAD.size + n * RECORD.size
        if magic != BATCH or end > len(data):
            break
        body = data[at + HEAD.size : end]
        if zlib.crc32(body) != crc:
            break
        counts.update(RECORD.iter_unpack(body))
        records += n
        at = end
    return counts, at, records


def _batch(items: Iterable[tuple[bytes, int]]) -> bytes:
    body = b"".join(RECORD.pack(key, count) for key, count in items)
    return HEAD.pack(BATCH, 0, len(body) // RECORD.size, zlib.crc32(body)) + body


class CountStore:
    """The counts one server model gave, read once at the start and appended as they come.
    A cache: a file that cannot be read or written is a cache that stays empty (the counts
    are asked of the server), never an error and never a wrong count."""

    def __init__(self, folder: Path, identity: str) -> None:
        self.path = cache_file(folder, identity)
        self.used: dict[bytes, None] = {}  # the keys this run looked up or added, in that order
        self.pending: dict[bytes, int] = {}  # counts not written yet
        # the file as this run last saw it: which file (a compacting run replaces it), where
        # its last whole batch ends, how many records it holds
        self.inode: int | None = None
        self.end = 0
        self.records = 0
        self.counts: dict[bytes, int] = {}
        try:
            with open(self.path, "rb") as handle:
                self.inode = os.fstat(handle.fileno()).st_ino
                self.counts, self.end, self.records = _batches(handle.read(MAX_BYTES))
        except OSError:
            pass

    def get(self, key: bytes) -> int | None:
        found = self.counts.get(key)
        if found is not None:
            self.used[key] = None
        return found

    def add(self, items: dict[bytes, int]) -> None:
        """Keep these counts, here and in the file (one batch, appended at once: a run that
        stops later keeps them)."""
        self.counts.update(items)
        self.used.update(dict.fromkeys(items))
        self.pending.update(items)
        self.flush()

    def flush(self) -> None:
        """Write the counts not yet written, as one batch."""
        if not self.pending:
            return
        batch, self.pending = _batch(self.pending.items()), {}
        with contextlib.suppress(OSError):
            self._append(batch)

    def _append(self, batch: bytes) -> None:
        """Append one batch under the lock. Only what other runs appended since this one last
        looked is read (their counts are learned on the way); a file replaced or shrunk is
        read again, a batch cut short cut off, and a file past `BOUND` compacted."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked() as handle:
            info = os.fstat(handle.fileno())
            if info.st_size == 0:
                handle.write(MAGIC)
                self.end, self.records = len(MAGIC), 0
            elif info.st_ino != self.inode or info.st_size < self.end:
                handle.seek(0)
                counts, self.end, self.records = _batches(handle.read(MAX_BYTES))
                self.counts = {**counts, **self.counts}
            elif info.st_size > self.end:
                handle.seek(self.end)
                counts, end, records = _batches(handle.read(MAX_BYTES), header=False)
                self.counts.update(counts)
                self.end, self.records = self.end + end, self.records + records
            self.inode = info.st_ino
            if self.end == 0 or self.records + len(batch) // RECORD.size > BOUND:
                self._compact(self.counts)
                return
            if self.end < info.st_size:  # a batch cut short by a run killed mid-write
                handle.truncate(self.end)
            handle.seek(0, os.SEEK_END)
            handle.write(batch)
            handle.flush()
            self.end += len(batch)
            self.records += len(batch) // RECORD.size

    @contextlib.contextmanager
    def _locked(self) -> Iterator[BinaryIO]:
        """The file opened for appending, under an exclusive lock, and the file the path names
        now (another run may have compacted it, replacing it, while this one waited)."""
        for _ in range(8):
            handle = open(self.path, "a+b")  # noqa: SIM115 - closed below
            try:
                if fcntl is not None:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                try:
                    same = os.stat(self.path).st_ino == os.fstat(handle.fileno()).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    yield handle
                    return
            finally:
                handle.close()  # closing it releases the lock
        raise OSError("the count cache keeps being replaced")

    def _compact(self, counts: dict[bytes, int]) -> None:
        """Rewrite the file with the records this run used, then the most recently written of
        the others (dicts keep the order written), up to BOUND // 2, by a temp file and a
        rename while the lock is held."""
        keep = BOUND // 2
        mine = [(key, counts[key]) for key in self.used if key in counts][-keep:]
        room = keep - len(mine)
        newest = [(key, count) for key, count in reversed(counts.items()) if key not in self.used][:room]
        kept = newest[::-1] + mine  # in the order written: this run's last, as the newest
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(temp, "wb") as out:
                out.write(MAGIC + _batch(kept))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.path)
            info = os.stat(self.path)
            self.inode, self.end = info.st_ino, info.st_size
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        self.records = len(kept)
