"""The code's own checks, run with the suite so the README's one test command covers them:
ruff (lint and format), and mypy (strict on the core, see pyproject.toml) in CI's deep step."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean():
    lint = _tool("ruff", "check", "otaku_ctx", "tests", "benchmarks")
    assert lint.returncode == 0, lint.stdout
    style = _tool("ruff", "format", "--check", "otaku_ctx", "tests", "benchmarks")
    assert style.returncode == 0, style.stdout


@pytest.mark.deep  # seven seconds from a fresh clone (no mypy cache): in .ci/run's second step
def test_mypy_passes():
    typed = _tool("mypy", "--no-error-summary")
    assert typed.returncode == 0, typed.stdout
