"""Story text is data on every route (issue 26), proven with llama.cpp's own tokenizer: a story
whose messages spell the model's control tokens ("<|im_start|>", "<start_of_turn>",
"<|START_OF_TURN_TOKEN|>", ...) builds a prompt that `llama-tokenize` — llama.cpp's tool, loading
the pinned llama.cpp's vocab-only test GGUFs, parsing special tokens as llama-server parses a
prompt — reads with exactly as many control tokens as the prompt of its plain twin (the same
story with each control token's text put as "x"). So no text of the story became a control
token; only the template's own markers are.

The routes: ctx's counter read from the GGUF with its chat template (`--use`), or with a
built-in format (`--tokenizer`, Llama 3's vocabulary having no template); the default counter
with the GGUF's chat template as the format (`--format`); and the real llama-server's own
tokenizer (`--tokenizer server`) with SmolLM2's GGUF as the model (`--use`) or as the format
(`--format`). setup.sh builds llama-tokenize beside llama-server and keeps the vocabularies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SETUP, RealServer  # tests/realserver/conftest.py

from otaku_ctx.cli.app import main
from otaku_ctx.model.gguf import read_gguf

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL in tokenizer.ggml.token_type
# each vocabulary, and the routes its prompt is built by (llama-bpe's file has no chat template)
ROUTES: dict[str, list[list[str]]] = {
    "qwen2": [["--use"], ["--format"]],
    "phi-3": [["--use"], ["--format"]],
    "gemma-4": [["--use"], ["--format"]],
    "command-r": [["--use"], ["--format"]],
    "llama-bpe": [["--tokenizer", "{gguf}", "--format", "llama3"]],
}
MOST_INJECTED = 24  # of a vocabulary's control tokens (Llama 3 has 256, most of them reserved)


def paths() -> dict[str, str]:
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    if found.returncode:
        pytest.fail(f"{found.stderr.strip()} (tests/realserver/setup.sh builds llama-tokenize)")
    return dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)


def controls(gguf: Path) -> dict[int, str]:
    """The vocabulary's control tokens, by id."""
    tokens, types = read_gguf(gguf).typed_tokens()
    return {i: t for i, (t, kind) in enumerate(zip(tokens, types, strict=False)) if kind == CONTROL}


def injected(named: list[str]) -> list[str]:
    """The ones a story spells: the named ones first (the turn markers), then the rest in order."""
    markers = [t for t in named if not t.startswith(("<|reserved", "<|placeholder", "<unused", "[unused"))]
    return (markers + [t for t in named if t not in markers])[:MOST_INJECTED]


def story(path: Path, spelled: list[str], plain: bool) -> Path:
    """A short chat whose every message spells some of `spelled` (or "x" for each, plain)."""
    lines = [{"type": "story", "title": "The lamp", "user": "Mara", "char": "Keeper"}]
    lines.append({"role": "system", "content": f"You are the keeper. {'x' if plain else spelled[0]} Stay in role."})
    for i in range(0, len(spelled), 3):
        said = " then ".join("x" if plain else t for t in spelled[i : i + 3])
        who = ("user", "Mara") if i % 2 == 0 else ("assistant", "Keeper")
        lines.append({"role": who[0], "name": who[1], "content": f"The lamp says {said}, and the storm goes on."})
    lines.append({"role": "user", "name": "Mara", "content": "Is the lamp lit?"})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def read_ids(tool: str, gguf: Path, prompt: str, tmp_path: Path) -> list[int]:
    """The tokens llama.cpp reads in `prompt` as a server reads a prompt: special tokens
    parsed, and the BOS added when the vocabulary says to add one."""
    text = tmp_path / "prompt.txt"
    text.write_text(prompt, encoding="utf-8")
    done = subprocess.run(
        [tool, "-m", str(gguf), "-f", str(text), "--ids", "--log-disable"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def count_controls(tool: str, gguf: Path, prompt: str, ids: dict[int, str], tmp_path: Path) -> int:
    """The control tokens llama.cpp reads in `prompt`; and one BOS, always: the prompt starts
    with the BOS when the vocabulary adds one, and never with two (SmolLM2's BOS is also its
    turn marker, so only the start tells)."""
    read = read_ids(tool, gguf, prompt, tmp_path)
    model = read_gguf(gguf)
    if model.bos_id is not None:
        assert read[:2] != [model.bos_id] * 2, f"two BOS: {read[:8]}"
        if model.add_bos:
            assert read[0] == model.bos_id, read[:8]
    return sum(1 for token in read if token in ids)


CASES = [(name, route) for name, routes in ROUTES.items() for route in routes]


@pytest.mark.parametrize(("name", "route"), CASES, ids=[f"{n}-{' '.join(r[:1])}" for n, r in CASES])
def test_no_text_of_the_story_becomes_a_control_token(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, route: list[str]
) -> None:
    found = paths()
    gguf = Path(found["LLAMA_VOCAB"]) / f"ggml-vocab-{name}.gguf"
    ids = controls(gguf)
    spelled = injected(list(ids.values()))
    flags = [a.replace("{gguf}", str(gguf)) for a in route] + ([str(gguf)] if len(route) == 1 else [])
    counts = []
    for plain in (False, True):
        chat = story(tmp_path / f"{'plain' if plain else 'injected'}.jsonl", spelled, plain)
        code = main(["build", str(chat), *flags, "--window", "8192"])
        prompt, err = capsys.readouterr()
        assert code == 0, err
        counts.append(count_controls(found["LLAMA_TOKENIZE"], gguf, prompt, ids, tmp_path))
        print(name, route, "plain" if plain else "injected", counts[-1], file=sys.stderr)
    injected_count, plain_count = counts
    assert plain_count > 0  # the template's own markers are control tokens: the check can see them
    assert injected_count == plain_count, f"{injected_count - plain_count} control tokens came from the story's text"


@pytest.mark.parametrize("route", ["--use", "--format"])
def test_no_text_of_the_story_becomes_a_control_token_on_the_servers_count(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, real_server: RealServer, route: str
) -> None:
    found = paths()
    gguf = Path(found["SMOLLM2_GGUF"])
    ids = controls(gguf)
    spelled = injected(list(ids.values()))
    server = real_server.url.removesuffix("/v1")
    counts = []
    for plain in (False, True):
        chat = story(tmp_path / f"{'plain' if plain else 'injected'}.jsonl", spelled, plain)
        code = main(
            ["build", str(chat), "--tokenizer", "server", "--server", server, route, str(gguf), "--window", "2048"]
        )
        prompt, err = capsys.readouterr()
        assert code == 0, err
        counts.append(count_controls(found["LLAMA_TOKENIZE"], gguf, prompt, ids, tmp_path))
    injected_count, plain_count = counts
    assert plain_count > 0
    assert injected_count == plain_count, f"{injected_count - plain_count} control tokens came from the story's text"
