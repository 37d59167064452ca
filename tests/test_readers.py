"""Story readers: detection by content, and each format read into the same Story."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from conftest import CASE3, FIXTURES
from ctx_run import ctx

from otaku_ctx.errors import StoryError
from otaku_ctx.status import ExitStatus
from otaku_ctx.story.detect import detect_format, read_story

OPENAI = FIXTURES / "openai-messages.jsonl"
CHAT = FIXTURES / "sillytavern" / "seraphina-chat.jsonl"
CARD_PNG = FIXTURES / "sillytavern" / "seraphina-card.png"
RIVER = FIXTURES / "otaku" / "river.md"
TOUR = FIXTURES / "otaku" / "tour.md"
ST_VARIANTS = FIXTURES / "sillytavern" / "variants"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def raises_story_error(path: Path, line: int | None = None, source_format: str | None = None) -> StoryError:
    """Read `path`, expecting a StoryError that names the file (and the line, when given)."""
    with pytest.raises(StoryError) as caught:
        read_story(path, source_format)
    error = caught.value
    assert str(path) in str(error)
    if line is not None:
        assert error.line == line
        assert f"{path}:{line}:" in str(error)
    return error


def openai_array(tmp_path: Path) -> Path:
    """The OpenAI fixture as one pretty-printed JSON array."""
    rows = [json.loads(line) for line in OPENAI.read_text(encoding="utf-8").splitlines() if line.strip()]
    return write(tmp_path / "messages.json", json.dumps(rows, indent=2, ensure_ascii=False))


# -- detection -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [(OPENAI, "native"), (CHAT, "sillytavern"), (RIVER, "otaku")],
    ids=["openai-jsonl-is-native", "sillytavern-chat", "otaku-export"],
)
def test_detect_format_of_fixtures(path: Path, expected: str) -> None:
    assert detect_format(path) == expected


def test_detect_format_by_content_not_extension(tmp_path: Path) -> None:
    assert detect_format(openai_array(tmp_path)) == "openai"
    assert detect_format(write(tmp_path / "chat.txt", CHAT.read_text(encoding="utf-8"))) == "sillytavern"
    assert detect_format(write(tmp_path / "river.jsonl", RIVER.read_text(encoding="utf-8"))) == "otaku"


def test_random_text_matches_no_reader(tmp_path: Path) -> None:
    path = write(tmp_path / "notes.txt", "Shopping list\n- eggs\n- milk\n")
    error = raises_story_error(path)
    assert "expected native story JSONL" in error.message
    assert "SillyTavern" in error.message and "otaku" in error.message


def test_png_given_as_story_matches_no_reader() -> None:
    error = raises_story_error(CARD_PNG)
    assert "PNG" in error.message and "expected" in error.message


def test_card_json_given_as_story_is_refused(tmp_path: Path) -> None:
    card = {"spec": "chara_card_v2", "spec_version": "2.0", "data": {"name": "Ilya", "first_mes": "Hi."}}
    one_line = raises_story_error(write(tmp_path / "card.jsonl", json.dumps(card)))
    assert "character card" in one_line.message
    pretty = raises_story_error(write(tmp_path / "card.json", json.dumps(card, indent=2)))
    assert "character card" in pretty.message


def test_unknown_source_format() -> None:
    error = raises_story_error(OPENAI, source_format="kobold")
    assert "'kobold'" in error.message and "sillytavern" in error.message


def test_missing_file(tmp_path: Path) -> None:
    error = raises_story_error(tmp_path / "nope.jsonl")
    assert "no such file" in error.message


# -- OpenAI messages -----------------------------------------------------------------------


def test_openai_jsonl_reads_as_native() -> None:
    story = read_story(OPENAI)
    assert story.source_format == "native"
    assert story.system.startswith("You are the narrator of a slow-burn mystery")
    assert [(m.number, m.role, m.name) for m in story.messages] == [
        (1, "user", "Ines"),
        (2, "assistant", None),
        (3, "user", "Ines"),
        (4, "assistant", None),
    ]
    # Text is kept verbatim: special tokens and macros are the renderer's business.
    assert "<|endoftext|>" in story.message(4).content and "{{char}}" in story.message(4).content


def test_openai_jsonl_asked_for_as_openai() -> None:
    native = read_story(OPENAI)
    story = read_story(OPENAI, "openai")
    assert story.source_format == "openai"
    assert story.messages == native.messages and story.system == native.system


def test_openai_jsonl_holds_messages_only(tmp_path: Path) -> None:
    text = OPENAI.read_text(encoding="utf-8") + '{"type": "card", "name": "Alder"}\n'
    path = write(tmp_path / "mixed.jsonl", text)
    assert read_story(path).message(5).card is not None  # native takes the card
    error = raises_story_error(path, line=6, source_format="openai")
    assert "messages only" in error.message


def test_openai_json_array(tmp_path: Path) -> None:
    path = openai_array(tmp_path)
    story = read_story(path)
    native = read_story(OPENAI)
    assert story.source_format == "openai"
    assert story.system == native.system
    assert [(m.role, m.name, m.content) for m in story.messages] == [
        (m.role, m.name, m.content) for m in native.messages
    ]
    # Each message remembers the line its object starts on.
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[story.message(1).line - 1].strip() == "{"
    assert '"name": "Ines",' in [line.strip() for line in lines[story.message(1).line : story.message(1).line + 3]]


def test_openai_array_error_names_the_element_line(tmp_path: Path) -> None:
    text = '[\n  {"role": "user", "content": "Hi"},\n  {"role": "narrator",\n   "content": "x"}\n]\n'
    error = raises_story_error(write(tmp_path / "bad.json", text), line=3)
    assert "narrator" in error.message


def test_openai_array_missing_comma(tmp_path: Path) -> None:
    text = '[\n  {"role": "user", "content": "Hi"}\n  {"role": "assistant", "content": "Hello"}\n]\n'
    raises_story_error(write(tmp_path / "bad.json", text), line=3)


# -- SillyTavern chats ---------------------------------------------------------------------


def test_sillytavern_chat() -> None:
    story = read_story(CHAT)
    assert story.source_format == "sillytavern"
    assert story.hidden == 1
    assert len(story) == 6
    assert (story.info.user, story.info.char) == ("Wren", "Seraphina")
    assert [m.role for m in story.messages] == ["assistant", "user", "assistant", "user", "assistant", "user"]
    assert [m.name for m in story.messages[:2]] == ["Seraphina", "Wren"]
    assert all("hidden from the AI" not in m.content for m in story.messages)


def test_sillytavern_selected_swipe_is_the_text() -> None:
    rows = [json.loads(line) for line in CHAT.read_text(encoding="utf-8").splitlines()]
    third = rows[3]
    assert third["swipe_id"] == 1
    story = read_story(CHAT)
    assert story.message(3).content == third["swipes"][1]
    assert story.message(3).line == 4


def test_sillytavern_headerless_group_chat_reads() -> None:
    story = read_story(ST_VARIANTS / "group-headerless.jsonl")
    assert story.source_format == "sillytavern" and len(story) == 4
    assert (story.info.user, story.info.char) == ("", "")
    assert [m.name for m in story.messages] == ["Wren", "Alder", "Mira", "Alder"]


def test_sillytavern_metadata_only_header() -> None:
    story = read_story(ST_VARIANTS / "group-metadata-header.jsonl")
    assert len(story) == 2 and story.info.scenario == "A storm over the lighthouse."


def test_sillytavern_115_chat() -> None:
    story = read_story(ST_VARIANTS / "st115-unused.jsonl")
    assert (story.info.user, story.info.char) == ("", "")  # "unused" is no name
    assert story.hidden == 2  # the is_system row and the tool-invocation row
    narrator = story.message(4)
    assert (narrator.role, narrator.name, narrator.content) == ("system", None, "The wind rises over the glade.")
    # swipe_id 2 of 2 swipes: a swipe still generating, so SillyTavern sends `mes`
    assert story.messages[-1].content == '*She steadies you.* "Slowly."'
    text = "\n".join(m.content for m in story.messages)
    for never in ("REASONING", "DISPLAY-TEXT", "TOOL-RESULT", "HIDDEN", "Tool calls"):
        assert never not in text


def test_sillytavern_is_user_as_text_is_an_error(tmp_path: Path) -> None:
    rows = CHAT.read_text(encoding="utf-8").splitlines()
    row = json.loads(rows[2])
    row["is_user"] = "true"
    rows[2] = json.dumps(row)
    error = raises_story_error(write(tmp_path / "chat.jsonl", "\n".join(rows) + "\n"), line=3)
    assert '"is_user" must be true or false' in error.message


# -- SillyTavern's Summarize memory (`extra.memory`) -----------------------------------------

MEMORY_CHAT = FIXTURES / "sillytavern" / "summarize-memory-chat.jsonl"


def st_chat(tmp_path: Path, rows: list[dict], header: bool = True) -> Path:
    """A SillyTavern chat of `rows` (each a partial row: name/mes, with `is_user`, `is_system`,
    `extra` as given), saved as `saveChat` writes it."""
    lines = [{"user_name": "Wren", "character_name": "Seraphina", "create_date": "2026-11-09@21h12m40s",
              "chat_metadata": {}}] if header else []  # fmt: skip
    for number, row in enumerate(rows, 1):
        name = "Wren" if row.get("is_user") else "Seraphina"
        lines.append({"name": name, "is_user": False, "is_system": False, "send_date": "", "mes": f"m{number}",
                      "extra": {}} | row)  # fmt: skip
    return write(tmp_path / "chat.jsonl", "".join(json.dumps(line) + "\n" for line in lines))


def test_sillytavern_memory_is_scene_1_through_the_message_that_holds_it() -> None:
    """The newest memory (row 33, line 34, after 32 messages the AI sees: one row is hidden)
    is scene 1, messages 1–32, its summary and its history; the stale one on row 19 is not read."""
    rows = [json.loads(line) for line in MEMORY_CHAT.read_text(encoding="utf-8").splitlines()]
    memories = [(n, r["extra"]["memory"]) for n, r in enumerate(rows, 1) if "memory" in r.get("extra", {})]
    assert [n for n, _ in memories] == [20, 34]
    story = read_story(MEMORY_CHAT)
    assert (story.source_format, len(story), story.hidden) == ("sillytavern", 48, 1)
    (scene,) = story.scenes
    newest = memories[-1][1]
    assert (scene.ref, scene.start, scene.end, scene.line) == (1, 1, 32, 34)
    assert scene.summary == scene.history == newest
    assert scene.source == "sillytavern memory"
    assert story.message(32).line == 34  # the row that holds it


def test_sillytavern_memory_of_the_last_row_is_not_read(tmp_path: Path) -> None:
    """`getLatestMemoryFromChat` skips the chat's last row (a reply that may be regenerated):
    the memory before it is the one SillyTavern sends."""
    rows = [{}, {"extra": {"memory": "older"}}, {}, {"extra": {"memory": "on the last row"}}]
    (scene,) = read_story(st_chat(tmp_path, rows)).scenes
    assert (scene.end, scene.summary) == (2, "older")
    assert read_story(st_chat(tmp_path, [{}, {"extra": {"memory": "only on the last row"}}])).scenes == ()


def test_sillytavern_memory_takes_javascripts_truthy_values(tmp_path: Path) -> None:
    """A falsy memory ("", null, false, 0) is no memory: the older one is used, as the
    extension's `if (mes.extra.memory)` does; a blank one is the newest, and says nothing."""
    for falsy in ("", None, False, 0):
        rows = [{"extra": {"memory": "kept"}}, {"extra": {"memory": falsy}}, {}]
        (scene,) = read_story(st_chat(tmp_path, rows)).scenes
        assert (scene.end, scene.summary) == (1, "kept")
    rows = [{"extra": {"memory": "kept"}}, {"extra": {"memory": "  \n"}}, {}]
    assert read_story(st_chat(tmp_path, rows)).scenes == ()


def test_sillytavern_memory_on_a_hidden_row_ends_at_the_message_before_it(tmp_path: Path) -> None:
    rows = [{}, {"is_user": True}, {"is_system": True, "extra": {"memory": "so far"}}, {}]
    story = read_story(st_chat(tmp_path, rows))
    (scene,) = story.scenes
    assert (len(story), scene.start, scene.end, scene.line) == (3, 1, 2, 4)
    rows = [{"is_system": True, "extra": {"memory": "before any message"}}, {}, {}]
    assert read_story(st_chat(tmp_path, rows)).scenes == ()


def test_sillytavern_memory_is_the_rows_not_a_swipes(tmp_path: Path) -> None:
    """A row's `extra` is its selected swipe's; `swipe_info` is never searched."""
    swiped = {"swipes": ["a", "b"], "swipe_id": 1, "swipe_info": [{"extra": {"memory": "x"}}, {"extra": {}}]}
    assert read_story(st_chat(tmp_path, [{}, swiped, {}])).scenes == ()


def test_sillytavern_memory_must_be_text(tmp_path: Path) -> None:
    path = st_chat(tmp_path, [{"extra": {"memory": {"summary": "x"}}}, {}])
    error = raises_story_error(path, line=2)
    assert '"extra.memory"' in error.message and "must be text" in error.message
    # A stale memory that is not text is never read, so it is no error.
    rows = [{"extra": {"memory": 7}}, {"extra": {"memory": "newest"}}, {}]
    assert read_story(st_chat(tmp_path, rows)).scenes[0].summary == "newest"


def test_headerless_sillytavern_group_chat_memory(tmp_path: Path) -> None:
    rows = [{"is_user": True}, {"extra": {"memory": "the group so far"}}, {}]
    (scene,) = read_story(st_chat(tmp_path, rows, header=False)).scenes
    assert (scene.end, scene.line) == (2, 2)


def test_scene_sources_of_the_other_readers() -> None:
    """Scene lines of a native file and an otaku export's scenes are the story's own."""
    assert {s.source for s in read_story(RIVER).scenes} == {"story"}
    assert {s.source for s in read_story(FIXTURES.parent.parent / "examples" / "lighthouse-case4.jsonl").scenes} == {
        "story"
    }


# -- otaku exports -------------------------------------------------------------------------


def test_otaku_export_river() -> None:
    story = read_story(RIVER)
    assert story.source_format == "otaku"
    assert len(story) == 16
    assert story.info.title == "The River That Forgot Its Name"
    assert story.system.startswith("You are the narrator of a quiet fantasy mystery.")
    assert story.system.endswith("end each one on something Maren can act on.")
    assert story.info.story_so_far.startswith("The traveling cartographer Maren came down")
    assert [c.name for c in story.info.cast] == ["Maren", "Tallis"]
    assert story.info.cast[1].description.startswith("ferryman of the vanished river")
    assert story.info.cast[1].aliases == ("the ferryman",)
    assert story.info.user == "Maren"


def test_otaku_export_scenes() -> None:
    first, second = read_story(RIVER).scenes
    assert (first.id, first.start, first.end, first.title) == (1, 1, 6, "The Dry Bed")
    assert (second.id, second.start, second.end, second.title) == (2, 7, 10, "The Map That Moved")
    for scene in (first, second):
        assert scene.summary and scene.history
        # Character sections (#### Maren ...) are character state, not the scene's texts.
        for text in (scene.summary, scene.history):
            assert "**State:**" not in text and "**Entry:**" not in text and "####" not in text
        assert "**History:**" not in scene.summary
    assert first.summary.startswith("Maren, a traveling cartographer, follows the post road")
    assert second.summary.endswith("sets out alone along the towpath for Harrow Lock.")
    assert second.history == read_story(RIVER).info.story_so_far


def test_otaku_export_messages() -> None:
    story = read_story(RIVER)
    assert [m.number for m in story.messages] == list(range(1, 17))
    assert (story.message(1).role, story.message(1).name) == ("user", "Maren")
    assert (story.message(2).role, story.message(2).name) == ("assistant", None)
    assert story.message(1).content == (
        "I follow the post road down into the Meade valley, checking the hills against my survey as I go."
    )
    assert story.message(3).content == (
        "((OOC: The user writes as Maren.))\nI kneel at the bank and press my palm to the riverbed."
    )
    assert story.message(2).content.endswith("its guide-rope still strung taut across the empty air.")
    assert "\n\nThe river is not there.\n\n" in story.message(2).content
    # The closing otk-question block is what the user saw: it stays in the text.
    last = story.message(16).content
    assert "```otk-question\nDo you follow the water into the culvert?" in last
    assert last.endswith("3. I climb out and go back for Tallis\n```")


def test_otaku_unknown_format_version(tmp_path: Path) -> None:
    text = RIVER.read_text(encoding="utf-8").replace("format-version: 3", "format-version: 4")
    error = raises_story_error(write(tmp_path / "river.md", text), line=5)
    assert "format-version 4" in error.message and "format-version 3" in error.message


def test_otaku_messages_out_of_order(tmp_path: Path) -> None:
    text = RIVER.read_text(encoding="utf-8").replace("### 4 · assistant", "### 5 · assistant")
    path = write(tmp_path / "river.md", text)
    line = text.splitlines().index("### 5 · assistant") + 1
    error = raises_story_error(path, line=line)
    assert "message 5 where message 4 was expected" in error.message


SMALL_EXPORT = """\
# Small

<!-- otaku export
format-version: 3
-->

## Scenes

### 1 · Arrival
- **Messages:** 1-{end}

They arrive.

## Messages

### 1 · user · Ines
I knock.

### 2 · user (card) · Alder
The lighthouse keeper, gone missing.

### 3 · assistant · Alder · "{{body}}\\n(The lamp turns.)"
Come in.

```
\\### 4 · user · not a heading
```
"""


def test_otaku_card_messages_and_fences(tmp_path: Path) -> None:
    story = read_story(write(tmp_path / "small.md", SMALL_EXPORT.format(end=3)))
    assert len(story) == 3
    card = story.message(2)
    assert card.card is not None and card.name == "Alder"
    assert card.card.description == "The lighthouse keeper, gone missing."
    assert story.message(3).name == "Alder"
    assert story.message(3).content == ("Come in.\n\n```\n### 4 · user · not a heading\n```\n(The lamp turns.)")
    assert story.scenes[0].summary == "They arrive." and story.scenes[0].history == ""
    assert story.system == "" and story.info.cast == ()


def test_otaku_unclosed_fence_is_an_error_at_the_fence(tmp_path: Path) -> None:
    text = SMALL_EXPORT.format(end=3).replace("\\### 4", "### 4")
    path = write(tmp_path / "small.md", text)
    fence = text.splitlines().index("```") + 1
    error = raises_story_error(path, line=fence)
    assert "fence is still open" in error.message


def test_otaku_scene_from_message_zero(tmp_path: Path) -> None:
    text = SMALL_EXPORT.format(end=3).replace("1-3", "0-1")
    error = raises_story_error(write(tmp_path / "small.md", text), line=10)
    assert "numbered from 1" in error.message


def test_otaku_tour_cards_aliases_and_lore() -> None:
    story = read_story(TOUR)
    assert len(story) == 318 and len(story.scenes) == 15
    vane = story.message(1)
    assert vane.card is not None and vane.card.name == "Odalric Vane"
    assert vane.card.personality.startswith("Grand, warm, evasive about money")
    assert vane.card.example_dialogue.startswith("{{user}}: The ledger says")
    assert story.message(5).name == "Bell Harrow" and story.info.user == "Bell Harrow"
    harrow = next(c for c in story.info.cast if c.name == "Bell Harrow")
    assert harrow.aliases == ("Harrow", "Madam Stage Manager", "Bell")
    assert "Odalric Vane" not in {c.name for c in story.info.cast}  # it joined as a card message
    first = [entry for entry in story.lore if entry.scene == 1]
    assert first[0].name == "Bell Harrow" and first[0].history.startswith("Came in out of the rain")
    assert all("**Entry:**" not in entry.history for entry in story.lore)


def test_otaku_card_profile_not_toml(tmp_path: Path) -> None:
    text = TOUR.read_text(encoding="utf-8").replace("file_name = 'vane.json'", "file_name = vane.json", 1)
    path = write(tmp_path / "tour.md", text)
    line = text.splitlines().index("file_name = vane.json") + 1
    error = raises_story_error(path, line=line)
    assert "not valid TOML" in error.message and "Odalric Vane" in error.message


def test_otaku_card_not_in_the_cast(tmp_path: Path) -> None:
    text = TOUR.read_text(encoding="utf-8")
    text = text.replace(
        "### 1 · user (card) · Odalric Vane\n/card vane.json", "### 1 · user (card) · Ghost\n/card ghost.json"
    )
    path = write(tmp_path / "tour.md", text)
    error = raises_story_error(path, line=text.splitlines().index("/card ghost.json") + 1)
    assert "/card ghost.json names no card profile in the Cast" in error.message


def test_otaku_truncated_export(tmp_path: Path) -> None:
    text = RIVER.read_text(encoding="utf-8")
    error = raises_story_error(write(tmp_path / "river.md", text[: text.index("## Messages") + 5]))
    assert "Messages" in error.message


def test_otaku_scene_beyond_the_messages(tmp_path: Path) -> None:
    path = write(tmp_path / "small.md", SMALL_EXPORT.format(end=9))
    error = raises_story_error(path, line=9)
    assert "runs to message 9" in error.message


def test_openai_empty_array(tmp_path: Path) -> None:
    error = raises_story_error(write(tmp_path / "empty.json", "[\n]\n"), line=2)
    assert "empty" in error.message


def test_a_legacy_tavernai_chat_reads_as_the_sillytavern_chat_it_is() -> None:
    """SillyTavern forked TavernAI and imports its chats unchanged; ctx reads them the same way."""
    path = FIXTURES / "neighbours" / "tavernai-legacy.jsonl"
    assert detect_format(path) == "sillytavern"
    story = read_story(path)
    assert [(m.role, m.name) for m in story.messages] == [("assistant", "Aqua"), ("user", "You"), ("assistant", "Aqua")]
    assert story.messages[2].content == "Of course! I blessed it myself."


def test_a_native_story_with_a_byte_order_mark_reads_from_its_first_line(tmp_path: Path) -> None:
    from otaku_ctx.story.detect import check_story

    path = tmp_path / "bom.jsonl"
    lines = ['{"role": "user", "content": "hi"}', "", '{"role": "assistant", "content": "hello"}']
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8") + b"\n")
    story = read_story(path)
    assert [m.content for m in story.messages] == ["hi", "hello"]
    assert check_story(path) == ("native", [])


def test_the_oldest_tavernai_chat_an_array_of_strings_reads() -> None:
    """SillyTavern's own `characters/Aqua/chats/1673181146000.json` (before its JSONL rows):
    a JSON array of "Name: text" strings; the first speaker is the character."""
    path = Path(__file__).parent / "fixtures" / "neighbours" / "tavernai-array-aqua.json"
    assert detect_format(path) == "tavernai"
    story = read_story(path)
    (only,) = story.messages
    assert (only.role, only.name) == ("assistant", "Aqua")
    assert only.content.startswith('*I am in the town square at a city named "Axel".') and only.content.endswith(
        "eyes*"
    )


def test_a_tavernai_array_tells_its_speakers_apart(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(["Aqua: Hello!\n", "You: Hi. Who are you?\n", "a second line\n", "Aqua: A goddess."]))
    story = read_story(path)
    assert [(m.role, m.name, m.content) for m in story.messages] == [
        ("assistant", "Aqua", "Hello!"),
        ("user", "You", "Hi. Who are you?\na second line"),
        ("assistant", "Aqua", "A goddess."),
    ]
    path.write_text(json.dumps(["no speaker here"]))
    with pytest.raises(StoryError, match='does not start with "Name: "'):
        read_story(path)


# -- encodings ----------------------------------------------------------------------------------


def test_a_config_with_a_utf8_byte_order_mark_reads_as_every_json_file_does(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"\xef\xbb\xbf[model]\nwindow = 8192\n")
    status, out, _ = ctx("config", "show", "--config", config)
    assert status == 0 and f"model.window\t8192\t{config}" in out


def test_a_utf16_story_says_so(tmp_path: Path) -> None:
    story = tmp_path / "story.jsonl"
    story.write_bytes(CASE3.read_bytes().decode("utf-8").encode("utf-16"))
    for argv in (["build", story], ["validate", story], ["build", "-"]):
        status, _, err = ctx(*argv, stdin=io.BytesIO(story.read_bytes()))
        assert status == ExitStatus.ERROR and err.count("\n") == 1 and "is UTF-16 text; save it as UTF-8" in err
