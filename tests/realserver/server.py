"""llama.cpp's `llama-server` for the real-server tests and the summarize benchmark: find the
build setup.sh cached, start it on 127.0.0.1, wait for `/health`, read its log (the count of
what it was asked), stop it; and the short SillyTavern chat both give it. No pytest here: the
tests' conftest turns a `ServerProblem` into a failure, the benchmark into its exit message."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from pathlib import Path

SETUP = Path(__file__).with_name("setup.sh")
CONTEXT = 4096
SLOTS = 2
#: the model as `ctx summarize --model` names it: llama-server lists the `-m` it was started
#: with, and a model file is named by its file name without the extension
MODEL = "SmolLM2-135M-Instruct.Q4_1"


class ServerProblem(Exception):
    """The server cannot be found, started or waited for."""


def built(gguf: str = "SMOLLM2_GGUF") -> tuple[str, str]:
    """(llama-server, the GGUF `gguf` names: SmolLM2's, or `EMBED_GGUF`, the embedding model), as
    setup.sh --check finds them."""
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    if found.returncode:
        raise ServerProblem(f"{found.stderr.strip()} (tests/realserver/setup.sh builds it)")
    paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
    return paths["LLAMA_SERVER"], paths[gguf]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


#: the embedding model as llama-server lists it (`EMBED_GGUF`'s file name without the extension)
EMBED_MODEL = "all-MiniLM-L6-v2.f16"


def launch(
    log: Path,
    port: int,
    *,
    context: int = CONTEXT,
    slots: int = SLOTS,
    extra: tuple[str, ...] = (),
    gguf: str = "SMOLLM2_GGUF",
) -> subprocess.Popen[bytes]:
    """llama-server on 127.0.0.1:`port`, its output appended to `log`, once `/health` says ready;
    `gguf="EMBED_GGUF"` with `extra=("--embeddings",)` serves the embedding model."""
    server, model = built(gguf)
    command = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", "1", "-c", str(context), "-np", str(slots), "--no-webui", *extra]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not healthy(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise ServerProblem("llama-server did not start:\n" + "\n".join(tail))
        time.sleep(0.1)
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def served(log: Path) -> int:
    """The completions the server itself ran: one `launch_slot_` line a task in its log."""
    return log.read_text(errors="replace").count("launch_slot_")


def overlapped(log: Path) -> int:
    """The most completions the server ran at once, from its log's launch and release lines."""
    running = most = 0
    for line in log.read_text(errors="replace").splitlines():
        if "launch_slot_" in line:
            running += 1
            most = max(most, running)
        elif "stop processing" in line:
            running -= 1
    return most


def quiet(log: Path, *, still: float = 1.0, timeout: float = 120.0) -> None:
    """Wait until the server has ended every completion it started (since it last started: a
    killed server's log ends mid-task) and its log has not grown for `still` seconds, so what a
    client stopped mid-request left in flight (bytes already sent, a task the server runs on until
    it sees the client gone) is counted before the next run is, not in it."""
    deadline = time.monotonic() + timeout
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if len(text) != seen:
            seen, since = len(text), time.monotonic()
        else:
            run = text[max(0, text.rfind(" listening on ")) :]
            if run.count("launch_slot_") == run.count("stop processing") and time.monotonic() - since >= still:
                return
        time.sleep(0.1)
    raise ServerProblem(f"llama-server did not go quiet within {timeout:g} s")


def chat(path: Path, n: int) -> Path:
    """A SillyTavern chat of `n` short messages (Mara and Keeper by turns), no summaries."""
    header = {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-01-01", "chat_metadata": {}}
    lines = [json.dumps(header)]
    for i in range(1, n + 1):
        who = "Mara" if i % 2 else "Keeper"
        text = f"{who} speaks in turn {i}: the lamp is lit, the storm grows and the ferry is late again tonight."
        lines.append(json.dumps({"name": who, "is_user": bool(i % 2), "mes": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
