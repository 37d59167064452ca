"""Prompt formats: loading (TOML, SillyTavern JSON), merging, text and chat rendering, stops."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO
from hypothesis import given
from hypothesis import strategies as st

from otaku_ctx.errors import ConfigError
from otaku_ctx.hbs.blocks import Block
from otaku_ctx.locations import shipped
from otaku_ctx.render.formats import (
    Format,
    format_names,
    load_format,
    merge_blocks,
    render_messages,
    render_text,
    stop_sequences,
)

PRESETS = sorted((FIXTURES / "sillytavern" / "instruct").glob("*.json"))
BUILTINS = (
    "chat",
    "chatml",
    "llama3",
    "llama3.1",
    "mistral",
    "mistral-v3",
    "mistral-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "alpaca",
    "vicuna",
    "gemma",
    "raw",
)

SYSTEM = "You are Ilya, a ferryman."
GREETING = "Ilya: Welcome aboard."
QUESTION = "Anna: Where are we going?"

CONVERSATION = [
    Block("system", SYSTEM),
    Block("assistant", GREETING),
    Block("user", QUESTION),
    Block("assistant", "Ilya: ", open=True),
]


def builtin(name: str) -> Format:
    return load_format(name, [shipped("formats")])


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- the shipped formats, rendered byte for byte ------------------------------------------

# The open turn ends "Ilya:" with no trailing space, as the models' templates and SillyTavern
# end it; tests/test_fidelity_formats.py holds the comparisons with the templates themselves.
EXPECTED = {
    "chatml": (
        "<|im_start|>system\nYou are Ilya, a ferryman.<|im_end|>\n"
        "<|im_start|>assistant\nIlya: Welcome aboard.<|im_end|>\n"
        "<|im_start|>user\nAnna: Where are we going?<|im_end|>\n"
        "<|im_start|>assistant\nIlya:"
    ),
    "llama3": (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nYou are Ilya, a ferryman.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIlya: Welcome aboard.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnna: Where are we going?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIlya:"
    ),
    "llama3.1": (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are Ilya, a ferryman.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIlya: Welcome aboard.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnna: Where are we going?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIlya:"
    ),
    "mistral": (
        "<s> [INST] You are Ilya, a ferryman. [/INST] Ilya: Welcome aboard.</s>"
        " [INST] Anna: Where are we going? [/INST] Ilya:"
    ),
    # the chat opens with the assistant: the system prompt stays its opening user turn
    "mistral-v3": (
        "<s>[INST] You are Ilya, a ferryman.[/INST] Ilya: Welcome aboard.</s>"
        "[INST] Anna: Where are we going?[/INST] Ilya:"
    ),
    "mistral-tekken": (
        "<s>[INST]You are Ilya, a ferryman.[/INST]Ilya: Welcome aboard.</s>[INST]Anna: Where are we going?[/INST]Ilya:"
    ),
    "mistral-v7": (
        "<s>[SYSTEM_PROMPT] You are Ilya, a ferryman.[/SYSTEM_PROMPT] Ilya: Welcome aboard.</s>"
        "[INST] Anna: Where are we going?[/INST] Ilya:"
    ),
    "mistral-v7-tekken": (
        "<s>[SYSTEM_PROMPT]You are Ilya, a ferryman.[/SYSTEM_PROMPT]Ilya: Welcome aboard.</s>"
        "[INST]Anna: Where are we going?[/INST]Ilya:"
    ),
    "raw": "You are Ilya, a ferryman.\n\nIlya: Welcome aboard.\n\nAnna: Where are we going?\n\nIlya:",
    "chat": "You are Ilya, a ferryman.\n\nIlya: Welcome aboard.\n\nAnna: Where are we going?\n\nIlya:",
    "gemma": (
        "<bos><start_of_turn>user\nYou are Ilya, a ferryman.<end_of_turn>\n"
        "<start_of_turn>model\nIlya: Welcome aboard.<end_of_turn>\n"
        "<start_of_turn>user\nAnna: Where are we going?<end_of_turn>\n"
        "<start_of_turn>model\nIlya:"
    ),
    "alpaca": (
        "You are Ilya, a ferryman.\n\n"
        "### Response:\nIlya: Welcome aboard.\n\n"
        "### Instruction:\nAnna: Where are we going?\n\n"
        "### Response:\nIlya:"
    ),
    "vicuna": (
        "You are Ilya, a ferryman.\n\nASSISTANT: Ilya: Welcome aboard.</s>\n"
        "USER: Anna: Where are we going?\nASSISTANT: Ilya:"
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_four_block_conversation_renders_exactly(name: str) -> None:
    assert render_text(builtin(name), CONVERSATION) == EXPECTED[name]


def test_every_shipped_format_has_an_expected_rendering() -> None:
    assert set(format_names([shipped("formats")])) == set(BUILTINS) == set(EXPECTED)


@pytest.mark.parametrize(
    ("name", "end"),
    [
        ("chatml", "<|im_start|>assistant\n"),
        ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        ("mistral", " [/INST] "),
        ("mistral-v3", "Anna: Where are we going?[/INST] "),
        ("mistral-tekken", "Anna: Where are we going?[/INST]"),
        ("mistral-v7-tekken", "Anna: Where are we going?[/INST]"),
        ("gemma", "<start_of_turn>model\n"),
        ("alpaca", "### Response:\n"),
        ("vicuna", "USER: Anna: Where are we going?\nASSISTANT:"),  # no trailing space
        ("raw", "Anna: Where are we going?\n\n"),
    ],
)
def test_without_an_open_block_an_assistant_turn_is_opened(name: str, end: str) -> None:
    prompt = render_text(builtin(name), CONVERSATION[:3])
    assert prompt.endswith(end)


def test_mistral_folds_the_system_block_into_the_next_user_turn() -> None:
    blocks = [Block("system", SYSTEM), Block("user", QUESTION), Block("assistant", "Ilya: ", open=True)]
    assert render_text(builtin("mistral"), blocks) == (
        "<s> [INST] You are Ilya, a ferryman.\n\nAnna: Where are we going? [/INST] Ilya:"
    )


@pytest.mark.parametrize(
    ("name", "marker"),
    [
        ("chatml", "<|im_end|>"),
        ("llama3", "<|eot_id|>"),
        ("mistral", "</s>"),
        ("gemma", "<end_of_turn>"),
        ("alpaca", "### Instruction:"),
        ("vicuna", "</s>"),
    ],
)
def test_each_format_stops_at_its_end_of_turn_marker(name: str, marker: str) -> None:
    assert marker in builtin(name).stop


def test_chat_is_the_only_chat_format() -> None:
    assert [name for name in BUILTINS if builtin(name).chat] == ["chat"]


# --- wrap, first/last output sequence, alignment ------------------------------------------


def test_wrap_puts_a_newline_after_the_prefix_and_in_place_of_a_missing_suffix() -> None:
    fmt = Format("w", wrap=True, input_sequence="U:", input_suffix="", output_sequence="A:", output_suffix="|")
    blocks = [Block("user", "hi"), Block("assistant", "yo"), Block("assistant", "", open=True)]
    # The open turn stands on a line of its own, as SillyTavern's formatInstructModePrompt puts it.
    assert render_text(fmt, blocks) == "U:\nhi\nA:\nyo|\nA:\n"


def test_first_and_last_output_sequences() -> None:
    fmt = Format("f", output_sequence="<A>", first_output_sequence="<A1>", last_output_sequence="<AL>")
    blocks = [Block("assistant", "a"), Block("user", "u"), Block("assistant", "b"), Block("user", "v")]
    assert render_text(fmt, blocks) == "<A1>a" + "u" + "<A>b" + "v" + "<AL>"


def test_user_alignment_message_goes_before_an_assistant_first_chat() -> None:
    fmt = Format("a", input_sequence="U:", output_sequence="A:", user_alignment_message="Begin.")
    assert render_text(fmt, CONVERSATION[:2]) == SYSTEM + "U:Begin.A:" + GREETING + "A:"
    # a chat that starts with the user needs none
    assert "Begin." not in render_text(fmt, [Block("user", QUESTION)])


def test_only_the_last_block_may_be_open() -> None:
    with pytest.raises(ValueError, match="last block"):
        render_text(builtin("chatml"), [Block("assistant", "x", open=True), Block("user", "y")])


# --- merging ------------------------------------------------------------------------------


def test_consecutive_blocks_of_one_role_merge_with_a_blank_line() -> None:
    blocks = [
        Block("system", "a"),
        Block("system", "b"),
        Block("user", "c"),
        Block("user", "d"),
        Block("assistant", "e"),
    ]
    assert merge_blocks(blocks) == [Block("system", "a\n\nb"), Block("user", "c\n\nd"), Block("assistant", "e")]


def test_a_named_open_block_continues_the_turn_before_it_a_blank_one_does_not() -> None:
    blocks = [Block("assistant", "Ilya: Hm."), Block("assistant", "Ilya: ", open=True)]
    assert merge_blocks(blocks) == [Block("assistant", "Ilya: Hm.\n\nIlya: ", open=True)]
    blank = [Block("assistant", "Ilya: Hm."), Block("assistant", "", open=True)]
    assert merge_blocks(blank) == blank


def test_alternating_text_formats_merge_the_others_keep_every_turn() -> None:
    blocks = [Block("system", "a"), Block("user", "c"), Block("user", "d")]
    assert render_text(builtin("gemma"), blocks).startswith("<bos><start_of_turn>user\na\n\nc\n\nd<end_of_turn>\n")
    assert render_text(builtin("chatml"), blocks).startswith(
        "<|im_start|>system\na<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>user\nd<|im_end|>\n"
    )


blocks_strategy = st.lists(
    st.builds(Block, st.sampled_from(["system", "user", "assistant"]), st.text(max_size=5)),
    max_size=8,
)


@given(blocks_strategy, st.booleans())
def test_merge_alternates_roles_and_keeps_the_text(blocks: list[Block], with_open: bool) -> None:
    if with_open and blocks:
        blocks[-1] = Block(blocks[-1].role, blocks[-1].text, open=True)
    merged = merge_blocks(blocks)
    for before, after in pairwise(merged):
        assert before.role != after.role or after.open
    assert "\n\n".join(b.text for b in merged) == "\n\n".join(b.text for b in blocks)
    assert [b.open for b in merged].count(True) == [b.open for b in blocks].count(True)


# --- chat messages ------------------------------------------------------------------------


def test_messages_send_a_non_blank_open_block_as_a_prefill() -> None:
    assert render_messages(builtin("chat"), CONVERSATION) == [
        {"role": "system", "content": SYSTEM},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Ilya:"},
    ]


@pytest.mark.parametrize("text", ["", "  \n"])
def test_messages_drop_a_blank_open_block(text: str) -> None:
    blocks = [*CONVERSATION[:3], Block("assistant", text, open=True)]
    assert render_messages(builtin("chat"), blocks)[-1] == {"role": "user", "content": QUESTION}


def test_messages_fold_the_system_role_where_the_model_has_none() -> None:
    """Mistral's and Gemma's templates refuse a system message that is not first, or any."""
    blocks = [Block("system", "a"), Block("system", "b"), Block("user", "c")]
    assert render_messages(builtin("mistral"), blocks) == [{"role": "user", "content": "a\n\nb\n\nc"}]
    assert render_messages(builtin("chatml"), blocks)[0] == {"role": "system", "content": "a"}


# --- stop sequences -----------------------------------------------------------------------


def test_stop_sequences_add_each_name_once_after_the_format_stops() -> None:
    assert stop_sequences(builtin("chatml"), ["Ilya", "Anna", "Ilya", ""]) == [
        "<|im_end|>",
        "<|im_start|>",
        "\nIlya:",
        "\nAnna:",
    ]


def test_stop_sequences_drop_empty_and_duplicate_format_stops(tmp_path: Path) -> None:
    path = write(tmp_path, "s.toml", 'stop_sequence = "END"\nstop = ["", "END", "\\nX:", "STOP"]\n')
    assert stop_sequences(load_format(str(path), []), ["X"]) == ["END", "\nX:", "STOP"]


def test_raw_has_only_name_stops() -> None:
    assert stop_sequences(builtin("raw"), ["Ilya"]) == ["\nIlya:"]


# --- SillyTavern presets ------------------------------------------------------------------


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_sillytavern_preset_renders_ending_in_its_output_sequence(path: Path) -> None:
    fmt = load_format(str(path), [])
    sequence = fmt.last_output_sequence or fmt.output_sequence
    assert sequence, "a preset without an output sequence"
    bare = render_text(fmt, [*CONVERSATION[:3], Block("assistant", "", open=True)])
    named = render_text(fmt, CONVERSATION)
    assert bare.endswith(sequence + ("\n" if fmt.wrap else ""))
    assert named.startswith(bare)
    assert named[len(bare) :].lstrip(" ") == "Ilya:"
    assert GREETING in named and QUESTION in named and SYSTEM in named


def test_the_preset_fixtures_are_there() -> None:
    assert len(PRESETS) >= 7


def test_chatml_preset_renders_like_the_shipped_chatml() -> None:
    preset = load_format(str(FIXTURES / "sillytavern" / "instruct" / "chatml.json"), [])
    assert preset.name == "ChatML"
    assert render_text(preset, CONVERSATION) == EXPECTED["chatml"]


def test_gemma_preset_gives_the_system_prompt_its_own_system_sequence() -> None:
    """A ctx template's system prompt takes a preset's system sequence when it names the
    system role, `system_same_as_user` or not (Llama 3's own header); for Gemma 2 that is its
    `<start_of_turn>system` (SillyTavern's Gemma 2 context preset writes a user turn instead:
    give it to --template, or use --format gemma, the model's own template)."""
    preset = load_format(str(FIXTURES / "sillytavern" / "instruct" / "gemma-2.json"), [])
    assert preset.system_same_as_user
    shipped = EXPECTED["gemma"].removeprefix("<bos>")
    assert render_text(preset, CONVERSATION) == shipped.replace(
        "<start_of_turn>user\nYou", "<start_of_turn>system\nYou"
    )


def test_llama3_preset_gives_the_system_prompt_its_own_header_alpaca_no_input() -> None:
    llama = load_format(str(FIXTURES / "sillytavern" / "instruct" / "llama-3-instruct.json"), [])
    assert render_text(llama, CONVERSATION) == EXPECTED["llama3"].removeprefix("<|begin_of_text|>")
    alpaca = load_format(str(FIXTURES / "sillytavern" / "instruct" / "alpaca.json"), [])
    text = render_text(alpaca, CONVERSATION)
    assert text.startswith(SYSTEM + "\n\n### Response:\n") and "### Input:" not in text


def test_mistral_preset_aligns_and_puts_the_space_back_before_the_name() -> None:
    """SillyTavern gives every message its own turn: the system prompt (a user turn here)
    and the alignment message are two [INST] turns, as SillyTavern writes them."""
    preset = load_format(str(FIXTURES / "sillytavern" / "instruct" / "mistral-v2-v3.json"), [])
    assert render_text(preset, CONVERSATION) == (
        "[INST] You are Ilya, a ferryman."
        "[INST] Let's get started. Please respond based on the information and instructions provided above."
        "[/INST] Ilya: Welcome aboard.</s>"
        "[INST] Anna: Where are we going?[/INST] Ilya:"
    )
    assert render_text(preset, CONVERSATION[:3]).endswith("Where are we going?[/INST]")


def test_legacy_system_prefix_wraps_system_blocks() -> None:
    preset = load_format(str(FIXTURES / "sillytavern" / "instruct" / "vicuna-1-1.json"), [])
    assert render_text(preset, CONVERSATION) == (
        "BEGINNING OF CONVERSATION:You are Ilya, a ferryman."
        "\nASSISTANT: Ilya: Welcome aboard.</s>"
        "\nUSER: Anna: Where are we going?"
        "\nASSISTANT: Ilya:"
    )


def test_preset_stop_strings_are_its_stop_sequence_and_its_sequences() -> None:
    preset = load_format(str(FIXTURES / "sillytavern" / "instruct" / "alpaca.json"), [])
    # SillyTavern's getInstructStoppingSequences: behind a newline when the preset wraps.
    assert preset.stop == ("\n### Instruction:", "\n### Response:", "\n### Input:")
    vicuna = load_format(str(FIXTURES / "sillytavern" / "instruct" / "vicuna-1-1.json"), [])
    assert vicuna.stop == ("USER: ", "ASSISTANT: ")  # trailing spaces kept, blank lines left out


def test_preset_ignores_unknown_keys_but_not_wrong_types(tmp_path: Path) -> None:
    ok = write(tmp_path, "ok.json", '{"input_sequence": "U:", "output_sequence": "A:", "ui_colour": 3}')
    assert render_text(load_format(str(ok), []), [Block("user", "hi")]) == "U:hiA:"
    bad = write(tmp_path, "bad.json", '{"input_sequence": "U:", "wrap": "yes"}')
    with pytest.raises(ConfigError) as caught:
        load_format(str(bad), [])
    assert caught.value.key == "wrap" and caught.value.source == str(bad)


# --- TOML files and their errors ----------------------------------------------------------


def test_a_bare_name_is_found_in_the_first_search_dir_that_has_it(tmp_path: Path) -> None:
    write(tmp_path, "chatml.toml", 'name = "Mine"\n')
    assert load_format("chatml", [tmp_path, shipped("formats")]).name == "Mine"
    assert load_format("llama3", [tmp_path, shipped("formats")]).bos == "<|begin_of_text|>"


def test_a_toml_path_is_read_as_it_is(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.toml", 'input_sequence = "> "\nwrap = true\n')
    fmt = load_format(str(path), [])
    assert (fmt.name, fmt.input_sequence, fmt.wrap, fmt.chat) == ("mine", "> ", True, False)


def test_the_shipped_formats_are_found_through_the_package() -> None:
    """A checkout finds them where an installed wheel does: `otaku_ctx/configs` (a link to
    the top-level `configs/` here), the folder importlib.resources names for the package."""
    from importlib.resources import files

    assert shipped("formats").resolve() == REPO / "configs" / "formats"
    assert shipped("formats") == Path(str(files("otaku_ctx") / "configs" / "formats"))


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="no such format.*chatml"):
        load_format("chatmll", [shipped("formats")])


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('input_sequense = "U:"\n', "input_sequense"),
        ("wrap = 1\n", "wrap"),
        ("input_sequence = 3\n", "input_sequence"),
        ('stop = "END"\n', "stop"),
        ("stop = [1]\n", "stop"),
        ('names_behavior = "sometimes"\n', "names_behavior"),
        ('name = ""\n', "name"),
        ("[input_sequence]\n", "input_sequence"),
    ],
)
def test_a_bad_toml_key_is_a_config_error_naming_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_format(str(path), [])
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{path}: {key}: ")


@pytest.mark.parametrize(("name", "text"), [("broken.toml", "wrap = \n"), ("broken.json", "{"), ("list.json", "[]")])
def test_an_unreadable_file_is_a_config_error(tmp_path: Path, name: str, text: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as caught:
        load_format(str(path), [])
    assert caught.value.source == str(path)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_format(str(tmp_path / "nope.toml"), [])


# --- names are data in sequences --------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "char"),
    [("{{char}}", "Ilya"), ("<BOT>", "Ilya"), ("Wren", "{{user}}"), ("{{name}} Jr", "Ilya"), ("Wren", "{{NAME}}")],
)
def test_a_name_that_looks_like_a_macro_is_written_as_it_is(user: str, char: str, tmp_path: Path) -> None:
    """`{{user}}` and `{{char}}` are filled in one pass, and `{{name}}` in a sequence only where
    the sequence wrote it: a persona named "{{char}}" must not become the character's name."""
    from otaku_ctx.render.formats import bind

    path = write(
        tmp_path,
        "m.toml",
        'input_sequence = "<{{user}}|{{name}}>"\noutput_sequence = "<{{char}}|{{name}}>"\n'
        'stop = ["{{user}}:"]\nwrap = false\nnames_behavior = "none"\n',
    )
    fmt = bind(load_format(str(path), []), user, char)
    blocks = [Block("user", "hi", name=user), Block("assistant", "yo", name=char), Block("assistant", "", open=True)]
    text = render_text(fmt, blocks)
    assert text.startswith(f"<{user}|{user}>hi<{char}|{char}>yo<{char}|{char}>"), text
    assert fmt.stop[0] == f"{user}:"
    assert "\ue000" not in text + "".join(fmt.stop)  # the mark that stands for a name's braces never shows


def test_the_system_prompt_goes_before_the_whole_last_user_turn() -> None:
    """Mistral v3: two user messages that merge into the last turn get the system prompt
    before both, as mistral-common 1.13.1's encode_chat_completion writes it:
    `<s>[INST] Anna: Hi.[/INST] Ilya: Hello.</s>[INST] You are Ilya.\\n\\nAnna: a\\n\\nAnna: b[/INST]`."""
    fmt = load_format("mistral-v3", [shipped("formats")])
    blocks = [
        Block("system", "You are Ilya."),
        Block("user", "Anna: Hi."),
        Block("assistant", "Ilya: Hello."),
        Block("user", "Anna: a"),
        Block("user", "Anna: b"),
    ]
    expected = "<s>[INST] Anna: Hi.[/INST] Ilya: Hello.</s>[INST] You are Ilya.\n\nAnna: a\n\nAnna: b[/INST]"
    assert render_text(fmt, blocks).startswith(expected)
