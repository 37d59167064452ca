"""Issue 17's first "done when", against the real server: a SillyTavern chat of a few hundred
short messages with no summaries, refused at `--window 8192`, builds after `ctx summarize` as
case 3, 4 or 5 within the limit, every message accounted for (head, summaries, history,
tail), and the chat file byte-identical. SmolLM2 writes the summaries: the test checks the
pipeline and the contracts, not the prose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import MODEL, RealServer  # tests/realserver/conftest.py

N = 320  # about 8,600 tokens of chat: more than an 8k window holds


def chat(path: Path) -> Path:
    header = {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-01-01", "chat_metadata": {}}
    lines = [json.dumps(header)]
    for i in range(1, N + 1):
        who = "Mara" if i % 2 else "Keeper"
        text = (
            f"{who}, turn {i}: the lamp burns low, the storm is over the bay, "
            f"and the ferry from the north shore is late again tonight."
        )
        lines.append(json.dumps({"name": who, "is_user": bool(i % 2), "mes": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def ctx(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OTAKU_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "otaku_ctx", *argv], capture_output=True, text=True, env=env)


def accounted(facts: dict) -> tuple[int, int]:
    """The messages the prompt accounts for, (first, last), when head, history, summaries and
    tail join with no message left out: the history stands for the chain's scenes up to its
    own (the chain starts with the scene holding the message after the head), each summary
    for its scene, and the tail starts right after the last of them."""
    head, tail = facts["head"], facts["tail"]
    scenes = {s["id"]: s for s in facts["scenes"]}
    ranges = [(head["first"], head["last"])]
    if facts["history"]:
        first = next(s for s in facts["scenes"] if s["start"] <= head["last"] + 1 <= s["end"])
        ranges.append((first["start"], scenes[facts["history"]["through_scene"]]["end"]))
    ranges += [(scenes[i]["start"], scenes[i]["end"]) for i in facts["summaries"]]
    assert ranges[1:] and tail["first"] == ranges[-1][1] + 1, (ranges, tail)  # the middle is summarized
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert start <= end + 1, ranges  # no message between two sections
    return ranges[0][0], tail["last"]


def test_a_long_chat_refused_at_8k_builds_after_summarize(real_server: RealServer, tmp_path: Path) -> None:
    story = chat(tmp_path / "chat.jsonl")
    before = story.read_bytes()
    home = tmp_path / "home"
    settings = tmp_path / "config.toml"
    settings.write_text(
        "[summarize]\nmin_chars = 4000\nsummary_words = 40\nhistory_words = 30\nrepeat_penalty = 1.1\ntimeout = 300\n"
        "attempts = 8\n",  # SmolLM2 sometimes echoes the schema's example; ctx refuses it and asks again
        encoding="utf-8",
    )
    common = ["--config", str(settings), "--window", "8192"]
    refused = ctx(home, "build", str(story), *common)
    assert refused.returncode == 3 and "ctx summarize" in refused.stderr, refused.stderr

    done = ctx(home, "summarize", str(story), "--url", real_server.url, "--model", MODEL, "--config", str(settings))
    assert done.returncode == 0, done.stderr

    built = ctx(home, "build", str(story), *common)
    assert built.returncode == 0 and built.stdout, built.stderr
    facts = json.loads(ctx(home, "inspect", str(story), *common, "--json").stdout)
    assert facts["case"] in (3, 4, 5) and facts["tokens"] <= facts["limit"]
    assert accounted(facts) == (1, N)
    assert story.read_bytes() == before
