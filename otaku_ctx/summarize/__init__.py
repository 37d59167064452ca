"""`ctx summarize`: scene summaries and histories written with the user's own model, into the
sidecar beside the story (`story/sidecar.py`), so every long chat builds. It asks its model
through `backend/` only, and never writes the story file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..backend import Backend, BadURL
from ..backend.servers import MODEL_FILES, listed_as
from ..config import SummarizeSettings
from ..errors import ConfigError, UsageError, did_you_mean
from ..story.model import Story
from ..story.sidecar import Record
from ..tokens import TokenCounter
from .commits import Commits, check_writable
from .prompts import Prompt, load_prompt
from .run import (
    DEFAULT_WINDOW,
    Options,
    Plan,
    Planned,
    Progress,
    Prompts,
    Report,
    SummarizeError,
    SummaryBackend,
    plan,
    run,
)
from .spans import Cutting, pack

__all__ = [
    "DEFAULT_WINDOW",
    "Cutting",
    "Options",
    "Plan",
    "Planned",
    "Progress",
    "Prompt",
    "Prompts",
    "Report",
    "SummarizeError",
    "backend_of",
    "check_model",
    "load_prompt",
    "options_of",
    "pack",
    "plan",
    "plan_for",
    "prompts_of",
    "run",
    "summarize",
]


def options_of(s: SummarizeSettings, jobs: int | None = None) -> Options:
    return Options(
        cutting=Cutting(s.settle, s.min_chars, s.min_messages, s.scene_breaks, s.date_gap),
        summary_words=s.summary_words,
        history_words=s.history_words,
        jobs=jobs or s.jobs,
        temperature=s.temperature,
        repeat_penalty=s.repeat_penalty,
        attempts=s.attempts,
        fallback=s.fallback,
    )


def prompts_of(s: SummarizeSettings, count: TokenCounter, jobs: int | None = None) -> Prompts:
    summary, history = load_prompt("summary", s.summary_prompt), load_prompt("history", s.history_prompt)
    return Prompts(summary, history, options_of(s, jobs), count)


def backend_of(s: SummarizeSettings) -> Backend:
    if not s.url:
        raise ConfigError("summarize.url", None, "no model server named; pass --url (e.g. http://127.0.0.1:8080/v1)")
    if not s.model:
        raise ConfigError("summarize.model", None, "no model named; pass --model (the server's name for it)")
    try:
        return Backend(
            s.url, s.model, api_key_env=s.api_key_env or None, timeout=s.timeout, connect_timeout=s.connect_timeout
        )
    except BadURL as exc:  # a URL no request can be sent to is a usage error, named by the setting
        raise UsageError("--url", "summarize.url", str(exc)) from None


SHOWN_MODELS = 8  # a server's list named in an error: at most this many of its models


def check_model(backend: Backend) -> None:
    """The model asked for is one the server lists (`Backend.models`), when it lists any: a name
    it does not know is a usage error naming the ones it has, before any summary is asked, so
    no summary is ever written under a model's name the server does not have."""
    ids = backend.models()
    if ids is None or listed_as(backend.model, ids) is not None:
        return
    shown = ", ".join(repr(i if len(i) <= 80 else i[:79] + "…") for i in ids[:SHOWN_MODELS])
    more = f" and {len(ids) - SHOWN_MODELS:,} more" if len(ids) > SHOWN_MODELS else ""
    asked = backend.model if len(backend.model) <= 80 else backend.model[:79] + "…"
    files = any(i.lower().endswith(MODEL_FILES) for i in ids)
    hint = " (a model file by its name, with or without its extension, will do)" if files else ""
    raise UsageError(
        "--model",
        "summarize.model",
        f"{backend.url} has no model {asked!r}{did_you_mean(backend.model, ids)}; it lists {shown}{more}{hint}",
    )


def plan_for(
    story: Story,
    records: list[Record],
    prompts: Prompts,
    s: SummarizeSettings,
    backend: SummaryBackend | None,
    redo: frozenset[int] = frozenset(),
) -> Plan:
    """The plan at the summarizer's window: `window` when set, else the server's (asked only
    when a backend is given: a dry run contacts nobody), else `DEFAULT_WINDOW`."""
    if s.window:
        return plan(story, records, prompts, s.window, "--window or [summarize] window", redo)
    if backend is None:  # the real run asks the server, which may say otherwise
        why = "the default: a dry run asks no server; give --window"
        return plan(story, records, prompts, DEFAULT_WINDOW, why, redo)
    told = backend.window()
    if told:
        return plan(story, records, prompts, told, "as the server says", redo)
    return plan(story, records, prompts, DEFAULT_WINDOW, "the default: the server did not say", redo)


def summarize(
    story: Story,
    sidecar: Path,
    records: list[Record],
    prompts: Prompts,
    s: SummarizeSettings,
    on_progress: Callable[[Progress], None] = lambda p: None,
    progress: Progress | None = None,
    redo: frozenset[int] = frozenset(),
) -> tuple[Plan, Report]:
    """Summarize what the sidecar lacks (and the scenes starting at `redo`), committing each
    finished scene to it (`commits.Commits`: merged into the file as it is on disk, under a
    lock against a second run) before the next request; `progress` is filled as the run goes
    (what an interrupted run had done). A sidecar no run could write is refused first; a plan
    that cannot fit the window, and a model the server does not list (`check_model`), before
    any summary is asked."""
    check_writable(sidecar)
    backend = backend_of(s)
    with Commits(sidecar, records) as commits:
        chosen = plan_for(story, records, prompts, s, backend, redo)
        if chosen.requests:
            check_model(backend)
        return chosen, run(chosen, backend, prompts, commits.commit, progress, on_progress)
