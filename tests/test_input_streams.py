"""What `ctx` does with a stream it reads: a FIFO whose writer comes late (or never), and a
signal (SIGTERM, SIGHUP) during the copy of stdin or a write under `-o`, which end the run
through its finally blocks and leave nothing behind."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import CASE3, REPO
from ctx_run import ctx

from otaku_ctx import files
from otaku_ctx.status import ExitStatus

STORY = CASE3.read_bytes()


@pytest.fixture(scope="module")
def expected() -> str:
    return ctx("build", CASE3)[1]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "TMPDIR"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


# -- a FIFO: its writer may come late, but never not at all --------------------------------


class Waits:
    """`select.poll` as files.py uses it, recording each wait it asks for (in ms): ctx's wait
    for a FIFO's writer is bounded by what it asks, which a test can read, not time. A wait
    longer than a minute is cut to one, so a test fails rather than hangs."""

    def __init__(self) -> None:
        self.asked: list[float | None] = []
        self.waiting = threading.Event()  # set once ctx waits for a writer
        self._poll = select.poll

    def __call__(self) -> Any:
        waits, poller = self, self._poll()

        class Poller:
            def register(self, descriptor: int, mask: int) -> None:
                poller.register(descriptor, mask)

            def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
                waits.asked.append(timeout)
                waits.waiting.set()
                return poller.poll(60_000 if timeout is None or not 0 <= timeout <= 60_000 else timeout)

        return Poller()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    spy = Waits()
    monkeypatch.setattr(select, "poll", spy)
    return spy


def test_a_writer_that_opens_the_fifo_just_after_ctx_is_read(
    tmp_path: Path, expected: str, waits: Waits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer opens the FIFO once ctx has found it empty and waits: within the grace (made
    a minute, a hang guard, so that how soon the writer's thread runs cannot matter)."""
    monkeypatch.setattr(files, "FIFO_GRACE", 60.0)
    fifo = tmp_path / "story.fifo"
    os.mkfifo(fifo)

    def write_late() -> None:
        waits.waiting.wait(60)
        fifo.write_bytes(STORY)

    writer = threading.Thread(target=write_late)
    writer.start()
    try:
        assert ctx("build", fifo) == (0, expected, "")
    finally:
        writer.join(timeout=60)
    assert waits.asked == [60_000]


def test_a_writer_that_holds_the_fifo_open_before_writing_is_waited_for(tmp_path: Path, expected: str) -> None:
    """A writer that is there is waited for however slow it is: `<(slow command)`."""
    fifo = tmp_path / "story.fifo"
    os.mkfifo(fifo)

    def write_slowly() -> None:
        descriptor = os.open(fifo, os.O_WRONLY)  # opens once ctx opens its end
        time.sleep(files.FIFO_GRACE * 2)
        os.write(descriptor, STORY)
        os.close(descriptor)

    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        assert ctx("build", fifo) == (0, expected, "")
    finally:
        writer.join(timeout=10)


def test_a_fifo_with_no_writer_is_refused_after_the_grace(tmp_path: Path, waits: Waits) -> None:
    """One wait, of the grace, then the refusal: never a wait for ever."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    status, out, err = ctx("build", CASE3, "--config", fifo)
    assert waits.asked == [files.FIFO_GRACE * 1000]
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err == f"ctx: {fifo}: is a FIFO no program is writing to; start its writer first, or name a regular file\n"


# -- signals: SIGTERM and SIGHUP end the run through its finally blocks -----------------------


def _main_thread_only() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed in the main thread")


class _KillOnSecondRead(io.BytesIO):
    """Stdin that delivers `signum` to this process once its first chunk is copied."""

    def __init__(self, data: bytes, signum: int) -> None:
        super().__init__(data)
        self.signum, self.reads = signum, 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        if self.reads == 2:
            os.kill(os.getpid(), self.signum)
        return super().read(1024 if size is None or size < 0 else min(size, 1024))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_copy_of_stdin_leaves_nothing_in_tmpdir(private_tmp: Path, signum: int) -> None:
    _main_thread_only()
    before = signal.getsignal(signum)
    status, out, err = ctx("build", "-", stdin=_KillOnSecondRead(STORY, signum))
    assert (status, out, err) == (128 + signum, "", "")
    assert not list(private_tmp.iterdir())
    assert signal.getsignal(signum) == before  # the run's handlers are gone with the run


def test_a_signal_during_o_leaves_no_temp_file_and_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _main_thread_only()
    target = tmp_path / "prompt.txt"
    target.write_text("old", encoding="utf-8")
    monkeypatch.setattr(os, "fsync", lambda fd: os.kill(os.getpid(), signal.SIGTERM))
    assert ctx("build", CASE3, "-o", target) == (128 + signal.SIGTERM, "", "")
    assert [p.name for p in tmp_path.iterdir()] == ["prompt.txt"] and target.read_text() == "old"


def test_a_real_process_killed_while_it_copies_a_pipe_leaves_nothing(tmp_path: Path) -> None:
    """`timeout 5 ctx build <(endless)`: the copy is removed when SIGTERM ends the run."""
    fifo, folder = tmp_path / "story.fifo", tmp_path / "TMPDIR"
    os.mkfifo(fifo)
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(folder)}
    process = subprocess.Popen([sys.executable, "-m", "otaku_ctx", "build", str(fifo)], env=env, stderr=subprocess.PIPE)
    opened: list[Any] = []
    opener = threading.Thread(target=lambda: opened.append(open(fifo, "wb")), daemon=True)  # noqa: SIM115
    opener.start()  # it opens once ctx opens its end
    opener.join(timeout=60)
    if not opened:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the opener go
        process.kill()
        pytest.fail(f"ctx never opened the story: {process.communicate()[1]!r}")
    with opened[0] as writer:  # held open: the story never ends
        writer.write(STORY[:4096])
        writer.flush()
        deadline = time.monotonic() + 60  # a hang guard
        while not list(folder.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(folder.iterdir()), "ctx never began its copy"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and err == b""
    assert not list(folder.iterdir())
