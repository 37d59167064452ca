"""`ctx summarize` end to end against the real llama-server (SmolLM2-135M-Instruct): a short
SillyTavern chat refused at a small window builds after it; stopped mid-run — SIGINT or SIGKILL
of ctx, or the server itself killed and started again — every finished scene is kept and the
rerun asks none of them again, counted from the completions the server itself logs (one
`launch_slot_` line a completion; `truncated = 0` on each) and from the spans the sidecar holds;
`--jobs 2` on the server's two slots runs two scenes at once. SmolLM2 is a weak writer: these
check the pipeline and the contracts, not the prose."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import server  # tests/realserver/server.py
from conftest import MODEL, RealServer, Served, overlapped, quiet, served  # tests/realserver/conftest.py

from otaku_ctx.story.detect import read_story
from otaku_ctx.story.sidecar import Record, judge, read_sidecar, sidecar_for

N = 90  # short messages: a few thousand tokens in all, so the step takes minutes
SHORT = 60  # three scenes (messages 1-17, 18-33, 34-50), the newest 10 left to settle


def chat(path: Path, n: int = N) -> Path:
    return server.chat(path, n)


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


def planned(story: Path, args: list[str], home: Path) -> list[tuple[int, int]]:
    plan = json.loads(ctx("summarize", str(story), *args, "--dry-run", "--json", home=home).stdout)
    return [tuple(s) for s in plan["spans"]]


def stopped_mid_run(
    story: Path, args: list[str], home: Path, stop: Callable[[subprocess.Popen[str]], None]
) -> tuple[int, str, list[Record]]:
    """`ctx summarize` started, and `stop` called once the first scene is in the sidecar (the
    next request in flight): (its exit status, its stderr, the sidecar it left)."""
    env = {**os.environ, "OTAKU_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "otaku_ctx", "summarize", str(story), *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a run started in the background (`.ci/run &`) inherits SIGINT
        # ignored, and would rightly ignore the test's Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    sidecar = sidecar_for(story)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (sidecar.exists() and sidecar.read_text().strip()):
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.05)
    stop(process)
    _, err = process.communicate(timeout=60)
    return process.returncode, err, read_sidecar(sidecar)  # valid JSON lines: never torn


def finishes_the_rest(
    story: Path, args: list[str], home: Path, log: Path, spans: list[tuple[int, int]], finished: list[Record]
) -> None:
    """The rerun asks only for the scenes not finished before (and the histories), as the
    server's own log counts what it was asked; the finished scenes stand as they were written."""
    quiet(log)  # what the stopped run left in flight is counted before, not in, the rerun
    asked_before = served(log)
    done = ctx("summarize", str(story), *args, "--json", home=home)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summaries"] == len(spans) - len(finished)
    quiet(log)
    assert served(log) - asked_before == report["requests"]
    records = read_sidecar(sidecar_for(story))
    assert [(r.start, r.end) for r in records] == spans
    assert all(r.summary.strip() and r.history.strip() for r in records)
    kept = {r.start: (r.summary, r.made) for r in records}
    assert all(kept[r.start] == (r.summary, r.made) for r in finished)  # not asked again, not rewritten
    assert "truncated = 1" not in log.read_text(errors="replace")  # nothing was cut by the server


def test_a_chat_refused_before_builds_after_and_survives_sigint(real_server: RealServer, tmp_path: Path) -> None:
    story = chat(tmp_path / "chat.jsonl")
    before = story.read_bytes()
    settings = config(tmp_path)
    home = tmp_path / "home"
    args = ["--url", real_server.url, "--model", MODEL, "--config", str(settings)]
    refused = ctx("build", str(story), "--window", "2000", "--config", str(settings), home=home)
    assert refused.returncode == 3, refused.stderr
    spans = planned(story, args, home)
    assert len(spans) >= 3

    code, _, finished = stopped_mid_run(story, args, home, lambda p: p.send_signal(signal.SIGINT))
    assert code == 130
    assert finished and all(r.summary.strip() for r in finished)
    finishes_the_rest(story, args, home, real_server.log, spans, finished)

    again = ctx("summarize", str(story), *args, "--json", home=home)
    assert json.loads(again.stdout)["requests"] == 0  # nothing changed: nothing asked

    built = ctx("inspect", str(story), "--window", "2000", "--config", str(settings), "--json", home=home)
    assert built.returncode == 0, built.stderr
    facts = json.loads(built.stdout)
    assert facts["case"] in (3, 4, 5) and facts["tokens"] <= facts["limit"]
    assert story.read_bytes() == before


def test_sigkill_of_ctx_mid_run(real_server: RealServer, tmp_path: Path) -> None:
    """No handler runs: what is in the sidecar is what each commit's rename left."""
    story = chat(tmp_path / "chat.jsonl", SHORT)
    home = tmp_path / "home"
    args = ["--url", real_server.url, "--model", MODEL, "--config", str(config(tmp_path))]
    spans = planned(story, args, home)
    code, _, finished = stopped_mid_run(story, args, home, lambda p: p.send_signal(signal.SIGKILL))
    assert code == -signal.SIGKILL
    assert 1 <= len(finished) < len(spans) and all(r.summary.strip() for r in finished)
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*.tmp"))
    finishes_the_rest(story, args, home, real_server.log, spans, finished)


def test_the_server_killed_mid_run(own_server: Served, tmp_path: Path) -> None:
    """The request in flight fails, is retried as a transport failure, then ctx stops with one
    line naming the URL (exit 1), the sidecar as the last commit left it; the server started
    again, the rerun finishes the rest."""
    story = chat(tmp_path / "chat.jsonl", SHORT)
    home = tmp_path / "home"
    args = ["--url", own_server.url, "--model", MODEL, "--config", str(config(tmp_path))]
    spans = planned(story, args, home)
    code, err, finished = stopped_mid_run(story, args, home, lambda p: own_server.kill())
    assert code == 1 and err.count("\n") == 1 and own_server.url in err, err
    assert 1 <= len(finished) < len(spans) and all(r.summary.strip() for r in finished)
    own_server.start()
    finishes_the_rest(story, args, home, own_server.log, spans, finished)


def test_two_jobs_on_two_slots(real_server: RealServer, tmp_path: Path) -> None:
    """`--jobs 2` against `-np 2`: the server ran two scenes at once (its log says so), and the
    sidecar is whole, every history rolled in story order from the one before it."""
    story = chat(tmp_path / "chat.jsonl", SHORT)
    home = tmp_path / "home"
    args = ["--url", real_server.url, "--model", MODEL, "--config", str(config(tmp_path))]
    spans = planned(story, args, home)
    quiet(real_server.log)
    mark = len(real_server.log.read_bytes())
    done = ctx("summarize", str(story), *args, "--jobs", "2", "--json", home=home)
    assert done.returncode == 0, done.stderr
    part = tmp_path / "this-run.log"
    part.write_bytes(real_server.log.read_bytes()[mark:])
    assert overlapped(part) == 2
    records = read_sidecar(sidecar_for(story))
    assert [(r.start, r.end) for r in records] == spans
    judged = judge(read_story(story), records)
    assert not judged.stale and judged.history_ok == {r.start for r in records}
