"""The requests serve forwards to the user's model server, streamed as they arrive.

`backend/` is ctx's client for what it asks a server itself (the window, the tokenizer, the
summaries); what a frontend asks is forwarded here, on serve's own asyncio loop, with aiohttp's
client: a reply streams through chunk by chunk, and a frontend that goes away cancels the
request to the server (the connection is closed, which llama.cpp and vLLM take as a cancel).
Failures are the backend's own typed errors (`backend.failures`), one line each."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from ..backend import BackendError, BadReply, KeyMissing, ServerError, TimedOut, Unreachable
from ..backend.failures import one_line, what_the_server_said
from ..backend.transport import LIMIT, too_large


class Upstream:
    """The model server at `url` (its OpenAI-compatible base, …/v1)."""

    def __init__(self, url: str, *, api_key_env: str = "", timeout: float, connect_timeout: float) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env, "").strip()
            if not key:
                raise KeyMissing(
                    self.url, f"${api_key_env} is not set", f"export the backend's API key in ${api_key_env}"
                )
            self.headers["Authorization"] = f"Bearer {key}"
        self.timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=timeout)
        self.seconds = timeout
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers, auto_decompress=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @staticmethod
    async def body(response: aiohttp.ClientResponse) -> bytes:
        """A response's whole body, bounded as ctx's own client bounds a reply
        (`transport.LIMIT`, 64 MiB): past it, a `BadReply` naming the URL."""
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.content.read(1 << 16):
            size += len(chunk)
            if size > LIMIT:
                raise too_large(str(response.url))
            chunks.append(chunk)
        return b"".join(chunks)

    @asynccontextmanager
    async def send(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The server's response to `method path` (its body still to read); an error reply of
        5xx raises `ServerError`, one that is not reached `Unreachable`, a silent one `TimedOut`.
        A 4xx is the client's to see, passed through as it came."""
        assert self._session is not None, "Upstream.open() first"
        url = f"{self.url}{path}"
        data = json.dumps(body, ensure_ascii=False).encode("utf-8") if body is not None else None
        try:
            async with self._session.request(method, url, data=data, allow_redirects=False) as response:
                if response.status >= 500:
                    try:
                        said = what_the_server_said(await self.body(response))
                    except BadReply:  # an error body past the bound: its status says enough
                        said = what_the_server_said(b"")
                    problem = f"{response.status} {response.reason or ''}".strip()
                    raise ServerError(
                        url, problem + (f": {said.message}" if said.message else ""), status=response.status
                    )
                try:
                    yield response
                except BaseException:
                    response.close()  # not back to the pool half read: the server sees the request end
                    raise
        except BackendError:
            raise
        except aiohttp.ClientConnectorError as error:
            raise Unreachable(url, f"cannot connect ({one_line(str(error.os_error) or str(error))})") from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise TimedOut(url, f"no reply within {self.seconds:g} s") from None
        except aiohttp.ServerDisconnectedError:
            raise Unreachable(url, "the server closed the connection without a reply") from None
        except aiohttp.ClientError as error:
            raise Unreachable(url, f"the connection failed ({one_line(str(error)) or type(error).__name__})") from None

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The response's body as it arrives (decompressed), bounded as a whole body is
        (`transport.LIMIT`: a gzip bomb is a `BadReply` at 64 MiB, not a stream without end); a
        server that stops mid-reply raises `Unreachable`, one silent for `timeout` `TimedOut`.

        Each read is given up after `POLL` seconds and asked again: aiohttp closes a connection
        whose chunked encoding breaks mid-body but leaves the read waiting for good (3.14); asked
        again, the read says the connection is closed."""
        size, silent = 0, 0.0
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(response.content.readany(), POLL)
                except TimeoutError:
                    silent += POLL
                    if silent >= self.seconds:
                        raise TimedOut(str(response.url), f"no more of the reply within {self.seconds:g} s") from None
                    continue
                if not chunk:
                    return
                silent = 0.0
                size += len(chunk)
                if size > LIMIT:
                    raise too_large(str(response.url))
                yield chunk
        except BackendError:
            raise
        except aiohttp.ServerTimeoutError:
            raise TimedOut(str(response.url), f"no more of the reply within {self.seconds:g} s") from None
        except Exception as error:  # a connection reset, aiohttp's parser's own (a broken chunk), a closed one
            raise Unreachable(str(response.url), f"the reply was cut off ({type(error).__name__})") from None


#: how often a read of a streamed reply looks again whether its connection is still there
POLL = 1.0


#: the longest server-sent event serve holds while it waits for the event's end (a reply's chunk
#: is some hundred bytes; llama.cpp's last, with its timings, a few thousand)
EVENT_LIMIT = 1 << 20


class Events:
    """A stream of server-sent events cut at the events' ends, so that only whole events are
    passed on: a backend that stops mid-event leaves no half line for serve's own `error` event
    to be glued onto. Linear in the bytes fed; an event past `most` bytes with no end is a
    `BadReply` (`url`), not a buffer without end."""

    def __init__(self, url: str, most: int = EVENT_LIMIT) -> None:
        self.url, self.most = url, most
        self._held = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        """The whole events that `chunk` completes (b"" while none), holding the rest."""
        start = max(0, len(self._held) - 3)  # an end may straddle the chunks
        self._held += chunk
        lf, crlf = self._held.rfind(b"\n\n", start), self._held.rfind(b"\r\n\r\n", start)
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if not end:
            if len(self._held) > self.most:
                raise BadReply(self.url, f"a server-sent event of over {self.most:,} bytes with no end")
            return b""
        whole = bytes(self._held[:end])
        del self._held[:end]
        return whole

    def end(self) -> None:
        """The stream's end: an event still held (the backend stopped in the middle of one) is a
        `BadReply`; blank lines are nothing."""
        held, self._held = bytes(self._held), bytearray()
        if held.strip():
            raise BadReply(self.url, "the reply stopped in the middle of a server-sent event")
