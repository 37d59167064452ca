"""A safe Handlebars engine for context templates (Serene Pub / SillyTavern style), built on pybars3.

Templates are untrusted: people share presets. So this module takes from pybars only what is
safe to take, its parser, and replaces the rest:

* **Parsing** is pybars' OMeta grammar, extended (`_GRAMMAR`, a pymeta sub-grammar) with
  block parameters (`{{#each xs as |x i|}}`, `{{#with o as |p|}}`), `{{else if ...}}` chains,
  `{{!-- --}}` comments, decimal numbers, real string values for literals, tagged path
  segments and the source offset of every tag (for errors). pybars' standalone-line
  whitespace control is reused as is.
* **No Python is generated from template text.** pybars compiles a template to Python
  source and pastes template text into it: a bracket segment such as `{{[a') or ... or (']}}`
  or a subexpression name lands inside a `u'...'` literal unescaped, which is code injection.
  Instead of patching each format string, the parse tree is compiled here into closures;
  template text only ever becomes Python *data*. pybars' `compile()` is disabled on the
  parser subclass so nobody reaches that path by accident.
* **Plain data only.** The context is copied into dicts, lists, str, int, float, bool and None
  before rendering (anything else is a `TemplateError`), and paths only index dicts by key
  and lists by integer index (plus `length`). There is no `getattr` and nothing is ever
  called, so `{{name.__class__}}` or `{{s.upper}}` render as empty text.
* **No HTML escaping**: `{{x}}` and `{{{x}}}` both print the raw value (prompts are not HTML).
* **Role blocks** (`{{#systemBlock}}`, `{{#userBlock}}`, `{{#assistantBlock}}`) emit marker
  *objects* into the output stream, not text, so story text can never forge a block boundary.
  Role blocks may not nest (a `TemplateError` at compile time).

Semantics follow Handlebars.js 4: `if` treats None, False, 0, "", [] (and NaN) as false but
an empty object as true; `../` climbs one *context* (blocks that keep the context, like `if`,
add no level); a block parameter is looked up for a plain first path segment (`msgIndex`,
`item.name`), never for `this.x`, `./x` or `../x`. Partials, raw blocks, decorators and
`key=value` hash arguments are not supported and fail to compile with a message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pybars import Compiler
from pymeta.runtime import ParseError

from .blocks import Block
from .errors import TemplateError
from .model import Role

__all__ = ["Template", "compile_template"]

ROLE_HELPERS: dict[str, Role] = {"systemBlock": "system", "userBlock": "user", "assistantBlock": "assistant"}
BLOCK_HELPERS = ("if", "unless", "each", "with", *ROLE_HELPERS)
# name -> (fewest, most arguments; None = any number)
INLINE_HELPERS: dict[str, tuple[int, int | None]] = {
    "eq": (2, 2),
    "ne": (2, 2),
    "gt": (2, 2),
    "lt": (2, 2),
    "and": (1, None),
    "or": (1, None),
    "not": (1, 1),
    "json": (1, 1),
    "lookup": (2, 2),
    "trim": (0, 0),
}


# --- parsing: pybars' grammar, extended -------------------------------------------------------


def _number(sign: str | None, digits: list[str], fraction: list[str] | None) -> int | float:
    whole = (sign or "") + "".join(digits)
    return float(whole + "." + "".join(fraction)) if fraction else int(whole)


# Rules redefined or added on top of pybars' `handlebars_grammar`; all others are inherited.
# Tree shapes produced (and consumed by `_Builder`):
#   ('at', offset, command)                       every tag, with its offset in the parsed text
#   ('block'|'invertedblock', name, args, block_params, body, else_body)
#   ('escapedexpand'|'expand', ('path', segments), args)
#   ('path', [('sym'|'lit', text) | ('sep',) | ('up',) | ('dataup',) ...])
#   ('literalparam', str | int | float | bool | None), ('subexpr', path, args), ('kwparam', k, v)
_GRAMMAR = r"""
templatecommand ::= ~<elsetag> !(self.input.position):pos
    (<blockrule> | <comment> | <escapedexpression> | <expression> | <partial> | <rawblock>):cmd
    => ('at', pos, cmd)
elsetag ::= <start> <spaces> ('e' 'l' 's' 'e' (<space> | <finish>) | '^' <spaces> <finish>)
comment ::= <start> '!' '-' '-' (~('-' '-' <finish>) <anything>)* '-' '-' <finish> => ('comment',)
    | <start> '!' (~<finish> <anything>)* <finish> => ('comment',)
blockrule ::= <start> '#' <block_inner>:i <template>:t <alttemplate>:alt <symbolfinish i[0]>
        => ('block', i[0], i[1], i[2], t, alt)
    | <start> '^' <block_inner>:i <template>:t <alttemplate>:alt <symbolfinish i[0]>
        => ('invertedblock', i[0], i[1], i[2], t, alt)
block_inner ::= <spaces> <symbol>:s <blockargs>:args <blockparams>?:bp <spaces> <finish>
    => (s, args, bp or [])
blockargs ::= (~<blockparams> <space>+ <argument>)*:args => args
blockparams ::= <space>+ 'a' 's' <space>+ '|' <spaces> <bpname>:first (<space>+ <bpname>)*:rest <spaces> '|'
    => [first] + rest
bpname ::= (<letterOrDigit> | '-')+:cs => ''.join(cs)
alttemplate ::= !(self.input.position):pos <start> <spaces> 'e' 'l' 's' 'e' <space>+ <block_inner>:i
        <template>:t <alttemplate>:alt
        => ['template', ('at', pos, ('block', i[0], i[1], i[2], t, alt))]
    | <start> <alt_inner> <template>:t => t
    | => []
arguments ::= (<space>+ <argument>)*:args => args
argument ::= <kwliteral> | <literal> | <path> | <subexpression>
symbol ::= ~<alt_inner> (<letterOrDigit> | '-' | '@')+:cs => ''.join(cs)
pathseg ::= '[' <notclosebracket>+:cs ']' => ('lit', ''.join(cs))
    | '@' '.' '.' '/' => ('dataup',)
    | <symbol>:s => ('sym', s)
    | '.' '.' '/' => ('up',)
    | '.' '.' => ('up',)
    | '.' => ('sep',)
    | '/' => ('sep',)
literal ::= (<string> | <number> | <boolean> | <null> | <undefined>):v ~<pathchar> => ('literalparam', v)
pathchar ::= <letterOrDigit> | '-' | '@' | '.' | '/' | '['
string ::= '"' (<escapedquote> | ~('"') <anything>)*:cs '"' => ''.join(cs)
    | '\'' (<escapedquote> | ~('\'') <anything>)*:cs '\'' => ''.join(cs)
escapedquote ::= '\\' '"' => '"'
    | '\\' '\'' => "'"
number ::= '-'?:sign <adigit>+:ds ('.' <adigit>+:fs => fs)?:frac => _number(sign, ds, frac)
adigit ::= :c ?(c in '0123456789') => c
"""


class _Parser(Compiler):
    """pybars' parser and whitespace control with `_GRAMMAR` on top; its code generator is off."""

    _handlebars = Compiler._handlebars.makeGrammar(_GRAMMAR, {"_number": _number}, "otaku_handlebars")

    def parse(self, source: str) -> tuple[list, str, int]:
        """The tree, the whitespace-controlled text it was parsed from, and how far parsing got."""
        text = self.whitespace_control(source)
        grammar = self._handlebars(text)
        tree, _ = grammar.apply("template")
        return tree, text, grammar.input.position

    def accepts(self, rule: str, text: str) -> bool:
        """Whether `rule` matches all of `text` (used to check one tag at a time)."""
        grammar = self._handlebars(text)
        try:
            grammar.apply(rule)
        except ParseError:
            return False
        return grammar.input.position == len(text)

    def compile(self, source: str, path: str | None = None) -> Any:
        raise NotImplementedError("pybars' code generator pastes template text into Python; use compile_template")

    precompile = compile


_PARSER = _Parser()


# --- checking tags one by one, for errors that name the right line --------------------------


def _stache(text: str) -> str:
    return "{{" + text + "}}"


@dataclass(frozen=True)
class _Tag:
    start: int
    text: str  # the whole tag as written
    core: str  # between the braces, without '~', '{'/'&' and outer spaces


@dataclass
class _Open:
    name: str
    tag: _Tag
    seen_else: bool = False


_COMMENT_END = re.compile(r"--~?\}\}")
_BLOCK_NAME = re.compile(r"[\w@-]+")
_ELSE = re.compile(r"else(?=\s|$)")


class _Checker:
    """Reads the source tag by tag before the grammar runs.

    The grammar only says where parsing stopped (often an outer block); this says which tag
    is wrong and why: a tag that does not parse, a block that is never closed or closed by the
    wrong name, an `{{else}}` outside a block, and the features we refuse (partials, raw blocks).
    """

    def __init__(self, source: str, name: str) -> None:
        self.source = source
        self.name = name

    def error(self, offset: int, message: str) -> TemplateError:
        line, column = _line_column(self.source, offset)
        return TemplateError(self.name, line, column, message)

    def run(self) -> None:
        stack: list[_Open] = []
        for tag in self.tags():
            self.check(tag, stack)
        if stack:
            opened = stack[-1]
            raise self.error(
                opened.tag.start,
                f"{opened.tag.text} is never closed: add {_stache('/' + opened.name)} where the block ends",
            )

    def tags(self):
        source, position = self.source, 0
        while (start := source.find("{{", position)) != -1:
            if source.startswith("{{{{", start):
                raise self.error(start, "raw blocks ({{{{name}}}}) are not supported: remove the extra braces")
            head = source[start + 2 : start + 6].lstrip("~")
            if head.startswith("!--"):
                end = _COMMENT_END.search(source, start + 5)
                if end is None:
                    raise self.error(start, "this {{!-- comment is never closed: end it with --}}")
                position = end.end()
                continue
            if head.startswith("!"):
                end = source.find("}}", start + 3)
                if end == -1:
                    raise self.error(start, "this {{! comment is never closed: end it with }}")
                position = end + 2
                continue
            position = self.tag_end(start)
            text = source[start:position]
            core = text[2:-2].strip("~").strip()
            if text.startswith("{{{"):
                core = core[1:-1].strip("~").strip()
            elif core.startswith("&"):
                core = core[1:].strip()
            yield _Tag(start, text, core)

    def tag_end(self, start: int) -> int:
        """Offset just past the tag opened at `start`, skipping "strings" and [segments]."""
        source, index = self.source, start + 2
        triple = source.startswith("{{{", start)
        closers = {'"': '"', "'": "'", "[": "]"}
        while index < len(source):
            char = source[index]
            if char in closers:
                close = source.find(closers[char], index + 1)
                if char != "[":
                    while close != -1 and source[close - 1] == "\\":
                        close = source.find(closers[char], close + 1)
                if close == -1:
                    break
                index = close + 1
            elif source.startswith("}}", index):
                if not triple:
                    return index + 2
                if source.startswith("}}}", index):
                    return index + 3
                raise self.error(start, "a tag opened with {{{ must be closed with }}}")
            else:
                index += 1
        raise self.error(start, "this tag is never closed: end it with }} (check for an unclosed quote or '[')")

    def check(self, tag: _Tag, stack: list[_Open]) -> None:
        core = tag.core
        if core.startswith(">"):
            raise self.error(tag.start, f"partials are not supported ({tag.text}): paste the text into the template")
        if core.startswith(("*", "#*", "#>")):
            raise self.error(tag.start, f"{tag.text}: decorators and partial blocks are not supported")
        if core.startswith("/"):
            self.close(tag, core[1:].strip(), stack)
        elif core == "^" or _ELSE.match(core):
            rest = "" if core == "^" else core[4:].strip()
            if not stack:
                raise self.error(
                    tag.start, f"{tag.text} is outside any block: it belongs between {{{{#if}}}} and {{{{/if}}}}"
                )
            opened = stack[-1]
            if opened.seen_else:
                raise self.error(
                    tag.start, f"{tag.text} follows an {{{{else}}}} of the same block: a block has one final else"
                )
            opened.seen_else = not rest
            if rest and not _PARSER.accepts("block_inner", rest + "}}"):
                raise self.error(tag.start, f"cannot read {tag.text}: write it as {{{{else if condition}}}}")
        elif core.startswith(("#", "^")):
            rest = core[1:].strip()
            match = _BLOCK_NAME.match(rest)
            if match is None or not _PARSER.accepts("block_inner", rest + "}}"):
                raise self.error(
                    tag.start,
                    f"cannot read {tag.text}: a block opens as {{{{#name argument}}}}, "
                    "with block params written `as |item index|` at the end",
                )
            stack.append(_Open(match.group(0), tag))
        elif not _PARSER.accepts("expression_inner", core + "}}"):
            raise self.error(
                tag.start,
                f"cannot read {tag.text}: expected a path such as {{{{name}}}} or a helper call such as "
                '{{eq role "user"}} (check quotes, parentheses and spaces)',
            )

    def close(self, tag: _Tag, name: str, stack: list[_Open]) -> None:
        if not stack:
            raise self.error(tag.start, f"{tag.text} closes a block that was never opened: remove it")
        opened = stack[-1]
        if name != opened.name:
            line, column = _line_column(self.source, opened.tag.start)
            raise self.error(
                tag.start,
                f"{tag.text} does not match {opened.tag.text} opened at {line}:{column}: "
                f"close that block first with {_stache('/' + opened.name)}",
            )
        stack.pop()


def _line_column(source: str, offset: int) -> tuple[int, int]:
    line_start = source.rfind("\n", 0, offset) + 1
    return source.count("\n", 0, offset) + 1, offset - line_start + 1


def _origins(original: str, parsed: str) -> list[int]:
    """Map each offset of the whitespace-controlled text back to the original source.

    Whitespace control only deletes characters (spaces, newlines, '~'), so `parsed` is a
    subsequence of `original`; the greedy alignment is exact for every '{', i.e. every tag.
    """
    origins, index = [], 0
    for char in parsed:
        index = original.find(char, index)
        if index == -1:  # cannot happen; degrade to approximate positions rather than fail
            return list(range(len(parsed))) + [len(original)]
        origins.append(index)
        index += 1
    origins.append(len(original))
    return origins


# --- runtime: plain data, frames, helpers -----------------------------------------------------


def _to_plain(value: Any, where: str, name: str, seen: frozenset[int] = frozenset()) -> Any:
    """Copy `value` into plain data (dict/list/str/int/float/bool/None) or refuse it."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            raise TemplateError(name, None, None, f"context value at {where} contains itself")
        seen = seen | {id(value)}
        if isinstance(value, Mapping):
            plain = {}
            for key, item in value.items():
                if not isinstance(key, str | int) or isinstance(key, bool):
                    raise TemplateError(name, None, None, f"context key {key!r} at {where} is not a string")
                text = str.__str__(key) if isinstance(key, str) else str(int.__int__(key))
                plain[text] = _to_plain(item, f"{where}.{text}", name, seen)
            return plain
        return [_to_plain(item, f"{where}[{index}]", name, seen) for index, item in enumerate(value)]
    raise TemplateError(
        name,
        None,
        None,
        f"context value at {where} is a {type(value).__name__}: templates only see dicts, lists, "
        "strings, numbers, booleans and None (convert it before rendering)",
    )


def _pick(value: Any, key: str) -> Any:
    """One path step: a dict by key, a list by index (or `length`), a string's `length`; else None."""
    kind = type(value)
    if kind is dict:
        return value.get(key)
    if kind is list:
        if key == "length":
            return len(value)
        if key.isascii() and key.isdigit():
            index = int(key)
            return value[index] if index < len(value) else None
        return None
    if kind is str and key == "length":
        return len(value)
    return None


def _walk(value: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if value is None:
            return None
        value = _pick(value, key)
    return value


def _truthy(value: Any) -> bool:
    """Handlebars' `if`: None, False, 0, "", [] and NaN are false; an empty object is true."""
    kind = type(value)
    if kind is dict:
        return True
    if kind is float and math.isnan(value):
        return False
    return bool(value)


def _is_empty(value: Any) -> bool:
    """Handlebars' `isEmpty` (used by `with`): None, False, "", [] and NaN, but not 0."""
    if value is None or value is False:
        return True
    kind = type(value)
    if kind is str or kind is list:
        return not value
    return kind is float and math.isnan(value)


def _display(value: Any) -> str:
    """What `{{x}}` prints, as Handlebars.js would (but never HTML-escaped)."""
    kind = type(value)
    if kind is str:
        return value
    if value is None:
        return ""
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if kind is list:
        return ",".join(_display(item) for item in value)
    return "[object Object]"


def _eq(left: Any, right: Any) -> bool:
    if (type(left) is bool) != (type(right) is bool):  # like ===: true is not 1
        return False
    return left == right


def _comparable(left: Any, right: Any) -> bool:
    numbers = (int, float)
    return (type(left) in numbers and type(right) in numbers) or (type(left) is str and type(right) is str)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _lookup(value: Any, key: Any) -> Any:
    if type(key) is int:
        key = str(key)
    return _pick(value, key) if type(key) is str else None


_HELPER_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "eq": _eq,
    "ne": lambda left, right: not _eq(left, right),
    "gt": lambda left, right: _comparable(left, right) and left > right,
    "lt": lambda left, right: _comparable(left, right) and left < right,
    "and": lambda *values: all(_truthy(value) for value in values),
    "or": lambda *values: any(_truthy(value) for value in values),
    "not": lambda value: not _truthy(value),
    "json": _json,
    "lookup": _lookup,
}

_PARENT_DATA = " parent"  # a key no `@name` path can spell (names have no spaces)


class _Frame:
    """Where a block body runs: its context, the frame `../` reaches, `@data` and block params."""

    __slots__ = ("context", "parent", "data", "params")

    def __init__(self, context: Any, parent: _Frame | None, data: dict, params: tuple | None) -> None:
        self.context = context
        self.parent = parent
        self.data = data
        self.params = params  # (values of the innermost `as |...|`, outer params) or None

    def enter(self, context: Any, data: dict | None = None, params: tuple | None = None) -> _Frame:
        """A child frame; as in Handlebars 4, `../` gains a level only when the context changes."""
        parent = self.parent if context is self.context else self
        return _Frame(context, parent, self.data if data is None else data, self.params if params is None else params)


# Items of the output stream that are not text. Rendered values are always `str`, so no data
# can ever produce one of these: story text cannot open, close or trim a block.
_TRIM = object()
_ROLE_END = object()


@dataclass(frozen=True)
class _RoleStart:
    role: Role


_ROLE_START = {role: _RoleStart(role) for role in ROLE_HELPERS.values()}

_LEADING_NEWLINES = re.compile(r"\A(?:\r?\n)+")
_TRAILING_NEWLINES = re.compile(r"(?:\r?\n)+\Z")


def _join_trimmed(pieces: list) -> str:
    """Join text pieces; around each `{{trim}}` drop every adjacent newline (SillyTavern's trim)."""
    if _TRIM not in pieces:
        return "".join(pieces)
    runs: list[str] = [""]
    for piece in pieces:
        if piece is _TRIM:
            runs.append("")
        else:
            runs[-1] += piece
    last = len(runs) - 1
    for index, run in enumerate(runs):
        if index > 0:
            run = _LEADING_NEWLINES.sub("", run)
        if index < last:
            run = _TRAILING_NEWLINES.sub("", run)
        runs[index] = run
    return "".join(runs)


def _assemble(stream: list) -> list[Block]:
    """Cut the output stream at role block edges into `Block`s.

    Text inside a role block belongs to it, even if empty (an empty assistant block can be the
    turn the model continues). Loose text becomes a system block unless it is only whitespace.
    Every block loses its leading and trailing newlines, not its spaces; nothing is merged.
    """
    blocks: list[Block] = []
    pieces: list = []
    role: Role = "system"  # loose text, outside any role block, is system text
    for item in stream:
        if type(item) is str or item is _TRIM:
            pieces.append(item)
            continue
        text = _join_trimmed(pieces).strip("\r\n")
        pieces = []
        if item is _ROLE_END:
            blocks.append(Block(role, text))
            role = "system"
        else:
            if text.strip():
                blocks.append(Block("system", text))
            role = item.role
    text = _join_trimmed(pieces).strip("\r\n")
    if text.strip():
        blocks.append(Block("system", text))
    return blocks


# --- compiling the tree into closures --------------------------------------------------------

Getter = Callable[[_Frame], Any]
Step = Callable[[_Frame, list], None]


def _nothing(frame: _Frame, out: list) -> None:
    return None


@dataclass(frozen=True)
class _Path:
    depth: int  # how many `../`
    data: bool  # an `@name`
    scoped: bool  # `this.x` / `./x`: never a helper or block param
    parts: tuple[str, ...]
    written: str  # as in the template, for messages


class _Builder:
    """Turns the parse tree into nested closures, checking helpers and their arguments."""

    def __init__(self, name: str, source: str, origins: list[int]) -> None:
        self.name = name
        self.source = source
        self.origins = origins

    def where(self, offset: int) -> tuple[int, int]:
        return _line_column(self.source, self.origins[min(offset, len(self.origins) - 1)])

    def error(self, offset: int, message: str) -> TemplateError:
        line, column = self.where(offset)
        return TemplateError(self.name, line, column, message)

    # scopes: names of the block params in force, innermost `as |...|` first
    def program(self, template: list, scopes: tuple, role_at: int | None) -> Step:
        steps: list[Step] = []
        text: list[str] = []
        for node in template[1:]:
            if node[0] in ("literal", "newline", "whitespace"):
                text.append(node[1])
                continue
            if text:
                steps.append(_text_step("".join(text)))
                text = []
            step = self.command(node[1], node[2], scopes, role_at)
            if step is not None:
                steps.append(step)
        if text:
            steps.append(_text_step("".join(text)))
        if not steps:
            return _nothing
        if len(steps) == 1:
            return steps[0]
        steps_tuple = tuple(steps)

        def run(frame: _Frame, out: list) -> None:
            for step in steps_tuple:
                step(frame, out)

        return run

    def command(self, at: int, node: tuple, scopes: tuple, role_at: int | None) -> Step | None:
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

    def mustache(self, at: int, path_node: tuple, args: list, scopes: tuple) -> Step:
        """`{{name}}`, `{{path.to.value}}`, `{{helper arg ...}}`; `{{{...}}}` is the same (no escaping)."""
        path = self.path(at, path_node)
        helper = self.helper_name(path, scopes)
        if args or helper is not None:
            if helper is None or helper in BLOCK_HELPERS:
                raise self.unknown_helper(at, path, helper)
            if helper == "trim":
                self.check_arity(at, helper, args)
                return _trim_step
            get = self.call(at, helper, args, scopes)
        else:
            get = self.getter(path, scopes)

        def expand(frame: _Frame, out: list) -> None:
            out.append(_display(get(frame)))

        return expand

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
                at, f"`{helper}` is a block helper: write {_stache('#' + helper + ' ...')}...{_stache('/' + helper)}"
            )
        known = ", ".join(name for name in INLINE_HELPERS if name != "trim")
        shown = path.written
        return self.error(
            at,
            f"unknown helper `{shown}`: only {known} take arguments; to print a value write {_stache(shown)} alone",
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

    def call(self, at: int, helper: str, args: list, scopes: tuple) -> Getter:
        self.check_arity(at, helper, args)
        function = _HELPER_FUNCTIONS[helper]
        getters = tuple(self.value(at, arg, scopes) for arg in args)
        name = self.name
        line, column = self.where(at)

        def get(frame: _Frame) -> Any:
            try:
                return function(*[getter(frame) for getter in getters])
            except TemplateError:
                raise
            except Exception as exc:  # a helper must never leak a traceback
                raise TemplateError(name, line, column, f"`{helper}` failed: {exc}") from exc

        return get

    def value(self, at: int, arg: tuple, scopes: tuple) -> Getter:
        kind = arg[0]
        if kind == "literalparam":
            constant = arg[1]
            return lambda frame: constant
        if kind == "path":
            path = self.path(at, arg)
            return self.getter(path, scopes)
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
            return self.error(at, f"invalid path `{written}`: {why}")

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
        return _Path(depth, data, scoped, tuple(parts), written)

    def getter(self, path: _Path, scopes: tuple) -> Getter:
        parts, depth = path.parts, path.depth
        if path.data:
            first, rest = parts[0], parts[1:]

            def get_data(frame: _Frame) -> Any:
                data: dict | None = frame.data
                for _ in range(depth):
                    data = data.get(_PARENT_DATA)
                    if data is None:
                        return None
                return _walk(data.get(first), rest)

            return get_data
        slot = None if depth or path.scoped or not parts else _find_param(scopes, parts[0])
        if slot is not None:
            level, position = slot
            rest = parts[1:]

            def get_param(frame: _Frame) -> Any:
                params = frame.params
                for _ in range(level):
                    params = params[1]
                return _walk(params[0][position], rest)

            return get_param
        if depth == 0 and len(parts) == 1:
            key = parts[0]

            def get_key(frame: _Frame) -> Any:
                context = frame.context
                return context.get(key) if type(context) is dict else _pick(context, key)

            return get_key

        def get_path(frame: _Frame) -> Any:
            reached: _Frame | None = frame
            for _ in range(depth):
                reached = reached.parent
                if reached is None:
                    return None
            return _walk(reached.context, parts)

        return get_path

    def block(self, at: int, node: tuple, scopes: tuple, role_at: int | None) -> Step:
        kind, name, args, params, body, alternative = node
        inverted = kind == "invertedblock"
        if name in ROLE_HELPERS:
            return self.role_block(at, name, args, params, body, alternative, inverted, scopes, role_at)
        if name in INLINE_HELPERS:
            raise self.error(
                at, f"`{name}` is not a block helper: use it inside one, e.g. {_stache('#if (' + name + ' ...)')}"
            )
        if name not in BLOCK_HELPERS:
            if inverted and not args and not params:  # {{^name}}...{{/name}}: a Mustache inverted section
                get = self.getter(self.path(at, ("path", [("sym", name)])), scopes)
                shown = self.program(body, scopes, role_at)
                otherwise = self.program(alternative, scopes, role_at) if alternative else _nothing
                return _if_step(get, otherwise, shown)
            raise self.error(
                at,
                f"unknown block helper {_stache('#' + name)}: the block helpers are {', '.join(BLOCK_HELPERS)}",
            )
        if any(arg[0] == "kwparam" for arg in args):
            raise self.error(at, f"`{name}` takes no key=value options")
        if len(args) != 1:
            raise self.error(at, f"{_stache('#' + name)} takes exactly one argument, not {len(args)}")
        most_params = {"each": 2, "with": 1}.get(name, 0)
        if len(params) > most_params:
            allowed = {2: "as |item index|", 1: "as |value|", 0: "no `as |...|` block params"}[most_params]
            raise self.error(at, f"{_stache('#' + name)} takes {allowed}")
        if len(set(params)) != len(params):
            raise self.error(at, "block params must have different names")
        get = self.value(at, args[0], scopes)
        inner_scopes = (tuple(params), *scopes) if params else scopes
        fn = self.program(body, inner_scopes, role_at)
        inverse = self.program(alternative, scopes, role_at) if alternative else _nothing
        if inverted:
            fn, inverse = inverse, fn
        if name == "if":
            return _if_step(get, fn, inverse)
        if name == "unless":
            return _if_step(get, inverse, fn)
        if name == "with":
            return _with_step(get, fn, inverse, bool(params))
        return _each_step(get, fn, inverse, len(params))

    def role_block(self, at, name, args, params, body, alternative, inverted, scopes, role_at) -> Step:
        """`{{#systemBlock}}`...: no arguments, no else, never inside another role block."""
        if inverted or args or params or alternative:
            raise self.error(
                at, f"{_stache('#' + name)} takes no arguments, block params or else: it only marks a role"
            )
        if role_at is not None:
            line, column = self.where(role_at)
            raise self.error(
                at,
                f"{_stache('#' + name)} is inside the role block opened at {line}:{column}: "
                "role blocks cannot nest, close the outer one first",
            )
        fn = self.program(body, scopes, at)
        start = _ROLE_START[ROLE_HELPERS[name]]

        def role(frame: _Frame, out: list) -> None:
            out.append(start)
            fn(frame, out)
            out.append(_ROLE_END)

        return role


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


def _text_step(text: str) -> Step:
    def emit(frame: _Frame, out: list) -> None:
        out.append(text)

    return emit


def _trim_step(frame: _Frame, out: list) -> None:
    out.append(_TRIM)


def _if_step(get: Getter, fn: Step, inverse: Step) -> Step:
    def run_if(frame: _Frame, out: list) -> None:
        (fn if _truthy(get(frame)) else inverse)(frame, out)

    return run_if


def _with_step(get: Getter, fn: Step, inverse: Step, named: bool) -> Step:
    def run_with(frame: _Frame, out: list) -> None:
        value = get(frame)
        if _is_empty(value):
            inverse(frame, out)
        else:
            fn(frame.enter(value, None, ((value,), frame.params) if named else None), out)

    return run_with


def _each_step(get: Getter, fn: Step, inverse: Step, param_count: int) -> Step:
    def run_each(frame: _Frame, out: list) -> None:
        value = get(frame)
        if type(value) is list:
            pairs = list(enumerate(value))
        elif type(value) is dict:
            pairs = list(value.items())
        else:
            pairs = []
        if not pairs:
            inverse(frame, out)
            return
        outer, last = frame.data, len(pairs) - 1
        for index, (key, item) in enumerate(pairs):
            data = {
                **outer,
                "index": index,
                "key": key,
                "first": index == 0,
                "last": index == last,
                _PARENT_DATA: outer,
            }
            params = ((item, key), frame.params) if param_count else None
            fn(frame.enter(item, data, params), out)

    return run_each


# --- the public API --------------------------------------------------------------------------


class Template:
    """A compiled context template: render it as many times as needed."""

    __slots__ = ("name", "_run")

    def __init__(self, name: str, run: Step) -> None:
        self.name = name
        self._run = run

    def __repr__(self) -> str:
        return f"Template({self.name!r})"

    def render(self, context: Mapping[str, Any]) -> list[Block]:
        """The role blocks, in order. The context is copied to plain data first."""
        try:
            if not isinstance(context, Mapping):
                raise TemplateError(self.name, None, None, f"the context must be a dict, not {type(context).__name__}")
            data = _to_plain(context, "context", self.name)
            stream: list = []
            self._run(_Frame(data, None, {"root": data}, None), stream)
            return _assemble(stream)
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError(self.name, None, None, "the template or its data nests too deeply") from None
        except Exception as exc:  # nothing from pybars or Python may escape as a traceback
            raise TemplateError(self.name, None, None, f"internal error while rendering: {exc!r}") from exc

    def render_text(self, context: Mapping[str, Any]) -> str:
        """The blocks' text joined by newlines (for story strings and tests)."""
        return "\n".join(block.text for block in self.render(context))


def compile_template(source: str, name: str) -> Template:
    """Compile a Handlebars template; every problem is a `TemplateError` naming line and column."""
    try:
        if not isinstance(source, str):
            raise TemplateError(name, None, None, f"template source must be text, not {type(source).__name__}")
        _Checker(source, name).run()
        tree, parsed, stopped = _PARSER.parse(source)
        origins = _origins(source, parsed)
        builder = _Builder(name, source, origins)
        if stopped < len(parsed):
            raise builder.error(stopped, "cannot read the template from here: check the tag's braces and quotes")
        return Template(name, builder.program(tree, (), None))
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError(name, None, None, "the template nests too deeply") from None
    except Exception as exc:  # pybars/pymeta errors must not escape as tracebacks
        raise TemplateError(name, None, None, f"cannot compile the template: {exc}") from exc
