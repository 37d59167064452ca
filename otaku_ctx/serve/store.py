"""The summaries store: one sidecar a chat, `~/.otaku/chats/<key>.ctx-summaries`, in the format
`ctx summarize` writes (`story/sidecar.py`), so either can read and extend the other's. It is
the only thing `ctx serve` writes."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from ..files import write_atomic
from ..locations import otaku_home
from ..story.model import Message, Story
from ..story.sidecar import SUFFIX, Record, judge, read_sidecar, sidecar_text, with_judged, with_sidecar
from ..tokens import common_length

#: the chats whose last judgment of their records is kept (each holds its messages)
MOST_JUDGED = 64


def chats_folder() -> Path:
    """Where serve keeps each chat's summaries: `$OTAKU_HOME/chats`, else `~/.otaku/chats`."""
    return otaku_home() / "chats"


class Store:
    """Each chat's sidecar, read when it changed on disk (by its size and time) and written
    atomically, whole, as `ctx summarize` writes it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._read: dict[str, tuple[tuple[int, int], list[Record]]] = {}
        # each chat's last judgment of its records: (the records, the messages judged, the story made)
        self._judged: OrderedDict[str, tuple[list[Record], tuple[Message, ...], Story]] = OrderedDict()
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
        """The chat with the fresh scenes of its sidecar (its stale ones left out).

        A chat's next turn is its last one and the messages after it: when the records are
        the ones judged last, every one of them was found fresh where it stands, and the
        story's messages begin with the messages judged then (the same objects, as
        `chat_story` keeps them, so they compare equal at once), the verdict is the same, and
        is not worked out again (hashing every scene's messages a turn was a third of serve's
        own time on a long chat). Its scenes are then the same objects too, so their prices
        are known again (`assemble.stable.Prices`)."""
        records = self.records(key)
        if not records or story.scenes or story.notes:  # a chat's story has neither of its own
            return with_sidecar(story, records, str(self.path(key))) if records else story
        with self._lock:
            known = self._judged.get(key)
        if known is not None and known[0] is records and common_length(story.messages, known[1]) == len(known[1]):
            return replace(story, scenes=known[2].scenes, notes=known[2].notes)
        judged = judge(story, records)
        made = with_judged(story, judged, str(self.path(key)))
        if judged.fresh == tuple(records):  # each fresh where it stands: more messages after change none
            with self._lock:
                self._judged[key] = (records, story.messages, made)
                self._judged.move_to_end(key)
                while len(self._judged) > MOST_JUDGED:
                    self._judged.popitem(last=False)
        return made

    def save(self, key: str, records: list[Record]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path(key), sidecar_text(records))
