"""The bounds on what `ctx` reads: the story's (a flag), the stated table of every kind's, sizes
as they are written and read back, and a read whole within its bound and refused past it."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from conftest import CASE3, REPO, examples
from ctx_run import ctx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otaku_ctx.config import CONFIG_BOUND
from otaku_ctx.errors import InputError
from otaku_ctx.files import BOUNDS, GiB, KiB, MiB, parse_size, read_input, size_text
from otaku_ctx.status import ExitStatus

STORY = CASE3.read_bytes()


@pytest.fixture(scope="module")
def expected() -> str:
    return ctx("build", CASE3)[1]


# -- the story's bound ----------------------------------------------------------------------------


def test_the_story_bound_is_a_flag(tmp_path: Path, expected: str) -> None:
    small = f"{len(STORY) - 1}"
    for argv, stdin in ((["build", CASE3], None), (["build", "-"], io.BytesIO(STORY))):
        status, _, err = ctx(*argv, "--max-story-size", small, stdin=stdin)
        assert status == ExitStatus.ERROR and err.count("\n") == 1
        assert f"is larger than the {int(small):,} bytes a story may be; pass --max-story-size" in err
    assert ctx("build", CASE3, "--max-story-size", "1M") == (0, expected, "")
    assert ctx("validate", CASE3, "--max-story-size", "1K")[0] == ExitStatus.ERROR
    status, _, err = ctx("build", CASE3, "--max-story-size", "lots")
    assert status == ExitStatus.USAGE and err.startswith("ctx: --max-story-size: expected a size")


def test_the_stated_bounds() -> None:
    """docs/files.md's table, and the config reader's own bound, are these."""
    assert BOUNDS == {
        "story": GiB,
        "card": 64 * MiB,
        "lorebook": 64 * MiB,
        "config file": MiB,
        "template": 16 * MiB,
        "context preset": 16 * MiB,
        "format file": MiB,
        "instruct preset": 16 * MiB,
        "variables file": 64 * MiB,
        "summaries": 256 * MiB,
        "prompt file": MiB,
    }
    assert CONFIG_BOUND == BOUNDS["config file"]
    doc = (REPO / "docs" / "files.md").read_text(encoding="utf-8")
    for kind, bound in BOUNDS.items():
        assert f"| {kind} | {size_text(bound)} |" in doc, kind


# -- properties -------------------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=1 << 40))
def test_sizes_read_back(n: int) -> None:
    assert parse_size(size_text(n).replace(",", "").replace(" bytes", "")) == n


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=examples(25))
@given(size=st.integers(min_value=0, max_value=3 * KiB), bound=st.integers(min_value=1, max_value=3 * KiB))
def test_a_read_is_whole_within_the_bound_and_refused_past_it(tmp_path: Path, size: int, bound: int) -> None:
    path = tmp_path / "lore.json"
    data = os.urandom(size).replace(b"\xff", b"a")  # never a UTF-16 byte-order mark
    path.write_bytes(data)
    if size <= bound:
        assert read_input(path, "lorebook", bound) == data
    else:
        with pytest.raises(InputError, match="is larger than the"):
            read_input(path, "lorebook", bound)
