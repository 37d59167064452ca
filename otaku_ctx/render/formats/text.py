"""The renderer: a format's turns made of role blocks, as one text prompt or as chat messages.

How a text prompt is built (`render_text`), and the decisions a user should know:

- Only the last block may be open. Without one, an empty open assistant turn is appended,
  so a text prompt always ends ready for the model's reply.
- `user_alignment_message`: if the first non-system block is an assistant's, a user block
  with this text goes before it (SillyTavern does the same), for templates that demand the
  user speak first.
- `system_same_as_user`: system blocks become user blocks *before* consecutive blocks merge,
  so a system prompt folds into the user turn beside it, joined by a blank line. This is
  how Mistral's and Gemma's own templates treat a system message.
- `alternate`: consecutive blocks of one role merge (`merge_blocks`), in text and in chat
  messages, so templates that demand alternating turns (Mistral, Gemma, Alpaca) get them; a
  named open turn ("Ilya:") after an assistant turn continues that turn. With
  `alternate = false` (ChatML, Llama 3, Vicuna, every SillyTavern preset) each block is a
  turn of its own, so the speakers of a group chat keep their own turns.
- For formats with `system_same_as_user`, chat messages (`render_messages`) fold system
  blocks into user turns too, as the model's template would: a server running Mistral's or
  Gemma's template refuses a system message that is not first (or any, Gemma 2).
- `system_placement = "last_user"` (Mistral v3, Tekken): the leading system blocks go before
  the last user turn's text, as Mistral's template and mistral-common put them — unless the
  chat opens with an assistant turn; then they stay the opening user turn.
- `system_preamble` (Llama 3.1's "Cutting Knowledge Date" lines): the prompt always opens with
  a system turn that starts with this text, made empty when the story has no system prompt.
- `wrap` is SillyTavern's: a newline between a prefix and its text, and a newline after the
  text when the role has no suffix. It does not put a newline before a non-empty suffix
  (SillyTavern does not either, and ChatML's `<|im_end|>` follows the text directly).
- The open block gets `last_output_sequence` (else `output_sequence`) and no suffix; its
  text is written without trailing spaces ("Ilya:"), as the models' templates and SillyTavern
  end it. When
  `last_output_sequence` drops the trailing space `output_sequence` has (Mistral's
  "[/INST]" vs "[/INST] "), that space goes back before a non-empty open text, as
  SillyTavern does.
- `bos` is the literal start-of-text the model's own chat template writes (Llama 3's
  `<|begin_of_text|>`, Mistral's `<s>`, Gemma's `<bos>`). A backend that adds BOS itself
  will then see two; copy the format and set `bos = ""` for such a backend.
- Macros: with `macro` (the default), `{{user}}` and `{{char}}` in every sequence and stop
  string are the story's names (`bind`), and `{{name}}` is the speaker of the block (the user
  for an input sequence, the character for an output one, "System" for a system block).
- `names_behavior` applies to blocks that carry their speaker (`Block.name`: a SillyTavern
  context preset's messages; a ctx template writes names into its text itself): "always"
  writes "Name: text", "none" the text alone, "force" the name only in a group chat (more than
  one character speaks) and never the user's. The open turn then ends "Name:" or the bare
  sequence, as SillyTavern's `formatInstructModePrompt` does.
- The oldest message (the first user or assistant block) takes `first_input_sequence` or
  `first_output_sequence` by its role; the last user block takes `last_input_sequence` (that
  wins when they are one block), as SillyTavern's `Generate` forces them.
- The system prompt (the system blocks before the first user or assistant block, from a ctx
  template) is wrapped with, in this order: `story_string_prefix/suffix` when the preset has
  them; `system_sequence_prefix/suffix` (SillyTavern 1.12.6); the system sequences when the
  system sequence names the system role (ChatML, Llama 3, Gemma 2: it has a turn of its own
  even with `system_same_as_user`); a user turn with `system_same_as_user` (Mistral); else
  as it is (Alpaca's `### Input:` marks system messages in the chat, not the prompt).
  A context preset's story string (`kind == "story"`) takes only `story_string_prefix/suffix`:
  SillyTavern 1.12.6 writes it as it is, its context presets carry the model's markup.

A format with a model's own Jinja chat template (`Format.chat_template`) renders that
template instead (`render.jinja`, as transformers renders it) over the chat messages
`render_messages` gives: consecutive turns of one role merged, names written "Name: text",
system turns sent as they are; the open turn continued as `continue_final_message` continues
a final message, or a blank one asked for with `add_generation_prompt`. A template that
refuses the chat gets it folded (`template_chats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ...hbs.blocks import Block
from .model import NAME_MACRO, Format, shown, unique


def merge_blocks(blocks: Sequence[Block]) -> list[Block]:
    """Merge consecutive blocks of one role (texts joined by a blank line) so roles
    alternate. An open block that has text ("Ilya:") merges into the closed turn of its role
    before it, so the model continues that turn; a blank one (no template open turn) stays a
    turn of its own."""
    merged: list[Block] = []
    for block in blocks:
        previous = merged[-1] if merged else None
        if previous and previous.role == block.role and (not block.open or block.text.strip()):
            merged[-1] = Block(block.role, f"{previous.text}\n\n{block.text}", block.open)
        else:
            merged.append(block)
    return merged


def turns(fmt: Format, blocks: Sequence[Block]) -> list[Block]:
    """The blocks as the format's turns: the alignment message in, system blocks folded into
    user turns where the model has no system role (the leading ones into the last user turn
    when `system_placement = "last_user"`), and consecutive turns of one role merged where
    the model demands alternating turns (`alternate`). A story string or preformatted text
    (`Block.kind`) is never folded or merged."""
    out = _aligned(fmt, _checked(blocks))
    if fmt.system_same_as_user:
        out = _folded(fmt, out)
    return merge_blocks(out) if fmt.alternate else out


def render_text(fmt: Format, blocks: Sequence[Block]) -> str:
    """A flat text-completion prompt, ending in the open turn the model continues."""
    return "".join(text_pieces(fmt, blocks))


def text_pieces(fmt: Format, blocks: Sequence[Block]) -> list[str]:
    """The text prompt in pieces: the BOS, then each turn with its sequences, the open turn
    last. Joined, they are `render_text`; apart, they can be priced one by one. A format
    with a chat template renders it whole (`_template_pieces`)."""
    if fmt.chat_template:
        return _template_pieces(fmt, blocks)
    blocks = list(blocks)
    if not blocks or not blocks[-1].open:
        blocks.append(Block("assistant", "", open=True))
    parts = [fmt.bos]
    all_turns = turns(fmt, blocks)
    if fmt.system_preamble:
        all_turns = _with_preamble(fmt, all_turns)
    chat = [i for i, b in enumerate(all_turns) if b.role != "system" and not b.kind and not b.open]
    first = chat[0] if chat else -1
    last_user = max((i for i in chat if all_turns[i].role == "user"), default=-1)
    for index, block in enumerate(all_turns):
        if block.open:
            if fmt.wrap and parts[-1].endswith("\n"):
                parts[-1] = parts[-1][:-1]  # the open turn starts on a line of its own
            parts.append(_open_turn(fmt, block))
            continue
        position = "last" if index == last_user else "first" if index == first else ""
        parts.append(_closed_turn(fmt, block, position, before_chat=first < 0 or index < first))
    return [shown(part) for part in parts]


def render_messages(fmt: Format, blocks: Sequence[Block]) -> list[dict[str, str]]:
    """Chat messages `{"role", "content"}`, as the format's turns (see `turns`): a server
    applying the model's own chat template accepts them. A blank open block is dropped;
    otherwise it is sent last as a prefill, with trailing whitespace removed (some APIs
    refuse a prefill that ends in whitespace, and the model writes the space itself).

    With a model's own template (a Jinja format), the messages are the first of the chats
    the text prompt tries (`template_chats`) that the template accepts: folded as the text
    prompt is folded (no system turn after the first for a template that demands
    alternation, none at all for one that refuses a system role), so a server applying that
    template to the messages renders what the text prompt holds."""
    if not fmt.chat_template:
        return _messages(fmt, turns(fmt, blocks))
    chats = template_chats(fmt, blocks)
    if not _holds_a_turn(chats[0][0]):
        return chats[0][0]  # a frame alone, which no server is sent: pricing's stand-in
    return _first_accepted(fmt, chats)[0]


def _holds_a_turn(messages: Sequence[dict[str, str]]) -> bool:
    """Whether a chat holds a user or assistant message (a chat a server is ever sent does)."""
    return any(m["role"] != "system" for m in messages)


def _first_accepted(fmt: Format, chats: list[tuple[list[dict[str, str]], bool]]) -> tuple[list[dict[str, str]], str]:
    """The first of `chats` the format's template accepts, and its rendering; the first
    refusal when it accepts none. A chat whose system turn after the first user or assistant
    turn (a recap) the template leaves out of its render (Nemotron Nano v2's renders only the
    leading one) is not accepted either: the next fold makes it a user turn, which it keeps."""
    from ..jinja import TemplateRefusal, render_chat

    refusal: TemplateRefusal | None = None
    for messages, continued in chats:
        try:
            rendered = render_chat(fmt.chat_template, messages, name=fmt.name, bos=fmt.bos_token,
                                   eos=fmt.eos_token, continue_final=continued)  # fmt: skip
        except TemplateRefusal as exc:
            refusal = refusal or exc
            continue
        if (left_out := _recap_left_out(messages, rendered)) is not None:
            refusal = refusal or TemplateRefusal(
                fmt.name, None, None, f"the template leaves out a system message in the chat ({left_out[:40]!r})"
            )
            continue
        return messages, rendered
    assert refusal is not None
    raise refusal


def _recap_left_out(messages: Sequence[dict[str, str]], rendered: str) -> str | None:
    """The text of the first system message after the chat's first other turn that `rendered`
    does not hold, else None."""
    started = False
    for message in messages:
        started = started or message["role"] != "system"
        text = message["content"].strip()
        if started and message["role"] == "system" and text and text not in rendered:
            return text
    return None


def _template_pieces(fmt: Format, blocks: Sequence[Block]) -> list[str]:
    """The prompt a model's chat template makes of the format's turns, sent as chat
    messages are (`render_messages`): an open turn with text ("Ilya:") is the final message,
    continued as transformers' `continue_final_message` continues it; a blank one, or none,
    asks for a new assistant turn (`add_generation_prompt`).

    A template that refuses the chat (its `raise_exception`: Mistral's and Gemma's demand
    that user and assistant alternate after one leading system message, Gemma 2's refuses a
    system message) is given it again as ctx's own formats for those models fold it
    (`_folded_for_template`): first with the system turns after the first user or assistant
    turn made user turns and a blank user turn before a chat that opens with the assistant,
    then with every system turn a user turn. Only when it refuses those too is the refusal
    an error (the first one, naming the template's own message).

    The prompt is one piece. Pieces a message (split at marks put after each message's text,
    checked against the plain render) priced the same to a token and built no faster:
    examples/lighthouse-case4.jsonl at windows of 4,096 and 16,384 with ChatML's and Llama
    3.1's templates, the head and tail priced 2,629 and 5,967 tokens (ChatML) in one piece, a token
    more in pieces, against 2,590 and 5,876 counted, in 14-25 ms a build either way."""
    from ...errors import TemplateError

    chats = template_chats(fmt, blocks)
    try:
        return [_first_accepted(fmt, chats)[1]]
    except TemplateError:
        if _holds_a_turn(chats[0][0]):
            raise
        # A frame alone (pricing's stand-in: no server is sent a chat of no turn), for a template
        # that cannot take a chat without a turn (Nemotron Nano v2's), is priced with a blank
        # user turn after it: a little more, never less.
        blank = [(messages + [{"role": "user", "content": ""}], False) for messages, _ in chats]
        return [_first_accepted(fmt, blank)[1]]


def template_chats(fmt: Format, blocks: Sequence[Block]) -> list[tuple[list[dict[str, str]], bool]]:
    """The chats a Jinja format gives its template, in the order it tries them (see
    `_template_pieces`), each with whether its last message is the open turn to continue."""
    all_turns = turns(fmt, blocks)
    continued = bool(all_turns) and all_turns[-1].open and bool(_said(fmt, all_turns[-1]).strip())
    attempts = (all_turns, _folded_for_template(all_turns, False), _folded_for_template(all_turns, True))
    return [(_messages(fmt, attempt), continued) for attempt in attempts]


def _folded_for_template(all_turns: Sequence[Block], every_system: bool) -> list[Block]:
    """The turns for a template that demands alternating user and assistant turns: system
    turns made user turns (all of them, or those after the leading ones), a blank user turn
    before an opening assistant turn, and turns of one role merged."""
    out: list[Block] = []
    leading = True
    for block in all_turns:
        leading = leading and block.role == "system"
        if block.role == "system" and (every_system or not leading):
            block = replace(block, role="user")
        if block.role == "assistant" and all(b.role == "system" for b in out):
            out.append(Block("user", ""))
        out.append(block)
    return merge_blocks(out)


def _messages(fmt: Format, all_turns: Sequence[Block]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for block in all_turns:
        text = _said(fmt, block)
        text = text.rstrip() if block.open else text
        if block.open and not text:
            continue
        messages.append({"role": block.role, "content": shown(text)})
    return messages


def stop_sequences(fmt: Format, names: Sequence[str]) -> list[str]:
    """The format's stop strings, then "\\n{name}:" for each participant, each once."""
    return list(unique([*fmt.stop, *(f"\n{name}:" for name in names if name.strip())]))


def includes_name(fmt: Format, name: str, role: str) -> bool:
    """SillyTavern's `names_behavior` for a speaker: "always" names everyone, "force" the
    characters of a group chat (and example dialogue's user), "none" no one."""
    if not name or role == "system":
        return False
    if fmt.names_behavior == "always":
        return True
    return fmt.names_behavior == "force" and fmt.group and name != fmt.user


def example_text(fmt: Format, role: str, text: str) -> str:
    """One line of example dialogue as SillyTavern's `formatInstructModeExamples` writes it:
    the speaker named as `names_behavior` says (the user's always with "force"), the role's
    sequences around it, `{{name}}` the speaker."""
    name = fmt.user if role == "user" else fmt.char
    named = includes_name(fmt, name, "assistant") or (fmt.names_behavior == "force" and role == "user")
    return _wrapped(fmt, role, f"{name}: {text}" if named else text, name, "")


def _said(fmt: Format, block: Block) -> str:
    """A block's text with its speaker's name, when it carries one and the format names it."""
    if block.name and includes_name(fmt, block.name, block.role):
        return f"{block.name}: {block.text}" if not block.open else f"{block.name}:{block.text}"
    return block.text


def _checked(blocks: Sequence[Block]) -> list[Block]:
    """The blocks as a list; only the last one may be open."""
    if any(block.open for block in blocks[:-1]):
        raise ValueError("only the last block may be open")
    return list(blocks)


def _aligned(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Put the user alignment message before the oldest message (the first user or assistant
    block), if that is an assistant's; it takes the first input sequence, as SillyTavern's."""
    if not fmt.user_alignment_message:
        return blocks
    for index, block in enumerate(blocks):
        if block.role == "system" or block.kind:
            continue
        if block.role == "assistant":
            align = Block("user", fmt.user_alignment_message, name=fmt.user)
            return [*blocks[:index], align, *blocks[index:]]
        break
    return blocks


def _folded(fmt: Format, blocks: list[Block]) -> list[Block]:
    """System blocks as user blocks. With `system_placement = "last_user"` the leading system
    blocks go before the text of the last user turn instead (Mistral v3 and Tekken; the first
    of the user blocks that merge into that turn) — unless
    the chat opens with an assistant turn: then they stay its opening user turn, so that
    turns still alternate. A system prompt with sequences of its own (`_prompt_sequences`),
    a story string and preformatted text stay as they are."""
    lead = 0
    while lead < len(blocks) and blocks[lead].role == "system":
        lead += 1
    keep = set(range(lead)) if _prompt_sequences(fmt) is not None else set()
    keep |= {i for i, b in enumerate(blocks) if b.kind}
    users = [i for i, b in enumerate(blocks) if b.role == "user" and i >= lead]
    if fmt.system_placement == "last_user" and lead and not keep and users and users[0] == lead:
        last = users[-1]
        while fmt.alternate and last - 1 > lead and blocks[last - 1].role == "user" and not blocks[last - 1].kind:
            last -= 1  # the last user *turn*: the run of user blocks that merges into it
        system = "\n\n".join(b.text for b in blocks[:lead])
        target = blocks[last]
        merged = Block("user", f"{system}\n\n{target.text}", target.open, name=target.name)
        blocks = [*blocks[lead:last], merged, *blocks[last + 1 :]]
        keep = set()
    return [replace(b, role="user") if b.role == "system" and i not in keep else b for i, b in enumerate(blocks)]


def _with_preamble(fmt: Format, blocks: list[Block]) -> list[Block]:
    """Llama 3.1's knowledge-date lines: the prompt always opens with a system turn that
    starts with `system_preamble`."""
    if blocks and blocks[0].role == "system" and not blocks[0].open:
        return [Block("system", fmt.system_preamble + blocks[0].text), *blocks[1:]]
    return [Block("system", fmt.system_preamble), *blocks]


def _prompt_sequences(fmt: Format) -> tuple[str, str] | None:
    """The sequences around the system prompt of a ctx template; None: a user turn (see the
    module's notes)."""
    if fmt.story_string_prefix or fmt.story_string_suffix:
        return fmt.story_string_prefix, fmt.story_string_suffix
    if fmt.system_sequence_prefix or fmt.system_sequence_suffix:
        return fmt.system_sequence_prefix, fmt.system_sequence_suffix
    if "system" in fmt.system_sequence.lower():
        return fmt.system_sequence, fmt.system_suffix
    if fmt.system_same_as_user:
        return None
    return "", fmt.system_suffix


def _sequences(fmt: Format, role: str, position: str) -> tuple[str, str]:
    """The prefix and suffix of a closed block; `position` is "first" for the oldest message,
    "last" for the last user message."""
    if role == "system":
        return fmt.system_sequence, fmt.system_suffix
    if role == "user":
        forced = {"first": fmt.first_input_sequence, "last": fmt.last_input_sequence}.get(position, "")
        return forced or fmt.input_sequence, fmt.input_suffix
    forced = fmt.first_output_sequence if position == "first" else ""
    return forced or fmt.output_sequence, fmt.output_suffix


def _name_filled(fmt: Format, text: str, name: str) -> str:
    return NAME_MACRO.sub(lambda _: name or "System", text) if fmt.macro else text


def _wrapped(fmt: Format, role: str, text: str, name: str, position: str) -> str:
    """SillyTavern's `formatInstructModeChat`: prefix, text, suffix (a newline when the preset
    wraps and the role has none), joined by a newline when it wraps."""
    prefix, suffix = (_name_filled(fmt, s, name) for s in _sequences(fmt, role, position))
    return _join(fmt, prefix, text, suffix)


def _join(fmt: Format, prefix: str, text: str, suffix: str) -> str:
    separator = "\n" if fmt.wrap else ""
    suffix = suffix or separator
    return prefix + (separator if prefix else "") + text + suffix


def _closed_turn(fmt: Format, block: Block, position: str, before_chat: bool) -> str:
    """One closed block with its sequences (see the module's notes for the system prompt and
    the story string)."""
    if block.kind == "raw":
        return block.text
    if block.kind == "story":
        if not (fmt.story_string_prefix or fmt.story_string_suffix):
            return block.text
        separator = "\n" if fmt.wrap else ""
        prefix = fmt.story_string_prefix + (separator if fmt.story_string_prefix else "")
        return prefix + block.text + fmt.story_string_suffix
    if block.role == "system" and before_chat:
        sequences = _prompt_sequences(fmt)
        if sequences is not None:
            prefix, suffix = (_name_filled(fmt, s, "System") for s in sequences)
            return _join(fmt, prefix, block.text, suffix)
    return _wrapped(fmt, block.role, _said(fmt, block), block.name, position)


def _open_turn(fmt: Format, block: Block) -> str:
    """The open block, as SillyTavern's `formatInstructModePrompt`: its role's prefix (an
    assistant's last one), then "Name:" when the format names the speaker — no trailing
    space (a token of its own to a BPE tokenizer, and the model writes it anyway) — and no
    suffix. With `wrap` it stands on a line of its own. When `last_output_sequence` drops the
    trailing space `output_sequence` has (Mistral's "[/INST]" vs "[/INST] "), that space goes
    back before the name, as SillyTavern does."""
    if block.role != "assistant":
        prefix = _sequences(fmt, block.role, "")[0]
    else:
        prefix = fmt.last_output_sequence or fmt.output_sequence
    prefix = _name_filled(fmt, prefix, block.name or fmt.char)
    text = _said(fmt, block).rstrip(" ")
    separator = "\n" if fmt.wrap else ""
    if not text.strip():
        opening = separator + prefix
        return (opening.rstrip() if fmt.wrap else opening) + separator + text.strip(" ")
    filler = ""
    if (
        block.role == "assistant"
        and fmt.last_output_sequence
        and fmt.output_sequence[-1:].isspace()
        and not fmt.last_output_sequence[-1:].isspace()
    ):
        filler = fmt.output_sequence[-1]
    opening = separator + prefix + (separator if prefix else "") + filler + text
    return opening.rstrip() if fmt.wrap else opening
