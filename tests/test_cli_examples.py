"""Every command's `--help` ends with its examples, and every example that needs no model
server runs as written, from a copy of the repository's examples folder: exit 0, and what
it says it writes is written."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, deep_but, run
from typer.main import get_command

from otaku_ctx.cli.app import app
from otaku_ctx.cli.examples import EXAMPLES

NEEDS_A_SERVER = ("--url", "--backend", "--redo")


def commands() -> list[str]:
    """Every command of `ctx`, as its words: "build", "config init", ..."""
    found = []

    def walk(group: Any, words: tuple[str, ...]) -> None:
        if hasattr(group, "commands"):  # a group (typer's own click, not the click package's)
            for name, command in group.commands.items():
                walk(command, (*words, name))
        else:
            found.append(" ".join(words))

    walk(get_command(app), ())
    return found


def test_every_command_has_examples_and_only_commands_do() -> None:
    assert sorted(EXAMPLES) == sorted(commands())


@pytest.mark.parametrize("command", commands())
def test_help_ends_with_examples_of_that_command(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run(capsys, *command.split(), "--help")
    assert code == 0
    examples = out[out.rindex("Examples:") :].splitlines()[1:]
    lines = [line.strip() for line in examples if line.strip()]
    assert lines and all(len(line) <= 80 for line in lines), lines
    assert any(line.startswith(f"ctx {command} ") or line == f"ctx {command}" for line in lines), lines


def runnable() -> list[str]:
    lines = [line.strip() for text in EXAMPLES.values() for line in text.splitlines()]
    return [line for line in lines if line.startswith("ctx ") and not any(flag in line for flag in NEEDS_A_SERVER)]


@pytest.mark.parametrize(
    "example", deep_but(runnable(), *(e for e in runnable() if "replay" not in e))
)  # a replay: 7 s
def test_an_example_runs_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: str
) -> None:
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    words = shlex.split(example.split("#")[0])
    redirect = words.index(">") if ">" in words else None
    argv = words[1:redirect] if redirect is not None else words[1:]
    if "--vars" in argv:  # the example after the one that wrote vars.json
        code, out, err = run(capsys, "template", "vars", "examples/lighthouse-case4.jsonl")
        (tmp_path / "vars.json").write_text(out, encoding="utf-8")
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert out or err or "-o" in argv, "the example printed nothing"
    if "-o" in argv:
        assert (tmp_path / argv[argv.index("-o") + 1]).stat().st_size > 0
    if redirect is not None:
        assert out.lstrip().startswith("{")  # what `> vars.json` keeps is the JSON the next example reads
