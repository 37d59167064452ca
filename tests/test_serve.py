"""`ctx serve` between the real `openai` client and a stand-in model server of the tests' own
(loopback, port 0, in a thread) that answers like llama.cpp's server and logs every request:
the chat assembled and forwarded (streamed and not), the pass-through endpoints, the stats, the
summaries written in the background, and the failure modes a real server will not produce on
cue — down, slow, a 500, a disconnect mid-stream, a client that goes away, an oversized body.
The real server's test is tests/realserver/test_serve_real.py."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from loopback import JSONHandler, QuietServer

from otaku_ctx.config import ContextSettings, ModelSettings, ServeSettings, Settings, SummarizeSettings
from otaku_ctx.serve.chats import HEADER, ChatError, chat_story, identify
from otaku_ctx.serve.errors import ServeError
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running
from otaku_ctx.serve.stats import StreamUsage, Usage
from otaku_ctx.story.sidecar import read_sidecar
from otaku_ctx.summarize import Cutting

REPO = Path(__file__).resolve().parents[1]


class StandIn(QuietServer):
    """A model server: `/props` says its window (0: none), `/v1/models` lists one model, chat completions
    answer `reply to N messages` (streamed a word a chunk when asked), summaries and histories
    answer JSON. `mode` makes it fail: "500", "slow" (waits `delay` first), "cut" (a stream
    that stops mid-reply), "hang" (a stream that sends one chunk, then waits)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.window = 8192
        self.mode = ""
        self.delay = 0.0
        self.summary_delay = 0.0
        self.loops = 0  # this many summary replies first come back as a loop
        self.useless = False  # every summary reply one that names no one (a check turns it down)
        self.bodies: list[dict[str, Any]] = []  # the live chat requests, as received
        self.summaries: list[dict[str, Any]] = []  # the summary and history requests
        self.completions: list[bytes] = []
        self.requests: list[str] = []  # every request's method and path, in order
        self.events: list[tuple[str, float]] = []  # ("live"|"summary" start/end, time)
        self.in_flight = self.most = 0  # live requests being answered at once ("slow"), and the most
        self.gone = threading.Event()  # a client went away mid-stream
        self.lock = threading.Lock()


_SUMMARY_ASK = "Reply with one JSON object"  # configs/prompts/summary.md and history.md end so


def reply_text(body: dict[str, Any]) -> str:
    return f"reply to {len(body['messages'])} messages"


class _Handler(JSONHandler):
    server: StandIn
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.requests.append(f"GET {self.path}")
        if self.path == "/props":
            self._send(200, {"default_generation_settings": {"n_ctx": self.server.window}})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "stand-in", "object": "model", "owned_by": "tests"}]})
        else:
            self._send(404, {"error": {"message": "no such endpoint"}})

    def do_POST(self) -> None:
        self.server.requests.append(f"POST {self.path}")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/completions":
            self.server.completions.append(raw)
            self._send(200, {"choices": [{"text": "continued", "index": 0, "finish_reason": "stop"}]})
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "no such endpoint"}})
            return
        body = json.loads(raw)
        if body.get("response_format") is not None or _SUMMARY_ASK in json.dumps(body["messages"][-1:]):
            self._summary(body)  # a summary asked in plain words too (the summarizer's third try)
            return
        stand_in = self.server
        with stand_in.lock:
            stand_in.bodies.append(body)
            stand_in.events.append(("live", time.monotonic()))
        if stand_in.mode == "500":
            self._send(500, {"error": {"message": "the model crashed"}})
            return
        if stand_in.mode == "slow":
            with stand_in.lock:
                stand_in.in_flight += 1
                stand_in.most = max(stand_in.most, stand_in.in_flight)
            time.sleep(stand_in.delay)
            with stand_in.lock:
                stand_in.in_flight -= 1
        text = reply_text(body)
        usage = {"prompt_tokens": 100, "completion_tokens": 4, "total_tokens": 104}
        timings = {"cache_n": 90, "prompt_n": 10}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            self._send(
                200,
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model") or "stand-in",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                    "timings": timings,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        words = text.split(" ")
        try:
            for i, word in enumerate(words):
                delta = {"content": word if i == 0 else " " + word}
                chunk = {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "stand-in",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                if stand_in.mode == "cut" and i == 1:
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                if stand_in.mode == "hang":
                    for _ in range(100):
                        time.sleep(0.05)
                        self._chunk(b": still working\n\n")
                time.sleep(stand_in.delay if stand_in.mode == "slow-stream" else 0)
            end = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "stand-in",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": usage,
                "timings": timings,
            }
            self._chunk(f"data: {json.dumps(end)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            stand_in.gone.set()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _summary(self, body: dict[str, Any]) -> None:
        stand_in = self.server
        with stand_in.lock:
            stand_in.summaries.append(body)
            stand_in.events.append(("summary", time.monotonic()))
        time.sleep(stand_in.summary_delay)
        asked = body["messages"][-1]["content"]
        if "The scene:" in asked or "[" in asked:
            text = json.dumps({"title": "A scene", "summary": "Mara and the keeper talk about the lamp."})
        else:
            text = json.dumps({"history": "So far Mara and the keeper have talked."})
        if "history" in json.dumps(body.get("response_format") or {}):
            text = json.dumps({"history": "So far Mara and the keeper have talked."})
        with stand_in.lock:
            looping, stand_in.loops = stand_in.loops > 0, stand_in.loops - 1
        if looping:
            text = json.dumps({"title": "A scene", "summary": "Mara and the keeper talk. " * 60})
        if stand_in.useless:
            text = json.dumps({"title": "A scene", "summary": "I cannot help with that.", "history": "Nothing."})
        with stand_in.lock:
            stand_in.events.append(("summary-end", time.monotonic()))
        self._send(
            200,
            {
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 20},
            },
        )


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn().start()
    try:
        yield server
    finally:
        server.stop()


def settings_for(url: str, **serve: Any) -> Settings:
    context = ContextSettings(head_messages=2, min_tail_messages=10, tail_step=4, tail_floor=6, reserve_default=100)
    summarize = SummarizeSettings(settle=4, min_chars=300, min_messages=6, summary_words=20, history_words=20)
    given = {"backend": url, "port": 0, "timeout": 5.0, "connect_timeout": 2.0, "summarize": False, **serve}
    return Settings(context=context, summarize=summarize, serve=ServeSettings(**given))


@pytest.fixture
def serving(stand_in: StandIn) -> Iterator[Running]:
    running = Running(Service(settings_for(stand_in.url)))
    try:
        yield running
    finally:
        running.stop()


def client(running: Running, key: str = "none", **given: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url, api_key=key, max_retries=0, timeout=20, **given)


def begun(talk: openai.OpenAI, messages: list[dict[str, Any]], **given: Any) -> None:
    """A chat's first request: served, and held as a one-shot (`serve.sessions`) until the
    request after it continues it; so the request a test looks at next is a chat's turn."""
    talk.chat.completions.create(model="local", messages=messages, **given)


def chat(n: int, frame: str = "You are the keeper of the lighthouse.", words: int = 12) -> list[dict[str, Any]]:
    """A chat of `n` messages after a system frame: Keeper's greeting first, then by turns."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": frame}]
    for i in range(1, n + 1):
        role = "assistant" if i % 2 else "user"
        name = "Keeper" if i % 2 else "Mara"
        text = " ".join(f"w{i}x{j}" for j in range(words))
        messages.append({"role": role, "name": name, "content": f"Turn {i}: {text}."})
    return messages


# ── a request as a Story, and which chat it is ─────────────────────────────────────────────


def test_a_request_becomes_a_story_with_its_frame_and_names() -> None:
    body = {"messages": [*chat(3), {"role": "system", "content": "A narrator's aside."}]}
    story = chat_story(body)
    assert story.system == "You are the keeper of the lighthouse."
    assert [(m.number, m.role, m.name) for m in story.messages] == [
        (1, "assistant", "Keeper"),
        (2, "user", "Mara"),
        (3, "assistant", "Keeper"),
        (4, "system", None),
    ]
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert chat_story(parts).messages[0].content == "a\nb"


@pytest.mark.parametrize(
    "messages, said",
    [
        ([], "non-empty list"),
        ([{"role": "system", "content": "only a frame"}], "only system messages"),
        ([{"role": "tool", "content": "x"}], "role 'tool'"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text content parts"),
    ],
)
def test_a_request_that_is_no_chat_is_refused(messages: list[Any], said: str) -> None:
    with pytest.raises(ChatError, match=said):
        chat_story({"messages": messages})


def test_a_chat_is_known_by_its_opening_whatever_its_frame_or_by_its_name() -> None:
    """SillyTavern's frame changes from turn to turn (World Info that fired, a group member's
    card): the chat is its opening messages. A name keeps the opening's summaries (`pool`); a
    one-message request is a probe, named or not."""
    first = chat_story({"messages": chat(4)})
    later = chat_story({"messages": chat(30)})
    reframed = chat_story({"messages": chat(30, frame="You are a ferryman.")})
    key = identify(first, {}, {}, 2)
    assert key == identify(later, {}, {}, 2) == identify(reframed, {}, {}, 2) and not key.named
    other = chat(30)
    other[2]["content"] = "Another first reply."
    assert identify(chat_story({"messages": other}), {}, {}, 2).key != key.key
    named = identify(later, {}, {HEADER: "lamp"}, 2)
    assert named.named and named == identify(reframed, {"user": "lamp"}, {}, 2) and named.key != key.key
    assert named.pool == key.pool
    probe = identify(chat_story({"messages": [{"role": "user", "content": "Hi"}]}), {}, {HEADER: "lamp"}, 2)
    assert probe.probe and not key.probe


def test_a_chats_next_request_keeps_the_messages_it_holds_again() -> None:
    """Turn after turn, the messages a chat's request holds again are the same objects as last
    turn's (what was worked out from them is known again by identity); from the first edited
    one on, and for another frame's chat, they are read afresh, and equal what a fresh read gives."""
    before = chat_story({"messages": chat(30)})
    after = chat_story({"messages": chat(33)}, before)
    assert all(a is b for a, b in zip(after.messages, before.messages, strict=False))
    assert after == chat_story({"messages": chat(33)})
    edited = chat(33)
    edited[11]["content"] += " (edited)"
    again = chat_story({"messages": edited}, before)
    assert all(a is b for a, b in zip(again.messages[:10], before.messages, strict=False))
    assert not any(a is b for a, b in zip(again.messages[10:], before.messages[10:], strict=False))
    assert again == chat_story({"messages": edited})
    assert chat_story({"messages": chat(2)}, before, most=1).messages == before.messages[:1]
    # as serve reads them (the session keeps what was sent): what was sent alike is not read again
    sent = chat(30)
    first = chat_story({"messages": sent})
    second = chat_story({"messages": edited}, first, sent_before=sent)
    assert all(a is b for a, b in zip(second.messages[:10], first.messages, strict=False))
    assert not any(a is b for a, b in zip(second.messages[10:], first.messages[10:], strict=False))
    assert second == chat_story({"messages": edited})
    grown = [*edited, *chat(35)[34:]]
    third = chat_story({"messages": grown}, second, sent_before=edited)
    assert all(a is b for a, b in zip(third.messages, second.messages, strict=False))
    assert third == chat_story({"messages": grown}) and len(third.messages) == 35


def test_the_sidecar_is_judged_again_only_when_the_chat_or_the_records_changed(tmp_path: Path) -> None:
    """The store judges a chat's records against its messages once: the next turn's story, the
    same messages and more, gets the same scenes (the same objects); an edited message, or
    records written since, are judged again — and what comes out is what a fresh judgment gives."""
    from otaku_ctx.serve.session import Session
    from otaku_ctx.serve.store import Store
    from otaku_ctx.story.sidecar import Record, covers, sha, sidecar_text

    story = chat_story({"messages": chat(40)})
    records = [
        Record(i + 1, a, b, f"S{i}", f"Scene {a}-{b}.", covers=covers(story, a, b), summary_sha=sha("x"))
        for i, (a, b) in enumerate([(3, 14), (15, 26)])
    ]
    # nothing more settled than the records cover (settle 44): the records alone, no provisional scene
    store, session = Store(tmp_path, Cutting(settle=44), (20, 20)), Session(identify(story, {}, {}, 2))
    store.path(session.chat.pool).write_text(sidecar_text(records))
    first = store.story(session, story, hold=False)
    judged = session.sidecar.judged
    next_turn = chat_story({"messages": chat(44)}, story)
    later = store.story(session, next_turn, hold=False)
    assert session.sidecar.judged is judged and later.scenes is first.scenes
    assert [(s.start, s.end) for s in first.scenes] == [(3, 14), (15, 26)]
    edited = chat(44)
    edited[5]["content"] += " (edited)"
    changed = chat_story({"messages": edited}, story)
    scenes = store.story(session, changed, hold=False).scenes
    # the stale scene 3-14 still serves (until it is redone), and the histories after it are ctx's own
    assert [(s.start, s.source) for s in scenes] == [(3, "sidecar"), (15, "sidecar")]
    store.path(session.chat.pool).write_text(sidecar_text(records[:1]))
    assert [s.start for s in store.story(session, next_turn, hold=False).scenes] == [3]


def test_usage_is_read_as_each_server_reports_it() -> None:
    llama = Usage()
    llama.read({"timings": {"cache_n": 90, "prompt_n": 10}})
    assert (llama.prompt_tokens, llama.cached) == (100, 90)
    hosted = Usage()
    hosted.read({"usage": {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}}})
    assert (hosted.prompt_tokens, hosted.cached) == (50, 32)
    streamed = StreamUsage()
    for piece in (b'data: {"choices": []}\n\nda', b'ta: {"usage": {"prompt_tokens": 7}, "tokens_cached": 5}\n\n'):
        streamed.feed(piece)
    assert (streamed.prompt_tokens, streamed.cached) == (7, 5)


# ── the endpoints, through the real openai client ──────────────────────────────────────────


def test_a_chat_is_assembled_and_forwarded_with_its_body(serving: Running, stand_in: StandIn) -> None:
    messages = chat(9)
    begun(client(serving), messages)
    reply = client(serving).chat.completions.create(
        model="local", messages=messages, temperature=0.3, stop=["\nMara:"], max_tokens=50, seed=7
    )
    assert reply.choices[0].message.content == reply_text(stand_in.bodies[-1])
    sent = stand_in.bodies[-1]
    assert (sent["model"], sent["temperature"], sent["stop"], sent["max_tokens"], sent["seed"]) == (
        "local",
        0.3,
        ["\nMara:"],
        50,
        7,
    )
    assert sent["messages"] != messages and sent["messages"][0]["role"] == "system"
    assert "You are the keeper of the lighthouse." in sent["messages"][0]["content"]
    assert "w9x11" in json.dumps(sent["messages"])  # the newest message is sent


def test_a_streamed_reply_arrives_chunk_by_chunk(serving: Running, stand_in: StandIn) -> None:
    stream = client(serving).chat.completions.create(model="local", messages=chat(5), stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == reply_text(stand_in.bodies[-1])
    assert len(pieces) == len(reply_text(stand_in.bodies[-1]).split(" "))


def test_a_streamed_turn_is_counted_once_its_last_event_passes(serving: Running, stand_in: StandIn) -> None:
    begun(client(serving), chat(3))
    stream = client(serving).chat.completions.create(model="local", messages=chat(5), stream=True)
    for _ in stream:  # the client hangs up once it has [DONE]
        pass
    stream.close()
    [_, turn] = json.loads(_get(serving, "/ctx/stats"))["chats"][0]["turns"]
    assert (turn["prompt_tokens"], turn["cached"]) == (100, 90)


def test_the_models_health_and_completions_pass_through(serving: Running, stand_in: StandIn) -> None:
    talk = client(serving)
    assert [m.id for m in talk.models.list()] == ["stand-in"]
    done = talk.completions.create(model="local", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert done.choices[0].text == "continued"
    assert json.loads(stand_in.completions[-1]) == {
        "model": "local",
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "temperature": 0,
    }
    connection = http.client.HTTPConnection("127.0.0.1", int(serving.url.split(":")[2].split("/")[0]), timeout=5)
    connection.request("GET", "/health")
    assert json.loads(connection.getresponse().read()) == {"status": "ok"}


def test_stats_say_each_turns_case_and_tokens(serving: Running, stand_in: StandIn) -> None:
    talk = client(serving)
    for n in (5, 7):
        talk.chat.completions.create(model="local", messages=chat(n), max_tokens=20)
    stats = json.loads(_get(serving, "/ctx/stats"))
    [one] = stats["chats"]
    assert [t["messages"] for t in one["turns"]] == [5, 7]
    assert one["case"] == 1 and one["turns"][-1]["cached"] == 90 and one["turns"][-1]["reprocessed"] == 10
    assert all(0 < t["sent"] <= t["limit"] for t in one["turns"])


def test_two_chats_at_once_each_get_their_own(serving: Running, stand_in: StandIn) -> None:
    stand_in.mode, stand_in.delay = "slow", 0.3
    talk = client(serving)
    got: dict[str, str] = {}

    def ask(frame: str, n: int, words: int) -> None:  # two openings: two chats
        reply = talk.chat.completions.create(model="local", messages=chat(n, frame=frame, words=words))
        got[frame] = reply.choices[0].message.content or ""

    threads = [threading.Thread(target=ask, args=each) for each in (("A ferry.", 3, 12), ("A lamp.", 6, 13))]
    for each in threads:
        each.start()
    for each in threads:
        each.join(60)  # a hang guard
    assert stand_in.most == 2  # the backend answered the two at once, not one after the other
    frames = {b["messages"][0]["content"].split("\n")[0]: b for b in stand_in.bodies}
    assert got == {f: reply_text(frames[f]) for f in ("A ferry.", "A lamp.")}
    assert json.loads(_get(serving, "/ctx/stats"))["one_shots"] == {"served": 2, "held": 2}  # no chat's yet


def test_a_chat_that_cannot_fit_is_refused_naming_the_window(serving: Running, stand_in: StandIn) -> None:
    """Only a frame and newest message that cannot fit are refused (a true case 6)."""
    stand_in.window = 600
    frame = " ".join(f"rule{i}" for i in range(600))
    with pytest.raises(openai.BadRequestError) as refused:
        client(serving).chat.completions.create(model="local", messages=chat(80, frame=frame), max_tokens=100)
    said = refused.value.body["message"]  # type: ignore[index]
    assert "it needs a window of" in said and "600-token window less 100 for the reply" in said
    assert stand_in.bodies == []


def test_a_long_chat_fits_the_backends_window_less_the_reply(serving: Running, stand_in: StandIn) -> None:
    stand_in.window = 3000
    home = Path(os.environ["OTAKU_HOME"]) / "chats"
    home.mkdir(parents=True)
    story = chat_story({"messages": chat(60)})
    key = identify(story, {}, {}, 2).pool
    from otaku_ctx.story.sidecar import Record, covers, sha

    records = [
        Record(i + 1, a, b, f"S{i}", f"Scene {a}-{b} in short.", covers=covers(story, a, b), summary_sha=sha("x"))
        for i, (a, b) in enumerate([(3, 14), (15, 26), (27, 38)])
    ]
    (home / f"{key}.ctx-summaries").write_text("".join(r.line_text() + "\n" for r in records))
    for _ in range(2):  # a first request, then the chat's turn
        client(serving).chat.completions.create(model="local", messages=chat(60), max_tokens=300)
    [_, turn] = json.loads(_get(serving, "/ctx/stats"))["chats"][0]["turns"]
    assert turn["case"] in (3, 5) and turn["sent"] <= turn["limit"] == 3000 - 300
    assert "Scene 3-14 in short." in json.dumps(stand_in.bodies[-1]["messages"])


@pytest.mark.parametrize("window, limit", [(None, 8192 - 300), (4096, 4096 - 300)])
def test_a_backend_that_says_no_window_is_asked_once_and_not_when_the_window_is_set(
    stand_in: StandIn, window: int | None, limit: int
) -> None:
    """Issue 42: a backend with no window was asked its four window endpoints on every turn,
    `[model] window` set or not. Now: asked once and its "none" remembered; not at all when
    the user set the window (what serve asks at its first turn to learn what the server is
    aside, every later turn is the chat completion alone)."""
    stand_in.window = 0  # its /props says n_ctx 0, and nothing else says a window
    settings = settings_for(stand_in.url)
    if window is not None:
        settings = replace(settings, model=ModelSettings(window=window))
    running = Running(Service(settings))
    try:
        talk, turns = client(running), []
        for n in (3, 5, 7, 9):
            before = len(stand_in.requests)
            talk.chat.completions.create(model="local", messages=chat(n), max_tokens=300)
            turns.append([r for r in stand_in.requests[before:] if r != "POST /v1/chat/completions"])
        stats = json.loads(_get(running, "/ctx/stats"))["chats"][0]["turns"]
    finally:
        running.stop()
    first, *later = turns
    assert later == [[], [], []]
    window_only = ["POST /api/show", "GET /api/extra/true_max_context_length"]  # asked for no other reason
    assert [r for r in first if r in window_only] == ([] if window else window_only)
    assert [turn["limit"] for turn in stats] == [limit] * 4


# ── failures ───────────────────────────────────────────────────────────────────────────────


def test_a_backend_that_is_down_is_a_502(stand_in: StandIn) -> None:
    url = stand_in.url
    stand_in.shutdown()
    stand_in.server_close()
    running = Running(Service(settings_for(url)))
    try:
        with pytest.raises(openai.APIStatusError) as failed:
            client(running).chat.completions.create(model="local", messages=chat(3))
        assert failed.value.status_code == 502
        said = failed.value.body["message"]  # type: ignore[index]
        assert "\n" not in said and "connection refused" in said and url.split("/v1")[0] in said
    finally:
        running.stop()


def test_a_backend_500_is_a_502_and_a_slow_one_a_504(stand_in: StandIn) -> None:
    running = Running(Service(settings_for(stand_in.url, timeout=0.5)))
    try:
        talk = client(running)
        talk.models.list()  # the window is asked before the mode changes
        stand_in.mode = "500"
        with pytest.raises(openai.APIStatusError) as failed:
            talk.chat.completions.create(model="local", messages=chat(3))
        assert failed.value.status_code == 502 and "the model crashed" in failed.value.body["message"]  # type: ignore[index]
        stand_in.mode, stand_in.delay = "slow", 2.0
        with pytest.raises(openai.APIStatusError) as slow:
            talk.chat.completions.create(model="local", messages=chat(3))
        assert slow.value.status_code == 504 and "no reply within 0.5 s" in slow.value.body["message"]  # type: ignore[index]
    finally:
        running.stop()


def test_a_backend_reply_past_the_bound_is_a_502(
    serving: Running, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve reads the backend's replies bounded as ctx's own client does (64 MiB; here 64
    bytes): a whole reply, a passed-through one and an error body past it are a 502 in one
    line, not read into memory whole."""
    import otaku_ctx.serve.upstream as upstream

    talk = client(serving)
    talk.models.list()  # the window is asked before the bound falls
    monkeypatch.setattr(upstream, "LIMIT", 64)
    with pytest.raises(openai.APIStatusError) as failed:
        talk.chat.completions.create(model="local", messages=chat(3))
    assert failed.value.status_code == 502 and "a reply of over" in failed.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as listed:
        talk.models.list()
    assert listed.value.status_code == 502
    stand_in.mode = "500"
    monkeypatch.setattr(upstream, "LIMIT", 16)  # the error body is 44 bytes
    with pytest.raises(openai.APIStatusError) as crashed:
        talk.chat.completions.create(model="local", messages=chat(3))
    said = crashed.value.body["message"]  # type: ignore[index]
    assert crashed.value.status_code == 502 and "500 Internal Server Error" in said and "crashed" not in said


def test_a_backend_that_stops_mid_stream_ends_the_stream_with_an_error(serving: Running, stand_in: StandIn) -> None:
    stand_in.mode = "cut"
    stream = client(serving).chat.completions.create(model="local", messages=chat(3), stream=True)
    with pytest.raises(openai.APIError, match="the backend failed"):
        for _ in stream:
            pass


def test_a_client_that_goes_away_cancels_the_backend_request(
    serving: Running, stand_in: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="otaku_ctx.serve")
    begun(client(serving), chat(3))
    stand_in.mode = "hang"
    host, port = serving.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    body = json.dumps({"model": "local", "messages": chat(3), "stream": True})
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.read1(100).startswith(b"data: ")
    response.close()
    connection.close()
    assert stand_in.gone.wait(4), "the backend's stream went on after the client left"
    deadline = time.monotonic() + 4
    while not (turns := [t for c in json.loads(_get(serving, "/ctx/stats"))["chats"] for t in c["turns"]]):
        assert time.monotonic() < deadline, "the stopped turn is not in /ctx/stats"
        time.sleep(0.05)
    [_, stopped] = turns  # SillyTavern's Stop: a turn all the same, marked, with what was sent
    assert stopped["cancelled"] is True and stopped["sent"] > 0 and stopped["prompt_tokens"] is None
    assert any("stopped by the client" in r.getMessage() for r in caplog.records)  # and one line of the log


def test_a_client_that_goes_away_before_a_whole_reply_is_a_cancelled_turn(
    serving: Running, stand_in: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Not streamed: the client hangs up while the backend works. The turn is logged and in
    /ctx/stats as stopped, as a stream's is (issue 45: it was in neither)."""
    caplog.set_level(logging.INFO, logger="otaku_ctx.serve")
    begun(client(serving), chat(3))
    stand_in.mode, stand_in.delay = "slow", 2.0
    host, port = serving.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    body = json.dumps({"model": "local", "messages": chat(3)})
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    deadline = time.monotonic() + 4
    while stand_in.in_flight == 0:  # the backend has it
        assert time.monotonic() < deadline
        time.sleep(0.02)
    connection.close()
    deadline = time.monotonic() + 4
    while len(turns := [t for c in json.loads(_get(serving, "/ctx/stats"))["chats"] for t in c["turns"]]) < 2:
        assert time.monotonic() < deadline, "the stopped turn is not in /ctx/stats"
        time.sleep(0.05)
    stopped = turns[-1]
    assert stopped["cancelled"] is True and stopped["sent"] > 0 and stopped["prompt_tokens"] is None
    assert any("stopped by the client" in r.getMessage() for r in caplog.records)


def test_an_oversized_body_is_a_413(stand_in: StandIn) -> None:
    running = Running(Service(settings_for(stand_in.url, max_body=4096)))
    try:
        with pytest.raises(openai.APIStatusError) as failed:
            client(running).chat.completions.create(model="local", messages=chat(60))
        assert failed.value.status_code == 413 and "4,096 bytes" in failed.value.body["message"]  # type: ignore[index]
        assert stand_in.bodies == []
    finally:
        running.stop()


@pytest.mark.parametrize(
    "body, said",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        # 4.2 million items in 6.3 MB (a 64 MiB body of them would be 1.7 GB decoded)
        (b'{"messages": [' + b"{}," * 2_100_000 + b"{}]}", "the request body is JSON of more than 4,000,000 items"),
        (b'{"messages": [', "malformed JSON"),
        (b"[1]", "JSON object"),
    ],
)
def test_a_body_that_is_no_json_object_is_a_400_in_one_line(
    serving: Running, stand_in: StandIn, body: bytes, said: str
) -> None:
    host, port = serving.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    message = json.loads(answer.read())["error"]["message"]
    assert answer.status == 400 and said in message and "\n" not in message
    assert stand_in.bodies == []


def test_another_address_needs_a_key_and_a_request_without_it_gets_401(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ServeError, match="needs an API key"):
        Service(settings_for(stand_in.url, host="0.0.0.0"))
    monkeypatch.setenv("CTX_TEST_KEY", "sesame")
    running = Running(Service(settings_for(stand_in.url, host="127.0.0.1", api_key_env="CTX_TEST_KEY")))
    try:
        with pytest.raises(openai.AuthenticationError):
            client(running, key="wrong").chat.completions.create(model="local", messages=chat(3))
        reply = client(running, key="sesame").chat.completions.create(model="local", messages=chat(3))
        assert reply.choices[0].message.content
    finally:
        running.stop()


def test_a_chats_text_is_never_logged(serving: Running, stand_in: StandIn, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otaku_ctx.serve")
    client(serving).chat.completions.create(model="local", messages=chat(5))
    lines = [r.getMessage() for r in caplog.records]
    assert any("case 1" in line and "tokens sent" in line and "90 cached" in line for line in lines)
    assert not any("w3x" in line or "lighthouse" in line for line in lines)


# ── summaries in the background ────────────────────────────────────────────────────────────


def test_summaries_are_written_in_the_background_and_used(stand_in: StandIn) -> None:
    stand_in.window, stand_in.summary_delay = 1200, 0.05
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        talk = client(running)
        begun(talk, chat(60), max_tokens=200)
        # the chat's first turn is played at once, on ctx's own provisional scenes
        talk.chat.completions.create(model="local", messages=chat(60), max_tokens=200)
        first = json.dumps(stand_in.bodies[-1]["messages"])
        assert "(provisional)" in first or "[Story so far" in first
        deadline = time.monotonic() + 60  # a hang guard
        while json.loads(_get(running, "/ctx/stats"))["chats"][0]["summaries_writing"] or not stand_in.summaries:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.3)
        talk.chat.completions.create(model="local", messages=chat(60), max_tokens=200)
        [turn] = json.loads(_get(running, "/ctx/stats"))["chats"][0]["turns"][-1:]
        assert turn["case"] in (3, 4, 5)
        assert "Mara and the keeper" in json.dumps(stand_in.bodies[-1]["messages"])  # the model's, now
        [sidecar] = (Path(os.environ["OTAKU_HOME"]) / "chats").glob("*.ctx-summaries")
        records = read_sidecar(sidecar)
        assert records and records[-1].end <= 60 - 4  # the newest `settle` messages are left alone
        written = json.loads(_get(running, "/ctx/stats"))["chats"][0]["summaries"]
        assert written["by_model"] >= len(records) and written["extracts"] == 0
    finally:
        running.stop()


def test_a_model_whose_summaries_are_all_turned_down_is_said_once(
    stand_in: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Every summary reply names no one: the scenes are ctx's extracts, `/ctx/stats` counts them
    and the turned-down replies and says why, and the log says it once, with the remedy, however
    many passes the chat's growth asks for. A pass stops asking once `STOPS` replies are turned
    down and none kept: its other scenes are not asked for."""
    from otaku_ctx.serve.gate import STOPS

    stand_in.window, stand_in.useless = 1200, True
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        talk = client(running)
        begun(talk, chat(58), max_tokens=200)
        for n in (60, 62, 80, 82):
            talk.chat.completions.create(model="local", messages=chat(n), max_tokens=200)
            deadline = time.monotonic() + 60
            while json.loads(_get(running, "/ctx/stats"))["chats"][0]["summaries_writing"] or not stand_in.summaries:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while "turned down" not in json.loads(_get(running, "/ctx/stats"))["chats"][0]["summaries_failed"]:
            assert time.monotonic() < deadline  # the last pass, in the pause after the last turn
            time.sleep(0.1)
        [chat_] = json.loads(_get(running, "/ctx/stats"))["chats"]
    finally:
        running.stop()
    written = chat_["summaries"]
    assert written["by_model"] == 0 and written["extracts"] >= 2 and written["turned_down"] >= STOPS
    # each pass asks the model one scene's tries, then writes the rest without a request
    assert len(stand_in.summaries) == written["turned_down"] < written["extracts"]
    assert "turned down" in chat_["summaries_failed"]
    said = [r.getMessage() for r in caplog.records if "were all turned down" in r.getMessage()]
    assert len(said) == 1 and "[summarize]" in said[0] and "the last: " in said[0], said


def test_a_summary_reply_that_loops_is_asked_again_with_the_servers_penalty(stand_in: StandIn) -> None:
    """Serve's summarizer reaches the backend through its gate (`GatedBackend`), which must
    offer all `summarize.run` asks of a backend: a loop asks for the server's loop penalty."""
    stand_in.window, stand_in.loops = 1200, 1
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        talk = client(running)
        begun(talk, chat(60), max_tokens=200)
        talk.chat.completions.create(model="local", messages=chat(60), max_tokens=200)
        home = Path(os.environ["OTAKU_HOME"]) / "chats"
        deadline = time.monotonic() + 60  # a hang guard
        while not list(home.glob("*.ctx-summaries")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(home.glob("*.ctx-summaries")), _get(running, "/ctx/stats")
        [sidecar] = home.glob("*.ctx-summaries")
        penalties = {"repeat_penalty", "frequency_penalty", "repetition_penalty"}
        first, again = stand_in.summaries[:2]
        assert not penalties & first.keys() and penalties & again.keys()
        assert "talk. Mara" not in read_sidecar(sidecar)[0].summary
    finally:
        running.stop()


def test_a_summarizer_that_fails_says_so_in_the_stats(stand_in: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the summarizer is logged with its traceback; the chat is still played (on its
    provisional scenes), and `/ctx/stats` says why its summaries are not written."""

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("otaku_ctx.serve.summaries.run", broken)
    stand_in.window = 1200
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        talk = client(running)
        begun(talk, chat(60), max_tokens=200)
        said = ""
        deadline = time.monotonic() + 30  # a hang guard
        while not said and time.monotonic() < deadline:
            talk.chat.completions.create(model="local", messages=chat(60), max_tokens=200)
            said = json.loads(_get(running, "/ctx/stats"))["chats"][0]["summaries_failed"]
            time.sleep(0.1)
        assert said == "an error in ctx serve itself (its log has the traceback)", said
    finally:
        running.stop()


def test_a_live_request_waits_behind_one_summary_request_at_most(stand_in: StandIn) -> None:
    stand_in.window, stand_in.summary_delay = 1200, 0.4
    running = Running(Service(settings_for(stand_in.url, summarize=True)))
    try:
        talk = client(running)
        begun(talk, chat(60), max_tokens=200)
        talk.chat.completions.create(model="local", messages=chat(60), max_tokens=200)
        while not stand_in.summaries:
            time.sleep(0.02)
        with stand_in.lock:
            before = sum(kind == "summary" for kind, _ in stand_in.events)
        talk.chat.completions.create(model="local", messages=chat(4, frame="Another chat."), max_tokens=20)
        with stand_in.lock:
            kinds = [kind for kind, _ in stand_in.events]
        live = len(kinds) - 1 - kinds[::-1].index("live")
        # the summary in flight when the turn came may finish; no other starts before the turn is sent
        assert sum(kind == "summary" for kind in kinds[:live]) <= before + 1
    finally:
        running.stop()


# ── the command ────────────────────────────────────────────────────────────────────────────


def test_serve_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from otaku_ctx.cli.app import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else real(name, *a))
    assert main(["serve", "--backend", "http://127.0.0.1:9/v1"]) == 1
    assert capsys.readouterr().err == (
        "ctx: ctx serve needs aiohttp, the serve extra: pip install 'otaku-ctx[serve]' (sh install.sh installs it)\n"
    )


def test_sigterm_lets_a_stream_in_flight_finish(stand_in: StandIn, otaku_home: Path) -> None:
    stand_in.mode, stand_in.delay = "slow-stream", 0.2
    env = {**os.environ, "OTAKU_HOME": str(otaku_home)}
    command = [sys.executable, "-m", "otaku_ctx", "serve", "--backend", stand_in.url, "--port", "0", "--no-summarize"]
    process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].split(",")[0]
        stream = openai.OpenAI(base_url=url, api_key="none", max_retries=0).chat.completions.create(
            model="local", messages=chat(3), stream=True
        )
        pieces = [next(iter(stream)).choices[0].delta.content]
        process.send_signal(signal.SIGTERM)
        pieces += [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert "".join(p or "" for p in pieces) == reply_text(stand_in.bodies[-1])
        assert process.wait(10) == 0
    finally:
        process.kill()
        process.wait()


def test_nothing_is_written_but_the_summaries_store(serving: Running, otaku_home: Path) -> None:
    client(serving).chat.completions.create(model="local", messages=chat(7))
    written = [p for p in otaku_home.rglob("*") if p.is_file() and "counts" not in p.parts]
    assert written == []


def _get(running: Running, path: str) -> bytes:
    host, port = running.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    connection.request("GET", path)
    return connection.getresponse().read()


def test_the_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    from otaku_ctx.cli.app import main

    assert main(["serve", "--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.rstrip().endswith("SillyTavern: Chat Completion, Custom, URL http://127.0.0.1:8765/v1")
    assert "ctx serve --backend http://127.0.0.1:8080/v1" in shown.split("Options:")[1]


def test_a_browser_frontend_may_ask(serving: Running) -> None:
    host, port = serving.url.split("//")[1].split("/")[0].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    asked = {"Origin": "http://localhost:6001", "Access-Control-Request-Method": "POST"}
    connection.request("OPTIONS", "/v1/chat/completions", headers=asked)
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 204 and answer.getheader("Access-Control-Allow-Origin") == "*"
    assert "Authorization" in (answer.getheader("Access-Control-Allow-Headers") or "")
    connection.request("GET", "/health", headers={"Origin": "http://localhost:6001"})
    assert connection.getresponse().getheader("Access-Control-Allow-Origin") == "*"
