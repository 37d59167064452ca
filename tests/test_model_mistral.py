"""ctx's counter for Mistral's own tokenizer files against mistral-common, offline.

tests/fixtures/mistral/golden.json holds what mistral-common 1.13.1's `encode_chat_completion`
gave for chats ctx renders in its `mistral*` formats (the fixture stories and random ones, made
by tests/mistral_chats.py), and what each tokenizer gave for plain texts (make_golden.py there).
The SentencePiece files and a small Tekken file are in the repository; mistral-common's real
Tekken files (15-19 MB) are used only when tests/realserver/setup.sh has put them in the cache.
tests/realserver/test_mistral_real.py asks mistral-common itself, on more random stories.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import mistral_chats as mc
import pytest
from conftest import FIXTURES, every

from otaku_ctx.errors import ConfigError
from otaku_ctx.model.mistral import mistral_counter, split_at_controls, without_dummy_prefix

MISTRAL = FIXTURES / "mistral"
GOLDEN = json.loads((MISTRAL / "golden.json").read_text(encoding="utf-8"))
CACHE = Path(os.environ.get("OTAKU_CTX_CACHE", Path.home() / ".cache" / "otaku-ctx"))
CACHED = CACHE / "mistral-common-1.13.1" / "data"  # where tests/realserver/setup.sh unzips its files
V1 = MISTRAL / "tokenizer.model.v1"
V3 = MISTRAL / "mistral_instruct_tokenizer_240323.model.v3"
V7 = MISTRAL / "mistral_instruct_tokenizer_241114.model.v7"
TEKKEN = MISTRAL / "tekken_small.json"


def tokenizer(name: str, scratch: Path) -> Path:
    """A golden case's tokenizer file: the repository's, one made from it, or the cache's."""
    if name == "tekken_small_v7.json":
        return mc.as_v7(TEKKEN, scratch / name)
    if (MISTRAL / name).exists():
        return MISTRAL / name
    source = CACHED / ("tekken_240911.json" if name == "tekken_v7.json" else name)
    if not source.exists():
        pytest.skip(f"{source} is not here (tests/realserver/setup.sh puts it there)")
    return mc.as_v7(source, scratch / name) if name == "tekken_v7.json" else source


def case_id(case: dict[str, Any]) -> str:
    return f"{case['format']}+{case['tokenizer']}"


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=case_id)
def test_a_prompt_counts_what_mistral_common_encodes(case: dict[str, Any], tmp_path: Path) -> None:
    """The Done-when of issue 18: for a story ending on a user turn, ctx's count of its
    prompt equals the number of tokens mistral-common's encode_chat_completion gives."""
    counter = mistral_counter(tokenizer(case["tokenizer"], tmp_path))
    counted = [counter(mc.prompt(case["format"], chat["messages"])) for chat in case["chats"]]
    assert counted == [chat["count"] for chat in case["chats"]]
    assert len(case["chats"]) == len(mc.STORIES) + 12


@pytest.mark.parametrize("case", [c for c in GOLDEN["cases"] if c["tokenizer"].endswith(".json")], ids=case_id)
def test_a_tekken_prompt_is_the_text_mistral_common_encodes(case: dict[str, Any]) -> None:
    """Tekken decodes to its text exactly: ctx's mistral-tekken and mistral-v7-tekken prompts
    are byte for byte what mistral-common encodes for the same messages (no file needed)."""
    for chat in case["chats"]:
        assert mc.prompt(case["format"], chat["messages"]) == chat["text"]


@pytest.mark.parametrize("case", every(GOLDEN["cases"], 2), ids=case_id)
def test_plain_text_counts_as_the_tokenizer_encodes_it(case: dict[str, Any], tmp_path: Path) -> None:
    """mistral-common's SentencePiece encodes a text with its dummy prefix (a space before
    it); ctx counts a text as it is, so " " + text is that text to ctx."""
    counter = mistral_counter(tokenizer(case["tokenizer"], tmp_path))
    space = "" if case["tokenizer"].endswith(".json") else " "
    assert [counter(space + t["text"]) for t in case["texts"]] == [t["count"] for t in case["texts"]]


def test_tekken_keeps_only_default_vocab_size_tokens() -> None:
    """tekken_small.json lists 6,000 tokens and keeps 5,000 (1,000 special ids + 5,000 =
    default_vocab_size): a token past the cut is not one token."""
    data = json.loads(TEKKEN.read_text(encoding="utf-8"))
    assert len(data["vocab"]) == 6000 and data["config"]["default_vocab_size"] == 6000
    counter = mistral_counter(TEKKEN)
    cut = GOLDEN["cut_token"]
    assert counter(cut) > 1
    assert counter(data["vocab"][4999]["token_str"] or "") == 1
    assert counter.name == "mistral tekken_small.json (Tekken v3, 6,000 tokens)"


def test_control_tokens_are_one_token_each() -> None:
    v1, v3, v7, tekken = (mistral_counter(p) for p in (V1, V3, V7, TEKKEN))
    for counter in (v3, v7, tekken):
        assert counter("[INST]") == counter("[/INST]") == counter("</s>") == 1
        assert counter("<s>[INST]") == 2
    assert v7("[SYSTEM_PROMPT]") == tekken("[SYSTEM_PROMPT]") == 1
    assert v3("[SYSTEM_PROMPT]") > 1  # v3's SentencePiece has no system prompt tokens
    assert v1("<s>") == v1("</s>") == 1
    assert v1("[INST]") > 1  # plain text in v1
    # A control token spelled in text is the one token; broken up, it is text again.
    assert tekken("a[INST]b") == tekken("a") + 1 + tekken("b")
    assert tekken("[\u2060INST]") > 1


def test_the_counter_says_what_it_counts() -> None:
    v1, v7 = mistral_counter(V1), mistral_counter(V7)
    assert v1.name == "mistral tokenizer.model.v1 (SentencePiece v1, 32,000 tokens)"
    assert v7.name == "mistral mistral_instruct_tokenizer_241114.model.v7 (SentencePiece v7, 32,768 tokens)"
    assert v1.specials == ("<s>", "</s>")
    assert {"<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"} <= set(v7.specials)
    assert "<unk>" not in v7.specials  # SentencePiece's unknown piece is not a control token
    tekken = mistral_counter(TEKKEN)
    assert tekken.specials[:4] == ("<unk>", "<s>", "</s>", "[INST]")
    assert len(tekken.specials) == 1000 and tekken.specials[-1] == "<SPECIAL_999>"
    for counter in (v1, v7, tekken):
        assert (counter.bos, counter.added, counter.parses_specials) == ("<s>", 1, True)  # the BOS the server adds


def test_a_tekken_file_that_lists_its_special_tokens_is_read_by_them(tmp_path: Path) -> None:
    data = json.loads(TEKKEN.read_text(encoding="utf-8"))
    data["special_tokens"] = [{"rank": 0, "token_str": "<unk>", "is_control": True},
                              {"rank": 1, "token_str": "<s>", "is_control": True},
                              {"rank": 2, "token_str": "[THINK]", "is_control": True}]  # fmt: skip
    path = tmp_path / "tekken.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    counter = mistral_counter(path)
    assert counter.specials[:3] == ("<unk>", "<s>", "[THINK]") and counter.specials[3] == "<SPECIAL_3>"
    assert counter("[THINK]") == 1 and counter("[INST]") > 1


def test_sentencepiece_counts_the_space_it_is_given() -> None:
    """The dummy prefix is off: " Anna" is ▁Anna and "Anna" is Anna, so a prompt's pieces
    count as they are joined (a space before "Anna" is the one mistral-common adds)."""
    v3 = mistral_counter(V3)
    assert v3(" a  b") == 3  # ▁a ▁ ▁b (with the dummy prefix it would be ▁ ▁a ▁ ▁b)
    text = "[INST] Anna: hello there[/INST] Ilya: hi</s>"
    pieces = split_at_controls(text, v3.specials)
    assert pieces == ["", "[INST]", " Anna: hello there", "[/INST]", " Ilya: hi", "</s>", ""]
    assert v3(text) == 3 + v3(" Anna: hello there") + v3(" Ilya: hi")


def test_without_dummy_prefix_sets_the_normalizer_flag() -> None:
    import sentencepiece

    model = V7.read_bytes()
    plain = sentencepiece.SentencePieceProcessor(model_proto=model)
    edited = sentencepiece.SentencePieceProcessor(model_proto=without_dummy_prefix(model))
    assert plain.encode("Anna", out_type=str) == ["▁Anna"]
    assert edited.encode("Anna", out_type=str) != ["▁Anna"]
    assert edited.encode(" Anna", out_type=str) == ["▁Anna"]
    for broken in (b"", b"\xff\xff", model[:1000]):
        with pytest.raises(ValueError):
            without_dummy_prefix(broken)


def test_a_folder_is_read_by_its_mistral_tokenizer_file(tmp_path: Path) -> None:
    for source in (V3, V7):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    assert "v7" in mistral_counter(tmp_path).name  # the newest SentencePiece version
    (tmp_path / "tekken.json").write_bytes(TEKKEN.read_bytes())
    assert mistral_counter(tmp_path).name.startswith("mistral tekken.json (Tekken")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no Mistral tokenizer file"):
        mistral_counter(empty)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.model.v3", b"not a model at all", "not a SentencePiece model"),
        ("tekken_bad.json", b"{", "not valid JSON"),
        ("tekken_bad.json", b"[1, 2]", "not a Tekken tokenizer file"),
        ("tekken_bad.json", b'{"config": {}, "vocab": []}', "expected pattern"),
        (
            "tekken_bad.json",
            b'{"config": {"pattern": ".", "default_vocab_size": 9000, "default_num_special_tokens": 1000},'
            b' "vocab": [{"rank": 0, "token_bytes": "AA==", "token_str": null}]}',
            "does not fit 1 tokens",
        ),
        (
            "tekken_bad.json",
            b'{"config": {"pattern": ".", "default_vocab_size": 1001, "default_num_special_tokens": 1000},'
            b' "vocab": [{"rank": 0, "token_bytes": 7}]}',
            "base64 token_bytes",
        ),
    ],
)
def test_a_file_that_cannot_load_is_one_error(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as raised:
        mistral_counter(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_without_sentencepiece_the_error_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails
    with pytest.raises(ConfigError, match=r"pip install 'otaku-ctx\[model\]'"):
        mistral_counter(V3)
    assert mistral_counter(TEKKEN)("hello") == 3  # Tekken needs only tiktoken (3 tokens in the small vocabulary)


def test_a_lone_surrogate_is_counted_not_raised() -> None:
    for path in (V3, TEKKEN):
        counter = mistral_counter(path)
        assert counter("a\ud800b") == counter("a\ufffdb")


def test_a_tekken_file_is_converted_once_and_read_from_the_cache(otaku_home: Path, tmp_path: Path) -> None:
    first = mistral_counter(TEKKEN)
    (cache,) = (otaku_home / "cache" / "models").glob("tekken-*.ranks")
    texts = [t["text"] for case in GOLDEN["cases"] for t in case["texts"]]
    again = mistral_counter(TEKKEN)  # from the cache
    assert (again.name, again.specials) == (first.name, first.specials)
    assert [again(t) for t in texts] == [first(t) for t in texts]
    assert cache.read_bytes().count(b"\n") == 5000  # the header, then the 5,000 tokens kept
    cache.write_bytes(b'{"format": 1, "tokens": 3}\nAA==\n')  # not what it says: remade
    assert mistral_counter(TEKKEN)(texts[-1]) == first(texts[-1])
    assert cache.read_bytes().count(b"\n") == 5000
    changed = tmp_path / "tekken.json"  # another file, or this one changed: converted again
    changed.write_bytes(TEKKEN.read_bytes().replace(b'"default_vocab_size": 6000', b'"default_vocab_size": 5500'))
    assert mistral_counter(changed).name == "mistral tekken.json (Tekken v3, 5,500 tokens)"
    assert len(list((otaku_home / "cache" / "models").glob("tekken-*.ranks"))) == 2


def test_a_cache_that_cannot_be_written_only_costs_time(otaku_home: Path) -> None:
    otaku_home.mkdir()
    (otaku_home / "cache").write_text("not a folder", encoding="utf-8")
    assert mistral_counter(TEKKEN)("the river") == mistral_counter(TEKKEN)("the river") > 0


def test_a_tekken_pattern_the_regex_engine_refuses_is_one_error(tmp_path: Path) -> None:
    data = json.loads(TEKKEN.read_text(encoding="utf-8"))
    data["config"]["pattern"] = "(["
    path = tmp_path / "tekken.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="pattern is not usable") as raised:
        mistral_counter(path)
    assert "\n" not in str(raised.value)
