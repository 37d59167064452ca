"""The template variables of a story and an assembly (docs/templates.md lists them)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..assemble import Part
from ..config import PromptSettings
from ..hbs import Template
from ..lore import LoreChoice, LoreDecision
from ..story.model import LORE_ROLES, Card, LorePosition, Role, Story
from .lookup import compiled
from .names import Names
from .presets import DEFAULT_EXAMPLE_SEPARATOR, example_blocks

# What `postHistory` is in a render that leaves out the anchored parts: nothing to place.
_NO_POST_HISTORY: dict[str, Any] = {"targetIndex": -1, "hasContent": False, "hasLoreNote": False}

# The open turn's `message`: private-use characters around a per-run nonce, which story text
# (data read from a file) cannot predict.
OPEN_MARK = f"\ue000open-{os.urandom(8).hex()}\ue001"


def _card_json(card: Card, names: Names, lore: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    fill = names.within(card).fill
    data: dict[str, Any] = {
        "name": card.name,
        "description": fill(card.description),
        "personality": fill(card.personality),
        "scenario": fill(card.scenario),
        "extraLore": list(lore),  # seed 000: character lore rides on its character
    }
    return {k: v for k, v in data.items() if v}


@dataclass
class Variables:
    """Builds the template variables for a story; the assembly-free part is computed once."""

    story: Story
    names: Names
    settings: PromptSettings = field(default_factory=PromptSettings)
    lore: LoreChoice = field(default_factory=LoreChoice.empty)

    def lore_text(self, d: LoreDecision) -> str:
        """An entry's content with `{{char}}` (its character's, for character lore) and `{{user}}`."""
        card = next((c for c in self.story.known_cards if c.name == d.entry.character), None)
        return self.names.within(card).fill(d.entry.content).strip("\n")

    @cached_property
    def lore_at(self) -> dict[LorePosition, list[LoreDecision]]:
        return self.lore.by_position

    def lore_join(self, position: LorePosition) -> str:
        return "\n".join(t for d in self.lore_at.get(position, []) if (t := self.lore_text(d)))

    @cached_property
    def lore_depth(self) -> list[tuple[int, str, str]]:
        """Position 4: (depth, role, text), one per depth and role as SillyTavern groups them."""
        groups: dict[tuple[int, str], list[str]] = {}
        for d in self.lore_at.get(LorePosition.DEPTH, []):
            groups.setdefault((d.entry.depth, LORE_ROLES[d.entry.role]), []).append(self.lore_text(d))
        return [
            (depth, role, "\n".join(texts)) for (depth, role), texts in sorted(groups.items(), key=lambda g: -g[0][0])
        ]

    @cached_property
    def card_template(self) -> Template:
        return compiled(self.settings.card_template, "[prompt] card_template")

    @cached_property
    def main_card(self) -> Card | None:
        cards = self.story.known_cards
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
        if part.kind == "recall":
            return self.recalled(part)
        if part.kind == "card" and m and m.card:
            return {"role": "system", "name": m.card.name, "message": self.card_text(m.card), "kind": "card",
                    "number": m.number, "scene": None, "title": ""}  # fmt: skip
        if part.kind == "message" and m:
            text = self.names.fill(m.content)
            return {"role": m.role, "name": self.label(m.role, m.name, text), "message": text,
                    "kind": "message", "number": m.number, "scene": None, "title": ""}  # fmt: skip
        if scene is not None:
            text = scene.summary if part.kind == "summary" else scene.history
            return {"role": "system", "name": "", "message": self.names.fill(text), "kind": part.kind,
                    "number": None, "scene": scene.ref, "title": scene.title}  # fmt: skip
        raise ValueError(f"cannot render {part!r}")

    def recalled(self, part: Part) -> dict[str, Any]:
        """A recalled entry (`assemble/recall.py`): a system entry of kind "recall" that says
        what it is — an earlier message with who spoke and when, or a scene's summary."""
        m, scene = part.message, part.scene
        if m is not None:
            who = self.names.speaker_as(m.role, m.name)
            when = f" · {m.sent.date().isoformat()}" if m.sent is not None else ""
            heading = f"[Earlier, message {m.number:,}{' · ' + who if who else ''}{when}]"
            text = self.names.fill(m.content)
            return {"role": "system", "name": "", "message": f"{heading}\n{text}", "kind": "recall",
                    "number": m.number, "scene": None, "title": "", "speaker": who, "text": text}  # fmt: skip
        if scene is not None:
            title = f" · {scene.title}" if scene.title else ""
            text = self.names.fill(scene.summary)
            return {"role": "system", "name": "", "message": f"[Earlier, scene {scene.ref}{title}]\n{text}",
                    "kind": "recall", "number": None, "scene": scene.ref, "title": scene.title, "speaker": "",
                    "text": text}  # fmt: skip
        raise ValueError(f"cannot render {part!r}")

    def label(self, role: Role, name: str | None, text: str) -> str:
        """Who a message's `name` says speaks it. `[prompt] speakers = "as_given"` (a frontend's
        chat, `ctx serve`): only the name the message carries, so a chat sent without names gets
        no "Assistant:" written into it for the model to copy. Either way, no name the message's
        text already starts with ("Aqua: …", SillyTavern's names in the content): it is not
        written twice."""
        speaker = (name or "") if self.settings.speakers == "as_given" else self.names.speaker_as(role, name)
        return "" if speaker and text.startswith(f"{speaker}:") else speaker

    @cached_property
    def fixed(self) -> dict[str, Any]:
        """The variables that do not depend on the assembly."""
        story, names, card = self.story, self.names, self.main_card
        cards = self.story.known_cards
        # Each persona once: the user first, then every other name the user's rows speak as.
        speakers = (name for role, name in story.speakers if role == "user" and name)
        users = list(dict.fromkeys([*([names.user] if names.user else []), *speakers]))
        persona = names.fill(story.info.persona)
        personas = [{"name": u, **({"description": persona} if persona and u == names.user else {})} for u in users]
        fill = names.within(card).fill
        scenario = names.fill(story.info.scenario) or (fill(card.scenario) if card else "")
        example = "\n".join(
            t
            for t in (
                self.lore_join(LorePosition.EXAMPLES_TOP),
                fill(card.example_dialogue) if card else "",
                self.lore_join(LorePosition.EXAMPLES_BOTTOM),
            )
            if t
        )
        placed = self.lore.ranked
        world = [{"name": d.entry.name, "content": self.lore_text(d)} for d in placed if not d.entry.character]
        bound: dict[str, list[dict[str, str]]] = {}
        for d in placed:
            if d.entry.character:
                bound.setdefault(d.entry.character, []).append({"name": d.entry.name, "content": self.lore_text(d)})
        system = names.fill(story.system) or (fill(card.system_prompt) if card else "")
        return {
            "system": system,
            "title": story.info.title,
            "char": names.char,
            "user": names.user,
            "characters": json.dumps(
                [_card_json(c, names, bound.get(c.name, ())) for c in cards], ensure_ascii=False, indent=2
            )
            if cards
            else "",
            "personas": json.dumps(personas, ensure_ascii=False, indent=2) if users else "",
            "scenario": scenario,
            # Serene Pub's template has no {{system}}: there the system prompt is the chat
            # prompt's instructions, so the story's system message stands in when none is set.
            "instructions": names.fill(story.info.instructions) or names.fill(self.settings.instructions) or system,
            "currentDate": story.info.current_date,
            "storySoFar": names.fill(story.info.story_so_far),
            # SillyTavern's story-string parameters (seed 003); the examples as SillyTavern
            # formats them by default (blocks headed by its separator, "***"). A context
            # preset formats `exampleDialogue` with its own separator.
            "description": fill(card.description) if card else "",
            "personality": fill(card.personality) if card else "",
            "persona": persona,
            "exampleDialogue": example,
            "mesExamples": "".join(example_blocks(example, DEFAULT_EXAMPLE_SEPARATOR, instruct=False)),
            "mesExamplesRaw": example,
            "wiBefore": self.lore_join(LorePosition.BEFORE),
            "wiAfter": self.lore_join(LorePosition.AFTER),
            "loreBefore": self.lore_join(LorePosition.BEFORE),
            "loreAfter": self.lore_join(LorePosition.AFTER),
            "loreNoteTop": self.lore_join(LorePosition.NOTE_TOP),
            "loreNoteBottom": self.lore_join(LorePosition.NOTE_BOTTOM),
            "anchorBefore": "",
            "anchorAfter": "",
            "worldLore": json.dumps(world, ensure_ascii=False, indent=2) if world else "",
            "narrativeGraph": "",
        }

    @cached_property
    def open_turn(self) -> dict[str, Any]:
        """The last `chatMessages` entry: the turn the model continues ("Name: ")."""
        speaker = ""  # "as_given": the frontend names the one to speak, if anyone
        if self.settings.speakers != "as_given":
            last = next((m.name for m in reversed(self.story.messages) if m.role == "assistant" and m.name), None)
            speaker = self.names.char or last or "Assistant"
        # Its `message` is a mark no story text can hold: where the template prints it is how
        # the renderer knows which block the model continues (the mark itself prints nothing).
        return {"role": "assistant", "name": speaker, "message": OPEN_MARK, "kind": "open", "number": None,
                "scene": None, "title": ""}  # fmt: skip

    def for_assembly(
        self, head: Sequence[Part], recap: Sequence[Part], tail: Sequence[Part], *, anchored: bool = True
    ) -> dict[str, Any]:
        """Every variable, for the given sections (see docs/templates.md). `anchored=False`
        leaves out what stands at a distance from the end of the chat (lore at a depth, the
        post-history reminder): the pricer's stand-in chats are short, so those would land
        elsewhere than in the prompt; their cost is in the frame's."""
        head_e = [self.entry(p) for p in head]
        entries = [self.entry(p) for p in recap]
        recap_e = [e for e in entries if e["kind"] != "recall"]
        recalled = [e for e in entries if e["kind"] == "recall"]
        tail_e = [self.entry(p) for p in tail]
        chat = head_e + recap_e + tail_e
        # Position 4: `depth` messages from the end, never above the tail's first message.
        # (With no recap, head and tail are one run of the chat, and the whole of it counts.)
        top = len(head_e) + len(recap_e) if recap_e else 0
        for depth, role, text in self.lore_depth if anchored else ():
            at = max(top, len(chat) - depth)
            chat.insert(at, {"role": role, "name": "", "message": text, "kind": "lore", "number": None,
                             "scene": None, "title": ""})  # fmt: skip
        # What the newest messages recall goes just before the newest user message (after the recap
        # when the tail has none): it changes with each turn's question, and there it costs only itself,
        # the prompt before it as the turn before sent it (SillyTavern's Vector Storage: depth 2).
        users = (i for i in range(len(chat) - 1, top - 1, -1) if chat[i]["kind"] == "message")
        at = next((i for i in users if chat[i]["role"] == "user"), top)
        chat[at:at] = recalled
        chat.append(self.open_turn)
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
        # seed 000's `history`: then the recalled history entries by relevance, and the recalled
        # messages (its template shows no system entry of chatMessages)
        for e in recalled:
            if e["scene"] is not None:
                recap_list.append({"scene": e["scene"], "title": e["title"], "summary": e["text"]})
        for e in recalled:
            if e["number"] is not None:
                recap_list.append({"message": e["number"], "name": e["speaker"], "text": e["text"]})
        variables = dict(self.fixed)
        variables.update(
            {
                "head": head_e,
                "tail": tail_e,
                "recap": {"history": history, "summaries": summaries, "floatedCards": floated}
                if recap_e or recalled
                else None,
                "floatedCards": floated,
                "summaries": summaries,
                "chatMessages": chat,
                "history": json.dumps(recap_list, ensure_ascii=False, indent=2) if recap_list else "",
                "postHistory": self.post_history(len(chat)) if anchored else _NO_POST_HISTORY,
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
        # World Info's author's-note positions (2, 3) stand beside the reminder, at its index.
        note = {
            "loreNoteTop": self.lore_join(LorePosition.NOTE_TOP),
            "loreNoteBottom": self.lore_join(LorePosition.NOTE_BOTTOM),
        }
        return {
            "targetIndex": target,
            "hasContent": any(post.values()),
            "hasLoreNote": any(note.values()),
            **post,
            **note,
        }


# ── Rendering and emitting ───────────────────────────────────────────────────────────────
