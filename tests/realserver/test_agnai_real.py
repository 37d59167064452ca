"""Agnai plays through `ctx serve` (issue 42): the 49 requests Agnai 1.0.27 really sent in a
played session (tests/fixtures/agnai-requests/, its README says what the user did; the stretches
are listed in tests/test_serve_agnai.py), sent in order through serve, with the defaults
(summaries written in the background), to the real llama-server (SmolLM2-135M-Instruct, two
slots of a 4,096-token window, `-c 8192 -np 2`).

Every request is answered 200; `/ctx/stats` shows one chat for each of the session's three
chats, each with all its turns, through the persona's renames, the edit, the deletes, Regenerate,
"Generate More" and Agnai's own trimming; and no forwarded prompt holds a user or assistant
message that its request did not. Each body goes as captured but for `max_tokens`, held to 32:
the reply's length is not what is tested, and the session's 300-token replies from a 135M model
on two busy cores would take the step most of an hour."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import frontend_session  # tests/realserver/conftest.py

from otaku_ctx.serve.listen import Running

SESSION = Path(__file__).resolve().parents[1] / "fixtures" / "agnai-requests" / "agnai-session.jsonl.gz"
#: the session's chats, by the numbers of their requests (tests/test_serve_agnai.py)
SHORT = (*range(1, 12), 23, 24, 25)
IMPORTED = (*range(12, 23), *range(27, 45))
REMNANT = (26, *range(45, 50))
REPLY = 32


def captured() -> list[dict[str, Any]]:
    with gzip.open(SESSION, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[Running, list[dict[str, Any]]]]:
    with frontend_session(tmp_path, 4096) as played:
        yield played


def test_agnai_plays_through_serve(serving: tuple[Running, list[dict[str, Any]]]) -> None:
    running, sent = serving
    url = urlsplit(running.url)
    statuses: dict[int, int] = {}
    for each in captured():
        body = {**each["body"], "max_tokens": min(each["body"]["max_tokens"], REPLY)}
        headers = {"Content-Type": "application/json", **each["headers"]}
        if each["authorization"] is not None:
            headers["Authorization"] = each["authorization"]
        before = len(sent)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        try:
            connection.request("POST", each["path"], json.dumps(body).encode(), headers)
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        statuses[each["turn"]] = answer.status
        assert answer.status == 200, f"request {each['turn']}: {answer.status} {data[:300]!r}"
        # the turn sent on (serve keeps Agnai's last message last), not a summary asked meanwhile
        [turn] = [b for b in sent[before:] if b["messages"][-1] == body["messages"][-1]]
        own = {m["content"] for m in body["messages"]}
        for m in turn["messages"]:
            if m["role"] in ("user", "assistant"):
                assert m["content"] in own, f"request {each['turn']}: {m['content'][:120]!r}"
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    connection.request("GET", "/ctx/stats")
    chats = json.loads(connection.getresponse().read())["chats"]
    connection.close()
    assert sorted(len(c["turns"]) for c in chats) == sorted(map(len, (SHORT, IMPORTED, REMNANT))), [
        (c["chat"], [t["messages"] for t in c["turns"]]) for c in chats
    ]
