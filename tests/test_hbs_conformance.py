"""The engine against Handlebars.js 4.7 itself: every case of tests/fixtures/handlebars/ (the
Mustache spec's comments, interpolation, inverted and sections suites, and the whitespace
cases), rendered by handlebars 4.7.10 with {noEscape: true}, compared byte for byte.
The golden files were made once with `make_golden.js` beside them; the tests never run node."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, REPO, every

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.errors import TemplateError
from otaku_ctx.hbs import compile_template

GOLDEN = FIXTURES / "handlebars"

# The cases rendered differently on purpose, and why (each is listed in docs/templates.md).
DIFFERENCES = {
    "a number as a path segment is a syntax error": (
        "`{{list.1}}` reads item 1 here; Handlebars.js wants `{{list.[1]}}` and refuses the template"
    ),
}


def _cases(name: str) -> list[dict[str, Any]]:
    golden = json.loads((GOLDEN / name).read_text(encoding="utf-8"))
    assert golden["versions"]["handlebars"].startswith("4.7.") and golden["options"] == {"noEscape": True}
    return golden["cases"]


SPEC = _cases("mustache-spec.json")
WHITESPACE = _cases("whitespace.json")
CASES = [c for c in SPEC if not c.get("skipped")] + WHITESPACE


def _id(case: dict[str, Any]) -> str:
    return f"{case.get('suite', 'whitespace')}: {case['name']}"


def _render(case: dict[str, Any]) -> str:
    return compile_template(case["template"], "t").render_raw(case["data"])


def test_the_golden_files_hold_every_case() -> None:
    """Mustache spec v1.1.3 has 88 cases in these four suites; handlebars.js skips none of them."""
    counts = {suite: sum(c["suite"] == suite for c in SPEC) for suite in ("comments", "interpolation", "inverted")}
    assert counts == {"comments": 11, "interpolation": 30, "inverted": 21}
    assert len(SPEC) == 88 and not any(c.get("skipped") for c in SPEC)
    assert len(WHITESPACE) >= 60


@pytest.mark.parametrize("case", [c for c in CASES if c["name"] not in DIFFERENCES], ids=_id)
def test_the_engine_renders_what_handlebars_renders(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(TemplateError):
            _render(case)
    else:
        assert _render(case) == case["expected"]


@pytest.mark.parametrize("name", sorted(DIFFERENCES))
def test_each_listed_difference_is_real_and_documented(name: str) -> None:
    case = next(c for c in CASES if c["name"] == name)
    try:
        differs = "error" in case or _render(case) != case["expected"]
    except TemplateError:
        differs = "error" not in case
    assert differs, f"{name!r} now renders as Handlebars.js does: take it off DIFFERENCES and the docs"
    assert name in (REPO / "docs" / "templates.md").read_text(encoding="utf-8")


def _ctx(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(stdin=io.BytesIO(), stdout=out, stderr=err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


# Through `ctx template render`: every whitespace case, and every third case of the spec.
THROUGH_CLI = [c for c in WHITESPACE if "error" not in c and c["name"] not in DIFFERENCES] + [
    c for c in SPEC[::3] if "error" not in c
]


@pytest.mark.parametrize("case", every(THROUGH_CLI, 3), ids=_id)
def test_ctx_template_render_prints_what_handlebars_prints(case: dict[str, Any], tmp_path: Path) -> None:
    template, variables = tmp_path / "t.hbs", tmp_path / "vars.json"
    template.write_bytes(case["template"].encode("utf-8"))  # bytes: CRLF cases keep their \r\n
    variables.write_text(json.dumps(case["data"]), encoding="utf-8")
    assert _ctx("template", "render", template, "--vars", variables) == (0, case["expected"], "")
