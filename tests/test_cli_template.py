"""`ctx template vars` and `ctx template render`: output, and every error as one line, exit 1."""

from __future__ import annotations

import io
import json
from pathlib import Path

from conftest import CASE4

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.status import ExitStatus


def ctx(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(stdin=io.BytesIO(), stdout=out, stderr=err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


def test_vars_are_the_chosen_assemblys() -> None:
    status, out, err = ctx("template", "vars", CASE4)
    assert (status, err) == (0, "")
    variables = json.loads(out)
    chat = variables["chatMessages"]
    assert chat[-1]["kind"] == "open" and chat[-1]["message"] == ""
    assert variables["char"] and variables["user"] and variables["system"]
    # A smaller window chooses another assembly, and the variables follow it.
    small = json.loads(ctx("template", "vars", CASE4, "--max-context", "3000")[1])
    assert len(small["chatMessages"]) < len(chat)
    assert small["recap"] is not None and any(e["kind"] in ("summary", "history") for e in small["chatMessages"])


def test_vars_of_a_story_that_cannot_fit_is_a_refusal() -> None:
    status, out, err = ctx("template", "vars", CASE4, "--max-context", "300")
    assert (status, out) == (ExitStatus.REFUSED, "")
    assert err.count("\n") == 1 and str(CASE4) in err


def test_vars_render_through_a_template(tmp_path: Path) -> None:
    variables = tmp_path / "vars.json"
    variables.write_text(ctx("template", "vars", CASE4)[1], encoding="utf-8")
    template = tmp_path / "t.hbs"
    template.write_text("{{#each chatMessages}}\n{{name}}: {{message}}\n{{/each}}", encoding="utf-8")
    status, out, _ = ctx("template", "render", template, "--vars", variables)
    chat = json.loads(variables.read_text(encoding="utf-8"))["chatMessages"]
    assert status == 0 and out == "".join(f"{e['name']}: {e['message']}\n" for e in chat)


def test_render_shows_role_blocks_inline_untrimmed(tmp_path: Path) -> None:
    template, variables = tmp_path / "t.hbs", tmp_path / "v.json"
    template.write_text("top\n{{#systemBlock}}\n{{s}}\n{{/systemBlock}}{{#userBlock}}{{u}}{{/userBlock}}\n")
    variables.write_text('{"s": "Be kind.", "u": "[user]hi"}')
    assert ctx("template", "render", template, "--vars", variables) == (
        0,
        "top\n[system]Be kind.\n[/system][user][user]hi[/user]\n",
        "",
    )


def test_render_a_shipped_template_by_name(tmp_path: Path) -> None:
    variables = tmp_path / "v.json"
    variables.write_text(ctx("template", "vars", CASE4)[1], encoding="utf-8")
    status, out, err = ctx("template", "render", "default", "--vars", variables)
    assert status == 0 and out.startswith("[system]") and "[user]" in out and err == ""


def _one_line_error(argv: list[str | Path], *needles: str) -> None:
    status, out, err = ctx(*argv)
    assert (status, out) == (ExitStatus.ERROR, "")
    assert err.startswith("ctx: ") and err.count("\n") == 1 and "Traceback" not in err
    for needle in needles:
        assert needle in err


def test_render_errors_are_one_line(tmp_path: Path) -> None:
    template, variables = tmp_path / "t.hbs", tmp_path / "v.json"
    template.write_text("{{x}}")
    variables.write_text('{"x": 1}')
    _one_line_error(["template", "render", tmp_path / "none.hbs", "--vars", variables], "none.hbs", "no such")
    _one_line_error(["template", "render", template, "--vars", tmp_path / "none.json"], "none.json", "no such file")
    variables.write_text('{"x": 1,\n  oops}')
    _one_line_error(["template", "render", template, "--vars", variables], "v.json:2:3", "not valid JSON")
    variables.write_text("[1, 2]")
    _one_line_error(["template", "render", template, "--vars", variables], "must be a JSON object")
    variables.write_text('{"x": 1}')
    template.write_text("line\n{{#each xs}}\n{{/if}}")
    _one_line_error(["template", "render", template, "--vars", variables], "t.hbs:3:1", "{{/if}}")


def test_vars_errors_are_one_line(tmp_path: Path) -> None:
    _one_line_error(["template", "vars", tmp_path / "none.jsonl"], "none.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"role": "user", "content": "hi"}\n{"role": \n')
    _one_line_error(["template", "vars", broken], "broken.jsonl", ":2")
