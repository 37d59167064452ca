"""A stand-in embeddings server for the fast suite: OpenAI's `POST /v1/embeddings` and Ollama's
`POST /api/embed`, whose "model" maps each text to counts of its concepts — words of one
meaning share a concept ("mom" and "mother", "dinner", "ate" and "meal"), so a paraphrase is
near its original as a real embedding model makes it, and a word alone is its own concept. Its
failures come on cue (`mode`): "404" (no such endpoint), "500", "nan", "dims" (the second
vector one number short), "few" (one vector fewer than asked), "slow" (waits `delay`).

The real embedding model is tests/realserver's (setup.sh); this one makes the mechanics and
every fallback testable offline."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from typing import Any

from loopback import JSONHandler, QuietServer

DIMENSIONS = 64
CONCEPTS = {
    "mother": ("mom", "mother", "mum", "mama"),
    "meal": ("dinner", "supper", "meal", "ate", "eat", "eating", "dined", "food"),
    "boat": ("boat", "ferry", "ship", "vessel"),
    "sister": ("sister", "sibling"),
    "estonia": ("tallinn", "estonia", "estonian"),
    "moved": ("moved", "relocated", "went"),
    "night": ("night", "evening", "tonight"),
}
CONCEPT_OF = {word: concept for concept, words in CONCEPTS.items() for word in words}
STOP = {"the", "a", "an", "and", "of", "to", "with", "was", "that", "what", "did", "we", "my", "i", "in", "it", "at"}


def vector_of(text: str) -> list[float]:
    """Each concept the text holds adds 1 at its place (a word of no listed meaning is its own)."""
    vector = [0.0] * DIMENSIONS
    for word in re.findall(r"[a-z]+", text.lower()):
        if word in STOP:
            continue
        concept = CONCEPT_OF.get(word, word)
        vector[int(hashlib.md5(concept.encode()).hexdigest(), 16) % DIMENSIONS] += 1.0
    vector[-1] += 0.01  # never all zeros
    return vector


class Embedder(QuietServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = ""
        self.delay = 0.0
        self.asked: list[list[str]] = []  # each request's texts
        self.lock = threading.Lock()


class _Handler(JSONHandler):
    server: Embedder
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._send(404, {"error": {"message": "no such endpoint"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        stand_in = self.server
        if self.path not in ("/v1/embeddings", "/api/embed") or stand_in.mode == "404":
            self._send(404, {"error": {"message": "no such endpoint"}})
            return
        body = json.loads(raw)
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        with stand_in.lock:
            stand_in.asked.append(texts)
        if stand_in.mode == "slow":
            time.sleep(stand_in.delay)
        if stand_in.mode == "500":
            self._send(500, {"error": {"message": "embedding failed"}})
            return
        vectors: list[list[Any]] = [vector_of(t) for t in texts]
        if stand_in.mode == "nan":
            vectors[0][0] = float("nan")
        elif stand_in.mode == "dims" and len(vectors) > 1:
            vectors[1] = vectors[1][:-1]
        elif stand_in.mode == "few":
            vectors = vectors[:-1]
        if self.path == "/api/embed":
            self._send(200, {"model": body["model"], "embeddings": vectors})
            return
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        self._send(200, {"object": "list", "data": data, "model": body["model"]})

    def _send(self, status: int, data: object) -> None:
        body = json.dumps(data, allow_nan=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
