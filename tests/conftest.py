"""Shared fixtures: never read the real ~/.otaku; every fixture file lives in tests/fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
CASE3 = REPO / "examples" / "lighthouse-case3.jsonl"
CASE4 = REPO / "examples" / "lighthouse-case4.jsonl"


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
