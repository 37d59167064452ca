"""pybars3 has no public grammar API: the engine extends `Compiler._handlebars`. These tests fail
loudly, saying what moved, when an upgrade of pybars3 or PyMeta3 changes that private hook."""

from __future__ import annotations

from importlib.metadata import version

import pybars
import pytest

from otaku_ctx.hbs import compile_template, grammar


@pytest.mark.parametrize("dist", sorted(grammar.PINNED))
def test_the_installed_versions_are_the_pinned_ones(dist: str) -> None:
    wanted = grammar.PINNED[dist]
    assert version(dist) == wanted, (
        f"{dist} {version(dist)} is installed but otaku_ctx/hbs/grammar.py extends the private grammar of "
        f"{dist} {wanted}: check the hook (this file's other tests), then update PINNED and pyproject.toml"
    )


def test_the_private_grammar_hook_is_where_the_engine_expects_it() -> None:
    problems = grammar.hook_problems()
    assert not problems, "pybars3's private grammar hook moved: " + "; ".join(problems)
    assert {"start", "finish", "template", "expression_inner", "path"} <= grammar.inherited_rules()


def test_a_moved_hook_is_reported_not_crashed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = type("Grammar", (), {"makeGrammar": classmethod(lambda cls, *a: cls)})
    monkeypatch.setattr(pybars.Compiler, "_handlebars", rules)
    problems = grammar.hook_problems()
    assert "pybars' grammar no longer has the rule `start`" in problems
    monkeypatch.delattr(pybars.Compiler, "_handlebars")
    assert grammar.hook_problems() == [
        "pybars.Compiler._handlebars, the PyMeta grammar class this engine extends, is gone or changed"
    ]


def test_the_extended_grammar_parses_what_it_adds() -> None:
    """Block params, else-if chains and decimals are this engine's rules on top of pybars'."""
    source = "{{#each xs as |x i|}}{{#if (gt x 1.5)}}{{i}}{{else if x}}-{{else}}0{{/if}}{{/each}}"
    assert compile_template(source, "t").render_text({"xs": [2, 1, 0]}) == "0-0"
