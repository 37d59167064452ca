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
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from .assembler import Assembly, Part
from .blocks import Block
from .config import DEFAULT_CARD_TEMPLATE
from .errors import ConfigError
from .formats import Format, builtin_dirs, load_format, render_messages, render_text, stop_sequences, text_pieces
from .hbs import Template, cached_template
from .model import Card, Message, Role, Scene, Story
from .tokens import TokenCounter

MACRO = re.compile(r"\{\{(char|user)\}\}", re.IGNORECASE)
EMITS = ("text", "messages", "openai-chat", "openai-completion")
# The open turn's `message`: private-use characters around a per-run nonce, which story text
# (data read from a file) cannot predict.
OPEN_MARK = f"\ue000open-{secrets.token_hex(8)}\ue001"
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
        cards = story.cards
        char = story.info.char or (cards[0].card.name if cards and cards[0].card else "")
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

    def within(self, card: Card | None) -> Names:
        """The names as a card's own text sees them: there `{{char}}` is that card."""
        return Names(card.name, self.user) if card else self

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
    """Compile once per run; parse only when no shipped or cached program has it (see hbs.store)."""
    return cached_template(source, name)


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
            raise ConfigError(name_or_path, None, f"no template named {name_or_path!r}; known: {', '.join(names)}")
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
    fill = names.within(card).fill
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
    def known_cards(self) -> list[Card]:
        """The story's cards, then its cast."""
        return [m.card for m in self.story.cards if m.card] + list(self.story.info.cast)

    @cached_property
    def main_card(self) -> Card | None:
        cards = self.known_cards
        return next((c for c in cards if c.name == self.names.char), cards[0] if cards else None)

    def card_text(self, card: Card) -> str:
        """How a card message reads: the `[prompt] card_template`, with macros filled in."""
        fill = self.names.within(card).fill
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
        cards = self.known_cards
        users = list(dict.fromkeys([names.user] if names.user else []))
        users += [m.name for m in story.messages if m.role == "user" and m.name and m.name not in users]
        persona = names.fill(story.info.persona)
        personas = [{"name": u, **({"description": persona} if persona and u == names.user else {})} for u in users]
        fill = names.within(card).fill
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
            # Serene Pub's template has no {{system}}: there the system prompt is the chat
            # prompt's instructions, so the story's system message stands in when none is set.
            "instructions": names.fill(story.info.instructions) or names.fill(self.settings.instructions) or system,
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
            "loreAfter": "",
            "anchorBefore": "",
            "anchorAfter": "",
            "worldLore": "",
            "narrativeGraph": "",
        }

    @cached_property
    def open_turn(self) -> dict[str, Any]:
        """The last `chatMessages` entry: the turn the model continues ("Name: ")."""
        story = self.story
        last = next((m.name for m in reversed(story.messages) if m.role == "assistant" and m.name), None)
        speaker = story.info.char or last or self.names.char or "Assistant"
        # Its `message` is a mark no story text can hold: where the template prints it is how
        # the renderer knows which block the model continues (the mark itself prints nothing).
        return {"role": "assistant", "name": speaker, "message": OPEN_MARK, "kind": "open", "number": None,
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
        fill = self.names.within(card).fill
        post = {
            "instructions": self.names.fill(self.settings.post_history_instructions),
            "charInstructions": fill(card.post_history_instructions) if card else "",
            "exampleDialogue": fill(card.example_dialogue) if card else "",
        }
        target = max(0, entries - 1 - self.settings.post_history_depth)
        return {"targetIndex": target, "hasContent": any(post.values()), **post}


# ── Rendering and emitting ───────────────────────────────────────────────────────────────


def _sections(a: Assembly) -> tuple[list[Part], list[Part], list[Part]]:
    return [Part.verbatim(m) for m in a.head], list(a.recap), [Part.verbatim(m) for m in a.tail]


@dataclass
class PromptRenderer:
    """Template + format + emit form: blocks for an assembly, and the prompt as printed."""

    variables: Variables
    template: Template
    format: Format
    emit: str = "text"
    reserve: int = 0
    bound: int | None = None  # characters a render may produce (hbs.bound_for_window), None = no bound

    def render(self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part]) -> list[Block]:
        """Role blocks; the last is open when it holds the open turn (see `Variables.open_turn`)."""
        blocks = self.template.render(self.variables.for_assembly(head, recap, tail), self.bound)
        out = [Block(b.role, b.text.replace(OPEN_MARK, "")) if OPEN_MARK in b.text else b for b in blocks]
        if out and OPEN_MARK in blocks[-1].text and out[-1].role == "assistant":
            out[-1] = Block("assistant", out[-1].text, open=True)
        return out

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
    """Prices parts by what they add to the emitted prompt, piece by piece.

    The emitted prompt is a list of pieces: for a text format, the BOS and each merged turn
    with its sequences; for chat output, each merged message. A part is priced by rendering
    the template twice, without and with it, and counting only the pieces that differ, so
    the template's framing, the format's sequences and merging are all in the price without
    ever counting the whole prompt:

    - a message or card of the head or tail is measured after a message of the other role
      (they alternate in a chat, so its turn stands alone);
    - a recap part (card, summary, history) is measured after another recap part, as it
      stands in a run of them: its run price. What a recap costs once, whatever it holds
      (its turn's sequences, a template's "Story history:" header), is `recap_opening()`.

    The prices add up to the prompt's count whenever the template renders the parts that
    way; the assembler still takes the exact count of the prompt it chooses.
    """

    def __init__(self, renderer: PromptRenderer, counter: TokenCounter) -> None:
        self.renderer = renderer
        self.count = counter
        self._fixed: int | None = None
        self._opening: int | None = None
        self._cache: dict[tuple[str, Part], int] = {}
        self._rendered: tuple[tuple[Any, ...], list[Block]] | None = None

    def pieces(self, blocks: Sequence[Block]) -> list[str]:
        if self.renderer.chat_counted:
            return [m["content"] for m in self.renderer.messages(blocks)]
        return text_pieces(self.renderer.format, blocks)

    def piece_cost(self, piece: str) -> int:
        overhead = MESSAGE_OVERHEAD if self.renderer.chat_counted else 0
        return self.count.bound(piece) + overhead

    def cost(self, blocks: Sequence[Block]) -> int:
        """Tokens of the emitted prompt for these blocks, as the sum of its pieces."""
        priming = REPLY_PRIMING if self.renderer.chat_counted else 0
        return sum(self.piece_cost(p) for p in self.pieces(blocks)) + priming

    def delta(self, before: Sequence[Block], after: Sequence[Block]) -> int:
        """What `after` adds to `before`, counting only the pieces that differ."""
        old, new = self.pieces(before), self.pieces(after)
        start, end_old, end_new = _difference(old, new)
        return self.region(new, start, end_new) - self.region(old, start, end_old)

    def region(self, pieces: list[str], start: int, end: int) -> int:
        """Tokens of pieces[start:end] where they stand. In a text prompt, a piece is counted
        after the piece before it, since sequences meeting at a boundary ("<|eot_id|>" then
        "<|start_header_id|>") can tokenize together."""
        if start == end:
            return 0
        if self.renderer.chat_counted:
            return sum(map(self.piece_cost, pieces[start:end]))
        before = pieces[start - 1] if start else ""
        return self.count.bound(before + "".join(pieces[start:end])) - self.count.bound(before)

    def fixed(self) -> int:
        if self._fixed is None:
            self._fixed = self.cost(self.renderer.render([], [], []))
        return self._fixed

    def part(self, part: Part, after: Role | None = None) -> int:
        """A head or tail message (or card), measured after a turn of role `after`, so that
        merging with a turn of the same role is priced as it will render."""
        key = (f"verbatim after {after}", part)
        cached = self._cache.get(key)
        if cached is None:
            before = [_PROBES[after]] if after else []
            render = self.renderer.render
            cached = self._cache[key] = self.delta(render(before, [], []), render([*before, part], [], []))
        return cached

    def recap_part(self, part: Part) -> int:
        """A recap part's run price: measured after another recap part, as it will stand."""
        key = ("recap", part)
        cached = self._cache.get(key)
        if cached is None:
            render = self.renderer.render
            before = render([_PROBE_USER], [_PROBE_RECAP], [])
            cached = self._cache[key] = self.delta(before, render([_PROBE_USER], [_PROBE_RECAP, part], []))
        return cached

    def recap_opening(self, after: Role | None = None) -> int:
        """What a non-empty recap costs beyond its parts' run prices, after a turn of role `after`."""
        key = (f"opening after {after}", _PROBE_RECAP)
        cached = self._cache.get(key)
        if cached is None:
            before = [_PROBES[after]] if after else []
            render = self.renderer.render
            first = self.delta(render(before, [], []), render(before, [_PROBE_RECAP], []))
            cached = self._cache[key] = first - self.recap_part(_PROBE_RECAP_2)
        return cached

    def exact(self, assembly: Assembly) -> int:
        return self.tokens(self.blocks(assembly))

    def blocks(self, assembly: Assembly) -> list[Block]:
        """The assembly's blocks; the last one rendered for `exact` is kept, since the
        candidate that was counted is the one that is emitted."""
        key = (assembly.head, assembly.recap, assembly.tail)
        if self._rendered is None or self._rendered[0] != key:
            self._rendered = (key, self.renderer.blocks(assembly))
        return self._rendered[1]

    def tokens(self, blocks: Sequence[Block]) -> int:
        """The count of the emitted prompt: the flat text, or chat messages by OpenAI's rule."""
        if self.renderer.chat_counted:
            contents = [m["content"] for m in self.renderer.messages(blocks)]
            return sum(self.count(c) + MESSAGE_OVERHEAD for c in contents) + REPLY_PRIMING
        return self.count(self.renderer.text(blocks))


# Stand-ins the pricer renders beside a part, so the part is measured where it will stand.
_PROBE_USER = Part("message", message=Message(0, "user", "…", "User"))
_PROBES: dict[Role, Part] = {
    "user": _PROBE_USER,
    "assistant": Part("message", message=Message(0, "assistant", "…", "Assistant")),
    "system": Part("message", message=Message(0, "system", "…", "System")),
}
_PROBE_RECAP = Part("summary", scene=Scene(order=0, start=0, end=0, id="·", summary="…"))
_PROBE_RECAP_2 = Part("summary", scene=Scene(order=0, start=0, end=0, id="··", summary="…"))


def _difference(before: list[str], after: list[str]) -> tuple[int, int, int]:
    """Where two piece lists differ, around their common prefix and suffix: (start, end in
    `before`, end in `after`). A part adds pieces in one place, or changes the one holding it."""
    start = 0
    while start < len(before) and start < len(after) and before[start] == after[start]:
        start += 1
    end_b, end_a = len(before), len(after)
    while end_b > start and end_a > start and before[end_b - 1] == after[end_a - 1]:
        end_b -= 1
        end_a -= 1
    return start, end_b, end_a
