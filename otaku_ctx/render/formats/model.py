"""The Format type: one prompt format as data, and the format for one story (`bind`).

Its fields are the keys of a format file (formats/toml.py lists them with what each does),
which mirror SillyTavern's instruct preset. A model's own Jinja chat template is a Format too
(`jinja_format`): its text prompts are the template rendered, and the sequences are unused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# What may be a model's control token, spelled in story text: `<|im_start|>`, `<start_of_turn>`,
# `</s>`, `[INST]`, `[/INST]` (not `[0]` or `['role']`).
WRITTEN_MARKUP = re.compile(r"<[^<>\s{}%]+>|\[/?[A-Z][A-Z_]*\]")
NAMES_BEHAVIORS = ("none", "force", "always")
SYSTEM_PLACEMENTS = ("in_place", "last_user")

# Fields read from a SillyTavern preset that are written as themselves in a Format.
SEQUENCE_FIELDS = (
    "system_sequence",
    "system_suffix",
    "input_sequence",
    "input_suffix",
    "output_sequence",
    "output_suffix",
    "first_output_sequence",
    "last_output_sequence",
    "first_input_sequence",
    "last_input_sequence",
    "last_system_sequence",
    "system_sequence_prefix",
    "system_sequence_suffix",
    "story_string_prefix",
    "story_string_suffix",
    "user_alignment_message",
)
STR_FIELDS = (
    *SEQUENCE_FIELDS,
    "name",
    "bos",
    "names_behavior",
    "stop_sequence",
    "system_placement",
    "system_preamble",
)
BOOL_FIELDS = ("chat", "system_same_as_user", "wrap", "alternate", "skip_examples", "macro")

# `{{name}}`, the speaker of a block: `bind` leaves it, each block's rendering fills it.
NAME_MACRO = re.compile(r"\{\{name\}\}", re.IGNORECASE)
_NAMES = re.compile(r"\{\{(?:(user)|char)\}\}|<(?:(USER)|BOT)>", re.IGNORECASE)
# A `{{name}}` inside a user's or character's name is text, not the macro: `bind` writes this
# mark in place of its `{{`, and the braces come back as the prompt leaves the formats package
# (`shown`, called by `text_pieces` and `render_messages`), after every `{{name}}` macro is
# filled. Its nonce is new every run, so no story text can hold it.
_BRACES = f"\ue000braces-{os.urandom(6).hex()}\ue001"


@dataclass(frozen=True)
class Format:
    """One prompt format: the sequences that wrap each role's blocks, and the stop strings."""

    name: str
    chat: bool = False
    bos: str = ""
    system_sequence: str = ""
    system_suffix: str = ""
    input_sequence: str = ""
    input_suffix: str = ""
    output_sequence: str = ""
    output_suffix: str = ""
    first_output_sequence: str = ""
    last_output_sequence: str = ""
    first_input_sequence: str = ""
    last_input_sequence: str = ""
    last_system_sequence: str = ""
    system_sequence_prefix: str = ""
    system_sequence_suffix: str = ""
    story_string_prefix: str = ""
    story_string_suffix: str = ""
    skip_examples: bool = False
    macro: bool = True
    system_same_as_user: bool = False
    wrap: bool = False
    user_alignment_message: str = ""
    names_behavior: str = "always"
    alternate: bool = True
    system_placement: str = "in_place"
    system_preamble: str = ""
    stop: tuple[str, ...] = ()
    # A model's own Jinja chat template (`jinja_format`): when set, a text prompt is the
    # template's rendering of the format's turns, and the sequences above are unused. Its BOS
    # and EOS texts are the template's `bos_token` and `eos_token`.
    chat_template: str = field(default="", repr=False)
    bos_token: str | None = None  # None: undefined in the template, as a tokenizer without one leaves it
    eos_token: str | None = None
    # The model's control tokens, as the file the format came from names them (a GGUF's, a
    # tokenizer_config.json's special added tokens): story text that spells one is broken up
    # in a text prompt whatever counts it (`Prepared.renderer`), not only with the model's counter.
    controls: tuple[str, ...] = field(default=(), repr=False)
    # The BOS text a server running the format's model adds to every prompt itself (a GGUF's
    # `add_bos_token`): a text prompt does not spell it too, whatever counts it (one BOS, always).
    server_bos: str = field(default="", repr=False)
    note: str = field(default="", repr=False)  # what a build says of the format on stderr, once
    # The story's names (`bind`), not read from a file: `{{user}}`, `{{char}}`, and whether
    # more than one character speaks (a group chat, for names_behavior = "force").
    user: str = ""
    char: str = ""
    group: bool = False


def bind(fmt: Format, user: str, char: str, group: bool = False) -> Format:
    """The format for one story: `{{user}}`/`{{char}}` filled in its sequences and stop
    strings (when `macro`), the names kept for `{{name}}` and `names_behavior`."""
    fmt = replace(fmt, user=user, char=char, group=group)
    if not fmt.macro:
        return fmt

    # One pass: a name is data, so a user named "{{char}}" stays "{{char}}".
    guarded = {
        True: NAME_MACRO.sub(lambda m: _BRACES + m[0][2:], user),
        False: NAME_MACRO.sub(lambda m: _BRACES + m[0][2:], char),
    }

    def fill(text: str) -> str:
        return _NAMES.sub(lambda m: guarded[bool(m.group(1) or m.group(2))], text)

    filled: dict[str, Any] = {key: fill(getattr(fmt, key)) for key in (*SEQUENCE_FIELDS, "system_preamble", "bos")}
    return replace(fmt, stop=unique([shown(fill(s)) for s in fmt.stop]), **filled)


def shown(text: str) -> str:
    """Text as it leaves the format: a name's own `{{name}}` given back (see `_BRACES`)."""
    return text.replace(_BRACES, "{{") if _BRACES in text else text


def jinja_format(
    template: str,
    *,
    bos: str | None,
    eos: str | None,
    name: str,
    controls: tuple[str, ...] = (),
    server_bos: str = "",
) -> Format:
    """A format whose text prompts are a model's own Jinja chat template rendered over the
    format's turns (`render.jinja`), with `bos` and `eos` as its `bos_token` and
    `eos_token` (None: undefined, as transformers leaves a token the tokenizer has not);
    `controls` the model's control tokens (`Format.controls`), `server_bos` the BOS its
    server adds itself (`Format.server_bos`);
    `name` names it in errors ("model.gguf (tokenizer.chat_template)"). The
    template is compiled now, so one that is not valid Jinja is an error naming its line.

    Its stop strings are the EOS text and what the template writes right after an
    assistant's message (its end of turn: "<|im_end|>", "<|eot_id|>", "<end_of_turn>").
    Consecutive turns of one role are merged (`alternate`), so a template that demands
    alternating turns accepts the chat; system turns are sent as they are, for the template
    to place (or refuse: a template's own refusal is an error naming it)."""
    from ..jinja import check_template, turn_end

    check_template(template, name)
    stop = unique([eos or "", turn_end(template, name, bos=bos, eos=eos)])
    return Format(
        name=name, chat_template=template, bos_token=bos, eos_token=eos, macro=False, stop=stop, controls=controls,
        server_bos=server_bos,
    )  # fmt: skip


def unique(strings: Sequence[str]) -> tuple[str, ...]:
    """Non-empty strings, each once, first occurrence kept."""
    return tuple(dict.fromkeys(s for s in strings if s))
