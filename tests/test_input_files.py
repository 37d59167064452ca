"""The hostile-input table (issue 20): every file `ctx` reads × every way it can be hostile.

Each row is one input, named the way a user names it (an argument, stdin, a flag, a name
looked up in ~/.otaku, a path listed in the config, the config's own default place). Each
column is one hostile file: a character device (`/dev/zero`, `/dev/urandom`), a FIFO no
program writes to, a symlink to each, a file past the kind's bound, an empty file, UTF-16
text, and the output path itself (the same path, a symlink, a hard link). Every case ends
in one line on stderr that names the file, at once — not a byte of a device, of a FIFO or of
a file past its bound is read — with nothing left in $TMPDIR, and no input is ever written over.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import CASE3, FIXTURES, REPO, every

from otaku_ctx import files
from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.files import BOUNDS
from otaku_ctx.status import ExitStatus

CARD = json.dumps({"name": "Ilya", "description": "The keeper of the lamp."}).encode()
GOOD: dict[str, bytes] = {
    "story": CASE3.read_bytes(),
    "card": CARD,
    "lorebook": (REPO / "examples" / "lighthouse-lore.json").read_bytes(),
    "config file": b"[model]\nwindow = 8192\n",
    "template": (REPO / "configs" / "templates" / "default.hbs").read_bytes(),
    "context preset": (FIXTURES / "sillytavern" / "context" / "default.json").read_bytes(),
    "format file": (REPO / "configs" / "formats" / "chatml.toml").read_bytes(),
    "instruct preset": (FIXTURES / "sillytavern" / "instruct" / "chatml.json").read_bytes(),
    "variables file": b'{"description": "A lamp."}',
    "summaries": b"",
    "prompt file": (REPO / "configs" / "prompts" / "summary.md").read_bytes(),
}


@dataclass(frozen=True)
class Input:
    """One way a file reaches `ctx`: its kind, the name it is given by, the command that reads it."""

    name: str
    kind: str
    suffix: str
    argv: Callable[[str, Path], list[str]]  # (the file as the user names it, a folder) -> the command line
    place: str = "arg"  # "arg", "stdin", or where under OTAKU_HOME it is found ("home:...")
    output: bool = True  # whether the command can write -o
    empty_ok: bool = False  # an empty file of this kind is a valid one


def _config_listing(lorebook: str, folder: Path) -> list[str]:
    config = folder / "listing.toml"
    config.write_text(f"[lore]\nfiles = [{json.dumps(lorebook)}]\n", encoding="utf-8")
    return ["build", str(CASE3), "--config", str(config)]


def _summary_prompt(prompt: str, folder: Path) -> list[str]:
    config = folder / "prompts.toml"
    config.write_text(f"[summarize]\nsummary_prompt = {json.dumps(prompt)}\n", encoding="utf-8")
    return [
        "summarize",
        str(CASE3),
        "--url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--dry-run",
        "--config",
        str(config),
    ]


INPUTS = [
    Input("story", "story", ".jsonl", lambda p, _: ["build", p]),
    Input("story on stdin", "story", ".jsonl", lambda p, _: ["build", "-"], place="stdin"),
    Input("story of convert", "story", ".jsonl", lambda p, _: ["convert", p, "--force"]),
    Input("story of validate", "story", ".jsonl", lambda p, _: ["validate", p], output=False),
    Input("--card", "card", ".json", lambda p, _: ["build", str(CASE3), "--card", p]),
    Input("--card of convert", "card", ".json", lambda p, _: ["convert", str(CASE3), "--force", "--card", p]),
    Input("--lore", "lorebook", ".json", lambda p, _: ["build", str(CASE3), "--lore", p]),
    Input("[lore] files", "lorebook", ".json", _config_listing),
    Input("--config", "config file", ".toml", lambda p, _: ["build", str(CASE3), "--config", p], empty_ok=True),
    Input(
        "the default config",
        "config file",
        ".toml",
        lambda p, _: ["build", str(CASE3)],
        place="home:configs/config.toml",
        empty_ok=True,
    ),
    Input(
        "--config of convert",
        "config file",
        ".toml",
        lambda p, _: ["convert", str(CASE3), "--force", "--config", p],
        empty_ok=True,
    ),
    Input("--template FILE", "template", ".hbs", lambda p, _: ["build", str(CASE3), "--template", p], empty_ok=True),
    Input(
        "--template NAME",
        "template",
        ".hbs",
        lambda p, _: ["build", str(CASE3), "--template", "hostile"],
        place="home:configs/templates/hostile.hbs",
        empty_ok=True,
    ),
    Input("--template PRESET", "context preset", ".json", lambda p, _: ["build", str(CASE3), "--template", p]),
    Input("--format FILE", "format file", ".toml", lambda p, _: ["build", str(CASE3), "--format", p], empty_ok=True),
    Input(
        "--format NAME",
        "format file",
        ".toml",
        lambda p, _: ["build", str(CASE3), "--format", "hostile"],
        place="home:configs/formats/hostile.toml",
        empty_ok=True,
    ),
    Input("--format PRESET", "instruct preset", ".json", lambda p, _: ["build", str(CASE3), "--format", p]),
    Input(
        "--vars", "variables file", ".json", lambda p, _: ["template", "render", "default", "--vars", p], output=False
    ),
    Input(
        "--summaries",
        "summaries",
        ".ctx-summaries",
        lambda p, _: ["build", str(CASE3), "--summaries", p],
        empty_ok=True,
    ),
    Input("[summarize] summary_prompt", "prompt file", ".md", _summary_prompt, output=False),
]

# The hostile files: what each is, and the words its one-line error holds.
HOSTILE = {
    "/dev/zero": "character device",
    "/dev/urandom": "character device",
    "fifo": "FIFO no program is writing to",
    "symlink to /dev/zero": "character device",
    "symlink to /dev/urandom": "character device",
    "symlink to a fifo": "FIFO no program is writing to",
    "huge": "larger than the",
    "empty": "",
    "utf-16": "UTF-16",
    "-o onto it": "is an input of this command",
    "-o onto a symlink to it": "is an input of this command",
    "-o onto a hard link to it": "is an input of this command",
}


def _applies(given: Input, hostile: str) -> bool:
    if hostile.startswith("-o") and not given.output:
        return False
    if given.place == "stdin":  # a shell opens a FIFO before ctx runs; a symlink is opened as its target
        return "fifo" not in hostile and not hostile.startswith("symlink")
    if given.place.startswith("home:") and hostile.startswith("/dev/"):
        return False  # it has a fixed name there: the symlinks stand for the devices
    if given.suffix in (".toml", ".json") and given.kind != "config file" and hostile.startswith("/dev/"):
        return given.kind in ("card", "lorebook", "variables file")  # their names may be anything
    return True


CASES = [
    pytest.param(given, hostile, id=f"{given.name} × {hostile}")
    for given in INPUTS
    for hostile in HOSTILE
    if _applies(given, hostile)
]


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$TMPDIR for the run, checked empty afterwards; a FIFO's grace cut short (the table
    holds many FIFOs; the grace itself has its own tests)."""
    folder = tmp_path / "TMPDIR"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(files, "FIFO_GRACE", 0.01)
    return folder


def _hostile_file(tmp_path: Path, given: Input, hostile: str, home: Path) -> tuple[Path, Path | None]:
    """(the file as the user names it, the -o target or None)."""
    if given.place.startswith("home:"):
        path = home / given.place.removeprefix("home:")
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        path = tmp_path / f"hostile{given.suffix}"
    fifo = tmp_path / "no-writer.fifo"
    if hostile.startswith("/dev/"):
        return Path(hostile), None
    if hostile.startswith("symlink to"):
        target = hostile.removeprefix("symlink to ")
        if target == "a fifo":
            os.mkfifo(fifo)
            target = str(fifo)
        path.symlink_to(target)
    elif hostile == "fifo":
        os.mkfifo(path)
    elif hostile == "huge":
        path.touch()
        os.truncate(path, BOUNDS[given.kind] + 1)  # sparse: no disk is spent
    elif hostile == "empty":
        path.touch()
    elif hostile == "utf-16":
        path.write_bytes(GOOD[given.kind].decode("utf-8").encode("utf-16"))
    else:
        path.write_bytes(GOOD[given.kind])
    if not hostile.startswith("-o"):
        return path, None
    if hostile == "-o onto it":
        return path, path
    other = tmp_path / "other-name.out"
    if "symlink" in hostile:
        other.symlink_to(path)
    else:
        os.link(path, other)
    return path, other


# The hostile files of which not a byte may be read: what they are is known before reading.
UNREAD = ("/dev/", "fifo", "symlink to", "huge")


class _CountedStdin(io.FileIO):
    """A file as stdin, counting the bytes read from it."""

    taken = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.taken += len(data or b"")
        return data or b""


def _bytes_read(monkeypatch: pytest.MonkeyPatch, path: Path) -> Callable[[], int]:
    """The bytes a run reads through `os.read` (as files.py reads every input) from the file
    `path` names, whatever name it is opened by."""
    info = os.stat(path)
    target, real, taken = (info.st_dev, info.st_ino), os.read, [0]

    def read(descriptor: int, size: int) -> bytes:
        data = real(descriptor, size)
        with contextlib.suppress(OSError):
            opened = os.fstat(descriptor)
            if (opened.st_dev, opened.st_ino) == target:
                taken[0] += len(data)
        return data

    monkeypatch.setattr(os, "read", read)
    return lambda: taken[0]


def _shown(given: Input, path: Path) -> str:
    return "<stdin>" if given.place == "stdin" else str(path)


@pytest.mark.parametrize(("given", "hostile"), every(CASES, 2))
def test_hostile_input(
    given: Input, hostile: str, tmp_path: Path, otaku_home: Path, private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, target = _hostile_file(tmp_path, given, hostile, otaku_home)
    argv = given.argv(str(path), tmp_path) + (["-o", str(target)] if target else [])
    if argv[0] == "convert" and not target:
        argv += ["-o", str(tmp_path / "converted.jsonl")]
    stdin = _CountedStdin(path, "r") if given.place == "stdin" else io.BytesIO()
    before = path.read_bytes() if target else None
    out, err = io.BytesIO(), io.StringIO()
    read = _bytes_read(monkeypatch, path)
    try:
        status = main(argv, Terminal(stdin, out, err))
    finally:
        stdin.close()
    taken = read() + (stdin.taken if isinstance(stdin, _CountedStdin) else 0)
    words = HOSTILE[hostile]
    message = err.getvalue()
    assert not (hostile.startswith(UNREAD) and taken), f"{taken:,} bytes of it were read"
    assert "Traceback" not in message
    assert not list(private_tmp.iterdir()), "a copy was left in $TMPDIR"
    if hostile == "empty" and given.empty_ok:  # an empty config, template or format file is a valid one
        assert status == ExitStatus.OK, message
        return
    assert status == ExitStatus.ERROR, message
    assert out.getvalue() == b""
    assert message.count("\n") == 1 and message.startswith(("ctx: ", f"{_shown(given, path)}: ")), message
    if hostile != "empty":
        assert words in message
        assert _shown(given, path) in message or (hostile.startswith("-o") and str(target) in message), message
    if target is not None:
        assert path.read_bytes() == before, "an input was written over"
        assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_table_covers_every_kind_and_every_hostile_file() -> None:
    """Every kind in BOUNDS is read by some row, and the table holds what docs/files.md says."""
    assert {given.kind for given in INPUTS} == set(BOUNDS)
    assert len(CASES) >= 150
