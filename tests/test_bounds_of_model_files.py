"""Hostile round 4 (issue 28), the model's files: a chat template that prints or joins a text
past its bound without building it, one too large to compile; a tokenizer.json too large to
parse, one whose regex panics the Rust tokenizer, a Tekken file whose pattern matches an empty
text; a number of 5,000 digits in a tokenizer.json or a config.json. Each ends in one line on
stderr naming the file, exit status 1, and no traceback, before the work is done."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import CASE3, FIXTURES
from ctx_run import ctx, one_line

from otaku_ctx.errors import ConfigError
from otaku_ctx.model import hf
from otaku_ctx.model.mistral import mistral_counter
from otaku_ctx.status import ExitStatus

HUGE = "9" * 5000  # past Python's int-conversion limit of 4,300 digits


def tiny_tokenizer() -> dict[str, object]:
    """A small tokenizer.json that loads: a word-level vocabulary split on whitespace."""
    vocab = {"[UNK]": 0, "the": 1, "lamp": 2}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def folder(tmp_path: Path, tokenizer: str | None = None, config: str | None = None) -> Path:
    """A model folder: its tokenizer.json and config.json as given (or plain ones)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text(tokenizer or json.dumps(tiny_tokenizer()))
    (model / "config.json").write_text(config or json.dumps({"max_position_embeddings": 4096}))
    return model


# -- #5, #6, #7: a chat template --------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{{ ['x'*900000]*100000 }}", ":1: stopped: the template would make a printed value of 1,800,0"),
        ("{{ ([[0]*1000000]*1000000)|join }}", ":1: stopped: the template would make a join of 1,0"),
        ("{{x}}" * 400_000, "not a template ctx can run: it holds more than 20,000 Jinja tokens"),
    ],
    ids=["a printed list (#5)", "a join of lists (#6)", "2 MB of {{x}} (#7)"],
)
def test_a_chat_template_past_its_bounds_is_stopped_before_the_work(tmp_path: Path, template: str, said: str) -> None:
    """The issue's own templates, at ctx's own bounds: measured (the list's text, the join's
    items, the template's tokens) before Python builds the text or Jinja compiles the code."""
    path = tmp_path / "hostile.jinja"
    path.write_text(template + "{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8")
    code, out, err = ctx("build", CASE3, "--format", path, "--tokenizer", "estimate")
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(f"ctx: {path}") and said in err


# -- #8: a tokenizer.json too large, or whose regex panics the Rust tokenizer ----------------


def test_a_tokenizer_json_past_its_items_is_refused_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its items counted by their commas, against `TOKENIZER_JSON_ITEMS` (lowered here to the
    test's size): neither json nor `tokenizers` parses it."""
    monkeypatch.setattr(hf, "TOKENIZER_JSON_ITEMS", 1_000)
    data = tiny_tokenizer()
    data["model"]["vocab"] = {f"w{i}": i for i in range(2_000)}  # type: ignore[index]
    data["model"]["unk_token"] = "w0"  # type: ignore[index]
    text = json.dumps(data)
    model = folder(tmp_path, text)
    code, out, err = ctx("build", CASE3, "--use", model)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {model / 'tokenizer.json'}: holds over 1,000 items ({text.count(',') + 1:,});"
        " no model's vocabulary is that large\n"
    )


def test_a_tokenizer_json_that_loads_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By `tokenizers` alone: json reads it only to say why `tokenizers` refused it."""
    import json as json_module

    def refused(*args: object, **kwargs: object) -> object:
        raise AssertionError("a tokenizer.json that loads was parsed by json too")

    counter = hf.tokenizer_json_counter(folder(tmp_path))
    monkeypatch.setattr(json_module, "loads", refused)
    assert counter("the lamp") == 2


@pytest.mark.parametrize("regex", ["((a+)+)+c", "(?:a*b)*", "(\\d+)+x"])
def test_a_pre_tokenizer_regex_that_repeats_a_repetition_is_refused(tmp_path: Path, regex: str) -> None:
    """Oniguruma backtracks on it until its retry limit, and the Rust tokenizer panics (pyo3's
    PanicException, with the panic's own lines on stderr): refused when the file is read."""
    data = tiny_tokenizer()
    data["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
    model = folder(tmp_path, json.dumps(data))
    code, out, err = ctx("build", CASE3, "--use", model)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {model / 'tokenizer.json'}: its regex {regex!r} repeats a repetition,"
        " which the tokenizer cannot run on a long text\n"
    )


def test_every_pre_tokenizer_ctx_converts_passes_the_regex_check() -> None:
    from otaku_ctx.model.llamacpp import PRE_TOKENIZERS
    from otaku_ctx.model.tokenizer_json import nested_repetition

    assert not any(nested_repetition(r) for pre in PRE_TOKENIZERS.values() for r in pre.regexes)
    assert not any(map(nested_repetition, ["(a+)?", "(ab)+", "[(a+)]+", "\\(a+\\)+", "(a{2,3})+"]))


def test_a_panic_in_the_rust_tokenizer_is_one_line_naming_the_file() -> None:
    """What the regex check does not foresee: pyo3's PanicException (a BaseException) becomes
    the file's ConfigError; any other BaseException (Ctrl-C) is left alone."""

    class PanicException(BaseException):
        pass

    class Panicking:
        def encode(self, text: str, add_special_tokens: bool) -> object:
            raise PanicException("Onig: Regex search error: retry-limit-in-match over\nmore")

    with pytest.raises(ConfigError) as caught:
        hf._batch(Panicking(), ["aaaa"], "m/tokenizer.json")
    assert str(caught.value) == (
        "m/tokenizer.json: its tokenizer broke down on a text: Onig: Regex search error: retry-limit-in-match over"
    )

    class Interrupting:
        def encode(self, text: str, add_special_tokens: bool) -> object:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hf._batch(Interrupting(), ["aaaa"], "m/tokenizer.json")


@pytest.mark.parametrize("pattern", ["", "a*", "x|"])
def test_a_tekken_pattern_that_matches_an_empty_text_is_one_line(tmp_path: Path, pattern: str) -> None:
    """tiktoken's Rust core panics on the empty piece such a pattern splits off (#15)."""
    data = json.loads((FIXTURES / "mistral" / "tekken_small.json").read_text(encoding="utf-8"))
    data["config"]["pattern"] = pattern
    path = tmp_path / "tekken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as caught:
        mistral_counter(path)("Hello, world")
    assert str(caught.value) == (f"{path}: config: pattern {pattern!r} matches an empty text, which splits nothing")
    code, _, err = ctx("build", CASE3, "--tokenizer", path)
    assert code == ExitStatus.ERROR and one_line(err) == f"ctx: {caught.value}\n"


# -- #11, #12: a number of 5,000 digits ------------------------------------------------------


def test_a_number_of_5000_digits_in_a_tokenizer_json(tmp_path: Path) -> None:
    text = json.dumps(tiny_tokenizer()).replace('"version": "1.0"', f'"version": "1.0", "x": {HUGE}')
    model = folder(tmp_path, text)
    code, out, err = ctx("build", CASE3, "--use", model)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {model / 'tokenizer.json'}: holds a number of more than 4,300 digits; is it a tokenizer.json?\n"
    )


def test_a_number_of_5000_digits_in_a_config_json(tmp_path: Path) -> None:
    model = folder(tmp_path, config=f'{{"max_position_embeddings": {HUGE}}}')
    code, out, err = ctx("build", CASE3, "--use", model)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {model / 'config.json'}: holds a number of more than 4,300 digits;"
        " fix the file, or name the part yourself\n"
    )


# -- also found: a GGUF of a 2M-token vocabulary took 736 MB and 25 s (6 GB at the 16M cap) ----


def _claiming(path: Path, key: str, count: int) -> Path:
    """A GGUF header whose array `key` claims `count` strings, none of them in the file."""
    from gguf_files import ARRAY, STRING, string

    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + string("general.architecture") + struct.pack("<I", STRING)
    path.write_bytes(head + string("llama") + string(key) + struct.pack("<IIQ", ARRAY, STRING, count))
    return path


@pytest.mark.parametrize(
    ("key", "count", "said"),
    [
        (
            "tokenizer.ggml.tokens",
            524_289,
            "tokenizer.ggml.tokens: holds 524,289 tokens, more than ctx reads (524,288,"
            " twice the largest real vocabulary)",
        ),
        (
            "tokenizer.ggml.merges",
            1_048_577,
            "tokenizer.ggml.merges: holds an array of 1,048,577 strings, more than ctx reads (1,048,576)",
        ),
    ],
)
def test_a_gguf_claiming_more_tokens_than_any_vocabulary_is_refused_before_reading_them(
    tmp_path: Path, key: str, count: int, said: str
) -> None:
    """Refused by the claim, in one line naming the file and the bound: none of the tokens is
    in the file, so a reader that went on would have said "truncated" (after reading them)."""
    path = _claiming(tmp_path / "claims.gguf", key, count)
    code, out, err = ctx("build", CASE3, "--tokenizer", path)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == f"ctx: {path}: {said}\n"


def test_the_conversion_takes_the_merges_as_the_gguf_holds_them(tmp_path: Path) -> None:
    """A merge of one space is `tokenizers`' own spelling of the pair llama.cpp splits it into:
    the GGUF's strings go through as they are (a million pairs were 170 MB in Python, and as
    much again in `tokenizers`). A merge of a token that holds a space goes as pairs, all of
    them, since `tokenizers` reads one spelling a file."""
    from gguf_files import MERGES, tiny_bpe, write_gguf

    from otaku_ctx.model.gguf import read_gguf

    plain = read_gguf(write_gguf(tmp_path / "plain.gguf", tiny_bpe()))
    assert hf.gguf_tokenizer_json(plain)["model"]["merges"] == MERGES
    spaced = tiny_bpe()
    spaced["tokenizer.ggml.tokens"] = [*spaced["tokenizer.ggml.tokens"], "y z", "xy z"]  # type: ignore[misc]
    spaced["tokenizer.ggml.token_type"].raw[1].extend([1, 1])  # type: ignore[attr-defined]
    spaced["tokenizer.ggml.merges"] = [*MERGES, "x y z"]
    model = read_gguf(write_gguf(tmp_path / "spaced.gguf", spaced))
    pairs = hf.gguf_tokenizer_json(model)["model"]["merges"]
    assert pairs == [m.split(" ", 1) for m in MERGES] + [["x", "y z"]]
    text = "the hand and the well, then in"
    assert hf.gguf_counter(model.path).ids(text) == hf.gguf_counter(plain.path).ids(text)  # either spelling


@pytest.mark.deep
def test_the_largest_vocabulary_ctx_reads_is_converted_and_counted(tmp_path: Path) -> None:
    """A GGUF at both bounds, 524,288 tokens and 1,048,576 merges: converted, cached, and read
    from the cache on the next run. benchmarks/hostile_bounds.py measures it (the issue asks
    under 1 GB and 10 s)."""
    from gguf_files import large_bpe, write_gguf

    from otaku_ctx.model import gguf

    path = write_gguf(tmp_path / "largest.gguf", large_bpe(gguf.MAX_TOKENS, gguf.MAX_STRINGS))
    first = ctx("build", CASE3, "--tokenizer", path)
    assert first[0] == ExitStatus.OK and first[2] == "", first[2]
    assert ctx("build", CASE3, "--tokenizer", path) == first
