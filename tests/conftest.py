"""Shared fixtures: never read the real ~/.otaku; every fixture file lives in tests/fixtures;
example paths; the Hypothesis profiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis: a quick default for the README's test command, a thorough profile for CI
# (CI=true), or any profile by name with HYPOTHESIS_PROFILE.
settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
CASE3 = REPO / "examples" / "lighthouse-case3.jsonl"
CASE4 = REPO / "examples" / "lighthouse-case4.jsonl"
EXAMPLES = (CASE3, CASE4)


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`ctx ARGV` in-process: (exit code, stdout, stderr)."""
    from otaku_ctx.cli.app import main

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


@pytest.fixture(scope="session")
def long_story():
    """318 messages, 15 scenes with summaries and histories: under a 40k window it spends its
    last turns in case 5 (tests/fixtures/README.md)."""
    from otaku_ctx.story.detect import read_story

    return read_story(FIXTURES / "replay-long.jsonl")
