"""A copy of a GGUF model with some of its metadata changed (another `tokenizer.ggml.pre`, say),
its tensors untouched: llama-server then tokenizes the same vocabulary another way, which
checks ctx's converter on pre-tokenizers no small model of ours ships with."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gguf_files import string, typed, value  # noqa: E402

from otaku_ctx.model.gguf import read_gguf  # noqa: E402


def _skip_value(data: bytes, pos: int, kind: int) -> int:
    widths = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if kind in widths:
        return pos + widths[kind]
    if kind == 8:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n
    item_type, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if item_type in widths:
        return pos + widths[item_type] * count
    for _ in range(count):
        pos = _skip_value(data, pos, item_type)
    return pos


def variant(source: Path, target: Path, changes: dict[str, object]) -> Path:
    """`target`: `source` with the keys in `changes` set (added when missing)."""
    model = read_gguf(source)
    with source.open("rb") as f:
        head = f.read(24)
        version, tensors, pairs = struct.unpack_from("<IQQ", head, 4)
        f.seek(0)
        data = f.read(64 << 20)  # the metadata and tensor infos are well within this
    pos, kept = 24, []
    for _ in range(pairs):
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + n].decode()
        start = pos
        pos += 8 + n
        (kind,) = struct.unpack_from("<I", data, pos)
        pos = _skip_value(data, pos + 4, kind)
        if key not in changes:
            kept.append(data[start:pos])
    for key, item in changes.items():
        kind, raw = typed(item)
        kept.append(string(key) + struct.pack("<I", kind) + value(kind, raw))
    infos_start = pos
    for _ in range(tensors):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        (dims,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * dims + 4 + 8
    infos = data[infos_start:pos]
    alignment = int(model.metadata.get("general.alignment", 32))  # type: ignore[call-overload]
    data_start = -(-pos // alignment) * alignment
    header = b"GGUF" + struct.pack("<IQQ", version, tensors, len(kept)) + b"".join(kept) + infos
    header += b"\0" * (-len(header) % alignment)
    with source.open("rb") as f, target.open("wb") as out:
        out.write(header)
        f.seek(data_start)
        shutil.copyfileobj(f, out, 1 << 20)
    return target
