"""One HTTP request to the model server, with its timeouts and its retries: the only code that
opens a connection. Only transport failures, 429 and 503 are retried (at most `Retry.attempts`
times, honouring Retry-After, never waiting longer than `Retry.cap`); any other answer is
returned as it came. No redirect is followed and no proxy used: a request goes to the host the
user named and nowhere else. `timeout` bounds a reply's whole time, from the request sent to its
last byte (`_Paced`): a server trickling a byte now and then cannot hold a run for ever."""

from __future__ import annotations

import email.utils
import http.client
import io
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any
from urllib.parse import SplitResult, urlsplit

from .failures import BadReply, Cancelled, TimedOut, Unreachable

#: the largest reply read; anything longer is not an answer to a chat request
LIMIT = 64 * 1024 * 1024
#: the longest label of a host name and the longest name (RFC 1035, 2.3.4)
LABEL, HOST = 63, 253

_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")


def without_credentials(url: str) -> str:
    """`url` as it may be shown: a `user:password@` in it left out."""
    return _CREDENTIALS.sub(r"\1", url)


def split_url(url: str) -> SplitResult:
    """`url` split as a connection will use it, or ValueError saying what is wrong with it: what
    `urlsplit`, its `port` and the IDNA codec would otherwise raise later, as a traceback (a port
    out of range or not a number, a broken IPv6 host, a host label over 63 characters)."""
    if _UNSAFE.search(url):
        raise ValueError("a space or a control character in it")
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL", "'x' does not appear to be an IPv4 or IPv6 address"
        raise ValueError("a host in [brackets] that is not an IPv6 address") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("not http:// or https://")
    _, colon, port = parts.netloc.rpartition("@")[2].rpartition("]")[2].rpartition(":")
    port = port if colon else ""
    shown = port if len(port) <= 20 else port[:20] + "…"
    if port and not (port.isascii() and port.isdigit()):
        raise ValueError(f"the port {shown!r} is not a number")
    if port and not (len(port) <= 5 and 1 <= int(port) <= 65535):
        raise ValueError(f"the port {shown} is not from 1 to 65535")
    try:
        parts.port  # noqa: B018 - what the connection will ask: `[::1]:80:90` still raises
    except ValueError:
        raise ValueError("a port that is not a number") from None
    if not parts.hostname:
        raise ValueError("no host")
    try:
        name = parts.hostname.encode("idna")
    except UnicodeError:
        too_long = any(len(label) > LABEL for label in parts.hostname.split("."))
        problem = f"a label over {LABEL} characters" if too_long else "an empty label, or one no host name has"
        raise ValueError(f"a host name with {problem}") from None
    if len(name) > HOST:
        raise ValueError(f"a host name of over {HOST} characters")
    return parts


@dataclass(frozen=True)
class Retry:
    """How the transport retries: `attempts` retries after the first try, waiting `backoff`,
    then twice that, and so on, or what Retry-After asks, never more than `cap` seconds."""

    attempts: int = 3
    backoff: float = 1.0
    cap: float = 60.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def wait(self, attempt: int, retry_after: float | None) -> float:
        wanted = self.backoff * 2**attempt if retry_after is None else retry_after
        return max(0.0, min(wanted, self.cap))


def too_large(url: str) -> BadReply:
    """The error of a reply from `url` past `LIMIT`, as every reader of a reply says it."""
    return BadReply(url, f"a reply of over {LIMIT // (1 << 20)} MiB")


@dataclass(frozen=True)
class Answer:
    """A reply read whole. `headers` has lower-case names."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    retries: int

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After in seconds: a number of seconds, or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Paced(io.RawIOBase):
    """A response's socket, read against one deadline for the whole reply: each read may wait
    only what is left of it (a socket's own timeout bounds each read alone, so a byte every
    second would keep a reply coming for ever). `got` and `reads` say what came before it."""

    def __init__(self, sock: socket.socket, deadline: float, holder: io.BufferedReader) -> None:
        super().__init__()
        self.sock, self.deadline = sock, deadline
        self.holder = holder  # the socket's own file: while it is open, closing the connection keeps the socket
        self.got = self.reads = 0

    def close(self) -> None:
        if not self.closed:
            self.holder.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the reply's deadline passed")
        self.sock.settimeout(left)
        n = self.sock.recv_into(buffer)
        self.got += n
        self.reads += 1
        return n


def _paced_response(paced: list[_Paced], deadline: float) -> type[http.client.HTTPResponse]:
    """An HTTPResponse class that reads its socket through a `_Paced` (kept in `paced`)."""

    class Response(http.client.HTTPResponse):
        def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            paced.append(_Paced(sock, deadline, self.fp))
            self.fp = io.BufferedReader(paced[-1])

    return Response


class Cancel:
    """A way to stop one request from another thread: `stop()` shuts its connection's socket
    down, so the request raises `Cancelled` at once and the server stops generating (llama.cpp,
    vLLM, Ollama and KoboldCpp each end a request whose client went away). Lock: `_lock`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.stopped = False

    def attach(self, sock: socket.socket | None) -> None:
        """The socket of the request now on the wire (stopped at once when `stop` came first)."""
        with self._lock:
            self._sock = sock
            if self.stopped:
                _shut(sock)

    def detach(self) -> None:
        with self._lock:
            self._sock = None

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            _shut(self._sock)


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass


class _Lost(Exception):
    """A transport failure worth another try: `why` says what happened, for the message."""

    def __init__(self, why: str) -> None:
        self.why = why
        super().__init__(why)


class Transport:
    """Requests to one server (scheme, host and port from the user's URL)."""

    def __init__(
        self, server: SplitResult, *, timeout: float, connect_timeout: float, headers: Mapping[str, str], retry: Retry
    ) -> None:
        if server.scheme not in ("http", "https") or not server.hostname:
            raise ValueError(f"not an http:// or https:// URL: {server.geturl()!r}")
        self.server = server
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.headers = dict(headers)
        self.retry = retry
        self.shown = f"{server.scheme}://{server.netloc.rpartition('@')[2]}"

    def url(self, path: str) -> str:
        """The URL of `path`, as a message may show it (no credentials)."""
        return f"{self.shown}{path}"

    def send(self, method: str, path: str, body: bytes | None = None, cancel: Cancel | None = None) -> Answer:
        """The server's answer to `method path`, after the retries; raises `Unreachable`,
        `TimedOut` or `BadReply` when there is no answer to return, and `Cancelled` as soon as
        `cancel` is stopped."""
        for attempt in range(self.retry.attempts + 1):
            if cancel is not None and cancel.stopped:
                raise Cancelled(self.url(path), "stopped before it was sent")
            try:
                answer = self._once(method, path, body, attempt, cancel)
            except _Lost as lost:
                if cancel is not None and cancel.stopped:
                    raise Cancelled(self.url(path), "stopped while the server worked on it") from None
                if attempt == self.retry.attempts:
                    tries = f" (after {attempt} retries)" if attempt else ""
                    raise Unreachable(self.url(path), lost.why + tries) from None
                self.retry.sleep(self.retry.wait(attempt, None))
                continue
            if answer.status not in (429, 503) or attempt == self.retry.attempts:
                return answer
            self.retry.sleep(self.retry.wait(attempt, retry_after(answer.headers.get("retry-after"))))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _connection(self) -> http.client.HTTPConnection:
        host, port = self.server.hostname or "", self.server.port
        if self.server.scheme == "https":
            return http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(host, port, timeout=self.connect_timeout)

    def _once(self, method: str, path: str, body: bytes | None, attempt: int, cancel: Cancel | None = None) -> Answer:
        url = self.url(path)
        connection = self._connection()
        try:
            try:
                connection.connect()
            except TimeoutError:
                raise _Lost(f"no answer to the connection within {self.connect_timeout:g} s") from None
            except ssl.SSLError as error:
                raise Unreachable(
                    url, f"TLS failed ({error.reason or error})", "check the URL's scheme and the certificate"
                ) from None
            except socket.gaierror:
                raise _Lost(f"cannot resolve the host {self.server.hostname!r}") from None
            except ConnectionRefusedError:
                raise _Lost("connection refused") from None
            except OSError as error:
                raise _Lost(f"cannot connect ({error.strerror or error})") from None
            if connection.sock is not None:
                connection.sock.settimeout(self.timeout)
            if cancel is not None:
                cancel.attach(connection.sock)
            paced: list[_Paced] = []
            connection.response_class = _paced_response(paced, time.monotonic() + self.timeout)
            try:
                headers = {**self.headers, "Content-Length": str(len(body or b""))}
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                status, reason = response.status, response.reason
                names = {name.lower(): value for name, value in response.getheaders()}
                data = self._read(response, url)
            except TimeoutError:
                raise TimedOut(url, self._late(paced)) from None
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                raise _Lost("the server closed the connection without a reply") from None
            except (http.client.HTTPException, BadReply) as error:
                if cancel is not None and cancel.stopped:  # its socket shut: a reply cut short
                    raise _Lost("stopped") from None
                if isinstance(error, BadReply):
                    raise
                raise BadReply(url, f"not an HTTP reply ({type(error).__name__}: {error})") from None
            except OSError as error:
                raise _Lost(f"the connection failed ({error.strerror or error})") from None
        finally:
            if cancel is not None:
                cancel.detach()
            connection.close()
        return Answer(status, reason, names, data, attempt)

    def _late(self, paced: list[_Paced]) -> str:
        """What a reply that missed its deadline had sent by then."""
        got = paced[0].got if paced else 0
        if not got:
            return f"no reply within {self.timeout:g} s"
        reads = paced[0].reads
        return (
            f"the reply was not whole within {self.timeout:g} s ({got:,} bytes came, in {reads:,} reads:"
            " a server sending it a little at a time)"
        )

    @staticmethod
    def _read(response: http.client.HTTPResponse, url: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := response.read(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > LIMIT:
                    raise too_large(url)
        except http.client.IncompleteRead as cut:
            got = size + len(cut.partial)
            expected = f" of {got + cut.expected}" if cut.expected is not None else ""
            raise BadReply(url, f"the reply was cut short ({got}{expected} bytes)") from None
        if response.length:  # read(amt) ends quietly where a Content-Length body is cut short
            raise BadReply(url, f"the reply was cut short ({size} of {size + response.length} bytes)")
        return b"".join(chunks)
