"""The documentation covers the tool (sqlite-utils' test_docs is the model): every command and
every config key appears in the README or docs/, and the docs cite files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otaku_ctx.cli.app import app
from otaku_ctx.config import SECTIONS, keys

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TEXT = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)


def commands() -> list[str]:
    names = [c.name for c in app.registered_commands]
    for group in app.registered_groups:
        names += [f"{group.name} {c.name}" for c in group.typer_instance.registered_commands]
    return sorted(n for n in names if n)


def settings() -> list[str]:
    return [f"{section}.{key.name}" for section in SECTIONS for key in keys(section)]


def test_the_lists_are_not_empty() -> None:
    assert len(commands()) >= 9 and len(settings()) >= 30


@pytest.mark.parametrize("command", commands())
def test_every_command_is_documented(command: str) -> None:
    assert f"ctx {command}" in TEXT, f"`ctx {command}` appears in neither README.md nor docs/"


@pytest.mark.parametrize("dotted", settings())
def test_every_config_key_is_documented(dotted: str) -> None:
    section, key = dotted.split(".")
    assert re.search(rf"\b{key}\b", TEXT), f"[{section}] {key} appears in neither README.md nor docs/"


def test_docs_cite_the_repository_copy_of_the_design() -> None:
    """The design document is docs/architecture.md; nothing cites a file beside the repository."""
    assert (REPO / "docs" / "architecture.md").is_file()
    stale = [
        str(path.relative_to(REPO))
        for path in [*DOCS, *(REPO / "otaku_ctx").rglob("*.py")]
        if re.search(r"(?<![/\w])ARCHITECTURE\.md|\.\./shared", path.read_text(encoding="utf-8"))
    ]
    assert not stale, f"cite docs/architecture.md instead: {stale}"


def test_the_cli_reference_is_the_commands_own_help() -> None:
    """docs/cli.md is written from each command's `--help` (`otaku_ctx/cli/reference.py`): a
    changed help text, option or command changes the page."""
    from otaku_ctx.cli.reference import COMMAND, reference

    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == reference(), f"docs/cli.md is not the commands' help: run `{COMMAND}` to update it"
