"""Shared fixtures: never read the real ~/.otaku; find the shared fixtures beside the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"
CASE3 = REPO / "examples" / "lighthouse-case3.jsonl"
CASE4 = REPO / "examples" / "lighthouse-case4.jsonl"
EXAMPLES = (CASE3, CASE4)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`ctx ARGV` in-process: (exit code, stdout, stderr)."""
    from otaku_ctx.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def otaku_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("otaku-home")
    monkeypatch.setenv("OTAKU_HOME", str(home))
    return home


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite tests/golden/ from the current output.")
