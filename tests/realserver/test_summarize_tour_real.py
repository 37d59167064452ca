"""Issue 27's first "done when", once: `ctx summarize` at its defaults, against the real
llama-server with SmolLM2-135M-Instruct (8,192 tokens in one slot), on a 200-message
SillyTavern chat of otaku's own sample story (tests/fixtures/otaku/make_tour_chat.py) with
each message cut to about 320 characters and no scenes. The run completes, every scene and
every history is written, and none of them fails the scene check a reply must pass (`ctx
scenes` says so of each: `fresh` or `extract`, never `rejected` or `missing`); the chat is left
as it was. docs/summarize.md's
"How small a model" gives the figures of three runs (about ten minutes each), and how few of
the scenes this model writes itself: the test holds the contract, not the prose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import MODEL, free_port, launch, stop  # tests/realserver/conftest.py

from otaku_ctx.story.detect import read_story
from otaku_ctx.story.sidecar import judge, read_sidecar, sidecar_for

FIXTURES = Path(__file__).parents[1] / "fixtures" / "otaku"
sys.path.insert(0, str(FIXTURES))
from make_tour_chat import MESSAGES, chat  # noqa: E402  (tests/fixtures/otaku/make_tour_chat.py)


def ctx(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OTAKU_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "otaku_ctx", *argv], capture_output=True, text=True, env=env)


def test_the_tour_summarized_at_the_defaults_has_every_scene_written_and_none_fails_the_check(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tour.jsonl"
    path.write_text(chat(), encoding="utf-8")
    before = path.read_bytes()
    home = tmp_path / "home"  # no config: ctx's defaults
    port = free_port()
    process = launch(tmp_path / "server.log", port, context=8192, slots=1)
    try:
        done = ctx("summarize", str(path), "--url", f"http://127.0.0.1:{port}/v1", "--model", MODEL, home=home)
    finally:
        stop(process)
    assert done.returncode == 0, done.stderr
    records = read_sidecar(sidecar_for(path))
    story = read_story(path)
    assert len(records) == 9 and [r.start for r in records] == [1, *(r.end + 1 for r in records[:-1])]
    assert records[-1].end == MESSAGES - 20  # the newest 20 settle first
    assert all(r.summary.strip() and r.history.strip() for r in records)
    assert len(judge(story, records).fresh) == len(records)
    listed = json.loads(ctx("scenes", str(path), "--json", home=home).stdout)
    covered = [row for row in listed if row["start"] <= records[-1].end]
    statuses = [(row["start"], row["status"], row["why"]) for row in covered]
    assert {status for _, status, _ in statuses} <= {"fresh", "extract"}, statuses
    assert len(covered) == len(records)
    assert path.read_bytes() == before
    by_model = sum(r.model == MODEL and not r.history_model for r in records)
    print(f"{by_model} of {len(records)} scenes written by the model, the rest extracts; {done.stderr.strip()}")
