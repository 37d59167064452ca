"""The commands on a story: `ctx build`, `ctx inspect`, `ctx validate`, `ctx convert`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..status import ExitStatus
from .options import (
    AsJson,
    Cards,
    ConfigPath,
    Conversation,
    Debug,
    Force,
    From,
    MaxStorySize,
    Request,
    StoryArg,
    Summaries,
    card_paths,
    named,
    prompt_options,
    read_story,
    settings_from,
    story_bound,
    summaries_path,
)
from .terminal import PipeClosed, show, stdout_of, terminal, write_stdout

if TYPE_CHECKING:
    from ..story.native import Problem


@prompt_options
def build_cmd(
    request: Request,
    story: StoryArg,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", metavar="FILE", help="Write the prompt here (atomically), or - for stdout."),
    ] = None,
) -> None:
    """Print the prompt for STORY on stdout (only the prompt; diagnostics go to stderr)."""
    from ..errors import ContextOverflow
    from ..files import write_output

    built, told, pipeline = request.run()
    a, io = built.assembly, terminal()
    if a.refusal or built.prompt is None:
        from ..report import refusal_message, remedy

        assert a.refusal is not None
        said = refusal_message(a.refusal, built.budget, remedy(a, told, story), pipeline.alternatives(told))
        raise ContextOverflow(a, f"{story}: {said}")
    if output is None:
        # A person at a terminal gets the cursor back on a new line; a pipe gets the prompt exactly.
        newline = "\n" if io.stdout_tty and not built.prompt.endswith("\n") else ""
        write_stdout(built.prompt + newline)
    else:
        try:
            write_output(output, built.prompt, stdout_of(io))
        except BrokenPipeError:  # -o - or -o /dev/stdout into a closed pipe
            raise PipeClosed from None
    if io.stderr_tty:
        io.say(f"case {a.case} · {a.tokens:,} of {a.limit:,} tokens ({built.tokenizer})")


@prompt_options
def inspect_cmd(
    request: Request,
    story: StoryArg,
    explain: Annotated[bool, typer.Option("--explain", help="Also list every step of the search.")] = False,
    as_json: AsJson = False,
) -> None:
    """Show which case STORY's prompt is, its sections and its budget."""
    from ..report import facts

    built, told, _ = request.run()
    data = facts(built, told.hidden, told, story)
    if as_json:
        write_stdout(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    else:
        from .views import explain as draw

        show(draw(data, steps=explain))
    if built.assembly.refusal:
        raise typer.Exit(ExitStatus.REFUSED)


# `ctx validate` lists this many problems, then counts the rest: a file with 300,000
# overlapping scenes once printed 299,999 lines.
MOST_PROBLEMS_SHOWN = 100


def validate_cmd(
    story: StoryArg,
    source_format: From = None,
    conversation: Conversation = None,
    config: ConfigPath = None,
    max_story_size: MaxStorySize = None,
    summaries: Summaries = None,
    debug: Debug = False,
) -> None:
    """Report every problem of STORY at once (and the stale scenes of its summaries file);
    exit 1 when any is an error."""
    from ..files import as_regular_file
    from ..story.detect import check_story

    settings_from(config)  # a bad --config is reported like everywhere else
    named(story, "STORY", "an empty path; name the story file, or - for stdin")
    sidecar = summaries_path(story, named(summaries, "--summaries", "an empty path; name a summaries file, or none"))
    with as_regular_file(story, terminal().stdin, story_bound(max_story_size)) as path:
        fmt = source_format.value if source_format else None
        kind, problems = check_story(path, fmt, conversation)
        if sidecar is not None and not any(p.severity == "error" for p in problems):
            problems += _sidecar_problems(path, fmt, conversation, sidecar)
    shown = "<stdin>" if str(story) == "-" else str(story)
    for p in problems[:MOST_PROBLEMS_SHOWN]:
        terminal().say(
            f"{shown}:{p.line}: {p.severity}: {p.message}" if p.line else f"{shown}: {p.severity}: {p.message}"
        )
    errors = sum(p.severity == "error" for p in problems)
    if len(problems) > MOST_PROBLEMS_SHOWN:
        rest, rest_errors = (
            len(problems) - MOST_PROBLEMS_SHOWN,
            errors - sum(p.severity == "error" for p in problems[:MOST_PROBLEMS_SHOWN]),
        )
        terminal().say(
            f"{shown}: … and {rest:,} more problems ({rest_errors:,} of them errors); "
            f"{errors:,} errors and {len(problems) - errors:,} warnings in all: mend the first ones and run it again"
        )
    if errors:
        raise typer.Exit(ExitStatus.ERROR)
    warnings = f" ({len(problems)} warning{'s' * (len(problems) != 1)})" if problems else ""
    terminal().say(f"{shown}: ok, {kind}{warnings}")


def _sidecar_problems(path: Path, fmt: str | None, conversation: int | None, sidecar: Path) -> list[Problem]:
    """The summaries file's stale scenes, as warnings (a build leaves them out)."""
    from ..story.detect import read_story as read_only_story
    from ..story.native import Problem
    from ..story.sidecar import judge, read_sidecar

    judged = judge(read_only_story(path, fmt, conversation), read_sidecar(sidecar))
    return [Problem(None, note, "warning") for note in judged.notes(str(sidecar))]


def convert_cmd(
    story: StoryArg,
    output: Annotated[str, typer.Option("-o", "--output", metavar="FILE", help="The native JSONL file to write.")],
    source_format: From = None,
    card: Cards = None,
    conversation: Conversation = None,
    force: Force = False,
    config: ConfigPath = None,
    max_story_size: MaxStorySize = None,
    summaries: Summaries = None,
    debug: Debug = False,
) -> None:
    """Write STORY (any readable format) as native JSONL, atomically, with the fresh scenes of
    its summaries file."""
    from ..build import native_text
    from ..errors import ConfigError
    from ..files import write_output

    settings_from(config)
    if output and output != "-" and Path(output).is_file() and not force:
        raise ConfigError(output, None, "already exists; pass --force to overwrite it")
    story = named(story, "STORY", "an empty path; name the story file, or - for stdin")
    fmt = source_format.value if source_format else None
    given = named(summaries, "--summaries", "an empty path; name a summaries file, or none")
    converted = read_story(story, fmt, card_paths(card), conversation, story_bound(max_story_size), given)
    for note in converted.notes:
        terminal().say(f"ctx: {note}")
    write_output(output, native_text(converted), stdout_of(terminal()))
    terminal().say(f"wrote {output}: {len(converted)} messages, {len(converted.scenes)} scenes")
