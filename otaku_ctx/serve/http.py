"""`ctx serve`: an OpenAI-compatible server between the user's frontend and their model server.

Each `POST /v1/chat/completions` is the whole chat. `Service` wires its stages, each a module:

    body.read_json → request.parse → turn.assemble_turn → relay.whole | relay.stream → record
                                      (sessions.take)

The body is read within its bounds; the request is checked whole before any state changes; on
its lane's worker thread (`setup.Lanes`), the chat's session is taken and the turn assembled for
the backend's real window less the reply; the assembled messages go on in the same request body
and the reply comes back whole or chunk by chunk; the turn is logged and kept in `/ctx/stats`.
`GET /v1/models` and `POST /v1/completions` pass through unchanged (a flat text prompt cannot be
re-assembled); `GET /health`; `GET /ctx/stats`. Each `/v1/…` path is answered without `/v1` too,
and under `/chat/NAME/v1/…` (or `/chat/NAME/…`), which names the chat as `X-Ctx-Chat` does.
Every failure is an error class that carries its own status (`errors`), answered in one place (`answer_errors`).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..backend import Backend, BackendError, Retry
from ..config import Settings
from ..errors import ConfigError, OtakuError
from ..summarize import options_of
from . import relay
from .body import read_json
from .chats import HEADER
from .errors import Failure, ServeError, Unauthorized, failure_of
from .gate import Gate
from .logs import unquoted
from .record import record, refusal, stats_of
from .request import parse
from .sessions import Sessions
from .setup import Lanes
from .stats import Usage
from .store import Store, chats_folder
from .summaries import Summarizer
from .turn import assemble_turn
from .upstream import Upstream

log = logging.getLogger("otaku_ctx.serve")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Service:
    """One `ctx serve`: its settings and client key, the lanes that count and assemble, the
    forwarding client, the chats (`sessions`), their summaries (`store`, `summarizer`) and the
    gate that keeps live requests first."""

    def __init__(self, settings: Settings) -> None:
        s = settings.serve
        if not s.backend:
            raise ConfigError(
                "serve.backend", None, "no model server named; pass --backend URL (e.g. http://127.0.0.1:8080/v1)"
            )
        self.settings = settings
        self.key = client_key(settings)
        self.upstream = Upstream(
            s.backend, api_key_env=s.backend_key_env, timeout=s.timeout, connect_timeout=s.connect_timeout
        )
        summarize = settings.summarize
        self.store = Store(
            chats_folder(), options_of(summarize).cutting, (summarize.summary_words, summarize.history_words)
        )
        self.sessions = Sessions()
        self.gate = Gate()
        self.summarizer = (
            Summarizer(self.store, self.gate, lambda chat, work: self.lanes.counting(chat.turn.sent, work))
            if s.summarize
            else None
        )
        self.lanes = Lanes(settings, partial(backend_for, settings), self._made)

    def _made(self, backend: Backend, settings: Settings) -> None:
        if self.summarizer is not None:
            self.summarizer.use(backend, settings)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        headers: Mapping[str, str] = request.headers
        if "chat" in request.match_info:  # named in the URL, for a frontend that can set nothing else
            headers = {**request.headers, HEADER: request.match_info["chat"]}
        turn = parse(await read_json(request, self.settings.serve.max_body), headers, self.settings.serve)
        lane = self.lanes.lane(turn.body["messages"])
        with self.gate.live():
            setup = await lane.run(lambda: self.lanes.setup(lane, str(turn.body.get("model") or "")))
            window = await lane.run(lambda: self.lanes.window(setup.settings))
            session, assembled = await lane.run(
                lambda: assemble_turn(turn, setup, window, self.sessions, self.store, self.summarizer)
            )
            own = time.monotonic() - started
            if assembled.messages is None:
                raise refusal(session, assembled)
            forwarded = {**turn.body, "messages": assembled.messages}
            if self.settings.serve.model:
                forwarded["model"] = self.settings.serve.model

            def done(usage: Usage, cancelled: bool) -> None:
                record(session, assembled, usage, own, cancelled)

            try:
                if turn.body.get("stream"):
                    return await relay.stream(request, self.upstream, "/chat/completions", forwarded, done)
                return await relay.whole(self.upstream, "/chat/completions", forwarded, done)
            except BackendError as failure:  # its words may quote the prompt: not into the log
                failure.problem = unquoted(failure.problem, [m["content"] for m in assembled.messages])
                raise

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/completions`, passed through unchanged: a flat text prompt cannot be
        re-assembled (its messages are not told apart)."""
        body = await read_json(request, self.settings.serve.max_body)
        with self.gate.live():
            if body.get("stream"):
                return await relay.stream(request, self.upstream, "/completions", body, relay.nothing)
            return await relay.whole(self.upstream, "/completions", body, relay.nothing)

    async def models(self, request: web.Request) -> web.Response:
        async with self.upstream.send("GET", "/models") as answer:
            return relay.passed(answer, await self.upstream.body(answer))

    async def ctx_stats(self, request: web.Request) -> web.Response:
        return web.json_response(stats_of(self.sessions))

    def app(self) -> web.Application:
        middlewares: list[Middleware] = [cors, answer_errors, authorized(self.key)]
        app = web.Application(client_max_size=self.settings.serve.max_body, middlewares=middlewares)
        # under /v1 as OpenAI's API, without it as llama.cpp's server answers too (Agnai's Local
        # Requests post there), and under /chat/NAME/ for a chat named in the URL
        for base in ("/v1", "", "/chat/{chat}/v1", "/chat/{chat}"):
            app.router.add_post(f"{base}/chat/completions", self.chat_completions)
            app.router.add_post(f"{base}/completions", self.completions)
            app.router.add_get(f"{base}/models", self.models)
        app.router.add_get("/health", health)
        app.router.add_get("/ctx/stats", self.ctx_stats)
        app.cleanup_ctx.extend([self._upstream, self._lanes, self._summaries])
        app.on_response_prepare.append(cors_headers)
        return app

    # each resource's start and stop, in one place (aiohttp stops them in the reverse order) ----------

    async def _upstream(self, app: web.Application) -> AsyncIterator[None]:
        await self.upstream.open()
        yield
        await self.upstream.close()

    async def _lanes(self, app: web.Application) -> AsyncIterator[None]:
        yield
        self.lanes.close()

    async def _summaries(self, app: web.Application) -> AsyncIterator[None]:
        """The summarizer's thread, started with the server and joined when it stops."""
        if self.summarizer is not None:
            self.summarizer.start()
        yield
        self.gate.stop()  # no summary request waits for a live one any more
        if self.summarizer is not None:
            self.summarizer.stop(SUMMARIZER_JOIN)


#: seconds the summarizer's thread is waited for at shutdown, once the replies in flight are done
#: (one waiting at the gate ends at once; a summary request on the backend is left to its own
#: timeout: the scenes it finished are on disk, the rest are resumed next time)
SUMMARIZER_JOIN = 2.0


def backend_for(settings: Settings, model: str) -> Backend:
    """The backend as ctx asks it itself (its window, its tokenizer, the summaries): one retry
    after a short wait, so that a frontend hears of a server that is down at once."""
    s = settings.serve
    return Backend(
        s.backend, model, api_key_env=s.backend_key_env or None, timeout=s.timeout,
        connect_timeout=s.connect_timeout, retry=Retry(attempts=1, backoff=0.25),
    )  # fmt: skip


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_key(settings: Settings) -> str:
    """The key clients must send, from `[serve] api_key_env`; none on loopback without one. Any
    other address must be asked for (`--host`) and then needs one."""
    s = settings.serve
    if s.api_key_env:
        key = os.environ.get(s.api_key_env, "").strip()
        if not key:
            raise ServeError(f"[serve] api_key_env names ${s.api_key_env}, which is not set: export the key in it")
        return key
    if not loopback(s.host):
        raise ServeError(
            f"--host {s.host} lets other machines in, so it needs an API key: set [serve] api_key_env to the"
            " name of the environment variable holding it"
        )
    return ""


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def error_reply(failure: Failure) -> web.Response:
    return web.Response(text=failure.json(), status=failure.status, content_type="application/json", charset="utf-8")


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answered as its class says (`errors.failure_of`), here once; what is no
    request's fault is logged."""
    try:
        return await handler(request)
    except (web.HTTPException, ConnectionResetError):  # aiohttp's own answer; a client gone
        raise
    except Exception as error:  # noqa: BLE001 - every failure is answered, and the odd one logged
        if isinstance(error, BackendError):
            log.warning("the backend failed: %s", error)
        elif isinstance(error, OtakuError) and not isinstance(error, Failure):
            log.warning("%s", error)
        elif not isinstance(error, OtakuError):
            log.exception("an internal error")
        return error_reply(failure_of(error))


def authorized(key: str) -> Middleware:
    """With a key set, every request but `/health` must send it (`Authorization: Bearer`, as the
    OpenAI client does, or `X-Api-Key`)."""

    @web.middleware
    async def checked(request: web.Request, handler: Handler) -> web.StreamResponse:
        if key and request.path != "/health":
            given = request.headers.get("Authorization", "")
            given = given[7:].strip() if given[:7].lower() == "bearer " else request.headers.get("X-Api-Key", "")
            if not hmac.compare_digest(given.encode(), key.encode()):
                return error_reply(Unauthorized("a missing or wrong API key"))
        return await handler(request)

    return checked


CORS_PREFLIGHT = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Api-Key, X-Ctx-Chat",
    "Access-Control-Max-Age": "600",
}


@web.middleware
async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A browser frontend (RisuAI, Agnai in a browser) asks first whether it may: yes, from any
    page, as llama.cpp's server answers. The key, when one is set, still decides."""
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return web.Response(status=204, headers=CORS_PREFLIGHT)
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Access-Control-Allow-Origin", "*")
