"""Benchmark (issue 44): does the player wait for ctx? Time to first token, turn by turn, with
`ctx serve` in front of the real llama-server (SmolLM2-135M-Instruct, one slot, `-np 1`, as most
local servers run) and its summaries being written, against the frontend alone straight to the
same server.

Two sessions, played with a think time between turns (the player reading and typing; seeded,
5 to 20 s): SillyTavern's captured requests (tests/fixtures/sillytavern-requests, the long chat:
16 turns of a 300-message chat, the probe left out), and a 300-message chat of this script's
own, played on for 10 turns. Each turn is streamed, its reply at most `--reply` tokens.

- **through serve**: serve with its defaults (summaries on: written in the player's pauses, and
  a summary request on the server stopped when a turn comes);
- **frontend alone**: the same requests to llama-server itself, cut as a frontend does to the
  window (its frame and the newest messages that fit, the reply's tokens kept free, by
  cl100k_base with a tenth spare).

It reports each side's time to first token (median, 90th percentile) and their ratio, the
summary requests serve stopped, and the summaries and extracts written during the run.

    python benchmarks/ttft_bench.py                 # both sessions (about 25 minutes)
    python benchmarks/ttft_bench.py --smoke         # 4 turns of the own chat, 1-3 s of thought

Figures (2026-12-07, this 2-core machine, `-t 1`, think 5-20 s, reply 48; the frontend's run
first, then serve's, on one server): time to first token through serve median 2.86 s, p90
24.80 s; the frontend alone median 12.32 s, p90 36.38 s; p90 ratio 0.68 (a run before it, with
other work on the machine: 0.63). Summary requests stopped by a turn: 5. Scenes with their
record at the end: 15, all ctx's extracts (no reply of SmolLM2's would do), every settled scene
of both chats, no request left and no pass under way. The day before, a turned-down reply
counted as one that ended, and each run ended with 6 and 7 of a pass's requests unsent.
docs/serve.md, "What the player sees", says what they mean. Benchmarks report figures; no test
asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "realserver"))
from serve_bench import prompt_tokens  # noqa: E402
from server import free_port, launch, stop  # noqa: E402 - the tests' own server helpers

WINDOW = 4096
SEED = 44
CAPTURED = REPO / "tests" / "fixtures" / "sillytavern-requests" / "seraphina-long-chat.jsonl"
LINES = (
    "The lamp needs oil before the storm reaches the rocks.",
    "I saw the ferry turn back at the harbour mouth.",
    "The gulls went quiet an hour ago, and that is never a good sign.",
    "Bring the rope from the lower stair, the wind is rising.",
    "A letter came for you with the morning boat.",
    "The glass in the lantern room cracked again last night.",
    "Tell me about the keeper who lived here before you.",
    "The tide will be high at midnight, higher than last winter.",
)


def captured() -> list[dict[str, Any]]:
    """SillyTavern's bodies, in order, the one-message probe left out."""
    bodies = [json.loads(line)["body"] for line in CAPTURED.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [b for b in bodies if len(b["messages"]) > 1]


def own_chat(turns: int) -> list[dict[str, Any]]:
    """A frame and 300 messages, then `turns` more user messages, each turn's body the chat so far
    (the replies in between are the chat's own lines, as a replay's are)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Keeper, the old lighthouse keeper."}]
    for i in range(1, 301 + 2 * turns):
        keeper = i % 2 == 0  # Mara opens, so each turn's body ends with her message
        text = f"{LINES[i % len(LINES)]} {LINES[(i * 3) % len(LINES)]}"
        messages.append({"role": "assistant" if keeper else "user", "content": text})
    return [{"model": "smollm2", "messages": messages[: 301 + 2 * t + 1]} for t in range(turns)]


def fitted(body: dict[str, Any], reply: int) -> dict[str, Any]:
    """What a frontend sends at the window: its leading system messages and the newest messages
    that fit, by cl100k_base with a tenth spare."""
    messages = body["messages"]
    frame = [m for m in messages[:8] if m["role"] == "system"]
    rest = messages[len(frame) :]
    budget = int((WINDOW - reply) * 0.9) - len(prompt_tokens(frame))
    kept: list[dict[str, Any]] = []
    for message in reversed(rest):
        cost = len(prompt_tokens([message]))
        if cost > budget:
            break
        budget -= cost
        kept.append(message)
    return {**body, "messages": frame + kept[::-1]}


def first_token(url: str, body: dict[str, Any]) -> float:
    """Seconds from the request sent to the first streamed text, the reply read to its end."""
    data = json.dumps({**body, "stream": True}).encode()
    request = urllib.request.Request(url + "/chat/completions", data, {"Content-Type": "application/json"})
    started, first = time.monotonic(), None
    with urllib.request.urlopen(request, timeout=600) as answer:
        for raw in answer:
            line = raw.decode("utf-8", "replace").strip()
            if first is None and line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[5:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices", ())):
                    first = time.monotonic()
    return (first or time.monotonic()) - started


def play(url: str, sessions: list[list[dict[str, Any]]], think: tuple[float, float], direct: bool) -> list[float]:
    rng = random.Random(SEED)
    times = []
    for bodies in sessions:
        for body in bodies:
            times.append(first_token(url, fitted(body, body["max_tokens"]) if direct else body))
            time.sleep(rng.uniform(*think))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reply", type=int, default=48, help="max_tokens of each turn (default 48)")
    parser.add_argument("--smoke", action="store_true", help="4 turns of the own chat, 1-3 s of thought")
    args = parser.parse_args()
    think = (1.0, 3.0) if args.smoke else (5.0, 20.0)
    own = own_chat(4 if args.smoke else 10)
    sessions = [own] if args.smoke else [captured(), own]
    sessions = [[{**b, "max_tokens": args.reply} for b in bodies] for bodies in sessions]

    os.environ["OTAKU_HOME"] = tempfile.mkdtemp(prefix="ttft-bench-")
    from otaku_ctx.config import ServeSettings, Settings
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running
    from otaku_ctx.story.sidecar import read_sidecar
    from otaku_ctx.summarize.extract import EXTRACT

    log = Path(tempfile.mkdtemp(prefix="ttft-bench-server-")) / "llama-server.log"
    process = launch(log, port := free_port(), context=WINDOW, slots=1)
    backend = f"http://127.0.0.1:{port}/v1"
    try:
        alone = play(backend, sessions, think, direct=True)
        service = Service(Settings(serve=ServeSettings(backend=backend, port=0)))
        running = Running(service)
        try:
            served = play(running.url, sessions, think, direct=False)
            with urllib.request.urlopen(running.url.removesuffix("/v1") + "/ctx/stats", timeout=60) as answer:
                stats = json.loads(answer.read())
            preempted = service.gate.preempted
        finally:
            running.stop()
    finally:
        stop(process)

    def p90(values: list[float]) -> float:
        return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]

    written = [c["summaries"] for c in stats["chats"]]
    left = sum(c["summaries_left"] for c in stats["chats"])
    sidecars = [read_sidecar(path) for path in (Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries")]
    records = [r for sidecar in sidecars for r in sidecar]
    extracts = sum(r.model == EXTRACT for r in records)
    print(f"{len(served)} turns, llama-server -np 1 -c {WINDOW}, think {think[0]:g}-{think[1]:g} s, reply {args.reply}")
    print(f"time to first token through serve: median {statistics.median(served):.2f} s, p90 {p90(served):.2f} s")
    print(f"time to first token, frontend alone: median {statistics.median(alone):.2f} s, p90 {p90(alone):.2f} s")
    print(f"p90 ratio serve / alone: {p90(served) / p90(alone):.2f}")
    print(f"summary requests stopped by a turn: {preempted}; written during the run: {written}")
    print(
        f"scenes with their record at the end: {len(records)} ({len(records) - extracts} the model's summaries,"
        f" {extracts} ctx's extracts); requests left unwritten: {left}"
    )
    lengths = [c["turns"][-1]["messages"] for c in stats["chats"]]
    covered = sorted((len(sidecar), max(r.end for r in sidecar)) for sidecar in sidecars if sidecar)
    writing = sum(c["summaries_writing"] for c in stats["chats"])
    print(f"chats of {lengths} messages; sidecars (scenes, to message): {covered}; chats still writing: {writing}")
    print("per turn (serve, alone):", [(round(a, 2), round(b, 2)) for a, b in zip(served, alone, strict=True)])


if __name__ == "__main__":
    main()
