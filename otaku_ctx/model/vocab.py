"""A GGUF's vocabulary as llama.cpp takes it: the one place where what the reader found
(gguf.py) meets llama.cpp's rules (llamacpp.py). The counters are built from what this gives:
spm.py's SentencePiece, and bpe.py's tokenizer.json that hf.py runs with `tokenizers`; they
read neither the file nor each other.

It costs what is used: the pre-tokenizer and the BOS a prompt gets are the header's, read with
it; the tokens and their types are read when first asked for (`llama_vocab`, on a counter's
first count; `gguf_controls`, without the merges).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..tokens import LOOK_BEHIND
from .controls import is_control
from .gguf import TOKENS, Gguf
from .llamacpp import (
    CUT_OUT,
    NORMAL,
    PRE_TOKENIZERS,
    USER_DEFINED,
    PreTokenizer,
    pre_tokenizer_name,
    strip_attributes,
    strips_spaces,
    token_types,
)


@dataclass(frozen=True)
class LlamaVocab:
    """A GGUF's tokens as llama.cpp works with them: an empty one by llama.cpp's name for it,
    each text's id (a text twice: its last id, as llama.cpp's map keeps), the types as llama.cpp
    retypes them; the scores and merges as the file holds them (empty when it has none, or when
    only the tokens and types were read)."""

    model: Gguf = field(repr=False)
    tokens: tuple[str, ...]
    ids: dict[str, int] = field(repr=False)
    types: tuple[int, ...]
    scores: tuple[float, ...] = ()
    merges: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        """The file an error names."""
        return str(self.model.path)

    def cut_out(self) -> list[tuple[int, str, int]]:
        """(id, text, type) of each token llama.cpp cuts out of a text before the rest is
        tokenized (control, user-defined and unknown ones), in the vocabulary's order."""
        typed = enumerate(zip(self.tokens, self.types, strict=False))
        return [(i, text, kind) for i, (text, kind) in typed if kind in CUT_OUT]

    def controls(self) -> tuple[str, ...]:
        """The texts story text must not spell (`controls.is_control`): the tokens cut out as
        `tokenizers` keeps the added tokens of bpe.py's conversion — one for each text, at the
        id the vocabulary gives it, special as its last entry says — so a counter of either
        kind names the same."""
        special = {text: kind != USER_DEFINED for _, text, kind in self.cut_out()}
        return tuple(text for text in sorted(special, key=self.ids.__getitem__) if is_control(text, special[text]))

    def strips(self, special_ids: list[int]) -> tuple[set[int], set[int]]:
        """(LSTRIP ids, RSTRIP ids): the special tokens llama.cpp strips spaces beside, by the
        model's name (`llamacpp.strip_attributes`)."""
        model = self.model
        name, pre = model.name or "", model.pre or ""
        return strip_attributes(name, pre, model.architecture, self.ids, special_ids, self.where)

    def space_prefix(self) -> bool:
        """Whether a SentencePiece vocabulary puts a space before a text's first piece
        (`tokenizer.ggml.add_space_prefix`; llama.cpp's default: yes)."""
        said = self.model.metadata.get("tokenizer.ggml.add_space_prefix")
        if said is not None and not isinstance(said, bool):
            raise ConfigError(self.where, "tokenizer.ggml.add_space_prefix", "is not true or false")
        return True if said is None else said


def llama_vocab(model: Gguf, *, strict: bool = True) -> LlamaVocab:
    """The vocabulary of `model`, its token arrays read now: what a counter is built from.
    `strict` refuses a file where llama.cpp's choice of a token's type is its hash map's."""
    read = model.vocabulary()
    return _made(model, read.tokens, read.token_types, strict, read.scores, read.merges)


def gguf_controls(model: Gguf) -> tuple[str, ...]:
    """The control tokens a counter of `model` names (its `specials`), from its tokens and their
    types alone: nothing converted, no merges read, no `tokenizers`, and of any kind of
    tokenizer (a SentencePiece GGUF too, or one only a server counts). A fill-in-the-middle
    text llama.cpp would pick by its hash order is taken, whichever it picks; a file with no
    tokens names none."""
    if TOKENS not in model.metadata:
        return ()
    return _made(model, *model.typed_tokens(), strict=False).controls()


def _made(
    model: Gguf,
    tokens: tuple[str, ...],
    types: tuple[int, ...],
    strict: bool,
    scores: tuple[float, ...] = (),
    merges: tuple[str, ...] = (),
) -> LlamaVocab:
    named = tuple(text or f"[EMPTY_{i}]" for i, text in enumerate(tokens))  # llama.cpp's name for ""
    ids = {text: i for i, text in enumerate(named)}
    file_types = list(types or (NORMAL,) * len(named))
    where = str(model.path)
    retyped = token_types(ids, file_types, metadata=model.metadata, eos_text=model.eos_text, where=where, strict=strict)
    return LlamaVocab(model, named, ids, tuple(retyped), scores, merges)


# -- what the header decides ------------------------------------------------------------------


def pre_tokenizer(model: Gguf) -> PreTokenizer:
    """The pre-tokenizer llama.cpp splits a BPE vocabulary's text with, or a one-line refusal:
    a tokenizer that is neither BPE nor Gemma 4's, a pre-tokenizer ctx does not convert, or a
    model whose special tokens llama.cpp strips spaces beside."""
    where = str(model.path)
    if model.tokenizer_model not in ("gpt2", "gemma4"):
        kind = model.tokenizer_model or "none"
        message = f"ctx does not count the {kind!r} tokenizer itself; use --tokenizer server"
        raise ConfigError(where, "tokenizer.ggml.model", message)
    name = pre_tokenizer_name(model.tokenizer_model, model.pre)
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        message = f"ctx does not count the {name!r} pre-tokenizer itself; use --tokenizer server"
        raise ConfigError(where, "tokenizer.ggml.pre", message)
    if strips_spaces(model.name or "", model.pre or "", model.architecture):
        message = (
            "llama.cpp strips the spaces beside this model's special tokens, which ctx does not; use --tokenizer server"
        )
        raise ConfigError(where, "general.name", message)
    return pre


def prompt_bos(model: Gguf) -> str:
    """The BOS text the server adds to a prompt ("" when it adds none): only a BOS the server
    adds is left to it."""
    return model.bos_text if model.add_bos else ""


def prompt_added(model: Gguf) -> int:
    """How many tokens the server adds to a prompt: its BOS and EOS, where llama.cpp adds them."""
    return int(model.add_bos) + int(model.add_eos)


def look_behind(text: str, longest: int) -> tuple[int, int] | None:
    """Where a counter's context of `text` (`TokenCounter.context`) looks for its cut: (lowest,
    target), target at least LOOK_BEHIND characters before the end (as cl100k_base's), more
    where a special token is longer (`longest`), and lowest four times that before it. None when
    `text` is short enough to be its own context."""
    reach = max(LOOK_BEHIND, longest)
    if len(text) <= 2 * reach:
        return None
    target = len(text) - reach
    return max(1, target - 4 * reach), target
