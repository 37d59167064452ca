"""What a request that fails is told: one error class a kind, each carrying its HTTP status,
its OpenAI-style `type` and `code`; one error body, two encodings (a JSON reply before the
stream, a server-sent `data:` line inside it). The middleware answers with the class it is
given (`failure_of` maps what is not one of these), so a failure says the same wherever it
happens: a backend that times out is `backend_timeout` before its stream and within it.

No aiohttp here: the stages that raise these (`chats`, `request`, `body`) are plain code.
"""

from __future__ import annotations

import json
from typing import Any

from ..backend import BackendError, TimedOut
from ..errors import OtakuError


class ServeError(OtakuError):
    """`ctx serve` cannot start: one line saying why and what to do (exit 1)."""


class Failure(OtakuError):
    """A request that gets an error reply: `status`, `kind` (OpenAI's `type`) and `code`."""

    status = 500
    kind = "server_error"
    code = "server_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error object: `message`, `type`, `param`, `code`."""
        said = f"ctx serve: {self.message}"
        return {"error": {"message": said, "type": self.kind, "param": self.param, "code": self.code}}

    def json(self) -> str:
        return json.dumps(self.body(), ensure_ascii=False)

    def event(self) -> bytes:
        """The same body as a server-sent event, for a stream already under way."""
        return f"data: {json.dumps(self.body())}\n\n".encode()


class BadRequest(Failure):
    status, kind, code = 400, "invalid_request_error", "invalid_request"


class Unauthorized(Failure):
    status, kind, code = 401, "invalid_request_error", "invalid_api_key"


class SlowBody(Failure):
    """A request body that did not arrive in time."""

    status, kind, code = 408, "invalid_request_error", "request_timeout"


class TooLarge(Failure):
    """A request past serve's bounds: its bytes, or its messages."""

    status, kind, code = 413, "invalid_request_error", "request_too_large"


class DoesNotFit(BadRequest):
    """Case 6 at serve: the chat's frame and newest message alone overrun the window."""

    code = "context_length_exceeded"


class BackendFailed(Failure):
    status, kind, code = 502, "backend_error", "backend_failed"


class BackendTimedOut(BackendFailed):
    status, code = 504, "backend_timeout"


class Internal(Failure):
    """A fault of ctx serve's own, or of its settings."""


def backend_failure(failure: BackendError) -> BackendFailed:
    made = BackendTimedOut if isinstance(failure, TimedOut) else BackendFailed
    return made(f"the backend failed: {failure}")


def failure_of(error: Exception) -> Failure:
    """The failure a request is answered with for `error`: itself, the backend's as a 502 (504
    when it timed out), any other of ctx's own errors as a 500 with its words, and anything else
    as a 500 that sends the reader to the log."""
    if isinstance(error, Failure):
        return error
    if isinstance(error, BackendError):
        return backend_failure(error)
    if isinstance(error, OtakuError):
        return Internal(str(error))
    return Internal("an internal error (its log says more)")
