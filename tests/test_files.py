"""The files `ctx` is named: what `>` refuses a normal user, `-o` refuses; what cannot be read is
bad input; a full disk; `./-`, `name/` and empty names; `-o` onto a model folder's own file;
and `-o` never onto an input, however it is named."""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CASE3, REPO, examples
from ctx_run import ctx, one_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otaku_ctx.status import ExitStatus

STORY = CASE3.read_bytes()


@pytest.fixture(scope="module")
def expected() -> str:
    return ctx("build", CASE3)[1]


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
