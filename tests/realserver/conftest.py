"""The real model server for tests/realserver: llama.cpp's `llama-server` serving
SmolLM2-135M-Instruct (both built and cached by setup.sh), started once a session on 127.0.0.1
at a free port, ready when `/health` says so, stopped at the end.

These tests are not part of the fast suite (`norecursedirs` in pyproject.toml keeps `pytest`
out of this folder); `pytest -n 0 tests/realserver` runs them, after `sh tests/realserver/setup.sh`
(.ci/run does both). One thread (`-t 1`: on a busy machine two threads collapse), a 4,096-token
context shared by two slots (`-np 2`, so two requests run at once, each with 2,048 tokens)."""

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


def _built() -> tuple[str, str]:
    """(llama-server, the GGUF), as setup.sh --check finds them."""
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    if found.returncode:
        pytest.fail(f"{found.stderr.strip()} (tests/realserver/setup.sh builds it)", pytrace=False)
    paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
    return paths["LLAMA_SERVER"], paths["SMOLLM2_GGUF"]


def _free_port() -> int:
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


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    server, model = _built()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    port = _free_port()
    command = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port)]
    command += ["-t", "1", "-c", str(CONTEXT), "-np", str(SLOTS), "--no-webui"]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                pytest.fail("llama-server did not start:\n" + "\n".join(tail), pytrace=False)
            time.sleep(0.1)
        yield RealServer(f"http://127.0.0.1:{port}/v1", log)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture
def backend(real_server: RealServer) -> Backend:
    return Backend(real_server.url, "smollm2-135m-instruct", timeout=120, retry=Retry(attempts=2, backoff=0.5))
