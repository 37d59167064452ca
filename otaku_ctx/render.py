"""From an assembly to role blocks, and what each part costs once rendered.

The built-in renderer gives otaku's shape: system, head, recap (floated cards, the story so
far, each scene's cards and summary), tail — each message with its speaker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .assembler import Assembly, Part
from .blocks import Block
from .model import Card, Message, Scene, Story
from .tokens import TokenCounter

MACRO = re.compile(r"\{\{(char|user)\}\}", re.IGNORECASE)
SEPARATOR = "\n\n"
# A chat message costs its content plus the role and the message's own framing; OpenAI's
# published rule for cl100k chat models is 3 tokens a message + the role, and 3 to prime
# the reply. We count exactly that for `--emit messages`.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3


@dataclass(frozen=True)
class Names:
    """Who `{{char}}` and `{{user}}` are, and how unnamed speakers are called."""

    char: str = ""
    user: str = ""

    @classmethod
    def of(cls, story: Story, user: str | None = None) -> Names:
        char = story.info.char or next((m.card.name for m in story.messages if m.card), "")
        return cls(char=char, user=user or story.info.user)

    def fill(self, text: str) -> str:
        """Replace `{{char}}`/`{{user}}` in story data by the names, SillyTavern-style. This is
        substitution in data, never template compilation; a macro whose name is unknown stays."""

        def swap(match: re.Match[str]) -> str:
            name = self.char if match.group(1).lower() == "char" else self.user
            return name or match.group(0)

        return MACRO.sub(swap, text) if "{{" in text else text

    def speaker(self, message: Message) -> str:
        if message.name:
            return message.name
        if message.role == "assistant":
            return self.char or "Assistant"
        if message.role == "user":
            return self.user or "User"
        return "System"


def card_text(card: Card, names: Names) -> str:
    """How a card reads in the prompt: who joins, then what the card says of them."""
    lines = [f"{card.name} joins the story."]
    if card.description:
        lines.append(card.description)
    if card.personality:
        lines.append(f"{card.name}'s personality: {card.personality}")
    if card.scenario:
        lines.append(f"Scenario: {card.scenario}")
    if card.example_dialogue:
        lines.append(f"Example dialogue:\n{card.example_dialogue}")
    local = Names(char=card.name, user=names.user)
    return local.fill("\n".join(lines))


def scene_label(scene: Scene) -> str:
    return f"Scene {scene.ref}" + (f" · {scene.title}" if scene.title else "")


class PlainRenderer:
    """The built-in rendering: each part becomes one block."""

    def __init__(self, story: Story, names: Names) -> None:
        self.story = story
        self.names = names

    def frame(self) -> list[Block]:
        """Blocks every prompt has: the system message, when the story has one."""
        system = self.names.fill(self.story.system)
        return [Block("system", system)] if system.strip() else []

    def part(self, part: Part) -> list[Block]:
        if part.kind == "card" and part.message and part.message.card:
            return [Block("system", card_text(part.message.card, self.names))]
        if part.kind == "message" and part.message:
            m = part.message
            return [Block(m.role, f"{self.names.speaker(m)}: {self.names.fill(m.content)}")]
        if part.kind == "summary" and part.scene:
            return [Block("system", f"[{scene_label(part.scene)}]\n{self.names.fill(part.scene.summary)}")]
        if part.kind == "history" and part.scene:
            return [
                Block(
                    "system", f"[Story so far, through scene {part.scene.ref}]\n{self.names.fill(part.scene.history)}"
                )
            ]
        raise ValueError(f"cannot render {part!r}")

    def blocks(self, assembly: Assembly) -> list[Block]:
        out = self.frame()
        for part in assembly.parts:
            out += self.part(part)
        return out


EMITS = ("text", "messages")


def emit_text(blocks: Sequence[Block]) -> str:
    return SEPARATOR.join(b.text for b in blocks)


def emit_messages(blocks: Sequence[Block]) -> list[dict[str, str]]:
    return [{"role": b.role, "content": b.text} for b in blocks]


def emitted(blocks: Sequence[Block], emit: str) -> str:
    """The prompt exactly as emitted (and counted). JSON ends with a newline; text does not,
    since a text-completion prompt must end where the model is to continue."""
    if emit == "messages":
        return json.dumps(emit_messages(blocks), ensure_ascii=False, indent=2) + "\n"
    return emit_text(blocks)


class BlockPricer:
    """Prices parts as the renderer renders them and the emit form counts them."""

    def __init__(self, renderer: PlainRenderer, counter: TokenCounter, emit: str) -> None:
        self.renderer = renderer
        self.count = counter
        self.emit = emit
        self._fixed: int | None = None

    def _blocks(self, blocks: Sequence[Block]) -> int:
        if self.emit == "messages":
            return sum(self.count(b.text) + MESSAGE_OVERHEAD for b in blocks)
        # Each block is priced with the separator after it: a separator ends in a newline and
        # tiktoken never joins a newline to the word after it, so these pieces add up to the
        # whole prompt's count (plus at most the last separator's token).
        bound = self.count.bound
        return sum(bound(b.text + SEPARATOR) for b in blocks)

    def fixed(self) -> int:
        if self._fixed is None:
            frame = self.renderer.frame()
            self._fixed = self._blocks(frame) + (REPLY_PRIMING if self.emit == "messages" else 0)
        return self._fixed

    def part(self, part: Part) -> int:
        return self._blocks(self.renderer.part(part))

    def exact(self, assembly: Assembly) -> int:
        return self.tokens(self.renderer.blocks(assembly))

    def tokens(self, blocks: Sequence[Block]) -> int:
        """The count of the emitted prompt: the flat text, or the chat messages by OpenAI's rule."""
        if self.emit == "messages":
            return self._blocks(blocks) + REPLY_PRIMING
        return self.count(emit_text(blocks))
