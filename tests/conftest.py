"""Shared fixtures: never read the real ~/.otaku; find the shared fixtures beside the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures"


@pytest.fixture(autouse=True)
def otaku_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("otaku-home")
    monkeypatch.setenv("OTAKU_HOME", str(home))
    return home
