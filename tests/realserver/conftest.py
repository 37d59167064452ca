"""The real model server for tests/realserver: llama.cpp's `llama-server` serving
SmolLM2-135M-Instruct (both built and cached by setup.sh), started once a session on 127.0.0.1
at a free port, ready when `/health` says so, stopped at the end; `Served` starts another one a
test may kill and start again (on the same port, its log appended).

These tests are not part of the fast suite (`norecursedirs` in pyproject.toml keeps `pytest`
out of this folder); `pytest -n 0 tests/realserver` runs them, after `sh tests/realserver/setup.sh`
(.ci/run does both). One thread (`-t 1`: on a busy machine two threads collapse), a 4,096-token
context shared by two slots (`-np 2`, so two requests run at once, each with 2,048 tokens).

The server's own log is the count of what it was asked: one `launch_slot_` line a completion it
ran, one `release` line when that completion ended (finished or cancelled)."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otaku_ctx.backend import Backend, Retry

SETUP = Path(__file__).with_name("setup.sh")
CONTEXT = 4096
SLOTS = 2


@dataclass(frozen=True)
class RealServer:
    url: str  # the OpenAI-compatible base, …/v1
    log: Path
    context: int = CONTEXT
    slots: int = SLOTS


def built() -> tuple[str, str]:
    """(llama-server, the GGUF), as setup.sh --check finds them."""
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    if found.returncode:
        pytest.fail(f"{found.stderr.strip()} (tests/realserver/setup.sh builds it)", pytrace=False)
    paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
    return paths["LLAMA_SERVER"], paths["SMOLLM2_GGUF"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def launch(log: Path, port: int, *, context: int = CONTEXT, slots: int = SLOTS) -> subprocess.Popen[bytes]:
    """llama-server on 127.0.0.1:`port`, its output appended to `log`, once `/health` says ready."""
    server, model = built()
    command = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", "1", "-c", str(context), "-np", str(slots), "--no-webui"]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not _healthy(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            tail = log.read_text(errors="replace").splitlines()[-15:]
            pytest.fail("llama-server did not start:\n" + "\n".join(tail), pytrace=False)
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
    pytest.fail(f"llama-server did not go quiet within {timeout:g} s", pytrace=False)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    port = free_port()
    process = launch(log, port)
    try:
        yield RealServer(f"http://127.0.0.1:{port}/v1", log)
    finally:
        stop(process)


class Served:
    """A server of one test's own, to kill mid-run (SIGKILL: no goodbye to its clients) and
    start again on the same port."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen[bytes] | None = launch(log, self.port)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def start(self) -> None:
        if self.process is None:
            self.process = launch(self.log, self.port)

    def close(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server of the test's own (the session's stands idle meanwhile: each has one thread)."""
    served_here = Served(tmp_path_factory.mktemp("own-server") / "server.log")
    try:
        yield served_here
    finally:
        served_here.close()


@pytest.fixture
def backend(real_server: RealServer) -> Backend:
    return Backend(real_server.url, "smollm2-135m-instruct", timeout=120, retry=Retry(attempts=2, backoff=0.5))
