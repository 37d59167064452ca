"""The summaries' sidecar under `ctx summarize`: a path no run could write, a summary edited by
hand during the run, a second run on the same sidecar, the cost of a commit, and lines that are
later, torn or hostile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_bad_replies
from ctx_run import one_line
from test_bad_replies import summarize_chat

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.status import ExitStatus

summarizer = test_bad_replies.summarizer  # the summarizer's stand-in, as a fixture here too

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
        f"ctx: {sidecar_for(chat)}: another ctx summarize is writing it (it holds {lock}); let it end first\n"
    )
    assert summarizer.bodies == []
    code, _, err, _ = summarize_chat(tmp_path, summarizer)  # the lock let go: a run goes
    assert code == 0 and not lock.exists(), err


def test_a_summarize_turned_away_by_serve_s_lock_names_serve(tmp_path: Path, summarizer: Any) -> None:
    """The lock says who holds it: `ctx serve` writing a chat's summaries is named as itself, not
    as "another ctx summarize" (issue 45)."""
    import os

    from otaku_ctx.story.sidecar import read_sidecar, sidecar_for
    from otaku_ctx.summarize.commits import Commits

    sidecar = sidecar_for(tmp_path / "chat.jsonl")
    with Commits(sidecar, read_sidecar(sidecar) if sidecar.exists() else [], writer="ctx serve"):
        code, out, err, _ = summarize_chat(tmp_path, summarizer)
    assert (code, out) == (ExitStatus.ERROR, "")
    assert f"ctx serve (pid {os.getpid()}) is writing it" in one_line(err)


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
