"""Hostile round 4 (issue 28): a server URL no request can be sent to, the server's own words
holding terminal escapes, JSON from a server nested or sized past reason, `-o` onto a model
folder's own file, an Ollama manifest or blob that is a device, a chat template nested past
Python's own limits. Each ends in one line on stderr naming the file or URL, an exit code, and
no traceback."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_backend
from conftest import CASE3
from test_backend import StandIn, raw, reply

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal, progress
from otaku_ctx.status import ExitStatus


def ctx(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(io.BytesIO(), out, err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("ctx: ") and "Traceback" not in err, err
    return err


# -- #14: a server URL no request can be sent to ---------------------------------------------

BAD_URLS = {
    "a port out of range": ("http://127.0.0.1:99999/v1", "the port 99999 is not from 1 to 65535"),
    "a port that is not a number": ("http://127.0.0.1:abc/v1", "the port 'abc' is not a number"),
    "a port of 5,000 digits": ("http://127.0.0.1:" + "9" * 5000 + "/v1", "the port 99999999999999999999… is not"),
    "a broken IPv6 host": ("http://[::1/v1", "a host in [brackets] that is not an IPv6 address"),
    "an IPv6 host that is not one": ("http://[zz]/v1", "a host in [brackets] that is not an IPv6 address"),
    "a host label over 63 characters": (
        "http://" + "a" * 64 + ".example/v1",
        "a host name with a label over 63 characters",
    ),
    "an empty host label": ("http://a..example/v1", "a host name with an empty label"),
}


def _summarize_url(url: str, folder: Path) -> list[str]:
    return ["summarize", str(CASE3), "--url", url, "--model", "m"]


def _build_server(url: str, folder: Path) -> list[str]:
    return ["build", str(CASE3), "--tokenizer", "server", "--server", url]


def _config(section: str, key: str) -> Callable[[str, Path], list[str]]:
    def argv(url: str, folder: Path) -> list[str]:
        config = folder / "config.toml"
        config.write_text(f"[{section}]\n{key} = {json.dumps(url)}\n", encoding="utf-8")
        if section == "summarize":
            return ["summarize", str(CASE3), "--model", "m", "--config", str(config)]
        return ["build", str(CASE3), "--tokenizer", "server", "--config", str(config)]

    return argv


# where a server URL is given, as the command line gives it
URL_SOURCES: dict[str, Callable[[str, Path], list[str]]] = {
    "--url": _summarize_url,
    "--server": _build_server,
    "[summarize] url": _config("summarize", "url"),
    "[model] server": _config("model", "server"),
}


@pytest.mark.parametrize("source", URL_SOURCES)
@pytest.mark.parametrize("hostile", BAD_URLS)
def test_a_server_url_no_request_can_be_sent_to(source: str, hostile: str, tmp_path: Path) -> None:
    """One line naming the URL and what is wrong with it, before any request, a usage error
    (exit 2) named by its setting: never the ValueError or UnicodeError that `urlsplit`, its
    `port` and IDNA raise."""
    url, problem = BAD_URLS[hostile]
    code, out, err = ctx(*URL_SOURCES[source](url, tmp_path))
    assert (code, out) == (ExitStatus.USAGE, "")
    assert one_line(err).startswith(("ctx: --url: summarize.url: ", "ctx: --server: model.server: "))
    assert f": not a server's base URL ({problem}" in one_line(err)
    assert err.endswith("): give one like http://127.0.0.1:8080/v1\n") and len(err) < 400


@pytest.mark.parametrize("source", URL_SOURCES)
def test_a_password_in_a_server_url_is_never_shown(source: str, tmp_path: Path) -> None:
    """Neither in the URL's own error nor in a failure to reach it."""
    bad = "http://ilya:hunter2@127.0.0.1:99999/v1"
    code, _, err = ctx(*URL_SOURCES[source](bad, tmp_path))
    assert code == ExitStatus.USAGE and ": http://127.0.0.1:99999/v1: not a server's" in one_line(err)
    assert "hunter2" not in err and "ilya" not in err


server = test_backend.server  # the backend tests' stand-in, as a fixture here too

# -- #9: the server's own words hold terminal escapes ----------------------------------------

STEERING = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
STEERS = set("\x1b\x07\x9b\u202e")


def test_a_server_error_holding_escapes_is_shown_not_obeyed(server: StandIn) -> None:
    """The server's message reaches stderr with each steering character shown as its escape."""
    server.answer(reply(401, {"error": {"message": f"no {STEERING} key"}}))
    code, out, err = ctx("build", CASE3, "--tokenizer", "server", "--server", server.url)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert f"{server.url}/models: 401 Unauthorized: no " in one_line(err)
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e key" in err
    assert not STEERS & set(err)


def test_a_reason_phrase_holding_escapes_is_shown_not_obeyed(server: StandIn) -> None:
    server.answer(raw(b"HTTP/1.1 401 \x1b]0;pwned\x07\r\nContent-Length: 0\r\n\r\n"))
    code, _, err = ctx("build", CASE3, "--tokenizer", "server", "--server", server.url)
    assert code == ExitStatus.ERROR
    assert "401 \\x1b]0;pwned\\x07" in one_line(err) and "\x1b" not in err


def test_a_file_name_holding_escapes_is_shown_not_obeyed(tmp_path: Path) -> None:
    named = tmp_path / "story\x1b[2J\n.jsonl"
    code, _, err = ctx("build", named)
    assert code == ExitStatus.ERROR
    assert "story\\x1b[2J\\x0a.jsonl" in one_line(err) and "\x1b" not in err


def test_a_reply_said_on_stderr_is_one_visible_line() -> None:
    """`say`, the one way words reach stderr (`summarize --debug`'s rejected replies too): the
    reply's line breaks and escapes shown, printable text as it is."""
    err = io.StringIO()
    Terminal(io.BytesIO(), io.BytesIO(), err).say(f"ctx: rejected: Ilya — «{STEERING}»\nline two\r\tend")
    assert err.getvalue() == (
        "ctx: rejected: Ilya — «\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e»\\x0aline two\\x0d\\x09end\n"
    )


def test_a_progress_phase_naming_a_hostile_file_is_shown_not_obeyed() -> None:
    """The bar's phase names the story file: its `[/b]` is no Rich markup (which raised a
    MarkupError in the bar's thread, and drew nothing) and its ESC no escape."""
    err = io.StringIO()
    with progress(Terminal(io.BytesIO(), io.BytesIO(), err, stderr_tty=True, progress_after=0.0)) as phase:
        phase(f"reading a[/b]{STEERING}.jsonl")
        for _ in range(100):  # until the bar has drawn (a hang guard of 5 s)
            if "reading" in err.getvalue():
                break
            time.sleep(0.05)
    assert "reading a[/b]\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e.jsonl" in err.getvalue()
    assert "\x1b]0;" not in err.getvalue() and not set("\x07\x9b\u202e") & set(err.getvalue())


def test_a_view_quoting_escapes_is_shown_not_obeyed() -> None:
    """`show` (inspect's tables, `config show`) shows what it quotes `visible`, line breaks kept."""
    from rich.table import Table

    from otaku_ctx.cli.terminal import serving, show

    table = Table("name")
    table.add_row(f"lamp {STEERING}")
    out = io.BytesIO()
    with serving(Terminal(io.BytesIO(), out, io.StringIO())):
        show(table)
    shown = out.getvalue().decode("utf-8")
    assert "lamp \\x1b]0;pwned" in shown and "\\x1b[2J\\x9b31m\\u202e" in shown and shown.count("\n") == 5
    assert not STEERS & set(shown)


# -- #2: `-o` onto a model folder's own file -------------------------------------------------


def model_folder(tmp_path: Path) -> Path:
    """A Hugging Face model folder: its tokenizer (never parsed here: `--tokenizer estimate`),
    its chat template, its window."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 65536}))
    return folder


# each part the folder gives, replaced by a flag, so that its file is never read
REPLACED = {
    "tokenizer.json": ["--tokenizer", "estimate"],
    "config.json": ["--tokenizer", "estimate", "--window", "65536"],
    "tokenizer_config.json": ["--tokenizer", "estimate", "--window", "65536", "--format", "chatml"],
}


@pytest.mark.parametrize("name", REPLACED)
def test_o_onto_a_file_of_the_model_folder_whose_part_a_flag_replaced(tmp_path: Path, name: str) -> None:
    folder = model_folder(tmp_path)
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    code, out, err = ctx("build", CASE3, "--use", folder, *REPLACED[name], "-o", folder / name)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {folder / name}: is a file of {folder}, a folder this command reads; it is never overwritten,"
        " name another file\n"
    )
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before


def test_o_onto_a_model_file_by_a_symlink_or_in_a_folder_of_symlinks(tmp_path: Path) -> None:
    """A symlink elsewhere to the model's file; a Hugging Face cache snapshot, whose files are
    symlinks to its blobs: the folder is found as named and where the link leads."""
    folder = model_folder(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(folder / "tokenizer.json")
    code, _, err = ctx("build", CASE3, "--use", folder, "--tokenizer", "estimate", "-o", link)
    assert code == ExitStatus.ERROR and f"is a file of {folder}, a folder this command reads" in one_line(err)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for each in folder.iterdir():
        (snapshot / each.name).symlink_to(each)
    code, _, err = ctx("build", CASE3, "--use", snapshot, "--tokenizer", "estimate", "-o", snapshot / "tokenizer.json")
    assert code == ExitStatus.ERROR and f"is a file of {snapshot}, a folder this command reads" in one_line(err)
    assert (folder / "tokenizer.json").read_text() == "{}"


def test_o_may_write_a_new_file_into_the_model_folder(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    code, _, err = ctx("build", CASE3, "--use", folder, "--tokenizer", "estimate", "-o", folder / "prompt.txt")
    assert (code, err) == (0, "")
    assert (folder / "prompt.txt").read_text(encoding="utf-8")


# -- #18: an Ollama manifest or blob that is a device ----------------------------------------


@pytest.mark.parametrize("which", ["manifest", "blob"])
def test_an_ollama_manifest_or_blob_that_is_a_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    models = tmp_path / "ollama"
    manifest = models / "manifests" / "registry.ollama.ai" / "library" / "dz" / "latest"
    manifest.parent.mkdir(parents=True)
    blob = models / "blobs" / ("sha256-" + "c" * 64)
    blob.parent.mkdir()
    if which == "manifest":
        manifest.symlink_to("/dev/zero")
    else:
        layer = {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "c" * 64}
        manifest.write_text(json.dumps({"layers": [layer]}))
        blob.symlink_to("/dev/zero")
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    code, out, err = ctx("build", CASE3, "--use", "dz")
    shown, what = (manifest, "an Ollama manifest") if which == "manifest" else (blob, "a model blob (a GGUF file)")
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == f"ctx: {shown}: is a character device, not {what}; pull the model again (ollama pull dz)\n"


# -- #13: a chat template nested past Python's own limits -----------------------------------


@pytest.mark.parametrize(
    "template",
    ["{% for m in messages %}" * 25 + "{% endfor %}" * 25, "{% if messages %}" * 120 + "{% endif %}" * 120],
    ids=["25 for", "120 if"],
)
def test_a_chat_template_nested_past_python_s_limits(tmp_path: Path, template: str) -> None:
    path = tmp_path / "deep.jinja"
    path.write_text(template, encoding="utf-8")
    code, out, err = ctx("build", CASE3, "--format", path)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err).startswith(f"ctx: {path}: not a template ctx can run: its blocks nest too deep (Python")


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

    stand_in = Summarizer().start(poll=0.02)
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


# -- #16: a sidecar path summarize can never write -------------------------------------------


@pytest.mark.parametrize("kind", ["a folder", "a FIFO", "/dev/null", "a symlink to /dev/null", "no such folder"])
def test_a_sidecar_no_run_could_write_is_refused_before_the_first_request(
    tmp_path: Path, summarizer: Any, kind: str
) -> None:
    import os

    path = tmp_path / "summaries"
    if kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "/dev/null":
        path = Path("/dev/null")
    elif kind == "a symlink to /dev/null":
        path.symlink_to("/dev/null")
    else:
        path = tmp_path / "gone" / "summaries"
    code, out, err, _ = summarize_chat(tmp_path, summarizer, 120, "--summaries", path)
    assert (code, out) == (ExitStatus.ERROR, "")
    shown = path.parent if kind == "no such folder" else path
    assert one_line(err).startswith(f"ctx: {shown}: ")
    what = {"a folder": "is a directory", "a FIFO": "is a FIFO", "no such folder": "no such folder"}
    assert what.get(kind, "is a character device") in err
    assert summarizer.bodies == []  # not one request sent


# -- #1: a summary edited by hand while ctx summarize runs; a second run; the cost of a commit ---


def test_a_summary_edited_by_hand_during_the_run_is_kept(tmp_path: Path, summarizer: Any) -> None:
    """The first scene's summary is edited by hand while the third is being asked: every later
    commit merges into the file as it is on disk, so the edit stands; the run's own scenes are
    all there."""
    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

    chat = tmp_path / "chat.jsonl"
    sidecar = sidecar_for(chat)
    hand = "Mara and the Keeper watch the tide come in; written by hand."

    def edit(number: int) -> None:
        if number == 3:  # scenes 1 and 2 are committed by now (--jobs 1)
            lines = sidecar.read_text(encoding="utf-8").splitlines()
            first = json.loads(lines[0])
            first["summary"] = hand
            lines[0] = json.dumps(first, ensure_ascii=False)
            sidecar.write_text("\n".join(lines) + "\n", encoding="utf-8")

    summarizer.on_request = edit
    code, _, err, _ = summarize_chat(tmp_path, summarizer, 300)
    assert code == 0, err
    records = read_sidecar(sidecar)
    summaries = [entry for entry in summarizer.log if entry[0] == "summary"]
    assert len(records) == len(summaries) >= 4
    assert records[0].summary == hand  # not put back
    assert all(r.summary.startswith("In messages") and r.history for r in records[1:])
    assert len(sidecar.read_text(encoding="utf-8").splitlines()) == len(records)  # one line a scene


def test_a_second_summarize_of_the_same_sidecar_is_refused(tmp_path: Path, summarizer: Any) -> None:
    import fcntl
    import os

    from otaku_ctx.story.sidecar import sidecar_for

    lock = Path(str(sidecar_for(tmp_path / "chat.jsonl")) + ".lock")
    held = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a run of ctx summarize holds it
        code, out, err, chat = summarize_chat(tmp_path, summarizer)
    finally:
        os.close(held)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert one_line(err) == (
        f"ctx: {sidecar_for(chat)}: another ctx summarize is writing it (it holds {lock}); let that run end first\n"
    )
    assert summarizer.bodies == []
    code, _, err, _ = summarize_chat(tmp_path, summarizer)  # the lock let go: a run goes
    assert code == 0 and not lock.exists(), err


def test_a_commit_costs_what_it_adds(tmp_path: Path, summarizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each scene and each history is appended (a line, fsynced), not the whole file rewritten:
    the bytes a run writes are a few times the file's size, not the scenes' count times it
    (which they were: 4,195 scenes took 255 s against an instant server)."""
    import otaku_ctx.summarize as summarize
    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for

    made: list[Any] = []

    class Watched(summarize.Commits):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(summarize, "Commits", Watched)
    code, _, err, chat = summarize_chat(tmp_path, summarizer, 800)
    assert code == 0, err
    records = read_sidecar(sidecar_for(chat))
    size = sidecar_for(chat).stat().st_size
    (commits,) = made
    assert len(records) >= 25 and commits.appends == 2 * len(records) - 1  # every scene, every history but one
    assert commits.rewrites == 2  # the first commit (the file as it is read) and the last (one line a scene)
    assert commits.written <= 3 * size


def test_a_later_line_of_a_scene_stands_and_a_torn_last_line_is_left_out(tmp_path: Path) -> None:
    from otaku_ctx.story.sidecar import Record, read_sidecar

    path = tmp_path / "chat.jsonl.ctx-summaries"
    one, two = Record(1, 1, 20, "T", "first"), Record(2, 21, 40, "U", "second")
    path.write_text(
        one.line_text() + "\n" + two.line_text() + "\n" + Record(1, 1, 20, "T", "again").line_text() + '\n{"typ',
        encoding="utf-8",
    )
    assert [(r.start, r.summary) for r in read_sidecar(path)] == [(1, "again"), (21, "second")]


@pytest.mark.parametrize(
    "line",
    [
        '{"type": "scene", "start": 1, "end": 2, "title": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"type": "scene", "start": 1' + "0" * 5000 + "}",
    ],
    ids=["nested 100,000 deep", "a 5,000-digit number"],
)
@pytest.mark.parametrize("command", ["build", "inspect", "validate", "replay", "summarize"])
def test_a_hostile_sidecar_line_is_one_line_naming_it(tmp_path: Path, line: str, command: str) -> None:
    """Issue 28, #11 and #12: every command that reads the summaries file names its line."""
    from io import BytesIO, StringIO

    from otaku_ctx.cli.app import main
    from otaku_ctx.cli.terminal import Terminal

    story = tmp_path / "chat.jsonl"
    story.write_text(
        "".join(f'{{"role": "{"user" if i % 2 else "assistant"}", "content": "line {i}"}}\n' for i in range(1, 9))
    )
    sidecar = tmp_path / "chat.jsonl.ctx-summaries"
    sidecar.write_text(line + "\n")
    more = ["--url", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run"] if command == "summarize" else []
    err = StringIO()
    code = main([command, str(story), *more], Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
    said = err.getvalue()
    assert code == 1 and f"{sidecar}:1: is not JSON ctx can read" in said and said.count("\n") == 1, said
