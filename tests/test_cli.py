"""`ctx` end to end through `main(argv)`: exact stdout, stderr and exit codes, error paths included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CASE3, CASE4, FIXTURES, REPO, run
from stories import story, to_records, write_jsonl

from otaku_ctx.cli.app import main
from otaku_ctx.config import default_toml
from otaku_ctx.tokens import make_counter


def inspect_json(capsys, *argv) -> dict:
    code, out, _ = run(capsys, "inspect", *argv, "--json")
    assert code in (0, 3)
    return json.loads(out)


# ── build and inspect on the bundled examples ────────────────────────────────────────────


def test_example_case_3(capsys):
    data = inspect_json(capsys, CASE3)
    assert data["case"] == 3
    assert data["summaries"] and data["history"] is None
    assert data["tail"]["last"] == data["messages"]


def test_example_case_4_fits_to_the_token(capsys):
    data = inspect_json(capsys, CASE4)
    assert data["case"] == 4
    assert data["history"] is not None
    assert data["tokens"] <= data["limit"]
    code, prompt, err = run(capsys, "build", CASE4)
    assert code == 0 and err == ""
    # The printed prompt, recounted from scratch, is what inspect reported, and ≤ the limit.
    assert make_counter("cl100k_base")(prompt) == data["tokens"]
    assert f"[Story so far, through scene {data['history']['through_scene']}]" in prompt


def test_inspect_json_has_the_promised_keys(capsys):
    data = inspect_json(capsys, CASE4)
    for key in ("case", "messages", "limit", "tokens", "head", "summaries", "history", "floated_cards", "tail"):
        assert key in data
    assert set(data["head"]) == {"first", "last"}
    assert data["tail_target"] == 150
    assert all(isinstance(step, str) for step in data["steps"]) and data["steps"]
    assert data["floated_cards"] == [33]


def test_inspect_explain_shows_case_4_and_every_step(capsys):
    code, out, _ = run(capsys, "inspect", CASE4, "--explain")
    assert code == 0
    assert "case 4" in out
    assert "Steps" in out and "replaced by scene 4's history" in out
    assert "limit" in out and "reserve" in out


def test_build_writes_only_the_prompt_to_stdout(capsys):
    code, out, err = run(capsys, "build", CASE3)
    assert code == 0
    assert out.startswith("You are the narrator")
    assert out.endswith("Narrator:")  # the open turn, no newline added off a terminal
    assert err == ""


def test_build_output_file_is_written_atomically(capsys, tmp_path):
    target = tmp_path / "prompt.txt"
    code, out, _ = run(capsys, "build", CASE3, "-o", target)
    assert code == 0 and out == ""
    assert target.read_text(encoding="utf-8").startswith("You are the narrator")
    assert [p.name for p in tmp_path.iterdir()] == ["prompt.txt"]  # no temp file left behind


def test_refusal_prints_nothing_and_leaves_the_output_alone(capsys, tmp_path):
    target = tmp_path / "prompt.txt"
    target.write_text("old", encoding="utf-8")
    code, out, err = run(capsys, "build", CASE4, "--window", "2000", "-o", target)
    assert code == 3
    assert out == ""
    assert target.read_text(encoding="utf-8") == "old"
    assert "nothing fits: the smallest prompt reached is" in err
    assert "A context of at least" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_inspect_json_on_refusal_has_the_figures(capsys):
    code, out, _ = run(capsys, "inspect", CASE4, "--window", "2000", "--json")
    assert code == 3
    data = json.loads(out)
    assert data["case"] == 6
    assert data["refusal"]["smallest"] > data["limit"]
    assert data["refusal"]["needed_context"] == data["refusal"]["smallest"] + data["reserve"]


def test_emit_messages_is_a_json_list_of_role_messages(capsys):
    code, out, _ = run(capsys, "build", CASE3, "--emit", "messages")
    assert code == 0
    messages = json.loads(out)
    assert {m["role"] for m in messages} <= {"system", "user", "assistant"}
    assert all(set(m) == {"role", "content"} for m in messages)
    assert messages[1]["content"].startswith("Mara: ")


def test_emit_openai_chat_is_a_request_body(capsys):
    code, out, _ = run(capsys, "build", CASE3, "--emit", "openai-chat", "--reserve", "300")
    body = json.loads(out)
    assert code == 0 and set(body) == {"messages", "max_tokens", "stop"}
    assert body["max_tokens"] == 300
    assert "\nMara:" in body["stop"] and "\nNarrator:" not in body["stop"]  # never the one speaking


def test_emit_openai_completion_is_a_request_body(capsys):
    code, out, _ = run(capsys, "build", CASE3, "--emit", "openai-completion", "--format", "chatml")
    body = json.loads(out)
    assert code == 0 and set(body) == {"prompt", "max_tokens", "stop"}
    assert body["prompt"].endswith("<|im_start|>assistant\nNarrator:")
    assert "<|im_end|>" in body["stop"]


def test_flags_win_over_the_config_file(capsys, otaku_home):
    (otaku_home / "configs").mkdir(parents=True)
    (otaku_home / "configs" / "config.toml").write_text("[context]\nhead_messages = 5\n", encoding="utf-8")
    assert inspect_json(capsys, CASE3)["head"] == {"first": 1, "last": 5}
    assert inspect_json(capsys, CASE3, "--head", "7")["head"] == {"first": 1, "last": 7}


def test_reserve_zero_is_allowed_and_auto_is_the_default(capsys):
    assert inspect_json(capsys, CASE3, "--reserve", "0")["reserve"] == 0
    data = inspect_json(capsys, CASE3)
    assert data["reserve_source"].startswith("auto")
    assert data["limit"] == 8192 - data["reserve"]


def test_max_context_caps_the_window(capsys):
    data = inspect_json(capsys, CASE3, "--max-context", "6000", "--reserve", "100")
    assert data["limit"] == 5900


def test_estimate_tokenizer(capsys):
    data = inspect_json(capsys, CASE3, "--tokenizer", "estimate")
    assert data["tokenizer"] == "estimate"
    code, prompt, _ = run(capsys, "build", CASE3, "--tokenizer", "estimate")
    assert len(prompt) // 4 == data["tokens"]


def test_story_text_is_data_never_code(capsys, tmp_path):
    text = "{{#each x}} }} {{ <|endoftext|> <|im_start|> {{char}}"
    path = write_jsonl(tmp_path / "s.jsonl", [{"role": "user", "name": "Mara", "content": text}])
    code, out, _ = run(capsys, "build", path)
    assert code == 0
    assert f"Mara: {text}" in out  # {{char}} stays: the story names no character


# ── config ───────────────────────────────────────────────────────────────────────────────


def test_config_init_writes_the_documented_default_and_refuses_to_overwrite(capsys, otaku_home):
    code, _, err = run(capsys, "config", "init")
    path = otaku_home / "configs" / "config.toml"
    assert code == 0 and str(path) in err
    assert path.read_text(encoding="utf-8") == default_toml()
    code, _, err = run(capsys, "config", "init")
    assert code == 1 and "--force" in err
    path.write_text("[context]\n", encoding="utf-8")
    assert run(capsys, "config", "init", "--force")[0] == 0
    assert path.read_text(encoding="utf-8") == default_toml()


def test_repository_default_config_is_what_init_writes():
    assert (REPO / "configs" / "config.toml").read_text(encoding="utf-8") == default_toml()


def test_config_show_says_where_each_value_came_from(capsys, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[model]\nwindow = 32768\n", encoding="utf-8")
    code, out, _ = run(capsys, "config", "show", "--config", path, "--json")
    data = json.loads(out)
    assert code == 0
    assert data["model.window"] == {"value": 32768, "from": str(path)}
    assert data["context.head_messages"] == {"value": 20, "from": "default"}


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[context]\nhead_messages = "twenty"\n', "context.head_messages: expected a whole number"),
        (
            "[context]\nhead_messages = -1\n",
            "context.head_messages: expected a whole number from 0 to 1,000,000,000, got -1",
        ),
        ("[context]\nheads = 3\n", "context.heads: unknown key"),
        ("[contxt]\n", "contxt: unknown section"),
        ("[model]\ntokenizer = 'gpt2'\n", "model.tokenizer: expected"),
        ("[context\n", "is not valid TOML"),
    ],
)
def test_bad_config_names_file_and_key(capsys, tmp_path, toml, needle):
    path = tmp_path / "bad.toml"
    path.write_text(toml, encoding="utf-8")
    code, out, err = run(capsys, "build", CASE3, "--config", path)
    assert code == 1 and out == ""
    assert err.startswith(f"ctx: {path}") and needle in err
    assert err.count("\n") == 1


def test_bad_flag_value_is_a_usage_error_naming_the_flag(capsys):
    code, out, err = run(capsys, "build", CASE3, "--reserve", "lots")
    assert (
        code == 2
        and out == ""
        and '--reserve: context.reply_reserve: expected a number of tokens ≥ 0 or "auto", got "lots"' in err
    )
    code, out, err = run(capsys, "build", CASE3, "--window", "-5")
    assert code == 2 and out == "" and "--window" in err and "from 1 to" in err
    code, out, err = run(capsys, "build", CASE3, "--window", "0")
    assert code == 2 and out == "" and err.startswith("ctx: --window: model.window")


def test_usage_error_is_exit_2(capsys):
    code, out, _ = run(capsys, "build", CASE3, "--emit-nothing")
    assert code == 2 and out == ""


def test_unknown_emit_and_reader_are_usage_errors(capsys, tmp_path):
    missing = tmp_path / "not-read.jsonl"  # checked before any story is read
    for argv in (
        ["build", missing, "--emit", "yaml"],
        ["build", missing, "--from", "yaml"],
        ["validate", missing, "--from", "yaml"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and "yaml" in err and "not-read" not in err


def test_refusal_names_the_setting_that_would_help(capsys):
    _, _, err = run(capsys, "build", CASE4, "--window", "2000")
    assert "raise --window (now 2,000)" in err
    _, _, err = run(capsys, "build", CASE4, "--window", "9000", "--max-context", "2000")
    assert "raise max_context (now 2,000)" in err
    code, out, err = run(capsys, "build", CASE4, "--window", "100", "--reserve", "500")
    assert code == 3 and out == ""
    assert "the 500-token reply reserve leaves no room in a context of 100 tokens" in err


def test_refusal_says_when_the_summaries_stop_early(capsys, tmp_path):
    s = story(300, [(40, 60), (61, 80)])  # no scene holds message 21
    path = write_jsonl(tmp_path / "late.jsonl", to_records(s))
    code, _, err = run(capsys, "build", path, "--window", "500")
    assert code == 3
    assert "the summaries stop early: no scene holds message 21 (the first after the head)" in err


# ── bad story input: one line, file and line, exit 1, nothing on stdout ─────────────────


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


GOOD = json.dumps({"role": "user", "content": "hi"})


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("malformed", f'{GOOD}\n{{"role": "user", "content": \n', ":2: malformed JSON"),
        ("not-utf8", GOOD.encode() + b'\n{"role": "user", "content": "\xff\xfe"}\n', ":2: bytes that are not UTF-8"),
        ("empty", b"", "the file is empty"),
        ("no-content", f'{GOOD}\n{{"role": "user", "name": "Mara"}}\n', ':2: a message needs "content"'),
        ("unknown-type", f'{GOOD}\n{{"type": "lorebook"}}\n', ":2: unknown record type 'lorebook'"),
        (
            "scene-past-end",
            "\n".join([GOOD] * 200 + [json.dumps({"type": "scene", "start": 1, "end": 9999})]) + "\n",
            ":201: scene 1 runs to message 9,999 but the story has 200 messages",
        ),
    ],
)
def test_bad_story_input(capsys, tmp_path, name, content, needle):
    data = content if isinstance(content, bytes) else content.encode()
    path = write_bytes(tmp_path / f"{name}.jsonl", data)
    before = path.read_bytes()
    for command in ("build", "inspect"):
        code, out, err = run(capsys, command, path)
        assert code == 1, err
        assert out == ""
        assert err.startswith(f"ctx: {path}") and needle in err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert path.read_bytes() == before  # a story file is never modified


def test_missing_story_file(capsys, tmp_path):
    code, out, err = run(capsys, "build", tmp_path / "nope.jsonl")
    assert code == 1 and out == "" and "nope.jsonl" in err


def test_debug_shows_the_traceback(tmp_path):
    path = write_bytes(tmp_path / "empty.jsonl", b"")
    with pytest.raises(Exception, match="empty"):
        main(["build", str(path), "--debug"])


def test_unwritable_output_is_one_line(capsys, tmp_path):
    folder = tmp_path / "no" / "such" / "dir"
    code, out, err = run(capsys, "build", CASE3, "-o", folder / "p.txt")
    assert code == 1 and out == "" and err == f"ctx: {folder}: no such folder to write into\n"


# ── validate ─────────────────────────────────────────────────────────────────────────────


def test_validate_reports_every_problem_at_once(capsys, tmp_path):
    records = [GOOD] * 30 + [
        "not json",
        json.dumps({"type": "scene", "id": 1, "start": 1, "end": 10}),
        json.dumps({"type": "scene", "id": 2, "start": 8, "end": 12}),  # overlaps 1
        json.dumps({"type": "scene", "id": 3, "start": 20, "end": 15}),  # inverted
        json.dumps({"type": "scene", "id": 4, "start": 25, "end": 40}),  # past the end
        json.dumps({"type": "widget"}),
    ]
    path = write_jsonl(tmp_path / "s.jsonl", records)
    code, out, err = run(capsys, "validate", path)
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert any(":31: error: malformed JSON" in line for line in lines)
    assert any("scene 2 (8–12) overlaps scene 1 (1–10)" in line for line in lines)
    assert any("scene 3 is inverted" in line for line in lines)
    assert any("scene 4 runs to message 40" in line for line in lines)
    assert any("unknown record type 'widget'" in line for line in lines)


def test_validate_lists_the_first_hundred_problems_and_counts_the_rest(capsys, tmp_path):
    """300,000 overlapping scenes once printed 299,999 lines; a person reads the first ones."""
    scenes = [json.dumps({"type": "scene", "id": i, "start": 1, "end": 20}) for i in range(1, 3002)]
    path = write_jsonl(tmp_path / "s.jsonl", [GOOD] * 30 + scenes)
    code, out, err = run(capsys, "validate", path)
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (1, "", 101)
    assert all(": error: scene " in line and " overlaps scene " in line for line in lines[:100])
    assert lines[100] == (
        f"{path}: … and 2,900 more problems (2,900 of them errors); 3,000 errors and 0 warnings in all: "
        "mend the first ones and run it again"
    )


def test_validate_gap_is_a_warning(capsys, tmp_path):
    s = story(40, [(1, 10), (15, 20)])
    path = write_jsonl(tmp_path / "s.jsonl", to_records(s))
    code, _, err = run(capsys, "validate", path)
    assert code == 0
    assert "warning: gap: messages 11–14" in err and "ok" in err


def test_validate_other_formats(capsys):
    code, _, err = run(capsys, "validate", FIXTURES / "otaku" / "river.md")
    assert code == 0 and "ok, otaku" in err


# ── the files people already have (issue: bring your story) ─────────────────────────────


def test_sillytavern_chat_with_card(capsys):
    chat = FIXTURES / "sillytavern" / "seraphina-chat.jsonl"
    card = FIXTURES / "sillytavern" / "seraphina-card.png"
    code, out, _ = run(capsys, "build", chat, "--card", card)
    assert code == 0
    # The card's lorebook (character_book) fires on "Eldoria" and stands before the card (docs/lore.md).
    assert out.startswith('Wren: "What is Eldoria?"') and "\n\nSeraphina joins the story." in out
    assert "Eldoria's edge, well off any road" in out  # the selected swipe of message 3
    assert "You should not be awake yet" not in out  # the other swipe
    assert "hidden from the AI" not in out
    assert "The forest keeps its own calendar, Wren." in out  # {{user}} filled from the chat


def test_sillytavern_hidden_rows_are_counted(capsys):
    data = inspect_json(capsys, FIXTURES / "sillytavern" / "seraphina-chat.jsonl")
    assert data["hidden"] == 1 and data["messages"] == 6


def test_otaku_export_cases(capsys):
    river = FIXTURES / "otaku" / "river.md"
    data = inspect_json(capsys, river)
    assert data["messages"] == 16
    data = inspect_json(capsys, river, "--head", "2", "--tail", "4")
    assert data["case"] == 3
    assert data["summaries"] == [1, 2]
    assert data["tail"] == {"first": 11, "last": 16}
    data = inspect_json(capsys, river, "--head", "2", "--tail", "4", "--max-context", "1100")
    assert data["case"] == 4
    assert data["history"] == {"through_scene": 2}
    assert data["summaries"] == []


def test_convert_writes_native_and_builds_the_same_prompt(capsys, tmp_path):
    river = FIXTURES / "otaku" / "river.md"
    target = tmp_path / "river.jsonl"
    code, _, err = run(capsys, "convert", river, "-o", target)
    assert code == 0 and "16 messages, 2 scenes" in err
    original = run(capsys, "build", river, "--head", "2", "--tail", "4")[1]
    converted = run(capsys, "build", target, "--head", "2", "--tail", "4")[1]
    assert converted == original
    code, _, err = run(capsys, "convert", river, "-o", target)
    assert code == 1 and "--force" in err


def test_from_overrides_detection(capsys):
    code, out, err = run(capsys, "build", FIXTURES / "openai-messages.jsonl", "--from", "sillytavern")
    assert code == 1 and out == "" and "openai-messages.jsonl:1" in err


def _png(chunks: list[tuple[bytes, bytes]]) -> bytes:
    import struct
    import zlib

    out = b"\x89PNG\r\n\x1a\n"
    for kind, body in chunks:
        out += struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return out


IHDR = (b"IHDR", bytes.fromhex("0000000100000001080600000000"))


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str | Path], str]]:
    chat = (FIXTURES / "sillytavern" / "seraphina-chat.jsonl").read_text(encoding="utf-8").splitlines()
    river = (FIXTURES / "otaku" / "river.md").read_text(encoding="utf-8")
    stringly = json.loads(chat[2])
    stringly["is_user"] = "true"
    files = {
        "no-card.png": _png([IHDR, (b"IEND", b"")]),
        "bad-base64.png": _png([IHDR, (b"tEXt", b"chara\x00!!!not base64!!!"), (b"IEND", b"")]),
        "truncated.png": (FIXTURES / "sillytavern" / "seraphina-card.png").read_bytes()[:5000],
        "is-user-text.jsonl": "\n".join([*chat[:2], json.dumps(stringly), *chat[3:]]).encode(),
        "river-range.md": river.replace("- **Messages:** 1-6", "- **Messages:** 0-1").encode(),
        "river-v9.md": river.replace("format-version: 3", "format-version: 9").encode(),
        "mystery.txt": b"Once upon a time there was no format at all.\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    story = REPO / "examples" / "lighthouse-case3.jsonl"
    return {
        "png without a card chunk": (["build", story, "--card", tmp_path / "no-card.png"], "no-card.png"),
        "corrupt base64": (["build", story, "--card", tmp_path / "bad-base64.png"], "bad-base64.png"),
        "truncated png": (["build", story, "--card", tmp_path / "truncated.png"], "truncated.png"),
        "is_user as text": (["build", tmp_path / "is-user-text.jsonl"], "is-user-text.jsonl:3"),
        "otaku scene from message 0": (["build", tmp_path / "river-range.md"], "river-range.md:28"),
        "otaku unknown version": (["build", tmp_path / "river-v9.md"], "river-v9.md"),
        "no reader matches": (["build", tmp_path / "mystery.txt"], "mystery.txt"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "png without a card chunk",
        "corrupt base64",
        "truncated png",
        "is_user as text",
        "otaku scene from message 0",
        "otaku unknown version",
        "no reader matches",
    ],
)
def test_bad_imports_are_one_line_errors(capsys, tmp_path, case):
    argv, where = _bad_inputs(tmp_path)[case]
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("ctx: ") and where in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_problems_are_reported_in_line_order(capsys, tmp_path):
    path = write_bytes(tmp_path / "s.jsonl", GOOD.encode() + b"\n{bad\n" + b'{"role": "user", "content": "\xff"}\n')
    code, _, err = run(capsys, "build", path)
    assert code == 1 and f"{path}:2: malformed JSON" in err
    code, _, err = run(capsys, "validate", path)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2
    assert ":2: error: malformed JSON" in lines[0] and ":3: error: bytes that are not UTF-8" in lines[1]


def test_scene_ids_4_and_text_4_clash(capsys, tmp_path):
    scenes = [{"type": "scene", "id": 1, "start": 1, "end": 2}, {"type": "scene", "id": "1", "start": 3, "end": 4}]
    path = write_jsonl(tmp_path / "s.jsonl", [GOOD] * 4 + scenes)
    code, _, err = run(capsys, "validate", path)
    assert code == 1 and "scene id '1' is used twice (also on line 5)" in err
