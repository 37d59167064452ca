"""Benchmark (issue 45): text that has no full stop, or ends its sentences with 。, or is one huge
message, or 100,000 messages, costs serve a turn linear in its size, and no other chat waits for it.

Each case is a chat sent to `ctx serve` (its defaults: summaries on, the stable policy, recall)
in front of the tests' stand-in model server (tests/test_serve.py `StandIn`, a 4,096-token
window, every summary reply turned down, so every scene is ctx's own extract: the text steps'
worst case), at 1×, 2× and 4× its size, against the same chat with full stops:

- **nostop**: a 205-message chat, one message of 4,000 words (×1) with no full stop;
- **cjk**: 200 messages (×1) of 1,500 Japanese characters, each sentence ending in 。;
- **many**: 25,000 messages (×1) of 300 characters with no full stop;
- **huge**: one message of 12.5 MB (×1; 50 MB at ×4) with no full stop.

A case's "with stops" chat is the same text with a full stop every twelve words (for cjk, English
text of as many characters). Each measure is a fresh serve (a cold turn: nothing priced or
extracted before) and a fresh chat folder. While the case's first turn is assembled and its
summaries written, another chat of 8 messages sends a turn every `THINK` seconds: its slowest
turn is what it waited.

It prints, per case and size, the median seconds of the chat's first two requests (each from
sent to replied), without full stops and with, their ratio and the growth from the size before
(linear is 2.0); for nostop and cjk, the seconds until its summaries were written (the other
chat's pauses included), with their growth; and the other chat's slowest turn. Rounds are interleaved (every
case and size once, then again), as this machine's speed drifts. A figure, not a test: no test
asserts a time.

    python benchmarks/hostile_text.py              # every case at 1×, 2×, 4×, 3 rounds (about 15 minutes)
    python benchmarks/hostile_text.py many --rounds 1
    python benchmarks/hostile_text.py --smoke      # every case at a tenth of 1× and 2×, one round

Figures (2026-12-06, this 2-core machine, 3 rounds; first two requests, 1×/2×/4×, and with
stops at 4×; the other chat's slowest turn at 4×): nostop 0.06/0.07/0.06 s (0.09), other 0.08 s;
cjk 0.30/0.40/0.86 s (1.13), other 0.05 s, summaries settled 9.0/19.6/39.3 s; many
7.0/11.8/26.0 s (43.7), other 0.26 s; huge 2.9/6.4/7.1 s (6.5), other 0.46 s. docs/serve.md,
"Hostile text", says what they mean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from test_serve import StandIn  # noqa: E402 - the tests' own stand-in model server

Messages = list[dict[str, Any]]
#: seconds the other chat's player pauses between turns: past serve's `PAUSE`, so summaries are written
THINK = 1.5
LINE = "the boat drifts on past the harbour wall and Tom waves to Mira from the pier"
JAPANESE = "雨が降っていたので彼は港に来なかったが灯台の光は夜通し海を照らしていた"


def words(count: int, stops: bool) -> str:
    """`count` words of the story's kind, a full stop after every twelfth when `stops`."""
    pool = LINE.split()
    said = [pool[i % len(pool)] + ("." if stops and i % 12 == 11 else "") for i in range(count)]
    return " ".join(said)


def dialogue(texts: list[str]) -> Messages:
    messages = [{"role": "system", "content": "You are Mira, a sailor on a stormy coast."}]
    for i, text in enumerate(texts):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "What now?"})
    return messages


def nostop(scale: float, stops: bool) -> Messages:
    short = [words(16, True) for _ in range(100)]
    return dialogue([*short, words(int(4000 * scale), stops), *short, *(words(6, True) for _ in range(4))])


def cjk(scale: float, stops: bool) -> Messages:
    if stops:  # English of as many characters, with full stops
        return dialogue([words(1500 // 5, True)[:1499] + "." for _ in range(int(200 * scale))])
    sentence = (JAPANESE * 3)[:99] + "。"
    return dialogue([(sentence * 15)[:1500] for _ in range(int(200 * scale))])


def many(scale: float, stops: bool) -> Messages:
    return dialogue([words(60, stops)[:300] for _ in range(int(25_000 * scale))])


def huge(scale: float, stops: bool) -> Messages:
    return dialogue([words(int(12_500_000 * scale) // 6, stops), "Go on."])


CASES: dict[str, Callable[[float, bool], Messages]] = {"nostop": nostop, "cjk": cjk, "many": many, "huge": huge}
#: the cases whose summaries are waited for: a few scenes each (many's 25,000 messages are some
#: 5,000 scenes, each asked of the stand-in in the other chat's pauses: hours)
SETTLED = ("nostop", "cjk")


def post(url: str, messages: Messages) -> float:
    """Seconds from the request sent to the reply read."""
    data = json.dumps({"model": "m", "messages": messages, "max_tokens": 50}).encode()
    request = urllib.request.Request(url + "/chat/completions", data, {"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=900) as answer:
        answer.read()
    return time.monotonic() - started


def writing(url: str, longer_than: int) -> bool:
    """Whether the summaries of a chat of more than `longer_than` messages are wanted or being
    written (`/ctx/stats`)."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/ctx/stats", timeout=60) as answer:
        chats = json.loads(answer.read())["chats"]
    return any(c["summaries_writing"] for c in chats if c["turns"] and c["turns"][-1]["messages"] > longer_than)


def measure(messages: Messages, backend: StandIn, settle: bool) -> tuple[float, float, float]:
    """Through a fresh serve: the chat's first two requests (the first is a one-shot, held until
    a second, one exchange on, continues it: `serve.sessions`; the first walks the chat, the
    second makes its scenes and their extracts), together; the seconds until its summaries are
    written too (in the background: every scene an extract); and the slowest turn another chat
    had through all of it (its own first turns made before)."""
    from otaku_ctx.config import load_settings
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running

    os.environ["OTAKU_HOME"] = tempfile.mkdtemp(prefix="hostile-text-")
    settings = load_settings(None, {})
    settings = replace(settings, serve=replace(settings.serve, backend=backend.url, port=0))
    running = Running(Service(settings))
    other = dialogue([words(10, True) for _ in range(8)])
    on = [{"role": "assistant", "content": "Aye."}, {"role": "user", "content": "And then?"}]
    try:
        post(running.url, other)
        post(running.url, [*other, *on])
        waits: list[float] = []
        done = threading.Event()

        def meanwhile() -> None:  # a player: a turn, then a pause (in which summaries are written)
            while not done.is_set():
                waits.append(post(running.url, other))
                done.wait(THINK)

        beside = threading.Thread(target=meanwhile)
        beside.start()
        try:
            started = time.monotonic()
            seconds = post(running.url, messages) + post(running.url, [*messages, *on])
            while settle and writing(running.url, len(other) + 2) and time.monotonic() - started < 900:
                time.sleep(0.05)
            settled = time.monotonic() - started if settle else math.nan
        finally:
            done.set()
            beside.join()
    finally:
        running.stop()
    return seconds, settled, max(waits, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", choices=[[], *CASES], help="the cases to run (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="every case at a tenth of 1× and 2×, one round")
    args = parser.parse_args()
    cases = args.cases or list(CASES)
    scales = (0.1, 0.2) if args.smoke else (1.0, 2.0, 4.0)
    rounds = 1 if args.smoke else args.rounds
    backend = StandIn().start()
    backend.window, backend.useless = 4096, True
    import logging

    logging.getLogger("otaku_ctx").setLevel(logging.ERROR)
    taken: dict[tuple[str, float, bool], list[tuple[float, float, float]]] = {}
    try:
        for _ in range(rounds):
            for case in cases:
                for scale in scales:
                    for stops in (False, True):
                        measured = measure(CASES[case](scale, stops), backend, case in SETTLED)
                        taken.setdefault((case, scale, stops), []).append(measured)
    finally:
        backend.stop()

    def median(case: str, scale: float, stops: bool, which: int) -> float:
        return statistics.median(t[which] for t in taken[(case, scale, stops)])

    print(f"{rounds} round(s), medians; stand-in window 4,096; serve's defaults, every scene an extract")
    heads = ("first s", 7), ("stops", 6), ("ratio", 6), ("growth", 7), ("settled s", 10), ("stops", 6), ("growth", 7)
    print(f"{'case':8} {'size':>5} " + " ".join(f"{h:>{w}}" for h, w in heads) + f" {'other chat s':>13}")
    for case in cases:
        before = None
        for scale in scales:
            turn, plain = median(case, scale, False, 0), median(case, scale, True, 0)
            settled, plain_settled = median(case, scale, False, 1), median(case, scale, True, 1)
            growth = f"{turn / before[0]:.2f}" if before else "—"
            settled_growth = f"{settled / before[1]:.2f}" if before else "—"
            waited = max(median(case, scale, s, 2) for s in (False, True))
            print(
                f"{case:8} {scale:>4g}× {turn:>7.2f} {plain:>6.2f} {turn / plain:>6.2f} {growth:>7}"
                f" {settled:>10.2f} {plain_settled:>6.2f} {settled_growth:>7} {waited:>13.2f}"
            )
            before = (turn, settled)


if __name__ == "__main__":
    main()
