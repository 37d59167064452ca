"""The one reader of untrusted JSON: a story line, a card, a preset, a model's file, a model
server's reply and the JSON in its text, a request to `ctx serve`. Quick, and safe when the
document is not ordinary.

`loads` first counts the document's items (`items_past`): a value, a key or a container each
costs the decoder tens of bytes of memory, and 60 MB of `[{},{},…]` would be 20 million
dicts, 1.6 GB. More than `MAX_ITEMS` is refused before anything is decoded. The count is a
few scans in C: none for a document shorter than the bound, one `bytes.count` a mark for a
longer one, and only if that rough count (which takes the commas and brackets inside strings
too) is past the bound, an exact one that leaves the strings out.

Then orjson: it is about four times faster than the standard library on story lines, refuses
nesting deeper than 1,024 levels, numbers beyond 64 bits, NaN and lone surrogate escapes,
and never raises anything but its own decode error. Whatever it refuses is decoded again by
the standard library under guards, which either accepts it (NaN, a big but sane integer) or
says what is wrong, in the words `ctx validate` has always used:

- malformed JSON, with the column;
- bytes that are not UTF-8, with the column;
- nesting so deep the decoder would recurse past its limit (a story record is a few levels
  deep; a thousand is an attack or a broken generator, never a story): `TooDeep`;
- a number of more than 4,300 digits (Python's limit on converting text to int);
- a lone surrogate escape (`"\\ud800"` with no low half): it decodes to a str that cannot be
  written out as UTF-8, so every later step would crash at output. It is refused, like bytes
  that are not UTF-8, rather than replaced: the line number lets the writer fix the one
  escape, and a silently altered message would be sent to the model unannounced. A server's
  reply keeps it (`surrogates=True`): the backend replaces it with U+FFFD, and names the
  server when what it holds is not text.

Each problem is a `JSONProblem`, one line; the caller names the source (the file and line,
the URL).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

try:  # a declared dependency; the standard library alone still reads every file correctly
    import orjson
except ImportError:  # pragma: no cover - exercised only where orjson is not installed
    orjson = None  # type: ignore[assignment]

MAX_DIGITS = 4300  # sys.get_int_max_str_digits() default; int() refuses longer numbers
# Items (values, keys, containers) of one document. The largest real ones: a 10,000-message
# chat sent to `ctx serve` holds about 50,000, a lorebook of 10,000 entries 800,000, a
# tokenize reply one a token (a 1M-token window, 1M). At the bound, the costliest shape
# measured (4M two-letter strings of é, 60 MB) decodes in 0.4 s and 540 MB peak, the process
# included; the 64 MiB a reply may be holds 22M empty dicts, 1.7 GB.
MAX_ITEMS = 4_000_000

NESTING = "JSON nested more than about a thousand levels deep; a story record is a few levels deep"
DIGITS = f"a number of more than {MAX_DIGITS:,} digits; no story field needs one"

_DECODER = json.JSONDecoder()
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class JSONProblem(ValueError):
    """What is wrong with a JSON document, where (1-based line and column within it)."""

    def __init__(self, message: str, line: int = 1, column: int | None = None) -> None:
        self.message = message
        self.line = line
        self.column = column
        super().__init__(message)


class TooDeep(JSONProblem):
    """Nested past what a decoder recurses into."""


class TooMany(JSONProblem):
    """More items than `loads` was allowed to decode."""

    def __init__(self, most: int) -> None:
        self.most = most
        super().__init__(f"JSON of more than {most:,} items (values, keys and containers), far past any ctx reads")


def loads(data: bytes | str, *, most: int = MAX_ITEMS, surrogates: bool = False) -> Any:
    """Decode one JSON document of at most `most` items; JSONProblem says what is wrong. Never
    raises anything else. `surrogates`: a lone surrogate escape is decoded as it is (the caller
    replaces it), not refused."""
    if items_past(data, most):
        raise TooMany(most)
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the careful decoder accepts it or names the problem
    return _careful(data, surrogates)


_MARKS = (b",", b":", b"[", b"{")  # one before each item but the first (a value, a key) or opening it
_CHUNK = 1 << 20


def items_past(data: bytes | str, most: int) -> bool:
    """Whether the JSON in `data` holds more than `most` items: one for the document, one for
    each comma, colon and opening bracket outside its strings. That is every value and key
    once (each but the first follows a comma, a colon or its container's opening bracket) and
    each non-empty container once more, so the items of a document are between its values and
    twice them. Braces and commas inside strings do not count: a reply whose text is full of
    them is as fair as any."""
    if len(data) < most:  # each item past the first is one character
        return False
    if isinstance(data, str):
        if 1 + sum(data.count(mark.decode()) for mark in _MARKS) <= most:  # strings' marks too: an upper bound
            return False
        raw = data.encode("utf-8", "surrogatepass")
    elif 1 + sum(data.count(mark) for mark in _MARKS) <= most:
        return False
    else:
        raw = data
    # exactly: without the escapes that are no string's end (an escaped backslash, an escaped
    # quote), every quote opens or closes a string, so the text outside them is every other
    # piece between quotes, taken a chunk at a time (a chunk ends outside a string)
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"")
    if b'\\"' in raw:
        raw = raw.replace(b'\\"', b"")
    items, start = 1, 0
    while start < len(raw):
        end = start + _CHUNK
        if raw.count(b'"', start, end) % 2:  # the chunk would end inside a string: take it whole
            end = raw.find(b'"', end) + 1 or len(raw)
        outside = b"".join(raw[start:end].split(b'"')[::2])
        items += sum(outside.count(mark) for mark in _MARKS)
        if items > most:
            return True
        start = end
    return False


# For a loop over many documents (a story's lines), which saves a call a line: the quick
# decoder, and the one error it raises. Whatever it refuses goes to `loads`, which decodes it
# carefully or says what is wrong.
quick_loads: Callable[[bytes | str], Any] = orjson.loads if orjson is not None else loads
QuickError: type[ValueError] = orjson.JSONDecodeError if orjson is not None else JSONProblem


def raw_decode(text: str, index: int) -> tuple[Any, int]:
    """Decode the JSON value starting at `index` of `text` (stdlib, guarded): (value, end).
    JSONProblem's line and column are within the whole `text`."""
    try:
        obj, end = _DECODER.raw_decode(text, index)
    except json.JSONDecodeError as exc:
        raise JSONProblem(f"malformed JSON at column {exc.colno}: {exc.msg}", exc.lineno, exc.colno) from None
    except RecursionError:
        raise TooDeep(NESTING, *_where(text, index)) from None
    except ValueError:
        raise JSONProblem(DIGITS, *_where(text, index)) from None
    if _SURROGATE_ESCAPE.search(text, index, end):
        _refuse_lone_surrogate(text, index, end)
    return obj, end


def _careful(data: bytes | str, surrogates: bool) -> Any:
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line, column = _where(data, exc.start)
            raise JSONProblem(
                f"bytes that are not UTF-8 at column {column}; save the file as UTF-8", line, column
            ) from None
    else:
        text = data
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JSONProblem(f"malformed JSON at column {exc.colno}: {exc.msg}", exc.lineno, exc.colno) from None
    except RecursionError:
        raise TooDeep(NESTING) from None
    except ValueError:  # int() refused a number longer than MAX_DIGITS
        raise JSONProblem(DIGITS) from None
    if not surrogates and _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogate(text)
    return obj


def _where(data: bytes | str, index: int) -> tuple[int, int]:
    newline = "\n" if isinstance(data, str) else b"\n"
    line = data.count(newline, 0, index) + 1  # type: ignore[arg-type]
    start = data.rfind(newline, 0, index) + 1  # type: ignore[arg-type]
    return line, index - start + 1


def _refuse_lone_surrogate(text: str, start: int = 0, end: int | None = None) -> None:
    """Raise JSONProblem at the first \\uD800-\\uDFFF escape that is not half of a pair."""
    pending: re.Match[str] | None = None  # a high surrogate waiting for its low half
    for match in _ESCAPE.finditer(text, start, len(text) if end is None else end):
        body = match.group(1)
        code = int(body[1:], 16) if body[0] == "u" and len(body) == 5 else None
        is_low = code is not None and 0xDC00 <= code <= 0xDFFF
        if pending is not None and not (is_low and match.start() == pending.end()):
            break
        if pending is not None:  # a proper pair
            pending = None
            continue
        if code is not None and 0xD800 <= code <= 0xDBFF:
            pending = match
        elif is_low:
            pending = match
            break
    else:
        if pending is None:
            return
    assert pending is not None
    line, column = _where(text, pending.start())
    raise JSONProblem(
        f"a lone surrogate escape {pending.group(0)} at column {column} is not a character; "
        "remove it or write the whole pair (\\ud83d\\ude00)",
        line,
        column,
    )
