"""The GGUF counter against llama.cpp itself: llama-server's /tokenize (`parse_special` on, nothing
added) on SmolLM2-135M-Instruct's GGUF gives the same tokens as `gguf_counter` for thousands of
texts (tests/tokenizer_texts.py: the fixtures' messages, random texts with emoji, CJK, Arabic,
combining marks, digits, odd spaces, CRLF and lone CRs, control tokens and look-alikes, long
words). The same vocabulary with other `tokenizer.ggml.pre` names (a copy of the GGUF with that
one key changed) checks the Llama 3, Qwen 2, GPT-2, Tekken and GPT-4o pre-tokenizers the same way."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf_variant import variant
from server import built, free_port, healthy, stop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizer_texts import all_texts  # noqa: E402

from otaku_ctx.model.gguf import read_gguf  # noqa: E402
from otaku_ctx.model.hf import gguf_counter  # noqa: E402

pytest.importorskip("tokenizers")


class Tokenize:
    """llama-server on one GGUF, asked for the tokens of texts."""

    def __init__(self, model: Path, log: Path) -> None:
        server, _ = built()
        self.port = free_port()
        command = [server, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["-t", "1", "-c", "256", "-np", "1", "--no-webui"]
        with log.open("ab") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not healthy(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                stop(self.process)
                pytest.fail("llama-server did not start: " + log.read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def __call__(self, text: str) -> list[int]:
        body = json.dumps({"content": text, "add_special": False, "parse_special": True})
        self.connection.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
        return list(json.loads(self.connection.getresponse().read())["tokens"])

    def close(self) -> None:
        self.connection.close()
        stop(self.process)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return Path(built()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[Tokenize]]:
    started: list[Tokenize] = []
    yield started
    for server in started:
        server.close()


def _compared(model: Path, tokenize: Tokenize) -> tuple[list[tuple[str, int, int]], list[int]]:
    """(the texts where ctx and the server differ, the server's count of each text)."""
    counter = gguf_counter(model)
    texts = all_texts()
    assert len(texts) > 3000
    wrong, counts = [], []
    unknown = counter.loaded().unknown  # a byte with no token: llama.cpp gives no id for it
    for text in texts:
        want = tokenize(text)
        ids = [i for i in counter.loaded().tokenizer.encode(text, add_special_tokens=False).ids if i != unknown]
        if counter(text) != len(want) or ids != want:
            wrong.append((text[:120], len(want), counter(text)))
        counts.append(len(want))
    return wrong, counts


def test_smollm2_counts_as_llama_server_counts(smollm2: Path, served: list[Tokenize], tmp_path: Path) -> None:
    model = read_gguf(smollm2)
    assert (model.tokenizer_model, model.pre, model.add_bos) == ("gpt2", "smollm", False)
    served.append(Tokenize(smollm2, tmp_path / "server.log"))
    wrong, _ = _compared(smollm2, served[0])
    assert wrong == []
    assert served[0]("<|im_start|>user\nHi<|im_end|>")[0] == 1  # a control token is parsed: one token


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt-2", "tekken", "gpt-4o"])
def test_other_pre_tokenizers_count_as_llama_server_counts(
    smollm2: Path, served: list[Tokenize], tmp_path: Path, pre: str
) -> None:
    copy = variant(smollm2, tmp_path / f"SmolLM2-{pre}.gguf", {"tokenizer.ggml.pre": pre})
    served.append(Tokenize(copy, tmp_path / "server.log"))
    wrong, counts = _compared(copy, served[0])
    assert wrong == []
    smollm = gguf_counter(smollm2)
    changed = sum(count != smollm(text) for text, count in zip(all_texts(), counts, strict=True))
    assert changed > 100  # the server did split this vocabulary another way


def test_tokens_llama_cpp_retypes_by_their_text(smollm2: Path, served: list[Tokenize], tmp_path: Path) -> None:
    """llama.cpp makes an end-of-generation or fill-in-the-middle text a control token whatever
    the file says, gpt-oss's `<|channel|>` user-defined, and `</s>` ordinary beside
    `<|tool_response>`: a copy of SmolLM2's GGUF with such texts in place of tokens no merge
    uses (the digits) counts as the server counts it."""
    vocabulary = read_gguf(smollm2).vocabulary()
    tokens, types = list(vocabulary.tokens), list(vocabulary.token_types)
    used = {part for merge in vocabulary.merges for part in (*merge.split(" ", 1), merge.replace(" ", "", 1))}
    free = [i for i, text in enumerate(tokens) if text not in used and types[i] == 1]
    renamed = [("<|eot_id|>", 1), ("<|channel|>", 3), ("</s>", 3), ("<|tool_response>", 1), ("<fim_prefix>", 1)]
    renamed += [("<unk-ish>", 2), ("<user_tok>", 4)]
    for i, (text, kind) in zip(free, renamed, strict=False):
        tokens[i], types[i] = text, kind
    copy = variant(
        smollm2, tmp_path / "retyped.gguf", {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    )
    served.append(Tokenize(copy, tmp_path / "server.log"))
    counter = gguf_counter(copy)
    texts = [f"a{text}b" for text, _ in renamed] + ["all " + "".join(text for text, _ in renamed) + " end"]
    assert [counter(text) for text in texts] == [len(served[0](text)) for text in texts]
    assert counter("a<|eot_id|>b") == 3 and counter("a</s>b") > 3  # a control token; an ordinary text
    assert "<|eot_id|>" in counter.specials and "<|channel|>" in counter.specials  # user-defined markup too
