"""Listening: the server's socket, its bound on connections, and its stop — on SIGTERM or Ctrl-C
(`serve_forever`), or from another thread (`Running`, the tests' and the benchmarks')."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from .errors import ServeError
from .logs import log_to_stderr

if TYPE_CHECKING:
    from .http import Service

#: seconds a connection may sit idle, before its first request or between two (llama.cpp's
#: server: 5); a client that trickles its headers is idle until they end
KEEPALIVE = 5.0
#: open connections at once; past it, the oldest idle ones are closed (waiting for a request, or
#: trickling its headers), so a flood of idle or slow connections never shuts out a client that
#: asks and goes, and the process stays well below the 1,024 files it may have open. A connection
#: in a request is never cut: its body has `body.BODY_SECONDS`, its reply the backend's timeout.
MOST_CONNECTIONS = 512


async def run(service: Service, stop: asyncio.Event, ready: Callable[[str], None]) -> None:
    """Serve until `stop` is set, then stop taking connections, let the replies in flight finish
    (at most `[serve] shutdown` seconds) and return."""
    s = service.settings.serve
    # aiohttp waits its shutdown timeout for the replies in flight, then as long again for them to
    # end once cancelled: half each, so that SIGTERM takes `shutdown` seconds at most
    runner = web.AppRunner(
        service.app(), access_log=None, handler_cancellation=True, shutdown_timeout=s.shutdown / 2,
        keepalive_timeout=KEEPALIVE,
    )  # fmt: skip
    await runner.setup()
    listening: asyncio.Server | None = None
    try:
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        listening = await loop.create_server(
            Capped(runner.server, MOST_CONNECTIONS), s.host, s.port, reuse_address=True
        )
        host, port = listening.sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        ready(f"http://{shown}:{port}/v1")
        await stop.wait()
    finally:
        if listening is not None:
            listening.close()
        await runner.cleanup()


class Capped:
    """The listening socket's protocol factory: aiohttp's server, and a bound on the connections
    it keeps (`MOST_CONNECTIONS`): when a new one would pass it, the oldest tenth of those idle
    are closed."""

    def __init__(self, server: web.Server, most: int) -> None:
        self.server, self.most = server, most

    def __call__(self) -> asyncio.BaseProtocol:
        connections = self.server.connections
        if len(connections) >= self.most:
            # aiohttp says no more than this of whether a connection is in a request; where it
            # says nothing, none is taken for idle
            idle = [c for c in connections if getattr(c, "_request_in_progress", True) is False]
            for handler in idle[: max(1, self.most // 10)]:
                handler.force_close()
        return self.server()


def serve_forever(service: Service, say: Callable[[str], None], *, debug: bool = False) -> None:
    """`ctx serve`: run until SIGTERM or Ctrl-C; the replies in flight then finish first. Its log
    on stderr (`logs.log_to_stderr`): one visible line a record, a traceback only with `debug`."""
    log_to_stderr(debug)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for each in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(each, stop.set)

        def ready(url: str) -> None:
            say(f"ctx serve: listening on {url}, forwarding to {service.lanes.backend.url}")

        await run(service, stop, ready)

    try:
        asyncio.run(main())
    except OSError as why:  # the port is taken, the address not ours
        raise ServeError(
            f"cannot listen on {service.settings.serve.host}:{service.settings.serve.port}: {why.strerror or why}"
        ) from None


class Running:
    """A `ctx serve` on a thread of its own (the tests' and the benchmark's): `url` once it
    listens; `stop()` ends it as SIGTERM does."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="ctx-serve", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._failed is not None:
            raise self._failed

    def _main(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await run(self.service, self._stop, ready)

        try:
            asyncio.run(main())
        except BaseException as failure:  # noqa: BLE001 - handed to the starting thread
            self._failed = failure
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
