"""Mistral's own tokenizer files, counted as `mistral-common` encodes a chat with them.

Two kinds, as mistral-common ships them and Mistral's model folders hold them:

- SentencePiece (`tokenizer.model.v1`, `*.model.v2`, `.v3`, `.v7`): Mistral 7B, Mixtral,
  Mistral Large 2407/2411, Small 2409. The control tokens are the model's own (v1 has only
  `<s>` and `</s>`: its `[INST]` is ordinary text).
- Tekken (`tekken*.json`): a tiktoken-style byte-level BPE (Mistral Nemo, Pixtral, Ministral,
  Small 3.x). Its first `default_num_special_tokens` ids are the special tokens (listed in the
  file, or mistral-common's default list padded with `<SPECIAL_n>`), the vocabulary after
  them cut to `default_vocab_size` in all.

The count rule, for a prompt in one of ctx's `mistral*` formats: the text is cut at the
control tokens it spells, each counted as the one token it is, and each stretch between
them is counted as the plain text it is. That is how `encode_chat_completion` builds a chat
(the control tokens put in by id, each message's content encoded on its own), so ctx's count
of its prompt equals the length of mistral-common's tokens for the same messages:

- Tekken encodes a content as it is; ctx's Tekken formats write `[INST]text[/INST]`.
- SentencePiece encodes a content with its dummy prefix, a space before it (`▁Anna`); ctx's
  SentencePiece formats write that space (`[INST] Anna`, `[/INST] Ilya`), and here a stretch
  is encoded with the dummy prefix turned off, so the space written is the one counted. A
  stretch that starts without a space counts as the text it is (no space made up for it).

The stretches join into the prompt at word starts (SentencePiece splits at spaces, Tekken's
pattern at the control token), so counting each on its own equals counting them joined.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, OtakuError
from ..files import read_input, write_atomic
from ..jsonload import JSONProblem, TooDeep, TooMany, loads  # orjson first: 4x json's speed on a 19 MB Tekken file
from ..locations import model_cache
from ..tokens import TokenCounter, without_surrogates
from . import INSTALL
from .controls import control_pattern

MiB = 1 << 20
MAX_FILE = 64 * MiB  # a Tekken file is 15-19 MiB, a SentencePiece model half of one
BOS, EOS = "<s>", "</s>"

# mistral-common's special tokens of a Tekken file that lists none (versions up to v7),
# in rank order; the ranks after them up to `default_num_special_tokens` are `<SPECIAL_n>`.
TEKKEN_SPECIALS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)  # fmt: skip
_SPM_VERSION = re.compile(r"\.model\.(v\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Tokenizer:
    """A loaded Mistral tokenizer: what it is called, its control tokens and how it counts
    a stretch of plain text."""

    name: str
    controls: tuple[str, ...]
    count_plain: Callable[[str], int]


def mistral_counter(path: Path) -> TokenCounter:
    """The counter for a Mistral tokenizer file, or for a model folder holding one (its
    `tekken*.json`, else its newest `*.model.v*`). A file that cannot be read is one
    `ConfigError` naming it."""
    path = _the_file(path)
    tokenizer = load(path)
    return TokenCounter(
        tokenizer.name,
        _counting(tokenizer),
        specials=tokenizer.controls,
        bos=BOS,
        added=1,  # the BOS, which every server adds itself: a text prompt leaves it out (one BOS)
        parses_specials=True,
    )


def load(path: Path) -> Tokenizer:
    """The tokenizer in a `tekken*.json` or `*.model.v*` file."""
    if path.suffix.lower() == ".json":
        return _tekken(path)
    return _sentencepiece(path)


def split_at_controls(text: str, controls: tuple[str, ...]) -> list[str]:
    """`text` cut at the control tokens it spells: plain stretches at the even places, the
    control tokens at the odd ones (the longest control token wins where two start)."""
    return control_pattern(controls).split(text)


def _counting(tokenizer: Tokenizer) -> Callable[[str], int]:
    pattern = control_pattern(tokenizer.controls)
    plain = tokenizer.count_plain

    def count(text: str) -> int:
        pieces = pattern.split(text)
        return sum(plain(piece) for piece in pieces[::2] if piece) + len(pieces) // 2

    return count


def _the_file(path: Path) -> Path:
    if not path.is_dir():
        return path
    try:
        names = sorted(p for p in path.iterdir() if p.is_file())
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot list the folder: {exc.strerror or exc}") from None
    tekken = [p for p in names if p.name.lower().startswith("tekken") and p.suffix.lower() == ".json"]
    if tekken:
        return tekken[-1]
    versions = [(_version_number(p), p) for p in names if _SPM_VERSION.search(p.name)]
    if versions:
        return max(versions)[1]
    raise ConfigError(str(path), None, "no Mistral tokenizer file (tekken*.json or *.model.v*) in this folder")


def _version_number(path: Path) -> int:
    found = _SPM_VERSION.search(path.name)
    return int(found.group(1)[1:]) if found else 0


# --- Tekken ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tekken:
    """What a Tekken file is to ctx, as kept in the cache: the tokens kept (base64, in rank
    order), the pre-tokenizer pattern, the special tokens' texts, the version and size."""

    tokens: list[bytes]
    pattern: str
    controls: tuple[str, ...]
    version: str
    size: int


CACHE_FORMAT = 1


def _tekken(path: Path) -> Tokenizer:
    """The Tekken file, converted once and cached by its identity (where it is, its size, its
    modification time): the 19 MB of JSON are not even read again, the cache's 1.5 MB of one
    base64 token a line are read in a fifth of the time."""
    source = str(path)
    cache = model_cache() / f"tekken-{_identity(path)}.ranks"
    tekken = _cached(cache)
    if tekken is None:
        tekken = _converted(source, read_input(path, "tokenizer file", bound=MAX_FILE))
        _keep(cache, tekken)
    try:
        ranks = dict(zip(map(binascii.a2b_base64, tekken.tokens), range(len(tekken.tokens)), strict=True))
    except binascii.Error:
        raise ConfigError(source, "vocab", "expected entries with base64 token_bytes") from None
    if len(ranks) != len(tekken.tokens):
        raise ConfigError(source, "vocab", "holds a token twice")
    shown = f" {tekken.version}" if tekken.version else ""
    name = f"mistral {path.name} (Tekken{shown}, {tekken.size:,} tokens)"
    return Tokenizer(name, tekken.controls, _tekken_count(source, _bpe(source, ranks, tekken.pattern)))


def _identity(path: Path) -> str:
    """A digest of the file's place, size, inode and modification time: a file changed or
    replaced is converted again."""
    try:
        info = path.stat()
        place = str(path.resolve())
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read it: {exc.strerror or exc}") from None
    key = f"{CACHE_FORMAT}\0{place}\0{info.st_size}\0{info.st_ino}\0{info.st_mtime_ns}"
    return hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _converted(source: str, raw: bytes) -> Tekken:
    data = _json(source, raw)
    config = data.get("config")
    vocab = data.get("vocab")
    if not isinstance(config, dict) or not isinstance(vocab, list):
        raise ConfigError(source, None, "not a Tekken tokenizer file (expected its config and vocab)")
    pattern, size = config.get("pattern"), config.get("default_vocab_size")
    specials = config.get("default_num_special_tokens")
    if not isinstance(pattern, str) or not isinstance(size, int) or not isinstance(specials, int):
        raise ConfigError(source, "config", "expected pattern, default_vocab_size and default_num_special_tokens")
    inner = size - specials  # mistral-common keeps the first `inner` ranks of the vocabulary
    if not 0 < inner <= len(vocab) or specials < 3:
        raise ConfigError(source, "config", f"default_vocab_size {size} does not fit {len(vocab)} tokens")
    controls = _tekken_specials(source, data.get("special_tokens"), specials)
    try:
        tokens = [entry["token_bytes"].encode("ascii") for entry in vocab[:inner]]
    except (TypeError, KeyError, AttributeError, UnicodeEncodeError):
        raise ConfigError(source, "vocab", "expected entries with base64 token_bytes") from None
    version = config.get("version")
    return Tekken(tokens, pattern, controls, version if isinstance(version, str) else "", size)


def _cached(cache: Path) -> Tekken | None:
    """The cache's conversion, or None when there is none (or it is not one: it is remade)."""
    try:
        header, _, body = read_input(cache, "tokenizer cache", bound=MAX_FILE).partition(b"\n")
        meta = loads(header)
        tokens = body.split()
        if meta.get("format") != CACHE_FORMAT or meta["tokens"] != len(tokens):
            return None
        return Tekken(tokens, meta["pattern"], tuple(meta["controls"]), meta["version"], meta["size"])
    except (OtakuError, JSONProblem, AttributeError, KeyError, TypeError):
        return None


def _keep(cache: Path, tekken: Tekken) -> None:
    """Write the conversion to the cache; a cache that cannot be written is only slower."""
    header = {
        "format": CACHE_FORMAT,
        "tokens": len(tekken.tokens),
        "pattern": tekken.pattern,
        "controls": list(tekken.controls),
        "version": tekken.version,
        "size": tekken.size,
    }
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(header, ensure_ascii=False) + "\n" + b"\n".join(tekken.tokens).decode("ascii"))
    except (OSError, OtakuError):
        pass


def _tekken_specials(source: str, listed: Any, total: int) -> tuple[str, ...]:
    if listed is None:
        texts = [*TEKKEN_SPECIALS, *(f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), total))]
    elif isinstance(listed, list) and all(isinstance(t, dict) and isinstance(t.get("token_str"), str) for t in listed):
        texts = [t["token_str"] for t in listed]
        texts += [f"<SPECIAL_{i}>" for i in range(len(texts), total)]
    else:
        raise ConfigError(source, "special_tokens", "expected a list of {rank, token_str, is_control}")
    return tuple(dict.fromkeys(t for t in texts[:total] if t))


# A text of each kind of character a pattern splits: one that matches nothing in it is no pattern.
_PROBE = "Hello, world! It's 2024.\n\t  日本語 x"


def _bpe(source: str, ranks: dict[bytes, int], pattern: str) -> Any:
    """tiktoken's encoder for the ranks, with no special tokens: they are cut out before. A
    pattern that matches an empty text (`""`, `a*`) is refused: tiktoken's Rust core panics on
    the empty piece."""
    import regex
    import tiktoken

    try:
        empty = any(m.end() == m.start() for m in regex.finditer(pattern, _PROBE))
    except regex.error as exc:
        raise ConfigError(source, "config", f"pattern is not usable: {exc}") from None
    if empty:
        raise ConfigError(source, "config", f"pattern {pattern[:80]!r} matches an empty text, which splits nothing")
    try:
        return tiktoken.Encoding(source, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    except ValueError as exc:  # a pattern the regex engine refuses
        raise ConfigError(source, "config", f"pattern is not usable: {exc}") from None


def _tekken_count(source: str, core: Any) -> Callable[[str], int]:
    def count(text: str) -> int:
        try:
            try:
                return len(core.encode_ordinary(text))
            except UnicodeEncodeError:
                return len(core.encode_ordinary(without_surrogates(text)))
        except BaseException as exc:  # a panic in tiktoken's Rust core (pyo3's PanicException is no Exception)
            if type(exc).__name__ != "PanicException":
                raise
            line = (str(exc).strip().splitlines() or ["a panic"])[0]
            raise ConfigError(source, "config", f"the tokenizer broke down on a text: {line}") from None

    return count


def _json(source: str, raw: bytes) -> dict[str, Any]:
    try:  # the one guarded reader: a Tekken file's 150,000 entries are 600,000 items, far inside its bound
        data = loads(raw)
    except (TooDeep, TooMany) as why:
        raise ConfigError(source, None, f"is not a Tekken tokenizer file: it holds {why.message}") from None
    except JSONProblem as why:
        raise ConfigError(source, None, f"not valid JSON: {why.message}") from None
    if not isinstance(data, dict):
        raise ConfigError(source, None, "not a Tekken tokenizer file (expected a JSON object)")
    return data


# --- SentencePiece --------------------------------------------------------------------------


def _sentencepiece(path: Path) -> Tokenizer:
    source = str(path)
    try:
        import sentencepiece
    except ImportError:
        raise ConfigError(source, None, f"a SentencePiece tokenizer needs sentencepiece: {INSTALL}") from None
    model = read_input(path, "tokenizer file", bound=MAX_FILE)
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=without_dummy_prefix(model))
    except (RuntimeError, ValueError, OSError):
        raise ConfigError(source, None, "not a SentencePiece model") from None
    size = processor.vocab_size()
    controls = tuple(processor.id_to_piece(i) for i in range(size) if processor.is_control(i))
    found = _SPM_VERSION.search(path.name)
    version = f" {found.group(1).lower()}" if found else ""
    name = f"mistral {path.name} (SentencePiece{version}, {size:,} tokens)"
    return Tokenizer(name, tuple(c for c in controls if c), _spm_count(processor))


def _spm_count(processor: Any) -> Callable[[str], int]:
    def count(text: str) -> int:
        try:
            return len(processor.encode(text))
        except (UnicodeEncodeError, TypeError, RuntimeError):
            return len(processor.encode(without_surrogates(text)))

    return count


# A SentencePiece model is a protocol-buffer message: its field 3 is the normalizer spec, whose
# field 3 (a bool) is add_dummy_prefix. A later value of a field wins in a protocol buffer, so
# the spec gets `add_dummy_prefix = false` appended, and its length rewritten.
_NORMALIZER = 3
_ADD_DUMMY_PREFIX_FALSE = bytes([3 << 3 | 0, 0])  # field 3, varint, 0


def without_dummy_prefix(model: bytes) -> bytes:
    """The serialized model with the normalizer's dummy prefix turned off, so a text is
    encoded as it is: " Anna" as `▁Anna`, "Anna" as `Anna`. Raises ValueError when the bytes
    are not a protocol-buffer message with a normalizer spec."""
    at, out, found = 0, bytearray(), False
    while at < len(model):
        start = at
        key, at = _varint(model, at)
        field, kind = key >> 3, key & 7
        if kind == 0:
            _, at = _varint(model, at)
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            length, body = _varint(model, at)
            at = body + length
            if field == _NORMALIZER and at <= len(model):
                spec = model[body:at] + _ADD_DUMMY_PREFIX_FALSE
                out += _encoded_varint(key) + _encoded_varint(len(spec)) + spec
                found = True
                continue
        else:
            raise ValueError("not a protocol-buffer message")
        if at > len(model):
            raise ValueError("truncated")
        out += model[start:at]
    if not found:
        raise ValueError("no normalizer spec")
    return bytes(out)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
