"""The counters built on `tokenizers`: a GGUF's vocabulary converted, counting as llama.cpp counts
(proved offline on SmolLM2's vocabulary against counts llama.cpp itself made, the golden files in
tests/fixtures/smollm2), cached by the GGUF's identity and loaded only when first used; and a
Hugging Face tokenizer.json."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import deep_but
from gguf_files import F32, I32, array, byte_alphabet, tiny_bpe, write_gguf

from otaku_ctx.errors import ConfigError
from otaku_ctx.locations import model_cache
from otaku_ctx.model import hf
from otaku_ctx.model.gguf import Gguf, read_gguf
from otaku_ctx.model.hf import ModelCounter, gguf_counter, gguf_tokenizer_json, tokenizer_json_counter

pytest.importorskip("tokenizers")

GOLDEN = Path(__file__).parent / "fixtures" / "smollm2"


@pytest.fixture(scope="module")
def smollm2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF holding SmolLM2-135M-Instruct's tokenizer metadata (no tensors), written from the
    golden vocabulary."""
    with gzip.open(GOLDEN / "vocabulary.json.gz", "rt", encoding="utf-8") as f:
        data = json.load(f)
    metadata = {
        "general.architecture": "llama",
        "llama.context_length": 8192,
        "tokenizer.ggml.model": data["tokenizer.ggml.model"],
        "tokenizer.ggml.pre": data["tokenizer.ggml.pre"],
        "tokenizer.ggml.tokens": data["tokens"],
        "tokenizer.ggml.token_type": array(I32, data["token_types"]),
        "tokenizer.ggml.merges": data["merges"],
        "tokenizer.ggml.bos_token_id": data["tokenizer.ggml.bos_token_id"],
        "tokenizer.ggml.eos_token_id": data["tokenizer.ggml.eos_token_id"],
        "tokenizer.ggml.add_bos_token": False,
    }
    return write_gguf(tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct.gguf", metadata)


def _golden() -> list[tuple[str, int]]:
    with gzip.open(GOLDEN / "counts.jsonl.gz", "rt", encoding="utf-8") as f:
        return [(r["text"], r["count"]) for r in map(json.loads, f)]


@pytest.mark.deep
def test_smollm2_counts_as_llama_cpp_counts(smollm2_gguf: Path) -> None:
    """Every text llama.cpp counted (the fixtures' messages, thousands of random texts with
    emoji, CJK, Arabic, marks, digits, odd spaces, control tokens and look-alikes) counts the
    same, one by one and in batches."""
    golden = _golden()
    assert len(golden) > 3000
    counter = gguf_counter(smollm2_gguf)
    wrong = [(text[:80], want, counter(text)) for text, want in golden if counter(text) != want]
    assert wrong == []
    fresh = gguf_counter(smollm2_gguf)
    assert fresh.count_many(text for text, _ in golden) == [want for _, want in golden]


def test_smollm2_s_model_facts(smollm2_gguf: Path) -> None:
    counter = gguf_counter(smollm2_gguf)
    assert counter.name == "gguf SmolLM2-135M-Instruct.gguf (BPE, 49,152 tokens)"
    assert (counter.bos, counter.added) == ("", 0)  # SmolLM2 adds no BOS: the server leaves none to strip
    assert counter.specials[:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert len(counter.specials) == 17 and "<|im_" not in counter.specials
    assert hf.gguf_controls(read_gguf(smollm2_gguf)) == counter.specials  # read without converting
    assert counter("<|im_start|>user\nHi<|im_end|>") == 1 + 1 + 1 + 1 + 1  # user, \n, Hi around the two
    assert counter("<|im_") > 1  # a part of one is ordinary text


def test_the_tiny_vocabulary_merges_by_rank(tmp_path: Path) -> None:
    counter = gguf_counter(write_gguf(tmp_path / "tiny.gguf", tiny_bpe()))
    tokenizer = counter.loaded().tokenizer
    assert tokenizer.encode(" the", add_special_tokens=False).tokens == ["Ġthe"]  # Ġ t, then h e, then Ġt he
    assert tokenizer.encode(" and", add_special_tokens=False).tokens == ["Ġand"]
    assert counter(" the and") == 2
    assert counter("<|im_start|>user") == 1 + 3  # u, s, er
    assert counter("12") == 2  # smollm isolates each digit
    assert counter("") == 0


def test_special_tokens_that_overlap_are_cut_as_llama_cpp_cuts_them(tmp_path: Path) -> None:
    """llama.cpp cuts out the longest special token first, wherever it is; `tokenizers` would
    take the leftmost. "<x|y" and "y>>>>" overlap in "<x|y>>>>": llama.cpp makes "<x|" + "y>>>>"."""
    metadata = tiny_bpe()
    tokens = [*metadata["tokenizer.ggml.tokens"], "<x|y", "y>>>>"]  # type: ignore[misc]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = array(I32, [3, 3, 3] + [1] * (len(tokens) - 5) + [3, 3])
    counter = gguf_counter(write_gguf(tmp_path / "overlap.gguf", metadata))
    assert counter.loaded().split is not None
    assert counter("<x|y>>>>") == 3 + 1  # "<", "x", "|" then "y>>>>"
    assert counter("a<x|y b") == 1 + 1 + 2
    assert counter.count_many(["<x|y>>>>", "y>>>><x|y"]) == [4, 2]


def test_user_defined_tokens_are_matched_and_markup_ones_are_broken_up(tmp_path: Path) -> None:
    """llama.cpp matches a user-defined token in any text: one that looks like markup
    (`<tool>`) could open a turn, so story text must not spell it; one of plain text must."""
    metadata = tiny_bpe()
    tokens = [*metadata["tokenizer.ggml.tokens"], "<tool>", "hello"]  # type: ignore[misc]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = array(I32, [3, 3, 3] + [1] * (len(tokens) - 5) + [4, 4])
    counter = gguf_counter(write_gguf(tmp_path / "user.gguf", metadata))
    assert counter("<tool>") == counter("hello") == 1
    assert "<tool>" in counter.specials and "hello" not in counter.specials


def test_the_conversion_is_cached_by_identity_and_a_damaged_cache_is_redone(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_bpe())
    model = read_gguf(path)
    assert gguf_counter(path)(" the") == 1
    cached = list(model_cache().glob(f"*{model.identity}*"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["model"]["type"] == "BPE"
    cached[0].write_text("{not json")
    assert gguf_counter(path)(" the") == 1
    assert json.loads(cached[0].read_text())["model"]["ignore_merges"] is False


def test_an_unwritable_cache_costs_only_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(hf, "_cache_file", lambda model: blocker / "x" / "y.json")
    assert gguf_counter(write_gguf(tmp_path / "tiny.gguf", tiny_bpe()))(" the") == 1


def test_the_vocabulary_is_read_only_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_bpe())
    read: list[int] = []
    original = Gguf.vocabulary
    monkeypatch.setattr(Gguf, "vocabulary", lambda self: (read.append(1), original(self))[1])
    counter = gguf_counter(path)
    assert read == []
    assert counter(" the") == 1 and read == [1]
    assert gguf_counter(path)(" the") == 1 and read == [1]  # the second loads the cached conversion


def test_importing_and_making_a_counter_import_no_tokenizers(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", tiny_bpe())
    code = (
        "import sys; from pathlib import Path; from otaku_ctx.model.hf import gguf_counter; "
        f"c = gguf_counter(Path({str(path)!r})); assert 'tokenizers' not in sys.modules, 'imported'; "
        "c(' the'); assert 'tokenizers' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"OTAKU_HOME": str(tmp_path), "PATH": ""})


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"tokenizer.ggml.pre": "deepseek-v3"}, r"tokenizer.ggml.pre: ctx does not count the 'deepseek-v3' pre-"),
        ({"tokenizer.ggml.model": "t5"}, r"tokenizer.ggml.model: ctx does not count the 't5' tokenizer"),
    ],
)
def test_what_is_not_converted_is_one_line_that_names_it(tmp_path: Path, extra: dict, match: str) -> None:
    path = write_gguf(tmp_path / "m.gguf", tiny_bpe(**extra))
    with pytest.raises(ConfigError, match=match) as caught:
        gguf_counter(path)
    assert "--tokenizer server" in str(caught.value) and "\n" not in str(caught.value)
    metadata = tiny_bpe()
    del metadata["tokenizer.ggml.pre"]
    with pytest.raises(ConfigError, match="'default' pre-tokenizer"):
        gguf_counter(write_gguf(tmp_path / "nopre.gguf", metadata))


@pytest.mark.parametrize(
    "extra",
    [{"general.name": "Phi-3.5 Mini"}, {"tokenizer.ggml.pre": "jina-v2-es"}, {"general.architecture": "jina-bert-v3"}],
)
def test_a_model_whose_special_tokens_llama_cpp_strips_is_refused(tmp_path: Path, extra: dict) -> None:
    with pytest.raises(ConfigError, match="strips the spaces beside this model's special tokens"):
        gguf_counter(write_gguf(tmp_path / "m.gguf", tiny_bpe(**extra)))


def test_a_bpe_vocabulary_without_merges_is_refused(tmp_path: Path) -> None:
    metadata = tiny_bpe()
    del metadata["tokenizer.ggml.merges"]
    with pytest.raises(ConfigError, match="tokenizer.ggml.merges: is missing"):
        gguf_counter(write_gguf(tmp_path / "m.gguf", metadata))(" the")


def test_a_merge_of_tokens_the_vocabulary_lacks_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", tiny_bpe(**{"tokenizer.ggml.merges": ["Ġ t", "q z"]}))
    with pytest.raises(ConfigError, match=r"merge 1 \('q z'\) joins tokens the vocabulary lacks"):
        gguf_counter(path)(" the")


def test_without_tokenizers_the_error_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tokenizers" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'otaku-ctx\[model\]'"):
        gguf_counter(write_gguf(tmp_path / "m.gguf", tiny_bpe()))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"pip install 'otaku-ctx\[model\]'"):
        tokenizer_json_counter(tmp_path)


# -- a Hugging Face tokenizer.json --------------------------------------------------------------


def _folder(tmp_path: Path, *, bos_added: bool) -> Path:
    folder = tmp_path / "Tiny-Model"
    folder.mkdir()
    data = gguf_tokenizer_json(read_gguf(write_gguf(tmp_path / "tiny.gguf", tiny_bpe())))
    if bos_added:
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
        }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def test_a_tokenizer_json_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path, bos_added=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<|endoftext|>"}}))
    counter = tokenizer_json_counter(folder)
    assert isinstance(counter, ModelCounter)
    assert counter.name == "tokenizer.json Tiny-Model"
    assert (counter.bos, counter.added) == ("<|endoftext|>", 1)
    assert counter.specials == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert counter("<|im_start|>user the") == 1 + 3 + 1
    assert tokenizer_json_counter(folder / "tokenizer.json")(" the") == 1


def test_a_tokenizer_json_without_a_config_takes_bos_from_what_it_adds(tmp_path: Path) -> None:
    counter = tokenizer_json_counter(_folder(tmp_path, bos_added=True))
    assert (counter.bos, counter.added) == ("<|endoftext|>", 1)
    (tmp_path / "other").mkdir()
    plain = tokenizer_json_counter(_folder(tmp_path / "other", bos_added=False))
    assert (plain.bos, plain.added) == ("", 0)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "is not valid JSON"),
        ('{"version": "1.0"}', "not a Hugging Face tokenizer.json"),
        ('{"model": {"type": "Nonsense"}}', "does not load as a tokenizer"),
    ],
)
def test_a_bad_tokenizer_json_is_one_line(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match) as caught:
        tokenizer_json_counter(path)(" the")
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_folder_without_a_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tokenizer.json in this folder"):
        tokenizer_json_counter(tmp_path)
    with pytest.raises(ConfigError, match="no such tokenizer file"):
        tokenizer_json_counter(tmp_path / "missing.json")


def test_the_byte_alphabet_is_gpt2_s() -> None:
    alphabet = byte_alphabet()
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("A")], len(set(alphabet))) == ("Ġ", "Ċ", "A", 256)


# -- the pricer's context ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "pre", deep_but(["smollm", "llama-bpe", "qwen2", "qwen35", "gpt-2", "tekken", "gpt-4o"], "smollm", "qwen2")
)
def test_the_context_of_a_text_counts_what_follows_as_the_whole_text_does(smollm2_gguf: Path, pre: str) -> None:
    """count(text + after) - count(text) == count(end + after) - count(end), end = context(text),
    over joined random texts and followers of every kind (a special token, a part of one, words,
    spaces, digits, newlines), with each pre-tokenizer splitting SmolLM2's vocabulary."""
    from tokenizer_texts import random_texts

    path = smollm2_gguf
    if pre != "smollm":
        path = _with_pre(smollm2_gguf.with_name(f"{pre}.gguf"), pre)
    counter = gguf_counter(path)
    pieces = random_texts(180, seed=7)
    followers = ["<|im_end|>", "im_end|>", "|>", "world", " world", "  x", "\n\n", "123", "'s", "é", "日本", ""]
    runs = [" " * 100, "x" * 150, "日本語の" * 40, "!" * 120, "\n" * 90, "\n \n" * 30, "7" * 100, "<|im_end|>" * 3]
    texts = ["".join(pieces[i : i + 6]) for i in range(0, len(pieces) - 6, 6)]
    texts += [f"The keeper said {word} and then " + run for word in ("yes", "no") for run in runs]
    followers += [" x", "x", "!", "\n", "5", " "]
    shortened = 0
    for i, text in enumerate(texts):
        end = counter.context(text)
        assert text.endswith(end)
        shortened += len(end) < len(text)
        for after in [*followers, pieces[i + 6][:40]]:  # and the start of a random text
            assert counter(text + after) - counter(text) == counter(end + after) - counter(end), (text, after)
    assert shortened > 10


def test_no_context_cut_crosses_a_special_token(tmp_path: Path) -> None:
    counter = gguf_counter(write_gguf(tmp_path / "tiny.gguf", tiny_bpe()))
    text = "word " * 40 + "<|im_start|>" + " the" * 30
    end = counter.context(text)
    assert text.endswith(end) and len(end) < len(text)
    assert hf._crossed("a <|im_end|> b", 5, ("<|im_end|>",))
    assert not hf._crossed("a <|im_end|> b", 2, ("<|im_end|>",))


def _with_pre(target: Path, pre: str) -> Path:
    with gzip.open(GOLDEN / "vocabulary.json.gz", "rt", encoding="utf-8") as f:
        data = json.load(f)
    metadata = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": data["tokens"],
        "tokenizer.ggml.token_type": array(I32, data["token_types"]),
        "tokenizer.ggml.merges": data["merges"],
        "tokenizer.ggml.add_bos_token": False,
    }
    return write_gguf(target, metadata)


def test_a_lone_surrogate_counts_as_a_replacement_character(tmp_path: Path) -> None:
    counter = gguf_counter(write_gguf(tmp_path / "tiny.gguf", tiny_bpe()))
    assert counter("a\ud800b") == counter("a\ufffdb") == 1 + 3 + 1  # U+FFFD is three bytes
    assert counter.count_many(["x\udc00", "y"]) == [counter("x\ufffd"), 1]


def test_a_counter_is_what_its_file_says_and_cannot_be_changed(tmp_path: Path) -> None:
    counter = gguf_counter(write_gguf(tmp_path / "tiny.gguf", tiny_bpe(**{"tokenizer.ggml.add_bos_token": True})))
    facts = (counter.bos, counter.added, counter.specials, counter.parses_specials)
    assert facts == ("<|im_start|>", 1, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), True)
    for name, value in [("bos", ""), ("added", 0), ("specials", ()), ("parses_specials", False), ("name", "x")]:
        with pytest.raises(AttributeError):
            setattr(counter, name, value)
    assert (counter.bos, counter.added, counter.specials, counter.parses_specials) == facts


def test_a_byte_the_vocabulary_lacks_keeps_its_neighbours_apart_and_counts_nothing(tmp_path: Path) -> None:
    """As llama.cpp does (SmolLM2 has no token for the byte 0x1D: llama-server gives "x \\x1d! y"
    as x, " ", "!", " y"): the merge of " " and "!" does not reach across it."""
    metadata = tiny_bpe()
    missing = byte_alphabet()[0x1D]
    tokens = [t for t in metadata["tokenizer.ggml.tokens"] if t != missing] + ["Ġ!"]  # type: ignore[attr-defined]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = array(I32, [3, 3, 3] + [1] * (len(tokens) - 3))
    metadata["tokenizer.ggml.merges"] = [*metadata["tokenizer.ggml.merges"], "Ġ !"]  # type: ignore[misc]
    counter = gguf_counter(write_gguf(tmp_path / "gap.gguf", metadata))
    assert counter(" !") == 1
    assert counter(" \x1d!") == 2
    assert counter("\x1d") == 0
    assert counter.count_many(["x \x1d! y", " \x1d!"]) == [5, 2]  # x, Ġ, !, Ġ, y: no "Ġy" here


def _retyped(tmp_path: Path, *renamed: tuple[str, int], **extra: object) -> Path:
    """The tiny model (with `extra` metadata) with these (text, type) tokens added."""
    metadata = tiny_bpe(**extra)
    tokens = [*metadata["tokenizer.ggml.tokens"], *(text for text, _ in renamed)]  # type: ignore[misc]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = array(
        I32, [3, 3, 3] + [1] * (len(tokens) - 3 - len(renamed)) + [k for _, k in renamed]
    )
    return write_gguf(tmp_path / "retyped.gguf", metadata)


def test_tokens_are_retyped_by_their_text_as_llama_cpp_does(tmp_path: Path) -> None:
    """The rules tests/realserver checks against llama-server: an end-of-generation text is a
    control token whatever the file says, gpt-oss's `<|channel|>` a user-defined one, `</s>`
    an ordinary text beside `<|tool_response>`, a fill-in-the-middle text the file names no id
    for a control token."""
    path = _retyped(tmp_path, ("<|eot_id|>", 1), ("<|channel|>", 3), ("</s>", 3), ("<|tool_response>", 1), ("<PRE>", 1))
    counter = gguf_counter(path)
    assert counter("a<|eot_id|>b") == counter("a<|channel|>b") == counter("a<PRE>b") == 3
    assert counter("a</s>b") == 1 + 4 + 1
    assert {"<|eot_id|>", "<|tool_response>", "<PRE>"} <= set(counter.specials)
    assert "<|channel|>" in counter.specials  # user-defined, and markup: broken up in story text
    assert "</s>" not in counter.specials


def test_two_fill_in_the_middle_candidates_are_refused(tmp_path: Path) -> None:
    """llama.cpp takes the first of them its hash map holds: no telling which."""
    with pytest.raises(ConfigError, match="llama.cpp picks one of <fim_prefix>, <PRE> by its hash order"):
        gguf_counter(_retyped(tmp_path, ("<fim_prefix>", 1), ("<PRE>", 3)))(" the")
    metadata = tiny_bpe(**{"tokenizer.ggml.fim_pre_token_id": 1})  # the file names it: no guessing
    tokens = [*metadata["tokenizer.ggml.tokens"], "<fim_prefix>", "<PRE>"]  # type: ignore[misc]
    metadata["tokenizer.ggml.tokens"] = tokens
    metadata["tokenizer.ggml.token_type"] = array(I32, [3, 3, 3] + [1] * (len(tokens) - 3))
    assert gguf_counter(write_gguf(tmp_path / "named.gguf", metadata))("<PRE>") > 1


@pytest.mark.parametrize(
    "added",
    [
        (),
        (("<tool>", 4), ("hello", 4), ("<unk>", 2), ("", 3), ("unused", 5), ("<0x0A>", 6)),
        (("<|eot_id|>", 1), ("<|channel|>", 3), ("</s>", 3), ("<|tool_response>", 1), ("<PRE>", 1)),
        (("<x>", 3), ("<y>", 3), ("<x>", 3)),  # a text twice: one token, where its last id is
        (("hello", 4), ("<y>", 3), ("hello", 3)),  # special as its last entry says
        (("hello", 3), ("<y>", 3), ("hello", 4)),
        (("hello", 4), ("<y>", 3), ("hello", 1)),  # only the entries of the types cut out count
        (("<|im_start|>", 1),),  # a control token's text again, as ordinary text
    ],
)
def test_a_ggufs_control_tokens_are_read_without_converting_it(tmp_path: Path, added: tuple) -> None:
    """`gguf_controls` names what the converted counter's `specials` name, from the tokens and
    their types alone: the conversion is never made (no cache file), the merges never read."""
    path = _retyped(tmp_path, *added)
    model = read_gguf(path)
    controls = hf.gguf_controls(model)
    assert not list(model_cache().glob(f"*{model.identity}*"))
    assert controls == gguf_counter(path).specials


def test_the_control_tokens_of_a_gguf_ctx_does_not_count_are_read_too(tmp_path: Path, monkeypatch) -> None:
    """A model a server counts for ctx: a SentencePiece GGUF, an unknown pre-tokenizer, one whose
    fill-in-the-middle token llama.cpp picks by its hash order (both taken), a file of no tokens."""
    read: list[str] = []
    original = Gguf.array
    monkeypatch.setattr(Gguf, "array", lambda self, key, *most: (read.append(key), original(self, key, *most))[1])
    spm = read_gguf(_retyped(tmp_path, ("<unk>", 2), **{"tokenizer.ggml.model": "llama"}))
    assert hf.gguf_controls(spm) == ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
    assert "tokenizer.ggml.merges" not in read
    odd = read_gguf(_retyped(tmp_path, ("<fim_prefix>", 1), ("<PRE>", 3), **{"tokenizer.ggml.pre": "x"}))
    assert hf.gguf_controls(odd)[-2:] == ("<fim_prefix>", "<PRE>")
    metadata = tiny_bpe()
    del metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    assert hf.gguf_controls(read_gguf(write_gguf(tmp_path / "none.gguf", metadata))) == ()


# -- SentencePiece GGUFs (tokenizer.ggml.model "llama", spm.py) and Gemma 4's BPE --------------

BYTES = [f"<0x{b:02X}>" for b in range(256)]


def tiny_spm(words: dict[str, float], **extra: object) -> dict[str, object]:
    """A tiny SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `words`
    with their scores."""
    tokens = ["<unk>", "<s>", "</s>", *BYTES, *words]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    metadata: dict[str, object] = {
        "general.architecture": "llama",
        "general.name": "tiny-spm",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": array(F32, [0.0] * 259 + list(words.values())),
        "tokenizer.ggml.token_type": array(I32, types),
    }
    metadata.update(extra)
    return metadata


def _spelled(counter: ModelCounter, text: str) -> list[str]:
    """The texts of the tokens `counter` gives `text`."""
    tokens = ["<unk>", "<s>", "</s>", *BYTES, *_WORDS[counter]]
    return [tokens[i] for i in counter.ids(text)]


_WORDS: dict[ModelCounter, list[str]] = {}


def _spm_counter(tmp_path: Path, words: dict[str, float], **extra: object) -> ModelCounter:
    counter = gguf_counter(write_gguf(tmp_path / "spm.gguf", tiny_spm(words, **extra)))
    _WORDS[counter] = list(words)
    return counter


def test_sentencepiece_merges_the_highest_score_first_and_the_leftmost_of_equals(tmp_path: Path) -> None:
    """In "▁abc" "bc" outscores "ab", so ▁a + bc; in "▁aaa" "aa" outscores "▁a", the leftmost "aa"
    first, and "▁aa" and "aaa" are no tokens."""
    words = {"\u2581": -1.0, "a": -2.0, "b": -2.0, "c": -2.0, "ab": -5.0, "bc": -3.0, "\u2581a": -4.0, "aa": -1.5}
    counter = _spm_counter(tmp_path, words)
    assert counter.name == "gguf spm.gguf (SentencePiece, 267 tokens)"
    assert _spelled(counter, "abc") == ["\u2581a", "bc"]  # the space prefix: "▁abc"
    assert _spelled(counter, "aaa") == ["\u2581", "aa", "a"]
    assert _spelled(counter, "ab aaa") == ["\u2581a", "b", "\u2581", "aa", "a"]
    assert _spelled(counter, "é") == ["\u2581", "<0xC3>", "<0xA9>"]  # no token: its bytes
    assert counter("</s>abc") == 3 and counter.ids("</s>") == [2]  # a control token; "▁abc" after it


def test_sentencepiece_without_the_space_prefix_and_what_the_counter_says(tmp_path: Path) -> None:
    words = {"\u2581": -1.0, "a": -2.0, "b": -2.0, "ab": -1.0, "<start>": 0.0}
    extra: dict[str, object] = {"tokenizer.ggml.add_space_prefix": False}
    extra["tokenizer.ggml.token_type"] = array(I32, [2, 3, 3] + [6] * 256 + [1] * 4 + [4])
    counter = _spm_counter(tmp_path, words, **extra)
    assert _spelled(counter, "ab ab") == ["ab", "\u2581", "ab"]
    assert _spelled(counter, "<start>ab") == ["<start>", "ab"]  # user-defined: cut out, no prefix after it
    assert counter.bos == "<s>" and counter.added == 1  # llama.cpp adds BOS to a SentencePiece prompt
    assert counter.specials == ("<unk>", "<s>", "</s>", "<start>")


def test_a_sentencepiece_vocabulary_without_byte_tokens_is_refused_in_one_line(tmp_path: Path) -> None:
    metadata = tiny_spm({"a": -1.0})
    metadata["tokenizer.ggml.tokens"] = ["<unk>", "<s>", "</s>", "a"]
    metadata["tokenizer.ggml.scores"] = array(F32, [0.0, 0.0, 0.0, -1.0])
    metadata["tokenizer.ggml.token_type"] = array(I32, [2, 3, 3, 1])
    with pytest.raises(ConfigError, match=r"has no byte token <0x00>, which llama.cpp fails on") as caught:
        gguf_counter(write_gguf(tmp_path / "m.gguf", metadata))("a")
    assert "\n" not in str(caught.value)


def tiny_gemma4(merges: list[str], words: list[str]) -> dict[str, object]:
    """A tiny Gemma 4 vocabulary: BPE on raw UTF-8, spaces as "▁", byte tokens <0xXX>."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *BYTES, *words]
    return {
        "general.architecture": "gemma4",
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": array(I32, [3] * 4 + [6] * 256 + [1] * len(words)),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": False,  # llama.cpp adds it all the same
    }


def test_gemma4_merges_lines_with_spaces_as_the_sentencepiece_mark(tmp_path: Path) -> None:
    words = ["\u2581", "a", "b", "\n", "ab", "\u2581ab", "\n\n"]
    path = write_gguf(tmp_path / "g.gguf", tiny_gemma4(["a b", "\u2581 ab", "\n \n"], words))
    counter = gguf_counter(path)
    tokens = read_gguf(path).vocabulary().tokens
    assert [tokens[i] for i in counter.ids("ab ab\n\nabé")] == [
        "ab", "\u2581ab", "\n\n", "ab", "<0xC3>", "<0xA9>"
    ]  # fmt: skip
    assert counter.bos == "<bos>" and counter.added == 1 and counter.context("x " * 200) == "x " * 200


def test_gemma4_whose_merges_do_not_make_a_newline_token_whole_is_refused(tmp_path: Path) -> None:
    words = ["\u2581", "a", "\n", "\u2581a", "\n\n"]
    with pytest.raises(ConfigError, match=r"its merges do not make the token '\\n\\n' whole"):
        gguf_counter(write_gguf(tmp_path / "g.gguf", tiny_gemma4(["\u2581 a"], words)))("a")
