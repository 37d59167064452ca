"""A GGUF file's metadata, read by our own bounded reader (no numpy, no `gguf` package).

A GGUF file (llama.cpp's model format, versions 2 and 3, little-endian) opens with a header
and a list of typed key/value pairs: the architecture, the window (`<arch>.context_length`),
the chat template, and the tokenizer (`tokenizer.ggml.*`). Only that list is read, never the
tensors after it. The file is the user's and may be anything: every length is checked against
the bytes the file holds before it is used, strings and arrays are capped, and whatever is
wrong is one `ConfigError` naming the file.

A build that needs only the template or the window must not pay for 150,000 tokens: the big
arrays (tokens, merges, types, scores) are walked past, their places kept, and read only by
`Gguf.vocabulary()`.

The reader says what the file says. The one thing it asks of llama.cpp's rules
(`llamacpp.special_tokens`) is which BOS and EOS llama.cpp takes where the file is silent, for
their texts are read with the header; what llama.cpp makes of the tokens themselves is the
vocabulary layer's (vocab.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from ..errors import ConfigError
from .llamacpp import special_tokens

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MiB = 1 << 20
# What a model's metadata may hold, set by what real ones need, with margin, so that the worst
# file accepted (every bound at once) is read and converted into a counter in under 1 GB and
# 10 s (benchmarks/hostile_bounds.py measures it). Its cost is per token and merge (a string
# each, in Python and again in `tokenizers`) and per byte of them.
MAX_METADATA = 64 * MiB  # bytes of header and key/values: Gemma 4's 262,144 tokens and merges are ~20 MiB
MAX_STRING = 64 * MiB  # one string value (a chat template is a few KiB)
MAX_KEY = 65_535  # GGUF's own limit on a key's length
MAX_ITEMS = 1 << 24  # elements of one array of numbers (16 bytes a million of them, read in one call)
# The tokens: twice the largest vocabulary of a released model (Gemma's 262,144; Llama 3 has
# 128,256, Qwen 151,936, gpt-oss 201,088). 2M of them took 2.2 GB and 16 s.
MAX_TOKENS = 1 << 19
# Elements of one array of strings, the merges the longest (Gemma's ~514,000, Llama 3's 280,147): twice them.
MAX_STRINGS = 1 << 20
MAX_PAIRS = 1 << 16  # key/value pairs
MAX_DEPTH = 3  # arrays of arrays of ...
SMALL_ARRAY = 4096  # longer arrays are walked past and read only when asked (`Gguf.array`)
MAX_KEPT = 1 << 16  # array items the first read keeps in all; past it, arrays too are left in the file
READ_AHEAD = MiB

# GGUF's value types: the scalars' struct formats (little-endian), then string and array.
SCALARS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
STRING, ARRAY = 8, 9
TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
    7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}  # fmt: skip

TOKENS = "tokenizer.ggml.tokens"

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Array:
    """Where a long array lies in the file: its element type, length and first byte."""

    item_type: int
    count: int
    offset: int


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer's lists, read only when a counter needs them. `token_types`, `merges`
    and `scores` are empty when the file has none."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    scores: tuple[float, ...]


@dataclass(frozen=True)
class Gguf:
    """What `ctx` takes from a GGUF file. `metadata` holds every scalar, string and short
    array; a long array is an `Array` there, read by `array(key)`. The BOS and EOS are those
    llama.cpp takes (the file's own ids and flags stay in `metadata`)."""

    path: Path
    version: int
    size: int  # the file's bytes
    architecture: str
    name: str | None  # general.name
    context_length: int | None
    chat_template: str | None
    tokenizer_model: str  # "gpt2" (BPE), "llama" (SentencePiece), ...; "" when the file has none
    pre: str | None  # the BPE pre-tokenizer's name
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    bos_text: str
    eos_text: str
    add_bos: bool
    add_eos: bool
    identity: str  # the metadata's digest and the file's size: the key of what is derived from it
    metadata: dict[str, object] = field(repr=False, compare=False)
    # the file as it was read (inode, size, modification time): an array read later must come
    # from the same file, or a replaced one's vocabulary would be taken under this identity
    stamp: tuple[int, int, int] = field(default=(0, 0, 0), repr=False, compare=False)

    def array(self, key: str, most: int | None = None) -> tuple[object, ...]:
        """The array under `key` (empty if the file has none), read from the file now: whole, or
        its first `most` items (a token's type or score past the last token is never read)."""
        found = self.metadata.get(key)
        if found is None:
            return ()
        if not isinstance(found, Array):
            if isinstance(found, tuple):
                return found[:most]
            raise ConfigError(str(self.path), key, f"is a {type(found).__name__}, not an array")
        opened = _open(self.path)
        with opened as (handle, size):
            if size != self.size or opened.stamp != self.stamp:
                raise ConfigError(str(self.path), None, "changed while it was read; run ctx again")
            reader = _Reader(self.path, handle, size, start=found.offset)
            count = found.count if most is None else min(found.count, most)
            return reader.items(key, found.item_type, count, 1, keep=True)  # type: ignore[return-value]

    def typed_tokens(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The tokens and their types (no types when the file has none): all that a list of its
        control tokens needs, without the merges."""
        tokens = self.array("tokenizer.ggml.tokens")
        types = self.array("tokenizer.ggml.token_type", len(tokens))
        where = str(self.path)
        if not tokens or not all(isinstance(t, str) for t in tokens):
            raise ConfigError(where, "tokenizer.ggml.tokens", "holds no list of token strings")
        if types and (len(types) < len(tokens) or not all(isinstance(t, int) for t in types)):
            raise ConfigError(where, "tokenizer.ggml.token_type", "is not one whole number for each token")
        return tokens, types[: len(tokens)]  # type: ignore[return-value]

    def vocabulary(self) -> Vocabulary:
        """The tokens, their types, the merges and the scores: what a counter is built from."""
        tokens, types = self.typed_tokens()
        merges = self.array("tokenizer.ggml.merges")
        scores = self.array("tokenizer.ggml.scores", len(tokens))
        where = str(self.path)
        if not all(isinstance(m, str) for m in merges):
            raise ConfigError(where, "tokenizer.ggml.merges", "is not a list of strings")
        if scores and (len(scores) < len(tokens) or not all(isinstance(s, int | float) for s in scores)):
            raise ConfigError(where, "tokenizer.ggml.scores", "is not one number for each token")
        n = len(tokens)
        return Vocabulary(tokens, types, merges, tuple(float(s) for s in scores[:n]))  # type: ignore[arg-type]


def looks_like_gguf(path: Path | str) -> bool:
    """Whether `path` is a regular file that starts as a GGUF file does (an Ollama blob has
    no suffix to tell). Never opens a FIFO or a device, which could block or never end."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


_READ: dict[tuple[str, tuple[int, int, int]], Gguf] = {}  # the last few files read, by path and stamp


def read_gguf(path: Path) -> Gguf:
    """The metadata of the GGUF file at `path` (its vocabulary left in the file). A run asks
    for it several times (the window, the template, the counter): a file unchanged since it
    was read (the same inode, size and modification time) is not read again."""
    path = Path(path)
    try:
        info = os.stat(path)
        key = (str(path), (info.st_ino, info.st_size, info.st_mtime_ns))
    except OSError:
        return _read_gguf(path)  # let the reader say what is wrong
    found = _READ.get(key)
    if found is None:
        found = _read_gguf(path)
        if found.stamp == key[1]:
            if len(_READ) >= 4:
                _READ.pop(next(iter(_READ)))
            _READ[key] = found
    return found


def _read_gguf(path: Path) -> Gguf:
    opened = _open(path)
    with opened as (handle, size):
        reader = _Reader(path, handle, size)
        version, pairs = reader.header()
        metadata: dict[str, object] = {}
        for _ in range(pairs):
            key = reader.key()
            if key in metadata:
                raise reader.fail(key, "appears twice; the file is damaged")
            metadata[key] = reader.value(key)
        digest = hashlib.sha256(reader.consumed())
        digest.update(size.to_bytes(8, "little"))
        found = _described(path, version, size, metadata, digest.hexdigest(), reader.token)
        return replace(found, stamp=opened.stamp)


# -- what the metadata says -------------------------------------------------------------------


def _described(
    path: Path, version: int, size: int, metadata: dict[str, object], identity: str, token: Callable[[int], str]
) -> Gguf:
    where = str(path)

    def text(key: str) -> str | None:
        value = metadata.get(key)
        if value is None or isinstance(value, str):
            return value
        raise ConfigError(where, key, f"is a {_kind(value)}, not a string")

    def number(key: str) -> int | None:
        value = metadata.get(key)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ConfigError(where, key, f"is a {_kind(value)}, not a whole number")

    def flag(key: str) -> bool | None:
        value = metadata.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise ConfigError(where, key, f"is a {_kind(value)}, not true or false")

    architecture = text("general.architecture") or ""
    model = text("tokenizer.ggml.model") or ""
    pre = text("tokenizer.ggml.pre")
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = tokens.count if isinstance(tokens, Array) else len(tokens) if isinstance(tokens, tuple) else 0
    said = (number("tokenizer.ggml.bos_token_id"), number("tokenizer.ggml.eos_token_id"))
    said_added = (flag("tokenizer.ggml.add_bos_token"), flag("tokenizer.ggml.add_eos_token"))
    bos, eos, add_bos, add_eos = special_tokens(model, pre, (*said, *said_added), vocab_size)
    window = number(f"{architecture}.context_length") if architecture else None
    return Gguf(
        path=path,
        version=version,
        size=size,
        architecture=architecture,
        name=text("general.name"),
        context_length=window if window and window > 0 else None,
        chat_template=text("tokenizer.chat_template"),
        tokenizer_model=model,
        pre=pre,
        vocab_size=vocab_size,
        bos_id=bos,
        eos_id=eos,
        bos_text=token(bos) if bos is not None else "",
        eos_text=token(eos) if eos is not None else "",
        add_bos=add_bos,
        add_eos=add_eos,
        identity=identity,
        metadata=metadata,
    )


def _kind(value: object) -> str:
    if isinstance(value, Array | tuple):
        return "array"
    return {bool: "boolean", int: "number", float: "number", str: "string"}.get(type(value), type(value).__name__)


# -- the reader -------------------------------------------------------------------------------


class _open:
    """The file opened to read, refused at once if it is not a regular file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: BinaryIO | None = None
        self.stamp = (0, 0, 0)  # (inode, size, mtime in ns) of what was opened

    def __enter__(self) -> tuple[BinaryIO, int]:
        where = str(self.path)
        try:
            info = os.stat(self.path)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(where, None, f"is {_what(info.st_mode)}, not a GGUF model file")
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ConfigError(where, None, "no such file") from None
        except PermissionError:
            raise ConfigError(where, None, "cannot be read (permission denied)") from None
        except OSError as exc:
            raise ConfigError(where, None, f"cannot be read: {exc.strerror or exc}") from None
        self.handle = os.fdopen(descriptor, "rb", buffering=0)
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):  # what was opened, should the path have changed since
            self.handle.close()
            raise ConfigError(where, None, f"is {_what(info.st_mode)}, not a GGUF model file")
        self.stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
        return self.handle, info.st_size

    def __exit__(self, *_: object) -> None:
        if self.handle is not None:
            self.handle.close()


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


class _Reader:
    """Reads the metadata through a buffer that grows as it is read, never past the file's
    size nor past MAX_METADATA bytes; every length is checked before it is trusted."""

    def __init__(self, path: Path, handle: BinaryIO, size: int, start: int = 0) -> None:
        self.path = path
        self.handle = handle
        self.size = size
        self.base = start  # the file offset of buf[0]
        self.buf = bytearray()
        self.pos = 0  # in buf
        self.kept = 0  # array items held in memory: bounded, as nested arrays could multiply them
        self.token_starts: list[int] = []  # where each string of tokenizer.ggml.tokens begins, in buf
        if start:
            handle.seek(start)

    def fail(self, key: str | None, message: str) -> ConfigError:
        """The error for `key`, a name read from the file: shown as it is only when it is a
        short printable name, else quoted and cut (a damaged file's "key" may be any bytes)."""
        if key is not None and not (key.isprintable() and len(key) <= 100):
            key = repr(key[:60]) + ("…" if len(key) > 60 else "")
        return ConfigError(str(self.path), key, message)

    def need(self, n: int, key: str | None = None) -> None:
        """Make sure the next `n` bytes are in the buffer."""
        end = self.pos + n
        if end <= len(self.buf):
            return
        if self.base + end > self.size:
            what = "the header" if key is None else f"{key!r}"
            raise self.fail(None, f"is truncated: {what} runs past the end of the file; is the download complete?")
        if end > MAX_METADATA:
            raise self.fail(None, f"holds more than {MAX_METADATA // MiB} MiB of metadata; is it a GGUF file?")
        want = max(end - len(self.buf), len(self.buf), READ_AHEAD)
        want = min(want, self.size - self.base - len(self.buf), MAX_METADATA + 1 - len(self.buf))
        while len(self.buf) < end:
            chunk = self.handle.read(want)
            if not chunk:
                raise self.fail(None, "is truncated (it shrank while it was read); run ctx again")
            self.buf += chunk
            want = max(want - len(chunk), end - len(self.buf))

    def token(self, index: int) -> str:
        """The text of token `index`, from the tokens array just walked past ("" if none)."""
        if index >= len(self.token_starts):
            return ""
        at = self.token_starts[index]
        (n,) = _U64.unpack_from(self.buf, at)
        return bytes(self.buf[at + 8 : at + 8 + n]).decode("utf-8", "replace")

    def consumed(self) -> bytes:
        return bytes(self.buf[: self.pos])

    def u32(self, key: str | None = None) -> int:
        self.need(4, key)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self, key: str | None = None) -> int:
        self.need(8, key)
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def header(self) -> tuple[int, int]:
        """(version, number of key/value pairs)."""
        if self.size < 4:
            raise self.fail(None, "is not a GGUF model file (it is too short)")
        self.need(4)
        if bytes(self.buf[:4]) != MAGIC:
            raise self.fail(None, "is not a GGUF model file (it does not begin with GGUF)")
        self.pos = 4
        version = self.u32()
        if version == 0 or version > 0xFFFF:
            raise self.fail(None, "is a big-endian GGUF file or not a GGUF file; ctx reads little-endian GGUF")
        if version not in VERSIONS:
            raise self.fail(None, f"is GGUF version {version}; ctx reads versions 2 and 3")
        self.u64()  # tensors
        pairs = self.u64()
        if pairs > MAX_PAIRS:
            raise self.fail(None, f"claims {pairs:,} metadata keys; the file is damaged")
        return version, pairs

    def key(self) -> str:
        n = self.u64("a key")
        if n == 0 or n > MAX_KEY:
            raise self.fail(None, f"holds a metadata key {n:,} bytes long; the file is damaged")
        return self.text("a key", n)

    def text(self, key: str, n: int) -> str:
        self.need(n, key)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(key, "holds text that is not UTF-8; the file is damaged") from None

    def string(self, key: str) -> str:
        n = self.u64(key)
        if n > MAX_STRING:
            raise self.fail(key, f"holds a string of {n:,} bytes, more than ctx reads ({MAX_STRING // MiB} MiB)")
        return self.text(key, n)

    def value(self, key: str, depth: int = 0) -> object:
        kind = self.u32(key)
        if kind in SCALARS:
            fmt = SCALARS[kind]
            width = struct.calcsize(fmt)
            self.need(width, key)
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
            self.pos += width
            if kind == 7 and self.buf[self.pos - 1] > 1:
                raise self.fail(key, "holds a boolean that is neither 0 nor 1; the file is damaged")
            return value
        if kind == STRING:
            return self.string(key)
        if kind == ARRAY:
            if depth >= MAX_DEPTH:
                raise self.fail(key, "nests arrays too deeply; the file is damaged")
            item_type = self.u32(key)
            count = self.u64(key)
            if item_type not in SCALARS and item_type not in (STRING, ARRAY):
                raise self.fail(key, f"holds an array of unknown type {item_type}; the file is damaged")
            if count > MAX_ITEMS:
                raise self.fail(key, f"holds an array of {count:,} items, more than ctx reads ({MAX_ITEMS:,})")
            if key == TOKENS and count > MAX_TOKENS:
                message = (
                    f"holds {count:,} tokens, more than ctx reads ({MAX_TOKENS:,}, twice the largest real vocabulary)"
                )
                raise self.fail(key, message)
            if item_type == STRING and count > MAX_STRINGS:
                raise self.fail(key, f"holds an array of {count:,} strings, more than ctx reads ({MAX_STRINGS:,})")
            lazy = count > SMALL_ARRAY or item_type == ARRAY or self.kept + count > MAX_KEPT
            if lazy and depth == 0:
                offset = self.base + self.pos
                self.items(key, item_type, count, depth + 1, keep=False)
                return Array(item_type, count, offset)
            return self.items(key, item_type, count, depth + 1, keep=True)
        raise self.fail(key, f"has a value of unknown type {kind}; the file is damaged")

    def items(self, key: str, item_type: int, count: int, depth: int, keep: bool) -> tuple[object, ...] | None:
        """`count` elements of `item_type`: a tuple of them, or (keep=False) only walked past."""
        if keep:
            self.kept += count
            if self.kept > MAX_ITEMS:
                raise self.fail(key, f"holds more than the {MAX_ITEMS:,} array items ctx reads; the file is damaged")
        if item_type in SCALARS:
            fmt = SCALARS[item_type]
            width = struct.calcsize(fmt)
            self.need(width * count, key)
            start = self.pos
            self.pos += width * count
            if not keep:
                return None
            values = struct.unpack_from(f"<{count}{fmt[1]}", self.buf, start)
            if item_type == 7 and any(b > 1 for b in self.buf[start : self.pos]):
                raise self.fail(key, "holds a boolean that is neither 0 nor 1; the file is damaged")
            return values
        if item_type == STRING:
            return self.strings(key, count, keep)
        nested: list[object] = []
        for _ in range(count):  # arrays of arrays: each element is an array value without its tag
            sub_type = self.u32(key)
            sub_count = self.u64(key)
            if sub_count > (MAX_STRINGS if sub_type == STRING else MAX_ITEMS) or (
                sub_type not in SCALARS and sub_type not in (STRING, ARRAY)
            ):
                raise self.fail(key, "holds a damaged nested array")
            if depth >= MAX_DEPTH:
                raise self.fail(key, "nests arrays too deeply; the file is damaged")
            nested.append(self.items(key, sub_type, sub_count, depth + 1, keep))
        return tuple(nested) if keep else None

    def strings(self, key: str, count: int, keep: bool) -> tuple[str, ...] | None:
        """`count` strings, walked past in one tight loop (a vocabulary holds 150,000): a length
        past the buffer's end makes `unpack_from` fail, and only then is more read (a length
        past the file's end or past MAX_METADATA is an error there)."""
        self.need(8 * count, key)  # at least their lengths: a claim the file cannot hold fails here
        unpack = _U64.unpack_from
        buf, pos = self.buf, self.pos
        starts: list[int] = []
        record = keep or (key == TOKENS and not self.token_starts)
        for _ in range(count):
            try:
                (n,) = unpack(buf, pos)
            except (struct.error, OverflowError):  # past the buffer: read more, or fail
                self.pos = pos
                self.need(8, key)
                buf = self.buf
                (n,) = unpack(buf, pos)
            if record:
                starts.append(pos)
            pos += 8 + n
        self.pos = pos
        if pos > len(buf):
            self.pos = len(buf)
            self.need(pos - len(buf), key)
            self.pos = pos
        if key == TOKENS and not self.token_starts:
            self.token_starts = starts
        if not keep or not starts:
            return None if not keep else ()
        view = memoryview(self.buf)  # no copy of the buffer for each array (it may be 512 MiB)
        try:
            return tuple(str(view[a + 8 : a + 8 + _U64.unpack_from(view, a)[0]], "utf-8") for a in starts)
        except UnicodeDecodeError:
            raise self.fail(key, "holds text that is not UTF-8; the file is damaged") from None
        finally:
            view.release()
