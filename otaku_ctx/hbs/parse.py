"""The template's structure and its whitespace, as Handlebars.js 4 has them.

The source is cut into text runs and tags (by `check.Checker`, which has already refused what
is wrong), the tags are nested into blocks, and Handlebars' whitespace rules are applied to the
text runs: `~` strips every whitespace character on its side, and a block, `{{else}}` or comment
tag alone on its line takes that line's indentation and line break with it ("standalone").
The rules are decided on the tree, sibling by sibling, like Handlebars.js' `WhitespaceControl`
visitor, so a tag's own line is judged against the text that stands beside it in the template.

The result is the tree `compile._Builder` reads: `['template', node, ...]` where a node is
`('literal', text)` or `('at', offset, command)`, offsets into the original source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .check import Checker, Tag
from .grammar import parser


@dataclass
class _Content:
    original: str
    value: str
    left_stripped: bool = False
    right_stripped: bool = False


@dataclass
class _Program:
    body: list[Any] = field(default_factory=list)
    chained: bool = False  # the `{{else if ...}}` chain: holds one block


@dataclass
class _Mustache:
    tag: Tag


@dataclass
class _Comment:
    tag: Tag


@dataclass
class _Block:
    tag: Tag  # `{{#name ...}}`, `{{^name}}`, or the `{{else if ...}}` of a chain
    rest: str  # what follows `#`, `^` or `else`
    inverted: bool
    first: _Program  # the body before any `{{else}}`, in the order written
    second: _Program | None = None  # after `{{else}}`
    inverse_strip: tuple[bool, bool] = (False, False)
    close_strip: tuple[bool, bool] = (False, False)

    # Handlebars.js swaps the two parts of an inverted block, and its whitespace rules follow that.
    @property
    def program(self) -> _Program | None:
        return self.second if self.inverted else self.first

    @property
    def inverse(self) -> _Program | None:
        return self.first if self.inverted else self.second


def _strips(tag: Tag) -> tuple[bool, bool]:
    return tag.strip_open, tag.strip_close


def build(source: str, name: str) -> list[Any]:
    """The whitespace-controlled tree of `source` (already accepted by `Checker`)."""
    root = _Program()
    # each open block: (the block as opened, the block whose program/inverse is being filled)
    stack: list[tuple[_Block, _Block]] = []
    body = root.body
    position = 0
    for tag in Checker(source, name).tags(with_comments=True):
        if tag.start > position:
            text = source[position : tag.start]
            body.append(_Content(text, text))
        position = tag.start + len(tag.text)
        core = tag.core
        if tag.comment:
            body.append(_Comment(tag))
        elif core.startswith(("#", "^")) and core != "^":
            block = _Block(tag, core[1:].strip(), core.startswith("^"), _Program())
            body.append(block)
            stack.append((block, block))
            body = block.first.body
        elif core == "^" or re.match(r"else(?=\s|$)", core):
            opened, current = stack.pop()
            rest = "" if core == "^" else core[4:].strip()
            current.inverse_strip = _strips(tag)
            if rest:  # `{{else if x}}`: the inverse is a program holding one more block
                chained = _Block(tag, rest, False, _Program(), close_strip=_strips(tag))
                current.second = _Program([chained], chained=True)
                stack.append((opened, chained))
                body = chained.first.body
            else:
                current.second = _Program()
                stack.append((opened, current))
                body = current.second.body
        elif core.startswith("/"):
            opened, _ = stack.pop()
            opened.close_strip = _strips(tag)
            if opened.second is not None and opened.second.chained:
                opened.second.body[0].close_strip = _strips(tag)
            body = root.body
            if stack:
                current = stack[-1][1]
                body = (current.second or current.first).body
        else:
            body.append(_Mustache(tag))
    if position < len(source):
        body.append(_Content(source[position:], source[position:]))
    _Whitespace().program(root)
    return _tree(root)


# --- Handlebars' whitespace rules ---------------------------------------------------------------

_PREV_LINE = re.compile(r"\r?\n\s*?\Z")
_PREV_LINE_FIRST = re.compile(r"(?:\A|\r?\n)\s*?\Z")
_NEXT_LINE = re.compile(r"\A\s*?\r?\n")
_NEXT_LINE_LAST = re.compile(r"\A\s*?(?:\r?\n|\Z)")


def _prev_is_blank(body: list[Any], index: int | None = None, root: bool = False) -> bool:
    """Whether what stands before `body[index]` (or the end) ends with a line break and blanks."""
    index = len(body) if index is None else index
    if index == 0:
        return root
    previous = body[index - 1]
    if not isinstance(previous, _Content):
        return False
    pattern = _PREV_LINE if index > 1 or not root else _PREV_LINE_FIRST
    return pattern.search(previous.original) is not None


def _next_is_blank(body: list[Any], index: int | None = None, root: bool = False) -> bool:
    """Whether what follows `body[index]` (or the start) is blanks up to a line break."""
    index = -1 if index is None else index
    if index + 1 >= len(body):
        return root
    following = body[index + 1]
    if not isinstance(following, _Content):
        return False
    pattern = _NEXT_LINE if index + 2 < len(body) or not root else _NEXT_LINE_LAST
    return pattern.match(following.original) is not None


def _omit_right(body: list[Any], index: int | None = None, every: bool = False) -> None:
    """Strip the start of the text after `body[index]` (or the first): all whitespace for `~`,
    else the blanks and one line break of a standalone line."""
    position = 0 if index is None else index + 1
    if position >= len(body):
        return
    current = body[position]
    if not isinstance(current, _Content) or (not every and current.right_stripped):
        return
    before = current.value
    current.value = re.sub(r"\A\s+" if every else r"\A[ \t]*\r?\n?", "", before)
    current.right_stripped = current.value != before


def _omit_left(body: list[Any], index: int | None = None, every: bool = False) -> bool:
    """Strip the end of the text before `body[index]` (or the last): all whitespace for `~`,
    else the indentation of a standalone line."""
    position = len(body) - 1 if index is None else index - 1
    if position < 0:
        return False
    current = body[position]
    if not isinstance(current, _Content) or (not every and current.left_stripped):
        return False
    before = current.value
    current.value = re.sub(r"\s+\Z" if every else r"[ \t]+\Z", "", before)
    current.left_stripped = current.value != before
    return current.left_stripped


@dataclass
class _Strip:
    open: bool = False
    close: bool = False
    open_standalone: bool = False
    close_standalone: bool = False
    inline_standalone: bool = False


class _Whitespace:
    """Handlebars' whitespace rules over the tree; the root program is the first one visited."""

    def __init__(self) -> None:
        self.root_seen = False

    def program(self, program: _Program) -> None:
        root, self.root_seen = not self.root_seen, True
        body = program.body
        for index, node in enumerate(body):
            strip = self.statement(node)
            if strip is None:
                continue
            prev_blank = _prev_is_blank(body, index, root)
            next_blank = _next_is_blank(body, index, root)
            if strip.close:
                _omit_right(body, index, True)
            if strip.open:
                _omit_left(body, index, True)
            if strip.inline_standalone and prev_blank and next_blank:
                _omit_right(body, index)
                _omit_left(body, index)
            if strip.open_standalone and prev_blank:
                _omit_right((node.program or node.inverse).body)
                _omit_left(body, index)
            if strip.close_standalone and next_blank:
                _omit_right(body, index)
                _omit_left((node.inverse or node.program).body)

    def statement(self, node: Any) -> _Strip | None:
        if isinstance(node, _Block):
            return self.block(node)
        if isinstance(node, _Mustache):
            return _Strip(open=node.tag.strip_open, close=node.tag.strip_close)
        if isinstance(node, _Comment):
            return _Strip(open=node.tag.strip_open, close=node.tag.strip_close, inline_standalone=True)
        return None

    def block(self, block: _Block) -> _Strip:
        for part in (block.program, block.inverse):
            if part is not None:
                self.program(part)
        program = block.program or block.inverse
        assert program is not None  # a block always has its first part
        inverse = block.inverse if block.program is not None else None
        first = last = inverse
        if inverse is not None and inverse.chained:
            first = inverse.body[0].program
            while last is not None and last.chained:  # as Handlebars.js walks it: each link's program
                last = last.body[-1].program
        strip = _Strip(
            open=block.tag.strip_open,
            close=block.close_strip[1],
            open_standalone=_next_is_blank(program.body),
            close_standalone=_prev_is_blank((first or program).body),
        )
        if block.tag.strip_close:
            _omit_right(program.body, None, True)
        if inverse is not None and first is not None and last is not None:
            if block.inverse_strip[0]:
                _omit_left(program.body, None, True)
            if block.inverse_strip[1]:
                _omit_right(first.body, None, True)
            if block.close_strip[0]:
                _omit_left(last.body, None, True)
            if _prev_is_blank(program.body) and _next_is_blank(first.body):  # a standalone {{else}}
                _omit_left(program.body)
                _omit_right(first.body)
        elif block.close_strip[0]:
            _omit_left(program.body, None, True)
        return strip


# --- the tree compile._Builder reads ------------------------------------------------------------


def _tree(program: _Program) -> list[Any]:
    tree: list[Any] = ["template"]
    for node in program.body:
        if isinstance(node, _Content):
            if node.value:
                tree.append(("literal", node.value))
        elif isinstance(node, _Mustache):
            kind = "expand" if node.tag.triple or node.tag.core.startswith("&") else "escapedexpand"
            core = node.tag.core[1:] if node.tag.core.startswith("&") and not node.tag.triple else node.tag.core
            path, args = parser().read("expression_inner", core + "}}")
            tree.append(("at", node.tag.start, (kind, path, args)))
        elif isinstance(node, _Block):
            tree.append(("at", node.tag.start, _block(node)))
    return tree


def _block(block: _Block) -> tuple[Any, ...]:
    path, args, params = parser().read("open_inner", block.rest + "}}")
    segments = path[1]
    name = segments[0][1] if len(segments) == 1 and segments[0][0] == "sym" else None
    body = _tree(block.first)
    alternative = _tree(block.second) if block.second is not None else []
    kind = "invertedblock" if block.inverted else "block"
    return (kind, name, args, params, body, alternative, path)
