"""CRLF and lone-CR line ends against Handlebars.js 4.7.8 itself: every conformance case whose
template has a line end (tests/fixtures/handlebars/mustache-spec.json and whitespace-cases.json),
rewritten to `\\r\\n` and to `\\r`, rendered by handlebars 4.7.8 with {noEscape: true} and compared
byte for byte. The golden file crlf.json was made once with `make_crlf_golden.js` beside it; the
tests never run node."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, every
from test_hbs_conformance import DIFFERENCES

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.errors import TemplateError
from otaku_ctx.hbs import compile_template

GOLDEN = FIXTURES / "handlebars"
ENDINGS = {"crlf": "\r\n", "cr": "\r"}


def _load(name: str) -> Any:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


CRLF = _load("crlf.json")
CASES: list[dict[str, Any]] = CRLF["cases"]
# The same skips as test_hbs_conformance: the cases rendered differently on purpose.
RUN = [c for c in CASES if c["name"] not in DIFFERENCES]


def _id(case: dict[str, Any]) -> str:
    return f"{case['ending']}: {case.get('suite', 'whitespace')}: {case['name']}"


def _render(case: dict[str, Any]) -> str:
    return compile_template(case["template"], "t").render_raw(case["data"])


def test_the_golden_file_is_handlebars_478_over_every_case_with_a_line_end() -> None:
    assert CRLF["versions"] == {"handlebars": "4.7.8"} and CRLF["options"] == {"noEscape": True}
    inputs = [c for c in _load("mustache-spec.json")["cases"] if not c.get("skipped")]
    inputs += _load("whitespace-cases.json")
    for ending, eol in ENDINGS.items():
        rewritten = [(c["name"], c["template"], re.sub(r"\r?\n", eol, c["template"])) for c in inputs]
        wanted = [(name, template) for name, original, template in rewritten if template != original]
        have = [(c["name"], c["template"]) for c in CASES if c["ending"] == ending]
        assert have == wanted, f"crlf.json is stale for {ending!r}: run make_crlf_golden.js"
        assert wanted, ending


def test_cases_ran() -> None:
    """The byte-for-byte test below must have something to compare, for both line ends."""
    assert {c["ending"] for c in RUN} == set(ENDINGS)
    assert len(RUN) >= 150


@pytest.mark.parametrize("case", RUN, ids=_id)
def test_the_engine_renders_what_handlebars_renders(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(TemplateError):
            _render(case)
    else:
        assert _render(case).encode("utf-8") == case["expected"].encode("utf-8")


def test_the_reported_case() -> None:
    """A standalone comment between CRLF lines takes one CRLF with it, as Handlebars.js does."""
    assert compile_template("|\r\n{{! c }}\r\n|", "t").render_raw({}) == "|\r\n|"
    assert compile_template("|\r{{! c }}\r|", "t").render_raw({}) == "|\r\r|"


def _ctx(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    status = main([str(a) for a in argv], Terminal(stdin=io.BytesIO(), stdout=out, stderr=err))
    return status, out.getvalue().decode("utf-8"), err.getvalue()


# Through `ctx template render`, which reads the template file: every whitespace case, every third of the spec.
THROUGH_CLI = [c for c in RUN if "error" not in c and "suite" not in c] + [
    c for c in RUN[::3] if "error" not in c and "suite" in c
]


@pytest.mark.parametrize("case", every(THROUGH_CLI, 3), ids=_id)
def test_ctx_template_render_keeps_the_line_ends(case: dict[str, Any], tmp_path: Path) -> None:
    template, variables = tmp_path / "t.hbs", tmp_path / "vars.json"
    template.write_bytes(case["template"].encode("utf-8"))
    variables.write_text(json.dumps(case["data"]), encoding="utf-8")
    assert _ctx("template", "render", template, "--vars", variables) == (0, case["expected"], "")
