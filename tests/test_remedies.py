"""A refusal names every remedy that would work, each with the value that makes the prompt fit,
found by building the story at it (issue 26): the window, the opening messages kept, the
tail floor. Each value is checked here the way a user would: applied, the story builds; one
step past it, it is refused."""

from __future__ import annotations

import re
from io import BytesIO, StringIO
from pathlib import Path

import pytest

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "lighthouse-case4.jsonl"


def build(*argv: str) -> tuple[int, str]:
    err = StringIO()
    code = main(["build", str(STORY), *argv], Terminal(stdin=BytesIO(), stdout=BytesIO(), stderr=err))
    return code, err.getvalue()


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("window", [1500, 1700])
def test_the_tail_floor_a_refusal_names_is_the_highest_that_fits(tmp_path: Path, window: int) -> None:
    code, err = build("--window", str(window))
    assert code == 3, err
    floor = int(re.search(r"\[context\] tail_floor = (\d+)", err)[1])  # type: ignore[index]
    at = [config(tmp_path, f"[context]\ntail_floor = {value}\n") for value in (floor, floor + 1)]
    assert build("--window", str(window), "--config", at[0])[0] == 0
    assert build("--window", str(window), "--config", at[1])[0] == 3
    needed = int(re.search(r"at least ([\d,]+) tokens would fit", err)[1].replace(",", ""))  # type: ignore[index]
    assert build("--window", str(needed))[0] == 0


def test_the_head_a_refusal_names_is_the_most_that_fits(tmp_path: Path) -> None:
    small = config(tmp_path, "[context]\ntail_floor = 2\nmin_tail_messages = 2\n")
    code, err = build("--window", "1200", "--head", "60", "--config", small)
    assert code == 3, err
    head = int(re.search(r"--head (\d+)\)", err)[1])  # type: ignore[index]
    assert 0 <= head < 60
    assert build("--window", "1200", "--head", str(head), "--config", small)[0] == 0
    assert build("--window", "1200", "--head", str(head + 1), "--config", small)[0] == 3


def test_a_long_chat_far_over_the_window_is_refused_without_rendering_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat of thousands of messages and no summaries: the smallest prompt is the parts' sum
    (FAR_OVER times the limit), not a render of every message (which passed the render bound
    at 100,000 messages, and cost what the story does)."""
    from otaku_ctx.build import Pipeline
    from otaku_ctx.config import load_settings
    from otaku_ctx.render.pricing import TemplatePricer
    from otaku_ctx.story.model import Message, Story

    rendered: list[int] = []
    exact = TemplatePricer.exact
    monkeypatch.setattr(TemplatePricer, "exact", lambda self, a: rendered.append(len(a.parts)) or exact(self, a))
    lines = (Message(i, "user" if i % 2 else "assistant", f"Row {i}: the tide comes in.") for i in range(1, 6001))
    built = Pipeline(load_settings(overrides={"model.window": (1024, "test")})).build(Story(STORY, tuple(lines)))
    assert built.assembly.refusal is not None and built.assembly.refusal.smallest > 8 * built.assembly.limit
    assert all(parts < 1000 for parts in rendered)  # nothing near the story's 6,000 messages was rendered
