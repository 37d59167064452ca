"""Compiling: the parse tree into a program, checking helpers, arguments, paths and role blocks.

No Python is ever generated from template text: the tree becomes a program of plain data
(lists, strings, numbers; see `program`), which the runtime links into closures.
Importing this module imports pybars3 (through `grammar`): only do it to parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TemplateError
from .check import Checker, line_column, stache
from .parse import build
from .program import MOST_UP, DamagedProgram, link
from .runtime import BLOCK_HELPERS, INLINE_HELPERS, ROLE_HELPERS, Template


@dataclass(frozen=True)
class _Path:
    depth: int  # how many `../`
    data: bool  # an `@name`
    scoped: bool  # `this.x` / `./x`: never a helper or block param
    parts: tuple[str, ...]
    written: str  # as in the template, for messages


class _Builder:
    """Turns the parse tree into a program (see `program`), checking helpers and their arguments."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source

    def where(self, offset: int) -> tuple[int, int]:
        return line_column(self.source, offset)

    def error(self, offset: int, message: str) -> TemplateError:
        line, column = self.where(offset)
        return TemplateError(self.name, line, column, message)

    # scopes: names of the block params in force, innermost `as |...|` first
    def program(self, template: list, scopes: tuple, role_at: int | None) -> list:
        steps: list = []
        text: list[str] = []
        for node in template[1:]:
            if node[0] in ("literal", "newline", "whitespace"):
                text.append(node[1])
                continue
            if text:
                steps.append(["text", "".join(text)])
                text = []
            step = self.command(node[1], node[2], scopes, role_at)
            if step is not None:
                steps.append(step)
        if text:
            steps.append(["text", "".join(text)])
        return steps

    def command(self, at: int, node: tuple, scopes: tuple, role_at: int | None) -> list | None:
        kind = node[0]
        if kind == "comment":
            return None
        if kind in ("expand", "escapedexpand"):
            return self.mustache(at, node[1], node[2], scopes)
        if kind in ("block", "invertedblock"):
            return self.block(at, node, scopes, role_at)
        if kind == "partial":
            raise self.error(at, "partials are not supported: paste the text into the template")
        raise self.error(at, "raw blocks are not supported: remove the extra braces")

    def mustache(self, at: int, path_node: tuple, args: list, scopes: tuple) -> list:
        """`{{name}}`, `{{path.to.value}}`, `{{helper arg ...}}`; `{{{...}}}` is the same (no escaping)."""
        path = self.path(at, path_node)
        helper = self.helper_name(path, scopes)
        if args or helper is not None:
            if helper is None or helper in BLOCK_HELPERS:
                raise self.unknown_helper(at, path, helper)
            if helper == "trim":
                self.check_arity(at, helper, args)
                return ["trim"]
            return ["print", self.call(at, helper, args, scopes)]
        return ["print", self.reference(path, scopes)]

    def helper_name(self, path: _Path, scopes: tuple) -> str | None:
        """The helper a path names: a single plain segment that no block param shadows."""
        if path.depth or path.data or path.scoped or len(path.parts) != 1:
            return None
        name = path.parts[0]
        if _find_param(scopes, name) is not None:
            return None
        return name if name in INLINE_HELPERS or name in BLOCK_HELPERS else None

    def unknown_helper(self, at: int, path: _Path, helper: str | None) -> TemplateError:
        if helper is not None:
            return self.error(
                at, f"`{helper}` is a block helper: write {stache('#' + helper + ' ...')}...{stache('/' + helper)}"
            )
        known = ", ".join(name for name in INLINE_HELPERS if name != "trim")
        shown = path.written
        return self.error(
            at,
            f"unknown helper `{shown}`: only {known} take arguments; to print a value write {stache(shown)} alone",
        )

    def check_arity(self, at: int, helper: str, args: list) -> None:
        fewest, most = INLINE_HELPERS[helper]
        if any(arg[0] == "kwparam" for arg in args):
            raise self.error(at, f"`{helper}` takes no key=value options: pass plain arguments")
        if len(args) < fewest or (most is not None and len(args) > most):
            if helper == "trim":
                wanted = "no arguments: write {{trim}}"
            elif most is None:
                wanted = f"at least {fewest} argument(s)"
            else:
                wanted = f"{fewest} argument(s)"
            raise self.error(at, f"`{helper}` takes {wanted}, not {len(args)}")

    def call(self, at: int, helper: str, args: list, scopes: tuple) -> list:
        self.check_arity(at, helper, args)
        line, column = self.where(at)
        return ["call", helper, [self.value(at, arg, scopes) for arg in args], line, column]

    def value(self, at: int, arg: tuple, scopes: tuple) -> list:
        kind = arg[0]
        if kind == "literalparam":
            return ["const", arg[1]]
        if kind == "path":
            return self.reference(self.path(at, arg), scopes)
        if kind == "subexpr":
            path = self.path(at, arg[1])
            helper = self.helper_name(path, scopes)
            if helper == "trim":
                raise self.error(at, "{{trim}} stands alone: it cannot be used inside ( )")
            if helper is None or helper in BLOCK_HELPERS:
                raise self.unknown_helper(at, path, helper)
            return self.call(at, helper, arg[2], scopes)
        raise self.error(at, "key=value options are not supported: pass plain arguments")

    def path(self, at: int, node: tuple) -> _Path:
        """Normalise pybars' path segments: `../` levels, `@data`, `this`/`./`, then the keys."""
        tokens = list(node[1])
        written = "".join(_token_text(token) for token in tokens)

        def invalid(why: str) -> TemplateError:
            shown = written if len(written) <= 60 else f"{written[:30]}…{written[-20:]}"
            return self.error(at, f"invalid path `{shown}`: {why}")

        index, depth, data, scoped = 0, 0, False, False
        if tokens and tokens[0] == ("dataup",):
            data, depth, index = True, 1, 1
        while index < len(tokens) and tokens[index] == ("up",):
            depth, index = depth + 1, index + 1
        if index < len(tokens) and tokens[index] in (("sym", "this"), ("sep",)):
            scoped, index = True, index + 1
            if index < len(tokens) and tokens[index] == ("sep",):
                index += 1
        parts: list[str] = []
        expect_key = True
        for token in tokens[index:]:
            if expect_key and token[0] in ("sym", "lit"):
                key = token[1]
                if token[0] == "sym" and key.startswith("@"):
                    if parts or data or depth or scoped or len(key) == 1:
                        raise invalid("`@` only starts a data name such as @index or @root")
                    data, key = True, key[1:]
                elif token[0] == "sym" and ("@" in key or key == "this"):
                    raise invalid("`@` and `this` may only start a path")
                parts.append(key)
                expect_key = False
            elif not expect_key and token == ("sep",):
                expect_key = True
            else:
                raise invalid("write keys joined by dots, `../` only at the start, e.g. ../postHistory.targetIndex")
        if parts and expect_key:
            raise invalid("it ends with a separator")
        if data and not parts:
            raise invalid("name the data value, e.g. @index")
        if depth > MOST_UP:
            raise invalid(f"it climbs {depth} levels; a path climbs at most {MOST_UP} (`../`)")
        return _Path(depth, data, scoped, tuple(parts), written)

    def reference(self, path: _Path, scopes: tuple) -> list:
        """How a path is looked up: `@data`, a block param, one key of the context, or a walk."""
        parts, depth = list(path.parts), path.depth
        if path.data:
            return ["data", depth, parts]
        slot = None if depth or path.scoped or not parts else _find_param(scopes, parts[0])
        if slot is not None:
            level, position = slot
            return ["param", level, position, parts[1:]]
        if depth == 0 and len(parts) == 1:
            return ["key", parts[0]]
        return ["path", depth, parts]

    def block(self, at: int, node: tuple, scopes: tuple, role_at: int | None) -> list:
        kind, name, args, params, body, alternative, path_node = node
        inverted = kind == "invertedblock"
        if name is None or name not in BLOCK_HELPERS or _find_param(scopes, name) is not None:
            return self.section(at, node, scopes, role_at)
        if name in ROLE_HELPERS:
            return self.role_block(at, name, args, params, body, alternative, inverted, scopes, role_at)
        if name in INLINE_HELPERS:
            raise self.error(
                at, f"`{name}` is not a block helper: use it inside one, e.g. {stache('#if (' + name + ' ...)')}"
            )
        if any(arg[0] == "kwparam" for arg in args):
            raise self.error(at, f"`{name}` takes no key=value options")
        if len(args) != 1:
            raise self.error(at, f"{stache('#' + name)} takes exactly one argument, not {len(args)}")
        most_params = {"each": 2, "with": 1}.get(name, 0)
        if len(params) > most_params:
            allowed = {2: "as |item index|", 1: "as |value|", 0: "no `as |...|` block params"}[most_params]
            raise self.error(at, f"{stache('#' + name)} takes {allowed}")
        if len(set(params)) != len(params):
            raise self.error(at, "block params must have different names")
        if params and inverted:
            raise self.error(at, f"block params need {stache('#' + name)}, not {stache('^' + name)}")
        get = self.value(at, args[0], scopes)
        inner_scopes = (tuple(params), *scopes) if params else scopes
        fn = self.program(body, inner_scopes, role_at)
        inverse = self.program(alternative, scopes, role_at) if alternative else []
        if inverted:
            fn, inverse = inverse, fn
        if name == "if":
            return ["if", get, fn, inverse]
        if name == "unless":
            return ["if", get, inverse, fn]
        return [name, get, fn, inverse, bool(params)]

    def section(self, at: int, node: tuple, scopes: tuple, role_at: int | None) -> list:
        """`{{#person}}`...`{{/person}}`, `{{^list}}`: a Mustache section over a value, as
        Handlebars.js' `blockHelperMissing` runs it (see `runtime.section_step`)."""
        kind, name, args, params, body, alternative, path_node = node
        path = self.path(at, path_node)
        if name in INLINE_HELPERS and self.helper_name(path, scopes) is not None:
            raise self.error(
                at, f"`{name}` is not a block helper: use it inside one, e.g. {stache('#if (' + name + ' ...)')}"
            )
        if args or params:
            raise self.error(
                at,
                f"unknown block helper {stache('#' + path.written)}: the block helpers are {', '.join(BLOCK_HELPERS)}"
                " (a section over a value takes no arguments)",
            )
        fn = self.program(body, scopes, role_at)
        inverse = self.program(alternative, scopes, role_at) if alternative else []
        if kind == "invertedblock":
            fn, inverse = inverse, fn
        return ["section", self.reference(path, scopes), fn, inverse]

    def role_block(self, at, name, args, params, body, alternative, inverted, scopes, role_at) -> list:
        """`{{#systemBlock}}`...: no arguments, no else, never inside another role block."""
        if inverted or args or params or alternative:
            raise self.error(at, f"{stache('#' + name)} takes no arguments, block params or else: it only marks a role")
        if role_at is not None:
            line, column = self.where(role_at)
            raise self.error(
                at,
                f"{stache('#' + name)} is inside the role block opened at {line}:{column}: "
                "role blocks cannot nest, close the outer one first",
            )
        return ["role", ROLE_HELPERS[name], self.program(body, scopes, at)]


def _token_text(token: tuple) -> str:
    kind = token[0]
    if kind == "sym":
        return token[1]
    if kind == "lit":
        return "[" + token[1] + "]"
    return {"sep": ".", "up": "../", "dataup": "@../"}[kind]


def _find_param(scopes: tuple, name: str) -> tuple[int, int] | None:
    for level, names in enumerate(scopes):
        if name in names:
            return level, names.index(name)
    return None


def compile_program(source: str, name: str) -> list:
    """Compile a Handlebars template into its program (plain data, see `program`); every problem
    is a `TemplateError` naming line and column."""
    try:
        if not isinstance(source, str):
            raise TemplateError(name, None, None, f"template source must be text, not {type(source).__name__}")
        Checker(source, name).run()
        tree = build(source, name)
        return _Builder(name, source).program(tree, (), None)
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError(name, None, None, "the template nests too deeply") from None
    except Exception as exc:  # pybars/pymeta errors must not escape as tracebacks
        raise TemplateError(name, None, None, f"cannot compile the template: {exc}") from exc


def compile_template(source: str, name: str) -> Template:
    """Compile a Handlebars template now (no cache); every problem is a `TemplateError`."""
    return linked(compile_program(source, name), name)


def linked(program: list, name: str) -> Template:
    """Link a program this module just compiled; a program `link` refuses is a bug here, never
    the template's fault, and is said as one line like any template problem."""
    try:
        return link(program, name)
    except DamagedProgram as exc:
        raise TemplateError(name, None, None, f"internal error: the compiled program is invalid ({exc})") from None
