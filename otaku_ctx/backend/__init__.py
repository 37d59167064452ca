"""The user's model server: the one HTTP client (`Backend`), its typed errors, its retries.

Nothing else in ctx opens a connection (STYLE.md, point 12): the summarizer and a server-backed
token counter call `Backend` and never build a request themselves.
"""

from __future__ import annotations

from .client import Backend, Reply
from .failures import (
    BackendError,
    BadReply,
    BadURL,
    Cancelled,
    ContextTooLong,
    FormatRefused,
    KeyMissing,
    ModelNotFound,
    NoTokenizer,
    Refused,
    ServerBusy,
    ServerError,
    TimedOut,
    Unreachable,
)
from .servers import KINDS, SERVERS, Server, ServerKind
from .transport import Cancel, Retry

__all__ = [
    "Backend",
    "BackendError",
    "BadReply",
    "BadURL",
    "Cancel",
    "Cancelled",
    "ContextTooLong",
    "FormatRefused",
    "KINDS",
    "KeyMissing",
    "ModelNotFound",
    "NoTokenizer",
    "Refused",
    "Reply",
    "Retry",
    "SERVERS",
    "Server",
    "ServerKind",
    "ServerBusy",
    "ServerError",
    "TimedOut",
    "Unreachable",
]
