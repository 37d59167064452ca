"""SillyTavern instruct presets as SillyTavern applies them (issue 9, item 2).

The golden prompts and stop strings in `fixtures/sillytavern/golden/instruct/` were made by
SillyTavern 1.12.6's own instruct-mode functions (commit ba6f7b7a), run under node by
`make_instruct_goldens.mjs` on `small-chat.jsonl`: each instruct preset with the Default
context preset, each context preset with its own instruct preset, and Default with instruct
mode off. ctx must print the same bytes and the same stop strings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FIXTURES

from otaku_ctx.build import build, open_story
from otaku_ctx.config import load_settings
from otaku_ctx.hbs.blocks import Block
from otaku_ctx.render.formats import Format, bind, load_format, render_messages, render_text

ST = FIXTURES / "sillytavern"
GOLDEN = ST / "golden"
CASES = sorted(p.stem for p in (GOLDEN / "instruct").glob("*.txt"))


def built(context: str, instruct: str, emit: str) -> str:
    fmt = GOLDEN / "plain-text.toml" if instruct == "none" else ST / "instruct" / f"{instruct}.json"
    settings = load_settings(
        overrides={
            "prompt.template": (str(ST / "context" / f"{context}.json"), "test"),
            "prompt.format": (str(fmt), "test"),
            "model.max_stop_strings": (0, "test"),
        }
    )
    prompt = build(open_story(GOLDEN / "small-chat.jsonl"), settings, emit=emit).prompt
    assert prompt is not None
    return prompt


def test_every_preset_and_pair_has_a_golden() -> None:
    presets = {p.stem for p in (ST / "instruct").glob("*.json")}
    assert {f"default+{name}" for name in presets} <= set(CASES)
    assert {"chatml+chatml", "llama-3-instruct+llama-3-instruct", "mistral-v2-v3+mistral-v2-v3"} <= set(CASES)
    assert {"alpaca+alpaca", "default+none"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_prompt_is_sillytavern_s_byte_for_byte(case: str) -> None:
    context, instruct = case.split("+")
    expected = (GOLDEN / "instruct" / f"{case}.txt").read_bytes()
    assert built(context, instruct, "text").encode("utf-8") == expected


@pytest.mark.parametrize("case", CASES)
def test_stop_strings_are_sillytavern_s(case: str) -> None:
    context, instruct = case.split("+")
    body = json.loads(built(context, instruct, "openai-completion"))
    expected = json.loads((GOLDEN / "instruct" / f"{case}.stop.json").read_text(encoding="utf-8"))
    assert body["stop"] == expected
    assert body["prompt"] == (GOLDEN / "instruct" / f"{case}.txt").read_text(encoding="utf-8")


# --- the rules one by one -----------------------------------------------------------------

SEQ = Format("s", input_sequence="<U {{name}}>", output_sequence="<A {{name}}>", system_sequence="<S {{name}}>",
             first_input_sequence="<FU>", last_input_sequence="<LU>", first_output_sequence="<FA>",
             names_behavior="always", alternate=False)  # fmt: skip


def chat(*blocks: Block) -> list[Block]:
    return [*blocks, Block("assistant", "", open=True, name="Ilya")]


def test_first_output_only_when_the_oldest_message_is_the_assistant_s() -> None:
    fmt = bind(SEQ, "Wren", "Ilya")
    text = render_text(fmt, chat(Block("user", "a", name="Wren"), Block("assistant", "b", name="Ilya"),
                                 Block("user", "c", name="Wren")))  # fmt: skip
    assert text == "<FU>Wren: a<A Ilya>Ilya: b<LU>Wren: c<A Ilya>Ilya:"
    text = render_text(fmt, chat(Block("assistant", "b", name="Ilya"), Block("user", "c", name="Wren")))
    assert text == "<FA>Ilya: b<LU>Wren: c<A Ilya>Ilya:"


def test_the_last_user_message_wins_over_the_first() -> None:
    assert render_text(bind(SEQ, "Wren", "Ilya"), chat(Block("user", "a", name="Wren"))) == "<LU>Wren: a<A Ilya>Ilya:"


def test_a_narrator_message_is_a_system_turn_named_system() -> None:
    text = render_text(bind(SEQ, "Wren", "Ilya"), chat(Block("user", "a", name="Wren"), Block("system", "fog")))
    assert text == "<LU>Wren: a<S System>fog<A Ilya>Ilya:"


@pytest.mark.parametrize(
    ("behavior", "group", "expected"),
    [
        ("always", False, "<U Wren>Wren: a<A Ilya>Ilya: b<A Ilya>Ilya:"),
        ("none", False, "<U Wren>a<A Ilya>b<A Ilya>"),
        ("force", False, "<U Wren>a<A Ilya>b<A Ilya>"),
        ("force", True, "<U Wren>a<A Ilya>Ilya: b<A Ilya>Ilya:"),
    ],
)
def test_names_behavior(behavior: str, group: bool, expected: str) -> None:
    fmt = bind(Format("n", input_sequence="<U {{name}}>", output_sequence="<A {{name}}>", names_behavior=behavior,
                      alternate=False), "Wren", "Ilya", group)  # fmt: skip
    blocks = chat(Block("user", "a", name="Wren"), Block("assistant", "b", name="Ilya"))
    assert render_text(fmt, blocks) == expected
    said = [m["content"] for m in render_messages(fmt, blocks[:-1])]
    assert said[1] == ("Ilya: b" if "Ilya: b" in expected else "b")


def test_user_and_char_macros_fill_sequences_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"input_sequence": "<|im_start|>{{user}}", "output_sequence": "<|im_start|>{{name}}",
                                "wrap": True, "names": False, "names_force_groups": False}))  # fmt: skip
    fmt = load_format(str(path), [])
    assert fmt.names_behavior == "none"  # the older keys migrate
    assert fmt.stop == ("\n<|im_start|>{{user}}", "\n<|im_start|>{{char}}")
    bound = bind(fmt, "Wren", "Ilya")
    assert bound.stop == ("\n<|im_start|>Wren", "\n<|im_start|>Ilya")
    text = render_text(bound, chat(Block("user", "a", name="Wren")))
    assert text == "<|im_start|>Wren\na\n<|im_start|>Ilya\n"


def test_without_macro_sequences_stay_literal() -> None:
    fmt = bind(Format("m", input_sequence="{{user}}>", output_sequence="{{name}}>", macro=False), "Wren", "Ilya")
    assert render_text(fmt, [Block("user", "a")]) == "{{user}}>a{{name}}>"


def test_story_string_sequences_wrap_only_the_story_block() -> None:
    fmt = Format("s", wrap=True, story_string_prefix="<SYS>", story_string_suffix="</SYS>\n",
                 input_sequence="U:", output_sequence="A:", alternate=False)  # fmt: skip
    blocks = [Block("system", "story\n", kind="story"), Block("system", "***\n", kind="raw"), Block("user", "hi")]
    assert render_text(fmt, blocks) == "<SYS>\nstory\n</SYS>\n***\nU:\nhi\nA:\n"
    plain = Format("p", input_sequence="U:", output_sequence="A:", system_sequence="S:", alternate=False)
    assert render_text(plain, blocks) == "story\n***\nU:hiA:"
