"""The summaries store: `~/.otaku/chats/<pool>[-<name>].ctx-summaries`, in the format `ctx
summarize` writes (`story/sidecar.py`), so either can read and extend the other's. It is the
only thing `ctx serve` writes (`summarize.commits.Commits` writes it, under the lock `ctx
summarize` takes too).

**Each chat writes its own file, and reads every file of its opening by content.** A chat's file
(`Session.pool`) is chosen on its first turn (`Store.place`): of its opening's files that no
other chat of this serve writes, the one whose every scene tells it (none stale, none past its
end), with the most scenes; else a new one, `<pool>-<name>`. So two chats never write one file,
and a chat never writes where another chat's scenes are (after a restart, a new chat that opens
as an old one does not take the old one's file: its scenes are past the new chat's end). What
a chat reads (`Store.records_of`) is its own file's scenes, and, where it has none, the scenes of
its opening's other files that tell its messages word for word (their hash, `covers`): a branch,
a second chat with the same opening, a chat after a restart reuse the summaries of the text they
share and ask for the rest. A summary of messages two chats both hold is both chats'.

A chat's scenes (`Store.story`) are its records judged against its messages — fresh,
touched, and stale ones too (after an edit, a stale summary serves until it is redone) — and,
for the settled messages no record covers yet, provisional scenes of ctx's own: each scene's
extract (`summarize.extract`: its own lines, no model) and a history rolled from them. So a
chat is played from its first turn, and the model's summaries take their place as they come.
"""

from __future__ import annotations

import bisect
import glob
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..locations import otaku_home
from ..story.model import Scene, Story
from ..story.sidecar import SUFFIX, Judged, Record, judge, read_sidecar
from ..story.speakers import Speakers
from ..summarize import Cutting, pack
from ..summarize.extract import history_extract, summary_extract
from ..summarize.run import words_for
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
        self._listed: dict[str, tuple[int, list[str]]] = {}  # an opening's files, by the folder's mtime
        self._writers: dict[str, weakref.ref[Session]] = {}  # each file's chat, while it lives
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

    def pools(self, main: str) -> list[str]:
        """The names of the files of the opening `main` (its own and every other chat's of it),
        listed again when the folder changed."""
        try:
            stamp = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return []
        with self._lock:
            known = self._listed.get(main)
            if known is not None and known[0] == stamp:
                return known[1]
        pools = [
            name
            for path in sorted(self.folder.glob(f"{glob.escape(main)}*{SUFFIX}"))
            if (name := path.name[: -len(SUFFIX)]) == main or name.startswith(f"{main}-")
        ]
        with self._lock:
            self._listed[main] = (stamp, pools)
            while len(self._listed) > 4 * MOST_SESSIONS:
                del self._listed[next(iter(self._listed))]
        return pools

    def records_of(self, session: Session, story: Story) -> tuple[list[Record], list[Record]]:
        """What a chat reads, and its own file's records (what its summarizer merges into): its
        own records, and where they have none, those of its opening's other files that tell its
        messages word for word (`merged`)."""
        own = self.records(session.pool)
        others = tuple(self.records(pool) for pool in self.pools(session.chat.pool) if pool != session.pool)
        if not any(others):
            return own, own
        return merged(session, story, own, others), own

    def place(self, session: Session, story: Story) -> None:
        """A chat's file, on its first turn and when its file turns out to tell another branch:
        of its opening's files that no other chat of this serve writes, the one whose every
        scene tells it, with the most scenes; else a new one of its own."""
        main = session.chat.pool
        best: tuple[int, str] | None = None
        with self._lock:
            self._writers = {pool: writer for pool, writer in self._writers.items() if writer() is not None}
            writers = {pool for pool, writer in self._writers.items() if writer() is not session}
        for pool in self.pools(main):
            records = self.records(pool)
            if pool in writers or not records:
                continue
            judged = judge(story, records)
            if not judged.stale and len(judged.usable) > (best[0] if best else -1):
                best = (len(judged.usable), pool)
        if best is not None:
            chosen = best[1]
        elif main not in writers and not self.path(main).exists():
            chosen = main
        else:
            name = f"{main}-{digest([session.key, [m.content for m in story.messages]])[:10]}"
            free = (f"{name}{n or ''}" for n in range(len(writers) + 2))
            chosen = next(pool for pool in free if pool not in writers and not self.path(pool).exists())
        with self._lock:
            self._writers[chosen] = weakref.ref(session)
        session.sidecar.place("" if chosen == main else chosen)

    def story(self, session: Session, story: Story, *, hold: bool, window: int | None = None) -> Story:
        """The chat with its scenes: the sidecar's records that still tell its messages, then
        provisional ones up to its settled end, told in the words the backend's `window` carries
        (`summarize.words_for`: what the summarizer asks its model for, too). `hold`: the
        summarizer is writing this chat's summaries, so the turn assembles with the records of
        the turn before (the model's summaries come in at once when it is done, one change of
        the prompt, not one a scene)."""
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
        words = words_for(window, *self.words) if window else self.words
        scenes = scenes_of(session, story, judged, self.cutting, words)
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


def merged(session: Session, story: Story, own: list[Record], others: tuple[list[Record], ...]) -> list[Record]:
    """`own`, and at the places it leaves free, the records of `others` (each a file's) fresh for
    the story, each place once (the first file's), in story order: the same list while the files
    and the story's messages are as they were."""
    sources = (own, *others)
    known = session.sidecar.borrowed
    if known is not None and len(known.records) == len(sources) and known.holds(known.records, story.messages):
        if all(a is b for a, b in zip(known.records, sources, strict=True)):
            return known.value
    found = sorted(own, key=lambda r: r.start)
    for records in others:
        for record in judge(story, records).fresh:
            at = bisect.bisect_left(found, record.start, key=lambda r: r.start)
            if (at == len(found) or found[at].start > record.end) and (at == 0 or found[at - 1].end < record.start):
                found.insert(at, record)
    session.sidecar.keep_borrowed(Known(sources, story.messages, found))
    return found


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
            summary = summary_extract(story.messages[start - 1 : end], summary_words, Speakers.of(story))
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
