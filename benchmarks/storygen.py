"""Deterministic story generator: the bundled examples and the benchmark stories.

    python benchmarks/storygen.py examples            # rewrite examples/*.jsonl
    python benchmarks/storygen.py examples FOLDER     # write them into FOLDER instead
    python benchmarks/storygen.py story 10000 out.jsonl

Stories are native JSONL: a system line, messages that alternate between the user (Mara)
and the narrator, cards now and then, and scenes of about `scene_size` messages, every
one summarised and some with a history (the story so far through that scene).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

PLACES = [
    "the lighthouse",
    "the salt market",
    "the drowned chapel",
    "the ferry landing",
    "the archive",
    "the ridge road",
]
THINGS = [
    "a brass key",
    "the logbook",
    "a torn map",
    "the lantern",
    "a sealed letter",
    "the tide table",
    "a silver bell",
]
PEOPLE = ["Keeper Alder", "Ilya", "the harbourmaster", "Sister Wren", "the ferryman", "old Tamsin"]
VERBS = ["studies", "pockets", "lifts", "turns over", "hides", "holds up", "listens to"]
MOODS = ["quietly", "with a frown", "too quickly", "as if it might bite", "without a word", "carefully"]
WEATHER = ["Rain needles the glass.", "The fog comes in off the water.", "Gulls quarrel overhead.", "The wind drops."]


def sentence(rng: random.Random) -> str:
    return rng.choice(
        [
            f"{rng.choice(PEOPLE)} {rng.choice(VERBS)} {rng.choice(THINGS)} {rng.choice(MOODS)}.",
            f"Somewhere near {rng.choice(PLACES)}, {rng.choice(THINGS)} waits.",
            rng.choice(WEATHER),
            f'"Have you seen {rng.choice(THINGS)}?" asks {rng.choice(PEOPLE)}.',
        ]
    )


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def records(
    n: int,
    *,
    seed: int = 7,
    scene_size: int = 20,
    history_every: int = 10,
    summary_sentences: int = 4,
    message_sentences: tuple[int, int] = (1, 3),
    cards_at: tuple[int, ...] = (),
) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = [
        {"type": "story", "title": "The Lamp That Would Not Go Out", "user": "Mara", "char": "Narrator"},
        {
            "role": "system",
            "content": "You are the narrator of a slow mystery on a stormy coast. Write in second person, "
            "present tense. Never speak or act for {{user}}; end each reply on something she can act on.",
        },
    ]
    for number in range(1, n + 1):
        if number in cards_at:
            name = PEOPLE[number % len(PEOPLE)]
            out.append(
                {
                    "type": "card",
                    "name": name,
                    "description": f"{name} knows {rng.choice(PLACES)} better than anyone. {paragraph(rng, 2)}",
                    "personality": "wary, dry, loyal once won",
                }
            )
            continue
        if number % 2:
            out.append({"role": "user", "name": "Mara", "content": paragraph(rng, rng.randint(*message_sentences))})
        else:
            out.append({"role": "assistant", "content": paragraph(rng, rng.randint(*message_sentences) + 1)})
    for order, start in enumerate(range(1, n + 1, scene_size), start=1):
        end = min(start + scene_size - 1, n)
        scene = {
            "type": "scene",
            "id": order,
            "start": start,
            "end": end,
            "title": f"{rng.choice(PLACES).capitalize()}",
            "summary": paragraph(rng, summary_sentences),
        }
        if history_every and order % history_every == 0:
            scene["history"] = paragraph(rng, summary_sentences + 2)
        out.append(scene)
    return out


def write(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")


def examples(folder: Path) -> None:
    """The bundled examples: under the default config (8,192 window) one reaches case 3,
    the other case 4."""
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "lighthouse-case3.jsonl", records(240, seed=3, scene_size=30, message_sentences=(1, 1)))
    write(
        folder / "lighthouse-case4.jsonl",
        records(
            420,
            seed=4,
            scene_size=15,
            history_every=1,
            summary_sentences=30,
            message_sentences=(1, 1),
            cards_at=(33, 120),
        ),
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["examples"] and len(argv) <= 2:
        examples(Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parents[1] / "examples")
        return 0
    if len(argv) == 3 and argv[0] == "story":
        write(Path(argv[2]), records(int(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
