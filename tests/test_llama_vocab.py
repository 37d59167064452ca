"""llama.cpp's own tokenizer tests on ctx's GGUF counter (issue 26): the `ggml-vocab-*.gguf`
vocabularies of the pinned llama.cpp and their `.inp`/`.out` vectors, read as llama.cpp's
`tests/test-tokenizer-0.cpp` reads them. A vocabulary ctx reads must give every vector's ids
exactly (and its count); one it does not read is a one-line error.

Here, offline, the two small SentencePiece ones kept in tests/fixtures/llama-vocab (Llama 2's
and Phi-3's); tests/realserver/test_llama_vocab_real.py runs every one, with `verdict` below."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from otaku_ctx.errors import ConfigError
from otaku_ctx.model.hf import gguf_counter

FIXTURES = Path(__file__).parent / "fixtures" / "llama-vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"  # test-tokenizer-0.cpp's, between two texts of a .inp file
READ = "read, all matched"


def vectors(gguf: Path) -> list[tuple[str, list[int]]]:
    """The texts of `gguf`.inp and the ids of `gguf`.out, paired as test-tokenizer-0.cpp pairs
    them: the texts cut at each separator (one after the last text ends the file), the ids one
    line a text, numbers apart by a space."""
    raw = Path(f"{gguf}.inp").read_bytes().decode("utf-8")
    texts, at = [], 0
    while at < len(raw):
        found = raw.find(SEPARATOR, at)
        if found == -1:
            texts.append(raw[at:])
            break
        texts.append(raw[at:found])
        at = found + len(SEPARATOR)
    lines = Path(f"{gguf}.out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # std::getline yields no line after the last newline
    assert len(texts) == len(lines), f"{gguf.name}: {len(texts)} texts, {len(lines)} lines of ids"
    return [(text, [int(n) for n in line.strip().split(" ") if n]) for text, line in zip(texts, lines, strict=True)]


def verdict(gguf: Path) -> str:
    """What ctx makes of one of llama.cpp's test vocabularies: "read, all matched" (every vector
    the same ids, and the same count), "read, no vectors" (llama.cpp ships none for it), or
    "refused: <the one-line error>". A vector read differently fails, naming it."""
    try:
        counter = gguf_counter(gguf)
        counter.loaded()
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message, f"{gguf.name}: not a one-line error: {message!r}"
        return f"refused: {message}"
    if not Path(f"{gguf}.inp").exists():
        return "read, no vectors"
    pairs = vectors(gguf)
    # llama.cpp runs them with parse_special off, ctx counts with it on: the same, as no text
    # spells a control (or unknown) token
    spelled = [(text, s) for text, _ in pairs for s in counter.specials if s in text]
    assert not spelled, f"{gguf.name}: a vector spells a special token: {spelled[:3]}"
    wrong = [(text, got, ids) for text, ids in pairs if (got := counter.ids(text)) != ids or counter(text) != len(ids)]
    assert not wrong, (
        f"{gguf.name}: {len(wrong)} of {len(pairs)} vectors differ; (text, ctx's, llama.cpp's): {wrong[0]}"
    )
    return READ


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixtures' vocabularies unpacked beside their vectors."""
    folder = tmp_path_factory.mktemp("llama-vocab")
    for packed in FIXTURES.glob("ggml-vocab-*.gguf.gz"):
        gguf = folder / packed.name.removesuffix(".gz")
        with gzip.open(packed) as source, gguf.open("wb") as target:
            shutil.copyfileobj(source, target)
        for suffix in (".inp", ".out"):
            shutil.copy(FIXTURES / f"{gguf.name}{suffix}", folder / f"{gguf.name}{suffix}")
    return folder


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_sentencepiece_vocabularies_match_every_vector_of_llama_cpp(vocabularies: Path, name: str) -> None:
    """Llama 2's (Mistral 7B's is the same model) and Phi-3's, whose special tokens llama.cpp
    strips the spaces after: read, every vector the ids llama.cpp gives."""
    assert verdict(vocabularies / f"ggml-vocab-{name}.gguf") == READ


def test_the_vectors_are_read_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    """The texts end at each separator (a text may be empty, or a newline), the ids one line a
    text; a text with no ids is an empty line."""
    gguf = tmp_path / "ggml-vocab-x.gguf"
    Path(f"{gguf}.inp").write_bytes(SEPARATOR.join(["a b", "", "\n", "é"]).encode() + SEPARATOR.encode())
    Path(f"{gguf}.out").write_text(" 1 2\n\n 3\n 4 5\n")
    assert vectors(gguf) == [("a b", [1, 2]), ("", []), ("\n", [3]), ("é", [4, 5])]


# -- what makes the SentencePiece counter fast, and its pricer's context, on the same files ----


@pytest.fixture(scope="module", params=["llama-spm", "phi-3"])
def spm(vocabularies: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    from otaku_ctx.model.gguf import read_gguf
    from otaku_ctx.model.spm import sentencepiece

    return sentencepiece(read_gguf(vocabularies / f"ggml-vocab-{request.param}.gguf"))


def test_a_piece_merged_word_by_word_is_the_piece_merged_whole(spm) -> None:  # type: ignore[no-untyped-def]
    """No merge crosses a cut (no token holds the two characters beside it), so the words' tokens
    one after the other are the whole piece's, for random texts of every kind."""
    from tokenizer_texts import long_texts, random_texts

    from otaku_ctx.model.spm import SPACE

    for text in [*random_texts(400, seed=26), *long_texts()[:4]]:
        piece = (" " + text).replace(" ", SPACE)
        assert spm._piece(piece) == spm._merged(piece), text


@pytest.mark.deep
def test_the_context_of_a_text_counts_what_follows_as_the_whole_text_does(spm) -> None:  # type: ignore[no-untyped-def]
    """count(text + after) - count(text) == count(end + after) - count(end), end = context(text),
    over joined random texts and followers of every kind (special tokens whole and in part,
    words, spaces, digits, newlines)."""
    from tokenizer_texts import random_texts

    def count(text: str) -> int:
        return len(spm.encode(text))

    pieces = random_texts(180, seed=8)
    followers = ["</s>", "s>", "<|end|>", "|>", "world", " world", "  x", "\n\n", "123", "é", "日本", "", " ", "x"]
    runs = [" " * 100, "x" * 150, "日本語の" * 40, "!" * 120, "\n" * 90, "\n \n" * 30, "7" * 100, "<|user|> " * 12]
    texts = ["".join(pieces[i : i + 6]) for i in range(0, len(pieces) - 6, 6)]
    texts += [f"The keeper said {word} and then " + run for word in ("yes", "no") for run in runs]
    texts += ["word " * 40 + "</s> " + " the" * 30, "a b " * 60 + "<|end|>  " + "c d " * 30]
    shortened = 0
    for i, text in enumerate(texts):
        end = spm.context(text)
        assert text.endswith(end)
        shortened += len(end) < len(text)
        for after in [*followers, pieces[(i + 6) % len(pieces)][:40]]:
            assert count(text + after) - count(text) == count(end + after) - count(end), (text, after)
    assert shortened > 10


def test_special_tokens_are_cut_out_and_phi3_s_take_the_spaces_after_them(spm) -> None:  # type: ignore[no-untyped-def]
    """A special token spelled in a text is its id; the text after it gets the space prefix;
    Phi-3's take the spaces after them (llama.cpp's RSTRIP, by the model's name), Llama 2's not.
    With parse_special off only user-defined ones are cut (Phi-3's `</s>` is, but llama.cpp
    makes it a control token: an end-of-generation text)."""
    eos = spm.ids["</s>"]
    hi = spm.encode("Hi")
    assert spm.encode("</s>Hi") == [eos, *hi]
    phi3 = "<|user|>" in spm.ids
    assert (spm.encode("</s>  Hi") == [eos, *hi]) is phi3
    assert eos not in spm.encode("</s>Hi", parse_special=False)
    assert spm.encode("") == [] and spm.encode("Hi", parse_special=False) == hi


def test_a_character_the_vocabulary_lacks_is_spelled_in_its_bytes(spm) -> None:  # type: ignore[no-untyped-def]
    bytes_of = [spm.ids[f"<0x{b:02X}>"] for b in "\U0001f9ff".encode()]
    assert spm.encode("\U0001f9ff")[-4:] == bytes_of
    assert spm.encode("\ud800") == spm.encode("\ufffd")  # a lone surrogate: U+FFFD, as its UTF-8 carries it
