"""`ctx summarize` against a stand-in model server of the tests' own (loopback, port 0, in a
thread) that answers like a chat-completions server and logs every request: the 1,000-message
SillyTavern chat refused before and built after, interruption (SIGKILL mid-run), staleness
after an edit, the format fallbacks, chatty and unusable replies. The real server's tests are
in tests/realserver/test_summarize_real.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import JSONHandler, QuietServer

from otaku_ctx.cli.app import main
from otaku_ctx.cli.terminal import Terminal
from otaku_ctx.story.sidecar import read_sidecar, sidecar_for
from otaku_ctx.summarize import Cutting, pack
from otaku_ctx.summarize.replies import field_of, json_object
from otaku_ctx.summarize.run import words_for

REPO = Path(__file__).resolve().parents[1]
FIRST = re.compile(r"^\[(\d+)\] ", re.MULTILINE)


class StandIn(QuietServer):
    """Answers /v1/chat/completions with a short summary or history naming what it was asked;
    logs (kind, first message number) for every chat request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.log: list[tuple[str, int]] = []
        self.bodies: list[dict[str, Any]] = []
        self.delay = 0.0
        self.window = 8192
        self.refuse_schema = False
        self.refused = 0
        self.replies: list[str] = []  # scripted reply texts, used first
        self.lock = threading.Lock()
        # concurrency: requests being answered now, the most at once; `gather` holds each one
        # until that many have been in flight together (a minute at most, a hang guard: then
        # gathering stops)
        self.in_flight = self.most = self.gather = 0
        self.gathered = threading.Condition(self.lock)
        self.first_last = False  # the scene starting at message 1 is answered after another one
        self.since = 0  # ... of the log from this entry on
        self.rolling = False  # a history names the history it was rolled from, then the scene
        self.on_request: Callable[[int], None] | None = None  # called with each chat request's number (1, 2, …)
        self.models: list[str] | None = None  # what GET /v1/models lists; None: a 404, as llama.cpp's /props is alone
        self.model_path = ""  # /props says it (as llama.cpp's does) when set


class _Handler(JSONHandler):
    server: StandIn

    def do_GET(self) -> None:
        if self.path == "/v1/models" and self.server.models is not None:
            self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]})
            return
        if self.path == "/props" and self.server.model_path:
            settings = {"n_ctx": self.server.window}
            self._send(200, {"default_generation_settings": settings, "model_path": self.server.model_path})
            return
        self._props(self.server.window)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": "no such endpoint"}})
            return
        form = body.get("response_format") or {}
        if self.server.refuse_schema and form.get("type") == "json_schema":
            self.server.refused += 1
            self._send(400, {"error": {"message": "response_format json_schema is not supported"}})
            return
        prompt = body["messages"][-1]["content"]
        kind = "history" if prompt.startswith("Until now:") else "summary"
        numbers = [int(n) for n in FIRST.findall(prompt)]
        stand_in = self.server
        if stand_in.on_request is not None:
            stand_in.on_request(len(stand_in.bodies) + 1)
        with stand_in.lock:
            stand_in.bodies.append(body)
            scripted = stand_in.replies.pop(0) if stand_in.replies else None
            stand_in.in_flight += 1
            stand_in.most = max(stand_in.most, stand_in.in_flight)
            stand_in.gathered.notify_all()
            if not stand_in.gathered.wait_for(lambda: stand_in.most >= stand_in.gather, timeout=60):
                stand_in.gather = 0  # they never came together: the test fails on `most`, and does not wait again
            if stand_in.first_last and kind == "summary" and numbers[0] == 1:
                stand_in.gathered.wait_for(  # a later scene of this run (not of an earlier one) answered first
                    lambda: any(k == "summary" and n != 1 for k, n in stand_in.log[stand_in.since :]), timeout=60
                )
        time.sleep(stand_in.delay)
        if scripted is not None:
            text = scripted
        elif kind == "summary":
            a, b = numbers[0], numbers[-1]
            told = (
                f"In messages {a} to {b} the Keeper and Mara watch the lamp turn at the top of the tower while the "
                "tide comes in over the rocks below; row by row they talk of the lamp and the tide, and at the end "
                "of it the lamp still turns and nothing is decided."
            )
            text = json.dumps({"title": f"Scene {a}", "summary": told})
        elif stand_in.rolling:
            earlier = prompt.split("Until now:", 1)[1].split("Then (", 1)
            text = json.dumps({"history": f"{earlier[0].strip()} | then {earlier[1].split(')', 1)[0]}"})
        else:
            text = json.dumps({"history": "So far the keeper and Mara have talked through many scenes."})
        with stand_in.lock:
            stand_in.in_flight -= 1
            stand_in.log.append((kind, numbers[0] if kind == "summary" else 0))
            stand_in.gathered.notify_all()
        self._send(
            200,
            {
                "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4},
            },
        )


@pytest.fixture
def server() -> Iterator[StandIn]:
    stand_in = StandIn().start(poll=0.005)
    try:
        yield stand_in
    finally:
        stand_in.stop()


def sillytavern_chat(path: Path, n: int, chars: int = 250) -> Path:
    """A SillyTavern chat of `n` rows with no summaries, each about `chars` characters."""
    header = {"user_name": "Mara", "character_name": "Keeper", "create_date": "2025-01-01", "chat_metadata": {}}
    lines = [json.dumps(header)]
    for i in range(1, n + 1):
        words = f"Row {i}: the lamp turns and the tide comes in over the rocks below the tower. "
        text = (words * (chars // len(words) + 1))[:chars]
        lines.append(json.dumps({"name": "Mara" if i % 2 else "Keeper", "is_user": bool(i % 2), "mes": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(*argv: str) -> tuple[int, str, str]:
    from io import BytesIO, StringIO

    out, err = BytesIO(), StringIO()
    io = Terminal(stdin=BytesIO(), stdout=out, stderr=err)
    code = main(list(argv), io)
    return code, out.getvalue().decode(), err.getvalue()


def summarize(story: Path, server: StandIn, *more: str) -> tuple[int, str, str]:
    return run("summarize", str(story), "--url", server.url, "--model", "stand-in", *more)


# -- the 1,000-message chat -------------------------------------------------------------------


def test_a_long_chat_refused_before_builds_after(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 1000)
    before = chat.read_bytes()
    code, _, err = run("build", str(chat), "--window", "8192")
    assert code == 3 and "refused" in err
    code, out, err = summarize(chat, server)
    assert code == 0, err
    records = read_sidecar(sidecar_for(chat))
    summaries = [entry for entry in server.log if entry[0] == "summary"]
    histories = [entry for entry in server.log if entry[0] == "history"]
    assert len(summaries) == len(records) and len(histories) == len(records) - 1  # the first history is free
    assert records[0].start == 1 and records[-1].end == 1000 - 20  # the newest 20 settle
    assert all(b.start == a.end + 1 for a, b in zip(records, records[1:], strict=False))
    assert all(r.end - r.start + 1 >= 20 for r in records)
    code, data, err = run("inspect", str(chat), "--window", "8192", "--json")
    assert code == 0, err
    facts = json.loads(data)
    assert facts["case"] in (3, 4, 5) and facts["tokens"] <= facts["limit"]
    code, prompt, err = run("build", str(chat), "--window", "8192")
    assert code == 0, err
    assert chat.read_bytes() == before  # the story file is never written
    # every message accounted for: verbatim in the prompt, or inside a summarized scene or history
    last_verbatim = max(int(n) for n in re.findall(r"Row (\d+):", prompt))
    assert last_verbatim == 1000 and "Row 1:" in prompt
    # a second run asks nothing
    asked = len(server.log)
    code, _, err = summarize(chat, server)
    assert code == 0 and len(server.log) == asked, err
    assert "0 scenes summarized" in err


def test_dry_run_lists_the_requests_and_contacts_nobody(tmp_path: Path) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 300)
    code, out, err = run(
        "summarize", str(chat), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--dry-run", "--json"
    )
    assert code == 0, err
    plan = json.loads(out)
    assert plan["window"] == 8192 and plan["requests"][0]["kind"] == "summary"
    assert "a dry run asks no server; give --window" in plan["window_source"]  # not "the server did not say"
    assert all(r["prompt_tokens"] + r["max_tokens"] <= plan["usable"] for r in plan["requests"])
    assert not sidecar_for(chat).exists()


def test_a_small_window_cuts_scenes_smaller_never_truncated(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 200)
    code, _, err = summarize(chat, server, "--window", "2500")
    assert code == 0, err
    for body in server.bodies:
        assert len(body["messages"][-1]["content"]) // 4 + body["max_tokens"] < 2500
    records = read_sidecar(sidecar_for(chat))
    assert any(r.end - r.start + 1 < 20 for r in records)  # cut below min_messages to fit


@pytest.mark.parametrize(("window", "summary", "history"), [(4096, 128, 200), (32768, 400, 200)])
def test_summary_and_history_lengths_follow_the_window(
    tmp_path: Path, server: StandIn, window: int, summary: int, history: int
) -> None:
    assert words_for(2048, 400, 200) == (64, 128) and words_for(512, 400, 200) == (40, 40)  # the floor
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    code, _, err = summarize(chat, server, "--window", str(window))
    assert code == 0, err
    asked = [b["messages"][-1]["content"] for b in server.bodies]
    summaries = [a for a in asked if '"summary" holds' in a]
    histories = [a for a in asked if '"history" holds' in a]
    assert summaries and histories
    assert all(f"at most {summary} words" in a for a in summaries)
    assert all(f"at most {history} words" in a for a in histories)
    assert {b["max_tokens"] for b in server.bodies} <= {summary * 2 + 64, history * 2 + 32}


# -- interruption -----------------------------------------------------------------------------


def test_sigkill_mid_run_keeps_every_finished_scene_and_a_rerun_asks_none_again(
    tmp_path: Path, server: StandIn
) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 400)
    sidecar = sidecar_for(chat)
    server.delay = 0.15
    env = {**os.environ, "OTAKU_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "otaku_ctx", "summarize", str(chat), "--url", server.url, "--model", "m"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60  # a hang guard
    while time.monotonic() < deadline and (not sidecar.exists() or len(read_lines(sidecar)) < 3):
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(60)
    finished = read_sidecar(sidecar)  # valid JSON lines: never torn
    assert len(finished) >= 3
    done_before = {r.start for r in finished}
    asked_before = len(server.log)
    server.delay = 0.0
    code, _, err = summarize(chat, server)
    assert code == 0, err
    again = [start for kind, start in server.log[asked_before:] if kind == "summary"]
    assert not done_before & set(again)  # no finished scene asked twice
    everything = read_sidecar(sidecar)
    assert everything[-1].end == 380 and all(r.history for r in everything)
    assert not list(tmp_path.glob(".*.tmp"))


def read_lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        return []


# -- --jobs -----------------------------------------------------------------------------------


def test_jobs_sends_that_many_scenes_at_once_and_the_sidecar_ends_as_with_one(tmp_path: Path, server: StandIn) -> None:
    """Four scene requests in flight together (the stand-in holds each until four are), the
    first scene answered last, so later scenes are committed before it; the histories still
    roll in story order, each from the one before, and the sidecar is what --jobs 1 writes."""
    server.rolling = True

    def written(folder: str, *more: str) -> list[tuple[object, ...]]:
        (tmp_path / folder).mkdir()
        chat = sillytavern_chat(tmp_path / folder / "chat.jsonl", 240)
        code, _, err = summarize(chat, server, *more)
        assert code == 0, err
        return [
            (r.id, r.start, r.end, r.title, r.summary, r.history, r.covers, r.history_from)
            for r in read_sidecar(sidecar_for(chat))
        ]

    one = written("one")
    assert server.most == 1
    server.most, server.gather, server.first_last = 0, 4, True
    asked = server.since = len(server.log)
    four = written("four", "--jobs", "4")
    assert server.most == 4  # four at once, never more
    summaries = [start for kind, start in server.log[asked:] if kind == "summary"]
    assert summaries.index(1) > 0  # scene 1 finished after a later one
    assert four == one and len(four) >= 6
    titles = " | then ".join(str(entry[3]) for entry in four)
    assert str(four[-1][5]).endswith(titles.split(" | then ", 1)[1])  # rolled in order, none skipped


# -- staleness --------------------------------------------------------------------------------


@pytest.mark.parametrize("edit", ["a word", "a rewrite"])
def test_editing_one_early_message_makes_that_scene_and_later_histories_stale(
    tmp_path: Path, server: StandIn, edit: str
) -> None:
    """A word changed (a typo fixed) leaves the scene's summary in the build, with a warning; a
    message rewritten leaves it out. Either way ctx summarize redoes it, and the histories after."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 300)
    assert summarize(chat, server)[0] == 0
    records = read_sidecar(sidecar_for(chat))
    second = records[1]
    lines = chat.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[second.start + 1])  # a message inside scene 2 (line 1 is the header)
    row["mes"] = row["mes"].replace("lamp", "lantern") if edit == "a word" else "Rewritten. " * 60
    lines[second.start + 1] = json.dumps(row)
    chat.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run("build", str(chat), "--window", "8192")
    assert f"scene {second.id} (messages {second.start:,}–{second.end:,}) stale" in err
    if edit == "a word":  # the build builds
        assert code == 0 and "a small edit" in err and "with the histories after them" in err
        assert second.summary in out
    else:  # left out: the chain stops there (at this window, a refusal)
        assert "left out" in err and "histories of scenes" in err and second.summary not in out
    code, _, err = run("validate", str(chat))
    assert code == 0 and "stale" in err
    asked = len(server.log)
    assert summarize(chat, server)[0] == 0
    redone = server.log[asked:]
    assert [entry for entry in redone if entry[0] == "summary"] == [("summary", second.start)]
    assert len([entry for entry in redone if entry[0] == "history"]) == len(records) - 1  # scene 2 on
    code, _, err = run("build", str(chat), "--window", "8192")
    assert code == 0 and "stale" not in err


@pytest.mark.parametrize("change", ["insert", "delete"])
def test_a_message_inserted_or_deleted_early_makes_only_its_scene_stale(
    tmp_path: Path, server: StandIn, change: str
) -> None:
    """The scenes after it moved, not changed: they are found at their new numbers, their
    summaries kept; only the scene where it happened is redone, and the histories from it on."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 300)
    assert summarize(chat, server)[0] == 0
    records = read_sidecar(sidecar_for(chat))
    second = records[1]
    lines = chat.read_text(encoding="utf-8").splitlines()
    at = second.start + 1  # a row inside scene 2 (line 1 is the header)
    if change == "insert":
        lines.insert(at, json.dumps({"name": "Mara", "is_user": True, "mes": "A new line, written later."}))
    else:
        del lines[at]
    chat.write_text("\n".join(lines) + "\n", encoding="utf-8")
    shift = 1 if change == "insert" else -1
    _, _, err = run("build", str(chat), "--window", "8192")
    assert f"scene {second.id} (messages {second.start:,}–{second.end + shift:,}) stale" in err
    asked = len(server.log)
    assert summarize(chat, server)[0] == 0
    redone = server.log[asked:]
    assert [entry for entry in redone if entry[0] == "summary"] == [("summary", second.start)]
    assert len([entry for entry in redone if entry[0] == "history"]) == len(records) - 1  # scene 2 on
    after = read_sidecar(sidecar_for(chat))
    assert [(r.start, r.end) for r in after[2:]] == [(r.start + shift, r.end + shift) for r in records[2:]]
    assert [r.summary for r in after[2:]] == [r.summary for r in records[2:]]  # kept, not asked again
    code, _, err = run("build", str(chat), "--window", "8192")
    assert code == 0 and "stale" not in err


def test_a_history_rolled_from_a_long_story_so_far_is_priced_as_it_is(tmp_path: Path) -> None:
    """The first history after the story's own scenes is rolled from their summaries (they have
    no histories): the plan counts that text, not a history's bound, and refuses before any
    request when it cannot fit."""
    lines = []
    for i in range(1, 201):
        who = "Mara" if i % 2 else "Keeper"
        lines.append(json.dumps({"role": "user" if i % 2 else "assistant", "name": who, "content": f"Line {i}. " * 25}))
    long = "The keeper and Mara talk about the lamp, the tide and the ferry. " * 60  # about 800 tokens
    for k in range(4):
        scene = {"type": "scene", "id": k + 1, "start": 20 * k + 1, "end": 20 * k + 20, "title": "T", "summary": long}
        lines.append(json.dumps(scene))
    story = tmp_path / "story.jsonl"
    story.write_text("\n".join(lines) + "\n", encoding="utf-8")
    base = ("summarize", str(story), "--url", "http://127.0.0.1:9/v1", "--model", "m")
    code, out, err = run(*base, "--window", "16000", "--dry-run", "--json")
    assert code == 0, err
    first = next(r for r in json.loads(out)["requests"] if r["kind"] == "history")
    assert first["prompt_tokens"] > 4 * 700  # the four summaries it is rolled from
    code, _, err = run(*base, "--window", "4096")
    assert code == 1 and err.count("\n") == 1, err
    assert "the history through messages 81–" in err and "the story so far it is rolled from" in err


# -- replies and formats ----------------------------------------------------------------------


def test_a_model_the_server_does_not_list_is_a_usage_error_before_any_request(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 200)
    server.models = ["/models/SmolLM2-135M-Instruct.Q4_1.gguf"]
    code, out, err = summarize(chat, server)  # --model stand-in
    assert code == 2 and not out and err.count("\n") == 1, err
    assert err == (
        f"ctx: --model: summarize.model: {server.url} has no model 'stand-in'; it lists"
        " '/models/SmolLM2-135M-Instruct.Q4_1.gguf' (a model file by its name, with or without its extension,"
        " will do)\n"
    )
    assert server.bodies == [] and not sidecar_for(chat).exists()  # nothing asked, no name saved
    # the file's name, with or without its extension, is the model
    for name in ("SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf"):
        sidecar_for(chat).unlink(missing_ok=True)
        code, _, err = run("summarize", str(chat), "--url", server.url, "--model", name)
        assert code == 0, err
        assert {r.model for r in read_sidecar(sidecar_for(chat))} == {name}


def test_a_long_model_list_is_named_in_part_and_a_close_name_suggested(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 200)
    server.models = [f"vendor/model-{i:02d}" for i in range(30)]
    code, _, err = run("summarize", str(chat), "--url", server.url, "--model", "vendor/modle-07")
    assert code == 2 and err.count("\n") == 1, err
    assert "has no model 'vendor/modle-07'; did you mean 'vendor/model-07'?; it lists 'vendor/model-00'," in err
    assert "'vendor/model-07' and 22 more\n" in err and "model-08" not in err
    assert server.bodies == []


def test_a_server_with_no_model_list_is_asked_by_the_name_given(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 200)
    assert server.models is None  # GET /v1/models is a 404
    code, _, err = summarize(chat, server)
    assert code == 0, err
    assert {body["model"] for body in server.bodies} == {"stand-in"}
    assert {r.model for r in read_sidecar(sidecar_for(chat))} == {"stand-in"}


def test_a_server_that_refuses_json_schema_gets_json_object(tmp_path: Path, server: StandIn) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    server.refuse_schema = True
    code, _, err = summarize(chat, server)
    assert code == 0, err
    kinds = [(b.get("response_format") or {}).get("type") for b in server.bodies]
    assert server.refused == 1 and set(kinds) == {"json_object"}  # asked once, then remembered


def test_an_unusable_reply_is_asked_again_differently_then_reported(tmp_path: Path, server: StandIn) -> None:
    """Each attempt asks differently (warmer, a looser form); with `fallback = "none"`, a scene
    no reply would do for is named, the other scenes are written, the run exits 1, and a rerun
    with a good server fills exactly that gap."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    config = tmp_path / "config.toml"
    config.write_text('[summarize]\nfallback = "none"\n', encoding="utf-8")
    server.replies = ['{"title": "x", "summary": ""}', "{}", "{"]
    code, _, err = summarize(chat, server, "--config", str(config))
    first = server.bodies[:3]
    assert code == 1 and len({tuple(b["messages"][-1]["content"].split()[:3]) for b in first}) == 1
    assert [b["temperature"] for b in first] == [0.2, 0.5, 0.8]
    assert [(b.get("response_format") or {}).get("type") for b in first] == ["json_schema", "json_object", None]
    scene = re.search(r"missing: messages (\d+)–(\d+): (.*)", err)
    assert scene is not None and server.url in scene[3] and "no usable summary" in scene[3], err
    written = read_sidecar(sidecar_for(chat))
    assert written and int(scene[1]) not in {r.start for r in written}  # nothing empty or garbage written
    assert all(r.start > int(scene[2]) for r in written) and not any(r.history for r in written)  # chain stops
    asked = len(server.log)
    assert summarize(chat, server, "--config", str(config))[0] == 0  # the server answers well now
    assert [e for e in server.log[asked:] if e[0] == "summary"] == [("summary", int(scene[1]))]
    assert read_sidecar(sidecar_for(chat))[0].start == int(scene[1])


def test_after_a_reply_that_loops_the_next_attempts_ask_with_a_frequency_penalty(
    tmp_path: Path, server: StandIn
) -> None:
    """A loop is a small model's commonest junk, and a warmer temperature alone does not end it:
    the attempts after one send OpenAI's `frequency_penalty` (every server takes it); after any
    other rejection they do not."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 60)
    loop = json.dumps({"title": "T", "summary": "The keeper and Mara talk. " * 60})
    server.replies = ['{"title": "x", "summary": "The recap"}', loop, loop]
    code, _, err = summarize(chat, server, "--debug")  # one scene, three attempts (the default)
    assert code == 0, err
    assert [b.get("frequency_penalty") for b in server.bodies] == [None, None, 0.5]
    assert "attempt 2: the phrase 'the keeper and mara' repeated 60 times" in err
    assert "(the next with frequency_penalty 0.5)" in err and err.count("(the next with") == 1
    assert [r.model for r in read_sidecar(sidecar_for(chat))] == ["ctx extract"]  # no reply would do


def test_against_llama_cpp_the_penalty_is_its_own_and_a_stronger_one_of_the_users_stands(
    tmp_path: Path, server: StandIn
) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 60)
    loop = json.dumps({"title": "T", "summary": "The keeper and Mara talk. " * 60})
    server.model_path = "/models/smol.gguf"  # its /props says what llama.cpp's says
    for given, sent in ((0.0, 1.1), (1.3, 1.3)):
        sidecar_for(chat).unlink(missing_ok=True)
        config = tmp_path / "config.toml"
        config.write_text(f"[summarize]\nrepeat_penalty = {given}\n", encoding="utf-8")
        server.bodies.clear()
        server.replies = [loop, loop, loop]
        code, _, err = summarize(chat, server, "--config", str(config))
        assert code == 0, err
        assert [b.get("repeat_penalty") for b in server.bodies] == [given or None, sent, sent]
        assert all("frequency_penalty" not in b for b in server.bodies)


def test_a_scene_no_reply_would_do_for_is_written_as_an_extract_by_default(tmp_path: Path, server: StandIn) -> None:
    """The default last resort: the scene's own lines, marked as an extract (`ctx scenes` lists
    it), the run going on and exiting 0."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    server.replies = ['{"title": "x", "summary": ""}', "{}", "{"]
    code, _, err = summarize(chat, server)
    assert code == 0 and "written as extracts of the scene's own lines" in err, err
    first = read_sidecar(sidecar_for(chat))[0]
    assert first.model == "ctx extract" and first.summary.startswith("Mara: Row 1: the lamp turns")
    code, out, _ = run("scenes", str(chat))
    assert code == 0 and " extract " in out.splitlines()[0]


def test_a_history_written_as_an_extract_is_marked_so_though_its_summary_is_the_models(
    tmp_path: Path, server: StandIn
) -> None:
    """The summary the model's, the history no reply would do for: the record says who wrote
    each (`ctx.history_model`), and `ctx scenes` lists the scene as an extract, to `--redo`."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    junk = json.dumps({"history": "the new story so far"})
    server.replies = [None] * 4 + [junk] * 3  # type: ignore[list-item]  # four good summaries, then junk
    code, _, err = summarize(chat, server)
    assert code == 0, err
    first, second, *_ = read_sidecar(sidecar_for(chat))
    assert (first.model, first.history_model) == ("stand-in", "")  # a story's first history is its summary
    assert (second.model, second.history_model) == ("stand-in", "ctx extract")
    assert '"history_model": "ctx extract"' in sidecar_for(chat).read_text(encoding="utf-8").splitlines()[1]
    code, out, _ = run("scenes", str(chat))
    statuses = [line.split()[2] for line in out.splitlines()]
    assert code == 0 and statuses[:2] == ["fresh", "extract"], out


def test_the_server_unreachable_is_one_line_with_the_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retried as a transport failure (the waits recorded, not slept: 1, 2 and 4 s), then one line."""
    import functools

    from otaku_ctx.backend import client
    from otaku_ctx.backend.transport import Retry

    waits: list[float] = []
    monkeypatch.setattr(client, "Retry", functools.partial(Retry, sleep=waits.append))
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    code, _, err = run("summarize", str(chat), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--window", "8192")
    assert code == 1 and err.count("\n") == 1 and "127.0.0.1:9" in err
    assert waits == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    ("reply", "summary"),
    [
        ('Sure! Here it is:\n```json\n{"title": "T", "summary": "Mara climbs the tower stairs."}\n```', "Mara climbs"),
        ("{“title”: “T”, “summary”: “Mara climbs the tower stairs.”}", "Mara climbs"),
        ('{"title": "T", "summary": "Mara climbs the tower stairs and', "Mara climbs"),
        ("Mara climbs the tower stairs at dusk.", "Mara climbs"),
        ('{"title": "T"}', None),
        ('{"summary": "ok"}', None),
    ],
)
def test_chatty_and_broken_replies(reply: str, summary: str | None) -> None:
    found = field_of(reply, "summary")
    if summary is None:
        assert found is None
    else:
        assert found is not None and found.startswith(summary)


def test_json_object_finds_the_first_object() -> None:
    assert json_object('noise {"a": 1} more {"b": 2}') == {"a": 1}


def test_pack_is_otakus_rule() -> None:
    from otaku_ctx.story.model import Message

    messages = [Message(i, "user", "x" * 100) for i in range(1, 46)]
    assert pack(messages, Cutting(0, 1000, 20)) == [(1, 20), (21, 45)]  # the short leftover joins
    assert pack(messages[:10], Cutting(0, 1000, 20)) == []  # too little yet


def test_a_prompt_without_its_placeholder_is_a_one_line_error(tmp_path: Path) -> None:
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 120)
    prompt = tmp_path / "mine.md"
    prompt.write_text("Summarize this in {summary_words} words.\n", encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(f'[summarize]\nsummary_prompt = "{prompt}"\n', encoding="utf-8")
    code, _, err = run(
        "summarize", str(chat), "--url", "http://127.0.0.1:9/v1", "--model", "m", "--config", str(config)
    )
    assert code == 1 and err.count("\n") == 1 and "{scene}" in err


def test_story_text_in_a_prompt_is_sent_as_it_is() -> None:
    """The placeholders are filled in one pass: a scene that holds `{summary_words}` or
    `{title}` is data, not another placeholder."""
    from otaku_ctx.summarize.prompts import load_prompt

    prompt = load_prompt("summary")
    scene = "Mara: the sign says {summary_words} and {title} and {scene}"
    (user,) = [m["content"] for m in prompt.messages({"scene": scene, "summary_words": "400"}) if m["role"] == "user"]
    assert scene in user and "400" in user


# -- ctx scenes --------------------------------------------------------------------------------


def test_scenes_lists_shows_and_redoes_one_scene(tmp_path: Path, server: StandIn) -> None:
    """The review without editing JSONL: every scene with its status and a line of it; a
    summary written by hand that fails the scene check is `rejected`; `--show` prints one
    whole; `--redo` asks the server for exactly that scene and the histories after it, and
    keeps every other scene as it was (a hand edit too)."""
    chat = sillytavern_chat(tmp_path / "chat.jsonl", 300)
    assert summarize(chat, server)[0] == 0
    sidecar = sidecar_for(chat)
    records = read_sidecar(sidecar)
    lines = sidecar.read_text(encoding="utf-8").splitlines()
    hand = json.loads(lines[2])
    hand["summary"] = "The recap of this scene only, in the order things happened."  # junk, by hand
    lines[2] = json.dumps(hand)
    kept = json.loads(lines[0])
    kept["summary"] = (  # a good hand edit
        "Mara and the Keeper watch the lamp turn at the top of the tower, row after row, while the tide comes "
        "in over the rocks below them; the Keeper says little, and this was written by hand."
    )
    lines[0] = json.dumps(kept)
    sidecar.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, _ = run("scenes", str(chat))
    assert code == 0
    statuses = {int(line.split()[0]): line.split()[2] for line in out.splitlines() if line.split()[0] != "-"}
    assert statuses[hand["id"]] == "rejected" and statuses[kept["id"]] == "fresh"
    assert set(statuses.values()) == {"fresh", "rejected"} and len(statuses) == len(records)
    code, out, _ = run("scenes", str(chat), "--show", str(hand["id"]))
    assert code == 0 and "rejected (it is the prompt's own words)" in out and hand["summary"] in out
    code, _, err = run("scenes", str(chat), "--show", "99")
    assert code == 2 and "no scene '99'" in err
    asked = len(server.log)
    code, _, err = run("scenes", str(chat), "--redo", str(hand["id"]), "--url", server.url, "--model", "stand-in")
    assert code == 0, err
    redone = server.log[asked:]
    assert [e for e in redone if e[0] == "summary"] == [("summary", hand["start"])]
    after = read_sidecar(sidecar)
    assert after[0].summary == kept["summary"]  # the hand edit stands
    assert next(r for r in after if r.start == hand["start"]).summary != hand["summary"]
    code, out, _ = run("scenes", str(chat), "--json")
    assert {row["status"] for row in json.loads(out)} == {"fresh"}
