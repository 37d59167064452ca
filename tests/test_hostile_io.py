"""Issue 20 beyond the table: a FIFO's writer that comes late, signals during a run, a
normal user's permissions, a full disk, `./-` and `name/`, empty flag values, the story's
bound, and properties of the bounded reader and of `-o` over every way to name an input."""

from __future__ import annotations

import errno
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CASE3, REPO, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otaku_ctx import files
from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.config import CONFIG_BOUND
from otaku_ctx.errors import InputError
from otaku_ctx.files import BOUNDS, GiB, KiB, MiB, parse_size, read_input, size_text
from otaku_ctx.status import ExitStatus

STORY = CASE3.read_bytes()


def ctx(*argv: str | Path, stdin: Any = None) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(stdin or io.BytesIO(), out, err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


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


# -- as a normal user: what `>` refuses, -o refuses; what cannot be read is bad input ------------


def as_normal_user(job: Callable[[], Any]) -> Any:
    """Run `job` as `nobody` when the tests run as root (root may write anything, so root's
    permissions prove nothing), in a forked child that drops its privileges; otherwise here."""
    if os.geteuid() != 0:
        return job()
    closed = [str(p) for p in [REPO, *REPO.parents] if not p.stat().st_mode & 0o001]
    if closed:
        pytest.skip(f"the checkout is inside {closed[0]}, which other users may not enter, so nobody cannot run ctx")
    import select  # noqa: F401 - what a run imports late, imported while the modules can still be read
    import tomllib  # noqa: F401

    import tomli_w  # noqa: F401

    ctx("build", CASE3, "-o", os.devnull)  # and the rest of it, as root
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            result = job()
            os.write(write, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(child, 0)
    assert data, "the child found no answer"
    return json.loads(data)


@pytest.fixture
def open_folder(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A folder the normal user may write in, holding the otaku home (pytest's own temp
    folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="ctx-hostile-", dir="/tmp"))
    folder.chmod(0o777)
    (folder / "home").mkdir(mode=0o777)
    monkeypatch.setenv("OTAKU_HOME", str(folder / "home"))
    yield folder
    import shutil

    shutil.rmtree(folder)


def test_o_onto_a_write_protected_file_is_refused_as_gt_refuses_it(open_folder: Path) -> None:
    target = open_folder / "prompt.txt"
    target.write_text("keep", encoding="utf-8")
    target.chmod(0o444)
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)

    def job() -> Any:
        try:
            open(target, "w").close()  # noqa: SIM115 - what `>` does
            shell = "replaced"
        except PermissionError:
            shell = "refused"
        return shell, ctx("build", CASE3, "-o", target)

    shell, (status, out, err) = as_normal_user(job)
    assert shell == "refused"
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err == f"ctx: {target}: is write-protected (permission denied); make it writable or name another file\n"
    assert target.read_text() == "keep"


def test_o_into_a_read_only_folder_names_the_file_not_the_temp_file(open_folder: Path) -> None:
    folder = open_folder / "read-only"
    folder.mkdir(mode=0o555)
    folder.chmod(0o555)
    status, out, err = as_normal_user(lambda: ctx("build", CASE3, "-o", folder / "prompt.txt"))
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err == (
        f"ctx: {folder / 'prompt.txt'}: cannot be written: the folder {folder} is not writable (permission denied)\n"
    )
    assert not list(folder.iterdir())


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("story.jsonl", lambda p: ["build", p]),
        ("card.json", lambda p: ["build", CASE3, "--card", p]),
        ("lore.json", lambda p: ["build", CASE3, "--lore", p]),
        ("config.toml", lambda p: ["build", CASE3, "--config", p]),
        ("mine.hbs", lambda p: ["build", CASE3, "--template", p]),
        ("preset.json", lambda p: ["build", CASE3, "--template", p]),
        ("mine.toml", lambda p: ["build", CASE3, "--format", p]),
        ("vars.json", lambda p: ["template", "render", "default", "--vars", p]),
    ],
)
def test_an_unreadable_input_is_bad_input_in_one_line(open_folder: Path, name: str, argv: Any) -> None:
    path = open_folder / name
    path.write_text("{}", encoding="utf-8")
    path.chmod(0o000)
    status, out, err = as_normal_user(lambda: ctx(*argv(path)))
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err.startswith(f"ctx: {path}: cannot be read (permission denied)") and err.count("\n") == 1


def test_an_unreadable_template_found_by_name_is_bad_input_not_usage(open_folder: Path) -> None:
    """`--template mine` names a template that is there: exit 1 (it was a usage error, exit 2)."""
    home = open_folder / "home"
    (home / "configs" / "templates").mkdir(parents=True)
    template = home / "configs" / "templates" / "mine.hbs"
    template.write_text("{{description}}", encoding="utf-8")
    template.chmod(0o000)
    status, _, err = as_normal_user(lambda: ctx("build", CASE3, "--template", "mine"))
    assert status == ExitStatus.ERROR and err.startswith(f"ctx: {template}: cannot be read (permission denied)")


# -- full disks ------------------------------------------------------------------------------


def test_o_onto_a_full_device_names_it() -> None:
    status, out, err = ctx("build", CASE3, "-o", "/dev/full")
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err == "ctx: /dev/full: cannot be written: no space left on the device; free some space or write elsewhere\n"


def test_a_full_disk_under_o_names_the_file_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "prompt.txt"
    target.write_text("old", encoding="utf-8")

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    status, _, err = ctx("build", CASE3, "-o", target)
    assert status == ExitStatus.ERROR and err.startswith(f"ctx: {target}: cannot be written: no space left")
    assert [p.name for p in tmp_path.iterdir()] == ["prompt.txt"] and target.read_text() == "old"


# -- names: `-` and `./-`, `name/`, empty values --------------------------------------------------


def test_dot_slash_dash_is_a_file_and_only_dash_is_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("-").write_bytes(STORY)
    assert ctx("build", "./-") == (0, expected, "")
    assert ctx("build", "-", stdin=io.BytesIO(STORY)) == (0, expected, "")
    Path("-").unlink()
    assert ctx("build", CASE3, "-o", "./-") == (0, "", "")
    assert Path("-").read_text(encoding="utf-8") == expected


def test_o_name_slash_is_never_name(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine", encoding="utf-8")
    status, out, err = ctx("build", CASE3, "-o", f"{notes}/")
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err == f"ctx: {notes}/: is not a directory, yet ends in /; name a file (without the /)\n"
    assert notes.read_text() == "mine"
    status, _, err = ctx("build", CASE3, "-o", f"{tmp_path / 'new'}/")
    assert status == ExitStatus.ERROR and "names a folder that does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["build", ""], "STORY"),
        (["build", CASE3, "--config", ""], "--config"),
        (["validate", CASE3, "--config", ""], "--config"),
        (["config", "show", "--config", ""], "--config"),
        (["config", "init", "--config", ""], "--config"),
        (["build", CASE3, "--template", ""], "--template"),
        (["build", CASE3, "--format", ""], "--format"),
        (["build", CASE3, "--card", ""], "--card"),
        (["build", CASE3, "--lore", ""], "--lore"),
        (["build", CASE3, "-o", ""], "-o"),
        (["convert", CASE3, "-o", ""], "-o"),
        (["template", "render", "default", "--vars", ""], "--vars"),
    ],
)
def test_an_empty_file_or_name_is_a_usage_error_naming_its_flag(argv: list[Any], flag: str) -> None:
    status, out, err = ctx(*argv)
    assert (status, out) == (ExitStatus.USAGE, "")
    assert err.startswith(f"ctx: {flag}: an empty ") and err.count("\n") == 1


def test_a_symlink_to_a_device_named_as_a_template_says_what_it_is(otaku_home: Path) -> None:
    folder = otaku_home / "configs" / "templates"
    folder.mkdir(parents=True)
    (folder / "zero.hbs").symlink_to("/dev/zero")
    status, _, err = ctx("build", CASE3, "--template", "zero")
    assert status == ExitStatus.ERROR
    assert err == f"ctx: {folder / 'zero.hbs'}: is a character device, not a template; name a regular file\n"


def test_config_init_never_replaces_a_fifo_with_a_file(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)
    for target in (fifo, link):
        status, _, err = ctx("config", "init", "--force", "--config", target)
        assert status == ExitStatus.ERROR and "is a FIFO; it is never replaced by a file" in err
    assert fifo.is_fifo()


# -- encodings ----------------------------------------------------------------------------------


def test_a_config_with_a_utf8_byte_order_mark_reads_as_every_json_file_does(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"\xef\xbb\xbf[model]\nwindow = 8192\n")
    status, out, _ = ctx("config", "show", "--config", config)
    assert status == 0 and f"model.window\t8192\t{config}" in out


def test_a_utf16_story_says_so(tmp_path: Path) -> None:
    story = tmp_path / "story.jsonl"
    story.write_bytes(STORY.decode("utf-8").encode("utf-16"))
    for argv in (["build", story], ["validate", story], ["build", "-"]):
        status, _, err = ctx(*argv, stdin=io.BytesIO(story.read_bytes()))
        assert status == ExitStatus.ERROR and err.count("\n") == 1 and "is UTF-16 text; save it as UTF-8" in err


# -- the story's bound ----------------------------------------------------------------------------


def test_the_story_bound_is_a_flag(tmp_path: Path, expected: str) -> None:
    small = f"{len(STORY) - 1}"
    for argv, stdin in ((["build", CASE3], None), (["build", "-"], io.BytesIO(STORY))):
        status, _, err = ctx(*argv, "--max-story-size", small, stdin=stdin)
        assert status == ExitStatus.ERROR and err.count("\n") == 1
        assert f"is larger than the {int(small):,} bytes a story may be; pass --max-story-size" in err
    assert ctx("build", CASE3, "--max-story-size", "1M") == (0, expected, "")
    assert ctx("validate", CASE3, "--max-story-size", "1K")[0] == ExitStatus.ERROR
    status, _, err = ctx("build", CASE3, "--max-story-size", "lots")
    assert status == ExitStatus.USAGE and err.startswith("ctx: --max-story-size: expected a size")


def test_the_stated_bounds() -> None:
    """docs/files.md's table, and the config reader's own bound, are these."""
    assert BOUNDS == {
        "story": GiB,
        "card": 64 * MiB,
        "lorebook": 64 * MiB,
        "config file": MiB,
        "template": 16 * MiB,
        "context preset": 16 * MiB,
        "format file": MiB,
        "instruct preset": 16 * MiB,
        "variables file": 64 * MiB,
        "summaries": 256 * MiB,
        "prompt file": MiB,
    }
    assert CONFIG_BOUND == BOUNDS["config file"]
    doc = (REPO / "docs" / "files.md").read_text(encoding="utf-8")
    for kind, bound in BOUNDS.items():
        assert f"| {kind} | {size_text(bound)} |" in doc, kind


# -- properties -------------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=1 << 40))
def test_sizes_read_back(n: int) -> None:
    assert parse_size(size_text(n).replace(",", "").replace(" bytes", "")) == n


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=examples(25))
@given(size=st.integers(min_value=0, max_value=3 * KiB), bound=st.integers(min_value=1, max_value=3 * KiB))
def test_a_read_is_whole_within_the_bound_and_refused_past_it(tmp_path: Path, size: int, bound: int) -> None:
    path = tmp_path / "lore.json"
    data = os.urandom(size).replace(b"\xff", b"a")  # never a UTF-16 byte-order mark
    path.write_bytes(data)
    if size <= bound:
        assert read_input(path, "lorebook", bound) == data
    else:
        with pytest.raises(InputError, match="is larger than the"):
            read_input(path, "lorebook", bound)


NAMINGS = st.lists(
    st.sampled_from(["symlink", "hardlink", "dotted", "absolute", "up-and-back"]), min_size=0, max_size=4
)


@pytest.mark.deep
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=examples(30), deadline=None)
@given(namings=NAMINGS, which=st.sampled_from(["story", "config", "template", "lore"]))
def test_o_never_writes_onto_an_input_however_it_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namings: list[str], which: str
) -> None:
    """Any chain of symlinks, hard links, `./`, absolute and `dir/../` names of an input."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    monkeypatch.chdir(folder)
    inputs = {
        "story": ("s.jsonl", STORY),
        "config": ("c.toml", b"[model]\nwindow = 8192\n"),
        "template": ("t.hbs", (REPO / "configs" / "templates" / "default.hbs").read_bytes()),
        "lore": ("l.json", (REPO / "examples" / "lighthouse-lore.json").read_bytes()),
    }
    for name, data in inputs.values():
        Path(name).write_bytes(data)
    (folder / "sub").mkdir()
    target = inputs[which][0]
    for step, how in enumerate(namings):
        if how == "symlink":
            Path(f"link{step}").symlink_to(target)
            target = f"link{step}"
        elif how == "hardlink" and not Path(target).is_symlink():
            os.link(target, f"hard{step}")
            target = f"hard{step}"
        elif how == "dotted" and not os.path.isabs(target):
            target = f"./{target}"
        elif how == "absolute":
            target = str(Path(target).absolute())
        elif how == "up-and-back" and not os.path.isabs(target):
            target = f"sub/../{target}"
    status, out, err = ctx(
        "build", "s.jsonl", "--config", "c.toml", "--template", "t.hbs", "--lore", "l.json", "-o", target
    )
    assert (status, out) == (ExitStatus.ERROR, ""), err
    assert err.startswith(f"ctx: {target}: is an input of this command")
    for name, data in inputs.values():
        assert Path(name).read_bytes() == data
