"""Who speaks a message, by name, where ctx writes a story's lines itself (a scene as the
summarizer is shown it, an extract, a provisional story-so-far).

In order: the message's `name`; else a speaker's name the frontend wrote at the start of its
text (`LABEL`: Agnai's "Mira: …", SillyTavern's names in the content, a group's members), taken
off the text so it is not written twice; else the name the story's frame gives the role
(`Speakers.of`: SillyTavern's main prompt, "… a fictional chat between Seraphina and User.");
else "Character", "User" or "Narration", the last resort.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .model import Message, Role, Story

#: a speaker's name written at the start of a message ("Mira: …"): up to four words, a letter
#: first, no digit ("Turn 3: …" is the text's own), ending in a colon within the text's first
#: `LABEL_REACH` characters
LABEL = re.compile(r"[^\W\d_][^\s:\d]*(?: [^\s:\d]+){0,3}:(?: |$)")
LABEL_REACH = 42
#: the last resort, a role's own word
ROLE_WORDS: dict[Role, str] = {"user": "User", "assistant": "Character", "system": "Narration"}
#: the names a frame gives: SillyTavern's default main prompt ("Write {{char}}'s next reply in a
#: fictional chat between {{charIfNotGroup}} and {{user}}.")
BETWEEN = re.compile(r"\bchat between (?P<assistant>[^\n.,:]{1,40}?) and (?P<user>[^\n.,:]{1,40}?)\.")


def label(text: str) -> tuple[str, str] | None:
    """The speaker's name written at the start of `text` and the text after it, if one is."""
    if text.find(":", 0, LABEL_REACH) < 0 or (found := LABEL.match(text)) is None:
        return None
    return found.group().rstrip().removesuffix(":"), text[found.end() :]


@dataclass(frozen=True)
class Speakers:
    """The names a story's frame gives its roles (`assistant`, `user`), for the messages that
    carry none of their own."""

    assistant: str = ""
    user: str = ""

    @staticmethod
    def of(story: Story) -> Speakers:
        return _framed(story.system)

    def said(self, message: Message) -> tuple[str, str]:
        """The message's speaker and its text without the speaker's name written first."""
        if message.name:
            text = message.content
            if text.startswith(message.name) and text.startswith(":", len(message.name)):
                text = text[len(message.name) + 1 :].removeprefix(" ")
            return message.name, text
        written = label(message.content)
        if written is not None:
            return written
        given = self.assistant if message.role == "assistant" else self.user if message.role == "user" else ""
        return given or ROLE_WORDS[message.role], message.content


#: no names but the messages' own: each role by its word
UNNAMED = Speakers()


@functools.lru_cache(maxsize=64)
def _framed(system: str) -> Speakers:
    found = BETWEEN.search(system)
    return Speakers(found["assistant"].strip(), found["user"].strip()) if found else Speakers()
