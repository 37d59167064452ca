"""The requests serve forwards to the user's model server, streamed as they arrive.

`backend/` is ctx's client for what it asks a server itself (the window, the tokenizer, the
summaries); what a frontend asks is forwarded here, on serve's own asyncio loop, with aiohttp's
client: a reply streams through chunk by chunk, and a frontend that goes away cancels the
request to the server (the connection is closed, which llama.cpp and vLLM take as a cancel).
Failures are the backend's own typed errors (`backend.failures`), one line each."""

from __future__ import annotations

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
        """The response's body as it arrives; a server that stops mid-reply raises `Unreachable`."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise TimedOut(str(response.url), f"no more of the reply within {self.seconds:g} s") from None
        except aiohttp.ClientError as error:
            raise Unreachable(str(response.url), f"the reply was cut off ({type(error).__name__})") from None
