"""The guarded JSON reader's bound on items (issue 28: a 60 MB reply of `[{},{},…]` took 1.66 GB
and 22 s to decode): `jsonload.items_past` counts a document's items exactly, the braces and
commas inside its strings left out, and `loads` refuses more than its bound before decoding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otaku_ctx import jsonload
from otaku_ctx.jsonload import MAX_ITEMS, TooMany, items_past, loads

# text full of what the count must not take for structure when it stands in a string
TRICKY = st.text(alphabet=st.sampled_from(list('ab,:[]{}"\\ \n\u00e9\U0001f600')), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY, inner, max_size=5),
    max_leaves=30,
)


def items(value: Any) -> int:
    """The items `items_past` counts, from the value itself: one for the document, and for
    each container its opening bracket, its commas and (an object) its colons."""

    def marks(v: Any) -> int:
        if isinstance(v, list):
            return 1 + max(len(v) - 1, 0) + sum(marks(x) for x in v)
        if isinstance(v, dict):
            return 1 + 2 * len(v) - (1 if v else 0) + sum(marks(x) for x in v.values())
        return 0

    return 1 + marks(value)


@given(VALUES, st.booleans(), st.booleans())
def test_the_count_is_the_documents_own_whatever_its_strings_hold(value: Any, ascii: bool, spaced: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii, indent=1 if spaced else None)
    n = items(value)
    for data in (text, text.encode("utf-8")):
        assert not items_past(data, n)
        assert items_past(data, n - 1)


def test_a_string_across_the_count_s_chunks_is_left_out() -> None:
    """A string of 3.6 MB of commas, braces and escaped quotes, across several of the exact
    count's 1 MiB chunks, between the document's few items."""
    text = json.dumps(["a", 'x,"{' * 900_000, [1, 2]])
    assert len(text) > 3 << 20
    assert not items_past(text, 6) and items_past(text, 5)
    assert loads(text, most=6)[2] == [1, 2]


def test_past_the_bound_nothing_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's shape at a tenth of its size: 2.1 million `{}` are 4.2 million items,
    refused before orjson or json sees a byte of them."""

    def decoded(*args: object, **kwargs: object) -> object:
        raise AssertionError("a document past the bound was decoded")

    body = b"[" + b"{}," * 2_100_000 + b"{}]"
    if jsonload.orjson is not None:
        monkeypatch.setattr(jsonload.orjson, "loads", decoded)
    monkeypatch.setattr(json, "loads", decoded)
    with pytest.raises(TooMany) as refused:
        loads(body)
    assert refused.value.message == (
        f"JSON of more than {MAX_ITEMS:,} items (values, keys and containers), far past any ctx reads"
    )


def test_a_fair_document_whose_strings_hold_millions_of_marks_is_read() -> None:
    """5 million commas and braces, every one inside a string (escaped quotes too): the rough
    count is past the bound, the exact one is 5."""
    text = '{}",' * 2_500_000
    body = json.dumps({"content": text, "n": 1}).encode()
    assert 1 + sum(body.count(m) for m in (b",", b":", b"[", b"{")) > MAX_ITEMS
    assert loads(body) == {"content": text, "n": 1}


def test_a_short_document_is_never_counted() -> None:
    """Each item past the first is one character: a document shorter than the bound cannot
    pass it, and costs nothing to check (a story's every line goes through `loads`)."""
    assert not items_past("[" + "0," * 49 + "0]", 101)
    assert items_past("[" + "0," * 49 + "0]", 50)
