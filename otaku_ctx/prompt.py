"""From an assembly to the emitted prompt: template variables, role blocks, the format, and
what each part costs once it is rendered that way.

The template turns the variables into role blocks; the format wraps the blocks into one
text prompt or chat messages; the emit form decides what is printed. The assembler prices
each part by what it adds to the rendered blocks (`TemplatePricer`), so the fit test
counts the template's preamble, wrappers and per-message overhead, and the final count is
taken on what is actually emitted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from .assembler import Assembly, Part
from .blocks import Block
from .config import DEFAULT_CARD_TEMPLATE
from .errors import ConfigError
from .formats import Format, builtin_dirs, load_format, render_messages, render_text, stop_sequences, wrap_block
from .hbs import Template, compile_template
from .model import Card, Message, Story
from .tokens import TokenCounter

MACRO = re.compile(r"\{\{(char|user)\}\}", re.IGNORECASE)
EMITS = ("text", "messages", "openai-chat", "openai-completion")
# A chat message costs its content plus the role and the message's own framing; OpenAI's
# published rule for cl100k chat models is 3 tokens a message + the role, and 3 to prime
# the reply. That is what `--emit messages` and `--emit openai-chat` are counted by.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3

# ── Names and macros ─────────────────────────────────────────────────────────────────────


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
        if "{{" not in text:
            return text

        def swap(match: re.Match[str]) -> str:
            name = self.char if match.group(1).lower() == "char" else self.user
            return name or match.group(0)

        return MACRO.sub(swap, text)

    def speaker(self, message: Message) -> str:
        if message.name:
            return message.name
        if message.role == "assistant":
            return self.char or "Assistant"
        if message.role == "user":
            return self.user or "User"
        return "System"


# ── Finding templates and formats ────────────────────────────────────────────────────────


@lru_cache(maxsize=64)
def compiled(source: str, name: str) -> Template:
    """Compile once per run (pymeta's parser is slow; a compiled template is immutable)."""
    return compile_template(source, name)


def search_dirs(kind: str, home: Path | None) -> list[Path]:
    """Where `--template NAME` / `--format NAME` are looked up: the user's
    `~/.otaku/configs/<kind>/` first, then the shipped `configs/<kind>/`."""
    dirs = [home / "configs" / kind] if home else []
    return dirs + [d.parent / kind for d in builtin_dirs()]


def load_template(name_or_path: str, home: Path | None) -> Template:
    """A template by name (`default`, `serene`, `sillytavern`, or one of the user's) or path."""
    path = Path(name_or_path).expanduser()
    if not (name_or_path.endswith(".hbs") or path.is_file()):
        found = [d / f"{name_or_path}.hbs" for d in search_dirs("templates", home)]
        path = next((p for p in found if p.is_file()), found[-1] if found else path)
        if not path.is_file():
            names = sorted({p.stem for d in search_dirs("templates", home) if d.is_dir() for p in d.glob("*.hbs")})
            raise ConfigError("--template", None, f"no template named {name_or_path!r}; known: {', '.join(names)}")
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), None, "no such template file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), None, f"cannot read the template: {exc}") from None
    return compiled(source, str(path))


def find_format(name_or_path: str, home: Path | None) -> Format:
    return load_format(name_or_path, search_dirs("formats", home))


# ── Template variables ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class PromptSettings:
    """The `[prompt]` settings that shape the variables."""

    post_history_depth: int = 0
    instructions: str = ""
    post_history_instructions: str = ""
    card_template: str = DEFAULT_CARD_TEMPLATE


def _card_json(card: Card, names: Names) -> dict[str, str]:
    fill = Names(card.name, names.user).fill
    data = {
        "name": card.name,
        "description": fill(card.description),
        "personality": fill(card.personality),
        "scenario": fill(card.scenario),
    }
    return {k: v for k, v in data.items() if v}


@dataclass
class Variables:
    """Builds the template variables for a story; the assembly-free part is computed once."""

    story: Story
    names: Names
    settings: PromptSettings = field(default_factory=PromptSettings)

    @cached_property
    def card_template(self) -> Template:
        return compiled(self.settings.card_template, "[prompt] card_template")

    @cached_property
    def main_card(self) -> Card | None:
        cards = [m.card for m in self.story.messages if m.card] + list(self.story.info.cast)
        return next((c for c in cards if c.name == self.names.char), cards[0] if cards else None)

    def card_text(self, card: Card) -> str:
        """How a card message reads: the `[prompt] card_template`, with macros filled in."""
        fill = Names(card.name, self.names.user).fill
        text = self.card_template.render_text(
            {
                "name": card.name,
                "description": fill(card.description),
                "personality": fill(card.personality),
                "scenario": fill(card.scenario),
                "exampleDialogue": fill(card.example_dialogue),
                "firstMessage": fill(card.first_message),
                "char": card.name,
                "user": self.names.user,
            }
        )
        return text.strip("\n")

    def entry(self, part: Part) -> dict[str, Any]:
        """One `chatMessages` entry: role, name, message, and what it is."""
        m, scene = part.message, part.scene
        if part.kind == "card" and m and m.card:
            return {"role": "system", "name": m.card.name, "message": self.card_text(m.card), "kind": "card",
                    "number": m.number, "scene": None, "title": ""}  # fmt: skip
        if part.kind == "message" and m:
            return {"role": m.role, "name": self.names.speaker(m), "message": self.names.fill(m.content),
                    "kind": "message", "number": m.number, "scene": None, "title": ""}  # fmt: skip
        if scene is not None:
            text = scene.summary if part.kind == "summary" else scene.history
            return {"role": "system", "name": "", "message": self.names.fill(text), "kind": part.kind,
                    "number": None, "scene": scene.ref, "title": scene.title}  # fmt: skip
        raise ValueError(f"cannot render {part!r}")

    @cached_property
    def fixed(self) -> dict[str, Any]:
        """The variables that do not depend on the assembly."""
        story, names, card = self.story, self.names, self.main_card
        cards = [m.card for m in story.messages if m.card] + list(story.info.cast)
        users = list(dict.fromkeys([names.user] if names.user else []))
        users += [m.name for m in story.messages if m.role == "user" and m.name and m.name not in users]
        persona = names.fill(story.info.persona)
        personas = [{"name": u, **({"description": persona} if persona and u == names.user else {})} for u in users]
        fill = Names(card.name, names.user).fill if card else names.fill
        scenario = names.fill(story.info.scenario) or (fill(card.scenario) if card else "")
        example = fill(card.example_dialogue) if card else ""
        system = names.fill(story.system) or (fill(card.system_prompt) if card else "")
        return {
            "system": system,
            "title": story.info.title,
            "char": names.char,
            "user": names.user,
            "characters": json.dumps([_card_json(c, names) for c in cards], ensure_ascii=False, indent=2)
            if cards
            else "",
            "personas": json.dumps(personas, ensure_ascii=False, indent=2) if users else "",
            "scenario": scenario,
            "instructions": names.fill(story.info.instructions) or names.fill(self.settings.instructions),
            "currentDate": story.info.current_date,
            "storySoFar": names.fill(story.info.story_so_far),
            # SillyTavern's story-string parameters (seed 003)
            "description": fill(card.description) if card else "",
            "personality": fill(card.personality) if card else "",
            "persona": persona,
            "mesExamples": example,
            "mesExamplesRaw": example,
            "wiBefore": "",
            "wiAfter": "",
            "loreBefore": "",
            "loreAfter": "",  # fmt: skip
            "anchorBefore": "",
            "anchorAfter": "",  # fmt: skip
            "worldLore": "",
            "narrativeGraph": "",
        }

    @cached_property
    def open_turn(self) -> dict[str, Any]:
        """The last `chatMessages` entry: the turn the model continues ("Name: ")."""
        story = self.story
        last = next((m.name for m in reversed(story.messages) if m.role == "assistant" and m.name), None)
        speaker = story.info.char or last or self.names.char or "Assistant"
        return {"role": "assistant", "name": speaker, "message": "", "kind": "open", "number": None,
                "scene": None, "title": ""}  # fmt: skip

    def for_assembly(self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part]) -> dict[str, Any]:
        """Every variable, for the given sections (see docs/templates.md)."""
        head_e = [self.entry(p) for p in head]
        recap_e = [self.entry(p) for p in recap]
        tail_e = [self.entry(p) for p in tail]
        chat = head_e + recap_e + tail_e + [self.open_turn]
        history = next((e for e in recap_e if e["kind"] == "history"), None)
        summaries, cards_before = [], []
        floated: list[dict[str, Any]] = []
        for e in recap_e:
            if e["kind"] == "card":
                cards_before.append(e)
            elif e["kind"] == "history":
                floated, cards_before = cards_before, []
            elif e["kind"] == "summary":
                summaries.append(
                    {"scene": e["scene"], "title": e["title"], "summary": e["message"], "cards": cards_before}
                )
                cards_before = []
        recap_list = ([{"scene": history["scene"], "history": history["message"]}] if history else []) + [
            {"scene": s["scene"], "title": s["title"], "summary": s["summary"]} for s in summaries
        ]
        variables = dict(self.fixed)
        variables.update(
            {
                "head": head_e,
                "tail": tail_e,
                "recap": {"history": history, "summaries": summaries, "floatedCards": floated} if recap_e else None,
                "floatedCards": floated,
                "summaries": summaries,
                "chatMessages": chat,
                "history": json.dumps(recap_list, ensure_ascii=False, indent=2) if recap_list else "",
                "postHistory": self.post_history(len(chat)),
            }
        )
        return variables

    def post_history(self, entries: int) -> dict[str, Any]:
        """Seed 000's reminder: depth 0 targets the open turn (the last entry), depth N sits N
        messages earlier, clamped to the oldest entry."""
        card = self.main_card
        fill = Names(card.name, self.names.user).fill if card else self.names.fill
        post = {
            "instructions": self.names.fill(self.settings.post_history_instructions),
            "charInstructions": fill(card.post_history_instructions) if card else "",
            "exampleDialogue": fill(card.example_dialogue) if card else "",
        }
        target = max(0, entries - 1 - self.settings.post_history_depth)
        return {"targetIndex": target, "hasContent": any(post.values()), **post}


# ── Rendering and emitting ───────────────────────────────────────────────────────────────


def _sections(a: Assembly) -> tuple[list[Part], list[Part], list[Part]]:
    def verbatim(m: Message) -> Part:
        return Part("card" if m.is_card else "message", message=m)

    return [verbatim(m) for m in a.head], list(a.recap), [verbatim(m) for m in a.tail]


@dataclass
class PromptRenderer:
    """Template + format + emit form: blocks for an assembly, and the prompt as printed."""

    variables: Variables
    template: Template
    format: Format
    emit: str = "text"
    reserve: int = 0

    def render(self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part]) -> list[Block]:
        blocks = self.template.render(self.variables.for_assembly(head, recap, tail))
        if blocks and self.is_open_turn(blocks[-1]):
            blocks[-1] = Block("assistant", blocks[-1].text, open=True)
        return blocks

    def is_open_turn(self, block: Block) -> bool:
        """Whether the template's last block is the open turn (the empty last chatMessages
        entry: "Name: " or nothing), which the model continues, rather than a spoken line."""
        if block.role != "assistant":
            return False
        text = block.text.rstrip()
        return not text or text.endswith(":") or text == self.variables.open_turn["name"]

    def blocks(self, assembly: Assembly) -> list[Block]:
        return self.render(*_sections(assembly))

    def messages(self, blocks: Sequence[Block]) -> list[dict[str, str]]:
        """Chat messages; the open turn is the API's own reply, so it is not sent."""
        return render_messages(self.format, [b for b in blocks if not b.open])

    def stop(self) -> list[str]:
        story, names = self.variables.story, self.variables.names
        speakers = [names.speaker(m) for m in story.messages if not m.is_card]
        people = list(dict.fromkeys([names.char, names.user, *speakers]))
        return stop_sequences(self.format, [p for p in people if p])

    def text(self, blocks: Sequence[Block]) -> str:
        return render_text(self.format, blocks)

    def emitted(self, blocks: Sequence[Block]) -> str:
        """The prompt exactly as printed. JSON ends with a newline; text does not, since a
        completion prompt must end where the model is to continue."""
        if self.emit == "text":
            return self.text(blocks)
        if self.emit == "messages":
            body: Any = self.messages(blocks)
        elif self.emit == "openai-chat":
            body = {"messages": self.messages(blocks), "max_tokens": self.reserve, "stop": self.stop()}
        elif self.emit == "openai-completion":
            body = {"prompt": self.text(blocks), "max_tokens": self.reserve, "stop": self.stop()}
        else:
            raise ConfigError("--emit", None, f"unknown emit form {self.emit!r}; expected one of {', '.join(EMITS)}")
        return json.dumps(body, ensure_ascii=False, indent=2) + "\n"

    @property
    def chat_counted(self) -> bool:
        return self.emit in ("messages", "openai-chat")


class TemplatePricer:
    """Prices parts by what they add to the rendered, format-wrapped blocks.

    A part's cost is found by rendering the template with that part alone and comparing the
    blocks with those of the empty render: the blocks that differ are what the part adds
    (its own message block, or the grown system block that holds it). Each differing block
    is counted as the format wraps it, so the template's per-message framing and the
    format's sequences are all in the price. Blocks that merge when rendered together share
    wrappers, so parts' prices add up to at least the prompt's count in practice; the
    assembler still takes the exact count of the prompt it chooses.
    """

    def __init__(self, renderer: PromptRenderer, counter: TokenCounter) -> None:
        self.renderer = renderer
        self.count = counter
        self._empty: list[Block] | None = None
        self._fixed: int | None = None
        self._cache: dict[Part, int] = {}

    def block_cost(self, block: Block) -> int:
        fmt = self.renderer.format
        if self.renderer.chat_counted:
            return 0 if block.open else self.count.bound(block.text) + MESSAGE_OVERHEAD
        return self.count.bound(wrap_block(fmt, block))

    @property
    def empty(self) -> list[Block]:
        if self._empty is None:
            self._empty = self.renderer.render([], [], [])
        return self._empty

    def fixed(self) -> int:
        if self._fixed is None:
            blocks = self.empty
            cost = sum(self.block_cost(b) for b in blocks)
            fmt = self.renderer.format
            if self.renderer.chat_counted:
                cost += REPLY_PRIMING
            else:
                cost += self.count.bound(fmt.bos) if fmt.bos else 0
                if not blocks or not blocks[-1].open:
                    cost += self.block_cost(Block("assistant", "", open=True))
            self._fixed = cost
        return self._fixed

    def part(self, part: Part) -> int:
        cached = self._cache.get(part)
        if cached is None:
            if part.kind in ("message", "card") and part.message is not None:
                alone = self.renderer.render([part], [], [])
            else:
                alone = self.renderer.render([], [part], [])
            added, removed = _difference(self.empty, alone)
            cached = sum(self.block_cost(b) for b in added) - sum(self.block_cost(b) for b in removed)
            self._cache[part] = cached
        return cached

    def exact(self, assembly: Assembly) -> int:
        return self.tokens(self.renderer.blocks(assembly))

    def tokens(self, blocks: Sequence[Block]) -> int:
        """The count of the emitted prompt: the flat text, or chat messages by OpenAI's rule."""
        if self.renderer.chat_counted:
            return (
                sum(self.count(m["content"]) + MESSAGE_OVERHEAD for m in self.renderer.messages(blocks)) + REPLY_PRIMING
            )
        return self.count(self.renderer.text(blocks))


def _difference(before: list[Block], after: list[Block]) -> tuple[list[Block], list[Block]]:
    """The blocks of `after` that are not in `before` and vice versa, around a common prefix
    and suffix (a part adds blocks in one place, or changes the block that holds it)."""
    start = 0
    while start < len(before) and start < len(after) and before[start] == after[start]:
        start += 1
    end_b, end_a = len(before), len(after)
    while end_b > start and end_a > start and before[end_b - 1] == after[end_a - 1]:
        end_b -= 1
        end_a -= 1
    return after[start:end_a], before[start:end_b]
