"""`ctx summarize` end to end against the real llama-server (SmolLM2-135M-Instruct): a short
SillyTavern chat refused at a small window builds after it; SIGINT mid-run keeps every finished
scene and the rerun asks none of them again, counted from the requests the server itself logs
(one `launch_slot_` line a completion; `truncated = 0` on each) and from the spans the sidecar holds. SmolLM2 is a
weak writer: these check the pipeline and the contracts, not the prose."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import RealServer  # tests/realserver/conftest.py (rootdir-relative, no package)

from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

N = 90  # short messages: a few thousand tokens in all, so the step takes minutes


def chat(path: Path) -> Path:
    header = {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-01-01", "chat_metadata": {}}
    lines = [json.dumps(header)]
    for i in range(1, N + 1):
        who = "Mara" if i % 2 else "Keeper"
        text = f"{who} speaks in turn {i}: the lamp is lit, the storm grows and the ferry is late again tonight."
        lines.append(json.dumps({"name": who, "is_user": bool(i % 2), "mes": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(folder: Path) -> Path:
    path = folder / "config.toml"
    path.write_text(
        "[context]\nmin_tail_messages = 20\ntail_floor = 10\n"
        "[summarize]\nsettle = 10\nmin_chars = 1500\nmin_messages = 15\nsummary_words = 40\nhistory_words = 30\n"
        "repeat_penalty = 1.1\ntimeout = 120\n",
        encoding="utf-8",
    )
    return path


def ctx(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OTAKU_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "otaku_ctx", *argv], capture_output=True, text=True, env=env)


def served(log: Path) -> int:
    """The completions the server itself ran: one `launch_slot_` line a task in its log."""
    return log.read_text(errors="replace").count("launch_slot_")


def test_a_chat_refused_before_builds_after_and_survives_sigint(real_server: RealServer, tmp_path: Path) -> None:
    story = chat(tmp_path / "chat.jsonl")
    before = story.read_bytes()
    settings = config(tmp_path)
    home = tmp_path / "home"
    args = ["--url", real_server.url, "--model", "smollm2", "--config", str(settings)]
    refused = ctx("build", str(story), "--window", "2000", "--config", str(settings), home=home)
    assert refused.returncode == 3, refused.stderr

    plan = json.loads(ctx("summarize", str(story), *args, "--dry-run", "--json", home=home).stdout)
    spans = [tuple(s) for s in plan["spans"]]
    assert len(spans) >= 3

    # SIGINT once the first scene is in the sidecar
    env = {**os.environ, "OTAKU_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "otaku_ctx", "summarize", str(story), *args], env=env, stderr=subprocess.PIPE, text=True
    )
    sidecar = sidecar_for(story)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (sidecar.exists() and sidecar.read_text().strip()):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    assert process.wait(60) == 130
    finished = read_sidecar(sidecar)
    assert finished and all(r.summary.strip() for r in finished)
    asked_before = served(real_server.log)

    done = ctx("summarize", str(story), *args, "--json", home=home)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # the rerun asked only for the scenes not finished before (and the histories)
    assert report["summaries"] == len(spans) - len(finished)
    assert served(real_server.log) - asked_before == report["requests"]
    records = read_sidecar(sidecar)
    assert [(r.start, r.end) for r in records] == spans
    assert all(r.summary.strip() and r.history.strip() for r in records)

    again = ctx("summarize", str(story), *args, "--json", home=home)
    assert json.loads(again.stdout)["requests"] == 0  # nothing changed: nothing asked

    built = ctx("inspect", str(story), "--window", "2000", "--config", str(settings), "--json", home=home)
    assert built.returncode == 0, built.stderr
    facts = json.loads(built.stdout)
    assert facts["case"] in (3, 4, 5) and facts["tokens"] <= facts["limit"]
    assert story.read_bytes() == before
    assert "truncated = 1" not in real_server.log.read_text(errors="replace")  # nothing was cut by the server
