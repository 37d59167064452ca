"""`ctx summarize STORY`: scene summaries and histories from the user's own model server, into
the sidecar beside the story; a progress bar on a terminal, the report line at the end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..status import ExitStatus
from .options import (
    AsJson,
    ConfigPath,
    Conversation,
    Debug,
    From,
    MaxStorySize,
    StoryArg,
    Summaries,
    named,
    read_story,
    settings_from,
    story_bound,
)
from .terminal import progress, terminal, write_stdout

if TYPE_CHECKING:
    from ..config import Settings
    from ..story.model import Story
    from ..story.sidecar import Record
    from ..summarize import Plan, Progress, Prompts, Report

Url = Annotated[str | None, typer.Option("--url", metavar="URL", help="The server's OpenAI-compatible base URL.")]
Model = Annotated[str | None, typer.Option("--model", metavar="NAME", help="The model to ask (the server's name).")]
Window = Annotated[
    int | None,
    typer.Option("--window", min=1, metavar="TOKENS", help="The summarizer's context (default: ask the server)."),
]
Jobs = Annotated[int | None, typer.Option("--jobs", min=1, metavar="N", help="Scene requests sent at once.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="List the scenes and requests; contact no server.")]


def summarize_cmd(
    story: StoryArg,
    url: Url = None,
    model: Model = None,
    window: Window = None,
    jobs: Jobs = None,
    dry_run: DryRun = False,
    as_json: AsJson = False,
    summaries: Summaries = None,
    source_format: From = None,
    conversation: Conversation = None,
    config: ConfigPath = None,
    max_story_size: MaxStorySize = None,
    debug: Debug = False,
) -> None:
    """Summarize STORY's scenes with your own model into STORY.ctx-summaries (the story file is
    never written); run it again to do only what is missing or stale."""
    from ..summarize import plan_for

    s = summoned_from(story, summaries, url, model, window, jobs, source_format, conversation, config, max_story_size)
    if dry_run:
        _show_plan(s.story, s.sidecar, plan_for(s.told, s.records, s.prompts, s.settings.summarize, None), as_json)
        return
    summarize_run(s, as_json=as_json, debug=debug)


def summoned_from(
    story: str, summaries: str | None, url: str | None, model: str | None, window: int | None, jobs: int | None,
    source_format: Any, conversation: int | None, config: str | None, max_story_size: str | None,
) -> Summoned:  # fmt: skip
    """The options a summarizing command shares, read: the settings with `--url`, `--model`,
    `--window` and `--jobs` on top, the story, its sidecar, the prompts."""
    given = {"url": url, "model": model, "window": window, "jobs": jobs}
    settings = settings_from(config, {f"summarize.{k}": (v, f"--{k}") for k, v in given.items() if v is not None})
    story = named(story, "STORY", "an empty path; name the story file")
    sidecar = named(summaries, "--summaries", "an empty path; name a summaries file")
    fmt = source_format.value if source_format else None
    return summoned(story, sidecar, settings, fmt, conversation, max_story_size)


@dataclass(frozen=True)
class Summoned:
    """What a command that runs the summarizer read: the story as named and as read, its
    sidecar and the records in it, the prompts, the settings."""

    story: str
    sidecar: Path
    told: Story
    records: list[Record]
    prompts: Prompts
    settings: Settings


def summoned(story: str, sidecar_given: str, settings: Settings, source_format: str | None,
             conversation: int | None, max_story_size: str | None) -> Summoned:  # fmt: skip
    """Read what a summarizing command needs (`ctx summarize`, `ctx scenes`)."""
    from ..build import Pipeline, with_model
    from ..story.sidecar import read_sidecar
    from ..summarize import prompts_of

    sidecar = _sidecar(story, sidecar_given)
    told = read_story(story, source_format, (), conversation, story_bound(max_story_size), "none")
    records = read_sidecar(sidecar) if sidecar.is_file() else []
    # counted as the configured model counts (`--tokenizer server`: as the summarizer's own server does);
    # the server is not asked to count unless told, so that a dry run contacts nobody
    prompts = prompts_of(settings.summarize, Pipeline(with_model(settings, ask_server=False)).count)
    return Summoned(story, sidecar, told, records, prompts, settings)


def summarize_run(s: Summoned, *, as_json: bool, debug: bool, redo: frozenset[int] = frozenset()) -> None:
    """Run the summarizer with a progress bar, say what it did, exit 1 when a scene is missing."""
    from ..summarize import Progress, summarize

    story, sidecar = s.story, s.sidecar
    watched = Progress()
    try:
        with progress(terminal()) as phase, _ticking(lambda: phase(_line(watched))):
            chosen, report = summarize(
                s.told, sidecar, s.records, s.prompts, s.settings.summarize, lambda p: phase(_line(p)), watched, redo
            )
    except KeyboardInterrupt:
        terminal().say(
            f"ctx: interrupted: {_count(watched.done, 'request')} of {watched.total} done and saved in {sidecar};"
            f" run `ctx summarize {story}` again to go on from there"
        )
        raise
    finally:
        if debug:
            for line in watched.rejected:
                terminal().say(f"ctx: rejected: {line}")
    _show_report(story, sidecar, chosen, report, as_json)
    if report.missing:
        raise typer.Exit(ExitStatus.ERROR)


@contextmanager
def _ticking(show: Callable[[], None]) -> Iterator[None]:
    """`show` once a second while the block runs, so the elapsed time moves between requests
    (a scene's request may take minutes); only for a person at a terminal."""
    if not terminal().stderr_tty:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(1.0):
            show()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()


def _line(p: Progress) -> str:
    """The progress bar's words: requests done of all, tokens in and out, time, ETA."""
    eta = f" · ETA {_duration(p.eta)}" if p.eta is not None else ""
    return (
        f"{p.done}/{p.total} requests · {p.tokens_in:,} tokens in, {p.tokens_out:,} out"
        f" · {_duration(time.monotonic() - p.started)}{eta}"
    )


def _sidecar(story: str, given: str) -> Path:
    from ..errors import UsageError
    from ..story.sidecar import sidecar_for

    if story == "-" and not given:
        raise UsageError("STORY", None, "summarize needs the story's file (its summaries go beside it), not stdin")
    if given == "none":
        raise UsageError("--summaries", None, "summarize writes summaries: name a file, or leave it out")
    path = Path(given) if given else sidecar_for(story)
    if story != "-" and path.exists() and Path(story).exists() and path.samefile(story):
        raise UsageError("--summaries", None, "is the story itself; the story file is never written")
    return path


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def _show_plan(story: str, sidecar: Path, chosen: Plan, as_json: bool) -> None:
    requests = [
        {
            "kind": r.kind,
            "start": r.span[0],
            "end": r.span[1],
            "prompt_tokens": r.prompt_tokens,
            "max_tokens": r.max_tokens,
            **({"cut": r.cut} if r.kind == "summary" else {}),
        }
        for r in chosen.requests
    ]
    facts: dict[str, Any] = {
        "story": story,
        "summaries": str(sidecar),
        "window": chosen.window,
        "window_source": chosen.window_source,
        "usable": chosen.usable,
        "kept": len(chosen.kept),
        "spans": [list(s) for s in chosen.spans],
        "requests": requests,
    }
    if as_json:
        write_stdout(json.dumps(facts, ensure_ascii=False, indent=2) + "\n")
        return
    lines = [
        f"{story}: {len(chosen.kept)} scenes up to date in {sidecar}; {len(chosen.spans)} to summarize, "
        f"{len(requests)} requests, at a {chosen.window:,}-token window ({chosen.window_source}; "
        f"{chosen.usable:,} used)"
    ]
    for r in chosen.requests:
        bound = "at most " if r.kind == "history" else ""
        cut = f" · {_cut(r.cut)}" if r.cut else ""
        lines.append(
            f"  {r.kind:<7} messages {r.span[0]:,}–{r.span[1]:,}: {bound}{r.prompt_tokens:,} prompt tokens, "
            f"max_tokens {r.max_tokens:,}{cut}"
        )
    write_stdout("\n".join(lines) + "\n")


def _cut(why: str) -> str:
    """Why a scene ends where it does, in words: by size, before a break the story marks, …"""
    if why == "size":
        return "cut by size"
    return f"cut before {why}" if why.startswith("a ") else why


def _show_report(story: str, sidecar: Path, chosen: Plan, report: Report, as_json: bool) -> None:
    if as_json:
        write_stdout(json.dumps({"story": story, "summaries": str(sidecar), **report.facts()}, indent=2) + "\n")
        return
    covered = f", messages 1–{report.covered_to:,} covered" if report.covered_to else ""
    terminal().say(
        f"{story}: {_count(report.summaries, 'scene')} summarized ({report.redone} redone), "
        f"{_count(report.histories, 'history', 'histories')}, {report.kept} up to date · "
        f"{_count(report.requests, 'request')}, {report.tokens_in:,} tokens in, {report.tokens_out:,} out, "
        f"{_duration(report.seconds)} · {_count(report.scenes, 'scene')} in {sidecar}{covered}"
    )
    if report.extracts:
        terminal().say(
            f"{story}: {_count(report.extracts, 'summary or history', 'summaries and histories')} written as extracts"
            f" of the scene's own lines (no reply of the model would do): `ctx scenes {story}` lists them, and"
            " --redo asks again"
        )
    for start, end, why in report.missing:
        terminal().say(f"{story}: missing: messages {start:,}–{end:,}: {why}")
    if report.missing:
        terminal().say(
            f"{story}: {_count(len(report.missing), 'scene')} could not be summarized; the rest are saved."
            f" Run `ctx summarize {story}` again to try them (--debug shows each rejected reply)"
        )


def _count(n: int, one: str, many: str = "") -> str:
    """`n` things, in the singular for one."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
