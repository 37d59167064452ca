"""From an assembly to the emitted prompt: the template turns the variables into role blocks,
the format wraps the blocks into one text prompt or chat messages, and the emit form decides
what is printed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..assemble import Assembly, Part
from ..hbs.blocks import Block
from ..tokens import TokenCounter
from .formats import Format, render_messages, text_pieces
from .specials import broken_up
from .templates import PromptTemplate
from .variables import OPEN_MARK, Variables

EMITS = ("text", "messages", "openai-chat", "openai-completion")


def sections(a: Assembly) -> tuple[list[Part], list[Part], list[Part]]:
    return [Part.verbatim(m) for m in a.head], [*a.recap, *a.recall], [Part.verbatim(m) for m in a.tail]


@dataclass
class PromptRenderer:
    """Template + format + emit form: blocks for an assembly, and the prompt as printed."""

    variables: Variables
    template: PromptTemplate  # bound to `format` (`for_format`)
    format: Format
    emit: str = "text"
    reserve: int = 0
    bound: int | None = None  # characters a render may produce (hbs.bound_for_window), None = no bound
    model: str = ""  # the request body's "model"; "" = left out
    max_stops: int = 0  # at most this many stop strings in a request body; 0 = all
    # For a model's counter (`for_model`): its control tokens, broken up in a text prompt's
    # blocks; the BOS text its server adds itself, so a text prompt does not spell it too;
    # and whether a chat is counted as the format's text (the server renders the messages
    # with the model's template) rather than by OpenAI's rule.
    specials: tuple[str, ...] = ()
    server_bos: str = ""
    chat_as_text: bool = False

    def for_model(self, count: TokenCounter) -> PromptRenderer:
        """This renderer for the model `count` (a model's `TokenCounter`) counts for."""
        server_bos = count.bos if count.added else ""  # `bos`: the BOS the server adds itself
        return replace(self, specials=tuple(count.specials), server_bos=server_bos, chat_as_text=True)

    @property
    def text_form(self) -> bool:
        """The prompt is one text a server tokenizes whole (not chat messages)."""
        return self.emit in ("text", "openai-completion")

    def render(
        self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part], *, anchored: bool = True
    ) -> list[Block]:
        """Role blocks; the last is open when it holds the open turn (see `Variables.open_turn`).
        `anchored=False`: without what stands at a depth from the end (`Variables.for_assembly`)."""
        variables = self.variables.for_assembly(head, recap, tail, anchored=anchored)
        blocks = self.template.render(variables, self.bound)
        out = [replace(b, text=b.text.replace(OPEN_MARK, "")) if OPEN_MARK in b.text else b for b in blocks]
        if self.specials and self.text_form:
            out = [
                replace(b, text=broken_up(b.text, self.specials), name=broken_up(b.name, self.specials)) for b in out
            ]
        if out and OPEN_MARK in blocks[-1].text and out[-1].role == "assistant":
            out[-1] = replace(out[-1], open=True)
        return out

    def blocks(self, assembly: Assembly) -> list[Block]:
        return self.render(*sections(assembly))

    def messages(self, blocks: Sequence[Block]) -> list[dict[str, str]]:
        """Chat messages; the open turn is the API's own reply, so it is not sent."""
        return render_messages(self.format, [b for b in blocks if not b.open])

    def stop(self) -> list[str]:
        """The stop strings, most important first: the format's end of turn, the user's name
        (the model must not speak for them), the format's other stops, then the other
        speakers. Never the name of the one speaking, whose reply it is; names as they are,
        trailing spaces kept (SillyTavern's rules)."""
        story, names = self.variables.story, self.variables.names
        speaking = self.variables.open_turn["name"]
        people = [p for p in dict.fromkeys([names.user, names.char, *names.speakers(story)]) if p and p != speaking]
        return self.template.stop(self.format, people, names.fill)

    def body(self, key: str, value: Any) -> dict[str, Any]:
        """An OpenAI-style request body: `model` when one is set, `max_tokens` only when a
        reply reserve is (0 leaves the server's default), at most `max_stops` stop strings."""
        stop = self.stop()
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        body[key] = value
        if self.reserve > 0:
            body["max_tokens"] = self.reserve
        if stop:
            body["stop"] = stop[: self.max_stops] if self.max_stops > 0 else stop
        return body

    def text(self, blocks: Sequence[Block]) -> str:
        return "".join(self.pieces(blocks))

    def pieces(self, blocks: Sequence[Block]) -> list[str]:
        """The text prompt in pieces (`text_pieces`), less the BOS the server adds itself. For
        chat messages counted as text, the text the server makes of the messages sent (the
        open turn is the reply it asks for, so not sent: `messages`), as llama.cpp's server
        reads them: a chat that ends on an assistant message is that message to continue
        (its prefill), not a new turn (docs/model.md)."""
        if not self.text_form:
            blocks = [b for b in blocks if not b.open]
            if blocks and blocks[-1].role == "assistant":
                blocks[-1] = replace(blocks[-1], open=True)
        pieces = text_pieces(self.format, blocks)
        if self.server_bos:
            for i, piece in enumerate(pieces):
                if piece:
                    pieces[i] = piece.removeprefix(self.server_bos)
                    break
        return pieces

    def emitted(self, blocks: Sequence[Block]) -> str:
        """The prompt exactly as printed. JSON ends with a newline; text does not, since a
        completion prompt must end where the model is to continue."""
        if self.emit == "text":
            return self.text(blocks)
        if self.emit == "messages":
            body: Any = self.messages(blocks)
        elif self.emit == "openai-chat":
            body = self.body("messages", self.messages(blocks))
        elif self.emit == "openai-completion":
            body = self.body("prompt", self.text(blocks))
        else:
            raise ValueError(f"unknown emit form {self.emit!r}; expected one of {', '.join(EMITS)}")
        return json.dumps(body, ensure_ascii=False, indent=2) + "\n"

    @property
    def chat_counted(self) -> bool:
        """The prompt is counted as chat messages by OpenAI's rule (no model is known)."""
        return self.emit in ("messages", "openai-chat") and not self.chat_as_text
