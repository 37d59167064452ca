"""Templates and formats end to end: the variables, the shipped templates, the presets, and the
budget holding whatever the template and format add."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CASE3, CASE4, FIXTURES, REPO, run, sweep
from stories import story, to_records, write_jsonl

from otaku_ctx.build import build, open_story, renderer_for
from otaku_ctx.config import load_settings
from otaku_ctx.story.model import Card, Message, Story, StoryInfo
from otaku_ctx.tokens import make_counter

PRESETS = sorted((FIXTURES / "sillytavern" / "instruct").glob("*.json"))


def settings(**prompt):
    return load_settings(overrides={f"prompt.{k}": (v, "test") for k, v in prompt.items()})


def chat_story(n: int = 8) -> Story:
    """Alternating user/assistant messages and Ilya's card at message 1."""
    card = Card(
        name="Ilya",
        description="{{char}} keeps the lamp; {{user}} is new here.",
        example_dialogue="Ilya: The light must not go out.",
        post_history_instructions="Ilya never hurries.",
    )
    messages = [Message(1, "system", "", "Ilya", card=card)]
    for number in range(2, n + 1):
        role = "user" if number % 2 == 0 else "assistant"
        messages.append(Message(number, role, f"line {number}", "Mara" if role == "user" else "Ilya"))
    return Story(path=Path("chat.jsonl"), messages=tuple(messages), system="Narrate for {{user}}.")


# ── the seed's Serene Pub template, verbatim ─────────────────────────────────────────────


def test_serene_template_is_the_seed_verbatim():
    seed = (FIXTURES / "serene-pub-context-configs.txt").read_text(encoding="utf-8")
    template = (REPO / "configs" / "templates" / "serene.hbs").read_text(encoding="utf-8")
    assert template.strip() in seed


@pytest.mark.parametrize("depth", [0, 2, 99])
def test_serene_reminder_renders_once_at_target_and_never_after_the_open_turn(depth):
    s = chat_story()
    st = settings(
        template="serene", post_history_instructions="Stay in character.", post_history_depth=depth, user="Mara"
    )
    built = build(s, st)
    renderer = renderer_for(s, st)
    blocks = renderer.blocks(built.assembly)
    reminders = [i for i, b in enumerate(blocks) if "Response reminder:" in b.text]
    assert len(reminders) == 1
    at = reminders[0]
    assert "Stay in character." in blocks[at].text and "Ilya never hurries." in blocks[at].text
    assert blocks[-1].open and blocks[-1].role == "assistant" and blocks[-1].text == "Ilya: "
    assert at < len(blocks) - 1
    # chatMessages: 7 spoken lines, then the open turn; serene renders user/assistant only,
    # after one system block. Depth d puts the reminder d entries before the open turn.
    spoken_after = [b for b in blocks[at + 1 : -1] if b.role in ("user", "assistant")]
    assert len(spoken_after) == min(depth, 7)


def test_serene_shows_characters_personas_and_history_json():
    s = open_story(CASE4)
    built = build(s, settings(template="serene"))
    blocks = renderer_for(s, settings(template="serene")).blocks(built.assembly)
    system = blocks[0].text
    assert "Assistant Characters (AI-controlled):" in system
    assert '"name": "Keeper Alder"' in system or '"name": "Ilya"' in system
    assert "User Characters (player-controlled):" in system and '"name": "Mara"' in system
    history = json.loads(system.split("Story history:\n```json\n", 1)[1].split("\n```", 1)[0])
    assert history[0]["scene"] == built.assembly.history.ref and "history" in history[0]
    assert [h["scene"] for h in history[1:]] == [sc.ref for sc in built.assembly.summaries]


def test_done_when_serene_chatml_case_4(capsys):
    code, prompt, _ = run(capsys, "build", CASE4, "--template", "serene", "--format", "chatml", "--emit", "text")
    assert code == 0
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>assistant\nNarrator:")
    code, out, _ = run(capsys, "inspect", CASE4, "--template", "serene", "--format", "chatml", "--json")
    data = json.loads(out)
    assert make_counter("cl100k_base")(prompt) == data["tokens"] <= data["limit"]


# ── shipped templates and variables ──────────────────────────────────────────────────────


def test_default_template_is_otakus_shape():
    s = story(220, [(1, 25), (26, 42), (43, 64), (65, 95)], cards=[47], system="Be kind.")
    st = settings()
    built = build(s, st)
    prompt = built.prompt
    assert prompt.startswith("Be kind.\n\nMara: word 1\n\nIlya: word 2")
    order = [
        prompt.index(x) for x in ("[Scene 1]", "[Scene 2]", "Card47 joins the story.", "[Scene 3]", "Ilya: word 66")
    ]
    assert order == sorted(order)
    assert prompt.endswith("Ilya: word 220\n\nIlya:")


def test_sillytavern_template_fills_the_story_string_from_the_card():
    s = chat_story()
    st = settings(template="sillytavern", user="Mara")
    blocks = renderer_for(s, st).blocks(build(s, st).assembly)
    assert blocks[0].role == "system"
    assert blocks[0].text.startswith("Narrate for Mara.\nIlya keeps the lamp; Mara is new here.")
    # SillyTavern's default context: examples headed by its separator, then its chat start.
    assert blocks[0].text.endswith("\n***\nIlya: The light must not go out.\n***")


def test_template_variables(tmp_path, capsys):
    template = tmp_path / "vars.hbs"
    template.write_text(
        "{{#systemBlock}}title={{title}} char={{char}} user={{user}} "
        "summaries={{#each summaries}}{{scene}},{{/each}} history={{recap.history.scene}} "
        "floated={{#each floatedCards}}{{number}},{{/each}} head={{head.length}} tail={{tail.length}} "
        "chat={{chatMessages.length}} last={{#each chatMessages}}{{#if @last}}{{kind}}{{/if}}{{/each}} "
        "missing=[{{nothing.here}}]{{/systemBlock}}\n"
        + (REPO / "configs" / "templates" / "default.hbs").read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    code, out, _ = run(capsys, "build", CASE4, "--template", template)
    assert code == 0
    data = json.loads(run(capsys, "inspect", CASE4, "--template", template, "--json")[1])
    assert out.startswith("title=The Lamp That Would Not Go Out char=Narrator user=Mara ")
    assert f"summaries={''.join(f'{s},' for s in data['summaries'])} " in out
    assert data["case"] == 4
    assert f"history={data['history']['through_scene']} " in out
    assert "floated=33, " in out
    head, tail = data["head"], data["tail"]
    assert f"head={head['last']} tail={tail['last'] - tail['first'] + 1} " in out
    assert "last=open " in out
    assert "missing=[]" in out  # a variable the story doesn't have is empty, never an error


def test_macros_are_replaced_in_data_not_compiled():
    s = chat_story()
    st = settings(user="Mara")
    prompt = build(s, st).prompt
    assert prompt.startswith("Narrate for Mara.")
    assert "Ilya keeps the lamp; Mara is new here." in prompt
    assert "{{" not in prompt


def test_consecutive_blocks_merge_so_chat_roles_alternate(capsys):
    code, out, _ = run(capsys, "build", CASE4, "--emit", "messages")
    roles = [m["role"] for m in json.loads(out)]
    assert code == 0
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


# ── the budget holds with any template and format ────────────────────────────────────────


def test_a_2000_token_preamble_is_counted_in_the_fit(tmp_path, capsys):
    preamble = " ".join(f"rule{i}." for i in range(700))
    assert 1900 <= make_counter("cl100k_base")(preamble) <= 2300
    default = (REPO / "configs" / "templates" / "default.hbs").read_text(encoding="utf-8")
    template = tmp_path / "heavy.hbs"
    template.write_text("{{#systemBlock}}\n" + preamble + "\n{{/systemBlock}}\n" + default, encoding="utf-8")
    light = json.loads(run(capsys, "inspect", CASE4, "--json")[1])
    heavy = json.loads(run(capsys, "inspect", CASE4, "--template", template, "--json")[1])
    code, prompt, _ = run(capsys, "build", CASE4, "--template", template)
    assert code == 0 and prompt.startswith("rule0.")
    assert make_counter("cl100k_base")(prompt) == heavy["tokens"] <= heavy["limit"]
    assert heavy["sections"]["fixed"] >= light["sections"]["fixed"] + 1900
    # The preamble pushed the recap down: a later level, or a shorter tail.
    assert (heavy["case"], heavy["level"], -heavy["tail_target"]) > (
        light["case"],
        light["level"],
        -light["tail_target"],
    )


@pytest.mark.parametrize(
    ("fmt", "emit"),
    sweep(["chat", "chatml", "llama3", "mistral", "alpaca", "vicuna", "gemma", "raw"], ["text", "messages"]),
)
def test_every_format_fits_to_the_token(capsys, fmt, emit):
    data = json.loads(run(capsys, "inspect", CASE4, "--format", fmt, "--emit", emit, "--json")[1])
    assert data["tokens"] <= data["limit"]
    code, out, _ = run(capsys, "build", CASE4, "--format", fmt, "--emit", emit)
    assert code == 0
    if emit == "text":
        assert make_counter("cl100k_base")(out) == data["tokens"]


# ── SillyTavern instruct presets as formats ──────────────────────────────────────────────


def test_the_preset_fixtures_are_there():
    assert len(PRESETS) >= 7


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_sillytavern_preset_renders_a_prompt(capsys, preset):
    fields = json.loads(preset.read_text(encoding="utf-8"))
    code, prompt, err = run(capsys, "build", CASE3, "--format", preset)
    assert code == 0, err
    assert "Mara: " in prompt and prompt.rstrip().endswith("Narrator:")
    if fields["input_sequence"].strip():
        assert fields["input_sequence"].strip() in prompt
    data = json.loads(run(capsys, "inspect", CASE3, "--format", preset, "--json")[1])
    assert make_counter("cl100k_base")(prompt) == data["tokens"] <= data["limit"]


# ── bad templates ────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("source", "where", "needle"),
    [
        ("line one\n{{#if system}}\nunclosed", ":2:", "if"),
        ("{{#each chatMessages}}{{/with}}", ":1:", "with"),
        ("ok\n\n  {{frobnicate system}}", ":3:3", "frobnicate"),
    ],
)
def test_bad_template_names_file_line_and_column(capsys, tmp_path, source, where, needle):
    template = tmp_path / "bad.hbs"
    template.write_text(source, encoding="utf-8")
    code, out, err = run(capsys, "build", CASE3, "--template", template)
    assert code == 1 and out == ""
    assert err.startswith(f"ctx: {template}{where}") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unknown_template_and_format_names(capsys):
    """A name that names nothing is a usage error on the command line, bad input in a config file."""
    code, out, err = run(capsys, "build", CASE3, "--template", "nope")
    assert code == 2 and out == "" and "no template named 'nope'" in err and "serene" in err
    code, out, err = run(capsys, "build", CASE3, "--format", "nope")
    assert code == 2 and out == "" and "nope" in err


def test_a_template_sees_only_plain_data(tmp_path, capsys):
    template = tmp_path / "probe.hbs"
    template.write_text(
        "{{#systemBlock}}[{{system.__class__}}][{{system.upper}}][{{chatMessages.__len__}}]"
        "[{{chatMessages.0.message.__class__.__mro__}}]{{/systemBlock}}",
        encoding="utf-8",
    )
    s = story(3, system="plain")
    path = write_jsonl(tmp_path / "s.jsonl", to_records(s))
    code, out, _ = run(capsys, "build", path, "--template", template)
    assert code == 0
    assert out.startswith("[][][][]")


def test_a_context_preset_is_not_a_format(capsys):
    context = FIXTURES / "sillytavern" / "context" / "chatml.json"
    code, out, err = run(capsys, "build", CASE3, "--format", context)
    assert code == 1 and out == "" and "context preset" in err and "input_sequence" in err


def test_a_last_reply_ending_in_a_colon_is_not_taken_for_the_open_turn(tmp_path):
    template = tmp_path / "no-open.hbs"
    template.write_text(
        "{{#each chatMessages}}{{#if (eq kind 'message')}}{{#if (eq role 'user')}}{{#userBlock}}{{name}}: {{message}}"
        "{{/userBlock}}{{else}}{{#assistantBlock}}{{name}}: {{message}}{{/assistantBlock}}{{/if}}{{/if}}{{/each}}",
        encoding="utf-8",
    )
    s = chat_story(4)
    s = Story(path=s.path, messages=(*s.messages[:2], Message(3, "assistant", "It reads:", "Ilya")))
    st = settings(template=str(template))
    built = build(s, st, emit="messages")
    assert json.loads(built.prompt)[-1] == {"role": "assistant", "content": "Ilya: It reads:"}
    blocks = renderer_for(s, st).blocks(built.assembly)
    assert not blocks[-1].open


def test_serene_shows_the_system_message_as_instructions():
    s = chat_story()
    st = settings(template="serene", user="Mara")
    blocks = renderer_for(s, st).blocks(build(s, st).assembly)
    assert 'Instructions:\n"""\nNarrate for Mara.\n"""' in blocks[0].text


def test_sillytavern_template_does_not_repeat_the_main_card():
    s = chat_story()
    st = settings(template="sillytavern", user="Mara")
    prompt = build(s, st).prompt
    assert prompt.count("Ilya keeps the lamp") == 1


def test_the_configured_user_names_the_persona_whatever_the_story_says(tmp_path):
    """SillyTavern's rule: {{user}} is the persona (--user, else [prompt] user), then the story."""
    s = chat_story()
    told = Story(path=s.path, messages=s.messages, system=s.system, info=StoryInfo(user="Wren"))
    configured = load_settings(overrides={"prompt.user": ("Robin", "--user")})
    assert build(s, configured).prompt.startswith("Narrate for Robin.")  # the story does not say
    assert build(told, load_settings()).prompt.startswith("Narrate for Wren.")  # only the story says
    assert build(told, configured).prompt.startswith("Narrate for Robin.")  # the persona wins
