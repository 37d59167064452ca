"""A llama.cpp BPE vocabulary as a Hugging Face `tokenizer.json` that tokenizes as llama.cpp
does, for hf.py to run with `tokenizers`; built from the vocabulary layer (vocab.py) alone.

llama.cpp tokenizes a text in three steps (src/llama-vocab.cpp, `tokenize` with
`parse_special=true`): it cuts out every control, user-defined and unknown token spelled in
the text (longest first), splits the rest with the pre-tokenizer its `tokenizer.ggml.pre`
names (regexes of its own, applied one after the other), and merges each piece's bytes by
the GGUF's merge ranks. The converted tokenizer does the same three steps: those tokens as
added tokens (matched on the raw text, not normalized, not stripped), the same regexes as
`Split` pre-tokenizers then GPT-2's byte mapping, and a BPE model of the same vocabulary and
merges.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .gguf import TOKENS
from .llamacpp import USER_DEFINED, PreTokenizer
from .vocab import LlamaVocab

UNKNOWN_BYTE = "\x00ctx: a byte with no token\x00"  # never a token's text: its NULs are no GGUF token's


def tokenizer_json(vocabulary: LlamaVocab, pre: PreTokenizer) -> dict[str, Any]:
    """The vocabulary as a `tokenizer.json` (a dict) that tokenizes as llama.cpp does with `pre`."""
    where = vocabulary.where
    tokens = vocabulary.tokens
    vocab = dict(vocabulary.ids)
    # A byte the vocabulary has no token for stays between its neighbours in llama.cpp (they
    # never merge across it) and then counts as nothing; `tokenizers` would drop it before
    # merging, joining them. It is kept as an unknown token of an id past the vocabulary's,
    # which the counter does not count.
    unknown = None
    if pre.spaces:
        # llama.cpp spells a character the vocabulary lacks in its bytes' tokens, and leaves
        # out a byte that has none; `tokenizers` would take the whole character as unknown
        if missing := [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab]:
            message = f"has no byte token {missing[0]}, which llama.cpp leaves out; use --tokenizer server"
            raise ConfigError(where, TOKENS, message)
    elif any(char not in vocab for char in _BYTE_CHARS):
        unknown = UNKNOWN_BYTE
        vocab[UNKNOWN_BYTE] = len(tokens)
    if not vocabulary.merges:  # llama.cpp refuses such a file too ("cannot find tokenizer merges")
        raise ConfigError(where, "tokenizer.ggml.merges", "is missing: a BPE vocabulary needs its merges")
    merges = _merges(where, vocabulary.merges, vocab)
    added = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind != USER_DEFINED,
        }
        for i, text, kind in vocabulary.cut_out()
    ]
    splits = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False} for regex in pre.regexes
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": spaces if pre.spaces else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": splits if pre.spaces else [*splits, byte_level]},
        "post_processor": None,
        "decoder": None if pre.spaces else byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unknown,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": pre.spaces,
            "ignore_merges": pre.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _merges(where: str, merges: tuple[str, ...], vocab: dict[str, int]) -> list[str] | list[list[str]]:
    """The merges as `tokenizers` reads them, split as llama.cpp splits them (at the first space
    after the first byte), a merge given twice kept at its first rank. A merge of tokens the
    vocabulary lacks, or whose result it lacks, is one llama.cpp would make and then spell out
    in bytes, which a `tokenizers` BPE cannot express: refused.

    When every merge holds one space, as a byte-level vocabulary's do (its space is `Ġ`), they
    are the GGUF's own strings, which `tokenizers` splits at that space as llama.cpp does: no
    pair is made of each (a million merges are 170 MB of pairs). Else, pairs."""
    unique = dict.fromkeys(merges)  # in order, each once
    one_space = True
    for merge in unique:
        cut = merge.find(" ", 1)
        first, second = (merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", "")
        if first not in vocab or second not in vocab or first + second not in vocab:
            raise ConfigError(
                where,
                "tokenizer.ggml.merges",
                f"merge {merges.index(merge)} ({merge!r}) joins tokens the vocabulary lacks; use --tokenizer server",
            )
        one_space = one_space and merge.count(" ") == 1
    if one_space:
        return list(unique)
    return [[merge[: (cut := merge.find(" ", 1))], merge[cut + 1 :]] for merge in unique]


def _byte_chars() -> tuple[str, ...]:
    """GPT-2's characters for the 256 bytes, as ByteLevel maps them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return tuple(chars)


_BYTE_CHARS = _byte_chars()
