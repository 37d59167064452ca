"""A request's body, read within its bounds and decoded: the first stage of every POST."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..jsonload import JSONProblem, TooMany, loads
from .chats import ChatError
from .errors import SlowBody, TooLarge

#: seconds a request's body may take to arrive, once its headers have
BODY_SECONDS = 30.0
#: a body of this many bytes or more is decoded on a thread of its own, not on the event loop
LONG_BODY = 1 << 20


async def read_json(request: web.Request, bound: int) -> dict[str, Any]:
    """The request's body as a JSON object: at most `bound` bytes (`[serve] max_body`), in within
    `BODY_SECONDS`, and decoded within the JSON reader's own bounds (nesting, items, numbers)."""
    if request.content_length is not None and request.content_length > bound:
        raise TooLarge(f"the request body is over {bound:,} bytes ([serve] max_body)")
    try:
        data = await asyncio.wait_for(request.read(), BODY_SECONDS)
    except web.HTTPRequestEntityTooLarge:
        raise TooLarge(f"the request body is over {bound:,} bytes ([serve] max_body)") from None
    except TimeoutError:
        raise SlowBody(f"the request body did not arrive within {BODY_SECONDS:g} s") from None
    try:  # orjson when there (a 10,000-message chat: 4 ms, not 15)
        # a long chat's body (20 MB: a tenth of a second and more) is decoded off the event loop
        body = loads(data) if len(data) < LONG_BODY else await asyncio.to_thread(loads, data)
    except TooMany as why:
        raise ChatError(f"the request body is {why.message}") from None
    except JSONProblem as why:
        raise ChatError(f"the request body is not JSON ({why.message})") from None
    if not isinstance(body, dict):
        raise ChatError("the request body must be a JSON object")
    return body
