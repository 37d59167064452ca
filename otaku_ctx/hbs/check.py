"""Sandbox and syntax checks: read the source tag by tag, before the grammar runs, so every
error names the right line and column; refuse the features the engine does not support."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import TemplateError
from .grammar import parser


def stache(text: str) -> str:
    return "{{" + text + "}}"


@dataclass(frozen=True)
class Tag:
    start: int
    text: str  # the whole tag as written
    core: str  # between the braces, without '~', '{' and outer spaces ("!" for a comment)
    strip_open: bool = False  # `{{~`: strip the whitespace before the tag
    strip_close: bool = False  # `~}}`: strip the whitespace after it
    triple: bool = False  # `{{{x}}}`
    comment: bool = False


@dataclass
class _Open:
    name: str
    tag: Tag
    seen_else: bool = False


_COMMENT_END = re.compile(r"--~?\}\}")
_BLOCK_NAME = re.compile(r"[^\s(){}~|=]+")  # a helper's name or, for a section, a path
_ELSE = re.compile(r"else(?=\s|$)")


class Checker:
    """Reads the source tag by tag before the grammar runs.

    The grammar only says where parsing stopped (often an outer block); this says which tag
    is wrong and why: a tag that does not parse, a block that is never closed or closed by the
    wrong name, an `{{else}}` outside a block, and the features we refuse (partials, raw blocks).
    """

    def __init__(self, source: str, name: str) -> None:
        self.source = source
        self.name = name

    def error(self, offset: int, message: str) -> TemplateError:
        line, column = line_column(self.source, offset)
        return TemplateError(self.name, line, column, message)

    def run(self) -> None:
        stack: list[_Open] = []
        for tag in self.tags():
            self.check(tag, stack)
        if stack:
            opened = stack[-1]
            raise self.error(
                opened.tag.start,
                f"{opened.tag.text} is never closed: add {stache('/' + opened.name)} where the block ends",
            )

    def tags(self, with_comments: bool = False) -> Iterator[Tag]:
        source, position = self.source, 0
        while (start := source.find("{{", position)) != -1:
            if source.startswith("{{{{", start):
                raise self.error(start, "raw blocks ({{{{name}}}}) are not supported: remove the extra braces")
            strip_open = source.startswith("~", start + 2)
            inner = start + 2 + strip_open
            if source.startswith("!--", inner):
                end = _COMMENT_END.search(source, inner + 3)
                if end is None:
                    raise self.error(start, "this {{!-- comment is never closed: end it with --}}")
                position = end.end()
                if with_comments:
                    yield Tag(start, source[start:position], "!", strip_open, "~" in end.group(0), comment=True)
                continue
            if source.startswith("!", inner):
                close = source.find("}}", inner + 1)
                if close == -1:
                    raise self.error(start, "this {{! comment is never closed: end it with }}")
                position = close + 2
                if with_comments:
                    yield Tag(start, source[start:position], "!", strip_open, source[close - 1] == "~", comment=True)
                continue
            triple = source.startswith("{", inner)
            position = self.tag_end(start, triple)
            text = source[start:position]
            inside = text[inner - start : -2]
            strip_close = inside.endswith("~")
            inside = inside[:-1] if strip_close else inside
            if triple:
                inside = inside[1:-1]
            yield Tag(start, text, inside.strip(), strip_open, strip_close, triple)

    def tag_end(self, start: int, triple: bool) -> int:
        """Offset just past the tag opened at `start`, skipping "strings" and [segments]."""
        source, index = self.source, start + 2
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
                if source.startswith("}~}}", index - 2) and index - 2 > start + 3:
                    return index + 2
                raise self.error(start, "a tag opened with {{{ must be closed with }}}")
            else:
                index += 1
        raise self.error(start, "this tag is never closed: end it with }} (check for an unclosed quote or '[')")

    def check(self, tag: Tag, stack: list[_Open]) -> None:
        core = tag.core
        if core.startswith("&") and not tag.triple:
            core = core[1:].strip()
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
            if rest and not parser().accepts("open_inner", rest + "}}"):
                raise self.error(tag.start, f"cannot read {tag.text}: write it as {{{{else if condition}}}}")
        elif core.startswith(("#", "^")):
            rest = core[1:].strip()
            match = _BLOCK_NAME.match(rest)
            if match is None or not parser().accepts("open_inner", rest + "}}"):
                raise self.error(
                    tag.start,
                    f"cannot read {tag.text}: a block opens as {{{{#name argument}}}}, "
                    "with block params written `as |item index|` at the end",
                )
            stack.append(_Open(match.group(0), tag))
        elif not parser().accepts("expression_inner", core + "}}"):
            raise self.error(
                tag.start,
                f"cannot read {tag.text}: expected a path such as {{{{name}}}} or a helper call such as "
                '{{eq role "user"}} (check quotes, parentheses and spaces)',
            )

    def close(self, tag: Tag, name: str, stack: list[_Open]) -> None:
        if not stack:
            raise self.error(tag.start, f"{tag.text} closes a block that was never opened: remove it")
        opened = stack[-1]
        if name != opened.name:
            line, column = line_column(self.source, opened.tag.start)
            raise self.error(
                tag.start,
                f"{tag.text} does not match {opened.tag.text} opened at {line}:{column}: "
                f"close that block first with {stache('/' + opened.name)}",
            )
        stack.pop()


def line_column(source: str, offset: int) -> tuple[int, int]:
    line_start = source.rfind("\n", 0, offset) + 1
    return source.count("\n", 0, offset) + 1, offset - line_start + 1
