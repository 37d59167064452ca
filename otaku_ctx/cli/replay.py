"""`ctx replay STORY`: build the story turn by turn and say how much a prompt cache reuses.

The turn range is `--first N` / `--last M` (every command's `--from` already names the
story's format); `--bound` adds the hindsight optimum over the same turns."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .options import AsJson, Request, StoryArg, prompt_options
from .terminal import write_stdout

First = Annotated[int | None, typer.Option("--first", min=1, metavar="N", help="The first turn (message number).")]
Last = Annotated[int | None, typer.Option("--last", min=1, metavar="M", help="The last turn (default: the end).")]
Every = Annotated[int, typer.Option("--every", min=1, metavar="K", help="Messages a turn adds.")]
Bound = Annotated[
    bool,
    typer.Option(
        "--bound",
        help="Also the hindsight optimum: the fewest tokens any choice among the seed's candidates reprocesses.",
    ),
]


@prompt_options
def replay_cmd(
    request: Request,
    story: StoryArg,
    first: First = None,
    last: Last = None,
    every: Every = 1,
    bound: Bound = False,
    as_json: AsJson = False,
) -> None:
    """Build STORY's prompt at every turn (turn n: messages 1..n and the scenes closed by then)
    and report how often the previous prompt, less its open turn, is a token prefix of the next."""
    from ..replay import replay, report

    settings = request.settings()
    told = request.read_story()
    result = replay(told, settings, emit=request.emit, first=first, last=last, every=every, bound=bound)
    if as_json:
        write_stdout(json.dumps(result.facts(), ensure_ascii=False, indent=2) + "\n")
    else:
        write_stdout(report(result))
