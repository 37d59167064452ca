"""`ctx serve`: an OpenAI-compatible server between the user's frontend and their model server.

Each `POST /v1/chat/completions` is the whole chat; ctx assembles it (cases 1-6) for the
backend's real window less the reply, sends the assembled messages on in the same request
body, and streams the reply back chunk by chunk. `GET /v1/models` and `POST /v1/completions`
pass through unchanged (a flat text prompt cannot be re-assembled); `GET /health`;
`GET /ctx/stats`. aiohttp serves it and streams from the backend, on one asyncio loop; ctx's
own work (counting, assembling, the backend's window) runs beside it on a worker thread, one
for the chats of fewer than `LONG_CHAT` messages and one for the longer (`Lane`), so that a
long chat's first turn (seconds, at 100,000 messages) holds up no other chat's.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from aiohttp import web

from ..backend import Backend, BackendError, NoTokenizer, Retry, TimedOut
from ..build import counter_for, with_model
from ..config import ModelSettings, ServeSettings, Settings
from ..errors import ConfigError, OtakuError
from ..jsonload import JSONProblem, TooMany, loads
from ..story.model import Story
from ..summarize import options_of
from ..tokens import TokenCounter
from .assemble import Assembled, assemble_chat, ladder
from .chats import Chat, ChatError, FramePart, chat_story, dialogue_of, frame_of, framed, identify
from .logs import log_to_stderr, unquoted
from .session import Session, Sessions
from .stats import StreamUsage, Turn, Usage
from .store import Store, chats_folder
from .summaries import Gate, Summarizer

log = logging.getLogger("otaku_ctx.serve")
T = TypeVar("T")


class ServeError(OtakuError):
    """`ctx serve` cannot start: one line saying why and what to do (exit 1)."""


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


#: a stream's headers: `X-Accel-Buffering: no` keeps a proxy in front (nginx) from holding it back,
#: as llama.cpp's server says
STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: what a JSON reply says it is, as llama.cpp's server and OpenAI's say it
JSON_TYPE = "application/json; charset=utf-8"

#: each status's error code, where the reply names none of its own (OpenAI's and llama.cpp's
#: error objects always carry one)
CODES = {400: "invalid_request", 401: "invalid_api_key", 404: "not_found", 408: "request_timeout",
         413: "request_too_large", 500: "server_error", 502: "backend_failed", 503: "unavailable",
         504: "backend_timeout"}  # fmt: skip


#: how deep a field serve passes on may nest (a JSON schema of tools is some ten levels deep)
MOST_NESTING = 100


def nested_past(value: Any, most: int) -> bool:
    """Whether `value` nests lists and objects more than `most` levels deep (walked without
    recursion: a decoder lets some thousand levels through, the encoder of the request sent on
    does not)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > most:
                    return True
                stack.append((child, depth + 1))
    return False


def content_type(answer: Any) -> str:
    """The backend's Content-Type as it sent it (`; charset=utf-8` kept), where it is a plain
    header of a sane length; else JSON's."""
    given = answer.headers.get("Content-Type", "")
    return given if given and len(given) <= 200 and given.isascii() and given.isprintable() else JSON_TYPE


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object: `message`, `type`, `param`, `code`."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> web.Response:
    """An OpenAI-style error reply."""
    body = error_body(message, kind, code or CODES.get(status, "error"))
    return web.Response(text=json.dumps(body, ensure_ascii=False), status=status, content_type="application/json",
                        charset="utf-8")  # fmt: skip


def backend_failed(failure: BackendError) -> web.Response:
    status = 504 if isinstance(failure, TimedOut) else 502
    return error(status, f"ctx serve: the backend failed: {failure}", "backend_error")


#: a chat of this many messages or more is long: its turns run on the long chats' worker
LONG_CHAT = 5000
#: a body of this many bytes or more is decoded on a thread of its own, not on the event loop
LONG_BODY = 1 << 20


class Lane:
    """A worker thread and what it counts and assembles with: its own counter and the
    pipelines made for it (a counter, and so a pipeline, is one thread's)."""

    def __init__(self, name: str) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.setup: Setup | None = None

    async def run(self, work: Callable[[], T]) -> T:
        """`work` on this lane's thread, from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    def wait(self, work: Callable[[], T]) -> T:
        """`work` on this lane's thread, from another thread (the summarizer's)."""
        return self.pool.submit(work).result()


@dataclass
class Setup:
    """What the first chat request works out once: the settings with the model's and the
    server's parts, the counter, the summarizer, and the settings of each rung of serve's
    small-window ladder (`assemble.ladder`)."""

    settings: Settings
    count: TokenCounter
    summarizer: Summarizer | None
    rungs: tuple[Settings, ...] = ()


def serving(settings: Settings) -> Settings:
    """serve's own defaults, where the settings keep the built-in ones: the stable cache policy
    (a server's chat is what it is for) and messages labelled only with the names the frontend
    sent (`[prompt] speakers = "as_given"`)."""
    context, prompt = settings.context, settings.prompt
    if context.cache == "exact":
        context = replace(context, cache="stable")
    if prompt.speakers == "labelled":
        prompt = replace(prompt, speakers="as_given")
    return replace(settings, context=context, prompt=prompt)


@dataclass(frozen=True)
class Request:
    """A chat request, parsed and checked before any state changes: which chat, its frame,
    the reply's reserve, and the body as it came."""

    body: dict[str, Any]
    chat: Chat
    frame: tuple[FramePart, ...]
    max_tokens: int | None


class Service:
    """One `ctx serve`: the settings, the backend (asked for its window and tokenizer), the
    forwarding client, the summaries store, the gate, the stats."""

    def __init__(self, settings: Settings) -> None:
        from .upstream import Upstream

        s = settings.serve
        if not s.backend:
            raise ConfigError(
                "serve.backend", None, "no model server named; pass --backend URL (e.g. http://127.0.0.1:8080/v1)"
            )
        self.settings = settings
        self.key = client_key(settings)
        self.backend = self.backend_for(s.model or settings.summarize.model or "")
        self.upstream = Upstream(
            self.backend.url, api_key_env=s.backend_key_env, timeout=s.timeout, connect_timeout=s.connect_timeout
        )
        self.summarize = s.summarize
        summarize = settings.summarize
        self.store = Store(
            chats_folder(), options_of(summarize).cutting, (summarize.summary_words, summarize.history_words)
        )
        self.sessions = Sessions()
        self.gate = Gate()
        # the chats of fewer than LONG_CHAT messages, and the longer
        self.lanes = (Lane("ctx-serve"), Lane("ctx-serve-long"))
        self._setup_lock = threading.Lock()

    def backend_for(self, model: str) -> Backend:
        """The backend as ctx asks it itself (its window, its tokenizer, the summaries): one retry
        after a short wait, so that a frontend hears of a server that is down at once."""
        s = self.settings.serve
        return Backend(
            s.backend, model, api_key_env=s.backend_key_env or None, timeout=s.timeout,
            connect_timeout=s.connect_timeout, retry=Retry(attempts=1, backoff=0.25),
        )  # fmt: skip

    # the worker threads -----------------------------------------------------------------------

    def lane(self, messages: int) -> Lane:
        """The lane of a chat of this many messages."""
        return self.lanes[messages >= LONG_CHAT]

    def counting(self, session: Session, work: Callable[[TokenCounter], T]) -> T:
        """`work` with a chat's lane's counter, on its thread, from another (the summarizer's):
        the lane of its last request, as `chat_completions` chose it."""
        lane = self.lane(len(session.sent))
        return lane.wait(lambda: work(self.setup_of(lane).count))

    def setup_of(self, lane: Lane, model_name: str = "") -> Setup:
        """The lane's setup: the first lane's (`setup`), with a counter of its own for any other."""
        if lane.setup is None:
            first = self.setup(model_name)
            lane.setup = first if lane is self.lanes[0] else replace(first, count=counter_for(first.settings))
        return lane.setup

    @property
    def _setup(self) -> Setup | None:
        return self.lanes[0].setup

    def setup(self, model_name: str = "") -> Setup:
        """The settings for this backend, made once: the model's parts (`[model] use`), and the
        server's own tokenizer where it has one and the user named none. `model_name` is the
        first request's "model", which the backend is asked about (and the summaries asked
        of) when `--model` names none."""
        with self._setup_lock:
            if self.lanes[0].setup is None:
                self.lanes[0].setup = self._made(model_name)
            return self.lanes[0].setup

    def _made(self, model_name: str) -> Setup:
        if not self.backend.model and model_name:
            self.backend = self.backend_for(model_name)
        settings = serving(self.settings)
        model = settings.model
        # the user's own choice: given, or set to other than the default (`config init` writes them all)
        chose_tokenizer = (
            bool(model.use) or "model.tokenizer" in settings.given or model.tokenizer != ModelSettings().tokenizer
        )
        server = self.backend.server()  # a server that is down says so here, at once
        if not chose_tokenizer and server.counts:
            served = replace(model, tokenizer="server", server=model.server or self.backend.url)
            try:
                count = counter_for(replace(settings, model=served))
                settings = replace(settings, model=served)
            except NoTokenizer as why:
                log.warning("counting with %s: %s", model.tokenizer, why)
                settings = with_model(settings)
                count = counter_for(settings)
        elif not chose_tokenizer:
            log.warning(
                "counting with %s: the backend has no tokenize endpoint (for exact counts set [model] use)",
                model.tokenizer,
            )
            settings = with_model(settings)
            count = counter_for(settings)
        else:
            settings = with_model(settings)
            count = counter_for(settings)
        summarizer = None
        if self.summarize:
            summarizer = Summarizer(self.backend, settings, self.store, self.gate, self.counting)
            summarizer.start()
        return Setup(settings, count, summarizer, ladder(settings))

    def window(self, settings: Settings) -> int:
        """The backend's window (llama.cpp's /props, vLLM's /v1/models, Ollama's /api/show),
        else `[model] window`."""
        return self.backend.window() or settings.model.window

    # the requests -----------------------------------------------------------------------------

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        bound = self.settings.serve.max_body
        if request.content_length is not None and request.content_length > bound:
            raise TooLarge(bound)
        try:
            data = await asyncio.wait_for(request.read(), BODY_SECONDS)
        except web.HTTPRequestEntityTooLarge:
            raise TooLarge(bound) from None
        except TimeoutError:
            raise SlowBody() from None
        try:  # orjson when there (a 10,000-message chat: 4 ms, not 15), guarded: nesting, items, numbers
            # a long chat's body (20 MB: a tenth of a second and more) is decoded off the event loop
            body = loads(data) if len(data) < LONG_BODY else await asyncio.to_thread(loads, data)
        except TooMany as why:
            raise ChatError(f"the request body is {why.message}") from None
        except JSONProblem as why:
            raise ChatError(f"the request body is not JSON ({why.message})") from None
        if not isinstance(body, dict):
            raise ChatError("the request body must be a JSON object")
        return body

    def parse(self, body: dict[str, Any], headers: Mapping[str, str]) -> Request:
        """Every check of a chat request, before any state changes: its messages are a chat ctx
        can assemble, its reply's reserve, which chat it is."""
        given = body.get("messages")
        if isinstance(given, list) and len(given) > MOST_MESSAGES:
            raise TooManyMessages(MOST_MESSAGES, len(given))
        for key, value in body.items():  # what is passed on as it came is encoded again: bounded first
            if key != "messages" and nested_past(value, MOST_NESTING):
                raise ChatError(f"{key}: nested more than {MOST_NESTING} levels deep; no chat request is")
        opening = max(2, self.settings.serve.chat_messages)  # two at least: one is a probe
        chat = identify(chat_story(body, most=opening), body, headers, self.settings.serve.chat_messages)
        return Request(body, chat, frame_of(body), _tokens(body))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        turn = self.parse(await self.read_json(request), request.headers)
        lane = self.lane(len(turn.body["messages"]))
        with self.gate.live():
            setup = await lane.run(lambda: self.setup_of(lane, str(turn.body.get("model") or "")))
            window = await lane.run(lambda: self.window(setup.settings))
            session, assembled = await lane.run(lambda: self.assemble(turn, setup, window))
            own = time.monotonic() - started
            if assembled.messages is None:
                return self.refused(session, assembled, setup)
            forwarded = {**turn.body, "messages": assembled.messages}
            if self.settings.serve.model:
                forwarded["model"] = self.settings.serve.model

            def done(usage: Usage, cancelled: bool = False) -> None:
                self.record(session, assembled, usage, own, cancelled)

            try:
                if turn.body.get("stream"):
                    return await self.stream(request, "/chat/completions", forwarded, done)
                return await self.whole("/chat/completions", forwarded, done)
            except BackendError as failure:  # its words may quote the prompt: not into the log
                failure.problem = unquoted(failure.problem, [m["content"] for m in assembled.messages])
                raise

    def assemble(self, turn: Request, setup: Setup, window: int) -> tuple[Session | None, Assembled]:
        """On the worker thread: the chat's session found (none for a probe), its story read
        against the last one, its scenes (the summaries, else provisional ones), its frame
        placed, and the turn assembled; then its summaries wished for."""
        if turn.chat.probe:  # a connection test: answered as it is, remembered nowhere
            probe = chat_story(turn.body)
            return None, assemble_chat(probe, setup.rungs, setup.count, window=window, max_tokens=turn.max_tokens)
        session = self.sessions.find(turn.chat, *dialogue_of(turn.body))
        with session.lock:  # its turn on another lane (the one that made it long) is done first
            return session, self._assembled(session, turn, setup, window)

    def _assembled(self, session: Session, turn: Request, setup: Setup, window: int) -> Assembled:
        summarizer = setup.summarizer
        story = chat_story(turn.body, session.story, sent_before=session.sent)
        session.sent, session.story = turn.body.get("messages"), story
        writing = summarizer is not None and summarizer.writing(session)
        told = self.store.story(session, story, hold=writing)
        sticky = setup.settings.serve.frame_sticky
        for keep in (sticky, 0) if sticky else (0,):  # what stopped being sent goes first, if it must
            placed = placed_frame(session, told, turn.frame, setup.settings.serve, keep, self.store.cutting.settle)
            assembled = assemble_chat(
                placed, setup.rungs, setup.count, window=window, max_tokens=turn.max_tokens, session=session
            )
            if assembled.messages is not None:
                break
        self.say_shape(session, assembled, setup)
        if summarizer is not None:
            summarizer.want(session, story)
        return assembled

    def say_shape(self, session: Session, assembled: Assembled, setup: Setup) -> None:
        """Once a chat, when the backend's window made serve shape it otherwise than configured."""
        if assembled.messages is None or (not assembled.rung and assembled.truncated is None):
            return
        c, given = setup.rungs[min(assembled.rung, len(setup.rungs) - 2)].context, setup.settings.context
        if assembled.truncated is not None:
            said = (
                f"the window holds no head of {c.head_messages} and tail of {c.tail_floor} beside the frame: the"
                " newest messages that fit are sent"
            )
        else:
            said = (
                f"head {c.head_messages} and tail floor {c.tail_floor} (the settings' {given.head_messages} and"
                f" {given.tail_floor} do not fit the window beside the frame)"
            )
        if said != session.said:
            session.said = said
            log.info("chat %s: %s", session.key[:12], said)

    def refused(self, session: Session | None, assembled: Assembled, setup: Setup) -> web.Response:
        """Case 6, which is now only a chat whose frame and newest message cannot fit: an
        OpenAI-style 400 naming the window it needs."""
        refusal = assembled.built.assembly.refusal
        assert refusal is not None
        key = session.key[:12] if session is not None else "(probe)"
        log.info("chat %s · %d messages · case 6 · refused (needs %d)", key, assembled.built.assembly.messages,
                 refusal.needed_context)  # fmt: skip
        remedy = "start the backend with a larger context, or send a shorter system prompt and card"
        if session is not None and session.why:
            remedy += f" (the summaries could not be written: {session.why})"
        return error(
            400,
            f"ctx serve: this chat does not fit: its frame and newest message alone are {refusal.smallest:,} tokens,"
            f" the limit {refusal.limit:,} (a {refusal.context:,}-token window less {refusal.reserve:,} for the reply);"
            f" it needs a window of {refusal.needed_context:,} tokens: {remedy}",
            code="context_length_exceeded",
        )

    def record(self, session: Session | None, assembled: Assembled, usage: Usage, seconds: float,
               cancelled: bool = False) -> None:  # fmt: skip
        a = assembled.built.assembly
        turn = Turn(a.messages, a.case, a.tokens, a.limit, usage.prompt_tokens, usage.cached, round(seconds, 4),
                    cancelled)  # fmt: skip
        cached = f"{turn.cached:,} cached" if turn.cached is not None else "cache not reported"
        stopped = " · stopped by the client" if cancelled else ""
        if session is None:
            log.info("a one-message probe · %s tokens sent · %s%s", f"{a.tokens:,}", cached, stopped)
            return
        with self.sessions.lock:
            session.turns.append(turn)
            number = len(session.turns)
        log.info(
            "chat %s · turn %d · %d messages · case %d · %s tokens sent (limit %s) · %s · ctx %.3f s%s",
            session.key[:12], number, a.messages, a.case, f"{a.tokens:,}", f"{a.limit:,}", cached, seconds, stopped,
        )  # fmt: skip

    async def whole(self, path: str, body: Mapping[str, Any], done: Done) -> web.Response:
        async with self.upstream.send("POST", path, body) as answer:
            data = await self.upstream.body(answer)
        usage = Usage()
        if answer.status == 200:
            try:
                usage.read(loads(data, surrogates=True))
            except JSONProblem:  # passed on as it came; only its usage is not known
                pass
            done(usage)
        return web.Response(body=data, status=answer.status, headers={"Content-Type": content_type(answer)})

    async def stream(self, request: web.Request, path: str, body: Mapping[str, Any], done: Done) -> web.StreamResponse:
        """The backend's reply, each chunk passed on as it arrives. A frontend that goes away
        ends the request to the backend (the handler is cancelled, the connection closed)."""
        from .upstream import Events, Upstream

        upstream: Upstream = self.upstream
        async with upstream.send("POST", path, body) as answer:
            if answer.status != 200 or answer.content_type != "text/event-stream":
                data = await self.upstream.body(answer)
                return web.Response(body=data, status=answer.status, headers={"Content-Type": content_type(answer)})
            response = web.StreamResponse(headers=STREAM_HEADERS)
            await response.prepare(request)
            usage, events = StreamUsage(), Events(str(answer.url))
            told = False
            try:
                async for chunk in upstream.chunks(answer):
                    whole = events.feed(chunk)  # only whole events go on: never half a line
                    if not whole:
                        continue
                    usage.feed(whole)
                    if usage.finished and not told:  # before the client has it, and may hang up
                        done(usage)
                        told = True
                    await response.write(whole)
                events.end()
            except (asyncio.CancelledError, ConnectionResetError):  # the client went away: SillyTavern's Stop
                if not told:
                    done(usage, True)
                raise
            except BackendError as failure:  # too late for a status: the stream says it, and ends
                failure.problem = unquoted(failure.problem, [str(m.get("content")) for m in body.get("messages", ())])
                log.warning("the backend failed mid-stream: %s", failure)
                said = error_body(f"ctx serve: the backend failed: {failure}", "backend_error", "backend_failed")
                await response.write(f"data: {json.dumps(said)}\n\n".encode())
                if not told:
                    done(usage)
            else:
                if not told:
                    done(usage)
            await response.write_eof()
            return response

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/completions`, passed through unchanged: a flat text prompt cannot be
        re-assembled (its messages are not told apart)."""
        body = await self.read_json(request)
        with self.gate.live():
            if body.get("stream"):
                return await self.stream(request, "/completions", body, lambda usage: None)
            return await self.whole("/completions", body, lambda usage: None)

    async def models(self, request: web.Request) -> web.Response:
        async with self.upstream.send("GET", "/models") as answer:
            data = await self.upstream.body(answer)
        return web.Response(body=data, status=answer.status, headers={"Content-Type": content_type(answer)})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ctx_stats(self, request: web.Request) -> web.Response:
        chats = []
        with self.sessions.lock:
            for session in self.sessions:
                if not session.turns:
                    continue
                work = session.working
                chats.append(
                    {
                        "chat": session.key,
                        "named": session.chat.named,
                        "case": session.turns[-1].case,
                        "summaries_left": work.requests_left if work is not None else 0,
                        "summaries_failed": session.why,
                        "shape": session.said or "as configured",
                        "turns": [t.facts() for t in session.turns],
                    }
                )
        return web.json_response({"chats": chats})

    # the app ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        middlewares = [self.cors, self.errors, self.authorized]
        app = web.Application(client_max_size=self.settings.serve.max_body, middlewares=middlewares)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ctx/stats", self.ctx_stats)
        app.on_startup.append(self._open)
        app.on_shutdown.append(self._stopping)
        app.on_cleanup.append(self._close)
        app.on_response_prepare.append(self._cors_headers)
        return app

    async def _open(self, app: web.Application) -> None:
        await self.upstream.open()

    async def _stopping(self, app: web.Application) -> None:
        self.gate.stop()
        if self._setup is not None and self._setup.summarizer is not None:
            self._setup.summarizer.stop()

    async def _close(self, app: web.Application) -> None:
        await self.upstream.close()
        for lane in self.lanes:
            lane.pool.shutdown(wait=False, cancel_futures=True)

    @web.middleware
    async def cors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A browser frontend (RisuAI, Agnai in a browser) asks first whether it may: yes, from
        any page, as llama.cpp's server answers. The key, when one is set, still decides."""
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return web.Response(status=204, headers=CORS_PREFLIGHT)
        return await handler(request)

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault("Access-Control-Allow-Origin", "*")

    @web.middleware
    async def authorized(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """With a key set, every request but `/health` must send it (`Authorization: Bearer`,
        as the OpenAI client does, or `X-Api-Key`)."""
        if self.key and request.path != "/health":
            given = request.headers.get("Authorization", "")
            given = given[7:].strip() if given[:7].lower() == "bearer " else request.headers.get("X-Api-Key", "")
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                return error(401, "ctx serve: a missing or wrong API key", code="invalid_api_key")
        return await handler(request)

    @web.middleware
    async def errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every failure as an OpenAI-style error, translated here once."""
        try:
            return await handler(request)
        except TooLarge as why:
            return error(413, f"ctx serve: the request body is over {why.bound:,} bytes ([serve] max_body)")
        except TooManyMessages as why:
            return error(
                413, f"ctx serve: a chat of {why.given:,} messages; serve takes at most {why.bound:,} a request"
            )
        except SlowBody:
            return error(408, f"ctx serve: the request body did not arrive within {BODY_SECONDS:g} s")
        except ChatError as why:
            return error(400, f"ctx serve: {why}")
        except BackendError as failure:
            log.warning("the backend failed: %s", failure)
            return backend_failed(failure)
        except web.HTTPException:
            raise
        except OtakuError as why:
            log.warning("%s", why)
            return error(500, f"ctx serve: {why}", "server_error")
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("ctx serve: an internal error")
            return error(500, "ctx serve: an internal error (its log says more)", "server_error")


CORS_PREFLIGHT = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Api-Key, X-Ctx-Chat",
    "Access-Control-Max-Age": "600",
}


#: the messages one request may hold: twice the longest story ctx is built for (100,000), so that
#: one request's assembly (some seconds, the first time) cannot hold the other chats' turns for long
MOST_MESSAGES = 200_000


class TooManyMessages(Exception):
    def __init__(self, bound: int, given: int) -> None:
        self.bound, self.given = bound, given


class SlowBody(Exception):
    """A request body that did not arrive within `BODY_SECONDS`."""


class TooLarge(Exception):
    def __init__(self, bound: int) -> None:
        super().__init__(bound)
        self.bound = bound


Done = Callable[..., None]  # a turn's end: done(usage, cancelled=False)
#: the depth that places the frame's moving parts at the tail's first message, whatever the chat's length
TAIL = 1 << 30


def placed_frame(
    session: Session, story: Story, sent: Sequence[FramePart], serve: ServeSettings, sticky: int, settle: int
) -> Story:
    """The story with the frame this turn sends on (`frame.FrameMemory`: parts as first sent, those
    that stopped `sticky` messages), the parts that stay first and the moving ones at
    `frame_depth`, and the system messages inside the chat held where they were (`depth_hold`);
    with `stable_frame` off, all as the frontend sent it."""
    if not serve.stable_frame:
        return story
    story = session.frame.held(story, serve.depth_hold, settle)
    frame = session.frame.frame(sent, len(story.messages), sticky)
    depth = TAIL if serve.frame_depth == "tail" else serve.frame_depth
    return framed(story, frame, session.frame.moving(frame), depth)


def _tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ChatError(f"{key}: expected a whole number of tokens ≥ 0")
        return value
    return None


# running it --------------------------------------------------------------------------------


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


#: seconds a connection may sit idle, before its first request or between two (llama.cpp's
#: server: 5); a client that trickles its headers is idle until they end
KEEPALIVE = 5.0
#: seconds a request's body may take to arrive, once its headers have
BODY_SECONDS = 30.0
#: open connections at once; past it, the oldest idle ones are closed (waiting for a request, or
#: trickling its headers), so a flood of idle or slow connections never shuts out a client that
#: asks and goes, and the process stays well below the 1,024 files it may have open. A connection
#: in a request is never cut: its body has `BODY_SECONDS`, its reply the backend's timeout.
MOST_CONNECTIONS = 512


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
            say(f"ctx serve: listening on {url}, forwarding to {service.backend.url}")

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
