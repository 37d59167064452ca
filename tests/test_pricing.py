"""Derived prices: a part's price taken from one stand-in render must be the price of the
part rendered, for every shipped template, format and emit form; a template whose output
depends on more than the text gets rendered prices."""

from __future__ import annotations

import pytest
from conftest import CASE4, REPO, sweep

from otaku_ctx.assemble import Part
from otaku_ctx.build import open_story, renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.render.pricing import TemplatePricer
from otaku_ctx.tokens import make_counter

TEMPLATES = sorted(p.stem for p in (REPO / "configs" / "templates").glob("*.hbs"))
FORMATS = sorted(p.stem for p in (REPO / "configs" / "formats").glob("*.toml"))


def _pricers(template: str, fmt: str, emit: str) -> tuple[TemplatePricer, TemplatePricer]:
    story = open_story(CASE4)
    settings = load_settings(overrides={"prompt.template": (template, "t"), "prompt.format": (fmt, "t")})
    renderer = renderer_for(story, settings, emit=emit)
    count = make_counter("cl100k_base")
    return TemplatePricer(renderer, count), TemplatePricer(renderer, count, derive=False)


@pytest.mark.parametrize(("template", "fmt"), sweep(TEMPLATES, FORMATS))
def test_derived_prices_are_rendered_prices(template: str, fmt: str) -> None:
    story = open_story(CASE4)
    messages = [m for m in story.messages if not m.is_card][:12] + [m for m in story.messages if m.is_card][:1]
    scenes = story.scenes[:4]
    for emit in ("text", "messages"):
        derived, rendered = _pricers(template, fmt, emit)
        for m in messages:
            for after in (None, "user", "assistant", "system"):
                part = Part.verbatim(m)
                assert derived.part(part, after) == rendered.part(part, after), (emit, m.number, after)
        for scene in scenes:
            for kind in ("summary", "history"):
                part = Part(kind, scene=scene)
                assert derived.recap_part(part) == rendered.recap_part(part), (emit, scene.ref, kind)


def test_a_template_that_treats_text_apart_is_rendered(tmp_path) -> None:
    """The text is printed through JSON here: the stand-ins show it, and no price is derived."""
    template = tmp_path / "json.hbs"
    template.write_text(
        "{{#each chatMessages}}{{#if (eq role 'user')}}{{#userBlock}}{{json message}}{{/userBlock}}"
        "{{else}}{{#assistantBlock}}{{name}}: {{message}}{{/assistantBlock}}{{/if}}{{/each}}",
        encoding="utf-8",
    )
    story = open_story(CASE4)
    settings = load_settings(overrides={"prompt.template": (str(template), "t")})
    pricer = TemplatePricer(renderer_for(story, settings), make_counter("cl100k_base"))
    user = next(m for m in story.messages if m.role == "user")
    assistant = next(m for m in story.messages if m.role == "assistant")
    rendered = TemplatePricer(renderer_for(story, settings), make_counter("cl100k_base"), derive=False)
    assert pricer.part(Part.verbatim(user), "assistant") == rendered.part(Part.verbatim(user), "assistant")
    assert pricer.part(Part.verbatim(assistant), "user") == rendered.part(Part.verbatim(assistant), "user")
    shapes = {key[1]: shape is not None for key, shape in pricer._shapes.items()}
    assert shapes == {"user": False, "assistant": True}


def test_the_price_memo_holds_a_bounded_number_of_characters_whatever_the_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server's chats each with a frame of their own (issue 45: 5,000 of them held 260 MB): the
    memo kept between turns counts every piece and text it keeps and starts again past its
    bound, and a shape's id is never given twice, so a price kept under an old id is never read
    for a new shape."""
    from otaku_ctx.config import load_settings
    from otaku_ctx.render.pricing import Prices
    from otaku_ctx.serve import assemble as serve_assemble
    from otaku_ctx.serve.chats import chat_story
    from otaku_ctx.serve.setup import serving
    from otaku_ctx.tokens import make_counter

    monkeypatch.setattr(Prices, "MOST_CHARACTERS", 300_000)
    monkeypatch.setattr(serve_assemble, "_PIPELINES", type(serve_assemble._PIPELINES)())
    settings = serving(load_settings(None, {}))
    rungs, count = serve_assemble.ladder(settings), make_counter("cl100k_base")
    card = "Mira is a sailor on a stormy coast, brave and quick to laugh. " * 40
    shape_of: dict[int, object] = {}
    kept: list[int] = []
    for i in range(150):
        body = {
            "messages": [
                {"role": "system", "content": f"Frame {i}. {card}"},
                *({"role": ("user", "assistant")[k % 2], "content": f"Line {k}: the boat drifts."} for k in range(20)),
            ]
        }
        serve_assemble.assemble_chat(chat_story(body), rungs, count, window=4096, max_tokens=200)
        memo = next(iter(serve_assemble._PIPELINES.values()))[2].prices
        for shape, found in memo.shapes.items():
            assert shape_of.setdefault(found, shape) == shape  # an id is one shape's, ever
        held = (
            sum(len(p) for _, old, new in memo.shapes for p in (*old, *new))
            + sum(len(p) for pieces in memo.renders.values() for p in pieces)
            + sum(len(text) + len(scene) + len(title) for _, text, scene, title in memo.prices)
        )
        assert held <= memo.characters <= Prices.MOST_CHARACTERS, i
        kept.append(memo.characters)
    assert any(b < a for a, b in zip(kept, kept[1:], strict=False))  # it started again, at least once
