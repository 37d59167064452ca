"""Benchmark: `ctx summarize` against the real llama-server (SmolLM2-135M-Instruct, as
tests/realserver runs it; `sh tests/realserver/setup.sh` builds it once).

    python benchmarks/summarize_bench.py                  # 150 messages, 3 rounds
    python benchmarks/summarize_bench.py --messages 90 --rounds 5
    python benchmarks/summarize_bench.py --instant 1000   # the sidecar's commits, no model
    python benchmarks/summarize_bench.py --smoke          # once, small: 30 messages, 1 round
    python benchmarks/summarize_bench.py --smoke --instant 50   # the commits, 1 round

It starts its own llama-server on 127.0.0.1 (`-t 1 -c 8192 -np 4`: four slots of 2,048
tokens, one thread, `--no-cache-prompt` so no run finds its prompts cached by an earlier one)
and summarizes one fixed SillyTavern chat (short messages, the small `[summarize]` numbers of
tests/realserver: scenes of 15+ messages, 40-word summaries, 30-word histories; temperature 0,
so every run asks the same requests).

- **Per request**, one in-process run a round (`--jobs 1`; no interpreter start, the
  tokenizer loaded): each request's wall time as the client saw it beside the server's own
  time for it (the reply's `timings`: prompt_ms + predicted_ms); the difference is HTTP and
  the server's queueing and JSON. ctx's own time per request is the run's wall time less
  every request's, over the requests: the plan, the prompts and their counting, reading the
  replies, each sidecar commit.
- **Wall time** of the whole `ctx summarize` process with `--jobs 1` and with `--jobs 4`, in
  interleaved rounds (the order flips each round), medians; beside it the server's summed
  `total time` from its log, so "ctx" is the process's wall time less the server's (start-up
  included) for `--jobs 1`.

Figures on this machine (2 cores, shared; 150 messages: 8 scenes, 15 requests; 3 rounds):

    per request      client 3,269 ms · server 3,256 ms · HTTP+queue 5.6 ms
    ctx's own time   1.9 ms a request, in-process (plan, prompts, replies, commits)
    --jobs 1  wall 35.0 s   server 34.7 s   ctx 0.28 s (18 ms a request, start-up in; 15 requests, 483 out)
    --jobs 4  wall 35.9 s   (1.03x; 15 requests, 479 out)

ctx's share is noise beside the model's: the server spends 99 % of the wall time, and ctx
under 2 ms a request once started. `--jobs 4` gains nothing here: on one CPU thread the work
is the prompts' processing (some 8,000 prompt tokens a run against 480 generated), which is
compute-bound, so four slots share the thread rather than multiply it. It pays where the
server has room to batch (a GPU, vLLM, a hosted API, llama.cpp with threads to spare).
Benchmarks report figures; no test asserts a time.

**The commits** (`--instant SCENES`): a chat of two-message scenes against the tests' own
stand-in server, which answers at once, so the time is ctx's own. Before (issue 28, #1) each
commit rewrote the whole sidecar (4,195 scenes took 255 s); now a commit appends its line
(`summarize/commits.py`) and the file is rewritten twice a run. 1,000 scenes (2,000 commits,
a 617 KB file), 3 interleaved rounds on this machine, medians:

    before  62.9 s   774.0 MB written (the whole file each commit)
    now     19.1 s   1.7 MB written (a line a commit)  3.3x

What is left of "now" is the requests themselves (HTTP to a threaded stand-in in the same
process, the checks, the counting): about 10 ms a request, flat with the story's length.

`--smoke` (benchmarks/smoke.sh) runs once at a small size, to show the benchmark still works:
one round of a 30-message chat (one scene of 20), its summary asked for once (`attempts = 1`,
not 5: a try is some 7 s of the server's one thread, and SmolLM2's replies for this scene were
all turned down, 2026-12-04: five requests a run, 40 s); with `--instant`, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "realserver"))
from server import MODEL, ServerProblem, chat, free_port, launch  # noqa: E402 - the tests' own server helpers

CONFIG = (
    "[summarize]\nsettle = 10\nmin_chars = 1500\nmin_messages = 15\nsummary_words = 40\nhistory_words = 30\n"
    "temperature = 0.0\nrepeat_penalty = 1.1\ntimeout = 300\nattempts = {attempts}\n"
)
TOTAL = re.compile(r"total time =\s*([\d.]+) ms")


# -- the server ---------------------------------------------------------------------------------


def start(log: Path, slots: int) -> tuple[subprocess.Popen[bytes], str]:
    log.write_bytes(b"")  # each start its own log: server_ms reads it from a byte offset
    port = free_port()
    try:
        process = launch(log, port, context=2048 * slots, slots=slots, extra=("--no-cache-prompt",))
    except ServerProblem as problem:
        sys.exit(str(problem))
    return process, f"http://127.0.0.1:{port}/v1"


def server_ms(log: Path, since: int) -> tuple[float, int]:
    """(the server's summed `total time` in ms, its completions) in its log after byte `since`,
    once every completion started there has ended and been logged."""
    deadline = time.monotonic() + 30
    while True:
        text = log.read_bytes()[since:].decode(errors="replace")
        launched, ended = text.count("launch_slot_"), text.count("stop processing")
        if launched == ended == len(TOTAL.findall(text)) or time.monotonic() > deadline:
            return sum(float(ms) for ms in TOTAL.findall(text)), launched
        time.sleep(0.05)


# -- the runs -----------------------------------------------------------------------------------


def whole(story: Path, url: str, jobs: int, home: Path, config: Path) -> tuple[float, dict[str, object]]:
    """One `ctx summarize` process: (its wall time, its --json report)."""
    env = {**os.environ, "OTAKU_HOME": str(home), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "otaku_ctx", "summarize", str(story), "--url", url, "--model", MODEL]
    command += ["--config", str(config), "--jobs", str(jobs), "--json"]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if done.returncode:
        sys.exit(done.stderr)
    return wall, json.loads(done.stdout)


def in_process(story: Path, url: str, config: Path) -> tuple[float, list[tuple[float, float]]]:
    """One `--jobs 1` run through ctx's own `main`, each request timed at the transport:
    (the run's wall time, [(the client's ms, the server's ms) a request])."""
    sys.path.insert(0, str(REPO))
    from otaku_ctx.backend import transport
    from otaku_ctx.cli.app import main
    from otaku_ctx.cli.terminal import Terminal
    from otaku_ctx.tokens import make_counter

    make_counter("cl100k_base")  # its file loaded once, as in any run: start-up is the next figure's
    timed: list[tuple[float, float]] = []
    send = transport.Transport.send

    def timed_send(
        self: transport.Transport, method: str, path: str, body: bytes | None = None, cancel: Any = None
    ) -> transport.Answer:
        began = time.perf_counter()
        answer = send(self, method, path, body, cancel)
        client = (time.perf_counter() - began) * 1000
        if path.endswith("/chat/completions"):
            said = json.loads(answer.body).get("timings") or {}
            timed.append((client, float(said.get("prompt_ms", 0)) + float(said.get("predicted_ms", 0))))
        return answer

    transport.Transport.send = timed_send  # type: ignore[method-assign]
    try:
        err = StringIO()
        io = Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err)
        argv = ["summarize", str(story), "--url", url, "--model", MODEL, "--config", str(config), "--jobs", "1"]
        began = time.perf_counter()
        code = main(argv, io)
        wall = time.perf_counter() - began
    finally:
        transport.Transport.send = send  # type: ignore[method-assign]
    if code:
        sys.exit(err.getvalue())
    return wall, timed


# -- the commits, against an instant server ------------------------------------------------------

INSTANT = "[summarize]\nsettle = 10\nmin_chars = 100\nmin_messages = 2\nwindow = 8192\n"


def instant(scenes: int, rounds: int) -> None:
    """`ctx summarize` of a chat of `scenes` two-message scenes against the tests' own stand-in
    (tests/test_summarize.py: it answers at once), in-process: the time is ctx's own, most of
    it the sidecar's commits. Each round runs it as it commits now (`commits.Commits`: a line
    appended a scene and a history) and as it committed before (the whole file rewritten
    atomically each time), interleaved; medians."""
    import threading

    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from test_summarize import StandIn, sillytavern_chat

    import otaku_ctx.summarize as summarize
    from otaku_ctx.cli.app import main as ctx
    from otaku_ctx.cli.terminal import Terminal
    from otaku_ctx.files import write_atomic
    from otaku_ctx.story.sidecar import Record, sidecar_text

    class Before(summarize.Commits):
        def commit(self, records: "list[Record]") -> None:  # noqa: UP037 - imported here
            text = sidecar_text(records)
            write_atomic(self.path, text)
            self.written += len(text.encode("utf-8"))
            self.rewrites += 1

    made: list[summarize.Commits] = []
    now = summarize.Commits

    def watched(kind: type[summarize.Commits]) -> type[summarize.Commits]:
        class Watched(kind):  # type: ignore[valid-type, misc]
            def __init__(self, *args: object) -> None:
                super().__init__(*args)
                made.append(self)

        return Watched

    server = StandIn()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    work = Path(tempfile.mkdtemp(prefix="summarize-commits-"))
    config = work / "config.toml"
    config.write_text(INSTANT, encoding="utf-8")
    times: dict[str, list[float]] = {"before": [], "now": []}
    written: dict[str, list[int]] = {"before": [], "now": []}
    try:
        for round_ in range(rounds):
            for name in ("before", "now") if round_ % 2 == 0 else ("now", "before"):
                folder = work / f"r{round_}-{name}"
                folder.mkdir()
                story = sillytavern_chat(folder / "chat.jsonl", 2 * scenes + 10, chars=60)
                summarize.Commits = watched(Before if name == "before" else now)  # type: ignore[misc]
                err = StringIO()
                argv = ["summarize", str(story), "--url", server.url, "--model", "m", "--config", str(config)]
                began = time.perf_counter()
                code = ctx(argv, Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
                times[name].append(time.perf_counter() - began)
                if code:
                    sys.exit(err.getvalue())
                written[name].append(made[-1].written)
                size = (folder / "chat.jsonl.ctx-summaries").stat().st_size
                print(
                    f"round {round_ + 1} {name:>6}: {times[name][-1]:.1f} s, {made[-1].written:,} bytes written"
                    f" for a file of {size:,}",
                    flush=True,
                )
    finally:
        summarize.Commits = now  # type: ignore[misc]
        server.shutdown()
        server.server_close()
    median = statistics.median
    before, after = median(times["before"]), median(times["now"])
    print(f"\n{scenes:,} scenes, {rounds} rounds (medians), an instant server, in-process")
    print(f"before  {before:.1f} s   {median(written['before']) / 1e6:,.1f} MB written (the whole file each commit)")
    print(
        f"now     {after:.1f} s   {median(written['now']) / 1e6:,.1f} MB written (a line a commit)  "
        f"{before / after:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, help="the chat's length (default 150)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    parser.add_argument("--instant", type=int, metavar="SCENES", help="time the commits of SCENES scenes instead")
    parser.add_argument("--smoke", action="store_true", help="once, small: 30 messages, 1 round")
    args = parser.parse_args()
    if args.messages is None:
        args.messages = 30 if args.smoke else 150
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 3
    if args.instant:
        instant(args.instant, args.rounds)
        return

    work = Path(tempfile.mkdtemp(prefix="summarize-bench-"))
    config = work / "config.toml"
    config.write_text(CONFIG.format(attempts=1 if args.smoke else 5), encoding="utf-8")
    log = work / "server.log"
    process, url = start(log, slots=4)
    walls: dict[int, list[float]] = {1: [], 4: []}
    served: dict[int, list[float]] = {1: [], 4: []}
    requests: dict[int, list[int]] = {1: [], 4: []}
    tokens_out: dict[int, list[int]] = {1: [], 4: []}
    clients: list[float] = []
    servers: list[float] = []
    own: list[float] = []
    try:
        for round_ in range(args.rounds):
            for jobs in (1, 4) if round_ % 2 == 0 else (4, 1):
                folder = work / f"r{round_}-j{jobs}"
                folder.mkdir()
                story = chat(folder / "chat.jsonl", args.messages)
                since = len(log.read_bytes())
                wall, report = whole(story, url, jobs, folder / "home", config)
                total, launched = server_ms(log, since)
                walls[jobs].append(wall)
                served[jobs].append(total / 1000)
                requests[jobs].append(int(report["requests"]))  # type: ignore[call-overload]
                tokens_out[jobs].append(int(report["tokens_out"]))  # type: ignore[call-overload]
                assert launched == report["requests"], (launched, report)
                print(f"round {round_ + 1} --jobs {jobs}: {wall:.1f} s ({report['requests']} requests)", flush=True)
            folder = work / f"r{round_}-in"
            folder.mkdir()
            wall, timed = in_process(chat(folder / "chat.jsonl", args.messages), url, config)
            clients += [c for c, _ in timed]
            servers += [s for _, s in timed]
            own.append((wall * 1000 - sum(c for c, _ in timed)) / len(timed))
    finally:
        process.terminate()
        process.wait(10)

    median = statistics.median
    n = median(requests[1])

    def asked(jobs: int) -> str:
        return f"{median(requests[jobs]):.0f} requests, {median(tokens_out[jobs]):,.0f} out"

    gaps = [c - s for c, s in zip(clients, servers, strict=True)]
    print(f"\n{args.messages} messages, {args.rounds} rounds (medians)")
    print(
        f"per request      client {median(clients):,.0f} ms · server {median(servers):,.0f} ms · "
        f"HTTP+queue {median(gaps):.1f} ms"
    )
    print(f"ctx's own time   {median(own):.1f} ms a request, in-process (plan, prompts, replies, commits)")
    one, four = median(walls[1]), median(walls[4])
    ctx_one = median(w - s for w, s in zip(walls[1], served[1], strict=True))
    print(
        f"--jobs 1  wall {one:.1f} s   server {median(served[1]):.1f} s   ctx {ctx_one:.2f} s "
        f"({ctx_one / n * 1000:.0f} ms a request, start-up in; {asked(1)})"
    )
    print(f"--jobs 4  wall {four:.1f} s   ({four / one:.2f}x; {asked(4)})")
    print(f"(work folder: {work})")


if __name__ == "__main__":
    main()
