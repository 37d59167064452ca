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
import json
import subprocess
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from server import (  # noqa: F401 - the tests import these from here
    CONTEXT,
    EMBED_MODEL,
    MODEL,
    SETUP,
    SLOTS,
    ServerProblem,
    built,
    free_port,
    launch,
    overlapped,
    quiet,
    served,
    stop,
)

from otaku_ctx.backend import Backend, Retry
from otaku_ctx.config import RecallSettings, ServeSettings, Settings, SummarizeSettings
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running


@dataclass(frozen=True)
class RealServer:
    url: str  # the OpenAI-compatible base, …/v1
    log: Path
    context: int = CONTEXT
    slots: int = SLOTS


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


def forwarded(service: Service) -> list[dict[str, Any]]:
    """The chat bodies `service` forwards to its backend, recorded as they go (the list fills)."""
    sent: list[dict[str, Any]] = []
    forward = service.upstream.send

    @asynccontextmanager
    async def recorded(method: str, path: str, body: Any = None) -> Any:
        if path == "/chat/completions" and body is not None:
            sent.append(dict(body))
        async with forward(method, path, body) as answer:
            yield answer

    service.upstream.send = recorded  # type: ignore[method-assign]
    return sent


@contextmanager
def frontend_session(
    folder: Path, window: int, summarize: SummarizeSettings | None = None, recall: RecallSettings | None = None
) -> Iterator[tuple[Running, list[dict[str, Any]]]]:
    """A frontend's session as a user runs it: llama-server with two slots of `window` each, serve
    in front of it with the defaults (summaries in the test's otaku home); the bodies serve
    forwarded, recorded. `/ctx/stats` and those bodies are written to `folder` at the end (to
    study a run offline: `--basetemp` keeps them). `summarize`: its `[summarize]`, else the
    defaults; `recall`: its `[recall]` (recall by meaning), else none."""
    process = launch(folder / "llama-server.log", free_port(), context=2 * window, slots=2)
    try:
        port = process.args[process.args.index("--port") + 1]  # type: ignore[union-attr]
        serve = ServeSettings(backend=f"http://127.0.0.1:{port}/v1", port=0)
        settings = Settings(serve=serve, summarize=summarize or SummarizeSettings(), recall=recall or RecallSettings())
        service = Service(settings)
        sent = forwarded(service)
        running = Running(service)
        try:
            yield running, sent
        finally:
            try:
                url = urlsplit(running.url)
                connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
                connection.request("GET", "/ctx/stats")
                (folder / "stats.json").write_bytes(connection.getresponse().read())
                connection.close()
            finally:
                running.stop()
                (folder / "sent.json").write_text(json.dumps(sent))
    finally:
        stop(process)


@pytest.fixture(scope="session")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """llama-server serving the embedding model (setup.sh's all-MiniLM-L6-v2) through
    `/v1/embeddings`, once a session."""
    log = tmp_path_factory.mktemp("embedding-server") / "server.log"
    port = free_port()
    process = launch(log, port, context=2048, slots=4, extra=("--embeddings",), gguf="EMBED_GGUF")
    try:
        yield RealServer(f"http://127.0.0.1:{port}/v1", log)
    finally:
        stop(process)


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server of the test's own (the session's stands idle meanwhile: each has one thread)."""
    served_here = Served(tmp_path_factory.mktemp("own-server") / "server.log")
    try:
        yield served_here
    finally:
        served_here.close()


@pytest.fixture(scope="session")
def llama_vocab() -> Path:
    """The folder of the pinned llama.cpp's tokenizer test vocabularies and their vectors
    (`ggml-vocab-*.gguf`, `.inp`, `.out`), as setup.sh --check names it (LLAMA_VOCAB)."""
    found = subprocess.run(["sh", str(SETUP), "--check"], capture_output=True, text=True, timeout=300)
    paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
    if found.returncode or "LLAMA_VOCAB" not in paths:
        pytest.fail(f"{found.stderr.strip()} (tests/realserver/setup.sh keeps llama.cpp's test vocabularies)")
    return Path(paths["LLAMA_VOCAB"])


@pytest.fixture
def backend(real_server: RealServer) -> Backend:
    return Backend(real_server.url, "smollm2-135m-instruct", timeout=120, retry=Retry(attempts=2, backoff=0.5))
