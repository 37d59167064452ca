"""The summarizer's prompts: shipped as files (`configs/prompts/summary.md`, `history.md`),
replaceable by the user's own (`[summarize] summary_prompt`, `history_prompt`).

A prompt file is the user message with `{placeholders}`; a line holding only `---` may
separate a system message before it. Only the placeholders below are filled, in one pass
(so a JSON example's braces stay as they are, and a scene whose text holds `{title}` is sent
as it is: story text is data); a file missing a required one is an error naming the file and
the placeholder."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..files import read_input, utf8_text
from ..locations import shipped

# each prompt's placeholders: the required ones, then the optional ones
PLACEHOLDERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "summary": (("scene", "summary_words"), ("title",)),
    "history": (("history", "summary", "history_words"), ("title",)),
}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its system message (may be empty) and its user message, unfilled."""

    kind: str
    system: str
    user: str
    source: str

    def messages(self, values: Mapping[str, str]) -> list[dict[str, str]]:
        names = (*PLACEHOLDERS[self.kind][0], *PLACEHOLDERS[self.kind][1])
        pattern = re.compile("|".join(re.escape("{" + name + "}") for name in names))
        text = pattern.sub(lambda m: values.get(m[0][1:-1], ""), self.user)
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": text}]


def load_prompt(kind: str, given: str = "") -> Prompt:
    """The `kind` prompt ("summary" or "history"): the file the user named, else the shipped one."""
    path = Path(given).expanduser() if given else shipped("prompts") / f"{kind}.md"
    text = utf8_text(read_input(path, "prompt file"), path)
    system, user = "", text
    head, mark, rest = text.partition("\n---\n")
    if mark:
        system, user = head.strip(), rest
    user = user.strip() + "\n"
    for name in PLACEHOLDERS[kind][0]:
        if "{" + name + "}" not in user:
            key = f"summarize.{kind}_prompt"
            raise ConfigError(str(path), key, f"the {kind} prompt has no {{{name}}}; put it where it belongs")
    return Prompt(kind, system, user, str(path))
