"""Token counting and cost: exact and offline, special tokens as text, each text once, the
covered middle never tokenised."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stories import story

from otaku_ctx import tokens
from otaku_ctx.assemble import Shape, assemble
from otaku_ctx.build import renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.errors import ConfigError
from otaku_ctx.render.pricing import TemplatePricer
from otaku_ctx.tokens import make_counter


def test_cl100k_is_exact():
    count = make_counter("cl100k_base")
    assert count("hello world") == 2
    assert count("") == 0


def test_special_tokens_are_counted_as_text():
    count = make_counter("cl100k_base")
    # As one special token <|endoftext|> would be 1; as text it is several ordinary tokens.
    assert count("<|endoftext|>") > 1
    assert count("<|im_start|>user") > 2


def test_estimate_is_len_over_four():
    count = make_counter("estimate")
    assert count("abcdefg") == 1 and count("abcdefgh") == 2
    assert count.bound("abcdefg") == 2  # a piece of a prompt is priced rounding up


def test_each_distinct_text_is_counted_once():
    count = make_counter("cl100k_base")
    for _ in range(3):
        count("the same text")
    count("another")
    assert count.calls == 2


def test_unknown_tokenizer():
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        make_counter("gpt2")


def test_a_counter_is_what_it_was_made_with_and_only_its_cache_changes():
    """Its facts are given when it is made (a model's counter by model/), then read-only."""
    plain = make_counter("cl100k_base")
    assert (plain.specials, plain.bos, plain.added, plain.parses_specials) == ((), "", 0, False)
    model = tokens.TokenCounter("m", len, specials=("<s>", "</s>"), bos="<s>", added=1, parses_specials=True)
    assert (model.name, model.specials, model.bos, model.added) == ("m", ("<s>", "</s>"), "<s>", 1)
    assert model.parses_specials and model.additive
    for name, value in [("name", "x"), ("specials", ()), ("bos", ""), ("added", 0), ("parses_specials", False)]:
        with pytest.raises(AttributeError):
            setattr(model, name, value)
    assert model("abc") == 3 and model.calls == 1


def test_loading_cl100k_reaches_no_network(monkeypatch, tmp_path):
    """Load the encoding afresh with sockets forbidden and an empty tiktoken cache."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access at run time")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    encoding = tokens._cl100k.__wrapped__()
    assert len(encoding.encode_ordinary("offline works")) == 2


class Spy:
    """A counter that records every text it is asked to count."""

    def __init__(self):
        self.inner = make_counter("cl100k_base")
        self.seen: list[str] = []
        self.name = self.inner.name
        self.additive = True
        self.added = 0  # a counter of no model: the server adds nothing
        self.parses_specials = False

    def __call__(self, text: str) -> int:
        self.seen.append(text)
        return self.inner(text)

    def bound(self, text: str) -> int:
        return self(text)

    def context(self, text: str) -> str:
        return self.inner.context(text)


def test_the_covered_middle_is_never_tokenised():
    s = story(2000, [(20 * k + 1, 20 * k + 20) for k in range(100)], text="middle")
    spy = Spy()
    renderer = renderer_for(s, load_settings())
    a = assemble(s, Shape(), 8000, TemplatePricer(renderer, spy))
    assert a.case in (3, 4)
    verbatim = {m.number for m in a.head} | {m.number for m in a.tail}
    middle = [m for m in s.messages if m.number not in verbatim]
    assert middle
    counted = "\n".join(spy.seen)
    for m in middle:
        assert f"Mara: {m.content}\n" not in counted and f"Ilya: {m.content}\n" not in counted
    # Work grows with the window: far fewer distinct texts counted than the story has messages.
    assert len(set(spy.seen)) < 500


# ── The look-behind a price needs ────────────────────────────────────────────────────────

_TEXTS = st.text(alphabet=st.sampled_from(list("ab é字 \n\t\r'sdm.,!?0123456789<|>")), max_size=400)


@given(_TEXTS, _TEXTS, st.integers(0, 300))
def test_the_context_of_a_text_counts_what_follows_it_as_the_whole_does(before: str, after: str, pad: int) -> None:
    from otaku_ctx.tokens import cl100k_context

    count = make_counter("cl100k_base")
    before = "x" * pad + " word" * (pad // 7) + before
    end = cl100k_context(before)
    assert before.endswith(end) and len(end) <= max(len(before), 1)
    assert count(before + after) - count(before) == count(end + after) - count(end)


_WORDS = st.lists(
    st.tuples(
        st.text(alphabet=st.sampled_from(list("aZé字'sd.,!?09<|>")), min_size=1, max_size=6),
        st.sampled_from([" ", "  ", "\n", " \n ", "\t ", "\xa0", "\u3000 ", "\r\n  ", ""]),
    ),
    max_size=60,
)


@given(_WORDS, st.integers(0, 400))
def test_a_word_start_is_where_tiktokens_pattern_starts_a_piece(words: list[tuple[str, str]], at: int) -> None:
    from otaku_ctx.tokens import _pieces, _word_start

    text = "".join(word + gap for word, gap in words)
    start = _word_start(text, min(at, len(text) - 2)) if len(text) >= 2 else None
    if start is not None:
        assert start in {piece.start() for piece in _pieces().finditer(text)}


@pytest.mark.parametrize(("before", "after"), [("word " * 10 + "x" * 151, "yz"), ("word " * 10 + "x" * 150, "y")])
def test_the_context_starts_where_a_piece_starts(before: str, after: str) -> None:
    """A last piece longer than the look-behind: cut inside it, the count would be wrong."""
    from otaku_ctx.tokens import LOOK_BEHIND, cl100k_context

    count = make_counter("cl100k_base")
    end, naive = cl100k_context(before), before[-LOOK_BEHIND:]
    assert count(before + after) - count(before) == count(end + after) - count(end)
    assert count(before + after) - count(before) != count(naive + after) - count(naive)


def test_the_context_of_a_long_text_is_short() -> None:
    from otaku_ctx.tokens import LOOK_BEHIND, cl100k_context

    lore = "The lighthouse keeper remembers every ship. " * 500
    end = cl100k_context(lore)
    assert LOOK_BEHIND <= len(end) < 2 * LOOK_BEHIND


_EDITS = st.lists(
    st.tuples(st.sampled_from(["append", "cut", "edit"]), st.integers(0, 10_000), _TEXTS), min_size=1, max_size=8
)


@given(_TEXTS, _EDITS)
def test_the_prefix_encoder_encodes_each_text_as_tiktoken_does(first: str, edits: list[tuple[str, int, str]]) -> None:
    """A replay's prompts: each mostly the one before, grown, cut or changed somewhere."""
    from otaku_ctx.tokens import PrefixEncoder, _cl100k

    encode, core = PrefixEncoder(), _cl100k()
    text = "The keeper climbs the stair. " * 5 + first
    for kind, at, piece in edits:
        at %= len(text) + 1
        text = {"append": text + piece, "cut": text[:at], "edit": text[:at] + piece + text[at + len(piece) :]}[kind]
        assert encode(text) == core.encode_ordinary(text)


def test_a_counter_that_outlives_many_builds_keeps_only_recent_long_texts() -> None:
    """A replay lends one counter to every turn; it once kept every turn's whole prompt. Short
    texts (messages) stay cached for good, long ones (whole prompts) only while recent, and a
    long text counted again after it was dropped counts the same."""
    from otaku_ctx.tokens import _LONG, _RECENT_LONG

    count = make_counter("estimate")
    shorts = [f"message {i}" for i in range(500)]
    longs = [f"{i:06d}" + "x" * _LONG for i in range(10 * _RECENT_LONG)]
    for text in [*shorts, *longs]:
        count(text)
    kept = [text for text in count._cache if len(text) > _LONG]
    assert len(kept) == _RECENT_LONG and kept == longs[-_RECENT_LONG:]
    assert all(text in count._cache for text in shorts)
    assert count(longs[0]) == len(longs[0]) // 4 and count.calls == 500 + 10 * _RECENT_LONG + 1
