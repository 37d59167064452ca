"""`ctx template`: what a template author needs — the variables a story gives a template, and
a template's raw output for given variables. The core is `build.Pipeline.variables` and
`hbs.Template.render_raw`; this module only reads arguments and prints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from .examples import EXAMPLES
from .options import ConfigPath, Debug, Request, StoryArg, named, prompt_options
from .terminal import terminal, write_stdout

template_app: typer.Typer = typer.Typer(no_args_is_help=True, help="Show a template's variables, or render a template.")


@template_app.command("vars", epilog=EXAMPLES["template vars"])
@prompt_options
def vars_cmd(request: Request, story: StoryArg) -> None:
    """Print, as JSON, the variables the template sees for STORY's prompt (the assembly
    `ctx build` chooses with the same options)."""
    from ..build import Pipeline
    from ..errors import ContextOverflow
    from ..report import refusal_message, remedy

    settings = request.settings()
    told = request.read_story()
    for note in told.notes:
        terminal().say(f"ctx: {note}")
    built, variables = Pipeline(settings).variables(told)
    refusal = built.assembly.refusal
    if variables is None or refusal is not None:
        assert refusal is not None  # a refusal alone has no variables
        a = built.assembly
        raise ContextOverflow(a, f"{story}: {refusal_message(refusal, built.budget, remedy(a, told, story))}")
    write_stdout(json.dumps(variables, ensure_ascii=False, indent=2) + "\n")


@template_app.command("render", epilog=EXAMPLES["template render"])
def render_cmd(
    template: Annotated[str, typer.Argument(metavar="NAME|FILE", help="A template: a name or a .hbs file.")],
    vars_file: Annotated[
        str,
        typer.Option("--vars", metavar="FILE.json", help="The variables, a JSON object."),
    ],
    config: ConfigPath = None,
    debug: Debug = False,
) -> None:
    """Print TEMPLATE's raw output for the variables in FILE.json: every character the template
    prints, each role block shown inline as [system]...[/system], [user]...[/user] or
    [assistant]...[/assistant] around its text (before blocks are cut and trimmed)."""
    from ..hbs import bound_for_window
    from ..render.lookup import load_template

    named(template, "TEMPLATE", "an empty name; name a template or a .hbs file")
    variables = _read_vars(Path(named(vars_file, "--vars", "an empty path; name a JSON file of variables")))
    loaded = load_template(template)
    text = loaded.render_raw(variables, bound_for_window(0))
    newline = "\n" if terminal().stdout_tty and not text.endswith("\n") else ""
    write_stdout(text + newline)


def _read_vars(path: Path) -> dict[str, Any]:
    from ..errors import ConfigError
    from ..files import read_input, utf8_text
    from ..jsonload import JSONProblem, loads

    where = str(path)
    if not os.path.lexists(path.expanduser()):
        raise ConfigError(where, None, "no such file (`ctx template vars STORY` writes one)")
    text = utf8_text(read_input(path.expanduser(), "variables file"), path)
    try:
        data = loads(text)
    except JSONProblem as exc:
        at = f"{where}:{exc.line}:{exc.column}" if exc.column else where
        raise ConfigError(at, None, f"not valid JSON ({exc.message}): fix the file") from None
    if not isinstance(data, dict):
        raise ConfigError(where, None, f"the variables must be a JSON object ({{...}}), not {type(data).__name__}")
    return data
