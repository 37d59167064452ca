"""A mistyped format or template name gets "did you mean", as flags and commands do; shell
completion offers the format and template names (issue 26)."""

from __future__ import annotations

import os
import subprocess
import sys
from io import BytesIO, StringIO
from pathlib import Path

import pytest

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal

REPO = Path(__file__).resolve().parents[1]
STORY = str(REPO / "examples" / "lighthouse-case4.jsonl")


def build(*argv: str) -> tuple[int, str]:
    err = StringIO()
    code = main(["build", STORY, *argv], Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("flag", "typo", "meant"), [("--format", "chatm", "chatml"), ("--template", "defualt", "default")]
)
def test_a_typo_gets_did_you_mean(flag: str, typo: str, meant: str) -> None:
    code, err = build(flag, typo)
    assert code == 2 and f"did you mean {meant!r}?" in err and err.count("\n") == 1


def test_a_name_far_from_any_gets_no_guess() -> None:
    code, err = build("--format", "qqqqqq")
    assert code == 2 and "did you mean" not in err and "known: alpaca" in err


@pytest.mark.parametrize(
    ("flag", "start", "offered"),
    [("--format", "ch", {"chat", "chatml"}), ("--template", "s", {"serene", "sillytavern"})],
)
def test_completion_offers_the_names(tmp_path: Path, flag: str, start: str, offered: set[str]) -> None:
    env = {**os.environ, "OTAKU_HOME": str(tmp_path), "_CTX_COMPLETE": "complete_bash",
           "COMP_WORDS": f"ctx build story.jsonl {flag} {start}", "COMP_CWORD": "4"}  # fmt: skip
    script = "import sys; from otaku_ctx.__main__ import entry; sys.argv[0] = 'ctx'; entry()"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120).stdout
    assert set(out.split()) == offered
