"""Hostile round 4 (issue 28): a server URL no request can be sent to, the server's own words
holding terminal escapes, JSON from a server nested or sized past reason, `-o` onto a model
folder's own file, an Ollama manifest or blob that is a device, a chat template nested past
Python's own limits. Each ends in one line on stderr naming the file or URL, an exit code, and
no traceback."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
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
    """One line naming the URL and what is wrong with it, before any request: never the
    ValueError or UnicodeError that `urlsplit`, its `port` and IDNA raise."""
    url, problem = BAD_URLS[hostile]
    code, out, err = ctx(*URL_SOURCES[source](url, tmp_path))
    assert (code, out) == (ExitStatus.ERROR, "")
    assert f": not a server's base URL ({problem}" in one_line(err)
    assert err.endswith("): give one like http://127.0.0.1:8080/v1\n") and len(err) < 400


@pytest.mark.parametrize("source", URL_SOURCES)
def test_a_password_in_a_server_url_is_never_shown(source: str, tmp_path: Path) -> None:
    """Neither in the URL's own error nor in a failure to reach it."""
    bad = "http://ilya:hunter2@127.0.0.1:99999/v1"
    code, _, err = ctx(*URL_SOURCES[source](bad, tmp_path))
    assert code == ExitStatus.ERROR and one_line(err).startswith("ctx: http://127.0.0.1:99999/v1: not a server's")
    assert "hunter2" not in err and "ilya" not in err


# -- #9: the server's own words hold terminal escapes ----------------------------------------

STEERING = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
STEERS = set("\x1b\x07\x9b\u202e")


@pytest.fixture
def server() -> Iterator[StandIn]:
    stand_in = StandIn()
    thread = threading.Thread(target=stand_in.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield stand_in
    stand_in.released.set()
    stand_in.shutdown()
    stand_in.server_close()
    thread.join(5)


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
