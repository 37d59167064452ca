"""The summaries file beside a story (`chat.jsonl.ctx-summaries`): scene lines that `ctx
summarize` wrote, read back into the story and judged fresh or stale.

Not `.jsonl`: SillyTavern lists every `.jsonl` of a chats folder as a chat. The story file is
never written (SillyTavern owns its chats); the sidecar only adds scenes after the ones the
story has. Each line is a native scene line plus `ctx`, its provenance:

    {"type": "scene", "id": 4, "start": 65, "end": 95, "title": "…", "summary": "…",
     "history": "…", "ctx": {"covers": "sha256:…", "messages": 31, "model": "…",
     ["history_model": "…",] "made": "2025-01-01T12:00:00Z", "summary_sha": "sha256:…",
     "history_from": {"scene": 3, "sha": "sha256:…"} | null}}

`covers` hashes the covered messages' text, so an edited, deleted or inserted message makes
the scene stale; `sketch` (each message's length and a short hash) tells a small edit from a
rewrite: a scene only touched (`touched`) is stale for `ctx summarize`, which redoes it, while
a build still uses its summary, and says so. A history was rolled from the history before it (`history_from`, `null`
for none) and this scene's summary (`summary_sha`): when either changed since, the history
is stale, and so is every history after it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import StoryError
from ..files import read_input, utf8_text
from ..jsonload import JSONProblem, loads
from .model import Message, Scene, Story

SUFFIX = ".ctx-summaries"


def sidecar_for(story: Path | str) -> Path:
    """Where the summaries of `story` are kept: beside it, its name plus `.ctx-summaries`."""
    path = Path(story)
    return path.with_name(path.name + SUFFIX)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _row(m: Message) -> list[Any]:
    return [m.role, m.name or "", m.content, m.card.name if m.card else None]


def covers(story: Story, start: int, end: int) -> str:
    """The hash of messages start..end as the story holds them now (role, name, text, card)."""
    rows = [_row(m) for m in story.messages[start - 1 : end]]
    return sha(json.dumps(rows, ensure_ascii=False))


def sketch(story: Story, start: int, end: int) -> tuple[str, ...]:
    """Each of messages start..end as its length and a short hash ("412:9f2c0a1b"): enough to
    tell a small edit of a scene (a typo fixed) from a rewrite, without keeping its text."""
    return tuple(
        f"{len(m.content)}:{sha(json.dumps(_row(m), ensure_ascii=False))[7:15]}"
        for m in story.messages[start - 1 : end]
    )


# A scene is only touched — a typo fixed, a few words changed — when it holds as many messages
# as it did, at most one in `TOUCHED_MESSAGES` of them (at least one) changed, and its text's
# length moved by at most `TOUCHED_SHARE` of it (at least `TOUCHED_CHARS` characters). Its
# summary then still tells the scene: a build uses it, and says it is stale.
TOUCHED_MESSAGES = 10
TOUCHED_SHARE = 0.05
TOUCHED_CHARS = 40


def touched(story: Story, record: Record, start: int) -> bool:
    """Whether `record`'s scene, now at `start`, changed only a little since it was summarized."""
    end = start + record.end - record.start
    if not record.sketch or start < 1 or end > len(story.messages) or len(record.sketch) != end - start + 1:
        return False
    now = sketch(story, start, end)
    changed = [(old, new) for old, new in zip(record.sketch, now, strict=True) if old != new]
    if not changed or len(changed) > max(1, len(now) // TOUCHED_MESSAGES):
        return False
    length = sum(len(m.content) for m in story.messages[start - 1 : end])
    moved = sum(abs(int(old.split(":", 1)[0]) - int(new.split(":", 1)[0])) for old, new in changed)
    return moved <= max(TOUCHED_CHARS, TOUCHED_SHARE * length)


@dataclass(frozen=True)
class Record:
    """One scene line of the sidecar, as written."""

    id: int | str
    start: int
    end: int
    title: str
    summary: str
    history: str = ""
    covers: str = ""
    model: str = ""  # who wrote the summary: the model's name, or ctx's extract (summarize/extract.py)
    history_model: str = ""  # who wrote the history, when not `model`
    made: str = ""
    summary_sha: str = ""
    history_from: dict[str, Any] | None = None
    line: int | None = field(default=None, compare=False)
    sketch: tuple[str, ...] = ()  # each covered message's length and short hash (`sketch`)

    def line_text(self) -> str:
        data: dict[str, Any] = {
            "type": "scene",
            "id": self.id,
            "start": self.start,
            "end": self.end,
            "title": self.title,
            "summary": self.summary,
            "history": self.history,
            "ctx": {
                "covers": self.covers,
                "messages": self.end - self.start + 1,
                "model": self.model,
                **({"history_model": self.history_model} if self.history_model else {}),
                "made": self.made,
                "summary_sha": self.summary_sha,
                "history_from": self.history_from,
                **({"sketch": list(self.sketch)} if self.sketch else {}),
            },
        }
        return json.dumps(data, ensure_ascii=False)


def sidecar_text(records: Iterable[Record]) -> str:
    return "".join(r.line_text() + "\n" for r in sorted(records, key=lambda r: r.start))


def read_sidecar(path: Path) -> list[Record]:
    """The records of a sidecar file, read bounded through `files` (an input of the run);
    errors name the file and the line. A later line of a scene (the same `start`) stands for
    the earlier ones: `ctx summarize` appends a changed scene rather than rewrite the file,
    and rewrites it whole at the end of its run. A last line cut short (no line break after
    it, not JSON: a run killed mid-write) is left out, and the next run writes the file whole."""
    text = utf8_text(read_input(path, "summaries"), path)
    lines = text.splitlines()
    records: dict[int, Record] = {}
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = loads(raw)  # guarded: nesting past a thousand levels, a 5,000-digit number
        except JSONProblem as exc:
            if number == len(lines) and not text.endswith("\n"):
                break  # an append cut short
            fix = "mend the line, or delete the file for ctx summarize to write again"
            raise StoryError(path, number, f"is not JSON ctx can read ({exc.message}); {fix}") from None
        except RecursionError:
            raise StoryError(path, number, "nests too deep to read; mend the line") from None
        record = _record(path, number, obj)
        records.pop(record.start, None)  # the latest line of a scene stands, in its place
        records[record.start] = record
    return sorted(records.values(), key=lambda r: r.start)


def _record(path: Path, number: int, obj: Any) -> Record:
    if not isinstance(obj, dict) or obj.get("type") != "scene":
        raise StoryError(path, number, 'expected a scene line ({"type": "scene", …})')
    for key in ("start", "end"):
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StoryError(path, number, f'scene "{key}" must be a message number ≥ 1')
    if obj["start"] > obj["end"]:
        raise StoryError(path, number, f"scene is inverted: start {obj['start']} is after end {obj['end']}")
    for key in ("title", "summary", "history"):
        if not isinstance(obj.get(key, ""), str):
            raise StoryError(path, number, f'scene "{key}" must be text')
    scene_id = obj.get("id", number)
    if isinstance(scene_id, bool) or not isinstance(scene_id, int | str):
        raise StoryError(path, number, 'scene "id" must be a number or text')
    given_ctx = obj.get("ctx")
    ctx: dict[str, Any] = given_ctx if isinstance(given_ctx, dict) else {}
    given = ctx.get("history_from")
    drawn = ctx.get("sketch")
    span = obj["end"] - obj["start"] + 1
    fits = (
        isinstance(drawn, list)
        and len(drawn) == span
        and all(isinstance(d, str) and SKETCH.fullmatch(d) for d in drawn)
    )
    return Record(
        id=scene_id,
        start=obj["start"],
        end=obj["end"],
        title=obj.get("title", ""),
        summary=obj.get("summary", ""),
        history=obj.get("history", ""),
        covers=str(ctx.get("covers", "")),
        model=str(ctx.get("model", "")),
        history_model=str(ctx.get("history_model", "")),
        made=str(ctx.get("made", "")),
        summary_sha=str(ctx.get("summary_sha", "")),
        history_from=given if isinstance(given, dict) else None,
        line=number,
        sketch=tuple(drawn) if fits and isinstance(drawn, list) else (),  # else judged by its hash alone
    )


SKETCH = re.compile(r"\d{1,9}:[0-9a-f]{8}")


@dataclass(frozen=True)
class Judged:
    """The sidecar's records against the story as it is now. `fresh`: records whose messages
    are unchanged (in story order, after the story's own scenes, none overlapping);
    `history_ok`: the starts of the fresh and touched records whose history is up to date;
    `stale`: records whose messages changed (or are gone); `touched`: records whose messages
    changed only a little (`touched`), still used by a build and redone by `ctx summarize`;
    `dropped`: records overlapping the story's own scenes or an earlier record."""

    fresh: tuple[Record, ...] = ()
    history_ok: frozenset[int] = frozenset()
    stale: tuple[Record, ...] = ()
    dropped: tuple[Record, ...] = ()
    touched: tuple[Record, ...] = ()

    @property
    def usable(self) -> tuple[Record, ...]:
        """The records a build uses: the fresh and the touched, in story order."""
        return tuple(sorted((*self.fresh, *self.touched), key=lambda r: r.start))

    def notes(self, shown: str) -> list[str]:
        """What a build should say on stderr about what it leaves out."""
        said: list[str] = []
        if self.touched:
            which = ", ".join(f"{r.id} (messages {r.start:,}–{r.end:,})" for r in self.touched)
            said.append(
                f"{shown}: scene{'s' * (len(self.touched) > 1)} {which} stale: a small edit since "
                "they were summarized; used as they are, with the histories after them"
                " (ctx summarize will refresh them)"
            )
        if self.stale:
            which = ", ".join(f"{r.id} (messages {r.start:,}–{r.end:,})" for r in self.stale)
            said.append(
                f"{shown}: scene{'s' * (len(self.stale) > 1)} {which} stale: "
                "the messages changed since they were summarized; left out (run ctx summarize to redo them)"
            )
        stale_histories = [r for r in self.fresh if r.history and r.start not in self.history_ok]
        if stale_histories:
            which = ", ".join(str(r.id) for r in stale_histories)
            said.append(
                f"{shown}: the histories of scene{'s' * (len(stale_histories) > 1)} {which} are stale "
                "(rolled from summaries that changed); left out (run ctx summarize to redo them)"
            )
        if self.dropped:
            which = ", ".join(f"{r.id} (messages {r.start:,}–{r.end:,})" for r in self.dropped)
            said.append(f"{shown}: scenes {which} overlap earlier scenes; left out")
        return said


def history_basis(previous: Scene | Record | None) -> dict[str, Any] | None:
    """What a history rolled after `previous` is rolled from: its scene and its history's hash
    (None: no history before it)."""
    if previous is None or not previous.history:
        return None
    ref = previous.id if isinstance(previous, Record) else previous.ref
    return {"scene": ref, "sha": sha(previous.history)}


# Messages inserted or deleted before a scene move it: a scene whose messages no longer hash
# at its numbers is looked for this many messages either way of where the scenes before it
# moved to, and at most this many spans are hashed in all, so a chat rewritten end to end
# costs a bounded look, not one per scene and offset.
MOST_SHIFT = 64
MOST_LOOKS = 4096


def judge(story: Story, records: Sequence[Record]) -> Judged:
    """Which records still describe the story: a record is fresh when its messages hash as
    they did — at its numbers, or moved by messages inserted or deleted before it (then it is
    renumbered, and the stale scene where the change happened spans to the moved one); its
    history is up to date when it was rolled from this summary and from the history before
    it as that stands now (so one stale scene makes every later history stale)."""
    after = story.scenes[-1].end if story.scenes else 0
    previous: Scene | Record | None = story.scenes[-1] if story.scenes else None
    chain_ok = True
    fresh: list[Record] = []
    stale: list[Record] = []
    dropped: list[Record] = []
    little: list[Record] = []
    history_ok: set[int] = set()
    shift, looks = 0, MOST_LOOKS
    for record in records:
        if record.start + shift <= after:
            dropped.append(record)
            continue
        now, tried = _found(story, record, shift, looks)
        looks -= tried
        edited = now is None and touched(story, record, record.start + shift)
        if edited:
            now = shift
        if now is None:
            stale.append(replace(record, start=record.start + shift, end=record.end + shift))
            chain_ok = False
            after = record.end + shift
            continue
        if now != shift and stale and stale[-1].end == record.start - 1 + shift:
            # a message was inserted or deleted in the stale scene just before: it ends where this one now starts
            stale[-1] = replace(stale[-1], end=max(stale[-1].start, record.start - 1 + now))
        shift = now
        record = replace(record, start=record.start + shift, end=record.end + shift)
        contiguous = previous is None or record.start == previous.end + 1
        if (
            chain_ok
            and contiguous
            and record.history
            and record.summary_sha == sha(record.summary)
            and record.history_from == history_basis(previous)
        ):
            history_ok.add(record.start)
        else:
            chain_ok = False
        (little if edited else fresh).append(record)
        previous, after = record, record.end
    return Judged(tuple(fresh), frozenset(history_ok), tuple(stale), tuple(dropped), tuple(little))


def _found(story: Story, record: Record, shift: int, looks: int) -> tuple[int | None, int]:
    """(where `record`'s messages are now, as a shift of its numbers, or None; the spans hashed
    to find out). At the scenes' current shift first; then, with `looks` to spend, nearest first."""
    n, length = len(story.messages), record.end - record.start
    tried = 0
    for offset in [0, *(d for k in range(1, MOST_SHIFT + 1) for d in (k, -k))]:
        if offset and tried >= looks:
            break
        start = record.start + shift + offset
        if start < 1 or start + length > n:
            continue
        tried += 1
        if covers(story, start, start + length) == record.covers:
            return shift + offset, tried
    return None, tried


def with_sidecar(story: Story, records: Sequence[Record], shown: str) -> Story:
    """The story with the sidecar's fresh scenes after its own (a stale history left out), and
    notes saying what was left out and why."""
    return with_judged(story, judge(story, records), shown)


def with_judged(story: Story, judged: Judged, shown: str) -> Story:
    """The story with the scenes of records judged against it (`judge`), and the notes."""
    scenes = list(story.scenes)
    for record in judged.usable:
        scenes.append(
            Scene(
                order=len(scenes) + 1,
                start=record.start,
                end=record.end,
                id=record.id,
                title=record.title,
                summary=record.summary,
                history=record.history if record.start in judged.history_ok else "",
                source="sidecar",
            )
        )
    return replace(story, scenes=tuple(scenes), notes=(*story.notes, *judged.notes(shown)))
