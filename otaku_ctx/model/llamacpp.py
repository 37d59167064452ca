"""llama.cpp's rules for a GGUF's tokenizer, written once (src/llama-vocab.cpp, `load`), as
tables and pure functions of plain values: the BOS and EOS it takes where the file is silent,
the types it gives tokens by their text, the spaces it strips beside special tokens by a
model's name, and the BPE pre-tokenizer a `tokenizer.ggml.pre` names.

Nothing here reads a file or imports another module of model/: the reader (gguf.py) takes the
BOS rule from here, the vocabulary layer (vocab.py) the rest, and the counters read only what
vocab.py makes of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

# Token types (`tokenizer.ggml.token_type`), as llama.cpp numbers them.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
CUT_OUT = (CONTROL, USER_DEFINED, UNKNOWN)  # the types llama.cpp cuts out of a text before pre-tokenizing


# -- BOS and EOS ------------------------------------------------------------------------------

# llama.cpp's defaults when the file does not say: (BOS id, EOS id, adds BOS, adds EOS), by
# `tokenizer.ggml.model` (llama-vocab.cpp, load).
_DEFAULTS: dict[str, tuple[int | None, int | None, bool, bool]] = {
    "llama": (1, 2, True, False),
    "bert": (101, None, True, False),
    "gpt2": (11, 11, False, False),
    "t5": (None, 1, False, True),
    "rwkv": (None, None, False, False),
    "plamo2": (1, 2, False, False),
    "gemma4": (None, None, True, False),
}
# The BPE pre-tokenizers for which llama.cpp adds BOS unless the file says otherwise.
_PRE_ADDS_BOS = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}
    | {"tekken", "chameleon"}
)
_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})


def special_tokens(
    model: str,
    pre: str | None,
    said: tuple[int | None, int | None, bool | None, bool | None],
    vocab_size: int,
) -> tuple[int | None, int | None, bool, bool]:
    """(BOS id, EOS id, adds BOS, adds EOS) as llama.cpp takes them for a tokenizer of kind
    `model` (`tokenizer.ggml.model`) and pre-tokenizer `pre`, from what the file `said` of each
    (None where it is silent): its defaults, then the file's word, then its own overrides."""
    said_bos_id, said_eos_id, said_add_bos, said_add_eos = said
    bos, eos, add_bos, add_eos = _DEFAULTS.get(model, (None, None, False, False))
    if model == "gpt2" and pre in _PRE_ADDS_BOS:
        add_bos = True
    if model == "gpt2" and pre in _PRE_NO_BOS:
        bos = None
    bos = _token_id(said_bos_id, bos, vocab_size)
    eos = _token_id(said_eos_id, eos, vocab_size)
    add_bos = add_bos if said_add_bos is None else said_add_bos
    add_eos = add_eos if said_add_eos is None else said_add_eos
    if pre in ("gemma4", "granite-embed-multi-311m") or model == "gemma4":
        add_bos = True  # llama.cpp overrides the file here (it takes a "gemma4" vocabulary's pre as "gemma4")
    return bos, eos, add_bos, add_eos


def _token_id(said: int | None, default: int | None, vocab_size: int) -> int | None:
    """The id llama.cpp takes: the file's when it is within the vocabulary, else the default
    (itself dropped when outside)."""
    if default is not None and default >= vocab_size:
        default = None
    if said is not None and 0 <= said < vocab_size:
        return said
    return default


# -- token types, by a token's text -----------------------------------------------------------

# llama.cpp changes some tokens' types by their text when it loads a vocabulary
# (llama-vocab.cpp, load, "special tokens"): which of them it then cuts out of a text changes.
_EOG = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)  # fmt: skip
# A fill-in-the-middle token the file names no id for: the first of these texts llama.cpp finds.
_FIM: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("fim_pre_token_id", "prefix_token_id"), (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
        "<|code_prefix|>", "<|prefix|>")),
    (("fim_suf_token_id", "suffix_token_id"), (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
        "<|code_suffix|>", "<|suffix|>")),
    (("fim_mid_token_id", "middle_token_id"), (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
        "<|code_middle|>", "<|middle|>")),
    (("fim_pad_token_id",), ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    (("fim_rep_token_id",), ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    (("fim_sep_token_id",), ("<|file_sep|>",)),
)  # fmt: skip
_ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined


def token_types(
    vocab: Mapping[str, int],
    types: list[int],
    *,
    metadata: Mapping[str, object],
    eos_text: str,
    where: str,
    strict: bool = True,
) -> list[int]:
    """The token types llama.cpp works with: the file's `types`, with the changes llama.cpp
    makes by a token's text (an end-of-generation or fill-in-the-middle text becomes a control
    token; gpt-oss's channel tokens and, beside `<|return|>` and `<|call|>`, `<|end|>`
    user-defined; `</s>` ordinary beside `<|tool_response>`). `vocab` is each text's id, and
    `metadata` the file's keys (the fill-in-the-middle ids it names). Where llama.cpp's choice
    depends on the order of its hash map (two candidates for one fill-in-the-middle token, not
    both control), refused when `strict`; else both are taken as control tokens."""
    types = list(types)

    def control(text: str) -> None:
        if text in vocab and types[vocab[text]] != CONTROL:
            types[vocab[text]] = CONTROL

    for keys, texts in _FIM:
        said = [metadata.get(f"tokenizer.ggml.{key}") for key in keys]
        if any(isinstance(i, int) and 0 <= i < len(types) for i in said):
            continue
        found = [text for text in texts if text in vocab]
        if strict and len(found) > 1 and any(types[vocab[text]] != CONTROL for text in found):
            message = f"llama.cpp picks one of {', '.join(found)} by its hash order; use --tokenizer server"
            raise ConfigError(where, "tokenizer.ggml.token_type", message)
        for text in found:
            control(text)
    for text in _EOG:
        control(text)
    for text in _ALWAYS_SHOWN:
        if text in vocab:
            types[vocab[text]] = USER_DEFINED
    has = set(vocab)
    if "<|end|>" in has and (
        ("<|return|>" in has and ("<|call|>" in has or "<|calls|>" in has))
        or (("<|call|>" in has or "<|calls|>" in has) and "<|flush|>" in has)
    ):
        types[vocab["<|end|>"]] = USER_DEFINED
    if "</s>" in has and ("<|tool_response>" in has or eos_text == "<|plamo:eos|>"):
        types[vocab["</s>"]] = NORMAL
    return types


# -- the spaces stripped beside special tokens ------------------------------------------------


def strips_spaces(name: str, pre: str, architecture: str) -> bool:
    """Whether llama.cpp gives a model's special tokens strip attributes by its name
    (llama-vocab.cpp, "set attributes by model/tokenizer/architecture name"): Phi-3's strip the
    spaces after them, a `<mask>` or `[MASK]` the spaces before it."""
    return _strip_rule(name.lower(), pre, architecture) is not None


def strip_attributes(
    name: str, pre: str, architecture: str, vocab: Mapping[str, int], special_ids: list[int], where: str
) -> tuple[set[int], set[int]]:
    """The tokens llama.cpp gives strip attributes by the model's name: (LSTRIP ids, RSTRIP
    ids), of `vocab` (each text's id) whose special tokens are `special_ids`. A token it names
    that the vocabulary lacks stops llama.cpp loading the model: refused."""

    def named(text: str) -> int:
        if text not in vocab:
            message = f"has no {text} token, without which llama.cpp does not load this model"
            raise ConfigError(where, "tokenizer.ggml.tokens", message)
        return vocab[text]

    rule = _strip_rule(name.lower(), pre, architecture)
    if rule == "<mask>":
        return ({vocab["<mask>"]} if "<mask>" in vocab else set()), set()
    if rule == "phi-3":
        rstrip = {*special_ids, named("</s>")}
        rstrip -= {named("<unk>"), named("<s>"), named("<|endoftext|>")}
        return set(), rstrip
    if rule == "[MASK]":
        return ({vocab["[MASK]"]} if "[MASK]" in vocab else set()), set()
    return set(), set()


def _strip_rule(name: str, pre: str, architecture: str) -> str | None:
    """Which of llama.cpp's strip rules by name applies, in its order: a `<mask>` (jina, nomic),
    Phi-3's special tokens, a `[MASK]` (ModernBERT); None for the rest."""
    if any(p in pre for p in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        a in architecture for a in ("nomic-bert-moe", "jina-bert-v3")
    ):
        return "<mask>"
    if "phi-3" in name or "phi3" in name:
        return "phi-3"
    if "modern-bert" in name:
        return "[MASK]"
    return None


# -- llama.cpp's pre-tokenizers (llama-vocab.cpp: llm_tokenizer_bpe, and its table of names) ---

# The regexes as llama.cpp applies them: its GPT-2 pattern is run by a hand-written splitter
# that also splits any other run of spaces (the regex's own `|\s+`, written out here); its
# Llama 3 and Qwen 2 patterns spell the contractions' case-insensitivity out ('[sS]), as
# llama.cpp's adapted patterns do (a case-folding `(?i:...)` would also take "'ſ").
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DIGIT = r"\p{N}"
# Tekken's (Mistral Nemo): llama.cpp runs its pattern through std::regex on text where each
# non-ASCII character stands for its class, so a non-ASCII letter is both an upper- and a
# lower-case one there, as `[^a-z]` and `[^A-Z]` after a letter lookahead say on the real text.
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 3.5's: Qwen 2's, with marks (\p{M}) among the letters.
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-4o's (Llama 4), the same letters with contractions, and digits three at a time.
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """One of llama.cpp's BPE pre-tokenizers: its regexes in order, and whether a piece that is
    itself a token skips the merges (llama.cpp's `ignore_merges`)."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    context: bool = True  # whether `context_of`'s argument holds for it
    # SentencePiece-style BPE (Gemma 4): spaces written "▁", the merges on raw UTF-8, and a
    # character the vocabulary lacks spelled in its bytes' tokens `<0xXX>`
    spaces: bool = False


_SMOLLM = PreTokenizer((DIGIT, GPT2))
_GPT2 = PreTokenizer((GPT2,))
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True)
_LLAMA3_MERGED = PreTokenizer((LLAMA3,))
_QWEN2 = PreTokenizer((QWEN2,))
_TEKKEN = PreTokenizer((TEKKEN,), ignore_merges=True)
_GPT4O = PreTokenizer((GPT4O,))
_QWEN35 = PreTokenizer((QWEN35,))
# Falcon's: runs of punctuation and ASCII symbols apart, GPT-2's splitter, then three ASCII digits
# apart; DeepSeek Coder's: newlines, letters, punctuation, CJK and Hangul runs, digits one by one
# (each a `std::regex` in llama.cpp on its classes of the characters, which these say on the text;
# it runs the CJK one on text where a non-ASCII space is a vertical tab: U+1680 and U+3000 lie in its
# range U+0800-U+4E00 and are no CJK there)
_FALCON = PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"), context=False)
_CJK = "(?:(?!\\s)[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff])+"
_DEEPSEEK_CODER = PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, DIGIT), context=False)
# DeepSeek LLM's: newlines; cased letters (the class its tokenizer.json names); ASCII and
# fullwidth punctuation and quotes; trailing spaces; CJK and Hangul runs; digit runs
_CASED = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_DEEPSEEK_LLM = PreTokenizer(
    (
        r"[\r\n]",
        rf"\s?[{_CASED}]+",
        "\\s?(?:(?!\\s)[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002])+",
        r"\s+\z",
        _CJK,
        r"\p{N}+",
    ),
    context=False,
)
# Gemma 4's: lines and runs of newlines, each merged whole (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4)
GEMMA4 = PreTokenizer((r"[^\n]+|[\n]+",), spaces=True, context=False)

# `tokenizer.ggml.pre` -> the pre-tokenizer llama.cpp uses for it. Those llama.cpp splits with
# its hand-written splitters (GPT-2, Llama 3, Qwen 2) or with a regex whose meaning, under its
# std::regex emulation of Unicode classes, the regex here says on the real text (each proved
# against llama-server: tests/realserver/test_model_hf_real.py, test_llama_vocab_real.py).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"), _SMOLLM
    ),
    **dict.fromkeys(
        ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum"), _GPT2
    ),
    **dict.fromkeys(("modern-bert", "mpt", "olmo", "jais", "exaone4", "trillion", "granite-docling"), _GPT2),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    **dict.fromkeys(("glm4", "glm5"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), _LLAMA3_MERGED),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), _QWEN2
    ),
    "tekken": _TEKKEN,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m"), GEMMA4),
    "qwen35": _QWEN35,
    "falcon": _FALCON,
    "deepseek-coder": _DEEPSEEK_CODER,
    "deepseek-llm": _DEEPSEEK_LLM,
}


def pre_tokenizer_name(model: str, pre: str | None) -> str:
    """The pre-tokenizer llama.cpp takes for a BPE vocabulary: its `pre`, "gemma4" for a Gemma 4
    vocabulary whatever it says, "default" when it says none."""
    return "gemma4" if model == "gemma4" else pre or "default"
