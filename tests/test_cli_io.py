"""`ctx` and the world around it: stdin and pipes, `-o` onto every kind of path, closed and
broken streams, exit statuses, help text. Streams are injected through `Terminal`, so the
branches a terminal or a pipe would take are all tested."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import typer.main
from conftest import CASE3, FIXTURES, REPO

from otaku_ctx import files
from otaku_ctx.cli.app import app, main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.status import ExitStatus
from otaku_ctx.story.detect import READERS


class Pipe(io.BytesIO):
    """A stdout whose reader went away."""

    def write(self, data: bytes) -> int:  # type: ignore[override]
        raise BrokenPipeError(32, "Broken pipe")


def ctx(*argv: str | Path, stdin: bytes = b"", **terminal: object) -> tuple[int, str, str]:
    """`ctx ARGV` with its own streams: (status, stdout, stderr)."""
    out, err = io.BytesIO(), io.StringIO()
    streams: dict[str, object] = {"stdin": io.BytesIO(stdin), "stdout": out, "stderr": err}
    streams.update(terminal)
    status = main([str(a) for a in argv], Terminal(**streams))  # type: ignore[arg-type]
    return status, out.getvalue().decode("utf-8"), err.getvalue()


@pytest.fixture(scope="module")
def expected() -> str:
    return ctx("build", CASE3)[1]


# ── Where the story comes from ───────────────────────────────────────────────────────────


def test_a_story_from_stdin(expected):
    assert ctx("build", "-", stdin=CASE3.read_bytes()) == (0, expected, "")


def test_a_story_from_a_pipe_is_read_once(tmp_path, expected, monkeypatch):
    """A FIFO (what `<(cat story)` is) can be read only once; sniffing must not use it up."""
    monkeypatch.setattr(files, "FIFO_GRACE", 60.0)  # a hang guard: however late the writer's thread runs
    fifo = tmp_path / "story.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(CASE3.read_bytes()))
    writer.start()
    try:
        assert ctx("build", fifo) == (0, expected, "")
    finally:
        writer.join(timeout=10)


def test_errors_in_a_story_from_stdin_name_stdin():
    status, out, err = ctx("build", "-", stdin=b'{"role": "user", "content": "hi"}\n{"role": \n')
    assert status == ExitStatus.ERROR and out == ""
    assert err.startswith("ctx: <stdin>:2: ") and "/tmp" not in err


# ── Where the prompt goes ────────────────────────────────────────────────────────────────


def test_o_never_overwrites_the_story_even_through_a_symlink(tmp_path):
    story = tmp_path / "story.jsonl"
    story.write_bytes(CASE3.read_bytes())
    link = tmp_path / "link.jsonl"
    link.symlink_to(story)
    for target in (story, link):
        status, out, err = ctx("build", story, "-o", target)
        assert status == ExitStatus.ERROR and out == "" and "never overwritten" in err
    assert story.read_bytes() == CASE3.read_bytes() and link.is_symlink()


def test_o_writes_into_a_fifo_without_replacing_it(tmp_path, expected):
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    status, _, err = ctx("build", CASE3, "-o", fifo)
    reader.join(timeout=60)
    assert (status, err) == (0, "")
    assert got == [expected.encode("utf-8")]
    assert fifo.is_fifo()


def test_o_onto_a_directory_or_nothing_names_what_the_user_gave(tmp_path):
    status, _, err = ctx("build", CASE3, "-o", tmp_path)
    assert status == ExitStatus.ERROR and err == f"ctx: {tmp_path}: is a directory; name a file inside it\n"
    status, _, err = ctx("build", CASE3, "-o", "")
    assert status == ExitStatus.USAGE and "empty path" in err and ".tmp" not in err


def test_o_dash_is_stdout(expected):
    assert ctx("build", CASE3, "-o", "-") == (0, expected, "")


def test_o_writes_a_regular_file_atomically(tmp_path, expected):
    target = tmp_path / "prompt.txt"
    target.write_text("old", encoding="utf-8")
    assert ctx("build", CASE3, "-o", target) == (0, "", "")
    assert target.read_text(encoding="utf-8") == expected
    assert [p.name for p in tmp_path.iterdir()] == ["prompt.txt"]  # no temp file left


# ── Closed and broken streams ────────────────────────────────────────────────────────────


def test_a_broken_pipe_exits_141_quietly():
    status, _, err = ctx("build", CASE3, stdout=Pipe())
    assert (status, err) == (ExitStatus.BROKEN_PIPE, "")
    status, _, err = ctx("inspect", CASE3, "--json", stdout=Pipe())
    assert (status, err) == (ExitStatus.BROKEN_PIPE, "")


def test_closed_stdout_is_one_line_and_exit_1():
    status, _, err = ctx("build", CASE3, stdout=None)
    assert status == ExitStatus.ERROR and err.count("\n") == 1 and "stdout is closed" in err


def test_closed_stderr_does_not_change_the_outcome(expected):
    out = io.BytesIO()
    assert main(["build", str(CASE3)], Terminal(io.BytesIO(), out, None, stderr_tty=True)) == 0
    assert out.getvalue().decode("utf-8") == expected


def test_a_terminal_gets_a_final_newline_and_a_summary(expected):
    status, out, err = ctx("build", CASE3, stdout_tty=True, stderr_tty=True)
    assert status == 0 and out == expected + "\n"
    assert err.startswith("case 3 · ") and err.endswith("(cl100k_base)\n")


def _run_process(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "otaku_ctx", *args], env=env, timeout=60, **kwargs)


def test_real_process_with_closed_stdout_and_a_non_ascii_locale(tmp_path):
    """`>&-` and PYTHONIOENCODING=ascii, as a shell would start ctx."""
    story = tmp_path / "story.jsonl"
    story.write_text('{"role": "user", "name": "Zoë", "content": "Ça va — ☕?"}\n', encoding="utf-8")
    done = _run_process(["build", str(story)], env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and "Ça va — ☕?" in done.stdout.decode("utf-8")
    shell = f"{sys.executable} -m otaku_ctx build {story} >&-"
    closed = subprocess.run(["sh", "-c", shell], capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert closed.returncode == 1 and b"stdout is closed" in closed.stderr


def test_real_process_whose_reader_went_away_exits_141_quietly():
    """The reader closed before ctx wrote (`| true`): the status of a broken pipe, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = _run_process(["build", str(CASE3)], stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (ExitStatus.BROKEN_PIPE, b"")


def test_ctx_version_imports_nothing_but_the_exit_statuses():
    """`ctx --version` answers before the CLI is imported; the console script takes its
    exit statuses from `status`, the one place that defines them, not from a copy."""
    script = (
        "import sys\n"
        "from otaku_ctx.__main__ import entry\n"
        "sys.argv = ['ctx', '--version']\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('otaku_ctx'))\n"
        "print(loaded, file=sys.stderr)\n"
        "entry()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.stderr.strip() == "['otaku_ctx', 'otaku_ctx.__main__', 'otaku_ctx.status']"
    assert done.stdout.startswith("ctx ") and done.returncode == 0


def test_a_build_of_an_english_story_imports_only_what_it_uses(tmp_path):
    """Each of these costs a few ms a run: the `regex` module is for pathological or unspaced
    text, pybars for templates not yet compiled, tiktoken's package for a changed tiktoken,
    tempfile for writing a file."""
    script = (
        "import sys\n"
        "from otaku_ctx.cli.app import main\n"
        f"status = main(['build', {str(CASE3)!r}])\n"
        "heavy = ('regex', 'pybars', 'tiktoken', 'tempfile', 'secrets', 'random')\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in heavy and m != 'tiktoken._tiktoken']\n"
        "print(status, sorted(loaded), file=sys.stderr)\n"
    )
    env = {**os.environ, "OTAKU_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.stderr.strip() == "0 []" and done.stdout


# ── Exit statuses and usage ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "argv",
    [
        ["--emit", "yaml"],
        ["--tokenizer", "gpt2"],
        ["--from", "word"],
        ["--reserve", "²"],
        ["--tail", "1000000000000"],
        ["--template", "nope"],
    ],
)
def test_bad_flag_values_are_usage_errors(argv):
    status, out, err = ctx("build", CASE3, *argv)
    assert status == ExitStatus.USAGE and out == "" and err and "Traceback" not in err


@pytest.mark.parametrize(
    "toml", ["reserve_factor = nan", "reserve_factor = inf", "reserve_factor = 1e308", "min_tail_messages = -1"]
)
def test_bad_numbers_in_the_config_are_bad_input(tmp_path, toml):
    config = tmp_path / "config.toml"
    config.write_text(f"[context]\n{toml}\n", encoding="utf-8")
    status, out, err = ctx("build", CASE3, "--config", config)
    assert status == ExitStatus.ERROR and out == "" and err.startswith(f"ctx: {config}: context.")


def test_a_huge_tail_with_a_tiny_step_is_bounded(tmp_path):
    """min_tail 10⁹ with tail_step 1 on a 2-message story: one prompt, not 10⁹ rungs."""
    story = tmp_path / "two.jsonl"
    story.write_text('{"role":"user","content":"a"}\n{"role":"assistant","content":"b"}\n', encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text("[context]\nmin_tail_messages = 1000000000\ntail_step = 1\n", encoding="utf-8")
    status, out, _ = ctx("inspect", story, "--json", "--config", config)
    assert status == 0 and json.loads(out)["case"] == 1


def test_config_works_on_every_command(tmp_path):
    missing = tmp_path / "missing.toml"
    for argv in (["build", CASE3], ["inspect", CASE3], ["validate", CASE3], ["config", "show"]):
        status, _, err = ctx(*argv, "--config", missing)
        assert status == ExitStatus.ERROR and "no such config file" in err, argv
    status, _, err = ctx("convert", CASE3, "-o", tmp_path / "out.jsonl", "--config", missing)
    assert status == ExitStatus.ERROR and "no such config file" in err


def test_inspect_explains_steps_only_when_asked():
    plain, explained = ctx("inspect", CASE3)[1], ctx("inspect", CASE3, "--explain")[1]
    assert "case 3" in plain and "Steps" not in plain
    assert "Steps" in explained and explained.startswith(plain.rstrip("\n"))


def test_config_show_in_a_pipe_keeps_every_column_whole(tmp_path):
    config = tmp_path / ("a-rather-long-folder-name-" * 3) / "config.toml"
    config.parent.mkdir()
    config.write_text("[model]\nwindow = 4096\n", encoding="utf-8")
    status, out, _ = ctx("config", "show", "--config", config)
    assert status == 0
    assert f"model.window\t4096\t{config}\n" in out


# ── Help ─────────────────────────────────────────────────────────────────────────────────


def _commands() -> list[tuple[str, object]]:
    root = typer.main.get_command(app)
    found = []

    def walk(command: object, path: str) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(root, "")
    return found


def test_every_command_and_option_has_help():
    for path, command in _commands():
        assert command.help, f"ctx {path} has no help"  # type: ignore[attr-defined]
        for param in command.params:  # type: ignore[attr-defined]
            assert getattr(param, "help", None), f"ctx {path} {param.name} has no help"


def test_help_reads_well_in_80_columns():
    for path, _ in _commands():
        status, out, _ = ctx(*path.split(), "--help")
        assert status == 0 and out.startswith("Usage: ctx")
        assert max(map(len, out.splitlines())) <= 80, f"ctx {path} --help is wider than 80 columns"
        assert "{" not in out.split("\n")[0], "the usage line shows arguments the usual way"


def test_shell_completion_is_offered():
    assert "--install-completion" in ctx("--help")[1]


def test_choices_are_the_cores():
    from otaku_ctx.cli.options import Emit, SourceFormat
    from otaku_ctx.render.emit import EMITS

    assert [e.value for e in Emit] == list(EMITS)
    assert [s.value for s in SourceFormat] == list(READERS)


def test_version_needs_nothing_else():
    done = _run_process(["--version"])
    assert done.returncode == 0 and done.stdout.decode().startswith("ctx ")


# ── Names, conversations and readers' notes (issue 8) ────────────────────────────────────

ST115 = FIXTURES / "sillytavern" / "variants" / "st115-unused.jsonl"
FINETUNE = FIXTURES / "neighbours" / "finetune.jsonl"
CARD = FIXTURES / "sillytavern" / "seraphina-card.png"


def test_inspect_says_where_each_name_came_from():
    data = json.loads(ctx("inspect", ST115, "--card", CARD, "--json")[1])
    assert data["names"] == {
        "char": {"name": "Seraphina", "source": "card"},
        "user": {"name": "Wren", "source": "user rows"},
    }
    data = json.loads(ctx("inspect", ST115, "--char", "Sera", "--user", "Robin", "--json")[1])
    assert data["names"]["char"] == {"name": "Sera", "source": "--char"}
    assert data["names"]["user"] == {"name": "Robin", "source": "--user"}


def test_char_flag_names_the_open_turn_and_no_unused_name_is_left():
    status, out, _ = ctx("build", ST115, "--card", CARD, "--char", "Sera")
    assert status == 0 and out.rstrip(" ").endswith("Sera:")
    assert "unused" not in ctx("build", ST115, "--card", CARD)[1]


def test_a_narrator_row_goes_out_as_a_system_message():
    status, out, _ = ctx("build", ST115, "--emit", "messages")
    assert status == 0
    roles = [m["role"] for m in json.loads(out)]
    assert "system" in roles[1:]  # the narrator row, after the opening
    assert "System:" not in ctx("build", ST115)[1]  # and it has no name to print


def test_a_finetune_file_says_which_conversation_it_took():
    status, out, err = ctx("build", FINETUNE)
    assert status == 0 and "Question 3" in out and "Question 2" not in out
    assert err.startswith("ctx: ") and "3" in err and err.count("\n") == 1
    status, out, err = ctx("build", FINETUNE, "--conversation", "2")
    assert status == 0 and "Question 2" in out and err == ""


def test_a_conversation_out_of_range_or_on_a_story_of_one_is_an_error():
    status, out, err = ctx("build", FINETUNE, "--conversation", "9")
    assert status == ExitStatus.ERROR and out == "" and err.count("\n") == 1 and str(FINETUNE) in err
    status, out, err = ctx("build", CASE3, "--conversation", "1")
    assert status == ExitStatus.ERROR and out == "" and "leave out --conversation" in err
    assert ctx("build", FINETUNE, "--conversation", "0")[0] == ExitStatus.USAGE


# ── Progress ─────────────────────────────────────────────────────────────────────────────


def test_a_slow_build_shows_progress_on_a_terminal_and_nowhere_else(expected):
    """With the delay at 0, the bar appears at once: on stderr, never in the prompt."""
    status, out, err = ctx("build", CASE3, stderr_tty=True, progress_after=0.0)
    assert status == 0 and out == expected
    assert "\x1b[" in err and err.rstrip("\n").endswith("(cl100k_base)")  # the bar, cleared, then the summary
    status, out, err = ctx("build", CASE3, stderr_tty=False, progress_after=0.0)
    assert (status, out, err) == (0, expected, "")


def test_a_template_and_a_config_from_pipes(tmp_path, expected, monkeypatch):
    """`--template <(...)` and `--config <(...)` are pipes: read once, like files."""
    monkeypatch.setattr(files, "FIFO_GRACE", 60.0)  # a hang guard: however late the writers' threads run
    template, config = tmp_path / "template.fifo", tmp_path / "config.fifo"
    os.mkfifo(template)
    os.mkfifo(config)
    source = (REPO / "configs" / "templates" / "default.hbs").read_bytes()
    writers = [
        threading.Thread(target=lambda: template.write_bytes(source)),
        threading.Thread(target=lambda: config.write_bytes(b"[model]\nwindow = 8192\n")),
    ]
    for writer in writers:
        writer.start()
    try:
        assert ctx("build", CASE3, "--config", config, "--template", template) == (0, expected, "")
    finally:
        for writer in writers:
            writer.join(timeout=10)


def test_the_persona_list_holds_each_name_once(tmp_path):
    """It used to get one entry per user message: serene refused long stories and grew without bound."""
    lines = [
        json.dumps({"role": role, "name": name, "content": f"line {n}"})
        for n in range(400)
        for role, name in (("user", "Mara" if n % 3 else "Wren"), ("assistant", "Ilya"))
    ]
    story = tmp_path / "story.jsonl"
    story.write_text("\n".join(lines) + "\n", encoding="utf-8")
    status, out, _ = ctx("template", "vars", story, "--template", "serene")
    assert status == 0
    personas = json.loads(json.loads(out)["personas"])
    assert [p["name"] for p in personas] == ["Mara", "Wren"]


@pytest.mark.parametrize(
    ("argv", "name", "text"),
    [
        (["build", CASE3, "--template"], "preset.json", "[" * 5000 + "]" * 5000),
        (["build", CASE3, "--format"], "instruct.json", "[" * 5000 + "]" * 5000),
        (["build"], "sharegpt.json", '{"conversations": ' + "[" * 5000 + "]" * 5000 + "}"),
        (["build"], "finetune.jsonl", '{"messages": ' + "[" * 5000 + "]" * 5000 + "}\n"),
    ],
)
def test_json_nested_past_reason_is_one_line_anywhere(tmp_path, argv, name, text):
    """Presets, formats and conversation files decode through the one guarded decoder."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    status, out, err = ctx(*argv, path)
    assert status == ExitStatus.ERROR and out == "" and err.count("\n") == 1
    assert "nested more than about a thousand levels" in err and "Traceback" not in err


def test_a_run_naming_a_command_builds_only_that_command() -> None:
    from otaku_ctx.cli.app import app_for

    assert [c.name for c in app_for(["build", "story.jsonl"], {}).registered_commands] == ["build"]
    assert app_for(["build", "story.jsonl"], {}).registered_groups == []
    for argv in (["config", "show"], ["template", "vars", "x"], ["biuld"], ["--version"], []):
        assert app_for(argv, {}) is app
    assert app_for(["build"], {"_CTX_COMPLETE": "bash_complete"}) is app
    assert len(app.registered_commands) > 1  # the narrowing copies; `app` itself keeps them all


def test_a_typo_in_the_command_is_still_named_by_the_whole_app() -> None:
    status, out, err = ctx("biuld", CASE3)
    assert status == ExitStatus.USAGE and "No such command 'biuld'" in err
