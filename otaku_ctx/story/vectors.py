"""The vectors of a story's texts, kept beside its summaries: `<sidecar>.<tag>.ctx-vectors`,
one file an embedding model (`tag`: 8 hex digits of the model's name), so a change of model
never mixes two models' numbers and going back to one finds its vectors again.

The file: a first line of JSON, `{"ctx-vectors": 1, "model": …, "dimensions": d}`, then one
record a text, `KEY_BYTES + d` bytes: the text's key (`meaning.key_of`: content-addressed, so
an edit embeds only what changed) and its quantized vector (`meaning.quantized`, a byte a
number). Append-only: a writer adds records under the file's lock (`<file>.lock`) and never
rewrites one; a record cut short by a crash is ignored by readers and cut off by the next
writer. 384 numbers (a small embedding model) are 400 bytes a text: 40 MB for a story of
100,000 messages, read through `mmap` (only the keys are held in memory, about 100 bytes a
text; a vector is read when it is asked for)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import StoryError
from .meaning import KEY_BYTES, Vector
from .sidecar import SUFFIX

VECTORS = ".ctx-vectors"
FORMAT = 1
#: the first line's bound: it names a model and a number
MOST_HEADER = 4096
#: the vectors a reader holds once read (4,096 of 384 numbers: about 3 MB)
MOST_HELD = 4096


def vectors_for(sidecar: Path, model: str) -> Path:
    """Where `model`'s vectors of the story whose summaries are `sidecar` are kept."""
    tag = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    stem = sidecar.name.removesuffix(SUFFIX)
    return sidecar.with_name(f"{stem}.{tag}{VECTORS}")


class VectorsError(StoryError):
    """A vectors file that is not one (its first line), or of another model or size."""


def header_of(path: Path, head: bytes, model: str, dimensions: int | None) -> tuple[int, int]:
    """(the vectors' size, where the first record begins) of a file beginning with `head`;
    `VectorsError` unless its first line names a vectors file of `model` (and of `dimensions`
    numbers, when given)."""
    end = head.find(b"\n")
    if end < 0:
        raise VectorsError(str(path), None, "has no first line of JSON naming its model: not a vectors file")
    try:
        header = json.loads(head[:end])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("ctx-vectors") != FORMAT:
        raise VectorsError(str(path), None, "does not begin with a ctx-vectors line: not a vectors file")
    dims = header.get("dimensions")
    if header.get("model") != model or not isinstance(dims, int) or dims <= 0:
        raise VectorsError(str(path), None, f"holds the vectors of {header.get('model')!r}, not {model!r}")
    if dimensions is not None and dims != dimensions:
        said = f"holds vectors of {dims} numbers; the model now gives {dimensions}"
        raise VectorsError(str(path), None, said)
    return dims, end + 1


class Vectors:
    """A vectors file as read now: `get(key)` the vector of a text's key, None when it has none.
    An absent file has no vectors. Use as a context manager (the map is closed at the end)."""

    def __init__(self, path: Path, model: str, dimensions: int | None = None) -> None:
        self.path, self.model = path, model
        self.dimensions = dimensions
        self._map: mmap.mmap | None = None
        self._at: dict[bytes, int] = {}  # a key's vector's offset
        self._held: dict[bytes, Vector] = {}  # the vectors read, the oldest first
        self.start = 0  # where the first record begins
        try:
            with open(path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size:
                    self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            return
        except OSError as error:
            raise VectorsError(str(path), None, f"cannot be read: {error.strerror or error}") from None
        if self._map is not None:
            self._index(size)

    def _index(self, size: int) -> None:
        assert self._map is not None
        self.dimensions, self.start = header_of(self.path, self._map[:MOST_HEADER], self.model, self.dimensions)
        record = KEY_BYTES + self.dimensions
        view = self._map
        for n in range((size - self.start) // record):  # a record cut short at the end is not read
            at = self.start + n * record
            self._at.setdefault(view[at : at + KEY_BYTES], at + KEY_BYTES)

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: bytes) -> bool:
        return key in self._at

    def get(self, key: bytes) -> Vector | None:
        """The vector of a text's key, read once (`MOST_HELD` are held: a turn's candidates are
        mostly the last turn's)."""
        found = self._held.get(key)
        if found is not None:
            return found
        at = self._at.get(key)
        if at is None or self._map is None or self.dimensions is None:
            return None
        found = self._held[key] = Vector(self._map[at : at + self.dimensions])
        if len(self._held) > MOST_HELD:
            del self._held[next(iter(self._held))]
        return found

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def __enter__(self) -> Vectors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def append_vectors(path: Path, model: str, records: Iterable[tuple[bytes, Vector]]) -> int:
    """Add `records` (a text's key, its quantized vector) to the file, under its lock, the file
    begun when there is none; a record cut short at its end (a crash) is cut off first, and a
    file of another model or size is refused (`VectorsError`). The caller leaves out the keys
    the file holds (`Vectors`, read once a run), so a run of many batches costs what it adds.
    A key two writers add at once is held twice, which costs its bytes and nothing else (a
    reader takes the first). The records written."""
    fresh = dict(records)
    if not fresh:
        return 0
    dims = len(next(iter(fresh.values())))
    if any(len(vector) != dims or len(key) != KEY_BYTES for key, vector in fresh.items()):
        raise ValueError("records of one length each")
    with _locked(path), open(path, "ab") as file:
        size = file.tell()
        if size == 0:
            header = {"ctx-vectors": FORMAT, "model": model, "dimensions": dims}
            file.write(json.dumps(header, ensure_ascii=False).encode("utf-8") + b"\n")
        else:
            with open(path, "rb") as head:
                _, start = header_of(path, head.read(MOST_HEADER), model, dims)
            cut = (size - start) % (KEY_BYTES + dims)
            if cut:
                file.truncate(size - cut)
                file.seek(size - cut)
        file.write(b"".join(key + vector.tobytes() for key, vector in fresh.items()))
        file.flush()
        os.fsync(file.fileno())
    return len(fresh)
