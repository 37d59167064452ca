"""Parsing: pybars3's OMeta grammar, extended. The only module that touches pybars3 or PyMeta3.

pybars3 has no public API for its grammar: `Compiler._handlebars` is a private attribute (a
PyMeta grammar class) that `_GRAMMAR` extends with `makeGrammar`. pyproject pins the versions
this was written against, and `tests/test_hbs_grammar_hook.py` fails loudly if the hook moves.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pybars import Compiler
from pymeta.runtime import ParseError


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
open_inner ::= <spaces> <path>:p <blockargs>:args <blockparams>?:bp <spaces> <finish>
    => (p, args, bp or [])
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


# The versions whose private grammar `_GRAMMAR` was written against (pinned in pyproject.toml).
PINNED = {"pybars3": "0.9.7", "PyMeta3": "0.5.1"}


def inherited_rules() -> set[str]:
    """The rules `_GRAMMAR` or the checker use but `_GRAMMAR` does not define: pybars' grammar
    must still provide them."""
    defined = set(re.findall(r"^(\w+) ::=", _GRAMMAR, re.MULTILINE))
    used = set(re.findall(r"<(\w+)", _GRAMMAR)) | {"template", "expression_inner", "block_inner"}
    return used - defined


def hook_problems() -> list[str]:
    """What is wrong with the private pybars3 hook this module relies on (empty when all is well)."""
    base = getattr(Compiler, "_handlebars", None)
    if base is None or not callable(getattr(base, "makeGrammar", None)):
        return ["pybars.Compiler._handlebars, the PyMeta grammar class this engine extends, is gone or changed"]
    problems = [
        f"pybars' grammar no longer has the rule `{rule}`"
        for rule in sorted(inherited_rules())
        if not callable(getattr(base, "rule_" + rule, None))
    ]
    if not callable(getattr(Compiler, "whitespace_control", None)):
        problems.append("pybars.Compiler.whitespace_control (standalone-line handling) is gone")
    return problems


class _Parser(Compiler):
    """pybars' grammar with `_GRAMMAR` on top, read one tag at a time; its code generator is off."""

    _handlebars: Any  # the extended grammar class, set by `parser()`

    def read(self, rule: str, text: str) -> Any:
        """What `rule` makes of `text` (which `accepts` has already passed)."""
        result, _ = self._handlebars(text).apply(rule)
        return result

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


@cache
def parser() -> _Parser:
    """The one parser; building its grammar costs a few tenths of a second, so only on first use."""
    problems = hook_problems()
    if problems:
        pins = ", ".join(f"{name}=={version}" for name, version in PINNED.items())
        raise RuntimeError(f"{'; '.join(problems)}: install {pins}")
    extended = _Parser()
    extended._handlebars = Compiler._handlebars.makeGrammar(_GRAMMAR, {"_number": _number}, "otaku_handlebars")
    return extended
