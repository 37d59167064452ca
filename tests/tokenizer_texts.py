"""Texts to compare a tokenizer with its reference on: every message of the fixtures, and
seeded random texts built to find where two tokenizers part (emoji with ZWJ sequences and skin
tones, CJK, Arabic, combining marks, runs of digits, spaces leading, trailing and doubled, tabs,
CRLF, a lone CR, control tokens spelled whole and in part, very long words)."""

from __future__ import annotations

import json
import random
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<jupyter_code>"]
LOOK_ALIKES = [
    "<|im_",
    "im_end|>",
    "<|im_start|",
    "<|endoftext",
    "< |im_end| >",
    "<|IM_END|>",
    "<<|im_end|>>",
    "<|im_end|",
]
PIECES = [
    "Hello", " world", "the", " The", "don't", " I'm", " they're", " we've", " she'll", " he'd", " It's",
    "'S", "'LL", " Mara", " lighthouse", " café", " naïve", " Zürich", " São", "Ünïcödé",
    "日本語", "の", "漢字", "中文字符", "한국어", "ひらがな", "カタカナ",
    "العربية", " مرحبا", "שלום", "Привет", "Ελληνικά",
    "e\u0301", "a\u0308", "\u0915\u094d\u0937", "ñ", "n\u0303", "\u0301",
    "\u200b", "\u200d", "\ufeff", "\u00a0", "\u3000",
    "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏿‍🚀", "❤️", "1️⃣", "🇯🇵", "😀😃😄", "🫠",
    "0", "7", "42", "2024", "1234567890", "3.14159", "1,000,000", "٣٤٥", "Ⅻ", "½", "²",
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", " \t ", "\u2028", "\x0b", "\x0c", "\x85",
    ".", ",", "!", "?", "...", "—", "–", "\u2026", '"', "'", "«", "»", "“", "”", "(", ")", "[", "]", "{", "}",
    "*", "**", "_", "~", "#", "@", "$", "%", "^", "&", "+", "=", "<", ">", "/", "\\", "|", "`", ":", ";",
    "http://example.com/a?b=c", "snake_case_name", "CamelCaseWord", "x86_64", "e-mail", "re-enter",
]  # fmt: skip


def fixture_messages(limit: int | None = None) -> list[str]:
    """The `content` (or SillyTavern `mes`) of every message line in the fixtures' JSONL files."""
    found: list[str] = []
    for path in sorted(FIXTURES.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                for key in ("content", "mes", "summary", "history", "description"):
                    value = record.get(key)
                    if isinstance(value, str) and value:
                        found.append(value)
    unique = list(dict.fromkeys(found))
    return unique[:limit] if limit is not None else unique


def random_texts(n: int, seed: int = 18) -> list[str]:
    """`n` seeded random texts of pieces, with control tokens and look-alikes among them."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 24)):
            roll = rng.random()
            if roll < 0.05:
                parts.append(rng.choice(CONTROL))
            elif roll < 0.10:
                parts.append(rng.choice(LOOK_ALIKES))
            elif roll < 0.13:
                parts.append(rng.choice("abcdefghijklmnopqrstuvwxyzé日") * rng.randint(30, 400))  # a very long word
            elif roll < 0.16:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(4, 40))))
            elif roll < 0.19:
                parts.append(
                    chr(
                        rng.choice(
                            [
                                rng.randint(0x20, 0x2FF),
                                rng.randint(0x370, 0x10FF),
                                rng.randint(0x1F300, 0x1FAFF),
                                rng.randint(0x4E00, 0x9FFF),
                            ]
                        )
                    )
                )
            else:
                parts.append(rng.choice(PIECES))
        texts.append("".join(parts))
    return texts


def long_texts() -> list[str]:
    """A few long texts: a whole fixture story joined, and long runs of one character."""
    story = "\n\n".join(fixture_messages())
    return [story[:20_000], " " * 3000 + "x", "a" * 5000, "\n" * 2000, "7" * 3000, "日本" * 1500]


# Characters where tokenizers' notions of a space differ: Unicode's White_Space, the ASCII
# separators Python calls spaces, the zero-width ones, and controls whose byte a vocabulary
# may lack (SmolLM2 has no token for the byte 0x1D).
SPACES = [0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680, 0x180E]
SPACES += [*range(0x2000, 0x200C), 0x2028, 0x2029, 0x202F, 0x205F, 0x2060, 0x3000, 0xFEFF, 0x4, 0x6]


def codepoint_texts(n_random: int = 2000, seed: int = 5) -> list[str]:
    """Pairs of those characters (and of random code points of every plane) in a few places."""
    texts = []
    for a in SPACES:
        for b in [*SPACES, ord("x"), ord("1"), ord("!")]:
            for form in ("{}{}", "x{}{}y", "x {}{} y", "{}{}x"):
                texts.append(form.format(chr(a), chr(b)))
    rng = random.Random(seed)
    points = [*range(0x80, 0xD800), *range(0xE000, 0x30000), *range(0xE0000, 0xE0080), 0xF0000, 0x10FFFD]
    for _ in range(n_random):
        form = rng.choice(["{}{}", " {}{}", "x{}{} y", "{} {}", "{}{}!", "1{}2{}", "{}\n{}"])
        texts.append(form.format(chr(rng.choice(points)), chr(rng.choice(points))))
    return texts


def all_texts(n_random: int = 3000) -> list[str]:
    texts = fixture_messages() + random_texts(n_random) + long_texts() + codepoint_texts()
    return list(dict.fromkeys(texts))
