"""docs/cli.md, written from the commands' own `--help`: `python -m otaku_ctx.cli.reference >
docs/cli.md`. The help is laid out at a fixed width with no colour, so the page is the same on
every machine; tests/test_docs.py regenerates it and compares."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import typer.main

from .app import app

# What `--help` lays out on a terminal 80 columns wide or wider: the app's `max_content_width`
# (80) less the 2 columns Click keeps free
WIDTH = 78
COMMAND = "python -m otaku_ctx.cli.reference > docs/cli.md"


def commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """The command and, for a group, each of its commands in the order `--help` lists them.
    (Click's objects, typed loosely: Typer 0.28 ships its own copy of Click.)"""
    yield command, ctx
    for name in command.list_commands(ctx) if hasattr(command, "list_commands") else ():
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield from commands(sub, sub.context_class(sub, info_name=name, parent=ctx, terminal_width=WIDTH))


def reference() -> str:
    """The page: a contents list, then each command's help as `ctx COMMAND --help` prints it."""
    root = typer.main.get_command(app)
    top = root.context_class(root, info_name="ctx", terminal_width=WIDTH)
    found = list(commands(root, top))
    lines = [
        "# CLI reference",
        "",
        "Every command's `--help`, as `ctx` prints it. Written by `" + COMMAND + "`;",
        "tests/test_docs.py fails when a command's help and this page differ.",
        "",
    ]
    lines += [f"- [`{ctx.command_path}`](#{_anchor(ctx.command_path)})" for _, ctx in found]
    for command, ctx in found:
        help_text = command.get_help(ctx).rstrip()
        lines += ["", f"## {ctx.command_path}", "", "```text", help_text, "```"]
    return "\n".join(lines) + "\n"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading of plain words: lower case, spaces as hyphens."""
    return heading.lower().replace(" ", "-")


if __name__ == "__main__":
    sys.stdout.write(reference())
