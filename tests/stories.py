"""Small builders for native stories in tests."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from otaku_ctx.story.model import Card, Message, Scene, Story


def story(
    n: int,
    scenes: Sequence[tuple[int, int]] = (),
    *,
    cards: Iterable[int] = (),
    summarized: Iterable[int] | None = None,
    histories: Iterable[int] | None = None,
    system: str = "",
    text: str = "word",
) -> Story:
    """A story of `n` messages; `scenes` are (start, end) ranges, numbered 1..; `cards` are
    message numbers that are cards; `summarized`/`histories` are scene numbers (default: all)."""
    card_at = set(cards)
    messages = []
    for number in range(1, n + 1):
        if number in card_at:
            card = Card(name=f"Card{number}", description=f"joins at {number}")
            messages.append(Message(number, "system", "", card.name, card=card))
        else:
            role = "user" if number % 2 else "assistant"
            messages.append(Message(number, role, f"{text} {number}", "Mara" if role == "user" else "Ilya"))
    with_summary = set(range(1, len(scenes) + 1) if summarized is None else summarized)
    with_history = set(range(1, len(scenes) + 1) if histories is None else histories)
    built = tuple(
        Scene(
            order=i,
            start=a,
            end=b,
            id=i,
            summary=f"summary {i}" if i in with_summary else "",
            history=f"history through {i}" if i in with_history else "",
        )
        for i, (a, b) in enumerate(scenes, start=1)
    )
    return Story(path=Path("test.jsonl"), messages=tuple(messages), scenes=built, system=system)


def write_jsonl(path: Path, records: Iterable[dict[str, Any] | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def to_records(s: Story) -> list[dict[str, Any]]:
    """A Story as native JSONL records (the small subset these tests use)."""
    records: list[dict[str, Any]] = []
    if s.system:
        records.append({"role": "system", "content": s.system})
    for m in s.messages:
        if m.card:
            records.append({"type": "card", "name": m.card.name, "description": m.card.description})
        else:
            records.append({"role": m.role, "name": m.name, "content": m.content})
    for sc in s.scenes:
        rec: dict[str, Any] = {"type": "scene", "id": sc.id, "start": sc.start, "end": sc.end}
        if sc.summary:
            rec["summary"] = sc.summary
        if sc.history:
            rec["history"] = sc.history
        records.append(rec)
    return records


def chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, kind, body and CRC."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(*chunks: bytes) -> bytes:
    """A minimal 1×1 PNG with the given chunks before IEND."""
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    pixels = chunk(b"IDAT", zlib.compress(b"\x00\x00"))
    return b"\x89PNG\r\n\x1a\n" + header + pixels + b"".join(chunks) + chunk(b"IEND", b"")
