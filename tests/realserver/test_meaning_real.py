"""Recall by meaning against real servers (issue 46): llama.cpp's `llama-server --embeddings`
serving all-MiniLM-L6-v2 (setup.sh converts and pins it), and SmolLM2's server, whose
embeddings endpoint is off.

- `ctx embed` writes a story's vectors with the real model, and `ctx build` then finds by
  meaning the message a paraphrased question asks about ("what did we eat with my mother" for
  "dinner with mom"), which the keyword engine alone leaves out.
- Through `ctx serve`, with `[recall]` pointed at a server whose embeddings endpoint is off
  (SmolLM2's, started without `--embeddings`), every turn is answered, by the keyword engine,
  and why is said."""

from __future__ import annotations

import json
import logging
import sys
import urllib.request
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any

import pytest
from conftest import EMBED_MODEL, RealServer

from otaku_ctx.build import native_text
from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.config import RecallSettings, ServeSettings, Settings
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running
from otaku_ctx.story.meaning import key_of, quantized
from otaku_ctx.story.vectors import append_vectors, vectors_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fast suite's story of small talk
from test_recall import story  # noqa: E402

FACT = "We had dinner with mom at the harbour inn, and she told us about the ferry."
ASKED = "What did we eat with my mother that night?"


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = BytesIO(), StringIO()
    code = main(argv, Terminal(stdin=BytesIO(), stdout=out, stderr=err))
    return code, out.getvalue().decode("utf-8"), err.getvalue()


def test_ctx_embed_then_build_finds_a_paraphrase_by_meaning(tmp_path: Path, embedding_server: RealServer) -> None:
    told = story(n=201, facts={30: FACT, 201: ASKED})
    path = tmp_path / "chat.jsonl"
    path.write_text(native_text(told), encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(
        "[context]\nhead_messages = 4\nmin_tail_messages = 20\ntail_step = 10\ntail_floor = 10\n"
        'reply_reserve = 0\nrecall = 0.2\n[model]\nwindow = 900\ntokenizer = "estimate"\n'
        f'[recall]\nurl = "{embedding_server.url}"\nmodel = "{EMBED_MODEL}"\n',
        encoding="utf-8",
    )
    # before its vectors are written, the keyword engine alone recalls, and leaves the fact out
    keywords = run(["build", str(path), "--config", str(config)])
    assert keywords[0] == 0 and FACT not in keywords[1] and "no vectors written yet" in keywords[2]
    code, out, err = run(["embed", str(path), "--config", str(config), "--json"])
    assert code == 0, err
    done = json.loads(out)
    assert done["embedded"] == done["texts"] >= 3 and Path(done["vectors"]).stat().st_size > 384 * done["texts"]
    code, out, err = run(["inspect", str(path), "--config", str(config), "--explain"])
    assert code == 0, err
    explained = " ".join(out.replace("│", " ").split())  # the explanation, its box and wrapping undone
    said = explained[explained.index("recall by meaning and keywords") :]
    assert "message 30 (Tobias): meaning 0." in said[:2000], said[:2000]
    code, prompt, err = run(["build", str(path), "--config", str(config)])
    assert code == 0 and FACT in prompt and "recall by keywords alone" not in err


def test_serve_with_the_embeddings_endpoint_off_answers_each_turn_by_keywords(
    real_server: RealServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SmolLM2's llama-server, started without `--embeddings`, refuses `/v1/embeddings`: each
    turn is answered, by the keyword engine, the server's refusal said once in the log and in
    each turn's stats. The chat's vectors are there (written beforehand), so the query is asked."""
    import openai

    recall = RecallSettings(url=real_server.url, model="SmolLM2", timeout=10.0)
    settings = Settings(serve=ServeSettings(backend=real_server.url, port=0, summarize=False), recall=recall)
    running = Running(Service(settings))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Keeper, the lighthouse keeper."}]
    for i in range(1, 120):
        line = f"Line {i}: the lamp, the gulls and the tide number {i}."
        messages.append({"role": "assistant" if i % 2 else "user", "content": line})
    talk = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0, timeout=300)
    try:
        with caplog.at_level(logging.INFO, logger="otaku_ctx.serve"):
            talk.chat.completions.create(model="m", messages=messages[:100], max_tokens=8)
            talk.chat.completions.create(model="m", messages=messages[:100], max_tokens=8)
            [session] = list(running.service.sessions)
            path = vectors_for(running.service.store.path(session.pool), recall.model)
            path.parent.mkdir(parents=True, exist_ok=True)
            texts = [m["content"] for m in messages[1:]]
            append_vectors(path, recall.model, [(key_of(t), quantized([1.0, float(len(t))])) for t in texts])
            for n in (102, 104, 106):
                reply = talk.chat.completions.create(model="m", messages=messages[:n], max_tokens=8)
                assert reply.choices[0].message.content is not None
        stats = json.loads(urllib.request.urlopen(running.url.removesuffix("/v1") + "/ctx/stats").read())
    finally:
        running.stop()
    turns = stats["chats"][0]["turns"]
    late = turns[-3:]
    assert all(t["recall_engine"] in ("keywords", "") for t in turns), turns
    assert all("the embeddings server" in t["recall_why"] for t in late if t["recall_engine"]), late
    said = [r.getMessage() for r in caplog.records if "the embeddings server" in r.getMessage()]
    assert len(said) == 1, said
    print(f"said: {said[0]}")
