"""Where scene summaries come from, and what a refusal says to do about them (issue 17, items 8
and 9): SillyTavern's own Summarize memory read as scene 1, `inspect` naming each scene's
source, and case 6 pointing at `ctx summarize` with the messages it would summarize."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import CASE4, FIXTURES, run
from stories import story, to_records, write_jsonl
from test_convert import comparable, round_trip

from otaku_ctx.story.detect import read_story
from otaku_ctx.story.sidecar import Record, covers, history_basis, sha, sidecar_for, sidecar_text

MEMORY_CHAT = FIXTURES / "sillytavern" / "summarize-memory-chat.jsonl"
SHAPE = ("--head", "4", "--tail", "10", "--reserve", "200")  # the fixture's 48 messages, shaped to cover
ROWS = [json.loads(line) for line in MEMORY_CHAT.read_text(encoding="utf-8").splitlines()]
STALE, NEWEST = (r["extra"]["memory"] for r in ROWS if "memory" in r.get("extra", {}))


def inspect_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> dict:
    code, out, _ = run(capsys, "inspect", *argv, "--json")
    assert code in (0, 3)
    return json.loads(out)


def without_memory(tmp_path: Path) -> Path:
    """The fixture chat as it would be had the Summarize extension never run."""
    rows = [dict(r, extra={k: v for k, v in r["extra"].items() if k != "memory"}) if "extra" in r else r for r in ROWS]
    path = tmp_path / "no-memory.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


# ── the memory builds where verbatim does not fit ───────────────────────────────────────


def test_a_chat_with_a_memory_builds_where_verbatim_does_not_fit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    window = ("--window", "2000")  # limit 1,800: the chat verbatim is 2,094 tokens
    code, _, err = run(capsys, "build", without_memory(tmp_path), *SHAPE, *window)
    assert code == 3 and "the smallest prompt reached is 2,094 tokens" in err
    data = inspect_json(capsys, MEMORY_CHAT, *SHAPE, *window)
    assert (data["case"], data["head"], data["summaries"], data["tail"]) == (
        3,
        {"first": 1, "last": 4},
        [1],
        {"first": 33, "last": 48},
    )
    assert data["tokens"] <= data["limit"] == 1800
    code, prompt, _ = run(capsys, "build", MEMORY_CHAT, *SHAPE, *window)
    assert code == 0
    assert prompt.count(NEWEST) == 1 and STALE not in prompt
    story = read_story(MEMORY_CHAT)
    # Every message is accounted for: 1–4 verbatim, 5–32 inside the memory, 33–48 verbatim.
    verbatim = [m.number for m in story.messages if m.content.replace("{{user}}", "Wren") in prompt]
    assert verbatim == [*range(1, 5), *range(33, 49)]


def test_inspect_names_each_scenes_source(capsys: pytest.CaptureFixture[str]) -> None:
    data = inspect_json(capsys, MEMORY_CHAT, *SHAPE, "--window", "2000")
    assert data["scenes"] == [
        {"id": 1, "start": 1, "end": 32, "title": "", "summary": True, "history": True,
         "source": "sillytavern memory", "used": "summary"},
    ]  # fmt: skip
    code, out, _ = run(capsys, "inspect", MEMORY_CHAT, *SHAPE, "--window", "2000")
    assert code == 0
    assert "Scenes" in out and "sillytavern memory" in out and "1–32" in out


def test_inspect_says_which_scenes_a_case_4_prompt_uses(capsys: pytest.CaptureFixture[str]) -> None:
    data = inspect_json(capsys, CASE4)
    assert data["case"] == 4 and {s["source"] for s in data["scenes"]} == {"story"}
    through = data["history"]["through_scene"]
    used = {s["id"]: s["used"] for s in data["scenes"]}
    assert used[through] == "history"
    assert [i for i, u in used.items() if u == "summary"] == data["summaries"]
    assert all(u is None for i, u in used.items() if i != through and i not in data["summaries"])


def test_a_memory_and_the_sidecar_after_it_build_case_4(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`ctx summarize` cuts after the story's own scenes, so its first scene follows the
    memory and its history rolls on from the memory: the history of that scene stands in
    for both (case 4), and `inspect` says where each came from."""
    chat = tmp_path / "chat.jsonl"
    shutil.copyfile(MEMORY_CHAT, chat)
    story = read_story(chat)
    (memory,) = story.scenes
    summary = "At the Hollow Wood Wren hears their grandmother's voice; Seraphina keeps them walking."
    history = "Wren and Seraphina, carrying the Warden's key, crossed Eldoria and reached the Hollow Wood."
    record = Record(
        id=2, start=33, end=37, title="The Hollow Wood", summary=summary, history=history,
        covers=covers(story, 33, 37), model="test", made="2026-11-10T00:00:00Z", summary_sha=sha(summary),
        history_from=history_basis(memory),
    )  # fmt: skip
    sidecar_for(chat).write_text(sidecar_text([record]), encoding="utf-8")
    data = inspect_json(capsys, chat, *SHAPE, "--window", "1000")
    assert [(s["id"], s["source"]) for s in data["scenes"]] == [(1, "sillytavern memory"), (2, "sidecar")]
    assert data["case"] == 4 and data["history"] == {"through_scene": 2} and data["summaries"] == []
    assert [s["used"] for s in data["scenes"]] == [None, "history"]
    code, out, _ = run(capsys, "inspect", chat, *SHAPE, "--window", "1000")
    assert code == 0 and "sillytavern memory" in out and "sidecar" in out


def test_a_converted_chat_keeps_its_memory_as_the_storys_own_scene(tmp_path: Path) -> None:
    story = read_story(MEMORY_CHAT)
    back = round_trip(story, tmp_path)
    assert comparable(back) == comparable(story)  # the source is provenance, not content
    assert [s.source for s in back.scenes] == ["story"]


# ── case 6 points at `ctx summarize` ──────────────────────────────────────────────────────


def long_chat(path: Path, messages: int = 1000) -> Path:
    """A SillyTavern chat of `messages` short rows and no summaries (issue 17's new user)."""
    rows = [{"user_name": "Wren", "character_name": "Seraphina", "create_date": "", "chat_metadata": {}}]
    for n in range(1, messages + 1):
        who = "Wren" if n % 2 == 0 else "Seraphina"
        mes = f"Message {n}: the path bends east past the old oak, and the river runs quiet beside it."
        rows.append({"name": who, "is_user": who == "Wren", "is_system": False, "send_date": "", "mes": mes,
                     "extra": {}})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_refusal_of_a_long_chat_says_to_run_ctx_summarize(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    chat = long_chat(tmp_path / "my chat.jsonl")
    code, out, err = run(capsys, "build", chat, "--window", "8192")
    assert (code, out) == (3, "")
    assert err.count("\n") == 1
    assert (
        "Messages 21–949 are not covered by scene summaries (the summaries stop early: no scene holds "
        f"message 21 (the first after the head)): run `ctx summarize {shlex.quote(str(chat))}`. "
        "Or a context of at least "
    ) in err
    assert "tokens would fit it as it is: raise --window (now 8,192)." in err


def test_inspect_explains_the_remedy_with_the_numbers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    chat = long_chat(tmp_path / "chat.jsonl")
    data = inspect_json(capsys, chat, "--window", "8192")
    assert data["case"] == 6
    assert data["refusal"]["summarize"] == {"first": 21, "last": 949}
    assert f"run `ctx summarize {chat}`" in data["refusal"]["message"]
    assert f"run `ctx summarize {chat}`" in data["steps"][-1]
    code, out, _ = run(capsys, "inspect", chat, "--window", "8192", "--explain")
    assert code == 3
    flat = " ".join(out.replace("│", " ").split())
    assert "Messages 21–949 are not covered by scene summaries" in flat and "ctx summarize" in flat


def test_template_vars_on_a_refusal_says_it_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    chat = long_chat(tmp_path / "chat.jsonl", 400)
    code, _, err = run(capsys, "template", "vars", chat, "--window", "2048")
    assert code == 3 and "Messages 21–349 are not covered by scene summaries" in err


def test_the_refusal_of_a_memory_chat_names_the_messages_after_the_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "build", MEMORY_CHAT, *SHAPE, "--window", "1200")
    assert code == 3
    assert "Messages 33–37 are not covered by scene summaries" in err and "ctx summarize" in err
    assert "a context of at least 1,320 tokens would fit it as it is: raise --window (now 1,200)." in err


def test_no_summarize_remedy_when_the_storys_own_scenes_stop_the_summaries(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`ctx summarize` cuts only after the story's own scenes: one of them without a summary,
    or a gap between them, is the story's to mend, and the refusal says so as before."""
    s = story(300, [(1, 100), (101, 150), (151, 200)], summarized=[1, 3])
    path = write_jsonl(tmp_path / "own.jsonl", to_records(s))
    code, _, err = run(capsys, "build", path, "--window", "500")
    assert code == 3 and "ctx summarize" not in err
    assert "A context of at least" in err and "or fill in what stands in the way (scenes without a summary: 2)" in err
