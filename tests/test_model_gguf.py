"""The GGUF metadata reader: what it takes from a file, llama.cpp's defaults where the file is
silent, the vocabulary read only when asked, and hostile files refused in one line."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from gguf_files import (
    ARRAY,
    BOOL,
    I32,
    MERGES,
    STRING,
    U8,
    U32,
    U64,
    Typed,
    array,
    gguf_bytes,
    string,
    tiny_bpe,
    write_gguf,
)
from hypothesis import given
from hypothesis import strategies as st

from otaku_ctx.errors import ConfigError
from otaku_ctx.model import gguf
from otaku_ctx.model.gguf import Array, read_gguf


def test_the_tiny_model_s_metadata(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_bpe())
    model = read_gguf(path)
    assert model.path == path
    assert (model.version, model.architecture, model.name, model.context_length) == (3, "llama", "tiny", 2048)
    assert model.chat_template is not None and model.chat_template.startswith("{% for m in messages %}")
    assert (model.tokenizer_model, model.pre) == ("gpt2", "smollm")
    assert (model.bos_id, model.bos_text, model.eos_id, model.eos_text) == (1, "<|im_start|>", 2, "<|im_end|>")
    assert (model.add_bos, model.add_eos) == (False, False)  # llama.cpp's default for a BPE vocabulary
    assert model.vocab_size == 3 + 256 + len(MERGES)
    assert model.size == path.stat().st_size
    vocabulary = model.vocabulary()
    assert vocabulary.tokens[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert vocabulary.token_types[:4] == (3, 3, 3, 1)
    assert vocabulary.merges[:2] == ("Ġ t", "h e")
    assert vocabulary.scores == ()


def test_version_2_is_read_too(tmp_path: Path) -> None:
    model = read_gguf(write_gguf(tmp_path / "v2.gguf", tiny_bpe(), version=2))
    assert (model.version, model.eos_text) == (2, "<|im_end|>")


def test_the_identity_follows_the_metadata_and_the_size(tmp_path: Path) -> None:
    one = read_gguf(write_gguf(tmp_path / "a.gguf", tiny_bpe()))
    same = read_gguf(write_gguf(tmp_path / "b.gguf", tiny_bpe()))
    other = read_gguf(write_gguf(tmp_path / "c.gguf", tiny_bpe(**{"tokenizer.ggml.merges": ["Ġ t"]})))
    longer = tmp_path / "d.gguf"
    longer.write_bytes(gguf_bytes(tiny_bpe()) + b"\0" * 64)  # the same metadata, other tensors
    assert one.identity == same.identity
    assert len({one.identity, other.identity, read_gguf(longer).identity}) == 3
    assert len(one.identity) == 64 and int(one.identity, 16) >= 0


def test_a_long_vocabulary_is_walked_past_until_asked_for(tmp_path: Path) -> None:
    tokens = [f"t{i}" for i in range(gguf.SMALL_ARRAY + 10)]
    path = write_gguf(
        tmp_path / "big.gguf",
        tiny_bpe(**{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * len(tokens)}),
    )
    model = read_gguf(path)
    held = model.metadata["tokenizer.ggml.tokens"]
    assert isinstance(held, Array) and held.count == len(tokens)
    assert (model.vocab_size, model.bos_text, model.eos_text) == (len(tokens), "t1", "t2")
    assert model.vocabulary().tokens == tuple(tokens)
    assert model.vocabulary().token_types == (1,) * len(tokens)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, (False, False)),
        ({"tokenizer.ggml.pre": "llama-bpe"}, (True, False)),  # llama.cpp adds BOS for Llama 3's
        ({"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": False}, (False, False)),
        ({"tokenizer.ggml.model": "llama"}, (True, False)),  # SentencePiece: BOS unless told
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.add_eos_token": True}, (True, True)),
        ({"tokenizer.ggml.model": "t5"}, (False, True)),
        ({"tokenizer.ggml.add_bos_token": True}, (True, False)),
    ],
)
def test_whether_bos_and_eos_are_added_defaults_as_llama_cpp_does(extra: dict[str, object], expected: tuple) -> None:
    assert _added(tiny_bpe(**extra)) == expected


def _added(metadata: dict[str, object]) -> tuple[bool, bool]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        model = read_gguf(write_gguf(Path(folder) / "m.gguf", metadata))
    return model.add_bos, model.add_eos


def test_bos_and_eos_ids_default_as_llama_cpp_s(tmp_path: Path) -> None:
    metadata = tiny_bpe()
    del metadata["tokenizer.ggml.bos_token_id"], metadata["tokenizer.ggml.eos_token_id"]
    model = read_gguf(write_gguf(tmp_path / "m.gguf", metadata))
    assert (model.bos_id, model.eos_id) == (11, 11)  # llama.cpp's BPE default: token 11
    metadata["tokenizer.ggml.bos_token_id"] = 10**6  # outside the vocabulary: the default stays
    model = read_gguf(write_gguf(tmp_path / "m.gguf", metadata))
    assert model.bos_id == 11
    metadata["tokenizer.ggml.model"] = "llama"
    assert read_gguf(write_gguf(tmp_path / "m.gguf", metadata)).eos_text == "<|im_end|>"  # SentencePiece: 2


def test_a_file_without_a_tokenizer_or_window(tmp_path: Path) -> None:
    model = read_gguf(write_gguf(tmp_path / "bare.gguf", {"general.architecture": "llama"}))
    assert (model.context_length, model.chat_template, model.tokenizer_model, model.pre) == (None, None, "", None)
    assert (model.vocab_size, model.bos_text, model.eos_text) == (0, "", "")
    with pytest.raises(ConfigError, match="tokenizer.ggml.tokens: holds no list of token strings"):
        model.vocabulary()


def test_arrays_of_every_type_and_nested(tmp_path: Path) -> None:
    metadata = {
        "general.architecture": "x",
        "a.u8": Typed(U8, 7),
        "a.u64": Typed(U64, 2**40),
        "a.flags": array(BOOL, [True, False]),
        "a.nested": array(ARRAY, [(I32, [1, 2]), (STRING, ["x"])]),
        "x.context_length": Typed(U64, 131072),
    }
    model = read_gguf(write_gguf(tmp_path / "types.gguf", metadata))
    assert model.metadata["a.u8"] == 7 and model.metadata["a.u64"] == 2**40
    assert model.metadata["a.flags"] == (True, False)
    assert isinstance(model.metadata["a.nested"], Array)  # arrays of arrays stay in the file until asked for
    assert model.array("a.nested") == ((1, 2), ("x",))
    assert model.context_length == 131072


# -- hostile files: each one line, naming the file ---------------------------------------------


def _refused(path: Path, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        read_gguf(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and "\n" not in message


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "story.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n')
    _refused(path, "not a GGUF model file")
    path.write_bytes(b"")
    _refused(path, "too short")


def test_a_directory_a_device_a_fifo_and_nothing(tmp_path: Path) -> None:
    _refused(tmp_path, "is a directory, not a GGUF model file")
    _refused(Path("/dev/zero"), "is a device")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(fifo, "is a FIFO")  # refused before it is opened: no waiting for a writer
    _refused(tmp_path / "missing.gguf", "no such file")


def test_versions_and_byte_order(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes(tiny_bpe(), version=1))
    _refused(path, "version 1; ctx reads versions 2 and 3")
    path.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    _refused(path, "big-endian")


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    whole = gguf_bytes(tiny_bpe(**{"tokenizer.ggml.add_bos_token": False}))
    path = tmp_path / "cut.gguf"
    for cut in [*range(0, 64), *range(64, len(whole), 97), len(whole) - 1]:
        path.write_bytes(whole[:cut])
        with pytest.raises(ConfigError) as caught:
            read_gguf(path)
        assert "truncated" in str(caught.value) or "too short" in str(caught.value) or cut < 4


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (string("k") + struct.pack("<IQ", STRING, 2**62), "more than ctx reads"),
        (string("k") + struct.pack("<IQ", STRING, 1000) + b"abc", "runs past the end of the file"),
        (string("k") + struct.pack("<IIQ", ARRAY, U32, 2**40), "more than ctx reads"),
        (string("k") + struct.pack("<IIQ", ARRAY, STRING, 10**6) + b"\0" * 64, "runs past the end"),
        (string("k") + struct.pack("<I", 99), "unknown type 99"),
        (string("k") + struct.pack("<IIQ", ARRAY, 99, 1), "unknown type 99"),
        (string("k") + struct.pack("<IB", BOOL, 2), "neither 0 nor 1"),
        (string("k") + struct.pack("<I", STRING) + string(b"\xff\xfe"), "not UTF-8"),
        (struct.pack("<Q", 0), "key 0 bytes long"),
        (struct.pack("<Q", 2**63), "bytes long"),
    ],
)
def test_damaged_values(tmp_path: Path, body: bytes, match: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)
    _refused(path, match)


def test_nesting_too_deep_and_too_many_keys_and_a_key_twice(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    deep = struct.pack("<IQ", ARRAY, 1) * (gguf.MAX_DEPTH + 1) + struct.pack("<IQ", U8, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + string("k") + struct.pack("<I", ARRAY) + deep)
    _refused(path, "too deeply")
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40))
    _refused(path, "metadata keys")
    pair = string("k") + struct.pack("<I", U8) + b"\x01"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + pair + pair)
    _refused(path, "k: appears twice")


def test_a_string_too_long_to_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf, "MAX_STRING", 16)
    path = write_gguf(tmp_path / "m.gguf", {"tokenizer.chat_template": "x" * 17})
    _refused(path, "more than ctx reads")


def test_metadata_past_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf, "MAX_METADATA", 4096)
    monkeypatch.setattr(gguf, "READ_AHEAD", 512)
    path = write_gguf(tmp_path / "m.gguf", tiny_bpe(**{"tokenizer.ggml.tokens": [f"t{i}" for i in range(2000)]}))
    _refused(path, "more than 0 MiB of metadata")


def test_a_vocabulary_that_does_not_fit_its_types(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", tiny_bpe(**{"tokenizer.ggml.token_type": [1, 1]}))
    with pytest.raises(ConfigError, match="token_type: is not one whole number for each token"):
        read_gguf(path).vocabulary()


def test_a_file_changed_after_its_metadata_was_read(tmp_path: Path) -> None:
    tokens = [f"t{i}" for i in range(gguf.SMALL_ARRAY + 1)]
    path = write_gguf(tmp_path / "m.gguf", tiny_bpe(**{"tokenizer.ggml.tokens": tokens}))
    model = read_gguf(path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ConfigError, match="changed while it was read"):
        model.vocabulary()


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=8))
def test_any_bytes_after_the_header_are_read_or_refused_in_one_line(tail: bytes, pairs: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.gguf"
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, pairs) + tail)
        try:
            read_gguf(path)
        except ConfigError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(str(path))


@given(st.data())
def test_damage_to_a_real_layout_is_read_or_refused(data: st.DataObject) -> None:
    import tempfile

    whole = bytearray(gguf_bytes(tiny_bpe()))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(whole) - 1))
        whole[at] = data.draw(st.integers(0, 255))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "damaged.gguf"
        path.write_bytes(bytes(whole))
        try:
            model = read_gguf(path)
            model.vocabulary()
        except ConfigError as exc:
            assert "\n" not in str(exc)


def test_what_the_first_read_keeps_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf, "MAX_KEPT", 100)
    metadata = {f"a.list{i}": array(I32, list(range(40))) for i in range(5)}
    model = read_gguf(write_gguf(tmp_path / "many.gguf", metadata))
    kept = [key for key, value in model.metadata.items() if isinstance(value, tuple)]
    assert kept == ["a.list0", "a.list1"]  # 80 items kept; the rest left in the file
    assert model.array("a.list4") == tuple(range(40))


def test_nested_arrays_are_bounded_when_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf, "MAX_ITEMS", 50)
    path = write_gguf(tmp_path / "nested.gguf", {"a.nested": array(ARRAY, [(I32, list(range(30)))] * 3)})
    with pytest.raises(ConfigError, match="more than the 50 array items ctx reads"):
        read_gguf(path).array("a.nested")


def test_a_file_replaced_after_it_was_read_is_not_read_as_the_same(tmp_path: Path) -> None:
    """The vocabulary is read when asked: from the very file the metadata came from, not a
    file of the same size put in its place (its tokens would be cached under the old identity)."""
    metadata = tiny_bpe()
    tokens = [*metadata["tokenizer.ggml.tokens"], *(f"t{i}" for i in range(70_000))]  # type: ignore[misc]
    metadata["tokenizer.ggml.tokens"] = tokens  # more than a first read keeps: read again when asked
    metadata["tokenizer.ggml.token_type"] = array(I32, [3, 3, 3] + [1] * (len(tokens) - 3))
    path = write_gguf(tmp_path / "m.gguf", metadata)
    model = read_gguf(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"<|im_end|>")
    data[at : at + 10] = b"<|im_xnd|>"
    replaced = tmp_path / "new.gguf"
    replaced.write_bytes(bytes(data))
    os.replace(replaced, path)  # another inode, the same size
    with pytest.raises(ConfigError, match="changed while it was read"):
        model.vocabulary()
