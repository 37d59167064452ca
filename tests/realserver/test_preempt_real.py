"""The player never waits for ctx (issue 44), against the real llama-server with one slot
(`-np 1`, as most local servers run): a turn that arrives while a summary request is on the
server stops it — its connection shut, the server stops that task — and is answered; the same
summary request is asked again, whole, in the pause after the turn, and the chat's summaries
are all written after it.

What it does not assert: that the turn's first token came before the stopped summary would have
ended. llama-server notices a closed connection only between its batches, so a turn that comes
while a summary's prompt is being read waits for that batch (about 5 s for 1,500 tokens at
`-t 1` here), and SmolLM2's summaries are short: the summary may end as soon. The timings are
printed; benchmarks/ttft_bench.py measures what the player waits, turn by turn."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import openai
from conftest import free_port, launch, stop

from otaku_ctx.config import ServeSettings, Settings, SummarizeSettings
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


def test_a_turn_during_a_summary_request_stops_it_and_it_is_asked_again(tmp_path: Path) -> None:
    process = launch(tmp_path / "llama-server.log", port := free_port(), context=4096, slots=1)
    summarize = SummarizeSettings(settle=8, min_chars=1500, min_messages=16, temperature=0.0, timeout=300)
    service = Service(Settings(summarize=summarize, serve=ServeSettings(backend=f"http://127.0.0.1:{port}/v1", port=0)))
    running = Running(service)
    watch = Watch(service)
    try:
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)
        chat = opening(80)
        for _ in range(2):  # a Regenerate: the second request makes it a chat, and its summaries start
            client.chat.completions.create(model="smollm2", messages=chat, max_tokens=8)  # type: ignore[arg-type]
        deadline = time.monotonic() + DEADLINE
        while not watch.seen:
            assert time.monotonic() < deadline, "no summary request in the pause"
            time.sleep(0.01)
        time.sleep(0.3)  # the summary request well under way
        assert watch.seen[0][2] is None, "the summary request ended before the turn could come"
        stopped, began = watch.seen[0][0], watch.seen[0][1]
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
        summarizer = service.summarizer
        assert summarizer is not None
        time.sleep(2)  # the pause after the turn
        while any(summarizer.writing(session) for session in service.sessions):
            assert time.monotonic() < deadline, "the summaries took too long"
            time.sleep(0.2)
    finally:
        watch.done.set()
        running.stop()
        stop(process)
    again = watch.seen[1]  # the same request, asked again whole after the turn
    assert again[2] is not None and len(watch.seen) >= 2
    print(
        f"turn's first token {first - sent:.2f} s after it was sent, {first - began:.2f} s after the summary"
        f" request began; that request asked again: {again[2] - again[1]:.2f} s; {len(watch.seen)} summary requests"
    )
    assert again[1] > first  # asked again after the turn, in its pause
    chats = list((Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries"))
    assert chats and chats[0].read_text(encoding="utf-8").strip()  # the summaries, written after it
