"""model/ imports one way: the file readers, then the vocabulary llama.cpp makes of a GGUF, then
the counters built from it (issue 41; docs/model.md). Imports inside functions count: a lazy
import that closes a circle is still a circle.

Checked on the source, with `ast`: no cycle among model/'s modules; nothing outside model/
imports a private name of it, nor takes from `model.hf` (the counters) what the vocabulary
layer owns; and each llama.cpp rule is written in one module only.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "otaku_ctx"
MODEL = PACKAGE / "model"
# Where code outside model/ may import it from: the package, the tests and the benchmarks.
OUTSIDE = [p for root in (PACKAGE, REPO / "tests", REPO / "benchmarks") for p in sorted(root.rglob("*.py"))]
OUTSIDE = [p for p in OUTSIDE if MODEL not in p.parents and "configs" not in p.parts]
# What the vocabulary layer owns, by the names it had in hf.py before it was one (they must
# not be taken from the counters' module), and by the names its modules define now.
VOCABULARY_MODULES = ("vocab", "llamacpp")
OLD_VOCABULARY_NAMES = {"gguf_controls", "llama_cpp_vocabulary", "llama_cpp_types", "PRE_TOKENIZERS", "PreTokenizer"}
# Rules written once: each assigned at the top of one module only, model/ and tokens.py.
RULES = ("LOOK_BEHIND", "SPACE", "UNKNOWN_BYTE", "NORMAL", "CONTROL", "USER_DEFINED", "UNKNOWN", "BYTE")


def module_of(path: Path) -> str:
    """The dotted name of a module file: otaku_ctx/model/hf.py -> otaku_ctx.model.hf."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # two tests read every file of the package, the tests and the benchmarks
def imports(path: Path) -> tuple[tuple[str, str], ...]:
    """(module, name) for every name `path` imports, anywhere in it (functions too); a plain
    `import a.b` is (a.b, ""). Relative imports are made absolute."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found += [(module, alias.name) for alias in node.names]
    return tuple(found)


def model_modules() -> dict[str, Path]:
    return {module_of(p): p for p in sorted(MODEL.glob("*.py"))}


def test_no_module_of_model_imports_in_a_circle() -> None:
    known = model_modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for module, imported in imports(path):
            if module in known:
                edges.add(module)
            if f"{module}.{imported}" in known:  # `from . import gguf`: the module itself
                edges.add(f"{module}.{imported}")
        graph[name] = edges - {name}
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"model/ imports in a circle: {' -> '.join(exc.args[1])}") from None
    assert set(order) == set(known)


def test_nothing_outside_model_imports_its_private_names() -> None:
    found = [
        f"{path.relative_to(REPO)}: {name} from {module}"
        for path in OUTSIDE
        for module, name in imports(path)
        if module.startswith("otaku_ctx.model") and name.startswith("_")
    ]
    assert not found, found


def test_nothing_outside_model_takes_the_vocabulary_from_the_counters() -> None:
    """The vocabulary (its control tokens, its pre-tokenizers, its types) is the vocabulary
    layer's: render/formats/gguf.py and the rest import it from there, never from model.hf."""
    owned = set(OLD_VOCABULARY_NAMES)
    for stem in VOCABULARY_MODULES:
        if (MODEL / f"{stem}.py").is_file():
            owned |= top_level_names(MODEL / f"{stem}.py")
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in OUTSIDE
        for module, name in imports(path)
        if module == "otaku_ctx.model.hf" and name in owned
    ]
    assert not found, found


def test_each_rule_is_written_in_one_module() -> None:
    places: dict[str, list[str]] = {}
    for path in [*sorted(MODEL.glob("*.py")), PACKAGE / "tokens.py"]:
        for name in top_level_names(path, assigned_only=True):
            if name in RULES:
                places.setdefault(name, []).append(path.name)
    twice = {name: where for name, where in places.items() if len(where) > 1}
    assert not twice, twice


def top_level_names(path: Path, *, assigned_only: bool = False) -> set[str]:
    """The names a module defines at its top: constants, and (unless `assigned_only`) its
    functions and classes. Private ones are left out."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef) and not assigned_only:
            names.add(node.name)
        for target in targets:
            elements = target.elts if isinstance(target, ast.Tuple) else [target]
            names |= {e.id for e in elements if isinstance(e, ast.Name)}
    return {name for name in names if not name.startswith("_")}
