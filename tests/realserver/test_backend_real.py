"""The client against a real model server (llama.cpp's llama-server, SmolLM2-135M-Instruct; see
conftest.py). SmolLM2 is a weak writer, so these check the contracts, not the prose; every
generation is short (at most 16-128 tokens, repeat_penalty 1.1 so temperature 0 does not loop)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from otaku_ctx.backend import Backend, ContextTooLong, FormatRefused, Reply

NO_LOOPS = {"repeat_penalty": 1.1}


def ask(backend: Backend, content: str, **kwargs: object) -> Reply:
    kwargs.setdefault("max_tokens", 16)
    return backend.chat(
        [{"role": "user", "content": content}],
        temperature=0,
        extra=NO_LOOPS,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_chat_completion_with_usage(backend: Backend) -> None:
    reply = ask(backend, "Say hello to Mara, the lighthouse keeper.")
    assert reply.text.strip()
    assert reply.finish_reason in ("stop", "length")
    assert reply.prompt_tokens and reply.prompt_tokens > 5
    assert reply.completion_tokens and 0 < reply.completion_tokens <= 16


def test_the_window_is_the_context_of_a_slot(backend: Backend, real_server) -> None:
    """llama.cpp splits `-c` among its `-np` slots: one request gets 4,096 / 2 tokens."""
    assert backend.window() == real_server.context // real_server.slots == 2048


def test_tokenize(backend: Backend) -> None:
    tokens = backend.tokenize("The lamp-room door creaks open.")
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert backend.tokenize("") == []
    # special tokens are read as the text they are, not as one control token
    special = backend.tokenize("<|im_start|>")
    assert special is not None and len(special) > 1


def test_a_json_schema_is_kept(backend: Backend) -> None:
    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "summary": {"type": "string", "maxLength": 160},
        },
        "required": ["title", "summary"],
        "additionalProperties": False,
    }
    reply = ask(
        backend,
        "Mara knocks on the lamp-room door; the latch lifts on its own. Give this scene a title and a summary.",
        max_tokens=128,
        response_format={"type": "json_schema", "json_schema": {"name": "scene", "schema": schema}},
    )
    scene = json.loads(reply.text)
    assert set(scene) == {"title", "summary"}
    assert isinstance(scene["title"], str) and len(scene["title"]) <= 40
    assert isinstance(scene["summary"], str) and len(scene["summary"]) <= 160


def test_a_response_format_it_refuses(backend: Backend) -> None:
    with pytest.raises(FormatRefused, match="response_format"):
        ask(backend, "Hello.", response_format={"type": "xml"})


def test_an_oversized_prompt_is_too_long(backend: Backend) -> None:
    with pytest.raises(ContextTooLong) as error:
        ask(backend, "word " * 3000)
    assert error.value.window == 2048
    assert error.value.prompt_tokens and error.value.prompt_tokens > 2048
    assert "exceeds the available context size" in str(error.value)


def test_two_requests_at_once(backend: Backend) -> None:
    """`-np 2`: two slots answer two requests together (what `summarize --jobs 2` will send)."""
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda who: ask(backend, f"Say hello to {who}."), ["Mara", "Ilya"]))
    assert all(reply.text.strip() and reply.completion_tokens for reply in replies)
