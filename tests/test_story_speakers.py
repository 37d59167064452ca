"""Who speaks a message, by name, where ctx writes a story's lines itself (`story.speakers`):
the message's name, else a name the frontend wrote into its text (not written twice), else the
name the frame gives its role, else the role's word."""

from __future__ import annotations

from pathlib import Path

from otaku_ctx.story.model import Message, Story
from otaku_ctx.story.speakers import Speakers, label
from otaku_ctx.summarize.extract import summary_extract

ST_MAIN = "Write Seraphina's next reply in a fictional chat between Seraphina and Tom."


def story(system: str, *messages: Message) -> Story:
    return Story(path=Path("chat"), messages=messages, system=system, source_format="openai")


def test_a_name_written_into_the_text_is_taken_off_it() -> None:
    assert label("Mira: Hello.") == ("Mira", "Hello.")
    assert label("Mira:") == ("Mira", "")
    assert label("Dr. Jane Smith: ok") == ("Dr. Jane Smith", "ok")
    assert [label(t) for t in ("Turn 3: a", "one two three four five: a", "http://a", "Note:a", "Hi")] == [None] * 5


def test_each_message_speaks_by_the_first_name_it_has() -> None:
    framed = Speakers.of(story(f"{ST_MAIN}\n\nSeraphina is a guardian."))
    assert framed == Speakers("Seraphina", "Tom")
    cases = [
        (Message(1, "assistant", "Ash: Ash: the fire.", "Ash"), ("Ash", "Ash: the fire.")),  # its name, once off
        (Message(2, "assistant", "Mira: I knew.", None), ("Mira", "I knew.")),  # written into the text
        (Message(3, "assistant", "I knew.", None), ("Seraphina", "I knew.")),  # the frame's
        (Message(4, "user", "Hi.", None), ("Tom", "Hi.")),
        (Message(5, "system", "Night falls.", None), ("Narration", "Night falls.")),
    ]
    assert [framed.said(m) for m in (m for m, _ in cases)] == [said for _, said in cases]
    assert Speakers.of(story("Be brief.")).said(Message(1, "user", "Hi.", None)) == ("User", "Hi.")


def test_an_extract_names_its_speakers_as_the_story_does() -> None:
    told = story(
        ST_MAIN,
        Message(1, "assistant", "Mira: The bridge at Karsk fell on the ninth of May.", None),
        Message(2, "user", "Who cut the ropes at Karsk?", None),
    )
    extract = summary_extract(told.messages, 60, Speakers.of(told))
    assert extract.splitlines() == [
        "Mira: The bridge at Karsk fell on the ninth of May.",
        "Tom: Who cut the ropes at Karsk?",
    ]
