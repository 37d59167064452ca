"""The summaries store: one sidecar an opening, `~/.otaku/chats/<pool>.ctx-summaries`, in the
format `ctx summarize` writes (`story/sidecar.py`), so either can read and extend the other's.
It is the only thing `ctx serve` writes (`summarize.commits.Commits` writes it, under the lock
`ctx summarize` takes too).

Each branch of an opening has its own file (`Session.pool`): `<pool>.ctx-summaries` the first,
`<pool>-<branch>.ctx-summaries` a fork, which reads its parent's scenes that still tell it
(those before the branch point) until its own file is written (`Store.records_of`). A chat
serve meets for the first time (after a restart) takes the file of its opening that tells it
best: none of its scenes stale, the most of them; if each tells another branch from some
scene on, it forks there (`Store.place`).

A chat's scenes (`Store.story`) are its sidecar's records judged against its messages — fresh,
touched, and stale ones too (after an edit, a stale summary serves until it is redone) — and,
for the settled messages no record covers yet, provisional scenes of ctx's own: each scene's
extract (`summarize.extract`: its own lines, no model) and a history rolled from them. So a
chat is played from its first turn, and the model's summaries take their place as they come.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..locations import otaku_home
from ..story.model import Scene, Story
from ..story.sidecar import SUFFIX, Judged, Record, judge, read_sidecar
from ..summarize import Cutting, pack
from ..summarize.extract import history_extract, summary_extract
from ..tokens import common_length
from .chats import digest
from .session import Known, Session
from .sessions import MOST_SESSIONS

#: a provisional scene's `source` (`Scene.source`): ctx's extract, standing in for the model's
PROVISIONAL = "provisional"


def chats_folder() -> Path:
    """Where serve keeps each chat's summaries: `$OTAKU_HOME/chats`, else `~/.otaku/chats`."""
    return otaku_home() / "chats"


class Store:
    """Each opening's sidecar, read again when it changed on disk (by its size and time), and a
    chat's scenes, cut by `[summarize]`'s `cutting` and told in its summary's and history's
    `words`."""

    def __init__(self, folder: Path, cutting: Cutting, words: tuple[int, int]) -> None:
        self.folder, self.cutting, self.words = folder, cutting, words
        # the file as last read, by its path: (size, mtime) and its records
        self._read: dict[Path, tuple[tuple[int, int], list[Record]]] = {}
        self._lock = threading.Lock()

    def path(self, pool: str) -> Path:
        return self.folder / f"{pool}{SUFFIX}"

    def records(self, pool: str) -> list[Record]:
        path = self.path(pool)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return []
        stamp = (info.st_size, info.st_mtime_ns)
        with self._lock:
            known = self._read.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        records = read_sidecar(path)
        with self._lock:
            self._read[path] = (stamp, records)
            while len(self._read) > 4 * MOST_SESSIONS:  # files of chats long gone
                del self._read[next(iter(self._read))]
        return records

    def records_of(self, session: Session, story: Story) -> tuple[list[Record], bool]:
        """A chat's records, and whether they are its own file's: until a fork's own file is
        written, its parent's records that are not stale for it (a branch's own scenes are)."""
        sidecar = session.sidecar
        with sidecar.lock:
            inherits, known = sidecar.inherits, sidecar.inherited
        if inherits is None or self.path(session.pool).exists():
            return self.records(session.pool), True
        parent = self.records(inherits)
        if known is not None and known.holds(parent, story.messages):
            return known.value, False  # the same file, the story only grew: a branch's scenes stay stale
        stale = {r.id for r in judge(story, parent).stale}
        kept = [r for r in parent if r.id not in stale]
        sidecar.keep_inherited(Known(parent, story.messages, kept))
        return kept, False

    def place(self, session: Session, story: Story) -> None:
        """A chat's file, on its first turn and when its file turns out to tell another branch:
        of its opening's files the one none of whose scenes is stale for it, with the most
        scenes; else a fork of the file it reads (its scenes before the branch point shared)."""
        main = session.chat.pool
        best: tuple[int, str] | None = None
        for path in sorted(self.folder.glob(f"{main}*{SUFFIX}")):
            pool = path.name[: -len(SUFFIX)]
            if pool == main or pool.startswith(f"{main}-"):
                judged = judge(story, self.records(pool))
                if not judged.stale and len(judged.usable) > (best[0] if best else -1):
                    best = (len(judged.usable), pool)
        if best is not None:
            session.sidecar.place("" if best[1] == main else best[1], None)
            return
        judged = judge(story, self.records_of(session, story)[0])
        if another_branch(judged):
            at = judged.stale[0].start
            said = story.messages[at - 1].content if at <= len(story.messages) else ""
            session.sidecar.place(f"{main}-{digest([session.pool, at, said])[:10]}", session.pool)
        else:
            session.sidecar.place(session.sidecar.own_pool, session.sidecar.inherits)

    def story(self, session: Session, story: Story, *, hold: bool) -> Story:
        """The chat with its scenes: the sidecar's records that still tell its messages, then
        provisional ones up to its settled end. `hold`: the summarizer is writing this chat's
        summaries, so the turn assembles with the records of the turn before (the model's
        summaries come in at once when it is done, one change of the prompt, not one a scene)."""
        sidecar = session.sidecar
        if hold and sidecar.held is not None:
            records = sidecar.held
            judged = self._judged(session, story, records)
        else:
            records = self.records_of(session, story)[0]
            judged = self._judged(session, story, records)
            if not sidecar.placed or another_branch(judged):
                self.place(session, story)
                records = self.records_of(session, story)[0]
                judged = self._judged(session, story, records)
            sidecar.hold(records)
        known = sidecar.scenes
        if known is not None and known[1] is judged and not any(x.source == PROVISIONAL for x in known[2]):
            # the same verdict and nothing of ctx's own: the same Scene objects, whose prices the walk
            # knows, unless a scene's worth more has settled
            covered = known[2][-1].end if known[2] else 0
            settled = len(story.messages) - self.cutting.settle
            if covered >= settled or not pack(story.messages[covered:settled], self.cutting):
                return replace(story, scenes=known[2])
        scenes = scenes_of(session, story, judged, self.cutting, self.words)
        sidecar.keep_scenes(story.messages, judged, scenes)
        return replace(story, scenes=scenes)

    @staticmethod
    def _judged(session: Session, story: Story, records: Sequence[Record]) -> Judged:
        """`judge`, kept while the records are the same and the story only grew: a chat's next
        turn is its last one and the messages after it (the same objects, as `chat_story` keeps
        them), so a verdict that found every record fresh stands."""
        known = session.sidecar.judged
        if known is not None and known.holds(records, story.messages):
            return known.value
        judged = judge(story, records)
        if judged.fresh == tuple(records):  # each fresh where it stands: more messages after change none
            session.sidecar.keep_judged(Known(records, story.messages, judged))
        return judged


def another_branch(judged: Judged) -> bool:
    """Whether a file's stale scenes tell another branch of the chat: two or more, and none of
    its scenes fresh after the first of them (an edit leaves the scenes after it fresh, and its
    stale scene serves until it is redone)."""
    if len(judged.stale) < 2:
        return False
    first = judged.stale[0].start
    return not any(r.start > first for r in judged.usable)


def scenes_of(
    session: Session, story: Story, judged: Judged, cutting: Cutting, words: tuple[int, int]
) -> tuple[Scene, ...]:
    """The scenes a turn assembles with: the records in story order (a stale one too), each
    with its history while the chain of histories holds, then ctx's own for the rest: a
    provisional scene for each settled span no record covers (kept from turn to turn while its
    messages are the same, so the prompt's prefix holds), each history an extract rolled from
    the one before."""
    summary_words, history_words = words
    in_use: list[Record] = []
    for record in sorted((*judged.usable, *judged.stale), key=lambda r: r.start):
        if not in_use or record.start > in_use[-1].end:
            in_use.append(record)
    scenes: list[Scene] = []
    history, chained = "", True
    for record in in_use:
        chained = chained and record.start in judged.history_ok and (not scenes or record.start == scenes[-1].end + 1)
        if chained:
            history = record.history
        else:
            history = history_extract(history, record.summary, history_words)
        scenes.append(Scene(len(scenes) + 1, record.start, record.end, record.id, record.title, record.summary,
                            history, source="sidecar"))  # fmt: skip
    covered = scenes[-1].end if scenes else 0
    settled = len(story.messages) - cutting.settle
    kept = _still_told(session, story, covered)
    for start, end, summary in kept:
        history = history_extract(history, summary, history_words)
        scenes.append(_provisional(len(scenes) + 1, start, end, summary, history))
    covered = kept[-1][1] if kept else covered
    if settled > covered:
        for start, end in pack(story.messages[covered:settled], cutting):
            summary = summary_extract(story.messages[start - 1 : end], summary_words)
            kept.append((start, end, summary))
            history = history_extract(history, summary, history_words)
            scenes.append(_provisional(len(scenes) + 1, start, end, summary, history))
    return tuple(scenes)


def _provisional(order: int, start: int, end: int, summary: str, history: str) -> Scene:
    return Scene(order, start, end, None, f"Messages {start:,}–{end:,} (provisional)", summary, history,
                 source=PROVISIONAL)  # fmt: skip


def _still_told(session: Session, story: Story, covered: int) -> list[tuple[int, int, str]]:
    """The provisional scenes of the turn before that still stand: after what the records cover,
    over messages that are the same objects as then (sent alike)."""
    if session.sidecar.scenes is None:
        return []
    messages, _, scenes = session.sidecar.scenes
    same = common_length(story.messages, messages)
    kept: list[tuple[int, int, str]] = []
    for scene in scenes:
        if scene.source != PROVISIONAL or scene.start <= covered:
            continue
        if scene.end > same or (kept and scene.start != kept[-1][1] + 1) or (not kept and scene.start != covered + 1):
            break
        kept.append((scene.start, scene.end, scene.summary))
    return kept
