"""A Hugging Face `tokenizer.json`, read and checked before `tokenizers` parses it (hf.py): its
text read bounded, a regex that would panic the Rust tokenizer refused, a file it refuses said
as JSON sees it, and the BOS the folder's tokenizer_config.json names. What it says, no more:
the counter is hf.py's.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ..errors import ConfigError, OtakuError
from ..files import read_input, utf8_text
from ..jsonload import loads


def not_loaded(text: str, why: str) -> str:
    """Why a tokenizer.json `tokenizers` refused does not load, said as JSON sees it first."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON (line {exc.lineno}); is it a tokenizer.json?"
    except ValueError:  # a number past Python's int-conversion limit
        return f"holds a number of more than {sys.get_int_max_str_digits():,} digits; is it a tokenizer.json?"
    except RecursionError:
        return "nests too deep to be a tokenizer.json"
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return "is not a Hugging Face tokenizer.json (it has no model)"
    return f"does not load as a tokenizer: {why}"


# A regex of a tokenizer.json (a `Split` pre-tokenizer's, a `Replace` normalizer's), as JSON spells it
_REGEX = re.compile(r'"Regex"\s*:\s*("(?:[^"\\]|\\.)*")')


def check_regexes(file: Path, text: str) -> None:
    """Refuse a regex that repeats a group holding a repetition (`(a+)+`): Oniguruma, the
    engine `tokenizers` runs it in, backtracks on it until its retry limit, and the Rust
    tokenizer then panics on the text."""
    for found in _REGEX.finditer(text):
        try:
            regex = json.loads(found[1])
        except ValueError:
            continue
        if isinstance(regex, str) and nested_repetition(regex):
            message = f"its regex {regex[:80]!r} repeats a repetition, which the tokenizer cannot run on a long text"
            raise ConfigError(str(file), None, message)


def nested_repetition(regex: str) -> bool:
    """Whether the regex repeats without bound a group that holds an unbounded repetition:
    `(a+)+`, `(?:a*b)*`, `((a+)+)+c` — the shape that backtracks exponentially."""
    inner: list[bool] = []  # for each open group: whether it holds an unbounded repetition
    i, n = 0, len(regex)

    def unbounded(at: int) -> bool:
        if at < n and regex[at] in "+*":
            return True
        shape = re.match(r"\{\d*,\}", regex[at:])
        return shape is not None

    while i < n:
        char = regex[i]
        if char == "\\":
            i += 2
            if i <= n and unbounded(i) and inner:
                inner[-1] = True
            continue
        if char == "[":  # a class: skipped whole (`]` first, escapes and POSIX `[:...:]` inside)
            i += 1
            if i < n and regex[i] == "^":
                i += 1
            if i < n and regex[i] == "]":
                i += 1
            while i < n and regex[i] != "]":
                i += 2 if regex[i] == "\\" else 1
            i += 1
            if unbounded(i) and inner:
                inner[-1] = True
            continue
        if char == "(":
            inner.append(False)
            i += 1
            continue
        if char == ")":
            held = inner.pop() if inner else False
            i += 1
            if unbounded(i):
                if held:
                    return True
                if inner:
                    inner[-1] = True
            elif held and inner:
                inner[-1] = True
            continue
        i += 1
        if char not in "|^$" and unbounded(i) and inner:
            inner[-1] = True
    return False


def read_text(file: Path, bound: int) -> str:
    """The file's text, read to `bound` bytes at most, refused in one line if it is not UTF-8."""
    return utf8_text(read_input(file, "tokenizer file", bound), file)


def config_bos(folder: Path, bound: int) -> str | None:
    """The `bos_token` of the folder's tokenizer_config.json (a string, or an object's
    `content`): None when it has no such file, or it names none."""
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        bos = loads(read_text(config, bound)).get("bos_token")
    except (OtakuError, ValueError, AttributeError):  # ValueError: jsonload's JSONProblem
        return None
    if isinstance(bos, dict):
        bos = bos.get("content")
    return bos if isinstance(bos, str) else None
