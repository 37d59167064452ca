"""Golden prompts: every bundled example × shipped template × format × emit form, byte for byte.

The expected prompts live in `tests/golden/<example>/<template>.<format>.<emit>`. After a
deliberate change of output, rewrite them with `pytest tests/test_golden.py --update-golden`
and review the diff like code.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, REPO, sweep

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.render.emit import EMITS

GOLDEN = Path(__file__).parent / "golden"
TEMPLATES = sorted(p.stem for p in (REPO / "configs" / "templates").glob("*.hbs"))
FORMATS = sorted(p.stem for p in (REPO / "configs" / "formats").glob("*.toml"))


@pytest.mark.parametrize(("template", "example", "format"), sweep(TEMPLATES, EXAMPLES, FORMATS))
def test_golden_prompts(example: Path, template: str, format: str, request: pytest.FixtureRequest) -> None:
    story = open_story(example)
    update = request.config.getoption("--update-golden")
    folder = GOLDEN / example.stem
    mismatched = []
    settings = load_settings(overrides={"prompt.template": (template, "test"), "prompt.format": (format, "test")})
    for emit in EMITS:
        built = build(story, settings, emit=emit)
        assert built.prompt is not None, f"{example.stem} {template} {format} {emit}: refused"
        path = folder / f"{template}.{format}.{emit}"
        if update:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(built.prompt.encode("utf-8"))
        elif path.read_bytes() != built.prompt.encode("utf-8"):
            mismatched.append(path.name)
    assert not mismatched, f"prompts differ from tests/golden/{example.stem}: {', '.join(mismatched)}"


def test_every_golden_file_is_checked() -> None:
    """A golden file left behind by a removed template, format or example fails loudly."""
    expected = {f"{e.stem}/{t}.{f}.{emit}" for e in EXAMPLES for t in TEMPLATES for f in FORMATS for emit in EMITS}
    present = {f"{p.parent.name}/{p.name}" for p in GOLDEN.glob("*/*")}
    assert present == expected
