"""`ctx scenes STORY`: the story's scenes for review — span, title, status, a line of each —
one scene whole (`--show`), or some redone with the model server (`--redo`), so that nobody
has to edit the summaries file by hand (though a hand edit is kept, as always)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Annotated

import typer

from .options import AsJson, ConfigPath, Conversation, Debug, From, MaxStorySize, StoryArg, Summaries
from .summarize import Jobs, Model, Url, Window, summarize_run, summoned_from
from .terminal import write_stdout

if TYPE_CHECKING:
    from ..summarize.review import Row

PREVIEW = 60  # characters of a scene's summary in the list


def scenes_cmd(
    story: StoryArg,
    show: Annotated[str | None, typer.Option("--show", metavar="ID", help="Show this scene whole.")] = None,
    redo: Annotated[
        str | None, typer.Option("--redo", metavar="ID|A-B", help="Summarize this scene (or these) again.")
    ] = None,
    url: Url = None,
    model: Model = None,
    window: Window = None,
    jobs: Jobs = None,
    as_json: AsJson = False,
    summaries: Summaries = None,
    source_format: From = None,
    conversation: Conversation = None,
    config: ConfigPath = None,
    max_story_size: MaxStorySize = None,
    debug: Debug = False,
) -> None:
    """List STORY's scenes (its own and its summaries file's) with their status: story, fresh,
    touched, stale, rejected or missing (docs/summarize.md)."""
    from ..errors import UsageError
    from ..summarize.review import review

    s = summoned_from(story, summaries, url, model, window, jobs, source_format, conversation, config, max_story_size)
    rows = review(s.told, s.records, s.prompts)
    if redo is not None:
        chosen = _chosen(redo, rows)
        own = [r for r in chosen if r.status == "story"]
        if own:
            raise UsageError(
                "--redo", None, f"scene {own[0].id} is the story's own; only the summaries file's are redone"
            )
        summarize_run(s, as_json=as_json, debug=debug, redo=frozenset(r.start for r in chosen if r.id is not None))
        return
    if show is not None:
        (row,) = _chosen(show, rows, one=True)
        if as_json:
            write_stdout(json.dumps(row.facts(), ensure_ascii=False, indent=2) + "\n")
            return
        lines = [
            f"scene {row.id}: messages {row.start:,}–{row.end:,} · {row.status}" + _why(row),
            f"title: {row.title}",
        ]
        lines += ["", "summary:", row.summary or "(none)", "", "history:", row.history or "(none)"]
        write_stdout("\n".join(lines) + "\n")
        return
    if as_json:
        write_stdout(json.dumps([r.facts() for r in rows], ensure_ascii=False, indent=2) + "\n")
        return
    out = []
    for r in rows:
        preview = " ".join(r.summary.split())
        preview = preview[:PREVIEW] + "…" if len(preview) > PREVIEW else preview
        name = f"{r.id}" if r.id is not None else "-"
        out.append(f"{name:>4}  {r.start:>6,}–{r.end:<6,}  {r.status:<8}  {r.title[:30]:<30}  {preview}")
    write_stdout("\n".join(out) + ("\n" if out else "no scenes\n"))


def _why(row: Row) -> str:
    return f" ({row.why})" if row.why else ""


def _chosen(given: str, rows: list[Row], *, one: bool = False) -> list[Row]:
    """The scenes `given` names by id: one id, or a range `A-B` of numeric ids."""
    from ..errors import UsageError

    flag = "--show" if one else "--redo"
    found = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", given)
    if found and not one:
        low, high = int(found[1]), int(found[2])
        chosen = [r for r in rows if isinstance(r.id, int) and low <= r.id <= high]
    else:
        chosen = [r for r in rows if r.id is not None and str(r.id) == given.strip()]
    if not chosen:
        ids = ", ".join(str(r.id) for r in rows if r.id is not None) or "none"
        raise UsageError(flag, None, f"no scene {given!r}; the scenes are {ids}")
    return chosen
