"""Recall by meaning (issue 46, seed 000's RAG Infill Engine): the embeddings client, the vectors
file beside the summaries, each mechanic (two passes, Reciprocal Rank Fusion, MMR, budgets by
kind) and "never neither" — every failure of the embeddings leaves the keyword engine recalling,
with the reason said. Against `embedder.py`'s stand-in, whose "model" knows that mom is mother
and dinner a meal; the real embedding model is tests/realserver's."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import test_serve
from embedder import Embedder, vector_of
from test_recall import settings, story

from otaku_ctx.assemble import Part
from otaku_ctx.assemble.meaning import MOST_MEANT, diverse, fused, led, meant, within_budgets
from otaku_ctx.backend import Backend, BadReply
from otaku_ctx.build import Pipeline
from otaku_ctx.config import RecallSettings, Settings
from otaku_ctx.embed import Held, meaning_for, texts_of, with_meaning, write_vectors
from otaku_ctx.report import describe
from otaku_ctx.serve.http import Service
from otaku_ctx.serve.listen import Running
from otaku_ctx.story.meaning import Meaning, key_of, quantized, similarity
from otaku_ctx.story.model import Message, Scene
from otaku_ctx.story.vectors import Vectors, VectorsError, append_vectors, vectors_for

FACT = "We had dinner with mom at the harbour inn, and she told us about the ferry."
ASKED = "What did we eat with my mother that night?"


@pytest.fixture
def embedder() -> Iterator[Embedder]:
    server = Embedder().start()
    yield server
    server.stop()


def recall_of(server: Embedder, **given: object) -> RecallSettings:
    return RecallSettings(url=server.url, model="stand-in", **given)  # type: ignore[arg-type]


# the client --------------------------------------------------------------------------------------


def test_the_openai_and_ollama_endpoints_give_the_vectors_in_order(embedder: Embedder) -> None:
    texts = ["dinner with mom", "the ferry sank", "a meal with mother"]
    openai = Backend(embedder.url, "m").embed(texts)
    ollama = Backend(embedder.url.removesuffix("/v1"), "m")
    ollama._server = (__import__("otaku_ctx.backend", fromlist=["SERVERS"]).SERVERS["Ollama"], None)  # type: ignore[assignment]
    assert openai == [vector_of(t) for t in texts] == ollama.embed(texts)
    a, b, c = map(quantized, openai)
    assert similarity(a, c) > 0.9 > 0.2 > similarity(a, b)  # the paraphrase is near, the other far


@pytest.mark.parametrize("mode", ["nan", "dims", "few"])
def test_an_embeddings_reply_that_is_wrong_is_a_bad_reply(embedder: Embedder, mode: str) -> None:
    embedder.mode = mode
    with pytest.raises(BadReply) as raised:
        Backend(embedder.url, "m").embed(["one text", "another text"])
    assert str(raised.value).count("\n") == 0 and embedder.url in str(raised.value)


# the vectors file --------------------------------------------------------------------------------


def test_the_vectors_file_is_content_addressed_and_appended(tmp_path: Path) -> None:
    path = vectors_for(tmp_path / "chat.jsonl.ctx-summaries", "stand-in")
    assert path.name.startswith("chat.jsonl.") and path.name.endswith(".ctx-vectors")
    records = [(key_of(t), quantized(vector_of(t))) for t in ("one", "two")]
    assert append_vectors(path, "stand-in", records) == 2
    size = path.stat().st_size
    # bytes a text: its key and a byte a number, after one line naming the model
    assert size == len(path.read_bytes().split(b"\n", 1)[0]) + 1 + 2 * (16 + 64)
    assert append_vectors(path, "stand-in", [*records, records[0]]) == 2  # a key twice in one call: once
    with Vectors(path, "stand-in") as vectors:  # a key two writers added at once: held twice, read once
        assert len(vectors) == 2 and vectors.get(key_of("two")) == quantized(vector_of("two"))
        assert vectors.get(key_of("three")) is None


def test_a_record_cut_short_by_a_crash_is_not_read_and_the_next_writer_cuts_it_off(tmp_path: Path) -> None:
    path = tmp_path / "v.ctx-vectors"
    append_vectors(path, "m", [(key_of("one"), quantized(vector_of("one")))])
    whole = path.read_bytes()
    path.write_bytes(whole + key_of("two") + b"\x01\x02")  # a writer killed mid-record
    with Vectors(path, "m") as vectors:
        assert len(vectors) == 1
    append_vectors(path, "m", [(key_of("three"), quantized(vector_of("three")))])
    with Vectors(path, "m") as vectors:
        assert len(vectors) == 2 and vectors.get(key_of("three")) == quantized(vector_of("three"))
    assert path.stat().st_size == len(whole) + 16 + 64


def test_a_vectors_file_of_another_model_or_no_vectors_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "v.ctx-vectors"
    append_vectors(path, "m", [(key_of("one"), quantized(vector_of("one")))])
    with pytest.raises(VectorsError, match="holds the vectors of 'm', not 'other'"):
        Vectors(path, "other")
    size = path.stat().st_size
    with pytest.raises(VectorsError, match="holds vectors of 64 numbers; the model now gives 3"):
        append_vectors(path, "m", [(key_of("two"), quantized([1.0, 2.0, 3.0]))])  # the model changed its size
    assert path.stat().st_size == size
    (tmp_path / "junk.ctx-vectors").write_bytes(b"\x00" * 100)
    with pytest.raises(VectorsError, match="not a vectors file"):
        Vectors(tmp_path / "junk.ctx-vectors", "m")
    with Vectors(tmp_path / "absent.ctx-vectors", "m") as none:
        assert len(none) == 0


def test_writing_embeds_only_what_the_file_lacks(tmp_path: Path, embedder: Embedder) -> None:
    path = tmp_path / "v.ctx-vectors"
    backend = Backend(embedder.url, "stand-in")
    first = write_vectors(["a", "b", "c"], path, backend, batch=2)
    assert (first.embedded, first.requests, first.had) == (3, 2, 0)
    again = write_vectors(["a", "b", "c", "d edited"], path, backend, batch=2)
    assert (again.embedded, again.requests, again.had) == (1, 1, 3) and embedder.asked[-1] == ["d edited"]


# the mechanics -----------------------------------------------------------------------------------


def _messages(n: int) -> list[Part]:
    return [Part("recall", message=Message(i, "user", f"text {i}")) for i in range(1, n + 1)]


def test_reciprocal_rank_fusion_puts_first_what_both_rankings_rank_high() -> None:
    a, b, c, d = _messages(4)
    order = fused([[a, b, c], [b, d, c], [b, d]], k=60)
    assert [p.message.number for p, _ in fused([[a], [c], [b, a]], [1, 1, 2])] == [1, 2, 3]  # type: ignore[union-attr]
    scores = dict((p.message.number, s) for p, s in order)  # type: ignore[union-attr]
    assert [p.message.number for p, _ in order] == [2, 4, 3, 1]  # type: ignore[union-attr]
    assert scores[2] == pytest.approx(1 / 62 + 1 / 61 + 1 / 61) and scores[1] == pytest.approx(1 / 61)


def test_each_engine_s_surest_leads_what_the_rankings_agree_on() -> None:
    """A candidate middling in every ranking outscores one first in one ranking alone; the
    keyword engine's best (an exact fact) and the question's nearest still come first."""
    parts = _messages(5)
    a, b, c, d, e = parts
    order = fused([[b, e, a], [e, b], [c, e, d]], [1, 1, 1])
    assert order[0][0] is e  # second, second, first... agreed on by all
    assert [p for p, _ in led(order, [b, c])][:3] == [b, c, e]
    assert [p for p, _ in led(order, [b, b])][:2] == [b, e]  # one leader twice is once


def test_mmr_spreads_near_copies_of_one_scene() -> None:
    """Three alike rank first by relevance: MMR takes the first, then the other scene, then the
    one only alike; the near-copy of the first is left out (it adds nothing)."""
    parts = _messages(4)
    vectors = {1: quantized([1, 0, 0]), 2: quantized([1, 0.01, 0]), 3: quantized([1, 0.6, 0]), 4: quantized([0, 1, 0])}
    ranked = [(parts[0], 1.0), (parts[1], 0.99), (parts[2], 0.98), (parts[3], 0.9)]
    taken = [p.message.number for p, _ in diverse(ranked, vectors, lam=0.7)]  # type: ignore[union-attr]
    assert taken == [1, 4, 3]
    assert [p.message.number for p, _ in diverse(ranked, vectors, lam=1.0)] == [1, 3, 4]  # type: ignore[union-attr]


def test_each_kind_fills_its_share_of_the_budget_and_lends_what_it_leaves() -> None:
    class Pricer:
        def recap_part(self, part: Part) -> int:
            return 10

    scene = Part("recall", scene=Scene(1, 1, 5, 1, "", "a summary", ""))
    messages = _messages(10)
    ranked = [(p, 1.0) for p in messages] + [(scene, 0.5)]
    taken = within_budgets(ranked, 100, Pricer(), {"history": 0.4, "message": 0.6})  # type: ignore[arg-type]
    assert sum(1 for p, _ in taken if p.message) == 9 and any(p.scene for p, _ in taken)  # 60 + what history left
    assert len(taken) == 10  # the budget, 10 a part


def test_past_its_bound_meaning_reads_the_nearest_scenes_messages_first() -> None:
    n = MOST_MEANT * 2
    messages = [Message(i, "user", f"small talk {i}") for i in range(1, n + 1)]
    messages[9] = replace(messages[9], content=FACT)
    scenes = [Scene(k + 1, a, a + 19, k + 1, "", "small talk" if a != 1 else "dinner with mom", "") for k, a in
              enumerate(range(1, n, 20))]  # fmt: skip
    meaning = Meaning("m", lambda t: quantized(vector_of(t)), quantized(vector_of(ASKED)), None)
    found = meant(scenes, messages, meaning)
    assert len(found) == MOST_MEANT
    assert any(m.part.message is not None and m.part.message.number == 10 for m in found)  # scene 1's
    assert any(m.part.message is not None and m.part.message.number == n for m in found)  # then the newest


# recall by meaning, and never neither ------------------------------------------------------------


def _told(tmp_path: Path) -> object:
    told = story(n=201, facts={30: FACT, 201: ASKED})  # the question is the player's (Mara's)
    return replace(told, path=tmp_path / "chat.jsonl")


def test_a_paraphrased_question_recalls_by_meaning_what_keywords_miss(tmp_path: Path, embedder: Embedder) -> None:
    told = _told(tmp_path)
    recall = recall_of(embedder)
    path = vectors_for(tmp_path / "chat.jsonl.ctx-summaries", recall.model)
    write_vectors(texts_of(told), path, Backend(embedder.url, "stand-in"), batch=64)  # type: ignore[arg-type]
    keywords = Pipeline(settings()).build(told)  # type: ignore[arg-type]
    assert keywords.prompt is not None and FACT not in keywords.prompt  # no rare word shared
    meant_ = with_meaning(told, recall, Held(path, recall.model))  # type: ignore[arg-type]
    built = Pipeline(settings()).build(meant_)
    assert built.prompt is not None and FACT in built.prompt
    said = describe(built.assembly.steps[-1])
    assert said.startswith("recall by meaning and keywords:") and "message 30 (Tobias): meaning 0." in said
    assert embedder.asked[-1] == [ASKED, "\n".join(
        f"{m.name}: {m.content}" for m in told.messages[-10:])]  # type: ignore[attr-defined]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("404", "the embeddings server:"),
        ("500", "the embeddings server:"),
        ("nan", "finite number"),
        ("few", "vectors for 2 texts"),
        ("slow", "the embeddings server:"),
        ("none", "no vectors written yet"),
        ("dims", "the model gives"),
    ],
)
def test_every_failure_of_the_embeddings_leaves_the_keyword_engine_recalling(
    tmp_path: Path, embedder: Embedder, mode: str, why: str
) -> None:
    """ "One or the other is always active, never neither": the prompt is the keyword engine's,
    to the byte, and what ran and why is said."""
    told = replace(story(), path=tmp_path / "chat.jsonl")
    recall = recall_of(embedder, timeout=0.5)
    path = vectors_for(tmp_path / "chat.jsonl.ctx-summaries", recall.model)
    if mode != "none":
        vectors = [(key_of(t), quantized(vector_of(t) + ([0.0] if mode == "dims" else []))) for t in texts_of(told)]
        append_vectors(path, recall.model, vectors)
    embedder.mode, embedder.delay = ("" if mode in ("none", "dims") else mode), 2.0
    meaning = meaning_for(told, recall, Held(path, recall.model))
    assert why in meaning.failed and "\n" not in meaning.failed
    built = Pipeline(settings()).build(replace(told, meaning=meaning))
    keywords = Pipeline(settings()).build(told)
    assert built.prompt == keywords.prompt and built.prompt is not None
    said = describe(built.assembly.steps[-1])
    assert said.startswith("recall by keywords alone (") and why in said


def test_ctx_build_with_recall_configured_says_why_the_keywords_ran(
    tmp_path: Path, embedder: Embedder, capsys: pytest.CaptureFixture[str]
) -> None:
    from otaku_ctx.cli.app import main

    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "\n".join(json.dumps({"role": "user" if i % 2 else "assistant", "content": f"line {i}"}) for i in range(1, 40)),
        encoding="utf-8",
    )
    code = main(["build", str(chat), "--window", "400", "--config", str(_config(tmp_path, embedder))])
    captured = capsys.readouterr()
    assert code == 0 and captured.out
    assert "ctx: recall by keywords alone: no vectors written yet (`ctx embed` writes them)" in captured.err
    assert main(["embed", str(chat), "--config", str(_config(tmp_path, embedder))]) == 0
    assert "39 texts embedded in 2 requests" in capsys.readouterr().out
    assert main(["build", str(chat), "--window", "400", "--config", str(_config(tmp_path, embedder))]) == 0
    assert "recall by keywords alone" not in capsys.readouterr().err


def _config(tmp_path: Path, server: Embedder) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(f'[recall]\nurl = "{server.url}"\nmodel = "stand-in"\n', encoding="utf-8")
    return config


# through ctx serve -------------------------------------------------------------------------------

stand_in = test_serve.stand_in  # the stand-in chat backend, as test_serve's tests have it


def _serve_settings(backend: str, recall: RecallSettings) -> Settings:
    return replace(test_serve.settings_for(backend, summarize=True), recall=recall)


def _stats(running: Running) -> dict[str, Any]:
    chat: dict[str, Any] = json.loads(test_serve._get(running, "/ctx/stats"))["chats"][0]
    return chat


def test_serve_writes_the_vectors_in_a_pause_and_then_recalls_by_meaning(
    stand_in: test_serve.StandIn, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    """A chat's first turns recall by keywords (no vectors yet: said once in the log and in each
    turn's stats); its summaries' pass writes the vectors the chat lacks in the pause; the turn
    that asks in other words recalls the answer by meaning, and says so."""
    stand_in.window = 2048
    messages = test_serve.chat(200)
    messages[30]["content"] = FACT
    running = Running(Service(_serve_settings(stand_in.url, recall_of(embedder))))
    home = Path(os.environ["OTAKU_HOME"]) / "chats"
    try:
        talk = test_serve.client(running)
        with caplog.at_level(logging.INFO, logger="otaku_ctx.serve"):
            test_serve.begun(talk, messages[:181], max_tokens=100)
            for n in (181, 183):
                talk.chat.completions.create(model="m", messages=messages[:n], max_tokens=100)
            deadline = time.monotonic() + 60  # a hang guard
            while _stats(running)["summaries_writing"] or not list(home.glob("*.ctx-vectors")):
                assert time.monotonic() < deadline, "no vectors written in the pause"
                time.sleep(0.05)
            asked = [*messages[:200], {"role": "user", "name": "Mara", "content": ASKED}]
            talk.chat.completions.create(model="m", messages=asked, max_tokens=100)
        sent = stand_in.bodies[-1]["messages"]
        assert any(m["content"].startswith("[Earlier, message 30 · Mara]") and FACT in m["content"] for m in sent)
        turns = _stats(running)["turns"]
    finally:
        running.stop()
    assert turns[0]["recall_engine"] == "keywords" and "no vectors written yet" in turns[0]["recall_why"]
    assert turns[-1]["recall_engine"] == "meaning" and turns[-1]["recall_why"] == ""
    assert "message 30" in turns[-1]["recalled"]
    said = [r.getMessage() for r in caplog.records if "recall by keywords alone" in r.getMessage()]
    assert len(said) == 1 and "no vectors written yet" in said[0]
    embedded = [r.getMessage() for r in caplog.records if "embedded for recall by meaning" in r.getMessage()]
    assert embedded and any("recalled by meaning message 30" in r.getMessage() for r in caplog.records)


def test_serve_with_its_embeddings_server_down_answers_every_turn_by_keywords(
    stand_in: test_serve.StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Never neither: the embeddings server refuses every connection; each turn is answered, by
    the keyword engine, the reason said once in the log and in each turn's stats."""
    down = Embedder()
    url = down.url
    down.server_close()  # nothing listens there now
    stand_in.window = 2048
    messages = test_serve.chat(200)
    running = Running(Service(_serve_settings(stand_in.url, RecallSettings(url=url, model="m", timeout=1.0))))
    try:
        talk = test_serve.client(running)
        with caplog.at_level(logging.INFO, logger="otaku_ctx.serve"):
            test_serve.begun(talk, messages[:181], max_tokens=100)
            for n in (181, 183, 185):
                talk.chat.completions.create(model="m", messages=messages[:n], max_tokens=100)
        turns = _stats(running)["turns"]
    finally:
        running.stop()
    assert len(turns) == 4 and all(t["recall_engine"] == "keywords" for t in turns)
    said = [r.getMessage() for r in caplog.records if "recall by keywords alone" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.deep  # 40 MB written and read under tracemalloc: in .ci/run's second step
def test_a_vectors_file_of_100_000_texts_is_read_holding_its_keys_not_its_vectors(tmp_path: Path) -> None:
    """40 MB of vectors (100,000 texts of 384 numbers): opening the file holds its keys (about
    100 bytes a text), and a vector is read when asked for."""
    import tracemalloc

    path = tmp_path / "v.ctx-vectors"
    header = json.dumps({"ctx-vectors": 1, "model": "m", "dimensions": 384}).encode() + b"\n"
    with open(path, "wb") as file:
        file.write(header)
        for n in range(100_000):
            file.write(key_of(f"text {n}") + bytes([n % 251]) * 384)
    assert path.stat().st_size > 40_000_000
    tracemalloc.start()
    try:
        with Vectors(path, "m") as vectors:
            held = tracemalloc.get_traced_memory()[1]
            assert len(vectors) == 100_000 and vectors.get(key_of("text 99999")) is not None
    finally:
        tracemalloc.stop()
    assert held < 20_000_000, f"{held:,} bytes held to open 40 MB of vectors"


def test_a_live_turn_stops_a_vectors_request_which_is_asked_again_in_the_next_pause(
    tmp_path: Path, embedder: Embedder
) -> None:
    """serve writes a chat's vectors through the gate: a live request stops the embeddings
    request on the server, and the batch is asked again when the player pauses; nothing is
    written twice, and nothing is lost."""
    import threading

    from otaku_ctx.serve.chats import Chat
    from otaku_ctx.serve.gate import Gate
    from otaku_ctx.serve.recalling import write_vectors_of
    from otaku_ctx.serve.session import Session
    from otaku_ctx.serve.store import Store

    embedder.mode, embedder.delay = "slow", 1.0
    gate = Gate(pause=0.05)
    told = replace(story(n=40), path=tmp_path / "chat.jsonl")
    session = Session(Chat(key="o123", named=False, pool="o123"))
    store = Store(tmp_path, None, (20, 20))  # type: ignore[arg-type]  # only its files' paths are asked
    writer = threading.Thread(
        target=write_vectors_of, args=(session, told, [], recall_of(embedder, batch=64), store, gate)
    )
    writer.start()
    deadline = time.monotonic() + 10
    while not embedder.asked:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with gate.live():  # a frontend's turn arrives while the batch is being embedded
        time.sleep(0.1)
    embedder.mode = ""
    writer.join(20)
    assert not writer.is_alive() and gate.preempted == 1
    assert len(embedder.asked) == 2 and embedder.asked[0] == embedder.asked[1]  # the same batch, again
    [path] = tmp_path.glob("*.ctx-vectors")
    with Vectors(path, "stand-in") as vectors:
        assert len(vectors) == len(texts_of(told))
