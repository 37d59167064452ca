"""Parity with otaku's own assembler on otaku's own sample (tour.md, from otaku 0.8.0).

The figures were taken once by running otaku 0.8.0's `otaku.context.assembler.assemble_story`
on tests/fixtures/otaku/tour.md with its default shape (head 20, min tail 150, tail step 50)
and its token estimate (len/4) — see benchmarks/otaku_adapter.py `build`:

    window  otaku 0.8.0 picked
    60000   head 20, summaries 8, no history, tail 154            (case 3)
    50000   head 20, summaries 10, no history, tail 114           (case 5: target 100)
    30000   head 20, summaries 13, no history, tail 54            (case 5: target 50)

At windows close to a boundary (40000, 25000, 20000) the two differ by design: ctx counts
the prompt it really sends (speaker names, card text, the template's framing), which is
longer than otaku's estimate of the bare story text, so ctx degrades one step sooner
(docs/decisions.md, "Parity with otaku").
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings

TOUR = FIXTURES / "otaku" / "tour.md"


@pytest.mark.parametrize(
    ("window", "summaries", "tail", "case"),
    [(60000, 8, 154, 3), (50000, 10, 114, 5), (30000, 13, 54, 5)],
)
def test_ctx_picks_what_otaku_picks(window: int, summaries: int, tail: int, case: int) -> None:
    settings = load_settings(overrides={"model.window": (window, "t"), "model.tokenizer": ("estimate", "t")})
    a = build(open_story(TOUR), settings).assembly
    assert len(a.head) == 20
    assert len(a.summaries) == summaries and a.history is None and a.level == 0
    assert len(a.tail) == tail and a.tail[-1].number == a.messages
    assert a.case == case
