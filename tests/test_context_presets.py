"""SillyTavern context presets as templates (issue 9, item 1; seed 003).

The golden prompts in `fixtures/sillytavern/golden/` were made by SillyTavern 1.12.6's own
`renderStoryString` and `parseMesExamples` (commit ba6f7b7a), run under node by
`make_goldens.mjs` on `small-chat.jsonl`; ctx must print the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES, examples, run
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import chained_stories, shapes
from test_properties import run as run_invariants

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.errors import ConfigError
from otaku_ctx.hbs import compile_template
from otaku_ctx.hbs.blocks import Block
from otaku_ctx.render.presets import (
    ContextPreset,
    PresetTemplate,
    example_blocks,
    parse_context_preset,
    stop_strings,
    story_source,
    story_string_text,
)

ST = FIXTURES / "sillytavern"
GOLDEN = ST / "golden"
CHAT = GOLDEN / "small-chat.jsonl"
PLAIN = GOLDEN / "plain-text.toml"
PRESETS = ("default", "alpaca", "chatml", "llama-3-instruct", "mistral-v2-v3")
WRAP = {"default": True, "alpaca": True, "chatml": True, "llama-3-instruct": False, "mistral-v2-v3": False}


def prompt(template: str | Path, fmt: str | Path = PLAIN, emit: str = "text", stops: int = 0) -> str:
    """The prompt as emitted; `stops` caps a request body's stop strings (0: all of them)."""
    settings = load_settings(
        overrides={
            "prompt.template": (str(template), "test"),
            "prompt.format": (str(fmt), "test"),
            "model.max_stop_strings": (stops, "test"),
        }
    )
    built = build(open_story(CHAT), settings, emit=emit)
    assert built.prompt is not None
    return built.prompt


@pytest.mark.parametrize("name", PRESETS)
def test_prompt_is_sillytavern_s_byte_for_byte(name: str) -> None:
    """Instruct mode off: story string, examples, chat start, `Name: text` lines, `Char:`."""
    expected = (GOLDEN / f"{name}.text.txt").read_bytes()
    assert prompt(ST / "context" / f"{name}.json").encode("utf-8") == expected


@pytest.mark.parametrize("name", PRESETS)
def test_story_string_in_instruct_mode_is_sillytavern_s(name: str) -> None:
    """Instruct mode on: no newline added after the story string unless the preset wraps."""
    preset = parse_context_preset(json.loads((ST / "context" / f"{name}.json").read_text()), name)
    template = PresetTemplate(preset, compile_template(story_source(preset), name), instruct=True)
    story = open_story(CHAT)
    from otaku_ctx.render.names import Names
    from otaku_ctx.render.variables import Variables

    variables = Variables(story, Names("Ilya", "Wren")).for_assembly([], [], [])
    text = story_string_text(template.story, template.params(variables), instruct=True, wrap=WRAP[name])
    assert text == (GOLDEN / f"{name}.story-instruct.txt").read_text(encoding="utf-8")


def test_cli_reads_a_preset_and_config_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    preset = ST / "context" / "default.json"
    code, out, err = run(capsys, "build", CHAT, "--template", preset, "--format", PLAIN)
    assert (code, err) == (0, "")
    assert out == (GOLDEN / "default.text.txt").read_text(encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(f'[prompt]\ntemplate = "{preset}"\nformat = "{PLAIN}"\n', encoding="utf-8")
    code, out2, _ = run(capsys, "build", CHAT, "--config", config)
    assert (code, out2) == (0, out)


@pytest.mark.parametrize(
    ("path", "named", "flag"),
    [
        (ST / "instruct" / "chatml.json", "instruct preset", "--format"),
        (ST / "eldoria-worldinfo.json", "World Info", ""),
    ],
)
def test_other_json_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], path: Path, named: str, flag: str
) -> None:
    code, out, err = run(capsys, "build", CHAT, "--template", path)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and named in err and flag in err and "Traceback" not in err


def test_a_card_json_is_named_a_card(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    card = tmp_path / "ilya.json"
    card.write_text(json.dumps({"spec": "chara_card_v2", "data": {"name": "Ilya", "first_mes": "Hi"}}))
    code, out, err = run(capsys, "build", CHAT, "--template", card)
    assert (code, out) == (1, "")
    assert "character card" in err and "--card" in err


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"story_string": 3}, "story_string"),
        ({"story_string": "", "use_stop_strings": "yes"}, "use_stop_strings"),
        ({"story_string": "", "story_string_position": 2}, "story_string_position"),
        ({"story_string": "", "story_string_role": 3}, "story_string_role"),
        ({"story_string": "", "story_string_depth": -1}, "story_string_depth"),
    ],
)
def test_a_bad_field_names_its_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_context_preset(data, "p.json")
    assert caught.value.key == key


def test_a_broken_story_string_is_a_template_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"story_string": "{{#if system}}{{system}}"}))
    code, out, err = run(capsys, "build", CHAT, "--template", bad)
    assert code == 1 and out == "" and "bad.json" in err and len(err.strip().splitlines()) == 1


# --- the parts, against SillyTavern's rules -----------------------------------------------


@pytest.mark.parametrize(
    ("examples", "separator", "instruct", "expected"),
    [
        ("", "***", False, []),
        ("<START>", "***", False, []),
        ("A: hi\nB: yo", "***", False, ["***\nA: hi\nB: yo\n"]),
        ("<START>\nA: 1\n<start>\nB: 2\n", "", False, ["A: 1\n", "B: 2\n"]),
        ("<START>\nA: 1", "", True, ["<START>\nA: 1\n"]),
        ("<START>\nA: 1", "---", True, ["---\nA: 1\n"]),
    ],
)
def test_example_blocks(examples: str, separator: str, instruct: bool, expected: list[str]) -> None:
    assert example_blocks(examples, separator, instruct) == expected


def _render(preset: ContextPreset, *, instruct: bool = False) -> list[Block]:
    from otaku_ctx.render.names import Names
    from otaku_ctx.render.variables import Variables

    story = open_story(CHAT)
    variables = Variables(story, Names("Ilya", "Wren"))
    from otaku_ctx.assemble import Part

    tail = [Part.verbatim(m) for m in story.messages]
    template = PresetTemplate(preset, compile_template(story_source(preset), "t"), instruct=instruct)
    return template.render(variables.for_assembly([], [], tail))


def test_every_story_string_parameter_is_given() -> None:
    names = "anchorBefore anchorAfter description scenario personality system persona char user"
    names += " wiBefore wiAfter loreBefore loreAfter mesExamples mesExamplesRaw"
    source = "".join(f"[{n}={{{{{n}}}}}]" for n in names.split())
    blocks = _render(ContextPreset("p", story_string=source, example_separator="~~", chat_start=""))
    story = blocks[0].text
    assert "[description=Ilya is the ferryman of the grey river. He never hurries.]" in story
    assert "[char=Ilya][user=Wren]" in story and "[persona=Wren is a cartographer from Ilya's home town.]" in story
    assert "[mesExamples=~~\nWren: Is the crossing safe?" in story
    assert "[mesExamplesRaw=~~\nWren:" in story
    # The story string printed the examples, so they are not repeated after it.
    assert story.count("Mind the step.") == 2


def test_trim_removes_the_newlines_around_it() -> None:
    blocks = _render(ContextPreset("p", story_string="A\n\n{{trim}}\nB{{trim}}", chat_start=""))
    assert blocks[0].text.startswith("AB\n")


def test_in_chat_position_puts_the_story_string_at_depth_with_its_role() -> None:
    preset = ContextPreset("p", story_string="STORY", chat_start="", story_string_position=1, story_string_depth=2,
                           story_string_role=1)  # fmt: skip
    blocks = _render(preset, instruct=True)
    texts = [b.text for b in blocks]
    at = texts.index("STORY")
    assert blocks[at].role == "user" and blocks[at].kind == ""
    # In instruct mode a message carries its speaker; the format writes the name.
    assert [(b.name, b.text) for b in blocks[at + 1 : at + 3]] == [
        ("Ilya", '"An hour. Maybe less." *He unties the rope.*'),
        ("Wren", "Then let's not waste it."),
    ]
    default = _render(ContextPreset("p", story_string="STORY", chat_start=""), instruct=True)
    assert default[0] == Block("system", "STORY", kind="story")


def test_without_always_add_name_the_prompt_ends_on_the_last_message(tmp_path: Path) -> None:
    text = prompt(_preset_file(tmp_path, {"story_string": "S", "chat_start": "", "example_separator": "",
                                "always_force_name2": False}))  # fmt: skip
    assert text.endswith("Wren: Then let's not waste it.")


def test_stop_strings() -> None:
    preset = ContextPreset("p", chat_start="<{{char}}>", example_separator="***")
    fill = lambda s: s.replace("{{char}}", "Ilya")  # noqa: E731
    got = stop_strings(preset, ["Wren", "Oona"], fill, ["<|im_end|>"])
    assert got == ["\nWren:", "\nOona:", "<|im_end|>", "\n<Ilya>", "\n***"]
    quiet = ContextPreset("p", use_stop_strings=False, names_as_stop_strings=False)
    assert stop_strings(quiet, ["Wren"]) == []


def test_stop_strings_in_a_request_body(tmp_path: Path) -> None:
    """names_as_stop_strings lists the user, never the character who is to speak."""
    body = json.loads(prompt(ST / "context" / "default.json", "chatml", emit="openai-completion"))
    assert body["stop"][0] == "\nWren:" and "\nIlya:" not in body["stop"] and "<|im_end|>" in body["stop"]
    assert "\n***" not in body["stop"]  # the Default preset's use_stop_strings is false
    custom = _preset_file(tmp_path, {"story_string": "S", "use_stop_strings": True, "chat_start": "###"})
    assert json.loads(prompt(custom, "chatml", emit="openai-completion"))["stop"][-2:] == ["\n###", "\n***"]


def test_instruct_format_wraps_the_turns() -> None:
    text = prompt(ST / "context" / "chatml.json", "chatml")
    assert "<|im_start|>user\nWren: Then let's not waste it.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nIlya:")


@given(
    chained_stories(),
    shapes,
    st.floats(0.05, 1.2),
    st.integers(0, 40),
    st.sampled_from(["text", "messages", "openai-completion"]),
    st.sampled_from(PRESETS),
    st.sampled_from(["chat", "chatml", "raw", str(PLAIN)]),
)
@settings(max_examples=examples(15))
def test_budget_invariants_hold_for_presets(
    s: object, shape: object, fraction: float, reserve: int, emit: str, name: str, fmt: str
) -> None:
    run_invariants(s, shape, fraction, reserve, emit, "cl100k_base", str(ST / "context" / f"{name}.json"), fmt)  # type: ignore[arg-type]


def _preset_file(folder: Path, data: dict[str, object]) -> Path:
    path = folder / "preset.json"
    path.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
    return path
