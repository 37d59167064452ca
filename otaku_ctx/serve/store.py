"""The summaries store: one sidecar a chat, `~/.otaku/chats/<key>.ctx-summaries`, in the format
`ctx summarize` writes (`story/sidecar.py`), so either can read and extend the other's. It is
the only thing `ctx serve` writes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..files import write_atomic
from ..locations import otaku_home
from ..story.model import Story
from ..story.sidecar import SUFFIX, Record, read_sidecar, sidecar_text, with_sidecar


def chats_folder() -> Path:
    """Where serve keeps each chat's summaries: `$OTAKU_HOME/chats`, else `~/.otaku/chats`."""
    return otaku_home() / "chats"


class Store:
    """Each chat's sidecar, read when it changed on disk (by its size and time) and written
    atomically, whole, as `ctx summarize` writes it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read: dict[str, tuple[tuple[int, int], list[Record]]] = {}
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def records(self, key: str) -> list[Record]:
        path = self.path(key)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return []
        stamp = (info.st_size, info.st_mtime_ns)
        with self._lock:
            known = self._read.get(key)
        if known is not None and known[0] == stamp:
            return known[1]
        records = read_sidecar(path)
        with self._lock:
            self._read[key] = (stamp, records)
        return records

    def story(self, key: str, story: Story) -> Story:
        """The chat with the fresh scenes of its sidecar (its stale ones left out)."""
        records = self.records(key)
        return with_sidecar(story, records, str(self.path(key))) if records else story

    def save(self, key: str, records: list[Record]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path(key), sidecar_text(records))
