"""The relaying stage: a request sent on to the backend and its reply passed back, whole or
streamed chunk by chunk; `done(usage, cancelled)` is told what the backend reported of the reply
(the recording stage), before the client has the end of it and may hang up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from ..backend import BackendError
from ..jsonload import JSONProblem, loads
from .errors import backend_failure
from .logs import unquoted
from .stats import StreamUsage, Usage
from .upstream import Events, Upstream

log = logging.getLogger("otaku_ctx.serve")

#: a stream's headers: `X-Accel-Buffering: no` keeps a proxy in front (nginx) from holding it back,
#: as llama.cpp's server says
STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: what a JSON reply says it is, as llama.cpp's server and OpenAI's say it
JSON_TYPE = "application/json; charset=utf-8"

Done = Callable[[Usage, bool], None]


def nothing(usage: Usage, cancelled: bool) -> None:
    """The `done` of a request that is no chat's turn."""


def content_type(answer: aiohttp.ClientResponse) -> str:
    """The backend's Content-Type as it sent it (`; charset=utf-8` kept), where it is a plain
    header of a sane length; else JSON's."""
    given = answer.headers.get("Content-Type", "")
    return given if given and len(given) <= 200 and given.isascii() and given.isprintable() else JSON_TYPE


def passed(answer: aiohttp.ClientResponse, data: bytes) -> web.Response:
    return web.Response(body=data, status=answer.status, headers={"Content-Type": content_type(answer)})


async def whole(upstream: Upstream, path: str, body: Mapping[str, Any], done: Done) -> web.Response:
    """The backend's reply, read whole and passed on as it came. A frontend that goes away before
    it ends the request to the backend, and the turn is recorded as cancelled."""
    try:
        async with upstream.send("POST", path, body) as answer:
            data = await upstream.body(answer)
    except asyncio.CancelledError:  # the client went away (the handler is cancelled)
        done(Usage(), True)
        raise
    if answer.status == 200:
        usage = Usage()
        try:
            usage.read(loads(data, surrogates=True))
        except JSONProblem:  # passed on as it came; only its usage is not known
            pass
        done(usage, False)
    return passed(answer, data)


async def stream(
    request: web.Request, upstream: Upstream, path: str, body: Mapping[str, Any], done: Done
) -> web.StreamResponse:
    """The backend's reply, each whole event passed on as it arrives. A frontend that goes away
    ends the request to the backend (the handler is cancelled, the connection closed); a backend
    that fails once the stream is under way is told in the stream, as its last event."""
    async with upstream.send("POST", path, body) as answer:
        if answer.status != 200 or answer.content_type != "text/event-stream":
            return passed(answer, await upstream.body(answer))
        response = web.StreamResponse(headers=STREAM_HEADERS)
        await response.prepare(request)
        usage, events = StreamUsage(), Events(str(answer.url))
        told = False
        try:
            async for chunk in upstream.chunks(answer):
                ready = events.feed(chunk)  # only whole events go on: never half a line
                if not ready:
                    continue
                usage.feed(ready)
                if usage.finished and not told:  # before the client has it, and may hang up
                    done(usage, False)
                    told = True
                await response.write(ready)
            events.end()
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away: SillyTavern's Stop
            if not told:
                done(usage, True)
            raise
        except BackendError as failure:  # too late for a status: the stream says it, and ends
            failure.problem = unquoted(failure.problem, [str(m.get("content")) for m in body.get("messages", ())])
            log.warning("the backend failed mid-stream: %s", failure)
            await response.write(backend_failure(failure).event())
            if not told:
                done(usage, False)
        else:
            if not told:
                done(usage, False)
        await response.write_eof()
        return response
