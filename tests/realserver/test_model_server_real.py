"""`--tokenizer server` against the real llama.cpp server (SmolLM2-135M-Instruct; see
conftest.py): its counts are `/tokenize`'s own, asked here by hand, for texts with emoji, CJK,
leading spaces and control tokens spelled or nearly spelled; what it adds to a prompt is what
`/tokenize` adds; its window is `/props`' `n_ctx` a slot; and a second counting of the same
texts sends no tokenize request, as a counting proxy of this test's own between ctx and the
server sees (llama-server does not log its /tokenize requests)."""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from otaku_ctx.backend import Backend, Retry
from otaku_ctx.model.server import JOIN_PROBE, server_counter

PIECES = [
    "Mara",
    " lights the lamp",
    "  two spaces",
    "\n\n",
    "漢字かな交じり",
    "🙂🌊",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_end|",
    "<|endoftext|>",
    "< |im_start|>",
    "[INST]",
    "<s>",
    " ",
    "Ilya's",
    "—",
    "\t",
    "42.",
]


def texts(seed: int = 18, n: int = 150) -> list[str]:
    pick = random.Random(seed)
    made = ["", " ", " leading space", "The lamp-room door creaks open."]
    made += ["".join(pick.choice(PIECES) for _ in range(pick.randint(1, 12))) for _ in range(n)]
    return made


def tokenize(url: str, text: str, *, add_special: bool) -> list[int]:
    """`/tokenize` asked by hand: the reference."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        body = json.dumps({"content": text, "add_special": add_special, "parse_special": True})
        connection.request("POST", "/tokenize", body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200
        return json.loads(answer.read())["tokens"]
    finally:
        connection.close()


class Proxy(ThreadingHTTPServer):
    """Forwards every request to the real server and counts them by path."""

    daemon_threads = True

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        parts = urlsplit(target)
        self.target = (parts.hostname or "", parts.port or 80)
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Forward(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True  # as tests/loopback.py: no delayed-ACK wait between headers and body
    server: Proxy

    def _any(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.seen[self.path] += 1
        connection = http.client.HTTPConnection(*self.server.target, timeout=60)
        try:
            connection.request(self.command, self.path, body=body or None, headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _any

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def proxy(real_server) -> Iterator[Proxy]:
    server = Proxy(real_server.url)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def talk(url: str) -> Backend:
    return Backend(url, "", timeout=60, retry=Retry(attempts=1, backoff=0.2))


def test_the_counts_are_tokenize_s_own(real_server, tmp_path: Path) -> None:
    counter = server_counter(talk(real_server.url), tmp_path)
    sample = texts()
    assert [counter(t) for t in sample] == [len(tokenize(real_server.url, t, add_special=False)) for t in sample]
    assert counter("<|im_start|>") == 1  # a control token spelled is the one token it is
    many = texts(seed=7)
    assert counter.count_many(many) == [len(tokenize(real_server.url, t, add_special=False)) for t in many]


def test_a_batch_counts_each_text_as_tokenize_counts_it_alone(real_server, tmp_path: Path) -> None:
    """The texts joined by SmolLM2's EOS in one /tokenize request: llama.cpp cuts the text at the
    control token and tokenizes each piece as a text of its own, so each count is the text's
    count alone (blanks at both ends, emoji, CJK, control tokens spelled and nearly spelled)."""
    backend = talk(real_server.url)
    sample = [t for t in texts(seed=5, n=300) if "<|im_end|>" not in t]
    assert backend.count_each(sample, "<|im_end|>") == [
        len(tokenize(real_server.url, t, add_special=False)) for t in sample
    ]
    assert server_counter(backend, tmp_path)._joins()  # and the counter believes its batches


def test_what_the_server_adds(real_server, tmp_path: Path) -> None:
    """SmolLM2's GGUF adds no BOS (`tokenizer.ggml.add_bos_token` false): /tokenize with
    add_special adds nothing to any text, and the counter says 0."""
    counter = server_counter(talk(real_server.url), tmp_path)
    added = {
        len(tokenize(real_server.url, t, add_special=True)) - len(tokenize(real_server.url, t, add_special=False))
        for t in texts(n=20)
        if t
    }
    assert added == {counter.added} == {0}
    assert counter.bos == "" and "<|im_end|>" in counter.specials  # it adds no BOS: none to leave to it
    assert counter.name == f"server {real_server.url.removesuffix('/v1')} (llama.cpp, SmolLM2-135M-Instruct.Q4_1.gguf)"


def test_the_window_is_n_ctx_a_slot(real_server) -> None:
    backend = talk(real_server.url)
    assert backend.server().window == backend.window() == real_server.context // real_server.slots


def test_a_second_counting_sends_no_tokenize_request(proxy: Proxy, tmp_path: Path) -> None:
    sample = texts(seed=3)
    first = server_counter(talk(proxy.url), tmp_path)
    counted = first.count_many(sample)
    asked = proxy.seen["/tokenize"]
    spelled = sum("<|im_end|>" in t for t in set(sample))  # a text that spells the separator, alone
    # the additions probe (two), the batches' probe (the separator, the probe joined and each of
    # its texts alone), one batch for all the rest
    assert asked == 2 + (2 + len(JOIN_PROBE)) + 1 + spelled
    first.store.flush()  # as at the end of the run

    backend = talk(proxy.url)
    second = server_counter(backend, tmp_path)
    assert [second(t) for t in sample] == counted
    assert proxy.seen["/tokenize"] == asked and backend.asked["tokenize"] == 0
    assert second("a text not counted before, 🙂") == len(
        tokenize(proxy.url, "a text not counted before, 🙂", add_special=False)
    )
    assert backend.asked["tokenize"] == 1


def test_the_server_counts_as_the_gguf_counter(real_server, tmp_path: Path) -> None:
    """The issue's promise: --tokenizer server and the model's GGUF file count alike."""
    from server import built

    from otaku_ctx.model.hf import gguf_counter

    by_file = gguf_counter(Path(built()[1]))
    by_server = server_counter(talk(real_server.url), tmp_path)
    sample = texts(seed=11)
    assert [by_server(t) for t in sample] == [by_file(t) for t in sample]
    assert by_server.added == by_file.added


def test_a_second_ctx_build_sends_no_tokenize_request(proxy: Proxy, tmp_path: Path) -> None:
    """Two `ctx build` processes with --tokenizer server: the second finds every count in the
    cache the first left, and prints the same prompt."""
    story = Path(__file__).resolve().parents[2] / "examples" / "lighthouse-case4.jsonl"
    env = {**os.environ, "OTAKU_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "otaku_ctx", "build", str(story), "--tokenizer", "server", "--server", proxy.url]
    first = subprocess.run([*argv, "--window", "4096"], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    asked = proxy.seen["/tokenize"]
    assert asked > 10
    second = subprocess.run([*argv, "--window", "4096"], capture_output=True, text=True, env=env, timeout=120)
    assert (second.returncode, second.stdout) == (0, first.stdout)
    assert proxy.seen["/tokenize"] == asked
