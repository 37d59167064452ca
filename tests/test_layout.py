"""The layout is the data flow, and the tests hold it there (docs/architecture.md).

Every module imports on its own in a fresh interpreter (pip-tools' test_circular_imports is
the model), and no stage imports a stage above it: `STAGES` is the table of what each stage
may import, the same table docs/architecture.md draws. Imports inside functions and under
`TYPE_CHECKING` count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "otaku_ctx"

FOUNDATION = {"status", "errors", "locations", "files", "tokens", "jsonload"}
# stage -> the stages it may import (besides itself). Lowest first: file -> Story -> lore ->
# assembly -> settings -> template engine -> render -> build, replay, report -> CLI.
STAGES: dict[str, set[str]] = {
    "status": set(),
    "errors": {"status"},
    "locations": set(),
    "jsonload": set(),  # the one guarded reader of untrusted JSON: files, stories, servers' replies
    "files": {"errors", "status"},
    "tokens": {"errors", "status"},
    "backend": {"errors", "status", "jsonload"},  # the one HTTP client for the user's model server
    # the model the user runs: its files (GGUF, tokenizer.json, Mistral's), its server's tokenizer
    "model": FOUNDATION | {"backend"},
    "story": {"errors", "status", "files", "jsonload"},
    "lore": {"story"},
    "assemble": {"story"},
    "config": {"errors", "status", "locations", "tokens", "lore", "assemble"},
    "hbs": {"errors", "status", "story"},  # story: the `Role` of a block, nothing else
    "render": FOUNDATION | {"story", "lore", "assemble", "config", "hbs", "model"},
    "summarize": FOUNDATION | {"story", "config", "backend", "model"},  # asks its model through backend/ only
    "build": FOUNDATION | {"story", "lore", "assemble", "config", "hbs", "render", "backend", "model"},
    "replay": FOUNDATION | {"story", "assemble", "config", "hbs", "render", "build", "model"},  # assemble: the bound
    "report": FOUNDATION | {"story", "lore", "assemble", "render", "build", "model"},
    # recall by meaning: the embedding model asked through backend/, its vectors beside the summaries
    "embed": FOUNDATION | {"story", "config", "backend"},
    # ctx serve: a chat request -> build -> the backend; summaries through summarize/
    "serve": FOUNDATION | {"story", "assemble", "config", "backend", "build", "summarize", "model", "render", "embed"},
    "cli": FOUNDATION
    | {"story", "lore", "assemble", "config", "hbs", "render", "build", "replay", "report", "backend", "summarize"}
    | {"model", "serve", "embed", ""},
    "__main__": {"status", "cli", ""},
    "": {"story", "lore", "assemble", "config", "hbs", "render", "build", "errors", "tokens"},  # the lazy public API
}
UI = {"typer", "click", "rich"}


def modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "configs" in path.relative_to(PACKAGE).parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def stage(module: str) -> str:
    """`otaku_ctx.render.emit` -> "render"; the package itself -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@functools.cache
def import_statements(module: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """Every import statement of `module`, wherever it is (read and parsed once a run)."""
    path = REPO / Path(*module.split("."))
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text(encoding="utf-8")
    return tuple(node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom)))


@functools.cache
def imports(module: str) -> frozenset[str]:
    """Every module `module` imports, by its absolute name, wherever the import statement is."""
    is_package = (REPO / Path(*module.split("."))).is_dir()
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in import_statements(module):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES)
    return frozenset(found)


MODULES = modules()


def test_the_layout_finds_every_stage() -> None:
    """A new top-level module or folder must be given its place in `STAGES` (and the docs)."""
    assert {stage(m) for m in MODULES} == set(STAGES)


def test_no_stage_imports_one_above_it() -> None:
    """Each module imports only what its stage may (every offender listed, one a line)."""
    above = [
        f"{module} ({stage(module) or 'the package'}) imports {target}"
        for module in MODULES
        for target in sorted(imports(module))
        if target.startswith("otaku_ctx") and (s := stage(target)) != stage(module) and s not in STAGES[stage(module)]
    ]
    assert not above, "\n".join([*above, "docs/architecture.md says what each stage may import"])


def test_the_core_knows_no_terminal() -> None:
    ui = [f"{m} imports {t}" for m in MODULES if stage(m) != "cli" for t in sorted(imports(m)) if t.split(".")[0] in UI]
    assert not ui, "\n".join([*ui, "only otaku_ctx.cli may"])


@pytest.mark.deep
def test_every_module_imports_on_its_own() -> None:
    """Each module in a fresh interpreter of its own, so no module works only because another
    was imported first (the cycle `import otaku_ctx.cli_template` once fell into)."""
    script = "import importlib, sys\nimportlib.import_module(sys.argv[1])\n"
    running = [
        (m, subprocess.Popen([sys.executable, "-c", script, m], cwd=REPO, stderr=subprocess.PIPE, text=True))
        for m in MODULES
    ]
    failed = {}
    for module, process in running:
        _, err = process.communicate(timeout=120)
        if process.returncode:
            failed[module] = err.strip().splitlines()[-1:]
    assert not failed
    assert len(running) > 40


def test_no_module_imports_another_modules_private_names() -> None:
    """A name that starts with `_` is its module's own: what two modules share is public."""
    private = [
        f"{module} imports {node.module}.{alias.name}"
        for module in MODULES
        for node in import_statements(module)
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("otaku_ctx"))
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not private, "\n".join(private)


NETWORK = {"socket", "http", "urllib", "ssl", "asyncio", "requests", "httpx", "aiohttp"}


# `ctx serve` is a server (aiohttp, on asyncio) and forwards its frontend's requests to the
# user's model server, streamed: those two modules of it, and no other, touch the network.
SERVING = {f"otaku_ctx.serve.{name}" for name in ("http", "upstream", "body", "relay", "listen", "setup")}


def test_only_the_backend_opens_a_connection() -> None:
    """ctx talks to a network only through backend/ (and `ctx serve`'s server and forwarding,
    `SERVING`), and only to the server the user names."""
    found = [
        f"{m} imports {t}"
        for m in MODULES
        if stage(m) != "backend" and m not in SERVING
        for t in sorted(imports(m))
        if t.split(".")[0] in NETWORK
    ]
    assert not found, "\n".join([*found, "a request to the model server goes through otaku_ctx.backend"])


def stage_table() -> str:
    """docs/architecture.md's table of what each stage may import, drawn from `STAGES` (print it
    with `python tests/test_layout.py`); the test below holds the two equal."""

    def shown(name: str) -> str:
        return "`otaku_ctx` (the public API)" if name == "" else f"`{name}`"

    rows = ["| stage | may import |", "| --- | --- |"]
    for name, allowed in STAGES.items():
        may = ", ".join(shown(s) for s in STAGES if s in allowed) or "nothing of ours"
        rows.append(f"| {shown(name)} | {may} |")
    return "\n".join(rows) + "\n"


def test_the_architecture_doc_draws_this_table() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    pasted = "docs/architecture.md's stage table differs from STAGES: paste `python tests/test_layout.py`"
    assert stage_table() in doc, pasted


def test_the_architecture_doc_names_only_files_that_exist() -> None:
    """Every module and folder the doc names (`name.py`, `name/`) is in the package."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    files = {p.name for p in PACKAGE.rglob("*.py")} | {p.name + "/" for p in PACKAGE.rglob("*") if p.is_dir()}
    named = set(re.findall(r"(?<![\w/.])([a-z_]+(?:\.py|/))(?![\w])", doc))
    missing = sorted(n for n in named if n not in files and not (REPO / n).exists())
    assert not missing, f"docs/architecture.md names {missing}, which do not exist"


def test_nothing_imports_builds_private_names() -> None:
    """The pipeline object is build's interface: no module, test or benchmark reaches past it."""
    pattern = re.compile(r"(?:from\s+(?:otaku_ctx|\.+)?\.?build\s+import[^\n]*\b_[a-z]\w*|\bbuild\._[a-z]\w*)")
    sources = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]
    found = [str(p.relative_to(REPO)) for p in sources if p.name != "build.py" and pattern.search(p.read_text("utf-8"))]
    found = [f for f in found if f != "tests/test_layout.py"]
    assert not found, f"{found} import private names of otaku_ctx.build"


def test_every_test_a_benchmark_or_script_names_still_exists() -> None:
    """A test renamed under a benchmark's list (`tests/x.py::test_y`) fails here, in a minute,
    not in CI's smoke step an hour in."""
    sources = [*(REPO / "benchmarks").rglob("*.py"), *(REPO / "benchmarks").rglob("*.sh"), REPO / ".ci" / "run"]
    named = {
        (path, test)
        for source in sources
        if source.is_file()
        for path, test in re.findall(r"(tests/[\w/]+\.py)::(\w+)", source.read_text("utf-8"))
    }
    assert named, "no benchmark names a test: the pattern no longer reads them"
    missing = sorted(
        f"{path}::{test}"
        for path, test in named
        if not re.search(rf"^(?:async )?def {test}\(", (REPO / path).read_text("utf-8"), re.MULTILINE)
    )
    assert not missing, f"benchmarks name tests that are gone: {missing}"


if __name__ == "__main__":
    print(stage_table(), end="")
