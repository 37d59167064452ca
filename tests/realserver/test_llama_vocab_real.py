"""Every tokenizer test vocabulary of the pinned llama.cpp (its `models/ggml-vocab-*.gguf` and
their `.inp`/`.out` vectors, which setup.sh keeps in its cache) on ctx's GGUF counter (issue 26):
each one ctx reads gives every vector's ids exactly, as llama.cpp's tests/test-tokenizer-0.cpp
checks them; each one it does not is a one-line error. `verdict` is tests/test_llama_vocab.py's,
which runs the two small SentencePiece ones offline; Gemma 4's (15 MB) is checked here.

No model server is needed: llama.cpp's own vectors are the reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_llama_vocab import READ, verdict  # noqa: E402

pytest.importorskip("tokenizers")

NO_VECTORS = "read, no vectors"
# What ctx makes of each: read, every vector matched; read, with no vectors to check; or the
# start of its refusal (after the file's name).
EXPECTED = {
    "aquila": "tokenizer.ggml.pre: ctx does not count the 'default' pre-tokenizer",
    "baichuan": NO_VECTORS,
    "bert-bge": "tokenizer.ggml.model: ctx does not count the 'bert' tokenizer",
    "command-r": READ,
    "deepseek-coder": READ,
    "deepseek-llm": READ,
    "falcon": READ,
    "gemma-4": READ,
    "gpt-2": READ,
    "gpt-neox": "tokenizer.ggml.pre: ctx does not count the 'default' pre-tokenizer",
    "llama-bpe": READ,
    "llama-spm": READ,
    "mpt": READ,
    "nomic-bert-moe": "tokenizer.ggml.model: ctx does not count the 't5' tokenizer",
    "phi-3": READ,
    "qwen2": READ,
    "qwen35": READ,
    "refact": READ,
    "starcoder": READ,
}


def test_the_pinned_llama_cpp_has_these_vocabularies(llama_vocab: Path) -> None:
    found = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf") for p in llama_vocab.glob("ggml-vocab-*.gguf")}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_vocabulary_is_read_and_matches_every_vector_or_is_refused_in_one_line(
    llama_vocab: Path, name: str
) -> None:
    gguf = llama_vocab / f"ggml-vocab-{name}.gguf"
    got = verdict(gguf)
    expected = EXPECTED[name]
    if expected in (READ, NO_VECTORS):
        assert got == expected
    else:
        assert got.startswith(f"refused: {gguf}: {expected}") and got.endswith("use --tokenizer server")


@pytest.mark.parametrize("pre", ["qwen35", "falcon", "deepseek-coder", "deepseek-llm"])
def test_the_pre_tokenizers_read_here_count_as_llama_server_counts(tmp_path: Path, pre: str) -> None:
    """Beyond llama.cpp's few vectors: SmolLM2's vocabulary split by each pre-tokenizer ctx
    reads since issue 26 (a copy of its GGUF with that `tokenizer.ggml.pre`), the same ids as
    llama-server's for thousands of texts (test_model_hf_real.py's)."""
    from gguf_variant import variant
    from server import built
    from test_model_hf_real import Tokenize, _compared

    copy = variant(Path(built()[1]), tmp_path / f"SmolLM2-{pre}.gguf", {"tokenizer.ggml.pre": pre})
    tokenize = Tokenize(copy, tmp_path / "server.log")
    try:
        wrong, _ = _compared(copy, tokenize)
    finally:
        tokenize.close()
    assert wrong == []
