"""Small GGUF files written by the tests themselves: a writer of GGUF's header and key/values
(no tensors), and the metadata of a tiny BPE model. Other engineers' tests may use it too."""

from __future__ import annotations

import struct
from pathlib import Path

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}
_FORMATS |= {U64: "<Q", I64: "<q", F64: "<d"}


def string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def value(kind: int, item: object) -> bytes:
    """A value of type `kind` without its type tag; an array is (item type, [items])."""
    if kind == STRING:
        return string(item)  # type: ignore[arg-type]
    if kind == ARRAY:
        item_type, items = item  # type: ignore[misc]
        return struct.pack("<IQ", item_type, len(items)) + b"".join(value(item_type, x) for x in items)
    return struct.pack(_FORMATS[kind], item)


class Typed:
    """A value written with the type given, not the one `typed` would choose."""

    def __init__(self, kind: int, raw: object) -> None:
        self.kind, self.raw = kind, raw


def array(item_type: int, items: list[object]) -> Typed:
    return Typed(ARRAY, (item_type, items))


def typed(item: object) -> tuple[int, object]:
    """The GGUF type a Python value is written as: str, bool, int (uint32), float (float32), a
    list (of strings, int32s or float32s, by its first item), or what a `Typed` says."""
    if isinstance(item, Typed):
        return item.kind, item.raw
    if isinstance(item, str):
        return STRING, item
    if isinstance(item, bool):
        return BOOL, item
    if isinstance(item, int):
        return U32, item
    if isinstance(item, float):
        return F32, item
    if isinstance(item, list):
        first = item[0] if item else ""
        inner = STRING if isinstance(first, str) else I32 if isinstance(first, int) else F32
        return ARRAY, (inner, item)
    raise TypeError(item)


def gguf_bytes(metadata: dict[str, object], version: int = 3, tensors: int = 0) -> bytes:
    """A GGUF file's bytes holding `metadata` (each value as `typed` writes it)."""
    out = [b"GGUF", struct.pack("<IQQ", version, tensors, len(metadata))]
    for key, item in metadata.items():
        kind, raw = typed(item)
        out += [string(key), struct.pack("<I", kind), value(kind, raw)]
    return b"".join(out)


def write_gguf(path: Path, metadata: dict[str, object], **options: int) -> Path:
    path.write_bytes(gguf_bytes(metadata, **options))
    return path


# A byte-level BPE vocabulary small enough to reason about: GPT-2's byte alphabet (every byte a
# token), a few merges, and ChatML's control tokens.
def byte_alphabet() -> list[str]:
    """GPT-2's bytes-to-characters map, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a n", "Ġ w", "Ġa n", "Ġan d", "l l"]


def tiny_bpe(**extra: object) -> dict[str, object]:
    """The metadata of a tiny GPT-2-style model: control tokens first, then the byte alphabet,
    then the merges' results."""
    tokens = list(CONTROL_TOKENS) + byte_alphabet()
    for merge in MERGES:
        joined = merge.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    metadata: dict[str, object] = {
        "general.architecture": "llama",
        "general.name": "tiny",
        "llama.context_length": 2048,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": array(I32, types),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": TEMPLATE,
    }
    metadata.update(extra)
    return metadata


def large_bpe(tokens: int, merges: int) -> dict[str, object]:
    """The metadata of a BPE model of `tokens` tokens and `merges` distinct merges, each joining
    two of its tokens into a third: the byte alphabet, every pair of it, then 3- and 4-character
    tokens over 64 of its characters, each with every split the vocabulary holds. The most
    work a vocabulary of that size can ask of the conversion (the issue's 2M-token file had one
    merge a token)."""
    import itertools

    alphabet = byte_alphabet()
    texts = list(CONTROL_TOKENS) + alphabet
    joins: list[str] = []
    for a, b in itertools.product(alphabet, repeat=2):
        texts.append(a + b)
        joins.append(f"{a} {b}")
    longer = itertools.chain(itertools.product(alphabet[:64], repeat=3), itertools.product(alphabet[:64], repeat=4))
    for chars in longer:
        if len(texts) >= tokens:
            break
        text = "".join(chars)
        texts.append(text)
        joins += [f"{text[:k]} {text[k:]}" for k in range(len(text) - 1, 0, -1)]
    assert len(texts) == tokens and len(joins) >= merges, "more merges than these tokens hold"
    return tiny_bpe(
        **{
            "tokenizer.ggml.tokens": texts,
            "tokenizer.ggml.token_type": array(I32, [3] * len(CONTROL_TOKENS) + [1] * (tokens - len(CONTROL_TOKENS))),
            "tokenizer.ggml.merges": joins[:merges],
        }
    )
