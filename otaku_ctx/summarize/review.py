"""A story's scenes for review (`ctx scenes`): each with its span, title, status and text.

The status of a scene: `story` (the story's own), `fresh` (the sidecar's, its messages as
they were), `touched` (a small edit since: still used, to be redone), `stale` (changed: left
out), `extract` (no reply of the model would do for its summary or its history: the scene's
own lines, or the story so far and the summary, stand in), `rejected`
(fresh, but its summary fails the check a new reply must pass, checks.py: written by hand,
or by an older ctx), and `missing` (settled messages no scene covers yet: what `ctx
summarize` would write)."""

from __future__ import annotations

from dataclasses import dataclass

from ..story.model import Story
from ..story.sidecar import Record, judge
from . import checks
from .extract import EXTRACT
from .run import Prompts
from .spans import pack


@dataclass(frozen=True)
class Row:
    """One scene of the review."""

    id: int | str | None
    start: int
    end: int
    title: str
    status: str
    summary: str = ""
    history: str = ""
    why: str = ""  # a rejected scene's reason

    def facts(self) -> dict[str, object]:
        return dict(self.__dict__)


def review(story: Story, records: list[Record], prompts: Prompts) -> list[Row]:
    """Every scene of the story, in story order: its own, the sidecar's, and the gaps."""
    judged = judge(story, records)
    rows = [Row(s.id, s.start, s.end, s.title, "story", s.summary, s.history) for s in story.scenes]
    for status, found in (("fresh", judged.fresh), ("touched", judged.touched), ("stale", judged.stale)):
        for r in found:
            why = ""
            if status == "fresh" and EXTRACT in (r.model, r.history_model):
                status_now = "extract"
            else:
                if status == "fresh":
                    why = checks.rejected("summary", r.summary, prompts.summary_check(story, (r.start, r.end))) or ""
                status_now = "rejected" if why else status
            rows.append(Row(r.id, r.start, r.end, r.title, status_now, r.summary, r.history, why))
    rows.sort(key=lambda row: row.start)
    settled = len(story.messages) - prompts.options.cutting.settle
    covered = 0
    gaps: list[Row] = []
    for row in rows:
        if row.start > covered + 1:
            gaps.append(Row(None, covered + 1, row.start - 1, "", "missing"))
        covered = max(covered, row.end)
    if settled > covered:  # what ctx summarize would cut there now (nothing while too little happened)
        cut = pack(story.messages[covered:settled], prompts.options.cutting)
        gaps += [Row(None, first, last, "", "missing") for first, last in cut]
    return sorted([*rows, *gaps], key=lambda row: row.start)
