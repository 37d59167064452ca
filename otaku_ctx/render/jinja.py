"""A model's own Jinja chat template, rendered as transformers' `apply_chat_template` renders
it, in jinja2's sandbox.

The environment is the one transformers gives a template: an `ImmutableSandboxedEnvironment`
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, `raise_exception`,
`strftime_now`, a `tojson` filter that keeps non-ASCII text and takes `indent`, `separators`
and `sort_keys` (`json.dumps`'s own), a `dict` that is only a constructor, a `namespace` that
refuses attributes starting with "_", and the variables `messages`, `tools` and `documents`
(None: ctx sends neither), `add_generation_prompt`, `bos_token` and `eos_token` (left
undefined when they are None: a tokenizer without one leaves them so).

An open turn with text is continued as transformers' `continue_final_message` continues a
final message: a tag is put after its text, the chat rendered, and the prompt cut where the
tag begins (and trailing whitespace dropped when the template trimmed the space the tag ends
with). A blank open turn is `add_generation_prompt`.

A template is someone else's code, so it runs bounded (`Limits`): no file system, no imports
and no network (the sandbox gives a template neither modules nor `__` attributes), and

- output: the rendered text stops at `Limits.chars` characters (the render is a stream of
  chunks, counted as they come);
- growth: `+`, `*`, `**`, `%` and `~` (concatenation), the filters and the calls of string
  methods are refused before they would make a value longer than `Limits.chars` (a string
  doubled forty times, `"x" * 10**10`, a width of a billion in a format or `center`);
- work: every loop iteration, call, attribute, item and operator is a step; a render stops
  after `Limits.steps` of them or `Limits.seconds` of wall time, whichever comes first
  (jinja2's sandbox bounds `range` at 100,000 items, not loops inside loops), and all the
  renders of one template in a run after `RUN_SECONDS` together;
- recursion: a macro that calls itself without end stops at Python's recursion limit.

Each ends the render with a one-line `TemplateError` naming the template. What is left
unbounded is work inside one C call on values that are already within the bounds (sorting a
long list, say), which ends with the values.

jinja2 is an optional dependency (`pip install 'otaku-ctx[model]'`): it is imported the first
time a template is compiled, never when this module is.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from ..errors import ConfigError, TemplateError
from ..model import INSTALL

# transformers' own tag: a template that splits or inspects the final message sees the same text.
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_WIDTH = re.compile(r"\d{7,}")  # a width or precision of a million or more in a format string
_MARKER = re.compile(r"\s*(<[^<>\s]+>|\[[^\[\]\s]+\])")


@dataclass(frozen=True)
class Limits:
    """What one render may cost: characters of output (and of any value it builds), steps of
    work, and seconds of wall time."""

    chars: int
    steps: int = 20_000_000
    seconds: float = 10.0


def limits_for(messages: Sequence[Mapping[str, str]]) -> Limits:
    """Room for what a chat template writes around these messages: each message's text twice
    over (a template may quote a message again, in a summary line or a tool call), plus a
    megabyte of the template's own text; a million steps and a thousand a message (real
    templates take 9-18 a message: ChatML's, Llama 3.1's, Gemma 3's, Mistral's, measured on
    1,000 messages); 5 s."""
    text = sum(len(m.get("content", "")) + len(m.get("role", "")) for m in messages)
    n = len(messages)
    return Limits(chars=2 * text + 256 * n + 1_000_000, steps=1_000_000 + 1_000 * n, seconds=5.0)


# A build renders a template many times (the pricer's stand-ins, then the prompt): all of one
# template's renders in a run share this much time, so a slow template cannot take 5 s each.
RUN_SECONDS = 60.0
_spent: dict[str, float] = {}


class Exceeded(Exception):
    """A render went past one of its `Limits`."""


class Refused(Exception):
    """The template called `raise_exception`: the chat is not one it accepts."""


class TemplateRefusal(TemplateError):
    """A template's own refusal of a chat (its `raise_exception`), named as a TemplateError."""


@dataclass
class _Budget:
    limits: Limits
    deadline: float
    late: str  # what passing the deadline means
    steps: int = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            raise Exceeded(f"runs past {self.limits.steps:,} steps (a loop without end?)")
        if not self.steps & 0x3F and time.monotonic() > self.deadline:  # every 64 steps: a step may be a sort
            raise Exceeded(self.late)

    def size(self, n: int, what: str) -> None:
        if n > self.limits.chars:
            raise Exceeded(f"would make {what} of {n:,} (the bound is {self.limits.chars:,} characters)")


_BUDGET: ContextVar[_Budget | None] = ContextVar("jinja_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # a template compiled here is only ever rendered by `render_chat`
        raise Exceeded("is rendered outside ctx's bounds")
    return budget


# --- rendering ------------------------------------------------------------------------------


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, str]],
    *,
    name: str,
    bos: str | None = None,
    eos: str | None = None,
    continue_final: bool = False,
    generation_prompt: bool = True,
    limits: Limits | None = None,
) -> str:
    """The prompt the template makes of `messages`: ready for a new assistant turn
    (`add_generation_prompt`, unless `generation_prompt` is False), or, with `continue_final`,
    ending in the last message's text for the model to continue (transformers'
    `continue_final_message`)."""
    chat = [dict(m) for m in messages]
    final = ""
    if continue_final:
        if not chat:
            raise TemplateError(name, None, None, "there is no message to continue")
        if "content" not in template:
            raise TemplateError(
                name, None, None, "the template never reads a message's content, so ctx cannot continue one"
            )
        final = chat[-1]["content"]
        chat[-1]["content"] = final + CONTINUE_TAG
    variables: dict[str, Any] = {
        "messages": chat,
        "tools": None,
        "documents": None,
        "add_generation_prompt": generation_prompt and not continue_final,
    }
    if bos is not None:
        variables["bos_token"] = bos
    if eos is not None:
        variables["eos_token"] = eos
    text = _render(compiled(template, name), variables, name, limits or limits_for(chat))
    if not continue_final:
        return text
    tag = CONTINUE_TAG.strip()
    if tag not in text or final.strip() not in text:
        raise TemplateError(
            name, None, None, "the template leaves out part of the open turn's text, so ctx cannot continue it"
        )
    at = text.rindex(tag)
    return text[:at] if text.startswith(CONTINUE_TAG, at) else text[:at].rstrip()


def _render(program: Any, variables: dict[str, Any], name: str, limits: Limits) -> str:
    """Stream the render, counting characters, with the budget in force."""
    import jinja2

    started = time.monotonic()
    left = RUN_SECONDS - _spent.get(name, 0.0)
    if left <= 0:
        raise TemplateError(name, None, None, f"stopped: the template has taken {RUN_SECONDS:g} s of this run")
    if left < limits.seconds:
        budget = _Budget(limits, started + left, f"has taken {RUN_SECONDS:g} s of this run")
    else:
        budget = _Budget(limits, started + limits.seconds, f"runs past {limits.seconds:g} s (a loop without end?)")
    token = _BUDGET.set(budget)
    out: list[str] = []
    size = 0
    try:
        for chunk in program.generate(**variables):
            size += len(chunk)
            if size > limits.chars:
                raise Exceeded(f"writes more than {limits.chars:,} characters")
            budget.tick()
            out.append(chunk)
    except Refused as exc:
        raise TemplateRefusal(name, _line(exc), None, f"the template refuses this chat: {_one_line(exc)}") from None
    except Exceeded as exc:
        raise TemplateError(name, _line(exc), None, f"stopped: the template {exc}") from None
    except RecursionError as exc:
        raise TemplateError(name, _line(exc), None, "stopped: the template recurses too deep") from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(name, _line(exc), None, f"the sandbox stopped the template: {_one_line(exc)}") from None
    except MemoryError:
        raise TemplateError(name, None, None, "stopped: the template ran out of memory") from None
    except Exception as exc:  # the template's own error: a bug in it, or a chat it does not expect
        kind = type(exc).__name__
        raise TemplateError(name, _line(exc), None, f"the template failed ({kind}): {_one_line(exc)}") from None
    finally:
        _BUDGET.reset(token)
        _spent[name] = _spent.get(name, 0.0) + time.monotonic() - started
    return "".join(out)


def _line(exc: BaseException) -> int | None:
    """The template line a render error was raised at: jinja2 gives its frames the
    template's line numbers, under the file name "<template>"."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + "…" if len(text) > 300 else text


# --- compiling ------------------------------------------------------------------------------


def check_template(template: str, name: str) -> None:
    """Compile the template now, so that one that is not valid Jinja is an error when the
    format is loaded, naming its line."""
    compiled(template, name)


@lru_cache(maxsize=16)
def compiled(template: str, name: str) -> Any:
    """The template compiled once per run, its loops and concatenations guarded (see the
    module's notes)."""
    try:
        environment = _environment()
    except ImportError:
        raise ConfigError(name, None, f"a Jinja chat template needs jinja2: {INSTALL}") from None
    import jinja2

    try:
        return _compile(environment, template)
    except jinja2.TemplateSyntaxError as exc:  # also a filter or test it does not know
        raise TemplateError(name, exc.lineno, None, f"not a valid Jinja template: {_one_line(exc)}") from None
    # Jinja compiles a template to Python: its blocks nested past what Python compiles (25
    # loops: "too many statically nested blocks"; about 100 ifs: "too many levels of indentation")
    # or past the recursion of Jinja's own parser. No chat template nests a tenth as deep.
    except SyntaxError as exc:  # IndentationError is one
        why = f"Python cannot compile it: {exc.msg}"
        raise TemplateError(name, None, None, f"not a template ctx can run: its blocks nest too deep ({why})") from None
    except (RecursionError, MemoryError):
        raise TemplateError(name, None, None, "not a template ctx can run: it nests too deep to compile") from None
    except _TooLarge as exc:
        raise TemplateError(
            name, None, None, f"not a template ctx can run: {exc}; no chat template is that large"
        ) from None


class _TooLarge(Exception):
    """A template past what ctx compiles (`TOKENS`)."""


# Jinja's tokens (a tag's delimiters, each name, operator and literal, each run of text) a
# template may hold: compiling costs ~3 KB and ~50 µs a token, so 20,000 are ~60 MB and ~1 s.
# The largest template in the fixtures, Mistral v7 Tekken's, holds 839.
TOKENS = 20_000


def _compile(environment: Any, template: str) -> Any:
    """Count the tokens (refused past `TOKENS`), parse, guard each loop and concatenation, compile."""
    from jinja2 import nodes

    for count, _ in enumerate(environment.lexer.tokenize(template), 1):
        if count > TOKENS:
            raise _TooLarge(f"it holds more than {TOKENS:,} Jinja tokens (tags, names, operators)")
    tree = environment.parse(template)
    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(loop.iter, "ctx_steps", [], [], None, None, lineno=loop.lineno)
    for concat in list(tree.find_all(nodes.Concat)):
        pieces = nodes.List(concat.nodes, lineno=concat.lineno)
        concat.nodes = [nodes.Filter(pieces, "ctx_concat", [], [], None, None, lineno=concat.lineno)]
    return environment.from_string(tree)


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Environment(ImmutableSandboxedEnvironment):
        """transformers' sandbox, with every step counted and every growth bounded."""

        intercepted_binops = frozenset(("+", "*", "**", "%"))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _budget()
            budget.tick()
            _check_binop(budget, operator, left, right)
            return super().call_binop(context, operator, left, right)

        def getattr(self, obj: Any, attribute: str) -> Any:
            _budget().tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            _budget().tick()
            return super().getitem(obj, argument)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            budget = _budget()
            budget.tick()
            args = _check_call(budget, __obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    class Generation(jinja2.ext.Extension):
        """`{% generation %}…{% endgeneration %}`, as transformers reads it: the body rendered in
        place (transformers also notes where it stands, to mask the assistant's tokens; a
        prompt has no use for that)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    environment = Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, Generation], finalize=_finalize
    )
    for key, function in list(environment.filters.items()):
        environment.filters[key] = _guarded_filter(function)
    environment.filters["tojson"] = _guarded_filter(_tojson)
    environment.filters["ctx_steps"] = _steps
    environment.filters["ctx_concat"] = _concat
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _Dict()
    environment.globals["namespace"] = _namespace_class(jinja2.utils.Namespace)
    environment.globals["lipsum"] = _lipsum(jinja2.utils.generate_lorem_ipsum)
    return environment


# --- what a template is given ----------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise Refused(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson`: `json.dumps` with its own options, non-ASCII kept, no HTML escaping."""
    if isinstance(indent, int) and indent > 64:
        raise Exceeded(f"asks for a JSON indent of {indent:,}")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)`, and nothing of the type a template could climb."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _namespace_class(base: Any) -> Any:
    """jinja2's `namespace`, refusing attributes that start with "_" (as transformers' does)."""

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise Refused(f"a namespace cannot hold an attribute starting with '_' ({name!r})")

    class Namespace(base):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja2's own signature
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for key in attrs:
                check(key)
            base.__init__(self, attrs)

        def __setitem__(self, key: str, value: Any) -> None:
            check(key)
            base.__setitem__(self, key, value)

    return Namespace


def _steps(value: Any) -> Iterator[Any]:
    """A loop's items, one step each."""
    budget = _budget()
    for item in value:
        budget.tick()
        yield item


def _concat(values: Iterable[Any]) -> str:
    """`a ~ b`: the texts joined, within the bound (a list's text measured before it is made)."""
    budget = _budget()
    values = list(values)
    size = 0
    for value in values:
        size += printed(value, budget.limits.chars - size)
        budget.size(size, "a concatenation")
    return "".join(map(str, values))


def _finalize(value: Any) -> Any:
    """What `{{ ... }}` prints, measured before Python makes its text: a list of a long text
    repeated is a short list whose text is not."""
    if not isinstance(value, str):
        budget = _budget()
        budget.size(printed(value, budget.limits.chars), "a printed value")
    return value


def printed(value: Any, bound: int) -> int:
    """About how many characters `str(value)` makes (a list's, a dict's, a namespace's text
    counted item by item, never made), stopping as soon as the count passes `bound`: each item
    is at least a character, so at most `bound` of them are looked at."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 4
    if isinstance(value, int):
        return value.bit_length() * 3 // 10 + 1
    if isinstance(value, float):
        return len(repr(value))
    items: Iterable[Any]
    if isinstance(value, Mapping) or isinstance(value, _namespaces()):
        attrs: Mapping[Any, Any] = (
            value if isinstance(value, Mapping) else object.__getattribute__(value, "_Namespace__attrs")
        )
        items = (part for key in attrs for part in (key, attrs[key]))
    elif isinstance(value, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
        items = value
    else:  # a macro, a loop, a cycler, a range: a short text of its own
        return 0
    size = 0  # each item's text and two characters: the brackets', or a ", " before the next
    for item in items:
        left = bound - size
        size += 2 + (len(item) + 2 if isinstance(item, str) else printed(item, left))
        if size > bound:
            break
    return size


@lru_cache(maxsize=1)
def _namespaces() -> tuple[type, ...]:
    import jinja2.utils

    return (jinja2.utils.Namespace,)


def _lipsum(generate: Callable[..., str]) -> Callable[..., str]:
    """jinja2's `lipsum`, at most 100 paragraphs of at most 1,000 words."""

    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - jinja2's names
        if n > 100 or max > 1000:
            raise Exceeded(f"asks for {n:,} paragraphs of up to {max:,} words of lorem ipsum")
        return generate(n, html, min, max)

    return lipsum


def _guarded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that counts as a step, refuses a width or count past the bound (and a join or
    an indent that would make a text past it), and whose result must be within it."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool):
                budget.size(abs(value), "a filter's argument")
        name = getattr(function, "__name__", "")
        at = next((i for i, a in enumerate(args) if not _is_context(a)), len(args))
        values = list(args[at:])
        if name not in _KEEPS:  # a filter that makes a text of its value (`string`, `tojson`, `upper`)
            size = 0
            for value in (*values, *kwargs.values()):
                size += printed(value, budget.limits.chars - size)
                budget.size(size, "a filter's text")
        if name == "do_replace" and len(values) >= 3:
            _check_replace(budget, values[0], values[1], values[2])
        elif name == "do_join" and values:
            if not isinstance(values[0], (str, list, tuple)):
                values[0] = _bounded_list(budget, values[0])  # what jinja2's join does first
                args = (*args[:at], *values)
            separator = values[1] if len(values) > 1 else kwargs.get("d", "")
            _check_join(budget, values[0], separator)
        elif name == "do_indent" and values and isinstance(values[0], str):
            width = values[1] if len(values) > 1 else kwargs.get("width", 4)
            lines = values[0].count("\n") + 1
            budget.size(len(values[0]) + lines * (width if isinstance(width, int) else len(str(width))), "an indent")
        result = function(*args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            budget.size(len(result), "a filter's result")
        return result

    for attribute in ("jinja_pass_arg", "__name__", "__doc__"):
        if hasattr(function, attribute):
            setattr(guarded, attribute, getattr(function, attribute))
    return guarded


# jinja2's filters that never make a text of their value: a long list passes them as it is
_KEEPS = frozenset(
    (
        "abs", "do_attr", "do_batch", "do_default", "do_dictsort", "do_first", "do_float", "do_groupby", "do_int",
        "do_items", "do_join", "do_last", "do_list", "do_map", "do_max", "do_min", "do_random", "do_reject",
        "do_rejectattr", "do_reverse", "do_round", "do_select", "do_selectattr", "do_slice", "do_sort", "do_sum",
        "do_unique", "len",
    )
)  # fmt: skip


def _is_context(value: Any) -> bool:
    return type(value).__name__ in ("EvalContext", "Context", "Environment")


def _check_binop(budget: _Budget, operator: str, left: Any, right: Any) -> None:
    sized = (str, list, tuple)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        budget.size(len(left) + len(right), "a sum")
    elif operator == "*":
        for a, b in ((left, right), (right, left)):
            if isinstance(a, sized) and isinstance(b, int):
                budget.size(len(a) * max(b, 0), "a repetition")
        if isinstance(left, int) and isinstance(right, int):
            budget.size((left.bit_length() + right.bit_length()) // 8, "a product")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        budget.size(left.bit_length() * max(right, 0) // 8, "a power")
    elif operator == "%" and isinstance(left, str):
        size = len(left)
        for value in right if isinstance(right, tuple) else (right,):  # '%s' % long_list: its text measured first
            size += printed(value, budget.limits.chars - size)
            budget.size(size, "a format")
        if _WIDTH.search(left):
            budget.size(max(int(w) for w in _WIDTH.findall(left)), "a format width")
        for value in _ints(right):  # a width taken from the arguments: '%*d' % (n, 1)
            budget.size(abs(value), "a format width")


def _check_call(budget: _Budget, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A string method asked for a width, a count, a format, a replace or a join past the
    bound; the arguments to call it with (a join's items made a list first, to be measured)."""
    method = getattr(function, "__wrapped__", function)  # the sandbox's wrapper of str.format
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str):
        return args
    for value in _ints((*args, *kwargs.values())):  # also inside a list or dict: '{:{w[0]}}'.format(x, w=[n])
        budget.size(abs(value), "a string method's argument")
    name = getattr(method, "__name__", "")
    if name in ("format", "format_map"):  # '{}'.format(long_list): its text measured first
        size = len(owner)
        for value in (*args, *kwargs.values()):
            size += printed(value, budget.limits.chars - size)
            budget.size(size, "a format")
    if name in ("format", "format_map") and _WIDTH.search(owner):
        budget.size(max(int(w) for w in _WIDTH.findall(owner)), "a format width")
    elif name == "replace" and len(args) >= 2:
        _check_replace(budget, owner, args[0], args[1])
    elif name == "join" and args:
        items = args[0] if isinstance(args[0], (str, list, tuple)) else _bounded_list(budget, args[0])
        _check_join(budget, items, owner)
        return (items, *args[1:])
    return args


def _ints(value: Any, depth: int = 3) -> Iterator[int]:
    """The whole numbers in a value and in the lists, tuples and dicts it holds, a few levels
    down and a few thousand items at most: what a format string could take a width from."""
    if isinstance(value, int) and not isinstance(value, bool):
        yield value
    elif depth and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        for n, item in enumerate(items):
            if n == 4096:
                break
            yield from _ints(item, depth - 1)


def _bounded_list(budget: _Budget, items: Iterable[Any]) -> list[Any]:
    """The items to be joined, taken one by one while their texts fit the bound."""
    out, size = [], 0
    for item in items:
        size += printed(item, budget.limits.chars - size)
        budget.size(size, "a join")
        out.append(item)
    return out


def _check_join(budget: _Budget, items: Any, separator: Any) -> None:
    """The join's size counted item by item (each item's text estimated, never made),
    refused as soon as it passes the bound."""
    if isinstance(items, (list, tuple)):
        between = printed(separator, budget.limits.chars)
        budget.size(between * max(len(items) - 1, 0), "a join")
        size = between * max(len(items) - 1, 0)
        for item in items:
            size += printed(item, budget.limits.chars - size)
            budget.size(size, "a join")


def _check_replace(budget: _Budget, text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        count = text.count(old) if old else len(text) + 1
        budget.size(len(text) + count * max(len(new) - len(old), 0), "a replace")


def turn_end(template: str, name: str, *, bos: str | None = None, eos: str | None = None) -> str:
    """The marker the template writes right after an assistant's message ("<|im_end|>",
    "<|eot_id|>", "<end_of_turn>", "</s>"): the first `<...>` or `[...]` there, before any
    other text. Empty when it writes none, or refuses the probe chat."""
    mark = "\ue000reply\ue001"
    chat = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": mark}]
    try:
        text = render_chat(template, chat, name=name, bos=bos, eos=eos, generation_prompt=False)
    except TemplateError:
        return ""
    after = text[text.rindex(mark) + len(mark) :] if mark in text else ""
    found = _MARKER.match(after)
    return found[1] if found else ""
