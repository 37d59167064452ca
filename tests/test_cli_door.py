"""The CLI drives the pipeline through its one door (issue 41): a module of otaku_ctx/cli/
imports from otaku_ctx.build only the names build lists in `__all__`, and nothing of the stages
a build hands a story down (lore/, assemble/, render/), which only build puts together.
Imports inside functions and under TYPE_CHECKING count, as in tests/test_layout.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import otaku_ctx.build as build

REPO = Path(__file__).resolve().parents[1]
CLI = sorted((REPO / "otaku_ctx" / "cli").glob("*.py"))

# The stages behind the door.
BEHIND = ("otaku_ctx.lore", "otaku_ctx.assemble", "otaku_ctx.render")
# `ctx template render` runs a template on the variables a file gives, with no story and no
# pipeline: it finds the template by name as a build does.
THE_TEMPLATE_ENGINE_ALONE = {"otaku_ctx.render.lookup"}


def imports(path: Path) -> list[tuple[str, str | None, int]]:
    """(module, name, line) for each name imported in the file, relative modules made absolute;
    name is None for `import module`."""
    package = "otaku_ctx.cli"
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(module, alias.name, node.lineno) for alias in node.names]
    return found


def test_builds_door_is_small_and_real() -> None:
    assert 0 < len(build.__all__) <= 8, build.__all__
    assert all(hasattr(build, name) and not name.startswith("_") for name in build.__all__)


@pytest.mark.parametrize("path", CLI, ids=lambda p: p.name)
def test_the_cli_imports_only_builds_public_names(path: Path) -> None:
    door = set(build.__all__)
    found = []
    for module, name, line in imports(path):
        whole = module if name is None else f"{module}.{name}"
        if whole == "otaku_ctx.build":  # the module itself: its names could not be checked
            found.append(f"line {line}: the module otaku_ctx.build (import names from its __all__)")
        elif module == "otaku_ctx.build" and name not in door:
            found.append(f"line {line}: {name}")
    assert not found, f"otaku_ctx/cli/{path.name} reaches past build.__all__ {sorted(door)}: {found}"


@pytest.mark.parametrize("path", CLI, ids=lambda p: p.name)
def test_the_cli_reaches_no_stage_behind_the_door(path: Path) -> None:
    found = []
    for module, name, line in imports(path):
        for each in (module, f"{module}.{name}"):
            behind = any(each == stage or each.startswith(stage + ".") for stage in BEHIND)
            if behind and each not in THE_TEMPLATE_ENGINE_ALONE and module not in THE_TEMPLATE_ENGINE_ALONE:
                found.append(f"line {line}: {each}")
                break
    assert not found, f"otaku_ctx/cli/{path.name} imports a stage only build may put together: {found}"
