"""A model server's bad replies: trickled a byte at a time, far past max_tokens, holding a lone
surrogate, JSON nested 100,000 deep or of more items than any answer holds. Each ends in one
line naming the URL, an exit code, and no traceback, and none is held whole."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_backend
from ctx_run import ctx, one_line
from test_backend import StandIn, reply

from otaku_ctx.status import ExitStatus

server = test_backend.server  # the backend tests' stand-in, as a fixture here too


# -- #3: a server that trickles its reply (slowloris) ----------------------------------------


def trickle(sent: list[int], gap: float) -> Callable[..., None]:
    """A whole, valid reply: its status line at once, then a byte every `gap` seconds (each
    well within the client's timeout); counts the bytes sent, stops when the client hangs up
    or the test ends (a hang guard)."""
    content = json.dumps({"choices": [{"message": {"content": "Hello there, Mara."}, "finish_reason": "stop"}]})
    body = content.encode()
    head = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def respond(handler: Any) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        handler.wfile.flush()
        sent.append(17)
        for byte in head + body:
            if handler.server.released.wait(gap):
                return
            try:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            except OSError:
                return
            sent.append(1)
        handler.close_connection = True

    sent.append(0)
    respond.total = 17 + len(head) + len(body)  # type: ignore[attr-defined]
    return respond


def test_a_reply_trickled_a_byte_at_a_time_ends_at_the_timeout(server: StandIn) -> None:
    """`timeout` bounds the whole reply, not each read: a server sending a byte every 0.2 s (a
    socket's timeout of 0.5 s never passes between two) is given up on at 0.5 s, long before
    its last byte; it is not retried. Counted: the bytes and the reads that came, not the time."""
    from otaku_ctx.backend import Backend, Retry, TimedOut

    sent: list[int] = []
    slow = trickle(sent, 0.2)
    server.answer(slow)
    waits: list[float] = []
    backend = Backend(server.url, "m", timeout=0.5, connect_timeout=0.5, retry=Retry(cap=0.2, sleep=waits.append))
    with pytest.raises(TimedOut) as caught:
        backend.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.2)
    message = str(caught.value)
    assert message.startswith(f"{server.url}/chat/completions: the reply was not whole within 0.5 s (")
    found = re.search(r"\((\d+) bytes came, in (\d+) reads", message)
    assert found is not None, message
    got, reads = int(found[1]), int(found[2])
    total = slow.total  # type: ignore[attr-defined]
    assert 17 <= got < total and 1 <= reads <= got  # what came, a read a byte or so, never the whole
    assert len(server.seen) == 1 and waits == []  # asked once: a timeout is not retried
    server.released.set()
    assert sum(sent) < total


def test_a_trickled_reply_to_summarize_is_one_line(server: StandIn, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[summarize]\ntimeout = 0.5\nwindow = 8192\n", encoding="utf-8")
    sent: list[int] = []
    server.answer(trickle(sent, 0.2))
    chat = tmp_path / "chat.jsonl"
    from test_summarize import sillytavern_chat

    sillytavern_chat(chat, 120)
    code, out, err = ctx("summarize", chat, "--url", server.url, "--model", "m", "--config", config)
    assert (code, out) == (ExitStatus.ERROR, "")
    # the first request (the model list --model is checked against, then the summary) is given up
    said = one_line(err)
    assert "/models: " in said or "/chat/completions: " in said, said
    assert "the reply was not whole within 0.5 s (" in said
    assert len(server.seen) == 1


# the summarizer's stand-in (tests/test_summarize.py): scripted reply texts, every request logged


@pytest.fixture
def summarizer() -> Iterator[Any]:
    from test_summarize import StandIn as Summarizer

    stand_in = Summarizer().start(poll=0.005)
    yield stand_in
    stand_in.stop()


def summarize_chat(tmp_path: Path, summarizer: Any, n: int = 120, *more: str | Path) -> tuple[int, str, str, Path]:
    from test_summarize import sillytavern_chat

    chat = sillytavern_chat(tmp_path / "chat.jsonl", n)
    code, out, err = ctx("summarize", chat, "--url", summarizer.url, "--model", "m", "--window", "8192", *more)
    return code, out, err, chat


# -- #4: a reply far past max_tokens ---------------------------------------------------------


@pytest.mark.deep
def test_a_reply_far_past_max_tokens_is_turned_down_and_never_held_whole(tmp_path: Path, summarizer: Any) -> None:
    """Each reply holds a title, a summary and a history of 1 MiB each (a server that ignores
    `max_tokens`): only `summary_words` × 12 characters of it are read, which still run far past
    the words asked, so every scene is written as an extract, and the sidecar stays small."""
    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

    mib = " ".join(f"Mara {i} sees {i} row {i} turn {i}." for i in range(40_000))[: 1 << 20]
    summarizer.replies = [json.dumps({"title": mib, "summary": mib, "history": mib})] * 20
    code, _, err, chat = summarize_chat(tmp_path, summarizer, 120, "--debug")
    assert code == 0, err
    assert "runs on past the words asked" in err
    records = read_sidecar(sidecar_for(chat))
    assert len(records) >= 3 and all(r.history for r in records)
    assert all(r.model == "ctx extract" and "Mara 1 sees" not in r.summary + r.title + r.history for r in records)
    assert sidecar_for(chat).stat().st_size < len(records) * 10_000  # not 4 MiB for 2 scenes


@pytest.mark.deep
def test_a_title_far_past_max_tokens_is_cut_at_a_word(tmp_path: Path, summarizer: Any) -> None:
    """A reply whose summary and history are good and whose title is 1 MiB long: the title is
    taken up to 120 characters, cut at a word and ended with "…"."""
    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

    mib = " ".join(f"Mara {i} sees the lamp {i}." for i in range(60_000))[: 1 << 20]
    told = (
        "The Keeper and Mara watch the lamp turn at the top of the tower while the tide comes in over the rocks "
        "below; row by row they talk of the lamp and the tide, and at the end of it nothing is decided."
    )
    summarizer.replies = [json.dumps({"title": mib, "summary": told, "history": told})] * 20
    code, _, err, chat = summarize_chat(tmp_path, summarizer)
    assert code == 0, err
    records = read_sidecar(sidecar_for(chat))
    assert len(records) >= 3
    for r in records:
        assert r.summary == told and r.model == "m"
        assert len(r.title) <= 120 and r.title.endswith("…") and mib.startswith(r.title[:-1])


def test_bounded_cuts_at_a_word() -> None:
    from otaku_ctx.summarize.replies import bounded

    assert bounded("short enough", 20) == "short enough"
    assert bounded("Mara climbs the tower stairs", 20) == "Mara climbs the…"
    assert bounded("x" * 50, 20) == "x" * 19 + "…"


# -- #17: a reply holding a lone surrogate ---------------------------------------------------


@pytest.mark.parametrize("where", ["in the reply's content", "in the JSON the content holds"])
def test_a_lone_surrogate_in_a_reply_never_reaches_the_sidecar(tmp_path: Path, summarizer: Any, where: str) -> None:
    """JSON's `\\ud800` with no pair is no Unicode: replaced by U+FFFD where the reply is read,
    the run goes on, and the sidecar is UTF-8 (never "check the story's text": the story is fine)."""
    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

    told = (  # long enough for its scene (checks.brief)
        " Row by row the lamp turns above them and the tide comes in over the rocks below the tower, and Mara "
        "and the Keeper watch the lamp turn and the tide come in."
    )
    summary = "Mara climbs the tower stairs \ud800 at dusk with the keeper." + told
    if where == "in the reply's content":  # the stand-in's own json.dumps escapes it: `\ud800` in the body
        summarizer.replies = ['{"title": "Stairs", "summary": "' + summary + '"}']
    else:  # escaped in the content: `\\ud800` in the body
        summarizer.replies = [json.dumps({"title": "Stairs", "summary": summary})]
    code, _, err, chat = summarize_chat(tmp_path, summarizer)
    assert code == 0, err
    sidecar_for(chat).read_bytes().decode("utf-8")  # strict: no surrogate was written
    first = read_sidecar(sidecar_for(chat))[0]
    assert first.summary == "Mara climbs the tower stairs \ufffd at dusk with the keeper." + told


# -- #10: JSON from the server nested 100,000 deep -------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_a_reply_nested_100_000_deep_is_a_bad_reply(server: StandIn) -> None:
    from otaku_ctx.backend import Backend, BadReply, Retry, ServerError

    backend = Backend(server.url, "m", timeout=5, connect_timeout=5, retry=Retry(attempts=0))
    asked = {"role": "user", "content": "Hi"}
    server.answer(reply(200, DEEP))
    with pytest.raises(BadReply, match="a reply whose JSON nests too deep to read") as caught:
        backend.chat([asked], max_tokens=8, temperature=0.2)
    assert str(caught.value).startswith(f"{server.url}/chat/completions: ")
    server.answer(reply(500, b'{"error": ' + DEEP + b"}"))  # an error reply: its words, as they are
    with pytest.raises(ServerError, match="500 Internal Server Error") as error:
        backend.chat([asked], max_tokens=8, temperature=0.2)
    assert "\n" not in str(error.value) and len(str(error.value)) < 600
    server.answer(reply(200, DEEP))  # a probe (a tokenize endpoint, here)
    with pytest.raises(BadReply, match="nests too deep") as probed:
        backend.tokenize("Hi")
    assert str(probed.value).startswith(f"{server.url.removesuffix('/v1')}/tokenize: ")


@pytest.mark.parametrize(
    ("depth", "said"),
    [
        (5_000, "a reply whose JSON nests too deep"),  # past what json recurses into
        (100_000, "a reply whose text holds JSON of more than 10,000 items"),  # refused before it is read
    ],
)
def test_a_reply_whose_text_nests_100_000_deep_is_one_line_naming_the_url(
    tmp_path: Path, summarizer: Any, depth: int, said: str
) -> None:
    summarizer.replies = ['{"summary": ' + "[" * depth]
    code, out, err, _ = summarize_chat(tmp_path, summarizer)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(f"ctx: {summarizer.url}/chat/completions: {said}")


# -- also found: a 60 MB reply of [{},{},…] took 1.66 GB and 22 s to decode --------------------

# the issue's shape at a tenth of its size: 4.2 million items (each `{` and `,`), 6.3 MB
MANY = b"[" + b"{}," * 2_100_000 + b"{}]"
TOO_MANY = "a reply whose JSON holds more than 4,000,000 items (values, keys and containers); no answer holds so many"
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}


def _with_junk(answer: dict[str, Any], junk: bytes) -> bytes:
    """`answer` as JSON with one more member, `"junk"`, holding `junk` as it is."""
    return json.dumps(answer).encode()[:-1] + b', "junk": ' + junk + b"}"


def test_a_reply_of_more_items_than_any_answer_is_refused_naming_the_url(server: StandIn) -> None:
    """A chat reply, a tokenize reply (a probe) and an error body, each an answer with millions of
    `{}` beside it: the first two are a bad reply naming the URL, the error body's words are
    shown as they are (cut to one line), and none of them is decoded."""
    from otaku_ctx.backend import Backend, BadReply, Retry, ServerError
    from otaku_ctx.backend.failures import QUOTE

    backend = Backend(server.url, "m", timeout=30, connect_timeout=5, retry=Retry(attempts=0))
    asked = {"role": "user", "content": "Hi"}
    server.answer(reply(200, _with_junk(ANSWER, MANY)))
    with pytest.raises(BadReply) as caught:
        backend.chat([asked], max_tokens=8, temperature=0.2)
    assert str(caught.value).startswith(f"{server.url}/chat/completions: {TOO_MANY}: ")
    server.answer(reply(200, _with_junk({"tokens": [1, 2]}, MANY)))
    with pytest.raises(BadReply) as probed:
        backend.tokenize("Hi")
    assert str(probed.value).startswith(f"{server.url.removesuffix('/v1')}/tokenize: {TOO_MANY}")
    server.answer(reply(500, _with_junk({"error": {"message": "the server is busy"}}, MANY)))
    with pytest.raises(ServerError) as error:
        backend.chat([asked], max_tokens=8, temperature=0.2)
    said = str(error.value)
    assert said.startswith(f'{server.url}/chat/completions: 500 Internal Server Error: {{"error": {{"message": "the')
    assert "\n" not in said and "[{},{},{}" in said and len(said) < 2 * QUOTE + 100


def test_a_fair_reply_whose_text_is_full_of_braces_is_read(server: StandIn) -> None:
    """5 million braces, commas and quotes, every one in the reply's text: the rough count is
    past the bound, the exact one (strings left out) is not."""
    from otaku_ctx.backend import Backend, Retry

    text = '{}",' * 2_500_000
    server.answer(reply(200, {**ANSWER, "choices": [{**ANSWER["choices"][0], "message": {"content": text}}]}))
    backend = Backend(server.url, "m", timeout=30, connect_timeout=5, retry=Retry(attempts=0))
    assert backend.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.2).text == text


def test_a_reply_s_text_of_more_items_than_asked_is_one_line_naming_the_url(tmp_path: Path, summarizer: Any) -> None:
    """The JSON asked for holds five items (a title and a summary); 12,000 is a server that
    ignored the schema and `max_tokens`, refused before its text is decoded."""
    summarizer.replies = ['{"summary": [' + "{}," * 6_000 + "{}]}"]
    code, out, err, _ = summarize_chat(tmp_path, summarizer)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(
        f"ctx: {summarizer.url}/chat/completions: a reply whose text holds JSON of more than 10,000 items;"
        " the JSON asked holds five: "
    )


def test_the_work_on_a_reply_s_text_is_bounded_by_its_size() -> None:
    """A reply cut off mid-way is closed a character at a time: only up to 1 MiB of characters
    (`REPAIRED`; a reply cut at `max_tokens` is a few thousand tokens). A text is prose by its
    first 1,000 words (`LOOKED`): a reply may be 64 MiB of them."""
    from otaku_ctx.summarize.replies import field_of, usable

    cut = '{"title": "T", "summary": "' + "Mara climbs the tower stairs. " * 1_000
    assert field_of(cut, "summary") == "Mara climbs the tower stairs. " * 999 + "Mara climbs the tower stairs."
    longer = cut + "Mara climbs the tower stairs. " * ((1 << 20) // 30)
    assert len(longer) > 1 << 20 and field_of(longer, "summary") is None
    assert usable("1 " * 997 + "Mara climbs stairs") == "1 " * 997 + "Mara climbs stairs"
    assert usable("1 " * 1_000 + "Mara climbs stairs") is None


@pytest.mark.deep
def test_the_issues_60_mb_reply_of_empty_objects_is_one_line(server: StandIn, tmp_path: Path, summarizer: Any) -> None:
    """The issue's own case, 60 MB of `[{},{},…]` (20 million dicts): as the reply's body, a
    bad reply naming the URL; as the JSON in a summary reply's text, the same from ctx
    summarize. benchmarks/hostile_bounds.py measures it."""
    from otaku_ctx.backend import Backend, BadReply, Retry

    issue = b"[" + b"{}," * 20_000_000 + b"{}]"
    server.answer(reply(200, issue))
    backend = Backend(server.url, "m", timeout=60, connect_timeout=5, retry=Retry(attempts=0))
    with pytest.raises(BadReply) as caught:
        backend.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.2)
    assert str(caught.value).startswith(f"{server.url}/chat/completions: {TOO_MANY}: ")
    summarizer.replies = ['{"summary": ' + issue.decode() + "}"]
    code, out, err, _ = summarize_chat(tmp_path, summarizer)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(f"ctx: {summarizer.url}/chat/completions: a reply whose text holds JSON of more")
