"""Shared fixtures: never read the real ~/.otaku; every fixture file lives in tests/fixtures;
example paths; the Hypothesis profiles; the split between the README's quick suite and the
deep sweeps (`deep`, `sweep`)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis: a quick default for the README's test command (a minute on two cores), a
# thorough profile for CI's deep step (.ci/run: HYPOTHESIS_PROFILE=ci pytest -m "deep or
# hypothesis"), or any profile by name with HYPOTHESIS_PROFILE.
QUICK_EXAMPLES = 10
settings.register_profile(
    "default", max_examples=QUICK_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))


def examples(thorough: int) -> int:
    """A test's own number of Hypothesis examples, for a test whose examples are dear: all of
    them at any profile but the quick default, a quarter (at least two) at that."""
    return max(2, thorough // 4) if settings.default.max_examples == QUICK_EXAMPLES else thorough


#: A sweep too slow for the README's one-minute suite: `pytest -m deep` runs it, and .ci/run does
#: on every submission. The quick suite keeps a representative of each (`deep_but`, `sweep`).
deep = pytest.mark.deep


def deep_but(values: Iterable[Any], *quick: Any) -> list[Any]:
    """Parametrize values: the `quick` ones in the README's suite, the rest `deep`."""
    return [v if v in quick else pytest.param(v, marks=deep) for v in values]


def every(values: Iterable[Any], k: int) -> list[Any]:
    """Parametrize values of a long matrix of cases alike (conformance goldens, hostile
    inputs): every k-th in the README's suite, the rest `deep`."""
    return [v if i % k == 0 else _deep(v) for i, v in enumerate(values)]


def _deep(value: Any) -> Any:
    if hasattr(value, "values") and hasattr(value, "marks"):  # already a pytest.param
        return pytest.param(*value.values, id=value.id, marks=(*value.marks, deep))
    return pytest.param(value, marks=deep)


def sweep(*axes: Sequence[Any]) -> list[Any]:
    """Every combination of the axes, as parametrize values: one diagonal of them (each value of
    each axis at least once) in the README's suite, the rest `deep`."""
    width = max(len(axis) for axis in axes)
    diagonal = {tuple(axis[i % len(axis)] for axis in axes) for i in range(width)}
    return [
        pytest.param(*combo, marks=() if combo in diagonal else deep, id="-".join(_id(v) for v in combo))
        for combo in itertools.product(*axes)
    ]


def _id(value: Any) -> str:
    return value.stem if isinstance(value, Path) else str(value)


# Compiled bytecode, written: a machine that sets PYTHONDONTWRITEBYTECODE (this one does)
# otherwise compiles ctx again in every `ctx` process a test starts, and pytest rewrites every
# test module again on every run. Beside the sources (__pycache__, ignored by git), not in a
# PYTHONPYCACHEPREFIX: a prefix hides the bytecode pip compiled into the venv at install, so a
# fresh clone's first run compiled every library again (3 s of its minute).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

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


@pytest.fixture(scope="session")
def _homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each test's OTAKU_HOME is, numbered here: `mktemp` numbers a name by listing its
    folder, a cost that grew with every test (a third of a quick test's overhead)."""
    return tmp_path_factory.mktemp("otaku-homes")


_numbers = itertools.count()


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's summaries wait for a player's pause of 50 ms, not a second: the tests whose chats
    are summarised do not each wait a second a pass (tests/test_serve_sidecar.py's pause tests
    set the gate's own `pause` to the real one)."""
    monkeypatch.setattr("otaku_ctx.serve.gate.PAUSE", 0.05)


@pytest.fixture(autouse=True)
def otaku_home(_homes: Path) -> Iterator[Path]:
    """The test's own OTAKU_HOME, not yet made, as a new user's ~/.otaku is not: what ctx writes
    there it makes (a test that writes there itself makes it first). Not made, it costs nothing
    to make, nor for pytest to delete three runs on (some 3,000 folders: 1.6 s a run)."""
    home = _homes / str(next(_numbers))
    before = os.environ.get("OTAKU_HOME")
    os.environ["OTAKU_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("OTAKU_HOME", None)
    else:
        os.environ["OTAKU_HOME"] = before


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="Rewrite tests/golden/ from the current output.")


def pytest_configure(config: pytest.Config) -> None:
    """`--update-golden` rewrites every golden file, the deep sweep's too."""
    if config.getoption("--update-golden") and config.option.markexpr == "not deep":
        config.option.markexpr = ""


@pytest.fixture(scope="session")
def long_story():
    """318 messages, 15 scenes with summaries and histories: under a 40k window it spends its
    last turns in case 5 (tests/fixtures/README.md)."""
    from otaku_ctx.story.detect import read_story

    return read_story(FIXTURES / "replay-long.jsonl")
