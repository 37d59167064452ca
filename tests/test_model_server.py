"""`--tokenizer server` against stand-in servers of the tests' own, one a dialect (llama.cpp,
vLLM, KoboldCpp, TabbyAPI; Ollama and a plain OpenAI gateway, which have no tokenize
endpoint), each speaking its server's API as its source says (backend/servers.py) with a toy
tokenizer of its own: a control token `<|...|>` is one token, else each run of spaces or of
other characters is one. Each answers a chat too, so that every kind of the table
(`servers.SERVERS`) is asked its window, a count and a chat reply here. The stand-ins count
what they are asked, so the count cache's promise — a second counting of the same texts asks
nothing — is checked by the server's own tally as well as `Backend.asked`. The real llama.cpp
server's tests are in tests/realserver/."""

from __future__ import annotations

import json
import multiprocessing
import re
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import JSONHandler, QuietServer

from otaku_ctx.backend import Backend, BadReply, NoTokenizer, Refused, Retry, ServerError, Unreachable
from otaku_ctx.backend.servers import OPENAI, SERVERS, WINDOWS, ServerKind
from otaku_ctx.model import counts
from otaku_ctx.model.counts import CountStore, cache_file, text_key
from otaku_ctx.model.server import ServerCounter, server_counter
from otaku_ctx.status import ExitStatus

TOKEN = re.compile(r"<\|[a-z_]+\|>|\s+|[^\s<]+|<")


def toy_count(text: str) -> int:
    return len(TOKEN.findall(text))


class Dialect:
    """What one kind of server answers: GETs by path, POSTs by path (its tokenize endpoint, and
    the chat completions every kind answers), and the window it says (`window`)."""

    kind = ""
    tokenize_path = ""
    window: int | None = None

    def __init__(self, model: str = "Smol-135M", *, adds_bos: bool = True, key: str = "") -> None:
        self.model = model
        self.adds_bos = adds_bos
        self.key = key

    def get(self, path: str) -> Any:
        return None

    def tokenize(self, body: dict[str, Any]) -> Any:
        return None

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/v1/chat/completions":
            self.last = body["messages"]  # the messages of the last chat request
            heard = sum(toy_count(message["content"]) for message in body["messages"])
            message = {"role": "assistant", "content": f"{self.kind} says hello"}
            usage = {"prompt_tokens": heard, "completion_tokens": 3, "total_tokens": heard + 3}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return {"object": "chat.completion", "model": body["model"], "choices": [choice], "usage": usage}
        if self.tokenize_path and path == self.tokenize_path:
            return self.tokenize(body)
        return None


def ids(text: str, bos: bool) -> list[int]:
    """The toy tokenizer's ids: 1 its BOS, 2 a control token, 7 any other token."""
    return [1] * bos + [2 if token.startswith("<|") else 7 for token in TOKEN.findall(text)]


class Llama(Dialect):
    kind, tokenize_path, window = "llama.cpp", "/tokenize", 2048

    def get(self, path: str) -> Any:
        if path == "/props":
            return {
                "default_generation_settings": {"n_ctx": self.window, "params": {}},
                "total_slots": 2,
                "model_path": f"/models/{self.model}.gguf",
                "build_info": "b4000-abc",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
            }
        if path == "/v1/models":
            meta = {"n_vocab": 49152, "n_ctx": self.window, "size": 96576768}
            return {"object": "list", "data": [{"id": f"{self.model}.gguf", "meta": meta}]}
        return None

    def tokenize(self, body: dict[str, Any]) -> Any:
        assert body["parse_special"] is True
        tokens = ids(body["content"], self.adds_bos and body["add_special"])
        if body.get("with_pieces"):
            return {"tokens": [{"id": t, "piece": "?"} for t in tokens]}
        return {"tokens": tokens}


def chatml(messages: list[dict[str, Any]]) -> str:
    """The stand-in's chat template: ChatML, and the reply's priming after a user's turn."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if messages[-1]["role"] != "assistant" else "")


class TemplatingLlama(Llama):
    """llama.cpp that applies its chat template on request (`POST /apply-template`)."""

    window = 16384

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/apply-template":
            return {"prompt": chatml(body["messages"])}
        return super().post(path, body)


class RoomyLlama(Llama):
    """llama.cpp with a window the examples fit in."""

    window = 16384


class Vllm(Dialect):
    kind, tokenize_path, window = "vLLM", "/tokenize", 32768

    def get(self, path: str) -> Any:
        if path == "/v1/models":
            card = {"id": self.model, "object": "model", "owned_by": "vllm", "root": f"/hf/{self.model}"}
            return {"object": "list", "data": [{**card, "max_model_len": 32768}]}
        return None

    def tokenize(self, body: dict[str, Any]) -> Any:
        assert body["model"] == self.model
        tokens = ids(body["prompt"], self.adds_bos and body["add_special_tokens"])
        return {"count": len(tokens), "max_model_len": 32768, "tokens": tokens}


class Kobold(Dialect):
    kind, tokenize_path, window = "KoboldCpp", "/api/extra/tokencount", 8192

    def get(self, path: str) -> Any:
        if path == "/api/extra/version":
            return {"result": "KoboldCpp", "version": "1.80.3", "protected": False}
        if path == "/api/v1/model":
            return {"result": f"koboldcpp/{self.model}"}
        if path == "/api/extra/true_max_context_length":
            return {"value": 8192}
        return None

    def tokenize(self, body: dict[str, Any]) -> Any:
        tokens = ids(body["prompt"], self.adds_bos and body.get("special", True))
        kept = tokens if len(tokens) < 50_000 else []  # koboldcpp.py's guard
        return {"value": len(kept), "ids": kept}


class Tabby(Dialect):
    kind, tokenize_path, window = "TabbyAPI", "/v1/token/encode", 16384

    def get(self, path: str) -> Any:
        if path == "/props":  # TabbyAPI's stand-in for llama.cpp's: no model_path
            return {"default_generation_settings": {"n_ctx": 16384}, "total_slots": 1}
        if path == "/v1/model":
            return {"id": self.model, "object": "model", "owned_by": "tabbyAPI", "parameters": {"max_seq_len": 16384}}
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "tabbyAPI"}]}
        return None

    def tokenize(self, body: dict[str, Any]) -> Any:
        assert body["encode_special_tokens"] is True
        tokens = ids(body["text"], self.adds_bos and body.get("add_bos_token", True))
        return {"tokens": tokens, "length": len(tokens)}


class Ollama(Dialect):
    kind, window = "Ollama", 4096

    def get(self, path: str) -> Any:
        if path == "/api/version":
            return {"version": "0.5.7"}
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "library"}]}
        return None

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/api/show" and "model" in body:
            return {"parameters": f"num_ctx {self.window}", "model_info": {"llama.context_length": 131072}}
        return super().post(path, body)


class Gateway(Dialect):
    """An OpenAI-compatible gateway: models and chat, nothing else."""

    kind = "OpenAI"

    def get(self, path: str) -> Any:
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        return None


class StandIn(QuietServer):
    def __init__(self, dialect: Dialect) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.dialect = dialect
        self.seen: Counter[str] = Counter()  # requests by path
        self.broken: int | None = None  # the status the tokenize endpoint answers instead
        self.lock = threading.Lock()

    @property
    def tokenized(self) -> int:
        return self.seen[self.dialect.tokenize_path] if self.dialect.tokenize_path else 0


class _Handler(JSONHandler):
    server: StandIn

    def _authorized(self) -> bool:
        key = self.server.dialect.key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._send(401, {"detail": "Invalid API key"})
            return False
        return True

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.seen[self.path] += 1
        if not self._authorized():
            return
        found = self.server.dialect.get(self.path)
        self._send(200, found) if found is not None else self._send(404, {"error": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with self.server.lock:
            self.server.seen[self.path] += 1
        if not self._authorized():
            return
        dialect = self.server.dialect
        if self.path == dialect.tokenize_path and self.server.broken is not None:
            self._send(self.server.broken, {"error": {"message": "tokenizer exploded"}})
            return
        found = dialect.post(self.path, body)
        self._send(200, found) if found is not None else self._send(404, {"error": "Not Found"})


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[StandIn] = []

    def start(dialect: Dialect) -> StandIn:
        server = StandIn(dialect).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def backend(server: StandIn, **kwargs: Any) -> Backend:
    return Backend(server.url, "", retry=Retry(attempts=0), timeout=5, connect_timeout=2, **kwargs)


TEXTS = [
    "The lamp-room door creaks open.",
    "Mara: <|im_end|> is not hers to say",
    "  two  spaces",
    "",
    "漢字 🙂",
    "a\ud800b",
]
COUNTERS = [Llama, Vllm, Kobold, Tabby]
#: a stand-in for every kind of server ctx knows, by its name in the table
STAND_INS: dict[str, type[Dialect]] = {d.kind: d for d in (Llama, Kobold, Tabby, Vllm, Ollama, Gateway)}


# every kind of the table: its window, a count, a chat -----------------------------------------


def test_every_kind_has_a_stand_in() -> None:
    assert list(STAND_INS) == list(SERVERS)


@pytest.mark.parametrize("name", list(SERVERS))
def test_every_kind_answers_window_tokenize_and_chat(serve: Any, name: str) -> None:
    """Each kind against its stand-in: detected as itself; its window, asked before the kind is
    known and after; a count through its tokenize endpoint (`NoTokenizer` for a kind with none);
    a chat completion, before the kind is known and after."""
    dialect = STAND_INS[name]()
    server = serve(dialect)
    assert backend(server).window() == dialect.window
    talk = backend(server)
    found = talk.server()
    assert (found.kind, found.counts) == (name, SERVERS[name].counts)
    assert talk.window() == dialect.window
    text = "Mara: <|im_end|> is not hers"
    if found.counts:
        assert (talk.count(text), talk.count(text, add_special=True)) == (toy_count(text), toy_count(text) + 1)
        assert server.tokenized == talk.asked["tokenize"] == 2
    else:
        with pytest.raises(NoTokenizer, match=f"{'this server' if name == OPENAI else name} .*has no tokenize"):
            talk.count(text)
        assert talk.asked["tokenize"] == 0
    messages = [{"role": "user", "content": text}]
    for asker in (backend(server), talk):
        answer = asker.chat(messages, max_tokens=4, temperature=0)
        assert (answer.text, answer.prompt_tokens, answer.model) == (f"{name} says hello", toy_count(text), "")
    assert server.seen["/v1/chat/completions"] == 2


@pytest.mark.parametrize(
    ("name", "penalty"),
    [
        ("llama.cpp", {"repeat_penalty": 1.1}),  # its own, which ended SmolLM2's loops
        ("vLLM", {"repetition_penalty": 1.1}),
        *((name, {"frequency_penalty": 0.5}) for name in ("KoboldCpp", "TabbyAPI", "Ollama", "OpenAI")),
    ],
)
def test_each_kind_says_how_a_reply_that_looped_is_asked_again(serve: Any, name: str, penalty: dict) -> None:
    assert backend(serve(STAND_INS[name]())).loop_penalty() == penalty


def test_every_window_endpoint_is_asked() -> None:
    """A kind whose window can be asked before the kind is known is in `WINDOWS`, once."""
    own = [kind for kind in SERVERS.values() if type(kind).window is not ServerKind.window]
    assert sorted(kind.name for kind in WINDOWS) == sorted(kind.name for kind in own)


# each dialect: counts, what it adds, its window, its name ------------------------------------


@pytest.mark.parametrize("dialect", COUNTERS, ids=lambda d: d.kind)
def test_each_server_counts_as_it_parses(serve: Any, tmp_path: Path, dialect: type[Dialect]) -> None:
    server = serve(dialect())
    counter = server_counter(backend(server), tmp_path)
    assert [counter(text) for text in TEXTS] == [toy_count(text) for text in TEXTS]
    assert counter("<|im_end|>") == 1  # a control token spelled in the text is the one token it is
    assert counter.added == 1  # BOS, learned by counting a text with and without it
    assert server.tokenized == len(TEXTS) + 1 + 2


@pytest.mark.parametrize("dialect", COUNTERS, ids=lambda d: d.kind)
def test_a_model_that_adds_no_bos_adds_nothing(serve: Any, tmp_path: Path, dialect: type[Dialect]) -> None:
    server = serve(dialect(adds_bos=False))
    assert server_counter(backend(server), tmp_path).added == 0


@pytest.mark.parametrize(
    ("dialect", "window", "name"),
    [
        (Llama, 2048, "llama.cpp, Smol-135M.gguf"),
        (Vllm, 32768, "vLLM, Smol-135M"),
        (Kobold, 8192, "KoboldCpp, Smol-135M"),
        (Tabby, 16384, "TabbyAPI, Smol-135M"),
    ],
)
def test_the_server_is_detected_with_its_window(
    serve: Any, tmp_path: Path, dialect: type[Dialect], window: int, name: str
) -> None:
    server = serve(dialect())
    talk = backend(server)
    counter = server_counter(talk, tmp_path)
    assert talk.server().kind == dialect.kind
    assert talk.server().window == talk.window() == window
    root = server.url.removesuffix("/v1")
    assert counter.name == f"server {root} ({name})"
    asked = sum(server.seen.values())
    talk.server(), talk.window()
    assert sum(server.seen.values()) == asked  # detected once, remembered


def test_llama_cpp_names_its_bos_and_eos(serve: Any, tmp_path: Path) -> None:
    counter = server_counter(backend(serve(Llama())), tmp_path)
    assert counter.bos == "<|im_start|>"
    assert counter.specials == ("<|im_start|>", "<|im_end|>")


def test_a_server_that_wants_a_key(serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve(Tabby(key="sekrit"))
    with pytest.raises(Refused):
        server_counter(backend(server), tmp_path)
    monkeypatch.setenv("TABBY_KEY", "sekrit")
    counter = server_counter(backend(server, api_key_env="TABBY_KEY"), tmp_path)
    assert counter("a b") == 3


# the failures: one line each, never a guess --------------------------------------------------


@pytest.mark.parametrize(("dialect", "said"), [(Ollama, "Ollama (?)"), (Gateway, "this server")])
def test_a_server_without_a_tokenizer(serve: Any, tmp_path: Path, dialect: type[Dialect], said: str) -> None:
    server = serve(dialect())
    with pytest.raises(NoTokenizer) as error:
        server_counter(backend(server), tmp_path)
    message = str(error.value)
    assert "has no tokenize endpoint" in message and "\n" not in message
    assert message.startswith(server.url.removesuffix("/v1"))
    assert error.value.exit_code == ExitStatus.ERROR
    if dialect is Ollama:
        assert "Ollama" in message


def test_a_server_that_is_down(tmp_path: Path) -> None:
    with pytest.raises(Unreachable) as error:
        server_counter(Backend("http://127.0.0.1:9/v1", "", retry=Retry(attempts=0), connect_timeout=1), tmp_path)
    assert "\n" not in str(error.value)


def test_a_server_that_stops_mid_build(serve: Any, tmp_path: Path) -> None:
    server = serve(Llama())
    counter = server_counter(backend(server), tmp_path)
    assert counter("before") == 1
    server.shutdown()
    server.server_close()
    with pytest.raises(Unreachable):
        counter("after it stopped")
    assert counter("before") == 1  # what was counted stays counted


@pytest.mark.parametrize(("status", "error"), [(404, NoTokenizer), (500, ServerError)])
def test_a_tokenize_endpoint_that_fails(serve: Any, tmp_path: Path, status: int, error: type[Exception]) -> None:
    server = serve(Llama())
    counter = server_counter(backend(server), tmp_path)
    server.broken = status
    with pytest.raises(error) as raised:
        counter("a new text")
    assert "\n" not in str(raised.value)
    if status == 404:
        assert "llama.cpp answers 404 to its tokenize endpoint" in str(raised.value)


def test_a_reply_without_a_count(serve: Any, tmp_path: Path) -> None:
    server = serve(Llama())
    counter = server_counter(backend(server), tmp_path)
    server.dialect.tokenize = lambda body: {"tokens": "many"}  # type: ignore[method-assign]
    with pytest.raises(BadReply, match="no token count"):
        counter("a new text")


def test_koboldcpp_s_guard_is_not_a_count(serve: Any, tmp_path: Path) -> None:
    counter = server_counter(backend(serve(Kobold())), tmp_path)
    with pytest.raises(BadReply, match="KoboldCpp counted 0 tokens"):
        counter("a " * 25_000)


# the count cache -------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", COUNTERS, ids=lambda d: d.kind)
def test_a_second_counting_asks_nothing(serve: Any, tmp_path: Path, dialect: type[Dialect]) -> None:
    server = serve(dialect())
    first = server_counter(backend(server), tmp_path)
    counted = [first(text) for text in TEXTS]
    first.store.flush()  # as at the end of the run
    before = server.tokenized
    talk = backend(server)
    second = server_counter(talk, tmp_path)
    assert [second(text) for text in TEXTS] == counted
    assert second.added == first.added
    assert server.tokenized == before and talk.asked["tokenize"] == 0
    second("one new text")
    assert server.tokenized == before + 1 and talk.asked["tokenize"] == 1


def test_the_cache_is_kept_per_server_model(serve: Any, tmp_path: Path) -> None:
    first = serve(Llama("Smol-135M"))
    counted = server_counter(backend(first), tmp_path)
    counted("same text")
    counted.store.flush()
    other = serve(Llama("Mistral-Nemo"))
    talk = backend(other)
    counter = server_counter(talk, tmp_path)
    counter("same text")
    counter.store.flush()
    assert talk.asked["tokenize"] == 3  # the additions and the text: the other model's counts are not its
    assert len(list(tmp_path.glob("*.counts"))) == 2


def test_count_many_asks_each_new_text_once(serve: Any, tmp_path: Path) -> None:
    server = serve(Vllm())
    counter = server_counter(backend(server), tmp_path)
    texts = [f"text number {i % 40}" for i in range(100)]
    before = server.tokenized
    assert counter.count_many(texts) == [toy_count(t) for t in texts]
    assert server.tokenized == before + 40
    assert [counter(t) for t in texts] == [toy_count(t) for t in texts]
    assert server.tokenized == before + 40
    assert cache_file(tmp_path, backend(server).server().identity).stat().st_size > 40 * counts.RECORD.size


def test_an_unwritable_cache_still_counts(serve: Any, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    counter = server_counter(backend(serve(Llama())), blocked / "counts")
    assert counter("a b c") == 5
    counter.store.flush()  # nothing raised: the cache stays empty


def _store(folder: Path) -> CountStore:
    return CountStore(folder, "the model")


def test_a_batch_cut_short_is_dropped_and_cut_off(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add({text_key("a"): 1, text_key("b"): 2})
    store.flush()
    with open(store.path, "ab") as file:  # a run killed mid-write
        file.write(counts.HEAD.pack(counts.BATCH, 0, 5, 0) + b"\x00" * 30)
    reread = _store(tmp_path)
    assert (reread.get(text_key("a")), reread.get(text_key("b"))) == (1, 2)
    reread.add({text_key("c"): 3})
    reread.flush()
    final = _store(tmp_path)
    assert (final.get(text_key("a")), final.get(text_key("c"))) == (1, 3)
    assert counts._batches(store.path.read_bytes())[1] == store.path.stat().st_size  # whole batches only


def test_a_damaged_batch_is_not_believed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add({text_key("a"): 1})
    store.flush()
    store.add({text_key("b"): 2})
    store.flush()
    data = bytearray(store.path.read_bytes())
    data[-1] ^= 0xFF  # the second batch's last count byte
    store.path.write_bytes(bytes(data))
    reread = _store(tmp_path)
    assert reread.get(text_key("a")) == 1 and reread.get(text_key("b")) is None


def test_a_file_that_is_not_a_cache(tmp_path: Path) -> None:
    path = cache_file(tmp_path, "the model")
    path.write_bytes(b"\x00garbage" * 100)
    store = _store(tmp_path)
    assert store.counts == {}
    store.add({text_key("a"): 1})
    store.flush()
    assert _store(tmp_path).get(text_key("a")) == 1  # rewritten whole


def test_the_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "BOUND", 100)
    old = _store(tmp_path)
    for i in range(10):
        old.add({text_key(f"old {i} {j}"): j for j in range(20)})
        old.flush()
    run = _store(tmp_path)
    assert run.records <= 100
    mine = {text_key(f"mine {j}"): j for j in range(30)}
    run.add(mine)
    run.flush()
    for i in range(4):  # more batches of this run (50 in all, BOUND // 2): each keeps what this run used
        run.add({text_key(f"more {i} {j}"): j for j in range(5)})
        run.flush()
    kept = _store(tmp_path)
    assert kept.records <= 100
    assert all(kept.get(key) == count for key, count in mine.items())
    assert kept.get(text_key("old 0 0")) is None  # the oldest went first


def _append_batches(folder: str, worker: int) -> None:
    store = CountStore(Path(folder), "shared model")
    for batch in range(30):
        store.add({text_key(f"{worker} {batch} {j}"): worker * 1000 + j for j in range(7)})
        store.flush()


def test_runs_at_once_do_not_corrupt_the_cache(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_batches, args=(str(tmp_path), w)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)  # a hang guard only: four processes on a busy machine
        assert worker.exitcode == 0
    path = cache_file(tmp_path, "shared model")
    found, end, records = counts._batches(path.read_bytes())
    assert end == path.stat().st_size and records == len(found) == 4 * 30 * 7
    assert found[text_key("3 29 6")] == 3006


def test_a_large_cache_is_read_a_batch_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 counts (2 MB) are read a batch at a time, never a record at a time: one unpacking
    (in C) a batch, so the Python work is the number of batches (a few milliseconds here)."""
    store = _store(tmp_path)
    for i in range(10):
        store.add({text_key(f"text {i} {j}"): j for j in range(10_000)})
    store.flush()
    unpacked: list[int] = []
    record = counts.RECORD

    class Counted:
        size = record.size

        def iter_unpack(self, body: bytes) -> Iterator[tuple[bytes, int]]:
            unpacked.append(len(body) // record.size)
            return record.iter_unpack(body)

    monkeypatch.setattr(counts, "RECORD", Counted())
    assert len(_store(tmp_path).counts) == 100_000
    assert unpacked == [10_000] * 10


def test_the_counter_is_a_token_counter(serve: Any, tmp_path: Path) -> None:
    counter = server_counter(backend(serve(Llama())), tmp_path)
    assert isinstance(counter, ServerCounter)
    assert counter.bound("a b") == counter("a b") == 3
    assert counter.calls == 1


def test_a_run_that_finds_the_file_compacted_under_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counts, "BOUND", 40)
    seen_early = _store(tmp_path)  # opened before the other run compacts
    other = _store(tmp_path)
    for i in range(6):
        other.add({text_key(f"other {i} {j}"): j for j in range(10)})  # compacts on the way
    seen_early.add({text_key("late"): 99})
    final = _store(tmp_path)
    assert final.get(text_key("late")) == 99 and final.get(text_key("other 5 9")) == 9
    path = cache_file(tmp_path, "the model")
    assert counts._batches(path.read_bytes())[1] == path.stat().st_size


def test_a_second_build_from_one_process_asks_nothing(serve: Any, tmp_path: Path) -> None:
    """Each count is in the file as soon as it is counted: a build in the same process (a
    replay, a test's CliRunner) finds it without any end-of-run flush."""
    server = serve(Llama())
    server_counter(backend(server), tmp_path)("counted once")
    before = server.tokenized
    talk = backend(server)
    assert server_counter(talk, tmp_path)("counted once") == 3
    assert talk.asked["tokenize"] == 0 and server.tokenized == before
    server_counter(backend(server), tmp_path)("not yet counted")
    assert server.tokenized == before + 1  # the one new text: what the server adds was kept too


def test_a_second_ctx_build_sends_no_tokenize_request(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import CASE4, run

    server = serve(Llama())
    argv = ("build", CASE4, "--tokenizer", "server", "--server", server.url, "--window", "100000")
    code, first, _ = run(capsys, *argv)
    assert code == 0 and first
    asked = server.tokenized
    assert asked > 10
    code, second, _ = run(capsys, *argv)
    assert (code, second) == (0, first)
    assert server.tokenized == asked
    code, out, err = run(
        capsys, "inspect", CASE4, "--tokenizer", "server", "--server", server.url, "--window", "100000"
    )
    assert code == 0 and f"server {server.url.removesuffix('/v1')} (llama.cpp, Smol-135M.gguf)" in out + err
    assert server.tokenized == asked


# exact by default: a server the user named counts, with no tokenizer of their own ----------------


def test_a_named_server_counts_by_default(serve: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Issue 26: `--server`, or `[summarize] url` in the config, with no tokenizer set, counts with
    the server and takes its window; inspect then names the server's count, not OpenAI's."""
    from conftest import CASE4, run

    server = serve(RoomyLlama())
    config = tmp_path / "config.toml"
    config.write_text(f'[summarize]\nurl = "{server.url}"\n', encoding="utf-8")
    for named in (("--server", server.url), ("--config", str(config))):
        code, out, err = run(capsys, "inspect", CASE4, *named, "--json")
        facts = json.loads(out)
        assert code == 0, err
        assert facts["tokenizer"].startswith("server ") and facts["tokenizer_is_the_models"], facts["tokenizer"]
        assert facts["window"] == RoomyLlama.window, facts["window"]
    assert server.tokenized > 0
    code, out, _ = run(capsys, "inspect", CASE4, "--server", server.url)
    assert code == 0 and "OpenAI's count" not in out


def test_a_tokenizer_of_the_user_s_asks_the_server_nothing(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import CASE4, run

    server = serve(Llama())
    code, out, err = run(capsys, "inspect", CASE4, "--server", server.url, "--tokenizer", "cl100k_base", "--json")
    assert code == 0, err
    assert json.loads(out)["tokenizer"] == "cl100k_base"
    assert sum(server.seen.values()) == 0


@pytest.mark.parametrize("dialect", [Ollama, Gateway])
def test_a_named_server_that_cannot_count(
    serve: Any, capsys: pytest.CaptureFixture[str], dialect: type[Dialect]
) -> None:
    """A server with no tokenize endpoint leaves OpenAI's count, and inspect says it is that."""
    from conftest import CASE4, run

    server = serve(dialect())
    code, out, err = run(capsys, "inspect", CASE4, "--server", server.url)
    assert code == 0, err
    assert "OpenAI's count, not your model's" in out + err


def test_a_named_server_that_is_down_says_how_to_count_without_it(capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import CASE4, run

    code, out, err = run(capsys, "build", CASE4, "--server", "http://127.0.0.1:9/v1")
    assert code == ExitStatus.ERROR and out == ""
    line = err.strip()
    assert "\n" not in line and "ctx counts with the model server you named" in line
    assert "--tokenizer cl100k_base" in line


# a chat counted as the model is given it ------------------------------------------------------


def test_a_chat_is_counted_as_the_server_templates_it(serve: Any, tmp_path: Path) -> None:
    server = serve(TemplatingLlama())
    counter = server_counter(backend(server), tmp_path)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Mara: is the lamp lit?"}]
    expected = 1 + toy_count(chatml(chat))  # its BOS, then the templated prompt
    assert counter.chat(chat) == expected
    asked = server.seen["/apply-template"]
    assert counter.chat([dict(m) for m in chat]) == expected and server.seen["/apply-template"] == asked  # kept
    per, priming = counter.chat_overhead or (0, 0)
    assert per == toy_count("<|im_start|>user\n<|im_end|>\n") and priming >= toy_count("<|im_start|>assistant\n")


def test_a_server_without_a_template_endpoint_counts_by_the_rule(serve: Any, tmp_path: Path) -> None:
    server = serve(Llama())
    counter = server_counter(backend(server), tmp_path)
    assert counter.chat([{"role": "user", "content": "Hi"}]) is None
    assert counter.chat([{"role": "user", "content": "Hello"}]) is None
    assert server.seen["/apply-template"] == 1 and counter.chat_overhead is None  # asked once


def test_a_built_chat_is_exactly_what_the_server_counts(serve: Any, tmp_path: Path) -> None:
    from otaku_ctx.build import Pipeline
    from otaku_ctx.config import ContextSettings, ModelSettings, Settings
    from otaku_ctx.story.model import Message, Story

    server = serve(TemplatingLlama())
    counter = server_counter(backend(server), tmp_path)
    lines = [Message(i, "user" if i % 2 else "assistant", f"Line {i}: the lamp burns low tonight. " * 3)
             for i in range(1, 11)]  # fmt: skip
    story = Story(path=Path("chat"), messages=tuple(lines), system="You are the keeper.", source_format="openai")
    settings = Settings(model=ModelSettings(window=1200), context=ContextSettings(reserve_default=100))
    built = Pipeline(settings, emit="messages", count=counter).build(story)
    assert built.prompt is not None
    sent = json.loads(built.prompt)
    assert built.assembly.tokens == counter.chat(sent) == 1 + toy_count(chatml(sent)) <= 1100
    assert built.assembly.tokens > sum(toy_count(m["content"]) + 4 for m in sent) + 3  # more than OpenAI's rule says


# serve: a turn whose count the server fails is counted with a margin, and answered ------------


@pytest.mark.parametrize("failure", ["500", "junk", "timeout"])
def test_serve_answers_a_turn_the_tokenize_endpoint_fails_with_one_call_and_a_margin(
    serve: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    """llama.cpp's /tokenize answers 500, a reply with no count, or nothing in time, from the
    second turn on: each of those turns asks it once, is counted by cl100k_base with a margin,
    and is answered, not a 502 (issue 45: every turn failed); the log says why once. When the
    endpoint is back, the next turn counts with the server again."""
    import time
    from dataclasses import replace

    import openai

    from otaku_ctx.config import load_settings
    from otaku_ctx.model import resolve
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running

    monkeypatch.setattr(resolve, "COUNT_TIMEOUT", 0.5)
    dialect = Llama()
    server = serve(dialect)
    counts = dialect.tokenize
    settings = load_settings(None, {})
    settings = replace(settings, serve=replace(settings.serve, backend=server.url, port=0, summarize=False))
    running = Running(Service(settings))
    talk = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=30)
    chat = [{"role": "system", "content": "You are Mira."}, {"role": "user", "content": "Hello there."}]

    def turn(said: str) -> str:
        chat.append({"role": "assistant", "content": "llama.cpp says hello"})
        chat.append({"role": "user", "content": said})
        before = server.tokenized
        reply = talk.chat.completions.create(model="m", messages=chat, max_tokens=20)
        assert reply.choices[0].message.content == "llama.cpp says hello"
        return f"{server.tokenized - before}"  # the tokenize calls it made

    def failing(body: dict[str, Any]) -> Any:
        if failure == "timeout":
            time.sleep(1.5)
            return counts(body)
        return {"tokens": "many"}

    try:
        assert turn("A first turn, counted by the server.") != "0"
        if failure == "500":
            server.broken = 500
        else:
            dialect.tokenize = failing  # type: ignore[method-assign]
        asked = [turn(f"Turn {n}: the lamp is lit again, and the tide is high.") for n in range(3)]
        server.broken = None
        dialect.tokenize = counts  # type: ignore[method-assign]
        back = turn("The endpoint is back: this is counted by the server.")
    finally:
        running.stop()
    assert asked == ["1"] * 3, asked  # one failed call a turn, however many texts are new
    assert back != "0"
    said = [r.getMessage() for r in caplog.records if "counting with cl100k_base and a margin" in r.getMessage()]
    assert len(said) == 1, said


# a cold turn: its new texts counted in a batch or a few ---------------------------------------


class StripsBeside(Llama):
    """A llama.cpp whose EOS strips the blanks beside it (a control token's `lstrip`/`rstrip`):
    a text joined to another by it does not count as it counts alone."""

    def tokenize(self, body: dict[str, Any]) -> Any:
        return super().tokenize({**body, "content": re.sub(r"\s*(<\|im_end\|>)\s*", r"\1", body["content"])})


def test_a_batch_counts_each_text_as_it_counts_alone(serve: Any, tmp_path: Path) -> None:
    """Texts joined by the server's EOS, one request: each count is the text's own, a text that
    spells the EOS asked alone; a server whose EOS strips the blanks beside it is not batched,
    and counts the same one text at a time."""
    many = [*TEXTS, " leading", "trailing ", "\n\nlines\n", "x <|im_end|> y"] * 3
    for dialect, batches in ((Llama(), True), (StripsBeside(), False)):
        server = serve(dialect)
        counter = server_counter(backend(server), tmp_path / dialect.__class__.__name__)
        before = server.tokenized
        counts = counter.count_many(many)
        alone = [dialect.tokenize({"content": t, "add_special": False, "parse_special": True}) for t in many]
        assert counts == [len(a["tokens"]) for a in alone]
        asked = server.tokenized - before
        assert (asked < 12) is batches, asked  # the probe, the separator, a batch, the text with the EOS


def test_serve_counts_a_cold_turn_s_new_texts_in_a_few_requests(serve: Any) -> None:
    """A 160-message chat's first turn, through serve counting with llama.cpp's /tokenize: a dry
    run gathers the texts the count cache lacks and one request counts them all (issue 45: 149
    requests one after another, not answered in 75 s at 0.5 s each). What it sends is what
    counting one text at a time sends."""
    from dataclasses import replace

    import openai

    from otaku_ctx.config import load_settings
    from otaku_ctx.serve.http import Service
    from otaku_ctx.serve.listen import Running

    chat = [{"role": "system", "content": "You are Mira, a sailor."}]
    for i in range(160):
        said = f"Line {i}: the boat drifts past pier {i}, and Tom waves to Mira. It rains."
        chat.append({"role": ("user", "assistant")[i % 2], "content": said})
    chat.append({"role": "user", "content": "What now?"})
    sent, asked = [], []
    for dialect in (Llama(), StripsBeside("Other-135M")):  # the second counts one text at a time
        server = serve(dialect)
        settings = load_settings(None, {})
        settings = replace(settings, serve=replace(settings.serve, backend=server.url, port=0, summarize=False))
        running = Running(Service(settings))
        talk = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=30)
        try:
            short = [{"role": "system", "content": "Another."}]  # serve set up, its batches tried
            short += [{"role": ("user", "assistant")[i % 2], "content": f"Short line {i}."} for i in range(7)]
            talk.chat.completions.create(model="m", messages=short, max_tokens=20)
            before = server.tokenized
            talk.chat.completions.create(model="m", messages=chat, max_tokens=20)
            asked.append(server.tokenized - before)
        finally:
            running.stop()
        sent.append(server.dialect.last)
    assert asked[0] <= 5 < asked[1], asked
    assert sent[0] == sent[1]
