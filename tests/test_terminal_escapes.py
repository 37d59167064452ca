"""The server's own words, a file's name, a reply or a view holding terminal escapes: shown, never
obeyed (issue 28's #9)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import test_backend
from conftest import CASE3
from ctx_run import ctx, one_line
from test_backend import StandIn, raw, reply

from otaku_ctx.cli.terminal import Terminal, progress
from otaku_ctx.status import ExitStatus

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
