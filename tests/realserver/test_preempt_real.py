"""The player never waits for ctx (issue 44), against the real llama-server with one slot
(`-np 1`, as most local servers run): a turn that arrives while a long summary request is on the
server stops it — its connection shut, the server stops that task — and gets its first token
before that summary request would have ended; the same request is asked again, whole, in the
pause after the turn, and the chat's summaries are all written after it.

"Would have ended" from the server's own figures: the turn is sent while a summary request is
generating (llama-server's `/slots`: `n_decoded` tokens written so far, at temperature 0) and has
written more than a short summary's tokens, so it is one of the long ones; asked again whole
after the turn, the same request writes the same `N` tokens (greedy, the same prompt), so the
stopped one had `N - n_decoded` still to write, each no faster than the fastest token the server
wrote in the whole test (its log's `eval time` lines). A turn that came while a summary's prompt
was being read waits for that batch (llama-server notices a closed connection between batches):
benchmarks/ttft_bench.py measures those turns too."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import free_port, launch, stop

from otaku_ctx.config import ServeSettings, Settings, SummarizeSettings
from otaku_ctx.serve.gate import GatedBackend
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running

LINES = (
    "The lamp needs oil before the storm reaches the rocks.",
    "I saw the ferry turn back at the harbour mouth.",
    "The gulls went quiet an hour ago, and that is never a good sign.",
    "Bring the rope from the lower stair, the wind is rising.",
    "A letter came for you with the morning boat.",
    "The glass in the lantern room cracked again last night.",
    "Tell me about the keeper who lived here before you.",
)
DEADLINE = 600.0
LONG = 48  # tokens written: past every short summary SmolLM2 writes of this chat (about 20 to 42)


def opening(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Keeper, the lighthouse keeper."}]
    for i in range(1, n + 1):
        who = "Keeper" if i % 2 else "Mara"
        text = f"{LINES[i % len(LINES)]} {LINES[(i * 3) % len(LINES)]}"
        messages.append({"role": "assistant" if i % 2 else "user", "name": who, "content": text})
    return messages


class Watch:
    """Each summary request serve's gate let go: (its `Cancel`, when it began, when it ended),
    seen every 5 ms from a thread of the test's."""

    def __init__(self, service: Service) -> None:
        self.gate = service.gate
        self.seen: list[list[Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            now, cancel = time.monotonic(), self.gate.cancel
            if self.seen and self.seen[-1][2] is None and self.seen[-1][0] is not cancel:
                self.seen[-1][2] = now
            if cancel is not None and (not self.seen or self.seen[-1][0] is not cancel):
                self.seen.append([cancel, now, None])
            time.sleep(0.005)


class Asked:
    """Each call of serve's summarizer to its gated backend: when it began, its temperature, and
    once it returned (asked again as often as turns stopped it), when and the tokens it wrote."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        real = GatedBackend.chat

        def chat(backend: GatedBackend, messages: Sequence[Mapping[str, str]], **asked: Any) -> Any:
            call = {"began": time.monotonic(), "temperature": asked.get("temperature")}
            self.calls.append(call)
            reply = real(backend, messages, **asked)
            call.update(ended=time.monotonic(), tokens=reply.completion_tokens)
            return reply

        monkeypatch.setattr(GatedBackend, "chat", chat)


def writing(port: int) -> int:
    """The tokens the server's one slot has written of the task it runs now (0: none)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=10) as answer:
        [slot] = json.loads(answer.read())
    if not slot.get("is_processing"):
        return 0
    return max((t.get("n_decoded", 0) for t in slot.get("next_token", ())), default=0)


def test_a_turn_during_a_long_summary_request_stops_it_and_it_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # preemption alone: the pass keeps asking however many of SmolLM2's replies are turned down
    # (with the give-up rule, three turned down on the first scene end the pass before any long
    # request at temperature 0 comes; the rule has its own tests, and ttft_bench measures both)
    monkeypatch.setattr("otaku_ctx.serve.gate.STOPS", 1000)
    log = tmp_path / "llama-server.log"
    process = launch(log, port := free_port(), context=4096, slots=1)
    summarize = SummarizeSettings(settle=8, min_chars=1500, min_messages=16, temperature=0.0, timeout=300)
    service = Service(Settings(summarize=summarize, serve=ServeSettings(backend=f"http://127.0.0.1:{port}/v1", port=0)))
    asked = Asked(monkeypatch)
    running = Running(service)
    watch = Watch(service)
    try:
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)
        chat = opening(80)
        for _ in range(2):  # a Regenerate: the second request makes it a chat, and its summaries start
            client.chat.completions.create(model="smollm2", messages=chat, max_tokens=8)  # type: ignore[arg-type]
        deadline = time.monotonic() + DEADLINE
        while True:  # a summary request at temperature 0 that is writing a long reply
            assert time.monotonic() < deadline, "no long summary request"
            written = writing(port)
            if written >= LONG and watch.seen and watch.seen[-1][2] is None and asked.calls[-1]["temperature"] == 0:
                break
            time.sleep(0.05)
        stopped, began, call = watch.seen[-1][0], watch.seen[-1][1], asked.calls[-1]
        sent = time.monotonic()
        stream = client.chat.completions.create(
            model="smollm2",
            messages=[*chat, {"role": "user", "content": "Is the lamp lit?"}],
            max_tokens=16,
            stream=True,
        )  # type: ignore[call-overload]
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
        assert first is not None and stopped.stopped and service.gate.preempted == 1
        time.sleep(2)  # the pause after the turn
        while any(session.summaries.writing for session in service.sessions):
            assert time.monotonic() < deadline, "the summaries took too long"
            time.sleep(0.2)
    finally:
        watch.done.set()
        running.stop()
        stop(process)
    generated = re.findall(r"\|\s+eval time = +([\d.]+) ms / +(\d+) tokens", log.read_text())
    fastest = min(float(ms) / int(n) for ms, n in generated if int(n) >= 8)  # ms a token written, the fastest
    left = (call["tokens"] - written) * fastest / 1000  # the stopped request's tokens still to write, at the least
    print(
        f"turn's first token {first - sent:.2f} s after it was sent, as the summary request"
        f" ({first - began:.2f} s in) had {written} of its {call['tokens']} tokens written: {left:.2f} s of writing"
        f" left at {fastest:.1f} ms a token; {len(watch.seen)} summary requests"
    )
    assert first - sent < left  # the turn's first token, before that summary would have ended
    again = next(seen for seen in watch.seen if seen[1] > first)  # the same request, asked again whole
    assert again[2] is not None and call["ended"] >= again[2] - 0.1  # its call returned with that reply
    chats = list((Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries"))
    assert chats and chats[0].read_text(encoding="utf-8").strip()  # the summaries, written after it
