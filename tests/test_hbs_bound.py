"""A render has a bound: a template that outgrows it stops early with an error naming it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from conftest import CASE4, run

from otaku_ctx.errors import TemplateError
from otaku_ctx.hbs import bound_for_window, compile_template

NESTED = "{{#each @root.chatMessages}}" * 6 + "{{name}}: {{message}}\n" + "{{/each}}" * 6
MESSAGES = {"chatMessages": [{"name": f"N{i}", "message": "x" * 50} for i in range(40)]}


def test_six_nested_loops_over_the_story_stop_at_the_bound_with_little_memory() -> None:
    template = compile_template(NESTED, "nested.hbs")
    tracemalloc.start()
    with pytest.raises(TemplateError) as caught:
        template.render(MESSAGES, bound=300_000)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert str(caught.value).startswith("nested.hbs: renders more than 300,000 characters; a loop probably")
    assert peak < 10_000_000  # the stream never held much more than the bound


def test_loops_that_print_nothing_are_bounded_too() -> None:
    silent = "{{#each @root.chatMessages}}" * 6 + "{{/each}}" * 6
    with pytest.raises(TemplateError, match=r"runs its loops more than 10,000 times"):
        compile_template(silent, "t").render(MESSAGES, bound=10_000)


@pytest.mark.parametrize("bound", [None, 1_000_000])
def test_a_render_within_the_bound_is_unchanged(bound: int | None) -> None:
    source = "{{#each chatMessages}}{{name}}: {{message}};{{/each}}"
    text = compile_template(source, "t").render_text(MESSAGES, bound)
    assert text == "".join(f"N{i}: {'x' * 50};" for i in range(40))


def test_the_bound_is_exact_in_characters() -> None:
    template = compile_template("{{#each xs}}{{this}}{{/each}}", "t")
    assert template.render_text({"xs": ["ab", "cd"]}, bound=4) == "abcd"
    with pytest.raises(TemplateError, match="more than 3 characters"):
        template.render_text({"xs": ["ab", "cd"]}, bound=3)


def test_the_prompt_bound_grows_with_the_window_from_a_floor() -> None:
    assert bound_for_window(8192) == 4_000_000
    assert bound_for_window(128_000) == 64 * 4 * 128_000


def test_ctx_build_stops_a_runaway_template_with_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    template = tmp_path / "runaway.hbs"
    template.write_text(NESTED.replace("@root.chatMessages", "@root.head"), encoding="utf-8")
    code, out, err = run(capsys, "build", CASE4, "--template", template)
    assert (code, out) == (1, "")
    assert f"{template}: renders more than 4,000,000 characters" in err
    assert len(err.strip().splitlines()) == 1


def test_the_bound_stops_growing_with_the_window_but_always_holds_the_longest_text() -> None:
    from otaku_ctx.hbs.runtime import RENDER_CEILING

    assert bound_for_window(10**9) == RENDER_CEILING == 64 * 2**20
    assert bound_for_window(8192, longest=5_000_000) == 40_000_000
    assert bound_for_window(10**9, longest=10**8) == 8 * 10**8


@pytest.mark.deep
def test_a_runaway_template_stops_at_the_ceiling_whatever_the_window(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --window 10^9 the bound once scaled to 256 billion characters and the run ran out
    of memory after 90 s; now it stops at the ceiling, a one-line error."""
    template = tmp_path / "runaway.hbs"
    template.write_text(NESTED.replace("@root.chatMessages", "@root.head"), encoding="utf-8")
    code, out, err = run(capsys, "build", CASE4, "--template", template, "--window", "1000000000")
    assert (code, out) == (1, "")
    assert f"{template}: renders more than 67,108,864 characters" in err


def test_one_huge_message_is_a_refusal_about_its_size_not_a_template_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import json

    story = tmp_path / "big.jsonl"
    rows = [("user", "hello"), ("assistant", "word " * 1_000_000), ("user", "bye")]
    story.write_text("".join(json.dumps({"role": r, "content": c}) + "\n" for r, c in rows), encoding="utf-8")
    code, out, err = run(capsys, "build", story, "--window", "8192", "--reserve", "100", "--tokenizer", "estimate")
    assert (code, out) == (3, "")
    assert "nothing fits: the smallest prompt reached is 1,2" in err and "characters" not in err
