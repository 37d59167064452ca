"""SillyTavern context presets (seed 003) as templates: `--template preset.json`.

A context preset is SillyTavern's "Context Template": a Handlebars `story_string` (the prompt's
preamble), an `example_separator`, a `chat_start`, where the story string goes and a few stop
string switches. `read_context_preset` reads one; `PresetTemplate` renders it into role blocks,
as a shipped `.hbs` template does, so the format, the pricer and the emit forms work unchanged.

How it renders, worked out from SillyTavern 1.12.6 (commit ba6f7b7a, `public/script.js`
`Generate`, `public/scripts/power-user.js` `renderStoryString`, `instruct-mode.js`), with the
in-chat position from seed 003 (newer SillyTavern):

- The story string is compiled by our safe engine (`hbs`) and given seed 003's parameters.
  Leading newlines are dropped; a newline is added at the end unless the format is an
  instruct format without `wrap` (SillyTavern's rule). `{{trim}}` removes the newlines around it.
- Example dialogue is split at `<START>` (a block without one gets one); each block is
  headed by `example_separator` + newline (in instruct mode, `<START>` when the separator is
  empty) and ends with a newline: that is `{{mesExamples}}`; `{{mesExamplesRaw}}` is the same
  before instruct formatting. Unless the story string prints `mesExamples`/`mesExamplesRaw`
  itself, the examples follow the story string (SillyTavern's default "keep examples").
- `chat_start` + newline stands after the story string and examples, before the first message.
- Messages read `Name: text` (a system message without a name, just its text). Without an
  instruct format ("instruct mode off"), every line ends with a newline and, with
  `always_force_name2`, the prompt ends `Char:` (no trailing space), as SillyTavern's
  "always add character name".
- With an instruct format (a text format with sequences: SillyTavern's "instruct mode") the
  prompt is SillyTavern's whole prompt: the story string as it is (`kind == "story"`: a
  format wraps it only with its `story_string_prefix/suffix`, which 1.12.6 does not have —
  its context presets carry the model's markup), `{{system}}` wrapped with the format's
  `system_sequence_prefix/suffix` (1.12.6's `formatInstructModeSystemPrompt`), the example
  dialogue split into messages and wrapped in the format's input and output sequences
  (`formatInstructModeExamples`; as they are with `skip_examples`), the chat start as it is,
  then each message a block that carries its speaker (`Block.name`), so the format decides
  the names (`names_behavior`), the first and last sequences and the open turn.
- `story_string_position`: 0 (default) puts the story string first, as a system block of
  kind "story" (a format may wrap it with its story-string sequences); 1 ("in chat @ depth")
  puts it among the messages, `story_string_depth` messages before the end, as a block of
  `story_string_role` (0 system, 1 user, 2 assistant), which an instruct format wraps with
  that role's sequences.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TemplateError
from ..files import read_input, utf8_text
from ..hbs import Template
from ..hbs.blocks import Block
from ..jsonload import JSONProblem, loads
from ..story.model import Role
from .formats import Format, bind, example_text, stop_sequences

# SillyTavern's own defaults (power-user.js at ba6f7b7a).
DEFAULT_STORY_STRING = (
    "{{#if system}}{{system}}\n{{/if}}{{#if description}}{{description}}\n{{/if}}"
    "{{#if personality}}{{char}}'s personality: {{personality}}\n{{/if}}"
    "{{#if scenario}}Scenario: {{scenario}}\n{{/if}}{{#if persona}}{{persona}}\n{{/if}}"
)
DEFAULT_EXAMPLE_SEPARATOR = "***"
DEFAULT_CHAT_START = "***"

IN_PROMPT, IN_CHAT = 0, 1
ROLES: tuple[Role, ...] = ("system", "user", "assistant")

# Marks the end of the story string's source, so the engine's trimming of a block's trailing
# newlines leaves SillyTavern's own (Alpaca's story string ends in a blank line).
_END = "\ue011"
_START_TAG = re.compile(r"<START>", re.IGNORECASE)
_START_LINE = re.compile(r"<START>\n", re.IGNORECASE)

# Keys of the other SillyTavern JSON files, for a one-line "this is X, use Y" error.
_CARD_KEYS = {"first_mes", "mes_example", "char_name", "char_persona"}


@dataclass(frozen=True)
class ContextPreset:
    """The fields of a SillyTavern context preset that shape a prompt."""

    name: str
    story_string: str = DEFAULT_STORY_STRING
    example_separator: str = DEFAULT_EXAMPLE_SEPARATOR
    chat_start: str = DEFAULT_CHAT_START
    use_stop_strings: bool = True
    names_as_stop_strings: bool = True
    always_force_name2: bool = True
    story_string_position: int = IN_PROMPT
    story_string_depth: int = 1
    story_string_role: int = 0

    @property
    def prints_examples(self) -> bool:
        """Whether the story string places the examples itself (then they are not repeated)."""
        return bool(re.search(r"\{\{[~#^/]?\s*mesExamples(Raw)?\b", self.story_string))


_STR = ("name", "story_string", "example_separator", "chat_start")
_BOOL = ("use_stop_strings", "names_as_stop_strings", "always_force_name2")
_INT = ("story_string_position", "story_string_depth", "story_string_role")


def what_json_is(data: Any) -> str:
    """Name a SillyTavern JSON file by its keys, and the flag that takes it."""
    if isinstance(data, dict):
        if "story_string" in data:
            return "a SillyTavern context preset"
        if "input_sequence" in data or "output_sequence" in data:
            return "a SillyTavern instruct preset: give it to --format"
        if "entries" in data:
            return "a SillyTavern World Info file (lorebook), not a template"
        inner = data.get("data")
        if str(data.get("spec", "")).startswith("chara_card") or _CARD_KEYS & set(data):
            return "a character card: give it to --card"
        if isinstance(inner, dict) and _CARD_KEYS & set(inner):
            return "a character card: give it to --card"
        if "messages" in data or "user_name" in data:
            return "a chat: give it as the story"
    if isinstance(data, list):
        return "a JSON list (a chat?): give a story as the story argument"
    return "not a SillyTavern context preset (it has no story_string)"


def parse_context_preset(data: Any, source: str) -> ContextPreset:
    """A context preset from parsed JSON; anything else is a `ConfigError` saying what it is."""
    kind = what_json_is(data)
    if kind != "a SillyTavern context preset":
        raise ConfigError(source, None, f"is {kind}; --template takes a .hbs template or a context preset")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        if key in _STR:
            if not isinstance(value, str):
                raise ConfigError(source, key, f"expected a string, got {value!r}")
        elif key in _BOOL:
            if not isinstance(value, bool):
                raise ConfigError(source, key, f"expected true or false, got {value!r}")
        elif key in _INT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(source, key, f"expected a whole number ≥ 0, got {value!r}")
        else:
            continue  # UI fields (trim_sentences, single_line, allow_jailbreak, ...) shape no prompt
        values[key] = value
    if values.get("story_string_position", IN_PROMPT) not in (IN_PROMPT, IN_CHAT):
        raise ConfigError(source, "story_string_position", "expected 0 (in prompt) or 1 (in chat @ depth)")
    if values.get("story_string_role", 0) >= len(ROLES):
        raise ConfigError(source, "story_string_role", "expected 0 (system), 1 (user) or 2 (assistant)")
    values.setdefault("name", Path(source).stem)
    return ContextPreset(**values)


def read_context_preset(path: Path) -> ContextPreset:
    source = str(path)
    text = utf8_text(read_input(path, "context preset"), path)
    try:
        data = loads(text)
    except JSONProblem as exc:
        raise ConfigError(source, None, f"not valid JSON (line {exc.line}): {exc.message}") from None
    return parse_context_preset(data, source)


def story_source(preset: ContextPreset) -> str:
    """The Handlebars source compiled for the story string (see `_END`)."""
    return preset.story_string + _END


def example_blocks(examples: str, separator: str, instruct: bool) -> list[str]:
    """SillyTavern's example blocks: split at `<START>`, each headed and ending in a newline."""
    if not examples or examples == "<START>":
        return []
    if not examples.startswith("<START>"):
        examples = "<START>\n" + examples.strip()
    heading = f"{separator}\n" if separator else ("<START>\n" if instruct else "")
    return [f"{heading}{block.strip()}\n" for block in _START_TAG.split(examples)[1:]]


def story_string_text(
    template: Template, params: Mapping[str, Any], *, instruct: bool, wrap: bool, bound: int | None = None
) -> str:
    """The rendered story string as SillyTavern's `renderStoryString` leaves it."""
    blocks = template.render(params, bound)
    if len(blocks) != 1 or blocks[0].role != "system":
        raise TemplateError(template.name, None, None, "a story string cannot hold role blocks")
    text = blocks[0].text
    text = text[: -len(_END)] if text.endswith(_END) else text
    text = text.lstrip("\n")
    if text and not text.endswith("\n") and (not instruct or wrap):
        text += "\n"
    return text


def stop_strings(
    preset: ContextPreset, others: Sequence[str], fill: Callable[[str], str] = str, between: Sequence[str] = ()
) -> list[str]:
    """The stop strings, in SillyTavern's order: `\n{name}:` for the user and the other speakers
    when names are stop strings (never the one who is to speak), then `between` (the format's),
    then `\n` + chat start and example separator when the separators are stop strings."""
    out = [f"\n{name}:" for name in others if name] if preset.names_as_stop_strings else []
    out += list(between)
    if preset.use_stop_strings:
        out += [f"\n{fill(s)}" for s in (preset.chat_start, preset.example_separator) if s]
    return list(dict.fromkeys(s for s in out if s))


@dataclass(frozen=True)
class PresetTemplate:
    """A context preset rendered as role blocks; `render` has `hbs.Template.render`'s shape."""

    preset: ContextPreset
    story: Template
    instruct: bool = False
    wrap: bool = False
    chat: bool = False
    format: Format | None = None  # the instruct format, when instruct

    @property
    def name(self) -> str:
        return self.story.name

    def for_format(self, fmt: Format) -> PresetTemplate:
        """The template as it renders for a format: instruct (sequences), chat messages, or
        plain text (SillyTavern with instruct mode off: one line per message)."""
        instruct = is_instruct(fmt.input_sequence, fmt.output_sequence, fmt.system_sequence, fmt.chat)
        return replace(
            self, instruct=instruct, wrap=bool(fmt.wrap), chat=bool(fmt.chat), format=fmt if instruct else None
        )

    def render_raw(self, variables: Mapping[str, Any], bound: int | None = None) -> str:
        """The story string's raw output (what `ctx template render` shows of a preset)."""
        return self.story.render_raw(variables, bound)

    def stop(self, fmt: Format, people: Sequence[str], fill: Callable[[str], str]) -> list[str]:
        """The context preset's switches decide (`stop_strings`), with the format's stops between."""
        return stop_strings(self.preset, people, fill, stop_sequences(fmt, []))

    @property
    def plain(self) -> bool:
        return not self.instruct and not self.chat

    def params(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """Seed 003's story-string parameters from the template variables."""
        dialogue = str(variables.get("exampleDialogue", ""))
        raw = example_blocks(dialogue, self._separator(variables), self.instruct)
        params = {key: variables.get(key, "") for key in _STORY_KEYS}
        params["mesExamples"] = params["mesExamplesRaw"] = "".join(raw)
        if self.instruct and self.format is not None:
            fmt = bind(self.format, str(variables.get("user", "")), str(variables.get("char", "")), self.format.group)
            params["mesExamples"] = instruct_examples(fmt, dialogue, raw, self._separator(variables))
            params["system"] = system_prompt(fmt, str(params["system"] or ""))
        return params

    def _separator(self, variables: Mapping[str, Any]) -> str:
        return _fill(variables, self.preset.example_separator)

    def render(self, variables: Mapping[str, Any], bound: int | None = None) -> list[Block]:
        """The story string, the examples, the chat start, the messages, the open turn."""
        preset, plain = self.preset, self.plain
        params = self.params(variables)
        story = _fill(
            variables, story_string_text(self.story, params, instruct=self.instruct, wrap=self.wrap, bound=bound)
        )
        examples = "" if preset.prints_examples else params["mesExamples"]
        chat_start = _fill(variables, preset.chat_start) + "\n" if preset.chat_start else ""
        entries: list[dict[str, Any]] = list(variables.get("chatMessages", []))
        opening = entries.pop() if entries and entries[-1].get("kind") == "open" else None
        turns = [b for e in entries if (b := self._turn(e, variables)) is not None]

        head: list[Block] = []
        if plain:
            text = (story if preset.story_string_position == IN_PROMPT else "") + examples + chat_start
            if text:
                head.append(Block("system", text, kind="story"))
        elif self.instruct:
            if story and preset.story_string_position == IN_PROMPT:
                head.append(Block("system", story, kind="story"))
            if examples + chat_start:
                head.append(Block("system", examples + chat_start, kind="raw"))
        else:
            if story and preset.story_string_position == IN_PROMPT:
                head.append(Block("system", story.rstrip("\n"), kind="story"))
            if examples:
                head.append(Block("system", examples.rstrip("\n")))
            if chat_start:
                head.append(Block("system", chat_start.rstrip("\n")))
        if story and preset.story_string_position == IN_CHAT:
            at = max(0, len(turns) - preset.story_string_depth)
            role = ROLES[preset.story_string_role]
            turns.insert(at, Block(role, story if plain or self.instruct else story.rstrip("\n")))
        if opening is None:
            return head + turns
        mark = str(opening.get("message", ""))
        if self.instruct:
            return [*head, *turns, Block("assistant", mark, name=str(opening.get("name", "")))]
        if plain and not preset.always_force_name2:
            if turns and turns[-1].text.endswith("\n"):
                turns[-1] = Block(turns[-1].role, turns[-1].text[:-1], kind=turns[-1].kind)
            return [*head, *turns, Block("assistant", mark)]
        return [*head, *turns, Block("assistant", f"{opening.get('name', '')}:{mark}")]

    def _turn(self, entry: Mapping[str, Any], variables: Mapping[str, Any]) -> Block | None:
        """One chat entry as a block: `Name: text` for a message, a bracketed line for a recap."""
        kind, message, name = entry.get("kind"), str(entry.get("message", "")), str(entry.get("name", ""))
        if kind == "summary":
            title = f", {entry['title']}" if entry.get("title") else ""
            text, role = f"[Summary of scene {entry.get('scene')}{title}: {message}]", "system"
        elif kind == "history":
            text, role = f"[Story so far: {message}]", "system"
        elif kind == "card":
            if name == variables.get("char"):
                return None  # the story string holds the main character's card
            text, role = message, "system"
        else:
            role = str(entry.get("role", "system"))
            if self.instruct and role != "system":
                return Block(_role(role), message, name=name)  # the format names the speaker
            text = f"{name}: {message}" if name and role != "system" else message
        return Block(_role(role), text + ("\n" if self.plain else ""))


def _role(name: str) -> Role:
    return next((role for role in ROLES if role == name), "system")


_STORY_KEYS = (
    "anchorBefore",
    "anchorAfter",
    "description",
    "scenario",
    "personality",
    "system",
    "persona",
    "char",
    "user",
    "wiBefore",
    "wiAfter",
    "loreBefore",
    "loreAfter",
    "mesExamples",
    "mesExamplesRaw",
)


def _fill(variables: Mapping[str, Any], text: str) -> str:
    """`{{char}}`/`{{user}}` in preset text, as SillyTavern's substituteParams fills them."""
    from .names import Names

    return Names(str(variables.get("char", "")), str(variables.get("user", ""))).fill(text)


def system_prompt(fmt: Format, system: str) -> str:
    """`{{system}}` in instruct mode: wrapped with `system_sequence_prefix/suffix`, joined by
    a newline when the format wraps (SillyTavern 1.12.6's `formatInstructModeSystemPrompt`; an
    empty system prompt stays empty)."""
    if not system:
        return system
    separator = "\n" if fmt.wrap else ""
    if fmt.system_sequence_prefix:
        prefix = fmt.system_sequence_prefix
        system = (
            (re.sub(r"\{\{name\}\}", "System", prefix, flags=re.IGNORECASE) if fmt.macro else prefix)
            + separator
            + system
        )
    if fmt.system_sequence_suffix:
        system = system + separator + fmt.system_sequence_suffix
    return system


def example_messages(body: str, user: str, char: str) -> list[tuple[str, str]]:
    """One block of example dialogue as (role, text) messages: a line that starts `User:` or
    `Char:` starts a message, other lines continue it; lines before the first speaker go with
    the first message; the speaker's `Name:` is taken off the front."""
    messages: list[tuple[str, str]] = []
    lines: list[str] = []
    speaker: tuple[str, str] | None = None  # (role, name)
    for line in body.split("\n"):
        starts = "user" if line.startswith(f"{user}:") else "assistant" if line.startswith(f"{char}:") else None
        if starts is not None and speaker is not None and starts != speaker[0]:
            messages.append((speaker[0], "\n".join(lines).replace(f"{speaker[1]}:", "", 1).strip()))
            lines = []
        if starts is not None and (speaker is None or starts != speaker[0]):
            speaker = (starts, user if starts == "user" else char)
        lines.append(line)
    if speaker is not None:
        messages.append((speaker[0], "\n".join(lines).replace(f"{speaker[1]}:", "", 1).strip()))
    return messages


def instruct_examples(fmt: Format, dialogue: str, raw: Sequence[str], separator: str) -> str:
    """`{{mesExamples}}` in instruct mode (SillyTavern's `formatInstructModeExamples`): each
    block headed by the example separator (when there is one), each message wrapped in the
    format's input or output sequences; with `skip_examples`, or when no block has a message,
    the blocks as they are, the separator in place of `<START>`."""
    heading = f"{separator}\n" if separator else ""
    unformatted = "".join(_START_LINE.sub(lambda _: heading, block, count=1) for block in raw)
    if fmt.skip_examples:
        return unformatted
    out: list[str] = []
    for block in raw:
        body = block.split("\n", 1)[1] if "\n" in block else ""
        messages = example_messages(body.replace("\r", ""), fmt.user, fmt.char)
        if messages:
            out.append(heading)
            out.extend(example_text(fmt, role, text) for role, text in messages)
    return "".join(out) if out else unformatted


def is_instruct(input_sequence: str, output_sequence: str, system_sequence: str, chat: bool) -> bool:
    """SillyTavern's "instruct mode": a text format with sequences."""
    return not chat and bool(input_sequence or output_sequence or system_sequence)
