"""A safe Handlebars engine for context templates (Serene Pub / SillyTavern style), built on pybars3.

The package, by job: `grammar` (the only module that touches pybars3/PyMeta3), `check`
(tag-by-tag syntax and sandbox checks), `parse` (the tags nested into a tree, with Handlebars.js'
whitespace rules), `compile` (parse tree -> program, plain data),
`program` (checks a program and links it into steps), `runtime` (rendering plain data into
role blocks), `store` (shipped and cached programs, so a normal run parses nothing).

Templates are untrusted: people share presets. So this module takes from pybars only what is
safe to take, its parser, and replaces the rest:

* **Parsing** is pybars' OMeta grammar, extended (`_GRAMMAR`, a pymeta sub-grammar) with
  block parameters (`{{#each xs as |x i|}}`, `{{#with o as |p|}}`), `{{else if ...}}` chains,
  `{{!-- --}}` comments, decimal numbers, real string values for literals, tagged path
  segments and the source offset of every tag (for errors). The grammar reads one tag at a
  time; nesting and whitespace (standalone lines, `~`) are `parse`'s, as Handlebars.js 4.7 does them.
* **No Python is generated from template text.** pybars compiles a template to Python
  source and pastes template text into it: a bracket segment such as `{{[a') or ... or (']}}`
  or a subexpression name lands inside a `u'...'` literal unescaped, which is code injection.
  Instead of patching each format string, the parse tree is compiled here into a program of
  plain data (JSON lists, storable), linked into closures; template text only ever becomes
  Python *data*. pybars' `compile()` is disabled on the
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

from .runtime import Template, bound_for_window
from .store import cached_template

__all__ = ["Template", "bound_for_window", "cached_template", "compile_template"]


def compile_template(source: str, name: str) -> Template:
    """Compile a Handlebars template now, without the store; every problem is a `TemplateError`
    naming line and column. (Imports pybars3: `cached_template` avoids it for known templates.)"""
    from .compile import compile_template as compile_now

    return compile_now(source, name)
